// Rung 1 — naive.
//
// One thread computes one output element: it walks the whole K dimension,
// reading one element of A and one of B per step straight from global memory,
// and accumulates in fp32. Nothing is reused through shared memory or
// registers, so the kernel is bound by memory traffic (2 loads per FMA). It is
// the baseline every later rung is measured against, and, since it honours
// arbitrary strides and has no alignment or size requirements, the reference
// path for any shape.
#include "device_helpers.cuh"
#include "matmul_problem.h"

namespace persistent_matmul {
namespace {

constexpr int kBlockCols = 32;  // threadIdx.x walks N: neighbouring threads write neighbouring columns
constexpr int kBlockRows = 8;
constexpr int64_t kMaxGridY = 65535;  // CUDA's limit on gridDim.y

template <typename T>
__global__ void naive_matmul_kernel(MatmulProblem p) {
  const T* a = static_cast<const T*>(p.a);
  const T* b = static_cast<const T*>(p.b);
  const T* bias = static_cast<const T*>(p.bias);
  T* out = static_cast<T*>(p.out);
  // Grid-stride loops: any M and N are covered whatever the grid limits.
  for (int64_t row = int64_t(blockIdx.y) * kBlockRows + threadIdx.y; row < p.m;
       row += int64_t(gridDim.y) * kBlockRows) {
    for (int64_t col = int64_t(blockIdx.x) * kBlockCols + threadIdx.x; col < p.n;
         col += int64_t(gridDim.x) * kBlockCols) {
      const T* a_row = a + row * p.a_stride_m;
      const T* b_col = b + col * p.b_stride_n;
      float acc = 0.0f;
      for (int64_t kk = 0; kk < p.k; ++kk) {
        acc = fmaf(to_float(a_row[kk * p.a_stride_k]), to_float(b_col[kk * p.b_stride_k]), acc);
      }
      if (bias != nullptr) acc += to_float(bias[col]);
      out[row * p.out_stride_m + col * p.out_stride_n] = from_float<T>(acc);
    }
  }
}

template <typename T>
cudaError_t launch_typed(const MatmulProblem& p, cudaStream_t stream) {
  const dim3 block(kBlockCols, kBlockRows);
  const int64_t grid_x = ceil_div(p.n, kBlockCols);
  const int64_t grid_y = ceil_div(p.m, kBlockRows);
  // gridDim.x may reach 2^31 - 1; the loops above cover what the grid does not.
  const dim3 grid(static_cast<unsigned>(grid_x < (int64_t(1) << 30) ? grid_x : (int64_t(1) << 30)),
                  static_cast<unsigned>(grid_y < kMaxGridY ? grid_y : kMaxGridY));
  naive_matmul_kernel<T><<<grid, block, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_naive(const MatmulProblem& problem, cudaStream_t stream) {
  if (problem.m == 0 || problem.n == 0) return cudaSuccess;
  switch (problem.dtype) {
    case ElementType::kFloat32: return launch_typed<float>(problem, stream);
    case ElementType::kFloat16: return launch_typed<__half>(problem, stream);
    case ElementType::kBFloat16: return launch_typed<__nv_bfloat16>(problem, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace persistent_matmul
