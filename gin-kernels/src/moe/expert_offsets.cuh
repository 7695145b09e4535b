// moe/expert_offsets.cuh - moe_expert_offsets: where each local expert's rows start in recvX, for
// a grouped GEMM. In both MoE code objects (moe_gin, moe_host), so every backend launches it from
// the code object it has, on the dispatch's stream right after the dispatch (no host sync, capturable).
//
//   offsets[e] = sum over e' < e of align_up(counts[e'], alignment),  e in [0, L]
//
// offsets[L] is the end of the last expert's block: the rows received for alignment = 1. Plain
// parameters, no ABI struct (abi/moe.h): counts int32 [L] (the dispatch's recvCounts), offsets
// int32 [L + 1], L = local experts (1..MOE_MAX_EXPERTS), alignment >= 1, errorFlags the
// instance's word. One block of any multiple of the warp size up to MOE_MAX_HOST_THREADS threads.
// A negative count (never written by a dispatch) counts as 0 and sets MOE_ERR_COUNTS.
#pragma once

#include "routing.cuh"

GIN_KERNEL void moe_expert_offsets(const int32_t* counts, int32_t* offsets, int32_t numLocalExperts, int32_t alignment,
                                   uint32_t* errorFlags) {
  __shared__ int a[MOE_MAX_EXPERTS];
  __shared__ int scanTmp[MOE_MAX_HOST_THREADS / 32];
  const int L = numLocalExperts, tid = (int)threadIdx.x, B = (int)blockDim.x;
  if (L < 1 || L > MOE_MAX_EXPERTS || alignment < 1 || counts == nullptr || offsets == nullptr || gridDim.x != 1 ||
      B % GIN_WARP_SIZE != 0 || B > MOE_MAX_HOST_THREADS) {
    if (blockIdx.x == 0 && tid == 0) gin_error_set(errorFlags, MOE_ERR_CONFIG);
    return;
  }
  for (int e = tid; e < L; e += B) {
    int c = counts[e];
    if (c < 0) {
      gin_error_set(errorFlags, MOE_ERR_COUNTS);
      c = 0;
    }
    a[e] = (int)moe_align_up((uint64_t)c, (uint64_t)alignment);  // < 2^31: counts <= R*M, alignment bounded by the host
  }
  __syncthreads();
  const int total = block_exclusive_scan(a, L, scanTmp);
  for (int e = tid; e < L; e += B) offsets[e] = a[e];
  if (tid == 0) offsets[L] = total;
}
