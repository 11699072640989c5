// The ops of persistent_matmul (torch_binding.cpp). linear_fwd, matmul and
// matmul_out check every argument, choose the rung (rungs.h), copy operands
// a rung cannot read, allocate the output and launch on the current stream;
// a bad call raises instead of crashing.
#pragma once

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>

using torch::stable::Tensor;

// x @ weight.T (+ bias): x is (..., K), weight N x K, bias N; returns (..., N).
Tensor linear_fwd_op(const Tensor& x, const Tensor& weight, const std::optional<Tensor>& bias, std::string kernel);
// a (M x K) @ b (K x N), any strides; returns a new M x N tensor.
Tensor matmul_op(const Tensor& a, const Tensor& b, std::string kernel);
// a @ b (+ bias) into out. tile_order: -1 (default: split tail), 0 grouped, 1
// Hilbert, 2 dynamic, 3 split tail (the persistent rungs). cluster_size: 0 (the
// kernel picks), 1 or 2 (wgmma_persistent). timeline, when given, is an int64
// [timeline rows, 8] tensor (tile_config's last value: a row per tile and per
// CTA the launch may run) that the instrumented build of a rung with tiles
// fills with one row per unit of work, a tile or a part of one cut in K:
// (tile_m, tile_n, k_begin, k_end, sm id, CTA index, start ns, end ns); rows
// of no unit keep their values.
void matmul_out_op(const Tensor& a, const Tensor& b, const std::optional<Tensor>& bias, Tensor& out,
                   std::string kernel, int64_t tile_order, int64_t cluster_size, const std::optional<Tensor>& timeline);

// The rung kernel="auto" runs on a GPU of compute capability major.minor with
// `sms` SMs, for an m x n output of `dtype` summed over k (b_kmajor: B is
// K-major); "none" if no rung runs there. streamk_clusters: whether the build
// runs wgmma_streamk's clustered cut (None: this build's answer; CUDA 12
// builds' is false), so either build's choice can be asked of any build.
std::string choose_kernel_op(int64_t major, int64_t minor, int64_t sms, torch::headeronly::ScalarType dtype,
                             int64_t m, int64_t n, int64_t k, bool b_kmajor, std::optional<bool> streamk_clusters);
// a and b as a rung reading `chunk`-element (16-byte) chunks takes them: the
// inputs themselves, or padded copies (need_kmajor: B copied K-major).
std::tuple<Tensor, Tensor> operands_for_op(const Tensor& a, const Tensor& b, int64_t chunk, bool need_kmajor);

// [block_m, block_n, block_k, tiles, persistent CTAs, timeline rows, cluster
// size] for an m x n output (summed over k; k < 1: not known) on `device`, of
// the rung `kernel` (tiled and persistent share one, wgmma and wgmma_persistent
// another; wgmma_streamk's grid depends on k), launched with `cluster_size`
// (0: the one the launch picks).
std::vector<int64_t> tile_config_op(int64_t m, int64_t n, int64_t device, std::string kernel, int64_t k,
                                    int64_t cluster_size);
