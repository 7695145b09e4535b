// a2a/direct.cuh - the direct protocol (gin_a2a, gin_a2av): each block stores its chunk straight
// into the peer's receive slot between a ready handshake and a done flag.
#pragma once

#include "blocks.cuh"

namespace gin_a2a_detail {

// ----------------------------------------------------------------------------------------------
// Remote copy policies of the direct protocol (the `RemoteCopy` parameter of a2a_direct). The
// library kernels use VectorCopy; the others are timing candidates (a2a/direct_copy_candidates.cuh)
// instantiated only by test/a2a_test.cu (docs/kernels.md, "Design choices and what they rest on").
// Every policy is called by all threads of the block with identical arguments, copies n bytes for
// any size and alignment, and returns only when every store it issued on behalf of thread 0 is
// complete and ordered for thread 0's later generic-proxy release (the caller then does
// __syncthreads + st.release.sys).
// ----------------------------------------------------------------------------------------------
template <int kUnroll>
struct VectorCopy {
  static GIN_DEVICE_INLINE void copy(uint8_t* dst, const uint8_t* src, uint64_t n, uint32_t tid, uint32_t nthreads) {
    gin_copy_bytes<kUnroll>(dst, src, n, tid, nthreads);
  }
};

// ----------------------------------------------------------------------------------------------
// Direct protocol (gin_a2a / gin_a2av). Per block (peer p, chunk c), on rank r, call seq s:
//   1. thread 0: ready[r][c] := s in p's window (release), wait ready[p][c] >= s in own window.
//      p raises it at the start of its own call s, i.e. after p's stream has finished everything
//      enqueued before, including every read of the results of its previous calls: from then on
//      writing into p's receive slot for r cannot disturb a reader (write-after-read).
//   2. all threads: copy chunk c of the bytes for p into p's receive slot for r.
//   3. __syncthreads, thread 0: done[r][c] := s in p's window (release; cumulative over the
//      barrier, so it orders every thread's data stores), then wait done[p][c] >= s in own window
//      (acquire): chunk c of p's data for r has landed. When all blocks exit, all data landed.
// Counters seqState[p][c] are touched by exactly one block per call; ranks run the same calls
// with the same chunksPerPeer, so s is equal on both sides of a pair.
// ----------------------------------------------------------------------------------------------
// kUnroll: 16-byte loads in flight per thread in the copies (the test times other values).
// RemoteCopy: how a chunk travels to a peer (VectorCopy for the library; the test times others).
// kSelfDiv: the self slot is copied by max(1, chunks / kSelfDiv) of its group's blocks (1 for the
// library); 0 skips the self copy (a test-only diagnostic of the pure NVLink time).
template <bool kVarCounts, int kUnroll = GIN_COPY_UNROLL, class RemoteCopy = VectorCopy<kUnroll>, int kSelfDiv = 1>
GIN_DEVICE_INLINE void a2a_direct(const uint8_t* send, uint64_t sendBytes, uint64_t bytesPerPeer,
                                  const uint64_t* sendCounts, const uint64_t* sendOffsets,
                                  const uint64_t* peerBases, uint64_t recvOffset, uint64_t slotBytes,
                                  uint64_t recvCountsOffset, uint64_t signalOffset, uint64_t* seqState,
                                  int rank, int nranks, int chunks, int maxChunks, uint32_t* errorFlags) {
  __shared__ uint64_t sharedSeq;
  __shared__ int sharedOk;
  if (!args_ok(peerBases, seqState, rank, nranks, chunks, maxChunks, errorFlags)) return;
  const uint32_t tid = threadIdx.x, nthreads = blockDim.x;
  const int c = (int)(blockIdx.x % (uint32_t)chunks);
  const int p = peer_of_group((int)(blockIdx.x / (uint32_t)chunks), rank, nranks);

  uint64_t count, srcOffset;
  if (!resolve_message<kVarCounts>(sendCounts, sendOffsets, sendBytes, bytesPerPeer, p, slotBytes, c, tid, errorFlags,
                                   count, srcOffset))
    return;
  uint64_t lo, hi;
  chunk_range(count, chunks, c, kDirectGranule, lo, hi);

  uint8_t* ownWin = (uint8_t*)peerBases[rank];
  if (p == rank) {
    // Self slot: a local copy, stream-ordered against this rank's own readers; no flags.
    if (kSelfDiv != 1) {
      const int selfBlocks = kSelfDiv == 0 ? 0 : (chunks / kSelfDiv > 1 ? chunks / kSelfDiv : 1);
      if (c >= selfBlocks) return;
      chunk_range(count, selfBlocks, c, kDirectGranule, lo, hi);
    }
    copy_self<kVarCounts, kUnroll>(peerBases, rank, send, srcOffset, count, lo, hi, recvOffset, slotBytes,
                                   recvCountsOffset, c, tid, nthreads);
    return;
  }
  // Uniform sizes are known to both sides: an empty chunk is skipped by both, so its counters
  // stay equal. (a2av cannot skip: the receiver does not know the sender's count.)
  if (!kVarCounts && hi == lo) return;

  // Thread 0 loads its counter together with the peer address (independent loads).
  uint64_t* seq = seqState + (uint64_t)p * maxChunks + c;
  const uint64_t seqBefore = tid == 0 ? *seq : 0;
  uint8_t* peerWin = (uint8_t*)peerBases[p];
  if (peerWin == nullptr) {
    // GIN PATH HOOK: a peer outside this rank's load/store team has no mapping here. Its
    // exchange belongs to the network path (ncclGin put + signal per peer, compiled in an
    // nccl_*.cu object against the NCCL device headers); this LSA-only kernel reports it.
    if (c == 0 && tid == 0) gin_error_set(errorFlags, GIN_ERR_NO_LSA_PATH);
    return;
  }
  uint64_t* ownSig = (uint64_t*)(ownWin + signalOffset);
  uint64_t* peerSig = (uint64_t*)(peerWin + signalOffset);
  const uint64_t readyBase = 0, doneBase = (uint64_t)nranks * (uint64_t)maxChunks;
  const uint64_t mine = (uint64_t)rank * maxChunks + c, theirs = (uint64_t)p * maxChunks + c;

  if (tid == 0) {
    const uint64_t s = seqBefore + 1;
    *seq = s;
    gin_st_release_sys(peerSig + readyBase + mine, s);
    sharedOk = gin_wait_geq_acquire_polls(ownSig + readyBase + theirs, s, errorFlags);
    sharedSeq = s;
  }
  __syncthreads();
  if (!sharedOk) return;  // timed out: never write into a slot the peer may still be reading
  const uint64_t s = sharedSeq;

  RemoteCopy::copy(peerWin + recvOffset + (uint64_t)rank * slotBytes + lo, send + srcOffset + lo, hi - lo, tid,
                   nthreads);
  if (kVarCounts && c == 0 && tid == 0) ((uint64_t*)(peerWin + recvCountsOffset))[rank] = count;
  __syncthreads();
  if (tid == 0) {
    gin_st_release_sys(peerSig + doneBase + mine, s);
    (void)gin_wait_geq_acquire_polls(ownSig + doneBase + theirs, s, errorFlags);
  }
}

}  // namespace gin_a2a_detail
