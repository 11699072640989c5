// Rung 7 — splitk: skinny products (decode shapes: a few to 64 tokens) on tensor cores.
//
// With a few rows of activations, a product is bound by reading the weights
// once, and one CTA per 128-row output tile leaves most SMs idle (M = 16,
// N = 4096: 16 tiles of 128 x 256 for 132 SMs). Over the tile rungs this one
// * swaps A and B: the weights (B stored K-major, as nn.Linear keeps them) are
//   the 16-row A operand of mma.sync m16n8k16 and the tokens its 8-column B
//   operand, so a product of 1 to 8 tokens needs one MMA per 16 weight rows
//   and k-step of 16, not a 128-row tile of padding;
// * gives every CTA 16 weight rows (16 output columns) and all of K, split
//   over its 8 warps: N / 16 CTAs (4096 rows: 256, several per SM), each warp
//   streaming its own stretch of K;
// * streams the weights from global memory straight into registers, DEPTH
//   k-steps ahead, with no shared memory: a k-step is 64 elements, so the
//   4 lanes that share a row read 128 contiguous bytes of it. A dot product's
//   terms may be summed in any order, so a lane's 16 consecutive elements of
//   a row are simply its A fragments of four MMAs (k slots 2c, 2c+1, 2c+8,
//   2c+9 of each), and the tokens' elements are loaded in the same
//   permutation as B fragments: no shuffles, no ldmatrix;
// * sums the warps' partial products through shared memory in a fixed order
//   (deterministic results), adds the bias in fp32 and rounds once;
// * where the units of 16 rows leave the last round of CTAs short (6144 rows:
//   384 units on 264 CTAs), cuts each unit's K over several CTAs, whose sums
//   the last of them to finish adds in a fixed order (KCut below).
// Blocks of up to 64 tokens run one after another (or side by side, on more
// CTAs: grid y), each reading all of its CTA's weight rows again: correct for
// any M, fast where M is small (rungs.h: what kernel="auto" gives it).
//
// Operands: A (tokens, M x K) K-contiguous, B K-major (N rows of K), leading
// dims multiples of 8 elements, 16-byte aligned data (tensor_core_operands_ok
// with a K-major B); bf16 or fp16. The last k-step, where K ends inside it,
// is read element by element, so nothing past the end of a row is addressed.
#include "device_helpers.cuh"
#include "hopper_helpers.cuh"  // mbarriers (sm_90 PTX; the bulk kernel only)
#include "matmul_problem.h"
#include "tensor_core_launch.cuh"  // operand layout checks, sm_count, allow_dynamic_smem

namespace persistent_matmul {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kRows = 16;   // weight rows (output columns) per CTA: one MMA's M
constexpr int kStepK = 64;  // K per k-step: 128 bytes of a row, 16 elements per lane

// 16 bytes from global memory. Weights are read once: they bypass L1. The
// tokens' rows are read by every CTA: they are kept there.
__device__ __forceinline__ uint4 load_streaming(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ uint4 load_cached(const void* p) { return __ldg(static_cast<const uint4*>(p)); }

// Elements [k, k + 16) of a row of `k_end` elements as two 16-byte halves,
// zeros past k_end, reading element by element (the last k-step only).
template <typename T>
__device__ __forceinline__ void load_row_tail(uint4 (&out)[2], const T* row, int64_t k, int64_t k_end) {
  uint16_t bits[16];
#pragma unroll
  for (int e = 0; e < 16; ++e) {
    bits[e] = k + e < k_end ? reinterpret_cast<const uint16_t*>(row)[k + e] : uint16_t(0);
  }
  uint32_t* words = reinterpret_cast<uint32_t*>(out);
#pragma unroll
  for (int i = 0; i < 8; ++i) words[i] = uint32_t(bits[2 * i]) | (uint32_t(bits[2 * i + 1]) << 16);
}

__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// One k-step's registers of a lane: its 16 elements of weight rows g and
// g + 8 (w[row][half]), loaded DEPTH k-steps ahead, and of token 8j + g for
// each of the GROUPS token groups (x[j][half]), loaded when the step is
// multiplied: they are L1 and L2 hits, and registers are what bounds how
// many warps, and so how many weight bytes, an SM keeps in flight.
struct WeightRegs {
  uint4 w[2][2];
};
template <int GROUPS>
struct TokenRegs {
  uint4 x[GROUPS][2];
};

template <typename T, int GROUPS>
struct Lane {
  const T* w_rows[2];       // weight rows g and g + 8 of this CTA, nullptr past N
  const T* x_rows[GROUPS];  // token rows 8j + g, nullptr past M
  int col;                  // 16 * (lane % 4): this lane's first element of a k-step

  __device__ __forceinline__ void load_weights(WeightRegs& r, int64_t k0) const {
    const int64_t k = k0 + col;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        r.w[i][h] = w_rows[i] ? load_streaming(w_rows[i] + k + 8 * h) : make_uint4(0, 0, 0, 0);
      }
    }
  }

  __device__ __forceinline__ void load_tokens(TokenRegs<GROUPS>& r, int64_t k0) const {
    const int64_t k = k0 + col;
#pragma unroll
    for (int j = 0; j < GROUPS; ++j) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        r.x[j][h] = x_rows[j] ? load_cached(x_rows[j] + k + 8 * h) : make_uint4(0, 0, 0, 0);
      }
    }
  }

  __device__ __forceinline__ void load_tail(WeightRegs& w, TokenRegs<GROUPS>& x, int64_t k0, int64_t k_end) const {
    const int64_t k = k0 + col;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      w.w[i][0] = w.w[i][1] = make_uint4(0, 0, 0, 0);
      if (w_rows[i]) load_row_tail(w.w[i], w_rows[i], k, k_end);
    }
#pragma unroll
    for (int j = 0; j < GROUPS; ++j) {
      x.x[j][0] = x.x[j][1] = make_uint4(0, 0, 0, 0);
      if (x_rows[j]) load_row_tail(x.x[j], x_rows[j], k, k_end);
    }
  }
};

// The four MMAs of a k-step: MMA q takes the lane's elements 4q .. 4q + 3 of
// the step (half q / 2, words 2 (q % 2) and 2 (q % 2) + 1) as k slots
// (2c, 2c + 1) and (2c + 8, 2c + 9), in the weights and the tokens alike.
template <typename T, int GROUPS>
__device__ __forceinline__ void multiply(float (&acc)[GROUPS][4], const WeightRegs& w, const TokenRegs<GROUPS>& x) {
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const int h = q / 2, lo = 2 * (q % 2), hi = lo + 1;
    const uint32_t a[4] = {word(w.w[0][h], lo), word(w.w[1][h], lo), word(w.w[0][h], hi), word(w.w[1][h], hi)};
#pragma unroll
    for (int j = 0; j < GROUPS; ++j) mma_16816<T>(acc[j], a, word(x.x[j][h], lo), word(x.x[j][h], hi));
  }
}

// ---------------------------------------------------------------- K cut over CTAs
//
// A launch runs its units of 16 weight rows in rounds of as many CTAs as fit
// the GPU at once. Where the last round is short (6144 rows: 384 units for the
// 264 CTAs of two an SM, a second round of 120), each unit's K is cut into
// `parts` equal parts on as many CTAs: 768 halves take 1.5 units' time where
// whole units take 2. Each part writes its sums (over its warps) to its own
// workspace slot and counts itself in on the unit's counter; the part that
// counts in last adds every part's sums in part order (its own from
// registers: the bits it wrote), so the result does not depend on which part
// is last, adds the bias, stores the outputs and sets the counter back to
// zero for the next launch. No CTA waits for another.
struct KCut {
  int64_t units;  // units of 16 weight rows
  int parts;      // parts per unit (1: K is not cut)
  __host__ __device__ int64_t items() const { return units * parts; }
  // Item i of a launch is part i % parts of unit i / parts: a unit's parts run side by side.
  __device__ int64_t unit(int64_t i) const { return i / parts; }
  __device__ int part(int64_t i) const { return int(i % parts); }
  // The first of `count` pieces of K (k-steps, chunks) that part q takes; part q ends where q + 1 begins.
  __device__ int64_t begin(int q, int64_t count) const { return count * q / parts; }
};

// The outputs of a CTA's token block, GROUPS * 8 tokens by 16 weight rows: a workspace slot's floats.
template <int GROUPS>
constexpr int kBlockSums = GROUPS * 4 * 32;

// Where a CTA's part of a unit hands its sums over (KCut); parts == 1: it stores them.
struct PartOfUnit {
  int part = 0, parts = 1;
  uint32_t* counter = nullptr;  // the unit's: zero until its parts count in
  float* slots = nullptr;       // the unit's `parts` slots of kBlockSums floats
};

template <int GROUPS>
__device__ __forceinline__ PartOfUnit part_of_unit(const MatmulProblem& p, const KCut& cut, int64_t item) {
  if (cut.parts == 1) return {};
  const int64_t unit = cut.unit(item);
  return {cut.part(item), cut.parts, p.partial_flags + unit, p.partials + unit * cut.parts * kBlockSums<GROUPS>};
}

// Up to 32 tokens two CTAs fit an SM (at most 128 registers a thread): 16
// warps, each with DEPTH - 1 to DEPTH k-steps of 2 KB of weights in flight.
// The CTA's output: the 8 warps' partial sums of weight rows [n0, n0 + 16) x
// tokens [m0, m0 + 8 GROUPS) through shared memory, added in warp order by the
// thread that stores each output (deterministic), plus the bias, rounded once;
// where K is cut, first handed over to the unit's last part (KCut). Called by
// the kThreads threads of the 8 warps; `sync` is a barrier over them (a
// previous call's sums must have been read before this one overwrites them:
// the caller syncs before).
template <typename T, int GROUPS, typename Sync>
__device__ __forceinline__ void store_sums(float (*partial)[GROUPS * 4][32], const float (&acc)[GROUPS][4], int64_t n0,
                                           int64_t m0, const MatmulProblem& p, const PartOfUnit& cut, Sync sync) {
  constexpr int kSums = kBlockSums<GROUPS>;
  constexpr int kPerThread = (kSums + kThreads - 1) / kThreads;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
#pragma unroll
  for (int j = 0; j < GROUPS; ++j) {
#pragma unroll
    for (int r = 0; r < 4; ++r) partial[warp][4 * j + r][lane] = acc[j][r];
  }
  sync();
  float sums[kPerThread];
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int v = tid + i * kThreads;
    sums[i] = 0.0f;
    if (v >= kSums) continue;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) sums[i] += partial[w][v / 32][v % 32];
  }
  if (cut.parts > 1) {
    __shared__ int is_last;
    float* mine = cut.slots + int64_t(cut.part) * kSums;
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      if (tid + i * kThreads < kSums) __stcg(mine + tid + i * kThreads, sums[i]);
    }
    __threadfence();  // this thread's sums are visible before its CTA counts in
    sync();           // ... and every thread's, before thread 0 counts in
    if (tid == 0) {
      const bool last = atomicAdd(cut.counter, 1u) == uint32_t(cut.parts - 1);
      if (last) {
        *cut.counter = 0;  // every part has counted in: zero for the next launch
        __threadfence();   // the other parts' sums, published before their counts, are read after them
      }
      is_last = last;
    }
    sync();
    if (!*static_cast<volatile int*>(&is_last)) return;
    __threadfence();
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int v = tid + i * kThreads;
      if (v >= kSums) continue;
      float total = 0.0f;
      for (int q = 0; q < cut.parts; ++q) total += q == cut.part ? sums[i] : __ldcg(cut.slots + int64_t(q) * kSums + v);
      sums[i] = total;
    }
  }
  const T* bias = static_cast<const T*>(p.bias);
  T* out = static_cast<T*>(p.out);
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int v = tid + i * kThreads;
    const int r = v / 32, l = v % 32;
    // Accumulator r % 4 of group r / 4 in lane l: weight row l / 4 (+ 8 for
    // r % 4 >= 2), token 8 (r / 4) + 2 (l % 4) (+ 1 for odd r).
    const int64_t n = n0 + l / 4 + 8 * ((r % 4) / 2);
    const int64_t m = m0 + 8 * (r / 4) + 2 * (l % 4) + (r % 2);
    if (v >= kSums || n >= p.n || m >= p.m) continue;
    float sum = sums[i];
    if (bias != nullptr) sum += to_float(bias[n]);
    out[m * p.out_stride_m + n * p.out_stride_n] = from_float<T>(sum);
  }
}

// One CTA: weight rows [n0, n0 + 16) of item blockIdx.x's unit (its part of
// K: KCut) against each block of 8 * GROUPS tokens it is given (blockIdx.y,
// then every gridDim.y-th block: any M is covered; K is cut only where one
// block holds every token).
template <typename T, int GROUPS, int DEPTH>
__global__ void __launch_bounds__(kThreads, GROUPS <= 4 ? 2 : 1) splitk_kernel(MatmulProblem p, KCut cut) {
  constexpr int kTokens = 8 * GROUPS;
  __shared__ float partial[kWarps][GROUPS * 4][32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4;
  const int64_t item = blockIdx.x;
  const int64_t n0 = cut.unit(item) * kRows;
  const PartOfUnit handover = part_of_unit<GROUPS>(p, cut, item);

  // This warp's k-steps [s_begin, s_end) of the part's; a partial last step of K is the tail.
  const int64_t steps = ceil_div(p.k, kStepK);
  const int64_t part_begin = cut.begin(handover.part, steps), part_steps = cut.begin(handover.part + 1, steps) - part_begin;
  const int64_t s_begin = part_begin + part_steps * warp / kWarps, s_end = part_begin + part_steps * (warp + 1) / kWarps;
  const bool has_tail = s_end == steps && p.k % kStepK != 0 && s_end > s_begin;
  const int64_t s_full_end = has_tail ? s_end - 1 : s_end;

  Lane<T, GROUPS> me;
  me.col = 16 * (lane % 4);
  const T* w = static_cast<const T*>(p.b);  // b is K x N, K-major: row n of the weights at n * b_stride_n
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int64_t n = n0 + g + 8 * i;
    me.w_rows[i] = n < p.n ? w + n * p.b_stride_n : nullptr;
  }
  const T* x = static_cast<const T*>(p.a);

  auto token_block = [&](int64_t m0) {
#pragma unroll
    for (int j = 0; j < GROUPS; ++j) {
      const int64_t m = m0 + 8 * j + g;
      me.x_rows[j] = m < p.m ? x + m * p.a_stride_m : nullptr;
    }
    float acc[GROUPS][4] = {};
    WeightRegs ring[DEPTH];
#pragma unroll
    for (int i = 0; i < DEPTH; ++i) {
      if (s_begin + i < s_full_end) me.load_weights(ring[i], (s_begin + i) * kStepK);
    }
    for (int64_t s = s_begin; s < s_full_end; s += DEPTH) {
#pragma unroll
      for (int i = 0; i < DEPTH; ++i) {
        if (s + i < s_full_end) {
          TokenRegs<GROUPS> tokens;
          me.load_tokens(tokens, (s + i) * kStepK);
          multiply<T, GROUPS>(acc, ring[i], tokens);
          if (s + i + DEPTH < s_full_end) me.load_weights(ring[i], (s + i + DEPTH) * kStepK);
        }
      }
    }
    if (has_tail) {
      WeightRegs wt;
      TokenRegs<GROUPS> tokens;
      me.load_tail(wt, tokens, s_full_end * kStepK, p.k);
      multiply<T, GROUPS>(acc, wt, tokens);
    }

    __syncthreads();  // a previous token block's sums have been read
    store_sums<T, GROUPS>(partial, acc, n0, m0, p, handover, [] { __syncthreads(); });
  };
  // Up to 32 tokens a launch has one block of them per CTA (no loop: a loop
  // keeps the pointers live across it, and ptxas spills registers).
  if constexpr (GROUPS < 8) {
    token_block(int64_t(blockIdx.y) * kTokens);
  } else {
    for (int64_t m0 = int64_t(blockIdx.y) * kTokens; m0 < p.m; m0 += int64_t(gridDim.y) * kTokens) token_block(m0);
  }
}

// ---------------------------------------------------------------- sm_90 and newer: bulk copies
//
// The same CTA work with the weights moved by the copy engine: a producer warp
// issues one bulk copy (cp.async.bulk, completing on an mbarrier) per weight
// row and 512-element chunk of K into a ring of STAGES shared-memory stages,
// and the 8 consumer warps each read their 64 elements of a stage (the
// warp whose elements hold the end of K reads them from global memory). A bulk copy
// of 1 KB is one request, where the registers' path needs 64 of 16 bytes: an
// SM keeps far more bytes in flight (the register kernel streamed 1.5 TB/s at
// N = 4096 on the H200, where every CTA had to fill its pipeline at once).
// CTAs are persistent: each walks items, units of 16 weight rows or parts of
// them (KCut; blockIdx.x, then every gridDim.x-th), the producer running
// ahead across items.

constexpr int kChunkK = kWarps * kStepK;       // 512 elements of K per stage
constexpr int kRowPitch = kChunkK * 2 + 16;    // bytes per weight row in a stage: padded against bank conflicts
constexpr int kStageBytes = kRows * kRowPitch;
// More tokens: the register kernel. Each CTA reads the tokens again for every
// unit of 16 rows, and from 16 tokens on that traffic outweighs the weights'
// (H200, CUDA graphs, 4096 x 14336 weights: 57 us at M = 16 against the
// register kernel's 40 us at M = 32).
constexpr int kBulkMaxTokens = 8;

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(hopper::smem_u32(bar))
               : "memory");
}

#endif

template <int GROUPS, int STAGES>
struct BulkSmem {
  static constexpr int kBarriers = STAGES * 16;  // full, then empty mbarriers
  static constexpr int kPartialBytes = kWarps * GROUPS * 4 * 32 * 4;
  static constexpr int kBytes = STAGES * kStageBytes + kBarriers + kPartialBytes;
};

template <typename T, int GROUPS, int STAGES>
__global__ void __launch_bounds__(kThreads + 32) splitk_bulk_kernel(MatmulProblem p, KCut cut) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) unsigned char smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + STAGES * kStageBytes);
  uint64_t* empty = full + STAGES;
  auto partial = reinterpret_cast<float (*)[GROUPS * 4][32]>(smem + STAGES * kStageBytes + 16 * STAGES);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t chunks = ceil_div(p.k, kChunkK);
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) {
      hopper::mbarrier_init(&full[s], 1);
      hopper::mbarrier_init(&empty[s], kThreads);
    }
    hopper::fence_barrier_init();
  }
  __syncthreads();
  const T* w = static_cast<const T*>(p.b);  // row n of the weights at n * b_stride_n

  if (warp == kWarps) {  // the producer warp: one thread issues every copy
    if (lane != 0) return;
    const uint32_t base = hopper::smem_u32(smem);
    int64_t it = 0;
    for (int64_t item = blockIdx.x; item < cut.items(); item += gridDim.x) {
      const int64_t n0 = cut.unit(item) * kRows;
      const int rows = int(min_i64(kRows, p.n - n0));
      const int part = cut.part(item);
      for (int64_t c = cut.begin(part, chunks); c < cut.begin(part + 1, chunks); ++c, ++it) {
        const int s = int(it % STAGES);
        if (it >= STAGES) hopper::mbarrier_wait(&empty[s], uint32_t(((it / STAGES) - 1) & 1));
        // Whole 16-byte pieces of K only: nothing past a row's last element is
        // read (a 1 x 1 operand is 2 bytes). The warp whose 64 elements K
        // ends in reads them from global memory instead.
        const int64_t k0 = c * kChunkK;
        const uint32_t bytes = uint32_t(min_i64(kChunkK, p.k - k0) / 8 * 16);
        hopper::mbarrier_arrive_expect_tx(&full[s], bytes * uint32_t(rows));
        for (int r = 0; r < rows; ++r) {
          bulk_load(base + uint32_t(s * kStageBytes + r * kRowPitch), w + (n0 + r) * p.b_stride_n + k0, bytes,
                    &full[s]);
        }
      }
    }
    return;
  }

  const int g = lane / 4, col = 8 * (lane % 4);
  const T* x = static_cast<const T*>(p.a);
  const T* x_rows[GROUPS];
#pragma unroll
  for (int j = 0; j < GROUPS; ++j) x_rows[j] = 8 * j + g < p.m ? x + (8 * j + g) * p.a_stride_m : nullptr;
  // This warp's slice of a chunk's tokens, zeros past K (the same for every unit).
  auto load_tokens = [&](int64_t c, TokenRegs<GROUPS>& tokens) {
    const int64_t k = c * kChunkK + kStepK * warp + col;
#pragma unroll
    for (int j = 0; j < GROUPS; ++j) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        tokens.x[j][h] = make_uint4(0, 0, 0, 0);
        if (x_rows[j] == nullptr || k + 32 * h >= p.k) continue;
        if (k + 32 * h + 8 <= p.k) {
          tokens.x[j][h] = load_cached(x_rows[j] + k + 32 * h);
        } else {
          uint4 half[2];
          load_row_tail(half, x_rows[j], k + 32 * h, p.k);
          tokens.x[j][h] = half[0];
        }
      }
    }
  };
  // The tokens of the next chunk are loaded while this one is multiplied:
  // waiting for them (L2 hits, but behind the weights' traffic) each chunk
  // made the consumers, not the copies, set the pace from 16 tokens on.
  // An item's first chunk (0 past the last item: loaded, never used).
  auto first_chunk = [&](int64_t item) { return item < cut.items() ? cut.begin(cut.part(item), chunks) : 0; };
  TokenRegs<GROUPS> next;
  load_tokens(first_chunk(blockIdx.x), next);
  int64_t it = 0;
  for (int64_t item = blockIdx.x; item < cut.items(); item += gridDim.x) {
    const int64_t unit = cut.unit(item);
    const int part = cut.part(item);
    const int64_t c_end = cut.begin(part + 1, chunks);
    float acc[GROUPS][4] = {};
    for (int64_t c = cut.begin(part, chunks); c < c_end; ++c, ++it) {
      const int s = int(it % STAGES);
      hopper::mbarrier_wait(&full[s], uint32_t((it / STAGES) & 1));
      const int64_t k = c * kChunkK + kStepK * warp;  // this warp's 64 elements of the chunk
      WeightRegs wr;
      if (k + kStepK <= p.k) {
        const unsigned char* stage = smem + s * kStageBytes + 2 * (kStepK * warp + col);
#pragma unroll
        for (int i = 0; i < 2; ++i) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            wr.w[i][h] = *reinterpret_cast<const uint4*>(stage + (g + 8 * i) * kRowPitch + 64 * h);
          }
        }
      }
      // Every thread frees the stage after its own reads (the barrier counts
      // all consumer threads, so no read is ordered only through a lane's peers).
      hopper::mbarrier_arrive(&empty[s]);
      const TokenRegs<GROUPS> tokens = next;
      load_tokens(c + 1 < c_end ? c + 1 : first_chunk(item + gridDim.x), next);
      if (k >= p.k) continue;  // past K: this warp has nothing in the last chunk
      if (k + kStepK > p.k) {  // K ends in these 64 elements: read them from global memory, zeros past K
        const int64_t unit_n0 = unit * kRows;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int64_t n = unit_n0 + g + 8 * i;
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            uint4 half[2] = {make_uint4(0, 0, 0, 0), make_uint4(0, 0, 0, 0)};
            const int64_t first = k + col + 32 * h;
            if (n < p.n && first < p.k) load_row_tail(half, w + n * p.b_stride_n, first, min_i64(p.k, first + 8));
            wr.w[i][h] = half[0];
          }
        }
      }
      multiply<T, GROUPS>(acc, wr, tokens);
    }
    hopper::named_barrier_sync(1, kThreads);  // the previous item's sums have been read (the producer warp takes no part)
    store_sums<T, GROUPS>(partial, acc, unit * kRows, 0, p, part_of_unit<GROUPS>(p, cut, item),
                          [] { hopper::named_barrier_sync(1, kThreads); });
  }
#else
  __trap();  // launched only on compute capability 9.0 and newer
#endif
}

constexpr int64_t kMaxGridY = 65535;  // CUDA's limit on gridDim.y; the kernel loops over the rest

// CTAs of `kKernel` that fit on one SM at once, asked of the runtime once per
// kernel and device (the query costs host time on every call otherwise).
template <auto kKernel>
int resident_ctas(int threads, int smem_bytes, int device) {
  static int cached[128] = {};
  const bool cacheable = device >= 0 && device < 128;
  if (cacheable && cached[device] > 0) return cached[device];
  int ctas = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, kKernel, threads, size_t(smem_bytes)) != cudaSuccess ||
      ctas < 1) {
    cudaGetLastError();  // clear it: the launch reports real errors
    return 1;
  }
  if (cacheable) cached[device] = ctas;
  return ctas;
}

// The parts of KCut: at most 8 (the last part adds as many slots), each at
// least 2 chunks of K long (1024 elements: shorter ones fill and drain the
// ring for little).
constexpr int kMaxParts = 8;
constexpr int64_t kMinChunksPerPart = 2;

// The parts per unit for `units` units of K elements on `slots` CTAs at once:
// the cut with the fewest rounds (a round of parts takes 1 / parts of a
// unit's time), where it saves at least a tenth of the uncut launch's time and
// the workspace of `sms` SMs holds the units' counters and slots of
// `slot_floats` floats.
int parts_for(int64_t units, int64_t k, int64_t slots, int64_t slot_floats, int64_t sms) {
  const int64_t most = min_i64(kMaxParts, ceil_div(k, kChunkK) / kMinChunksPerPart);
  const int64_t whole_rounds = ceil_div(units, slots);
  int best = 1;
  int64_t best_rounds = whole_rounds;  // rounds of `best` parts
  for (int q = 2; q <= most; ++q) {
    const int64_t rounds = ceil_div(units * q, slots);
    if (rounds * best < best_rounds * q) best = q, best_rounds = rounds;
  }
  const bool pays = 10 * best_rounds <= 9 * whole_rounds * best;
  const bool fits = units <= sms * kSplitFlagsPerSm && units * best * slot_floats * 4 <= sms * kPartialBytesPerSm;
  return pays && fits ? best : 1;
}

// The bulk kernel's ring: 4 stages of 16 KB. Its registers (87 a thread)
// allow two CTAs an SM either way; against 6 stages (200 KB of weights in
// flight an SM where these keep 133 KB) it ran 1.00-1.09x as fast at 1-8
// tokens on every projection measured, while deeper rings of one CTA an SM
// (9 or 12 stages) lost up to 30% on the long ones. H100, CUDA graphs,
// M = 1/2/4/8, us a call, 6 -> 4 stages: 8B qkv 23.6-23.9 -> 22.3-22.9,
// 8B o 16.0-16.2 -> 15.0-15.3, 70B o 50.8-52.1 -> 50.5-51.1, 8B down
// 45.2-45.7 -> 44.4-44.7 (benchmarks/NOTES.md, "Why a split-K rung for decode").
constexpr int kBulkStages = 4;

// The bulk kernel runs up to kBulkMaxTokens tokens on GPUs with bulk copies
// (compute capability 9.0 and newer) whose CTAs can have 100 KB of shared
// memory (not sm_120's 99 KB: the ring's depth was measured on Hopper only).
constexpr int kBulkMinSmemPerBlock = 100 * 1024;
static_assert(BulkSmem<1, kBulkStages>::kBytes <= kBulkMinSmemPerBlock, "the ring fits where the bulk kernel runs");

// A launch of this rung: the bulk kernel (GROUPS == 0), or the register
// kernel with GROUPS groups of 8 tokens a CTA.
template <typename T, int GROUPS>
struct Launch {
  static constexpr bool kBulk = GROUPS == 0;
  static constexpr int kGroups = kBulk ? 1 : GROUPS;
  static constexpr auto kKernel = kBulk ? splitk_bulk_kernel<T, 1, kBulkStages>
                                        : splitk_kernel<T, kGroups, kGroups <= 2 ? 4 : 2>;
  static constexpr int kLaunchThreads = kBulk ? kThreads + 32 : kThreads;
  static constexpr int kSmemBytes = kBulk ? BulkSmem<1, kBulkStages>::kBytes : 0;  // dynamic shared memory

  // The CTAs that fit the GPU at once; K's cut for them (uncut without the
  // workspace, or where a CTA takes several blocks of tokens).
  static int64_t slots(int device) {
    return int64_t(resident_ctas<kKernel>(kLaunchThreads, kSmemBytes, device)) * tc::sm_count(device);
  }
  static KCut cut(const MatmulProblem& p, int device, bool workspace) {
    const int64_t units = ceil_div(p.n, kRows);
    if (!workspace || p.m > 8 * kGroups) return {units, 1};
    return {units, parts_for(units, p.k, slots(device), kBlockSums<kGroups>, tc::sm_count(device))};
  }

  static cudaError_t run(const MatmulProblem& p, cudaStream_t stream, int device) {
    if constexpr (kBulk) {
      if (cudaError_t err = tc::allow_dynamic_smem<kKernel>(kSmemBytes, device)) return err;
    }
    const KCut c = cut(p, device, p.partials != nullptr && p.partial_flags != nullptr);
    // The bulk kernel's CTAs are persistent: one per item up to what fits.
    const dim3 grid = kBulk ? dim3(unsigned(min_i64(c.items(), slots(device))))
                            : dim3(unsigned(c.items()), unsigned(min_i64(ceil_div(p.m, 8 * kGroups), kMaxGridY)));
    kKernel<<<grid, dim3(kLaunchThreads), kSmemBytes, stream>>>(p, c);
    return cudaGetLastError();
  }
};

// Calls `visit` with the Launch that M tokens take: the bulk kernel where it
// runs, else the register kernel of the narrowest token block that holds
// them (every block of 64 in turn past 32 tokens).
template <typename T, typename Visit>
auto with_launch(const MatmulProblem& p, int device, Visit&& visit) {
  if (tc::cached_device_attribute<cudaDevAttrComputeCapabilityMajor, 0>(device) >= 9 && p.m <= kBulkMaxTokens &&
      tc::max_smem_per_block(device) >= kBulkMinSmemPerBlock) {
    return visit(Launch<T, 0>{});
  }
  if (p.m <= 8) return visit(Launch<T, 1>{});
  if (p.m <= 16) return visit(Launch<T, 2>{});
  if (p.m <= 32) return visit(Launch<T, 4>{});
  return visit(Launch<T, 8>{});
}

template <typename Visit>
auto with_typed_launch(const MatmulProblem& p, int device, Visit&& visit) {
  return p.dtype == ElementType::kBFloat16 ? with_launch<__nv_bfloat16>(p, device, visit)
                                           : with_launch<__half>(p, device, visit);
}

}  // namespace

bool splitk_operands_ok(const MatmulProblem& p) {
  return tc::operands_ok(p) && tc::b_layout(p) == tc::BLayout::kKMajor;
}

cudaError_t launch_splitk(const MatmulProblem& problem, cudaStream_t stream) {
  if (problem.m == 0 || problem.n == 0) return cudaSuccess;
  if (!splitk_operands_ok(problem)) return cudaErrorInvalidValue;
  int device = 0;
  if (cudaError_t err = cudaGetDevice(&device)) return err;
  return with_typed_launch(problem, device, [&](auto launch) { return launch.run(problem, stream, device); });
}

int splitk_parts(int64_t m, int64_t n, int64_t k, ElementType dtype, int device) {
  if (m < 1 || n < 1 || k < 1) return 1;
  MatmulProblem shape;
  shape.m = m;
  shape.n = n;
  shape.k = k;
  shape.dtype = dtype;
  return with_typed_launch(shape, device, [&](auto launch) { return launch.cut(shape, device, true).parts; });
}

}  // namespace persistent_matmul
