// moe/dispatch_layout_path.cuh - the dispatch on the layout path: senders lay out the routing and
// send rows with a progress word per warp; receivers read the count tables, then expand each
// remote item as it lands and claim own-token items meanwhile.
#pragma once

#include "dispatch_call.cuh"

// Layout-path sender, the routing layout's block c (blocks [0, C)).
template <bool kXFresh>
GIN_DEVICE_INLINE void dispatch_layout_sender(const DispatchCall& call, DispatchSmem& sm, int& sharedOwnLeft) {
  const uint16_t* const x = call.x;
  const uint16_t* const xBf16 = call.xBf16;
  uint8_t* const xq = call.xq;
  const bool quant = call.quant;
  const int32_t* const topkIdx = call.topkIdx;
  const float* const topkWeights = call.topkWeights;
  uint16_t* const recvX = call.recvX;
  float* const recvWeights = call.recvWeights;
  const uint64_t* const peerBases = call.peerBases;
  uint8_t* const workspace = call.workspace;
  uint32_t* const errorFlags = call.errorFlags;
  const Dims& d = call.d;
  const MoeWindowLayout& wl = call.wl;
  const MoeWorkspaceLayout& ws = call.ws;
  int* const tokenPos = call.tokenPos;
  int* const slotInExpert = call.slotInExpert;
  int* const sendList = call.sendList;
  const bool fast = call.fast;
  uint8_t* const ownWin = call.ownWin;
  const uint64_t seq = call.seq;
  const uint64_t seqHi = call.seqHi;
  uint64_t* const state = call.state;
  const int tid = call.tid;
  const int B = call.B;
  const int lane = call.lane;
  const int warp = call.warp;
  LayoutSmem& s = sm.lay;
  const int c = (int)blockIdx.x;
  GIN_TRACE(MOE_TRACE_DISPATCH_START);
  // Write-after-read on every remote rank's staging (ranges move between calls, so all of its
  // receivers of the previous call must be done): thread i probes flag i now, under the routing
  //; a flag not there yet is waited for only after the routing, before the barrier
  // that precedes the sends. No warp polls all C flags (3 dependent acquires per lane at C = 66)
  // between the positions and its first store.
  const int warFlags = (d.R - 1) * d.C;
  auto warFlag = [&](int i) -> const uint64_t* {
    const int r = (d.rank + 1 + i / d.C) % d.R;
    return (const uint64_t*)(ownWin + wl.dispConsumed) +
           (uint64_t)moe_peer_section(r, d.rank, d.R) * MOE_MAX_CHANNELS + (uint64_t)(i % d.C);
  };
  // The last threads probe (flag i: thread B - 1 - i, ...): an acquire holds back its thread's
  // later loads, and at small T those threads have no token of the routing walk.
  bool warSeen = true;  // every flag of this thread probed at >= n - 1
  auto probeWar = [&]() {
    for (int i = B - 1 - tid; i < warFlags; i += B) warSeen &= gin_ld_acquire_sys(warFlag(i)) >= seq - 1;
  };
  int t0, t1;
  token_range(d, c, t0, t1);
  int* histE = (int*)(workspace + ws.histE);
  int* histD = (int*)(workspace + ws.histD);
  uint64_t* claimWord = state + MOE_STATE_HIST_READY + c;
  const bool direct = layout_is_direct(d);
  const bool small = layout_is_small(d, t0, t1);
  if (small) {
    // Probes under the id walk (before the clearing barrier the
    // acquires' latency is most of the 2.2 us to "counters cleared" at 128 tokens).
    layout_direct_small(s, topkIdx, d, t0, t1, c == d.C - 1, slotInExpert, tokenPos, sendList, errorFlags, probeWar);
    GIN_TRACE(MOE_TRACE_SENDER_ROUTED);  // routing counted and positions written
  } else if (direct) {
    probeWar();
    layout_direct(s, topkIdx, d, t0, t1, c == d.C - 1, errorFlags);
    GIN_TRACE(MOE_TRACE_SENDER_ROUTED);
  } else {
    probeWar();
    layout_histogram(s, topkIdx, d, t0, t1, histE + (uint64_t)c * d.E, histD + (uint64_t)c * d.R, errorFlags);
    publish_local(claimWord, (seq << 32) - 1);
    GIN_TRACE(MOE_TRACE_SENDER_ROUTED);
    layout_prefix(s, d, c, histE, histD, state + MOE_STATE_HIST_READY, (seq << 32) - 1, errorFlags);
  }
  GIN_TRACE(MOE_TRACE_SENDER_OFFSETS);

  if (c == d.C - 1) {
    // Leader: totals, then the count tables every receiver needs before it can place any row.
    layout_lead_totals(s, d, direct ? nullptr : histD, (int*)(workspace + ws.expertCount),
                       (int*)(workspace + ws.tokensTo), (int*)(workspace + ws.chanStartTo));
    if (tid == 0) state[MOE_STATE_DISPATCH_TOKENS] = (uint64_t)d.T;
    // Our table into every rank's window (own included) as LL words in the buffer of this
    // call's parity: no write-after-read wait (for d's dispConsumed of call n-1), no fence and
    // no flag release (a fence.acq_rel.sys here waits behind the other senders' row stores on
    // NVLink: tables released at 56-64 us at 4096 tokens).
    // Remote ranks first (their receivers are the ones that wait longest).
    const int entries = d.L + 2 + d.C;
    for (int i = tid; i < d.R * entries; i += B) {
      const int r = (d.rank + 1 + i / entries) % d.R, k = i % entries;
      int v;
      if (k < d.L) v = s.runE[r * d.L + k] + s.cntE[r * d.L + k];
      else if (k == d.L) v = s.u.lead.chanStart[r * (d.C + 1) + d.C];
      else v = s.u.lead.chanStart[r * (d.C + 1) + (k - d.L - 1)];
      gin_st_relaxed_sys(count_table((const uint8_t*)peerBases[r], wl, d.rank, d.R, seq) + k,
                         (seq << 32) | (uint64_t)(uint32_t)v);
    }
    __syncthreads();  // u.lead is reused by the tiles below
    GIN_TRACE(MOE_TRACE_SENDER_TABLES);
  }

  if (!small) layout_positions(s, topkIdx, d, t0, t1, slotInExpert, tokenPos, sendList);
  // The quantizing dispatch: this channel's fp8 rows, before the barrier and the positions'
  // release below (which every own-item reader acquires, and which precedes our sends). We
  // take the first quarter of the range; receiver c, idle until the count tables come, the rest
  // (quant_split), and releases quantReady[c] = n: our acquire of it, then the barrier, order
  // its xq stores before the positions' release.
  if (quant) {
    const int tm = quant_split(t0, t1);
    fp8_quantize_tokens(xBf16, d.H, xq, (uint64_t)t0, (uint64_t)(tm - t0), (uint64_t)warp, MOE_WARPS);
    GIN_TRACE(MOE_TRACE_SENDER_QUANTIZED);
    if (tid == 0) (void)gin_wait_geq(state + MOE_STATE_QUANT_READY + c, seq, errorFlags);
  }
  if (!warSeen)
    for (int i = B - 1 - tid; i < warFlags; i += B) (void)gin_wait_geq(warFlag(i), seq - 1, errorFlags);
#if GIN_HIP
  __threadfence();  // every wave's position stores before the one release below
#endif
  // Positions (this block's global writes) visible to every warp; and the write-after-read
  // acquires above, then this barrier: every warp may store into the peers' staging.
  __syncthreads();
  // Positions published and the own-item claim counter of this call reset (n << 32): the
  // barrier orders every thread's position stores before the release (cumulative). The last
  // warp releases it: at small T it has no send item, so the release's fence delays no send.
  if (tid == B - GIN_WARP_SIZE) gin_st_release_sys(claimWord, seq << 32);
  GIN_TRACE(MOE_TRACE_SENDER_POSITIONS);

  // Send this channel's slots to every remote rank (rotated so channels spread over peers).
  for (int q = 1; q < d.R; ++q) {
    const int r = (d.rank + 1 + (c + q - 1) % (d.R - 1)) % d.R;
    const int lo = s.prefD[r], cnt = s.cntD[r];
    if (cnt == 0) continue;
    uint8_t* peerWin = (uint8_t*)peerBases[r];
    const uint64_t sec = (uint64_t)moe_peer_section(d.rank, r, d.R);
    uint8_t* rowsBase = peerWin + wl.dispRows + sec * d.M * wl.rowStride;
    uint8_t* metaBase = peerWin + wl.dispMeta + sec * d.M * wl.metaStride;
    uint64_t* progress = (uint64_t*)(peerWin + wl.dispProgress) + (sec * MOE_MAX_CHANNELS + c) * MOE_MAX_WARPS + warp;
    // Items (slot j, segment): warp w sends items w, w+W, ...; its progress word counts them.
    const RowSplit sp = row_split(d.rowBytes, cnt);
    const int items = cnt * sp.nseg;
    int done = 0;
    for (int i = warp; i < items; i += MOE_WARPS) {
      const int j = i / sp.nseg, seg = i - j * sp.nseg;
      uint64_t b0, b1;
      seg_range(sp, seg, d.rowBytes, b0, b1);
      const int slot = lo + j;
      int t;
      if (small) {
        // Small layout: slot lo + j is the own token of the j-th set bit of maskD[r] (from
        // shared memory instead of one sendList round trip before the row loads).
        uint32_t m = s.maskD[r];
        for (int q = 0; q < j; ++q) m &= m - 1u;
        t = t0 + __ffs((int)m) - 1;
      } else {
        t = ld_fresh_i32(sendList + (uint64_t)r * d.M + slot);
      }
      const uint8_t* src = (const uint8_t*)x + (uint64_t)t * d.rowBytes;
      uint8_t* dst = rowsBase + (uint64_t)slot * wl.rowStride;
      // Segment 0 carries the slot's metadata: its loads go out with the row's (they
      // followed the row copy, two more round trips before segment 0's release, and every
      // other segment of the slot waits for segment 0 at the receiver).
      int me = -1, msl = -1;
      float mw = 0.f;
      if (seg == 0 && lane < d.K) {
        me = topkIdx[(uint64_t)t * d.K + lane];
        msl = ld_fresh_i32(slotInExpert + (uint64_t)t * d.K + lane);
        mw = topkWeights[(uint64_t)t * d.K + lane];
      }
      if (fast) {
        const uint64_t vEnd = b1 >> 4;
        // No L2 prefetch here: the sends are NVLink-bound at ~0.3 GB/s per warp, so
        // a whole-row prefetch sits in L2 for ~50 us and is mostly evicted before the
        // loads come (x read twice from HBM; sends' max 195 -> 205 us at 4096 tokens).
        for (uint64_t v0 = b0 >> 4; v0 < vEnd; v0 += (uint64_t)GIN_WARP_SIZE * kExpandUnroll) {
          gin_u128 v[kExpandUnroll];
#pragma unroll
          for (int u = 0; u < kExpandUnroll; ++u) {
            const uint64_t vi = v0 + (uint64_t)lane + (uint64_t)u * GIN_WARP_SIZE;
            if (vi < vEnd) v[u] = ld16<kXFresh>(src + (vi << 4));
          }
#pragma unroll
          for (int u = 0; u < kExpandUnroll; ++u) {
            const uint64_t vi = v0 + (uint64_t)lane + (uint64_t)u * GIN_WARP_SIZE;
            if (vi < vEnd) gin_st16(dst + (vi << 4), v[u]);
          }
        }
      } else {
        gin_copy_bytes(dst + b0, src + b0, b1 - b0, (uint32_t)lane, GIN_WARP_SIZE);
      }
      if (seg == 0 && lane < d.K) {  // the slot's metadata travels with its segment 0
        const bool mine = msl >= 0 && me / d.L == r;  // sl >= 0 implies e is a validated id
        int* meta = (int*)(metaBase + (uint64_t)slot * wl.metaStride);
        meta[lane] = mine ? me - r * d.L : -1;
        meta[d.K + lane] = mine ? msl : -1;
        ((float*)meta)[2 * d.K + lane] = mine ? mw : 0.f;
      }
      ++done;
      // bar.warp.sync orders every lane's stores before lane 0's release (cumulative), and the
      // release's own system fence covers the warp's stores: no separate per-lane fence.
      syncwarp();
      if (lane == 0) gin_st_release_sys(progress, seqHi | (uint64_t)done);
    }
  }
  GIN_TRACE_SYNC();
  GIN_TRACE(MOE_TRACE_SENDER_SENT);

  // Own tokens of this channel: when every source's count table is already here (a
  // non-blocking probe: a sender never waits for the leader, a higher block, or a peer's leader)
  // the sender joins receiver c in claiming own-token items; otherwise receiver c does every
  // own item. The tables are double-buffered, so these reads need no consumed flag.
  // Not even the probe when receiver c already claimed every own item (the claim
  // counter has reached this channel's own items, known from the layout: slots to ourselves
  // = cntD[rank]); at 128 tokens the probe cost ~4 us after the sends and found nothing left.
  if (tid == 0) {
    const int ownSlots = s.cntD[d.rank];
    const int ownItems = ownSlots * row_split(d.rowBytes, ownSlots).nseg;
    // This call's claims only (the reset to n << 32 is another warp's store, unordered with
    // this load: an older value means "probe"). Skipping is always safe: receiver c
    // takes every own item left at its end.
    const uint64_t w = gin_ld_relaxed_sys(claimWord);
    sharedOwnLeft = (w >> 32) == seq && (int)(uint32_t)w >= ownItems ? 0 : 1;
  }
  __syncthreads();  // every warp is done with sm.lay before sm.rcv (same storage) is written
  RecvSmem& rs = sm.rcv;
  const bool takeOwn = sharedOwnLeft != 0 && recv_tables(rs, d, c, ownWin, wl, seq, false, nullptr, errorFlags);
  if (takeOwn) {
    GIN_TRACE(MOE_TRACE_SENDER_JOINS_OWN);
    const OwnWork ow = own_work(rs, d);
    while (own_claim_item<kXFresh>(rs, ow, d, claimWord, x, topkIdx, topkWeights, sendList, slotInExpert,
                          (int*)(workspace + ws.slotRows), recvX, recvWeights, fast, errorFlags)) {
    }
  }
  GIN_TRACE_SYNC();
  GIN_TRACE(MOE_TRACE_SENDER_END);
}

// Layout-path receiver (blocks [C, 2C)).
template <bool kXFresh>
GIN_DEVICE_INLINE void dispatch_layout_receiver(const DispatchCall& call, RecvSmem& s) {
  const uint16_t* const x = call.x;
  const uint16_t* const xBf16 = call.xBf16;
  uint8_t* const xq = call.xq;
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
  int* const slotInExpert = call.slotInExpert;
  int* const sendList = call.sendList;
  const bool fast = call.fast;
  uint8_t* const ownWin = call.ownWin;
  const uint64_t seq = call.seq;
  const uint64_t seqHi = call.seqHi;
  uint64_t* const state = call.state;
  const int tid = call.tid;
  const int B = call.B;
  const int lane = call.lane;
  const int warp = call.warp;
  const int c = (int)blockIdx.x - d.C;
  GIN_TRACE(MOE_TRACE_DISPATCH_START);
  if (quant) {
    // The quantizing dispatch: our part of sender c's token range into xq while the senders
    // lay out the routing, then quantReady[c] = n (the barrier orders every warp's stores
    // before the release; sender c waits for it before it publishes its positions).
    int t0, t1;
    token_range(d, c, t0, t1);
    const int tm = quant_split(t0, t1);
    fp8_quantize_tokens(xBf16, d.H, xq, (uint64_t)tm, (uint64_t)(t1 - tm), (uint64_t)warp, MOE_WARPS);
#if GIN_HIP
    __threadfence();
#endif
    __syncthreads();
    if (tid == B - GIN_WARP_SIZE) gin_st_release_gpu(state + MOE_STATE_QUANT_READY + c, seq);
    GIN_TRACE(MOE_TRACE_RECEIVER_QUANTIZED);  // receiver: its part of the fp8 rows stored and released
  }
  (void)recv_tables(s, d, c, ownWin, wl, seq, true, c == 0 ? recvCounts : nullptr, errorFlags);
  GIN_TRACE(MOE_TRACE_RECEIVER_TABLES);
  if (c == 0) {
    int* slotsFrom = (int*)(workspace + ws.slotsFrom);
    int* chanStartFrom = (int*)(workspace + ws.chanStartFrom);
    for (int src = tid; src < d.R; src += B) slotsFrom[src] = s.slots[src];
    for (int i = tid; i < d.R * (d.C + 1); i += B) {
      const int src = i / (d.C + 1), j = i % (d.C + 1);
      int v = 0;
      (void)ll_table_get(count_table(ownWin, wl, src, d.R, seq) + d.L + 1 + j, seq, true, errorFlags, v);
      if (v < 0 || v > s.slots[src]) v = s.slots[src] < 0 ? 0 : s.slots[src];
      chanStartFrom[src * (MOE_MAX_CHANNELS + 1) + j] = v;
    }
  }
  // Remote sources' items as one list (q = 1..R-1 in order), spread over all warps: item i of
  // source src was sent by sender warp i % W as its (i / W + 1)-th item.
  if (tid == 0) {
    s.itemEnd[0] = 0;
    for (int q = 1; q < d.R; ++q) {
      const int src = (d.rank + q) % d.R;
      const RowSplit sp = row_split(d.rowBytes, s.hi[src] - s.lo[src]);
      s.nseg[src] = sp.nseg;
      s.segBytes[src] = sp.segBytes;
      s.itemEnd[q] = s.itemEnd[q - 1] + (s.hi[src] - s.lo[src]) * sp.nseg;
    }
  }
  __syncthreads();
  int* slotRows = (int*)(workspace + ws.slotRows);
  uint8_t* recvBase = (uint8_t*)recvX;
  const int totalItems = d.R > 1 ? s.itemEnd[d.R - 1] : 0;
  // Own-token items (shared with sender c through the claim counter): a warp takes one whenever
  // its next remote item has not landed yet, so the own work overlaps the NVLink traffic.
  // ownState: 0 = sender c's positions not seen yet, 1 = claiming, 2 = none left.
  uint64_t* claimWord = state + MOE_STATE_HIST_READY + c;
  const OwnWork ow = own_work(s, d);
  int ownState = ow.items > 0 ? 0 : 2;
  auto tryOwn = [&]() -> bool {
    if (ownState == 0) {
      int seen = 0;
      if (lane == 0) seen = gin_ld_acquire_sys(claimWord) >= (seq << 32) ? 1 : 0;
      seen = gin_shfl_int(seen, 0);
      syncwarp();  // lane 0's acquire, then the barrier: every lane may read the positions
      if (!seen) return false;
      ownState = 1;
    }
    if (ownState == 2) return false;
    if (own_claim_item<kXFresh>(s, ow, d, claimWord, x, topkIdx, topkWeights, sendList, slotInExpert, slotRows, recvX,
                       recvWeights, fast, errorFlags))
      return true;
    ownState = 2;
    return false;
  };
  for (int g = warp; g < totalItems; g += MOE_WARPS) {
    int q = 1;
    while (g >= s.itemEnd[q]) ++q;
    const int src = (d.rank + q) % d.R;
    const int i = g - s.itemEnd[q - 1];
    RowSplit sp;
    sp.nseg = s.nseg[src];
    sp.segBytes = s.segBytes[src];
    const int j = i / sp.nseg, seg = i - j * sp.nseg;
    uint64_t b0, b1;
    seg_range(sp, seg, d.rowBytes, b0, b1);
    const int slot = s.lo[src] + j;
    const uint64_t sec = (uint64_t)moe_peer_section(src, d.rank, d.R);
    const uint8_t* rowsBase = ownWin + wl.dispRows + sec * d.M * wl.rowStride;
    const uint8_t* metaBase = ownWin + wl.dispMeta + sec * d.M * wl.metaStride;
    const uint64_t* progress = (const uint64_t*)(ownWin + wl.dispProgress) + (sec * MOE_MAX_CHANNELS + c) * MOE_MAX_WARPS;
    // Lane 0 waits for this item, lane 1 for the slot's segment 0 (it carried the metadata);
    // the warp barrier then orders every lane's reads after those acquires.
    const int i0 = j * sp.nseg;
    const uint64_t need0 = seqHi | (uint64_t)(i / MOE_WARPS + 1), need1 = seqHi | (uint64_t)(i0 / MOE_WARPS + 1);
    while (ownState != 2) {  // not landed yet: an own item meanwhile
      bool landed = true;
      if (lane == 0) landed = gin_ld_relaxed_sys(progress + i % MOE_WARPS) >= need0;
      else if (lane == 1 && seg != 0) landed = gin_ld_relaxed_sys(progress + i0 % MOE_WARPS) >= need1;
      if (moe_detail::ballot(!landed) == 0 || !tryOwn()) break;
    }
    if (lane == 0) (void)gin_wait_geq(progress + i % MOE_WARPS, seqHi | (uint64_t)(i / MOE_WARPS + 1), errorFlags);
    else if (lane == 1 && seg != 0)
      (void)gin_wait_geq(progress + i0 % MOE_WARPS, seqHi | (uint64_t)(i0 / MOE_WARPS + 1), errorFlags);
    syncwarp();
    if (g == warp) GIN_TRACE(MOE_TRACE_RECEIVER_FIRST_REMOTE);  // thread 0: warp 0's first item landed
    // The staging segment's first pass and the slot's metadata in flight together (not
    // metadata -> weight -> staging, three dependent round trips per item).
    const uint8_t* stageRow = rowsBase + (uint64_t)slot * wl.rowStride;
    gin_u128 pass[kExpandUnroll];
    if (fast) expand_load_pass<true>(pass, stageRow, b0 >> 4, b1 >> 4);
    int row = -1;
    float wt = 0.f;
    if (lane < d.K) {
      const int* meta = (const int*)(metaBase + (uint64_t)slot * wl.metaStride);
      const int le = ld_fresh_i32(meta + lane);
      const int sl = ld_fresh_i32(meta + d.K + lane);
      const int wbits = ld_fresh_i32(meta + 2 * d.K + lane);
      if (le >= 0 && le < d.L && sl >= 0 && sl < s.cnt[src * d.L + le]) {
        row = s.rowBase[src * d.L + le] + sl;
        wt = __int_as_float(wbits);
      } else if (le != -1) {
        if (seg == 0) gin_error_set(errorFlags, MOE_ERR_COUNTS);
      }
      if (seg == 0) slotRows[((uint64_t)src * d.M + slot) * d.K + lane] = row;
    }
    if (seg == 0 && row >= 0) recvWeights[row] = wt;
    warp_expand_seg<true>(stageRow, recvBase, d.rowBytes, row, d.K, fast, b0, b1, pass, fast);
  }
  // The own items nobody took yet (sender c is a lower block: waiting for its positions keeps
  // progress).
  if (ownState == 0) {
    if (lane == 0) (void)gin_wait_geq(claimWord, seq << 32, errorFlags);
    syncwarp();
    ownState = 1;
  }
  while (ownState == 1) {
    if (!own_claim_item<kXFresh>(s, ow, d, claimWord, x, topkIdx, topkWeights, sendList, slotInExpert, slotRows, recvX,
                        recvWeights, fast, errorFlags))
      ownState = 2;
  }
  GIN_TRACE_SYNC();
  // Staging write-after-read: dispConsumed is stored at the start of the next call, not released
  // here (a release here costs ~1 us per dispatch).
  GIN_TRACE(MOE_TRACE_RECEIVER_END);
}
