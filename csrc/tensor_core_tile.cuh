// The tensor-core tile shared by rungs `tiled` and `persistent`: how one CTA
// computes one BM x BN output tile with mma.sync.
//
// * Global -> shared: cp.async 16-byte copies into a STAGES-deep ring of
//   shared-memory buffers, so the loads of k-tile i+STAGES-1 are in flight while
//   k-tile i is multiplied. Chunks past the edges of M, N and K are stored as
//   zeros, and a chunk cut by an edge is read element by element (nothing
//   beyond a tensor is touched), so the math needs no bounds checks.
// * Shared memory is XOR-swizzled per 16-byte chunk, so the cp.async writes and
//   the ldmatrix reads of 8 rows hit 8 different bank groups (no conflicts).
// * Shared -> registers: ldmatrix (.trans for a B tile stored N-major), then
//   mma.sync m16n8k16 with fp32 accumulators.
//
// Operand layouts the tile takes directly (the host copies anything else):
// A is M x K with K contiguous; B is either K-major (each output column's K
// values contiguous: nn.Linear's weight, b.t()) or N-major (a row-major b).
// Leading dimensions are multiples of 8 elements and base pointers 16-byte
// aligned, which every 16-byte chunk address then is too.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "device_helpers.cuh"
#include "matmul_problem.h"
#include "tile_scheduler.cuh"

namespace persistent_matmul {
namespace tc {

// ---------------------------------------------------------------- PTX wrappers

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Copies one whole 16-byte chunk from global to shared memory asynchronously
// (bypassing L1); chunks cut by a tensor's edge go through copy_partial_chunk.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

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

// ---------------------------------------------------------------- swizzle

// Byte offset of 16-byte chunk `chunk` of row `row` in a tile whose rows hold
// ROW_CHUNKS chunks. Rows of 64 bytes XOR the chunk with (row / 2) % 4, longer
// rows with row % 8: either way 8 consecutive rows at one logical chunk land
// in 8 distinct 16-byte bank groups.
template <int ROW_CHUNKS>
__device__ __forceinline__ int swizzled_offset(int row, int chunk) {
  static_assert(ROW_CHUNKS == 4 || ROW_CHUNKS % 8 == 0, "tile rows must be 64 bytes or a multiple of 128");
  const int phys = ROW_CHUNKS == 4 ? (chunk ^ ((row >> 1) & 3)) : (chunk ^ (row & 7));
  return (row * ROW_CHUNKS + phys) * 16;
}

// ---------------------------------------------------------------- global -> shared copies

// Stores one 16-byte chunk of zeros to shared memory.
__device__ __forceinline__ void st_shared_zero16(uint32_t dst) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(dst), "r"(0));
}

// A chunk that straddles the end of a row (the last `valid` < 8 elements of a
// dimension that is not a multiple of 8): read the valid elements one by one,
// so nothing past the tensor is touched, and zero the rest.
static __device__ __noinline__ void copy_partial_chunk(uint32_t dst, const char* src, int64_t valid) {
  const uint16_t* s = reinterpret_cast<const uint16_t*>(src);
  uint32_t w[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const uint32_t lo = 2 * e < valid ? s[2 * e] : 0;
    const uint32_t hi = 2 * e + 1 < valid ? s[2 * e + 1] : 0;
    w[e] = lo | (hi << 16);
  }
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst), "r"(w[0]), "r"(w[1]), "r"(w[2]),
               "r"(w[3]));
}

// Copies a ROWS x (ROW_CHUNKS * 8) tile of 16-bit elements into swizzled
// shared memory: tile element (r, c) is global element (row0 + r, col0 + c)
// at gmem + ((row0 + r) * ld + col0 + c) * 2, valid below (row_limit,
// col_limit); invalid elements become zeros. Each thread owns one chunk
// column and every (THREADS / ROW_CHUNKS)-th row, so its addresses are one
// base pointer plus constant multiples of ld.
template <int ROWS, int ROW_CHUNKS, int THREADS>
__device__ __forceinline__ void copy_tile(uint32_t smem, const char* gmem, int64_t ld, int64_t row0,
                                          int64_t row_limit, int64_t col0, int64_t col_limit) {
  static_assert(THREADS % ROW_CHUNKS == 0 && (ROWS * ROW_CHUNKS) % THREADS == 0, "tile must split evenly");
  constexpr int ROW_STEP = THREADS / ROW_CHUNKS;
  constexpr int PER_THREAD = ROWS * ROW_CHUNKS / THREADS;
  const int first_row = threadIdx.x / ROW_CHUNKS, chunk = threadIdx.x % ROW_CHUNKS;
  const int64_t col = col0 + chunk * 8;
  const int64_t col_valid = col_limit - col;
  const char* src = gmem + ((row0 + first_row) * ld + col) * 2;
  const int64_t row_bytes = ld * ROW_STEP * 2;
#pragma unroll
  for (int i = 0; i < PER_THREAD; ++i) {
    const int r = first_row + i * ROW_STEP;
    const uint32_t dst = smem + swizzled_offset<ROW_CHUNKS>(r, chunk);
    const char* p = src + i * row_bytes;
    if (row0 + r >= row_limit || col_valid <= 0) {
      st_shared_zero16(dst);
    } else if (col_valid >= 8) {
      cp_async_16(dst, p);
    } else {
      copy_partial_chunk(dst, p, col_valid);
    }
  }
}

// ---------------------------------------------------------------- the tile

// BM x BN output tile, BK deep k-tiles, WARPS_M x WARPS_N warps each owning a
// (BM / WARPS_M) x (BN / WARPS_N) warp tile, STAGES shared-memory buffers.
// MIN_CTAS CTAs must fit on one SM: it caps registers (launch bounds) so the
// tiled and persistent kernels get the same occupancy.
template <int BM_, int BN_, int BK_, int WARPS_M_, int WARPS_N_, int STAGES_, int MIN_CTAS_>
struct TileShape {
  static constexpr int BM = BM_, BN = BN_, BK = BK_, WARPS_M = WARPS_M_, WARPS_N = WARPS_N_;
  static constexpr int STAGES = STAGES_, MIN_CTAS = MIN_CTAS_;
  static constexpr int THREADS = 32 * WARPS_M * WARPS_N;
  static constexpr int WM = BM / WARPS_M, WN = BN / WARPS_N;
  static constexpr int MMA_M = WM / 16, MMA_N = WN / 8;
  static_assert(WM % 16 == 0 && WN % 16 == 0 && BK % 16 == 0, "warp tile and k-tile must be multiples of 16");
  static constexpr int A_STAGE_BYTES = BM * BK * 2;
  static constexpr int B_STAGE_BYTES = BN * BK * 2;
  static constexpr int STAGE_BYTES = A_STAGE_BYTES + B_STAGE_BYTES;
  static constexpr int SMEM_BYTES = STAGES * STAGE_BYTES;
};

// The operands as the tile reads them (see the header comment for layouts).
struct TileOperands {
  const char* a;  // bytes; element (m, k) at a + (m * lda + k) * 2
  int64_t lda;
  const char* b;  // K-major: (k, n) at b + (n * ldb + k) * 2; N-major: b + (k * ldb + n) * 2
  int64_t ldb;
  int64_t m, n, k;
};

template <typename Shape, bool B_KMAJOR>
struct Tile {
  using S = Shape;
  static constexpr int A_ROW_CHUNKS = S::BK / 8;                         // A stored [BM][BK]
  static constexpr int B_ROW_CHUNKS = B_KMAJOR ? S::BK / 8 : S::BN / 8;  // [BN][BK] or [BK][BN]

  // Issue the copies of k-tile `kt` of output tile (tile_m, tile_n) into `stage`.
  static __device__ __forceinline__ void load_stage(const TileOperands& op, char* stage, int tile_m, int tile_n,
                                                    int kt) {
    const int64_t k0 = int64_t(kt) * S::BK;
    const uint32_t a_smem = smem_addr(stage), b_smem = smem_addr(stage + S::A_STAGE_BYTES);
    copy_tile<S::BM, A_ROW_CHUNKS, S::THREADS>(a_smem, op.a, op.lda, int64_t(tile_m) * S::BM, op.m, k0, op.k);
    if constexpr (B_KMAJOR) {
      copy_tile<S::BN, B_ROW_CHUNKS, S::THREADS>(b_smem, op.b, op.ldb, int64_t(tile_n) * S::BN, op.n, k0, op.k);
    } else {
      copy_tile<S::BK, B_ROW_CHUNKS, S::THREADS>(b_smem, op.b, op.ldb, k0, op.k, int64_t(tile_n) * S::BN, op.n);
    }
  }

  // Multiply one shared-memory stage into the warp's accumulators.
  template <typename T>
  static __device__ __forceinline__ void compute_stage(const char* stage, float (&acc)[S::MMA_M][S::MMA_N][4]) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int warp_m = warp / S::WARPS_N, warp_n = warp % S::WARPS_N;
    const uint32_t a_base = smem_addr(stage);
    const uint32_t b_base = smem_addr(stage + S::A_STAGE_BYTES);
#pragma unroll
    for (int ks = 0; ks < S::BK / 16; ++ks) {
      uint32_t a_frag[S::MMA_M][4];
      uint32_t b_frag[S::MMA_N][2];
#pragma unroll
      for (int i = 0; i < S::MMA_M; ++i) {
        // Lanes 0-15 address rows 0-15 at k 0-7, lanes 16-31 the same rows at k 8-15.
        const int row = warp_m * S::WM + i * 16 + lane % 16;
        const int chunk = ks * 2 + lane / 16;
        ldmatrix_x4(a_frag[i], a_base + swizzled_offset<A_ROW_CHUNKS>(row, chunk));
      }
#pragma unroll
      for (int j = 0; j < S::MMA_N; j += 2) {
        uint32_t r[4];
        if constexpr (B_KMAJOR) {
          // Matrices: (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15).
          const int row = warp_n * S::WN + j * 8 + (lane / 16) * 8 + lane % 8;
          const int chunk = ks * 2 + (lane / 8) % 2;
          ldmatrix_x4(r, b_base + swizzled_offset<B_ROW_CHUNKS>(row, chunk));
        } else {
          // Same four matrices, stored with k as the row: load them transposed.
          const int row = ks * 16 + (lane / 8) % 2 * 8 + lane % 8;
          const int chunk = (warp_n * S::WN + j * 8) / 8 + lane / 16;
          ldmatrix_x4_trans(r, b_base + swizzled_offset<B_ROW_CHUNKS>(row, chunk));
        }
        b_frag[j][0] = r[0];
        b_frag[j][1] = r[1];
        b_frag[j + 1][0] = r[2];
        b_frag[j + 1][1] = r[3];
      }
#pragma unroll
      for (int i = 0; i < S::MMA_M; ++i)
#pragma unroll
        for (int j = 0; j < S::MMA_N; ++j) mma_16816<T>(acc[i][j], a_frag[i], b_frag[j][0], b_frag[j][1]);
    }
  }

  static __device__ __forceinline__ int k_tiles(const TileOperands& op) { return int(ceil_div(op.k, S::BK)); }

  // Start the first STAGES - 1 k-tiles of a tile (one cp.async group each, empty past K).
  static __device__ __forceinline__ void prologue(const TileOperands& op, char* smem, int tile_m, int tile_n) {
    const int kts = k_tiles(op);
#pragma unroll
    for (int s = 0; s < S::STAGES - 1; ++s) {
      if (s < kts) load_stage(op, smem + s * S::STAGE_BYTES, tile_m, tile_n, s);
      cp_async_commit();
    }
  }

  // The k loop of a tile whose prologue was issued: wait for k-tile kt, start
  // k-tile kt + STAGES - 1 into the buffer k-tile kt - 1 used, multiply kt.
  // Ends with every cp.async drained and every warp past its last read of
  // shared memory, so the buffers are free for the next tile's prologue.
  template <typename T>
  static __device__ __forceinline__ void mainloop(const TileOperands& op, char* smem, int tile_m, int tile_n,
                                                  float (&acc)[S::MMA_M][S::MMA_N][4]) {
#pragma unroll
    for (int i = 0; i < S::MMA_M; ++i)
#pragma unroll
      for (int j = 0; j < S::MMA_N; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
    const int kts = k_tiles(op);
    for (int kt = 0; kt < kts; ++kt) {
      cp_async_wait<S::STAGES - 2>();
      __syncthreads();
      const int next = kt + S::STAGES - 1;
      if (next < kts) load_stage(op, smem + (next % S::STAGES) * S::STAGE_BYTES, tile_m, tile_n, next);
      cp_async_commit();
      compute_stage<T>(smem + (kt % S::STAGES) * S::STAGE_BYTES, acc);
    }
    cp_async_wait<0>();
    __syncthreads();
  }

  // Write the accumulators (+ bias, in fp32) to out, rounding to T; rows and
  // columns outside the problem are skipped.
  template <typename T>
  static __device__ __forceinline__ void epilogue(const MatmulProblem& p, int tile_m, int tile_n,
                                                  const float (&acc)[S::MMA_M][S::MMA_N][4]) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int warp_m = warp / S::WARPS_N, warp_n = warp % S::WARPS_N;
    T* out = static_cast<T*>(p.out);
    const T* bias = static_cast<const T*>(p.bias);
#pragma unroll
    for (int j = 0; j < S::MMA_N; ++j) {
      const int64_t col0 = int64_t(tile_n) * S::BN + warp_n * S::WN + j * 8 + (lane % 4) * 2;
      float bias0 = 0.0f, bias1 = 0.0f;
      if (bias != nullptr) {
        if (col0 < p.n) bias0 = to_float(bias[col0]);
        if (col0 + 1 < p.n) bias1 = to_float(bias[col0 + 1]);
      }
#pragma unroll
      for (int i = 0; i < S::MMA_M; ++i) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int64_t row = int64_t(tile_m) * S::BM + warp_m * S::WM + i * 16 + lane / 4 + half * 8;
          if (row >= p.m) continue;
          T* dst = out + row * p.out_stride_m + col0 * p.out_stride_n;
          if (col0 < p.n) dst[0] = from_float<T>(acc[i][j][half * 2] + bias0);
          if (col0 + 1 < p.n) dst[p.out_stride_n] = from_float<T>(acc[i][j][half * 2 + 1] + bias1);
        }
      }
    }
  }
};

// One record of the instrumented builds: which SM ran an output tile, when.
struct TileRecord {
  int64_t tile_m, tile_n, sm, cta, start_ns, end_ns;
};
static_assert(sizeof(TileRecord) == 6 * sizeof(int64_t), "TileRecord is read as an int64 [tiles, 6] tensor");

__device__ __forceinline__ int64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return static_cast<int64_t>(t);
}
__device__ __forceinline__ int64_t sm_id() {
  uint32_t id;
  asm volatile("mov.u32 %0, %smid;" : "=r"(id));
  return id;
}

}  // namespace tc
}  // namespace persistent_matmul
