// a2a/blocks.cuh - what every a2a.cu protocol does the same way: which (peer, chunk) a block
// serves, the byte range of its chunk, the argument checks, this call's message to the peer
// (count, offset, clamping) and the self slot's local copy.
#pragma once

#include "window_layout.cuh"

namespace gin_a2a_detail {

constexpr uint64_t kDirectGranule = 256;  // chunk boundaries on whole 128-byte lines (x2)

// Block b serves group i = b / chunks, chunk c = b % chunks, peer p = (i - rank) mod nranks.
// This pairing gives a block and its counterpart on the peer the same blockIdx (on p, group i
// maps back to r), so ranks that schedule blocks in index order make progress on matching pairs
// even if a grid were not fully resident.
GIN_DEVICE_INLINE int peer_of_group(int group, int rank, int nranks) {
  int p = (group - rank) % nranks;
  return p < 0 ? p + nranks : p;
}

GIN_DEVICE_INLINE void chunk_range(uint64_t n, int chunks, int c, uint64_t granule, uint64_t& lo,
                                   uint64_t& hi) {
  uint64_t per = (n + (uint64_t)chunks - 1) / (uint64_t)chunks;
  per = (per + granule - 1) / granule * granule;
  lo = per * (uint64_t)c;
  if (lo > n) lo = n;
  hi = lo + per;
  if (hi > n) hi = n;
}

// The self slot: bytes [lo, hi) of this rank's own message copied locally, stream-ordered against
// the rank's own readers (no flags); a2av chunk 0 also records the count.
template <bool kVarCounts, int kUnroll = GIN_COPY_UNROLL>
GIN_DEVICE_INLINE void copy_self(const uint64_t* peerBases, int rank, const uint8_t* send, uint64_t srcOffset,
                                 uint64_t count, uint64_t lo, uint64_t hi, uint64_t recvOffset, uint64_t slotBytes,
                                 uint64_t recvCountsOffset, int c, uint32_t tid, uint32_t nthreads) {
  uint8_t* ownWin = (uint8_t*)peerBases[rank];
  gin_copy_bytes<kUnroll>(ownWin + recvOffset + (uint64_t)rank * slotBytes + lo, send + srcOffset + lo, hi - lo, tid,
                          nthreads);
  if (kVarCounts && c == 0 && tid == 0) ((uint64_t*)(ownWin + recvCountsOffset))[rank] = count;
}

// Checks shared by every entry point. All blocks reach the same verdict (arguments are uniform);
// block 0 reports it.
GIN_DEVICE_INLINE bool args_ok(const uint64_t* peerBases, const uint64_t* seqState, int rank, int nranks,
                               int chunks, int maxChunks, uint32_t* errorFlags) {
  bool ok = peerBases != nullptr && seqState != nullptr && nranks >= 1 && rank >= 0 && rank < nranks &&
            chunks >= 1 && maxChunks >= chunks && (uint64_t)gridDim.x == (uint64_t)nranks * (uint64_t)chunks &&
            gridDim.y == 1 && gridDim.z == 1 && blockDim.y == 1 && blockDim.z == 1;
  if (!ok && blockIdx.x == 0 && threadIdx.x == 0) gin_error_set(errorFlags, GIN_ERR_BAD_ARGS);
  return ok;
}

// This call's message to peer p: its byte count and where it starts in `send`, clamped to
// `capacity` (a2av: also to the send buffer); chunk 0's thread 0 reports any clamping. Returns
// false for a uniform call of 0 bytes, which every rank skips without advancing a sequence.
template <bool kVarCounts>
GIN_DEVICE_INLINE bool resolve_message(const uint64_t* sendCounts, const uint64_t* sendOffsets, uint64_t sendBytes,
                                       uint64_t bytesPerPeer, int p, uint64_t capacity, int c, uint32_t tid,
                                       uint32_t* errorFlags, uint64_t& count, uint64_t& srcOffset) {
  if (kVarCounts) {
    uint32_t err = gin_resolve_count(sendCounts, sendOffsets, p, sendBytes, capacity, count, srcOffset);
    if (err && c == 0 && tid == 0) gin_error_set(errorFlags, err);
    return true;
  }
  if (bytesPerPeer == 0) return false;
  count = bytesPerPeer;
  srcOffset = (uint64_t)p * bytesPerPeer;
  if (count > capacity) {
    count = capacity;
    if (c == 0 && tid == 0) gin_error_set(errorFlags, GIN_ERR_COUNT_CLAMPED);
  }
  return true;
}

}  // namespace gin_a2a_detail
