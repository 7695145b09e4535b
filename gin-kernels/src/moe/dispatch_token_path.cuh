// moe/dispatch_token_path.cuh - the dispatch on the token path (moe_token_path): senders push their
// tokens' ids and then each row as LL128 lines to staging slot = token index; receivers lay out
// every source themselves and copy each line as it lands.
#pragma once

#include "dispatch_call.cuh"

// Token-path sender (blocks [0, C)).
// Rows go out at once, into the receiver's staging slot = the token's own index (a token goes
// to rank r iff one of its ids is in r's range), after the token's ids as LL words into every
// remote rank's id list; the receivers run the layout themselves. Before the sends only what
// they need: the ids pushed (range-checked; the receivers drop repeats
// with the same rule as the layout) and each own token's destination ranks, one warp per token
// with lane k on id k, rather than the small layout's whole id walk first (4-6 us, one token
// per thread). What the combine reads of the sending side (tokenPos; the last block's
// chanStartTo and T) follows the sends, from destination masks alone (tp_send_positions).
template <bool kXFresh>
GIN_DEVICE_INLINE void dispatch_tp_sender(const DispatchCall& call, LayoutSmem& s, int*& tpTokenPos, int*& tpChanStartTo,
                                        uint64_t*& tpState) {
  const uint16_t* const x = call.x;
  const uint16_t* const xBf16 = call.xBf16;
  uint8_t* const xq = call.xq;
  const bool quant = call.quant;
  const int32_t* const topkIdx = call.topkIdx;
  const float* const topkWeights = call.topkWeights;
  const uint64_t* const peerBases = call.peerBases;
  uint8_t* const workspace = call.workspace;
  uint32_t* const errorFlags = call.errorFlags;
  const Dims& d = call.d;
  const MoeWindowLayout& wl = call.wl;
  const MoeWorkspaceLayout& ws = call.ws;
  int* const tokenPos = call.tokenPos;
  const bool fast = call.fast;
  uint8_t* const ownWin = call.ownWin;
  const uint64_t seq = call.seq;
  const uint64_t seqHi = call.seqHi;
  uint64_t* const state = call.state;
  const int tid = call.tid;
  const int B = call.B;
  const int lane = call.lane;
  const int warp = call.warp;
  const int c = (int)blockIdx.x;
  GIN_TRACE(MOE_TRACE_DISPATCH_START);
  int t0, t1;
  token_range(d, c, t0, t1);
  // Write-after-read on the remote staging: as in the layout path (all of r's receivers of the
  // previous call are done; one acquire per flag by the last threads, waited for if missing).
  const int warFlags = (d.R - 1) * d.C;
  auto warFlag = [&](int i) -> const uint64_t* {
    const int r = (d.rank + 1 + i / d.C) % d.R;
    return (const uint64_t*)(ownWin + wl.dispConsumed) +
           (uint64_t)moe_peer_section(r, d.rank, d.R) * MOE_MAX_CHANNELS + (uint64_t)(i % d.C);
  };
  bool warSeen = true;
  for (int i = B - 1 - tid; i < warFlags; i += B) warSeen &= gin_ld_acquire_sys(warFlag(i)) >= seq - 1;
  if (c == 0 && tid == B - GIN_WARP_SIZE)  // T into every remote rank's id list (word 0)
    for (int r = 0; r < d.R; ++r)
      if (r != d.rank)
        gin_st_relaxed_sys(ids_area((const uint8_t*)peerBases[r], wl, d.rank, d.R, seq), seqHi | (uint64_t)(uint32_t)d.T);
  {
    const int nw = moe_id_words(d.K);
    const int Kp = id_group_size(d.K);  // the repeat check's lane group (lanes >= K hold -1)
    if (tid >= t1 - t0 && tid < 32) s.tokDest[tid] = 0u;  // no token there
    for (int j = warp; j < t1 - t0; j += MOE_WARPS) {  // own token t0 + j (<= 32 on the token path)
      const int t = t0 + j;
      int e = -1;
      bool bad = false;
      if (t < t1 && lane < d.K) {
        e = topkIdx[(uint64_t)t * d.K + lane];
        bad = e < -1 || e >= d.E;
        if (e < 0 || e >= d.E) e = -1;
      }
      // Reported here, by the token's own block (the ids go out range-checked only; every
      // receiver drops repeats by the same rule).
      bad |= id_repeats_lower(e, lane & (Kp - 1), Kp);
      if (gin_warp_any(bad) && lane == 0) gin_error_set(errorFlags, MOE_ERR_EXPERT_ID);
      // Ids 2i and 2i + 1 into word i of the token's list in every remote rank's window.
      const int hi = gin_shfl_int(e, (2 * lane + 1) % GIN_WARP_SIZE);
      const int lo = gin_shfl_int(e, (2 * lane) % GIN_WARP_SIZE);
      if (t < t1 && lane < nw) {
        const uint32_t a = (uint32_t)lo & 0xffffu;
        const uint32_t b = 2 * lane + 1 < d.K ? (uint32_t)hi & 0xffffu : 0xffffu;
        for (int q = 1; q < d.R; ++q) {
          const int r = (d.rank + q) % d.R;
          uint64_t* dst = ids_area((const uint8_t*)peerBases[r], wl, d.rank, d.R, seq) + 1 + (uint64_t)t * (uint64_t)nw;
          gin_st_relaxed_sys(dst + lane, seqHi | (uint64_t)(a | (b << 16)));
        }
      }
      // Destination ranks of the token: one bit per rank, OR-ed over the lanes.
      uint32_t dm = e >= 0 ? 1u << (e / d.L) : 0u;
#pragma unroll
      for (int off = GIN_WARP_SIZE / 2; off > 0; off >>= 1) dm |= (uint32_t)gin_shfl_xor_int((int)dm, off);
      if (lane == 0) s.tokDest[j] = dm;
    }
  }
  GIN_TRACE(MOE_TRACE_TP_SENDER_IDS);  // thread 0: its token's ids out and destinations known (then the write-after-read waits)
  if (quant) {
    // Every warp, after its token's ids (2 ranks on one H200, DeepSeek-V3, 128
    // tokens: only the warps without ids quantizing was 0.5 us slower). One round of loads per
    // warp where the share allows it (fp8_quantize_tokens' lane grouping).
    fp8_quantize_tokens(xBf16, d.H, xq, (uint64_t)t0, (uint64_t)(t1 - t0), (uint64_t)warp, MOE_WARPS);
    GIN_TRACE(MOE_TRACE_SENDER_QUANTIZED);  // thread 0: its warp's share of the fp8 rows stored
  }
  for (int r = tid; r < d.R; r += B) s.runD[r] = 0;  // tp_send_positions' counters
  if (c == d.C - 1)
    for (int i = tid; i < d.C * d.R; i += B) s.u.lead.histD[i] = 0;
  if (!warSeen)
    for (int i = B - 1 - tid; i < warFlags; i += B) (void)gin_wait_geq(warFlag(i), seq - 1, errorFlags);
  if (tid == 0) {
    tpTokenPos = tokenPos;
    tpChanStartTo = (int*)(workspace + ws.chanStartTo);
    tpState = state;
  }
#if GIN_HIP
  if (quant) __threadfence();  // every wave's xq stores before the one release below
#endif
  __syncthreads();  // destinations known; the write-after-read acquires before any staging store
  // Our fp8 rows are in xq: receiver c's own items may read them (the barrier orders every
  // thread's xq stores before the release).
  if (quant && tid == B - GIN_WARP_SIZE) gin_st_release_gpu(state + MOE_STATE_QUANT_READY + c, seq);
  GIN_TRACE(MOE_TRACE_TP_SENDER_SENDS);
  {
    for (int q = 1; q < d.R; ++q) {
      const int r = (d.rank + 1 + (c + q - 1) % (d.R - 1)) % d.R;
      const uint32_t mr = (uint32_t)moe_detail::ballot(lane < 32 && ((s.tokDest[lane & 31] >> r) & 1u) != 0u);  // bit j: token t0 + j
      const int cnt = __popc(mr);
      if (cnt == 0) continue;
      // Section base in r's window (staging rows and metadata are offsets from it).
      uint8_t* peerWin = (uint8_t*)peerBases[r];
      const uint64_t sec = (uint64_t)moe_peer_section(d.rank, r, d.R);
      // Items (token, pass of kTpPassLines lines): the channel's tokens to r in token order (cnt
      // of them), each row as LL128 lines with flag n into staging slot t (until then
      // row_split segments, each followed by a release of the warp's progress word: a system
      // fence per item on the critical path). Pass 0 also carries the token's K weights, as LL
      // words (n << 32 | bits) in the slot's metadata (the receiver has the ids already).
      const int nl = (int)moe_row_lines(d.rowBytes);
      const int npass = (nl + kTpPassLines - 1) / kTpPassLines;
      const int items = cnt * npass;
      for (int i = warp; i < items; i += MOE_WARPS) {
        const int j = i / npass, pass = i - j * npass;
        uint32_t m = mr;
        for (int u = 0; u < j; ++u) m &= m - 1u;
        const int t = t0 + __ffs((int)m) - 1;
        const uint64_t slotIx = sec * (uint64_t)d.M + (uint64_t)t;  // staging slot = token index
        if (pass == 0 && lane < d.K)
          gin_st_relaxed_sys((uint64_t*)(peerWin + wl.dispMeta + slotIx * wl.metaStride) + lane,
                             seqHi | (uint64_t)__float_as_uint(topkWeights[(uint64_t)t * d.K + lane]));
        tp_send_pass<kXFresh>((const uint8_t*)x + (uint64_t)t * d.rowBytes, peerWin + wl.dispRows + slotIx * wl.dispSlotStride,
                     d.rowBytes, nl, pass * kTpPassLines, seq, fast);
      }
    }
    GIN_TRACE_SYNC();
    GIN_TRACE(MOE_TRACE_SENDER_SENT);
  }
  tp_send_positions(s, topkIdx, d, c, t0, t1, *(int* volatile*)&tpTokenPos, *(int* volatile*)&tpChanStartTo,
                    *(uint64_t* volatile*)&tpState);
  GIN_TRACE_SYNC();
  GIN_TRACE(MOE_TRACE_TP_SENDER_END);
}

// Token-path receiver (blocks [C, 2C)).
// Every source's id list (own: topkIdx) -> this rank's layout of every source restricted to
// what channel c needs: rows per (source, local expert) for rowBase, and for s's tokens of
// channel c (token range by s's T) the rows before them (run) and bit masks (mask), the slots
// before them (runD) and which come here (maskD). Slots, rows and slotRows come out exactly as
// the layout path's (positions by token order per source). Receiver 0 also writes recvCounts,
// slotsFrom and chanStartFrom.
template <bool kXFresh>
GIN_DEVICE_INLINE void dispatch_tp_receiver(const DispatchCall& call, TpRecvSmem& s) {
  const uint16_t* const x = call.x;
  const bool quant = call.quant;
  const int32_t* const topkIdx = call.topkIdx;
  const float* const topkWeights = call.topkWeights;
  uint16_t* const recvX = call.recvX;
  float* const recvWeights = call.recvWeights;
  int32_t* const recvCounts = call.recvCounts;
  uint8_t* const workspace = call.workspace;
  uint32_t* const errorFlags = call.errorFlags;
  const Dims& d = call.d;
  const MoeWindowLayout& wl = call.wl;
  const MoeWorkspaceLayout& ws = call.ws;
  const bool fast = call.fast;
  uint8_t* const ownWin = call.ownWin;
  const uint64_t seq = call.seq;
  uint64_t* const state = call.state;
  const int B = call.B;
  const int lane = call.lane;
  const int warp = call.warp;
  const int c = (int)blockIdx.x - d.C;
  GIN_TRACE(MOE_TRACE_DISPATCH_START);
  tp_recv_layout(s, d, c, wl, ownWin, workspace, ws, seq, topkIdx, recvCounts, errorFlags);
  const int nw = moe_id_words(d.K);
  __syncthreads();
  GIN_TRACE(MOE_TRACE_TP_RECEIVER_LAYOUT);
  if (c == 0) {
    // What the combine reads: slots per source and their channel boundaries (one warp per
    // source, a shuffle scan over the channels' counts). Before the items: after them, its
    // pointers held through the item loop cost the kernel a stack frame on sm_90.
    int* slotsFrom = *(int* volatile*)&s.slotsFrom;
    int* chanStartFrom = *(int* volatile*)&s.chanStartFrom;
    const int nwarps = B / GIN_WARP_SIZE;
    for (int src = warp; src < d.R; src += nwarps) {
      (void)warp_chan_scan(s.hist + src * d.C, 1, d.C,
                           [&](int j, int v) { chanStartFrom[src * (MOE_MAX_CHANNELS + 1) + j] = v; });
      if (lane == 0) {
        chanStartFrom[src * (MOE_MAX_CHANNELS + 1) + d.C] = s.slots[src];
        slotsFrom[src] = s.slots[src];
      }
    }
  }
  int* slotRows = *(int* volatile*)&s.slotRows;
  const int capacity = (int)moe_recv_capacity_rows(d.R, d.E, d.K, d.M, d.A);
  const int totalItems = s.itemEnd[d.R];
  bool firstRemote = true;
  bool quantSeen = !quant;  // the quantizing dispatch: sender c's fp8 rows of our own tokens are in xq
  for (int g = warp; g < totalItems; g += MOE_WARPS) {
    int q = 0;
    while (g >= s.itemEnd[q + 1]) ++q;
    const int src = (d.rank + q) % d.R;
    const bool self = q == 0;
    const int i = g - s.itemEnd[q];
    RowSplit sp;
    sp.nseg = s.nseg[src];
    sp.segBytes = s.segBytes[src];
    const int j = i / sp.nseg, seg = i - j * sp.nseg;
    uint64_t b0, b1;
    seg_range(sp, seg, d.rowBytes, b0, b1);
    uint32_t m = s.maskD[src];
    for (int u = 0; u < j; ++u) m &= m - 1u;
    const int bit = __ffs((int)m) - 1;
    const int t = s.t0s[src] + bit;
    const int slot = s.runD[src] + j;
    // An own item's loads first, all in flight together: the row's pass and the token's weights
    // with its ids below (ids, then the pass, then the weights would be three dependent
    // round trips, ~0.8 us each at one rank, before the item's first store).
    gin_u128 pass[kExpandUnroll];
    float wt = 0.f;
    const uint8_t* xRow = (const uint8_t*)x + (uint64_t)t * d.rowBytes;
    if (self) {
      if (!quantSeen) {
        if (lane == 0) (void)gin_wait_geq(state + MOE_STATE_QUANT_READY + c, seq, errorFlags);
        syncwarp();  // lane 0's acquire, then the barrier: every lane may read xq
        quantSeen = true;
        if (warp == 0) GIN_TRACE(MOE_TRACE_TP_RECEIVER_QUANT_SEEN);  // thread 0: sender c's fp8 rows seen
      }
      if (fast) expand_load_pass<kXFresh>(pass, xRow, b0 >> 4, b1 >> 4);
      if (seg == 0 && lane < d.K) wt = topkWeights[(uint64_t)t * d.K + lane];
    }
    // Lane k's id of token t (before any flag: the ids are here), validated like token_experts
    // (range, then a repeat of an earlier slot's id is masked).
    int e = -1;
    if (lane < d.K) {
      if (self) {
        e = topkIdx[(uint64_t)t * d.K + lane];
      } else {
        const uint64_t w = gin_ld_relaxed_sys(s.ids[src] + (uint32_t)(t * nw + (lane >> 1)));
        const uint32_t v = (uint32_t)(w >> (16 * (lane & 1))) & 0xffffu;
        e = v == 0xffffu ? -1 : (int)v;
      }
      if (e < 0 || e >= d.E) e = -1;
    }
    bool dup = false;
    for (int k = 0; k < d.K; ++k) {
      const int o = gin_shfl_int(e, k);
      if (k < lane && e >= 0 && o == e) dup = true;
    }
    int row = -1;
    if (e >= 0 && !dup && e / d.L == d.rank) {
      const int ix = src * d.L + (e - d.rank * d.L);
      row = s.rowBase[ix] + __popc(s.mask[ix] & ((1u << bit) - 1u));
      if (row < 0 || row >= capacity) {
        if (seg == 0) gin_error_set(errorFlags, MOE_ERR_COUNTS);
        row = -1;
      }
    }
    if (self) {
      if (seg == 0) {
        if (lane < d.K) slotRows[((uint64_t)src * d.M + slot) * d.K + lane] = row;
        if (row >= 0) recvWeights[row] = wt;
      }
      warp_expand_seg<kXFresh>(xRow, (uint8_t*)recvX, d.rowBytes, row, d.K, fast, b0, b1, pass, fast);
      if (g == warp && warp == 0) GIN_TRACE(MOE_TRACE_TP_RECEIVER_FIRST_OWN);  // thread 0: warp 0's first own item copied
    } else {
      // Pass `seg` of the token's LL128 row (lines seg * kTpPassLines ...), each line polled until
      // it carries this call's flag; pass 0 also the token's weights (LL words, polled likewise).
      const int nl = (int)moe_row_lines(d.rowBytes);
      const uint64_t* wWord = (const uint64_t*)(s.meta[src] + (uint64_t)t * (uint32_t)wl.metaStride) + lane;
      uint64_t wv = 0;
      if (seg == 0 && row >= 0) wv = gin_ld_relaxed_sys(wWord);
      uint64_t lo[kTpUnroll], hi[kTpUnroll];
      tp_wait_lines(s.stage[src] + (uint64_t)t * (uint32_t)wl.dispSlotStride, nl, seg * kTpPassLines, seq, lo, hi, errorFlags);
      if (firstRemote) {
        if (warp == 0) GIN_TRACE(MOE_TRACE_RECEIVER_FIRST_REMOTE);  // thread 0: warp 0's first remote item landed
        firstRemote = false;
      }
      if (seg == 0) {
        if (row >= 0) {
          uint32_t spins = 0;
          uint64_t start = 0;
          while (!ll_tag_ok(wv, seq) && !gin_wait_timed_out(spins++, start, errorFlags)) wv = gin_ld_relaxed_sys(wWord);
          wt = __uint_as_float((uint32_t)wv);
        }
        if (lane < d.K) slotRows[((uint64_t)src * d.M + slot) * d.K + lane] = row;
        if (row >= 0) recvWeights[row] = wt;
      }
      // The pass's chunks to every target row (lane k's row), as the combine consumer stores y.
      const int gj = lane & 7;
      for (int k = 0; k < d.K; ++k) {
        const int rk = gin_shfl_int(row, k);
        if (rk < 0) continue;
        uint8_t* dst = (uint8_t*)recvX + (uint64_t)rk * d.rowBytes;
#pragma unroll
        for (int u = 0; u < kTpUnroll; ++u) {
          const int L = seg * kTpPassLines + u * kTpGroups + (lane >> 3);
          gin_u128 v;
          v.lo = lo[u];
          v.hi = gj < 7 ? hi[u] : 0ull;
          if (L < nl) tp_store_chunk(dst, tp_chunk_off(L, gj, nl), gj < 7, d.rowBytes, fast, v);
        }
      }
    }
  }
  GIN_TRACE_SYNC();
  GIN_TRACE(MOE_TRACE_RECEIVER_END);  // staging write-after-read: dispConsumed at the start of the next call
}
