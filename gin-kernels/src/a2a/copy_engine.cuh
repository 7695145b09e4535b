// a2a/copy_engine.cuh - device helpers of the copy-engine variant of the uniform all-to-all
// (gin_a2a_ce_ready, gin_a2a_ce_done, gin_a2a_ce_self in a2a.cu): its argument check and its
// signal exchange with one peer, on the direct protocol's chunk-0 signal words.
#pragma once

#include "blocks.cuh"

namespace gin_a2a_detail {

// Grid 1, block >= nranks: one thread per peer.
GIN_DEVICE_INLINE bool ce_args_ok(const uint64_t* peerBases, const uint64_t* seqState, int rank, int nranks,
                                  int maxChunks, uint32_t* errorFlags) {
  bool ok = peerBases != nullptr && seqState != nullptr && nranks >= 1 && rank >= 0 && rank < nranks &&
            maxChunks >= 1 && gridDim.x == 1 && gridDim.y == 1 && gridDim.z == 1 && (int)blockDim.x >= nranks &&
            blockDim.y == 1 && blockDim.z == 1 && peerBases[rank] != 0;
  if (!ok && threadIdx.x == 0) gin_error_set(errorFlags, GIN_ERR_BAD_ARGS);
  return ok;
}

// The copy-engine kernels' exchange with peer p: word `base + rank * maxChunks` of p's signal area
// := s (release), then wait for word `base + p * maxChunks` of this rank's own area >= s (acquire).
GIN_DEVICE_INLINE void ce_signal_and_wait(const uint64_t* peerBases, uint64_t signalOffset, uint64_t base, int rank,
                                          int p, int maxChunks, uint64_t s, uint32_t* errorFlags) {
  uint64_t* peerSig = (uint64_t*)((uint8_t*)peerBases[p] + signalOffset);
  const uint64_t* ownSig = (const uint64_t*)((const uint8_t*)peerBases[rank] + signalOffset);
  gin_st_release_sys(peerSig + base + (uint64_t)rank * maxChunks, s);
  (void)gin_wait_geq_acquire_polls(ownSig + base + (uint64_t)p * maxChunks, s, errorFlags);
}

}  // namespace gin_a2a_detail
