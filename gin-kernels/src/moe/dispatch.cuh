// moe/dispatch.cuh - gin_dispatch, the body of moe_gin_dispatch and its token-path entries.
#pragma once

#include "routing_layout.cuh"
#include "dispatch_receive.cuh"
#include "token_path_layout.cuh"
#include "fp8.cuh"
#include "trace_slots.cuh"

union DispatchSmem {
  LayoutSmem lay;
  RecvSmem rcv;
  TpRecvSmem tp;
};

// ================================================================================================
// moe_gin_dispatch and its token-path entries (body: gin_dispatch; "Entry points" in moe_gin.cu).
// Grid 2*C blocks of MOE_THREADS: blocks [0, C) are senders (channel c = token range c), blocks
// [C, 2C) receivers (channel c = the slots that the senders of channel c of every
// source produce). Per call seq n (per-block counters in the workspace state):
//  sender c:  routing layout (one-level: counts the lower tokens itself; two-level: steps 1-2,
//             claim[c] = (n << 32) - 1, waits for lower blocks only);
//             last sender (the leader): totals; writes our count table (per local expert of d,
//             slots, chanStart[C+1]) as LL words tagged n into buffer n % 2 of every rank d's
//             window (own included): no wait, no fence, no flag;
//             layout step 3, claim[c] = n << 32 (positions published, own-item
//             claim counter reset; local);
//             for each remote d with slots: wait dispConsumed[d][*] >= n-1 (all of d's receivers
//             finished reading our previous staging), then warp w sends slots j = w, w+W, ... of
//             the channel: row + metadata into d's staging, fence, dispProgress[rank][c][w] =
//             (n << 32) | (slots done by w) in d's window.
//  receiver c: polls the LL table words of every source until tagged n; rowBase[s][e] = expertStart[e] +
//             sum_{s'<s} count[s'][e]; expands each remote source's items of channel c as they
//             land, claiming own-token items (source = x) from claim[c] while the next remote
//             item is not there yet, then the own items left; row = rowBase[s][e] + slotInExpert;
//             at the start of call n+1 it writes dispConsumed[rank][c] = n into every remote
//             source's window (staging WAR). Sender c, when the tables were already there after its
//             sends, claims own items too.
// Receiver 0 also writes recvCounts, slotsFrom and chanStartFrom (kept for combine).
// Token path (moe_token_path: M*K <= 4096 and <= 32 tokens per channel, the same choice
// on every rank): senders push their tokens' ids (LL words, by call parity) and then each row to
// staging slot = token index right after the id walk; receivers lay out every source themselves;
// the senders' positions follow their sends. Same outputs and workspace arrays (docs/kernels.md).
// ================================================================================================
template <class Shape>
GIN_DEVICE_INLINE void gin_dispatch(const MoeGinDispatchArgs& a) {
  // The fields by name (a is the kernel's parameter: these read the parameter space).
  const uint16_t* x = a.x;
  const int32_t* topkIdx = a.topkIdx;
  const float* topkWeights = a.topkWeights;
  uint16_t* recvX = a.recvX;
  float* recvWeights = a.recvWeights;
  int32_t* recvCounts = a.recvCounts;
  const uint64_t* peerBases = a.peerBases;
  uint8_t* workspace = a.workspace;
  uint32_t* errorFlags = a.errorFlags;
  uint8_t* xq = Shape::fp8 ? a.xq : nullptr;  // the bf16 entries never quantize
  int32_t numTokens = a.numTokens, rank = a.dims.rank, nRanks = a.dims.nRanks, numExperts = a.dims.numExperts,
          topK = a.dims.topK, hidden = a.dims.hidden, maxTokens = a.dims.maxTokens, numChannels = a.dims.numChannels;
  __shared__ __align__(16) DispatchSmem sm;
  __shared__ uint64_t sharedSeq;
  __shared__ uint64_t sharedBases[MOE_MAX_RANKS];
  __shared__ int sharedOwnLeft;  // sender: own-token items left to claim after the sends (block-uniform)
  // Token-path sender: what tp_send_positions writes, parked here across the sends (output
  // pointers held in registers through the send loop cost the kernel a stack frame on sm_90).
  __shared__ int* tpTokenPos;
  __shared__ int* tpChanStartTo;
  __shared__ uint64_t* tpState;
  gin_wait_prior_grids();  // launched with PDL: nothing below may run before the previous kernel is done
  GIN_TRACE(MOE_TRACE_DISPATCH_ENTRY);  // entry, before the checks and the prologue's loads
  const int tid = (int)threadIdx.x, B = (int)blockDim.x;
  uint64_t* state = state_of(workspace);
  // The prologue's loads first, by different threads (as the token-path combine's): the peers' window bases into shared memory and this block's call counter; the
  // checks and the layout arithmetic run under their round trip, one barrier collects them. They
  // read only what the checks then validate (guarded: at most MOE_MAX_RANKS bases, counters of
  // blocks < 2 * MOE_MAX_CHANNELS). One after the other, peers_ok's loads, ~0.7 us of layout
  // arithmetic and load_seq's round trip took ~2 us from entry to "start".
  if (peerBases != nullptr && tid < nRanks && tid < MOE_MAX_RANKS) sharedBases[tid] = peerBases[tid];
  else if (tid == MOE_MAX_RANKS && workspace != nullptr && blockIdx.x < 2 * MOE_MAX_CHANNELS)
    sharedSeq = state[MOE_STATE_SEQ_DISPATCH + blockIdx.x] + 1;
  Dims dims = make_dims(rank, nRanks, numExperts, topK, hidden, maxTokens, numChannels, numTokens);
  dims.A = moe_alignment(a.dims.expertAlignment);
  if (!launch_ok(dims, 2, true, workspace, peerBases, errorFlags) || !shape_ok<Shape>(dims, errorFlags)) return;
  const Dims d = dims;
  if (recvX == nullptr || recvWeights == nullptr || recvCounts == nullptr || topkIdx == nullptr ||
      topkWeights == nullptr || (x == nullptr && d.T > 0)) {
    if (blockIdx.x == 0 && threadIdx.x == 0) gin_error_set(errorFlags, MOE_ERR_CONFIG);
    return;
  }
  if ((numTokens < 0 || numTokens > maxTokens) && blockIdx.x == 0 && threadIdx.x == 0)
    gin_error_set(errorFlags, MOE_ERR_TOKENS);
  // The quantizing fp8 dispatch (fp8 entries with xq != null): x holds bf16 rows, and
  // sender c turns its own tokens into scaled fp8 rows in xq[t] (fp8_quantize_tokens) before it
  // sends any; from then on every path reads xq as it reads x otherwise. Its rows are written
  // during the kernel, so the fp8 entries read x with coherent loads (kXFresh).
  constexpr bool kXFresh = Shape::fp8;
  const bool quant = Shape::fp8 && xq != nullptr;
  const uint16_t* const xBf16 = x;
  if (quant) {
    if (!gin_is_aligned(x, 16) || !gin_is_aligned(xq, 16) || !gin_is_aligned(recvX, 16)) {
      if (blockIdx.x == 0 && threadIdx.x == 0) gin_error_set(errorFlags, MOE_ERR_CONFIG);
      return;
    }
    x = (const uint16_t*)xq;
  }
  const int lane = (int)gin_lane_id(), warp = tid / GIN_WARP_SIZE;
  const MoeWindowLayout wl = moe_window_layout(d.R, d.E, d.K, d.H, d.M);
  const MoeWorkspaceLayout ws = moe_workspace_layout(d.R, d.E, d.K, d.M);
  int* tokenPos = (int*)(workspace + ws.tokenPos);
  int* slotInExpert = (int*)(workspace + ws.slotInExpert);
  int* sendList = (int*)(workspace + ws.sendList);
  const bool fast = (d.rowBytes & 15u) == 0 && gin_is_aligned(x, 16) && gin_is_aligned(recvX, 16);
  const bool tokenPath = Shape::tokenPathOnly || moe_token_path(d.K, d.M, d.C);
  GIN_TRACE_AFTER(MOE_TRACE_DISPATCH_PROLOGUE, (uint32_t)(wl.totalBytes + ws.totalBytes));  // checks and layouts done
  __syncthreads();
  bool basesOk = true;
  for (int p = 0; p < d.R; ++p) basesOk &= sharedBases[p] != 0 && (sharedBases[p] & 15u) == 0;
  if (!basesOk) {
    if (blockIdx.x == 0 && tid == 0) gin_error_set(errorFlags, GIN_ERR_NO_LSA_PATH);
    return;
  }
  uint8_t* ownWin = (uint8_t*)sharedBases[d.rank];
  const uint64_t seq = sharedSeq;
  const uint64_t seqHi = seq << 32;
  // Staging write-after-read: receiver c tells every remote source that it finished
  // reading that source's staging in call n-1 (dispConsumed[rank][c] = n-1), here at the start of
  // call n instead of with a release at the end of call n-1. Call n-1 is complete before this call
  // starts (stream order; with PDL, gin_wait_prior_grids above), so its staging loads have all
  // returned: a relaxed store is enough, and the release's system fence (~1 us at the end of every
  // dispatch, measured) is gone. Every call writes it, so a source's call n waits at most for this
  // rank's call n to start.
  if ((int)blockIdx.x >= d.C && tid < d.R && tid != d.rank)
    gin_st_relaxed_sys((uint64_t*)((uint8_t*)sharedBases[tid] + wl.dispConsumed) +
                           (uint64_t)moe_peer_section(d.rank, tid, d.R) * MOE_MAX_CHANNELS + ((int)blockIdx.x - d.C),
                       seq - 1);

  if (tokenPath && (int)blockIdx.x < d.C) {
    // ------------------------------------------------------------------ token-path sender
    // Rows go out at once, into the receiver's staging slot = the token's own index (a token goes
    // to rank r iff one of its ids is in r's range), after the token's ids as LL words into every
    // remote rank's id list; the receivers run the layout themselves. Before the sends only what
    // they need: the ids pushed (range-checked; the receivers drop repeats
    // with the same rule as the layout) and each own token's destination ranks, one warp per token
    // with lane k on id k, rather than the small layout's whole id walk first (4-6 us, one token
    // per thread). What the combine reads of the sending side (tokenPos; the last block's
    // chanStartTo and T) follows the sends, from destination masks alone (tp_send_positions).
    LayoutSmem& s = sm.lay;
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
  } else if (tokenPath) {
    // ------------------------------------------------------------------ token-path receiver
    // Every source's id list (own: topkIdx) -> this rank's layout of every source restricted to
    // what channel c needs: rows per (source, local expert) for rowBase, and for s's tokens of
    // channel c (token range by s's T) the rows before them (run) and bit masks (mask), the slots
    // before them (runD) and which come here (maskD). Slots, rows and slotRows come out exactly as
    // the layout path's (positions by token order per source). Receiver 0 also writes recvCounts,
    // slotsFrom and chanStartFrom.
    TpRecvSmem& s = sm.tp;
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
  } else if ((int)blockIdx.x < d.C) {
    // ------------------------------------------------------------------ sender / layout block
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
  } else {
    // ------------------------------------------------------------------ receiver block
    RecvSmem& s = sm.rcv;
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
    GIN_TRACE(MOE_TRACE_RECEIVER_END);  // staging write-after-read: dispConsumed is stored at the start of the next call,
                     // not released here (a release here costs ~1 us per dispatch)
  }
  if (tid == 0) state[MOE_STATE_SEQ_DISPATCH + blockIdx.x] = seq;
}

// One combine role's items, shared by producers (kConsumer = false: the slots [first, first + n)
// that source slotSrc sent us in this channel, partials into its window) and consumers
// (kConsumer = true: tokens [first, first + n), y), one loop for both.
// Per-lane metadata runs ahead of the rows: the next item's slotRows entry (and, for
// the consumer, the tokenPos words two items ahead) are loaded while the current item reduces, so
// an item's first row loads wait for nothing but their own addresses (not slotRows ->
// recvWeights -> rows, three dependent round trips per item; consumer: tokenPos -> slotRows ->
// recvWeights -> rows). The weight of a row is loaded with the rows (warp_reduce_seg uses it last).
