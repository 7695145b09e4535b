/* gin-kernels/abi/a2a.h - the boundary between the Java library and the all-to-all kernels (code
 * objects a2a, nccl_gin_a2a and nccl_peers), defined once: every kernel takes one of these structs
 * by value (after the ncclDevComm where it has one), and bindings/ generates the Java side from
 * this file (dev.gin4j.bindings.a2a), whose LayoutTest checks every size and offset against gcc.
 * Plain C11 with <stdint.h> only, so gcc, nvcc and hipcc read it alike. Changing a struct means
 * bumping GIN_A2A_ABI_VERSION.
 *
 * Window offsets are bytes from the start of every rank's symmetric window (the same on every
 * rank; the offsets ncclGetLsaPointer and GIN puts take, not relative to a peerBases entry);
 * R = nranks. send, sendCounts, sendOffsets, peerBases, seqState and errorFlags are local device
 * memory (need not be in the window); errorFlags points at one device word, or is null. Every rank
 * passes the same sizes, offsets, chunksPerPeer and maxChunksPerPeer. Window layout, grids, signals
 * and error bits: docs/kernels.md, "a2a.cu" and "nccl_gin_a2a.cu". */
#ifndef GIN4J_ABI_A2A_H
#define GIN4J_ABI_A2A_H

#include <stdint.h>

/* Version of this ABI. */
#define GIN_A2A_ABI_VERSION 1

/* gin_a2a: the direct protocol, bytesPerPeer to every peer. */
typedef struct GinA2aArgs {
  const uint8_t* send;           /* bytes for peer p at send + p * bytesPerPeer; any address and alignment */
  uint64_t bytesPerPeer;         /* any count, 0 and odd ones included; the same on every rank */
  const uint64_t* peerBases;     /* [R] every rank's window as mapped in this process; [rank] = own (PeerTable) */
  uint64_t recvOffset;           /* the message from source s lands at recvOffset + s * slotBytes */
  uint64_t slotBytes;            /* receive slot per source: messages are clamped to it */
  uint64_t signalOffset;         /* ready[R][maxChunksPerPeer] then done[R][maxChunksPerPeer], uint64; 8-byte aligned */
  uint64_t* seqState;            /* [R][maxChunksPerPeer] uint64 call counters, zeroed once; the direct protocol's own */
  int32_t rank;
  int32_t nranks;
  int32_t chunksPerPeer;         /* grid = nranks * chunksPerPeer blocks */
  int32_t maxChunksPerPeer;      /* the signal area's and seqState's chunk dimension, the same for every call */
  uint32_t* errorFlags;
} GinA2aArgs;

/* gin_a2av: the direct protocol with per-peer byte counts and offsets read on the device. */
typedef struct GinA2avArgs {
  const uint8_t* send;
  uint64_t sendBytes;            /* bytes readable at send: every message is clamped to it */
  const uint64_t* sendCounts;    /* [R] bytes for each peer (device memory) */
  const uint64_t* sendOffsets;   /* [R] byte offset in send of each peer's bytes (any alignment, any order) */
  const uint64_t* peerBases;
  uint64_t recvOffset;
  uint64_t slotBytes;
  uint64_t recvCountsOffset;     /* recvCounts[R], uint64 received byte counts; 8-byte aligned */
  uint64_t signalOffset;
  uint64_t* seqState;
  int32_t rank;
  int32_t nranks;
  int32_t chunksPerPeer;
  int32_t maxChunksPerPeer;
  uint32_t* errorFlags;
} GinA2avArgs;

/* gin_a2a_ll (LL) and gin_a2a_ll128 (LL128): the staged protocols, bytesPerPeer to every peer. */
typedef struct GinA2aStagedArgs {
  const uint8_t* send;
  uint64_t bytesPerPeer;
  const uint64_t* peerBases;
  uint64_t recvOffset;
  uint64_t slotBytes;
  uint64_t stagingOffset;        /* the protocol's staging area: LL 16-byte, LL128 128-byte aligned */
  uint64_t stagingCapacity;      /* payload bytes per (source, parity) the staging holds: LL < 2^32, LL128 <= 2^44 */
  uint64_t* seqState;            /* this protocol's own counters, [R][maxChunksPerPeer], zeroed once (not the direct array) */
  int32_t rank;
  int32_t nranks;
  int32_t chunksPerPeer;
  int32_t maxChunksPerPeer;
  uint32_t* errorFlags;
} GinA2aStagedArgs;

/* gin_a2av_ll and gin_a2av_ll128: the staged protocols with per-peer counts. */
typedef struct GinA2avStagedArgs {
  const uint8_t* send;
  uint64_t sendBytes;
  const uint64_t* sendCounts;
  const uint64_t* sendOffsets;
  const uint64_t* peerBases;
  uint64_t recvOffset;
  uint64_t slotBytes;
  uint64_t recvCountsOffset;
  uint64_t stagingOffset;
  uint64_t stagingCapacity;
  uint64_t* seqState;
  int32_t rank;
  int32_t nranks;
  int32_t chunksPerPeer;
  int32_t maxChunksPerPeer;
  uint32_t* errorFlags;
} GinA2avStagedArgs;

/* gin_a2a_ce_ready, gin_a2a_ce_done: the copy-engine variant's handshakes (one block, a thread per
 * peer), on the direct protocol's chunk-0 signals and counters. */
typedef struct GinA2aCeSignalArgs {
  const uint64_t* peerBases;
  uint64_t signalOffset;
  uint64_t* seqState;
  int32_t rank;
  int32_t nranks;
  int32_t maxChunksPerPeer;
  uint32_t* errorFlags;
} GinA2aCeSignalArgs;

/* gin_a2a_ce_self: the copy-engine variant's self slot, by SMs. */
typedef struct GinA2aCeSelfArgs {
  const uint8_t* send;
  uint64_t bytesPerPeer;
  const uint64_t* peerBases;
  uint64_t recvOffset;
  uint64_t slotBytes;
  int32_t rank;
} GinA2aCeSelfArgs;

/* gin_a2a_hybrid, after the ncclDevComm: LSA stores to the peers of this rank's LSA team, ncclGin
 * puts with signals to the others. */
typedef struct GinA2aHybridArgs {
  void* window;                  /* ncclWindow_t of the symmetric window (ncclCommWindowRegister, NCCL_WIN_COLL_SYMMETRIC) */
  const uint8_t* send;           /* as GinA2aArgs.send; may be null when bytesPerPeer == 0 */
  uint64_t bytesPerPeer;
  uint64_t recvOffset;
  uint64_t slotBytes;            /* one receive slot and one staging region */
  uint64_t stagingOffset;        /* [R] regions of send staging (only the GIN peers' are used) */
  uint64_t lsaSignalOffset;      /* ready/done flags of the LSA peers, laid out as GinA2aArgs.signalOffset; 8-byte aligned */
  int32_t ginSignalBase;         /* first of the 2 * R * maxChunksPerPeer GIN signals this kernel owns (>= 0) */
  uint64_t* seqState;            /* zeroed by gin_a2a_hybrid_reset */
  int32_t rank;                  /* rank and nranks must equal devComm.rank / devComm.nRanks (world ranks) */
  int32_t nranks;
  int32_t chunksPerPeer;
  int32_t maxChunksPerPeer;
  uint32_t* errorFlags;
} GinA2aHybridArgs;

/* gin_a2av_hybrid, after the ncclDevComm: the same with per-peer counts. */
typedef struct GinA2avHybridArgs {
  void* window;                  /* ncclWindow_t */
  const uint8_t* send;
  uint64_t sendBytes;
  const uint64_t* sendCounts;
  const uint64_t* sendOffsets;
  uint64_t recvOffset;
  uint64_t slotBytes;
  uint64_t recvCountsOffset;
  uint64_t stagingOffset;
  uint64_t countStagingOffset;   /* [R] uint64 counts staged for the GIN peers; 8-byte aligned */
  uint64_t lsaSignalOffset;
  int32_t ginSignalBase;
  uint64_t* seqState;
  int32_t rank;
  int32_t nranks;
  int32_t chunksPerPeer;
  int32_t maxChunksPerPeer;
  uint32_t* errorFlags;
} GinA2avHybridArgs;

/* gin_a2a_hybrid_reset, after the ncclDevComm: zeroes seqState, the own LSA flags and the GIN signals. */
typedef struct GinA2aHybridResetArgs {
  void* window;                  /* ncclWindow_t */
  uint64_t lsaSignalOffset;      /* the LSA flag area to zero (own window) */
  int32_t ginSignalBase;         /* the GIN signals to reset (context 0) */
  uint64_t* seqState;            /* zeroed: R * maxChunksPerPeer entries */
  int32_t nranks;
  int32_t maxChunksPerPeer;
  uint32_t* errorFlags;
} GinA2aHybridResetArgs;

/* gin_resolve_peers (nccl_peers), after the ncclDevComm: peerBases[p] = rank p's window +
 * windowOffset as mapped here, 0 where p is outside this rank's LSA team. */
typedef struct GinResolvePeersArgs {
  void* window;                  /* ncclWindow_t */
  uint64_t windowOffset;         /* byte offset inside the window */
  uint64_t* peerBases;           /* [nranks] entries, written */
  int32_t nranks;                /* entries in peerBases; should equal devComm's nRanks */
  uint32_t* errorFlags;          /* GIN_PEERS_ERR_NRANKS_MISMATCH */
} GinResolvePeersArgs;

/* gin_resolve_peers: nranks differs from the device communicator's rank count. */
#define GIN_PEERS_ERR_NRANKS_MISMATCH 0x1u

#endif /* GIN4J_ABI_A2A_H */
