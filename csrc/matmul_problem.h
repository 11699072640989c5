// The description of one matmul that the binding hands to every kernel rung,
// and the host-side launchers the rungs export. Plain C++ with no torch types,
// so the .cu files build without torch headers.
#pragma once

#include <cstdint>
#include <initializer_list>

#include <cuda_runtime.h>

namespace persistent_matmul {

enum class ElementType : int32_t { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

// out[m, n] = sum_k a[m, k] * b[k, n] (+ bias[n]), accumulated in fp32.
// Every operand is addressed through element strides, so transposed and
// sliced tensors need no copy. All three matrices share one element type.
struct MatmulProblem {
  int64_t m = 0, n = 0, k = 0;
  ElementType dtype = ElementType::kFloat32;
  const void* a = nullptr;
  int64_t a_stride_m = 0, a_stride_k = 0;
  const void* b = nullptr;
  int64_t b_stride_k = 0, b_stride_n = 0;
  const void* bias = nullptr;  // n elements, contiguous; nullptr for none
  void* out = nullptr;
  int64_t out_stride_m = 0, out_stride_n = 0;
  // Instrumented launches only: TileConfig::timeline_rows TileRecords, one
  // per unit of work (a whole output tile, or a part of one cut in K; see
  // tensor_core_tile.cuh), nullptr for the normal path.
  void* timeline = nullptr;
  // The persistent rungs only: 0 = grouped tile order, 1 = Hilbert, 2 =
  // dynamic, 3 = split tail (tile_scheduler.cuh). Dynamic and split tail take
  // tile indices from `tile_counter`: one uint32 in device memory, zero at
  // launch (the launch sets it back to zero as it ends: claim_tile_index).
  // Split tail hands partial sums of split tiles from CTA to CTA through
  // `partials` (a slot of BM x BN floats per split unit) and `partial_flags`
  // (kSplitFlagsPerSlot per slot, zero at launch; the launch leaves them
  // zero), sized per SM of the device (kSplitPartialBytesPerSm, kSplitFlagsPerSm).
  int32_t tile_order = 0;
  uint32_t* tile_counter = nullptr;
  float* partials = nullptr;
  uint32_t* partial_flags = nullptr;
  // `wgmma_persistent`: 1 (no clusters), 2 (CTA pairs share B by TMA
  // multicast), or 0 (the default: the launch picks, wgmma_cluster_size_for).
  // `wgmma_streamk`: 1 (its stream-K cut over 128-row tiles, no clusters) or
  // 0 (the default: the clustered cut where one fits, streamk_clustered_cut).
  int32_t cluster_size = 0;
};

// The split-tail order's workspace per SM of the device: the partial-sum
// slots of the split units (at most one per CTA of the grid, and an SM holds
// one 128 x 256 fp32 tile, two 128 x 128 or eight 64 x 64) and two flags per
// slot (one per consumer warpgroup in wgmma_persistent). A launch whose grid
// needs more runs the dynamic order.
constexpr int64_t kSplitPartialBytesPerSm = 128 * 256 * 4;
constexpr int64_t kSplitFlagsPerSlot = 2;
constexpr int64_t kSplitFlagsPerSm = 8 * kSplitFlagsPerSlot;
// `wgmma_streamk` shares that workspace (the same `partials` and
// `partial_flags`): one CTA an SM, whose stretch of work holds parts of at
// most two tiles, so two slots of up to 128 x 256 floats per SM and a
// counter per slot and consumer warpgroup (zero at launch; the launch leaves
// them zero).
constexpr int64_t kStreamKPartialBytesPerSm = 2 * 128 * 256 * 4;
static_assert(2 * 2 <= kSplitFlagsPerSm, "wgmma_streamk's counters share the split-tail flags");
// The partial-sum bytes per SM the workspace holds: enough for either rung.
constexpr int64_t kPartialBytesPerSm =
    kSplitPartialBytesPerSm > kStreamKPartialBytesPerSm ? kSplitPartialBytesPerSm : kStreamKPartialBytesPerSm;
// Whether `ctas` CTAs with BM x BN tiles fit the workspace of `sms` SMs.
inline bool split_workspace_fits(int64_t ctas, int64_t bm, int64_t bn, int64_t sms) {
  return ctas * bm * bn * 4 <= sms * kSplitPartialBytesPerSm && ctas * kSplitFlagsPerSlot <= sms * kSplitFlagsPerSm;
}

// How the tensor-core rungs cut a problem into output tiles on this device.
struct TileConfig {
  int64_t block_m = 0, block_n = 0, block_k = 0;
  int64_t tiles = 0;            // output tiles = CTAs of `tiled`
  // CTAs of the persistent rung's launch: what fills the device once, capped
  // at the tiles (wgmma_persistent: split in K, up to one CTA per part)
  int64_t persistent_ctas = 0;
  // Rows of an instrumented launch's timeline: one per tile, then one per CTA
  // the launch may run, for the parts of tiles cut in K (at most one a CTA
  // besides the tiles' own rows; tc::timeline_row).
  int64_t timeline_rows = 0;
  // CTAs per cluster the rung launches where the caller leaves it open
  // (wgmma_persistent: wgmma_default_cluster_size).
  int64_t cluster_size = 1;
};

// Each launcher returns the launch error, if any.
// Rung 1: one thread per output element.
cudaError_t launch_naive(const MatmulProblem& problem, cudaStream_t stream);
// Rung 2: fp32 on CUDA cores, block/warp/thread tiles. fp32 only; A
// K-contiguous, B K- or N-contiguous, leading dims multiples of 4 elements,
// 16-byte-aligned bases (cuda_core_operands_ok says whether they are).
cudaError_t launch_warptiled(const MatmulProblem& problem, cudaStream_t stream);
bool cuda_core_operands_ok(const MatmulProblem& problem);
// Rung 3: tensor cores (mma.sync), one CTA per output tile. bf16/fp16 only;
// A K-contiguous, B K- or N-contiguous, leading dims multiples of 8 elements,
// 16-byte-aligned bases (tensor_core_operands_ok says whether they are).
cudaError_t launch_tiled(const MatmulProblem& problem, cudaStream_t stream);
// Rung 4: the same tile code, one wave of CTAs that loop over the tiles.
cudaError_t launch_persistent(const MatmulProblem& problem, cudaStream_t stream);
bool tensor_core_operands_ok(const MatmulProblem& problem);
TileConfig tensor_core_tile_config(int64_t m, int64_t n, int device);
// Rungs 5 and 6, Hopper only (built for sm_90a; the caller checks the device):
// TMA + wgmma, warp-specialized, one CTA per tile / persistent. Same operand
// rules as the tensor-core rungs (tensor_core_operands_ok).
cudaError_t launch_wgmma(const MatmulProblem& problem, cudaStream_t stream);
cudaError_t launch_wgmma_persistent(const MatmulProblem& problem, cudaStream_t stream);
// wgmma_persistent's tiles of an m x n output; persistent_ctas is the grid of
// its launch in the split-tail order with `cluster_size` CTAs a cluster (0:
// the default size), which for fewer tiles than SMs splits them in K when k
// is deep enough (k < 1: K not known, taken as deep enough).
TileConfig wgmma_tile_config(int64_t m, int64_t n, int64_t k, int device, int32_t cluster_size = 0);
// The tile order worth running for wgmma_persistent's `tile_order` on this
// problem (its cluster_size, 0: the default): the split-tail order where it
// splits tiles in K, else grouped where the grid holds every tile (the dynamic
// and split-tail orders would assign the same tiles, their counter and
// workspace pure cost), else `tile_order` itself.
int32_t wgmma_order_worth_running(int32_t tile_order, const MatmulProblem& problem, int device);
// Whether this build has wgmma_persistent's CTA-pair kernels (cluster_size 2);
// builds without them run single CTAs only (wgmma_persistent.cu says why).
bool wgmma_cluster_pairs_built();
// wgmma_persistent's cluster size for m rows where the caller leaves it open
// (cluster_size 0): wgmma_cluster_size_for where the build has pairs, else 1.
int32_t wgmma_default_cluster_size(int64_t m);
// Rung 7: skinny products (decode shapes), the weights as mma.sync's A
// operand, K split over each CTA's warps. bf16/fp16; A K-contiguous, B
// K-major, leading dims multiples of 8 elements, 16-byte-aligned bases
// (splitk_operands_ok says whether they are).
cudaError_t launch_splitk(const MatmulProblem& problem, cudaStream_t stream);
bool splitk_operands_ok(const MatmulProblem& problem);
// Up to this many tokens splitk streams the weights through shared memory by
// bulk copies where the GPU has them (compute capability 9.0 and newer;
// csrc/splitk.cu), else through registers.
constexpr int64_t kSplitkBulkMaxTokens = 8;
// Weight rows (output columns) each splitk CTA takes: one MMA's M.
constexpr int64_t kSplitkRowsPerCta = 16;
// Rung 8, Hopper only (sm_90a): skinny products on TMA + wgmma, the weights
// as wgmma's A operand, the work cut evenly over the SMs (stream-K). Same
// operand rules as splitk (splitk_operands_ok); needs the workspace
// (`partials`, `partial_flags`, zero flags).
cudaError_t launch_wgmma_streamk(const MatmulProblem& problem, cudaStream_t stream);
// wgmma_streamk's tiles are 128 weight rows (output columns, N), or 64 in
// the clustered cut where that runs more CTAs (streamk_clustered_cut), by the
// token tile it launches for M (output rows); its grid depends on K too
// (k < 1: K deep enough to give every SM work); `clusters` false: the cut of
// a launch with cluster_size 1 (no clusters).
TileConfig wgmma_streamk_tile_config(int64_t m, int64_t n, int64_t k, int device, bool clusters = true);
// Whether this build runs wgmma_streamk's clustered cut (below; CUDA 13
// builds), else its stream-K cut everywhere.
bool wgmma_streamk_clusters_built();
// wgmma_streamk's tile heights, in weight rows: two consumer warpgroups of 64
// rows each, or, in the clustered cut, both consumers on the same 64 rows,
// each over half of every k-block.
constexpr int64_t kStreamkTileRows = 128;
constexpr int64_t kStreamkHalfTileRows = 64;
// K of one work item of wgmma_streamk's cut (a k-block: two TMA boxes of 64).
constexpr int64_t kStreamkBlockK = 128;
// Whether `ctas` CTAs fill at least 2/3 of `sms` SMs: the least that the
// skinny rungs' cuts are given (cuBLAS runs 96 CTAs at 6144 weight rows on
// 132 SMs).
inline bool fills_two_thirds(int64_t ctas, int64_t sms) { return 3 * ctas >= 2 * sms; }
// Whether wgmma_streamk can cut `tiles` tiles of k_blocks k-blocks
// `cluster` CTAs a tile, in clusters of as many (the clustered cut): the CTAs
// fit the SMs once and fill at least 2/3 of them (fills_two_thirds), each
// part at least two k-blocks deep. The launch also needs the clusters
// resident at once, which the runtime says.
inline bool streamk_cluster_fits(int64_t tiles, int64_t k_blocks, int64_t cluster, int64_t sms) {
  const int64_t ctas = tiles * cluster;
  return cluster >= 1 && cluster <= 8 && ctas <= sms && fills_two_thirds(ctas, sms) &&
         (cluster == 1 || 2 * cluster <= k_blocks);
}

// A clustered cut of wgmma_streamk: `ctas` CTAs in clusters of `cluster`,
// one cluster a tile of `rows` weight rows; ctas == 0: none fits.
struct StreamkCut {
  int64_t ctas = 0;
  int64_t cluster = 0;
  int64_t rows = 0;
};

// The clustered cut that runs the most CTAs, of n weight rows by
// `token_tiles` token tiles, k_blocks deep, of those that
// `usable(rows, cluster, tiles)` accepts (the launch: `tiles` such clusters
// can all be resident at once). Tiles of 64 weight rows (the two consumer
// warpgroups of a CTA split each stage's K) run only in clusters of 2 or
// more, where they fill more SMs than 128-row tiles do: 4096 rows are 32
// tiles of 128, 96 CTAs in clusters of 3 on 132 SMs (clusters of 4 do not all
// fit at once on an H100), or 64 tiles of 64, 128 CTAs in pairs. Of cuts with
// as many CTAs, the smaller cluster, then the taller tile.
template <typename Usable>
StreamkCut streamk_clustered_cut(int64_t n, int64_t token_tiles, int64_t k_blocks, int64_t sms, Usable&& usable) {
  StreamkCut best;
  for (int64_t rows : {kStreamkTileRows, kStreamkHalfTileRows}) {
    const int64_t tiles = (n + rows - 1) / rows * token_tiles;
    for (int64_t cluster = rows == kStreamkTileRows ? 1 : 2; cluster <= 8; ++cluster) {
      const int64_t ctas = tiles * cluster;
      const bool better = ctas > best.ctas || (ctas == best.ctas && cluster < best.cluster);
      if (better && streamk_cluster_fits(tiles, k_blocks, cluster, sms) && usable(rows, cluster, tiles)) {
        best = {ctas, cluster, rows};
      }
    }
  }
  return best;
}

// The rows of every wgmma tile (wgmma_launch.cuh checks it).
constexpr int64_t kWgmmaTileRows = 128;
// wgmma_persistent's cluster size where the caller leaves it open
// (cluster_size 0): pairs of vertically adjacent tiles sharing B, unless the
// output has a single row of tiles, where every pair's second CTA would only
// pass B on. On the H200 (2026-11-30, benchmarks/NOTES.md) pairs ran at
// 1.00-1.04x the speed of single CTAs at the large benchmark shapes and
// 1.07-1.11x at 3000^3.
inline int32_t wgmma_cluster_size_for(int64_t m) { return m > kWgmmaTileRows ? 2 : 1; }

}  // namespace persistent_matmul
