// Rung 2 — warptiled: fp32 SGEMM on CUDA cores.
//
// Over `naive`, which reads two global values per FMA, every operand value is
// reused many times from fast memory:
// * block tile: a CTA computes a 128x128 output tile; each k-tile of A and B
//   is read from global memory once, with 16-byte loads, into shared memory
//   (A stored transposed, so threads read it along M with 16-byte loads too).
//   Two shared-memory buffers: the next k-tile is fetched while the current
//   one is multiplied. A goes through registers (fetched before the math,
//   stored transposed after it); a row-major (N-major) B goes straight to
//   shared memory by cp.async, which needs no registers, so that case takes
//   16-deep k-tiles (1024 FMAs per thread between barriers) for the same
//   register budget; a K-major B is transposed through registers like A, in
//   8-deep k-tiles.
// * warp tile: each of the 8 warps owns a 32x64 part of the tile, so a warp's
//   shared-memory reads are broadcasts (A) or one contiguous 128-byte line (B),
//   free of bank conflicts.
// * thread tile: each thread accumulates an 8x8 block (2x2 sub-blocks of 4x4)
//   in registers: per k step it loads 2 + 2 float4 and does 64 FMAs. At 128
//   registers two CTAs (16 warps) share an SM.
// Edges: chunks past M, N or K are zeros; a chunk cut by an edge is read
// element by element (copy_chunk_16 in device_helpers.cuh). Operands arrive
// K-contiguous (A, and B when stored K-major) or N-contiguous (B row-major)
// with 16-byte-aligned rows; the host copies anything else
// (persistent_matmul._matmul.cuda_core_operands).
#include "device_helpers.cuh"
#include "matmul_problem.h"

namespace persistent_matmul {
namespace {

constexpr int BM = 128, BN = 128;
constexpr int THREADS = 256;
constexpr int WARPS_N = 2;            // warps tile the block 4 (M) x 2 (N): 32x64 each
constexpr int WM = 32, WN = 64;
constexpr int PAD = 4;                // shared rows of 132 floats: transposed stores hit distinct banks
constexpr int N_CHUNKS = BN / 4;      // float4 chunks along N in a row of N-major B
constexpr int B_ROW_STEP = THREADS / N_CHUNKS;  // N-major B: k-rows between a thread's chunks

// k-tile depth: 16 when B is N-major (B goes to shared memory by cp.async,
// with no registers staging it, so twice the depth costs no registers and
// halves the per-k-tile overhead), 8 when both operands go through registers.
template <bool B_KMAJOR>
constexpr int kBK = B_KMAJOR ? 8 : 16;

template <int BK>
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

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::); }

// The chunks of each k-tile a thread fetches, with addresses worked out once
// per CTA. A (and B when K-major), stored "rows x contiguous k": the thread
// owns k-chunk threadIdx.x % K_CHUNKS of rows threadIdx.x / K_CHUNKS + i *
// ROW_STEP, fetched into registers and stored transposed. B N-major: k-rows
// threadIdx.x / N_CHUNKS + i * (THREADS / N_CHUNKS), n-chunk threadIdx.x %
// N_CHUNKS, copied by cp.async. Each k-tile then costs pointer bumps and a
// compare or two per chunk.
template <bool B_KMAJOR>
struct Loader {
  static constexpr int BK = kBK<B_KMAJOR>;
  static constexpr int K_CHUNKS = BK / 4;                // float4 chunks along K in a row of A
  static constexpr int CHUNKS = BM * BK / 4 / THREADS;   // chunks per thread and operand
  static constexpr int ROW_STEP = THREADS / K_CHUNKS;
  static_assert(BM * BK / 4 % THREADS == 0 && BN * BK / 4 % THREADS == 0, "every thread copies whole chunks");

  struct Fetched {
    float4 a[CHUNKS];
    float4 b[B_KMAJOR ? CHUNKS : 1];
  };

  const float* a;    // this thread's first A chunk in k-tile 0
  const float* b;    // this thread's first B chunk in k-tile 0
  int64_t a_k;       // k of the thread's A (and K-major B) chunks in k-tile 0
  int64_t a_row_step, b_row_step;  // elements between a thread's rows
  int64_t b_step;    // elements from one k-tile's B chunk to the next
  int b_bytes;       // N-major B: bytes of the thread's chunk inside N
  int b_k;           // N-major B: k of the thread's first row in k-tile 0
  uint32_t a_rows, b_rows;  // bit i: row i inside M (A) or N (K-major B)

  __device__ Loader(const MatmulProblem& p, int64_t tile_m, int64_t tile_n) {
    const int t = threadIdx.x;
    const int64_t m = tile_m * BM + t / K_CHUNKS;
    a_k = (t % K_CHUNKS) * 4;
    a = static_cast<const float*>(p.a) + (m < p.m ? m * p.a_stride_m : 0) + a_k;
    a_row_step = ROW_STEP * p.a_stride_m;
    a_rows = 0;
#pragma unroll
    for (int i = 0; i < CHUNKS; ++i) a_rows |= uint32_t(m + i * ROW_STEP < p.m) << i;
    if constexpr (B_KMAJOR) {
      const int64_t n = tile_n * BN + t / K_CHUNKS;
      b = static_cast<const float*>(p.b) + (n < p.n ? n * p.b_stride_n : 0) + a_k;
      b_row_step = ROW_STEP * p.b_stride_n;
      b_step = BK;
      b_rows = 0;
#pragma unroll
      for (int i = 0; i < CHUNKS; ++i) b_rows |= uint32_t(n + i * ROW_STEP < p.n) << i;
      b_bytes = 16;
      b_k = 0;
    } else {
      const int64_t n = tile_n * BN + (t % N_CHUNKS) * 4;
      const int64_t valid = p.n - n;
      b_bytes = valid >= 4 ? 16 : valid > 0 ? int(valid) * 4 : 0;
      b_k = t / N_CHUNKS;
      b = static_cast<const float*>(p.b) + b_k * p.b_stride_k + (b_bytes > 0 ? n : 0);
      b_row_step = B_ROW_STEP * p.b_stride_k;
      b_step = BK * p.b_stride_k;
      b_rows = 0;
    }
  }

  // Registers for k-tile kt: A's chunks (and K-major B's).
  __device__ __forceinline__ void fetch(const MatmulProblem& p, int64_t kt, Fetched& f) const {
    const int64_t k0 = kt * BK;
    const int64_t k_valid = p.k - (k0 + a_k);
#pragma unroll
    for (int i = 0; i < CHUNKS; ++i) {
      f.a[i] = (a_rows >> i) & 1 ? load_chunk(a + k0 + i * a_row_step, k_valid) : make_float4(0.f, 0.f, 0.f, 0.f);
      if constexpr (B_KMAJOR) {
        f.b[i] = (b_rows >> i) & 1 ? load_chunk(b + k0 + i * b_row_step, k_valid) : make_float4(0.f, 0.f, 0.f, 0.f);
      }
    }
  }

  // N-major B: k-tile kt straight into shared memory (cp.async, zero-filled past N and K).
  __device__ __forceinline__ void copy_b(const MatmulProblem& p, int64_t kt, SharedTiles<BK>& s, int buf) const {
    static_assert(!B_KMAJOR, "K-major B goes through registers");
    const int64_t k_left = p.k - (kt * BK + b_k);  // rows of this k-tile inside K, from the thread's first
    const float* src = b + kt * b_step;
#pragma unroll
    for (int i = 0; i < CHUNKS; ++i) {
      const int bytes = i * B_ROW_STEP < k_left ? b_bytes : 0;
      copy_chunk_16(static_cast<uint32_t>(__cvta_generic_to_shared(&s.b[buf][b_k + i * B_ROW_STEP][(threadIdx.x % N_CHUNKS) * 4])),
                    src + i * b_row_step, bytes);
    }
  }

  // The fetched registers into buffer `buf`, A (and K-major B) transposed to [k][m].
  __device__ __forceinline__ void store(SharedTiles<BK>& s, int buf, const Fetched& f) const {
    const int row = threadIdx.x / K_CHUNKS, k = (threadIdx.x % K_CHUNKS) * 4;
#pragma unroll
    for (int i = 0; i < CHUNKS; ++i) {
      s.a[buf][k + 0][row + i * ROW_STEP] = f.a[i].x;
      s.a[buf][k + 1][row + i * ROW_STEP] = f.a[i].y;
      s.a[buf][k + 2][row + i * ROW_STEP] = f.a[i].z;
      s.a[buf][k + 3][row + i * ROW_STEP] = f.a[i].w;
      if constexpr (B_KMAJOR) {
        s.b[buf][k + 0][row + i * ROW_STEP] = f.b[i].x;
        s.b[buf][k + 1][row + i * ROW_STEP] = f.b[i].y;
        s.b[buf][k + 2][row + i * ROW_STEP] = f.b[i].z;
        s.b[buf][k + 3][row + i * ROW_STEP] = f.b[i].w;
      }
    }
  }
};

template <bool B_KMAJOR>
__global__ void __launch_bounds__(THREADS, 2) warptiled_kernel(MatmulProblem p) {
  constexpr int BK = kBK<B_KMAJOR>;
  __shared__ __align__(16) SharedTiles<BK> s;
  const int64_t tile_m = blockIdx.x, tile_n = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int warp_m = warp / WARPS_N, warp_n = warp % WARPS_N;
  const int tm = lane / 8, tn = lane % 8;  // thread within the warp tile: 4 x 8
  // The thread's rows: m_base + {0..3} and m_base + 16 + {0..3}; columns likewise with 32.
  const int m_base = warp_m * WM + tm * 4, n_base = warp_n * WN + tn * 4;

  float acc[8][8] = {};
  const int64_t k_tiles = ceil_div(p.k, BK);
  const Loader<B_KMAJOR> loader(p, tile_m, tile_n);
  typename Loader<B_KMAJOR>::Fetched f;
  if constexpr (!B_KMAJOR) loader.copy_b(p, 0, s, 0);
  cp_async_commit();
  loader.fetch(p, 0, f);
  loader.store(s, 0, f);
  cp_async_wait_all();
  __syncthreads();
  for (int64_t kt = 0; kt < k_tiles; ++kt) {
    const int buf = kt % 2;
    const bool more = kt + 1 < k_tiles;
    // The other buffer was last read before the barrier that ended k-tile kt - 1.
    if constexpr (!B_KMAJOR) {
      if (more) loader.copy_b(p, kt + 1, s, buf ^ 1);
      cp_async_commit();
    }
    if (more) loader.fetch(p, kt + 1, f);
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
    if (more) loader.store(s, buf ^ 1, f);
    if constexpr (!B_KMAJOR) cp_async_wait_all();
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
