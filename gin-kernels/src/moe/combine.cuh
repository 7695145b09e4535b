// moe/combine.cuh - gin_combine, the body of moe_gin_combine and its token-path entries.
#pragma once

#include "combine_token_path.cuh"
#include "dispatch_receive.cuh"
#include "trace_slots.cuh"

struct CombineCtx {
  // Kept in shared memory (one per block and source) and read where used: as registers, the
  // context stood beside the 12 x 16-byte loads and 32 accumulators of a pass and spilled.
  int R, rank, K, M;
  uint64_t rowBytes;
  const uint8_t* expertOut;
  const float* recvWeights;
  const int* slotRows;  // [R][M][K] recvX row of (received slot, k), from the dispatch
  int capacity;         // rows of expertOut that may be read: the receive capacity, or fewer (expertOutRows)
  int recvCapacity;     // rows a dispatch can leave: a row in [capacity, recvCapacity) is MOE_ERR_EXPERT_ROWS
  bool fast;
  uint64_t seqHi;
  uint32_t* errorFlags;
  int slotSrc;          // whose received slots the own rows come from (producer: the source; consumer: self)
  uint8_t* out;         // row j of the items goes to out + (first + j) * outStride (first: argument)
  uint64_t outStride;
  uint64_t* progress;   // combProgress words of channel c, section 0 (+ warp; consumer: + section *
                        // MOE_MAX_CHANNELS * MOE_MAX_WARPS): producer in the source's window, consumer in ours
  const int* tokenPos;       // consumer only, and the fields below
  const uint8_t* ownWin;
  uint64_t combRows, rowStride;
  const int* lo;  // [R] this channel's first slot at rank r (shared memory)
  const int* hi;
};

template <bool kConsumer>
GIN_DEVICE_INLINE void combine_items(const CombineCtx& cx, int first, int n, const RowSplit sp) {
  const CombineCtx& d = cx;  // R, rank, K, M, rowBytes
  const int lane = (int)gin_lane_id(), warp = (int)threadIdx.x / GIN_WARP_SIZE;
  const int items = n * sp.nseg;
  // Consumer, lane r < R: tokenPos[t][r] of item i's token (its slot at rank r, or -1).
  auto posOf = [&](int i) -> int {
    if (!kConsumer || i >= items || lane >= d.R) return -1;
    return cx.tokenPos[(uint64_t)(first + i / sp.nseg) * d.R + (uint64_t)lane];
  };
  // Lane k < K: slotRows entry k of item i's slot (consumer: its own slot, from lane rank's pos).
  auto rowOf = [&](int i, int pos) -> int {
    if (i >= items) return -1;  // warp-uniform
    const int slot = kConsumer ? gin_shfl_int(pos, d.rank) : first + i / sp.nseg;
    if (lane >= d.K || slot < 0 || slot >= d.M) return -1;
    return cx.slotRows[((uint64_t)cx.slotSrc * d.M + (uint64_t)slot) * d.K + (uint64_t)lane];
  };
  int posC = posOf(warp), posN = posOf(warp + MOE_WARPS);
  int rowC = rowOf(warp, posC);
  int done = 0;
  for (int i = warp; i < items; i += MOE_WARPS) {
    const int rowN = rowOf(i + MOE_WARPS, posN);  // posN landed during the previous item
    const int posNN = posOf(i + 2 * MOE_WARPS);
    const int j = i / sp.nseg, seg = i - j * sp.nseg;
    uint64_t b0, b1;
    seg_range(sp, seg, d.rowBytes, b0, b1);
    int row = rowC;
    float wt = 0.f;
    if (lane < d.K) {
      if (row >= cx.capacity || row < -1) {
        if (seg == 0) gin_error_set(cx.errorFlags, row >= 0 && row < cx.recvCapacity ? MOE_ERR_EXPERT_ROWS : MOE_ERR_COUNTS);
        row = -1;
      }
      if (row >= 0) wt = cx.recvWeights[row];
    }
    uint8_t* out = cx.out + (uint64_t)(first + j) * cx.outStride;
    if (kConsumer) {
      // Remote partials: lane r waits for the producer items of rank r that cover this segment
      // (the producer's split follows from hi[r] - lo[r]).
      const uint8_t* extra = nullptr;
      const uint64_t* prog = nullptr;
      int pi0 = 0, npi = 0;
      if (lane < d.R && lane != d.rank && posC >= 0) {
        const int pj = posC - cx.lo[lane];
        if (pj < 0 || posC >= cx.hi[lane]) {
          if (seg == 0) gin_error_set(cx.errorFlags, MOE_ERR_COUNTS);
        } else {
          const uint64_t sec = (uint64_t)moe_peer_section(lane, d.rank, d.R);
          const RowSplit psp = row_split(d.rowBytes, cx.hi[lane] - cx.lo[lane]);
          const int sA = (int)(b0 / psp.segBytes), sB = (int)((b1 - 1) / psp.segBytes);
          prog = cx.progress + sec * MOE_MAX_CHANNELS * MOE_MAX_WARPS;
          pi0 = pj * psp.nseg + sA;
          npi = sB - sA + 1;
          extra = cx.ownWin + cx.combRows + (sec * d.M + (uint64_t)posC) * cx.rowStride;
        }
      }
      auto waitPartials = [&]() {
        for (int pi = pi0; pi < pi0 + npi; ++pi)
          (void)gin_wait_geq(prog + pi % MOE_WARPS, cx.seqHi | (uint64_t)(pi / MOE_WARPS + 1), cx.errorFlags);
        syncwarp();  // lane r's acquires, then the barrier: every lane may read r's partial
        if (i == warp) GIN_TRACE(MOE_TRACE_CONSUMER_FIRST);  // thread 0: warp 0's first partials landed
      };
      warp_reduce_seg(cx.expertOut, d.rowBytes, row, wt, d.K, extra, d.R, out, cx.fast, b0, b1, waitPartials);
    } else {
      // (write-after-read on the partial area: waited for in the kernel's prologue)
      warp_reduce_seg(cx.expertOut, d.rowBytes, row, wt, d.K, nullptr, 0, out, cx.fast, b0, b1, NoWait{});
      ++done;
      syncwarp();  // every lane's partial stores before lane 0's release (cumulative)
      if (lane == 0) gin_st_release_sys(cx.progress + warp, cx.seqHi | (uint64_t)done);
    }
    rowC = rowN;
    posC = posN;
    posN = posNN;
  }
}

// ================================================================================================
// moe_gin_combine and its token-path entries (body: gin_combine). Grid 2*C blocks of MOE_THREADS,
// same C as the dispatch whose results it uses.
//  producer c (blocks [0, C)), expert side: for each remote source s, the slots of s's channel c
//             (chanStartFrom): wait combConsumed[s][*] >= n-1 in its own window (s's consumers
//             finished reading our previous partials), then warp w reduces slots j = w, w+W, ...:
//             partial = sum_k w_k * expertOut[row_k] (fp32 -> bf16) into s's window, fence,
//             combProgress[rank][c][w] = (n << 32) | (slots done by w) in s's window.
//  alone (R = 1): no producer; every block is a consumer of part b of 2C of the tokens.
//  consumer c (blocks [C, 2C)), source side: tokens of channel c (same T and C as the dispatch):
//             y[t] = sum over own experts of w * expertOut[row] + sum over remote d of the partial
//             from d (after its producer warp's progress word), fp32 -> bf16; then
//             combConsumed[rank][c] = n into every remote rank's window.
// ================================================================================================
template <class Shape>
GIN_DEVICE_INLINE void gin_combine(const MoeGinCombineArgs& a) {
  // The fields by name (a is the kernel's parameter: these read the parameter space).
  const uint16_t* expertOut = a.expertOut;
  const float* recvWeights = a.recvWeights;
  uint16_t* y = a.y;
  const uint64_t* peerBases = a.peerBases;
  uint8_t* workspace = a.workspace;
  uint32_t* errorFlags = a.errorFlags;
  const int32_t expertOutRows = a.expertOutRows;
  int32_t numTokens = a.numTokens, rank = a.dims.rank, nRanks = a.dims.nRanks, numExperts = a.dims.numExperts,
          topK = a.dims.topK, hidden = a.dims.hidden, maxTokens = a.dims.maxTokens, numChannels = a.dims.numChannels;
  __shared__ uint64_t sharedSeq;
  // Producer: [q] = the q-th remote source's slot count and channel range; consumer: [r] = rank r's.
  __shared__ int lo[MOE_MAX_RANKS], hi[MOE_MAX_RANKS], srcSlots[MOE_MAX_RANKS];
  __shared__ CombineCtx cxs[MOE_MAX_RANKS];
  // the argument checks read no memory: before the wait, under the previous kernel's drain
  Dims d = make_dims(rank, nRanks, numExperts, topK, hidden, maxTokens, numChannels, numTokens);
  d.A = moe_alignment(a.dims.expertAlignment);
  const bool argsOk = launch_args_ok(d, 2, true, workspace, peerBases) && Shape::accepts(d.R, d.E, d.K, d.H, d.M, d.C);
  gin_wait_prior_grids();  // launched with PDL: nothing below may run before the previous kernel is done
  GIN_TRACE(MOE_TRACE_COMBINE_ENTRY);  // entry, before the prologue (write-after-read waits, ranges, load_seq)
  if (!config_ok(argsOk, errorFlags)) return;
  Shape::fix(d);
  if (expertOut == nullptr || recvWeights == nullptr || (y == nullptr && d.T > 0)) {
    if (blockIdx.x == 0 && threadIdx.x == 0) gin_error_set(errorFlags, MOE_ERR_CONFIG);
    return;
  }
  if (Shape::tokenPathOnly || moe_token_path(d.K, d.M, d.C)) {
    combine_token_path<Shape>(expertOut, recvWeights, numTokens, expertOutRows, y, peerBases, workspace, errorFlags, d);
    return;
  }
  if (!peers_ok(peerBases, d.R, errorFlags)) return;
  uint64_t* state = state_of(workspace);
  // The token partition must be the dispatch's: use its T (y must have at least T rows).
  const int dispatchT = (int)state[MOE_STATE_DISPATCH_TOKENS];
  if (dispatchT != numTokens) {
    if (blockIdx.x == 0 && threadIdx.x == 0) gin_error_set(errorFlags, MOE_ERR_TOKENS);
  }
  d.T = dispatchT < 0 ? 0 : (dispatchT > d.M ? d.M : dispatchT);
  const int yRows = numTokens < 0 ? 0 : numTokens;

  const int tid = (int)threadIdx.x, B = (int)blockDim.x;
  const MoeWindowLayout wl = moe_window_layout(d.R, d.E, d.K, d.H, d.M);
  const MoeWorkspaceLayout ws = moe_workspace_layout(d.R, d.E, d.K, d.M);
  const int* slotRows = (const int*)(workspace + ws.slotRows);
  const int recvCapacity = (int)moe_recv_capacity_rows(d.R, d.E, d.K, d.M, d.A);
  const int capacity = expertOutRows < 0 ? 0 : (expertOutRows < recvCapacity ? expertOutRows : recvCapacity);
  uint8_t* ownWin = (uint8_t*)peerBases[d.rank];
  const bool fast = (d.rowBytes & 15u) == 0 && gin_is_aligned(expertOut, 16) && gin_is_aligned(y, 16);
  // Channel boundaries into shared memory before load_seq's barrier (the same round trip
  // as the call counter instead of one more after it). Producer: source q's slot count and this
  // channel's slot range [a, b); consumer: this channel's slot range [lo, hi) at every rank.
  // Per-role context (cxs[q]: producer, the q-th remote source; cxs[0]: consumer) likewise.
  const bool producer = d.R > 1 && (int)blockIdx.x < d.C;  // alone, every block consumes (consumer_tokens)
  const int c = (int)blockIdx.x < d.C ? (int)blockIdx.x : (int)blockIdx.x - d.C;
  if (producer) {
    const int* slotsFrom = (const int*)(workspace + ws.slotsFrom);
    const int* chanStartFrom = (const int*)(workspace + ws.chanStartFrom);
    for (int q = 1 + tid; q < d.R; q += B) {
      const int src = (d.rank + 1 + (c + q - 1) % (d.R - 1)) % d.R;
      srcSlots[q] = slotsFrom[src];
      lo[q] = chanStartFrom[src * (MOE_MAX_CHANNELS + 1) + c];
      hi[q] = chanStartFrom[src * (MOE_MAX_CHANNELS + 1) + c + 1];
    }
  } else {
    const int* chanStartTo = (const int*)(workspace + ws.chanStartTo);
    for (int r = tid; r < d.R; r += B) {
      lo[r] = chanStartTo[r * (MOE_MAX_CHANNELS + 1) + c];
      hi[r] = chanStartTo[r * (MOE_MAX_CHANNELS + 1) + c + 1];
    }
  }
  for (int q = producer ? 1 + tid : tid; q < (producer ? d.R : 1); q += B) {
    CombineCtx& x = cxs[q];
    x.R = d.R;
    x.rank = d.rank;
    x.K = d.K;
    x.M = d.M;
    x.rowBytes = d.rowBytes;
    x.expertOut = (const uint8_t*)expertOut;
    x.recvWeights = recvWeights;
    x.slotRows = slotRows;
    x.capacity = capacity;
    x.recvCapacity = recvCapacity;
    x.fast = fast;
    x.errorFlags = errorFlags;
    x.tokenPos = (const int*)(workspace + ws.tokenPos);
    x.ownWin = ownWin;
    x.combRows = wl.combRows;
    x.rowStride = wl.rowStride;
    x.lo = lo;
    x.hi = hi;
    if (producer) {
      const int src = (d.rank + 1 + (c + q - 1) % (d.R - 1)) % d.R;
      uint8_t* peerWin = (uint8_t*)peerBases[src];
      const uint64_t sec = (uint64_t)moe_peer_section(d.rank, src, d.R);
      x.slotSrc = src;
      x.out = peerWin + wl.combRows + sec * d.M * wl.rowStride;
      x.outStride = wl.rowStride;
      x.progress = (uint64_t*)(peerWin + wl.combProgress) + (sec * MOE_MAX_CHANNELS + c) * MOE_MAX_WARPS;
    } else {
      x.slotSrc = d.rank;
      x.out = (uint8_t*)y;
      x.outStride = d.rowBytes;
      x.progress = (uint64_t*)(ownWin + wl.combProgress) + (uint64_t)c * MOE_MAX_WARPS;
    }
  }
  if (producer) {
    // WAR on every remote source's partial area: its C consumers finished reading our partials of
    // the previous call (n - 1 = this block's call counter, read by each waiting thread itself so
    // that the waits overlap load_seq). One acquire per flag, all in flight together (the last
    // threads: no prologue load of theirs is held back), then the barriers below; no warp
    // polls all C flags (3 dependent acquires per lane at C = 66) before its first store.
    const int n = (d.R - 1) * d.C;
    if (B - 1 - tid < n) {
      const uint64_t prev = *(volatile uint64_t*)(state + MOE_STATE_SEQ_COMBINE + blockIdx.x);
      for (int i = B - 1 - tid; i < n; i += B) {
        const int q = 1 + i / d.C, cc = i % d.C;
        const int src = (d.rank + 1 + (c + q - 1) % (d.R - 1)) % d.R;
        const uint64_t* consumed = (const uint64_t*)(ownWin + wl.combConsumed) +
                                   (uint64_t)moe_peer_section(src, d.rank, d.R) * MOE_MAX_CHANNELS + cc;
        (void)gin_wait_geq(consumed, prev, errorFlags);
      }
    }
  }
  const uint64_t seq = load_seq(state + MOE_STATE_SEQ_COMBINE + blockIdx.x, &sharedSeq);
  if (tid < MOE_MAX_RANKS) cxs[tid].seqHi = seq << 32;  // read only after the barrier below
  __syncthreads();  // the acquires above, then the barriers: every warp may store into the windows
  GIN_TRACE(MOE_TRACE_COMBINE_START);

  if (producer) {
    // ------------------------------------------------------------------ producer (expert side)
    for (int q = 1; q < d.R; ++q) {
      const int S = srcSlots[q], a = lo[q], b = hi[q];
      if (S < 0 || S > d.M || a < 0 || a > b || b > S) {
        if (tid == 0) gin_error_set(errorFlags, MOE_ERR_COUNTS);
        continue;
      }
      if (a == b) continue;
      combine_items<false>(cxs[q], a, b - a, row_split(d.rowBytes, b - a));
    }
    GIN_TRACE_SYNC();
    GIN_TRACE(MOE_TRACE_PRODUCER_SENT);
  } else {
    // ------------------------------------------------------------------ consumer (source side)
    int t0, t1;
    consumer_tokens(d, c, t0, t1);
    if (t1 > yRows) t1 = yRows;  // never write past the y the caller passed
    // Items (token, segment) over all warps, at least 2 segments per row: after a
    // token's partial lands, a warp has half a row left to reduce, not a whole one (the consumer's
    // tail behind the producers at 4096 tokens was ~50 us). Each producer's split follows from
    // its slot count (hi - lo).
    if (t1 > t0) combine_items<true>(cxs[0], t0, t1 - t0, row_split(d.rowBytes, t1 - t0, 2));
    __syncthreads();
    GIN_TRACE(MOE_TRACE_CONSUMER_END);
    if (tid < d.R && tid != d.rank) {
      uint64_t* f = (uint64_t*)((uint8_t*)peerBases[tid] + wl.combConsumed) +
                    (uint64_t)moe_peer_section(d.rank, tid, d.R) * MOE_MAX_CHANNELS + c;
      gin_st_release_sys(f, seq);
    }
  }
  if (tid == 0) state[MOE_STATE_SEQ_COMBINE + blockIdx.x] = seq;
}
