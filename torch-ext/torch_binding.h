// Ops of persistent_matmul, one per kernel rung. Each computes
// out = a @ b (+ bias) in place into a caller-allocated `out`; the Python
// package validates arguments and allocates, these re-check what a direct
// caller of the op could get wrong, so a bad call raises instead of crashing.
#pragma once

#include <optional>

#include <torch/csrc/stable/tensor.h>

#include <vector>

using torch::stable::Tensor;

void naive_op(const Tensor& a, const Tensor& b, const std::optional<Tensor>& bias, Tensor& out);
void warptiled_op(const Tensor& a, const Tensor& b, const std::optional<Tensor>& bias, Tensor& out);

// Tensor-core rungs. `timeline`, when given, is an int64 [tiles, 6] tensor
// that the instrumented kernel fills with one row per output tile:
// (tile_m, tile_n, sm id, CTA index, start ns, end ns) from %globaltimer.
void tiled_op(const Tensor& a, const Tensor& b, const std::optional<Tensor>& bias, Tensor& out,
                  const std::optional<Tensor>& timeline);
// tile_order: 0 = grouped, 1 = Hilbert (csrc/tile_scheduler.cuh).
void persistent_op(const Tensor& a, const Tensor& b, const std::optional<Tensor>& bias, Tensor& out,
                   const std::optional<Tensor>& timeline, int64_t tile_order);

// Hopper only (sm_90a): TMA + wgmma, one CTA per tile / persistent.
void wgmma_op(const Tensor& a, const Tensor& b, const std::optional<Tensor>& bias, Tensor& out,
              const std::optional<Tensor>& timeline);
// cluster_size: 1 (default), or 2 for CTA pairs sharing B by TMA multicast.
void wgmma_persistent_op(const Tensor& a, const Tensor& b, const std::optional<Tensor>& bias, Tensor& out,
                         const std::optional<Tensor>& timeline, int64_t tile_order, int64_t cluster_size);

// [block_m, block_n, block_k, tiles, persistent CTAs] for an m x n output on
// `device`: of tiled/persistent, or with `hopper` of wgmma/wgmma_persistent.
std::vector<int64_t> tile_config(int64_t m, int64_t n, int64_t device, bool hopper);
