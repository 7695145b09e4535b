/* gin-kernels/abi/moe.h - the boundary between the Java library and the MoE kernels (code objects
 * moe_gin and moe_host), defined once: every kernel takes one of these structs by value, and
 * bindings/ generates the Java side from this file (dev.gin4j.bindings.moe), whose LayoutTest
 * checks every size and offset against gcc. Plain C11 with <stdint.h> only, so gcc, nvcc and
 * hipcc read it alike. Changing a struct, an error bit or the window / workspace layouts means
 * bumping MOE_ABI_VERSION (moe_query_layout reports it; MoeAllToAll refuses another).
 *
 * Sizes: T = numTokens (per call), M = maxTokens, H = hidden, K = topK, R = nRanks, E = numExperts,
 * L = E / R local experts, C = numChannels. Rows are bf16 [H] or scaled fp8 rows
 * (moe_fp8_row_bytes(H) bytes: H e4m3 bytes, then one f32 scale per 128 elements, padded to 16 bytes).
 * Grids and the meaning of each kernel's work: docs/kernels.md. */
#ifndef GIN4J_ABI_MOE_H
#define GIN4J_ABI_MOE_H

/* NVRTC / hiprtc have no C library headers: there the including kernel source (gin_device.cuh)
 * defines the fixed-width types first. */
#if !defined(__CUDACC_RTC__) && !defined(__HIPCC_RTC__)
#include <stdint.h>
#endif

/* Version of this ABI and of the window / workspace layouts it sizes. */
#define MOE_ABI_VERSION 4

/* Error bits, OR-ed into *errorFlags (bits 0-7 are the sync layer's: 1 time-out, 16 no LSA path). */
#define MOE_ERR_EXPERT_ID (1u << 8) /* topkIdx entry < -1, >= E, or repeated in a token: masked */
#define MOE_ERR_TOKENS (1u << 9)    /* numTokens < 0 or > maxTokens: clamped to [0, maxTokens] */
#define MOE_ERR_CONFIG (1u << 10)   /* launch geometry / sizes outside the limits: nothing done */
#define MOE_ERR_COUNTS (1u << 11)   /* received counts or row indices inconsistent: rows dropped */
#define MOE_ERR_EXPERT_ROWS (1u << 12) /* combine: a received row at or past expertOutRows: not read, left out of y */

/* The instance's shape, the same on every rank and every call (rank: this rank's index; the HOST
 * kernels ignore it, and hidden too where they move no rows). */
typedef struct MoeDims {
  int32_t rank;
  int32_t nRanks;
  int32_t numExperts;
  int32_t topK;
  int32_t hidden;
  int32_t maxTokens;
  int32_t numChannels;
  int32_t expertAlignment; /* rows: each local expert's block of recvX starts at a multiple of it
                            * (0 or 1: packed; at most MOE_MAX_ALIGNMENT); the rows in between are
                            * not written. The receive capacity grows by L * (alignment - 1). */
} MoeDims;

/* moe_query_layout (both code objects; grid 1, block 1): out = the sizes below, all zero when the
 * kernels refuse dims. */
typedef struct MoeLayoutInfo {
  uint64_t windowBytes;          /* GIN symmetric window per rank */
  uint64_t windowFlagsOffset;    /* its flag area (zeroed before the first call) */
  uint64_t windowFlagsBytes;
  uint64_t workspaceBytes;       /* local workspace per rank (zeroed at creation) */
  uint64_t workspaceStateBytes;
  uint64_t recvCapacityRows;     /* R * M * min(K, L) + L * (expertAlignment - 1): rows recvX holds */
  uint64_t sendCapacityRows;     /* M * K */
  uint64_t wsExpertCount;        /* workspace offsets of int32 arrays the HOST exchange reads: [E] */
  uint64_t wsExpertOffset;       /* [E + 1] */
  uint64_t wsRowsTo;             /* [R] */
  uint64_t wsTokensTo;           /* [R] */
  uint64_t wsSlotInExpert;       /* [M][K] */
  uint64_t wsTokenPos;           /* [M][R] */
  uint64_t rowStride;            /* window row stride in bytes */
  uint64_t version;              /* MOE_ABI_VERSION */
  uint64_t tokenPath;            /* 1: the instance takes the token path at numChannels */
} MoeLayoutInfo;

typedef struct MoeQueryArgs {
  MoeLayoutInfo* out;
  MoeDims dims;
} MoeQueryArgs;

/* moe_gin_dispatch and every moe_gin_dispatch* entry (fp8 ones included). */
typedef struct MoeGinDispatchArgs {
  const uint16_t* x;             /* [T] rows: bf16 [H], or for the fp8 entries fp8 rows (xq null) or bf16 (xq set) */
  const int32_t* topkIdx;        /* [T][K] expert ids, -1 = masked */
  const float* topkWeights;      /* [T][K] */
  uint16_t* recvX;               /* [recvCapacityRows] rows, expert-major */
  float* recvWeights;            /* [recvCapacityRows] */
  int32_t* recvCounts;           /* [L] rows per local expert */
  const uint64_t* peerBases;     /* [R] every rank's window, mapped here */
  uint8_t* workspace;
  uint32_t* errorFlags;
  uint8_t* xq;                   /* fp8 entries: null = x holds fp8 rows; else [M] fp8 rows of scratch, x bf16 */
  MoeDims dims;
  int32_t numTokens;
} MoeGinDispatchArgs;

/* moe_gin_combine and every moe_gin_combine* entry. */
typedef struct MoeGinCombineArgs {
  const uint16_t* expertOut;     /* bf16 [H] per received row, the dispatch's layout: [expertOutRows] */
  const float* recvWeights;      /* per received row (all 1.0: the unweighted sum) */
  uint16_t* y;                   /* [T][H] bf16 */
  const uint64_t* peerBases;
  uint8_t* workspace;
  uint32_t* errorFlags;
  MoeDims dims;
  int32_t numTokens;             /* the dispatch's T */
  int32_t expertOutRows;         /* rows expertOut holds (recvCapacityRows or fewer): none past it is read */
} MoeGinCombineArgs;

/* moe_gin_row_values: one f32 per received row back to its (token, k). */
typedef struct MoeGinRowValuesArgs {
  const float* rowValues;        /* per received row */
  float* g;                      /* [T][K] */
  const uint64_t* peerBases;
  uint8_t* workspace;
  uint32_t* errorFlags;
  MoeDims dims;
  int32_t numTokens;
} MoeGinRowValuesArgs;

/* moe_host_layout: the routing layout into the workspace. */
typedef struct MoeHostLayoutArgs {
  const int32_t* topkIdx;
  uint8_t* workspace;
  uint32_t* errorFlags;
  MoeDims dims;
  int32_t numTokens;
} MoeHostLayoutArgs;

/* moe_host_pack, moe_host_pack_fp8: token rows into send-row order, with their weights. */
typedef struct MoeHostPackArgs {
  const uint16_t* x;
  const int32_t* topkIdx;
  const float* topkWeights;
  const uint8_t* workspace;
  uint16_t* sendRows;            /* [sendCapacityRows] rows */
  float* sendWeights;
  uint32_t* errorFlags;
  MoeDims dims;
  int32_t numTokens;
} MoeHostPackArgs;

/* moe_host_permute, moe_host_permute_fp8: received rows (source-major) -> recvX (expert-major). */
typedef struct MoeHostPermuteArgs {
  const uint16_t* recvBuf;
  const float* recvBufWeights;
  const int32_t* countMatrix;    /* [R][L] rows from each source for each local expert */
  uint16_t* recvX;
  float* recvWeights;
  int32_t* recvCounts;           /* [L] */
  uint32_t* errorFlags;
  MoeDims dims;
} MoeHostPermuteArgs;

/* moe_host_unpermute: expert-major rows of dims.hidden bf16 -> backBuf (source-major). */
typedef struct MoeHostUnpermuteArgs {
  const uint16_t* expertOut;
  const int32_t* countMatrix;
  uint16_t* backBuf;
  uint32_t* errorFlags;
  MoeDims dims;
} MoeHostUnpermuteArgs;

/* moe_host_combine: y[t] = sum_k weight * returned row, fp32. */
typedef struct MoeHostCombineArgs {
  const uint16_t* returned;      /* rows in send-row order */
  const int32_t* topkIdx;
  const float* topkWeights;
  const uint8_t* workspace;
  uint16_t* y;
  uint32_t* errorFlags;
  MoeDims dims;
  int32_t numTokens;
} MoeHostCombineArgs;

/* moe_host_row_values_in: g[t][k] = returned[send row of (t, k)]. */
typedef struct MoeHostRowValuesArgs {
  const float* returned;
  const int32_t* topkIdx;
  const uint8_t* workspace;
  float* g;
  uint32_t* errorFlags;
  MoeDims dims;
  int32_t numTokens;
} MoeHostRowValuesArgs;

/* moe_fp8_quantize: bf16 [T][H] -> scaled fp8 rows (x 16-byte, out 8-byte aligned; H % 16 == 0). */
typedef struct MoeFp8QuantizeArgs {
  const uint16_t* x;
  uint8_t* out;
  uint32_t* errorFlags;
  int32_t numTokens;
  int32_t hidden;
} MoeFp8QuantizeArgs;

#endif /* GIN4J_ABI_MOE_H */
