// moe/query_layout.cuh - moe_query_layout, in both MoE code objects (each backend loads one).
// Included first by each entry unit: the optimizer's code for the kernels after it depends on the
// order of definitions (without it first, most of moe_gin's kernels and moe_host_layout compile
// differently; moe_host_layout takes 95 registers instead of 80).
#pragma once

#include "memory_layout.cuh"

// ================================================================================================
// moe_query_layout: *a.out = the window / workspace sizes and the few offsets the Java side needs
// (MoeLayoutInfo in abi/moe.h). Grid 1, block 1.
// ================================================================================================
GIN_KERNEL void moe_query_layout(const __grid_constant__ MoeQueryArgs a) {
  MoeLayoutInfo* const out = a.out;
  if (threadIdx.x != 0 || blockIdx.x != 0 || out == nullptr) return;
  const int32_t nRanks = a.dims.nRanks, numExperts = a.dims.numExperts, topK = a.dims.topK, hidden = a.dims.hidden,
                maxTokens = a.dims.maxTokens, numChannels = a.dims.numChannels;
  MoeLayoutInfo q = {};  // all zero = refused
  const int A = moe_alignment(a.dims.expertAlignment);
  if (moe_sizes_ok(nRanks, numExperts, topK, hidden, maxTokens) && a.dims.expertAlignment <= MOE_MAX_ALIGNMENT &&
      moe_recv_capacity_rows(nRanks, numExperts, topK, maxTokens, A) < (1ull << 31)) {
    const MoeWindowLayout w = moe_window_layout(nRanks, numExperts, topK, hidden, maxTokens);
    const MoeWorkspaceLayout s = moe_workspace_layout(nRanks, numExperts, topK, maxTokens);
    q.windowBytes = w.totalBytes;
    q.windowFlagsOffset = w.flagsOffset;
    q.windowFlagsBytes = w.flagsBytes;
    q.workspaceBytes = s.totalBytes;
    q.workspaceStateBytes = 8ull * MOE_STATE_WORDS;
    q.recvCapacityRows = moe_recv_capacity_rows(nRanks, numExperts, topK, maxTokens, A);
    q.sendCapacityRows = (uint64_t)maxTokens * (uint64_t)topK;
    q.wsExpertCount = s.expertCount;
    q.wsExpertOffset = s.expertOffset;
    q.wsRowsTo = s.rowsTo;
    q.wsTokensTo = s.tokensTo;
    q.wsSlotInExpert = s.slotInExpert;
    q.wsTokenPos = s.tokenPos;
    q.rowStride = w.rowStride;
    q.version = MOE_ABI_VERSION;
    q.tokenPath = moe_token_path(topK, maxTokens, numChannels) ? 1 : 0;
  }
  *out = q;
}
