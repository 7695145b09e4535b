// moe/dispatch.cuh - gin_dispatch, the body of moe_gin_dispatch and its token-path entries: the
// prologue (checks, call counter, peers' bases), then the role of the block.
#pragma once

#include "dispatch_token_path.cuh"
#include "dispatch_layout_path.cuh"

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
  // the argument checks read no memory: before the wait, under the previous kernel's drain
  Dims dims = make_dims(rank, nRanks, numExperts, topK, hidden, maxTokens, numChannels, numTokens);
  dims.A = moe_alignment(a.dims.expertAlignment);
  const bool argsOk = launch_args_ok(dims, 2, true, workspace, peerBases) && Shape::accepts(dims.R, dims.E, dims.K, dims.H, dims.M, dims.C);
  gin_wait_prior_grids();  // launched with PDL: nothing below may run before the previous kernel is done
  GIN_TRACE(MOE_TRACE_DISPATCH_ENTRY);  // entry, before the checks' verdict and the prologue's loads
  const int tid = (int)threadIdx.x, B = (int)blockDim.x;
  uint64_t* state = state_of(workspace);
  // The prologue's loads first, by different threads (as the token-path combine's): the peers' window bases into shared memory and this block's call counter; the
  // layout arithmetic runs under their round trip, one barrier collects them. They
  // read only what the checks then validate (guarded: at most MOE_MAX_RANKS bases, counters of
  // blocks < 2 * MOE_MAX_CHANNELS). One after the other, peers_ok's loads, ~0.7 us of layout
  // arithmetic and load_seq's round trip took ~2 us from entry to "start".
  if (peerBases != nullptr && tid < nRanks && tid < MOE_MAX_RANKS) sharedBases[tid] = peerBases[tid];
  else if (tid == MOE_MAX_RANKS && workspace != nullptr && blockIdx.x < 2 * MOE_MAX_CHANNELS)
    sharedSeq = state[MOE_STATE_SEQ_DISPATCH + blockIdx.x] + 1;
  if (!config_ok(argsOk, errorFlags)) return;
  Shape::fix(dims);
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

  const DispatchCall call{x, xBf16, xq, quant, topkIdx, topkWeights, recvX, recvWeights, recvCounts, peerBases,
                          workspace, errorFlags, d, wl, ws, tokenPos, slotInExpert, sendList, fast, ownWin,
                          seq, seqHi, state, tid, B, lane, warp};
  if (tokenPath && (int)blockIdx.x < d.C)
    dispatch_tp_sender<kXFresh>(call, sm.lay, tpTokenPos, tpChanStartTo, tpState);
  else if (tokenPath)
    dispatch_tp_receiver<kXFresh>(call, sm.tp);
  else if ((int)blockIdx.x < d.C)
    dispatch_layout_sender<kXFresh>(call, sm, sharedOwnLeft);
  else
    dispatch_layout_receiver<kXFresh>(call, sm.rcv);
  if (tid == 0) state[MOE_STATE_SEQ_DISPATCH + blockIdx.x] = seq;
}
