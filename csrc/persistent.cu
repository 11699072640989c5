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
// the copy runs during the next tile's mainloop.
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

template <typename T, typename Shape, bool B_KMAJOR, bool TIMELINE>
__global__ void __launch_bounds__(Shape::THREADS, Shape::MIN_CTAS) persistent_kernel(MatmulProblem p, tc::TileOperands op) {
  extern __shared__ __align__(128) char smem[];
  using Tile = tc::Tile<Shape, B_KMAJOR>;
  int64_t position = blockIdx.x;
  tc::TileCoord c;
  if (!next_tile<Shape>(p, smem, position, c)) return;
  Tile::prologue(op, smem, c.m, c.n);
  const bool staged = Shape::MIN_CTAS == 1 && Tile::can_stage_output(p);
  while (true) {
    const int64_t start = TIMELINE ? tc::global_timer_ns() : 0;
    float acc[Shape::MMA_M][Shape::MMA_N][4];
    Tile::template mainloop<T>(op, smem, c.m, c.n, acc);
    // The shared-memory buffers are free now: start the next tile's loads
    // before spending time on this tile's stores.
    tc::TileCoord next_c;
    const bool more = next_tile<Shape>(p, smem, position, next_c);
    if (more) Tile::prologue(op, smem, next_c.m, next_c.n);
    Tile::template store_tile<T>(p, smem, c.m, c.n, staged, acc);
    if constexpr (TIMELINE) {
      __syncthreads();
      if (threadIdx.x == 0) {
        const int64_t tiles_n = ceil_div(p.n, Shape::BN);
        static_cast<tc::TileRecord*>(p.timeline)[c.m * tiles_n + c.n] = {
            c.m, c.n, tc::sm_id(), blockIdx.x, start, tc::global_timer_ns()};
      }
    }
    if (!more) break;
    c = next_c;
  }
  if (staged) Tile::finish_staged_output();
}

// CTAs that fill the device once: SMs x resident CTAs per SM, capped at the
// tile count. The occupancy is asked of the runtime once per kernel and device
// (a kernel's threads and shared memory never change on a device): the query
// costs microseconds of host time, which small products would pay per call.
template <auto kKernel>
int64_t persistent_grid(int threads, int smem_bytes, int device, int64_t tiles) {
  static int cached[128] = {};
  const bool cacheable = device >= 0 && device < 128;
  int per_sm = cacheable ? cached[device] : 0;
  if (per_sm == 0) {
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kKernel, threads, smem_bytes) != cudaSuccess ||
        per_sm < 1) {
      cudaGetLastError();  // clear it: the launch reports real errors
      per_sm = 1;
    } else if (cacheable) {
      cached[device] = per_sm;
    }
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
    const int64_t grid = persistent_grid<kernel>(Shape::THREADS, smem, device, tiles);
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
    cfg.persistent_ctas = persistent_grid<kernel>(Shape::THREADS, smem, device, cfg.tiles);
  };
  tc::with_tile_shape(m, n, device, fill);
  return cfg;
}

}  // namespace persistent_matmul
