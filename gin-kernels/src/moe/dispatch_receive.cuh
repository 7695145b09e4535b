// moe/dispatch_receive.cuh - the dispatch receivers' count tables (LL words by call parity) and
// the own-token items that sender c and receiver c claim from one counter.
#pragma once

#include "row_movers.cuh"

namespace moe_detail {

struct RecvSmem {
  int cnt[MOE_MAX_EXPERTS];      // [R][L] rows from source s for local expert e
  int rowBase[MOE_MAX_EXPERTS];  // [R][L] first recvX row of (s, e)
  int slots[MOE_MAX_RANKS];      // slots source s sends us
  int lo[MOE_MAX_RANKS];         // this channel's slot range of source s
  int hi[MOE_MAX_RANKS];
  int bad[MOE_MAX_RANKS];        // validation of source s's table
  unsigned long long sum[MOE_MAX_RANKS];
  int nseg[MOE_MAX_RANKS];       // receiver: row split of source s's channel (= its sender's)
  unsigned long long segBytes[MOE_MAX_RANKS];
  int itemEnd[MOE_MAX_RANKS];    // receiver: end of the q-th remote source's items, q = 1..R-1 ([0] = 0)
  int scanTmp[MOE_THREADS];
  int ok;
};

// Count table of source src for call seq in the window at win: two buffers by call parity, so a
// leader never waits before writing its table (the buffer it writes was last read in call n-2,
// and every reader of call n-2 on the owner finished before the owner's call n-1 could end: see
// docs/kernels.md). LL words: (seq << 32) | uint32 value, one single-copy-atomic 8-byte store each, so
// a word whose high half is seq's low 32 bits carries this call's value (no fence, no flag).
GIN_DEVICE_INLINE uint64_t* count_table(const uint8_t* win, const MoeWindowLayout& wl, int src, int R, uint64_t seq) {
  return (uint64_t*)(win + wl.counts + ((seq & 1ull) * (uint64_t)R + (uint64_t)src) * wl.countStride);
}
GIN_DEVICE_INLINE bool ll_tag_ok(uint64_t w, uint64_t seq) { return (uint32_t)(w >> 32) == (uint32_t)seq; }
// Token path: source src's id list of call seq in the window at win (word 0 = T, then the ids);
// double-buffered by call parity exactly like the count tables (same write-after-read argument).
GIN_DEVICE_INLINE uint64_t* ids_area(const uint8_t* win, const MoeWindowLayout& wl, int src, int R, uint64_t seq) {
  return (uint64_t*)(win + wl.dispIds + ((seq & 1ull) * (uint64_t)R + (uint64_t)src) * wl.idsStride);
}
// One table word of call seq into out: block = poll until it is there (timeout: out = 0, false),
// otherwise one probe (false when it is not there yet).
GIN_DEVICE_INLINE bool ll_table_get(const uint64_t* p, uint64_t seq, bool block, uint32_t* errorFlags, int& out) {
  uint64_t w = gin_ld_relaxed_sys(p);
  if (!ll_tag_ok(w, seq)) {
    out = 0;
    if (!block) return false;
    uint64_t start = 0;
    for (uint32_t spins = 0;; ++spins) {
      w = gin_ld_relaxed_sys(p);
      if (ll_tag_ok(w, seq)) break;
      if (gin_wait_timed_out(spins, start, errorFlags)) return false;
    }
  }
  out = (int)(uint32_t)w;
  return true;
}

// Count tables of every source of call seq (LL words in this rank's window): cnt, slots, channel
// c's slot range per source, validation (a source whose numbers cannot be right contributes
// nothing, never out of bounds) and rowBase[s][e] = expertStart[e] + sum_{s'<s} cnt[s'][e], where
// expertStart is the exclusive prefix of the d.A-aligned expert block sizes.
// recvCountsOut (optional) receives the per-expert totals. block = false: a probe that returns
// false (nothing else done) when any word of this call is missing. Whole block; ends with a
// barrier. The loads of all R*L = E count words are in flight together (<= 4 per thread), the
// checks are warp reductions (adding every count into a 64-bit shared word with atomics, a
// compare-and-swap loop with 128 lanes on one word at L = 128, costs ~5 us).
GIN_DEVICE_INLINE bool recv_tables(RecvSmem& s, const Dims& d, int c, const uint8_t* ownWin, const MoeWindowLayout& wl,
                                   uint64_t seq, bool block, int* recvCountsOut, uint32_t* errorFlags) {
  const int tid = (int)threadIdx.x, B = (int)blockDim.x;
  const int lane = (int)gin_lane_id(), warp = tid / GIN_WARP_SIZE, nw = B / GIN_WARP_SIZE;
  if (tid == 0) s.ok = 1;
  // Blocking read: one thread per source polls one word (this channel's lo) until it carries the
  // tag, then the block reads every word (nearly all there by then), rather than all R*L word
  // threads of all C receiver blocks spinning (DeepSeek-V3: ~17K threads) on the few L2 lines
  // that the senders' own loads and the peer's table stores go through.
  if (block && tid < d.R) {
    int unused = 0;
    (void)ll_table_get(count_table(ownWin, wl, tid, d.R, seq) + d.L + 1 + c, seq, true, errorFlags, unused);
  }
  __syncthreads();
  const int n = d.R * d.L;
  bool missing = false;
  for (int i0 = tid; i0 < n; i0 += 4 * B) {
    uint64_t w[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int i = i0 + u * B;
      w[u] = i < n ? gin_ld_relaxed_sys(count_table(ownWin, wl, i / d.L, d.R, seq) + i % d.L) : 0ull;
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int i = i0 + u * B;
      if (i >= n) continue;
      int v = (int)(uint32_t)w[u];
      if (!ll_tag_ok(w[u], seq) && !ll_table_get(count_table(ownWin, wl, i / d.L, d.R, seq) + i % d.L, seq, block, errorFlags, v))
        missing = true;
      s.cnt[i] = v;
    }
  }
  for (int src = tid; src < d.R; src += B) {
    const uint64_t* table = count_table(ownWin, wl, src, d.R, seq);
    int sl = 0, lo = 0, hi = 0;
    bool got = ll_table_get(table + d.L, seq, block, errorFlags, sl);
    got &= ll_table_get(table + d.L + 1 + c, seq, block, errorFlags, lo);
    got &= ll_table_get(table + d.L + 2 + c, seq, block, errorFlags, hi);
    if (!got) missing = true;
    s.slots[src] = sl;
    s.lo[src] = lo;
    s.hi[src] = hi;
  }
  if (missing) s.ok = 0;  // every writer stores the same value
  __syncthreads();
  if (!block && s.ok == 0) {
    __syncthreads();  // every thread read s.ok before the next writer of it
    return false;
  }
  for (int src = warp; src < d.R; src += nw) {  // one warp per source (warp-uniform loop)
    unsigned long long sum = 0ull;
    bool bad = false;
    for (int e = lane; e < d.L; e += GIN_WARP_SIZE) {
      const int v = s.cnt[src * d.L + e];
      if (v < 0 || v > d.M) bad = true;
      else sum += (unsigned long long)v;
    }
#pragma unroll
    for (int off = GIN_WARP_SIZE / 2; off > 0; off >>= 1) sum += gin_shfl_u64(sum, lane ^ off);
    const bool anyBad = moe_detail::ballot(bad) != 0ull;
    if (lane == 0) {
      s.sum[src] = sum;
      s.bad[src] = anyBad ? 1 : 0;
    }
  }
  __syncthreads();
  const unsigned long long maxRowsPerSource = (unsigned long long)d.M * (unsigned long long)moe_min_i(d.K, d.L);
  for (int src = tid; src < d.R; src += B) {
    const bool bad = s.bad[src] != 0 || s.slots[src] < 0 || s.slots[src] > d.M || s.lo[src] < 0 ||
                     s.lo[src] > s.hi[src] || s.hi[src] > s.slots[src] || s.sum[src] > maxRowsPerSource;
    s.bad[src] = bad ? 1 : 0;
    if (bad) {
      gin_error_set(errorFlags, MOE_ERR_COUNTS);
      s.slots[src] = 0;
      s.lo[src] = s.hi[src] = 0;
    }
  }
  __syncthreads();
  for (int i = tid; i < d.R * d.L; i += B)
    if (s.bad[i / d.L]) s.cnt[i] = 0;
  __syncthreads();
  for (int e = tid; e < d.L; e += B) {
    int tot = 0;
    for (int src = 0; src < d.R; ++src) tot += s.cnt[src * d.L + e];
    s.rowBase[e] = moe_expert_block_rows(tot, d.A);  // scanned below into the expert starts
    if (recvCountsOut != nullptr) recvCountsOut[e] = tot;
  }
  __syncthreads();
  block_exclusive_scan(s.rowBase, d.L, s.scanTmp);
  for (int e = tid; e < d.L; e += B) {
    int run = s.rowBase[e];
    for (int src = 0; src < d.R; ++src) {
      s.rowBase[src * d.L + e] = run;
      run += s.cnt[src * d.L + e];
    }
  }
  __syncthreads();
  return true;
}

// Own tokens of channel c (slots [lo, hi) of this rank's slots to itself) go into recvX straight
// from x, as (slot, segment) items that sender c and receiver c claim from one counter (the low
// 32 bits of claimWord = state HIST_READY[c], reset to n << 32 by sender c when it published the
// positions): whoever is free takes the next item (receiver warps between remote items that have
// not landed yet, sender warps after their sends), so the own work overlaps the NVLink traffic
// and spreads over both halves of the grid. Needs the block's tables (recv_tables); the caller
// has seen claimWord >= n << 32 (positions written). Returns false when no item was left.
struct OwnWork {
  int lo, n, items;
  RowSplit sp;
};
GIN_DEVICE_INLINE OwnWork own_work(const RecvSmem& rs, const Dims& d) {
  OwnWork w;
  w.lo = rs.lo[d.rank];
  w.n = rs.hi[d.rank] - rs.lo[d.rank];
  w.sp = row_split(d.rowBytes, w.n);
  w.items = w.n * w.sp.nseg;
  return w;
}
// kXFresh: x was written during this kernel (the quantizing fp8 dispatch's rows): coherent loads.
template <bool kXFresh>
GIN_DEVICE_INLINE bool own_claim_item(const RecvSmem& rs, const OwnWork& ow, const Dims& d, uint64_t* claimWord,
                                      const uint16_t* x, const int32_t* topkIdx, const float* topkWeights,
                                      const int* sendList, const int* slotInExpert, int* slotRows, uint16_t* recvX,
                                      float* recvWeights, bool fast, uint32_t* errorFlags) {
  const int lane = (int)gin_lane_id();
  int i = 0;
  if (lane == 0) i = (int)(uint32_t)atomicAdd((unsigned long long*)claimWord, 1ull);
  i = gin_shfl_int(i, 0);
  if (i >= ow.items) return false;
  const int j = i / ow.sp.nseg, seg = i - j * ow.sp.nseg;
  uint64_t b0, b1;
  seg_range(ow.sp, seg, d.rowBytes, b0, b1);
  const int slot = ow.lo + j;
  // sendList / slotInExpert were written by sender c during this kernel: coherent loads.
  const int t = ld_fresh_i32(sendList + (uint64_t)d.rank * d.M + slot);
  const bool tokenOk = t >= 0 && t < d.T;
  const uint8_t* src = (const uint8_t*)x + (uint64_t)(tokenOk ? t : 0) * d.rowBytes;
  // The row's first pass, the ids, positions and weights in flight together (not the weight
  // after the ids and the row after the weight's store: 3 round trips after sendList).
  gin_u128 pass[kExpandUnroll];
  if (fast && tokenOk) expand_load_pass<kXFresh>(pass, src, b0 >> 4, b1 >> 4);
  int row = -1;
  float wt = 0.f;
  if (lane < d.K && tokenOk) {
    const int e = topkIdx[(uint64_t)t * d.K + lane];
    const int sl = ld_fresh_i32(slotInExpert + (uint64_t)t * d.K + lane);
    const float w = topkWeights[(uint64_t)t * d.K + lane];
    if (sl >= 0 && e / d.L == d.rank) {
      const int le = e - d.rank * d.L;
      if (sl < rs.cnt[d.rank * d.L + le]) {
        row = rs.rowBase[d.rank * d.L + le] + sl;
        wt = w;
      } else if (seg == 0) {
        gin_error_set(errorFlags, MOE_ERR_COUNTS);
      }
    }
  }
  if (seg == 0) {
    if (lane < d.K) slotRows[((uint64_t)d.rank * d.M + slot) * d.K + lane] = row;
    if (row >= 0) recvWeights[row] = wt;
  }
  if (tokenOk) warp_expand_seg<kXFresh>(src, (uint8_t*)recvX, d.rowBytes, row, d.K, fast, b0, b1, pass, fast);
  return true;
}

}  // namespace moe_detail
