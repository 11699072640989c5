// Registration of the persistent_matmul ops through torch's stable ABI, and
// the one place where torch tensors become the plain MatmulProblem that the
// CUDA rungs take.
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/headeronly/util/Exception.h>

#include <map>
#include <mutex>
#include <utility>

#include "matmul_problem.h"
#include "registration.h"
#include "torch_binding.h"

namespace {

using persistent_matmul::ElementType;
using persistent_matmul::MatmulProblem;
using torch::headeronly::ScalarType;
using torch::stable::Tensor;

ElementType element_type_of(const Tensor& t, const char* name) {
  switch (t.scalar_type()) {
    case ScalarType::Float: return ElementType::kFloat32;
    case ScalarType::Half: return ElementType::kFloat16;
    case ScalarType::BFloat16: return ElementType::kBFloat16;
    default:
      STD_TORCH_CHECK(false, "persistent_matmul: ", name,
                      " must be float32, float16 or bfloat16");
  }
  return ElementType::kFloat32;  // unreachable
}

void check_cuda_on(const Tensor& t, const char* name, int32_t device) {
  STD_TORCH_CHECK(t.is_cuda(), "persistent_matmul: ", name, " must be a CUDA tensor");
  STD_TORCH_CHECK(t.get_device_index() == device, "persistent_matmul: ", name,
                  " is on cuda:", t.get_device_index(), " but a is on cuda:", device);
}

MatmulProblem describe(const Tensor& a, const Tensor& b, const std::optional<Tensor>& bias,
                       const Tensor& out) {
  STD_TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && out.dim() == 2,
                  "persistent_matmul: a, b and out must be 2-D");
  STD_TORCH_CHECK(a.is_cuda(), "persistent_matmul: a must be a CUDA tensor");
  const int32_t device = a.get_device_index();
  check_cuda_on(b, "b", device);
  check_cuda_on(out, "out", device);
  MatmulProblem p;
  p.m = a.size(0);
  p.k = a.size(1);
  p.n = b.size(1);
  STD_TORCH_CHECK(b.size(0) == p.k, "persistent_matmul: a is ", p.m, "x", p.k, " but b is ",
                  b.size(0), "x", p.n);
  STD_TORCH_CHECK(out.size(0) == p.m && out.size(1) == p.n, "persistent_matmul: out must be ",
                  p.m, "x", p.n);
  p.dtype = element_type_of(a, "a");
  STD_TORCH_CHECK(element_type_of(b, "b") == p.dtype && element_type_of(out, "out") == p.dtype,
                  "persistent_matmul: a, b and out must have the same dtype");
  p.a = a.data_ptr();
  p.a_stride_m = a.stride(0);
  p.a_stride_k = a.stride(1);
  p.b = b.data_ptr();
  p.b_stride_k = b.stride(0);
  p.b_stride_n = b.stride(1);
  p.out = out.data_ptr();
  p.out_stride_m = out.stride(0);
  p.out_stride_n = out.stride(1);
  if (bias.has_value()) {
    const Tensor& bias_t = *bias;
    check_cuda_on(bias_t, "bias", device);
    STD_TORCH_CHECK(bias_t.dim() == 1 && bias_t.size(0) == p.n && (p.n <= 1 || bias_t.stride(0) == 1),
                    "persistent_matmul: bias must be a contiguous 1-D tensor of ", p.n, " elements");
    STD_TORCH_CHECK(element_type_of(bias_t, "bias") == p.dtype,
                    "persistent_matmul: bias must have the dtype of a");
    p.bias = bias_t.data_ptr();
  }
  return p;
}

using Launcher = cudaError_t (*)(const MatmulProblem&, cudaStream_t);
using TileConfigOf = persistent_matmul::TileConfig (*)(int64_t m, int64_t n, int device);

// Checks the operands of a tensor-core rung and attaches the timeline buffer,
// which needs one row per output tile of the rung's tile configuration.
void prepare_tensor_core(MatmulProblem& problem, const Tensor& a, const std::optional<Tensor>& timeline,
                         TileConfigOf tile_config_of = persistent_matmul::tensor_core_tile_config) {
  STD_TORCH_CHECK(problem.dtype != ElementType::kFloat32,
                  "persistent_matmul: the tensor-core rungs take float16 and bfloat16, not float32");
  STD_TORCH_CHECK(persistent_matmul::tensor_core_operands_ok(problem),
                  "persistent_matmul: operand layout not taken by the tensor-core rungs (A needs K "
                  "contiguous, B K or N contiguous, leading dims multiples of 8, 16-byte aligned data); "
                  "persistent_matmul.matmul copies such operands first");
  if (!timeline.has_value()) return;
  const Tensor& t = *timeline;
  check_cuda_on(t, "timeline", a.get_device_index());
  const auto cfg = tile_config_of(problem.m, problem.n, a.get_device_index());
  STD_TORCH_CHECK(t.scalar_type() == ScalarType::Long && t.dim() == 2 && t.size(0) == cfg.tiles &&
                      t.size(1) == 6 && t.stride(0) == 6 && t.stride(1) == 1,
                  "persistent_matmul: timeline must be a contiguous int64 tensor of shape [", cfg.tiles, ", 6]");
  problem.timeline = t.data_ptr();
}

// The Hopper rungs have machine code for sm_90a only.
void check_hopper(int32_t device) {
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  STD_TORCH_CHECK(major == 9 && minor == 0, "persistent_matmul: the wgmma rungs need a Hopper GPU (compute capability "
                  "9.0); cuda:", device, " is ", major, ".", minor);
}

void check_tile_order(int64_t tile_order) {
  STD_TORCH_CHECK(tile_order >= 0 && tile_order <= 3,
                  "persistent_matmul: tile_order must be 0 (grouped), 1 (Hilbert), 2 (dynamic) or 3 (split tail), got ",
                  tile_order);
}

cudaStream_t current_stream(int32_t device) {
  void* stream = nullptr;
  STD_TORCH_CHECK(aoti_torch_get_current_cuda_stream(device, &stream) == AOTI_TORCH_SUCCESS,
                  "persistent_matmul: could not get the current CUDA stream");
  return static_cast<cudaStream_t>(stream);
}

// The persistent rungs' scratch memory for one launch: the dynamic and
// split-tail orders' tile counter (a uint32, in the first 16 bytes), then the
// split-tail order's workspace (matmul_problem.h: the partial-sum slots of
// the device's SMs, then their flags). Zero at launch where it matters: each
// launch leaves the counter and the flags zero again (claim_tile_index,
// wait_and_clear_flag).
constexpr int64_t kCounterBytes = 16;

int64_t scratch_bytes(int32_t device) {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  return kCounterBytes + sms * (persistent_matmul::kSplitPartialBytesPerSm + persistent_matmul::kSplitFlagsPerSm * 4);
}

void point_at_scratch(MatmulProblem& problem, char* scratch, int32_t device) {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  problem.tile_counter = reinterpret_cast<uint32_t*>(scratch);
  problem.partials = reinterpret_cast<float*>(scratch + kCounterBytes);
  problem.partial_flags =
      reinterpret_cast<uint32_t*>(scratch + kCounterBytes + sms * persistent_matmul::kSplitPartialBytesPerSm);
}

// The scratch memory for launches on `stream`: allocated and zeroed on first
// use and kept for the process. Launches on one stream run one after another,
// so they never share it at the same time; a call costs a lookup, not an
// allocation and a fill.
char* stream_scratch(int32_t device, cudaStream_t stream) {
  static std::mutex mutex;
  static std::map<std::pair<int32_t, cudaStream_t>, char*> scratches;
  const std::lock_guard<std::mutex> lock(mutex);
  char*& scratch = scratches[{device, stream}];
  if (scratch == nullptr) {
    void* memory = nullptr;
    const int64_t bytes = scratch_bytes(device);
    const cudaError_t err = cudaMalloc(&memory, bytes);
    STD_TORCH_CHECK(err == cudaSuccess && cudaMemsetAsync(memory, 0, bytes, stream) == cudaSuccess,
                    "persistent_matmul: could not allocate the tile orders' scratch memory (", bytes, " bytes): ",
                    cudaGetErrorString(err == cudaSuccess ? cudaGetLastError() : err));
    scratch = static_cast<char*>(memory);
  }
  return scratch;
}

// Sets the problem's tile order; the dynamic and split-tail orders also get
// the scratch memory: the stream's, or while the stream is being captured
// into a CUDA graph, a fresh zeroed one from torch's allocator (cudaMalloc
// may not run during capture, and the graph may be replayed on any stream;
// the zero-fill is part of the graph). That tensor is returned: it must
// outlive the launch call.
std::optional<Tensor> set_tile_order(MatmulProblem& problem, const Tensor& a, int64_t tile_order) {
  check_tile_order(tile_order);
  problem.tile_order = static_cast<int32_t>(tile_order);
  if (tile_order != 2 && tile_order != 3) return std::nullopt;
  const int32_t device = a.get_device_index();
  torch::stable::accelerator::DeviceGuard guard(device);
  const cudaStream_t stream = current_stream(device);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  STD_TORCH_CHECK(cudaStreamIsCapturing(stream, &capture) == cudaSuccess,
                  "persistent_matmul: could not query the stream's capture status");
  if (capture == cudaStreamCaptureStatusNone) {
    point_at_scratch(problem, stream_scratch(device, stream), device);
    return std::nullopt;
  }
  Tensor scratch = torch::stable::new_zeros(a, {scratch_bytes(device)}, ScalarType::Byte);
  point_at_scratch(problem, static_cast<char*>(scratch.data_ptr()), device);
  return scratch;
}

// The dynamic order's first tile per CTA is the grouped order's (blockIdx.x),
// so where the grid holds every tile (small products) it assigns exactly what
// grouped does, and its counter lookup (host) and last claim (device) are pure
// cost: those launches run grouped. On the H200 the persistent rungs trailed
// their one-tile-per-CTA twins by 5-8% at 1024^3 and 16x4096x4096 with the
// counter (2026-11-30). The same holds for the split-tail order, which splits
// nothing there and whose workspace lookup is then pure cost.
int64_t order_worth_running(int64_t tile_order, const MatmulProblem& problem, int32_t device,
                            TileConfigOf tile_config_of) {
  if (tile_order != 2 && tile_order != 3) return tile_order;
  torch::stable::accelerator::DeviceGuard guard(device);  // the occupancy queries ask the current device
  const auto cfg = tile_config_of(problem.m, problem.n, device);
  return cfg.tiles <= cfg.persistent_ctas ? 0 : tile_order;
}

void launch_on_stream(Launcher launch, const MatmulProblem& problem, int32_t device) {
  torch::stable::accelerator::DeviceGuard guard(device);
  const cudaError_t err = launch(problem, current_stream(device));
  STD_TORCH_CHECK(err == cudaSuccess, "persistent_matmul: kernel launch failed: ", cudaGetErrorString(err));
}

void run(Launcher launch, const Tensor& a, const Tensor& b, const std::optional<Tensor>& bias,
         const Tensor& out) {
  launch_on_stream(launch, describe(a, b, bias, out), a.get_device_index());
}

void run_tensor_core(Launcher launch, const Tensor& a, const Tensor& b, const std::optional<Tensor>& bias,
                     const Tensor& out, const std::optional<Tensor>& timeline) {
  MatmulProblem problem = describe(a, b, bias, out);
  prepare_tensor_core(problem, a, timeline);
  launch_on_stream(launch, problem, a.get_device_index());
}

}  // namespace

void naive_op(const Tensor& a, const Tensor& b, const std::optional<Tensor>& bias, Tensor& out) {
  run(persistent_matmul::launch_naive, a, b, bias, out);
}

void warptiled_op(const Tensor& a, const Tensor& b, const std::optional<Tensor>& bias, Tensor& out) {
  const MatmulProblem problem = describe(a, b, bias, out);
  STD_TORCH_CHECK(problem.dtype == ElementType::kFloat32, "persistent_matmul: warptiled takes float32 only");
  STD_TORCH_CHECK(persistent_matmul::cuda_core_operands_ok(problem),
                  "persistent_matmul: operand layout not taken by warptiled (A needs K contiguous, B K or N "
                  "contiguous, leading dims multiples of 4, 16-byte aligned data); persistent_matmul.matmul "
                  "copies such operands first");
  launch_on_stream(persistent_matmul::launch_warptiled, problem, a.get_device_index());
}

void tiled_op(const Tensor& a, const Tensor& b, const std::optional<Tensor>& bias, Tensor& out,
                  const std::optional<Tensor>& timeline) {
  run_tensor_core(persistent_matmul::launch_tiled, a, b, bias, out, timeline);
}

void persistent_op(const Tensor& a, const Tensor& b, const std::optional<Tensor>& bias, Tensor& out,
                   const std::optional<Tensor>& timeline, int64_t tile_order) {
  MatmulProblem problem = describe(a, b, bias, out);
  prepare_tensor_core(problem, a, timeline);
  tile_order =
      order_worth_running(tile_order, problem, a.get_device_index(), persistent_matmul::tensor_core_tile_config);
  const auto counter = set_tile_order(problem, a, tile_order);
  launch_on_stream(persistent_matmul::launch_persistent, problem, a.get_device_index());
}

void wgmma_op(const Tensor& a, const Tensor& b, const std::optional<Tensor>& bias, Tensor& out,
              const std::optional<Tensor>& timeline) {
  MatmulProblem problem = describe(a, b, bias, out);
  check_hopper(a.get_device_index());
  prepare_tensor_core(problem, a, timeline, persistent_matmul::wgmma_tile_config);
  launch_on_stream(persistent_matmul::launch_wgmma, problem, a.get_device_index());
}

void wgmma_persistent_op(const Tensor& a, const Tensor& b, const std::optional<Tensor>& bias, Tensor& out,
                         const std::optional<Tensor>& timeline, int64_t tile_order, int64_t cluster_size) {
  STD_TORCH_CHECK(cluster_size >= 0 && cluster_size <= 2,
                  "persistent_matmul: cluster_size must be 0 (the kernel picks), 1 or 2, got ", cluster_size);
  STD_TORCH_CHECK(cluster_size != 2 || tile_order != 2,
                  "persistent_matmul: the dynamic tile order runs without clusters (cluster_size=1, or 0 to let "
                  "the kernel pick)");
  MatmulProblem problem = describe(a, b, bias, out);
  check_hopper(a.get_device_index());
  prepare_tensor_core(problem, a, timeline, persistent_matmul::wgmma_tile_config);
  problem.cluster_size =
      cluster_size == 0 ? persistent_matmul::wgmma_cluster_size_for(problem.m) : static_cast<int32_t>(cluster_size);
  // Pairs walk a static order: where the kernel picks them, the dynamic order
  // runs as grouped, and no counter is looked up.
  if (problem.cluster_size == 2 && tile_order == 2) tile_order = 0;
  tile_order = order_worth_running(tile_order, problem, a.get_device_index(), persistent_matmul::wgmma_tile_config);
  const auto counter = set_tile_order(problem, a, tile_order);
  launch_on_stream(persistent_matmul::launch_wgmma_persistent, problem, a.get_device_index());
}

std::vector<int64_t> tile_config(int64_t m, int64_t n, int64_t device, bool hopper) {
  STD_TORCH_CHECK(m >= 0 && n >= 0, "persistent_matmul: tile_config needs m, n >= 0");
  int devices = 0;
  STD_TORCH_CHECK(cudaGetDeviceCount(&devices) == cudaSuccess && device >= 0 && device < devices,
                  "persistent_matmul: tile_config needs a CUDA device; cuda:", device, " is not present");
  if (hopper) check_hopper(static_cast<int32_t>(device));
  const auto cfg = hopper ? persistent_matmul::wgmma_tile_config(m, n, static_cast<int>(device))
                          : persistent_matmul::tensor_core_tile_config(m, n, static_cast<int>(device));
  return {cfg.block_m, cfg.block_n, cfg.block_k, cfg.tiles, cfg.persistent_ctas};
}

STABLE_TORCH_LIBRARY_EXPAND(TORCH_EXTENSION_NAME, ops) {
  ops.def("naive(Tensor a, Tensor b, Tensor? bias, Tensor(a!) out) -> ()");
  ops.def("warptiled(Tensor a, Tensor b, Tensor? bias, Tensor(a!) out) -> ()");
  ops.def("tiled(Tensor a, Tensor b, Tensor? bias, Tensor(a!) out, Tensor(b!)? timeline) -> ()");
  ops.def(
      "persistent(Tensor a, Tensor b, Tensor? bias, Tensor(a!) out, Tensor(b!)? timeline, int tile_order=2) -> ()");
  ops.def("wgmma(Tensor a, Tensor b, Tensor? bias, Tensor(a!) out, Tensor(b!)? timeline) -> ()");
  ops.def(
      "wgmma_persistent(Tensor a, Tensor b, Tensor? bias, Tensor(a!) out, Tensor(b!)? timeline, int tile_order=2, "
      "int cluster_size=0) -> ()");
  ops.def("tile_config(int m, int n, int device, bool hopper=False) -> int[]");
}

STABLE_TORCH_LIBRARY_IMPL_EXPAND(TORCH_EXTENSION_NAME, CUDA, ops) {
  ops.impl("naive", TORCH_BOX(&naive_op));
  ops.impl("warptiled", TORCH_BOX(&warptiled_op));
  ops.impl("tiled", TORCH_BOX(&tiled_op));
  ops.impl("persistent", TORCH_BOX(&persistent_op));
  ops.impl("wgmma", TORCH_BOX(&wgmma_op));
  ops.impl("wgmma_persistent", TORCH_BOX(&wgmma_persistent_op));
}

// tile_config takes no tensor, so it is registered for every dispatch key.
STABLE_TORCH_LIBRARY_IMPL_EXPAND(TORCH_EXTENSION_NAME, CompositeExplicitAutograd, ops) {
  ops.impl("tile_config", TORCH_BOX(&tile_config));
}

REGISTER_EXTENSION(TORCH_EXTENSION_NAME)
