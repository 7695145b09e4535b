// a2a.cu - GPU-initiated all-to-all and all-to-all-v inside a node (LSA: every peer's symmetric
// window is reachable by load/store through peerBases). Four entry points:
//
//   gin_a2a      uniform, "direct" protocol: data stored straight into the peers' receive slots,
//                per-(peer, chunk) ready handshake + done flag. Latency variant with 1 chunk per
//                peer, bandwidth variant with 16-64 chunks per peer (Java picks grid and block).
//   gin_a2av     the same protocol with per-peer byte counts and offsets read on the device.
//   gin_a2a_ll   uniform, "LL" protocol for small sizes: payload travels in 8-byte words that
//                carry their own sequence flag, into a parity-double-buffered staging area of the
//                receiver's window; the receiver unpacks into the same fixed receive slots. No
//                handshake, no fences: one NVLink one-way latency on the critical path.
//   gin_a2av_ll  the LL protocol with device-side counts.
//   gin_a2a_ll128 / gin_a2av_ll128  "LL128" for medium sizes: 128-byte staging lines of 120
//                payload bytes + an 8-byte sequence flag, each stored by one warp instruction
//                (NVLink delivers it whole); 6.7 % extra bytes instead of LL's 100 %, still no
//                handshake, fence or done flag.
//   gin_a2a_ce_ready / gin_a2a_ce_self / gin_a2a_ce_done  the copy-engine variant for large uniform
//                sizes: the host enqueues the remote slots as copy-engine copies between a ready
//                handshake kernel and a done kernel, and the self slot as a kernel on a second
//                stream (the copy engines move ~5 % more over NVLink than SM stores on H200).
//
// Signatures, window layout, grid rules, error bits and the memory-ordering arguments (including
// the proof that the LL protocol needs no ready handshake) are in docs/kernels.md, section
// "a2a.cu"; the short form of each argument is repeated next to the code that relies on it.
#include "include/gin_sync.cuh"

#define GIN_A2A_MAX_THREADS 1024    // direct kernels: blockDim.x <= 1024
#define GIN_A2A_LL_MAX_THREADS 512  // LL kernels: blockDim.x <= 512 (more registers for pairs in flight)
#define GIN_A2A_LL128_MAX_THREADS 512  // LL128 kernels: blockDim.x <= 512, a multiple of the warp size

// Window layout helpers (host and device), mirrored in docs/kernels.md for the Java side.
// Direct protocol signal area: ready[writer][chunk] then done[writer][chunk], uint64 each.
__host__ __device__ inline uint64_t gin_a2a_signal_bytes(int nranks, int maxChunksPerPeer) {
  return 16ull * (uint64_t)nranks * (uint64_t)maxChunksPerPeer;
}
// LL staging slot for one (parity, source): one 16-byte header pair, then one 16-byte pair of LL
// words per 8 payload bytes.
__host__ __device__ inline uint64_t gin_a2a_ll_slot_stride(uint64_t llCapacity) {
  return 16ull + 16ull * ((llCapacity + 7ull) / 8ull);
}
__host__ __device__ inline uint64_t gin_a2a_ll_staging_bytes(int nranks, uint64_t llCapacity) {
  return 2ull * (uint64_t)nranks * gin_a2a_ll_slot_stride(llCapacity);
}
// LL128 staging slot for one (parity, source): one 128-byte header line (a2av count), then one
// 128-byte line per 120 payload bytes. Lines must be 128-byte aligned (llOffset % 128 == 0).
__host__ __device__ inline uint64_t gin_a2a_ll128_slot_stride(uint64_t ll128Capacity) {
  return 128ull * (1ull + (ll128Capacity + 119ull) / 120ull);
}
__host__ __device__ inline uint64_t gin_a2a_ll128_staging_bytes(int nranks, uint64_t ll128Capacity) {
  return 2ull * (uint64_t)nranks * gin_a2a_ll128_slot_stride(ll128Capacity);
}
// seqState entries (uint64, local device memory, zeroed once) for any protocol.
__host__ __device__ inline uint64_t gin_a2a_seq_entries(int nranks, int maxChunksPerPeer) {
  return (uint64_t)nranks * (uint64_t)maxChunksPerPeer;
}

namespace gin_a2a_detail {

constexpr uint64_t kDirectGranule = 256;  // chunk boundaries on whole 128-byte lines (x2)
constexpr uint64_t kLlGranule = 64;       // 64 payload bytes = 128 staging bytes = one line
constexpr int kLlUnroll = 8;              // LL pairs in flight per thread

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

// ----------------------------------------------------------------------------------------------
// Remote copy policies of the direct protocol (the `RemoteCopy` parameter of a2a_direct). The
// library kernels use VectorCopy; the others are timing candidates instantiated only by
// test/a2a_test.cu (docs/kernels.md, "Design choices and what they rest on"). Every policy is called
// by all threads of the block with identical arguments, copies n bytes for any size and alignment,
// and returns only when every store it issued on behalf of thread 0 is complete and ordered for
// thread 0's later generic-proxy release (the caller then does __syncthreads + st.release.sys).
// ----------------------------------------------------------------------------------------------
template <int kUnroll>
struct VectorCopy {
  static GIN_DEVICE_INLINE void copy(uint8_t* dst, const uint8_t* src, uint64_t n, uint32_t tid, uint32_t nthreads) {
    gin_copy_bytes<kUnroll>(dst, src, n, tid, nthreads);
  }
};

// Head (bytes up to 16-byte alignment of dst) and tail (bytes after the last whole 16-byte unit)
// by the block's threads; returns the body [head, head + body) of whole 16-byte units, or false
// when src is not 16-byte aligned at dst's alignment (then nothing was copied).
GIN_DEVICE_INLINE bool split_head_body_tail(uint8_t* dst, const uint8_t* src, uint64_t n, uint32_t tid,
                                            uint32_t nthreads, uint64_t& head, uint64_t& body) {
  head = (16u - ((uintptr_t)dst & 15u)) & 15u;
  if (head > n) head = n;
  if (((uintptr_t)(src + head) & 15u) != 0) return false;
  body = (n - head) & ~15ull;
  for (uint64_t i = tid; i < head; i += nthreads) dst[i] = src[i];
  for (uint64_t i = head + body + tid; i < n; i += nthreads) dst[i] = src[i];
  return true;
}

// Candidate (c): the vector copy with cache hints: source loads `ld.global.nc.L1::no_allocate`
// with an L2 evict_first policy (read once), stores `st.global.L1::no_allocate` with the same
// policy. Same alignment rule as gin_copy_bytes (misaligned sources fall back to it).
template <int kUnroll>
struct HintedCopy {
  static GIN_DEVICE_INLINE void copy(uint8_t* dst, const uint8_t* src, uint64_t n, uint32_t tid, uint32_t nthreads) {
#if GIN_CUDA && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if (n == 0) return;
    uint64_t head, body;
    if (!split_head_body_tail(dst, src, n, tid, nthreads, head, body)) {
      gin_copy_bytes<kUnroll>(dst, src, n, tid, nthreads);
      return;
    }
    uint64_t policy;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    const uint8_t* s = src + head;
    uint8_t* d = dst + head;
    const uint64_t nvec = body >> 4, step = (uint64_t)nthreads * kUnroll;
    uint64_t v = tid;
    for (; v + (uint64_t)(kUnroll - 1) * nthreads < nvec; v += step) {
      uint64_t lo[kUnroll], hi[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v2.u64 {%0, %1}, [%2], %3;"
                     : "=l"(lo[u]), "=l"(hi[u])
                     : "l"(s + ((v + (uint64_t)u * nthreads) << 4)), "l"(policy));
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        asm volatile("st.global.L1::no_allocate.L2::cache_hint.v2.u64 [%0], {%1, %2}, %3;" ::"l"(
                         d + ((v + (uint64_t)u * nthreads) << 4)),
                     "l"(lo[u]), "l"(hi[u]), "l"(policy)
                     : "memory");
    }
    for (; v < nvec; v += nthreads) gin_st16(d + (v << 4), gin_ld16_stream(s + (v << 4)));
#else
    gin_copy_bytes<kUnroll>(dst, src, n, tid, nthreads);
#endif
  }
};

// Candidate (a): TMA bulk copies (sm_90+). Thread 0 drives a ring of kStages tiles of kTile bytes
// in dynamic shared memory: cp.async.bulk global -> shared (completion on one mbarrier per stage),
// then cp.async.bulk shared -> global straight into the destination (a peer's window over NVLink
// is global memory too). Head and tail bytes go through the block's threads. Needs
// kStages*kTile bytes of dynamic shared memory at launch; with less (or before sm_90, or on HIP,
// or a source not 16-byte aligned at dst's alignment) it falls back to the vector copy.
// Ordering: (1) thread 0 acquired the peer's ready flag (generic proxy) before this call;
// fence.proxy.async.global orders that before the bulk writes (async proxy). (2) Before
// returning, thread 0 waits with cp.async.bulk.wait_group 0 (not .read: the writes themselves are
// complete and visible to thread 0) and fences the async proxy against the generic one again, so
// the caller's __syncthreads + thread 0's st.release.sys done flag covers the bulk writes.
template <int kStages, uint32_t kTile>
struct TmaCopy {
  static_assert(kStages >= 2, "the refill of tile t-1's stage needs a second stage");
  static_assert(kTile % 16 == 0 && kTile < (1u << 20), "bulk copy sizes: multiple of 16, mbarrier tx count < 2^20");
  static constexpr uint32_t kSharedBytes = (uint32_t)kStages * kTile;

  static GIN_DEVICE_INLINE void copy(uint8_t* dst, const uint8_t* src, uint64_t n, uint32_t tid, uint32_t nthreads) {
#if GIN_CUDA && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    __shared__ __align__(8) uint64_t stageFull[kStages];
    extern __shared__ __align__(128) uint8_t tmaTiles[];
    if (n == 0) return;
    uint32_t dynBytes;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dynBytes));
    uint64_t head = 0, body = 0;
    if (dynBytes < kSharedBytes || !split_head_body_tail(dst, src, n, tid, nthreads, head, body)) {
      gin_copy_bytes<GIN_COPY_UNROLL>(dst, src, n, tid, nthreads);
      return;
    }
    if (tid != 0 || body == 0) return;
    const uint32_t tiles = (uint32_t)__cvta_generic_to_shared(tmaTiles);
    const uint32_t bars = (uint32_t)__cvta_generic_to_shared(stageFull);
    for (int s = 0; s < kStages; ++s)
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bars + 8u * s) : "memory");
    // Barrier inits visible to the async proxy; the ready acquire ordered before the bulk writes.
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    asm volatile("fence.proxy.async.global;" ::: "memory");
    const uint8_t* s0 = src + head;
    uint8_t* d0 = dst + head;
    const uint64_t ntiles = (body + kTile - 1) / kTile;
    auto tile_bytes = [&](uint64_t t) -> uint32_t {
      const uint64_t rest = body - t * kTile;
      return rest < kTile ? (uint32_t)rest : kTile;
    };
    auto load = [&](uint64_t t) {
      const uint32_t st = (uint32_t)(t % kStages), bar = bars + 8u * st, bytes = tile_bytes(t);
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
      asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                       tiles + st * kTile),
                   "l"(s0 + t * kTile), "r"(bytes), "r"(bar)
                   : "memory");
    };
    for (uint64_t t = 0; t < ntiles && t < (uint64_t)kStages; ++t) load(t);
    for (uint64_t t = 0; t < ntiles; ++t) {
      const uint32_t st = (uint32_t)(t % kStages), bar = bars + 8u * st;
      const uint32_t parity = (uint32_t)((t / kStages) & 1u);
      for (uint32_t landed = 0; !landed;)  // local HBM -> shared: completes without any peer
        asm volatile(
            "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
            : "=r"(landed)
            : "r"(bar), "r"(parity)
            : "memory");
      asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(d0 + t * kTile),
                   "r"(tiles + st * kTile), "r"(tile_bytes(t))
                   : "memory");
      asm volatile("cp.async.bulk.commit_group;" ::: "memory");
      // Refill the stage of tile t-1 once its store has read it (all groups but the newest).
      if (t >= 1 && t - 1 + kStages < ntiles) {
        asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
        load(t - 1 + kStages);
      }
    }
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
    asm volatile("fence.proxy.async.global;" ::: "memory");
#else
    gin_copy_bytes<GIN_COPY_UNROLL>(dst, src, n, tid, nthreads);
#endif
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

// ================================================================================================
// Entry points. Grid: nranks * chunksPerPeer blocks (1-D), all co-resident; blockDim.x <= 1024
// (direct) or <= 512 (LL, LL128), a multiple of 32 recommended (LL128: required, a multiple of the
// warp size); no dynamic shared memory. See docs/kernels.md for every argument. Each waits for prior
// grids first (gin_wait_prior_grids), so it may be launched as a programmatic dependent launch.
// ================================================================================================

extern "C" __global__ void __launch_bounds__(GIN_A2A_MAX_THREADS)
gin_a2a(const uint8_t* send, uint64_t bytesPerPeer, const uint64_t* peerBases, uint64_t recvOffset,
        uint64_t slotBytes, uint64_t signalOffset, uint64_t* seqState, int32_t rank, int32_t nranks,
        int32_t chunksPerPeer, int32_t maxChunksPerPeer, uint32_t* errorFlags) {
  gin_wait_prior_grids();  // programmatic dependent launch: the previous kernel is done
  gin_a2a_detail::a2a_direct<false>(send, 0, bytesPerPeer, nullptr, nullptr, peerBases, recvOffset, slotBytes, 0,
                                    signalOffset, seqState, rank, nranks, chunksPerPeer, maxChunksPerPeer,
                                    errorFlags);
}

extern "C" __global__ void __launch_bounds__(GIN_A2A_MAX_THREADS)
gin_a2av(const uint8_t* send, uint64_t sendBytes, const uint64_t* sendCounts, const uint64_t* sendOffsets,
         const uint64_t* peerBases, uint64_t recvOffset, uint64_t slotBytes, uint64_t recvCountsOffset,
         uint64_t signalOffset, uint64_t* seqState, int32_t rank, int32_t nranks, int32_t chunksPerPeer,
         int32_t maxChunksPerPeer, uint32_t* errorFlags) {
  gin_wait_prior_grids();  // programmatic dependent launch: the previous kernel is done
  gin_a2a_detail::a2a_direct<true>(send, sendBytes, 0, sendCounts, sendOffsets, peerBases, recvOffset, slotBytes,
                                   recvCountsOffset, signalOffset, seqState, rank, nranks, chunksPerPeer,
                                   maxChunksPerPeer, errorFlags);
}

extern "C" __global__ void __launch_bounds__(GIN_A2A_LL_MAX_THREADS)
gin_a2a_ll(const uint8_t* send, uint64_t bytesPerPeer, const uint64_t* peerBases, uint64_t recvOffset,
           uint64_t slotBytes, uint64_t llOffset, uint64_t llCapacity, uint64_t* llSeqState, int32_t rank,
           int32_t nranks, int32_t chunksPerPeer, int32_t maxChunksPerPeer, uint32_t* errorFlags) {
  gin_wait_prior_grids();  // programmatic dependent launch: the previous kernel is done
  gin_a2a_detail::a2a_ll<false>(send, 0, bytesPerPeer, nullptr, nullptr, peerBases, recvOffset, slotBytes, 0,
                                llOffset, llCapacity, llSeqState, rank, nranks, chunksPerPeer, maxChunksPerPeer,
                                errorFlags);
}

extern "C" __global__ void __launch_bounds__(GIN_A2A_LL_MAX_THREADS)
gin_a2av_ll(const uint8_t* send, uint64_t sendBytes, const uint64_t* sendCounts, const uint64_t* sendOffsets,
            const uint64_t* peerBases, uint64_t recvOffset, uint64_t slotBytes, uint64_t recvCountsOffset,
            uint64_t llOffset, uint64_t llCapacity, uint64_t* llSeqState, int32_t rank, int32_t nranks,
            int32_t chunksPerPeer, int32_t maxChunksPerPeer, uint32_t* errorFlags) {
  gin_wait_prior_grids();  // programmatic dependent launch: the previous kernel is done
  gin_a2a_detail::a2a_ll<true>(send, sendBytes, 0, sendCounts, sendOffsets, peerBases, recvOffset, slotBytes,
                               recvCountsOffset, llOffset, llCapacity, llSeqState, rank, nranks, chunksPerPeer,
                               maxChunksPerPeer, errorFlags);
}

extern "C" __global__ void __launch_bounds__(GIN_A2A_LL128_MAX_THREADS)
gin_a2a_ll128(const uint8_t* send, uint64_t bytesPerPeer, const uint64_t* peerBases, uint64_t recvOffset,
              uint64_t slotBytes, uint64_t ll128Offset, uint64_t ll128Capacity, uint64_t* ll128SeqState,
              int32_t rank, int32_t nranks, int32_t chunksPerPeer, int32_t maxChunksPerPeer, uint32_t* errorFlags) {
  gin_wait_prior_grids();  // programmatic dependent launch: the previous kernel is done
  gin_a2a_detail::a2a_ll128<false>(send, 0, bytesPerPeer, nullptr, nullptr, peerBases, recvOffset, slotBytes, 0,
                                   ll128Offset, ll128Capacity, ll128SeqState, rank, nranks, chunksPerPeer,
                                   maxChunksPerPeer, errorFlags);
}

extern "C" __global__ void __launch_bounds__(GIN_A2A_LL128_MAX_THREADS)
gin_a2av_ll128(const uint8_t* send, uint64_t sendBytes, const uint64_t* sendCounts, const uint64_t* sendOffsets,
               const uint64_t* peerBases, uint64_t recvOffset, uint64_t slotBytes, uint64_t recvCountsOffset,
               uint64_t ll128Offset, uint64_t ll128Capacity, uint64_t* ll128SeqState, int32_t rank, int32_t nranks,
               int32_t chunksPerPeer, int32_t maxChunksPerPeer, uint32_t* errorFlags) {
  gin_wait_prior_grids();  // programmatic dependent launch: the previous kernel is done
  gin_a2a_detail::a2a_ll128<true>(send, sendBytes, 0, sendCounts, sendOffsets, peerBases, recvOffset, slotBytes,
                                  recvCountsOffset, ll128Offset, ll128Capacity, ll128SeqState, rank, nranks,
                                  chunksPerPeer, maxChunksPerPeer, errorFlags);
}

// ================================================================================================
// Copy-engine variant of the uniform all-to-all (large sizes). Per call, on the caller's stream S
// and a second stream X of the same rank (docs/kernels.md, "Copy-engine variant"):
//   X (forked from S): gin_a2a_ce_self          the self slot, by SMs
//   S: gin_a2a_ce_ready                          ready handshake with every peer
//   S: one copy-engine copy per peer p           send + p*bytesPerPeer -> p's slot for this rank
//   S (after joining X): gin_a2a_ce_done         done flag to every peer, wait for every peer's
// Signals: the direct protocol's chunk-0 words ready[w][0] / done[w][0] and counters seqState[p][0]
// (a copy-engine call is one direct call with one chunk on both sides of every pair), so the
// variants may alternate call to call on one window.
// ================================================================================================
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

// Thread p (p != rank): s = ++seqState[p][0]; ready[rank][0] := s in p's window (release), then wait
// ready[p][0] >= s in its own window: p's stream has passed every reader of its earlier results, so
// the copy engine may overwrite p's slot. The copies are enqueued by the host after this kernel
// whatever its outcome (a copy engine cannot be told to skip): a time-out here (a peer more than
// GIN_WAIT_TIMEOUT_NS late) is reported through errorFlags, and that call's results are invalid.
extern "C" __global__ void gin_a2a_ce_ready(const uint64_t* peerBases, uint64_t signalOffset, uint64_t* seqState,
                                            int32_t rank, int32_t nranks, int32_t maxChunksPerPeer,
                                            uint32_t* errorFlags) {
  using namespace gin_a2a_detail;
  if (!ce_args_ok(peerBases, seqState, rank, nranks, maxChunksPerPeer, errorFlags)) return;
  const int p = (int)threadIdx.x;
  if (p >= nranks || p == rank) return;
  if (peerBases[p] == 0) {  // no load/store path to p: the copy-engine variant is LSA-only
    gin_error_set(errorFlags, GIN_ERR_NO_LSA_PATH);
    return;
  }
  uint64_t* seq = seqState + (uint64_t)p * maxChunksPerPeer;
  const uint64_t s = *seq + 1;
  *seq = s;
  ce_signal_and_wait(peerBases, signalOffset, 0, rank, p, maxChunksPerPeer, s, errorFlags);
}

// Runs after this rank's copies into every peer completed (stream order: a completed copy has
// written the peer's memory), so done[rank][0] := s in p's window (release) follows the data; then
// waits done[p][0] >= s in its own window (acquire): p's data for this rank has landed when the
// kernel ends, and stream order makes it visible to whatever runs next.
extern "C" __global__ void gin_a2a_ce_done(const uint64_t* peerBases, uint64_t signalOffset, uint64_t* seqState,
                                           int32_t rank, int32_t nranks, int32_t maxChunksPerPeer,
                                           uint32_t* errorFlags) {
  using namespace gin_a2a_detail;
  if (!ce_args_ok(peerBases, seqState, rank, nranks, maxChunksPerPeer, errorFlags)) return;
  const int p = (int)threadIdx.x;
  if (p >= nranks || p == rank) return;
  if (peerBases[p] == 0) return;  // reported by gin_a2a_ce_ready
  const uint64_t s = seqState[(uint64_t)p * maxChunksPerPeer];  // advanced by this call's gin_a2a_ce_ready
  const uint64_t doneBase = (uint64_t)nranks * (uint64_t)maxChunksPerPeer;
  ce_signal_and_wait(peerBases, signalOffset, doneBase, rank, p, maxChunksPerPeer, s, errorFlags);
}

// Any 1-D grid, block <= 1024: the self slot, send + rank*bytesPerPeer -> own window
// recvOffset + rank*slotBytes, any size and alignment, split in 256-byte-aligned block ranges.
extern "C" __global__ void __launch_bounds__(GIN_A2A_MAX_THREADS)
gin_a2a_ce_self(const uint8_t* send, uint64_t bytesPerPeer, const uint64_t* peerBases, uint64_t recvOffset,
                uint64_t slotBytes, int32_t rank) {
  using namespace gin_a2a_detail;
  uint64_t lo, hi;
  chunk_range(bytesPerPeer, (int)gridDim.x, (int)blockIdx.x, kDirectGranule, lo, hi);
  copy_self<false>(peerBases, rank, send, (uint64_t)rank * bytesPerPeer, bytesPerPeer, lo, hi, recvOffset, slotBytes, 0,
                   (int)blockIdx.x, threadIdx.x, blockDim.x);
}
