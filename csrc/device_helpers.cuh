// Device helpers shared by the kernel rungs: element conversions to and from
// the fp32 accumulator, and integer helpers for grid arithmetic.
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

__host__ __device__ constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
__host__ __device__ constexpr int64_t min_i64(int64_t a, int64_t b) { return a < b ? a : b; }

}  // namespace persistent_matmul
