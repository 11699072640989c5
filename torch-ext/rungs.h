// The kernel rungs as the op entry sees them: their names, which GPUs and
// dtypes each takes, and the rung `kernel="auto"` runs for a product. Plain
// C++ (no torch types), so the choice is one function of the device, the
// dtype and the shape, which the `choose_kernel` op exposes to tests.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "matmul_problem.h"

namespace persistent_matmul {

enum class Rung : int32_t { kNaive, kWarptiled, kTiled, kPersistent, kWgmma, kWgmmaPersistent, kSplitk, kWgmmaStreamk };

inline constexpr std::string_view kRungNames[] = {"naive", "warptiled", "tiled", "persistent",
                                                  "wgmma", "wgmma_persistent", "splitk", "wgmma_streamk"};

inline std::string_view rung_name(Rung r) { return kRungNames[static_cast<int32_t>(r)]; }

inline std::optional<Rung> rung_named(std::string_view name) {
  for (int32_t i = 0; i < int32_t(std::size(kRungNames)); ++i) {
    if (kRungNames[i] == name) return static_cast<Rung>(i);
  }
  return std::nullopt;
}

// What the choice needs to know about a GPU.
struct DeviceFacts {
  int major = 0, minor = 0;
  int sms = 0;
  bool streamk_clusters = true;  // the build runs wgmma_streamk's clustered cut (wgmma_streamk_clusters_built)
};

// The portable rungs have machine code for 8.0 and newer (and PTX); the
// Hopper rungs for sm_90a only, which runs on compute capability 9.0 alone.
inline bool rung_runs_on(Rung r, const DeviceFacts& d) {
  if (r == Rung::kWgmma || r == Rung::kWgmmaPersistent || r == Rung::kWgmmaStreamk) return d.major == 9 && d.minor == 0;
  return d.major >= 8;
}

inline bool rung_takes(Rung r, ElementType t) {
  switch (r) {
    case Rung::kNaive: return true;
    case Rung::kWarptiled: return t == ElementType::kFloat32;
    default: return t != ElementType::kFloat32;
  }
}

// The rungs with an instrumented build, which records a timeline (one row
// per unit of work: a tile, or a part of one cut in K), and a tile
// configuration (the op tile_config).
inline bool rung_has_timeline(Rung r) {
  return r == Rung::kTiled || r == Rung::kPersistent || r == Rung::kWgmma || r == Rung::kWgmmaPersistent ||
         r == Rung::kWgmmaStreamk;
}

// The rungs that read operands in 16-byte chunks: elements per chunk (the
// binding copies operands they cannot read into a padded layout first); 0
// for naive, which takes any strides.
inline int rung_chunk_elements(Rung r) {
  switch (r) {
    case Rung::kNaive: return 0;
    case Rung::kWarptiled: return 4;
    default: return 8;
  }
}

// splitk by default up to this many tokens (rows of A), where it streams the
// weights faster than the tile rungs compute them (H200, CUDA graphs, the
// Llama-3 projections: 1.4-2.1x wgmma_persistent's speed up to 32 tokens,
// 0.37-0.75x at 64; benchmarks/NOTES.md, "Why a split-K rung for decode"),
// from 1024 weight rows (64 CTAs) on, the narrowest measured: 2.1x there
// (1024 x 4096, one token).
constexpr int64_t kSplitkAutoTokens = 32;
constexpr int64_t kSplitkAutoMinRows = 1024;

// On Hopper, wgmma_streamk instead, where its fixed cost (~6 us a call more
// than cuBLAS's) is small beside the weights' stream: up to 32 tokens from
// 80 M weight elements (160 MB of bf16) on. H100, CUDA graphs, the Llama-3
// projections (benchmarks/NOTES.md, "Why a stream-K rung for decode on
// Hopper"): 1-6% ahead of splitk from 168 MB (70B qkv) on and 3-10% behind it
// at 117-134 MB (8B down, 70B o). Past 32 tokens wgmma_persistent, which
// splits fewer tiles than SMs in K, ran the long weight rows faster than
// wgmma_streamk's stream-K cut (64 tokens: 1.06x at K = 14336, 1.07x at
// K = 28672; "Why fewer tiles than SMs are split in K" in
// benchmarks/NOTES.md); its clustered cut takes some of them back (below).
constexpr int64_t kStreamkAutoMinWeights = 80 * 1000 * 1000;

// Except up to 8 tokens (kSplitkBulkMaxTokens) against rows of at most 4096
// elements, where splitk runs its bulk kernel, with programmatic launches, if
// its CTAs (16 weight rows each) fill at least 2/3 of the SMs: H100,
// CUDA graphs, 1, 4 and 8 tokens against 28672 x 4096 (8B gate_up) ran
// 80.9-81.9 us against wgmma_streamk's 83.8-84.1, while at 10240 x 8192
// (70B qkv) splitk ran 62.2-63.6 against 62.3-62.4 and from 16 tokens on
// (its register kernel) it fell behind at both (benchmarks/NOTES.md, "Why a
// stream-K rung for decode on Hopper"). With fewer, wgmma_streamk's clustered
// cut: at 1024 x 4096 (64 splitk CTAs for 132 SMs; 64-row tiles in clusters
// of 8) it ran 1 and 8 tokens in 7.4 and 7.0 us against splitk's 8.2 and
// 7.7, while at 1536 x 4096 (96 CTAs) splitk kept one token, 8.0 against 8.5.
constexpr int64_t kSplitkShortRowsK = 4096;
inline bool splitk_bulk_fills(const DeviceFacts& d, int64_t n) {
  return fills_two_thirds((n + kSplitkRowsPerCta - 1) / kSplitkRowsPerCta, d.sms);
}

// And wgmma_streamk up to 64 tokens where it runs its clustered cut (one
// token tile; streamk_clustered_cut), but up to 32 tokens not in clusters of
// 3 or more of 128-row tiles, nor in pairs of 64-row tiles against rows of at
// most kSplitkShortRowsK. H100, CUDA graphs (benchmarks/NOTES.md, "Why a
// stream-K rung for decode on Hopper"): pairs of 128-row tiles ran 70B o
// (8192 x 8192) 5-7% ahead of splitk at 1-32 tokens and of wgmma_persistent
// at 64, 6144 x 4096 7% ahead of splitk at 32 tokens; clusters of 3 at
// 4096 x 4096 ran 15-16% behind splitk at 16-32. Pairs of 64-row tiles ran
// 8B down (4096 x 14336) 2-7% ahead of splitk at 1-32 tokens and 8B o
// (4096 x 4096) 19% ahead of wgmma_persistent at 64, but 5-8% behind splitk
// at 16-32; 64-row tiles in clusters of 5 to 8 (1024 and 1536 rows, whose
// 64 or 96 splitk CTAs fill too few SMs) ran 16-63% ahead of splitk at 32
// tokens and 2.0-3.6x ahead of wgmma_persistent at 48-64. Cuts of 64-row
// tiles up to 128 tokens (kStreamkHalfTileMaxTokens): at 128 they ran
// 1024 x 4096 19% and 8B o and 8B down 2% ahead of wgmma_persistent, while
// 128-row pairs ran 8B qkv (6144 x 4096) 19% and 70B o 8% behind it.
constexpr int64_t kStreamkClusteredMaxTokens = 64;
constexpr int64_t kStreamkHalfTileMaxTokens = 128;
inline bool streamk_runs_clustered(const DeviceFacts& d, int64_t m, int64_t n, int64_t k) {
  if (!d.streamk_clusters || m > kStreamkHalfTileMaxTokens) return false;
  const auto taken = [&](int64_t rows, int64_t cluster, int64_t) {  // the launch asks whether they are resident
    if (m > kStreamkClusteredMaxTokens) return rows == kStreamkHalfTileRows;
    if (m > kSplitkAutoTokens) return true;
    return rows == kStreamkTileRows ? cluster <= 2 : (cluster > 2 || k > kSplitkShortRowsK);
  };
  const int64_t k_blocks = (k + kStreamkBlockK - 1) / kStreamkBlockK;
  return streamk_clustered_cut(n, 1, k_blocks, d.sms, taken).ctas > 0;
}

// kernel="auto": the skinny-product rungs for few tokens against K-major
// weights (wgmma_streamk or splitk, by the rules above), then the fastest
// tile rung the GPU runs (wgmma_persistent on Hopper, persistent elsewhere),
// warptiled for fp32, naive where nothing else runs.
inline std::optional<Rung> choose_auto(const DeviceFacts& d, ElementType t, int64_t m, int64_t n, int64_t k,
                                       bool b_kmajor) {
  const bool half = t != ElementType::kFloat32;
  const bool splitk_streams_faster = m <= kSplitkBulkMaxTokens && k <= kSplitkShortRowsK && splitk_bulk_fills(d, n);
  const bool streamk_faster = (m <= kSplitkAutoTokens && n * k >= kStreamkAutoMinWeights) ||
                              streamk_runs_clustered(d, m, n, k);
  if (half && b_kmajor && streamk_faster && !splitk_streams_faster && rung_runs_on(Rung::kWgmmaStreamk, d)) {
    return Rung::kWgmmaStreamk;
  }
  if (half && m <= kSplitkAutoTokens && b_kmajor && n >= kSplitkAutoMinRows && rung_runs_on(Rung::kSplitk, d)) {
    return Rung::kSplitk;
  }
  for (Rung r : {Rung::kWgmmaPersistent, Rung::kPersistent, Rung::kWarptiled, Rung::kNaive}) {
    if (rung_takes(r, t) && rung_runs_on(r, d)) return r;
  }
  return std::nullopt;
}

}  // namespace persistent_matmul
