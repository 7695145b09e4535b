// moe_gin.cu - the GPU-initiated MoE exchange (code object "moe_gin"): dispatch and combine over
// LSA windows, no host round trip, graph-capturable; row values back to their tokens; and
// moe_query_layout, the window and workspace sizes (moe_host has it too).
//
// The data path, one header per phase (moe/):
//   routing_layout      routing ids -> slot and row positions (layout path senders, moe_host_layout)
//   token_path_layout   token path: the receivers lay out every source's ids themselves
//   fp8                 bf16 -> scaled fp8 rows (the quantizing fp8 dispatch)
//   dispatch*           gin_dispatch: prologue, then the token-path or layout-path sender/receiver
//   dispatch_receive    count tables and own-token items of the dispatch receivers
//   row_movers, ll128_rows   rows copied, reduced, or sent as LL128 lines
//   combine*            gin_combine: layout path and token path
// Signatures, grids, window/workspace layouts, error bits and the ordering arguments are in
// docs/kernels.md; the short form of each argument sits next to the code.
#include "moe/entry_points.cuh"
#include "moe/query_layout.cuh"
#include "moe/dispatch.cuh"
#include "moe/combine.cuh"
#include "moe/expert_offsets.cuh"
#include "moe/shaped_entries.cuh"

// ================================================================================================
// Entry points. moe_gin_dispatch / moe_gin_combine run any accepted instance, either
// path. The token-path entries run only instances on the token path (moe_token_path; anything else
// gets MOE_ERR_CONFIG) and leave the layout path out: moe_gin_{dispatch,combine}_tp for any shape,
// ..._tp_r1 for any shape at one rank, and one pair per shape of MOE_TP_SHAPES, named
// ..._tp_r<R>_e<E>_k<K>_h<H>, for that shape only.
// The Java side takes the most specific entry the code object has (docs/kernels.md, "Entry points").
// All entries of an instance share its window and workspace protocol: any mix of them is valid.
// ================================================================================================

GIN_KERNEL void __launch_bounds__(MOE_THREADS, 1) moe_gin_dispatch(MOE_DISPATCH_PARAMS) {
  gin_dispatch<MoeAnyShape>(a);
}
GIN_KERNEL void __launch_bounds__(MOE_THREADS, 1) moe_gin_combine(MOE_COMBINE_PARAMS) {
  gin_combine<MoeAnyShape>(a);
}
GIN_KERNEL void __launch_bounds__(MOE_THREADS, 1) moe_gin_dispatch_tp(MOE_DISPATCH_PARAMS) {
  gin_dispatch<MoeShape<true, 0, 0, 0, 0>>(a);
}
GIN_KERNEL void __launch_bounds__(MOE_THREADS, 1) moe_gin_combine_tp(MOE_COMBINE_PARAMS) {
  gin_combine<MoeShape<true, 0, 0, 0, 0>>(a);
}
// One rank alone, any model shape: with R = 1 a constant the remote parts fold away
// (one H200, 128 tokens, 8 back to back: dispatch / combine 13.2-14.0 / 11.0 -> 12.5-13.0 / 10.6 us
// for DeepSeek-V3, 8.6 / 6.2 -> 8.1 / 5.7 for Mixtral, against moe_gin_dispatch_tp / _combine_tp).
GIN_KERNEL void __launch_bounds__(MOE_THREADS, 1) moe_gin_dispatch_tp_r1(MOE_DISPATCH_PARAMS) {
  gin_dispatch<MoeShape<true, 1, 0, 0, 0>>(a);
}
GIN_KERNEL void __launch_bounds__(MOE_THREADS, 1) moe_gin_combine_tp_r1(MOE_COMBINE_PARAMS) {
  gin_combine<MoeShape<true, 1, 0, 0, 0>>(a);
}
MOE_TP_SHAPES(MOE_TP_ENTRIES)

// fp8 dispatch: the same kernels moving scaled fp8 rows (moe_fp8_row_bytes(hidden)
// bytes each; recvX holds such rows, H % 16 == 0, else MOE_ERR_CONFIG), reading one more field,
// xq: null = x holds fp8 rows already; else x holds bf16 rows [T][H] and the kernel
// quantizes them into xq ([maxTokens][moe_fp8_row_bytes(hidden)] scratch, as moe_fp8_quantize
// would; x, xq and recvX 16-byte aligned, else MOE_ERR_CONFIG) before sending them. The combine of
// an fp8 dispatch is the bf16 one (expert outputs are bf16), any of the entries above.
GIN_KERNEL void __launch_bounds__(MOE_THREADS, 1) moe_gin_dispatch_fp8(MOE_DISPATCH_FP8_GENERIC_PARAMS) {
  gin_dispatch<MoeShape<false, 0, 0, 0, 0, true>>(a);
}
GIN_KERNEL void __launch_bounds__(MOE_THREADS, 1) moe_gin_dispatch_fp8_tp(MOE_DISPATCH_PARAMS) {
  gin_dispatch<MoeShape<true, 0, 0, 0, 0, true>>(a);
}
GIN_KERNEL void __launch_bounds__(MOE_THREADS, 1) moe_gin_dispatch_fp8_tp_r1(MOE_DISPATCH_PARAMS) {
  gin_dispatch<MoeShape<true, 1, 0, 0, 0, true>>(a);
}
MOE_TP_FP8_SHAPES(MOE_TP_FP8_ENTRIES)

// ================================================================================================
// One f32 per received row back to its (token, k) at the token's rank: in training,
// the router weights' gradient dL/dw[t][k] = <dy[t], out(t, expert_k)>, one dot product per
// received row on the expert side. Both use the last dispatch's layouts (workspace); out of range
// row indices set MOE_ERR_COUNTS and give 0; masked slots give 0.
// moe_gin_row_values (GPU-initiated, one launch): grid C blocks of MOE_THREADS (C = the dispatch's
// channels; all blocks of all ranks resident together, as the dispatch's). Call n, block b:
//  expert side: for every rank s, slots [b*S/C, (b+1)*S/C) of the S = slotsFrom[s] slots s sent
//    here: v[j][k] = rowValues[slotRows[s][j][k]], 0 where that slot's k made no row here, stored
//    as the LL word (n << 32 | bits of v) into s's window at valRows[n % 2][this rank][j][k]: the
//    word proves itself, so no fence, no ready flag, no barrier across blocks. Buffer n % 2 was
//    last read by s in call n - 2: first wait for valConsumed[s] >= n - 2 in our window, which s
//    stores at the start of its call n - 1 (its call n - 2 is complete then: a relaxed store, as
//    the dispatch's dispConsumed).
//  token side: tokens [b*T/C, (b+1)*T/C): g[t][k] = sum over the ranks r that token t went to
//    (j = tokenPos[t][r] >= 0) of valRows[n % 2][r][j][k], each polled until it carries n; one of
//    them made a row for slot k, the others stored 0.
// moe_host_row_values_in (HOST, after moe_host_unpermute of 4-byte rows and the rows' way back):
// g[t][k] = returned[expertOffset[e] + slotInExpert[t][k]].
// ================================================================================================
constexpr int kRowValuesBatch = 4;
GIN_KERNEL void __launch_bounds__(MOE_THREADS, 1) moe_gin_row_values(const __grid_constant__ MoeGinRowValuesArgs a) {
  const float* rowValues = a.rowValues;
  float* g = a.g;
  const uint64_t* peerBases = a.peerBases;
  uint8_t* workspace = a.workspace;
  uint32_t* errorFlags = a.errorFlags;
  const int32_t numTokens = a.numTokens;
  __shared__ uint64_t sharedSeq;
  __shared__ int sharedSlots[MOE_MAX_RANKS];
  const int tid = (int)threadIdx.x, B = (int)blockDim.x, C = a.dims.numChannels, b = (int)blockIdx.x;
  Dims d = make_dims(a.dims.rank, a.dims.nRanks, a.dims.numExperts, a.dims.topK, a.dims.hidden, a.dims.maxTokens,
                     a.dims.numChannels, numTokens);  // H: the window layout
  d.A = moe_alignment(a.dims.expertAlignment);
  if (!launch_ok(d, 1, true, workspace, peerBases, errorFlags) || !peers_ok(peerBases, d.R, errorFlags)) return;
  if (rowValues == nullptr || (numTokens > 0 && g == nullptr)) {
    if (b == 0 && tid == 0) gin_error_set(errorFlags, MOE_ERR_CONFIG);
    return;
  }
  uint64_t* state = state_of(workspace);
  // The token partition is the dispatch's (tokenPos holds its T tokens); g gets numTokens rows. A
  // mismatch is reported but the call goes on: the other ranks wait for our values.
  const int dispatchT = (int)state[MOE_STATE_DISPATCH_TOKENS];
  if (dispatchT != numTokens && b == 0 && tid == 0) gin_error_set(errorFlags, MOE_ERR_TOKENS);
  d.T = dispatchT < 0 ? 0 : (dispatchT > d.M ? d.M : dispatchT);
  const int gRows = numTokens < 0 ? 0 : numTokens;
  const MoeWindowLayout wl = moe_window_layout(d.R, d.E, d.K, d.H, d.M);
  const MoeWorkspaceLayout ws = moe_workspace_layout(d.R, d.E, d.K, d.M);
  uint8_t* ownWin = (uint8_t*)peerBases[d.rank];
  const int* slotsFrom = (const int*)(workspace + ws.slotsFrom);
  // Prologue, one round trip: thread s < R reads the call counter, how many slots s sent here, and
  // waits until s's call n - 2 has read buffer n % 2; block 0 tells every rank that our call n - 1
  // has read its values (it is complete).
  if (tid < d.R) {
    const uint64_t n = state[MOE_STATE_SEQ_ROW_VALUES + b] + 1;
    if (tid == 0) sharedSeq = n;
    const int S = slotsFrom[tid];
    sharedSlots[tid] = S < 0 ? 0 : (S > d.M ? d.M : S);
    if (b == 0) gin_st_relaxed_sys((uint64_t*)((uint8_t*)peerBases[tid] + wl.valConsumed) + d.rank, n - 1);
    if (n >= 2) (void)gin_wait_geq((const uint64_t*)(ownWin + wl.valConsumed) + tid, n - 2, errorFlags);
  }
  __syncthreads();
  const uint64_t seq = sharedSeq, tag = seq << 32;
  const uint64_t perRank = (uint64_t)d.M * (uint64_t)d.K, parity = seq & 1ull;

  // Expert side. kRowValuesBatch items per thread in flight: each loop's loads all issued before
  // its stores (the LL stores are asm volatile with a memory clobber, which the compiler does not
  // move loads across: one item at a time was two dependent round trips per item).
  const int* slotRows = (const int*)(workspace + ws.slotRows);
  const uint64_t capacity = moe_recv_capacity_rows(d.R, d.E, d.K, d.M, d.A);
  for (int s = 0; s < d.R; ++s) {
    const int S = sharedSlots[s];
    const uint64_t end = (uint64_t)((int64_t)(b + 1) * S / C) * (uint64_t)d.K;
    uint64_t* dst = (uint64_t*)((uint8_t*)peerBases[s] + wl.valRows) + (parity * (uint64_t)d.R + (uint64_t)d.rank) * perRank;
    const int* rows = slotRows + (uint64_t)s * perRank;
    for (uint64_t i0 = (uint64_t)((int64_t)b * S / C) * (uint64_t)d.K + (uint64_t)tid; i0 < end; i0 += kRowValuesBatch * (uint64_t)B) {
      int row[kRowValuesBatch];
      float v[kRowValuesBatch];
#pragma unroll
      for (int u = 0; u < kRowValuesBatch; ++u) {
        const uint64_t i = i0 + (uint64_t)u * B;
        row[u] = i < end ? rows[i] : -1;
      }
#pragma unroll
      for (int u = 0; u < kRowValuesBatch; ++u) {
        v[u] = 0.f;
        if (row[u] >= 0 && (uint64_t)row[u] < capacity) v[u] = rowValues[row[u]];
        else if (row[u] >= 0) gin_error_set(errorFlags, MOE_ERR_COUNTS);
      }
#pragma unroll
      for (int u = 0; u < kRowValuesBatch; ++u) {
        const uint64_t i = i0 + (uint64_t)u * B;
        if (i < end) gin_st_relaxed_sys(dst + i, tag | (uint64_t)__float_as_uint(v[u]));
      }
    }
  }

  // Token side: per item the R positions, then the R words, each group of loads in flight together;
  // only a word that has not landed yet is polled.
  const int* tokenPos = (const int*)(workspace + ws.tokenPos);
  const uint64_t* vals = (const uint64_t*)(ownWin + wl.valRows) + parity * (uint64_t)d.R * perRank;
  int t0, t1;
  token_range(d, b, t0, t1);
  if (t1 > gRows) t1 = gRows;
  for (uint64_t i = (uint64_t)t0 * d.K + tid; i < (uint64_t)(t1 > t0 ? t1 : t0) * d.K; i += (uint64_t)B) {
    const uint64_t t = i / (uint64_t)d.K, k = i - t * (uint64_t)d.K;
    float v = 0.f;
    for (int r0 = 0; r0 < d.R; r0 += kRowValuesBatch) {
      int j[kRowValuesBatch];
      uint64_t w[kRowValuesBatch];
#pragma unroll
      for (int u = 0; u < kRowValuesBatch; ++u) {
        j[u] = r0 + u < d.R ? tokenPos[t * (uint64_t)d.R + (uint64_t)(r0 + u)] : -1;
        if (j[u] >= d.M) {
          gin_error_set(errorFlags, MOE_ERR_COUNTS);
          j[u] = -1;
        }
      }
#pragma unroll
      for (int u = 0; u < kRowValuesBatch; ++u)
        w[u] = j[u] >= 0 ? gin_ld_relaxed_sys(vals + (uint64_t)(r0 + u) * perRank + (uint64_t)j[u] * d.K + k) : 0;
#pragma unroll
      for (int u = 0; u < kRowValuesBatch; ++u) {
        if (j[u] < 0) continue;
        int bits = (int)(uint32_t)w[u];
        if (ll_tag_ok(w[u], seq) ||
            ll_table_get(vals + (uint64_t)(r0 + u) * perRank + (uint64_t)j[u] * d.K + k, seq, true, errorFlags, bits))
          v += __int_as_float(bits);
      }
    }
    g[i] = v;
  }
  // The prologue's barrier: every thread of this block has read the counter.
  if (tid == 0) state[MOE_STATE_SEQ_ROW_VALUES + b] = seq;
}

#if defined(GIN4J_TRACE) && GIN_CUDA
// Trace builds only: points this code object's GIN_TRACE stamps at buf (null: none).
extern "C" cudaError_t moe_gin_trace_buffer(uint64_t* buf) {
  return cudaMemcpyToSymbol(gin_trace_buffer, &buf, sizeof(buf));
}
#endif
