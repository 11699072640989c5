// The CTA body shared by the Hopper rungs `wgmma` and `wgmma_persistent`:
// warp-specialized TMA + wgmma over a stream of output tiles.
//
// A CTA has three warpgroups (four for the 192 x 192 tile). Warpgroup 0 is
// the producer: it gives most of its registers away (setmaxnreg) and one of
// its threads issues TMA loads of BM x BK slices of A and BK x BN slices of B
// into a ring of STAGES shared-memory stages, 128-byte swizzled, each
// completing on its `full` mbarrier. The others are consumers: each takes 64
// rows of the tile, waits for a stage, multiplies it with four m64nBNk16 wgmmas
// (fp32 accumulators in registers), waits for them and frees the stage on
// its `empty` mbarrier at once (the other consumer's wgmmas keep the tensor
// cores busy meanwhile). After the last k-block the consumers round their
// rows (bias added) into registers and go on to the next tile's k-loop;
// after issuing each of its first k-blocks' wgmmas, a consumer writes one
// 64 x 64 box of the previous tile's rows into one of a pair of swizzled
// staging buffers and one thread issues a TMA store of it, which writes
// global memory (tails clipped). The producer meanwhile already loads the
// next tile's stages.
// Outputs TMA cannot store (rows not 16-byte aligned or not a multiple of
// 16 bytes long, strided columns) are stored from registers instead.
//
// With CLUSTER = 2 (an option of `wgmma_persistent`), the two CTAs of a thread block
// cluster compute vertically adjacent tiles, which need the same slice of B:
// each CTA loads half of it and the copy engine multicasts that half into
// both CTAs' shared memory, so B's L2 traffic halves. A stage is then free
// only when the consumers of both CTAs are done with it.
//
// The stream of tiles is the only difference between the two rungs: one
// tile per CTA (`wgmma`), or the persistent tile scheduler (`wgmma_persistent`:
// a static order, the dynamic order through a small queue of claimed tiles,
// or pairs of tiles in its cluster option).
#pragma once

#include <type_traits>

#include "device_helpers.cuh"
#include "hopper_helpers.cuh"
#include "matmul_problem.h"
#include "tensor_core_tile.cuh"  // TileRecord, global_timer_ns, sm_id
#include "tile_scheduler.cuh"

namespace persistent_matmul {
namespace hopper {

// Slots of the queue that hands dynamically claimed tiles from the producer
// thread to the consumers: one for the tile being computed, one for the
// tile the producer is already loading.
constexpr int TILE_QUEUE_SLOTS = 2;

// Named barriers (bar.sync ids) of a CTA: 0 is __syncthreads, kUnitStart and
// kUnitEnd the instrumented build's (record_units), and each consumer
// warpgroup has its own, consumer_barrier(consumer), from 2 on.
constexpr int kUnitStart = 1, kFirstConsumerBarrier = 2, kUnitEnd = 5;
__device__ __forceinline__ int consumer_barrier(int consumer) { return kFirstConsumerBarrier + consumer; }

// A BM x BN x 64 tile: CONSUMERS warpgroups of 64 x BN each, BM = 64 x
// CONSUMERS. 128 rows: BN = 256 for problems with enough tiles to fill the
// GPU, 192 where those tiles make whole rounds and the 256-wide ones do not,
// 64 for a few hundred tokens where those tiles fit on the SMs at once, 128
// otherwise; 192 x 192 (three consumers) where only those make whole rounds
// (tile_shape in wgmma_launch.cuh). The output staging buffers (two 64 x 64
// boxes per consumer) take 32 or 48 KB, the stages what fits beside them in
// 226 KB (4 of 48 or 40 KB, 6 of 32 KB or 8 of 24 KB; 3 of 48 KB for three
// consumers).
template <int BN_, int CONSUMERS_ = 2>
struct WgmmaShape {
  static constexpr int CONSUMERS = CONSUMERS_;
  static constexpr int BM = 64 * CONSUMERS, BN = BN_, BK = 64;
  static constexpr int THREADS = 128 * (CONSUMERS + 1);
  static_assert(kFirstConsumerBarrier + CONSUMERS <= kUnitEnd, "a named barrier per consumer, below kUnitEnd");
  static constexpr int ACCUMULATORS = BN / 2;  // fp32 registers per consumer thread
  static constexpr int A_STAGE_BYTES = BM * BK * 2;
  static constexpr int B_STAGE_BYTES = BN * BK * 2;
  static constexpr int STAGE_BYTES = A_STAGE_BYTES + B_STAGE_BYTES;
  static constexpr int OUT_BOX_BYTES = 64 * 64 * 2;  // a 64 x 64 box of the output, 128-byte rows
  static constexpr int OUT_BUFFERS = 2;              // per consumer: one fills while TMA reads the other
  static constexpr int OUT_STAGING_BYTES = CONSUMERS * OUT_BUFFERS * OUT_BOX_BYTES;
  static constexpr int STAGES = (226 * 1024 - OUT_STAGING_BYTES) / STAGE_BYTES;
  // Output boxes a consumer of `wgmma_persistent` stores at a tile's end;
  // the others wait in registers (PendingStore) for the next tile's first
  // k-blocks. Of a 128 x 256 tile's four, keeping three there besides the
  // next tile's accumulators spilled registers in the split-tail kernels,
  // which then ran 3-5% slower than with two (H200, 2026-12-02). The 128 x 192
  // tile stores all three at its end: with one or two kept, ptxas 13.0
  // serialised the wgmmas of some of its kernels (C7511: the pairs' kernels
  // with two, the single CTAs' split kernels with one). So does the 192 x 192
  // tile, whose consumers have fewer registers.
  static constexpr int BOXES_AT_TILE_END = BN == 192 ? 3 : BN > 128 ? 2 : 0;
  // 1024 bytes of slack to align the stages for the 128-byte swizzle, the
  // stages, the output staging (1024-byte aligned too), the full and empty
  // barriers, then the tile queue (TileQueue): 225 KB at most, under the
  // H200's 227 KB per CTA.
  static constexpr int SMEM_BYTES =
      1024 + STAGES * STAGE_BYTES + OUT_STAGING_BYTES + 2 * STAGES * 8 + TILE_QUEUE_SLOTS * (8 + 8 + 8);
  static_assert(SMEM_BYTES <= 227 * 1024, "more shared memory than an sm_90 CTA may have");
  // Registers per thread after setmaxnreg. At launch every thread holds
  // LAUNCH_REGS (64K / THREADS, rounded down to 8); the consumers can only
  // grow by what the producer gives back, else setmaxnreg.inc waits forever
  // (a hang seen on the H200 with 48 / 232). What a producer of 40 leaves:
  // 232 each for two consumers, 152 each for three.
  static constexpr int LAUNCH_REGS = (65536 / THREADS) / 8 * 8;
  static constexpr int PRODUCER_REGS = 40;
  static constexpr int CONSUMER_REGS = CONSUMERS == 2 ? 232 : 152;
  static_assert((LAUNCH_REGS - PRODUCER_REGS) * 128 >= (CONSUMER_REGS - LAUNCH_REGS) * 128 * CONSUMERS,
                "the consumers' registers must come from the producer's");
};
using WideTile = WgmmaShape<256>;
using MediumTile = WgmmaShape<192>;
using NarrowTile = WgmmaShape<128>;
using SlimTile = WgmmaShape<64>;
using SquareTile = WgmmaShape<192, 3>;

// The tile queue in shared memory: per slot a tile index and two barriers,
// `full` (the producer thread has written the slot) and `empty` (every
// consumer thread has read it).
struct TileQueue {
  int64_t* slots;
  uint64_t* full;
  uint64_t* empty;
};

template <typename Shape>
struct SharedStages {
  char* stages;       // STAGES x (A stage, B stage), 1024-byte aligned
  char* out_staging;  // CONSUMERS x OUT_BUFFERS output boxes, 1024-byte aligned
  uint64_t* full;     // STAGES barriers: the stage holds data
  uint64_t* empty;    // STAGES barriers: the consumers are done with the stage
  TileQueue queue;    // the dynamic order's claimed tiles (wgmma_persistent)
  __device__ explicit SharedStages(char* raw) {
    const uintptr_t base = (reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023);
    stages = reinterpret_cast<char*>(base);
    out_staging = stages + Shape::STAGES * Shape::STAGE_BYTES;
    full = reinterpret_cast<uint64_t*>(out_staging + Shape::OUT_STAGING_BYTES);
    empty = full + Shape::STAGES;
    queue.full = empty + Shape::STAGES;
    queue.empty = queue.full + TILE_QUEUE_SLOTS;
    queue.slots = reinterpret_cast<int64_t*>(queue.empty + TILE_QUEUE_SLOTS);
  }
};

// k-blocks [begin, end) of a tile.
struct KRange {
  int begin, end;
};

// A unit's place in a split tile (tc::SplitTail): part -1 of a whole tile,
// else part `part` of `parts`, whose partial sums go through workspace slot
// `slot` (the tile's other parts use slot - stride, slot - 2 stride, ...).
struct UnitRole {
  int part, parts;
  int64_t slot, stride;
};

// The tile stream of `wgmma`: tile blockIdx.x of the grouped order, once.
class OneTilePerCta {
 public:
  __device__ OneTilePerCta(int tiles_m, int tiles_n) : tiles_m_(tiles_m), tiles_n_(tiles_n) {}
  __device__ bool next(tc::TileCoord& tile) {
    if (done_) return false;
    done_ = true;
    tile = tc::grouped_tile(blockIdx.x, tiles_m_, tiles_n_);
    return true;
  }

 private:
  int tiles_m_, tiles_n_;
  bool done_ = false;
};

// The tile stream of `wgmma_persistent`: the scheduler walks pairs of
// vertically adjacent tiles, one pair per cluster at a time, and CTA `rank`
// of the cluster takes tile row 2 * pair + rank. With an odd number of tile
// rows the last pair's second tile lies below the output: that CTA still
// loads and multicasts its half of B for its partner, skips A, and its
// consumers only pass the stages through (mma_width 0: no wgmma, no store).
class TilePairsPerCluster {
 public:
  __device__ TilePairsPerCluster(int tiles_m, int tiles_n, tc::TileOrder order, int rank)
      : pairs_((tiles_m + 1) / 2, tiles_n, order, blockIdx.x / 2, gridDim.x / 2), rank_(rank) {}
  __device__ bool next(tc::TileCoord& tile) {
    tc::TileCoord pair;
    if (!pairs_.next(pair)) return false;
    tile = {2 * pair.m + rank_, pair.n};
    return true;
  }

 private:
  tc::TileScheduler pairs_;
  int rank_;
};

// One side of the tile queue in the dynamic orders: the producer thread
// takes its first index from the static order (blockIdx.x, as
// tc::claim_tile_index expects), claims each later one of `indices` from the
// counter and passes it to the consumer threads, which read it here.
template <bool PRODUCER>
class ClaimedIndices {
 public:
  __device__ explicit ClaimedIndices(const TileQueue& queue) : queue_(queue) {}
  __device__ int64_t next_index(uint32_t* counter, int64_t indices) {
    int64_t index;
    if constexpr (PRODUCER) {
      index = first_ ? int64_t(blockIdx.x) : tc::claim_tile_index(counter, indices);
      first_ = false;
      mbarrier_wait(&queue_.empty[slot_.stage], slot_.phase ^ 1);  // a fresh barrier passes parity 1
      queue_.slots[slot_.stage] = index;
      mbarrier_arrive(&queue_.full[slot_.stage]);  // releases the slot's write to the waiting consumers
    } else {
      mbarrier_wait(&queue_.full[slot_.stage], slot_.phase);
      index = *static_cast<volatile int64_t*>(&queue_.slots[slot_.stage]);
      mbarrier_arrive(&queue_.empty[slot_.stage]);
    }
    slot_.advance();
    return index;
  }

 private:
  TileQueue queue_;
  RingPosition<TILE_QUEUE_SLOTS> slot_;
  bool first_ = true;  // the producer's first tile
};

// The tile stream of `wgmma_persistent` without clusters: its static orders
// (tc::TileScheduler) or, with a counter, the dynamic order, where the
// producer thread takes its first tile from the static order and claims
// each later one (tc::claim_tile_index) as it starts to load it, and passes
// the index on to the consumer threads through the tile queue. PRODUCER
// says which side this copy of the stream is.
template <bool PRODUCER>
class PersistentTiles {
 public:
  __device__ PersistentTiles(int tiles_m, int tiles_n, tc::TileOrder order, uint32_t* counter,
                             const TileQueue& queue)
      : static_(tiles_m, tiles_n, order == tc::TileOrder::kDynamic ? tc::TileOrder::kGrouped : order),
        counter_(order == tc::TileOrder::kDynamic ? counter : nullptr),
        queue_(queue),
        tiles_m_(tiles_m),
        tiles_n_(tiles_n) {}
  __device__ bool next(tc::TileCoord& tile) {
    if (counter_ == nullptr) return static_.next(tile);
    const int64_t index = queue_.next_index(counter_, int64_t(tiles_m_) * tiles_n_);
    if (index >= int64_t(tiles_m_) * tiles_n_) return false;  // past the last tile: the stream ends
    tile = tc::grouped_tile(int(index), tiles_m_, tiles_n_);
    return true;
  }

 private:
  tc::TileScheduler static_;
  uint32_t* counter_;
  ClaimedIndices<PRODUCER> queue_;
  int tiles_m_, tiles_n_;
};

// The tile stream of `wgmma_persistent` in the split-tail order
// (tc::SplitTail): whole tiles, then the parts of the split tiles. Single
// CTAs walk its indices as in the dynamic order (the producer claims them and
// queues them for the consumers); pairs of CTAs (CLUSTER = 2) walk them
// statically over tile pairs as TilePairsPerCluster, both CTAs of a pair the
// same units, CTA `rank` the pair's tile row 2 * pair + rank, and the partial
// sums go between CTAs of the same rank.
template <int CLUSTER, bool PRODUCER>
class SplitTailUnits {
 public:
  __device__ SplitTailUnits(int tiles_m, int tiles_n, int k_blocks, int rank, uint32_t* counter,
                            const TileQueue& queue)
      : split_(int64_t((tiles_m + CLUSTER - 1) / CLUSTER) * tiles_n, k_blocks, gridDim.x / CLUSTER),
        queue_(queue),
        counter_(counter),
        pair_rows_((tiles_m + CLUSTER - 1) / CLUSTER),
        tiles_n_(tiles_n),
        k_blocks_(k_blocks),
        rank_(rank),
        next_(blockIdx.x / CLUSTER) {}
  __device__ bool next(tc::TileCoord& tile) {
    if constexpr (CLUSTER > 1) {
      index_ = next_;
      next_ += gridDim.x / CLUSTER;
    } else {
      index_ = queue_.next_index(counter_, split_.indices);
    }
    if (index_ >= split_.indices) return false;
    unit_ = split_.unit(index_, pair_rows_, tiles_n_, k_blocks_);
    tile = {CLUSTER * unit_.tile.m + rank_, unit_.tile.n};
    return true;
  }
  __device__ KRange k_range() const { return {unit_.k_begin, unit_.k_end}; }
  __device__ UnitRole role() const {
    return {split_.part_of(index_), split_.parts, (index_ - split_.whole) * CLUSTER + rank_, CLUSTER};
  }

 private:
  tc::SplitTail split_;
  ClaimedIndices<PRODUCER> queue_;
  uint32_t* counter_;
  int pair_rows_, tiles_n_, k_blocks_, rank_;
  int64_t next_, index_ = 0;
  tc::WorkUnit unit_;
};

// The k-blocks of the stream's current tile, and the unit's part in a split
// tile: all k-blocks of a whole tile, but for split-tail units.
template <typename Tiles>
__device__ __forceinline__ KRange k_range_of(const Tiles&, int k_blocks) {
  return {0, k_blocks};
}
template <int CLUSTER, bool PRODUCER>
__device__ __forceinline__ KRange k_range_of(const SplitTailUnits<CLUSTER, PRODUCER>& tiles, int) {
  return tiles.k_range();
}
template <typename Tiles>
__device__ __forceinline__ UnitRole role_of(const Tiles&) {
  return {-1, 1, 0, 1};
}
template <int CLUSTER, bool PRODUCER>
__device__ __forceinline__ UnitRole role_of(const SplitTailUnits<CLUSTER, PRODUCER>& tiles) {
  return tiles.role();
}

// The instrumented build (TIMELINE) records each unit of the stream (a tile,
// or a split-tail part of one) from a warp of its own, the producer
// warpgroup's second (record_units), so that the consumers keep nothing for
// it in registers: a record kept by a consumer thread, even its start alone
// in shared memory, made ptxas serialize the wgmmas of the pairs' split-tail
// kernels of the 256-wide tile (C7511), which have no register to spare. The
// producer thread notes each unit (its tile, k-blocks and split-tail role)
// in a ring in shared memory as it starts to load it; the consumers wait at
// named barrier kUnitStart as they begin a unit and at kUnitEnd once it is
// done (results stored, or partial sums handed over); the recording warp reads
// the clock as each barrier completes and writes the unit's record. Once the
// consumers have no unit left they meet the recording warp at kUnitStart once
// more, saying so through the barrier itself (bar.red.or): a flag in shared
// memory that one consumer set made compute-sanitizer's racecheck report its
// write and the recording warp's read as a race in the CTA pairs' kernels,
// whatever barrier stood between them.
template <typename Shape>
constexpr int kRecordingThreads = 128 * Shape::CONSUMERS + 32;
// Notes in the ring: while the recording warp reads the note of unit u, the
// consumers wait at kUnitStart of unit u + 1, and the producer, at most
// STAGES k-blocks (so many units) ahead of them, may have noted unit
// u + STAGES + 2, waiting for a stage to load it.
constexpr int kUnitNotes = 16;
struct UnitNote {
  tc::TileCoord tile;
  KRange k_blocks;
  int64_t slot;  // the split-tail part's workspace slot; -1 for a whole tile (tc::timeline_row)
};
struct Recording {
  UnitNote notes[kUnitNotes];
};

// The recording warp: the record of each unit the consumers run, until they
// have none left.
template <typename Shape>
__device__ __forceinline__ void record_units(const MatmulProblem& p, const volatile Recording& recording) {
  static_assert(kUnitNotes > Shape::STAGES + 2, "a note is read before the producer reuses it");
  const int tiles_m = int(ceil_div(p.m, Shape::BM)), tiles_n = int(ceil_div(p.n, Shape::BN));
  for (int unit = 0;; ++unit) {
    if (named_barrier_sync_or(kUnitStart, kRecordingThreads<Shape>, false)) return;  // the consumers are done
    const int64_t start = tc::global_timer_ns();
    named_barrier_sync(kUnitEnd, kRecordingThreads<Shape>);
    // bar.sync lets a warp go on issuing until its next memory access, so a
    // clock read right after it may run before the barrier completes (every
    // end read so equal to its start). The note's load here waits for the
    // barrier, and the branch on it holds the clock read back, as the
    // barrier's own result does for start.
    const volatile UnitNote& note = recording.notes[unit % kUnitNotes];
    const tc::TileCoord tile{note.tile.m, note.tile.n};
    if (tile.m < 0) return;
    const int64_t end = tc::global_timer_ns();
    if (threadIdx.x % 32 == 0 && tile.m < tiles_m) {  // a tile below the output is not recorded
      static_cast<tc::TileRecord*>(p.timeline)[tc::timeline_row(tile, tiles_m, tiles_n, note.slot)] = {
          tile.m, tile.n, int64_t(note.k_blocks.begin) * Shape::BK,
          min_i64(int64_t(note.k_blocks.end) * Shape::BK, p.k), tc::sm_id(), blockIdx.x, start, end};
    }
  }
}

// Producer: loads every k-block of every tile of the stream (of a split-tail
// unit: its k-blocks) into the ring.
// In a cluster of two, CTA `rank` loads half of each B slice and multicasts it.
// TIMELINE: notes each unit in `recording` first.
template <typename Shape, int CLUSTER, bool B_KMAJOR, bool TIMELINE, typename Tiles>
__device__ void produce(const CUtensorMap* map_a, const CUtensorMap* map_b, const SharedStages<Shape>& smem,
                        Tiles tiles, int64_t m, int k_blocks, int rank, volatile Recording* recording) {
  static_assert(CLUSTER == 1 || CLUSTER == 2, "clusters of one or two CTAs");
  // K-major B: BN rows of 64 K, loaded as CLUSTER boxes of BN / CLUSTER rows.
  // N-major B: BN / 64 boxes of 64 K rows x 64 N. CTA `rank` of a cluster
  // loads boxes rank, rank + CLUSTER, ... (the 64-wide tile's single N-major
  // box: CTA 0 alone, for both).
  constexpr int B_BOXES = B_KMAJOR ? CLUSTER : Shape::BN / 64;
  constexpr int B_BOX_BYTES = Shape::B_STAGE_BYTES / B_BOXES;
  constexpr uint16_t kAllCtas = (1u << CLUSTER) - 1;
  // Launched as a programmatic dependent (wgmma_persistent), the CTA may
  // start while the kernel before it in the stream still runs. Its first
  // access to global memory is this thread's first tile claim or load (the
  // consumers write only results of loaded stages, and the scratch memory
  // after): from here on that kernel is done. (The wait sits here because
  // ptxas serialized the wgmmas of 8 of the pair kernels, C7511, with it in
  // run_cta or at the kernel's start.)
  wait_for_prior_grids();
  RingPosition<Shape::STAGES> ring;
  tc::TileCoord tile;
  int unit = 0;  // the stream's units so far (TIMELINE)
  while (tiles.next(tile)) {
    // A tile below the output (the second of a cluster's last pair) needs no
    // A: its rows are never stored. Its CTA still sends B to the partner.
    const bool loads_a = int64_t(tile.m) * Shape::BM < m;
    const KRange range = k_range_of(tiles, k_blocks);
    if constexpr (TIMELINE) {
      // Read by the recording warp once the consumers are done with the unit,
      // which they begin after the unit's first stage is loaded (released by
      // its full barrier).
      volatile UnitNote& note = recording->notes[unit % kUnitNotes];
      const UnitRole role = role_of(tiles);
      note.tile.m = tile.m;
      note.tile.n = tile.n;
      note.k_blocks.begin = range.begin;
      note.k_blocks.end = range.end;
      note.slot = role.part < 0 ? -1 : role.slot;
      ++unit;
    }
    for (int kb = range.begin; kb < range.end; ++kb) {
      mbarrier_wait(&smem.empty[ring.stage], ring.phase ^ 1);  // a fresh barrier passes parity 1
      uint64_t* full = &smem.full[ring.stage];
      char* a = smem.stages + ring.stage * Shape::STAGE_BYTES;
      char* b = a + Shape::A_STAGE_BYTES;
      // A (if needed) and all of B, whoever sends it.
      mbarrier_arrive_expect_tx(full, loads_a ? Shape::STAGE_BYTES : Shape::B_STAGE_BYTES);
      if (loads_a) tma_load_2d(a, map_a, full, kb * Shape::BK, tile.m * Shape::BM);
#pragma unroll
      for (int box = 0; box < B_BOXES; ++box) {
        if (box % CLUSTER != rank) continue;
        const int inner = B_KMAJOR ? kb * Shape::BK : tile.n * Shape::BN + box * 64;
        const int outer = B_KMAJOR ? tile.n * Shape::BN + box * (Shape::BN / CLUSTER) : kb * Shape::BK;
        if constexpr (CLUSTER == 1) {
          tma_load_2d(b + box * B_BOX_BYTES, map_b, full, inner, outer);
        } else {
          tma_load_2d_multicast(b + box * B_BOX_BYTES, map_b, full, inner, outer, kAllCtas);
        }
      }
      ring.advance();
    }
  }
}

// Tells the producers of every CTA of the cluster that this consumer
// warpgroup is done with `stage` (one thread per warpgroup signals).
template <int CLUSTER>
__device__ __forceinline__ void release_stage(uint64_t* empty) {
  if constexpr (CLUSTER == 1) {
    mbarrier_arrive(empty);
  } else {
#pragma unroll
    for (int cta = 0; cta < CLUSTER; ++cta) mbarrier_arrive_in_cta(empty, cta);
  }
}

// The wgmma width one consumer warpgroup needs for a tile: 0 if its 64
// rows all lie below the output (it computes nothing), else the narrowest of
// 64, 128, BN columns that covers the tile's columns inside the output. An
// edge tile with a few rows or columns in the output (4097^3: one of each)
// then costs a fraction of a full tile, not a whole one.
template <typename Shape>
__device__ __forceinline__ int mma_width(const MatmulProblem& p, tc::TileCoord tile, int consumer) {
  if (int64_t(tile.m) * Shape::BM + consumer * 64 >= p.m) return 0;
  const int64_t cols = p.n - int64_t(tile.n) * Shape::BN;
  const int width = cols <= 64 ? 64 : cols <= 128 ? 128 : Shape::BN;
  return width < Shape::BN ? width : Shape::BN;
}

// The bias of output columns col and col + 1 (zero past N, or without bias).
template <typename T>
__device__ __forceinline__ void bias_pair(const T* bias, int64_t col, int64_t n, float& bias0, float& bias1) {
  bias0 = bias != nullptr && col < n ? to_float(bias[col]) : 0.0f;
  bias1 = bias != nullptr && col + 1 < n ? to_float(bias[col + 1]) : 0.0f;
}

// One consumer's results of its last tile, rounded to T (bias added), two
// to a register in the accumulator fragment's order (pair i holds d[2i] and
// d[2i + 1]), waiting to go to the copy engine while the consumer computes
// its next tile: consume_tile stages and stores one 64 x 64 box of them per
// k-block, in the shadow of that k-block's wgmmas. Storing them at the
// tile's end instead left the tensor cores idle for ~2500 cycles a tile
// (12% of a tile at K = 1024; H200, 2026-12-02).
template <typename Shape>
struct PendingStore {
  uint32_t pairs[Shape::ACCUMULATORS / 2];
  tc::TileCoord tile;
  int boxes = 0;  // boxes of the tile inside the output; 0: nothing pending
};

// Rounds one consumer's 64 x BN accumulators (+ bias) into `pending`.
// Without a bias there is nothing to add (128 FADDs of zero were ~9% of the
// store-at-the-end epilogue's samples).
template <typename T, typename Shape>
__device__ __forceinline__ void pack_tile(const MatmulProblem& p, tc::TileCoord tile,
                                          const float (&d)[Shape::ACCUMULATORS], PendingStore<Shape>& pending) {
  const T* bias = static_cast<const T*>(p.bias);
  if (bias != nullptr) {
    const int64_t col0 = int64_t(tile.n) * Shape::BN + 2 * (threadIdx.x % 4);
#pragma unroll
    for (int j = 0; j < Shape::BN / 8; ++j) {  // 8-column blocks
      float bias0, bias1;
      bias_pair(bias, col0 + j * 8, p.n, bias0, bias1);
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const tc::Pair<T> pair = tc::make_pair<T>(d[j * 4 + half * 2] + bias0, d[j * 4 + half * 2 + 1] + bias1);
        pending.pairs[j * 2 + half] = *reinterpret_cast<const uint32_t*>(&pair);
      }
    }
  } else {
#pragma unroll
    for (int i = 0; i < Shape::ACCUMULATORS / 2; ++i) {
      const tc::Pair<T> pair = tc::make_pair<T>(d[2 * i], d[2 * i + 1]);
      pending.pairs[i] = *reinterpret_cast<const uint32_t*>(&pair);
    }
  }
  pending.tile = tile;
  pending.boxes = int(min_i64(Shape::BN / 64, ceil_div(p.n - int64_t(tile.n) * Shape::BN, 64)));
}

// Box `box` of the pending results (if inside the output) goes to the copy
// engine in three steps, so that the wgmmas a consumer has in flight meanwhile
// meet no divergent code (ptxas then serializes every wgmma of the kernel,
// its advisory C7518): claim_box, where the leader thread (the one that
// issues stores) waits until the last store from the box's staging buffer has
// read it;
// stage_pending_box, where every thread writes its part of the box into the
// buffer, a 64 x 64 box with 128-byte rows in TMA's 128B-swizzled layout
// (16-byte chunk c of row r at chunk c ^ (r % 8)); and send_box, where the
// leader issues the TMA store. Each stmatrix writes four 8 x 8 pieces: rows
// 0-7 and 8-15 of the warp's 16 rows in two adjacent 8-column blocks; lane
// l gives the address of row l % 8 of piece l / 8.
template <typename Shape>
__device__ __forceinline__ char* out_buffer(char* staging, int consumer, int box) {
  return staging + (consumer * Shape::OUT_BUFFERS + box % Shape::OUT_BUFFERS) * Shape::OUT_BOX_BYTES;
}
// Box b goes through buffer b % 2, so consecutive boxes alternate buffers and
// the last store from a box's buffer is the one two boxes back, which
// bulk_wait_read<1> waits for: except after a tile of an odd number of boxes
// (the 64- and 192-wide tiles), whose last box used the buffer of the next
// tile's box 0, so that box waits for every store. (With one k-block a tile
// the next tile's stores come right after: 192-wide tiles of 8192 x 8192 x 64
// had a normwise error of 0.23 on the H100 with the one-store wait.) `box` is
// known where the loops over boxes are unrolled, so no branch stays.
template <typename Shape>
__device__ __forceinline__ void claim_box(int consumer, int box) {
  // every thread: only the leader has stores to wait for
  if ((Shape::BN / 64) % 2 == 1 && box == 0) {
    bulk_wait_read<0>();
  } else {
    bulk_wait_read<1>();
  }
  named_barrier_sync(consumer_barrier(consumer), 128);
}
template <typename Shape>
__device__ __forceinline__ void stage_pending_box(char* staging, int consumer, int box,
                                                  const PendingStore<Shape>& pending) {
  static_assert(Shape::OUT_BUFFERS == 2, "claim_box waits for the store two boxes back");
  const int t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
  const int piece = lane / 8, row = warp * 16 + (piece % 2) * 8 + lane % 8;
  const uint32_t row_base = smem_u32(out_buffer<Shape>(staging, consumer, box)) + row * 128;
#pragma unroll
  for (int q = 0; q < 4; ++q) {  // 8-column blocks 2q and 2q + 1 of the box
    const int j = box * 8 + 2 * q;  // ... and of the consumer's fragment
    stmatrix_x4(row_base + (((2 * q + piece / 2) ^ (lane % 8)) << 4), pending.pairs[j * 2], pending.pairs[j * 2 + 1],
                pending.pairs[j * 2 + 2], pending.pairs[j * 2 + 3]);
  }
  fence_proxy_async();  // this thread's shared stores, visible to the copy engine
}
// Every box commits one bulk group, empty where no store is sent (a box past
// the output's last column, or no tile pending): claim_box's waits count
// one group a box.
template <typename Shape>
__device__ __forceinline__ void send_box(const CUtensorMap* map_out, char* staging, int consumer, int box,
                                         const PendingStore<Shape>& pending) {
  named_barrier_sync(consumer_barrier(consumer), 128);  // every thread has staged the box
  if (threadIdx.x % 128 == 0) {
    if (box < pending.boxes) {
      tma_store_2d(map_out, out_buffer<Shape>(staging, consumer, box), pending.tile.n * Shape::BN + box * 64,
                   pending.tile.m * Shape::BM + consumer * 64);
    }
    bulk_commit();
  }
}
// Where a consumer's pending results go: the output's tensor map and the staging buffers.
struct OutputStaging {
  const CUtensorMap* map_out;
  char* staging;
};

// Boxes FIRST .. LAST - 1 of the pending results, the three steps at once
// (where no wgmma is in flight); a box past the output commits its empty group.
template <typename Shape, int FIRST, int LAST>
__device__ __forceinline__ void store_pending_boxes(const OutputStaging& out, int consumer,
                                                    const PendingStore<Shape>& pending) {
#pragma unroll
  for (int box = FIRST; box < LAST; ++box) {
    if (box >= pending.boxes) {
      if (threadIdx.x % 128 == 0) bulk_commit();
      continue;
    }
    claim_box<Shape>(consumer, box);
    stage_pending_box<Shape>(out.staging, consumer, box, pending);
    send_box<Shape>(out.map_out, out.staging, consumer, box, pending);
  }
}

// One consumer warpgroup's k-loop over a tile: d = A[rows of this consumer] x
// B[first WIDTH columns], with wgmmas WIDTH wide; accumulators past WIDTH / 2
// are zero. WIDTH = 0 only waits for each stage and releases it. The
// consumer's pending results of its previous tile go out meanwhile, a box
// after each of the first k-blocks' wgmmas are issued (the rest after the
// loop where the tile has fewer k-blocks than boxes); none are pending after.
template <typename T, typename Shape, int CLUSTER, bool B_KMAJOR, int WIDTH, int AT_END>
__device__ __forceinline__ void consume_tile(const SharedStages<Shape>& smem, RingPosition<Shape::STAGES>& ring,
                                             int k_blocks, int consumer, float (&d)[Shape::ACCUMULATORS],
                                             PendingStore<Shape>& pending, const OutputStaging& out) {
  constexpr bool kBF16 = std::is_same_v<T, __nv_bfloat16>;
  static_assert(WIDTH == 0 || WIDTH == 64 || WIDTH == 128 || WIDTH == 192 || WIDTH == 256,
                "wgmma widths 64, 128, 192 or 256");
#pragma unroll
  for (int i = WIDTH / 2; i < Shape::ACCUMULATORS; ++i) d[i] = 0.0f;
  const bool signals = threadIdx.x % 128 == 0;
  const uint32_t stages = smem_u32(smem.stages);
  // Waits for k-block kb's stage and issues its wgmmas.
  auto issue = [&](int kb) {
    mbarrier_wait(&smem.full[ring.stage], ring.phase);
    if constexpr (WIDTH > 0) {
      const uint32_t a = stages + ring.stage * Shape::STAGE_BYTES + consumer * 64 * 128;
      const uint32_t b = stages + ring.stage * Shape::STAGE_BYTES + Shape::A_STAGE_BYTES;
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < Shape::BK / 16; ++kk) {
        // K-major rows are 128 bytes (64 elements): step 32 bytes per k16.
        // N-major B holds 64-element column blocks of BK rows: step 16 rows.
        const uint64_t desc_a = smem_descriptor(a + kk * 32, 16, 1024);
        const uint64_t desc_b = B_KMAJOR ? smem_descriptor(b + kk * 32, 16, 1024)
                                         : smem_descriptor(b + kk * 16 * 128, Shape::BK * 128, 1024);
        Wgmma<WIDTH, B_KMAJOR ? 0 : 1>::template run<kBF16>(reinterpret_cast<float(&)[WIDTH / 2]>(d), desc_a,
                                                            desc_b, (kb > 0 || kk > 0) ? 1 : 0);
      }
      wgmma_commit();
    }
  };
  // Waits for the k-block's wgmmas and frees its stage at once (the other
  // consumer's wgmmas keep the tensor cores busy meanwhile).
  auto retire = [&]() {
    wgmma_wait<0>();
    if (signals) release_stage<CLUSTER>(&smem.empty[ring.stage]);
    ring.advance();
  };
  constexpr int kFirst = AT_END, kBoxes = Shape::BN / 64;
  int kb = 0;
  if constexpr (kFirst == kBoxes) {
    // nothing waits: every box went out at the tile's end
  } else if (k_blocks >= kBoxes - kFirst) {
    // Every box is staged (a box past the output's last column, or with no
    // tile pending, fills its buffer with what is there, unsent; claim_box
    // still waits for the buffer's last store): the code between a k-block's
    // wgmmas and their wait has no branch.
#pragma unroll
    for (int box = kFirst; box < kBoxes; ++box, ++kb) {
      claim_box<Shape>(consumer, box);
      issue(kb);
      stage_pending_box<Shape>(out.staging, consumer, box, pending);
      retire();
      send_box<Shape>(out.map_out, out.staging, consumer, box, pending);
    }
  } else {
    store_pending_boxes<Shape, kFirst, kBoxes>(out, consumer, pending);
  }
  pending.boxes = 0;
  for (; kb < k_blocks; ++kb) {
    issue(kb);
    retire();
  }
}

// consume_tile at the width the tile needs (mma_width).
template <typename T, typename Shape, int CLUSTER, bool B_KMAJOR, int AT_END>
__device__ __forceinline__ void consume_tile_at(int width, const SharedStages<Shape>& smem,
                                                RingPosition<Shape::STAGES>& ring, int k_blocks, int consumer,
                                                float (&d)[Shape::ACCUMULATORS],
                                                PendingStore<Shape>& pending, const OutputStaging& out) {
  if (width == Shape::BN) {
    consume_tile<T, Shape, CLUSTER, B_KMAJOR, Shape::BN, AT_END>(smem, ring, k_blocks, consumer, d, pending, out);
  } else if (width == 0) {
    consume_tile<T, Shape, CLUSTER, B_KMAJOR, 0, AT_END>(smem, ring, k_blocks, consumer, d, pending, out);
  } else if (width == 64) {
    consume_tile<T, Shape, CLUSTER, B_KMAJOR, 64, AT_END>(smem, ring, k_blocks, consumer, d, pending, out);
  } else if constexpr (Shape::BN > 128) {
    consume_tile<T, Shape, CLUSTER, B_KMAJOR, 128, AT_END>(smem, ring, k_blocks, consumer, d, pending, out);
  }
}

template <typename T>
__device__ __forceinline__ void store_pair(T* dst, float x, float y);
template <>
__device__ __forceinline__ void store_pair<__nv_bfloat16>(__nv_bfloat16* dst, float x, float y) {
  *reinterpret_cast<__nv_bfloat162*>(dst) = __floats2bfloat162_rn(x, y);
}
template <>
__device__ __forceinline__ void store_pair<__half>(__half* dst, float x, float y) {
  *reinterpret_cast<__half2*>(dst) = __floats2half2_rn(x, y);
}

// Writes one consumer's 64 x BN accumulators (+ bias) to out, clipping tails,
// straight from the fragments: for outputs whose rows are not contiguous
// (out_stride_n != 1; the other outputs go through shared memory).
// Fragment layout of m64nNk16: thread t of the warpgroup holds, for each
// 8-column block j, rows 16 * (t / 32) + (t % 32) / 4 (+ 8) and columns
// 8j + 2 * (t % 4) (+ 1).
template <typename T, typename Shape>
__device__ __forceinline__ void store_tile(const MatmulProblem& p, tc::TileCoord tile, int consumer,
                                           const float (&d)[Shape::ACCUMULATORS]) {
  const int t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
  const int64_t row0 = int64_t(tile.m) * Shape::BM + consumer * 64 + warp * 16 + lane / 4;
  const int64_t col0 = int64_t(tile.n) * Shape::BN + 2 * (lane % 4);
  T* out = static_cast<T*>(p.out);
  const T* bias = static_cast<const T*>(p.bias);
  // Two adjacent outputs form one aligned 4-byte store when rows are contiguous.
  const bool pairs = p.out_stride_n == 1 && p.out_stride_m % 2 == 0 && reinterpret_cast<uintptr_t>(out) % 4 == 0;
#pragma unroll
  for (int j = 0; j < Shape::BN / 8; ++j) {
    const int64_t col = col0 + j * 8;
    float bias0, bias1;
    bias_pair(bias, col, p.n, bias0, bias1);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int64_t row = row0 + 8 * half;
      if (row >= p.m || col >= p.n) continue;
      const float x = d[j * 4 + half * 2] + bias0, y = d[j * 4 + half * 2 + 1] + bias1;
      T* dst = out + row * p.out_stride_m + col * p.out_stride_n;
      if (pairs && col + 1 < p.n) {
        store_pair<T>(dst, x, y);
      } else {
        dst[0] = from_float<T>(x);
        if (col + 1 < p.n) dst[p.out_stride_n] = from_float<T>(y);
      }
    }
  }
}

// The same staging for outputs with contiguous rows that TMA cannot store
// (rows not whole 16-byte chunks, e.g. N = 4097): the rounded results go
// into the staging buffers box by box as for TMA (stage_pending_box), and
// the warps copy each box out a row at a time, lane l writing columns 2l
// and 2l + 1, so one store instruction covers 128 contiguous bytes of a row
// (a 4-byte store per lane where the pair is 4-byte aligned, else two 2-byte
// ones). Storing from the fragments instead wrote 2-byte pieces of 8 rows
// per instruction: at 4096 x 4097 x 4096 the kernel took 247 us against
// 184 us with N = 4096. `rounded` is the consumer's PendingStore (nothing
// pending on this path): its registers hold the rounded tile meanwhile, and
// it is left with nothing pending.
template <typename T, typename Shape>
__device__ __forceinline__ void store_tile_staged(const MatmulProblem& p, char* staging, tc::TileCoord tile,
                                                  int consumer, const float (&d)[Shape::ACCUMULATORS],
                                                  PendingStore<Shape>& rounded) {
  const int t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
  const int barrier = consumer_barrier(consumer);
  T* out = static_cast<T*>(p.out);
  const bool out_even = reinterpret_cast<uintptr_t>(out) % 4 == 0;
  const int64_t first_row = int64_t(tile.m) * Shape::BM + consumer * 64;
  pack_tile<T, Shape>(p, tile, d, rounded);
#pragma unroll
  for (int box = 0; box < Shape::BN / 64; ++box) {
    if (box >= rounded.boxes) break;  // boxes past the output's last column
    const int64_t col = int64_t(tile.n) * Shape::BN + box * 64 + 2 * lane;
    const uint32_t buffer = smem_u32(out_buffer<Shape>(staging, consumer, box));
    named_barrier_sync(barrier, 128);  // every thread has copied out the buffer's previous box
    stage_pending_box<Shape>(staging, consumer, box, rounded);
    named_barrier_sync(barrier, 128);  // the box is staged
#pragma unroll 4
    for (int r = warp; r < 64; r += 4) {
      const int64_t row = first_row + r;
      if (row >= p.m) break;
      const uint32_t bits = ld_shared_b32(buffer + r * 128 + (((lane / 4) ^ (r % 8)) << 4) + 4 * (lane % 4));
      const tc::Pair<T> pair = *reinterpret_cast<const tc::Pair<T>*>(&bits);
      T* dst = out + row * p.out_stride_m + col;
      if (col + 1 < p.n && out_even && (row * p.out_stride_m + col) % 2 == 0) {
        *reinterpret_cast<tc::Pair<T>*>(dst) = pair;
      } else {
        if (col < p.n) dst[0] = pair.x;
        if (col + 1 < p.n) dst[1] = pair.y;
      }
    }
  }
  rounded.boxes = 0;
}

// Split-tail partial sums of one consumer's 64 x BN rows in a slot of
// p.partials (BM x BN floats per slot; each consumer's half in the layout of
// store_partial_sums) and the consumer's flag of that slot.
template <typename Shape>
__device__ __forceinline__ float4* partial_of(const MatmulProblem& p, int64_t slot, int consumer) {
  return reinterpret_cast<float4*>(p.partials + (slot * Shape::BM + consumer * 64) * Shape::BN);
}
__device__ __forceinline__ uint32_t* partial_flag(const MatmulProblem& p, int64_t slot, int consumer) {
  return p.partial_flags + slot * kSplitFlagsPerSlot + consumer;
}

// A part of a split tile but its last: its sums go to its slot, for the last part.
template <typename Shape>
__device__ __forceinline__ void hand_over_partial(const MatmulProblem& p, const UnitRole& role, int consumer,
                                                  const float (&d)[Shape::ACCUMULATORS]) {
  store_partial_sums(partial_of<Shape>(p, role.slot, consumer), d);
  __threadfence();
  named_barrier_sync(consumer_barrier(consumer), 128);  // every thread's sums are out
  if (threadIdx.x % 128 == 0) store_release_gpu(partial_flag(p, role.slot, consumer), 1);
}

// The last part of a split tile: add the earlier parts' sums, once they are there.
template <typename Shape>
__device__ __forceinline__ void take_over_partials(const MatmulProblem& p, const UnitRole& role, int consumer,
                                                   float (&d)[Shape::ACCUMULATORS]) {
  if (threadIdx.x % 128 == 0) {
    for (int j = 1; j <= role.part; ++j) wait_and_clear_flag(partial_flag(p, role.slot - j * role.stride, consumer));
  }
  named_barrier_sync(consumer_barrier(consumer), 128);
  for (int j = 1; j <= role.part; ++j) add_partial_sums(d, partial_of<Shape>(p, role.slot - j * role.stride, consumer));
}

// Before the CTA exits: thread 0 of each consumer waits until its TMA
// stores have written global memory (and stopped reading shared memory).
__device__ __forceinline__ void finish_stores() {
  if (threadIdx.x % 128 == 0) bulk_wait<0>();
}

// The whole CTA: set up the barriers, split into producer and consumers, and
// run the tile stream. `make_tiles(rank, queue, is_producer)` gives each role
// its own copy of the stream of this CTA's tiles (both roles walk the same
// tiles in the same order).
// `map_out` describes the output in 64 x 64 boxes if `store_by_tma`, else the
// consumers store through shared memory themselves (store_tile_staged), or
// from registers where out's rows are not contiguous (store_tile).
template <typename T, typename Shape, int CLUSTER, bool B_KMAJOR, bool TIMELINE, typename MakeTiles>
__device__ __forceinline__ void run_cta(const CUtensorMap* map_a, const CUtensorMap* map_b,
                                        const CUtensorMap* map_out, bool store_by_tma, const MatmulProblem& p,
                                        MakeTiles make_tiles) {
  extern __shared__ char smem_raw[];
  const SharedStages<Shape> smem(smem_raw);
  __shared__ Recording recording;  // the instrumented build's (record_units)
  const int rank = CLUSTER > 1 ? int(cluster_cta_rank()) : 0;
  if (threadIdx.x == 0) {
    for (int s = 0; s < Shape::STAGES; ++s) {
      mbarrier_init(&smem.full[s], 1);
      mbarrier_init(&smem.empty[s], Shape::CONSUMERS * CLUSTER);
    }
    for (int s = 0; s < TILE_QUEUE_SLOTS; ++s) {
      mbarrier_init(&smem.queue.full[s], 1);
      mbarrier_init(&smem.queue.empty[s], 128 * Shape::CONSUMERS);
    }
    fence_barrier_init();
  }
  // The partner CTA multicasts into these barriers: they must exist first.
  if constexpr (CLUSTER > 1) {
    cluster_sync();
  } else {
    __syncthreads();
  }
  const int k_blocks = int(ceil_div(p.k, Shape::BK));
  const int warpgroup = threadIdx.x / 128;
  if (warpgroup == 0) {
    release_registers<Shape::PRODUCER_REGS>();
    if (threadIdx.x == 0) {
      produce<Shape, CLUSTER, B_KMAJOR, TIMELINE>(map_a, map_b, smem, make_tiles(rank, smem.queue, std::true_type{}),
                                                  p.m, k_blocks, rank, &recording);
      // The next programmatic launch in the stream may be scheduled once every
      // CTA's producer is here: its CTAs take SMs as this grid's exit, and
      // wait for it before touching global memory (produce). On the H200 that
      // ran 1.017x the speed of no programmatic launch (8 shapes), against
      // 1.013x when scheduled at the CTAs' end (2026-12-03).
      allow_dependent_grids();
    } else if (TIMELINE && threadIdx.x / 32 == 1) {
      record_units<Shape>(p, recording);
    }
  } else {
    claim_registers<Shape::CONSUMER_REGS>();
    const int consumer = warpgroup - 1;
    RingPosition<Shape::STAGES> ring;
    PendingStore<Shape> pending;  // the results of the previous tile, while they go out
    const OutputStaging out{map_out, smem.out_staging};
    auto tiles = make_tiles(rank, smem.queue, std::false_type{});
    // A CTA of `wgmma` has no next tile to hide its stores: all go out at once.
    constexpr int kAtEnd =
        std::is_same_v<decltype(tiles), OneTilePerCta> ? Shape::BN / 64 : Shape::BOXES_AT_TILE_END;
    tc::TileCoord tile;
    while (tiles.next(tile)) {
      if constexpr (TIMELINE) named_barrier_sync_or(kUnitStart, kRecordingThreads<Shape>, false);
      float d[Shape::ACCUMULATORS];
      const int width = mma_width<Shape>(p, tile, consumer);
      const KRange range = k_range_of(tiles, k_blocks);
      consume_tile_at<T, Shape, CLUSTER, B_KMAJOR, kAtEnd>(width, smem, ring, range.end - range.begin, consumer, d, pending,
                                                   out);
      const UnitRole role = role_of(tiles);
      if (width > 0 && role.part >= 0 && role.part < role.parts - 1) {
        hand_over_partial<Shape>(p, role, consumer, d);  // a part of a tile another unit stores
        if constexpr (TIMELINE) named_barrier_sync(kUnitEnd, kRecordingThreads<Shape>);
        continue;
      }
      if (width > 0 && role.part > 0) take_over_partials<Shape>(p, role, consumer, d);  // the last part
      if (width == 0) {
        // rows below the output: nothing to store
      } else if (store_by_tma) {
        pack_tile<T, Shape>(p, tile, d, pending);
        store_pending_boxes<Shape, 0, kAtEnd>(out, consumer, pending);  // the rest: during the next tile
      } else if (p.out_stride_n == 1) {
        store_tile_staged<T, Shape>(p, out.staging, tile, consumer, d, pending);
      } else {
        store_tile<T, Shape>(p, tile, consumer, d);
      }
      if constexpr (TIMELINE) named_barrier_sync(kUnitEnd, kRecordingThreads<Shape>);
    }
    if constexpr (TIMELINE) named_barrier_sync_or(kUnitStart, kRecordingThreads<Shape>, true);  // no unit left
    if (store_by_tma) {
      store_pending_boxes<Shape, kAtEnd, Shape::BN / 64>(out, consumer, pending);  // the last tile's rest
      finish_stores();
    }
  }
  // Stay alive until the partner CTA has made its last arrivals on our barriers.
  if constexpr (CLUSTER > 1) cluster_sync();
}

}  // namespace hopper
}  // namespace persistent_matmul
