// Device helpers shared by the kernel rungs: element conversions to and from
// the fp32 accumulator, the mma.sync tensor-core instruction, integer helpers
// for grid arithmetic, flags one CTA sets for another, and the sm_90 (Hopper
// and newer, not only sm_90a) shared-memory stores and bulk copies of the
// epilogues that stage output tiles in shared memory.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace persistent_matmul {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// d += a (16 x 16, row-major fragments) * b (16 x 8, column-major fragments),
// fp32 accumulators: mma.sync m16n8k16 (sm_80 and newer).
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma_16816<__half>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Copies the first `bytes` (even, 0..16) of the 16-byte chunk at src (16-byte
// aligned) to shared memory at dst and zero-fills the rest. Whole chunks go
// through cp.async; the rare partial or empty chunks at a tensor's edges are
// read two bytes at a time and stored by the thread, so nothing outside the
// tensor is ever addressed. (cp.async's src-size form would read only the
// valid bytes too, but compute-sanitizer's memcheck counts all 16 of them:
// seen on the H200 with a 1x1 operand.) A thread's plain store lands before
// the barrier that publishes its cp.async group, so readers see both alike.
__device__ __forceinline__ void copy_chunk_16(uint32_t dst, const void* src, int bytes) {
  if (bytes == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
    return;
  }
  const uint16_t* halves = static_cast<const uint16_t*>(src);
  uint32_t words[4] = {0, 0, 0, 0};
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    if (2 * i < bytes) words[i / 2] |= uint32_t(halves[i]) << (16 * (i % 2));
  }
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst), "r"(words[0]), "r"(words[1]), "r"(words[2]),
               "r"(words[3])
               : "memory");
}

// A flag in global memory that one CTA sets for another (the split-tail
// order's partial tiles, tile_scheduler.cuh): the setter's earlier writes
// are visible to a reader that has seen the flag set (release / acquire at
// GPU scope; sm_70 and newer).
__device__ __forceinline__ void store_release_gpu(uint32_t* flag, uint32_t value) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(flag), "r"(value) : "memory");
}

__device__ __forceinline__ uint32_t load_acquire_gpu(const uint32_t* flag) {
  uint32_t value;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(value) : "l"(flag) : "memory");
  return value;
}

// Waits until `flag` is set, then clears it for the next launch.
__device__ __forceinline__ void wait_and_clear_flag(uint32_t* flag) {
  while (load_acquire_gpu(flag) == 0) __nanosleep(64);
  *static_cast<volatile uint32_t*>(flag) = 0;
}

// ---------------------------------------------------------------- sm_90 and newer
// Call these only from code compiled for __CUDA_ARCH__ >= 900.

// Four 8 x 8 matrices of 16-bit elements from a warp's registers to shared
// memory: lane l holds, in r_i, the two elements of row l / 4, columns
// 2 (l % 4) and 2 (l % 4) + 1 of matrix i (the layout of mma's and wgmma's
// accumulator fragments), and gives in `addr` the shared-window address of
// row l % 8 of matrix l / 8 (16 bytes, 16-byte aligned).
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
}

// Makes this thread's ordinary shared-memory stores visible to the copy
// engine (TMA and bulk copies read shared memory through the async proxy).
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// `bytes` (a multiple of 16) of shared memory at `src` to global memory at
// `dst` (both 16-byte aligned) by the copy engine, in this thread's current
// bulk group: the thread goes on at once.
__device__ __forceinline__ void bulk_copy_to_global(void* dst, uint32_t src, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst), "r"(src), "r"(bytes)
               : "memory");
}

// Bulk copies (and TMA stores) are grouped per thread: bulk_commit closes
// the thread's current group; bulk_wait_read<N> returns once at most N of its
// groups still read shared memory, bulk_wait<N> once at most N still write
// global memory.
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }

template <int N>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}

template <int N>
__device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;" ::"n"(N) : "memory");
}

__host__ __device__ constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
__host__ __device__ constexpr int64_t min_i64(int64_t a, int64_t b) { return a < b ? a : b; }

}  // namespace persistent_matmul
