// a2a/ll.cuh - the LL protocol (gin_a2a_ll, gin_a2av_ll): 8-byte words that carry their own
// sequence flag, into parity-double-buffered staging in the receiver's window; no handshake.
#pragma once

#include "blocks.cuh"

namespace gin_a2a_detail {

constexpr uint64_t kLlGranule = 64;       // 64 payload bytes = 128 staging bytes = one line
constexpr int kLlUnroll = 8;              // LL pairs in flight per thread

// ----------------------------------------------------------------------------------------------
// LL protocol (gin_a2a_ll / gin_a2av_ll). Call seq s (one counter per peer, see below) writes
// into staging half (s & 1) of the receiver's window; every 8-byte word carries 4 payload bytes
// and the 32-bit flag(s) (below), so a matching flag proves its payload arrived (single-copy
// atomic 64-bit stores). The receiver polls its own staging and unpacks into the fixed receive
// slot.
//
// Why no ready handshake (write-after-read on staging half h = s & 1 in p's window, slot r):
//   that memory was last written by r in call s-2 and read only by p's kernel of call s-2
//   (the unpack). r's kernel s starts after r's kernel s-1 ended; r's kernel s-1 could only end
//   after reading words that p's kernel s-1 wrote (every call sends at least one word per pair of
//   ranks: uniform calls with 0 bytes are skipped by all ranks without advancing s, a2av always
//   sends the count header). p's kernel s-1 started after p's kernel s-2 ended (stream order).
//   So every read of half h by p happened before r's first write of call s: the chain is
//   [p: reads in kernel s-2] -> kernel boundary -> [p: word store in s-1] -> observed by
//   [r: kernel s-1] -> kernel boundary -> [r: stores of call s]. A load that completed before its
//   kernel retired cannot observe a store issued after a later kernel observed a still later
//   store; this is the same reasoning NCCL's LL protocol uses for its credit words.
//   Flags never go stale: the receiver clears every payload pair it consumed (a local store in its
//   kernel of call s-2, ordered before r's stores of call s by the same chain), so a payload word
//   holds either 0 or the flag of the write now in flight, and flags are never 0:
//   flag(s) = (s mod (2^32-1)) + 1. The count header (pair 0) is not cleared (several blocks read
//   it) but is rewritten by every LL call, uniform or not, so it holds flag(s-2) != flag(s) or 0.
// The fixed receive slot itself is written only by its owner (unpack / self copy), so it is
// stream-ordered against the owner's readers; the output location never alternates.
//
// Counters: the parity argument needs one sequence per peer shared by all chunk blocks, yet each
// counter word may be touched by one block only. Entries seqState[p][0..maxChunks) all hold the
// call count; block c reads entry c and writes s to entries c, c+chunks, c+2*chunks, ... so every
// entry is written exactly once per call and all stay equal even when chunksPerPeer changes.
// ----------------------------------------------------------------------------------------------
GIN_DEVICE_INLINE uint64_t load_payload8(const uint8_t* src, uint64_t avail) {
  if (avail >= 8 && ((uintptr_t)src & 7u) == 0) return __ldg((const unsigned long long*)src);
  uint64_t v = 0;
  uint64_t n = avail < 8 ? avail : 8;
  for (uint64_t k = 0; k < n; ++k) v |= (uint64_t)src[k] << (8 * k);
  return v;
}

GIN_DEVICE_INLINE void store_payload8(uint8_t* dst, uint64_t v, uint64_t avail) {
  if (avail >= 8 && ((uintptr_t)dst & 7u) == 0) {
    *(uint64_t*)dst = v;
    return;
  }
  uint64_t n = avail < 8 ? avail : 8;
  for (uint64_t k = 0; k < n; ++k) dst[k] = (uint8_t)(v >> (8 * k));
}

GIN_DEVICE_INLINE uint32_t ll_flag(uint64_t seq) { return (uint32_t)(seq % 0xFFFFFFFFull) + 1u; }

// LL pairs [jlo, jhi) holding payload bytes [lo, hi) of a chunk. Chunk bounds are multiples of
// kLlGranule except where clamped to the count, so an empty chunk (lo == hi == count, maybe not a
// multiple of 8) must own no pair: the last partial pair belongs to the chunk that ends there.
GIN_DEVICE_INLINE void ll_pairs(uint64_t lo, uint64_t hi, uint64_t& jlo, uint64_t& jhi) {
  jlo = lo / 8;
  jhi = hi > lo ? (hi + 7) / 8 : jlo;
}

GIN_DEVICE_INLINE uint64_t ll_word(uint32_t flag, uint32_t payload) {
  return ((uint64_t)flag << 32) | payload;
}

GIN_DEVICE_INLINE bool ll_pair_ready(uint64_t w0, uint64_t w1, uint32_t flag) {
  return (uint32_t)(w0 >> 32) == flag && (uint32_t)(w1 >> 32) == flag;
}

// Timeout bookkeeping of the LL polls: the clock is first read after GIN_WAIT_FREE_SPINS polls
// (no globaltimer read between the first polls of a short wait, which is on the critical path),
// then every 256 polls. Returns true when the wait must give up (error bit set).
GIN_DEVICE_INLINE bool ll_poll_timed_out(uint32_t spins, uint64_t& start, uint32_t* errorFlags) {
  return gin_wait_timed_out(spins, start, errorFlags, 255u);
}

// Polls one pair until both flags match; false after the timeout (error bit set).
GIN_DEVICE_INLINE bool ll_wait_pair(const uint64_t* pair, uint32_t flag, uint64_t& w0, uint64_t& w1,
                                    uint32_t* errorFlags) {
  uint64_t start = 0;
  for (uint32_t spins = 0;; ++spins) {
    if (ll_pair_ready(w0, w1, flag)) return true;
    if (ll_poll_timed_out(spins, start, errorFlags)) return false;
    gin_ll_load_pair(pair, w0, w1);
  }
}

// Packs payload bytes [8*jlo, min(count, 8*jhi)) of src into LL pairs jlo..jhi-1 at stage.
// Loads come first and do not depend on the flag or the peer address, so the first batch overlaps
// the loads of the sequence number and of peerBases (stores happen only when `store`).
GIN_DEVICE_INLINE void ll_send(uint64_t* stagePairs, const uint8_t* src, uint64_t count, uint64_t jlo, uint64_t jhi,
                               uint32_t flag, uint32_t tid, uint32_t nthreads, bool store) {
  for (uint64_t base = jlo + tid; base < jhi; base += (uint64_t)nthreads * kLlUnroll) {
    uint64_t v[kLlUnroll];
#pragma unroll
    for (int u = 0; u < kLlUnroll; ++u) {
      uint64_t j = base + (uint64_t)u * nthreads;
      if (j < jhi) v[u] = load_payload8(src + 8 * j, count - 8 * j);
    }
#pragma unroll
    for (int u = 0; u < kLlUnroll; ++u) {
      uint64_t j = base + (uint64_t)u * nthreads;
      if (j < jhi && store)
        gin_ll_store_pair(stagePairs + 2 * j, ll_word(flag, (uint32_t)v[u]), ll_word(flag, (uint32_t)(v[u] >> 32)));
    }
  }
}

// Waits for LL pairs jlo..jhi-1 at stage, unpacks their payload (bytes < count) into dst and
// clears each consumed pair (so no old flag can ever be mistaken for a new one). Each thread keeps
// kLlUnroll pairs in flight and re-polls all still-missing pairs of its batch together, so a late
// batch costs one memory round trip per poll, not one per pair.
GIN_DEVICE_INLINE bool ll_recv(uint64_t* stagePairs, uint8_t* dst, uint64_t count, uint64_t jlo, uint64_t jhi,
                               uint32_t flag, uint32_t tid, uint32_t nthreads, uint32_t* errorFlags) {
  for (uint64_t base = jlo + tid; base < jhi; base += (uint64_t)nthreads * kLlUnroll) {
    uint64_t w0[kLlUnroll], w1[kLlUnroll];
    uint32_t pending = 0;
#pragma unroll
    for (int u = 0; u < kLlUnroll; ++u) {
      uint64_t j = base + (uint64_t)u * nthreads;
      if (j < jhi) {
        gin_ll_load_pair(stagePairs + 2 * j, w0[u], w1[u]);
        pending |= 1u << u;
      }
    }
    uint64_t start = 0;
    for (uint32_t spins = 0;; ++spins) {
#pragma unroll
      for (int u = 0; u < kLlUnroll; ++u) {
        if ((pending >> u) & 1u) {
          if (ll_pair_ready(w0[u], w1[u], flag)) {
            uint64_t j = base + (uint64_t)u * nthreads;
            store_payload8(dst + 8 * j, (w0[u] & 0xffffffffull) | (w1[u] << 32), count - 8 * j);
            gin_st16((void*)(stagePairs + 2 * j), gin_u128{0, 0});
            pending &= ~(1u << u);
          }
        }
      }
      if (pending == 0) break;
      if (ll_poll_timed_out(spins, start, errorFlags)) return false;
#pragma unroll
      for (int u = 0; u < kLlUnroll; ++u)
        if ((pending >> u) & 1u) gin_ll_load_pair(stagePairs + 2 * (base + (uint64_t)u * nthreads), w0[u], w1[u]);
    }
  }
  return true;
}

template <bool kVarCounts>
GIN_DEVICE_INLINE void a2a_ll(const uint8_t* send, uint64_t sendBytes, uint64_t bytesPerPeer,
                              const uint64_t* sendCounts, const uint64_t* sendOffsets, const uint64_t* peerBases,
                              uint64_t recvOffset, uint64_t slotBytes, uint64_t recvCountsOffset, uint64_t llOffset,
                              uint64_t llCapacity, uint64_t* seqState, int rank, int nranks, int chunks,
                              int maxChunks, uint32_t* errorFlags) {
  __shared__ uint64_t sharedCount;
  __shared__ int sharedOk;
  if (!args_ok(peerBases, seqState, rank, nranks, chunks, maxChunks, errorFlags)) return;
  if (llCapacity >= (1ull << 32)) {  // counts travel in one 32-bit LL payload
    if (blockIdx.x == 0 && threadIdx.x == 0) gin_error_set(errorFlags, GIN_ERR_BAD_ARGS);
    return;
  }
  const uint32_t tid = threadIdx.x, nthreads = blockDim.x;
  const int c = (int)(blockIdx.x % (uint32_t)chunks);
  const int p = peer_of_group((int)(blockIdx.x / (uint32_t)chunks), rank, nranks);
  const uint64_t capacity = slotBytes < llCapacity ? slotBytes : llCapacity;

  uint64_t count, srcOffset;
  if (!resolve_message<kVarCounts>(sendCounts, sendOffsets, sendBytes, bytesPerPeer, p, capacity, c, tid, errorFlags,
                                   count, srcOffset))
    return;

  if (p == rank) {  // self slot: a local copy, stream-ordered against this rank's readers
    uint64_t lo, hi;
    chunk_range(count, chunks, c, kDirectGranule, lo, hi);
    copy_self<kVarCounts>(peerBases, rank, send, srcOffset, count, lo, hi, recvOffset, slotBytes, recvCountsOffset, c,
                          tid, nthreads);
    return;
  }
  // Critical path of a small call: the sequence number, the peer's address and the first payload
  // batch are independent loads, issued together; the first stores need all three. Every thread
  // reads the sequence word itself (no barrier to broadcast it); thread 0 writes it back after the
  // block's final barrier, when no thread of this block can still be reading it.
  uint64_t* seq = seqState + (uint64_t)p * maxChunks;
  const uint64_t s = seq[c] + 1;
  uint8_t* peerWin = (uint8_t*)peerBases[p];
  const bool reachable = peerWin != nullptr;
  const uint32_t flag = ll_flag(s);
  const uint64_t stride = gin_a2a_ll_slot_stride(llCapacity);
  const uint64_t half = (s & 1ull) * (uint64_t)nranks;
  uint64_t* sendStage = (uint64_t*)(peerWin + llOffset + (half + (uint64_t)rank) * stride);

  // Send side: chunk c of my bytes for p, then the count header from chunk 0 (written by uniform
  // calls too, so the header never holds a stale flag; see above).
  {
    uint64_t lo, hi, jlo, jhi;
    chunk_range(count, chunks, c, kLlGranule, lo, hi);
    ll_pairs(lo, hi, jlo, jhi);
    ll_send(sendStage + 2, send + srcOffset, count, jlo, jhi, flag, tid, nthreads, reachable);
    if (reachable && c == 0 && tid == 0)
      gin_ll_store_pair(sendStage, ll_word(flag, (uint32_t)count), ll_word(flag, 0));
  }
  if (!reachable) {
    // GIN PATH HOOK: see a2a_direct; peers outside the load/store team go over the network path.
    // The counters still advance (the whole block takes this branch), so they stay equal.
    if (c == 0 && tid == 0) gin_error_set(errorFlags, GIN_ERR_NO_LSA_PATH);
    __syncthreads();
    if (tid == 0)
      for (int e = c; e < maxChunks; e += chunks) seq[e] = s;
    return;
  }
  uint8_t* ownWin = (uint8_t*)peerBases[rank];
  uint64_t* recvStage = (uint64_t*)(ownWin + llOffset + (half + (uint64_t)p) * stride);

  // Receive side: chunk c of p's bytes for me.
  uint64_t recvCount = bytesPerPeer;
  if (kVarCounts) {
    if (tid == 0) {
      uint64_t w0 = 0, w1 = 0;
      gin_ll_load_pair(recvStage, w0, w1);
      bool ok = ll_wait_pair(recvStage, flag, w0, w1, errorFlags);
      uint64_t n = ok ? (w0 & 0xffffffffull) : 0;
      if (n > capacity) {  // the sender clamps already; never trust a remote count for bounds
        n = capacity;
        gin_error_set(errorFlags, GIN_ERR_COUNT_CLAMPED);
      }
      sharedOk = ok;
      sharedCount = n;
      if (ok && c == 0) ((uint64_t*)(ownWin + recvCountsOffset))[p] = n;
    }
    __syncthreads();
    if (!sharedOk) return;
    recvCount = sharedCount;
  } else if (recvCount > capacity) {
    recvCount = capacity;
  }
  uint64_t lo, hi;
  chunk_range(recvCount, chunks, c, kLlGranule, lo, hi);
  uint64_t jlo, jhi;
  ll_pairs(lo, hi, jlo, jhi);
  (void)ll_recv(recvStage + 2, ownWin + recvOffset + (uint64_t)p * slotBytes, recvCount, jlo, jhi, flag, tid, nthreads,
                errorFlags);
  __syncthreads();  // every thread of the block has read seq[c]
  if (tid == 0)
    for (int e = c; e < maxChunks; e += chunks) seq[e] = s;
}

}  // namespace gin_a2a_detail
