// moe_net/ht_node_reduce.cuh - the high-throughput combine's node reduction on the entry rank: one
// bf16 partial per (token, node), sent back to the token's source.
#pragma once

#include "targets.cuh"
#include "topology.cuh"

namespace moe_net {

// ------------------------------------------------------------------------------------------------
// Node reduction: block (sigma, c) of an entry rank reduces node rows [lo, hi) of slot sigma's
// sender s, row u = sum over the node's ranks q of partial[q][fwdPos[u][q]] in f32, rounded once to
// bf16, into s's combine section [parity][this rank] (the node partial). Each rank q publishes its
// partials for the slot chunk by chunk (combine_send: chunk c' holds positions part(n_q, C, c')),
// and q's positions grow with u (the forwarder placed the rows in node-row order), so the block
// waits only for the chunks of each q that hold the positions of its rows: it starts while later
// chunks are still on their way, and its node partial goes out while they are (NVLink and network
// phases overlap, as in the dispatch). The row values call (rowValues set) ORs the [K] words of the
// node's partials instead (each word is 0 but at the one rank that made that slot's row).
// ------------------------------------------------------------------------------------------------
GIN_DEVICE_INLINE void ht_node_reduce(const ncclDevComm& comm, const MoeNetCombineArgs& a, int sigma, int c, int parity, uint64_t count) {
  const MoeNetDims& d = a.dims;
  const MoeNetTopology& topo = a.topo;
  const MoeNetForward& f = a.fwd;
  const int R = d.nRanks, M = d.maxTokens, H = d.hidden, C = d.chunks, K = d.topK;
  const int S = topo.nodes * topo.slotsPerNode, G = topo.maxNodeSize, myNode = topo.nodeOf[d.rank], Gm = topo.nodeSize[myNode];
  const ncclWindow_t window = (ncclWindow_t)(uintptr_t)a.window;
  const int s = slot_source(topo, d.rank, sigma);
  if (s < 0) return;
  const int tid = (int)threadIdx.x;
  // the dispatch's forwarder left here the slot's row count, each node peer's and where each chunk's start
  const int* fwdCount = (const int*)ncclGetLocalPointer(window, f.fwdCountOffset) + (uint64_t)sigma * (1 + G + G * C);
  const int nD = clamp_count(fwdCount[0], M);
  const int* fwdPos = (const int*)ncclGetLocalPointer(window, f.fwdPosOffset) + (uint64_t)sigma * M * G;
  uint64_t lo, hi;
  part((uint64_t)nD, C, c, lo, hi);
  bool ok = true;
  if (tid < Gm) {  // q = tid: its positions for rows [lo, hi) (the forwarder's chunk c for q), then their chunks
    const int nq = clamp_count(fwdCount[1 + tid], M);
    const int from = clamp_count(fwdCount[1 + G + tid * C + c], nq), to = c + 1 < C ? clamp_count(fwdCount[1 + G + tid * C + c + 1], nq) : nq;
    if (to > from) {
      const int per = (nq + C - 1) / C;
      const int c0 = from / per, c1 = (to - 1) / per;
      for (int cq = c0; ok && cq <= c1 && cq < C; ++cq) {
        const uint64_t idx = part_chunk(parity, S, sigma, G, tid, C, cq);
        ok = wait_one(comm, window, node_rank(topo, myNode, tid), f.part.flagOffset + 8ull * idx, f.part.signalBase + (int)idx, count, a.errorFlags);
      }
    }
  }
  if (__syncthreads_or(!ok)) return;
  const uint8_t* partials = (const uint8_t*)ncclGetLocalPointer(window, f.part.recvOffset + ((uint64_t)parity * S + sigma) * G * f.part.sectionBytes);
  const Target t = target(comm, window, s, section(a.net.recvOffset, a.net, parity, R, d.rank), section(a.net.stageOffset, a.net, parity, R, s),
                          f.htFlagOffset + 8ull * (2ull * R + (uint64_t)parity * R + d.rank), f.htSignalBase + 2 * R + parity * R + d.rank);
  const uint32_t lane = gin_lane_id(), warp = threadIdx.x / GIN_WARP_SIZE, warps = blockDim.x / GIN_WARP_SIZE;
  const bool vec = H % 8 == 0;  // sections are 256-byte aligned, rows 16-byte aligned when H % 8 == 0
  for (uint64_t u = lo + warp; a.rowValues != nullptr && u < hi; u += warps) {
    const int pos = (int)lane < Gm ? fwdPos[u * G + lane] : -1;
    uint32_t bits = 0;
    for (int q = 0; q < Gm; ++q) {
      const int r = __shfl_sync(0xffffffffu, pos, q);
      if ((int)lane < K && r >= 0 && r < M) bits |= __ldcg((const unsigned int*)(partials + (uint64_t)q * f.part.sectionBytes + (uint64_t)r * 4ull * K) + lane);
    }
    if ((int)lane < K) ((uint32_t*)(t.bytes + u * 4ull * K))[lane] = bits;
  }
  for (uint64_t u = lo + warp; a.rowValues == nullptr && u < hi; u += warps) {
    const int pos = (int)lane < Gm ? fwdPos[u * G + lane] : -1;
    uint16_t* out = (uint16_t*)(t.bytes + u * 2ull * (uint64_t)H);
    if (vec) {
      for_columns<8>(H, lane, [&](int h, bool on) {
        float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        for (int q = 0; q < Gm; ++q) {
          const int r = __shfl_sync(0xffffffffu, pos, q);
          if (on && r >= 0 && r < M) acc_bf16x8(acc, ld16<true>(partials + (uint64_t)q * f.part.sectionBytes + ((uint64_t)r * H + h) * 2ull), 1.f);
        }
        if (on) gin_st16(out + h, pack_bf16x8(acc));
      });
    } else {
      for_columns<1>(H, lane, [&](int h, bool on) {
        float acc = 0.f;
        for (int q = 0; q < Gm; ++q) {
          const int r = __shfl_sync(0xffffffffu, pos, q);
          if (on && r >= 0 && r < M) acc += bf16_to_f32(((const uint16_t*)(partials + (uint64_t)q * f.part.sectionBytes))[(uint64_t)r * H + h]);
        }
        if (on) out[h] = (uint16_t)f32_to_bf16(acc);
      });
    }
  }
  __syncthreads();
  if (tid == 0) {
    const uint64_t rowBytes = combine_row_bytes(a), pieceLo[2] = {lo * rowBytes, 0}, pieceHi[2] = {hi * rowBytes, 0};
    publish(comm, window, t, pieceLo, pieceHi);
  }
}

}  // namespace moe_net
