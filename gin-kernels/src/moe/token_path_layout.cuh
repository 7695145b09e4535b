// moe/token_path_layout.cuh - the token-path dispatch receiver's layout of every source's tokens,
// computed from the sources' id lists.
#pragma once

#include "routing_layout.cuh"
#include "dispatch_receive.cuh"
#include "ll128_rows.cuh"
#include "trace_slots.cuh"

// Token-path receiver: the layout of every source's tokens at this rank, computed here
// from the sources' id lists, restricted to this rank's experts and to what channel c needs.
struct TpRecvSmem {
  int cnt[MOE_MAX_EXPERTS];        // [R][L] rows from source s for local expert e
  int rowBase[MOE_MAX_EXPERTS];    // [R][L] recvX row of channel c's first row of (s, e)
  int run[MOE_MAX_EXPERTS];        // [R][L] rows of s's tokens before channel c
  uint32_t mask[MOE_MAX_EXPERTS];  // [R][L] bit j: s's token t0s + j (channel c) picked e
  int hist[MOE_MAX_RANKS * MOE_MAX_CHANNELS];  // receiver 0: [s][channel] tokens of s coming here
  int Ts[MOE_MAX_RANKS];           // T of each source in this call
  int t0s[MOE_MAX_RANKS];          // channel c's first token of source s
  int t1s[MOE_MAX_RANKS];          // and the end of its range
  int splitNseg[33];               // row_split(rowBytes, n) for n = 0..32 tokens of a channel
  unsigned long long splitSegBytes[33];
  int runD[MOE_MAX_RANKS];         // s's tokens before channel c coming here (= channel's first slot)
  uint32_t maskD[MOE_MAX_RANKS];   // bit j: s's token t0s + j comes here
  int slots[MOE_MAX_RANKS];        // s's tokens coming here
  int nseg[MOE_MAX_RANKS];         // items per token: own (self) row_split segments, remote LL128 passes
  unsigned long long segBytes[MOE_MAX_RANKS];
  int itemEnd[MOE_MAX_RANKS + 1];  // end of the q-th source's items (q = 0: self, then rank + q)
  // Per remote source, in shared memory rather than registers through the item loop (the window
  // offsets as live 64-bit registers cost the kernel a stack frame on sm_90): its staging rows,
  // metadata (section of s in this window) and id list of this call.
  const uint8_t* stage[MOE_MAX_RANKS];
  const uint8_t* meta[MOE_MAX_RANKS];
  const uint64_t* ids[MOE_MAX_RANKS];
  int* slotRows;  // workspace arrays written here (likewise parked in shared memory)
  int* slotsFrom;
  int* chanStartFrom;
  int scanTmp[MOE_THREADS];
};

constexpr int kTpWalkRounds = 2;  // token rounds of the receivers' walk with loads in flight together

// Token-path receiver, before its items (the walk one id per lane):
// every source's T and ids -> what channel c needs in s (rows per (source, local expert),
// rowBase, the channel's masks, runD, item ends); receiver 0 also recvCounts and hist. A function
// of its own so that bench/walk_probe.cu times the same code outside the exchange and checks it
// against a host reference.
GIN_DEVICE_INLINE void tp_recv_layout(TpRecvSmem& s, const Dims& d, int c, const MoeWindowLayout& wl,
                                      const uint8_t* ownWin, uint8_t* workspace, const MoeWorkspaceLayout& ws,
                                      uint64_t seq, const int32_t* topkIdx, int32_t* recvCounts,
                                      uint32_t* errorFlags) {
  const int tid = (int)threadIdx.x, B = (int)blockDim.x;
  const int lane = (int)gin_lane_id(), warp = tid / GIN_WARP_SIZE;
  // The walk's lane roles (below): groups of Kp lanes (K rounded up to a power of two) hold the
  // ids of one token, a warp takes 32 / Kp tokens per round.
  const int Kp = id_group_size(d.K), lgK = __ffs(Kp) - 1;
  const int perWarp = GIN_WARP_SIZE >> lgK, k = lane & (Kp - 1), sub = lane >> lgK;
  const int nWarps = B / GIN_WARP_SIZE, step = nWarps * perWarp;
  // This lane's own ids of its first walk rounds, loaded before the sources' T arrive: the walk
  // starts with them (same-run A/B against loading them in the walk: DeepSeek-V3 and
  // Qwen3 128-token dispatch ~0.2 us faster on one H200).
  int ownFirst[kTpWalkRounds];
#pragma unroll
  for (int u = 0; u < kTpWalkRounds; ++u) {
    const int t = warp * perWarp + u * step + sub;
    ownFirst[u] = t < d.T && k < d.K ? topkIdx[(uint64_t)t * d.K + k] : -1;
  }
  if (tid < d.R) {
    if (tid == d.rank) {
      s.Ts[tid] = d.T;
      s.t0s[tid] = (int)((int64_t)c * d.T / d.C);
      s.t1s[tid] = (int)((int64_t)(c + 1) * d.T / d.C);
    } else {  // a remote source's T: one probe now, -1 if it is not here yet (the walk then polls)
      int T = 0;
      s.Ts[tid] = ll_table_get(ids_area(ownWin, wl, tid, d.R, seq), seq, false, errorFlags, T) ? T : -1;
    }
    const uint64_t sec = (uint64_t)moe_peer_section(tid, d.rank, d.R);  // unused for self
    s.stage[tid] = ownWin + wl.dispRows + sec * d.M * wl.dispSlotStride;
    s.meta[tid] = ownWin + wl.dispMeta + sec * d.M * wl.metaStride;
    s.ids[tid] = ids_area(ownWin, wl, tid, d.R, seq) + 1;
    if (tid == 0) {
      s.slotRows = (int*)(workspace + ws.slotRows);
      s.slotsFrom = (int*)(workspace + ws.slotsFrom);
      s.chanStartFrom = (int*)(workspace + ws.chanStartFrom);
    }
    s.runD[tid] = 0;
    s.maskD[tid] = 0u;
    s.slots[tid] = 0;
  }
  // The item split of every possible channel size (a channel has <= 32 tokens of a source on the
  // token path), off the critical path: the walk then only looks it up.
  for (int n = B - 1 - tid; n <= 32; n += B) {  // the last threads (the first ones poll T)
    const RowSplit sp = row_split(d.rowBytes, n);
    s.splitNseg[n] = sp.nseg;
    s.splitSegBytes[n] = sp.segBytes;
  }
  for (int i = tid; i < d.R * d.L; i += B) {
    s.cnt[i] = 0;
    s.run[i] = 0;
    s.mask[i] = 0u;
  }
  if (c == 0)
    for (int i = tid; i < d.R * d.C; i += B) s.hist[i] = 0;
  __syncthreads();
  GIN_TRACE(MOE_TRACE_TP_WALK_CLEARED);  // counters cleared (the remote sources' T may still be on the way)
  // The walk, one id per lane: groups of Kp lanes (K rounded up to a power of two) hold the ids
  // of one token (lane k: id k), a warp takes 32 / Kp tokens per round, two rounds at a time with
  // every load in flight first; source by source (one token per thread with its ids in registers
  // would be ~500 dependent instructions per token, 1.5-3 us per block).
  const int nw = moe_id_words(d.K);
  const int lo = d.rank * d.L;
  const lanemask_t groupBits = (lanemask_t)(((uint64_t)1 << Kp) - 1);
  for (int q = 0; q < d.R; ++q) {
    const int src = (d.rank + q) % d.R;  // own ids first (already loaded), then the remote sources
    const bool self = src == d.rank;
    // A remote source's T (word 0 of its id list): the probe's value, or lane 0 of each warp polls
    // it here, so that the own walk runs while it is on the way (until then every
    // block waited for every T before its walk).
    int Tsrc = d.T;
    if (!self) {
      Tsrc = gin_shfl_int(s.Ts[src], 0);  // warp-uniform (warp 0 may be writing it)
      if (Tsrc < 0) {
        if (lane == 0) (void)ll_table_get(s.ids[src] - 1, seq, true, errorFlags, Tsrc);
        Tsrc = gin_shfl_int(Tsrc, 0);
      }
      if (Tsrc < 0 || Tsrc > d.M) {
        if (lane == 0) gin_error_set(errorFlags, MOE_ERR_COUNTS);
        Tsrc = 0;
      }
      if (warp == 0 && lane == 0) s.Ts[src] = Tsrc;  // for the items, after the walk's barrier
    }
    const int ct0 = (int)((int64_t)c * Tsrc / d.C), ct1 = (int)((int64_t)(c + 1) * Tsrc / d.C);
    if (!self && warp == 0 && lane == 0) {
      s.t0s[src] = ct0;
      s.t1s[src] = ct1;
    }
    const uint64_t* words = s.ids[src];
    int nHere = 0, nBefore = 0;  // lane 0: this warp's tokens of src coming here (before channel c)
    for (int tw = warp * perWarp; tw < Tsrc; tw += kTpWalkRounds * step) {  // warp-uniform
      int e[kTpWalkRounds];
      uint64_t v[kTpWalkRounds];
#pragma unroll
      for (int u = 0; u < kTpWalkRounds; ++u) {
        const int t = tw + u * step + sub;
        e[u] = -1;
        v[u] = 0;
        if (t < Tsrc && k < d.K) {
          if (self) e[u] = tw == warp * perWarp ? ownFirst[u] : topkIdx[(uint64_t)t * d.K + k];
          else v[u] = gin_ld_relaxed_sys(words + (uint32_t)(t * nw + (k >> 1)));
        }
      }
#pragma unroll
      for (int u = 0; u < kTpWalkRounds; ++u) {
        const int t = tw + u * step + sub;
        if (!self && t < Tsrc && k < d.K) {
          if (!ll_tag_ok(v[u], seq)) {
            const uint64_t* w = words + (uint32_t)(t * nw + (k >> 1));
            uint64_t start = 0;
            for (uint32_t spins = 0;; ++spins) {
              v[u] = gin_ld_relaxed_sys(w);
              if (ll_tag_ok(v[u], seq)) break;
              if (gin_wait_timed_out(spins, start, errorFlags)) {
                v[u] = seq << 32 | 0xffffffffull;  // both ids masked
                break;
              }
            }
          }
          const uint32_t h = (uint32_t)(v[u] >> (16 * (k & 1))) & 0xffffu;
          e[u] = h == 0xffffu ? -1 : (int)h;
        }
      }
#pragma unroll
      for (int u = 0; u < kTpWalkRounds; ++u) {
        const int t = tw + u * step + sub;
        int ev = e[u];
        if (ev >= d.E) ev = -1;
        if (ev < 0) ev = -1;
        const bool dup = id_repeats_lower(ev, k, Kp);  // masked (token_experts' rule)
        const bool local = !dup && (unsigned)(ev - lo) < (unsigned)d.L;
        const bool before = t < ct0, inCh = !before && t < ct1;
        const uint32_t bit = inCh ? 1u << (t - ct0) : 0u;
        if (local) {
          const int i = src * d.L + (ev - lo);
          atomicAdd(&s.cnt[i], 1);
          if (before) atomicAdd(&s.run[i], 1);
          else if (inCh) atomicOr(&s.mask[i], bit);
        }
        const lanemask_t lm = (lanemask_t)moe_detail::ballot(local);
        const bool here = k == 0 && ((lm >> (sub * Kp)) & groupBits) != 0;  // t < Tsrc implied
        const lanemask_t hb = (lanemask_t)moe_detail::ballot(here);
        const lanemask_t bb = (lanemask_t)moe_detail::ballot(here && before);
        nHere += __popc((uint32_t)hb) + (GIN_WARP_SIZE > 32 ? __popc((uint32_t)((uint64_t)hb >> 32)) : 0);
        nBefore += __popc((uint32_t)bb) + (GIN_WARP_SIZE > 32 ? __popc((uint32_t)((uint64_t)bb >> 32)) : 0);
        if (here) {
          if (inCh) atomicOr(&s.maskD[src], bit);
          if (c == 0) atomicAdd(&s.hist[src * d.C + ((t + 1) * d.C - 1) / Tsrc], 1);  // < 2^31: M, C bounded
        }
      }
      if (tw == warp * perWarp && q == 0) GIN_TRACE(MOE_TRACE_TP_WALK_FIRST);  // thread 0: its warp's first (own) tokens counted
    }
    if (lane == 0 && nHere) {
      atomicAdd(&s.slots[src], nHere);
      if (nBefore) atomicAdd(&s.runD[src], nBefore);
    }
  }
  GIN_TRACE(MOE_TRACE_TP_WALK_COUNTED);  // thread 0's tokens counted (before the barrier)
  __syncthreads();
  GIN_TRACE(MOE_TRACE_TP_WALK_DONE);  // every source's ids walked
  // rowBase[s][e] = expertStart[e] + sum_{s' < s} cnt[s'][e] + run[s][e]: thread i takes local
  // experts [i*per, (i+1)*per) (per = 1 up to L = 512), warp scans of their rows, the warp totals
  // through shared memory after one barrier (one block scan with three barriers and
  // thread 0 alone on the item ends costs ~2 us). The last warp finds the item ends meanwhile.
  int* warpTot = s.scanTmp;
  const int per = (d.L + B - 1) / B;  // experts per thread (1 for L <= 512)
  const int e0 = moe_min_i(d.L, tid * per), e1 = moe_min_i(d.L, e0 + per);
  int sum = 0;
  for (int e = e0; e < e1; ++e) {
    int tot = 0;
    for (int q = 0; q < d.R; ++q) tot += s.cnt[q * d.L + e];
    if (c == 0) recvCounts[e] = tot;
    sum += moe_expert_block_rows(tot, d.A);  // the scan below gives the d.A-aligned expert starts
  }
  int inc = sum;
#pragma unroll
  for (int off = 1; off < GIN_WARP_SIZE; off <<= 1) {
    const int v = shfl_up_i(inc, off);
    if (lane >= off) inc += v;
  }
  if (lane == GIN_WARP_SIZE - 1) warpTot[warp] = inc;
  if (warp == nWarps - 1) {  // item ends: own tokens first (they wait for nothing), then rank + q
    int items = 0;
    if (lane < d.R) {
      // Own tokens: row_split segments of x; remote ones: passes of kTpPassLines LL128 lines.
      const int src = (d.rank + lane) % d.R;
      const int n = __popc(s.maskD[src]);
      const int nl = (int)moe_row_lines(d.rowBytes);
      s.nseg[src] = lane == 0 ? s.splitNseg[n] : (nl + kTpPassLines - 1) / kTpPassLines;
      s.segBytes[src] = s.splitSegBytes[n];
      items = n * s.nseg[src];
    }
    int incI = items;
#pragma unroll
    for (int off = 1; off < GIN_WARP_SIZE; off <<= 1) {
      const int v = shfl_up_i(incI, off);
      if (lane >= off) incI += v;
    }
    if (lane < d.R) s.itemEnd[lane + 1] = incI;
    if (lane == 0) s.itemEnd[0] = 0;
  }
  __syncthreads();
  int run = inc - sum;
  if (e0 < e1)
    for (int w = 0; w < warp; ++w) run += warpTot[w];
  for (int e = e0; e < e1; ++e) {
    const int start = run;
    for (int q = 0; q < d.R; ++q) {
      s.rowBase[q * d.L + e] = run + s.run[q * d.L + e];
      run += s.cnt[q * d.L + e];
    }
    run = start + moe_expert_block_rows(run - start, d.A);
  }
}
