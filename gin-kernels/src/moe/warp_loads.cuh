// moe/warp_loads.cuh - lane shuffles and ballots, coherent ("fresh") loads of data written during
// the kernel, and bf16 conversions.
#pragma once

#include "../include/gin_sync.cuh"

namespace moe_detail {

// ------------------------------------------------------------------------------------------------
// Small portable helpers.
// ------------------------------------------------------------------------------------------------
GIN_DEVICE_INLINE int shfl_up_i(int v, int delta) {
#if GIN_HIP
  return __shfl_up(v, (unsigned)delta);
#else
  return __shfl_up_sync(0xffffffffu, v, (unsigned)delta);
#endif
}
// shfl_up_i within groups of `width` lanes (a power of two).
GIN_DEVICE_INLINE int shfl_up_w(int v, int delta, int width) {
#if GIN_HIP
  return __shfl_up(v, (unsigned)delta, width);
#else
  return __shfl_up_sync(0xffffffffu, v, (unsigned)delta, width);
#endif
}
GIN_DEVICE_INLINE float shfl_f(float v, int src) { return __int_as_float(gin_shfl_int(__float_as_int(v), src)); }
GIN_DEVICE_INLINE const uint8_t* shfl_ptr(const uint8_t* p, int src) {
  uint64_t u = (uint64_t)(uintptr_t)p;
  uint32_t lo = (uint32_t)gin_shfl_int((int)(uint32_t)u, src);
  uint32_t hi = (uint32_t)gin_shfl_int((int)(uint32_t)(u >> 32), src);
  return (const uint8_t*)(uintptr_t)(((uint64_t)hi << 32) | lo);
}

// Lanes of the warp/wavefront where p holds (bit = lane).
GIN_DEVICE_INLINE uint64_t ballot(bool p) {
#if GIN_HIP
  return (uint64_t)__ballot(p);
#else
  return (uint64_t)__ballot_sync(0xffffffffu, p);
#endif
}

// A ballot as narrow as the warp (32-bit masks on NVIDIA: fewer registers in the reductions).
#if GIN_WARP_SIZE > 32
typedef uint64_t lanemask_t;
GIN_DEVICE_INLINE int lanemask_ffs(lanemask_t m) { return __ffsll((long long)m) - 1; }
#else
typedef uint32_t lanemask_t;
GIN_DEVICE_INLINE int lanemask_ffs(lanemask_t m) { return __ffs((int)m) - 1; }
#endif

// Execution + memory barrier of one warp/wavefront.
GIN_DEVICE_INLINE void syncwarp() {
#if GIN_HIP
  __builtin_amdgcn_fence(__ATOMIC_ACQ_REL, "wavefront");
  __builtin_amdgcn_wave_barrier();
#else
  __syncwarp();
#endif
}

// Loads of data written during this kernel by another block or another GPU (after the matching
// acquire): never through the non-coherent path, and not kept in L1.
GIN_DEVICE_INLINE int ld_fresh_i32(const int* p) {
#if GIN_HIP
  return __hip_atomic_load(p, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
#else
  return __ldcg(p);
#endif
}
GIN_DEVICE_INLINE int4 ld_fresh_i32x4(const int* p) {  // p 16-byte aligned
#if GIN_HIP
  return make_int4(ld_fresh_i32(p), ld_fresh_i32(p + 1), ld_fresh_i32(p + 2), ld_fresh_i32(p + 3));
#else
  return __ldcg((const int4*)p);
#endif
}
GIN_DEVICE_INLINE uint16_t ld_fresh_u16(const uint16_t* p) {
#if GIN_HIP
  return *(const volatile uint16_t*)p;
#else
  return __ldcg((const unsigned short*)p);
#endif
}
GIN_DEVICE_INLINE gin_u128 ld16_fresh(const void* p) {
  gin_u128 v;
#if GIN_HIP
  v.lo = __hip_atomic_load((const uint64_t*)p, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
  v.hi = __hip_atomic_load((const uint64_t*)p + 1, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
#else
  asm volatile("ld.global.cg.v2.u64 {%0, %1}, [%2];" : "=l"(v.lo), "=l"(v.hi) : "l"(p));
#endif
  return v;
}
GIN_DEVICE_INLINE uint64_t ld8_fresh(const void* p) {
#if GIN_HIP
  return __hip_atomic_load((const uint64_t*)p, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
#else
  uint64_t v;
  asm volatile("ld.global.cg.u64 %0, [%1];" : "=l"(v) : "l"(p));
  return v;
#endif
}
template <bool kFresh>
GIN_DEVICE_INLINE gin_u128 ld16(const void* p) {
  return kFresh ? ld16_fresh(p) : gin_ld16_stream(p);
}
// ld16 at p + kOff bytes (an immediate of the instruction): a reduction pass keeps one address
// register pair per row instead of one per vector in flight (16 vectors per lane).
template <bool kFresh, int kOff>
GIN_DEVICE_INLINE gin_u128 ld16_at(const uint8_t* p) {
#if GIN_HIP
  return ld16<kFresh>(p + kOff);
#else
  gin_u128 v;
  if (kFresh)
    asm volatile("ld.global.cg.v2.u64 {%0, %1}, [%2+%3];" : "=l"(v.lo), "=l"(v.hi) : "l"(p), "n"(kOff));
  else
    asm volatile("ld.global.nc.L1::no_allocate.v2.u64 {%0, %1}, [%2+%3];" : "=l"(v.lo), "=l"(v.hi) : "l"(p), "n"(kOff));
  return v;
#endif
}
template <bool kFresh>
GIN_DEVICE_INLINE uint16_t ld_u16(const uint16_t* p) {
  return kFresh ? ld_fresh_u16(p) : *p;
}

GIN_DEVICE_INLINE float bf16_to_f32(uint32_t b) { return __uint_as_float((b & 0xffffu) << 16); }

// Round to nearest even; NaN stays NaN.
GIN_DEVICE_INLINE uint32_t f32_to_bf16(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u;
  u += 0x7fffu + ((u >> 16) & 1u);
  return u >> 16;
}

GIN_DEVICE_INLINE void acc_bf16x8(float* acc, gin_u128 v, float w) {
#pragma unroll
  for (int i = 0; i < 4; ++i) acc[i] += w * bf16_to_f32((uint32_t)(v.lo >> (16 * i)));
#pragma unroll
  for (int i = 0; i < 4; ++i) acc[4 + i] += w * bf16_to_f32((uint32_t)(v.hi >> (16 * i)));
}

GIN_DEVICE_INLINE gin_u128 pack_bf16x8(const float* acc) {
  gin_u128 v;
  v.lo = (uint64_t)f32_to_bf16(acc[0]) | ((uint64_t)f32_to_bf16(acc[1]) << 16) |
         ((uint64_t)f32_to_bf16(acc[2]) << 32) | ((uint64_t)f32_to_bf16(acc[3]) << 48);
  v.hi = (uint64_t)f32_to_bf16(acc[4]) | ((uint64_t)f32_to_bf16(acc[5]) << 16) |
         ((uint64_t)f32_to_bf16(acc[6]) << 32) | ((uint64_t)f32_to_bf16(acc[7]) << 48);
  return v;
}

}  // namespace moe_detail
