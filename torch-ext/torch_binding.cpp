// The op entry of persistent_matmul, through torch's stable ABI: every call's
// checks, the rung choice, operand copies where a rung cannot read a layout,
// the output allocation and the launch, in C++, so a call costs the host
// about what one of torch's own ops does (the Python package only explains
// errors: when an op raises, it re-checks the arguments and raises the
// precise exception naming the argument).
//
// Ops (schemas at the end of the file):
//   linear_fwd(x, weight, bias, kernel) -> out     x @ weight.T + bias, any leading dims of x
//   matmul(a, b, kernel) -> out                    a @ b
//   matmul_out(a, b, bias, out, kernel, tile_order, cluster_size, timeline)
//                                                  a @ b + bias into out, with the persistent
//                                                  rungs' options and the instrumented build
//   choose_kernel(...), operands_for(...), tile_config(...): the rung choice, the operand
//   preparation and the tile configuration, for tests and tools.
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/headeronly/util/Exception.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "matmul_problem.h"
#include "registration.h"
#include "rungs.h"
#include "torch_binding.h"

namespace {

using persistent_matmul::DeviceFacts;
using persistent_matmul::ElementType;
using persistent_matmul::MatmulProblem;
using persistent_matmul::Rung;
using torch::headeronly::ScalarType;
using torch::stable::Tensor;

// Grid dimensions and tile counts are 32-bit.
constexpr int64_t kMaxDim = 2147483647;

// ------------------------------------------------------------------ arguments

std::optional<ElementType> element_type_of(ScalarType t) {
  switch (t) {
    case ScalarType::Float: return ElementType::kFloat32;
    case ScalarType::Half: return ElementType::kFloat16;
    case ScalarType::BFloat16: return ElementType::kBFloat16;
    default: return std::nullopt;
  }
}

std::string kernel_choices() {
  std::string s = "auto";
  for (auto name : persistent_matmul::kRungNames) s.append(", ").append(name);
  return s;
}

// "auto" (nullopt) or a rung.
std::optional<Rung> parse_kernel(const std::string& kernel) {
  if (kernel == "auto") return std::nullopt;
  const auto rung = persistent_matmul::rung_named(kernel);
  STD_TORCH_CHECK(rung.has_value(), "persistent_matmul: unknown kernel '", kernel, "'; choose one of: ",
                  kernel_choices());
  return rung;
}

// A CUDA tensor of a supported dtype with `dims` dims and sizes a kernel can index.
void check_operand(const Tensor& t, const char* name, int64_t min_dims, int64_t max_dims) {
  STD_TORCH_CHECK(t.dim() >= min_dims && t.dim() <= max_dims, "persistent_matmul: ", name, " must have ",
                  min_dims == max_dims ? std::to_string(min_dims) : std::to_string(min_dims) + " to " +
                  std::to_string(max_dims), " dims, got ", t.dim());
  STD_TORCH_CHECK(element_type_of(t.scalar_type()).has_value(), "persistent_matmul: ", name,
                  " must be float32, float16 or bfloat16");
  STD_TORCH_CHECK(t.is_cuda(), "persistent_matmul: ", name, " must be a CUDA tensor");
  for (int64_t d = 0; d < t.dim(); ++d) {
    STD_TORCH_CHECK(t.size(d) <= kMaxDim, "persistent_matmul: ", name, " has size ", t.size(d), " in dim ", d,
                    "; at most ", kMaxDim, " is supported");
  }
}

void check_same(const Tensor& t, const char* name, const Tensor& first, const char* first_name) {
  STD_TORCH_CHECK(t.scalar_type() == first.scalar_type(), "persistent_matmul: ", name, " and ", first_name,
                  " must have the same dtype");
  STD_TORCH_CHECK(t.get_device_index() == first.get_device_index(), "persistent_matmul: ", name, " is on cuda:",
                  t.get_device_index(), " but ", first_name, " is on cuda:", first.get_device_index());
}

// ------------------------------------------------------------------ devices

// Every device's facts, asked of the runtime once (a function-local static, not
// std::call_once, whose pthread_once would need glibc 2.34): they do not
// change, and each query costs host time on every call otherwise.
const DeviceFacts& device_facts(int32_t device) {
  static const std::vector<DeviceFacts> facts = [] {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
    std::vector<DeviceFacts> all(size_t(count > 0 ? count : 0));
    for (int d = 0; d < count; ++d) {
      cudaDeviceGetAttribute(&all[d].major, cudaDevAttrComputeCapabilityMajor, d);
      cudaDeviceGetAttribute(&all[d].minor, cudaDevAttrComputeCapabilityMinor, d);
      cudaDeviceGetAttribute(&all[d].sms, cudaDevAttrMultiProcessorCount, d);
      all[d].streamk_clusters = persistent_matmul::wgmma_streamk_clusters_built();
    }
    return all;
  }();
  STD_TORCH_CHECK(device >= 0 && size_t(device) < facts.size(), "persistent_matmul: device index ", device,
                  " out of range");
  return facts[size_t(device)];
}

cudaStream_t current_stream(int32_t device) {
  void* stream = nullptr;
  STD_TORCH_CHECK(aoti_torch_get_current_cuda_stream(device, &stream) == AOTI_TORCH_SUCCESS,
                  "persistent_matmul: could not get the current CUDA stream");
  return static_cast<cudaStream_t>(stream);
}

// ------------------------------------------------------------------ operands

// A matrix as the kernels address it: element strides of its rows and columns.
struct View {
  void* data = nullptr;
  int64_t rows = 0, cols = 0, row_stride = 0, col_stride = 0;
};

View view_of(const Tensor& t) { return {t.data_ptr(), t.size(0), t.size(1), t.stride(0), t.stride(1)}; }

int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Whether the chunked rungs read `a` (M x K) directly: K contiguous, rows that
// start 16-byte aligned and do not overlap (the Hopper rungs' tensor maps need that).
bool a_readable(const View& a, int chunk) {
  return aligned16(a.data) && (a.col_stride == 1 || a.cols == 1) &&
         (a.rows == 1 || (a.row_stride % chunk == 0 && a.row_stride >= a.cols));
}

// Whether B (K x N) is K-major (column n's K values contiguous, as nn.Linear's
// weight, transposed) or N-major (a row-major b) in a layout the chunked rungs read.
bool b_kmajor(const View& b, int chunk) {
  return (b.row_stride == 1 || b.rows == 1) && (b.cols == 1 || (b.col_stride % chunk == 0 && b.col_stride >= b.rows));
}
bool b_nmajor(const View& b, int chunk) {
  return (b.col_stride == 1 || b.cols == 1) && (b.rows == 1 || (b.row_stride % chunk == 0 && b.row_stride >= b.cols));
}

// A copy of `v` (of `like`'s dtype and device) that the chunked rungs read:
// contiguous along its columns (rows_contiguous: each row's elements adjacent)
// or along its rows, the other stride rounded up to 8 chunks (128 bytes) so
// every line starts on a cache line (16 bytes would do for correctness; at
// 4097^3 rows 8208 bytes apart ran the wgmma rung at 270 TFLOP/s on the H200).
Tensor padded_copy(const Tensor& like, const View& v, bool rows_contiguous, int chunk) {
  const int64_t lines = rows_contiguous ? v.rows : v.cols;
  const int64_t line = rows_contiguous ? v.cols : v.rows;
  const int64_t padded = std::max(round_up(line, 8 * chunk), int64_t(chunk));
  Tensor buffer = torch::stable::new_empty(like, {lines, padded});
  Tensor copy = torch::stable::narrow(buffer, 1, 0, line);
  if (!rows_contiguous) copy = torch::stable::transpose(copy, 0, 1);
  const Tensor source = torch::stable::from_blob(v.data, {v.rows, v.cols}, {v.row_stride, v.col_stride},
                                                 like.device(), like.scalar_type());
  torch::stable::copy_(copy, source);
  return copy;
}

// a and b as a rung that reads 16-byte chunks takes them, copying only what it
// cannot read: a transposed A, a leading dimension like 4097, an odd offset.
// `need_kmajor` asks for a K-major B (splitk and wgmma_streamk read weight rows).
struct Prepared {
  View a, b;
  std::optional<Tensor> a_copy, b_copy;  // must outlive the launch
};

Prepared prepare_operands(const Tensor& like, const View& a, const View& b, int chunk, bool need_kmajor) {
  Prepared out{a, b, std::nullopt, std::nullopt};
  if (!a_readable(a, chunk)) {
    out.a_copy = padded_copy(like, a, /*rows_contiguous=*/true, chunk);
    out.a = view_of(*out.a_copy);
  }
  const bool kmajor = b_kmajor(b, chunk);
  if (!aligned16(b.data) || !(kmajor || (!need_kmajor && b_nmajor(b, chunk)))) {
    // Keep B's orientation where it has one (K contiguous stays K contiguous).
    const bool rows_contiguous = !need_kmajor && b.row_stride != 1;
    out.b_copy = padded_copy(like, b, rows_contiguous, chunk);
    out.b = view_of(*out.b_copy);
  }
  return out;
}

// ------------------------------------------------------------------ memory checks (out)

// Byte range [start, end) a strided tensor's elements occupy.
std::pair<uintptr_t, uintptr_t> span(const Tensor& t) {
  int64_t last = 0;
  for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
  const auto start = reinterpret_cast<uintptr_t>(t.data_ptr());
  return {start, start + uintptr_t(last + 1) * t.element_size()};
}

bool may_overlap(const Tensor& x, const Tensor& y) {
  if (x.numel() == 0 || y.numel() == 0) return false;
  const auto [a0, a1] = span(x);
  const auto [b0, b1] = span(y);
  return a0 < b1 && b0 < a1;
}

// Whether two elements of a 2-D tensor may share an address (an expanded one, say).
bool internal_overlap(const Tensor& t) {
  if (t.numel() == 0 || t.is_contiguous()) return false;
  std::array<std::pair<int64_t, int64_t>, 2> dims{};  // (stride, size) of dims with size > 1
  int used = 0;
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) > 1) dims[used++] = {t.stride(d), t.size(d)};
  }
  std::sort(dims.begin(), dims.begin() + used);
  int64_t reach = 0;
  for (int i = 0; i < used; ++i) {
    if (dims[i].first <= reach) return true;
    reach += dims[i].first * (dims[i].second - 1);
  }
  return false;
}

// ------------------------------------------------------------------ scratch memory of the tile orders

// The scratch memory of one launch of the persistent and stream-K rungs: the
// dynamic and split-tail orders' tile counter (a uint32, in the first 16
// bytes), the flags of the split-tail order and the counters of wgmma_streamk
// (per SM of the device), then their partial-sum slots (matmul_problem.h).
// The counter and the flags are zero at launch, and each launch leaves them
// zero again (claim_tile_index, wait_and_clear_flag, wgmma_streamk's last
// part); the partial sums are written before they are read, so they need no
// fill.
constexpr int64_t kCounterBytes = 16;

int64_t zeroed_bytes(int sms) { return kCounterBytes + sms * persistent_matmul::kSplitFlagsPerSm * 4; }

int64_t scratch_bytes(int sms) { return zeroed_bytes(sms) + sms * persistent_matmul::kPartialBytesPerSm; }

void point_at_scratch(MatmulProblem& problem, char* scratch, int sms) {
  problem.tile_counter = reinterpret_cast<uint32_t*>(scratch);
  problem.partial_flags = reinterpret_cast<uint32_t*>(scratch + kCounterBytes);
  problem.partials = reinterpret_cast<float*>(scratch + zeroed_bytes(sms));
}

// The scratch memory for launches on `stream`: allocated, its counters zeroed,
// on first use and kept for the process. Launches on one stream run one after
// another, so they never share it at the same time; a call costs a lookup,
// not an allocation and a fill.
char* stream_scratch(int32_t device, cudaStream_t stream, int sms) {
  static std::mutex mutex;
  static std::map<std::pair<int32_t, cudaStream_t>, char*> scratches;
  const std::lock_guard<std::mutex> lock(mutex);
  char*& scratch = scratches[{device, stream}];
  if (scratch == nullptr) {
    void* memory = nullptr;
    const int64_t bytes = scratch_bytes(sms);
    const cudaError_t err = cudaMalloc(&memory, bytes);
    STD_TORCH_CHECK(err == cudaSuccess && cudaMemsetAsync(memory, 0, zeroed_bytes(sms), stream) == cudaSuccess,
                    "persistent_matmul: could not allocate the tile orders' scratch memory (", bytes, " bytes): ",
                    cudaGetErrorString(err == cudaSuccess ? cudaGetLastError() : err));
    scratch = static_cast<char*>(memory);
  }
  return scratch;
}

// The tile orders' ints (csrc/tile_scheduler.cuh, TileOrder) that the op entry names.
constexpr int32_t kGrouped = 0;
constexpr int32_t kDynamic = 2;
constexpr int32_t kSplitTail = 3;

// The scratch memory of the launches a CUDA graph capture records on one
// stream: from torch's allocator (cudaMalloc may not run during capture, and
// the graph may be replayed on any stream), its counters zeroed by the
// capture's first launch on that stream, a fill the graph repeats at every
// replay. The capture's later launches on the stream reuse it, as launches on
// a stream outside a graph reuse the stream's: they run one after another and
// each leaves the counters zero. A zero fill per launch instead put a memset
// node between every two launches of a graph, which broke the programmatic
// overlap of each launch with the one before (benchmarks/NOTES.md, "Why a
// captured graph zeroes its workspace once").
// Kept until the stream is captured again or runs a launch outside capture:
// until the capture ends nothing else of it may be given that memory.
struct CaptureScratch {
  unsigned long long capture_id = 0;
  std::optional<Tensor> memory;
};

std::mutex capture_scratch_mutex;
std::map<std::pair<int32_t, cudaStream_t>, CaptureScratch> capture_scratches;
std::atomic<size_t> capture_scratches_held{0};  // its size, read without the lock

// Drops the scratch of the stream's last capture (outside capture, that capture has ended).
void end_capture_scratch(int32_t device, cudaStream_t stream) {
  if (capture_scratches_held.load(std::memory_order_relaxed) == 0) return;  // the usual case: nothing to look up
  const std::lock_guard<std::mutex> lock(capture_scratch_mutex);
  capture_scratches.erase({device, stream});
  capture_scratches_held.store(capture_scratches.size(), std::memory_order_relaxed);
}

// The scratch of capture `capture_id` on `stream` (CaptureScratch).
char* capture_scratch(const Tensor& like, int32_t device, cudaStream_t stream, unsigned long long capture_id,
                      int sms) {
  const std::lock_guard<std::mutex> lock(capture_scratch_mutex);
  CaptureScratch& entry = capture_scratches[{device, stream}];
  if (entry.capture_id != capture_id || !entry.memory.has_value()) {
    Tensor scratch = torch::stable::new_empty(like, {scratch_bytes(sms)}, ScalarType::Byte);
    Tensor counters = torch::stable::narrow(scratch, 0, 0, zeroed_bytes(sms));
    torch::stable::zero_(counters);
    entry = {capture_id, scratch};
    capture_scratches_held.store(capture_scratches.size(), std::memory_order_relaxed);
  }
  return static_cast<char*>(entry.memory->data_ptr());
}

// Points a launch at its scratch memory: the stream's, or while the stream is
// being captured into a CUDA graph, the capture's (CaptureScratch).
void attach_scratch(MatmulProblem& problem, const Tensor& like, int32_t device, cudaStream_t stream, int sms) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  unsigned long long capture_id = 0;
  STD_TORCH_CHECK(cudaStreamGetCaptureInfo(stream, &capture, &capture_id) == cudaSuccess,
                  "persistent_matmul: could not query the stream's capture status");
  if (capture == cudaStreamCaptureStatusNone) {
    end_capture_scratch(device, stream);
    point_at_scratch(problem, stream_scratch(device, stream, sms), sms);
    return;
  }
  STD_TORCH_CHECK(capture == cudaStreamCaptureStatusActive,
                  "persistent_matmul: the stream's CUDA graph capture was invalidated by an earlier call");
  point_at_scratch(problem, capture_scratch(like, device, stream, capture_id, sms), sms);
}

// Whether a persistent rung's tile order reads the scratch memory.
bool takes_scratch(int32_t tile_order) { return tile_order == kDynamic || tile_order == kSplitTail; }

// The dynamic order's first tile per CTA is the grouped order's (blockIdx.x),
// so where the grid holds every tile (small products) it assigns exactly what
// grouped does, and its counter lookup (host) and last claim (device) are pure
// cost: those launches run grouped. On the H200 the persistent rungs trailed
// their one-tile-per-CTA twins by 5-8% at 1024^3 and 16x4096x4096 with the
// counter. The same holds for the split-tail order, which splits nothing there
// and whose workspace lookup is then pure cost.
// (wgmma_persistent applies the same rule, persistent_matmul::wgmma_order_worth_running,
// where its split-tail order also splits the tiles of a grid that holds them all.)
int32_t order_worth_running(int32_t tile_order, const MatmulProblem& problem, int32_t device) {
  if (!takes_scratch(tile_order)) return tile_order;
  const auto cfg = persistent_matmul::tensor_core_tile_config(problem.m, problem.n, device);
  return cfg.tiles <= cfg.persistent_ctas ? kGrouped : tile_order;
}

// ------------------------------------------------------------------ the product

// Options of matmul_out; linear_fwd and matmul take the defaults.
struct Options {
  int64_t tile_order = -1;    // -1: the default, split tail (3)
  int64_t cluster_size = 0;   // 0 (the kernel picks), 1 or 2 (wgmma_persistent; wgmma_streamk takes 1)
  const std::optional<Tensor>* timeline = nullptr;
};


// The tile configuration of a rung with an instrumented build (rung_has_timeline)
// for an m x n output summed over k (k < 1: not known; only wgmma_streamk's grid depends on it),
// launched with `cluster_size` (0: the one the launch picks; wgmma_persistent's clusters, or
// wgmma_streamk's cut: 1 runs no clusters).
persistent_matmul::TileConfig tile_config_for(Rung rung, int64_t m, int64_t n, int64_t k, int device,
                                              int64_t cluster_size = 0) {
  switch (rung) {
    case Rung::kWgmma: {
      auto cfg = persistent_matmul::wgmma_tile_config(m, n, k, device);
      cfg.cluster_size = 1;  // one CTA per tile, no clusters
      return cfg;
    }
    case Rung::kWgmmaPersistent:
      return persistent_matmul::wgmma_tile_config(m, n, k, device, static_cast<int32_t>(cluster_size));
    case Rung::kWgmmaStreamk: return persistent_matmul::wgmma_streamk_tile_config(m, n, k, device, cluster_size != 1);
    default: return persistent_matmul::tensor_core_tile_config(m, n, device);
  }
}

// A launch's `cluster_size`: 0 (the kernel picks), 1 or 2, but not 2 for
// wgmma_streamk by name (`named`: the caller named the rung, not "auto"),
// which picks its clusters' size itself: 1 (none) is the one size a caller names.
void check_cluster_size(Rung rung, bool named, int64_t cluster_size) {
  STD_TORCH_CHECK(cluster_size >= 0 && cluster_size <= 2,
                  "persistent_matmul: cluster_size must be 0 (the kernel picks), 1 or 2, got ", cluster_size);
  STD_TORCH_CHECK(!(named && rung == Rung::kWgmmaStreamk && cluster_size == 2),
                  "persistent_matmul: kernel 'wgmma_streamk' takes cluster_size 1 (its stream-K cut, no clusters) or "
                  "0 (the kernel picks), got 2");
}

// wgmma_persistent's CTA pairs (cluster_size 2) where this build has them.
void check_pairs_built(int64_t cluster_size) {
  STD_TORCH_CHECK(cluster_size != 2 || persistent_matmul::wgmma_cluster_pairs_built(),
                  "persistent_matmul: cluster_size=2: this build (CUDA 12) has no CTA-pair kernels of "
                  "wgmma_persistent; pass cluster_size=1, or 0 to let the kernel pick");
}

// The columns of a timeline row (tensor_core_tile.cuh, TileRecord).
constexpr int64_t kTimelineColumns = 8;

void check_timeline(MatmulProblem& problem, const Tensor& t, int32_t device, const persistent_matmul::TileConfig& cfg) {
  STD_TORCH_CHECK(t.is_cuda() && t.get_device_index() == device, "persistent_matmul: timeline must be on cuda:",
                  device);
  STD_TORCH_CHECK(t.scalar_type() == ScalarType::Long && t.dim() == 2 && t.size(0) == cfg.timeline_rows &&
                      t.size(1) == kTimelineColumns && t.stride(0) == kTimelineColumns && t.stride(1) == 1,
                  "persistent_matmul: timeline must be a contiguous int64 tensor of shape [", cfg.timeline_rows, ", ",
                  kTimelineColumns, "]: a row per tile (", cfg.tiles, ") and per CTA the launch may run (",
                  cfg.timeline_rows - cfg.tiles, "), of columns tile_m, tile_n, k_begin, k_end, sm, cta, start_ns, "
                  "end_ns");
  problem.timeline = t.data_ptr();
}

// out = a @ b (+ bias) for views a (M x K) and b (K x N) of tensors on
// `device`, whose dtype `like` has; K >= 1, M, N >= 1, checked by the caller.
void multiply(const Tensor& like, View a, View b, const void* bias, const View& out, std::optional<Rung> named,
              const Options& opt) {
  const int32_t device = like.get_device_index();
  const DeviceFacts& facts = device_facts(device);
  const ElementType dtype = *element_type_of(like.scalar_type());
  const int64_t m = a.rows, n = b.cols, k = a.cols;
  Rung rung;
  if (named.has_value()) {
    rung = *named;
    STD_TORCH_CHECK(persistent_matmul::rung_runs_on(rung, facts), "persistent_matmul: kernel '",
                    persistent_matmul::rung_name(rung), "' does not run on cuda:", device, " (compute capability ",
                    facts.major, ".", facts.minor, ")");
    STD_TORCH_CHECK(persistent_matmul::rung_takes(rung, dtype), "persistent_matmul: kernel '",
                    persistent_matmul::rung_name(rung), "' does not take this dtype");
  } else {
    const int chunk = 8;
    const bool kmajor = aligned16(b.data) && b_kmajor(b, chunk);
    const auto chosen = persistent_matmul::choose_auto(facts, dtype, m, n, k, kmajor);
    STD_TORCH_CHECK(chosen.has_value(), "persistent_matmul: no kernel runs on cuda:", device,
                    " (compute capability ", facts.major, ".", facts.minor, "; 8.0 or newer is needed)");
    rung = *chosen;
  }

  const int chunk = persistent_matmul::rung_chunk_elements(rung);
  const bool weights_kmajor = rung == Rung::kSplitk || rung == Rung::kWgmmaStreamk;  // they read weight rows
  Prepared ops = chunk ? prepare_operands(like, a, b, chunk, weights_kmajor) : Prepared{a, b, {}, {}};

  MatmulProblem p;
  p.m = m;
  p.n = n;
  p.k = k;
  p.dtype = dtype;
  p.a = ops.a.data;
  p.a_stride_m = ops.a.row_stride;
  p.a_stride_k = ops.a.col_stride;
  p.b = ops.b.data;
  p.b_stride_k = ops.b.row_stride;
  p.b_stride_n = ops.b.col_stride;
  p.bias = bias;
  p.out = out.data;
  p.out_stride_m = out.row_stride;
  p.out_stride_n = out.col_stride;

  STD_TORCH_CHECK(opt.tile_order >= -1 && opt.tile_order <= 3,
                  "persistent_matmul: tile_order must be -1 (the default), 0 (grouped), 1 (Hilbert), 2 (dynamic) or 3 "
                  "(split tail), got ", opt.tile_order);
  check_cluster_size(rung, named.has_value(), opt.cluster_size);
  if (opt.timeline != nullptr && opt.timeline->has_value()) {
    STD_TORCH_CHECK(persistent_matmul::rung_has_timeline(rung), "persistent_matmul: kernel '",
                    persistent_matmul::rung_name(rung), "' has no instrumented build (no timeline)");
    check_timeline(p, **opt.timeline, device, tile_config_for(rung, m, n, k, device, opt.cluster_size));
  }

  const cudaStream_t stream = current_stream(device);
  cudaError_t err = cudaSuccess;
  switch (rung) {
    case Rung::kNaive: err = persistent_matmul::launch_naive(p, stream); break;
    case Rung::kWarptiled: err = persistent_matmul::launch_warptiled(p, stream); break;
    case Rung::kTiled: err = persistent_matmul::launch_tiled(p, stream); break;
    case Rung::kWgmma: err = persistent_matmul::launch_wgmma(p, stream); break;
    case Rung::kSplitk: err = persistent_matmul::launch_splitk(p, stream); break;
    case Rung::kWgmmaStreamk:
      p.cluster_size = opt.cluster_size == 1 ? 1 : 0;  // with kernel="auto", 2 is wgmma_persistent's
      attach_scratch(p, like, device, stream, facts.sms);
      err = persistent_matmul::launch_wgmma_streamk(p, stream);
      break;
    case Rung::kPersistent: {
      const int32_t order = opt.tile_order < 0 ? kSplitTail : int32_t(opt.tile_order);
      p.tile_order = order_worth_running(order, p, device);
      if (takes_scratch(p.tile_order)) attach_scratch(p, like, device, stream, facts.sms);
      err = persistent_matmul::launch_persistent(p, stream);
      break;
    }
    case Rung::kWgmmaPersistent: {
      int32_t order = opt.tile_order < 0 ? kSplitTail : int32_t(opt.tile_order);
      STD_TORCH_CHECK(opt.cluster_size != 2 || order != kDynamic,
                      "persistent_matmul: the dynamic tile order runs without clusters (cluster_size=1, or 0 to let "
                      "the kernel pick)");
      check_pairs_built(opt.cluster_size);
      p.cluster_size = opt.cluster_size == 0 ? persistent_matmul::wgmma_default_cluster_size(m)
                                             : static_cast<int32_t>(opt.cluster_size);
      // Pairs walk a static order: where the kernel picks them, the dynamic
      // order runs as grouped, and no counter is looked up.
      if (p.cluster_size == 2 && order == kDynamic) order = kGrouped;
      p.tile_order = persistent_matmul::wgmma_order_worth_running(order, p, device);
      if (takes_scratch(p.tile_order)) attach_scratch(p, like, device, stream, facts.sms);
      err = persistent_matmul::launch_wgmma_persistent(p, stream);
      break;
    }
  }
  STD_TORCH_CHECK(err == cudaSuccess, "persistent_matmul: kernel launch failed (", persistent_matmul::rung_name(rung),
                  "): ", cudaGetErrorString(err));
}

// out = bias broadcast over the rows, or zeros: the empty sum (K = 0).
void fill_empty_sum(Tensor& out, const std::optional<Tensor>& bias) {
  if (bias.has_value()) {
    torch::stable::copy_(out, *bias);
  } else {
    torch::stable::zero_(out);
  }
}

// A contiguous new tensor of `like`'s dtype and device.
Tensor new_output(const Tensor& like, const std::vector<int64_t>& sizes) {
  std::vector<int64_t> strides(sizes.size(), 1);
  for (int64_t d = int64_t(sizes.size()) - 2; d >= 0; --d) strides[d] = strides[d + 1] * std::max<int64_t>(sizes[d + 1], 1);
  int32_t dtype = 0;
  STD_TORCH_CHECK(aoti_torch_get_dtype(like.get(), &dtype) == AOTI_TORCH_SUCCESS, "persistent_matmul: dtype query failed");
  AtenTensorHandle handle = nullptr;
  STD_TORCH_CHECK(aoti_torch_empty_strided(int64_t(sizes.size()), sizes.data(), strides.data(), dtype,
                                           aoti_torch_device_type_cuda(), like.get_device_index(),
                                           &handle) == AOTI_TORCH_SUCCESS,
                  "persistent_matmul: could not allocate the output");
  return Tensor(handle);
}

// bias checked against N and made contiguous; its data pointer (nullptr for none).
const void* bias_data(const std::optional<Tensor>& bias, std::optional<Tensor>& contiguous_bias, int64_t n,
                      const Tensor& like, const char* like_name) {
  if (!bias.has_value()) return nullptr;
  const Tensor& t = *bias;
  check_operand(t, "bias", 1, 1);
  check_same(t, "bias", like, like_name);
  STD_TORCH_CHECK(t.size(0) == n, "persistent_matmul: bias has ", t.size(0), " elements, expected ", n);
  if (n > 1 && t.stride(0) != 1) {
    contiguous_bias = torch::stable::contiguous(t);
    return contiguous_bias->data_ptr();
  }
  return t.data_ptr();
}

}  // namespace

// ------------------------------------------------------------------ ops

Tensor linear_fwd_op(const Tensor& x_in, const Tensor& weight, const std::optional<Tensor>& bias, std::string kernel) {
  const auto named = parse_kernel(kernel);
  check_operand(x_in, "x", 1, 8);
  check_operand(weight, "weight", 2, 2);
  check_same(weight, "weight", x_in, "x");
  const int64_t n = weight.size(0), k = weight.size(1);
  STD_TORCH_CHECK(x_in.size(x_in.dim() - 1) == k, "persistent_matmul: x has ", x_in.size(x_in.dim() - 1),
                  " features in its last dim but weight is ", n, "x", k);
  torch::stable::accelerator::DeviceGuard guard(x_in.get_device_index());
  std::optional<Tensor> contiguous_bias;
  const void* bias_ptr = bias_data(bias, contiguous_bias, n, x_in, "x");

  // x as rows x K: the leading dims must collapse into one stride, else a copy.
  Tensor x = x_in;
  int64_t rows = 1, row_stride = k;
  bool collapsible = true;
  for (int64_t d = x.dim() - 2, expected = -1; d >= 0; --d) {
    rows *= x.size(d);
    if (x.size(d) == 1) continue;
    if (expected < 0) {
      row_stride = x.stride(d);
    } else if (x.stride(d) != expected) {
      collapsible = false;
    }
    expected = x.stride(d) * x.size(d);
  }
  if (!collapsible) {
    x = torch::stable::contiguous(x_in);
    row_stride = k;
  }
  std::vector<int64_t> out_sizes(x.sizes().begin(), x.sizes().end());
  out_sizes.back() = n;
  Tensor out = new_output(x, out_sizes);
  if (rows == 0 || n == 0) return out;
  if (k == 0) {
    Tensor out2d = torch::stable::from_blob(out.data_ptr(), {rows, n}, {n, 1}, out.device(), out.scalar_type());
    fill_empty_sum(out2d, contiguous_bias.has_value() ? contiguous_bias : bias);
    return out;
  }
  const View a{x.data_ptr(), rows, k, row_stride, x.stride(x.dim() - 1)};
  const View b{weight.data_ptr(), k, n, weight.stride(1), weight.stride(0)};  // weight.T
  multiply(x, a, b, bias_ptr, View{out.data_ptr(), rows, n, n, 1}, named, Options{});
  return out;
}

Tensor matmul_op(const Tensor& a, const Tensor& b, std::string kernel) {
  const auto named = parse_kernel(kernel);
  check_operand(a, "a", 2, 2);
  check_operand(b, "b", 2, 2);
  check_same(b, "b", a, "a");
  STD_TORCH_CHECK(a.size(1) == b.size(0), "persistent_matmul: a is ", a.size(0), "x", a.size(1), " but b is ",
                  b.size(0), "x", b.size(1));
  torch::stable::accelerator::DeviceGuard guard(a.get_device_index());
  Tensor out = new_output(a, {a.size(0), b.size(1)});
  if (out.numel() == 0) return out;
  if (a.size(1) == 0) {
    fill_empty_sum(out, std::nullopt);
    return out;
  }
  multiply(a, view_of(a), view_of(b), nullptr, view_of(out), named, Options{});
  return out;
}

void matmul_out_op(const Tensor& a, const Tensor& b, const std::optional<Tensor>& bias, Tensor& out, std::string kernel,
                int64_t tile_order, int64_t cluster_size, const std::optional<Tensor>& timeline) {
  const auto named = parse_kernel(kernel);
  check_operand(a, "a", 2, 2);
  check_operand(b, "b", 2, 2);
  check_operand(out, "out", 2, 2);
  check_same(b, "b", a, "a");
  check_same(out, "out", a, "a");
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  STD_TORCH_CHECK(b.size(0) == k, "persistent_matmul: a is ", m, "x", k, " but b is ", b.size(0), "x", n);
  STD_TORCH_CHECK(out.size(0) == m && out.size(1) == n, "persistent_matmul: out must be ", m, "x", n);
  STD_TORCH_CHECK(!internal_overlap(out), "persistent_matmul: out has overlapping elements");
  STD_TORCH_CHECK(!may_overlap(out, a) && !may_overlap(out, b) && !(bias.has_value() && may_overlap(out, *bias)),
                  "persistent_matmul: out overlaps an input in memory");
  torch::stable::accelerator::DeviceGuard guard(a.get_device_index());
  std::optional<Tensor> contiguous_bias;
  const void* bias_ptr = bias_data(bias, contiguous_bias, n, a, "a");
  if (m == 0 || n == 0) return;
  if (k == 0) {
    fill_empty_sum(out, contiguous_bias.has_value() ? contiguous_bias : bias);
    return;
  }
  Options opt;
  opt.tile_order = tile_order;
  opt.cluster_size = cluster_size;
  opt.timeline = &timeline;
  multiply(a, view_of(a), view_of(b), bias_ptr, view_of(out), named, opt);
}

std::string choose_kernel_op(int64_t major, int64_t minor, int64_t sms, ScalarType dtype, int64_t m, int64_t n,
                             int64_t k, bool b_kmajor, std::optional<bool> streamk_clusters) {
  const auto t = element_type_of(dtype);
  STD_TORCH_CHECK(t.has_value(), "persistent_matmul: choose_kernel takes float32, float16 or bfloat16");
  const DeviceFacts facts{int(major), int(minor), int(sms),
                          streamk_clusters.value_or(persistent_matmul::wgmma_streamk_clusters_built())};
  const auto rung = persistent_matmul::choose_auto(facts, *t, m, n, k, b_kmajor);
  return rung.has_value() ? std::string(persistent_matmul::rung_name(*rung)) : std::string("none");
}

std::tuple<Tensor, Tensor> operands_for_op(const Tensor& a, const Tensor& b, int64_t chunk, bool need_kmajor) {
  STD_TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(0) && a.scalar_type() == b.scalar_type(),
                  "persistent_matmul: operands_for takes a (M x K) and b (K x N) of one dtype");
  STD_TORCH_CHECK(chunk == 4 || chunk == 8, "persistent_matmul: chunk must be 4 or 8 elements, got ", chunk);
  const Prepared p = prepare_operands(a, view_of(a), view_of(b), int(chunk), need_kmajor);
  return {p.a_copy.value_or(a), p.b_copy.value_or(b)};
}

std::vector<int64_t> tile_config_op(int64_t m, int64_t n, int64_t device, std::string kernel, int64_t k,
                                    int64_t cluster_size) {
  STD_TORCH_CHECK(m >= 0 && n >= 0, "persistent_matmul: tile_config needs m, n >= 0");
  const auto rung = persistent_matmul::rung_named(kernel);
  if (!rung.has_value() || !persistent_matmul::rung_has_timeline(*rung)) {
    std::string names;
    for (auto name : persistent_matmul::kRungNames) {
      if (persistent_matmul::rung_has_timeline(*persistent_matmul::rung_named(name))) {
        names.append(names.empty() ? "" : ", ").append(name);
      }
    }
    STD_TORCH_CHECK(false, "persistent_matmul: kernel '", kernel, "' has no tile configuration; choose one of: ",
                    names);
  }
  check_cluster_size(*rung, true, cluster_size);
  STD_TORCH_CHECK(cluster_size == 0 || *rung == Rung::kWgmmaPersistent || *rung == Rung::kWgmmaStreamk,
                  "persistent_matmul: kernel '", kernel, "' takes no cluster_size (0), got ", cluster_size);
  check_pairs_built(cluster_size);
  int devices = 0;
  STD_TORCH_CHECK(cudaGetDeviceCount(&devices) == cudaSuccess && device >= 0 && device < devices,
                  "persistent_matmul: tile_config needs a CUDA device; cuda:", device, " is not present");
  torch::stable::accelerator::DeviceGuard guard(static_cast<int32_t>(device));  // the occupancy queries ask the current device
  const DeviceFacts& f = device_facts(static_cast<int32_t>(device));
  STD_TORCH_CHECK(persistent_matmul::rung_runs_on(*rung, f), "persistent_matmul: kernel '", kernel,
                  "' does not run on cuda:", device, " (compute capability ", f.major, ".", f.minor, ")");
  const auto cfg = tile_config_for(*rung, m, n, k, static_cast<int>(device), cluster_size);
  return {cfg.block_m, cfg.block_n, cfg.block_k, cfg.tiles, cfg.persistent_ctas, cfg.timeline_rows, cfg.cluster_size};
}

STABLE_TORCH_LIBRARY_EXPAND(TORCH_EXTENSION_NAME, ops) {
  ops.def("linear_fwd(Tensor x, Tensor weight, Tensor? bias, str kernel) -> Tensor");
  ops.def("matmul(Tensor a, Tensor b, str kernel) -> Tensor");
  ops.def(
      "matmul_out(Tensor a, Tensor b, Tensor? bias, Tensor(a!) out, str kernel, int tile_order=-1, "
      "int cluster_size=0, Tensor(b!)? timeline=None) -> ()");
  ops.def(
      "choose_kernel(int major, int minor, int sms, ScalarType dtype, int m, int n, int k, bool b_kmajor, "
      "bool? streamk_clusters=None) -> str");
  ops.def("operands_for(Tensor a, Tensor b, int chunk, bool need_kmajor) -> (Tensor, Tensor)");
  ops.def("tile_config(int m, int n, int device, str kernel=\"persistent\", int k=0, int cluster_size=0) -> int[]");
}

STABLE_TORCH_LIBRARY_IMPL_EXPAND(TORCH_EXTENSION_NAME, CUDA, ops) {
  ops.impl("linear_fwd", TORCH_BOX(&linear_fwd_op));
  ops.impl("matmul", TORCH_BOX(&matmul_op));
  ops.impl("matmul_out", TORCH_BOX(&matmul_out_op));
}

// These take no tensor or work on any device: registered for every dispatch key.
STABLE_TORCH_LIBRARY_IMPL_EXPAND(TORCH_EXTENSION_NAME, CompositeExplicitAutograd, ops) {
  ops.impl("choose_kernel", TORCH_BOX(&choose_kernel_op));
  ops.impl("operands_for", TORCH_BOX(&operands_for_op));
  ops.impl("tile_config", TORCH_BOX(&tile_config_op));
}

REGISTER_EXTENSION(TORCH_EXTENSION_NAME)
