// moe/entry_points.cuh - the extern "C" entry points of the MoE code objects, declared once: the
// entry translation units (moe_gin.cu, moe_host.cu) include it, so their definitions must match,
// and a test program that links those objects launches them through these declarations.
#pragma once

#include "memory_layout.cuh"

// The model shapes with token-path entries of their own (moe/shaped_entries.cuh):
// MOE_TP_SHAPES(X) and MOE_TP_FP8_SHAPES(X) call X(R, E, K, H) once per shape. gin-kernels/build
// writes moe_shapes.h from gin-kernels/moe_shapes.list; a run-time compile writes its own.
#include "moe_shapes.h"

#define MOE_DISPATCH_PARAMS                                                                                    \
  const uint16_t *x, const int32_t *topkIdx, const float *topkWeights, int32_t numTokens, uint16_t *recvX,      \
      float *recvWeights, int32_t *recvCounts, const uint64_t *peerBases, uint8_t *workspace,                  \
      uint32_t *errorFlags, int32_t rank, int32_t nRanks, int32_t numExperts, int32_t topK, int32_t hidden,     \
      int32_t maxTokens, int32_t numChannels
#define MOE_DISPATCH_ARGS                                                                                      \
  x, topkIdx, topkWeights, numTokens, recvX, recvWeights, recvCounts, peerBases, workspace, errorFlags, rank,  \
      nRanks, numExperts, topK, hidden, maxTokens, numChannels
#define MOE_COMBINE_PARAMS                                                                                     \
  const uint16_t *expertOut, const float *recvWeights, int32_t numTokens, uint16_t *y,                         \
      const uint64_t *peerBases, uint8_t *workspace, uint32_t *errorFlags, int32_t rank, int32_t nRanks,       \
      int32_t numExperts, int32_t topK, int32_t hidden, int32_t maxTokens, int32_t numChannels
#define MOE_COMBINE_ARGS                                                                                       \
  expertOut, recvWeights, numTokens, y, peerBases, workspace, errorFlags, rank, nRanks, numExperts, topK,      \
      hidden, maxTokens, numChannels
#define MOE_DISPATCH_FP8_PARAMS MOE_DISPATCH_PARAMS, uint8_t *xq
#define MOE_DISPATCH_FP8_ARGS MOE_DISPATCH_ARGS, xq
#define MOE_HOST_PACK_PARAMS                                                                                   \
  const uint16_t *x, const int32_t *topkIdx, const float *topkWeights, int32_t numTokens, const uint8_t *workspace, \
      uint16_t *sendRows, float *sendWeights, uint32_t *errorFlags, int32_t nRanks, int32_t numExperts,         \
      int32_t topK, int32_t hidden, int32_t maxTokens

// Both objects: the window and workspace sizes (moe/query_layout.cuh).
GIN_KERNEL void moe_query_layout(int32_t nRanks, int32_t numExperts, int32_t topK, int32_t hidden, int32_t maxTokens,
                                 int32_t numChannels, uint64_t* out);

// moe_gin.cu: GPU-initiated (GIN) dispatch, combine and row values.
GIN_KERNEL void __launch_bounds__(MOE_THREADS, 1) moe_gin_dispatch(MOE_DISPATCH_PARAMS);
GIN_KERNEL void __launch_bounds__(MOE_THREADS, 1) moe_gin_combine(MOE_COMBINE_PARAMS);
GIN_KERNEL void __launch_bounds__(MOE_THREADS, 1) moe_gin_dispatch_tp(MOE_DISPATCH_PARAMS);
GIN_KERNEL void __launch_bounds__(MOE_THREADS, 1) moe_gin_combine_tp(MOE_COMBINE_PARAMS);
GIN_KERNEL void __launch_bounds__(MOE_THREADS, 1) moe_gin_dispatch_tp_r1(MOE_DISPATCH_PARAMS);
GIN_KERNEL void __launch_bounds__(MOE_THREADS, 1) moe_gin_combine_tp_r1(MOE_COMBINE_PARAMS);
#define MOE_TP_DECLARE(R, E, K, H)                                                                              \
  GIN_KERNEL void __launch_bounds__(MOE_THREADS, 1) moe_gin_dispatch_tp_r##R##_e##E##_k##K##_h##H(MOE_DISPATCH_PARAMS); \
  GIN_KERNEL void __launch_bounds__(MOE_THREADS, 1) moe_gin_combine_tp_r##R##_e##E##_k##K##_h##H(MOE_COMBINE_PARAMS);
MOE_TP_SHAPES(MOE_TP_DECLARE)
#undef MOE_TP_DECLARE
GIN_KERNEL void __launch_bounds__(MOE_THREADS, 1) moe_gin_dispatch_fp8(MOE_DISPATCH_FP8_PARAMS);
GIN_KERNEL void __launch_bounds__(MOE_THREADS, 1) moe_gin_dispatch_fp8_tp(MOE_DISPATCH_FP8_PARAMS);
GIN_KERNEL void __launch_bounds__(MOE_THREADS, 1) moe_gin_dispatch_fp8_tp_r1(MOE_DISPATCH_FP8_PARAMS);
#define MOE_TP_FP8_DECLARE(R, E, K, H) \
  GIN_KERNEL void __launch_bounds__(MOE_THREADS, 1) moe_gin_dispatch_fp8_tp_r##R##_e##E##_k##K##_h##H(MOE_DISPATCH_FP8_PARAMS);
MOE_TP_FP8_SHAPES(MOE_TP_FP8_DECLARE)
#undef MOE_TP_FP8_DECLARE
GIN_KERNEL void __launch_bounds__(MOE_THREADS, 1)
moe_gin_row_values(const float* rowValues, int32_t numTokens, float* g, const uint64_t* peerBases, uint8_t* workspace,
                   uint32_t* errorFlags, int32_t rank, int32_t nRanks, int32_t numExperts, int32_t topK, int32_t hidden,
                   int32_t maxTokens, int32_t numChannels);

// moe_host.cu: the HOST backend's local kernels (the exchanges are NCCL calls from Java) and the
// fp8 quantizer.
GIN_KERNEL void __launch_bounds__(MOE_THREADS, 1)
moe_host_layout(const int32_t* topkIdx, int32_t numTokens, uint8_t* workspace, uint32_t* errorFlags, int32_t nRanks,
                int32_t numExperts, int32_t topK, int32_t maxTokens, int32_t numChannels);
GIN_KERNEL void moe_host_pack(MOE_HOST_PACK_PARAMS);
GIN_KERNEL void moe_host_pack_fp8(MOE_HOST_PACK_PARAMS);
GIN_KERNEL void moe_host_permute(const uint16_t* recvBuf, const float* recvBufWeights, const int32_t* countMatrix,
                                 uint16_t* recvX, float* recvWeights, int32_t* recvCounts, uint32_t* errorFlags,
                                 int32_t nRanks, int32_t numExperts, int32_t topK, int32_t hidden, int32_t maxTokens);
GIN_KERNEL void moe_host_permute_fp8(const uint16_t* recvBuf, const float* recvBufWeights, const int32_t* countMatrix,
                                     uint16_t* recvX, float* recvWeights, int32_t* recvCounts, uint32_t* errorFlags,
                                     int32_t nRanks, int32_t numExperts, int32_t topK, int32_t hidden,
                                     int32_t maxTokens);
GIN_KERNEL void moe_host_unpermute(const uint16_t* expertOut, const int32_t* countMatrix, uint16_t* backBuf,
                                   uint32_t* errorFlags, int32_t nRanks, int32_t numExperts, int32_t topK,
                                   int32_t hidden, int32_t maxTokens);
GIN_KERNEL void moe_host_combine(const uint16_t* returned, const int32_t* topkIdx, const float* topkWeights,
                                 int32_t numTokens, const uint8_t* workspace, uint16_t* y, uint32_t* errorFlags,
                                 int32_t nRanks, int32_t numExperts, int32_t topK, int32_t hidden, int32_t maxTokens);
GIN_KERNEL void moe_host_row_values_in(const float* returned, const int32_t* topkIdx, int32_t numTokens,
                                       const uint8_t* workspace, float* g, uint32_t* errorFlags, int32_t nRanks,
                                       int32_t numExperts, int32_t topK, int32_t maxTokens);
GIN_KERNEL void moe_fp8_quantize(const uint16_t* x, int32_t numTokens, int32_t hidden, uint8_t* out,
                                 uint32_t* errorFlags);
