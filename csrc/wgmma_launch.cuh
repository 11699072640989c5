// Host side shared by the Hopper rungs `wgmma` and `wgmma_persistent`: the
// tile shape per problem, the tensor maps of A and B, and the dispatch over
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

// 128x256 tiles when they give every SM at least one, else 128x128.
inline bool use_wide_tile(int64_t m, int64_t n, int sms) {
  return ceil_div(m, WideTile::BM) * ceil_div(n, WideTile::BN) >= sms;
}

inline int64_t round_up(int64_t x, int64_t to) { return ceil_div(x, to) * to; }

// Tensor maps of A (M x K, K contiguous) and B (K- or N-contiguous) for a
// tile shape and cluster size (a K-major B slice is loaded in `cluster`
// boxes). A size-1 dim's stride is never used to address, so it is replaced
// by one TMA accepts.
template <typename Shape>
bool make_tensor_maps(const MatmulProblem& p, bool b_kmajor, int cluster, CUtensorMap* map_a, CUtensorMap* map_b) {
  const int32_t bf16 = p.dtype == ElementType::kBFloat16;
  TensorMapKey a{};
  a.base = p.a;
  a.rows = uint64_t(p.m);
  a.cols = uint64_t(p.k);
  a.row_stride_bytes = uint64_t(p.m == 1 ? round_up(p.k, 8) : p.a_stride_m) * 2;
  a.box_rows = Shape::BM;
  a.box_cols = Shape::BK;
  a.bf16 = bf16;
  TensorMapKey b{};
  b.base = p.b;
  b.bf16 = bf16;
  if (b_kmajor) {  // N rows of K: loaded as (BN / cluster) x 64 boxes
    b.rows = uint64_t(p.n);
    b.cols = uint64_t(p.k);
    b.row_stride_bytes = uint64_t(p.n == 1 ? round_up(p.k, 8) : p.b_stride_n) * 2;
    b.box_rows = Shape::BN / cluster;
    b.box_cols = Shape::BK;
  } else {  // K rows of N: loaded as 64 x 64 boxes
    b.rows = uint64_t(p.k);
    b.cols = uint64_t(p.n);
    b.row_stride_bytes = uint64_t(p.k == 1 ? round_up(p.n, 8) : p.b_stride_k) * 2;
    b.box_rows = Shape::BK;
    b.box_cols = 64;
  }
  return tensor_map(a, map_a) && tensor_map(b, map_b);
}

// Calls launch(TypeTag<T>, Shape, std::bool_constant<B_KMAJOR>, map_a, map_b)
// with tensor maps for clusters of `cluster` CTAs.
template <typename Launch>
cudaError_t dispatch(const MatmulProblem& p, int device, int cluster, Launch&& launch) {
  if (!tc::operands_ok(p)) return cudaErrorInvalidValue;
  const bool kmajor = tc::b_layout(p) == tc::BLayout::kKMajor;
  const bool wide = use_wide_tile(p.m, p.n, tc::sm_count(device));
  auto by_layout = [&](auto type, auto shape) -> cudaError_t {
    CUtensorMap map_a, map_b;
    if (!make_tensor_maps<decltype(shape)>(p, kmajor, cluster, &map_a, &map_b)) return cudaErrorInvalidValue;
    return kmajor ? launch(type, shape, std::true_type{}, map_a, map_b)
                  : launch(type, shape, std::false_type{}, map_a, map_b);
  };
  auto by_shape = [&](auto type) { return wide ? by_layout(type, WideTile{}) : by_layout(type, NarrowTile{}); };
  return p.dtype == ElementType::kBFloat16 ? by_shape(tc::TypeTag<__nv_bfloat16>{})
                                           : by_shape(tc::TypeTag<__half>{});
}

}  // namespace hopper
}  // namespace persistent_matmul
