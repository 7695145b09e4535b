// moe/fp8.cuh - scaled fp8 rows from bf16 rows (moe_fp8_quantize and the quantizing fp8 dispatch).
#pragma once

#include "routing.cuh"

// ================================================================================================
// Scaled fp8 rows from bf16 rows: moe_fp8_quantize and the quantizing fp8 dispatch.
// Per 128-element block of a row (the last may be short): amax = max |x|, scale = amax / FMAX
// (1 where amax = 0), code = e4m3(x * (FMAX / amax)), rounded to nearest even and saturated to
// +-FMAX. FMAX = 448 for e4m3fn (NVIDIA), 240 for e4m3fnuz (gfx942, the format its fp8 units take).
// Non-finite inputs give non-finite scales or codes. out: [T][moe_fp8_row_bytes(H)], the padding
// scales zero.
// ================================================================================================
namespace moe_detail {
#if GIN_HIP
constexpr bool kFp8Fnuz = true;
#else
constexpr bool kFp8Fnuz = false;
#endif
constexpr float kFp8Max = kFp8Fnuz ? 240.f : 448.f;

// Round to nearest even, saturate to +-kFp8Max (a ≥ 0 here; the sign is added by the caller).
GIN_DEVICE_INLINE uint32_t fp8_e4m3_magnitude(float a) {
  constexpr int kBias = kFp8Fnuz ? 8 : 7;
  if (a >= kFp8Max) a = kFp8Max;
  const float minNormal = ldexpf(1.f, 1 - kBias);
  if (a < minNormal) return (uint32_t)rintf(ldexpf(a, kBias + 2));  // subnormal steps of 2^(-bias-2); 8 = the min normal
  int e;
  const float f = frexpf(a, &e);                                    // a = f * 2^e, f in [0.5, 1)
  uint32_t m = (uint32_t)rintf((2.f * f - 1.f) * 8.f), E = (uint32_t)(e - 1 + kBias);
  if (m == 8u) {
    m = 0u;
    ++E;
  }
  return (E << 3) | m;
}
GIN_DEVICE_INLINE uint32_t fp8_e4m3(float v) {
  if (v != v) return kFp8Fnuz ? 0x80u : 0x7fu;  // NaN
  const uint32_t mag = fp8_e4m3_magnitude(fabsf(v));
  if (kFp8Fnuz && mag == 0u) return 0u;           // fnuz has no negative zero (0x80 is its NaN)
  return ((__float_as_uint(v) >> 31) << 7) | mag;  // the sign bit, as the hardware conversion keeps it
}
// Four codes, v[0] in the low byte. sm_89+: the hardware conversion (same rounding, saturation and
// signed zero as fp8_e4m3).
GIN_DEVICE_INLINE uint32_t fp8_e4m3x4(const float (&v)[4]) {
#if !GIN_HIP && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint16_t lo, hi;  // cvt puts its first source in the upper byte
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(lo) : "f"(v[1]), "f"(v[0]));
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(hi) : "f"(v[3]), "f"(v[2]));
  return (uint32_t)lo | ((uint32_t)hi << 16);
#else
  uint32_t c = 0u;
#pragma unroll
  for (int i = 0; i < 4; ++i) c |= fp8_e4m3(v[i]) << (8 * i);
  return c;
#endif
}

// Per 16-bit half, the larger (unsigned).
GIN_DEVICE_INLINE uint32_t max_u16x2(uint32_t a, uint32_t b) {
#if GIN_HIP
  const uint32_t al = a & 0xffffu, bl = b & 0xffffu, ah = a >> 16, bh = b >> 16;
  return (al > bl ? al : bl) | ((ah > bh ? ah : bh) << 16);
#else
  return __vmaxu2(a, b);
#endif
}
// Tokens [t0, t0 + n) of x (bf16 rows of H) -> scaled fp8 rows out[t] (moe_fp8_row_bytes(H) bytes
// each), by warps warpIdx of nWarps (warp-uniform arguments; every lane of a warp calls). A group of
// kQuantLanes lanes per (token, 128-block), each lane 128 / kQuantLanes elements (chunks of 8, one
// 16-byte load each, chunk j * kQuantLanes + lane of the block), kQuantUnroll blocks per group at a
// time with all their loads in flight: one load per lane at a time kept an H200 at ~1.3 TB/s
// (4096 x 7168: 68 us), latency- not bandwidth-bound. H % 16 == 0, x 16-byte and out 8-byte aligned
// (the callers check). moe_fp8_quantize runs it over the grid, the quantizing dispatch over a
// block's share of its channel's tokens.
template <int kQuantLanes, int kQuantUnroll>
GIN_DEVICE_INLINE void fp8_quantize_tokens_by(const uint16_t* x, int hidden, uint8_t* out, uint64_t t0, uint64_t n,
                                              uint64_t warpIdx, uint64_t nWarps) {
  constexpr int kChunks = 16 / kQuantLanes, kGroups = GIN_WARP_SIZE / kQuantLanes;
  static_assert(kQuantLanes == 16 || kQuantLanes == 8 || kQuantLanes == 4 || kQuantLanes == 2, "a block is 16 chunks of 8 elements");
  const int S = moe_fp8_scales(hidden), Sp = (S + 3) / 4 * 4;
  const uint64_t rowBytes = moe_fp8_row_bytes(hidden);
  const int lane = (int)gin_lane_id(), sub = lane % kQuantLanes, grp = lane / kQuantLanes;
  constexpr uint64_t kPerWarp = (uint64_t)kGroups * kQuantUnroll;  // blocks a warp takes per iteration
  const uint64_t items = n * (uint64_t)S;
  const bool items32 = items < (1ull << 32);  // 32-bit item arithmetic (a 64-bit division is a long call)
  for (uint64_t base = warpIdx * kPerWarp; base < items; base += nWarps * kPerWarp) {  // warp-uniform
    uint32_t w[kQuantUnroll][kChunks][4];  // the lane's bf16 values of block u, chunk j, two per word
    uint64_t t[kQuantUnroll];
    int b[kQuantUnroll];
#pragma unroll
    for (int u = 0; u < kQuantUnroll; ++u) {
      const uint64_t it = base + (uint64_t)(u * kGroups + grp);
      t[u] = items32 ? (uint64_t)((uint32_t)it / (uint32_t)S) : it / (uint64_t)S;
      b[u] = (int)(it - t[u] * (uint64_t)S);
      t[u] += t0;
#pragma unroll
      for (int j = 0; j < kChunks; ++j) {
        const int h0 = b[u] * 128 + (j * kQuantLanes + sub) * 8;  // H % 16 == 0: a chunk is all in the row or none
        gin_u128 raw;
        raw.lo = raw.hi = 0;
        if (it < items && h0 < hidden) raw = *(const gin_u128*)(x + t[u] * (uint64_t)hidden + (uint64_t)h0);
        w[u][j][0] = (uint32_t)raw.lo;
        w[u][j][1] = (uint32_t)(raw.lo >> 32);
        w[u][j][2] = (uint32_t)raw.hi;
        w[u][j][3] = (uint32_t)(raw.hi >> 32);
      }
    }
#pragma unroll
    for (int u = 0; u < kQuantUnroll; ++u) {
      // amax over the group on the bf16 bits (the float form with a NaN test per
      // element is ~2x the instructions): |x| as 15-bit magnitudes order like the values, a NaN
      // above every number; canonical NaN.
      uint32_t m2 = 0u;
#pragma unroll
      for (int j = 0; j < kChunks; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) m2 = max_u16x2(m2, w[u][j][i] & 0x7fff7fffu);
      int m = (int)((m2 & 0xffffu) > (m2 >> 16) ? (m2 & 0xffffu) : (m2 >> 16));
#pragma unroll
      for (int o = kQuantLanes / 2; o > 0; o >>= 1) {
        const int other = gin_shfl_xor_int(m, o);
        m = other > m ? other : m;
      }
      if (m > 0x7f80) m = 0x7fc0;
      if (base + (uint64_t)(u * kGroups + grp) >= items) continue;
      const float amax = __uint_as_float((uint32_t)m << 16);
      uint8_t* row = out + t[u] * rowBytes;
      // x * (FMAX / amax): one division per block, not per element (a division each kept the kernel
      // ALU-bound: 45 us at 4096 x 7168). Blocks of bf16 subnormals are scaled up by 2^64 first
      // (exact), else FMAX / amax overflows; (x * 2^64) * inv, as x * (2^64 * inv) may overflow.
      const bool tiny = amax < 0x1p-100f;
      const float pre = tiny ? 0x1p64f : 1.f;
      const float inv = amax == 0.f ? 0.f : kFp8Max / (amax * pre);
#pragma unroll
      for (int j = 0; j < kChunks; ++j) {
        const int h0 = b[u] * 128 + (j * kQuantLanes + sub) * 8;
        if (h0 >= hidden) continue;
        float q[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) q[i] = bf16_to_f32(w[u][j][i / 2] >> (16 * (i & 1)));
        if (tiny) {
#pragma unroll
          for (int i = 0; i < 8; ++i) q[i] *= pre;
        }
#pragma unroll
        for (int i = 0; i < 8; ++i) q[i] *= inv;
        const float q0[4] = {q[0], q[1], q[2], q[3]}, q1[4] = {q[4], q[5], q[6], q[7]};
        *(uint64_t*)(row + h0) = (uint64_t)fp8_e4m3x4(q0) | ((uint64_t)fp8_e4m3x4(q1) << 32);
      }
      float* scales = (float*)(row + hidden);
      if (sub == 0) {
        scales[b[u]] = amax == 0.f ? 1.f : amax / kFp8Max;
        if (b[u] == S - 1)
          for (int p = S; p < Sp; ++p) scales[p] = 0.f;  // padding
      }
    }
  }
}
// The lane grouping by work per warp (1x H200, DeepSeek-V3): where one iteration of
// 8-lane groups covers a warp's share (2 tokens per sender block at 128 tokens: 112 blocks over 16
// warps) they take it in one round, with every warp busy; 4-lane groups would leave half the warps
// idle (+1.3 us to "quantized"), 16-lane groups need two rounds (+0.7 us).
// Above that, 4-lane groups keep the most loads in flight: at 4 tokens per block 21.0 against 21.3
// (8-lane) and 25 us (16-lane) per gated call, and moe_fp8_quantize at 4096 x 7168 ~30 us
// against 35 (16-lane). Two lanes per block (moe_fp8_quantize at 4096 tokens: 1.8-2.0 TB/s) and 4
// blocks per group (the dispatch at its 128-register limit) were slower.
GIN_DEVICE_INLINE void fp8_quantize_tokens(const uint16_t* x, int hidden, uint8_t* out, uint64_t t0, uint64_t n,
                                           uint64_t warpIdx, uint64_t nWarps) {
  const uint64_t items = n * (uint64_t)moe_fp8_scales(hidden);
  if (items <= nWarps * (GIN_WARP_SIZE / 8) * 2) fp8_quantize_tokens_by<8, 2>(x, hidden, out, t0, n, warpIdx, nWarps);
  else fp8_quantize_tokens_by<4, 2>(x, hidden, out, t0, n, warpIdx, nWarps);
}
}  // namespace moe_detail
