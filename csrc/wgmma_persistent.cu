// Rung 6 — wgmma_persistent (Hopper, sm_90a): the `wgmma` CTA, scheduled
// persistently.
//
// Over `wgmma`, the grid is what fits on the GPU at once (the CTAs, or
// clusters, that can be resident together, read at run time) and each CTA
// walks output tiles through the tile scheduler (tile_scheduler.cuh: grouped
// or Hilbert order, or the dynamic order, where the producer thread claims
// each next tile from a counter and queues it for the consumers). Nothing
// stops at a tile's end: the producer warpgroup is already loading the next
// tile's first stages, so every tile after a CTA's first starts with its
// pipeline full, and the consumers round the tile's results into registers
// and store them while they compute the next tile's first k-blocks
// (wgmma_tile.cuh, PendingStore): 1.06-1.10x the speed of storing them at
// the tile's end at K = 1024, 1.01-1.02x at 4096^3 (H200, 2026-12-02).
//
// With clusters (cluster_size 2, and the default wherever the output has
// more than one row of tiles: wgmma_cluster_size_for) the CTAs run in
// pairs on vertically adjacent tiles, which need the same slice of B: each
// loads half and multicasts it to both, halving B's L2 reads. On the H200
// that is 1.00-1.04x the speed of single CTAs at the large benchmark shapes
// (1.07-1.11x at 3000^3; sustained, a 2-3% higher SM clock at the power
// limit), 2026-11-30. Pairs walk the grouped (or Hilbert) order of tile
// pairs; the dynamic order is the single CTAs'. The split-tail order (single
// CTAs dynamic, pairs static) splits the tiles of the last, ragged round in K
// (hopper::SplitTailUnits; tile_scheduler.cuh), and where there are fewer
// tiles than SMs, every tile, a CTA per part (launch_grid).
//
// Each launch is a programmatic dependent launch: its CTAs are scheduled
// while the kernel before them in the stream finishes (from the moment every
// producer of a previous wgmma_persistent has issued its last load), set up
// their barriers, and wait for that kernel before their first global memory
// access. Back to back, that hides the launch and the set-up: 1.017x the
// speed on the geometric mean of 8 shapes, 1.04-1.06x where a call takes
// ~100 us or less (H200, 2026-12-03).
#include "wgmma_launch.cuh"

namespace persistent_matmul {
namespace {

// SPLIT: the split-tail order (p.tile_order 3; hopper::SplitTailUnits), in
// single CTAs or pairs.
template <typename T, typename Shape, int CLUSTER, bool B_KMAJOR, bool TIMELINE, bool SPLIT>
__global__ void __cluster_dims__(CLUSTER, 1, 1) __launch_bounds__(Shape::THREADS, 1)
    wgmma_persistent_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                            const __grid_constant__ CUtensorMap map_out, const bool store_by_tma,
                            const MatmulProblem p) {
  const int tiles_m = int(ceil_div(p.m, Shape::BM)), tiles_n = int(ceil_div(p.n, Shape::BN));
  const auto order = static_cast<tc::TileOrder>(p.tile_order);
  if constexpr (SPLIT) {
    const int k_blocks = int(ceil_div(p.k, Shape::BK));
    hopper::run_cta<T, Shape, CLUSTER, B_KMAJOR, TIMELINE>(
        &map_a, &map_b, &map_out, store_by_tma, p, [&](int rank, const hopper::TileQueue& queue, auto is_producer) {
          return hopper::SplitTailUnits<CLUSTER, decltype(is_producer)::value>(tiles_m, tiles_n, k_blocks, rank,
                                                                               p.tile_counter, queue);
        });
  } else if constexpr (CLUSTER == 2) {
    // Pairs walk a static order: the dynamic one (single CTAs only) becomes grouped.
    const auto pair_order = order == tc::TileOrder::kDynamic ? tc::TileOrder::kGrouped : order;
    hopper::run_cta<T, Shape, CLUSTER, B_KMAJOR, TIMELINE>(
        &map_a, &map_b, &map_out, store_by_tma, p, [&](int rank, const hopper::TileQueue&, auto) {
          return hopper::TilePairsPerCluster(tiles_m, tiles_n, pair_order, rank);
        });
  } else {
    hopper::run_cta<T, Shape, CLUSTER, B_KMAJOR, TIMELINE>(
        &map_a, &map_b, &map_out, store_by_tma, p, [&](int, const hopper::TileQueue& queue, auto is_producer) {
          return hopper::PersistentTiles<decltype(is_producer)::value>(tiles_m, tiles_n, order, p.tile_counter,
                                                                        queue);
        });
  }
}

// The clusters that can be resident at the same time (SM count, shared
// memory and the GPCs' layout decide): asked of the runtime once per kernel
// and device, as the query costs microseconds of host time per call.
template <int CLUSTER, auto kKernel>
int64_t resident_clusters(int threads, int smem_bytes, int device) {
  static int cached[128] = {};
  const bool cacheable = device >= 0 && device < 128;
  int clusters = cacheable ? cached[device] : 0;
  if (clusters == 0) {
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(unsigned(CLUSTER * tc::sm_count(device)));
    config.blockDim = dim3(unsigned(threads));
    config.dynamicSmemBytes = size_t(smem_bytes);
    if (cudaOccupancyMaxActiveClusters(&clusters, kKernel, &config) != cudaSuccess || clusters < 1) {
      cudaGetLastError();  // clear it: the launch reports real errors
      clusters = tc::sm_count(device) / CLUSTER;
    } else if (cacheable) {
      cached[device] = clusters;
    }
  }
  return clusters;
}

template <typename T, typename Shape, int CLUSTER, bool B_KMAJOR, bool TIMELINE, bool SPLIT>
cudaError_t launch_kernel(const MatmulProblem& p, cudaStream_t stream, int device, const hopper::TensorMaps& maps,
                          int64_t ctas) {
  constexpr auto kernel = wgmma_persistent_kernel<T, Shape, CLUSTER, B_KMAJOR, TIMELINE, SPLIT>;
  if (cudaError_t err = tc::allow_dynamic_smem<kernel>(Shape::SMEM_BYTES, device)) return err;
  // The CTAs wait for the kernel before them in hopper::produce.
  return hopper::launch_programmatic(kernel, dim3(unsigned(ctas)), dim3(Shape::THREADS), Shape::SMEM_BYTES, stream,
                                     maps.a, maps.b, maps.out, maps.store_by_tma, p);
}

// Whether this build has the split-tail kernel of a tile shape and cluster
// size. ptxas before CUDA 13 serialises the wgmmas of the single-CTA
// split-tail kernel of the 128-wide tile (advisory C7511, not enough
// registers for the wgmma pipeline), which would make it several times
// slower; such builds leave it out, and that order runs as the dynamic one
// there (the same whole tiles, the last round not split). The 192 x 192 tile
// has none: it runs only where its tiles make whole rounds, and the
// workspace holds partial sums of 128-row tiles (a flag per consumer of two).
template <int CLUSTER, typename Shape>
constexpr bool kSplitTailBuilt = Shape::CONSUMERS == kSplitFlagsPerSlot &&
                                 (hopper::kBuiltWithCuda13 || !(CLUSTER == 1 && Shape::BN == 128));

// Whether this build has the CTA-pair kernels. Built with CUDA 12 (nvcc 12.4,
// ptxas 12.6) they fault wherever a pair runs more than one tile (4096^3,
// 256 x 28672 x 4096: "unspecified launch failure", or a hang; memcheck puts
// it at a consumer's arrival on its partner's empty-stage barrier, H100),
// while their SASS matches the CUDA 13 build's barrier for barrier and the
// single-CTA kernels of the same build pass. Such builds run single CTAs,
// which the op entry asks for (wgmma_cluster_pairs_built).
constexpr bool kClusterPairsBuilt = hopper::kBuiltWithCuda13;

// A launch's grid: `ctas` CTAs, and whether they run the split kernel.
struct LaunchGrid {
  int64_t ctas;
  bool split;
};

// The grid of a launch over an m x n x k product, with `clusters` resident
// at once. The static and dynamic orders run what fills the device once,
// capped at the tile pairs. The split-tail order (`split_order`, with the
// workspace) runs the split kernel where SplitTail cuts tiles: the last,
// ragged round of many tiles, on the grid that fills the device; or, with
// fewer tiles than that (a few hundred tokens against a projection's weights),
// every tile, a CTA per part, where the parts fill at least 7/8 of what fits.
// On the H100, with nn.Linear's weights, that split ran 1.02-1.35x the speed
// of whole tiles where it splits the Llama-3 projections at 64-256 tokens
// (1.31x at 128 x 4096 x 14336, 1.15x at 64 x 4096 x 4096) but 0.96x at
// 128 x 8192 x 8192, and 0.92x at 64 x 6144 x 4096, whose 48 tiles in 2 parts
// would leave 36 SMs idle all the same (2026-12-06; benchmarks/NOTES.md,
// "Why fewer tiles than SMs are split in K"). Elsewhere that
// order runs as the dynamic one (pairs: grouped), which then assigns the same
// whole tiles: the split kernel ran 2-8% slower on the H200 at shapes it does
// not split (2026-12-02).
template <int CLUSTER, typename Shape>
LaunchGrid launch_grid(int64_t m, int64_t n, int64_t k, bool split_order, int64_t clusters, int sms) {
  const int64_t stream_tiles = ceil_div(ceil_div(m, Shape::BM), CLUSTER) * ceil_div(n, Shape::BN);
  if (kSplitTailBuilt<CLUSTER, Shape> && split_order) {
    const tc::SplitTail split(stream_tiles, int(ceil_div(k, Shape::BK)), clusters);
    const bool fills = stream_tiles > clusters || 8 * split.indices >= 7 * clusters;
    const int64_t ctas = CLUSTER * min_i64(split.indices, clusters);
    if (split.parts > 1 && fills && split_workspace_fits(ctas, Shape::BM, Shape::BN, sms)) return {ctas, true};
  }
  return {CLUSTER * min_i64(stream_tiles, clusters), false};
}

template <int CLUSTER, bool TIMELINE>
cudaError_t launch(const MatmulProblem& problem, cudaStream_t stream, int device) {
  return hopper::dispatch(problem, device, CLUSTER,
                          [&](auto type, auto shape, auto kmajor, const hopper::TensorMaps& maps) {
    using T = typename decltype(type)::type;
    using Shape = decltype(shape);
    constexpr bool kKMajor = decltype(kmajor)::value;
    constexpr auto kernel = wgmma_persistent_kernel<T, Shape, CLUSTER, kKMajor, TIMELINE, false>;
    if (cudaError_t err = tc::allow_dynamic_smem<kernel>(Shape::SMEM_BYTES, device)) return err;
    MatmulProblem p = problem;
    const bool split_order = p.tile_order == int32_t(tc::TileOrder::kSplitTail) && p.partials != nullptr &&
                             p.tile_counter != nullptr;
    const LaunchGrid grid =
        launch_grid<CLUSTER, Shape>(p.m, p.n, p.k, split_order,
                                    resident_clusters<CLUSTER, kernel>(Shape::THREADS, Shape::SMEM_BYTES, device),
                                    tc::sm_count(device));
    if constexpr (kSplitTailBuilt<CLUSTER, Shape>) {
      if (grid.split) return launch_kernel<T, Shape, CLUSTER, kKMajor, TIMELINE, true>(p, stream, device, maps, grid.ctas);
    }
    if (p.tile_order == int32_t(tc::TileOrder::kSplitTail)) {
      p.tile_order = int32_t(CLUSTER == 1 ? tc::TileOrder::kDynamic : tc::TileOrder::kGrouped);
    }
    return launch_kernel<T, Shape, CLUSTER, kKMajor, TIMELINE, false>(p, stream, device, maps, grid.ctas);
  });
}

// The grid of a launch (the split-tail order with the workspace where
// `split_order`) of an m x n x k product in `cluster`-CTA clusters, with the
// tile shape the launch picks; `tiles`: its output tiles. Every kernel of a
// shape and cluster size has the same threads and shared memory, so one
// stands for all.
struct GridOfShape {
  LaunchGrid grid;
  int64_t tiles;
};
template <int CLUSTER, typename Shape>
LaunchGrid grid_of_clusters(int64_t m, int64_t n, int64_t k, bool split_order, int device) {
  constexpr auto kernel = wgmma_persistent_kernel<__nv_bfloat16, Shape, CLUSTER, true, false, false>;
  tc::allow_dynamic_smem<kernel>(Shape::SMEM_BYTES, device);
  return launch_grid<CLUSTER, Shape>(m, n, k, split_order,
                                     resident_clusters<CLUSTER, kernel>(Shape::THREADS, Shape::SMEM_BYTES, device),
                                     tc::sm_count(device));
}
template <typename Shape>
GridOfShape grid_of_shape(int64_t m, int64_t n, int64_t k, bool split_order, int cluster, int device) {
  const int64_t tiles = ceil_div(m, Shape::BM) * ceil_div(n, Shape::BN);
  if constexpr (kClusterPairsBuilt) {
    if (cluster == 2) return {grid_of_clusters<2, Shape>(m, n, k, split_order, device), tiles};
  }
  return {grid_of_clusters<1, Shape>(m, n, k, split_order, device), tiles};
}
GridOfShape grid_of(int64_t m, int64_t n, int64_t k, bool split_order, int cluster, int device) {
  return hopper::with_tile_shape(m, n, k, device, [&](auto shape) {
    return grid_of_shape<decltype(shape)>(m, n, k, split_order, cluster, device);
  });
}

}  // namespace

cudaError_t launch_wgmma_persistent(const MatmulProblem& problem, cudaStream_t stream) {
  if (problem.m == 0 || problem.n == 0) return cudaSuccess;
  int device = 0;
  if (cudaError_t err = cudaGetDevice(&device)) return err;
  const int cluster = problem.cluster_size == 0 ? wgmma_default_cluster_size(problem.m) : problem.cluster_size;
  if (cluster == 2) {
    if constexpr (kClusterPairsBuilt) {
      return problem.timeline ? launch<2, true>(problem, stream, device) : launch<2, false>(problem, stream, device);
    } else {
      return cudaErrorNotSupported;  // the op entry asks this build for single CTAs only
    }
  }
  return problem.timeline ? launch<1, true>(problem, stream, device) : launch<1, false>(problem, stream, device);
}

bool wgmma_cluster_pairs_built() { return kClusterPairsBuilt; }

int32_t wgmma_default_cluster_size(int64_t m) { return kClusterPairsBuilt ? wgmma_cluster_size_for(m) : 1; }

TileConfig wgmma_tile_config(int64_t m, int64_t n, int64_t k, int device, int32_t cluster_size) {
  TileConfig cfg;
  const int32_t cluster = cluster_size == 0 ? wgmma_default_cluster_size(m) : cluster_size;
  // K not known: deep enough that the split-tail order's parts are not capped by it.
  const int64_t depth = k < 1 ? INT32_MAX : k;
  auto fill = [&](auto shape) {
    using Shape = decltype(shape);
    cfg.block_m = Shape::BM;
    cfg.block_n = Shape::BN;
    cfg.block_k = Shape::BK;
    cfg.tiles = ceil_div(m, Shape::BM) * ceil_div(n, Shape::BN);
    cfg.persistent_ctas = grid_of_shape<Shape>(m, n, depth, true, cluster, device).grid.ctas;
    // A row per SM past the tiles': no launch runs more than one CTA an SM
    // (their shared memory), so no more parts of tiles cut in K.
    cfg.timeline_rows = cfg.tiles + tc::sm_count(device);
    cfg.cluster_size = cluster;
  };
  hopper::with_tile_shape(m, n, depth, device, fill);
  return cfg;
}

int32_t wgmma_order_worth_running(int32_t tile_order, const MatmulProblem& p, int device) {
  const auto split_tail = int32_t(tc::TileOrder::kSplitTail);
  if (tile_order != split_tail && tile_order != int32_t(tc::TileOrder::kDynamic)) return tile_order;
  const int cluster = p.cluster_size == 0 ? wgmma_default_cluster_size(p.m) : p.cluster_size;
  const GridOfShape launch = grid_of(p.m, p.n, p.k, tile_order == split_tail, cluster, device);
  if (launch.grid.split) return tile_order;
  return launch.tiles <= launch.grid.ctas ? int32_t(tc::TileOrder::kGrouped) : tile_order;
}

}  // namespace persistent_matmul
