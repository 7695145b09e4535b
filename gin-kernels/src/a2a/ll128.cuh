// a2a/ll128.cuh - the LL128 protocol (gin_a2a_ll128, gin_a2av_ll128): 128-byte staging lines of
// 120 payload bytes and an 8-byte sequence flag, each stored by one warp instruction.
#pragma once

#include "blocks.cuh"

namespace gin_a2a_detail {

// ----------------------------------------------------------------------------------------------
// LL128 protocol (gin_a2a_ll128 / gin_a2av_ll128). Call seq s (one counter per peer, kept equal
// over the chunk entries exactly as in LL, in its own array) writes into staging half h = s & 1
// of the receiver's window, slot of the sender: line 0 = header (a2av: count in word 0), data
// line L (from 1) carries payload bytes [120(L-1), 120L) in words 0..14 and the flag s in word
// 15. The 8 lanes of one group of a warp store a whole line with ONE 16-byte-per-lane store
// instruction (lane j: words 2j, 2j+1; lane 7: word 14 + the flag); NVLink delivers such a line
// whole, so a matching flag proves the line's payload (NCCL's LL128 relies on the same on sm_90).
// The receiver loads its lines the same way (one load instruction per line), checks lane 7's
// flag (shuffle within the group), re-reads lines until they match, and unpacks into the fixed
// receive slot.
//
// Flags are the full 64-bit sequence number (never 0, never wraps), and nothing is cleared: a
// line of half h holds 0 or the flag of an earlier call of this protocol (<= s-2), never s.
// Write-after-read on half h: the argument of the LL protocol, unchanged: r's kernel s starts
// after its kernel s-1, which waited for lines p's kernel s-1 wrote (uniform: chunk 0 of a
// nonzero count has a line; 0-byte uniform calls are skipped by all ranks without advancing s;
// a2av: the header line is sent every call); p's kernel s-1 started after p's kernel s-2, the
// last reader of half h, ended. Every line r stores in call s is waited for by p in call s (both
// sides split the same count into the same chunks), so no store of an older call is still in
// flight that could overwrite a newer line.
// ----------------------------------------------------------------------------------------------
constexpr uint64_t kLl128Line = 128;       // staging bytes per line
constexpr uint64_t kLl128Payload = 120;    // payload bytes per line
constexpr uint32_t kLl128LinesPerWarp = GIN_WARP_SIZE / 8;  // lines per warp instruction (8 lanes each)
constexpr uint64_t kLl128ChunkLines = 8;   // chunk boundaries in lines (a multiple of kLl128LinesPerWarp)
#ifndef GIN_LL128_UNROLL
#define GIN_LL128_UNROLL 2  // warp stores per round: 2 beat 4 and 8 at 64 KiB-16 MiB (a2a_test, 2x H200, 2026-11-30, commit 712472d)
#endif
static_assert(kLl128ChunkLines % kLl128LinesPerWarp == 0, "chunk boundaries on whole warp instructions");

// Payload bytes [off, off+8) of src (bytes at or past n read as 0), little-endian, any alignment.
// `src8`: src is 8-byte aligned. Misaligned sources are assembled from the aligned words that
// cover the bytes; each such word holds at least one byte of [src, src+n), so no load leaves the
// source's pages.
GIN_DEVICE_INLINE uint64_t ll128_load8(const uint8_t* src, uint64_t off, uint64_t n, bool src8) {
  if (off >= n) return 0;
  const uint64_t avail = n - off;
  if (src8 && avail >= 8) return gin_ld8_stream(src + off);
  const uintptr_t a = (uintptr_t)(src + off);
  const uint32_t sh = (uint32_t)(a & 7u);
  const uint64_t* w = (const uint64_t*)(a - sh);
  uint64_t v = gin_ld8_stream(w) >> (8u * sh);
  if (sh != 0 && avail > 8u - sh) v |= gin_ld8_stream(w + 1) << (64u - 8u * sh);
  if (avail < 8) v &= (1ull << (8u * avail)) - 1ull;
  return v;
}

// Stores the low n (1..8) bytes of v at dst, any alignment.
GIN_DEVICE_INLINE void ll128_store8(uint8_t* dst, uint64_t v, uint64_t n) {
  const uintptr_t a = (uintptr_t)dst;
  if (n >= 8) {
    if ((a & 7u) == 0) {
      *(uint64_t*)dst = v;
      return;
    }
    if ((a & 3u) == 0) {
      ((uint32_t*)dst)[0] = (uint32_t)v;
      ((uint32_t*)dst)[1] = (uint32_t)(v >> 32);
      return;
    }
    if ((a & 1u) == 0) {  // e.g. bf16 slots of an odd element count
      for (int k = 0; k < 4; ++k) ((uint16_t*)dst)[k] = (uint16_t)(v >> (16 * k));
      return;
    }
    n = 8;
  }
  for (uint64_t k = 0; k < n; ++k) dst[k] = (uint8_t)(v >> (8 * k));
}

// Sends data lines [Llo, Lhi) (line L at lines + 128 L, payload bytes [120 L, 120 L + 120) of
// src). Called by every thread of the block with warp-uniform loop bounds; each warp moves
// kUnroll warp instructions (4 lines each) per round: all loads first, then the stores.
template <int kUnroll>
GIN_DEVICE_INLINE void ll128_send(uint8_t* lines, const uint8_t* src, uint64_t count, uint64_t Llo, uint64_t Lhi,
                                  uint64_t flag, uint32_t warp, uint32_t nwarps, uint32_t lane, bool store) {
  const uint32_t g = lane / 8, j = lane % 8;
  const bool src8 = ((uintptr_t)src & 7u) == 0;
  const uint64_t groups = (Lhi - Llo + kLl128LinesPerWarp - 1) / kLl128LinesPerWarp;
  for (uint64_t k0 = (uint64_t)warp * kUnroll; k0 < groups; k0 += (uint64_t)nwarps * kUnroll) {
    uint64_t lo[kUnroll], hi[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const uint64_t L = Llo + (k0 + u) * kLl128LinesPerWarp + g;
      const uint64_t off = L * kLl128Payload + 16u * j;
      lo[u] = L < Lhi ? ll128_load8(src, off, count, src8) : 0;
      hi[u] = L < Lhi && j != 7 ? ll128_load8(src, off + 8, count, src8) : 0;
      if (j == 7) hi[u] = flag;
    }
    // The 8 lanes of a line must store in one instruction: reconverge after the loads'
    // lane-dependent paths (tails, misaligned sources).
    gin_syncwarp();
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const uint64_t L = Llo + (k0 + u) * kLl128LinesPerWarp + g;
      gin_ll128_store16(store && L < Lhi, lines + L * kLl128Line + 16u * j, lo[u], hi[u]);
    }
  }
}

// Whether the line this lane's group loaded carries `flag` (lane 7 of the group holds the flag
// word in hi). Every lane of the warp must call it.
GIN_DEVICE_INLINE bool ll128_line_ready(uint64_t hi, uint64_t flag, uint32_t lane) {
  return gin_shfl_int(hi == flag ? 1 : 0, (int)(lane | 7u)) != 0;
}

// Waits for data lines [Llo, Lhi) at lines (own staging) and unpacks their payload (bytes <
// count) into dst. Each warp keeps kUnroll warp loads in flight and re-reads only the lines whose
// flag did not match yet (a whole line per instruction, so its payload and flag come from one
// read). Warp-uniform loop bounds; false after the timeout (error bit set).
template <int kUnroll>
GIN_DEVICE_INLINE bool ll128_recv(const uint8_t* lines, uint8_t* dst, uint64_t count, uint64_t Llo, uint64_t Lhi,
                                  uint64_t flag, uint32_t warp, uint32_t nwarps, uint32_t lane, uint32_t* errorFlags) {
  const uint32_t g = lane / 8, j = lane % 8;
  const uint64_t groups = (Lhi - Llo + kLl128LinesPerWarp - 1) / kLl128LinesPerWarp;
  for (uint64_t k0 = (uint64_t)warp * kUnroll; k0 < groups; k0 += (uint64_t)nwarps * kUnroll) {
    uint64_t lo[kUnroll], hi[kUnroll];
    uint32_t pending = 0;  // bit u: this lane's line of instruction u has not been seen whole yet
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const uint64_t L = Llo + (k0 + u) * kLl128LinesPerWarp + g;
      lo[u] = hi[u] = 0;
      gin_ll128_load16(L < Lhi, lines + L * kLl128Line + 16u * j, lo[u], hi[u]);
      if (L < Lhi) pending |= 1u << u;
    }
    uint64_t start = 0;
    for (uint32_t spins = 0;; ++spins) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (ll128_line_ready(hi[u], flag, lane)) pending &= ~(1u << u);
      if (!gin_warp_any(pending != 0)) break;
      const bool late = gin_wait_timed_out(spins, start, errorFlags, 255u);
      if (gin_warp_any(late)) {
        gin_error_set(errorFlags, GIN_ERR_TIMEOUT);
        return false;
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const uint64_t L = Llo + (k0 + u) * kLl128LinesPerWarp + g;
        gin_ll128_load16((pending >> u) & 1u, lines + L * kLl128Line + 16u * j, lo[u], hi[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const uint64_t L = Llo + (k0 + u) * kLl128LinesPerWarp + g;
      const uint64_t off = L * kLl128Payload + 16u * j;
      if (L < Lhi && off < count) {
        const uint64_t n = count - off;
        ll128_store8(dst + off, lo[u], n);
        if (j != 7 && n > 8) ll128_store8(dst + off + 8, hi[u], n - 8);
      }
    }
  }
  return true;
}

// a2av: every warp waits for the header line itself (no block barrier on the critical path) and
// returns the count it carries; false after the timeout.
GIN_DEVICE_INLINE bool ll128_wait_header(const uint8_t* header, uint64_t flag, uint32_t lane, uint64_t& count,
                                         uint32_t* errorFlags) {
  uint64_t lo = 0, hi = 0;
  gin_ll128_load16(lane < 8, header + 16u * lane, lo, hi);
  uint64_t start = 0;
  for (uint32_t spins = 0;; ++spins) {
    if (ll128_line_ready(hi, flag, lane & 7u)) break;
    const bool late = gin_wait_timed_out(spins, start, errorFlags, 255u);
    if (gin_warp_any(late)) {
      gin_error_set(errorFlags, GIN_ERR_TIMEOUT);
      return false;
    }
    gin_ll128_load16(lane < 8, header + 16u * lane, lo, hi);
  }
  count = gin_shfl_u64(lo, 0);
  return true;
}

template <bool kVarCounts, int kUnroll = GIN_LL128_UNROLL>
GIN_DEVICE_INLINE void a2a_ll128(const uint8_t* send, uint64_t sendBytes, uint64_t bytesPerPeer,
                                 const uint64_t* sendCounts, const uint64_t* sendOffsets, const uint64_t* peerBases,
                                 uint64_t recvOffset, uint64_t slotBytes, uint64_t recvCountsOffset,
                                 uint64_t llOffset, uint64_t llCapacity, uint64_t* seqState, int rank, int nranks,
                                 int chunks, int maxChunks, uint32_t* errorFlags) {
  if (!args_ok(peerBases, seqState, rank, nranks, chunks, maxChunks, errorFlags)) return;
  // Whole warps (shuffles, one store per line) and 128-byte aligned lines; capacity bounded so
  // the staging arithmetic cannot overflow.
  if (blockDim.x % GIN_WARP_SIZE != 0 || (llOffset & (kLl128Line - 1)) != 0 || llCapacity > (1ull << 44)) {
    if (blockIdx.x == 0 && threadIdx.x == 0) gin_error_set(errorFlags, GIN_ERR_BAD_ARGS);
    return;
  }
  const uint32_t tid = threadIdx.x, nthreads = blockDim.x;
  const uint32_t lane = tid % GIN_WARP_SIZE, warp = tid / GIN_WARP_SIZE, nwarps = nthreads / GIN_WARP_SIZE;
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
  // Sequence number, peer address and the first payload loads are independent; every thread
  // reads the counter itself, thread 0 writes it back after the block's final barrier.
  uint64_t* seq = seqState + (uint64_t)p * maxChunks;
  const uint64_t s = seq[c] + 1;
  uint8_t* peerWin = (uint8_t*)peerBases[p];
  const bool reachable = peerWin != nullptr;
  const uint64_t stride = gin_a2a_ll128_slot_stride(llCapacity);
  const uint64_t half = (s & 1ull) * (uint64_t)nranks;
  uint8_t* sendStage = peerWin + llOffset + (half + (uint64_t)rank) * stride;

  // Send side: the a2av header first (receivers need the count before any data line), then
  // chunk c's data lines.
  if (kVarCounts && reachable && c == 0 && warp == 0) {
    gin_syncwarp();
    gin_ll128_store16(lane < 8, sendStage + 16u * lane, lane == 0 ? count : 0ull, lane == 7 ? s : 0ull);
  }
  {
    uint64_t Llo, Lhi;
    chunk_range((count + kLl128Payload - 1) / kLl128Payload, chunks, c, kLl128ChunkLines, Llo, Lhi);
    ll128_send<kUnroll>(sendStage + kLl128Line, send + srcOffset, count, Llo, Lhi, s, warp, nwarps, lane, reachable);
  }
  if (!reachable) {
    // GIN PATH HOOK: as in a2a_direct. The counters still advance (the whole block is here).
    if (c == 0 && tid == 0) gin_error_set(errorFlags, GIN_ERR_NO_LSA_PATH);
    __syncthreads();
    if (tid == 0)
      for (int e = c; e < maxChunks; e += chunks) seq[e] = s;
    return;
  }
  uint8_t* ownWin = (uint8_t*)peerBases[rank];
  const uint8_t* recvStage = ownWin + llOffset + (half + (uint64_t)p) * stride;

  // Receive side: chunk c of p's lines for me. No early return: every thread reaches the
  // final barrier.
  bool ok = true;
  uint64_t recvCount = count;  // uniform: the same on both sides
  if (kVarCounts) {
    ok = ll128_wait_header(recvStage, s, lane, recvCount, errorFlags);
    if (!ok) recvCount = 0;
    if (recvCount > capacity) {  // the sender clamps already; never trust a remote count for bounds
      recvCount = capacity;
      if (lane == 0) gin_error_set(errorFlags, GIN_ERR_COUNT_CLAMPED);
    }
    if (ok && c == 0 && tid == 0) ((uint64_t*)(ownWin + recvCountsOffset))[p] = recvCount;
  }
  if (ok) {
    uint64_t Llo, Lhi;
    chunk_range((recvCount + kLl128Payload - 1) / kLl128Payload, chunks, c, kLl128ChunkLines, Llo, Lhi);
    (void)ll128_recv<kUnroll>(recvStage + kLl128Line, ownWin + recvOffset + (uint64_t)p * slotBytes, recvCount, Llo,
                              Lhi, s, warp, nwarps, lane, errorFlags);
  }
  __syncthreads();  // every thread of the block has read seq[c]
  if (tid == 0)
    for (int e = c; e < maxChunks; e += chunks) seq[e] = s;
}

}  // namespace gin_a2a_detail
