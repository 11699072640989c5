// The tensor-core ceiling of wgmma_persistent's CTA on this GPU, at the clock
// its power limit leaves: a diagnostic kernel, not part of the package build
// (scripts/speed_of_light.py compiles it with nvcc and launches it).
//
// Each CTA has the two consumer warpgroups of a 128 x 256 x 64 WideTile and
// runs their k-loop exactly (four m64n256k16 wgmmas per k-block and
// consumer, then a wait for them, the stage ring walked in order, the
// accumulators restarted at every tile's first k-block), on shared memory
// filled once with random operands. Nothing else: no loads, no barriers, no
// epilogue, no tile scheduler. So any kernel that computes a product with this
// instruction mix does at least this work, and at the power limit moving data
// only takes power away from the tensor cores: the time this kernel takes for
// a product's k-blocks bounds how fast any such kernel can be.
//
// The k-blocks are handed out as the launch asks: CTA c runs `base` k-blocks,
// plus `extra` more if c < extra_ctas. Whole tiles per CTA (base and extra
// multiples of a tile's k-blocks) is wgmma_persistent's balance; one k-block
// per step is a perfect one.
#include "wgmma_tile.cuh"

namespace {

using persistent_matmul::hopper::WideTile;
namespace hopper = persistent_matmul::hopper;

// sink[c * 256 + t]: the sum of thread t's accumulators in CTA c, so the
// compiler keeps every wgmma (an unused accumulator's wgmmas are removed).
template <bool B_KMAJOR>
__device__ __forceinline__ void k_loop(const uint4* random, float* sink, int base, int extra, int extra_ctas,
                                       int tile_kblocks) {
  extern __shared__ __align__(1024) char raw[];
  char* stages = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
  constexpr int kChunks = WideTile::STAGES * WideTile::STAGE_BYTES / 16;
  for (int i = threadIdx.x; i < kChunks; i += blockDim.x) {
    reinterpret_cast<uint4*>(stages)[i] = random[(blockIdx.x * 4099 + i) % kChunks];
  }
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // ordinary stores, then wgmma reads
  __syncthreads();

  const int consumer = threadIdx.x / 128;
  const int k_blocks = base + (int(blockIdx.x) < extra_ctas ? extra : 0);
  const uint32_t base_addr = hopper::smem_u32(stages);
  float d[WideTile::ACCUMULATORS];
#pragma unroll
  for (int i = 0; i < WideTile::ACCUMULATORS; ++i) d[i] = 0.0f;
  int stage = 0, in_tile = 0;
  for (int kb = 0; kb < k_blocks; ++kb) {
    const uint32_t a = base_addr + stage * WideTile::STAGE_BYTES + consumer * 64 * 128;
    const uint32_t b = base_addr + stage * WideTile::STAGE_BYTES + WideTile::A_STAGE_BYTES;
    hopper::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < WideTile::BK / 16; ++kk) {
      const uint64_t desc_a = hopper::smem_descriptor(a + kk * 32, 16, 1024);
      const uint64_t desc_b = B_KMAJOR ? hopper::smem_descriptor(b + kk * 32, 16, 1024)
                                       : hopper::smem_descriptor(b + kk * 16 * 128, WideTile::BK * 128, 1024);
      hopper::Wgmma<WideTile::BN, B_KMAJOR ? 0 : 1>::template run<true>(d, desc_a, desc_b, (in_tile > 0 || kk > 0) ? 1 : 0);
    }
    hopper::wgmma_commit();
    hopper::wgmma_wait<0>();
    stage = stage + 1 == WideTile::STAGES ? 0 : stage + 1;
    in_tile = in_tile + 1 == tile_kblocks ? 0 : in_tile + 1;
  }
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < WideTile::ACCUMULATORS; ++i) sum += d[i];
  sink[blockIdx.x * 256 + threadIdx.x] = sum;
}

}  // namespace

// 256 threads (the two consumer warpgroups), WideTile's stages of dynamic shared memory + 1 KB.
extern "C" __global__ void __launch_bounds__(256, 1)
    wgmma_k_loop_b_kmajor(const uint4* random, float* sink, int base, int extra, int extra_ctas, int tile_kblocks) {
  k_loop<true>(random, sink, base, extra, extra_ctas, tile_kblocks);
}
extern "C" __global__ void __launch_bounds__(256, 1)
    wgmma_k_loop_b_nmajor(const uint4* random, float* sink, int base, int extra, int extra_ctas, int tile_kblocks) {
  k_loop<false>(random, sink, base, extra, extra_ctas, tile_kblocks);
}
