// moe_host.cu - the HOST backend's local kernels (code object "moe_host"; TorchTitan style: the
// exchanges are ncclAlltoAll / ncclSend / ncclRecv from Java): moe_host_layout, moe_host_pack,
// moe_host_permute, moe_host_unpermute, moe_host_combine, moe_host_row_values_in; moe_query_layout; and
// moe_fp8_quantize (bf16 -> scaled fp8 rows, also the library's Fp8Rows). The routing layout is
// the GIN dispatch's (moe/routing_layout.cuh), so both backends place every row alike.
#include "moe/entry_points.cuh"
#include "moe/query_layout.cuh"
#include "moe/routing_layout.cuh"
#include "moe/fp8.cuh"
#include "moe/expert_offsets.cuh"

// ================================================================================================
// HOST backend: local kernels around the Java side's ncclAlltoAll / ncclSend / ncclRecv.
// ================================================================================================

// moe_host_layout: the routing layout (same positions as the GIN dispatch) plus expertOffset
// (exclusive scan of expertCount: send rows are ordered by global expert id, hence by destination
// rank, and by token within an expert) and rowsTo[d]. Grid C blocks of MOE_THREADS (C <= 128;
// block c waits only for blocks < c).
GIN_KERNEL void __launch_bounds__(MOE_THREADS, 1) moe_host_layout(const __grid_constant__ MoeHostLayoutArgs a) {
  const int32_t* topkIdx = a.topkIdx;
  uint8_t* workspace = a.workspace;
  uint32_t* errorFlags = a.errorFlags;
  const int32_t numTokens = a.numTokens, maxTokens = a.dims.maxTokens;
  __shared__ __align__(16) LayoutSmem s;
  __shared__ uint64_t sharedSeq;
  const Dims d = make_dims(0, a.dims.nRanks, a.dims.numExperts, a.dims.topK, 1, maxTokens, a.dims.numChannels, numTokens);
  if (!launch_ok(d, 1, false, workspace, topkIdx, errorFlags)) return;
  if ((numTokens < 0 || numTokens > maxTokens) && blockIdx.x == 0 && threadIdx.x == 0)
    gin_error_set(errorFlags, MOE_ERR_TOKENS);
  const int tid = (int)threadIdx.x, B = (int)blockDim.x;
  const MoeWorkspaceLayout ws = moe_workspace_layout(d.R, d.E, d.K, d.M);
  uint64_t* state = state_of(workspace);
  const uint64_t seq = load_seq(state + MOE_STATE_SEQ_LAYOUT + blockIdx.x, &sharedSeq);
  const int c = (int)blockIdx.x;
  int t0, t1;
  token_range(d, c, t0, t1);
  int* histE = (int*)(workspace + ws.histE);
  int* histD = (int*)(workspace + ws.histD);
  // A HOST instance has its own workspace: the dispatch's HIST_READY words are free to use here.
  const bool direct = layout_is_direct(d);
  if (direct) {
    layout_direct(s, topkIdx, d, t0, t1, c == d.C - 1, errorFlags);
  } else {
    layout_histogram(s, topkIdx, d, t0, t1, histE + (uint64_t)c * d.E, histD + (uint64_t)c * d.R, errorFlags);
    publish_local(state + MOE_STATE_HIST_READY + c, (seq << 32) - 1);
    layout_prefix(s, d, c, histE, histD, state + MOE_STATE_HIST_READY, (seq << 32) - 1, errorFlags);
  }
  if (c == d.C - 1) {
    int* expertCount = (int*)(workspace + ws.expertCount);
    layout_lead_totals(s, d, direct ? nullptr : histD, expertCount, (int*)(workspace + ws.tokensTo),
                       (int*)(workspace + ws.chanStartTo));
    if (tid == 0) state[MOE_STATE_DISPATCH_TOKENS] = (uint64_t)d.T;
    for (int e = tid; e < d.E; e += B) s.cntE[e] += s.runE[e];  // totals; runE stays for step 3
    __syncthreads();
    const int total = block_exclusive_scan(s.cntE, d.E, s.scanTmp);
    int* expertOffset = (int*)(workspace + ws.expertOffset);
    int* rowsTo = (int*)(workspace + ws.rowsTo);
    for (int e = tid; e < d.E; e += B) expertOffset[e] = s.cntE[e];
    if (tid == 0) expertOffset[d.E] = total;
    for (int r = tid; r < d.R; r += B)
      rowsTo[r] = (r + 1 < d.R ? s.cntE[(r + 1) * d.L] : total) - s.cntE[r * d.L];
    __syncthreads();
  }
  layout_positions(s, topkIdx, d, t0, t1, (int*)(workspace + ws.slotInExpert), (int*)(workspace + ws.tokenPos),
                   (int*)(workspace + ws.sendList));
  if (tid == 0) state[MOE_STATE_SEQ_LAYOUT + blockIdx.x] = seq;
}

// HOST backend: the send-row position of token t's slot k (its expert's send offset + the token's
// slot in that expert), or -1 for a masked slot; an impossible position sets MOE_ERR_COUNTS.
GIN_DEVICE_INLINE int host_send_row(const int* slotInExpert, const int* expertOffset, const int32_t* topkIdx,
                                    const Dims& d, uint64_t t, int k, uint64_t capacity, uint32_t* errorFlags) {
  const int sl = slotInExpert[t * d.K + k];
  if (sl < 0) return -1;
  const int e = topkIdx[t * d.K + k];
  const int64_t p = (e >= 0 && e < d.E) ? (int64_t)expertOffset[e] + sl : -1;
  if (p >= 0 && (uint64_t)p < capacity) return (int)p;
  gin_error_set(errorFlags, MOE_ERR_COUNTS);
  return -1;
}

// moe_host_pack: sendRows[expertOffset[e] + slotInExpert[t][k]] = x[t], sendWeights[same] =
// topkWeights[t][k] for every non-masked (t, k). One warp per token; any grid, any block size that
// is a multiple of the warp size (<= 1024).
template <bool kFp8>
GIN_DEVICE_INLINE void host_pack(const MoeHostPackArgs& a) {
  const uint16_t* x = a.x;
  const int32_t* topkIdx = a.topkIdx;
  const float* topkWeights = a.topkWeights;
  const uint8_t* workspace = a.workspace;
  uint16_t* sendRows = a.sendRows;
  float* sendWeights = a.sendWeights;
  uint32_t* errorFlags = a.errorFlags;
  Dims d = make_dims(0, a.dims.nRanks, a.dims.numExperts, a.dims.topK, a.dims.hidden, a.dims.maxTokens, 1, a.numTokens);
  if (kFp8) d.rowBytes = moe_fp8_row_bytes(d.H);
  if (!moe_sizes_ok(d.R, d.E, d.K, d.H, d.M) || (kFp8 && !moe_fp8_hidden_ok(d.H)) || blockDim.x % GIN_WARP_SIZE != 0 || workspace == nullptr ||
      topkIdx == nullptr || topkWeights == nullptr || sendRows == nullptr || sendWeights == nullptr ||
      (x == nullptr && d.T > 0)) {
    if (blockIdx.x == 0 && threadIdx.x == 0) gin_error_set(errorFlags, MOE_ERR_CONFIG);
    return;
  }
  const MoeWorkspaceLayout ws = moe_workspace_layout(d.R, d.E, d.K, d.M);
  const int* slotInExpert = (const int*)(workspace + ws.slotInExpert);
  const int* expertOffset = (const int*)(workspace + ws.expertOffset);
  const int lane = (int)gin_lane_id();
  const uint64_t warpsTotal = (uint64_t)gridDim.x * (blockDim.x / GIN_WARP_SIZE);
  const uint64_t capacity = (uint64_t)d.M * (uint64_t)d.K;
  const bool fast = (d.rowBytes & 15u) == 0 && gin_is_aligned(x, 16) && gin_is_aligned(sendRows, 16);
  for (uint64_t t = (uint64_t)blockIdx.x * (blockDim.x / GIN_WARP_SIZE) + threadIdx.x / GIN_WARP_SIZE;
       t < (uint64_t)d.T; t += warpsTotal) {
    const int pos = lane < d.K ? host_send_row(slotInExpert, expertOffset, topkIdx, d, t, lane, capacity, errorFlags) : -1;
    if (pos >= 0) sendWeights[pos] = topkWeights[t * d.K + lane];
    warp_expand_row<false>((const uint8_t*)x + t * d.rowBytes, (uint8_t*)sendRows, d.rowBytes, pos, d.K, fast);
  }
}
GIN_KERNEL void moe_host_pack(const __grid_constant__ MoeHostPackArgs a) { host_pack<false>(a); }
// Scaled fp8 rows (moe_fp8_row_bytes(hidden) bytes in x and sendRows); same arguments.
GIN_KERNEL void moe_host_pack_fp8(const __grid_constant__ MoeHostPackArgs a) { host_pack<true>(a); }

// Shared by permute / unpermute: received rows are ordered source-major (s, then local expert e,
// then token); recvX is expert-major (e, then s, then token). countMatrix[s][e] = rows from s for
// local expert e (device int32 [R][L], from the count exchange).
// kFp8: the rows are scaled fp8 rows (moe_fp8_row_bytes), not bf16.
template <bool kToExpertMajor, bool kFp8 = false>
GIN_DEVICE_INLINE void host_permute(const uint16_t* in, const float* inWeights, const int32_t* countMatrix,
                                    uint16_t* out, float* outWeights, int32_t* recvCounts, uint32_t* errorFlags,
                                    const MoeDims& dims) {
  __shared__ int cnt[MOE_MAX_EXPERTS], srcOff[MOE_MAX_EXPERTS], dstOff[MOE_MAX_EXPERTS];
  __shared__ int scanTmp[MOE_MAX_HOST_THREADS];
  __shared__ int totalRows;
  Dims d = make_dims(0, dims.nRanks, dims.numExperts, dims.topK, dims.hidden, dims.maxTokens, 1, 0);
  d.A = moe_alignment(dims.expertAlignment);
  if (kFp8) d.rowBytes = moe_fp8_row_bytes(d.H);
  if (!moe_sizes_ok(d.R, d.E, d.K, d.H, d.M) || d.A > MOE_MAX_ALIGNMENT || (kFp8 && !moe_fp8_hidden_ok(d.H)) || blockDim.x % GIN_WARP_SIZE != 0 ||
      blockDim.x > MOE_MAX_HOST_THREADS || in == nullptr || out == nullptr || countMatrix == nullptr ||
      (kToExpertMajor && (inWeights == nullptr || outWeights == nullptr))) {
    if (blockIdx.x == 0 && threadIdx.x == 0) gin_error_set(errorFlags, MOE_ERR_CONFIG);
    return;
  }
  const int tid = (int)threadIdx.x, B = (int)blockDim.x, n = d.R * d.L;
  const int capacity = (int)moe_recv_capacity_rows(d.R, d.E, d.K, d.M, d.A);
  // Every block derives the same offsets; a bad matrix (negative, or more than fits) moves nothing.
  for (int i = tid; i < n; i += B) {
    const int v = countMatrix[i];
    cnt[i] = v;
    srcOff[i] = v;
  }
  if (tid == 0) totalRows = 0;
  __syncthreads();
  if (tid == 0) {
    int64_t sum = 0;
    bool bad = false;
    for (int i = 0; i < n; ++i) {
      if (cnt[i] < 0 || cnt[i] > d.M) bad = true;
      sum += cnt[i] < 0 ? 0 : cnt[i];
    }
    if (bad || sum > capacity) {
      if (blockIdx.x == 0) gin_error_set(errorFlags, MOE_ERR_COUNTS);
      totalRows = -1;
    }
  }
  __syncthreads();
  if (totalRows < 0) return;  // uniform: every thread of every block returns
  const int total = block_exclusive_scan(srcOff, n, scanTmp);  // source-major offsets
  // Expert-major: dstOff[s][e] = sum of all rows of experts < e + rows of (s' < s, e).
  for (int e = tid; e < d.L; e += B) {
    int tot = 0;
    for (int s = 0; s < d.R; ++s) tot += cnt[s * d.L + e];
    dstOff[e] = moe_expert_block_rows(tot, d.A);  // scanned below (only the first L entries): the aligned expert starts
    if (kToExpertMajor && blockIdx.x == 0 && recvCounts != nullptr) recvCounts[e] = tot;
  }
  __syncthreads();
  block_exclusive_scan(dstOff, d.L, scanTmp);
  for (int e = tid; e < d.L; e += B) {
    int run = dstOff[e];
    for (int s = 0; s < d.R; ++s) {
      dstOff[s * d.L + e] = run;
      run += cnt[s * d.L + e];
    }
  }
  __syncthreads();
  const bool fast = (d.rowBytes & 15u) == 0 && gin_is_aligned(in, 16) && gin_is_aligned(out, 16);
  const int lane = (int)gin_lane_id();
  const uint64_t warpsTotal = (uint64_t)gridDim.x * (blockDim.x / GIN_WARP_SIZE);
  for (uint64_t j = (uint64_t)blockIdx.x * (blockDim.x / GIN_WARP_SIZE) + threadIdx.x / GIN_WARP_SIZE;
       j < (uint64_t)total; j += warpsTotal) {
    // Last (s, e) with srcOff <= j: entries with zero rows share the next one's offset.
    int lo = 0, hi = n - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) >> 1;
      if ((uint64_t)srcOff[mid] <= j) lo = mid;
      else hi = mid - 1;
    }
    const uint64_t dst = (uint64_t)dstOff[lo] + (j - (uint64_t)srcOff[lo]);
    const uint64_t from = kToExpertMajor ? j : dst;
    const uint64_t to = kToExpertMajor ? dst : j;
    warp_expand_row<false>((const uint8_t*)in + from * d.rowBytes, (uint8_t*)out, d.rowBytes,
                           lane == 0 ? (int)to : -1, 1, fast);
    if (kToExpertMajor && lane == 0) outWeights[to] = inWeights[from];
  }
}

// moe_host_permute: recvBuf (source-major, as received) -> recvX (expert-major), with weights;
// writes recvCounts[L]. Any grid, block size a multiple of the warp size (<= 1024).
GIN_KERNEL void moe_host_permute(const __grid_constant__ MoeHostPermuteArgs a) {
  host_permute<true>(a.recvBuf, a.recvBufWeights, a.countMatrix, a.recvX, a.recvWeights, a.recvCounts, a.errorFlags, a.dims);
}
// The same for scaled fp8 rows (moe_fp8_row_bytes(hidden) bytes in recvBuf and recvX).
GIN_KERNEL void moe_host_permute_fp8(const MoeHostPermuteArgs a) {
  host_permute<true, true>(a.recvBuf, a.recvBufWeights, a.countMatrix, a.recvX, a.recvWeights, a.recvCounts, a.errorFlags,
                           a.dims);
}

// moe_host_unpermute: expertOut (expert-major) -> backBuf (source-major, ready to send back).
GIN_KERNEL void moe_host_unpermute(const __grid_constant__ MoeHostUnpermuteArgs a) {
  host_permute<false>(a.expertOut, nullptr, a.countMatrix, a.backBuf, nullptr, nullptr, a.errorFlags, a.dims);
}

// moe_host_combine: y[t] = sum_k topkWeights[t][k] * returned[expertOffset[e] + slotInExpert[t][k]]
// in fp32 (returned rows are in send-row order). One warp per token; any grid.
GIN_KERNEL void moe_host_combine(const __grid_constant__ MoeHostCombineArgs a) {
  const uint16_t* returned = a.returned;
  const int32_t* topkIdx = a.topkIdx;
  const float* topkWeights = a.topkWeights;
  const uint8_t* workspace = a.workspace;
  uint16_t* y = a.y;
  uint32_t* errorFlags = a.errorFlags;
  const Dims d = make_dims(0, a.dims.nRanks, a.dims.numExperts, a.dims.topK, a.dims.hidden, a.dims.maxTokens, 1, a.numTokens);
  if (!moe_sizes_ok(d.R, d.E, d.K, d.H, d.M) || blockDim.x % GIN_WARP_SIZE != 0 || workspace == nullptr ||
      topkIdx == nullptr || topkWeights == nullptr || (d.T > 0 && (returned == nullptr || y == nullptr))) {
    if (blockIdx.x == 0 && threadIdx.x == 0) gin_error_set(errorFlags, MOE_ERR_CONFIG);
    return;
  }
  const MoeWorkspaceLayout ws = moe_workspace_layout(d.R, d.E, d.K, d.M);
  const int* slotInExpert = (const int*)(workspace + ws.slotInExpert);
  const int* expertOffset = (const int*)(workspace + ws.expertOffset);
  const int lane = (int)gin_lane_id();
  const uint64_t warpsTotal = (uint64_t)gridDim.x * (blockDim.x / GIN_WARP_SIZE);
  const uint64_t capacity = (uint64_t)d.M * (uint64_t)d.K;
  const bool fast = (d.rowBytes & 15u) == 0 && gin_is_aligned(returned, 16) && gin_is_aligned(y, 16);
  for (uint64_t t = (uint64_t)blockIdx.x * (blockDim.x / GIN_WARP_SIZE) + threadIdx.x / GIN_WARP_SIZE;
       t < (uint64_t)d.T; t += warpsTotal) {
    const int pos = lane < d.K ? host_send_row(slotInExpert, expertOffset, topkIdx, d, t, lane, capacity, errorFlags) : -1;
    const float w = pos >= 0 ? topkWeights[t * d.K + lane] : 0.f;
    warp_reduce_row((const uint8_t*)returned, d.rowBytes, pos, w, d.K, (uint8_t*)y + t * d.rowBytes, fast);
  }
}

GIN_KERNEL void moe_host_row_values_in(const __grid_constant__ MoeHostRowValuesArgs a) {
  const float* returned = a.returned;
  const int32_t* topkIdx = a.topkIdx;
  const uint8_t* workspace = a.workspace;
  float* g = a.g;
  uint32_t* errorFlags = a.errorFlags;
  const int32_t numTokens = a.numTokens, maxTokens = a.dims.maxTokens;
  const Dims d = make_dims(0, a.dims.nRanks, a.dims.numExperts, a.dims.topK, 1, maxTokens, 1, numTokens);
  if (!moe_sizes_ok(d.R, d.E, d.K, d.H, d.M) || numTokens < 0 || numTokens > maxTokens || workspace == nullptr ||
      (numTokens > 0 && (returned == nullptr || topkIdx == nullptr || g == nullptr))) {
    if (blockIdx.x == 0 && threadIdx.x == 0) gin_error_set(errorFlags, MOE_ERR_CONFIG);
    return;
  }
  const MoeWorkspaceLayout ws = moe_workspace_layout(d.R, d.E, d.K, d.M);
  const int* slotInExpert = (const int*)(workspace + ws.slotInExpert);
  const int* expertOffset = (const int*)(workspace + ws.expertOffset);
  const uint64_t capacity = (uint64_t)d.M * (uint64_t)d.K, n = (uint64_t)numTokens * (uint64_t)d.K;
  for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x) {
    const uint64_t t = i / (uint64_t)d.K;
    const int pos = host_send_row(slotInExpert, expertOffset, topkIdx, d, t, (int)(i - t * (uint64_t)d.K), capacity, errorFlags);
    g[i] = pos >= 0 ? returned[pos] : 0.f;
  }
}

// ================================================================================================
// moe_fp8_quantize: bf16 rows -> scaled fp8 rows (fp8_quantize_tokens over the grid),
// the input of the fp8 dispatch entries when they do not quantize themselves. H % 16 == 0 (else
// MOE_ERR_CONFIG); x 16-byte and out 8-byte aligned (else MOE_ERR_CONFIG). Any grid, any block
// size that is a multiple of the warp size.
// ================================================================================================
GIN_KERNEL void moe_fp8_quantize(const MoeFp8QuantizeArgs a) {
  const uint16_t* x = a.x;
  uint8_t* out = a.out;
  uint32_t* errorFlags = a.errorFlags;
  const int32_t numTokens = a.numTokens, hidden = a.hidden;
  if (numTokens < 0 || !moe_fp8_hidden_ok(hidden) || blockDim.x % GIN_WARP_SIZE != 0 ||
      (numTokens > 0 && (x == nullptr || out == nullptr)) || !gin_is_aligned(x, 16) || !gin_is_aligned(out, 8)) {
    if (blockIdx.x == 0 && threadIdx.x == 0) gin_error_set(errorFlags, MOE_ERR_CONFIG);
    return;
  }
  const uint64_t warpsPerBlock = blockDim.x / GIN_WARP_SIZE;
  moe_detail::fp8_quantize_tokens(x, hidden, out, 0, (uint64_t)numTokens,
                                  (uint64_t)blockIdx.x * warpsPerBlock + threadIdx.x / GIN_WARP_SIZE,
                                  (uint64_t)gridDim.x * warpsPerBlock);
}
