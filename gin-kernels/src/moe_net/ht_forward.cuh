// moe_net/ht_forward.cuh - the high-throughput dispatch between nodes: the node sender (one section
// per other node, at its entry rank) and the entry's forwarder to the ranks of its node.
#pragma once

#include "targets.cuh"
#include "topology.cuh"

namespace moe_net {

// ================================================================================================
// High-throughput mode (MOE_NET_MODE_HT). A token crosses to each other node once: its sender puts
// one row and its metadata into a node section at the node's entry rank (ht_node_send), the entry
// forwards it to every rank of its node that the token goes to, itself included, as that rank's
// low-latency section for the sender (ht_forward; LSA stores, or GIN puts for a node peer outside
// the LSA team), and the ranks place the rows as in the low-latency mode (dispatch_receive). The
// sender's own node gets its sections straight from it (dispatch_send). The combine reverses it:
// the expert ranks send their partials for another node's token to their node's entry for that
// token's sender (combine_send), the entry adds them into one bf16 partial per (token, node)
// (ht_node_reduce), and the source adds the partials of its own node's ranks and of every entry.
// ================================================================================================

// Sums one int per thread over the block (every thread gets the total).
GIN_DEVICE_INLINE int block_sum(int v, int* shared1) {
  if (threadIdx.x == 0) *shared1 = 0;
  __syncthreads();
  if (v != 0) atomicAdd(shared1, v);
  __syncthreads();
  const int total = *shared1;
  __syncthreads();
  return total;
}

// Token t has a slot on a rank of node D (masked, invalid and repeated ids have none).
GIN_DEVICE_INLINE bool token_to_node(const MoeNetDispatchArgs& a, const int* slotInExpert, int t, int D, int L) {
  const int K = a.dims.topK;
  for (int k = 0; k < K; ++k) {
    const int e = a.topkIdx[(uint64_t)t * K + k], sl = slotInExpert[(uint64_t)t * K + k];
    if (sl >= 0 && e >= 0 && e < a.dims.numExperts && a.topo.nodeOf[e / L] == D) return true;
  }
  return false;
}

// Node row u (metadata at meta) has a slot on rank p.
GIN_DEVICE_INLINE bool row_to_rank(const int32_t* meta, int K, int E, int L, int p) {
  for (int k = 0; k < K; ++k) {
    const int e = meta[k];
    if (e >= 0 && e < E && e / L == p) return true;
  }
  return false;
}

// ------------------------------------------------------------------------------------------------
// Node sender: block (D, c) of a rank writes node rows [lo, hi) of its node section for node D
// (tokens in token order that go to some rank of D; row u = the u-th such token) into D's entry
// rank, published on the chunk's own flag / signal (node_chunk): metadata (per k the global expert id if on D, else -1; slot in that expert; weight) and
// row; chunk 0 also the header (tokens; per rank of D its rows per local expert, from this rank's
// layout). Each block walks all T tokens (a block-wide scan gives u), and records token t's node
// row in nodePos[t][D] for its share of the tokens (the combine adds the node partials from it).
// ------------------------------------------------------------------------------------------------
GIN_DEVICE_INLINE void ht_node_send(const ncclDevComm& comm, const MoeNetDispatchArgs& a, int D, int c, int parity) {
  __shared__ int scan[MOE_NET_THREADS], list[MOE_NET_THREADS], scanTmp[32], total;
  const MoeNetDims& d = a.dims;
  const MoeNetTopology& topo = a.topo;
  const MoeNetForward& f = a.fwd;
  const int R = d.nRanks, K = d.topK, E = d.numExperts, L = E / R, M = d.maxTokens, T = clamp_count(a.numTokens, M), N = topo.nodes;
  const int S = N * topo.slotsPerNode, G = topo.maxNodeSize;
  const ncclWindow_t window = (ncclWindow_t)(uintptr_t)a.window;
  const MoeWorkspaceLayout ws = moe_workspace_layout(R, E, K, M);
  const int* slotInExpert = (const int*)(a.workspace + ws.slotInExpert);
  const int* expertCount = (const int*)(a.workspace + ws.expertCount);
  int* nodePos = (int*)ncclGetLocalPointer(window, f.nodePosOffset);
  const int entry = entry_of(topo, d.rank, D), sigma = slot_of(topo, d.rank, D);
  const uint64_t unit = node_chunk(parity, S, sigma, d.chunks, c);  // each chunk its own flag and signal: a forwarder starts on the first chunks
  const Target t = target(comm, window, entry, section(f.node.recvOffset, f.node, parity, S, sigma), section(f.node.stageOffset, f.node, parity, N, D),
                          f.node.flagOffset + 8ull * unit, f.node.signalBase + (int)unit);
  const int tid = (int)threadIdx.x, B = (int)blockDim.x;
  const uint32_t lane = gin_lane_id(), warp = threadIdx.x / GIN_WARP_SIZE, warps = blockDim.x / GIN_WARP_SIZE;
  int mine = 0;
  for (int tk = tid; tk < T; tk += B) mine += token_to_node(a, slotInExpert, tk, D, L) ? 1 : 0;
  const int nD = block_sum(mine, &total);
  uint64_t lo, hi, tlo, thi;
  part((uint64_t)nD, d.chunks, c, lo, hi);
  part((uint64_t)T, d.chunks, c, tlo, thi);
  if (c == 0) {
    if (tid == 0) *(uint64_t*)t.bytes = (uint64_t)nD;
    for (int i = tid; i < G * L; i += B) {
      const int q = i / L, j = i % L;
      ((int32_t*)(t.bytes + 8))[i] = q < topo.nodeSize[D] ? expertCount[node_rank(topo, D, q) * L + j] : 0;
    }
  }
  const uint64_t metaStride = 12ull * (uint64_t)K, rowBytes = (uint64_t)d.rowBytes;
  int run = 0;
  for (int base = 0; base < T; base += B) {
    const int tk = base + tid;
    const bool in = tk < T && token_to_node(a, slotInExpert, tk, D, L);
    scan[tid] = in ? 1 : 0;
    __syncthreads();
    const int tot = block_exclusive_scan(scan, B, scanTmp);
    const int u = run + scan[tid];
    if (tk < T && (uint64_t)tk >= tlo && (uint64_t)tk < thi) nodePos[(uint64_t)tk * N + D] = in ? u : -1;
    const int64_t from = (int64_t)lo > run ? (int64_t)lo : run, to = (int64_t)hi < run + tot ? (int64_t)hi : run + tot;
    if (in && u >= from && u < to) list[u - from] = tk;
    __syncthreads();
    for (int64_t i = warp; i < to - from; i += warps) {
      const int tok = list[i];
      const uint64_t row = (uint64_t)(from + i);
      int32_t* meta = (int32_t*)(t.bytes + f.node.metaOffset + row * metaStride);
      if ((int)lane < K) {
        const uint64_t slot = (uint64_t)tok * K + lane;
        const int e = a.topkIdx[slot], sl = slotInExpert[slot];
        const bool here = sl >= 0 && e >= 0 && e < E && topo.nodeOf[e / L] == D;
        meta[lane] = here ? e : -1;
        meta[K + lane] = here ? sl : -1;
        ((float*)meta)[2 * K + lane] = a.topkWeights[slot];
      }
      gin_copy_bytes(t.bytes + f.node.rowsOffset + row * rowBytes, (const uint8_t*)a.x + (uint64_t)tok * rowBytes, rowBytes, lane,
                     GIN_WARP_SIZE);
    }
    run += tot;
    __syncthreads();
  }
  if (tid == 0) {
    const uint64_t pieceLo[2] = {c == 0 ? 0 : f.node.metaOffset + lo * metaStride, f.node.rowsOffset + lo * rowBytes};
    const uint64_t pieceHi[2] = {hi > lo || c == 0 ? f.node.metaOffset + hi * metaStride : pieceLo[0], f.node.rowsOffset + hi * rowBytes};
    publish(comm, window, t, pieceLo, pieceHi);
  }
}

// ------------------------------------------------------------------------------------------------
// Forwarder: block (sigma, q, c) of an entry rank forwards node rows [ulo, uhi) of slot sigma's
// node section (the share of the sender's chunk c) to node peer q, as positions [first, first + n)
// of q's low-latency section for the slot's sender s: the rows that go to q, in node-row order (=
// the sender's sendList order for q: both are token order), with q's local expert ids, into q's
// receive section [parity][s] (LSA) or staged for GIN, published on q's HT flag / signal
// [parity][s]. It waits for the sender's chunks 0..c only (chunk 0 has the header, the earlier
// chunks' metadata give `first`), so it starts while later chunks are still on the wire: the
// network and NVLink phases of one sender's section overlap. The last chunk writes q's header
// (its row count and per-expert counts from the node header). Each block records, for its node
// rows, the row's position in q's section in fwdPos[sigma][u][q] (-1: not there), which the
// combine's node reduction reads, its `first` in fwdCount[sigma][1 + G + q C + c] and the last chunk
// q's row count in fwdCount[sigma][1 + q] (the node reduction's chunks of q's partials).
// ------------------------------------------------------------------------------------------------
GIN_DEVICE_INLINE void ht_forward(const ncclDevComm& comm, const MoeNetDispatchArgs& a, int sigma, int q, int c, int parity, uint64_t count) {
  __shared__ int scan[MOE_NET_THREADS], list[MOE_NET_THREADS], scanTmp[32], total;
  const MoeNetDims& d = a.dims;
  const MoeNetTopology& topo = a.topo;
  const MoeNetForward& f = a.fwd;
  const int R = d.nRanks, K = d.topK, E = d.numExperts, L = E / R, M = d.maxTokens, C = d.chunks;
  const int S = topo.nodes * topo.slotsPerNode, G = topo.maxNodeSize;
  const ncclWindow_t window = (ncclWindow_t)(uintptr_t)a.window;
  const int s = slot_source(topo, d.rank, sigma);
  if (s < 0) return;  // no sender has this rank as entry in this slot
  const int tid = (int)threadIdx.x, B = (int)blockDim.x;
  bool ok = true;
  if (tid <= c) {
    const uint64_t unit = node_chunk(parity, S, sigma, C, tid);
    ok = wait_one(comm, window, s, f.node.flagOffset + 8ull * unit, f.node.signalBase + (int)unit, count, a.errorFlags);
  }
  if (__syncthreads_or(!ok)) return;
  const uint8_t* sec = (const uint8_t*)ncclGetLocalPointer(window, section(f.node.recvOffset, f.node, parity, S, sigma));
  const uint64_t nRaw = *(const uint64_t*)sec;
  const int nD = nRaw <= (uint64_t)M ? (int)nRaw : M;
  if (nRaw > (uint64_t)M && q == 0 && c == 0 && tid == 0) gin_error_set(a.errorFlags, MOE_ERR_COUNTS);
  // [S][1 + G + G C]: the slot's rows, each peer's rows, each peer's first position per chunk
  int* fwdCount = (int*)ncclGetLocalPointer(window, f.fwdCountOffset) + (uint64_t)sigma * (1 + G + G * C);
  if (q == 0 && c == 0 && tid == 0) fwdCount[0] = nD;
  const int p = node_rank(topo, topo.nodeOf[d.rank], q);
  const uint64_t nodeMetaStride = 12ull * (uint64_t)K, rowBytes = (uint64_t)d.rowBytes;
  uint64_t ulo, uhi;
  part((uint64_t)nD, C, c, ulo, uhi);
  auto toQ = [&](uint64_t u) { return row_to_rank((const int32_t*)(sec + f.node.metaOffset + u * nodeMetaStride), K, E, L, p); };
  int before = 0, here = 0;
  for (uint64_t u = tid; u < ulo; u += B) before += toQ(u) ? 1 : 0;
  for (uint64_t u = ulo + tid; u < uhi; u += B) here += toQ(u) ? 1 : 0;
  const int first = block_sum(before, &total), n = block_sum(here, &total);
  const bool last = c == C - 1;  // its share ends at nD (part), so first + n is q's row count
  const uint64_t stage = f.fwdStageOffset + (((uint64_t)parity * S + sigma) * G + q) * a.net.sectionBytes;
  const Target t = target(comm, window, p, section(a.net.recvOffset, a.net, parity, R, s), stage, f.htFlagOffset + 8ull * ((uint64_t)parity * R + s),
                          f.htSignalBase + parity * R + s);
  if (last) {
    if (tid == 0) *(uint64_t*)t.bytes = (uint64_t)(first + n);
    if (tid == 0) fwdCount[1 + q] = first + n;  // q's partials come back in chunks of this count (ht_node_reduce)
    for (int j = tid; j < L; j += B) ((int32_t*)(t.bytes + 8))[j] = ((const int32_t*)(sec + 8))[q * L + j];
  }
  if (tid == 0) fwdCount[1 + G + q * C + c] = first;  // where this chunk's rows start among q's partials
  int* fwdPos = (int*)ncclGetLocalPointer(window, f.fwdPosOffset) + (uint64_t)sigma * M * G;
  const uint32_t lane = gin_lane_id(), warp = threadIdx.x / GIN_WARP_SIZE, warps = blockDim.x / GIN_WARP_SIZE;
  const uint64_t metaStride = 12ull * (uint64_t)K;
  int run = first;
  for (uint64_t base = ulo; base < uhi; base += B) {
    const uint64_t u = base + tid;
    const bool in = u < uhi && toQ(u);
    scan[tid] = in ? 1 : 0;
    __syncthreads();
    const int tot = block_exclusive_scan(scan, B, scanTmp);
    if (u < uhi) fwdPos[u * G + q] = in ? run + scan[tid] : -1;
    if (in) list[scan[tid]] = (int)u;
    __syncthreads();
    for (int i = (int)warp; i < tot; i += (int)warps) {
      const int row = list[i];
      const uint64_t at = (uint64_t)(run + i);
      const int32_t* nm = (const int32_t*)(sec + f.node.metaOffset + (uint64_t)row * nodeMetaStride);
      int32_t* meta = (int32_t*)(t.bytes + a.net.metaOffset + at * metaStride);
      if ((int)lane < K) {
        const int e = nm[lane];
        const bool mineE = e >= 0 && e < E && e / L == p;
        meta[lane] = mineE ? e - p * L : -1;
        meta[K + lane] = mineE ? nm[K + lane] : -1;
        meta[2 * K + lane] = nm[2 * K + lane];  // the weight's bits
      }
      gin_copy_bytes(t.bytes + a.net.rowsOffset + at * rowBytes, sec + f.node.rowsOffset + (uint64_t)row * rowBytes, rowBytes, lane, GIN_WARP_SIZE);
    }
    run += tot;
    __syncthreads();
  }
  if (tid == 0) {
    // pieces: the header up to the metadata (last chunk), this chunk's metadata, its rows; the
    // header and the metadata are one piece when the chunk starts at position 0
    const uint64_t metaLo = a.net.metaOffset + (uint64_t)first * metaStride, metaHi = a.net.metaOffset + (uint64_t)(first + n) * metaStride;
    const bool joined = last && first == 0;
    const uint64_t pieceLo[3] = {0, joined ? 0 : metaLo, a.net.rowsOffset + (uint64_t)first * rowBytes};
    const uint64_t pieceHi[3] = {last && !joined ? a.net.metaOffset : 0, metaHi, a.net.rowsOffset + (uint64_t)(first + n) * rowBytes};
    publish(comm, window, t, pieceLo, pieceHi);
  }
}

}  // namespace moe_net
