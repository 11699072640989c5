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

// Whether nvcc 13 or newer builds this: with ptxas before CUDA 13 some Hopper
// kernels have their wgmmas serialised, and the CTA pairs' kernels fault, so
// such builds leave them out (kMediumTileBuilt here; kSplitTailBuilt and
// kClusterPairsBuilt in wgmma_persistent.cu).
constexpr bool kBuiltWithCuda13 = __CUDACC_VER_MAJOR__ >= 13;

// Whether this build has the 128 x 192 tile's kernels: ptxas before CUDA 13
// serialises the wgmmas of its single-CTA kernels (C7515), so CUDA 12 builds
// run 256- or 128-wide tiles where CUDA 13 builds run 192-wide ones. CUDA 12
// builds leave the 192 x 192 tile out as well: its 192-wide wgmmas are the
// same, and CUDA 12 builds run single CTAs only.
constexpr bool kMediumTileBuilt = kBuiltWithCuda13;
constexpr bool kSquareTileBuilt = kBuiltWithCuda13;

// Whether `tiles` make whole rounds on `sms` SMs: at least 7/8 of the SMs
// busy in every round, the last included.
inline bool makes_whole_rounds(int64_t tiles, int sms) {
  const int64_t last = tiles % sms;
  return 8 * tiles >= 7 * int64_t(sms) && (last == 0 || 8 * last >= 7 * int64_t(sms));
}

// The tile shapes of the Hopper rungs (wgmma_tile.cuh).
enum class TileShape { kWide, kMedium, kSquare, kNarrow, kSlim };

// The tile shape for an m x n x k product on `sms` SMs:
// - 128 x 192 where those tiles make one or two whole rounds and 128 x 256
//   ones do not: against 128x128 tiles split in K, and 128x256 tiles in 1.5
//   rounds, 1.19x the speed at 512 x 6144 x 4096 and 1.13x at
//   1024 x 6144 x 4096 (Llama-3-8B's qkv; H100, CUDA graphs, nn.Linear's
//   weights). Past two rounds they gained nothing (3000^3, 2048 x 6144 x 4096),
//   and at 256 tokens against 128-wide tiles split in K they lost (0.88x at
//   256 x 6144 x 4096).
// - 192 x 192 where neither makes whole rounds and those tiles make one or two,
//   in an even number of tile rows, four or more (CTA pairs run pairs of rows:
//   with an odd number, the last pair's second tile lies below the output and
//   its pairs may not make whole rounds; 2048 x 4232 x 4096, 11 rows, ran 0.86x
//   the speed of 128 x 256 tiles). 3000^3 runs 256 of them in two rounds
//   (cuBLAS's choice there) against 288 128 x 256 tiles whose third round is
//   split in K: 1.11x the speed (1.14x at 3008^3, 1.33x at 768 x 6336 x 4096;
//   H100, 2026-12-06).
// - 128 x 256 where those tiles fill at least 7/8 of the SMs: one round of
//   128 such tiles on 132 SMs ran 1.07x the speed of two of 128x128 tiles at
//   1024 x 4096 x 4096, 1.07x at 1024 x 4096 x 14336 and 1.05x at
//   512 x 8192 x 8192 (the same run).
// - 128 x 64 for a few hundred tokens where those tiles fit on the SMs at once
//   (no second round). Against 128x128 tiles, which there run fewer tiles than
//   SMs split in K, the 64-wide ones ran 1.08-1.24x the speed (H100, CUDA
//   graphs, nn.Linear's weights: 1.14x at 128 x 6144 x 4096, 1.19x at
//   128 x 4096 x 4096, 1.08x at 128 x 4096 x 14336, 1.14x at 128 x 8192 x 8192,
//   1.24x at 256 x 4096 x 4096). Where they lost: up to 64 tokens, where a
//   tile's second 64 rows are empty either way (0.89-0.98x); past one round of
//   tiles (0.70-0.90x); and with two rows of tiles at long K, where each CTA
//   pair re-reads the tokens for half the weight columns of a 128-wide tile
//   (0.88x at 256 x 4096 x 14336).
// - 128 x 128 otherwise.
// (benchmarks/NOTES.md, "Why 64-wide tiles for a few hundred tokens", "Why
// 192-wide tiles, and 256-wide ones from 7/8 of the SMs" and "Why 192 x 192
// tiles where only they make whole rounds")
inline TileShape tile_shape(int64_t m, int64_t n, int64_t k, int sms) {
  const int64_t rows = ceil_div(m, kWgmmaTileRows);
  const int64_t wide = rows * ceil_div(n, WideTile::BN), medium = rows * ceil_div(n, MediumTile::BN);
  const bool wide_rounds = makes_whole_rounds(wide, sms);
  auto fits_one_or_two_rounds = [&](int64_t tiles) {
    return tiles <= 2 * int64_t(sms) && makes_whole_rounds(tiles, sms);
  };
  if (kMediumTileBuilt && !wide_rounds && fits_one_or_two_rounds(medium)) return TileShape::kMedium;
  const int64_t square_rows = ceil_div(m, SquareTile::BM), square = square_rows * ceil_div(n, SquareTile::BN);
  if (kSquareTileBuilt && !wide_rounds && square_rows >= 4 && square_rows % 2 == 0 && fits_one_or_two_rounds(square)) {
    return TileShape::kSquare;
  }
  if (8 * wide >= 7 * int64_t(sms)) return TileShape::kWide;
  const bool few_tokens = m > 64 && (m <= SlimTile::BM || (m <= 2 * SlimTile::BM && k <= 4096));
  if (few_tokens && rows * ceil_div(n, SlimTile::BN) <= sms) return TileShape::kSlim;
  return TileShape::kNarrow;
}

// Calls f(Shape{}) for the shape tile_shape picks.
template <typename F>
auto with_tile_shape(int64_t m, int64_t n, int64_t k, int device, F&& f) {
  const TileShape shape = tile_shape(m, n, k, tc::sm_count(device));
  if (shape == TileShape::kWide) return f(WideTile{});
  if constexpr (kMediumTileBuilt) {
    if (shape == TileShape::kMedium) return f(MediumTile{});
  }
  if constexpr (kSquareTileBuilt) {
    if (shape == TileShape::kSquare) return f(SquareTile{});
  }
  if (shape == TileShape::kSlim) return f(SlimTile{});
  return f(NarrowTile{});
}

// wgmma_cluster_size_for pairs CTAs from two rows of 128-row tiles on (the
// 192 x 192 tile runs from four rows of its own, in pairs there).
static_assert(WideTile::BM == kWgmmaTileRows && MediumTile::BM == kWgmmaTileRows && NarrowTile::BM == kWgmmaTileRows &&
                  SlimTile::BM == kWgmmaTileRows,
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
