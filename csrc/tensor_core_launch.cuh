// Host side shared by rungs `tiled` and `persistent`: the tile shapes, the
// choice between them, operand layout checks and the dispatch over dtype,
// tile shape and B layout.
#pragma once

#include <type_traits>

#include "tensor_core_tile.cuh"

namespace persistent_matmul {
namespace tc {

// All shapes: 64-deep k-tiles (128-byte shared-memory rows), 3 or more stages.
// Huge problems on GPUs with 144 KB of shared memory per CTA (sm_80, sm_90,
// sm_100): 128x256 tiles of eight 64x64 warp tiles, 3 stages (144 KB), one
// CTA an SM. Against two 128x128 CTAs an SM it has the same warps and warp
// tiles but moves 25% fewer operand bytes into shared memory per mma, and
// with a single CTA on an SM, `persistent` overlapping the next tile's loads
// with this tile's epilogue is what keeps the SM busy between tiles.
// Large problems elsewhere (sm_86, sm_89, sm_120: 99 KB a CTA): 128x128
// tiles of four 64x64 warp tiles, 3 stages (96 KB), two CTAs an SM where
// 192 KB fit, one elsewhere. Small problems, where bigger tiles would leave
// SMs idle: 64x64 tiles of four 32x32 warp tiles, 4 stages (64 KB).
using HugeTile = TileShape<128, 256, 64, 2, 4, 3, 1>;
using LargeTile = TileShape<128, 128, 64, 2, 2, 3, 2>;
using SmallTile = TileShape<64, 64, 64, 2, 2, 4, 3>;

// A device attribute, asked of the runtime once per device (each query costs
// host time on every launch otherwise); `fallback` for a device index out of
// the table's range.
template <cudaDeviceAttr kAttribute, int kFallback>
inline int cached_device_attribute(int device) {
  static int cache[128] = {};
  if (device < 0 || device >= 128) return kFallback;
  if (cache[device] == 0) cudaDeviceGetAttribute(&cache[device], kAttribute, device);
  return cache[device];
}

inline int sm_count(int device) { return cached_device_attribute<cudaDevAttrMultiProcessorCount, 1>(device); }

inline int max_smem_per_block(int device) {
  return cached_device_attribute<cudaDevAttrMaxSharedMemoryPerBlockOptin, 0>(device);
}

enum class TileChoice { kHuge, kLarge, kSmall };

// The one tile-shape choice `tiled`, `persistent` and tile_config all use: the
// biggest shape whose tiles still cover every SM at least once (and that fits
// the device's shared memory).
inline TileChoice choose_tile(int64_t m, int64_t n, int device) {
  const int sms = sm_count(device);
  if (max_smem_per_block(device) >= HugeTile::SMEM_BYTES &&
      ceil_div(m, HugeTile::BM) * ceil_div(n, HugeTile::BN) >= sms) {
    return TileChoice::kHuge;
  }
  if (ceil_div(m, LargeTile::BM) * ceil_div(n, LargeTile::BN) >= sms) return TileChoice::kLarge;
  return TileChoice::kSmall;
}

// Calls f(Shape{}) for the shape choose_tile picks.
template <typename F>
auto with_tile_shape(int64_t m, int64_t n, int device, F&& f) {
  switch (choose_tile(m, n, device)) {
    case TileChoice::kHuge:
      return f(HugeTile{});
    case TileChoice::kLarge:
      return f(LargeTile{});
    default:
      return f(SmallTile{});
  }
}

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// How B is stored, if the tile can read it directly: K-major (column n's K
// values contiguous, as nn.Linear's weight) or N-major (a row-major b). With
// K == 1 or N == 1 the stride of that dim is irrelevant.
enum class BLayout { kKMajor, kNMajor, kUnsupported };

inline BLayout b_layout(const MatmulProblem& p) {
  if (!aligned16(p.b)) return BLayout::kUnsupported;
  if ((p.b_stride_k == 1 || p.k == 1) && (p.n == 1 || p.b_stride_n % 8 == 0)) return BLayout::kKMajor;
  if ((p.b_stride_n == 1 || p.n == 1) && (p.k == 1 || p.b_stride_k % 8 == 0)) return BLayout::kNMajor;
  return BLayout::kUnsupported;
}

// A must be K-contiguous with a leading dim that keeps rows 16-byte aligned.
inline bool a_ok(const MatmulProblem& p) {
  return aligned16(p.a) && (p.a_stride_k == 1 || p.k == 1) && (p.m == 1 || p.a_stride_m % 8 == 0);
}

inline bool operands_ok(const MatmulProblem& p) {
  return p.dtype != ElementType::kFloat32 && a_ok(p) && b_layout(p) != BLayout::kUnsupported;
}

inline TileOperands operands_of(const MatmulProblem& p, bool b_kmajor) {
  TileOperands op;
  op.a = static_cast<const char*>(p.a);
  op.lda = p.m == 1 ? 0 : p.a_stride_m;
  op.b = static_cast<const char*>(p.b);
  op.ldb = b_kmajor ? (p.n == 1 ? 0 : p.b_stride_n) : (p.k == 1 ? 0 : p.b_stride_k);
  op.m = p.m;
  op.n = p.n;
  op.k = p.k;
  return op;
}

template <typename T>
struct TypeTag {
  using type = T;
};

// Calls launch(TypeTag<T>, Shape, std::bool_constant<B_KMAJOR>) for the problem.
template <typename Launch>
cudaError_t dispatch(const MatmulProblem& p, int device, Launch&& launch) {
  if (!operands_ok(p)) return cudaErrorInvalidValue;
  const bool kmajor = b_layout(p) == BLayout::kKMajor;
  auto by_layout = [&](auto type, auto shape) {
    return kmajor ? launch(type, shape, std::true_type{}) : launch(type, shape, std::false_type{});
  };
  auto by_shape = [&](auto type) {
    return with_tile_shape(p.m, p.n, device, [&](auto shape) { return by_layout(type, shape); });
  };
  return p.dtype == ElementType::kBFloat16 ? by_shape(TypeTag<__nv_bfloat16>{}) : by_shape(TypeTag<__half>{});
}

// Dynamic shared memory a CTA of this shape asks for on `device`: at least
// what its stages need, raised so that no more than Shape::MIN_CTAS CTAs fit
// on an SM. Registers are capped for MIN_CTAS CTAs by the launch bounds, so
// every variant of a shape (dtype, B layout, instrumented or not) has the same
// occupancy, min(MIN_CTAS, what shared memory allows), for `tiled` and
// `persistent` alike.
template <typename Shape>
int smem_request(int device) {
  int per_sm = 0, per_block = 0;
  cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device);
  cudaDeviceGetAttribute(&per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  constexpr int kReservedPerCta = 1024;  // shared memory the runtime keeps per CTA
  const int limit_occupancy = per_sm / Shape::MIN_CTAS - kReservedPerCta;
  const int request = limit_occupancy > Shape::SMEM_BYTES ? limit_occupancy : Shape::SMEM_BYTES;
  return request < per_block ? request : per_block;
}

// Lets a kernel use more than 48 KB of dynamic shared memory, once per kernel
// and device (the template parameter is the kernel itself, so each kernel
// has its own flags).
template <auto kKernel>
cudaError_t allow_dynamic_smem(int bytes, int device) {
  static bool done[128] = {};
  if (device >= 0 && device < 128 && done[device]) return cudaSuccess;
  const cudaError_t err = cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err == cudaSuccess && device >= 0 && device < 128) done[device] = true;
  return err;
}

// Whether the image of kKernel that runs on `device` records timelines in
// its plain kernels (kPlainKernelRecords): compiled for compute capability
// 10.0 or newer, which the image's PTX version tells (the cubin of sm_100 also
// runs on 10.3, the PTX of compute_120 on newer GPUs). Asked once per device.
template <auto kKernel>
bool records_in_plain_kernel(int device) {
  static int known[128] = {};  // 1: no, 2: yes
  const bool cacheable = device >= 0 && device < 128;
  if (cacheable && known[device] != 0) return known[device] == 2;
  cudaFuncAttributes attributes = {};
  if (cudaFuncGetAttributes(&attributes, kKernel) != cudaSuccess) {
    cudaGetLastError();  // clear it: the launch reports real errors
    return false;
  }
  const bool records = attributes.ptxVersion >= 100;
  if (cacheable) known[device] = records ? 2 : 1;
  return records;
}

}  // namespace tc
}  // namespace persistent_matmul
