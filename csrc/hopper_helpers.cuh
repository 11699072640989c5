// Hopper (sm_90a) building blocks shared by the `wgmma`, `wgmma_persistent`
// and `wgmma_streamk` rungs: mbarriers, TMA (bulk tensor) loads and stores,
// wgmma and its shared-memory descriptors, register reallocation, partial sums
// handed between CTAs, and on the host the programmatic dependent launch and
// the cached tensor maps that describe operands to the copy engine.
//
// Everything here is PTX for sm_90a; the sources that include it are built
// only for "9.0a" (build.toml's [kernel.hopper]).
#pragma once

#include <cstdint>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <utility>

#include <cuda.h>  // CUtensorMap and its enums (types only: no libcuda link)
#include <cuda_runtime.h>

namespace persistent_matmul {
namespace hopper {

// ---------------------------------------------------------------- device side

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// A 4-byte store to / load from shared memory at a shared-window address.
__device__ __forceinline__ void st_shared_b32(uint32_t addr, uint32_t value) {
  asm volatile("st.shared.b32 [%0], %1;" ::"r"(addr), "r"(value) : "memory");
}
__device__ __forceinline__ uint32_t ld_shared_b32(uint32_t addr) {
  uint32_t value;
  asm volatile("ld.shared.b32 %0, [%1];" : "=r"(value) : "r"(addr) : "memory");
  return value;
}

// mbarriers: `full` barriers complete when TMA has written a stage (one
// arrival plus the stage's bytes), `empty` barriers when every consumer
// warpgroup has finished reading it.
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(arrivals));
}

// Makes the barrier initialisation visible to the async (TMA) proxy.
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}

// Blocks until the barrier's phase with this parity has completed.
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_AGAIN:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_AGAIN;\n"
      "}\n" ::"r"(smem_u32(bar)),
      "r"(parity)
      : "memory");
}

// Position in a ring of shared-memory stages (a `full` and an `empty` mbarrier
// each); the phase bit flips on every wrap.
template <int STAGES>
struct RingPosition {
  int stage = 0;
  uint32_t phase = 0;
  __device__ void advance() {
    if (++stage == STAGES) {
      stage = 0;
      phase ^= 1;
    }
  }
};

// One box of a 2-D tensor map into shared memory; completes on `bar`.
// Coordinates are in elements, innermost first; parts of the box outside the
// tensor are filled with zeros.
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, uint64_t* bar, int inner,
                                            int outer) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];" ::
          "r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(inner), "r"(outer)
      : "memory");
}

// L2 eviction policies for the cache-hinted load below (createpolicy): data
// read once (a skinny product's weights) goes first, data read again (its
// tokens, read by every weight tile) stays longest.
__device__ __forceinline__ uint64_t l2_evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}
__device__ __forceinline__ uint64_t l2_evict_last_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

// tma_load_2d with an L2 eviction policy for the lines it reads.
__device__ __forceinline__ void tma_load_2d_hinted(void* dst, const CUtensorMap* map, uint64_t* bar, int inner,
                                                   int outer, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%3, %4}], [%2], %5;" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(inner), "r"(outer), "l"(policy)
      : "memory");
}

// The same box written into the shared memory of every CTA of the cluster in
// `cta_mask` (at this CTA's offsets), completing on each one's barrier at
// `bar`'s offset: one L2 read feeds several SMs.
__device__ __forceinline__ void tma_load_2d_multicast(void* dst, const CUtensorMap* map, uint64_t* bar, int inner,
                                                      int outer, uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%3, %4}], [%2], %5;" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(inner), "r"(outer), "h"(cta_mask)
      : "memory");
}

// TMA stores: a box of shared memory (written by ordinary stores, then made
// visible to the copy engine with fence_proxy_async) to the tensor at box
// coordinates (inner, outer); parts of the box outside the tensor are not
// written. Stores are grouped per thread with bulk_commit and awaited with
// bulk_wait_read / bulk_wait (device_helpers.cuh).
__device__ __forceinline__ void tma_store_2d(const CUtensorMap* map, const void* src, int inner, int outer) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(smem_u32(src)), "r"(inner), "r"(outer)
               : "memory");
}

// Thread block clusters: this CTA's rank, a barrier over every thread of the
// cluster (not `.aligned`: warps may reach it diverged), and an arrival on the
// barrier at `bar`'s offset in CTA `cta` of the cluster. The arrival keeps
// PTX's default semantics (release at CTA scope), as CUTLASS's ClusterBarrier
// does: what it publishes is that this warpgroup's wgmmas, already waited
// for, are done reading a stage, which needs no ordering of this thread's
// own memory operations at cluster scope. `.release.cluster` compiles to
// MEMBAR.ALL.GPU before every arrival; with two of them per k-block the
// cluster option ran at 0.58x of the same kernel without clusters (H200,
// 2026-11-30), and 1.04x without them.
__device__ __forceinline__ uint32_t cluster_cta_rank() {
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  return rank;
}

__device__ __forceinline__ uint32_t cluster_ctas() {
  uint32_t ctas;
  asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(ctas));
  return ctas;
}

__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;" ::: "memory");
}

// 16 bytes at `addr` (a shared-memory address of this CTA's layout) in the
// shared memory of CTA `cta` of the cluster (distributed shared memory).
__device__ __forceinline__ float4 ld_shared_cluster_f4(uint32_t addr, uint32_t cta) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(addr), "r"(cta));
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(remote)
               : "memory");
  return v;
}

// Programmatic dependent launch (a kernel launched with
// cudaLaunchAttributeProgrammaticStreamSerialization may start while the
// kernel before it in the stream still runs): wait until the grids this one
// depends on have finished and their memory is visible, before this grid's
// first global memory access (returns at once in a kernel launched without
// the attribute); and let the next grid launched with it be scheduled.
// griddepcontrol is sm_90 PTX: code for older GPUs (splitk's portable
// kernels), whose launches never ask for the overlap, compiles them to nothing.
__device__ __forceinline__ void wait_for_prior_grids() {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void allow_dependent_grids() {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void mbarrier_arrive_in_cta(uint64_t* bar, uint32_t cta) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem_u32(bar)), "r"(cta));
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(remote) : "memory");
}

// Register reallocation between warpgroups (needs a register cap at entry,
// i.e. __launch_bounds__(threads, 1)).
template <int REGS>
__device__ __forceinline__ void release_registers() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(REGS));
}
template <int REGS>
__device__ __forceinline__ void claim_registers() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(REGS));
}

// A barrier among `threads` threads (a multiple of 32) on hardware barrier `id` (1..15).
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
// The same barrier, returning whether `flag` was set in any of its threads
// (bar.red.or; every thread that meets at `id` must call this form).
__device__ __forceinline__ bool named_barrier_sync_or(int id, int threads, bool flag) {
  uint32_t any;
  asm volatile(
      "{\n"
      "  .reg .pred flag, any;\n"
      "  setp.ne.u32 flag, %1, 0;\n"
      "  bar.red.or.pred any, %2, %3, flag;\n"
      "  selp.u32 %0, 1, 0, any;\n"
      "}\n"
      : "=r"(any)
      : "r"(uint32_t(flag)), "r"(id), "r"(threads)
      : "memory");
  return any != 0;
}

// wgmma ordering: fence before the first wgmma that reads registers or
// shared memory written by ordinary instructions; commit closes a group of
// wgmmas; wait<N> blocks until at most N groups are still running.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

// A wgmma shared-memory descriptor for a 128-byte-swizzled operand (the
// layout TMA writes with CU_TENSOR_MAP_SWIZZLE_128B): start address, leading
// byte offset (K-major: unused; MN-major: bytes between 64-element column
// blocks), stride byte offset (bytes between 8-row groups). The stage bases
// are 1024-byte aligned, so the base-offset field stays 0.
__device__ __forceinline__ uint64_t smem_descriptor(uint32_t addr, uint32_t leading_bytes, uint32_t stride_bytes) {
  uint64_t desc = (addr & 0x3FFFF) >> 4;
  desc |= uint64_t((leading_bytes & 0x3FFFF) >> 4) << 16;
  desc |= uint64_t((stride_bytes & 0x3FFFF) >> 4) << 32;
  desc |= uint64_t(1) << 62;  // 128-byte swizzle
  return desc;
}

// The accumulator registers of the wide wgmmas (m64n256k16: 128 a thread,
// m64n192k16: 96, m64n128k16: 64, m64n64k16: 32), in pieces of 32: the
// instruction's register list ("%0, ..., %31", ...) and the matching asm
// operands (d[0] ... d[31], ...), joined per width below.
#define PM_WGMMA_REGS_0 \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define PM_WGMMA_D_0 \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define PM_WGMMA_REGS_32 \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define PM_WGMMA_D_32 \
  "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
  "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
  "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define PM_WGMMA_REGS_64 \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
#define PM_WGMMA_D_64 \
  "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), \
  "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), \
  "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), \
  "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
#define PM_WGMMA_REGS_96 \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define PM_WGMMA_D_96 \
  "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), \
  "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), \
  "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), \
  "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
#define PM_WGMMA_ACC_LIST_128 "{" PM_WGMMA_REGS_0 ", " PM_WGMMA_REGS_32 ", " PM_WGMMA_REGS_64 ", " PM_WGMMA_REGS_96 "}"
#define PM_WGMMA_ACC_OPERANDS_128 PM_WGMMA_D_0, PM_WGMMA_D_32, PM_WGMMA_D_64, PM_WGMMA_D_96
#define PM_WGMMA_ACC_LIST_96 "{" PM_WGMMA_REGS_0 ", " PM_WGMMA_REGS_32 ", " PM_WGMMA_REGS_64 "}"
#define PM_WGMMA_ACC_OPERANDS_96 PM_WGMMA_D_0, PM_WGMMA_D_32, PM_WGMMA_D_64
#define PM_WGMMA_ACC_LIST_64 "{" PM_WGMMA_REGS_0 ", " PM_WGMMA_REGS_32 "}"
#define PM_WGMMA_ACC_OPERANDS_64 PM_WGMMA_D_0, PM_WGMMA_D_32
#define PM_WGMMA_ACC_LIST_32 "{" PM_WGMMA_REGS_0 "}"
#define PM_WGMMA_ACC_OPERANDS_32 PM_WGMMA_D_0

// The 16, 8 and 4 accumulator registers of m64n32k16, m64n16k16 and m64n8k16
// (the stream-K rung's narrow token tiles).
#define PM_WGMMA_ACC_LIST_16 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define PM_WGMMA_ACC_OPERANDS_16 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
#define PM_WGMMA_ACC_LIST_8 "{%0, %1, %2, %3, %4, %5, %6, %7}"
#define PM_WGMMA_ACC_OPERANDS_8 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
#define PM_WGMMA_ACC_LIST_4 "{%0, %1, %2, %3}"
#define PM_WGMMA_ACC_OPERANDS_4 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])

// d (+)= A(64 x 16, K-major, from desc_a) * B(16 x N, from desc_b); fp32
// accumulators in the m64nNk16 fragment layout. scale_d == 0 overwrites d.
// TRANS_B = 0: B is K-major in shared memory; 1: N-major.
template <int N, int TRANS_B>
struct Wgmma;

#define PM_WGMMA(SHAPE, TYPE, LIST, OPERANDS, I_A, I_B, I_SCALE, I_TRANS)                                   \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" I_SCALE ", 0;\n"                                        \
               "wgmma.mma_async.sync.aligned." SHAPE ".f32." TYPE "." TYPE " " LIST ", %" I_A ", %" I_B \
               ", p, 1, 1, 0, %" I_TRANS ";\n}\n"                                                          \
               : OPERANDS                                                                                   \
               : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TRANS_B))

// Wgmma<N, TRANS_B> for one width N: its accumulators (N / 2 registers per
// thread, the asm operands 0 .. N / 2 - 1) and the operand numbers after them.
#define PM_WGMMA_WIDTH(N, REGS, I_A, I_B, I_SCALE, I_TRANS)                                                          \
  template <int TRANS_B>                                                                                            \
  struct Wgmma<N, TRANS_B> {                                                                                        \
    template <bool BF16>                                                                                            \
    static __device__ __forceinline__ void run(float (&d)[REGS], uint64_t desc_a, uint64_t desc_b, int scale_d) { \
      if constexpr (BF16) {                                                                                         \
        PM_WGMMA("m64n" #N "k16", "bf16", PM_WGMMA_ACC_LIST_##REGS, PM_WGMMA_ACC_OPERANDS_##REGS, I_A, I_B,      \
                 I_SCALE, I_TRANS);                                                                                 \
      } else {                                                                                                      \
        PM_WGMMA("m64n" #N "k16", "f16", PM_WGMMA_ACC_LIST_##REGS, PM_WGMMA_ACC_OPERANDS_##REGS, I_A, I_B,       \
                 I_SCALE, I_TRANS);                                                                                 \
      }                                                                                                             \
    }                                                                                                               \
  };

PM_WGMMA_WIDTH(256, 128, "128", "129", "130", "131")
PM_WGMMA_WIDTH(192, 96, "96", "97", "98", "99")
PM_WGMMA_WIDTH(128, 64, "64", "65", "66", "67")
PM_WGMMA_WIDTH(64, 32, "32", "33", "34", "35")
PM_WGMMA_WIDTH(32, 16, "16", "17", "18", "19")
PM_WGMMA_WIDTH(16, 8, "8", "9", "10", "11")
PM_WGMMA_WIDTH(8, 4, "4", "5", "6", "7")

#undef PM_WGMMA_WIDTH
#undef PM_WGMMA

// Partial sums handed between CTAs through global memory (the split tiles of
// wgmma_persistent's split-tail order and of wgmma_streamk): one consumer
// warpgroup's N accumulators as N / 4 float4s, thread-minor (float4 i of
// thread t at i * 128 + t, so each warp's accesses are contiguous), through L2
// only (L1 is not coherent between SMs). `slot` points at the warpgroup's
// thread 0.
template <int N>
__device__ __forceinline__ void store_partial_sums(float4* slot, const float (&d)[N]) {
  static_assert(N % 4 == 0, "whole float4s");
  float4* mine = slot + threadIdx.x % 128;
#pragma unroll
  for (int i = 0; i < N / 4; ++i) __stcg(mine + i * 128, make_float4(d[4 * i], d[4 * i + 1], d[4 * i + 2], d[4 * i + 3]));
}
template <int N>
__device__ __forceinline__ void add_partial_sums(float (&d)[N], const float4* slot) {
  const float4* mine = slot + threadIdx.x % 128;
#pragma unroll
  for (int i = 0; i < N / 4; ++i) {
    const float4 v = __ldcg(mine + i * 128);
    d[4 * i] += v.x;
    d[4 * i + 1] += v.y;
    d[4 * i + 2] += v.z;
    d[4 * i + 3] += v.w;
  }
}

// ------------------------------------------------------------------ host side

// Launches `kernel` as a programmatic dependent launch: its CTAs may start
// (set up their barriers) while the kernel before them in the stream
// finishes; the kernel waits for that one (wait_for_prior_grids) before it
// touches global memory.
// With `cluster` > 1 the grid runs in clusters of that many CTAs (a kernel
// without compile-time cluster dimensions).
template <typename... Params, typename... Args>
cudaError_t launch_programmatic_in_clusters(void (*kernel)(Params...), dim3 grid, dim3 block, int smem_bytes,
                                            unsigned cluster, cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = size_t(smem_bytes);
  config.stream = stream;
  cudaLaunchAttribute attributes[2];
  attributes[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attributes[0].val.programmaticStreamSerializationAllowed = 1;
  attributes[1].id = cudaLaunchAttributeClusterDimension;
  attributes[1].val.clusterDim.x = cluster;
  attributes[1].val.clusterDim.y = 1;
  attributes[1].val.clusterDim.z = 1;
  config.attrs = attributes;
  config.numAttrs = cluster > 1 ? 2 : 1;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}
template <typename... Params, typename... Args>
cudaError_t launch_programmatic(void (*kernel)(Params...), dim3 grid, dim3 block, int smem_bytes,
                                cudaStream_t stream, Args&&... args) {
  return launch_programmatic_in_clusters(kernel, grid, block, smem_bytes, 1u, stream, std::forward<Args>(args)...);
}


// A 2-D row-major view for a tensor map: `rows` rows of `cols` elements,
// `row_stride_bytes` apart, read in boxes of box_rows x box_cols.
struct TensorMapKey {
  const void* base;
  uint64_t rows, cols, row_stride_bytes;
  uint32_t box_rows, box_cols;
  int32_t bf16;
  int32_t unused = 0;  // no implicit padding: keys are compared and hashed bytewise
  bool operator==(const TensorMapKey& o) const { return std::memcmp(this, &o, sizeof(*this)) == 0; }
};

// The key of a bf16 (else fp16) matrix of `rows` rows of `cols` elements,
// `row_stride` elements apart, read in box_rows x box_cols boxes. A single
// row's stride is never used to address, so it is replaced by one TMA
// accepts: the row's length rounded up to 16 bytes.
inline TensorMapKey matrix_key(const void* base, int64_t rows, int64_t cols, int64_t row_stride, uint32_t box_rows,
                               uint32_t box_cols, bool bf16) {
  TensorMapKey key{};
  key.base = base;
  key.rows = uint64_t(rows);
  key.cols = uint64_t(cols);
  key.row_stride_bytes = uint64_t(rows == 1 ? (cols + 7) / 8 * 8 : row_stride) * 2;
  key.box_rows = box_rows;
  key.box_cols = box_cols;
  key.bf16 = bf16;
  return key;
}

struct TensorMapKeyHash {
  size_t operator()(const TensorMapKey& k) const {
    uint64_t h = 1469598103934665603ull;
    const unsigned char* bytes = reinterpret_cast<const unsigned char*>(&k);
    for (size_t i = 0; i < sizeof(k); ++i) h = (h ^ bytes[i]) * 1099511628211ull;
    return static_cast<size_t>(h);
  }
};

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// cuTensorMapEncodeTiled from the driver, found through the runtime so the
// extension does not link libcuda.
inline EncodeTiled encode_tiled() {
  static EncodeTiled fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    // The versioned query exists from CUDA 12.5 and is the only one from 13.0 on;
    // builds with an older toolkit ask for the runtime's own version instead.
#if CUDART_VERSION >= 12050
    const cudaError_t status =
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found);
#else
    const cudaError_t status = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &p, cudaEnableDefault, &found);
#endif
    if (status != cudaSuccess || found != cudaDriverEntryPointSuccess) {
      p = nullptr;
    }
    return reinterpret_cast<EncodeTiled>(p);
  }();
  return fn;
}

// L2 promotion of a tensor map's loads: 256 bytes where every row starts on a
// 128-byte line, none otherwise. A box row is 128 bytes, so on rows that are
// not whole lines (3000 bf16 elements: 6000 bytes) seven of every eight box
// rows straddle two lines, where the promotion cost more than it saved (not
// yet traced to counters): 3000^3 took 98 us with it against 89 us without (H100,
// cuBLAS 83-85 us), while the same product on rows padded to 6144 bytes ran
// the same either way. 64-byte promotion there ran as fast as none (0.998x
// its speed at 3000^3, one process, interleaved).
inline CUtensorMapL2promotion l2_promotion(const TensorMapKey& key) {
  const bool whole_lines = (reinterpret_cast<uintptr_t>(key.base) | key.row_stride_bytes) % 128 == 0;
  return whole_lines ? CU_TENSOR_MAP_L2_PROMOTION_L2_256B : CU_TENSOR_MAP_L2_PROMOTION_NONE;
}

// The tensor map for `key` (128-byte swizzle, zero fill outside the tensor),
// encoded once and cached under the whole key: base pointer, shape, stride,
// box and dtype. Maps are small (128 bytes) and encoding costs host time on
// every call otherwise. Returns false if the driver rejects the layout.
inline bool tensor_map(const TensorMapKey& key, CUtensorMap* out) {
  static std::mutex mutex;
  static std::unordered_map<TensorMapKey, CUtensorMap, TensorMapKeyHash> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(key);
  if (it != cache.end()) {
    *out = it->second;
    return true;
  }
  EncodeTiled encode = encode_tiled();
  if (encode == nullptr) return false;
  const cuuint64_t dims[2] = {key.cols, key.rows};
  const cuuint64_t strides[1] = {key.row_stride_bytes};
  const cuuint32_t box[2] = {key.box_cols, key.box_rows};
  const cuuint32_t element_strides[2] = {1, 1};
  CUtensorMap map;
  const CUresult r = encode(&map, key.bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2,
                            const_cast<void*>(key.base), dims, strides, box, element_strides,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            l2_promotion(key), CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) return false;
  if (cache.size() >= 4096) cache.clear();  // bounded: long-running processes allocate new buffers
  cache.emplace(key, map);
  *out = map;
  return true;
}

}  // namespace hopper
}  // namespace persistent_matmul
