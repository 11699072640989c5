// The tensor-core tile shared by rungs `tiled` and `persistent`: how one CTA
// computes one BM x BN output tile with mma.sync.
//
// * Global -> shared: cp.async 16-byte copies into a STAGES-deep ring of
//   shared-memory buffers, so the loads of k-tile i+STAGES-1 are in flight while
//   k-tile i is multiplied. Interior tiles (inside M and N: most tiles of a
//   large problem) copy every chunk with a bare cp.async; where K ends in a
//   partial k-tile they multiply that one first, its copies checked in the
//   prologue, so the mainloop still copies whole k-tiles only. Edge tiles
//   check each chunk: what lies past the edges of M, N and K is zeros in
//   shared memory (copy_chunk_16: a chunk cut by an edge is read element by
//   element, a chunk past an edge is not read), so the math needs no bounds
//   checks. The two kinds are two instantiations of the same code (the FULL
//   template flag), picked per tile.
// * Shared memory is XOR-swizzled per 16-byte chunk, so the cp.async writes and
//   the ldmatrix reads of 8 rows hit 8 different bank groups (no conflicts).
// * Shared -> registers: ldmatrix (.trans for a B tile stored N-major), one
//   mma k-step ahead of the mma.sync m16n8k16 (fp32 accumulators) that use the
//   fragments, interleaved with them (see Tile::mainloop).
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
// The same, issued only if `valid` (a predicate, not a branch: nothing is read otherwise).
__device__ __forceinline__ void cp_async_16_if(uint32_t dst, const void* src, bool valid) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %2, 0;\n@p cp.async.cg.shared.global [%0], [%1], 16;\n}\n" ::"r"(dst),
      "l"(src), "r"(int(valid)));
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

// Two neighbouring output elements, packed for one 4-byte store.
template <typename T>
struct PairOf;
template <>
struct PairOf<__nv_bfloat16> {
  using type = __nv_bfloat162;
};
template <>
struct PairOf<__half> {
  using type = __half2;
};
template <typename T>
using Pair = typename PairOf<T>::type;
template <typename T>
__device__ __forceinline__ Pair<T> make_pair(float lo, float hi);
template <>
__device__ __forceinline__ __nv_bfloat162 make_pair<__nv_bfloat16>(float lo, float hi) {
  return __floats2bfloat162_rn(lo, hi);
}
template <>
__device__ __forceinline__ __half2 make_pair<__half>(float lo, float hi) {
  return __floats2half2_rn(lo, hi);
}

// ---------------------------------------------------------------- swizzle

// Byte offset of 16-byte chunk `chunk` of row `row` in a tile whose rows hold
// ROW_CHUNKS chunks (a multiple of 8: rows of 128 bytes or more). The chunk
// index is XORed with row % 8, so 8 consecutive rows at one logical chunk land
// in 8 distinct 16-byte bank groups. XORing the logical chunk with c < 8 XORs
// the offset with 16 * c, which the ldmatrix addressing below relies on.
template <int ROW_CHUNKS>
__device__ __forceinline__ int swizzled_offset(int row, int chunk) {
  static_assert(ROW_CHUNKS % 8 == 0, "tile rows must be a multiple of 128 bytes");
  return (row * ROW_CHUNKS + (chunk ^ (row & 7))) * 16;
}

// ---------------------------------------------------------------- global -> shared copies

// min(max(x, 0), hi) for a 64-bit x, as an int.
__device__ __forceinline__ int clamp_to(int64_t x, int hi) { return x <= 0 ? 0 : x >= hi ? hi : int(x); }

// One thread's share of copying a ROWS x (ROW_CHUNKS * 8) operand tile of
// 16-bit elements into swizzled shared memory, one k-tile after another. The
// thread owns one chunk column and every ROW_STEP-th row, so its chunks are one
// base pointer plus constant multiples of the leading dimension, and (ROW_STEP
// being a multiple of 8) lie at constant offsets in shared memory. What does
// not change along K is set once per output tile (set_*); per k-tile the
// caller works out the byte counts once (kt_*), then issue() issues each chunk
// as one zero-filling cp.async: no branches, so copies interleave with the
// math around them. The tensor's leading dimension and K come in again as
// arguments (kernel parameters: constant-bank operands, no registers).
template <int ROWS, int ROW_CHUNKS, int THREADS>
struct ChunkCopier {
  static_assert(THREADS % ROW_CHUNKS == 0 && (ROWS * ROW_CHUNKS) % THREADS == 0, "tile must split evenly");
  static constexpr int ROW_STEP = THREADS / ROW_CHUNKS;
  static constexpr int PER_THREAD = ROWS * ROW_CHUNKS / THREADS;
  static_assert(PER_THREAD <= 32, "row mask is 32 bits");
  static_assert(ROW_STEP % 8 == 0, "a thread's rows must share a swizzle phase");

  const char* src;  // this thread's first chunk in k-tile 0
  uint32_t mask;    // K contiguous: bit i set if the thread's row i is inside M (or N)
  int col_bytes;    // K as rows (N-major B): bytes of the thread's chunk inside N

  static __device__ __forceinline__ int first_row() { return threadIdx.x / ROW_CHUNKS; }
  static __device__ __forceinline__ int chunk() { return threadIdx.x % ROW_CHUNKS; }

  // Rows are M (or N) from row0, below row_limit; columns are K.
  __device__ __forceinline__ void set_k_contiguous(const char* gmem, int64_t ld, int64_t row0, int64_t row_limit) {
    src = gmem + ((row0 + first_row()) * ld + chunk() * 8) * 2;
    const int rows_left = clamp_to(row_limit - row0 - first_row(), ROWS);
    mask = 0;
#pragma unroll
    for (int i = 0; i < PER_THREAD; ++i) mask |= uint32_t(i * ROW_STEP < rows_left) << i;
  }
  // Bytes of the thread's chunks in k-tile kt that lie inside K (same for all its rows).
  __device__ __forceinline__ int kt_bytes_k_contiguous(int kt, int64_t k) const {
    return 2 * clamp_to(k - (int64_t(kt) * (ROW_CHUNKS * 8) + chunk() * 8), 8);
  }

  // Rows are K (ROWS of them per k-tile), columns N from col0, below col_limit.
  __device__ __forceinline__ void set_k_rows(const char* gmem, int64_t ld, int64_t col0, int64_t col_limit) {
    const int64_t col = col0 + chunk() * 8;
    col_bytes = 2 * clamp_to(col_limit - col, 8);
    src = gmem + (int64_t(first_row()) * ld + col) * 2;
  }
  // Rows of k-tile kt, from the thread's first one, that lie inside K.
  __device__ __forceinline__ int kt_rows_k_rows(int kt, int64_t k) const {
    return clamp_to(k - (int64_t(kt) * ROWS + first_row()), ROWS);
  }

  // The thread's first chunk of k-tile kt.
  __device__ __forceinline__ const char* kt_src(int kt, int64_t ktile_bytes) const {
    return src + kt * ktile_bytes;
  }

  // Chunk i of an interior tile: the whole chunk, no checks (none at all
  // if the k-tile lies past K, `valid` false).
  __device__ __forceinline__ void issue_whole(uint32_t smem, const char* p, int64_t ld, int i, bool valid) const {
    cp_async_16_if(dst(smem, i), p + i * (ld * ROW_STEP * 2), valid);
  }

  // Chunk i: K contiguous (`bytes` from kt_bytes_k_contiguous) or K as rows
  // (`rows` from kt_rows_k_rows), from p = kt_src(kt) into the stage at `smem`.
  __device__ __forceinline__ void issue_k_contiguous(uint32_t smem, const char* p, int64_t ld, int i,
                                                     int bytes) const {
    copy_chunk_16(dst(smem, i), p + i * (ld * ROW_STEP * 2), (mask >> i) & 1 ? bytes : 0);
  }
  __device__ __forceinline__ void issue_k_rows(uint32_t smem, const char* p, int64_t ld, int i, int rows) const {
    copy_chunk_16(dst(smem, i), p + i * (ld * ROW_STEP * 2), i * ROW_STEP < rows ? col_bytes : 0);
  }

  static __device__ __forceinline__ uint32_t dst(uint32_t smem, int i) {
    return smem + swizzled_offset<ROW_CHUNKS>(first_row(), chunk()) + i * ROW_STEP * ROW_CHUNKS * 16;
  }
};

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
  static_assert(STAGES >= 3, "the mainloop refills the stage read two k-tiles earlier");
  static constexpr int A_STAGE_BYTES = BM * BK * 2;
  static constexpr int B_STAGE_BYTES = BN * BK * 2;
  static constexpr int STAGE_BYTES = A_STAGE_BYTES + B_STAGE_BYTES;
  // The stages, then 16 bytes where `persistent`'s dynamic order passes each
  // claimed tile index to the CTA's threads.
  static constexpr int CLAIM_SLOT_OFFSET = STAGES * STAGE_BYTES;
  static constexpr int SMEM_BYTES = CLAIM_SLOT_OFFSET + 16;
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
  static constexpr int KS = S::BK / 16;                                   // mma k-steps per k-tile
  using ACopier = ChunkCopier<S::BM, A_ROW_CHUNKS, S::THREADS>;
  using BCopier = ChunkCopier<B_KMAJOR ? S::BN : S::BK, B_ROW_CHUNKS, S::THREADS>;
  static constexpr int A_CHUNKS = ACopier::PER_THREAD, B_CHUNKS = BCopier::PER_THREAD;

  // A thread's copy state for one output tile (see ChunkCopier).
  struct Loader {
    ACopier a;
    BCopier b;
    __device__ __forceinline__ Loader(const TileOperands& op, int tile_m, int tile_n) {
      a.set_k_contiguous(op.a, op.lda, int64_t(tile_m) * S::BM, op.m);
      if constexpr (B_KMAJOR) {
        b.set_k_contiguous(op.b, op.ldb, int64_t(tile_n) * S::BN, op.n);
      } else {
        b.set_k_rows(op.b, op.ldb, int64_t(tile_n) * S::BN, op.n);
      }
    }
    // Bytes between consecutive k-tiles of B in global memory.
    static __device__ __forceinline__ int64_t b_ktile_bytes(const TileOperands& op) {
      return B_KMAJOR ? S::BK * 2 : S::BK * op.ldb * 2;
    }
    // An interior tile's share `part` of the copies of the k-tile whose first
    // chunks (this thread's) are at pa and pb; `valid` false past K turns the
    // copies off without a branch. The mainloop advances pa and pb by a
    // k-tile each step rather than recomputing them from the tile's origin.
    __device__ __forceinline__ void issue_whole(const TileOperands& op, uint32_t stage, const char* pa,
                                                const char* pb, bool valid, int part, int parts) const {
#pragma unroll
      for (int c = 0; c < A_CHUNKS + B_CHUNKS; ++c) {
        if (c * parts / (A_CHUNKS + B_CHUNKS) != part) continue;
        if (c < A_CHUNKS) {
          a.issue_whole(stage, pa, op.lda, c, valid);
        } else {
          b.issue_whole(stage + S::A_STAGE_BYTES, pb, op.ldb, c - A_CHUNKS, valid);
        }
      }
    }
    // An interior tile's whole k-tile kt (all of it, or nothing if it is not
    // whole: a tail k-tile or one past K).
    __device__ __forceinline__ void issue_whole_ktile(const TileOperands& op, uint32_t stage, int kt) const {
      issue_whole(op, stage, a.kt_src(kt, S::BK * 2), b.kt_src(kt, b_ktile_bytes(op)),
                  int64_t(kt + 1) * S::BK <= op.k, 0, 1);
    }
    // Share `part` (of `parts`) of this thread's checked copies of k-tile kt
    // into the stage at shared address `stage` (part and parts are constants
    // where the mainloop is unrolled, and what depends only on kt is computed
    // once for all parts): the mainloop spreads one k-tile's copies over its
    // mma k-steps. What lies past M, N or K is zeros in the stage.
    __device__ __forceinline__ void issue_checked(const TileOperands& op, uint32_t stage, int kt, int part,
                                                  int parts) const {
      const char* pa = a.kt_src(kt, S::BK * 2);
      const int a_bytes = a.kt_bytes_k_contiguous(kt, op.k);
      const char* pb = b.kt_src(kt, b_ktile_bytes(op));
      const int b_valid = B_KMAJOR ? b.kt_bytes_k_contiguous(kt, op.k) : b.kt_rows_k_rows(kt, op.k);
#pragma unroll
      for (int c = 0; c < A_CHUNKS + B_CHUNKS; ++c) {
        if (c * parts / (A_CHUNKS + B_CHUNKS) != part) continue;
        if (c < A_CHUNKS) {
          a.issue_k_contiguous(stage, pa, op.lda, c, a_bytes);
        } else if constexpr (B_KMAJOR) {
          b.issue_k_contiguous(stage + S::A_STAGE_BYTES, pb, op.ldb, c - A_CHUNKS, b_valid);
        } else {
          b.issue_k_rows(stage + S::A_STAGE_BYTES, pb, op.ldb, c - A_CHUNKS, b_valid);
        }
      }
    }
  };

  using AFrags = uint32_t[S::MMA_M][4];  // a k-step's A fragments (16 rows x 16 k each)
  using BFrags = uint32_t[S::MMA_N][2];  // a k-step's B fragments (8 n x 16 k each)

  // Where a lane's ldmatrix reads start, relative to a stage (see
  // swizzled_offset). A: lanes 0-15 address rows 0-15 of the warp's 16-row
  // block at k 0-7, lanes 16-31 the same rows at k 8-15; fragment i of k-step
  // ks is at (a_lane ^ 32 * ks) + i * 16 rows. B K-major, matrices (n 0-7,
  // k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15): fragments j,
  // j + 1 of k-step ks at (b_lane ^ 32 * ks) + j * 8 rows. B N-major, the same
  // four matrices stored with k as the row, loaded transposed: at
  // (b_lane ^ 16 * j) + ks * 16 rows.
  static __device__ __forceinline__ uint32_t a_lane_offset() {
    const int lane = threadIdx.x % 32, warp_m = (threadIdx.x / 32) / S::WARPS_N;
    return swizzled_offset<A_ROW_CHUNKS>(warp_m * S::WM + lane % 16, lane / 16);
  }
  static __device__ __forceinline__ uint32_t b_lane_offset() {
    const int lane = threadIdx.x % 32, warp_n = (threadIdx.x / 32) % S::WARPS_N;
    if constexpr (B_KMAJOR) {
      return S::A_STAGE_BYTES +
             swizzled_offset<B_ROW_CHUNKS>(warp_n * S::WN + (lane / 16) * 8 + lane % 8, (lane / 8) % 2);
    } else {
      return S::A_STAGE_BYTES +
             swizzled_offset<B_ROW_CHUNKS>((lane / 8) % 2 * 8 + lane % 8, warp_n * S::WN / 8 + lane / 16);
    }
  }
  // The XOR forms above hold because the XORed bits are clear in the lane's
  // own chunk index: 32 * ks against a lane chunk of 0 or 1; 16 * j (j even,
  // below WN / 8) against warp_n * WN / 8 + 0 or 1, when WN / 8 is a power of two.
  static_assert(((S::WN / 8) & (S::WN / 8 - 1)) == 0, "N-major B: WN / 8 must be a power of two");

  static __device__ __forceinline__ void load_a(AFrags& a, uint32_t stage, uint32_t a_lane, int ks, int i) {
    ldmatrix_x4(a[i], stage + (a_lane ^ (32 * ks)) + i * 16 * (A_ROW_CHUNKS * 16));
  }
  static __device__ __forceinline__ void load_b(BFrags& b, uint32_t stage, uint32_t b_lane, int ks, int j) {
    uint32_t r[4];
    if constexpr (B_KMAJOR) {
      ldmatrix_x4(r, stage + (b_lane ^ (32 * ks)) + j * 8 * (B_ROW_CHUNKS * 16));
    } else {
      ldmatrix_x4_trans(r, stage + (b_lane ^ (16 * j)) + ks * 16 * (B_ROW_CHUNKS * 16));
    }
    b[j][0] = r[0];
    b[j][1] = r[1];
    b[j + 1][0] = r[2];
    b[j + 1][1] = r[3];
  }

  static __device__ __forceinline__ int k_tiles(const TileOperands& op) { return int(ceil_div(op.k, S::BK)); }

  static __device__ __forceinline__ uint32_t stage_addr(char* smem, int s) {
    return smem_addr(smem) + s * S::STAGE_BYTES;
  }

  // Whether a tile is interior: it lies inside M and N, so only a K tail
  // (K % BK != 0) can need checked copies.
  static __device__ __forceinline__ bool interior(const TileOperands& op, int tile_m, int tile_n) {
    return int64_t(tile_m + 1) * S::BM <= op.m && int64_t(tile_n + 1) * S::BN <= op.n;
  }

  // 1 if K ends in a partial k-tile. An interior tile then multiplies that
  // tail k-tile first (its prologue's one checked copy) and the whole k-tiles
  // 0, 1, ... after it, so its mainloop copies whole k-tiles only, branch-free
  // (the order of the k-tiles changes only the fp32 rounding). Before, every
  // tile of a problem with a K tail took the checked copies all along
  // (3000^3: 0.31x cuBLAS against 0.55x at 4096^3 on the H200).
  static __device__ __forceinline__ int k_tail(const TileOperands& op) { return op.k % S::BK != 0; }

  // Start the first STAGES - 1 k-tiles of a tile (one cp.async group each;
  // k-tiles past K copy nothing). FULL (interior tiles): with a K tail, the
  // tail k-tile comes first, then whole k-tiles 0, 1, ...
  template <bool FULL>
  static __device__ __forceinline__ void prologue_of(const TileOperands& op, char* smem, int tile_m, int tile_n) {
    const Loader ld(op, tile_m, tile_n);
    const int tail = k_tail(op);
#pragma unroll
    for (int s = 0; s < S::STAGES - 1; ++s) {
      if (!FULL || (tail && s == 0)) {
        ld.issue_checked(op, stage_addr(smem, s), FULL ? k_tiles(op) - 1 : s, 0, 1);
      } else {
        ld.issue_whole_ktile(op, stage_addr(smem, s), s - tail);
      }
      cp_async_commit();
    }
  }
  static __device__ __forceinline__ void prologue(const TileOperands& op, char* smem, int tile_m, int tile_n) {
    if (interior(op, tile_m, tile_n)) {
      prologue_of<true>(op, smem, tile_m, tile_n);
    } else {
      prologue_of<false>(op, smem, tile_m, tile_n);
    }
  }

  // The k loop of a tile whose prologue was issued (mainloop_of below), in
  // its interior or edge form.
  template <typename T>
  static __device__ __forceinline__ void mainloop(const TileOperands& op, char* smem, int tile_m, int tile_n,
                                                  float (&acc)[S::MMA_M][S::MMA_N][4]) {
    if (interior(op, tile_m, tile_n)) {
      mainloop_of<T, true>(op, smem, tile_m, tile_n, acc);
    } else {
      mainloop_of<T, false>(op, smem, tile_m, tile_n, acc);
    }
  }

  // The k loop of a tile whose prologue was issued. Every mma multiplies
  // fragments loaded during the k-step before, so no mma waits on an ldmatrix
  // issued just before it: B fragments are double buffered in registers; an A
  // fragment is reloaded in place for the next k-step as soon as its row of
  // mmas is issued (one row of mmas later than B's, still a k-step ahead of its
  // use), which saves a second A buffer's registers. Each k-step interleaves
  // its mmas with these ldmatrix and, in the k-steps but the last, with a
  // share of the cp.async copies of k-tile kt + STAGES - 1 (into the stage
  // k-tile kt - 1 used). Before its last k-step the CTA waits for k-tile
  // kt + 1 and synchronizes once: the barrier publishes kt + 1 and tells that
  // every warp has read all of kt's stage it needs (the last k-step's
  // fragments are in registers), so kt + 1's first fragments load while kt's
  // last k-step multiplies. Ends with every cp.async drained and every warp
  // past its last read of shared memory, so the buffers are free for the next
  // tile's prologue.
  template <typename T, bool FULL>
  static __device__ __forceinline__ void mainloop_of(const TileOperands& op, char* smem, int tile_m, int tile_n,
                                                     float (&acc)[S::MMA_M][S::MMA_N][4]) {
    static_assert(KS >= 2, "copies are spread over the k-steps before the last");
#pragma unroll
    for (int i = 0; i < S::MMA_M; ++i)
#pragma unroll
      for (int j = 0; j < S::MMA_N; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
    const Loader ld(op, tile_m, tile_n);
    const int kts = k_tiles(op);
    AFrags a;
    BFrags b[2];
    cp_async_wait<S::STAGES - 2>();
    __syncthreads();
    const uint32_t a_lane = a_lane_offset(), b_lane = b_lane_offset();
    uint32_t stage = stage_addr(smem, 0);  // k-tile kt's stage
#pragma unroll
    for (int i = 0; i < S::MMA_M; ++i) load_a(a, stage, a_lane, 0, i);
#pragma unroll
    for (int j = 0; j < S::MMA_N; j += 2) load_b(b[0], stage, b_lane, 0, j);
    int read_slot = 0, write_slot = S::STAGES - 1;
    // Interior tiles: the first chunks of the k-tile the k-steps refill,
    // advanced a k-tile per iteration: step kt + STAGES - 1 of the order,
    // k-tile kt + STAGES - 1 - k_tail (prologue_of). It is whole exactly when
    // that step is inside K's k-tiles, (kt + STAGES - 1) * BK < K.
    const int first_write_kt = S::STAGES - 1 - (FULL ? k_tail(op) : 0);
    const char* write_a = ld.a.kt_src(first_write_kt, S::BK * 2);
    const char* write_b = ld.b.kt_src(first_write_kt, Loader::b_ktile_bytes(op));
    constexpr int MMAS = S::MMA_M * S::MMA_N;
    constexpr int B_LOADS = S::MMA_N / 2;
    for (int kt = 0; kt < kts; ++kt) {
      const uint32_t write_stage = stage_addr(smem, write_slot);
      const int write_kt = kt + S::STAGES - 1;
      uint32_t next_stage = stage;
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) {
        BFrags& cur_b = b[ks % 2];
        BFrags& next_b = b[(ks + 1) % 2];
        if (ks == KS - 1) {
          cp_async_wait<S::STAGES - 2>();
          __syncthreads();
          read_slot = read_slot == S::STAGES - 1 ? 0 : read_slot + 1;
          next_stage = stage_addr(smem, read_slot);
        }
        const int next_ks = ks == KS - 1 ? 0 : ks + 1;
        const bool load_next = ks < KS - 1 || kt + 1 < kts;
        // mma (i, j) row by row, serpentine in j (a B fragment serves two mmas
        // in a row); the next k-step's B pairs load evenly spread over the
        // k-step, A fragment i right after row i's last mma.
#pragma unroll
        for (int t = 0; t < MMAS; ++t) {
          const int i = t / S::MMA_N;
          const int j = i % 2 == 0 ? t % S::MMA_N : S::MMA_N - 1 - t % S::MMA_N;
#pragma unroll
          for (int n = 0; n < B_LOADS; ++n)
            if (t == n * MMAS / B_LOADS + MMAS / B_LOADS / 2 && load_next) load_b(next_b, next_stage, b_lane, next_ks, 2 * n);
          if (t == 1 && ks < KS - 1) {
            if constexpr (FULL) {
              ld.issue_whole(op, write_stage, write_a, write_b, int64_t(write_kt) * S::BK < op.k, ks, KS - 1);
            } else {
              ld.issue_checked(op, write_stage, write_kt, ks, KS - 1);
            }
          }
          mma_16816<T>(acc[i][j], a[i], cur_b[j][0], cur_b[j][1]);
          if (t % S::MMA_N == S::MMA_N - 1 && load_next) load_a(a, next_stage, a_lane, next_ks, i);
        }
        if (ks == KS - 2) cp_async_commit();
      }
      stage = next_stage;
      write_slot = write_slot == S::STAGES - 1 ? 0 : write_slot + 1;
      write_a += S::BK * 2;
      write_b += Loader::b_ktile_bytes(op);
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
    // A thread's two neighbouring columns go out as one 4-byte store when
    // rows are contiguous and every row starts 4-byte aligned (col0 is even).
    const bool pairs = p.out_stride_n == 1 && p.out_stride_m % 2 == 0 && reinterpret_cast<uintptr_t>(out) % 4 == 0;
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
          const float v0 = acc[i][j][half * 2] + bias0, v1 = acc[i][j][half * 2 + 1] + bias1;
          if (pairs && col0 + 1 < p.n) {
            *reinterpret_cast<Pair<T>*>(dst) = make_pair<T>(v0, v1);  // one 4-byte store
          } else {
            if (col0 < p.n) dst[0] = from_float<T>(v0);
            if (col0 + 1 < p.n) dst[p.out_stride_n] = from_float<T>(v1);
          }
        }
      }
    }
  }

  // ------------------------------------------------ staged output
  //
  // With one CTA an SM (the 128x256 tile) on sm_90 and newer, the epilogue
  // writes the tile (+ bias, rounded) with stmatrix into a staging area in
  // shared memory past the stages, and the copy engine copies each of its
  // rows to global memory (bulk copies) while the warps go on: `persistent`
  // to its next tile's mainloop (it waits for the copies to have read the
  // area only at its next epilogue), `tiled` to its exit (it waits for
  // that first). Rows are BN * 2 + 16 bytes apart: contiguous for the copy,
  // and the eight rows of each stmatrix land in distinct bank groups.
  // Before, the warps stored their fragments themselves, 4 bytes of 8 rows
  // per store instruction: on the H200 the staged epilogue measured 1.23x
  // (tiled) and 1.17x (persistent) at 8192x8192x1024, 1.03-1.10x at the
  // other large shapes (2026-12-01).
  static constexpr int STAGED_ROW_BYTES = S::BN * 2 + 16;
  static constexpr int STAGED_OFFSET = (S::SMEM_BYTES + 127) / 128 * 128;
  static constexpr int STAGED_SMEM_BYTES = STAGED_OFFSET + S::BM * STAGED_ROW_BYTES;

  // Whether the launch can stage its output: an sm_90+ build, shared memory
  // for the staging area (the CTA's dynamic allocation, as the host asked
  // for it), and an output whose rows the copy engine can write whole:
  // contiguous, 16-byte aligned starts, N a multiple of 8 (rows of whole
  // 16-byte chunks, the edge tile's too). The same for every CTA.
  static __device__ __forceinline__ bool can_stage_output(const MatmulProblem& p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    uint32_t smem_bytes;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(smem_bytes));
    return smem_bytes >= uint32_t(STAGED_SMEM_BYTES) && p.out_stride_n == 1 && p.n % 8 == 0 &&
           reinterpret_cast<uintptr_t>(p.out) % 16 == 0 && (p.m == 1 || p.out_stride_m % 8 == 0);
#else
    return false;
#endif
  }

  // The staged epilogue (can_stage_output must hold). Threads 0 .. BM - 1
  // each copy one row and, at the CTA's next staged epilogue, first wait
  // until that copy has read the staging area; finish_staged_output waits
  // for the last ones before the CTA exits.
  template <typename T>
  static __device__ __forceinline__ void epilogue_staged(const MatmulProblem& p, char* smem, int tile_m, int tile_n,
                                                         const float (&acc)[S::MMA_M][S::MMA_N][4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    static_assert(S::MMA_N % 2 == 0, "stmatrix takes two 8-column blocks at a time");
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int warp_m = warp / S::WARPS_N, warp_n = warp % S::WARPS_N;
    const uint32_t staging = smem_addr(smem) + STAGED_OFFSET;
    if (threadIdx.x < S::BM) bulk_wait_read<0>();  // the previous tile's row copies have read the area
    __syncthreads();
    const T* bias = static_cast<const T*>(p.bias);
    // Lane l addresses row l % 8 of matrix l / 8: (8-column block 2 * jp + (l / 8) / 2, 8-row half (l / 8) % 2).
    const int matrix = lane / 8;
    const uint32_t lane_base = staging + (warp_m * S::WM + (matrix % 2) * 8 + lane % 8) * STAGED_ROW_BYTES +
                               (warp_n * S::WN + (matrix / 2) * 8) * 2;
#pragma unroll
    for (int jp = 0; jp < S::MMA_N / 2; ++jp) {
      float bias0[2], bias1[2];  // the lane's two columns in blocks 2 * jp and 2 * jp + 1
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t col = int64_t(tile_n) * S::BN + warp_n * S::WN + (2 * jp + h) * 8 + (lane % 4) * 2;
        bias0[h] = bias != nullptr && col < p.n ? to_float(bias[col]) : 0.0f;
        bias1[h] = bias != nullptr && col + 1 < p.n ? to_float(bias[col + 1]) : 0.0f;
      }
#pragma unroll
      for (int i = 0; i < S::MMA_M; ++i) {
        uint32_t r[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {  // matrix q: block 2 * jp + q / 2, rows 8 * (q % 2) ...
          const float* f = acc[i][2 * jp + q / 2] + 2 * (q % 2);
          const Pair<T> pair = make_pair<T>(f[0] + bias0[q / 2], f[1] + bias1[q / 2]);
          r[q] = *reinterpret_cast<const uint32_t*>(&pair);
        }
        stmatrix_x4(lane_base + i * 16 * STAGED_ROW_BYTES + jp * 16 * 2, r[0], r[1], r[2], r[3]);
      }
    }
    fence_proxy_async();  // the stmatrix writes, visible to the copy engine
    __syncthreads();
    if (threadIdx.x < S::BM) {
      const int64_t row = int64_t(tile_m) * S::BM + threadIdx.x;
      const int64_t col0 = int64_t(tile_n) * S::BN;
      if (row < p.m) {
        const int cols = int(min_i64(S::BN, p.n - col0));
        T* dst = static_cast<T*>(p.out) + row * p.out_stride_m + col0;
        bulk_copy_to_global(dst, staging + threadIdx.x * STAGED_ROW_BYTES, uint32_t(cols) * 2);
        bulk_commit();
      }
    }
#endif
  }

  // The operands of k-blocks [k_begin, k_end) of a product (a split-tail unit,
  // tile_scheduler.cuh): the same matrices from k = k_begin * BK on, K cut to
  // the unit's depth. A unit that ends at the product's K keeps its K tail.
  static __device__ __forceinline__ TileOperands k_blocks_of(const TileOperands& op, int k_begin, int k_end) {
    TileOperands unit = op;
    const int64_t k0 = int64_t(k_begin) * S::BK;
    unit.a += k0 * 2;
    unit.b += B_KMAJOR ? k0 * 2 : k0 * op.ldb * 2;
    unit.k = min_i64(op.k, int64_t(k_end) * S::BK) - k0;
    return unit;
  }

  // A split-tail partial tile in a slot of BM x BN floats in global memory:
  // each thread's accumulators as float4s, thread-minor (coalesced), through
  // L2 only (.cg: the slot is written by one CTA and read by another).
  static __device__ __forceinline__ void write_partial(float* slot, const float (&acc)[S::MMA_M][S::MMA_N][4]) {
    float4* dst = reinterpret_cast<float4*>(slot) + threadIdx.x;
#pragma unroll
    for (int i = 0; i < S::MMA_M; ++i)
#pragma unroll
      for (int j = 0; j < S::MMA_N; ++j) {
        __stcg(dst + (i * S::MMA_N + j) * S::THREADS, make_float4(acc[i][j][0], acc[i][j][1], acc[i][j][2], acc[i][j][3]));
      }
  }
  static __device__ __forceinline__ void add_partial(const float* slot, float (&acc)[S::MMA_M][S::MMA_N][4]) {
    const float4* src = reinterpret_cast<const float4*>(slot) + threadIdx.x;
#pragma unroll
    for (int i = 0; i < S::MMA_M; ++i)
#pragma unroll
      for (int j = 0; j < S::MMA_N; ++j) {
        const float4 v = __ldcg(src + (i * S::MMA_N + j) * S::THREADS);
        acc[i][j][0] += v.x;
        acc[i][j][1] += v.y;
        acc[i][j][2] += v.z;
        acc[i][j][3] += v.w;
      }
  }

  // Before a CTA that staged its output exits: its last row copies have read
  // the staging area (their global writes complete on their own, as the
  // TMA stores of CUTLASS's epilogues do).
  static __device__ __forceinline__ void finish_staged_output() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (threadIdx.x < S::BM) bulk_wait_read<0>();
#endif
  }

  // A tile's epilogue: staged where the launch can stage its output (above),
  // else from the registers (epilogue).
  template <typename T>
  static __device__ __forceinline__ void store_tile(const MatmulProblem& p, char* smem, int tile_m, int tile_n,
                                                    bool staged, const float (&acc)[S::MMA_M][S::MMA_N][4]) {
    if (staged) {
      epilogue_staged<T>(p, smem, tile_m, tile_n, acc);
    } else {
      epilogue<T>(p, tile_m, tile_n, acc);
    }
  }
};

// One record of the instrumented builds: one unit of work (a whole output
// tile, or a part of a tile that split tail or stream-K cut in K), the
// elements [k_begin, k_end) of K it summed ([0, K) for a whole tile), which SM
// and CTA ran it, and when. A launch has at most tiles + CTAs units, each
// with a row of its own (timeline_row) in an int64 [tiles + CTAs, 8] tensor;
// rows no unit writes keep what the caller filled in.
struct TileRecord {
  int64_t tile_m, tile_n, k_begin, k_end, sm, cta, start_ns, end_ns;
};
static_assert(sizeof(TileRecord) == 8 * sizeof(int64_t), "TileRecord is read as an int64 [tiles + CTAs, 8] tensor");

// A unit's row: a whole tile's is its linear index tile_m * tiles_n + tile_n;
// a part's is past every tile's, at tiles + `slot`, a number no other part
// of the launch has and below the CTA count (split tail: the part's
// workspace slot, at most one a CTA; stream-K: the CTA whose stretch starts
// inside the tile). slot < 0: a whole tile (or the part that starts it, in
// stream-K).
__device__ __forceinline__ int64_t timeline_row(TileCoord tile, int tiles_m, int tiles_n, int64_t slot) {
  return slot < 0 ? int64_t(tile.m) * tiles_n + tile.n : int64_t(tiles_m) * tiles_n + slot;
}

// Whether this image's plain kernels of `tiled` and `persistent` record the
// timeline themselves, when p.timeline is set: those for compute capability
// 10.0 and newer (sm_100, sm_120 and the compute_120 PTX), whose instrumented
// instantiations are empty: one kernel a shape and layout, not two, halves
// the code compiled for those images. The sm_80 and sm_90 images keep a separate
// instrumented kernel, so their plain kernels carry no recording code. The
// host tells the two apart by the image it loaded (records_in_plain_kernel).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000
constexpr bool kPlainKernelRecords = true;
#else
constexpr bool kPlainKernelRecords = false;
#endif

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
