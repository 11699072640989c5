// The description of one matmul that the binding hands to every kernel rung,
// and the host-side launchers the rungs export. Plain C++ with no torch types,
// so the .cu files build without torch headers.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace persistent_matmul {

enum class ElementType : int32_t { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

// out[m, n] = sum_k a[m, k] * b[k, n] (+ bias[n]), accumulated in fp32.
// Every operand is addressed through element strides, so transposed and
// sliced tensors need no copy. All three matrices share one element type.
struct MatmulProblem {
  int64_t m = 0, n = 0, k = 0;
  ElementType dtype = ElementType::kFloat32;
  const void* a = nullptr;
  int64_t a_stride_m = 0, a_stride_k = 0;
  const void* b = nullptr;
  int64_t b_stride_k = 0, b_stride_n = 0;
  const void* bias = nullptr;  // n elements, contiguous; nullptr for none
  void* out = nullptr;
  int64_t out_stride_m = 0, out_stride_n = 0;
};

// Rung 1: one thread per output element. Returns the launch error, if any.
cudaError_t launch_naive(const MatmulProblem& problem, cudaStream_t stream);

}  // namespace persistent_matmul
