// Rung 4 — persistent: the `tiled` tile code, scheduled persistently.
//
// Over `tiled`, the grid is only as large as what fits on the GPU at once
// (SM count x CTAs per SM, both read at run time), and each CTA walks output
// tiles t = blockIdx.x, blockIdx.x + gridDim.x, ... in the same grouped order
// (or a Hilbert order), or after its first claims each next tile from a
// counter when it is done with one (the dynamic order; tile_scheduler.cuh). There are no waves and no launch
// of a new CTA per tile: a CTA that finishes a tile starts the cp.async loads
// of its next tile first, then writes the finished tile's results, so the
// next tile's loads overlap this tile's epilogue. Where the epilogue stages
// the tile for the copy engine (one CTA an SM, sm_90+: Tile::epilogue_staged),
// the copy runs during the next tile's mainloop. In the split-tail order the
// tiles of the last, ragged round are split in K into parts that run on
// otherwise idle SMs, their partial sums passed on through global memory
// (tc::SplitTail). Where the grid would hold every tile, each CTA would run
// one: the launch runs `tiled`'s kernel, which is that schedule.
#include "tensor_core_launch.cuh"

namespace persistent_matmul {
namespace {

// The CTA's next tile in the problem's order. In a static order the only
// state carried from one call to the next is `position`, the next index; the
// rest of the scheduler is rebuilt from the kernel parameters each time, so
// no scheduler state takes registers during the mainloop, which needs nearly
// all of them (224 for the 128x256 tile, 234 with the scheduler kept live).
// In the dynamic order, the first tile is the static one (`position` =
// blockIdx.x) and thread 0 claims each later one.
template <typename Shape>
__device__ __forceinline__ bool next_tile(const MatmulProblem& p, char* smem, int64_t& position, tc::TileCoord& c) {
  const int tiles_m = int(ceil_div(p.m, Shape::BM)), tiles_n = int(ceil_div(p.n, Shape::BN));
  const auto order = static_cast<tc::TileOrder>(p.tile_order);
  if (order == tc::TileOrder::kDynamic && position != blockIdx.x) {
    const int64_t claimed = threadIdx.x == 0 ? tc::claim_tile_index(p.tile_counter, int64_t(tiles_m) * tiles_n) : 0;
    return tc::share_claimed_tile(claimed, tiles_m, tiles_n,
                                  reinterpret_cast<int64_t*>(smem + Shape::CLAIM_SLOT_OFFSET), c);
  }
  tc::TileScheduler scheduler(tiles_m, tiles_n, order, position, gridDim.x);
  const bool more = scheduler.next(c);
  position = scheduler.position();
  return more;
}

// The split-tail order's next index (tc::SplitTail): the first is the static
// one (blockIdx.x), thread 0 claims each later one from the counter.
__device__ __forceinline__ int64_t next_split_index(const MatmulProblem& p, const tc::SplitTail& split, char* slot,
                                                     bool first) {
  if (first) return blockIdx.x;
  const int64_t claimed = threadIdx.x == 0 ? tc::claim_tile_index(p.tile_counter, split.indices) : 0;
  return tc::share_claimed_index(claimed, reinterpret_cast<int64_t*>(slot));
}

// SPLIT: the split-tail order (p.tile_order 3): the CTA walks units of work,
// whole tiles or parts of a split tile's k-blocks. A part other than a tile's
// last hands its partial sums to the last through the workspace slot of its
// index instead of storing; the last part adds the others' before it stores.
// TIMELINE: the instrumented kernel, which records every unit; empty in the
// images whose plain kernel records them when p.timeline is set
// (tc::kPlainKernelRecords).
template <typename T, typename Shape, bool B_KMAJOR, bool TIMELINE, bool SPLIT>
__global__ void __launch_bounds__(Shape::THREADS, Shape::MIN_CTAS) persistent_kernel(MatmulProblem p, tc::TileOperands op) {
  if constexpr (TIMELINE && tc::kPlainKernelRecords) {
    __trap();  // never launched: launch_persistent runs the plain kernel with p.timeline set
  } else {
    extern __shared__ __align__(128) char smem[];
    using Tile = tc::Tile<Shape, B_KMAJOR>;
    const bool record = TIMELINE || (tc::kPlainKernelRecords && p.timeline != nullptr);
    const int tiles_m = int(ceil_div(p.m, Shape::BM)), tiles_n = int(ceil_div(p.n, Shape::BN));
    const int k_blocks = SPLIT ? Tile::k_tiles(op) : 0;  // read only by the split-tail order
    // The order's next unit: a whole tile (next_tile), or a unit of the split
    // tail; `index` becomes the unit's index there.
    auto next_unit = [&](int64_t& position, int64_t& index, tc::WorkUnit& unit) {
      if constexpr (SPLIT) {
        const tc::SplitTail split(int64_t(tiles_m) * tiles_n, k_blocks, gridDim.x);
        index = next_split_index(p, split, smem + Shape::CLAIM_SLOT_OFFSET, position == blockIdx.x);
        position = -1;  // the first index is taken
        if (index >= split.indices) return false;
        unit = split.unit(index, tiles_m, tiles_n, k_blocks);
        return true;
      } else {
        return next_tile<Shape>(p, smem, position, unit.tile);
      }
    };
    // A unit's loads and k loop: over the whole product's K, or the unit's k-blocks.
    auto prologue = [&](const tc::WorkUnit& unit) {
      if constexpr (SPLIT) {
        Tile::prologue(Tile::k_blocks_of(op, unit.k_begin, unit.k_end), smem, unit.tile.m, unit.tile.n);
      } else {
        Tile::prologue(op, smem, unit.tile.m, unit.tile.n);
      }
    };
    auto mainloop = [&](const tc::WorkUnit& unit, float (&acc)[Shape::MMA_M][Shape::MMA_N][4]) {
      if constexpr (SPLIT) {
        Tile::template mainloop<T>(Tile::k_blocks_of(op, unit.k_begin, unit.k_end), smem, unit.tile.m, unit.tile.n,
                                   acc);
      } else {
        Tile::template mainloop<T>(op, smem, unit.tile.m, unit.tile.n, acc);
      }
    };
    int64_t position = blockIdx.x, index = 0;
    tc::WorkUnit u;
    if (!next_unit(position, index, u)) return;
    prologue(u);
    const bool staged = Shape::MIN_CTAS == 1 && Tile::can_stage_output(p);
    while (true) {
      const int64_t start = record ? tc::global_timer_ns() : 0;
      float acc[Shape::MMA_M][Shape::MMA_N][4];
      mainloop(u, acc);
      // The shared-memory buffers are free now: start the next tile's loads
      // before spending time on this tile's stores.
      tc::WorkUnit next_u;
      int64_t next_index = 0;
      const bool more = next_unit(position, next_index, next_u);
      if (more) prologue(next_u);
      const tc::SplitTail split(SPLIT ? int64_t(tiles_m) * tiles_n : 1, k_blocks, gridDim.x);
      const int part = SPLIT ? split.part_of(index) : -1;
      if (SPLIT && part >= 0 && part < split.parts - 1) {
        // Not the tile's last part: pass the partial sums on.
        const int64_t slot = index - split.whole;
        Tile::write_partial(p.partials + slot * Shape::BM * Shape::BN, acc);
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) store_release_gpu(p.partial_flags + slot * kSplitFlagsPerSlot, 1);
      } else {
        if (SPLIT && part > 0) {
          // The last part of a split tile: add the others.
          const int64_t first_slot = index - split.whole - part;
          if (threadIdx.x == 0) {
            for (int j = 0; j < part; ++j) wait_and_clear_flag(p.partial_flags + (first_slot + j) * kSplitFlagsPerSlot);
          }
          __syncthreads();
          for (int j = 0; j < part; ++j) Tile::add_partial(p.partials + (first_slot + j) * Shape::BM * Shape::BN, acc);
        }
        Tile::template store_tile<T>(p, smem, u.tile.m, u.tile.n, staged, acc);
      }
      if (record) {
        __syncthreads();  // every thread has stored its results, or handed its partial sums over
        if (threadIdx.x == 0) {
          int64_t k_begin = 0, k_end = p.k;
          if constexpr (SPLIT) {
            // The unit's k-blocks, worked out again rather than kept in
            // registers across the mainloop.
            const tc::WorkUnit done = split.unit(index, tiles_m, tiles_n, k_blocks);
            k_begin = int64_t(done.k_begin) * Shape::BK;
            k_end = min_i64(int64_t(done.k_end) * Shape::BK, p.k);
          }
          const int64_t row = tc::timeline_row(u.tile, tiles_m, tiles_n, part < 0 ? -1 : index - split.whole);
          static_cast<tc::TileRecord*>(p.timeline)[row] = {u.tile.m,    u.tile.n,   k_begin, k_end, tc::sm_id(),
                                                           blockIdx.x, start, tc::global_timer_ns()};
        }
      }
      if (!more) break;
      u = next_u;
      index = next_index;
    }
    if (staged) Tile::finish_staged_output();
  }
}

// CTAs that fill the device once: SMs x resident CTAs per SM, capped at the
// tile count. The occupancy is asked of the runtime once per kernel and device
// (a kernel's threads and shared memory never change on a device): the query
// costs microseconds of host time, which small products would pay per call.
// The kernel may ask for more than 48 KB of shared memory before the query:
// without that the query found no room, and each kernel's first launch ran
// one CTA an SM (64x64 tiles: 132 CTAs for 256 tiles, 3 an SM after it).
template <auto kKernel>
int64_t persistent_grid(int threads, int smem_bytes, int device, int64_t tiles) {
  static int cached[128] = {};
  const bool cacheable = device >= 0 && device < 128;
  int per_sm = cacheable ? cached[device] : 0;
  if (per_sm == 0) {
    if (tc::allow_dynamic_smem<kKernel>(smem_bytes, device) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kKernel, threads, smem_bytes) != cudaSuccess ||
        per_sm < 1) {
      cudaGetLastError();  // clear it: the launch reports real errors
      per_sm = 1;
    } else if (cacheable) {
      cached[device] = per_sm;
    }
  }
  return min_i64(tiles, int64_t(per_sm) * tc::sm_count(device));
}

template <typename T, typename Shape, bool B_KMAJOR, bool TIMELINE, bool SPLIT>
cudaError_t launch_kernel(const MatmulProblem& p, cudaStream_t stream, int device, int64_t grid) {
  constexpr auto kernel = persistent_kernel<T, Shape, B_KMAJOR, TIMELINE, SPLIT>;
  const int smem = tc::smem_request<Shape>(device);
  if (cudaError_t err = tc::allow_dynamic_smem<kernel>(smem, device)) return err;
  kernel<<<static_cast<unsigned>(grid), Shape::THREADS, smem, stream>>>(p, tc::operands_of(p, B_KMAJOR));
  return cudaGetLastError();
}

// Whether the split-tail order splits anything here: tiles of the 128x256 or
// 128x128 shapes whose last round SplitTail cuts in parts, with a grid that
// fits the workspace. Elsewhere the order runs as the dynamic one, which then
// assigns the same whole tiles: the split kernel's extra work per unit cost
// 1-8% on the H200 at shapes it does not split (2026-12-02).
template <typename Shape>
bool splits_tail(const MatmulProblem& p, int device, int64_t tiles, int64_t grid) {
  return Shape::BM * Shape::BN >= 128 * 128 && p.partials != nullptr &&
         split_workspace_fits(grid, Shape::BM, Shape::BN, tc::sm_count(device)) &&
         tc::SplitTail(tiles, int(ceil_div(p.k, Shape::BK)), grid).parts > 1;
}

template <bool TIMELINE>
cudaError_t launch(const MatmulProblem& problem, cudaStream_t stream, int device) {
  return tc::dispatch(problem, device, [&](auto type, auto shape, auto kmajor) {
    using T = typename decltype(type)::type;
    using Shape = decltype(shape);
    constexpr bool kKMajor = decltype(kmajor)::value;
    constexpr auto kernel = persistent_kernel<T, Shape, kKMajor, TIMELINE, false>;
    const int64_t tiles = ceil_div(problem.m, Shape::BM) * ceil_div(problem.n, Shape::BN);
    const int64_t grid = persistent_grid<kernel>(Shape::THREADS, tc::smem_request<Shape>(device), device, tiles);
    // A grid that holds every tile gives each CTA one tile in every order:
    // that is `tiled`'s schedule, and tiled's kernel runs it without the
    // loop's extra code (on the H200 persistent_kernel ran such grids 9%
    // slower at 16x4096x4096: 45.1 against 41.3 us a call, 2026-12-02).
    if (tiles <= grid) return launch_tiled(problem, stream);
    MatmulProblem p = problem;
    if (p.tile_order == int32_t(tc::TileOrder::kSplitTail)) {
      if constexpr (Shape::BM * Shape::BN >= 128 * 128) {
        if (splits_tail<Shape>(p, device, tiles, grid)) return launch_kernel<T, Shape, kKMajor, TIMELINE, true>(p, stream, device, grid);
      }
      p.tile_order = int32_t(tc::TileOrder::kDynamic);
    }
    return launch_kernel<T, Shape, kKMajor, TIMELINE, false>(p, stream, device, grid);
  });
}

}  // namespace

cudaError_t launch_persistent(const MatmulProblem& problem, cudaStream_t stream) {
  if (problem.m == 0 || problem.n == 0) return cudaSuccess;
  int device = 0;
  if (cudaError_t err = cudaGetDevice(&device)) return err;
  // The instrumented kernels, unless the plain ones record (tc::kPlainKernelRecords).
  constexpr auto plain = persistent_kernel<__nv_bfloat16, tc::SmallTile, true, false, false>;
  const bool instrumented = problem.timeline != nullptr && !tc::records_in_plain_kernel<plain>(device);
  return instrumented ? launch<true>(problem, stream, device) : launch<false>(problem, stream, device);
}

TileConfig tensor_core_tile_config(int64_t m, int64_t n, int device) {
  TileConfig cfg;
  auto fill = [&](auto shape) {
    using Shape = decltype(shape);
    cfg.block_m = Shape::BM;
    cfg.block_n = Shape::BN;
    cfg.block_k = Shape::BK;
    cfg.tiles = ceil_div(m, Shape::BM) * ceil_div(n, Shape::BN);
    constexpr auto kernel = persistent_kernel<__nv_bfloat16, Shape, true, false, false>;
    cfg.persistent_ctas = persistent_grid<kernel>(Shape::THREADS, tc::smem_request<Shape>(device), device, cfg.tiles);
    cfg.timeline_rows = cfg.tiles + cfg.persistent_ctas;
  };
  tc::with_tile_shape(m, n, device, fill);
  return cfg;
}

}  // namespace persistent_matmul
