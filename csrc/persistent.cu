// Rung 4 — persistent: the `tiled` tile code, scheduled persistently.
//
// Over `tiled`, the grid is only as large as what fits on the GPU at once
// (SM count x CTAs per SM, both read at run time), and each CTA walks output
// tiles t = blockIdx.x, blockIdx.x + gridDim.x, ... in the same grouped order
// (or a Hilbert order; tile_scheduler.cuh). There are no waves and no launch
// of a new CTA per tile: a CTA that finishes a tile starts the cp.async loads
// of its next tile first, then writes the finished tile's results, so the
// next tile's loads overlap this tile's epilogue.
#include "tensor_core_launch.cuh"

namespace persistent_matmul {
namespace {

template <typename T, typename Shape, bool B_KMAJOR, bool TIMELINE>
__global__ void __launch_bounds__(Shape::THREADS, Shape::MIN_CTAS) persistent_kernel(MatmulProblem p, tc::TileOperands op) {
  extern __shared__ __align__(128) char smem[];
  using Tile = tc::Tile<Shape, B_KMAJOR>;
  const int tiles_m = int(ceil_div(p.m, Shape::BM)), tiles_n = int(ceil_div(p.n, Shape::BN));
  tc::TileScheduler scheduler(tiles_m, tiles_n, static_cast<tc::TileOrder>(p.tile_order));
  tc::TileCoord c;
  if (!scheduler.next(c)) return;
  Tile::prologue(op, smem, c.m, c.n);
  while (true) {
    const int64_t start = TIMELINE ? tc::global_timer_ns() : 0;
    float acc[Shape::MMA_M][Shape::MMA_N][4];
    Tile::template mainloop<T>(op, smem, c.m, c.n, acc);
    // The shared-memory buffers are free now: start the next tile's loads
    // before spending time on this tile's stores.
    tc::TileCoord next_c;
    const bool more = scheduler.next(next_c);
    if (more) Tile::prologue(op, smem, next_c.m, next_c.n);
    Tile::template epilogue<T>(p, c.m, c.n, acc);
    if constexpr (TIMELINE) {
      __syncthreads();
      if (threadIdx.x == 0) {
        static_cast<tc::TileRecord*>(p.timeline)[int64_t(c.m) * tiles_n + c.n] = {
            c.m, c.n, tc::sm_id(), blockIdx.x, start, tc::global_timer_ns()};
      }
    }
    if (!more) break;
    c = next_c;
  }
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
  return tc::dispatch(p, device, [&](auto type, auto shape, auto kmajor) {
    using T = typename decltype(type)::type;
    using Shape = decltype(shape);
    constexpr auto kernel = persistent_kernel<T, Shape, decltype(kmajor)::value, TIMELINE>;
    const int smem = tc::smem_request<Shape>(device);
    if (cudaError_t err = tc::allow_dynamic_smem<kernel>(smem, device)) return err;
    const int64_t tiles = ceil_div(p.m, Shape::BM) * ceil_div(p.n, Shape::BN);
    const int64_t grid = persistent_grid(kernel, Shape::THREADS, smem, device, tiles);
    kernel<<<static_cast<unsigned>(grid), Shape::THREADS, smem, stream>>>(
        p, tc::operands_of(p, decltype(kmajor)::value));
    return cudaGetLastError();
  });
}

}  // namespace

cudaError_t launch_persistent(const MatmulProblem& problem, cudaStream_t stream) {
  if (problem.m == 0 || problem.n == 0) return cudaSuccess;
  int device = 0;
  if (cudaError_t err = cudaGetDevice(&device)) return err;
  return problem.timeline ? launch<true>(problem, stream, device) : launch<false>(problem, stream, device);
}

TileConfig tensor_core_tile_config(int64_t m, int64_t n, int device) {
  TileConfig cfg;
  auto fill = [&](auto shape) {
    using Shape = decltype(shape);
    cfg.block_m = Shape::BM;
    cfg.block_n = Shape::BN;
    cfg.block_k = Shape::BK;
    cfg.tiles = ceil_div(m, Shape::BM) * ceil_div(n, Shape::BN);
    constexpr auto kernel = persistent_kernel<__nv_bfloat16, Shape, true, false>;
    const int smem = tc::smem_request<Shape>(device);
    tc::allow_dynamic_smem<kernel>(smem, device);
    cfg.persistent_ctas = persistent_grid(kernel, Shape::THREADS, smem, device, cfg.tiles);
  };
  tc::with_tile_shape(m, n, device, fill);
  return cfg;
}

}  // namespace persistent_matmul
