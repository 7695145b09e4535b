/* moe_net.h - the argument structs of the cross-node MoE kernels (src/nccl_gin_moe.cu), shared by
 * the kernels and the Java side (dev.gin4j.moe.MoeNetwork): the one definition of that boundary.
 * Plain C11, <stdint.h> only. Every kernel takes its struct by value (after the ncclDevComm).
 *
 * Window layout (one symmetric window per rank, offsets the same on every rank, chosen by Java):
 *   dispatch receive sections [2][R] and staging sections [2][R] of dispatchSection bytes,
 *   combine receive sections [2][R] and staging sections [2][R] of combineSection bytes,
 *   LSA flags [2 exchanges][2 parities][R] uint64.
 * Section of call n for (writer w, reader r): parity n % 2; the reader's receive section [n % 2][w];
 * a GIN writer first stages it in its own staging section [n % 2][r] and puts it from there.
 * A dispatch section: header (uint64 tokens, int32 count[L]) at 0, metadata of slot i at
 * metaOffset + i * 12K (int32 localExpert[K], int32 slotInExpert[K], float weight[K]), row i at
 * rowsOffset + i * rowBytes. A combine section: partial row i (bf16 [hidden]) at i * 2 * hidden.
 */
#ifndef GIN4J_ABI_MOE_NET_H
#define GIN4J_ABI_MOE_NET_H
#include <stdint.h>

#define MOE_NET_ABI_VERSION 1
#define MOE_NET_THREADS 512        /* blockDim.x of every moe_net kernel */
#define MOE_NET_MAX_LOCAL_EXPERTS 1024
#define MOE_NET_MAX_BLOCKS 256     /* grid limit: one call counter per block in the MoE workspace */

/* Sizes of the instance, the same on every rank and call. */
typedef struct MoeNetDims {
  int32_t rank;        /* this rank in the communicator */
  int32_t nRanks;      /* R */
  int32_t numExperts;  /* E, a multiple of R; L = E / R local experts */
  int32_t topK;        /* K */
  int32_t hidden;      /* H, bf16 elements of an expert output row */
  int32_t maxTokens;   /* M, tokens per rank and call at most */
  int32_t rowBytes;    /* bytes of a dispatched row: 2H (bf16) or moe_fp8_row_bytes(H) (scaled fp8) */
  int32_t chunks;      /* blocks per peer in each role; grid = 2 * R * chunks */
} MoeNetDims;

/* Where one exchange (dispatch or combine) lives in the window, and its GIN signals. */
typedef struct MoeNetSections {
  uint64_t recvOffset;    /* window offset of receive sections [2][R] */
  uint64_t stageOffset;   /* window offset of staging sections [2][R] */
  uint64_t sectionBytes;  /* bytes per section (a multiple of 256) */
  uint64_t metaOffset;    /* dispatch: slot metadata inside a section (0 for the combine) */
  uint64_t rowsOffset;    /* dispatch: rows inside a section (0 for the combine) */
  uint64_t flagOffset;    /* window offset of this exchange's LSA flags [2][R] uint64 */
  int32_t signalBase;     /* first of this exchange's 2R GIN signals: [parity][source] */
  int32_t reserved;
} MoeNetSections;

/* moe_net_dispatch: after moe_host_layout on the same workspace and stream. */
typedef struct MoeNetDispatchArgs {
  uint64_t window;            /* ncclWindow_t of the instance's window */
  MoeNetDims dims;
  MoeNetSections net;
  const void* x;              /* [T][rowBytes] rows */
  const int32_t* topkIdx;     /* [T][K] expert ids, -1 = masked */
  const float* topkWeights;   /* [T][K] */
  void* recvX;                /* [capacityRows][rowBytes] expert-major rows (out) */
  float* recvWeights;         /* [capacityRows] (out) */
  int32_t* recvCounts;        /* [L] rows per local expert (out) */
  uint8_t* workspace;         /* the MoE workspace (moe_workspace_layout): routing of this call, slot rows for the combine */
  uint32_t* errorFlags;       /* gin_sync / MoE error bits */
  uint64_t capacityRows;      /* rows recvX and recvWeights hold */
  int32_t numTokens;          /* T of this call, 0..M; must equal the layout's */
  int32_t reserved;
} MoeNetDispatchArgs;

/* moe_net_combine: the inverse exchange of the last dispatch on this workspace. */
typedef struct MoeNetCombineArgs {
  uint64_t window;
  MoeNetDims dims;
  MoeNetSections net;
  const uint16_t* expertOut;  /* [expertOutRows][H] bf16, rows aligned with recvX */
  const float* weights;       /* [expertOutRows] per-row weights (the dispatch's recvWeights), null = unweighted */
  uint16_t* y;                /* [T][H] bf16 (out) */
  uint8_t* workspace;
  uint32_t* errorFlags;
  uint64_t expertOutRows;     /* rows expertOut holds; a received row at or past it sets MOE_ERR_COUNTS and is not read */
  int32_t numTokens;          /* T of the last dispatch */
  int32_t reserved;
} MoeNetCombineArgs;

/* moe_net_reset: zeroes the instance's 4R GIN signals (NCCL's signal pool is not zeroed). */
typedef struct MoeNetResetArgs {
  int32_t signalBase;   /* first signal (the dispatch's base; the combine's follow) */
  int32_t signalCount;  /* 4R */
  uint32_t* errorFlags;
} MoeNetResetArgs;

#endif
