// Rung 8 — wgmma_streamk (Hopper, sm_90a): skinny products (decode shapes) on
// TMA + wgmma, with the work cut evenly over the SMs (stream-K).
//
// Over `splitk` (mma.sync, every CTA 16 weight rows and all of K) this rung
// * keeps the swap of A and B: the weights (B, stored K-major as nn.Linear
//   keeps them) are wgmma's A operand, 64 weight rows per consumer warpgroup
//   and 128 per tile, and the tokens its B operand, a tile as wide as the
//   narrowest wgmma (8, 16, 32, 64, 128 or 256 columns) that holds all M of
//   them: one token costs m64n8k16 wgmmas, not a 128-row tile of padding;
// * loads both by TMA: one thread of a producer warp fills a ring of
//   shared-memory stages (32 KB of weights each, 2 to 5 of them, or with
//   64-row tiles 16 KB, 4 to 11) that the consumers free as soon as their
//   wgmmas have read them, so every SM keeps up to 160-176 KB of weights in
//   flight; the weights, read once, are marked to
//   leave L2 first and the tokens, read by every weight tile, to stay;
// * cuts the work, the (tile, stage of K) pairs tile after tile, into one
//   stretch of equal length per SM (stream-K), so every SM streams the same
//   number of weight bytes whatever the number of tiles (a 4096-row
//   projection has 32 tiles for 132 SMs, a 28672-row one 224). A tile whose
//   k-blocks fall into several stretches is finished by whichever of their
//   CTAs gets there last: each writes its fp32 partial sums to a workspace
//   slot and counts itself in on the tile's counter; the last one adds every
//   part in CTA order (so the result does not depend on who is last), adds
//   the bias and stores the tile. No CTA ever waits for another.
// Where the tiles are few but a whole number of CTAs per tile fills most of
// the SMs (4096 weight rows: 32 tiles, 3 CTAs each on an H100), the same cut runs in
// thread block clusters instead: every CTA of a cluster takes an equal
// stretch of K of one tile, and the cluster adds its parts through
// distributed shared memory, each CTA a share of the tile, so no CTA reads
// the whole tile's parts alone and nothing passes through global memory.
// Where tiles of 64 weight rows fill more SMs (4096 rows: 64 tiles in pairs,
// 128 CTAs, against 96 in clusters of 3 of 128-row tiles), the clustered cut
// runs those, both consumers on the tile's 64 rows, each over half of every
// stage's K, their two parts added with the cluster's.
// Each launch is a programmatic dependent launch, as wgmma_persistent's: its
// CTAs set up while the kernel before them finishes.
//
// Operands: A (the tokens, M x K) K-contiguous, B K-major (N rows of K),
// leading dims multiples of 8 elements, 16-byte aligned data (what TMA needs
// of a base and a row stride); bf16 or fp16. TMA fills what a box holds past
// M, N or K with zeros, so any M, N, K >= 1 is computed exactly.
#include <type_traits>

#include "hopper_helpers.cuh"
#include "matmul_problem.h"
#include "tensor_core_launch.cuh"  // operand layout checks, sm_count, TypeTag, allow_dynamic_smem
#include "tensor_core_tile.cuh"    // TileRecord, timeline_row, global_timer_ns, sm_id

namespace persistent_matmul {
namespace {

constexpr int kBlockK = 64;     // K per TMA box: 128-byte rows, the width of the 128-byte swizzle
constexpr int kConsumers = 2;
constexpr int kConsumerThreads = 128 * kConsumers;
constexpr int kThreads = kConsumerThreads + 32;  // the consumers, then the producer warp

// A tile of ROWS (128 or 64) weight rows x BT tokens; a stage holds two
// k-boxes of 64, a k-block of 128 (one work item of the stream-K cut):
// [k-box][ROWS weight rows][128 bytes], then [k-box][BT token rows][128
// bytes], each box in TMA's 128-byte swizzle; as many stages as fit ~200 KB
// of shared memory. With 128 rows each consumer takes 64 of them over both
// k-boxes, with 64 rows each takes all of them over one k-box. (On the H100,
// 1, 2 or 4 k-boxes a stage, and weight boxes of 8, 64 or 128 rows, ran
// within 5% of each other at 1 to 64 tokens; two k-boxes were at the front or
// within 2%.)
template <int BT, int ROWS>
struct StreamKShape {
  static constexpr int KB = 2;        // k-boxes per stage
  static constexpr int BK = kBlockK * KB;  // K per stage: a k-block
  static constexpr bool SPLIT_K = ROWS == kStreamkHalfTileRows;  // the consumers split each stage's k-boxes
  static constexpr int CONSUMER_BOXES = SPLIT_K ? KB / kConsumers : KB;  // k-boxes each consumer multiplies
  static constexpr int WEIGHT_BOX_BYTES = ROWS * kBlockK * 2;
  static constexpr int TOKEN_BOX_BYTES = BT * kBlockK * 2;
  static constexpr int WEIGHT_STAGE_BYTES = KB * WEIGHT_BOX_BYTES;
  static constexpr int STAGE_BYTES = KB * (WEIGHT_BOX_BYTES + TOKEN_BOX_BYTES);
  static constexpr int STAGES = (200 * 1024) / STAGE_BYTES;
  static constexpr int ACCUMULATORS = BT / 2;  // fp32 registers per consumer thread
  // 1024 bytes to align the stages for the 128-byte swizzle, the stages, the
  // full and empty barriers, and one int per consumer (who finishes a tile).
  static constexpr int SMEM_BYTES = 1024 + STAGES * STAGE_BYTES + 2 * STAGES * 8 + 4 * kConsumers;
  static_assert(STAGE_BYTES % 1024 == 0, "stages stay 1024-byte aligned");
  static_assert(STAGES >= 2, "a ring of at least two stages");
  static_assert(ROWS == kStreamkTileRows || ROWS == kStreamkHalfTileRows, "tiles of 128 or 64 weight rows");
  static_assert(!SPLIT_K || KB % kConsumers == 0, "the consumers split a stage's k-boxes evenly");
  static_assert(SMEM_BYTES <= 227 * 1024, "more shared memory than an sm_90 CTA may have");
  static_assert(2 * kStreamkTileRows * BT * 4 <= kStreamKPartialBytesPerSm, "two partial-sum slots per SM");
  static_assert(kStreamkTileRows * BT * 4 <= STAGES * STAGE_BYTES, "a cluster's part of a tile fits in the ring");
};

// The stream-K cut: `total` work items (k-blocks of tiles, tile after tile,
// `k_blocks` per tile) in `ctas` stretches; stretch c is [start(c), start(c + 1)).
struct StreamK {
  int64_t k_blocks, total;
  int ctas;
  __device__ int64_t start(int c) const { return total * c / ctas; }
  // The CTA whose stretch holds work item w.
  __device__ int owner(int64_t w) const {
    int c = int(w * ctas / total);
    while (c + 1 < ctas && start(c + 1) <= w) ++c;
    while (start(c) > w) --c;
    return c;
  }
  // The workspace slot of CTA c's part of tile u. Only the first and the last
  // tile of a stretch can be parts (the ones between are whole): two slots a CTA.
  __device__ int64_t slot(int c, int64_t u) const { return 2 * int64_t(c) + (start(c) / k_blocks == u ? 0 : 1); }
};

// A stretch's piece of one tile: k-blocks [kb_begin, kb_end) of tile `tile`.
struct Segment {
  int64_t tile;
  int kb_begin, kb_end;
};

// This CTA's stretch, one tile's piece at a time (the producer and the
// consumers each walk their own copy).
class Stretch {
 public:
  __device__ explicit Stretch(const StreamK& sk) : sk_(sk), w_(sk.start(blockIdx.x)), end_(sk.start(blockIdx.x + 1)) {}
  __device__ bool next(Segment& s) {
    if (w_ >= end_) return false;
    s.tile = w_ / sk_.k_blocks;
    s.kb_begin = int(w_ % sk_.k_blocks);
    s.kb_end = int(min_i64(sk_.k_blocks, s.kb_begin + (end_ - w_)));
    w_ += s.kb_end - s.kb_begin;
    return true;
  }

 private:
  StreamK sk_;
  int64_t w_, end_;
};

// One consumer's 64 x BT results (+ bias) to the output: weight row n (the
// fragment's row) is output column n, token m (its column) output row m.
// Fragment layout of m64nNk16: thread t of the warpgroup holds, for each
// 8-column block j, rows 16 (t / 32) + (t % 32) / 4 (+ 8) and columns
// 8j + 2 (t % 4) (+ 1).
template <typename T, int BT>
__device__ __forceinline__ void store_results(const MatmulProblem& p, int64_t n0, int64_t m0, const float (&d)[BT / 2]) {
  const int t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
  T* out = static_cast<T*>(p.out);
  const T* bias = static_cast<const T*>(p.bias);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t n = n0 + warp * 16 + lane / 4 + 8 * half;
    if (n >= p.n) continue;
    const float b = bias != nullptr ? to_float(bias[n]) : 0.0f;
#pragma unroll
    for (int j = 0; j < BT / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int64_t m = m0 + 8 * j + 2 * (lane % 4) + e;
        if (m < p.m) out[m * p.out_stride_m + n * p.out_stride_n] = from_float<T>(d[j * 4 + half * 2 + e] + b);
      }
    }
  }
}

// The clustered cut's hand-over: every CTA of the cluster holds a part of
// the same tile (an equal stretch of its k-blocks), which its consumers write
// to its own shared memory, over the ring's stages (all consumed). After the
// cluster's barrier each CTA adds its 1/ctas share of the tile's float4s over
// every CTA's part, in rank order (so the result does not depend on timing),
// adds the bias and stores them; the second barrier keeps every CTA's shared
// memory until the others have read it. The layout is the fragment's
// (store_partial_sums): float4 i of thread t of consumer c holds rows
// 16 (t / 32) + (t % 32) / 4 (+ 8) and columns 8i + 2 (t % 4) (+ 1) of the
// consumer's 64 x BT, which are rows c * 64 + ... of a 128-row tile, and the
// same rows of a 64-row tile (whose consumers' parts are two more parts of
// it, added in consumer order).
template <typename T, int BT, int ROWS>
__device__ __forceinline__ void reduce_in_cluster(const MatmulProblem& p, char* stages, int64_t n_tile, int64_t m0,
                                                  const float (&d)[BT / 2], int consumer) {
  constexpr int kPerConsumer = BT / 8 * 128;
  constexpr int kPartsPerCta = StreamKShape<BT, ROWS>::SPLIT_K ? kConsumers : 1;  // of each float4 of the tile
  constexpr int kPerTile = kConsumers * kPerConsumer / kPartsPerCta;
  hopper::named_barrier_sync(1, kConsumerThreads);  // both consumers' wgmmas are done with the stages
  float4* part = reinterpret_cast<float4*>(stages) + consumer * kPerConsumer + threadIdx.x % 128;
#pragma unroll
  for (int i = 0; i < BT / 8; ++i) part[i * 128] = make_float4(d[4 * i], d[4 * i + 1], d[4 * i + 2], d[4 * i + 3]);
  hopper::cluster_sync();
  const int ctas = int(hopper::cluster_ctas()), rank = int(hopper::cluster_cta_rank());
  const uint32_t base = hopper::smem_u32(stages);
  T* out = static_cast<T*>(p.out);
  const T* bias = static_cast<const T*>(p.bias);
  const int end = kPerTile * (rank + 1) / ctas;
  for (int f = kPerTile * rank / ctas + int(threadIdx.x); f < end; f += kConsumerThreads) {
    float4 s = hopper::ld_shared_cluster_f4(base + 16 * f, 0);
    for (int q = 0; q < ctas; ++q) {
#pragma unroll
      for (int h = q == 0 ? 1 : 0; h < kPartsPerCta; ++h) {
        const float4 v = hopper::ld_shared_cluster_f4(base + 16 * (f + h * kPerConsumer), uint32_t(q));
        s.x += v.x;
        s.y += v.y;
        s.z += v.z;
        s.w += v.w;
      }
    }
    const float sums[4] = {s.x, s.y, s.z, s.w};
    const int c = f / kPerConsumer, i = f % kPerConsumer / 128, warp = f % 128 / 32, lane = f % 32;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int64_t n = n_tile + c * 64 + warp * 16 + lane / 4 + 8 * half;
      if (n >= p.n) continue;
      const float b = bias != nullptr ? to_float(bias[n]) : 0.0f;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int64_t m = m0 + 8 * i + 2 * (lane % 4) + e;
        if (m < p.m) out[m * p.out_stride_m + n * p.out_stride_n] = from_float<T>(sums[2 * half + e] + b);
      }
    }
  }
  hopper::cluster_sync();
}

// One consumer's half of a partial-sum slot: its 64 x BT floats (store_partial_sums).
template <int BT>
__device__ __forceinline__ float4* partial_of(const MatmulProblem& p, int64_t slot, int consumer) {
  return reinterpret_cast<float4*>(p.partials + (slot * kStreamkTileRows + consumer * 64) * BT);
}

// The instrumented build's record of a segment, once both consumers are
// done with it (stored its results, or handed its part over): thread 0
// writes it, with the start it kept in shared memory. Tile u is token tile
// u % token_tiles (output rows) and weight tile u / token_tiles (output
// columns); a segment that starts the tile has the tile's row, the first
// segment of a stretch that starts inside a tile the row past the tiles'
// of its CTA (tc::timeline_row). Every consumer thread calls this once per
// segment, whichever way the segment ended (named barrier 1 holds the 256
// consumer threads; 2 and 3 are the warpgroups' own).
template <int BT, int ROWS>
__device__ __forceinline__ void record_segment(const MatmulProblem& p, const Segment& seg, int64_t token_tiles,
                                               const int64_t& start) {
  hopper::named_barrier_sync(1, kConsumerThreads);
  if (threadIdx.x == 0) {
    constexpr int kBK = StreamKShape<BT, ROWS>::BK;
    const tc::TileCoord tile{int(seg.tile % token_tiles), int(seg.tile / token_tiles)};
    const int tiles_m = int(token_tiles), tiles_n = int(ceil_div(p.n, ROWS));
    const int64_t row = tc::timeline_row(tile, tiles_m, tiles_n, seg.kb_begin == 0 ? -1 : int64_t(blockIdx.x));
    static_cast<tc::TileRecord*>(p.timeline)[row] = {tile.m,
                                                     tile.n,
                                                     int64_t(seg.kb_begin) * kBK,
                                                     min_i64(int64_t(seg.kb_end) * kBK, p.k),
                                                     tc::sm_id(),
                                                     blockIdx.x,
                                                     start,
                                                     tc::global_timer_ns()};
  }
}

// At most 168 registers a thread: the 9 warps spread over the SM's four
// register files of 16384, three warps on one. ROWS: weight rows a tile (64
// only in the clustered cut). TIMELINE: the instrumented build, which records
// each segment (record_segment).
template <typename T, int BT, int ROWS, bool TIMELINE>
__global__ void __launch_bounds__(kThreads, 1)
    wgmma_streamk_kernel(const __grid_constant__ CUtensorMap map_w, const __grid_constant__ CUtensorMap map_x,
                         const MatmulProblem p) {
  using Shape = StreamKShape<BT, ROWS>;
  extern __shared__ char smem_raw[];
  char* stages = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint64_t* full = reinterpret_cast<uint64_t*>(stages + Shape::STAGES * Shape::STAGE_BYTES);
  uint64_t* empty = full + Shape::STAGES;
  int* finisher = reinterpret_cast<int*>(empty + Shape::STAGES);  // per consumer: 1 if it finishes the tile

  const int64_t token_tiles = ceil_div(p.m, BT);
  const int64_t k_blocks = ceil_div(p.k, Shape::BK);
  StreamK sk{k_blocks, ceil_div(p.n, ROWS) * token_tiles * k_blocks, int(gridDim.x)};

  if (threadIdx.x == 0) {
    for (int s = 0; s < Shape::STAGES; ++s) {
      hopper::mbarrier_init(&full[s], 1);
      hopper::mbarrier_init(&empty[s], kConsumers);
    }
    hopper::fence_barrier_init();
  }
  __syncthreads();  // the last CTA-wide barrier: then the producer warp's other lanes leave (in clusters,
                    // after the cluster's barriers)
  // Launched in clusters (the clustered cut), or with 64-row tiles (only
  // launched so): each CTA's stretch is one part of its cluster's tile,
  // handed over by reduce_in_cluster.
  const bool clustered = Shape::SPLIT_K || hopper::cluster_ctas() > 1;

  if (threadIdx.x >= kConsumerThreads) {  // the producer warp: one thread issues every load
    if (threadIdx.x == kConsumerThreads) {
      // The kernel before this one in the stream may still run: wait for it
      // before the first access to global memory (every other access follows
      // a load issued here).
      hopper::wait_for_prior_grids();
      hopper::RingPosition<Shape::STAGES> ring;
      Stretch stretch(sk);
      Segment seg;
      // Every weight is read once and every token by each weight tile: the
      // weights leave L2 first, so the tokens stay (H100: 2-3% faster at 32
      // tokens against 10240 x 8192 and at 128 against 4096 x 4096,
      // benchmarks/NOTES.md).
      const uint64_t read_once = hopper::l2_evict_first_policy(), read_again = hopper::l2_evict_last_policy();
      while (stretch.next(seg)) {
        const int weight_row = int(seg.tile / token_tiles) * ROWS;
        const int token_row = int(seg.tile % token_tiles) * BT;
        for (int kb = seg.kb_begin; kb < seg.kb_end; ++kb) {
          hopper::mbarrier_wait(&empty[ring.stage], ring.phase ^ 1);  // a fresh barrier passes parity 1
          char* stage = stages + ring.stage * Shape::STAGE_BYTES;
          uint64_t* bar = &full[ring.stage];
          hopper::mbarrier_arrive_expect_tx(bar, Shape::STAGE_BYTES);
          for (int j = 0; j < Shape::KB; ++j) {
            const int k = kb * Shape::BK + j * kBlockK;
            hopper::tma_load_2d_hinted(stage + j * Shape::WEIGHT_BOX_BYTES, &map_w, bar, k, weight_row, read_once);
            hopper::tma_load_2d_hinted(stage + Shape::WEIGHT_STAGE_BYTES + j * Shape::TOKEN_BOX_BYTES, &map_x, bar, k,
                                       token_row, read_again);
          }
          ring.advance();
        }
      }
      hopper::allow_dependent_grids();  // the next launch may set up while the last stages are used
    }
    if (clustered) {  // every thread of the cluster takes part in reduce_in_cluster's two barriers
      hopper::cluster_sync();
      hopper::cluster_sync();
    }
    return;
  }

  constexpr bool kBF16 = std::is_same_v<T, __nv_bfloat16>;
  const int consumer = threadIdx.x / 128;
  const int t = threadIdx.x % 128;
  const uint32_t stage_base = hopper::smem_u32(stages);
  hopper::RingPosition<Shape::STAGES> ring;
  Stretch stretch(sk);
  Segment seg;
  __shared__ int64_t segment_start;  // the instrumented build's, kept by thread 0 (record_segment)
  while (stretch.next(seg)) {
    if constexpr (TIMELINE) {
      if (threadIdx.x == 0) segment_start = tc::global_timer_ns();
    }
    // Zeroed here, outside the k-loop's wgmma fences, though the first wgmma
    // overwrites them (scale-d 0): left undefined, ptxas before CUDA 13 lets
    // other instructions define them inside the pipeline and serialises the
    // wgmmas (advisory C7515).
    float d[Shape::ACCUMULATORS] = {};
    for (int kb = seg.kb_begin; kb < seg.kb_end; ++kb) {
      hopper::mbarrier_wait(&full[ring.stage], ring.phase);
      // A consumer's 64 weight rows of both k-boxes (128-row tiles), or all
      // 64 rows of its own k-box (64-row tiles), and the k-boxes' tokens.
      const int first_box = Shape::SPLIT_K ? consumer * Shape::CONSUMER_BOXES : 0;
      const uint32_t weights = stage_base + ring.stage * Shape::STAGE_BYTES + first_box * Shape::WEIGHT_BOX_BYTES +
                               (Shape::SPLIT_K ? 0 : consumer * 64 * 128);
      const uint32_t tokens =
          stage_base + ring.stage * Shape::STAGE_BYTES + Shape::WEIGHT_STAGE_BYTES + first_box * Shape::TOKEN_BOX_BYTES;
      hopper::wgmma_fence();
#pragma unroll
      for (int j = 0; j < Shape::CONSUMER_BOXES; ++j) {
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {  // K-major rows of 128 bytes: 32 bytes per k16
          hopper::Wgmma<BT, 0>::template run<kBF16>(
              d, hopper::smem_descriptor(weights + j * Shape::WEIGHT_BOX_BYTES + kk * 32, 16, 1024),
              hopper::smem_descriptor(tokens + j * Shape::TOKEN_BOX_BYTES + kk * 32, 16, 1024),
              (kb > seg.kb_begin || j > 0 || kk > 0) ? 1 : 0);
        }
      }
      hopper::wgmma_commit();
      hopper::wgmma_wait<0>();
      if (t == 0) hopper::mbarrier_arrive(&empty[ring.stage]);
      ring.advance();
    }

    const int64_t n_tile = (seg.tile / token_tiles) * ROWS;  // the tile's first weight row
    const int64_t m0 = (seg.tile % token_tiles) * BT;
    if (clustered) {  // a part of the cluster's tile (the launch gives every CTA one)
      reduce_in_cluster<T, BT, ROWS>(p, stages, n_tile, m0, d, consumer);
      if constexpr (TIMELINE) record_segment<BT, ROWS>(p, seg, token_tiles, segment_start);
      continue;
    }
    const int64_t n0 = n_tile + consumer * 64;  // this consumer's first weight row
    if (seg.kb_begin == 0 && seg.kb_end == k_blocks) {  // the whole tile: store it
      store_results<T, BT>(p, n0, m0, d);
      if constexpr (TIMELINE) record_segment<BT, ROWS>(p, seg, token_tiles, segment_start);
      continue;
    }
    // A part: hand it over, and count in. The CTAs that share tile u are the
    // owners of its first and last k-block and those between; the counter of
    // (tile, consumer) sits at the first one's slot of the tile.
    const int64_t u = seg.tile;
    const int first = sk.owner(u * k_blocks), last = sk.owner((u + 1) * k_blocks - 1);
    hopper::store_partial_sums(partial_of<BT>(p, sk.slot(int(blockIdx.x), u), consumer), d);
    __threadfence();                                // this thread's sums are visible before it counts in
    hopper::named_barrier_sync(2 + consumer, 128);  // ... and every thread's, before thread 0 counts the warpgroup in
    if (t == 0) {
      uint32_t* counter = p.partial_flags + sk.slot(first, u) * 2 + consumer;
      const bool is_last = atomicAdd(counter, 1u) == uint32_t(last - first);
      if (is_last) {
        *counter = 0;      // every part has counted in: zero for the next launch
        __threadfence();   // the other parts' sums, published before their counts, are read after them
      }
      finisher[consumer] = is_last ? 1 : 0;
    }
    hopper::named_barrier_sync(2 + consumer, 128);
    if (!*static_cast<volatile int*>(&finisher[consumer])) {
      if constexpr (TIMELINE) record_segment<BT, ROWS>(p, seg, token_tiles, segment_start);
      continue;
    }
    __threadfence();
#pragma unroll
    for (int i = 0; i < Shape::ACCUMULATORS; ++i) d[i] = 0.0f;
    for (int c = first; c <= last; ++c) hopper::add_partial_sums(d, partial_of<BT>(p, sk.slot(c, u), consumer));
    store_results<T, BT>(p, n0, m0, d);
    if constexpr (TIMELINE) record_segment<BT, ROWS>(p, seg, token_tiles, segment_start);
  }
}

// The tensor maps of the weights (N rows of K, in ROWS x 64 boxes) and the
// tokens (M rows of K, in BT x 64 boxes).
bool make_maps(const MatmulProblem& p, int rows, int bt, CUtensorMap* map_w, CUtensorMap* map_x) {
  const bool bf16 = p.dtype == ElementType::kBFloat16;
  return hopper::tensor_map(hopper::matrix_key(p.b, p.n, p.k, p.b_stride_n, uint32_t(rows), kBlockK, bf16), map_w) &&
         hopper::tensor_map(hopper::matrix_key(p.a, p.m, p.k, p.a_stride_m, uint32_t(bt), kBlockK, bf16), map_x);
}

// The token tile (BT) a launch takes for M tokens: the narrowest that holds
// them all, or several tiles of 256 for more tokens.
int token_tile_for(int64_t m) { return m <= 8 ? 8 : m <= 16 ? 16 : m <= 32 ? 32 : m <= 64 ? 64 : m <= 128 ? 128 : 256; }

// Calls f(std::integral_constant<int, BT>{}) for the token tile of m tokens.
template <typename F>
auto with_token_tile(int64_t m, F&& f) {
  switch (token_tile_for(m)) {
    case 8: return f(std::integral_constant<int, 8>{});
    case 16: return f(std::integral_constant<int, 16>{});
    case 32: return f(std::integral_constant<int, 32>{});
    case 64: return f(std::integral_constant<int, 64>{});
    case 128: return f(std::integral_constant<int, 128>{});
    default: return f(std::integral_constant<int, 256>{});  // more tokens: several token tiles
  }
}

// The clustered cut needs CUDA 13's toolkit: CUDA 12 builds of this
// project's other cluster kernels (wgmma_persistent's pairs) fault, and
// these run the stream-K cut everywhere.
constexpr bool kClusteredCutBuilt = __CUDACC_VER_MAJOR__ >= 13;

// How a launch cuts the work: `ctas` CTAs (stretches), in clusters of
// `cluster` CTAs for the clustered cut (`cluster` CTAs a tile), else 1, over
// tiles of `rows` weight rows (64 only in the clustered cut).
struct WorkCut {
  int64_t ctas;
  int cluster;
  int rows;
};

// Clusters of `cluster` CTAs (1 to 8) of the kernel that can be resident at
// once (the GPCs' layout decides: an H100's 132 SMs hold 32 clusters of 3
// such CTAs but fewer than 32 of 4), 0 where the runtime will not say: asked
// once per kernel, device and cluster size, as the query costs microseconds
// of host time.
template <auto kKernel>
int64_t resident_clusters_of(int cluster, int smem_bytes, int device) {
  static int known[128][8] = {};  // + 1: asked
  const bool cacheable = device >= 0 && device < 128;
  if (cacheable && known[device][cluster - 1] > 0) return known[device][cluster - 1] - 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(unsigned(cluster * tc::sm_count(device)));
  config.blockDim = dim3(unsigned(kThreads));
  config.dynamicSmemBytes = size_t(smem_bytes);
  cudaLaunchAttribute dims;
  dims.id = cudaLaunchAttributeClusterDimension;
  dims.val.clusterDim.x = unsigned(cluster);
  dims.val.clusterDim.y = 1;
  dims.val.clusterDim.z = 1;
  config.attrs = &dims;
  config.numAttrs = 1;
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, kKernel, &config) != cudaSuccess || clusters < 0) {
    cudaGetLastError();  // clear it: this cluster size is not used
    clusters = 0;
  }
  if (cacheable) known[device][cluster - 1] = clusters + 1;
  return clusters;
}

// Whether `tiles` clusters of `cluster` CTAs of the kernel for ROWS-row tiles
// can all be resident at once.
template <int BT, int ROWS>
bool clusters_resident(int64_t cluster, int64_t tiles, int device) {
  using Shape = StreamKShape<BT, ROWS>;
  constexpr auto kernel = wgmma_streamk_kernel<__nv_bfloat16, BT, ROWS, false>;  // the same resources at every T
  return tc::allow_dynamic_smem<kernel>(Shape::SMEM_BYTES, device) == cudaSuccess &&
         tiles <= resident_clusters_of<kernel>(int(cluster), Shape::SMEM_BYTES, device);
}

// The cut of n weight rows by `token_tiles` token tiles, K deep (k < 1: deep
// enough for every SM): where `clusters` allows, the clustered cut with the
// most CTAs that fits and is resident (streamk_clustered_cut), else stream-K
// over 128-row tiles, one CTA an SM, each with at least one work item (a
// k-block of a tile, as deep at every BT).
constexpr int kItemK = StreamKShape<8, kStreamkTileRows>::BK;
static_assert(kItemK == kStreamkBlockK, "a work item is the k-block the rule in rungs.h counts");
template <int BT>
WorkCut work_cut(int64_t n, int64_t token_tiles, int64_t k, int device, bool clusters) {
  const int64_t sms = tc::sm_count(device);
  const int64_t k_blocks = k < 1 ? sms : ceil_div(k, int64_t(kItemK));
  if (kClusteredCutBuilt && clusters) {
    const auto resident = [&](int64_t rows, int64_t cluster, int64_t tiles) {
      return rows == kStreamkTileRows ? clusters_resident<BT, kStreamkTileRows>(cluster, tiles, device)
                                      : clusters_resident<BT, kStreamkHalfTileRows>(cluster, tiles, device);
    };
    const StreamkCut cut = streamk_clustered_cut(n, token_tiles, k_blocks, sms, resident);
    if (cut.ctas > 0) return {cut.ctas, int(cut.cluster), int(cut.rows)};
  }
  const int64_t tiles = ceil_div(n, int64_t(kStreamkTileRows)) * token_tiles;
  return {k < 1 ? sms : min_i64(tiles * k_blocks, sms), 1, kStreamkTileRows};
}

template <typename T, int BT, int ROWS, bool TIMELINE>
cudaError_t launch_cut(const MatmulProblem& p, const WorkCut& cut, cudaStream_t stream, int device) {
  using Shape = StreamKShape<BT, ROWS>;
  constexpr auto kernel = wgmma_streamk_kernel<T, BT, ROWS, TIMELINE>;
  if (cudaError_t err = tc::allow_dynamic_smem<kernel>(Shape::SMEM_BYTES, device)) return err;
  CUtensorMap map_w, map_x;
  if (!make_maps(p, ROWS, BT, &map_w, &map_x)) return cudaErrorInvalidValue;
  return hopper::launch_programmatic_in_clusters(kernel, dim3(unsigned(cut.ctas)), dim3(kThreads), Shape::SMEM_BYTES,
                                                 unsigned(cut.cluster), stream, map_w, map_x, p);
}

template <typename T, int BT, bool TIMELINE>
cudaError_t launch_typed(const MatmulProblem& p, cudaStream_t stream, int device) {
  const WorkCut cut = work_cut<BT>(p.n, ceil_div(p.m, BT), p.k, device, p.cluster_size != 1);
  return cut.rows == kStreamkHalfTileRows ? launch_cut<T, BT, kStreamkHalfTileRows, TIMELINE>(p, cut, stream, device)
                                          : launch_cut<T, BT, kStreamkTileRows, TIMELINE>(p, cut, stream, device);
}

template <typename T>
cudaError_t launch_for(const MatmulProblem& p, cudaStream_t stream, int device) {
  return with_token_tile(p.m, [&](auto bt) {
    return p.timeline != nullptr ? launch_typed<T, decltype(bt)::value, true>(p, stream, device)
                                 : launch_typed<T, decltype(bt)::value, false>(p, stream, device);
  });
}

}  // namespace

cudaError_t launch_wgmma_streamk(const MatmulProblem& problem, cudaStream_t stream) {
  if (problem.m == 0 || problem.n == 0) return cudaSuccess;
  if (!splitk_operands_ok(problem) || problem.partials == nullptr || problem.partial_flags == nullptr) {
    return cudaErrorInvalidValue;
  }
  int device = 0;
  if (cudaError_t err = cudaGetDevice(&device)) return err;
  return problem.dtype == ElementType::kBFloat16 ? launch_for<__nv_bfloat16>(problem, stream, device)
                                                 : launch_for<__half>(problem, stream, device);
}

bool wgmma_streamk_clusters_built() { return kClusteredCutBuilt; }

TileConfig wgmma_streamk_tile_config(int64_t m, int64_t n, int64_t k, int device, bool clusters) {
  TileConfig cfg;
  cfg.block_m = token_tile_for(m);
  cfg.block_k = kItemK;
  const WorkCut cut = with_token_tile(
      m, [&](auto bt) { return work_cut<decltype(bt)::value>(n, ceil_div(m, cfg.block_m), k, device, clusters); });
  cfg.block_n = cut.rows;
  cfg.tiles = ceil_div(m, cfg.block_m) * ceil_div(n, int64_t(cut.rows));
  cfg.persistent_ctas = cut.ctas;
  cfg.cluster_size = cut.cluster;
  cfg.timeline_rows = cfg.tiles + cfg.persistent_ctas;
  return cfg;
}

}  // namespace persistent_matmul
