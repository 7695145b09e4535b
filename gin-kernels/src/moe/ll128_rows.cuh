// moe/ll128_rows.cuh - rows as LL128 lines (the token path's dispatch staging and combine partials).
#pragma once

#include "routing.cuh"

// ------------------------------------------------------------------------------------------------
// LL128 rows (the token path: dispatch staging and combine partials),
// as gin_a2a_ll128: a 128-byte line = 120 payload bytes + an 8-byte flag = the call number n,
// stored by the 8 lanes of one lane group with one warp store instruction; a reader polls a line
// until its flag is n, so the data proves itself (no progress word, no release fence).
// Payload mapping (keeps 16-byte alignment of the rows): in line L of a row of nl lines, lane j < 7
// of the group carries row bytes [112 L + 16 j, +16), lane 7 carries [112 nl + 8 L, +8) (the row's
// tail region) in its low word and the flag in its high word. Bytes past the row are zero.
// A warp pass covers kTpUnroll lines per group: 16 lines (1,920 payload bytes) on NVIDIA.
// ------------------------------------------------------------------------------------------------
constexpr int kTpUnroll = 4;
constexpr int kTpGroups = GIN_WARP_SIZE / 8;
constexpr int kTpPassLines = kTpUnroll * kTpGroups;

GIN_DEVICE_INLINE uint64_t tp_chunk_off(int L, int j, int nl) {
  return j < 7 ? 112ull * (uint64_t)L + 16ull * (uint64_t)j : 112ull * (uint64_t)nl + 8ull * (uint64_t)L;
}

// 16 (wide) or 8 bytes of a row at byte offset off; zero past rowBytes. fast: rowBytes % 16 == 0
// and the row 16-byte aligned, so a chunk is either wholly inside the row or wholly past it.
template <bool kFresh>
GIN_DEVICE_INLINE gin_u128 tp_load_chunk(const uint8_t* row, uint64_t off, bool wide, uint64_t rowBytes, bool fast) {
  gin_u128 v;
  v.lo = 0;
  v.hi = 0;
  if (off >= rowBytes) return v;
  if (fast) {
    if (wide) v = kFresh ? ld16_fresh(row + off) : gin_ld16_stream(row + off);
    else v.lo = kFresh ? ld8_fresh(row + off) : gin_ld8_stream(row + off);
  } else {
    for (int i = 0; i < (wide ? 8 : 4); ++i) {
      const uint64_t b = off + 2ull * (uint64_t)i;
      if (b >= rowBytes) break;
      const uint64_t e = (uint64_t)ld_u16<kFresh>((const uint16_t*)(row + b));
      if (i < 4) v.lo |= e << (16 * i);
      else v.hi |= e << (16 * (i - 4));
    }
  }
  return v;
}
GIN_DEVICE_INLINE void tp_store_chunk(uint8_t* row, uint64_t off, bool wide, uint64_t rowBytes, bool fast, gin_u128 v) {
  if (off >= rowBytes) return;
  if (fast) {
    if (wide) gin_st16(row + off, v);
    else *(uint64_t*)(row + off) = v.lo;
  } else {
    for (int i = 0; i < (wide ? 8 : 4); ++i) {
      const uint64_t b = off + 2ull * (uint64_t)i;
      if (b >= rowBytes) break;
      ((uint16_t*)(row + b))[0] = (uint16_t)((i < 4 ? v.lo : v.hi) >> (16 * (i & 3)));
    }
  }
}

// Sends lines [L0, L0 + kTpPassLines) of a row as LL128 lines with `flag` (the dispatch's token
// path). kFresh: the row was written during this kernel (coherent loads).
template <bool kFresh>
GIN_DEVICE_INLINE void tp_send_pass(const uint8_t* row, uint8_t* lines, uint64_t rowBytes, int nl, int L0, uint64_t flag,
                                    bool fast) {
  const int lane = (int)gin_lane_id(), g = lane >> 3, j = lane & 7;
  const bool wide = j < 7;
  gin_u128 v[kTpUnroll];
#pragma unroll
  for (int u = 0; u < kTpUnroll; ++u) {
    const int L = L0 + u * kTpGroups + g;
    v[u].lo = 0;
    v[u].hi = 0;
    if (L < nl) v[u] = tp_load_chunk<kFresh>(row, tp_chunk_off(L, j, nl), wide, rowBytes, fast);
  }
  syncwarp();  // the 8 lanes of a line converged: one store instruction per line
#pragma unroll
  for (int u = 0; u < kTpUnroll; ++u) {
    const int L = L0 + u * kTpGroups + g;
    gin_ll128_store16(L < nl, lines + (uint64_t)L * 128ull + 16ull * (uint64_t)j, v[u].lo, wide ? v[u].hi : flag);
  }
}

// This lane's chunks of lines L0 + u * kTpGroups + group (u < kTpUnroll) of an LL128 row, each
// line re-read whole until its flag (lane 7 of the group) is `flag`: payload and flag come from
// one read of the line. Gives up after gin_sync's timeout (GIN_ERR_TIMEOUT).
GIN_DEVICE_INLINE void tp_wait_lines(const uint8_t* base, int nl, int L0, uint64_t flag, uint64_t (&lo)[kTpUnroll],
                                     uint64_t (&hi)[kTpUnroll], uint32_t* errorFlags) {
  const int lane = (int)gin_lane_id(), g = lane >> 3, j = lane & 7;
  syncwarp();
#pragma unroll
  for (int u = 0; u < kTpUnroll; ++u) {
    const int L = L0 + u * kTpGroups + g;
    lo[u] = 0;
    hi[u] = 0;
    gin_ll128_load16(L < nl, base + (uint64_t)L * 128ull + 16ull * (uint64_t)j, lo[u], hi[u]);
  }
  uint32_t pending = 0;
  uint64_t start = 0;
  for (uint32_t spins = 0;; ++spins) {
#pragma unroll
    for (int u = 0; u < kTpUnroll; ++u) {
      const uint64_t f = gin_shfl_u64(hi[u], (lane & ~7) | 7);  // the line's flag, from lane 7 of the group
      const bool live = L0 + u * kTpGroups + g < nl;
      if (live && f != flag) pending |= 1u << u;
      else pending &= ~(1u << u);
    }
    if (!gin_warp_any(pending != 0)) break;
    if (gin_wait_timed_out(spins, start, errorFlags)) break;
    syncwarp();
#pragma unroll
    for (int u = 0; u < kTpUnroll; ++u)
      gin_ll128_load16(((pending >> u) & 1u) != 0, base + (uint64_t)(L0 + u * kTpGroups + g) * 128ull + 16ull * (uint64_t)j,
                       lo[u], hi[u]);
  }
}
