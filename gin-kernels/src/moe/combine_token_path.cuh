// moe/combine_token_path.cuh - the combine on the token path: partials as LL128 lines.
#pragma once

#include "routing.cuh"
#include "row_movers.cuh"
#include "ll128_rows.cuh"
#include "trace_slots.cuh"

// ------------------------------------------------------------------------------------------------
// Combine, token path (the dispatch's token-path sizes: M*K <= MOE_TOKEN_PATH_IDS and at
// most 32 tokens per channel). Partials travel as LL128 lines (see "LL128 rows" above), in buffer
// n % 2 of the source's window. The consumer sums each line as it lands (no progress word, no
// release fence, no consumed flag, nothing ever cleared).
// ------------------------------------------------------------------------------------------------
// Asks L2 for the row bytes of lines [L0, L1) of one row (main and tail ranges), as prefetch_l2.
GIN_DEVICE_INLINE void tp_prefetch_lines(const uint8_t* row, uint64_t rowBytes, int nl, int L0, int L1, bool fast) {
  if (!fast) return;
  uint64_t a = 112ull * (uint64_t)L0, b = 112ull * (uint64_t)L1;
  if (b > rowBytes) b = rowBytes;
  if (a < b) prefetch_l2(row + a, (uint32_t)(b - a));
  a = 112ull * (uint64_t)nl + 8ull * (uint64_t)L0;
  b = 112ull * (uint64_t)nl + 8ull * (uint64_t)L1;
  if (b > rowBytes) b = rowBytes;
  a &= ~15ull;  // prefetch wants 16-byte multiples
  b = (b + 15ull) & ~15ull;
  if (b > rowBytes) b = rowBytes;
  if (a < b) prefetch_l2(row + a, (uint32_t)(b - a));
}

// acc[u] += sum over lanes k < nk with myRow >= 0 (lane order) of w_k * bytes of row_k under this
// lane's chunk of line L0 + u * kTpGroups + group. Fast path: rows in groups of kReduceGroup with
// all their loads in flight, one address per row (a lane's chunks of a pass are a fixed stride
// apart: 112 * kTpGroups bytes in the main region, 8 * kTpGroups in the tail); element loads
// otherwise (odd sizes, one row at a time).
GIN_DEVICE_INLINE void tp_sum_own(float (&acc)[kTpUnroll][8], const uint8_t* rowsBase, uint64_t rowBytes, int myRow,
                                  float myW, int nk, int nl, int L0, bool fast) {
  const int lane = (int)gin_lane_id(), g = lane >> 3, j = lane & 7;
  const bool wide = j < 7;
  lanemask_t mOwn = (lanemask_t)moe_detail::ballot(lane < nk && myRow >= 0);
  const uint64_t off0 = tp_chunk_off(L0 + g, j, nl);
  const uint64_t stride = wide ? 112ull * kTpGroups : 8ull * kTpGroups;
  if (!fast) {
    while (mOwn) {
      const int k = lanemask_ffs(mOwn);
      mOwn &= mOwn - 1;
      const int row = gin_shfl_int(myRow, k);
      const float w = shfl_f(myW, k);
      const uint8_t* src = rowsBase + (uint64_t)(row < 0 ? 0 : row) * rowBytes;
      for (int u = 0; u < kTpUnroll; ++u)
        if (L0 + u * kTpGroups + g < nl) acc_bf16x8(acc[u], tp_load_chunk<false>(src, off0 + (uint64_t)u * stride, wide, rowBytes, false), w);
    }
    return;
  }
  // Chunks of this lane inside the row (a whole chunk or none on the fast path).
  uint32_t live = 0;
#pragma unroll
  for (int u = 0; u < kTpUnroll; ++u)
    if (L0 + u * kTpGroups + g < nl && off0 + (uint64_t)u * stride < rowBytes) live |= 1u << u;
  while (mOwn) {
    const uint8_t* src[kReduceGroup];
    int wl[kReduceGroup];
#pragma unroll
    for (int q = 0; q < kReduceGroup; ++q) {
      wl[q] = -1;
      src[q] = rowsBase;
      if (mOwn) {
        const int k = lanemask_ffs(mOwn);
        mOwn &= mOwn - 1;
        const int row = gin_shfl_int(myRow, k);
        wl[q] = k;
        src[q] = rowsBase + (uint64_t)(row < 0 ? 0 : row) * rowBytes + off0;
      }
    }
    gin_u128 r[kReduceGroup][kTpUnroll];
#pragma unroll
    for (int q = 0; q < kReduceGroup; ++q)
#pragma unroll
      for (int u = 0; u < kTpUnroll; ++u) {
        r[q][u].lo = 0;
        r[q][u].hi = 0;
        if (wl[q] >= 0 && ((live >> u) & 1u)) {
          const uint8_t* a = src[q] + (uint64_t)u * stride;
          if (wide) r[q][u] = gin_ld16_stream(a);
          else r[q][u].lo = gin_ld8_stream(a);
        }
      }
#pragma unroll
    for (int q = 0; q < kReduceGroup; ++q) {
      if (wl[q] < 0) continue;  // warp-uniform
      const float wq = shfl_f(myW, wl[q]);
#pragma unroll
      for (int u = 0; u < kTpUnroll; ++u)
        if ((live >> u) & 1u) acc_bf16x8(acc[u], r[q][u], wq);
    }
  }
}

// Producer: lines [L0, L0 + kTpPassLines) of one slot's partial into the LL128 lines at `lines`
// (a peer's window), flag = call number n.
GIN_DEVICE_INLINE void tp_produce_pass(const uint8_t* rowsBase, uint64_t rowBytes, int myRow, float myW, int nk,
                                       uint8_t* lines, int nl, int L0, uint64_t flag, bool fast) {
  const int lane = (int)gin_lane_id(), g = lane >> 3, j = lane & 7;
  float acc[kTpUnroll][8];
#pragma unroll
  for (int u = 0; u < kTpUnroll; ++u)
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[u][i] = 0.f;
  tp_sum_own(acc, rowsBase, rowBytes, myRow, myW, nk, nl, L0, fast);
  syncwarp();  // the 8 lanes of a line converged: one store instruction per line
#pragma unroll
  for (int u = 0; u < kTpUnroll; ++u) {
    const int L = L0 + u * kTpGroups + g;
    const gin_u128 v = pack_bf16x8(acc[u]);
    gin_ll128_store16(L < nl, lines + (uint64_t)L * 128ull + 16ull * (uint64_t)j, v.lo, j < 7 ? v.hi : flag);
  }
}

// Consumer: lines [L0, L0 + kTpPassLines) of y[t] = own rows (lane k) + the partial lines of each
// remote rank (lane r: the slot's line base in our window, or null), in rank order, one rounding.
// Each line is polled until its flag is n (payload and flag from one read of the line). yRow null:
// the lines are waited for but nothing is stored (a token past the caller's y).
GIN_DEVICE_INLINE void tp_consume_pass(const uint8_t* rowsBase, uint64_t rowBytes, int myRow, float myW, int nk,
                                       const uint8_t* myLines, int nr, uint8_t* yRow, int nl, int L0, uint64_t flag,
                                       bool fast, uint32_t* errorFlags, bool first) {
  const int lane = (int)gin_lane_id(), g = lane >> 3, j = lane & 7;
  const bool wide = j < 7;
  float acc[kTpUnroll][8];
#pragma unroll
  for (int u = 0; u < kTpUnroll; ++u)
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[u][i] = 0.f;
  if (yRow != nullptr) tp_sum_own(acc, rowsBase, rowBytes, myRow, myW, nk, nl, L0, fast);
  lanemask_t mExt = (lanemask_t)moe_detail::ballot(lane < nr && myLines != nullptr);
  while (mExt) {
    const int r = lanemask_ffs(mExt);
    mExt &= mExt - 1;
    const uint8_t* base = shfl_ptr(myLines, r);
    uint64_t lo[kTpUnroll], hi[kTpUnroll];
    tp_wait_lines(base, nl, L0, flag, lo, hi, errorFlags);
    if (first) GIN_TRACE(MOE_TRACE_CONSUMER_FIRST);  // thread 0: warp 0's first partial lines landed
    first = false;
#pragma unroll
    for (int u = 0; u < kTpUnroll; ++u) {
      gin_u128 v;
      v.lo = lo[u];
      v.hi = wide ? hi[u] : 0ull;
      if (L0 + u * kTpGroups + g < nl) acc_bf16x8(acc[u], v, 1.f);
    }
  }
  if (yRow == nullptr) return;
#pragma unroll
  for (int u = 0; u < kTpUnroll; ++u) {
    const int L = L0 + u * kTpGroups + g;
    if (L < nl) tp_store_chunk(yRow, tp_chunk_off(L, j, nl), wide, rowBytes, fast, pack_bf16x8(acc[u]));
  }
}

// The token-path combine (moe_gin_combine's body when moe_token_path(K, M, C)); see docs/kernels.md
// ("moe_gin_combine"). Call n = this block's counter + 1; partial lines go to buffer n % 2.
//  producer c: for each remote source r, the slots [lo, hi) of r's channel c (chanStartFrom), items
//    (slot, pass of kTpPassLines lines) cut into contiguous ranges per warp; a source with no slot
//    in this channel gets a hello word (n) instead, so that its consumer c still sees this call.
//  consumer c: tokens of channel c, items (token, pass) likewise; every line of every slot of the
//    channel is read (no late stores), and a remote rank with no slot here is waited for by its
//    hello word: every consumer block observes every remote producer's call n, which is what makes
//    the parity buffers safe to rewrite without a consumed flag (docs/kernels.md).
struct TpCombSmem {
  uint64_t bases[MOE_MAX_RANKS];
  int lo[MOE_MAX_RANKS], hi[MOE_MAX_RANKS], slots[MOE_MAX_RANKS];
  uint64_t seq;
  int dispatchT;
  // Parked per-block context (written before the prologue barrier, read where used): held in
  // registers beside a pass's 8 x 16-byte loads and 32 accumulators they spilled.
  const uint8_t* rowsBase;
  const float* recvWeights;
  const int* slotRows;
  const int* tokenPos;
  uint8_t* y;
  uint32_t* errorFlags;
  uint64_t rowBytes, lineStride, combRows, combProgress;
  int nl, PP, capacity, recvCapacity, yRows;  // capacity: rows of expertOut that may be read (<= recvCapacity)
  bool fast;
};

// Lane k < K: the recvX row of slot entry `entry`'s expert k (slotRows; -1 = none, out of range
// flags MOE_ERR_COUNTS) and its weight in wt, and this warp's passes [pass, lastPass] of the row
// into L2 now, so the loads of later row groups and passes hit L2. Producer and consumer call it
// once per slot / token they start.
GIN_DEVICE_INLINE int tp_entry_row(const TpCombSmem& s, int K, uint64_t entry, int pass, int lastPass, float& wt) {
  int row = -1;
  wt = 0.f;
  if ((int)gin_lane_id() < K) {
    row = s.slotRows[entry * K + gin_lane_id()];
    if (row >= s.capacity || row < -1) {
      gin_error_set(s.errorFlags, row >= 0 && row < s.recvCapacity ? MOE_ERR_EXPERT_ROWS : MOE_ERR_COUNTS);
      row = -1;
    }
    if (row >= 0) {
      wt = s.recvWeights[row];
      const int L1 = (lastPass + 1) * kTpPassLines < s.nl ? (lastPass + 1) * kTpPassLines : s.nl;
      tp_prefetch_lines(s.rowsBase + (uint64_t)row * s.rowBytes, s.rowBytes, s.nl, pass * kTpPassLines, L1, s.fast);
    }
  }
  return row;
}

// Not inlined on NVIDIA: inlined into moe_gin_combine beside the layout path, ptxas gave the
// kernel a 16-byte spill at the 128-register cap; as a call, neither has a stack frame. Inlined on
// AMD: as a call, gfx942 needs 76 bytes of scratch per lane; inlined, none (29 SGPR spills to VGPR lanes).
#if GIN_HIP
#define MOE_NOINLINE GIN_DEVICE_INLINE
#else
#define MOE_NOINLINE __device__ __noinline__
#endif
template <class Shape>
MOE_NOINLINE void combine_token_path(const uint16_t* expertOut, const float* recvWeights, int32_t numTokens, int32_t expertOutRows,
                                     uint16_t* y, const uint64_t* peerBases, uint8_t* workspace,
                                     uint32_t* errorFlags, Dims d) {
  Shape::fix(d);  // the shape's constants inside the call as well (it is not inlined on NVIDIA)
  __shared__ TpCombSmem s;
  const int tid = (int)threadIdx.x;
  const int lane = (int)gin_lane_id(), warp = tid / GIN_WARP_SIZE;
  const bool producer = d.R > 1 && (int)blockIdx.x < d.C;  // alone, every block consumes (consumer_tokens)
  const int c = (int)blockIdx.x < d.C ? (int)blockIdx.x : (int)blockIdx.x - d.C;
  // Prologue: every load the block needs before its items, issued together by different
  // threads (peer bases, call counter, dispatch T, channel ranges), then one barrier, not
  // peerBases -> dispatch T -> counter and ranges -> write-after-read acquires -> barrier, four
  // dependent round trips (~2.5 us from entry to "start"); the token path has no acquire here.
  {
    const MoeWorkspaceLayout ws = moe_workspace_layout(d.R, d.E, d.K, d.M);
    uint64_t* state = state_of(workspace);
    if (tid < d.R) {
      s.bases[tid] = peerBases[tid];
    } else if (tid >= 16 && tid < 16 + d.R) {
      const int r = tid - 16;
      const int* cs = (const int*)(workspace + (producer ? ws.chanStartFrom : ws.chanStartTo)) + r * (MOE_MAX_CHANNELS + 1) + c;
      s.lo[r] = cs[0];
      s.hi[r] = cs[1];
      s.slots[r] = producer ? ((const int*)(workspace + ws.slotsFrom))[r] : d.M;
    } else if (tid == 32) {
      s.seq = state[MOE_STATE_SEQ_COMBINE + blockIdx.x] + 1;
      s.dispatchT = (int)state[MOE_STATE_DISPATCH_TOKENS];
    } else if (tid == 33) {
      const MoeWindowLayout wl = moe_window_layout(d.R, d.E, d.K, d.H, d.M);
      s.rowsBase = (const uint8_t*)expertOut;
      s.recvWeights = recvWeights;
      s.slotRows = (const int*)(workspace + ws.slotRows);
      s.tokenPos = (const int*)(workspace + ws.tokenPos);
      s.y = (uint8_t*)y;
      s.errorFlags = errorFlags;
      s.rowBytes = d.rowBytes;
      s.nl = (int)moe_comb_lines(d.H);
      s.lineStride = 128ull * (uint64_t)s.nl;
      s.PP = (s.nl + kTpPassLines - 1) / kTpPassLines;  // passes per row
      s.combRows = wl.combRows;
      s.combProgress = wl.combProgress;
      s.recvCapacity = (int)moe_recv_capacity_rows(d.R, d.E, d.K, d.M, d.A);
      s.capacity = expertOutRows < 0 ? 0 : (expertOutRows < s.recvCapacity ? expertOutRows : s.recvCapacity);
      s.yRows = numTokens < 0 ? 0 : numTokens;
      s.fast = (d.rowBytes & 15u) == 0 && gin_is_aligned(expertOut, 16) && gin_is_aligned(y, 16);
    }
  }
  __syncthreads();
  bool ok = true;
  for (int p = 0; p < d.R; ++p) ok &= s.bases[p] != 0 && (s.bases[p] & 15u) == 0;
  if (!ok) {
    if (blockIdx.x == 0 && tid == 0) gin_error_set(errorFlags, GIN_ERR_NO_LSA_PATH);
    return;
  }
  {
    const int dispatchT = s.dispatchT;
    if (dispatchT != numTokens && blockIdx.x == 0 && tid == 0) gin_error_set(errorFlags, MOE_ERR_TOKENS);
    d.T = dispatchT < 0 ? 0 : (dispatchT > d.M ? d.M : dispatchT);
  }
  GIN_TRACE(MOE_TRACE_COMBINE_START);

  const uint64_t P = (uint64_t)(d.R - 1);
  const int M = d.M;
  // Slots (producer) / tokens (consumer) of rank r in this channel; -1 = invalid range.
  auto count = [M](int r) -> int {
    const int S = s.slots[r], a = s.lo[r], b = s.hi[r];
    if (S < 0 || S > M || a < 0 || a > b || b > S) return -1;
    return b - a;
  };
  if (producer) {
    // ------------------------------------------------------------------ producer (expert side)
    int total = 0;
    for (int r = 0; r < d.R; ++r) {
      if (r == d.rank) continue;
      const int n = count(r);
      if (n < 0) {
        if (tid == 0) gin_error_set(s.errorFlags, MOE_ERR_COUNTS);
      } else {
        total += n * s.PP;
      }
    }
    if (tid < d.R && tid != d.rank && count(tid) == 0) {
      uint64_t* hello = (uint64_t*)((uint8_t*)s.bases[tid] + s.combProgress) +
                        ((uint64_t)moe_peer_section(d.rank, tid, d.R) * MOE_MAX_CHANNELS + c) * MOE_MAX_WARPS;
      gin_st_relaxed_sys(hello, s.seq);
    }
    const int i0 = (int)((int64_t)warp * total / MOE_WARPS), i1 = (int)((int64_t)(warp + 1) * total / MOE_WARPS);
    int curR = -1, curSlot = -1, row = -1;
    float wt = 0.f;
    uint8_t* lines = nullptr;
#pragma unroll 1
    for (int i = i0; i < i1; ++i) {
      const int PP = s.PP;
      int r = 0, k = i;
#pragma unroll 1
      for (; r < d.R; ++r) {
        if (r == d.rank) continue;
        const int n = count(r);
        if (n <= 0) continue;
        if (k < n * PP) break;
        k -= n * PP;
      }
      const int slot = s.lo[r] + k / PP, pass = k % PP;
      if (r != curR || slot != curSlot) {
        curR = r;
        curSlot = slot;
        const int lastPass = pass + (i1 - 1 - i) < PP - 1 ? pass + (i1 - 1 - i) : PP - 1;  // this warp's, of the row
        row = tp_entry_row(s, d.K, (uint64_t)r * d.M + (uint64_t)slot, pass, lastPass, wt);
        lines = (uint8_t*)s.bases[r] + s.combRows +
                (((s.seq & 1ull) * P + (uint64_t)moe_peer_section(d.rank, r, d.R)) * d.M + (uint64_t)slot) * s.lineStride;
      }
      tp_produce_pass(s.rowsBase, s.rowBytes, row, wt, d.K, lines, s.nl, pass * kTpPassLines, s.seq, s.fast);
    }
    GIN_TRACE_SYNC();
    GIN_TRACE(MOE_TRACE_PRODUCER_SENT);
  } else {
    // ------------------------------------------------------------------ consumer (source side)
    int t0, t1;
    consumer_tokens(d, c, t0, t1);
    const int total = (t1 - t0) * s.PP;
    const int i0 = (int)((int64_t)warp * total / MOE_WARPS), i1 = (int)((int64_t)(warp + 1) * total / MOE_WARPS);
    int curT = -1, row = -1;
    float wt = 0.f;
    const uint8_t* myLines = nullptr;
#pragma unroll 1
    for (int i = i0; i < i1; ++i) {
      const int PP = s.PP;
      const int t = t0 + i / PP, pass = i % PP;
      if (t != curT) {
        curT = t;
        const int pos = lane < d.R ? s.tokenPos[(uint64_t)t * d.R + (uint64_t)lane] : -1;
        const int selfPos = gin_shfl_int(pos, d.rank);
        const int lastPass = pass + (i1 - 1 - i) < PP - 1 ? pass + (i1 - 1 - i) : PP - 1;
        row = -1;
        wt = 0.f;
        if (selfPos >= 0 && selfPos < d.M) row = tp_entry_row(s, d.K, (uint64_t)d.rank * d.M + (uint64_t)selfPos, pass, lastPass, wt);
        myLines = nullptr;
        if (lane < d.R && lane != d.rank && pos >= 0) {
          if (pos < s.lo[lane] || pos >= s.hi[lane]) {
            gin_error_set(s.errorFlags, MOE_ERR_COUNTS);
          } else {
            myLines = (const uint8_t*)s.bases[d.rank] + s.combRows +
                      (((s.seq & 1ull) * P + (uint64_t)moe_peer_section(lane, d.rank, d.R)) * d.M + (uint64_t)pos) *
                          s.lineStride;
          }
        }
      }
      uint8_t* yRow = t < s.yRows ? s.y + (uint64_t)t * s.rowBytes : nullptr;
      tp_consume_pass(s.rowsBase, s.rowBytes, row, wt, d.K, myLines, d.R, yRow, s.nl, pass * kTpPassLines, s.seq,
                      s.fast, s.errorFlags, warp == 0 && i == i0);
    }
    // A remote rank with no slot of this channel: its producer c's hello word of call n.
    if (tid < d.R && tid != d.rank && count(tid) == 0) {
      const uint64_t* hello = (const uint64_t*)((const uint8_t*)s.bases[d.rank] + s.combProgress) +
                              ((uint64_t)moe_peer_section(tid, d.rank, d.R) * MOE_MAX_CHANNELS + c) * MOE_MAX_WARPS;
      (void)gin_wait_geq(hello, s.seq, s.errorFlags);
    }
    GIN_TRACE_SYNC();
    GIN_TRACE(MOE_TRACE_CONSUMER_END);
  }
  if (tid == 0) state_of(workspace)[MOE_STATE_SEQ_COMBINE + blockIdx.x] = s.seq;
}
