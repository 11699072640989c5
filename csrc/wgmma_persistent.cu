// Rung 6 — wgmma_persistent (Hopper, sm_90a): the `wgmma` CTA, scheduled
// persistently.
//
// Over `wgmma`, the grid is what fits on the GPU at once (SM count x CTAs
// per SM, read at run time) and each CTA walks output tiles through the
// tile scheduler (tile_scheduler.cuh: grouped or Hilbert order). The
// producer warpgroup does not stop at a tile's end: while the consumers
// write one tile's results, it is already loading the next tile's first
// stages, so every tile after a CTA's first starts with its pipeline full.
#include "wgmma_launch.cuh"

namespace persistent_matmul {
namespace {

template <typename T, typename Shape, bool B_KMAJOR, bool TIMELINE>
__global__ void __launch_bounds__(Shape::THREADS, 1)
    wgmma_persistent_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                            const MatmulProblem p) {
  const int tiles_m = int(ceil_div(p.m, Shape::BM)), tiles_n = int(ceil_div(p.n, Shape::BN));
  const auto order = static_cast<tc::TileOrder>(p.tile_order);
  hopper::run_cta<T, Shape, B_KMAJOR, TIMELINE>(&map_a, &map_b, p,
                                                [&] { return tc::TileScheduler(tiles_m, tiles_n, order); });
}

// CTAs that fill the device once: SMs x resident CTAs per SM, capped at the tile count.
template <typename Kernel>
int64_t persistent_grid(Kernel kernel, int threads, int smem_bytes, int device, int64_t tiles) {
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem_bytes) != cudaSuccess ||
      per_sm < 1) {
    per_sm = 1;
  }
  return min_i64(tiles, int64_t(per_sm) * tc::sm_count(device));
}

template <bool TIMELINE>
cudaError_t launch(const MatmulProblem& p, cudaStream_t stream, int device) {
  return hopper::dispatch(p, device, [&](auto type, auto shape, auto kmajor, const CUtensorMap& map_a,
                                         const CUtensorMap& map_b) {
    using T = typename decltype(type)::type;
    using Shape = decltype(shape);
    constexpr auto kernel = wgmma_persistent_kernel<T, Shape, decltype(kmajor)::value, TIMELINE>;
    if (cudaError_t err = tc::allow_dynamic_smem<kernel>(Shape::SMEM_BYTES, device)) return err;
    const int64_t tiles = ceil_div(p.m, Shape::BM) * ceil_div(p.n, Shape::BN);
    const int64_t ctas = persistent_grid(kernel, Shape::THREADS, Shape::SMEM_BYTES, device, tiles);
    kernel<<<static_cast<unsigned>(ctas), Shape::THREADS, Shape::SMEM_BYTES, stream>>>(map_a, map_b, p);
    return cudaGetLastError();
  });
}

}  // namespace

cudaError_t launch_wgmma_persistent(const MatmulProblem& problem, cudaStream_t stream) {
  if (problem.m == 0 || problem.n == 0) return cudaSuccess;
  int device = 0;
  if (cudaError_t err = cudaGetDevice(&device)) return err;
  return problem.timeline ? launch<true>(problem, stream, device) : launch<false>(problem, stream, device);
}

TileConfig wgmma_tile_config(int64_t m, int64_t n, int device) {
  TileConfig cfg;
  auto fill = [&](auto shape) {
    using Shape = decltype(shape);
    cfg.block_m = Shape::BM;
    cfg.block_n = Shape::BN;
    cfg.block_k = Shape::BK;
    cfg.tiles = ceil_div(m, Shape::BM) * ceil_div(n, Shape::BN);
    // Every variant of a shape has the same threads and shared memory, so one stands for all.
    constexpr auto kernel = wgmma_persistent_kernel<__nv_bfloat16, Shape, true, false>;
    tc::allow_dynamic_smem<kernel>(Shape::SMEM_BYTES, device);
    cfg.persistent_ctas = persistent_grid(kernel, Shape::THREADS, Shape::SMEM_BYTES, device, cfg.tiles);
  };
  if (hopper::use_wide_tile(m, n, tc::sm_count(device))) {
    fill(hopper::WideTile{});
  } else {
    fill(hopper::NarrowTile{});
  }
  return cfg;
}

}  // namespace persistent_matmul
