// Rung 2 — warptiled: fp32 SGEMM on CUDA cores.
//
// Over `naive`, which reads two global values per FMA, every operand value is
// reused many times from fast memory:
// * block tile: a CTA computes a 128x128 output tile; each 8-deep k-tile of A
//   and B is read from global memory once, with 16-byte loads, into shared
//   memory (A stored transposed, so threads read it along M with 16-byte loads
//   too). Two shared-memory buffers: the next k-tile is fetched into registers
//   while the current one is multiplied, then stored into the other buffer.
// * warp tile: each of the 8 warps owns a 32x64 part of the tile, so a warp's
//   shared-memory reads are broadcasts (A) or one contiguous 128-byte line (B),
//   free of bank conflicts.
// * thread tile: each thread accumulates an 8x8 block (2x2 sub-blocks of 4x4)
//   in registers: per k step it loads 2 + 2 float4 and does 64 FMAs. At 128
//   registers two CTAs (16 warps) share an SM.
// Edges: chunks past M, N or K are zeros; a chunk cut by an edge is read
// element by element. Operands arrive K-contiguous (A, and B when stored
// K-major) or N-contiguous (B row-major) with 16-byte-aligned rows; the host
// copies anything else (persistent_matmul._matmul.cuda_core_operands).
#include "device_helpers.cuh"
#include "matmul_problem.h"

namespace persistent_matmul {
namespace {

constexpr int BM = 128, BN = 128, BK = 8;
constexpr int THREADS = 256;
constexpr int WARPS_N = 2;            // warps tile the block 4 (M) x 2 (N): 32x64 each
constexpr int WM = 32, WN = 64;
constexpr int PAD = 4;                // shared rows of 132 floats: transposed stores hit distinct banks
constexpr int CHUNKS_A = BM * BK / 4 / THREADS;  // float4 chunks each thread loads per k-tile, per operand
constexpr int K_CHUNKS = BK / 4;                   // float4 chunks along K in a row of A (or K-major B)
constexpr int N_CHUNKS = BN / 4;                   // float4 chunks along N in a row of N-major B
static_assert(CHUNKS_A >= 1 && BM * BK / 4 % THREADS == 0, "every thread loads whole chunks");

struct SharedTiles {
  float a[2][BK][BM + PAD];  // a[.][k][m]
  float b[2][BK][BN + PAD];  // b[.][k][n]
};

// Reads the 4 floats at src whose index along the contiguous dim is < valid (0..4+).
__device__ __forceinline__ float4 load_chunk(const float* src, int64_t valid) {
  if (valid >= 4) return *reinterpret_cast<const float4*>(src);
  float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
  if (valid > 0) v.x = src[0];
  if (valid > 1) v.y = src[1];
  if (valid > 2) v.z = src[2];
  return v;
}

// The chunk of each k-tile a thread fetches, with its address worked out once
// per CTA: for an operand stored "rows x contiguous k" (A, or B K-major) the
// thread owns row threadIdx.x / K_CHUNKS and k-chunk threadIdx.x % K_CHUNKS
// (CHUNKS_A == 1); for B N-major, k-row threadIdx.x / N_CHUNKS and n-chunk
// threadIdx.x % N_CHUNKS. Each k-tile then costs a pointer bump and one
// compare per operand.
static_assert(CHUNKS_A == 1, "the loader below fetches one chunk per operand and k-tile");

struct Fetched {
  float4 a, b;
};

template <bool B_KMAJOR>
struct Loader {
  const float* a;  // this thread's A chunk in k-tile 0
  const float* b;  // this thread's B chunk in k-tile 0
  int64_t a_k, b_k;  // k (of the chunk's first element; for N-major B, of its row) in k-tile 0
  int64_t b_step;    // elements from one k-tile's B chunk to the next
  int64_t b_valid;   // N-major B: elements of the chunk inside N
  bool a_row_ok, b_row_ok;

  __device__ Loader(const MatmulProblem& p, int64_t tile_m, int64_t tile_n) {
    const int t = threadIdx.x;
    const int64_t m = tile_m * BM + t / K_CHUNKS;
    a_k = (t % K_CHUNKS) * 4;
    a_row_ok = m < p.m;
    a = static_cast<const float*>(p.a) + (a_row_ok ? m * p.a_stride_m : 0) + a_k;
    if constexpr (B_KMAJOR) {
      const int64_t n = tile_n * BN + t / K_CHUNKS;
      b_k = a_k;
      b_row_ok = n < p.n;
      b = static_cast<const float*>(p.b) + (b_row_ok ? n * p.b_stride_n : 0) + b_k;
      b_step = BK;
      b_valid = 4;
    } else {
      const int64_t n = tile_n * BN + (t % N_CHUNKS) * 4;
      b_k = t / N_CHUNKS;
      b_valid = p.n - n;
      b_row_ok = b_valid > 0;
      b = static_cast<const float*>(p.b) + b_k * p.b_stride_k + (b_row_ok ? n : 0);
      b_step = BK * p.b_stride_k;
    }
  }

  __device__ __forceinline__ void fetch(const MatmulProblem& p, int64_t kt, Fetched& f) const {
    const int64_t k0 = kt * BK;
    f.a = a_row_ok ? load_chunk(a + k0, p.k - (k0 + a_k)) : make_float4(0.f, 0.f, 0.f, 0.f);
    if constexpr (B_KMAJOR) {
      f.b = b_row_ok ? load_chunk(b + k0, p.k - (k0 + b_k)) : make_float4(0.f, 0.f, 0.f, 0.f);
    } else {
      f.b = b_row_ok && k0 + b_k < p.k ? load_chunk(b + kt * b_step, b_valid) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
};

template <bool B_KMAJOR>
__device__ __forceinline__ void store(SharedTiles& s, int buf, const Fetched& f) {
  const int row = threadIdx.x / K_CHUNKS, k = (threadIdx.x % K_CHUNKS) * 4;
  s.a[buf][k + 0][row] = f.a.x;
  s.a[buf][k + 1][row] = f.a.y;
  s.a[buf][k + 2][row] = f.a.z;
  s.a[buf][k + 3][row] = f.a.w;
  if constexpr (B_KMAJOR) {
    s.b[buf][k + 0][row] = f.b.x;
    s.b[buf][k + 1][row] = f.b.y;
    s.b[buf][k + 2][row] = f.b.z;
    s.b[buf][k + 3][row] = f.b.w;
  } else {
    *reinterpret_cast<float4*>(&s.b[buf][threadIdx.x / N_CHUNKS][(threadIdx.x % N_CHUNKS) * 4]) = f.b;
  }
}

template <bool B_KMAJOR>
__global__ void __launch_bounds__(THREADS, 2) warptiled_kernel(MatmulProblem p) {
  __shared__ __align__(16) SharedTiles s;
  const int64_t tile_m = blockIdx.x, tile_n = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int warp_m = warp / WARPS_N, warp_n = warp % WARPS_N;
  const int tm = lane / 8, tn = lane % 8;  // thread within the warp tile: 4 x 8
  // The thread's rows: m_base + {0..3} and m_base + 16 + {0..3}; columns likewise with 32.
  const int m_base = warp_m * WM + tm * 4, n_base = warp_n * WN + tn * 4;

  float acc[8][8] = {};
  const int64_t k_tiles = ceil_div(p.k, BK);
  const Loader<B_KMAJOR> loader(p, tile_m, tile_n);
  Fetched f;
  loader.fetch(p, 0, f);
  store<B_KMAJOR>(s, 0, f);
  __syncthreads();
  for (int64_t kt = 0; kt < k_tiles; ++kt) {
    const int buf = kt % 2;
    if (kt + 1 < k_tiles) loader.fetch(p, kt + 1, f);
#pragma unroll
    for (int k = 0; k < BK; ++k) {
      const float4 a0 = *reinterpret_cast<const float4*>(&s.a[buf][k][m_base]);
      const float4 a1 = *reinterpret_cast<const float4*>(&s.a[buf][k][m_base + 16]);
      const float4 b0 = *reinterpret_cast<const float4*>(&s.b[buf][k][n_base]);
      const float4 b1 = *reinterpret_cast<const float4*>(&s.b[buf][k][n_base + 32]);
      const float av[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
      const float bv[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
    }
    if (kt + 1 < k_tiles) store<B_KMAJOR>(s, buf ^ 1, f);
    __syncthreads();
  }

  float* out = static_cast<float*>(p.out);
  const float* bias = static_cast<const float*>(p.bias);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int64_t row = tile_m * BM + m_base + (i / 4) * 16 + i % 4;
    if (row >= p.m) continue;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int64_t col = tile_n * BN + n_base + half * 32;
      float v[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) v[j] = acc[i][half * 4 + j] + (bias && col + j < p.n ? bias[col + j] : 0.0f);
      float* dst = out + row * p.out_stride_m + col * p.out_stride_n;
      if (p.out_stride_n == 1 && col + 3 < p.n && reinterpret_cast<uintptr_t>(dst) % 16 == 0) {
        *reinterpret_cast<float4*>(dst) = make_float4(v[0], v[1], v[2], v[3]);  // one 16-byte store
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j)
          if (col + j < p.n) dst[j * p.out_stride_n] = v[j];
      }
    }
  }
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

}  // namespace

bool cuda_core_operands_ok(const MatmulProblem& p) {
  if (p.dtype != ElementType::kFloat32 || !aligned16(p.a) || !aligned16(p.b)) return false;
  const bool a_ok = (p.a_stride_k == 1 || p.k == 1) && (p.m == 1 || p.a_stride_m % 4 == 0);
  const bool b_kmajor = (p.b_stride_k == 1 || p.k == 1) && (p.n == 1 || p.b_stride_n % 4 == 0);
  const bool b_nmajor = (p.b_stride_n == 1 || p.n == 1) && (p.k == 1 || p.b_stride_k % 4 == 0);
  return a_ok && (b_kmajor || b_nmajor);
}

cudaError_t launch_warptiled(const MatmulProblem& problem, cudaStream_t stream) {
  if (problem.m == 0 || problem.n == 0) return cudaSuccess;
  if (!cuda_core_operands_ok(problem)) return cudaErrorInvalidValue;
  MatmulProblem p = problem;
  // A dim of size 1 may carry any stride: use one the loads accept.
  if (p.m == 1) p.a_stride_m = 0;
  if (p.k == 1) p.a_stride_k = 1;
  const bool b_kmajor = (p.b_stride_k == 1 || p.k == 1) && (p.n == 1 || p.b_stride_n % 4 == 0);
  if (b_kmajor) {
    if (p.k == 1) p.b_stride_k = 1;
    if (p.n == 1) p.b_stride_n = 0;
  } else {
    if (p.n == 1) p.b_stride_n = 1;
    if (p.k == 1) p.b_stride_k = 0;
  }
  // M on grid.x (up to 2^31 - 1 tiles), N on grid.y (up to 65535 tiles: N <= 8388480).
  const int64_t tiles_n = ceil_div(p.n, BN);
  if (tiles_n > 65535) return cudaErrorInvalidConfiguration;
  const dim3 grid(static_cast<unsigned>(ceil_div(p.m, BM)), static_cast<unsigned>(tiles_n));
  if (b_kmajor) {
    warptiled_kernel<true><<<grid, THREADS, 0, stream>>>(p);
  } else {
    warptiled_kernel<false><<<grid, THREADS, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace persistent_matmul
