// moe_net/dispatch.cuh - the dispatch's section sender and receiver: the low-latency mode, and the
// high-throughput mode's direct senders and receivers.
#pragma once

#include "targets.cuh"

namespace moe_net {

// ------------------------------------------------------------------------------------------------
// Dispatch sender: block (p, c) writes slots [lo, hi) of its rows to destination p: the slot's
// row (x of token sendList[p][i]) and metadata (for each k: p's local expert or -1, the slot in
// that expert's rows from this rank, the weight); chunk 0 also writes the header (tokens, count[L]).
// ------------------------------------------------------------------------------------------------
GIN_DEVICE_INLINE void dispatch_send(const ncclDevComm& comm, const MoeNetDispatchArgs& a, int p, int c, int parity, uint64_t flagOffset,
                                     int signalBase) {
  const MoeNetDims& d = a.dims;
  const int R = d.nRanks, K = d.topK, L = d.numExperts / R, M = d.maxTokens;
  const ncclWindow_t window = (ncclWindow_t)(uintptr_t)a.window;
  const MoeWorkspaceLayout ws = moe_workspace_layout(R, d.numExperts, K, M);
  const int* tokensTo = (const int*)(a.workspace + ws.tokensTo);
  const int* sendList = (const int*)(a.workspace + ws.sendList) + (uint64_t)p * M;
  const int* slotInExpert = (const int*)(a.workspace + ws.slotInExpert);
  const int* expertCount = (const int*)(a.workspace + ws.expertCount);
  const uint64_t n = (uint64_t)clamp_count(tokensTo[p], M);
  uint64_t lo, hi;
  part(n, d.chunks, c, lo, hi);
  const Target t = ll_target(comm, window, a.net, parity, d.rank, R, p, flagOffset, signalBase);
  const uint32_t tid = threadIdx.x, lane = gin_lane_id(), warp = tid / GIN_WARP_SIZE, warps = blockDim.x / GIN_WARP_SIZE;
  if (c == 0) {
    if (tid == 0) *(uint64_t*)t.bytes = n;
    for (int j = (int)tid; j < L; j += (int)blockDim.x) ((int32_t*)(t.bytes + 8))[j] = expertCount[p * L + j];
  }
  const uint64_t metaStride = 12ull * (uint64_t)K, rowBytes = (uint64_t)d.rowBytes;
  for (uint64_t i = lo + warp; i < hi; i += warps) {
    const int tok = sendList[i];
    int32_t* meta = (int32_t*)(t.bytes + a.net.metaOffset + i * metaStride);
    if ((int)lane < K) {
      const uint64_t slot = (uint64_t)tok * K + lane;
      const int e = a.topkIdx[slot], sl = slotInExpert[slot];
      const bool here = sl >= 0 && e >= 0 && e / L == p;  // masked, invalid and repeated ids have no slot
      meta[lane] = here ? e - p * L : -1;
      meta[K + lane] = here ? sl : -1;
      ((float*)meta)[2 * K + lane] = a.topkWeights[slot];
    }
    gin_copy_bytes(t.bytes + a.net.rowsOffset + i * rowBytes, (const uint8_t*)a.x + (uint64_t)tok * rowBytes, rowBytes, lane,
                   GIN_WARP_SIZE);
  }
  __syncthreads();
  if (tid == 0) {
    // chunk 0's metadata piece starts at the header; the pieces of a chunk are contiguous per kind
    const uint64_t pieceLo[2] = {c == 0 ? 0 : a.net.metaOffset + lo * metaStride, a.net.rowsOffset + lo * rowBytes};
    const uint64_t pieceHi[2] = {hi > lo || c == 0 ? a.net.metaOffset + hi * metaStride : pieceLo[0], a.net.rowsOffset + hi * rowBytes};
    publish(comm, window, t, pieceLo, pieceHi);
  }
}

// ------------------------------------------------------------------------------------------------
// Dispatch receiver: block (s, c), after every source arrived: the expert-major position of source
// s's rows for each local expert j (all sources' rows of the experts before j, each expert's block
// rounded up to the expert alignment, then the rows of sources before s for j), then slots
// [lo, hi) of s's section into recvX / recvWeights, and the row of each (slot, k) into the
// workspace's slotRows for the combine.
// ------------------------------------------------------------------------------------------------
GIN_DEVICE_INLINE void dispatch_receive(const ncclDevComm& comm, const MoeNetDispatchArgs& a, int s, int c, int parity) {
  __shared__ int start[MOE_NET_MAX_LOCAL_EXPERTS], mine[MOE_NET_MAX_LOCAL_EXPERTS], scanTmp[32];
  const MoeNetDims& d = a.dims;
  const int R = d.nRanks, K = d.topK, L = d.numExperts / R, M = d.maxTokens;
  const ncclWindow_t window = (ncclWindow_t)(uintptr_t)a.window;
  const uint32_t tid = threadIdx.x, lane = gin_lane_id(), warp = tid / GIN_WARP_SIZE, warps = blockDim.x / GIN_WARP_SIZE;
  auto sectionOf = [&](int src) { return (const uint8_t*)ncclGetLocalPointer(window, section(a.net.recvOffset, a.net, parity, R, src)); };
  for (int j = (int)tid; j < L; j += (int)blockDim.x) {
    int total = 0;
    for (int src = 0; src < R; ++src) total += ((const int32_t*)(sectionOf(src) + 8))[j];
    start[j] = (int)moe_align_up((uint64_t)total, (uint64_t)d.expertAlignment);  // < 2^31: the launch check bounds both
    mine[j] = ((const int32_t*)(sectionOf(s) + 8))[j];
  }
  __syncthreads();
  const int totalRows = block_exclusive_scan(start, L, scanTmp);
  for (int j = (int)tid; j < L; j += (int)blockDim.x) {
    int pre = 0;
    for (int src = 0; src < s; ++src) pre += ((const int32_t*)(sectionOf(src) + 8))[j];
    start[j] += pre;
  }
  __syncthreads();
  const MoeWorkspaceLayout ws = moe_workspace_layout(R, d.numExperts, K, M);
  const uint8_t* sec = sectionOf(s);
  const uint64_t nRaw = *(const uint64_t*)sec;
  const uint64_t n = nRaw <= (uint64_t)M ? nRaw : (uint64_t)M;
  if (nRaw > (uint64_t)M && c == 0 && tid == 0) gin_error_set(a.errorFlags, MOE_ERR_COUNTS);
  if (c == 0 && tid == 0) ((int*)(a.workspace + ws.slotsFrom))[s] = (int)n;
  if (s == 0 && c == 0) {
    for (int j = (int)tid; j < L; j += (int)blockDim.x) {
      int total = 0;
      for (int src = 0; src < R; ++src) total += ((const int32_t*)(sectionOf(src) + 8))[j];
      a.recvCounts[j] = total;
    }
    if ((uint64_t)totalRows > a.capacityRows && tid == 0) gin_error_set(a.errorFlags, MOE_ERR_COUNTS);
  }
  int* slotRows = (int*)(a.workspace + ws.slotRows) + (uint64_t)s * M * K;
  uint64_t lo, hi;
  part(n, d.chunks, c, lo, hi);
  const uint64_t metaStride = 12ull * (uint64_t)K, rowBytes = (uint64_t)d.rowBytes;
  for (uint64_t i = lo + warp; i < hi; i += warps) {
    const int32_t* meta = (const int32_t*)(sec + a.net.metaOffset + i * metaStride);
    int row = -1;
    float w = 0.f;
    if ((int)lane < K) {
      const int j = meta[lane], sl = meta[K + lane];
      w = ((const float*)meta)[2 * K + lane];
      if (j >= 0) {
        if (j < L && sl >= 0 && sl < mine[j] && (uint64_t)(start[j] + sl) < a.capacityRows) row = start[j] + sl;
        else gin_error_set(a.errorFlags, MOE_ERR_COUNTS);
      }
      slotRows[i * K + lane] = row;
    }
    const uint8_t* src = sec + a.net.rowsOffset + i * rowBytes;
    for (int k = 0; k < K; ++k) {
      const int r = __shfl_sync(0xffffffffu, row, k);
      const float wk = __shfl_sync(0xffffffffu, w, k);
      if (r < 0) continue;
      gin_copy_bytes((uint8_t*)a.recvX + (uint64_t)r * rowBytes, src, rowBytes, lane, GIN_WARP_SIZE);
      if (lane == 0) a.recvWeights[r] = wk;
    }
  }
}

}  // namespace moe_net
