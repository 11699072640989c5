// Host side shared by the Hopper rungs `wgmma` and `wgmma_persistent`: the
// tile shape per problem, the tensor maps of A, B and the output, and the dispatch over
// dtype, tile shape and B layout. Operand rules are the tensor-core rungs'
// (tc::operands_ok): A K-contiguous, B K- or N-contiguous, leading dims
// multiples of 8 elements, 16-byte aligned data; that is exactly what TMA
// needs (16-byte aligned base and row strides).
#pragma once

#include <type_traits>

#include "tensor_core_launch.cuh"  // operand layout checks, sm_count, TypeTag, allow_dynamic_smem
#include "wgmma_tile.cuh"

namespace persistent_matmul {
namespace hopper {

// The tile width (BN) for an m x n x k product on `sms` SMs: 256 where
// 128x256 tiles give every SM at least one; else 64 for a few hundred tokens
// where 128x64 tiles fit on the SMs at once (no second round), else 128.
// Against 128x128 tiles, which there run fewer tiles than SMs split in K, the
// 64-wide ones ran 1.08-1.24x the speed (H100, CUDA graphs, nn.Linear's
// weights: 1.14x at 128 x 6144 x 4096, 1.19x at 128 x 4096 x 4096, 1.08x at
// 128 x 4096 x 14336, 1.14x at 128 x 8192 x 8192, 1.24x at 256 x 4096 x 4096).
// Where they lost: up to 64 tokens, where a tile's second 64 rows are empty
// either way (0.89-0.98x); past one round of tiles (0.70-0.90x); and with two
// rows of tiles at long K, where each CTA pair re-reads the tokens for half the
// weight columns of a 128-wide tile (0.88x at 256 x 4096 x 14336).
// (benchmarks/NOTES.md, "Why 64-wide tiles for a few hundred tokens")
inline int tile_width(int64_t m, int64_t n, int64_t k, int sms) {
  if (ceil_div(m, WideTile::BM) * ceil_div(n, WideTile::BN) >= sms) return WideTile::BN;
  const bool few_tokens = m > 64 && (m <= SlimTile::BM || (m <= 2 * SlimTile::BM && k <= 4096));
  if (few_tokens && ceil_div(m, SlimTile::BM) * ceil_div(n, SlimTile::BN) <= sms) return SlimTile::BN;
  return NarrowTile::BN;
}

// Calls f(Shape{}) for the shape tile_width picks.
template <typename F>
auto with_tile_shape(int64_t m, int64_t n, int64_t k, int device, F&& f) {
  const int width = tile_width(m, n, k, tc::sm_count(device));
  if (width == WideTile::BN) return f(WideTile{});
  if (width == SlimTile::BN) return f(SlimTile{});
  return f(NarrowTile{});
}

static_assert(WideTile::BM == kWgmmaTileRows && NarrowTile::BM == kWgmmaTileRows && SlimTile::BM == kWgmmaTileRows,
              "wgmma_cluster_size_for counts rows of tiles of kWgmmaTileRows");

// Tensor maps of A (M x K, K contiguous) and B (K- or N-contiguous) for a
// tile shape and cluster size (a K-major B slice is loaded in `cluster`
// boxes).
template <typename Shape>
bool make_tensor_maps(const MatmulProblem& p, bool b_kmajor, int cluster, CUtensorMap* map_a, CUtensorMap* map_b) {
  const bool bf16 = p.dtype == ElementType::kBFloat16;
  const TensorMapKey a = matrix_key(p.a, p.m, p.k, p.a_stride_m, Shape::BM, Shape::BK, bf16);
  const TensorMapKey b =
      b_kmajor ? matrix_key(p.b, p.n, p.k, p.b_stride_n, Shape::BN / cluster, Shape::BK, bf16)  // N rows of K: (BN / cluster) x 64 boxes
               : matrix_key(p.b, p.k, p.n, p.b_stride_k, Shape::BK, 64, bf16);                  // K rows of N: 64 x 64 boxes
  return tensor_map(a, map_a) && tensor_map(b, map_b);
}

// Whether TMA can store the output: contiguous rows whose starts are 16-byte
// aligned (TMA's rule for a base and a row stride), and rows a whole number
// of 16-byte chunks long: TMA stores write whole 16-byte chunks, so a row of
// N % 8 != 0 elements would get its neighbour's first elements overwritten
// (seen on the H200: an out view inside a wider buffer lost up to 7 of them).
inline bool tma_can_store(const MatmulProblem& p) {
  return tc::aligned16(p.out) && p.out_stride_n == 1 && p.n % 8 == 0 && (p.m == 1 || p.out_stride_m % 8 == 0);
}

// The output as TMA stores it, in 64 x 64 boxes (the staging buffers of wgmma_tile.cuh).
inline bool make_output_map(const MatmulProblem& p, CUtensorMap* map_out) {
  return tensor_map(matrix_key(p.out, p.m, p.n, p.out_stride_m, 64, 64, p.dtype == ElementType::kBFloat16), map_out);
}

// The tensor maps of one launch (passed to the kernel as __grid_constant__
// parameters, where TMA reads them).
struct TensorMaps {
  CUtensorMap a, b, out;
  bool store_by_tma = false;
};

// Calls launch(TypeTag<T>, Shape, std::bool_constant<B_KMAJOR>, maps) with
// tensor maps for clusters of `cluster` CTAs.
template <typename Launch>
cudaError_t dispatch(const MatmulProblem& p, int device, int cluster, Launch&& launch) {
  if (!tc::operands_ok(p)) return cudaErrorInvalidValue;
  const bool kmajor = tc::b_layout(p) == tc::BLayout::kKMajor;
  auto by_layout = [&](auto type, auto shape) -> cudaError_t {
    TensorMaps maps;
    if (!make_tensor_maps<decltype(shape)>(p, kmajor, cluster, &maps.a, &maps.b)) return cudaErrorInvalidValue;
    // An output TMA cannot describe is stored from registers (the map stays unused).
    maps.store_by_tma = tma_can_store(p) && make_output_map(p, &maps.out);
    return kmajor ? launch(type, shape, std::true_type{}, maps) : launch(type, shape, std::false_type{}, maps);
  };
  auto by_shape = [&](auto type) {
    return with_tile_shape(p.m, p.n, p.k, device, [&](auto shape) { return by_layout(type, shape); });
  };
  return p.dtype == ElementType::kBFloat16 ? by_shape(tc::TypeTag<__nv_bfloat16>{})
                                           : by_shape(tc::TypeTag<__half>{});
}

}  // namespace hopper
}  // namespace persistent_matmul
