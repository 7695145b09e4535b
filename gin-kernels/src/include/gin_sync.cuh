// gin_sync.cuh - portable flag and copy primitives for GPU-initiated exchange (CUDA and HIP).
//
// Shared by a2a.cu and the MoE kernels. Self-contained: needs only the CUDA or HIP toolchain.
// Flags are uint64 sequence numbers in a symmetric window: the writer raises them with a
// system-scope release store, the reader waits with system-scope acquire. Memory-ordering notes
// are in docs/kernels.md ("a2a.cu").
#pragma once

#include "gin_device.cuh"  // GIN_HIP / GIN_CUDA (0 or 1), GIN_DEVICE_INLINE, vendor runtime header

// ---------------------------------------------------------------------------------------------
// Error bits in the caller's `uint32_t* errorFlags` device word (sticky: kernels only OR bits in;
// the host clears the word). Bits 0-7 belong to gin_sync/a2a, MoE kernels use bits 8 and up.
// ---------------------------------------------------------------------------------------------
#define GIN_ERR_TIMEOUT        (1u << 0)  // a wait exceeded GIN_WAIT_TIMEOUT_NS; the kernel gave up
#define GIN_ERR_COUNT_CLAMPED  (1u << 1)  // a byte count exceeded its receive slot; clamped to the slot
#define GIN_ERR_SEND_RANGE     (1u << 2)  // send offset+count beyond sendBytes; clamped to the buffer
#define GIN_ERR_BAD_ARGS       (1u << 3)  // grid/arguments inconsistent (see docs/kernels.md); nothing moved
#define GIN_ERR_NO_LSA_PATH    (1u << 4)  // peerBases[p] == 0: peer not load/store reachable (GIN path)

#ifndef GIN_WAIT_TIMEOUT_NS
#define GIN_WAIT_TIMEOUT_NS 10000000000ull  // 10 s: far beyond any legitimate skew between ranks
#endif

// ---------------------------------------------------------------------------------------------
// Scalar flag accesses (64-bit, naturally aligned, global memory; may be a peer's window).
// ---------------------------------------------------------------------------------------------
GIN_DEVICE_INLINE uint64_t gin_ld_acquire_sys(const uint64_t* p) {
#if GIN_HIP
  return __hip_atomic_load(p, __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_SYSTEM);
#else
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
#endif
}

GIN_DEVICE_INLINE uint64_t gin_ld_relaxed_sys(const uint64_t* p) {
#if GIN_HIP
  return __hip_atomic_load(p, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
#else
  uint64_t v;
  asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
#endif
}

GIN_DEVICE_INLINE void gin_st_release_sys(uint64_t* p, uint64_t v) {
#if GIN_HIP
  __hip_atomic_store(p, v, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_SYSTEM);
#else
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
#endif
}

// Release at device scope, for flags that only blocks of the same GPU read (a cheaper fence).
GIN_DEVICE_INLINE void gin_st_release_gpu(uint64_t* p, uint64_t v) {
#if GIN_HIP
  __hip_atomic_store(p, v, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_AGENT);
#else
  asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
#endif
}

GIN_DEVICE_INLINE void gin_st_relaxed_sys(uint64_t* p, uint64_t v) {
#if GIN_HIP
  __hip_atomic_store(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
#else
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
#endif
}

// Full acquire+release fence at system scope (orders this thread's, and by cumulativity the
// CTA's barrier-ordered, earlier accesses before its later ones as seen by peers).
GIN_DEVICE_INLINE void gin_fence_acq_rel_sys() {
#if GIN_HIP
  __atomic_thread_fence(__ATOMIC_ACQ_REL);  // system scope is the default for __atomic_thread_fence
#else
  asm volatile("fence.acq_rel.sys;" ::: "memory");
#endif
}

// Nanoseconds of a free-running device clock (only differences are used).
GIN_DEVICE_INLINE uint64_t gin_clock_ns() {
#if GIN_HIP
  // wall_clock64() ticks at a constant 100 MHz on gfx90a/gfx942 (hipDeviceAttributeWallClockRate).
  return (uint64_t)wall_clock64() * 10ull;
#else
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
#endif
}

// The SM's cycle counter (profiling only: per SM, not comparable across SMs).
GIN_DEVICE_INLINE uint64_t gin_cycles() {
#if GIN_HIP
  return (uint64_t)clock64();
#else
  uint64_t c;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(c)::"memory");
  return c;
#endif
}

GIN_DEVICE_INLINE void gin_error_set(uint32_t* errorFlags, uint32_t bits) {
  if (errorFlags != nullptr) atomicOr(errorFlags, bits);
}

GIN_DEVICE_INLINE bool gin_timeout_already_flagged(const uint32_t* errorFlags) {
  if (errorFlags == nullptr) return false;
#if GIN_HIP
  return (__hip_atomic_load(errorFlags, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT) & GIN_ERR_TIMEOUT) != 0;
#else
  uint32_t v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(errorFlags) : "memory");
  return (v & GIN_ERR_TIMEOUT) != 0;
#endif
}

// Spin until *p >= v, then return true with acquire semantics. Polls with relaxed loads (cheap,
// no L1 invalidation, so many polling lanes do not disturb the SM's cached data) and confirms once
// with an acquire load (flags are monotonic, so the condition still holds). The timeout clock is
// read only after GIN_WAIT_FREE_SPINS polls, so a short wait never pays for a globaltimer read
// between two polls (the timeout starts that many polls late: microseconds against 10 s). Gives
// up after GIN_WAIT_TIMEOUT_NS, or early once another wait of this kernel's errorFlags has timed
// out, sets GIN_ERR_TIMEOUT and returns false: a dead peer yields an error, never a hang.
#ifndef GIN_WAIT_FREE_SPINS
#define GIN_WAIT_FREE_SPINS 1024u
#endif
// periodMask + 1 (a power of two) polls pass between clock reads after the free spins.
GIN_DEVICE_INLINE bool gin_wait_timed_out(uint32_t spins, uint64_t& start, uint32_t* errorFlags,
                                          uint32_t periodMask = 1023u) {
  if (spins < GIN_WAIT_FREE_SPINS || ((spins - GIN_WAIT_FREE_SPINS) & periodMask) != 0) return false;
  const uint64_t now = gin_clock_ns();
  if (spins == GIN_WAIT_FREE_SPINS) {
    start = now;
    return false;
  }
  if (now - start > GIN_WAIT_TIMEOUT_NS || gin_timeout_already_flagged(errorFlags)) {
    gin_error_set(errorFlags, GIN_ERR_TIMEOUT);
    return true;
  }
  return false;
}

GIN_DEVICE_INLINE bool gin_wait_geq(const uint64_t* p, uint64_t v, uint32_t* errorFlags) {
  if (gin_ld_acquire_sys(p) >= v) return true;
  uint64_t start = 0;
  for (uint32_t spins = 0;; ++spins) {
    if (gin_ld_relaxed_sys(p) >= v) {
      (void)gin_ld_acquire_sys(p);
      return true;
    }
    if (gin_wait_timed_out(spins, start, errorFlags)) return false;
  }
}

// The same wait, every poll an acquire load: the poll that succeeds provides the ordering, so the
// wait ends one memory round trip earlier than gin_wait_geq (no confirming load). For a single
// polling thread (a2a: thread 0 while its block waits at a barrier); on NVIDIA each acquire poll
// also invalidates the SM's L1, which is why many-lane waits use gin_wait_geq.
GIN_DEVICE_INLINE bool gin_wait_geq_acquire_polls(const uint64_t* p, uint64_t v, uint32_t* errorFlags) {
  uint64_t start = 0;
  for (uint32_t spins = 0;; ++spins) {
    if (gin_ld_acquire_sys(p) >= v) return true;
    if (gin_wait_timed_out(spins, start, errorFlags)) return false;
  }
}

// The form named in kernels.md; reports a timeout through the return value only.
GIN_DEVICE_INLINE bool gin_wait_geq(const uint64_t* p, uint64_t v) { return gin_wait_geq(p, v, nullptr); }

// ---------------------------------------------------------------------------------------------
// 16-byte vector accesses.
// ---------------------------------------------------------------------------------------------
struct gin_u128 {
  uint64_t lo, hi;
};

// Streaming load of data that stays unchanged for the whole kernel (user send buffers).
GIN_DEVICE_INLINE gin_u128 gin_ld16_stream(const void* p) {
  gin_u128 v;
#if GIN_HIP
  v.lo = __builtin_nontemporal_load((const uint64_t*)p);
  v.hi = __builtin_nontemporal_load((const uint64_t*)p + 1);
#else
  asm volatile("ld.global.nc.L1::no_allocate.v2.u64 {%0, %1}, [%2];" : "=l"(v.lo), "=l"(v.hi) : "l"(p));
#endif
  return v;
}

// Plain (weak) 16-byte global store; also used for stores into a peer's window over NVLink/xGMI.
GIN_DEVICE_INLINE void gin_st16(void* p, gin_u128 v) {
#if GIN_HIP
  ((uint64_t*)p)[0] = v.lo;
  ((uint64_t*)p)[1] = v.hi;
#else
  asm volatile("st.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(v.lo), "l"(v.hi) : "memory");
#endif
}

// LL (low-latency) words: 8 bytes = 4 payload bytes (low half) + 4 flag bytes (high half), stored
// and loaded as single-copy-atomic 64-bit units, so a matching flag proves its payload landed.
// Pairs are moved as one 16-byte access; each 8-byte half is atomic, the pair is not (the reader
// checks both flags).
GIN_DEVICE_INLINE void gin_ll_store_pair(uint64_t* p, uint64_t w0, uint64_t w1) {
#if GIN_HIP
  __hip_atomic_store(p, w0, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
  __hip_atomic_store(p + 1, w1, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
#else
  asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(w0), "l"(w1) : "memory");
#endif
}

GIN_DEVICE_INLINE void gin_ll_load_pair(const uint64_t* p, uint64_t& w0, uint64_t& w1) {
#if GIN_HIP
  w0 = __hip_atomic_load(p, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
  w1 = __hip_atomic_load(p + 1, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
#else
  asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(w0), "=l"(w1) : "l"(p) : "memory");
#endif
}

// LL128 lines (a2a.cu): a 128-byte line is stored by the 8 lanes of one group of a warp in ONE
// store instruction (16 bytes per lane), and loaded back the same way. Like NCCL's LL128 protocol
// the receiver relies on NVLink/L2 delivering such a line whole, so the flag in its last 8 bytes
// proves the other 120 bytes. Every lane of the warp calls these together (warp-uniform control
// flow); `active` predicates the lane, and the 8 lanes of a line always agree on it. On HIP they
// are single 16-byte volatile vector accesses; whether xGMI keeps a line whole is NOT validated
// (Java does not pick LL128 on AMD by itself).
GIN_DEVICE_INLINE void gin_ll128_store16(bool active, void* p, uint64_t lo, uint64_t hi) {
#if GIN_HIP
  typedef uint64_t gin_u64x2 __attribute__((ext_vector_type(2)));
  if (active) {
    gin_u64x2 v;
    v.x = lo;
    v.y = hi;
    *(volatile gin_u64x2*)p = v;
  }
#else
  if (active) asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(lo), "l"(hi) : "memory");
#endif
}

GIN_DEVICE_INLINE void gin_ll128_load16(bool active, const void* p, uint64_t& lo, uint64_t& hi) {
#if GIN_HIP
  typedef uint64_t gin_u64x2 __attribute__((ext_vector_type(2)));
  if (active) {
    gin_u64x2 v = *(const volatile gin_u64x2*)p;
    lo = v.x;
    hi = v.y;
  }
#else
  if (active) asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(lo), "=l"(hi) : "l"(p) : "memory");
#endif
}

// One aligned 8-byte streaming load of read-only data (user send buffers).
GIN_DEVICE_INLINE uint64_t gin_ld8_stream(const void* p) {
#if GIN_HIP
  return __builtin_nontemporal_load((const uint64_t*)p);
#else
  uint64_t v;
  asm volatile("ld.global.nc.L1::no_allocate.u64 %0, [%1];" : "=l"(v) : "l"(p));
  return v;
#endif
}

// Warp-level helpers (every lane of the warp must call them; blockDim a multiple of the warp).
GIN_DEVICE_INLINE void gin_syncwarp() {
#if GIN_HIP
  __builtin_amdgcn_wave_barrier();  // wavefronts run in lockstep; this only stops code motion
#else
  __syncwarp();
#endif
}

GIN_DEVICE_INLINE int gin_shfl_int(int v, int srcLane) {
#if GIN_HIP
  return __shfl(v, srcLane);
#else
  return __shfl_sync(0xffffffffu, v, srcLane);
#endif
}

// v of lane (this lane ^ mask): butterfly reductions.
GIN_DEVICE_INLINE int gin_shfl_xor_int(int v, int laneMask) {
#if GIN_HIP
  return __shfl(v, (int)(gin_lane_id() ^ (uint32_t)laneMask));
#else
  return __shfl_xor_sync(0xffffffffu, v, laneMask);
#endif
}

GIN_DEVICE_INLINE uint64_t gin_shfl_u64(uint64_t v, int srcLane) {
  const uint32_t lo = (uint32_t)gin_shfl_int((int)(uint32_t)v, srcLane);
  const uint32_t hi = (uint32_t)gin_shfl_int((int)(uint32_t)(v >> 32), srcLane);
  return ((uint64_t)hi << 32) | lo;
}

GIN_DEVICE_INLINE bool gin_warp_any(bool pred) {
#if GIN_HIP
  return __any(pred ? 1 : 0) != 0;
#else
  return __any_sync(0xffffffffu, pred ? 1 : 0) != 0;
#endif
}

// All-to-all-v: the count this rank sends to peer p, clamped so that neither the send buffer nor the
// receive slot (capacity) is overrun. Returns the error bits the clamping implies.
GIN_DEVICE_INLINE uint32_t gin_resolve_count(const uint64_t* sendCounts, const uint64_t* sendOffsets, int p,
                                             uint64_t sendBytes, uint64_t capacity, uint64_t& count,
                                             uint64_t& srcOffset) {
  uint32_t err = 0;
  count = sendCounts[p];
  srcOffset = sendOffsets[p];
  if (srcOffset > sendBytes) {
    srcOffset = 0;
    count = 0;
    err |= GIN_ERR_SEND_RANGE;
  } else if (count > sendBytes - srcOffset) {
    count = sendBytes - srcOffset;
    err |= GIN_ERR_SEND_RANGE;
  }
  if (count > capacity) {
    count = capacity;
    err |= GIN_ERR_COUNT_CLAMPED;
  }
  return err;
}

// ---------------------------------------------------------------------------------------------
// Cooperative byte copy: `width` threads (a warp, a block, ...) with indices lane in [0, width)
// copy n bytes from src to dst (dst may be a peer's window). Any alignment and size. The body
// uses 16-byte stores aligned on dst; when src has the same alignment modulo 16 it uses 16-byte
// streaming loads with UNROLL independent loads in flight per thread, otherwise it assembles each
// 16-byte store from 4-byte-aligned loads with funnel shifts (so misaligned inputs still move as
// full 16-byte stores). Heads/tails (< 16 bytes) go byte by byte. src must not change during the
// copy and must not overlap dst.
// ---------------------------------------------------------------------------------------------

#ifndef GIN_COPY_UNROLL
#define GIN_COPY_UNROLL 8
#endif

GIN_DEVICE_INLINE uint32_t gin_funnel_r(uint32_t lo, uint32_t hi, uint32_t shiftBits) {
  // (hi:lo) >> shiftBits, low 32 bits; shiftBits in [0, 32).
#if GIN_HIP
  return shiftBits == 0 ? lo : (uint32_t)((((uint64_t)hi << 32) | lo) >> shiftBits);
#else
  return __funnelshift_r(lo, hi, shiftBits);
#endif
}

template <int UNROLL = GIN_COPY_UNROLL>
GIN_DEVICE_INLINE void gin_copy_bytes(uint8_t* dst, const uint8_t* src, uint64_t n, uint32_t lane,
                                      uint32_t width) {
  if (n == 0) return;
  uint64_t head = (16u - ((uintptr_t)dst & 15u)) & 15u;
  if (head > n) head = n;
  for (uint64_t i = lane; i < head; i += width) dst[i] = src[i];
  dst += head;
  src += head;
  n -= head;
  uint64_t nvec = n >> 4;
  uint64_t tailStart = nvec << 4;
  for (uint64_t i = tailStart + lane; i < n; i += width) dst[i] = src[i];
  if (nvec == 0) return;

  if (((uintptr_t)src & 15u) == 0) {
    // Same alignment: 16-byte loads and stores, UNROLL independent loads in flight per thread.
    const uint64_t step = (uint64_t)width * UNROLL;
    uint64_t v = lane;
    for (; v + (uint64_t)(UNROLL - 1) * width < nvec; v += step) {
      gin_u128 r[UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) r[u] = gin_ld16_stream(src + ((v + (uint64_t)u * width) << 4));
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) gin_st16(dst + ((v + (uint64_t)u * width) << 4), r[u]);
    }
    for (; v < nvec; v += width) gin_st16(dst + (v << 4), gin_ld16_stream(src + (v << 4)));
  } else {
    // Relative misalignment: each 16-byte store is assembled from the aligned 4-byte words that
    // cover it. Every word loaded holds at least one byte of [src, src+16*nvec), so no load leaves
    // the source's pages.
    const uint32_t byteShift = (uint32_t)((uintptr_t)src & 3u);
    const uint32_t* base = (const uint32_t*)((uintptr_t)src & ~(uintptr_t)3u);
    for (uint64_t v = lane; v < nvec; v += width) {
      const uint32_t* w = base + (v << 2);
      uint32_t a0 = w[0], a1 = w[1], a2 = w[2], a3 = w[3];
      uint32_t a4 = byteShift ? w[4] : 0u;
      uint32_t sh = byteShift * 8u;
      gin_u128 out;
      out.lo = (uint64_t)gin_funnel_r(a0, a1, sh) | ((uint64_t)gin_funnel_r(a1, a2, sh) << 32);
      out.hi = (uint64_t)gin_funnel_r(a2, a3, sh) | ((uint64_t)gin_funnel_r(a3, a4, sh) << 32);
      gin_st16(dst + (v << 4), out);
    }
  }
}
