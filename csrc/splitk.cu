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
//   (deterministic results), adds the bias in fp32 and rounds once.
// Blocks of up to 64 tokens run one after another (or side by side, on more
// CTAs: grid y), each reading all of its CTA's weight rows again: correct for
// any M, fast where M is small (rungs.h: what kernel="auto" gives it).
// On compute capability 9.0 and newer each launch is a programmatic dependent
// launch, as the Hopper rungs' are: its CTAs set up while the kernel before
// them finishes, which a call of 15-25 us feels (eager, one process: 1.02-1.19x
// the speed of plain launches; benchmarks/NOTES.md, "Why a programmatic
// dependent launch").
//
// Operands: A (tokens, M x K) K-contiguous, B K-major (N rows of K), leading
// dims multiples of 8 elements, 16-byte aligned data (tensor_core_operands_ok
// with a K-major B); bf16 or fp16. The last k-step, where K ends inside it,
// is read element by element, so nothing past the end of a row is addressed.
#include "device_helpers.cuh"
#include "hopper_helpers.cuh"  // mbarriers (sm_90 PTX; the bulk kernel only), programmatic launches
#include "matmul_problem.h"
#include "tensor_core_launch.cuh"  // operand layout checks, sm_count, allow_dynamic_smem

namespace persistent_matmul {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kRows = int(kSplitkRowsPerCta);  // weight rows (output columns) per CTA
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

// Up to 32 tokens two CTAs fit an SM (at most 128 registers a thread): 16
// warps, each with DEPTH - 1 to DEPTH k-steps of 2 KB of weights in flight.
// The CTA's output: the 8 warps' partial sums of weight rows [n0, n0 + 16) x
// tokens [m0, m0 + 8 GROUPS) through shared memory, added in warp order by the
// thread that stores each output (deterministic), plus the bias, rounded once.
// `sync` is a barrier over the `threads` threads that call this (a previous
// call's sums must have been read before this one overwrites them: the caller
// syncs before).
template <typename T, int GROUPS, typename Sync>
__device__ __forceinline__ void store_sums(float (*partial)[GROUPS * 4][32], const float (&acc)[GROUPS][4], int64_t n0,
                                           int64_t m0, const MatmulProblem& p, int tid, int threads, Sync sync) {
  const int warp = tid / 32, lane = tid % 32;
#pragma unroll
  for (int j = 0; j < GROUPS; ++j) {
#pragma unroll
    for (int r = 0; r < 4; ++r) partial[warp][4 * j + r][lane] = acc[j][r];
  }
  sync();
  const T* bias = static_cast<const T*>(p.bias);
  T* out = static_cast<T*>(p.out);
  for (int v = tid; v < GROUPS * 4 * 32; v += threads) {
    const int r = v / 32, l = v % 32;
    // Accumulator r % 4 of group r / 4 in lane l: weight row l / 4 (+ 8 for
    // r % 4 >= 2), token 8 (r / 4) + 2 (l % 4) (+ 1 for odd r).
    const int64_t n = n0 + l / 4 + 8 * ((r % 4) / 2);
    const int64_t m = m0 + 8 * (r / 4) + 2 * (l % 4) + (r % 2);
    if (n >= p.n || m >= p.m) continue;
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) sum += partial[w][r][l];
    if (bias != nullptr) sum += to_float(bias[n]);
    out[m * p.out_stride_m + n * p.out_stride_n] = from_float<T>(sum);
  }
}

// One CTA: weight rows [n0, n0 + 16) against each block of 8 * GROUPS tokens
// it is given (blockIdx.y, then every gridDim.y-th block: any M is covered).
template <typename T, int GROUPS, int DEPTH>
__global__ void __launch_bounds__(kThreads, GROUPS <= 4 ? 2 : 1) splitk_kernel(MatmulProblem p) {
  constexpr int kTokens = 8 * GROUPS;
  __shared__ float partial[kWarps][GROUPS * 4][32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4;
  const int64_t n0 = int64_t(blockIdx.x) * kRows;
  hopper::wait_for_prior_grids();  // a no-op in the code for GPUs before 9.0, launched without the overlap

  // This warp's k-steps [s_begin, s_end); a partial last step of K is the tail.
  const int64_t steps = ceil_div(p.k, kStepK);
  const int64_t s_begin = steps * warp / kWarps, s_end = steps * (warp + 1) / kWarps;
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
    store_sums<T, GROUPS>(partial, acc, n0, m0, p, threadIdx.x, kThreads, [] { __syncthreads(); });
  };
  // Up to 32 tokens a launch has one block of them per CTA (no loop: a loop
  // keeps the pointers live across it, and ptxas spills registers).
  if constexpr (GROUPS < 8) {
    token_block(int64_t(blockIdx.y) * kTokens);
  } else {
    for (int64_t m0 = int64_t(blockIdx.y) * kTokens; m0 < p.m; m0 += int64_t(gridDim.y) * kTokens) token_block(m0);
  }
  // Only once every CTA is here or done: the next grid's CTAs, waiting for
  // this one, take no SM that a CTA of this grid still needs.
  hopper::allow_dependent_grids();
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
// CTAs are persistent: each walks units of 16 weight rows (blockIdx.x, then
// every gridDim.x-th), the producer running ahead across units.

constexpr int kChunkK = kWarps * kStepK;       // 512 elements of K per stage
constexpr int kRowPitch = kChunkK * 2 + 16;    // bytes per weight row in a stage: padded against bank conflicts
constexpr int kStageBytes = kRows * kRowPitch;
// Past kSplitkBulkMaxTokens (matmul_problem.h), the register kernel. Each CTA
// reads the tokens again for every unit of 16 rows, and from 16 tokens on that
// traffic outweighs the weights' (H200, CUDA graphs, 4096 x 14336 weights:
// 57 us at M = 16 against the register kernel's 40 us at M = 32).

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
__global__ void __launch_bounds__(kThreads + 32) splitk_bulk_kernel(MatmulProblem p) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) unsigned char smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + STAGES * kStageBytes);
  uint64_t* empty = full + STAGES;
  auto partial = reinterpret_cast<float (*)[GROUPS * 4][32]>(smem + STAGES * kStageBytes + 16 * STAGES);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t units = ceil_div(p.n, kRows), chunks = ceil_div(p.k, kChunkK);
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) {
      hopper::mbarrier_init(&full[s], 1);
      hopper::mbarrier_init(&empty[s], kThreads);
    }
    hopper::fence_barrier_init();
  }
  __syncthreads();
  // Set up while the kernel before this one finished; it may have written the
  // tokens or the weights.
  hopper::wait_for_prior_grids();
  const T* w = static_cast<const T*>(p.b);  // row n of the weights at n * b_stride_n

  if (warp == kWarps) {  // the producer warp: one thread issues every copy
    if (lane != 0) return;
    const uint32_t base = hopper::smem_u32(smem);
    int64_t it = 0;
    for (int64_t unit = blockIdx.x; unit < units; unit += gridDim.x) {
      const int64_t n0 = unit * kRows;
      const int rows = int(min_i64(kRows, p.n - n0));
      for (int64_t c = 0; c < chunks; ++c, ++it) {
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
    hopper::allow_dependent_grids();  // the next launch may set up while the last stages are used
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
  TokenRegs<GROUPS> next;
  load_tokens(0, next);
  int64_t it = 0;
  for (int64_t unit = blockIdx.x; unit < units; unit += gridDim.x) {
    float acc[GROUPS][4] = {};
    for (int64_t c = 0; c < chunks; ++c, ++it) {
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
      load_tokens(c + 1 < chunks ? c + 1 : 0, next);
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
    hopper::named_barrier_sync(1, kThreads);  // the previous unit's sums have been read (the producer warp takes no part)
    store_sums<T, GROUPS>(partial, acc, unit * kRows, 0, p, threadIdx.x, kThreads, [] { hopper::named_barrier_sync(1, kThreads); });
  }
#else
  __trap();  // launched only on compute capability 9.0 and newer
#endif
}

constexpr int64_t kMaxGridY = 65535;  // CUDA's limit on gridDim.y; the kernel loops over the rest

// Compute capability 9.0 and newer: a programmatic dependent launch (the
// kernel's wait_for_prior_grids), as the bulk kernel's.
template <typename T, int GROUPS, int DEPTH>
cudaError_t launch_typed(const MatmulProblem& p, cudaStream_t stream, int device) {
  const int64_t token_blocks = ceil_div(p.m, 8 * GROUPS);
  const dim3 grid(unsigned(ceil_div(p.n, kRows)), unsigned(min_i64(token_blocks, kMaxGridY)));
  if (tc::cached_device_attribute<cudaDevAttrComputeCapabilityMajor, 0>(device) >= 9) {
    return hopper::launch_programmatic(splitk_kernel<T, GROUPS, DEPTH>, grid, dim3(kThreads), 0, stream, p);
  }
  splitk_kernel<T, GROUPS, DEPTH><<<grid, dim3(kThreads), 0, stream>>>(p);
  return cudaGetLastError();
}

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

template <typename T, int GROUPS, int STAGES>
cudaError_t launch_bulk(const MatmulProblem& p, cudaStream_t stream, int device) {
  constexpr auto kernel = splitk_bulk_kernel<T, GROUPS, STAGES>;
  constexpr int bytes = BulkSmem<GROUPS, STAGES>::kBytes;
  if (cudaError_t err = tc::allow_dynamic_smem<kernel>(bytes, device)) return err;
  const int64_t slots = int64_t(resident_ctas<kernel>(kThreads + 32, bytes, device)) * tc::sm_count(device);
  return hopper::launch_programmatic(kernel, dim3(unsigned(min_i64(ceil_div(p.n, kRows), slots))),
                                     dim3(kThreads + 32), bytes, stream, p);
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

// The bulk kernel up to kSplitkBulkMaxTokens tokens on GPUs with bulk copies
// (compute capability 9.0 and newer) whose CTAs can have 100 KB of shared
// memory (not sm_120's 99 KB: the ring's depth was measured on Hopper only),
// else the register kernel.
constexpr int kBulkMinSmemPerBlock = 100 * 1024;
static_assert(BulkSmem<1, kBulkStages>::kBytes <= kBulkMinSmemPerBlock, "the ring fits where the bulk kernel runs");

template <typename T>
cudaError_t launch_for_tokens(const MatmulProblem& p, cudaStream_t stream) {
  int device = 0;
  if (cudaError_t err = cudaGetDevice(&device)) return err;
  if (tc::cached_device_attribute<cudaDevAttrComputeCapabilityMajor, 0>(device) >= 9 &&
      p.m <= kSplitkBulkMaxTokens && tc::max_smem_per_block(device) >= kBulkMinSmemPerBlock) {
    return launch_bulk<T, 1, kBulkStages>(p, stream, device);
  }
  if (p.m <= 8) return launch_typed<T, 1, 4>(p, stream, device);
  if (p.m <= 16) return launch_typed<T, 2, 4>(p, stream, device);
  if (p.m <= 32) return launch_typed<T, 4, 2>(p, stream, device);
  return launch_typed<T, 8, 2>(p, stream, device);
}

}  // namespace

bool splitk_operands_ok(const MatmulProblem& p) {
  return tc::operands_ok(p) && tc::b_layout(p) == tc::BLayout::kKMajor;
}

cudaError_t launch_splitk(const MatmulProblem& problem, cudaStream_t stream) {
  if (problem.m == 0 || problem.n == 0) return cudaSuccess;
  if (!splitk_operands_ok(problem)) return cudaErrorInvalidValue;
  return problem.dtype == ElementType::kBFloat16 ? launch_for_tokens<__nv_bfloat16>(problem, stream)
                                                 : launch_for_tokens<__half>(problem, stream);
}

}  // namespace persistent_matmul
