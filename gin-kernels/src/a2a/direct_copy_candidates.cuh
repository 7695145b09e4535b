// a2a/direct_copy_candidates.cuh - remote copy policies for a2a_direct that the library does not
// use: timing candidates instantiated only by test/a2a_test.cu (docs/kernels.md, "Design choices
// and what they rest on"). Same contract as VectorCopy (a2a/direct.cuh). No code object includes
// this file.
#pragma once

#include "direct.cuh"

namespace gin_a2a_detail {

// Head (bytes up to 16-byte alignment of dst) and tail (bytes after the last whole 16-byte unit)
// by the block's threads; returns the body [head, head + body) of whole 16-byte units, or false
// when src is not 16-byte aligned at dst's alignment (then nothing was copied).
GIN_DEVICE_INLINE bool split_head_body_tail(uint8_t* dst, const uint8_t* src, uint64_t n, uint32_t tid,
                                            uint32_t nthreads, uint64_t& head, uint64_t& body) {
  head = (16u - ((uintptr_t)dst & 15u)) & 15u;
  if (head > n) head = n;
  if (((uintptr_t)(src + head) & 15u) != 0) return false;
  body = (n - head) & ~15ull;
  for (uint64_t i = tid; i < head; i += nthreads) dst[i] = src[i];
  for (uint64_t i = head + body + tid; i < n; i += nthreads) dst[i] = src[i];
  return true;
}

// Candidate (c): the vector copy with cache hints: source loads `ld.global.nc.L1::no_allocate`
// with an L2 evict_first policy (read once), stores `st.global.L1::no_allocate` with the same
// policy. Same alignment rule as gin_copy_bytes (misaligned sources fall back to it).
template <int kUnroll>
struct HintedCopy {
  static GIN_DEVICE_INLINE void copy(uint8_t* dst, const uint8_t* src, uint64_t n, uint32_t tid, uint32_t nthreads) {
#if GIN_CUDA && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if (n == 0) return;
    uint64_t head, body;
    if (!split_head_body_tail(dst, src, n, tid, nthreads, head, body)) {
      gin_copy_bytes<kUnroll>(dst, src, n, tid, nthreads);
      return;
    }
    uint64_t policy;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    const uint8_t* s = src + head;
    uint8_t* d = dst + head;
    const uint64_t nvec = body >> 4, step = (uint64_t)nthreads * kUnroll;
    uint64_t v = tid;
    for (; v + (uint64_t)(kUnroll - 1) * nthreads < nvec; v += step) {
      uint64_t lo[kUnroll], hi[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v2.u64 {%0, %1}, [%2], %3;"
                     : "=l"(lo[u]), "=l"(hi[u])
                     : "l"(s + ((v + (uint64_t)u * nthreads) << 4)), "l"(policy));
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        asm volatile("st.global.L1::no_allocate.L2::cache_hint.v2.u64 [%0], {%1, %2}, %3;" ::"l"(
                         d + ((v + (uint64_t)u * nthreads) << 4)),
                     "l"(lo[u]), "l"(hi[u]), "l"(policy)
                     : "memory");
    }
    for (; v < nvec; v += nthreads) gin_st16(d + (v << 4), gin_ld16_stream(s + (v << 4)));
#else
    gin_copy_bytes<kUnroll>(dst, src, n, tid, nthreads);
#endif
  }
};

// Candidate (a): TMA bulk copies (sm_90+). Thread 0 drives a ring of kStages tiles of kTile bytes
// in dynamic shared memory: cp.async.bulk global -> shared (completion on one mbarrier per stage),
// then cp.async.bulk shared -> global straight into the destination (a peer's window over NVLink
// is global memory too). Head and tail bytes go through the block's threads. Needs
// kStages*kTile bytes of dynamic shared memory at launch; with less (or before sm_90, or on HIP,
// or a source not 16-byte aligned at dst's alignment) it falls back to the vector copy.
// Ordering: (1) thread 0 acquired the peer's ready flag (generic proxy) before this call;
// fence.proxy.async.global orders that before the bulk writes (async proxy). (2) Before
// returning, thread 0 waits with cp.async.bulk.wait_group 0 (not .read: the writes themselves are
// complete and visible to thread 0) and fences the async proxy against the generic one again, so
// the caller's __syncthreads + thread 0's st.release.sys done flag covers the bulk writes.
template <int kStages, uint32_t kTile>
struct TmaCopy {
  static_assert(kStages >= 2, "the refill of tile t-1's stage needs a second stage");
  static_assert(kTile % 16 == 0 && kTile < (1u << 20), "bulk copy sizes: multiple of 16, mbarrier tx count < 2^20");
  static constexpr uint32_t kSharedBytes = (uint32_t)kStages * kTile;

  static GIN_DEVICE_INLINE void copy(uint8_t* dst, const uint8_t* src, uint64_t n, uint32_t tid, uint32_t nthreads) {
#if GIN_CUDA && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    __shared__ __align__(8) uint64_t stageFull[kStages];
    extern __shared__ __align__(128) uint8_t tmaTiles[];
    if (n == 0) return;
    uint32_t dynBytes;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dynBytes));
    uint64_t head = 0, body = 0;
    if (dynBytes < kSharedBytes || !split_head_body_tail(dst, src, n, tid, nthreads, head, body)) {
      gin_copy_bytes<GIN_COPY_UNROLL>(dst, src, n, tid, nthreads);
      return;
    }
    if (tid != 0 || body == 0) return;
    const uint32_t tiles = (uint32_t)__cvta_generic_to_shared(tmaTiles);
    const uint32_t bars = (uint32_t)__cvta_generic_to_shared(stageFull);
    for (int s = 0; s < kStages; ++s)
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bars + 8u * s) : "memory");
    // Barrier inits visible to the async proxy; the ready acquire ordered before the bulk writes.
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    asm volatile("fence.proxy.async.global;" ::: "memory");
    const uint8_t* s0 = src + head;
    uint8_t* d0 = dst + head;
    const uint64_t ntiles = (body + kTile - 1) / kTile;
    auto tile_bytes = [&](uint64_t t) -> uint32_t {
      const uint64_t rest = body - t * kTile;
      return rest < kTile ? (uint32_t)rest : kTile;
    };
    auto load = [&](uint64_t t) {
      const uint32_t st = (uint32_t)(t % kStages), bar = bars + 8u * st, bytes = tile_bytes(t);
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
      asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                       tiles + st * kTile),
                   "l"(s0 + t * kTile), "r"(bytes), "r"(bar)
                   : "memory");
    };
    for (uint64_t t = 0; t < ntiles && t < (uint64_t)kStages; ++t) load(t);
    for (uint64_t t = 0; t < ntiles; ++t) {
      const uint32_t st = (uint32_t)(t % kStages), bar = bars + 8u * st;
      const uint32_t parity = (uint32_t)((t / kStages) & 1u);
      for (uint32_t landed = 0; !landed;)  // local HBM -> shared: completes without any peer
        asm volatile(
            "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
            : "=r"(landed)
            : "r"(bar), "r"(parity)
            : "memory");
      asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(d0 + t * kTile),
                   "r"(tiles + st * kTile), "r"(tile_bytes(t))
                   : "memory");
      asm volatile("cp.async.bulk.commit_group;" ::: "memory");
      // Refill the stage of tile t-1 once its store has read it (all groups but the newest).
      if (t >= 1 && t - 1 + kStages < ntiles) {
        asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
        load(t - 1 + kStages);
      }
    }
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
    asm volatile("fence.proxy.async.global;" ::: "memory");
#else
    gin_copy_bytes<GIN_COPY_UNROLL>(dst, src, n, tid, nthreads);
#endif
  }
};

}  // namespace gin_a2a_detail
