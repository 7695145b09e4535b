/* moe_net.h - the argument structs of the cross-node MoE kernels (src/nccl_gin_moe.cu), shared by
 * the kernels and the Java side (dev.gin4j.moe.MoeNetwork, through the classes bindings/moe_net.args
 * generates into dev.gin4j.bindings.moenet): the one definition of that boundary.
 * Plain C11, <stdint.h> only. Every kernel takes its struct by value (after the ncclDevComm).
 * Two modes: low-latency (moe_net_dispatch / moe_net_combine: one row per (token, destination
 * rank), straight to that rank) and high-throughput (moe_net_dispatch_ht / moe_net_combine_ht: one
 * row per (token, destination node) to the node's entry rank, which forwards it inside its node;
 * the combine reduces inside the node first). Both share the sections below; the HT mode adds the
 * MoeNetForward regions and its own flags and signals.
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

#define MOE_NET_ABI_VERSION 7
#define MOE_NET_THREADS 512        /* blockDim.x of every moe_net kernel */
#define MOE_NET_MAX_LOCAL_EXPERTS 1024
#define MOE_NET_MAX_BLOCKS 256     /* grid limit: the call counters have 256 slots */
#define MOE_NET_MAX_RANKS 16       /* the MoE kernels' rank limit (MOE_MAX_RANKS) */
#define MOE_NET_MODE_LL 0          /* low-latency: a row per (token, destination rank) */
#define MOE_NET_MODE_HT 1          /* high-throughput: a row per (token, destination node), forwarded inside it */
/* Which roles a launch runs (the phase field of the dispatch and combine arguments). SEND runs the
 * sending roles of a new call and returns once the network has read their bytes; the COMPLETE
 * launch after it on the same stream runs the call's other roles (wait, forward, place or reduce). */
#define MOE_NET_PHASE_ALL 0
#define MOE_NET_PHASE_SEND 1
#define MOE_NET_PHASE_COMPLETE 2

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
  int32_t expertAlignment; /* rows, 1..MOE_MAX_ALIGNMENT: each local expert's block of recvX starts at
                            * a multiple of it (MoeDims.expertAlignment); the rows between are not written */
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

/* Which ranks form a node, the same on every rank (computed on the host). Node D's ranks are
 * nodeRank[nodeStart[D] .. nodeStart[D] + nodeSize[D]), in rank order; rank r is the
 * localOf[r]-th of node nodeOf[r]. The entry rank of node D for a sender s of another node is the
 * rank of D with local index localOf[s] % nodeSize[D]; it serves s in its slot
 * nodeOf[s] * slotsPerNode + localOf[s] / nodeSize[D]. */
typedef struct MoeNetTopology {
  int32_t nodes;         /* N */
  int32_t slotsPerNode;  /* F = max over node pairs (S, D) of ceil(nodeSize[S] / nodeSize[D]): 1 for equal nodes */
  int32_t maxNodeSize;   /* G = the largest nodeSize */
  int32_t reserved;
  int32_t nodeOf[MOE_NET_MAX_RANKS];
  int32_t localOf[MOE_NET_MAX_RANKS];
  int32_t nodeStart[MOE_NET_MAX_RANKS];
  int32_t nodeSize[MOE_NET_MAX_RANKS];
  int32_t nodeRank[MOE_NET_MAX_RANKS];
} MoeNetTopology;

/* The high-throughput mode's regions (all zero and unused by the low-latency kernels). S = N * F
 * slots per entry rank, G = maxNodeSize.
 *  node      dispatch, sender -> entry: receive sections [2][S] at the entry, staging [2][N] at the
 *            sender (by destination node); flags and signals [2][S][chunks] by slot and sender
 *            chunk (a forwarder waits for the chunks it needs only). A node section:
 *            header (uint64 tokens, int32 count[G][L]: per rank of the node, rows per local expert)
 *            at 0, token u's metadata (int32 expert[K]: global id if on this node else -1, int32
 *            slotInExpert[K], float weight[K]) at metaOffset + 12K u, its row at rowsOffset +
 *            rowBytes u. Tokens in token order.
 *  fwdStage  dispatch, entry -> node peer outside the LSA team: forwarded sections staged [2][S][G]
 *            of the dispatch's sectionBytes (fwdStageSlots = 0: every node peer is in the LSA
 *            team, nothing is staged). Forwarded sections land in the low-latency receive
 *            sections [parity][source] of the node peer; they have their format, byte for byte.
 *  part      combine, expert rank -> entry: receive sections [2][S][G] (row i of peer q's partials
 *            for slot sigma: bf16 [H] at i * 2H), staged at the expert rank in its combine staging
 *            section [parity][source]; flags and signals [2][S][G][chunks] by slot, peer and
 *            the peer's chunk (an entry reduces the node rows whose partials are there only).
 *  scratch   local words (never read by a peer): fwdCount int32 [S][1 + G + G chunks] (tokens of
 *            each slot's node section, the rows forwarded to each node peer, and per peer and
 *            chunk the position its forwarded rows start at), fwdPos int32 [S][M][G] (entry row u's position in node peer q's forwarded
 *            section, -1: not there), nodePos int32 [M][N] (token t's row in the node section to
 *            node D, -1: none), and the call counters uint64 [2 exchanges][256 slots][4].
 * The node partials (entry -> source) use the combine's sections [parity][entry] (an entry is on
 * another node, so its low-latency section is otherwise unused in this mode). */
typedef struct MoeNetForward {
  MoeNetSections node;
  MoeNetSections part;
  uint64_t fwdStageOffset;
  uint64_t fwdStageSlots;   /* S * G * 2 sections, or 0 */
  uint64_t fwdCountOffset;
  uint64_t fwdPosOffset;
  uint64_t nodePosOffset;
  uint64_t countersOffset;  /* both modes: uint64 [2][256][4] */
  uint64_t htFlagOffset;    /* the HT final flags: dispatch [2][R], then combine [2][R] */
  int32_t htSignalBase;     /* the HT final signals: dispatch [2][R], then combine [2][R] */
  int32_t reserved;
} MoeNetForward;

/* moe_net_dispatch: after moe_host_layout on the same workspace and stream. */
typedef struct MoeNetDispatchArgs {
  uint64_t window;            /* ncclWindow_t of the instance's window */
  MoeNetDims dims;
  MoeNetSections net;
  MoeNetTopology topo;
  MoeNetForward fwd;
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
  int32_t phase;              /* MOE_NET_PHASE_*: the whole call, or its send or complete half */
} MoeNetDispatchArgs;

/* moe_net_combine: the inverse exchange of the last dispatch on this workspace. With rowValues set
 * it returns one f32 per received row instead (MoeAllToAll.returnRowValues): the same exchange,
 * sections and signals, each partial a [K] f32 row (value of slot k's row here, else 0) in place
 * of the [H] bf16 row, so 4K <= 2H bytes; tokenValues[t][k] = the OR of the writers' words: the
 * bits of the one value made for (t, k), unchanged, or 0 for a masked slot. expertOut, weights
 * and y are not read. */
typedef struct MoeNetCombineArgs {
  uint64_t window;
  MoeNetDims dims;
  MoeNetSections net;
  MoeNetTopology topo;
  MoeNetForward fwd;
  const uint16_t* expertOut;  /* [expertOutRows][H] bf16, rows aligned with recvX */
  const float* weights;       /* [expertOutRows] per-row weights (the dispatch's recvWeights), null = unweighted */
  uint16_t* y;                /* [T][H] bf16 (out) */
  uint8_t* workspace;
  uint32_t* errorFlags;
  uint64_t expertOutRows;     /* rows expertOut holds; a received row at or past it sets MOE_ERR_COUNTS and is not read */
  int32_t numTokens;          /* T of the last dispatch */
  int32_t phase;              /* MOE_NET_PHASE_* */
  const float* rowValues;     /* [expertOutRows] f32 per received row: null = a combine, else the row values call */
  float* tokenValues;         /* [T][K] f32 (out) of the row values call */
} MoeNetCombineArgs;

/* moe_net_reset: zeroes the instance's GIN signals (NCCL's signal pool is not zeroed). */
typedef struct MoeNetResetArgs {
  int32_t signalBase;   /* first signal (the dispatch's base; the combine's and the HT mode's follow) */
  int32_t signalCount;  /* every signal of the instance */
  uint32_t* errorFlags;
} MoeNetResetArgs;

#endif
