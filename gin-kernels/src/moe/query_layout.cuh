// moe/query_layout.cuh - moe_query_layout, in both MoE code objects (each backend loads one).
// Included first by each entry unit: the optimizer's code for the kernels after it depends on the
// order of definitions (without it first, most of moe_gin's kernels and moe_host_layout compile
// differently; moe_host_layout takes 95 registers instead of 80).
#pragma once

#include "memory_layout.cuh"

// ================================================================================================
// moe_query_layout: out[MOE_Q_*] = window / workspace sizes and a few offsets the Java side needs.
// Grid 1, block 1.
// ================================================================================================
GIN_KERNEL void moe_query_layout(int32_t nRanks, int32_t numExperts, int32_t topK, int32_t hidden,
                                 int32_t maxTokens, int32_t numChannels, uint64_t* out) {
  if (threadIdx.x != 0 || blockIdx.x != 0 || out == nullptr) return;
  for (int i = 0; i < MOE_Q_WORDS; ++i) out[i] = 0;
  if (!moe_sizes_ok(nRanks, numExperts, topK, hidden, maxTokens)) return;  // all zero = refused
  const MoeWindowLayout w = moe_window_layout(nRanks, numExperts, topK, hidden, maxTokens);
  const MoeWorkspaceLayout s = moe_workspace_layout(nRanks, numExperts, topK, maxTokens);
  out[MOE_Q_WINDOW_BYTES] = w.totalBytes;
  out[MOE_Q_WINDOW_FLAGS_OFFSET] = w.flagsOffset;
  out[MOE_Q_WINDOW_FLAGS_BYTES] = w.flagsBytes;
  out[MOE_Q_WORKSPACE_BYTES] = s.totalBytes;
  out[MOE_Q_WORKSPACE_STATE_BYTES] = 8ull * MOE_STATE_WORDS;
  out[MOE_Q_RECV_CAPACITY_ROWS] = moe_recv_capacity_rows(nRanks, numExperts, topK, maxTokens);
  out[MOE_Q_SEND_CAPACITY_ROWS] = (uint64_t)maxTokens * (uint64_t)topK;
  out[MOE_Q_WS_EXPERT_COUNT] = s.expertCount;
  out[MOE_Q_WS_EXPERT_OFFSET] = s.expertOffset;
  out[MOE_Q_WS_ROWS_TO] = s.rowsTo;
  out[MOE_Q_WS_TOKENS_TO] = s.tokensTo;
  out[MOE_Q_WS_SLOT_IN_EXPERT] = s.slotInExpert;
  out[MOE_Q_WS_TOKEN_POS] = s.tokenPos;
  out[MOE_Q_ROW_STRIDE] = w.rowStride;
  out[MOE_Q_VERSION] = MOE_LAYOUT_VERSION;
  out[MOE_Q_TOKEN_PATH] = moe_token_path(topK, maxTokens, numChannels) ? 1 : 0;
}
