// moe/routing_layout.cuh - the routing layout (slot and row positions of every (token, expert)),
// shared by the GIN dispatch's senders and moe_host_layout.
#pragma once

#include "row_movers.cuh"
#include "trace_slots.cuh"

namespace moe_detail {

// ------------------------------------------------------------------------------------------------
// Routing layout, shared by moe_gin_dispatch (its sender blocks) and moe_host_layout.
// Block c of C owns tokens [c*T/C, (c+1)*T/C). Positions are deterministic: the row of (t, e) among
// this rank's rows for expert e is the number of tokens t' < t that picked e (slotInExpert), the
// slot of t towards rank d is the number of tokens t' < t going to d (tokenPos). Each block
//   1. counts its tokens per expert / destination and publishes the histogram (histReady[c] = seq),
//   2. sums the histograms of blocks < c (it waits only for lower blocks, so blocks dispatched in
//      index order always progress) = its starting offsets; the last block also gets the totals,
//   3. walks its tokens in tiles of 32-token chunks: per expert a 32-bit mask per chunk (atomicOr,
//      order-free), a scan over chunks, then position = prefix + popc(mask below the token).
// ------------------------------------------------------------------------------------------------
struct LayoutSmem {
  int cntE[MOE_MAX_EXPERTS];  // this block's rows per expert
  int runE[MOE_MAX_EXPERTS];  // rows of lower blocks per expert, then running position
  int cntD[MOE_MAX_RANKS];    // this block's tokens per destination
  int runD[MOE_MAX_RANKS];
  int prefD[MOE_MAX_RANKS];   // tokens of lower blocks per destination (= this channel's first slot)
  uint32_t maskD[MOE_MAX_RANKS];  // small layout: bit i = own token t0 + i goes to rank r (slot order)
  uint32_t tokDest[32];           // token-path sender: bit r = own token t0 + j goes to rank r
  union {
    struct {
      uint32_t bits[MOE_TILE_WORDS];  // [E][chunks] token masks
      int pre[MOE_TILE_WORDS];        // [E][chunks] position of the chunk's first hit
      uint32_t dbits[MOE_MAX_RANKS * 32];
      int dpre[MOE_MAX_RANKS * 32];
    } tile;
    struct {
      int histD[MOE_MAX_CHANNELS * MOE_MAX_RANKS];          // [C][R] of every block
      int chanStart[MOE_MAX_RANKS * (MOE_MAX_CHANNELS + 1)];  // [R][C+1]
    } lead;
  } u;
  int scanTmp[MOE_THREADS];
  int ok;
};

// Step 1: histogram of the block's tokens into smem and into this block's rows of histE / histD.
GIN_DEVICE_INLINE void layout_histogram(LayoutSmem& s, const int* topkIdx, const Dims& d, int t0, int t1,
                                        int* histERow, int* histDRow, uint32_t* errorFlags) {
  const int tid = (int)threadIdx.x, B = (int)blockDim.x;
  for (int e = tid; e < d.E; e += B) s.cntE[e] = 0;
  for (int r = tid; r < d.R; r += B) s.cntD[r] = 0;
  __syncthreads();
  const int Kp = id_group_size(d.K), k = tid & (Kp - 1), per = B / Kp;
  for (int base = t0; base < t1; base += per) {  // block-uniform
    bool bad;
    const int e = lane_expert(topkIdx, base + tid / Kp, t1, k, Kp, d, bad);
    if (gin_warp_any(bad) && gin_lane_id() == 0) gin_error_set(errorFlags, MOE_ERR_EXPERT_ID);
    if (e >= 0) atomicAdd(&s.cntE[e], 1);
    if (lane_first_of_rank(e, k, Kp, d)) atomicAdd(&s.cntD[e / d.L], 1);
  }
  __syncthreads();
  for (int e = tid; e < d.E; e += B) histERow[e] = s.cntE[e];
  for (int r = tid; r < d.R; r += B) histDRow[r] = s.cntD[r];
}

// One-level layout (T*K <= kDirectLayoutIds = 4096, i.e. up to 512 tokens at top-8; at 65536 ids
// the last block's walk over all 32K ids of 4096 tokens takes ~33 us, and with the two-level walks
// one id per lane Mixtral at 4096 tokens, 8192 ids, R = 1, 8 back to back, takes 50.8 us two-level
// against 58.2 one-level): block c
// counts the ids of tokens [0, t0) itself (runE / runD / prefD: its starting offsets) and its own
// tokens [t0, t1) (cntE / cntD), straight from topkIdx: no histogram publication and no wait for
// other blocks (at 128 tokens the two-level steps 1-2 cost ~11-13 us of flag and fence latency;
// this reads at most T*K ids, 4 KB there). The leader (lead = last block, t1 = T) also counts
// tokens per (channel, destination) into u.lead.histD for chanStart. Same numbers as steps 1-2.
constexpr int64_t kDirectLayoutIds = 4096;
GIN_DEVICE_INLINE bool layout_is_direct(const Dims& d) { return (int64_t)d.T * (int64_t)d.K <= kDirectLayoutIds; }

GIN_DEVICE_INLINE void layout_direct(LayoutSmem& s, const int* topkIdx, const Dims& d, int t0, int t1, bool lead,
                                     uint32_t* errorFlags) {
  const int tid = (int)threadIdx.x, B = (int)blockDim.x;
  for (int e = tid; e < d.E; e += B) {
    s.cntE[e] = 0;
    s.runE[e] = 0;
  }
  for (int r = tid; r < d.R; r += B) {
    s.cntD[r] = 0;
    s.runD[r] = 0;
  }
  if (lead)
    for (int i = tid; i < d.C * d.R; i += B) s.u.lead.histD[i] = 0;
  __syncthreads();
  int ev[MOE_MAX_TOPK];
  for (int t = tid; t < t1; t += B) {
    const bool own = t >= t0;
    token_experts(topkIdx, t, d, ev, own, errorFlags);  // each token reported by its own block only
    int* ce = own ? s.cntE : s.runE;
    int* cd = own ? s.cntD : s.runD;
    uint32_t destMask = 0;
#pragma unroll
    for (int k = 0; k < MOE_MAX_TOPK; ++k) {
      if (k >= d.K) break;
      if (ev[k] < 0) continue;
      atomicAdd(&ce[ev[k]], 1);
      destMask |= 1u << (ev[k] / d.L);
    }
    // Channel of t: the largest j with j*T/C <= t (token_range's partition).
    const int ch = lead ? (int)(((int64_t)(t + 1) * d.C - 1) / d.T) : 0;
    while (destMask) {
      const int r = __ffs((int)destMask) - 1;
      destMask &= destMask - 1;
      atomicAdd(&cd[r], 1);
      if (lead) atomicAdd(&s.u.lead.histD[ch * d.R + r], 1);
    }
  }
  __syncthreads();
  for (int r = tid; r < d.R; r += B) s.prefD[r] = s.runD[r];
  __syncthreads();
}

// Small blocks of the one-level layout: when the block owns at most 32 tokens (every
// top-8 call up to 2112 tokens at C = 66), routing and positions are one walk over the ids: lower
// tokens are counted into runE / runD, own token t sets bit t - t0 of the 32-bit masks held in
// cntE / cntD, so after one barrier the position of (t, e) is runE[e] + popc(mask[e] below t) and
// the slot of t towards d is runD[d] + popc(maskD[d] below t). Running layout_positions after
// the count walk instead (a second walk, a 3072-word tile to clear, three more barriers) puts the
// positions at 13.4 us against routing counted at 5.9 for DeepSeek-V3 at 128 tokens. Same numbers as
// layout_direct + layout_positions; ends with cntE / cntD holding counts again and prefD = runD.
GIN_DEVICE_INLINE bool layout_is_small(const Dims& d, int t0, int t1) { return layout_is_direct(d) && t1 - t0 <= 32; }

// underWalk() is called by every thread between the clearing barrier and the id walk (the
// dispatch's write-after-read probes: their acquires then overlap the walk instead of delaying
// the first barrier). After small_walk, cntD[r] holds the own tokens' masks (bit i =
// token t0 + i goes to r), after small_positions counts again (and maskD the masks).
template <class UnderWalk>
GIN_DEVICE_INLINE void small_walk(LayoutSmem& s, const int* topkIdx, const Dims& d, int t0, int t1, bool lead,
                                  uint32_t* errorFlags, const UnderWalk& underWalk) {
  const int tid = (int)threadIdx.x, B = (int)blockDim.x;
  for (int e = tid; e < d.E; e += B) {
    s.cntE[e] = 0;
    s.runE[e] = 0;
  }
  for (int r = tid; r < d.R; r += B) {
    s.cntD[r] = 0;
    s.runD[r] = 0;
  }
  if (lead)
    for (int i = tid; i < d.C * d.R; i += B) s.u.lead.histD[i] = 0;
  __syncthreads();
  GIN_TRACE(MOE_TRACE_SMALL_LAYOUT_CLEARED);  // (dispatch only) counters cleared
  underWalk();
  int ev[MOE_MAX_TOPK];
  for (int t = tid; t < t1; t += B) {
    const bool own = t >= t0;
    token_experts(topkIdx, t, d, ev, own, errorFlags);  // each token reported by its own block only
    const int bit = (int)(1u << ((t - t0) & 31));
    uint32_t destMask = 0;
#pragma unroll
    for (int k = 0; k < MOE_MAX_TOPK; ++k) {
      if (k >= d.K) break;
      if (ev[k] < 0) continue;
      if (own) atomicOr(&s.cntE[ev[k]], bit);
      else atomicAdd(&s.runE[ev[k]], 1);
      destMask |= 1u << (ev[k] / d.L);
    }
    const int ch = lead ? (int)(((int64_t)(t + 1) * d.C - 1) / d.T) : 0;
    while (destMask) {
      const int r = __ffs((int)destMask) - 1;
      destMask &= destMask - 1;
      if (own) atomicOr(&s.cntD[r], bit);
      else atomicAdd(&s.runD[r], 1);
      if (lead) atomicAdd(&s.u.lead.histD[ch * d.R + r], 1);
    }
  }
  __syncthreads();
  GIN_TRACE(MOE_TRACE_SMALL_LAYOUT_WALKED);  // ids walked (counts and masks)
}
GIN_DEVICE_INLINE void small_positions(LayoutSmem& s, const int* topkIdx, const Dims& d, int t0, int t1,
                                       int* slotInExpert, int* tokenPos, int* sendList) {
  const int tid = (int)threadIdx.x, B = (int)blockDim.x;
  int ev[MOE_MAX_TOPK];
  // Positions of the own tokens (ids again: L1 hits of this block's first walk).
  for (int i = tid; i < t1 - t0; i += B) {
    const int t = t0 + i;
    const uint32_t below = (1u << i) - 1u;
    token_experts(topkIdx, t, d, ev, false, nullptr);
#pragma unroll
    for (int k = 0; k < MOE_MAX_TOPK; ++k) {
      if (k >= d.K) break;
      const int e = ev[k];
      slotInExpert[(uint64_t)t * d.K + k] = e < 0 ? -1 : s.runE[e] + __popc((uint32_t)s.cntE[e] & below);
    }
    for (int r = 0; r < d.R; ++r) {
      const uint32_t m = (uint32_t)s.cntD[r];
      int pos = -1;
      if ((m >> i) & 1u) {
        pos = s.runD[r] + __popc(m & below);
        sendList[(uint64_t)r * d.M + pos] = t;
      }
      tokenPos[(uint64_t)t * d.R + r] = pos;
    }
  }
  __syncthreads();  // masks read; back to counts
  for (int e = tid; e < d.E; e += B) s.cntE[e] = __popc((uint32_t)s.cntE[e]);
  for (int r = tid; r < d.R; r += B) {
    s.maskD[r] = (uint32_t)s.cntD[r];  // the senders' slot -> token map (no sendList round trip)
    s.cntD[r] = __popc((uint32_t)s.cntD[r]);
    s.prefD[r] = s.runD[r];
  }
  __syncthreads();
}

template <class UnderWalk>
GIN_DEVICE_INLINE void layout_direct_small(LayoutSmem& s, const int* topkIdx, const Dims& d, int t0, int t1, bool lead,
                                           int* slotInExpert, int* tokenPos, int* sendList, uint32_t* errorFlags,
                                           const UnderWalk& underWalk) {
  small_walk(s, topkIdx, d, t0, t1, lead, errorFlags, underWalk);
  small_positions(s, topkIdx, d, t0, t1, slotInExpert, tokenPos, sendList);
}

// Publishes this block's histogram rows (written by all threads) with one release.
GIN_DEVICE_INLINE void publish_local(uint64_t* flag, uint64_t value) {
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) gin_st_release_sys(flag, value);
}

// Step 2: runE / runD / prefD = sums over blocks < c. Returns false after a timeout.
GIN_DEVICE_INLINE bool layout_prefix(LayoutSmem& s, const Dims& d, int c, const int* histE, const int* histD,
                                     const uint64_t* histReady, uint64_t seq, uint32_t* errorFlags) {
  const int tid = (int)threadIdx.x, B = (int)blockDim.x;
  if (tid == 0) s.ok = 1;
  for (int e = tid; e < d.E; e += B) s.runE[e] = 0;
  for (int r = tid; r < d.R; r += B) s.runD[r] = 0;
  __syncthreads();
  bool ok = true;
  for (int b = tid; b < c; b += B) ok &= gin_wait_geq(histReady + b, seq, errorFlags);
  if (!ok) s.ok = 0;
  __syncthreads();  // acquire by thread b, then the barrier: every thread may read block b's rows
  // Column sums: thread (g, u) adds unit u (4 experts when E % 4 == 0: one 16-byte load, rows
  // are 16-byte aligned then) of rows g, g+G, ... < c with 8 loads in flight, then one shared add
  // per expert and group (G-way at most), not a shared atomic per loaded int (up to C*E of them
  // into the same E words).
  const int per = (d.E & 3) == 0 ? 4 : 1;
  const int units = d.E / per;
  const int G = units >= B ? 1 : B / units;
  for (int idx = tid; idx < units * G; idx += B) {
    const int u = idx % units, g = idx / units;
    int acc0 = 0, acc1 = 0, acc2 = 0, acc3 = 0;
    for (int b0 = g; b0 < c; b0 += 8 * G) {
      int4 v[8];
#pragma unroll
      for (int q = 0; q < 8; ++q) {
        const int b = b0 + q * G;
        const int* src = histE + (uint64_t)b * (uint64_t)d.E + (uint64_t)u * (uint64_t)per;
        v[q] = b >= c ? make_int4(0, 0, 0, 0) : (per == 4 ? ld_fresh_i32x4(src) : make_int4(ld_fresh_i32(src), 0, 0, 0));
      }
#pragma unroll
      for (int q = 0; q < 8; ++q) {
        acc0 += v[q].x;
        acc1 += v[q].y;
        acc2 += v[q].z;
        acc3 += v[q].w;
      }
    }
    const int accs[4] = {acc0, acc1, acc2, acc3};
#pragma unroll
    for (int q = 0; q < 4; ++q)
      if (q < per && accs[q] != 0) atomicAdd(&s.runE[u * per + q], accs[q]);
  }
  const int nD = c * d.R;
  for (int i = tid; i < nD; i += B) {
    const int v = ld_fresh_i32(histD + i);
    if (v != 0) atomicAdd(&s.runD[i % d.R], v);
  }
  __syncthreads();
  for (int r = tid; r < d.R; r += B) s.prefD[r] = s.runD[r];
  __syncthreads();
  return s.ok != 0;
}

// Last block only: channel boundaries per destination, chanStart[r][j] = sum_{b<j} histD[b][r]
// for j in [0, C], into smem (u.lead) and workspace chanStartTo; totals into expertCount/tokensTo.
// histD: the published rows (two-level layout), or nullptr when layout_direct already filled
// u.lead.histD.
// cntIsMask: called between small_walk and small_positions (token path), where cntE holds the
// own tokens' masks.
// Exclusive prefix over channels j < C of h[j * stride] by one warp: lane l sums channels
// [l*per, (l+1)*per), a shuffle scan gives the lanes' starts, then out(j, prefix) per channel;
// returns the total to every lane (one thread per (r, j) summing up to C shared words costs
// ~1-2 us).
template <class Out>
GIN_DEVICE_INLINE int warp_chan_scan(const int* h, int stride, int C, const Out& out) {
  const int lane = (int)gin_lane_id();
  const int per = (C + GIN_WARP_SIZE - 1) / GIN_WARP_SIZE;
  const int j0 = moe_min_i(C, lane * per), j1 = moe_min_i(C, j0 + per);
  int sum = 0;
  for (int j = j0; j < j1; ++j) sum += h[j * stride];
  int inc = sum;
#pragma unroll
  for (int off = 1; off < GIN_WARP_SIZE; off <<= 1) {
    const int v = shfl_up_i(inc, off);
    if (lane >= off) inc += v;
  }
  int run = inc - sum;
  for (int j = j0; j < j1; ++j) {
    out(j, run);
    run += h[j * stride];
  }
  return gin_shfl_int(inc, GIN_WARP_SIZE - 1);
}

// chanStartTo[r][j] = tokens of channels < j going to r (j <= C; [C] = all of them) from the
// per-(channel, destination) counts in s.u.lead.histD, also kept in s.u.lead.chanStart; one warp
// per destination.
GIN_DEVICE_INLINE void lead_chan_start(LayoutSmem& s, const Dims& d, int* chanStartTo) {
  const int warp = (int)threadIdx.x / GIN_WARP_SIZE, nw = (int)blockDim.x / GIN_WARP_SIZE;
  for (int r = warp; r < d.R; r += nw) {
    const int total = warp_chan_scan(s.u.lead.histD + r, d.R, d.C, [&](int j, int v) {
      s.u.lead.chanStart[r * (d.C + 1) + j] = v;
      chanStartTo[r * (MOE_MAX_CHANNELS + 1) + j] = v;
    });
    if (gin_lane_id() == 0) {
      s.u.lead.chanStart[r * (d.C + 1) + d.C] = total;
      chanStartTo[r * (MOE_MAX_CHANNELS + 1) + d.C] = total;
    }
  }
}

GIN_DEVICE_INLINE void layout_lead_totals(LayoutSmem& s, const Dims& d, const int* histD, int* expertCount,
                                          int* tokensTo, int* chanStartTo, bool cntIsMask = false) {
  const int tid = (int)threadIdx.x, B = (int)blockDim.x;
  const int last = d.C - 1;
  if (histD != nullptr) {
    for (int i = tid; i < d.C * d.R; i += B) {
      const int b = i / d.R;
      s.u.lead.histD[i] = b < last ? ld_fresh_i32(histD + i) : s.cntD[i % d.R];
    }
    __syncthreads();
  }
  lead_chan_start(s, d, chanStartTo);
  for (int e = tid; e < d.E; e += B) expertCount[e] = s.runE[e] + (cntIsMask ? __popc((uint32_t)s.cntE[e]) : s.cntE[e]);
  __syncthreads();
  for (int r = tid; r < d.R; r += B) tokensTo[r] = s.u.lead.chanStart[r * (d.C + 1) + d.C];
}

// Token-path sender, after its sends: what the combine reads of the sending side, from
// destination masks alone: tokenPos of the own tokens (slot of t towards r = own tokens t' < t
// going to r, -1 if t does not go to r) and, in the last block, chanStartTo and the dispatch's T.
// The small layout's per-expert walk and positions are not needed here (they would cost 4-5 us
// after the sends, the end of the kernel); slotInExpert, sendList, expertCount and tokensTo of a GIN workspace are read
// by nothing (the HOST path keeps its own workspace). s.runD and (last block) s.u.lead.histD must
// be zero and s.tokDest hold the own tokens' destinations (bit r) on entry.
GIN_DEVICE_INLINE void tp_send_positions(LayoutSmem& s, const int* topkIdx, const Dims& d, int c, int t0, int t1,
                                         int* tokenPos, int* chanStartTo, uint64_t* state) {
  const int tid = (int)threadIdx.x, B = (int)blockDim.x;
  const int lane = (int)gin_lane_id(), warp = tid / GIN_WARP_SIZE;
  const bool last = c == d.C - 1;
  // Lower tokens per destination (the last block: every token, per channel too), one id per lane
  // as in tp_recv_layout: groups of Kp lanes hold one token's ids.
  const int tEnd = last ? d.T : t0;
  const int Kp = id_group_size(d.K), lgK = __ffs(Kp) - 1;
  const int perWarp = GIN_WARP_SIZE >> lgK, k = lane & (Kp - 1), sub = lane >> lgK;
  for (int f0 = warp * perWarp; f0 < tEnd; f0 += (B / GIN_WARP_SIZE) * perWarp) {  // warp-uniform
    const int f = f0 + sub;
    int e = -1;
    if (f < tEnd && k < d.K) {
      e = topkIdx[(uint64_t)f * d.K + k];
      if (e < 0 || e >= d.E) e = -1;
    }
    uint32_t dm = e >= 0 ? 1u << (e / d.L) : 0u;
    for (int off = Kp >> 1; off > 0; off >>= 1) dm |= (uint32_t)gin_shfl_xor_int((int)dm, off);  // within the group
    const bool lead = k == 0 && f < tEnd;
    for (int r = 0; r < d.R; ++r) {
      const lanemask_t m = (lanemask_t)moe_detail::ballot(lead && f < t0 && ((dm >> r) & 1u) != 0u);
      if (lane == 0 && m != 0)
        atomicAdd(&s.runD[r], __popc((uint32_t)m) + (GIN_WARP_SIZE > 32 ? __popc((uint32_t)((uint64_t)m >> 32)) : 0));
    }
    if (last && lead) {
      const int ch = ((f + 1) * d.C - 1) / d.T;  // token_range's channel of f (< 2^31: M*C bounded)
      for (uint32_t m = dm; m != 0u; m &= m - 1u) atomicAdd(&s.u.lead.histD[ch * d.R + __ffs((int)m) - 1], 1);
    }
  }
  __syncthreads();
  if (warp == 0) {  // own token t0 + lane (<= 32 of them)
    const int t = t0 + lane;
    const uint32_t dm = lane < 32 ? s.tokDest[lane & 31] : 0u;
    const lanemask_t below = (lanemask_t)(((uint64_t)1 << lane) - 1);
    for (int r = 0; r < d.R; ++r) {
      const bool to = ((dm >> r) & 1u) != 0u;
      const lanemask_t m = (lanemask_t)moe_detail::ballot(to);
      const lanemask_t mb = m & below;
      if (t < t1)
        tokenPos[(uint64_t)t * d.R + r] =
            to ? s.runD[r] + __popc((uint32_t)mb) + (GIN_WARP_SIZE > 32 ? __popc((uint32_t)((uint64_t)mb >> 32)) : 0) : -1;
    }
  }
  if (last) {
    lead_chan_start(s, d, chanStartTo);
    if (tid == 0) state[MOE_STATE_DISPATCH_TOKENS] = (uint64_t)d.T;
  }
}

// Step 3: final positions of the block's tokens. runE/runD hold the block's starting offsets.
GIN_DEVICE_INLINE void layout_positions(LayoutSmem& s, const int* topkIdx, const Dims& d, int t0, int t1,
                                        int* slotInExpert, int* tokenPos, int* sendList) {
  const int tid = (int)threadIdx.x, B = (int)blockDim.x;
  const int NC = moe_min_i(32, MOE_TILE_WORDS / d.E);  // chunks per tile (>= 1 since E <= 2048)
  const int tileTokens = 32 * NC;
  const int Kp = id_group_size(d.K), k = tid & (Kp - 1), per = B / Kp;
  for (int tb = t0; tb < t1; tb += tileTokens) {
    const int nt = moe_min_i(tileTokens, t1 - tb);
    const int nch = (nt + 31) >> 5;
    for (int i = tid; i < d.E * NC; i += B) s.u.tile.bits[i] = 0;
    for (int i = tid; i < d.R * NC; i += B) s.u.tile.dbits[i] = 0;
    __syncthreads();
    for (int i0 = 0; i0 < nt; i0 += per) {  // block-uniform
      const int i = i0 + tid / Kp, ch = i >> 5;
      const uint32_t bit = 1u << (i & 31);
      bool bad;
      const int e = lane_expert(topkIdx, tb + i, tb + nt, k, Kp, d, bad);
      if (e >= 0) atomicOr(&s.u.tile.bits[e * NC + ch], bit);
      if (lane_first_of_rank(e, k, Kp, d)) atomicOr(&s.u.tile.dbits[(e / d.L) * NC + ch], bit);
    }
    __syncthreads();
    for (int i = tid; i < d.E + d.R; i += B) {
      if (i < d.E) {
        int run = s.runE[i];
        for (int ch = 0; ch < nch; ++ch) {
          s.u.tile.pre[i * NC + ch] = run;
          run += __popc(s.u.tile.bits[i * NC + ch]);
        }
        s.runE[i] = run;
      } else {
        const int r = i - d.E;
        int run = s.runD[r];
        for (int ch = 0; ch < nch; ++ch) {
          s.u.tile.dpre[r * NC + ch] = run;
          run += __popc(s.u.tile.dbits[r * NC + ch]);
        }
        s.runD[r] = run;
      }
    }
    __syncthreads();
    for (int i0 = 0; i0 < nt; i0 += per) {  // block-uniform
      const int i = i0 + tid / Kp, t = tb + i, ch = i >> 5;
      const uint32_t bit = 1u << (i & 31), below = bit - 1u;
      bool bad;
      const int e = lane_expert(topkIdx, t, tb + nt, k, Kp, d, bad);
      if (i >= nt) continue;  // after the shuffles
      if (k < d.K)
        slotInExpert[(uint64_t)t * d.K + k] =
            e < 0 ? -1 : s.u.tile.pre[e * NC + ch] + __popc(s.u.tile.bits[e * NC + ch] & below);
      for (int r = k; r < d.R; r += Kp) {
        const uint32_t m = s.u.tile.dbits[r * NC + ch];
        int pos = -1;
        if (m & bit) {
          pos = s.u.tile.dpre[r * NC + ch] + __popc(m & below);
          sendList[(uint64_t)r * d.M + pos] = t;
        }
        tokenPos[(uint64_t)t * d.R + r] = pos;
      }
    }
    __syncthreads();
  }
}
}  // namespace moe_detail
