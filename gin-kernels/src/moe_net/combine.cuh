// moe_net/combine.cuh - the combine's expert-side partial sender and source-side reducer, both modes.
#pragma once

#include "targets.cuh"
#include "topology.cuh"

namespace moe_net {

// ------------------------------------------------------------------------------------------------
// Combine, expert side: block (p, c) reduces slots [lo, hi) of the tokens source p sent in the last
// dispatch, sum over k of weight x expertOut[row(slot, k)] in f32, rounded once to bf16, and sends
// the partial rows back into p's combine section [parity][rank]. The row values call (rowValues
// set) sends for each slot the [K] words bits(rowValues[row(slot, k)]), 0 where k's row is not
// here, instead.
// ------------------------------------------------------------------------------------------------
GIN_DEVICE_INLINE void combine_send(const ncclDevComm& comm, const MoeNetCombineArgs& a, int p, int c, int parity, const Target& t) {
  const MoeNetDims& d = a.dims;
  const int R = d.nRanks, K = d.topK, M = d.maxTokens, H = d.hidden;
  const ncclWindow_t window = (ncclWindow_t)(uintptr_t)a.window;
  const MoeWorkspaceLayout ws = moe_workspace_layout(R, d.numExperts, K, M);
  const uint64_t n = (uint64_t)clamp_count(((const int*)(a.workspace + ws.slotsFrom))[p], M);
  const int* slotRows = (const int*)(a.workspace + ws.slotRows) + (uint64_t)p * M * K;
  uint64_t lo, hi;
  part(n, d.chunks, c, lo, hi);
  const uint32_t tid = threadIdx.x, lane = gin_lane_id(), warp = tid / GIN_WARP_SIZE, warps = blockDim.x / GIN_WARP_SIZE;
  const bool vec = H % 8 == 0 && gin_is_aligned(a.expertOut, 16);  // 16-byte loads and stores
  for (uint64_t i = lo + warp; a.rowValues != nullptr && i < hi; i += warps) {
    if ((int)lane < K) {
      int row = slotRows[i * K + lane];
      if (row >= 0 && (uint64_t)row >= a.expertOutRows) {
        gin_error_set(a.errorFlags, MOE_ERR_COUNTS);
        row = -1;
      }
      ((uint32_t*)(t.bytes + i * 4ull * K))[lane] = row >= 0 ? __float_as_uint(a.rowValues[row]) : 0u;
    }
  }
  for (uint64_t i = lo + warp; a.rowValues == nullptr && i < hi; i += warps) {
    int row = -1;
    float w = 0.f;
    if ((int)lane < K) {
      row = slotRows[i * K + lane];
      if (row >= 0 && (uint64_t)row >= a.expertOutRows) {
        gin_error_set(a.errorFlags, MOE_ERR_COUNTS);
        row = -1;
      }
      if (row >= 0) w = a.weights != nullptr ? a.weights[row] : 1.f;
    }
    uint16_t* out = (uint16_t*)(t.bytes + i * 2ull * (uint64_t)H);
    if (vec) {
      for_columns<8>(H, lane, [&](int h, bool on) {
        float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        for (int k = 0; k < K; ++k) {
          const int r = __shfl_sync(0xffffffffu, row, k);
          const float wk = __shfl_sync(0xffffffffu, w, k);
          if (on && r >= 0) acc_bf16x8(acc, ld16<false>(a.expertOut + (uint64_t)r * H + h), wk);
        }
        if (on) gin_st16(out + h, pack_bf16x8(acc));
      });
    } else {
      for_columns<1>(H, lane, [&](int h, bool on) {
        float acc = 0.f;
        for (int k = 0; k < K; ++k) {
          const int r = __shfl_sync(0xffffffffu, row, k);
          const float wk = __shfl_sync(0xffffffffu, w, k);
          if (on && r >= 0) acc += wk * bf16_to_f32(a.expertOut[(uint64_t)r * H + h]);
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

// Combine, source side: block b of the reducers takes its share of the tokens, after every writer's
// partials arrived: y[t] = sum over writers p of partial[p][pos(t, p)]. Low-latency: the writers
// are the ranks t went to, pos = tokenPos[t][p]. HT: the ranks of this node that t went to
// (tokenPos), and for each other node D that t went to its entry rank, pos = nodePos[t][D] (one
// partial per (token, node)). The row values call: tokenValues[t][k] = the OR over the writers of
// their word k, the bits of the one value made for (t, k) (the others are 0), or 0 when masked.
GIN_DEVICE_INLINE void combine_reduce(const MoeNetCombineArgs& a, ncclWindow_t window, int b, int blocks, int parity, bool ht) {
  const MoeNetDims& d = a.dims;
  const int R = d.nRanks, K = d.topK, M = d.maxTokens, H = d.hidden;
  const MoeWorkspaceLayout ws = moe_workspace_layout(R, d.numExperts, K, M);
  const int* tokenPos = (const int*)(a.workspace + ws.tokenPos);
  const int* nodePos = ht ? (const int*)ncclGetLocalPointer(window, a.fwd.nodePosOffset) : nullptr;
  const int T = clamp_count(a.numTokens, M);
  const uint32_t lane = gin_lane_id(), warp = threadIdx.x / GIN_WARP_SIZE, warps = blockDim.x / GIN_WARP_SIZE;
  const uint8_t* partials = (const uint8_t*)ncclGetLocalPointer(window, section(a.net.recvOffset, a.net, parity, R, 0));
  const bool vec = H % 8 == 0 && gin_is_aligned(a.y, 16);
  for (int t = b * (int)warps + (int)warp; t < T; t += blocks * (int)warps) {
    int pos = -1;
    if ((int)lane < R) {
      const int D = a.topo.nodeOf[lane];
      if (!ht || D == a.topo.nodeOf[d.rank]) pos = tokenPos[(uint64_t)t * R + lane];
      else if (entry_of(a.topo, d.rank, D) == (int)lane) pos = nodePos[(uint64_t)t * a.topo.nodes + D];
    }
    if (a.rowValues != nullptr) {
      uint32_t bits = 0;
      for (int p = 0; p < R; ++p) {
        const int q = __shfl_sync(0xffffffffu, pos, p);
        if ((int)lane < K && q >= 0) bits |= __ldcg((const unsigned int*)(partials + (uint64_t)p * a.net.sectionBytes + (uint64_t)q * 4ull * K) + lane);
      }
      if ((int)lane < K) a.tokenValues[(uint64_t)t * K + lane] = __uint_as_float(bits);
      continue;
    }
    uint16_t* y = a.y + (uint64_t)t * H;
    if (vec) {
      for_columns<8>(H, lane, [&](int h, bool on) {
        float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        for (int p = 0; p < R; ++p) {
          const int q = __shfl_sync(0xffffffffu, pos, p);
          if (on && q >= 0)
            acc_bf16x8(acc, ld16<true>(partials + (uint64_t)p * a.net.sectionBytes + ((uint64_t)q * H + h) * 2ull), 1.f);
        }
        if (on) gin_st16(y + h, pack_bf16x8(acc));
      });
    } else {
      for_columns<1>(H, lane, [&](int h, bool on) {
        float acc = 0.f;
        for (int p = 0; p < R; ++p) {
          const int q = __shfl_sync(0xffffffffu, pos, p);
          if (on && q >= 0) acc += bf16_to_f32(((const uint16_t*)(partials + (uint64_t)p * a.net.sectionBytes))[(uint64_t)q * H + h]);
        }
        if (on) y[h] = (uint16_t)f32_to_bf16(acc);
      });
    }
  }
}

}  // namespace moe_net
