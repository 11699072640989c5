// The order in which output tiles are computed, shared by `tiled` (one CTA
// per tile, tile = blockIdx.x) and `persistent` (each CTA walks tiles
// blockIdx.x, blockIdx.x + gridDim.x, ...).
//
// Grouped order walks kGroupRows tile rows column by column, so tiles that run
// at the same time share rows of A and columns of B in L2. Hilbert order
// (persistent only) walks a Hilbert curve over the smallest power-of-two
// square that covers the tile grid, skipping cells outside it: neighbouring
// indices are neighbouring tiles in both directions. Dynamic order
// (persistent only) is the grouped order handed out at run time: after its
// first tile, a CTA that finishes a tile (in wgmma_persistent: whose
// producer is done loading one) claims the next unclaimed index from a
// counter in global memory, one atomic per tile, so CTAs that run ahead take more tiles and
// the tiles in flight stay a contiguous stretch of the grouped order, as the
// hardware's block dispatch keeps them for `tiled`. A static order fixes
// each CTA's tiles up front (blockIdx.x, blockIdx.x + gridDim.x, ...).
// Split-tail order (persistent only; SplitTail below) is the dynamic order
// with the tiles of the last, ragged round split in K, so that round keeps
// every SM busy for a fraction of a tile's time.
#pragma once

#include <cstdint>

#include "device_helpers.cuh"  // min_i64

namespace persistent_matmul {
namespace tc {

// Tile counts fit in 32 bits: an output holds at most ~2^36 elements (all of
// a GPU's memory) and a tile at least 2^12.
struct TileCoord {
  int m, n;
};

// Grouped measured faster than Hilbert on 8 of the 11 benchmark shapes on the
// H200 (benchmarks/results/2026-11-29-benchmark.md); the dynamic order (grouped,
// claimed at run time) is the default, faster still where the last wave is
// ragged (benchmarks/NOTES.md, fourth session). On a
// long, thin tile grid most cells of Hilbert's covering square lie outside
// it, and striding CTAs over the square gives some CTAs several tiles and
// others none (3x slower at 128x4096x4096).
enum class TileOrder : int32_t { kGrouped = 0, kHilbert = 1, kDynamic = 2, kSplitTail = 3 };

// Rows of tiles per group of the grouped order.
constexpr int kGroupRows = 8;

// Tile `in_group` of group `group`: the group's rows of tiles walked column by
// column. Every group but the last has kGroupRows rows, so the position in
// the group splits with a shift and a mask (a division by a run-time value
// costs ~25 dependent instructions on the GPU).
__host__ __device__ __forceinline__ TileCoord tile_in_group(int group, int in_group, int tiles_m) {
  const int first_m = group * kGroupRows;
  const int group_rows = min(kGroupRows, tiles_m - first_m);
  if (group_rows == kGroupRows) {
    return {first_m + int(unsigned(in_group) % kGroupRows), int(unsigned(in_group) / kGroupRows)};
  }
  return {first_m + in_group % group_rows, in_group / group_rows};
}

__host__ __device__ __forceinline__ TileCoord grouped_tile(int t, int tiles_m, int tiles_n) {
  const int tiles_per_group = kGroupRows * tiles_n;
  const int group = t / tiles_per_group;
  return tile_in_group(group, t - group * tiles_per_group, tiles_m);
}

// Cell d of the Hilbert curve over a side x side square (side a power of two).
__host__ __device__ __forceinline__ TileCoord hilbert_cell(int64_t d, int side) {
  int x = 0, y = 0;
  for (int s = 1; s < side; s *= 2) {
    const int rx = 1 & int(d / 2);
    const int ry = 1 & int(d ^ rx);
    if (ry == 0) {  // rotate the quadrant
      if (rx == 1) {
        x = s - 1 - x;
        y = s - 1 - y;
      }
      const int swap = x;
      x = y;
      y = swap;
    }
    x += s * rx;
    y += s * ry;
    d /= 4;
  }
  return {y, x};
}

// The dynamic order: CTA c's first tile is index c (blockIdx.x, as in the
// static grouped order: the first wave needs no atomic and keeps the static
// order's placement), and each later index is claimed with one atomic on the
// launch's counter, zero at launch: claim j gives index gridDim.x + j.
// Indices past the last tile say "no more". Every claiming thread (one per
// CTA) claims until it gets such an index and then stops, so a launch makes
// exactly `tiles` claims (grid <= tiles): the thread that makes the last one
// sets the counter back to zero, ready for the next launch on the stream
// (the binding keeps one counter per stream; torch_binding.cpp).
__device__ __forceinline__ int64_t claim_tile_index(uint32_t* counter, int64_t tiles) {
  const int64_t claim = atomicAdd(counter, 1u);
  if (claim == tiles - 1) atomicExch(counter, 0u);
  return gridDim.x + claim;
}

// The tiles one persistent CTA computes, in a static order: indices
// first, first + stride, ... (by default blockIdx.x, blockIdx.x + gridDim.x,
// ...; a cluster of CTAs walks its own sequence of cluster-sized tiles).
// The grouped order keeps the next index as (group, position in the group)
// and steps both by the stride's own split, so a step costs no division: the
// consumers of wgmma_persistent take their next tile between one tile's
// epilogue and the next one's first wgmma, with the tensor cores idle, where
// grouped_tile's two divisions by run-time values (~25 dependent instructions
// each) sat. On the H200 that made wgmma_persistent 0.7-2.2% faster at
// K = 1024 and changed nothing measurable at larger K (2026-12-02).
class TileScheduler {
 public:
  __device__ TileScheduler(int tiles_m, int tiles_n, TileOrder order)
      : TileScheduler(tiles_m, tiles_n, order, blockIdx.x, gridDim.x) {}
  __device__ TileScheduler(int tiles_m, int tiles_n, TileOrder order, int64_t first, int stride)
      : tiles_m_(tiles_m), tiles_n_(tiles_n), order_(order), stride_(stride), next_(first) {
    if (order_ == TileOrder::kHilbert) {
      side_ = 1;
      while (side_ < tiles_m || side_ < tiles_n) side_ *= 2;
      end_ = int64_t(side_) * side_;
    } else {
      side_ = 0;
      end_ = int64_t(tiles_m) * tiles_n;
      tiles_per_group_ = kGroupRows * tiles_n;
      group_ = int(first / tiles_per_group_);
      in_group_ = int(first % tiles_per_group_);
      stride_groups_ = stride / tiles_per_group_;
      stride_in_group_ = stride % tiles_per_group_;
    }
  }

  // The static orders' next index (where a scheduler rebuilt later resumes).
  __device__ int64_t position() const { return next_; }

  // The CTA's next tile; false when it has none left.
  __device__ bool next(TileCoord& tile) {
    if (order_ != TileOrder::kHilbert) {  // every index below end_ is a tile of the grid
      if (next_ >= end_) return false;
      tile = tile_in_group(group_, in_group_, tiles_m_);
      next_ += stride_;
      group_ += stride_groups_;
      in_group_ += stride_in_group_;
      if (in_group_ >= tiles_per_group_) {
        in_group_ -= tiles_per_group_;
        ++group_;
      }
      return true;
    }
    for (; next_ < end_; next_ += stride_) {
      tile = hilbert_cell(next_, side_);
      if (tile.m < tiles_m_ && tile.n < tiles_n_) {
        next_ += stride_;
        return true;
      }
    }
    return false;
  }

 private:
  int tiles_m_, tiles_n_;
  TileOrder order_;
  int stride_;
  int side_;
  int64_t next_, end_;
  // The grouped order's next index as group_ * tiles_per_group_ + in_group_,
  // and the stride split the same way.
  int tiles_per_group_ = 0, group_ = 0, in_group_ = 0, stride_groups_ = 0, stride_in_group_ = 0;
};

// The split-tail order (persistent rungs): where the tiles do not make whole
// waves, the last round leaves SMs idle (3000^3: 288 tiles of 128x256 make
// 2.2 waves on 132 SMs, so the third round runs 24 tiles on 132 SMs). The
// order splits each of those last `tiles % CTAs` tiles into `parts` units of
// consecutive k-blocks, as many parts as fit the CTAs in one round, so the
// last round takes 1 / parts of a tile's time. The units of one round start
// at the same k offsets and run at the same time, like whole tiles, so they
// share their A and B slices in L2 (a stream-K split, where each CTA takes an
// equal stretch of all k-blocks, put every CTA at another k and ran 5-12%
// slower on the H200 at 4096^3 and 4096x4096x11008, bandwidth-bound).
// Fewer tiles than CTAs (the products of a few hundred tokens) are a last
// round of their own: every tile is split, so the launch may run up to
// `tiles * parts` CTAs where one CTA a tile would leave most SMs idle, each
// streaming a 1 / parts share of the tile's A and B slices (split-K).
//
// Indices [0, whole) are whole tiles in grouped order; index whole + u for u
// in [0, (tiles - whole) * parts) is part u % parts of tile whole + u / parts.
// The CTAs walk these indices as in the dynamic order (or, for CTA pairs,
// statically: CTA c takes c, c + CTAs, ...). A part other than the last
// writes its fp32 partial sums to slot u of the workspace and sets the
// slot's flag; the last part (the tile's owner) waits for the other parts'
// flags, adds their slots, clears the flags for the next launch and stores the
// tile. A part never waits for a later index, and an owner only for earlier
// ones, which the CTAs that took them compute without waiting: no wait forms
// a cycle (every CTA of the grid is resident: the grid fills the GPU once).
struct WorkUnit {
  TileCoord tile;
  int k_begin, k_end;  // the unit's k-blocks [k_begin, k_end) of the tile's k_blocks
};

struct SplitTail {
  static constexpr int kMinBlocksPerPart = 4;  // parts shorter than this fill and drain the pipeline for little
  static constexpr int kMaxParts = 8;          // the owner adds parts - 1 slots of 128 KB
  int64_t whole;    // indices [0, whole): whole tiles
  int64_t indices;  // all indices: whole + (tiles - whole) * parts
  int parts;        // units per split tile (1: nothing is split)
  __host__ __device__ SplitTail(int64_t tiles, int k_blocks, int64_t ctas) {
    const int64_t rest = tiles % ctas;
    // Fewer tiles than CTAs: all of them. (Two steps: as one expression ptxas
    // 13.0 serialised the wgmmas of wgmma_persistent's split kernels, C7511.)
    int64_t p = tiles <= ctas || rest == 0 ? 1 : ctas / rest;
    if (tiles < ctas) p = ctas / tiles;
    p = min_i64(min_i64(p, k_blocks / kMinBlocksPerPart), kMaxParts);
    parts = p < 2 ? 1 : int(p);
    whole = parts == 1 ? tiles : tiles - rest;
    indices = whole + (tiles - whole) * parts;
  }
  // The part of index i (0 .. parts - 1), or -1 for a whole tile.
  __host__ __device__ int part_of(int64_t i) const { return i < whole ? -1 : int((i - whole) % parts); }
  __device__ WorkUnit unit(int64_t i, int tiles_m, int tiles_n, int k_blocks) const {
    if (i < whole) return {grouped_tile(int(i), tiles_m, tiles_n), 0, k_blocks};
    const int part = part_of(i);
    return {grouped_tile(int(whole + (i - whole) / parts), tiles_m, tiles_n), part * k_blocks / parts,
            (part + 1) * k_blocks / parts};
  }
};

// The dynamic order in a CTA whose threads walk the tiles together
// (`persistent`): thread 0 has claimed `index` (the other threads' value is
// unused) and shares it through `slot` in shared memory.
__device__ __forceinline__ int64_t share_claimed_index(int64_t index, int64_t* slot) {
  if (threadIdx.x == 0) *slot = index;
  __syncthreads();
  index = *slot;
  __syncthreads();  // every thread has read the slot before thread 0 refills it
  return index;
}

// The claimed index's tile (share_claimed_index); false past the last tile.
__device__ __forceinline__ bool share_claimed_tile(int64_t index, int tiles_m, int tiles_n, int64_t* slot,
                                                   TileCoord& tile) {
  index = share_claimed_index(index, slot);
  if (index >= int64_t(tiles_m) * tiles_n) return false;
  tile = grouped_tile(int(index), tiles_m, tiles_n);
  return true;
}

}  // namespace tc
}  // namespace persistent_matmul
