// Rung 5 — wgmma (Hopper, sm_90a): TMA + wgmma, warp-specialized, one CTA
// per output tile.
//
// Over `tiled`, the copy engine (TMA) moves whole 128-byte-swizzled tiles of
// A and B into shared memory, issued by one producer thread and tracked by
// mbarriers instead of every thread's cp.async; the tensor cores read both
// operands straight from shared memory with warpgroup-wide wgmma (64 x BN x
// 16 per instruction, asynchronous) instead of ldmatrix + mma.sync per warp;
// and the registers go to the two consumer warpgroups (setmaxnreg), which
// hold 128 x 256 tiles. The CTA body is in wgmma_tile.cuh, shared with
// `wgmma_persistent`, so the two rungs differ only in scheduling.
#include "wgmma_launch.cuh"

namespace persistent_matmul {
namespace {

template <typename T, typename Shape, bool B_KMAJOR, bool TIMELINE>
__global__ void __launch_bounds__(Shape::THREADS, 1)
    wgmma_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                 const __grid_constant__ CUtensorMap map_out, const bool store_by_tma, const MatmulProblem p) {
  const int tiles_m = int(ceil_div(p.m, Shape::BM)), tiles_n = int(ceil_div(p.n, Shape::BN));
  hopper::run_cta<T, Shape, 1, B_KMAJOR, TIMELINE>(&map_a, &map_b, &map_out, store_by_tma, p,
                                                   [&](int, const hopper::TileQueue&, auto) { return hopper::OneTilePerCta(tiles_m, tiles_n); });
}

template <bool TIMELINE>
cudaError_t launch(const MatmulProblem& p, cudaStream_t stream, int device) {
  return hopper::dispatch(p, device, 1, [&](auto type, auto shape, auto kmajor, const hopper::TensorMaps& maps) {
    using T = typename decltype(type)::type;
    using Shape = decltype(shape);
    constexpr auto kernel = wgmma_kernel<T, Shape, decltype(kmajor)::value, TIMELINE>;
    if (cudaError_t err = tc::allow_dynamic_smem<kernel>(Shape::SMEM_BYTES, device)) return err;
    const int64_t tiles = ceil_div(p.m, Shape::BM) * ceil_div(p.n, Shape::BN);
    kernel<<<static_cast<unsigned>(tiles), Shape::THREADS, Shape::SMEM_BYTES, stream>>>(maps.a, maps.b, maps.out,
                                                                                        maps.store_by_tma, p);
    return cudaGetLastError();
  });
}

}  // namespace

cudaError_t launch_wgmma(const MatmulProblem& problem, cudaStream_t stream) {
  if (problem.m == 0 || problem.n == 0) return cudaSuccess;
  int device = 0;
  if (cudaError_t err = cudaGetDevice(&device)) return err;
  return problem.timeline ? launch<true>(problem, stream, device) : launch<false>(problem, stream, device);
}

}  // namespace persistent_matmul
