// nccl_gin_a2a.cu - hybrid all-to-all and all-to-all-v over NCCL's device API: per peer,
// load/store (LSA) when the peer is in this rank's LSA team, GPU-initiated networking (ncclGin put
// + signal) otherwise. Entry points:
//
//   gin_a2a_hybrid        same grid, chunking and output placement as gin_a2a (a2a.cu): rank r's
//                         result from source s lies at window offset recvOffset + s*slotBytes.
//   gin_a2av_hybrid       the same with per-peer byte counts and offsets read on the device (as
//                         gin_a2av): the count travels ahead of the data (an 8-byte put from
//                         countStagingOffset + p*8 into the peer's recvCountsOffset + r*8, or a
//                         store over LSA), and every chunk signals, empty or not.
//   gin_a2a_hybrid_reset  once per devComm, on every rank, before the first call (then a barrier):
//                         zeroes seqState, the own LSA flags and the kernel's GIN signals (NCCL
//                         hands out signals from a pool, so a new devComm's may hold old values).
//
// Needs the GIN device API (nccl_device/gin.h, NCCL >= 2.29.7); gin-kernels/build skips this file
// with a printed reason against older headers (e.g. NCCL 2.28.3, which has no ncclGin at all), so
// no object without kernels is ever emitted. Each entry takes the ncclDevComm, then its argument
// struct of gin-kernels/abi/a2a.h, by value. Window layout, ncclDevCommRequirements and the
// ordering arguments are in docs/kernels.md, section "nccl_gin_a2a.cu"; the short form of each
// argument sits next to the code that relies on it.
//
// Run through NCCL 2.29.7's GIN proxy backend and the loopback GIN transport (gin-kernels/loopback)
// with every peer across the "network" (LoopbackGinGpuTest); not yet on an RDMA NIC.
#include "include/gin_sync.cuh"
#include "abi/a2a.h"  // the argument structs (gin-kernels/abi/a2a.h; the build passes -I gin-kernels)
#include <nccl.h>
#include <nccl_device.h>

#if !defined(NCCL_VERSION_CODE) || NCCL_VERSION_CODE < 22907 || !__has_include(<nccl_device/gin.h>)
#error "nccl_gin_a2a.cu needs NCCL's GIN device API (nccl_device/gin.h) from NCCL >= 2.29.7; gin-kernels/build skips it for older headers"
#endif
#include <nccl_device/gin.h>
#include "include/gin_signal.cuh"  // the GIN signal wait (ends at the time-out or the abort)

#define GIN_HYBRID_MAX_THREADS 1024

// Window layout helpers (mirrored in docs/kernels.md for the Java side).
// LSA signal area: ready[writer][chunk] then done[writer][chunk], uint64 each (as gin_a2a's).
__host__ __device__ inline uint64_t gin_hybrid_lsa_signal_bytes(int nranks, int maxChunksPerPeer) {
  return 16ull * (uint64_t)nranks * (uint64_t)maxChunksPerPeer;
}
// GIN signals used: data[source][chunk] then ready[source][chunk], from ginSignalBase on.
__host__ __device__ inline uint64_t gin_hybrid_gin_signal_count(int nranks, int maxChunksPerPeer) {
  return 2ull * (uint64_t)nranks * (uint64_t)maxChunksPerPeer;
}

namespace gin_hybrid_detail {

constexpr uint64_t kGranule = 256;               // chunk bounds on whole 128-byte lines (x2)
constexpr uint64_t kMaxPutBytes = 1ull << 30;    // one RDMA write stays far below the 2 GiB limit
constexpr int kGinContext = 0;                   // every rank uses context 0 (signals are per context)

// Block b serves group i = b / chunks, chunk c = b % chunks, peer p = (i - rank) mod nranks: the
// same pairing as a2a.cu, so a block and its counterpart on the peer have the same blockIdx.
GIN_DEVICE_INLINE int peer_of_group(int group, int rank, int nranks) {
  int p = (group - rank) % nranks;
  return p < 0 ? p + nranks : p;
}

GIN_DEVICE_INLINE void chunk_range(uint64_t n, int chunks, int c, uint64_t& lo, uint64_t& hi) {
  uint64_t per = (n + (uint64_t)chunks - 1) / (uint64_t)chunks;
  per = (per + kGranule - 1) / kGranule * kGranule;
  lo = per * (uint64_t)c;
  if (lo > n) lo = n;
  hi = lo + per;
  if (hi > n) hi = n;
}

// Signal ids (relative to the devComm's signal range; NCCL adds its own base).
GIN_DEVICE_INLINE ncclGinSignal_t data_signal(uint32_t base, int source, int chunk, int maxChunks) {
  return base + (uint32_t)source * (uint32_t)maxChunks + (uint32_t)chunk;
}
GIN_DEVICE_INLINE ncclGinSignal_t ready_signal(uint32_t base, int source, int chunk, int nranks, int maxChunks) {
  return base + (uint32_t)(nranks + source) * (uint32_t)maxChunks + (uint32_t)chunk;
}

// Argument checks; every block reaches the same verdict (arguments and devComm are uniform), block
// 0 reports it. GIN is checked only where this rank has a peer outside its LSA team.
GIN_DEVICE_INLINE bool args_ok(const ncclDevComm& comm, ncclWindow_t window, const uint8_t* send,
                               uint64_t sendBytes, uint64_t lsaSignalOffset, int32_t ginSignalBase, const uint64_t* seqState,
                               int rank, int nranks, int chunks, int maxChunks, bool needGin,
                               uint32_t* errorFlags) {
  bool ok = window != nullptr && seqState != nullptr && nranks >= 1 && rank >= 0 && rank < nranks &&
            comm.rank == rank && comm.nRanks == nranks && chunks >= 1 && maxChunks >= chunks &&
            (uint64_t)gridDim.x == (uint64_t)nranks * (uint64_t)chunks && gridDim.y == 1 && gridDim.z == 1 &&
            blockDim.y == 1 && blockDim.z == 1 && (lsaSignalOffset & 7u) == 0 &&
            (send != nullptr || sendBytes == 0);
  if (ok && needGin) {
    // A devComm without GIN connections, a railed one (reaches only peers of the same rail) or one
    // with too few signals cannot serve the network path; nothing is moved.
    ok = comm.ginConnectionCount > 0 && !comm.ginIsRailed && ginSignalBase >= 0 && comm.ginSignalCount >= 0 &&
         (uint64_t)ginSignalBase + gin_hybrid_gin_signal_count(nranks, maxChunks) <= (uint64_t)comm.ginSignalCount;
  }
  if (!ok && blockIdx.x == 0 && threadIdx.x == 0) gin_error_set(errorFlags, GIN_ERR_BAD_ARGS);
  return ok;
}

// ----------------------------------------------------------------------------------------------
// One block: peer p, chunk c, on rank r, call sequence s = ++seqState[p][c].
//
// LSA peer (p in r's LSA team): the direct protocol of a2a.cu, flags in the window's LSA signal
// area, addresses from ncclGetLsaPointer:
//   1. thread 0: ready[r][c] := s in p's window (st.release.sys); wait ready[p][c] >= s in its own.
//   2. all threads: chunk c of send[p] -> p's slot r (16-byte stores over NVLink).
//   3. __syncthreads; thread 0: done[r][c] := s in p's window (release, cumulative over the
//      barrier); wait done[p][c] >= s in its own (acquire): p's chunk c for r has landed.
//
// GIN peer (outside the LSA team): signals instead of flags, a put instead of stores:
//   1. thread 0: signal +1 on p's GIN signal ready(r, c); wait own ready(p, c) >= s.
//      p raises it when its own call s starts, i.e. after p's stream finished every earlier
//      operation, including all reads of its previous results: writing into p's slot r from now on
//      disturbs no reader (write-after-read; the chain is p's readers -> kernel boundary -> p's
//      signal -> network -> r's poll -> r's put -> network -> p's memory).
//   2. all threads: chunk c of send[p] -> own window's send staging (stagingOffset + p*slotBytes).
//      Done after the ready wait on purpose: the ready of call s proves that p finished its
//      kernel of the previous call, which waited for every data signal of r's previous puts to
//      p, so the NIC has finished reading the staging bytes of every earlier call (independent of
//      the chunk split, which may change between calls). gin.flush at the end of each block is
//      the API's own guarantee of the same thing; the protocol does not depend on it.
//   3. __syncthreads; thread 0: put staging[lo, hi) -> p's slot r [lo, hi), the last piece with
//      signal +1 on p's data(r, c) (NCCL makes a signal visible only after the payload of its put
//      and of every earlier put on the context to that peer). requiredRelease = system: the put
//      issues a system-scope release fence, ordering every thread's staging stores (barrier, then
//      cumulative fence) before the NIC reads them.
//   4. thread 0: wait own data(p, c) >= s (acquire): p's chunk c for r has landed. Then flush
//      (skipped after a timeout, when the communicator is broken anyway).
//
// Sequence values: seqState[p][c] (local memory) counts the calls in which block (p, c)
// communicated; both ranks of a pair count the same calls (uniform arguments: empty chunks are
// skipped by both sides). Each GIN signal of the pair is incremented exactly once in each such
// call, so after call s both the expected and the actual value are s: signals only grow, and
// nothing ever resets them (64 bits do not wrap). LSA flags hold s the same way.
// ----------------------------------------------------------------------------------------------
//
// All-to-all-v (kVarCounts): the count (clamped to the slot and the send buffer, as gin_a2av's)
// goes to p's recvCounts[r] in the block of chunk 0, before its data: over LSA a plain store
// ordered by the done flag; over GIN an 8-byte put staged in this rank's countStaging[p], issued
// on the same context before the data puts, so the data signal (after every earlier put to p)
// proves it landed. The receiver does not know the count, so no chunk is skipped: an empty GIN
// chunk sends its data signal alone.
template <bool kVarCounts>
GIN_DEVICE_INLINE void hybrid_block(const ncclDevComm& comm, ncclWindow_t window, const uint8_t* send, uint64_t sendBytes,
                                    uint64_t bytesPerPeer, const uint64_t* sendCounts, const uint64_t* sendOffsets,
                                    uint64_t recvOffset, uint64_t slotBytes, uint64_t recvCountsOffset,
                                    uint64_t stagingOffset, uint64_t countStagingOffset, uint64_t lsaSignalOffset,
                                    int32_t ginSignalBase, uint64_t* seqState, int rank, int nranks, int chunks,
                                    int maxChunks, uint32_t* errorFlags) {
  __shared__ uint64_t sharedSeq;
  __shared__ int sharedOk;
  const ncclTeam world = ncclTeamWorld(comm);
  const ncclTeam lsa = ncclTeamLsa(comm);
  const bool needGin = lsa.nRanks < world.nRanks;
  if (!args_ok(comm, window, send, kVarCounts ? sendBytes : bytesPerPeer, lsaSignalOffset, ginSignalBase, seqState, rank,
               nranks, chunks, maxChunks, needGin, errorFlags))
    return;
  if (kVarCounts && (sendCounts == nullptr || sendOffsets == nullptr || (recvCountsOffset & 7u) != 0 || (countStagingOffset & 7u) != 0)) {
    if (blockIdx.x == 0 && threadIdx.x == 0) gin_error_set(errorFlags, GIN_ERR_BAD_ARGS);
    return;
  }
  const uint32_t tid = threadIdx.x, nthreads = blockDim.x;
  const int c = (int)(blockIdx.x % (uint32_t)chunks);
  const int p = peer_of_group((int)(blockIdx.x / (uint32_t)chunks), rank, nranks);

  uint64_t count, srcOffset;
  if (kVarCounts) {
    const uint32_t err = gin_resolve_count(sendCounts, sendOffsets, p, sendBytes, slotBytes, count, srcOffset);
    if (err && c == 0 && tid == 0) gin_error_set(errorFlags, err);
  } else {
    count = bytesPerPeer;
    srcOffset = (uint64_t)p * bytesPerPeer;
    if (count > slotBytes) {
      count = slotBytes;
      if (c == 0 && tid == 0) gin_error_set(errorFlags, GIN_ERR_COUNT_CLAMPED);
    }
  }
  const bool sendsCount = kVarCounts && c == 0;
  uint64_t lo, hi;
  chunk_range(count, chunks, c, lo, hi);
  const uint64_t slotOffset = recvOffset + (uint64_t)rank * slotBytes;  // my slot in every window

  if (p == rank) {
    // Self slot: a local copy, stream-ordered against this rank's own readers; no flags.
    uint8_t* own = (uint8_t*)ncclGetLocalPointer(window, slotOffset);
    gin_copy_bytes(own + lo, send + srcOffset + lo, hi - lo, tid, nthreads);
    if (sendsCount && tid == 0) ((uint64_t*)ncclGetLocalPointer(window, recvCountsOffset))[rank] = count;
    return;
  }
  // Both sides know the uniform size: an empty chunk is skipped by both, counters stay equal.
  if (!kVarCounts && hi == lo) return;

  uint64_t* seq = seqState + (uint64_t)p * (uint64_t)maxChunks + (uint64_t)c;
  const bool lsaPeer = ncclTeamRankIsMember(lsa, world, p);

  if (lsaPeer) {
    const int lsaP = ncclTeamRankToTeam(lsa, world, p);
    uint8_t* peerSlot = (uint8_t*)ncclGetLsaPointer(window, slotOffset, lsaP);
    uint64_t* ownSig = (uint64_t*)ncclGetLocalPointer(window, lsaSignalOffset);
    uint64_t* peerSig = (uint64_t*)ncclGetLsaPointer(window, lsaSignalOffset, lsaP);
    const uint64_t doneBase = (uint64_t)nranks * (uint64_t)maxChunks;
    const uint64_t mine = (uint64_t)rank * maxChunks + c, theirs = (uint64_t)p * maxChunks + c;
    if (tid == 0) {
      const uint64_t s = *seq + 1;
      *seq = s;
      gin_st_release_sys(peerSig + mine, s);
      sharedOk = gin_wait_geq_acquire_polls(ownSig + theirs, s, errorFlags);
      sharedSeq = s;
    }
    __syncthreads();
    if (!sharedOk) return;  // timed out: never write into a slot the peer may still be reading
    const uint64_t s = sharedSeq;
    gin_copy_bytes(peerSlot + lo, send + srcOffset + lo, hi - lo, tid, nthreads);
    if (sendsCount && tid == 0) ((uint64_t*)ncclGetLsaPointer(window, recvCountsOffset, lsaP))[rank] = count;
    __syncthreads();
    if (tid == 0) {
      gin_st_release_sys(peerSig + doneBase + mine, s);
      (void)gin_wait_geq_acquire_polls(ownSig + doneBase + theirs, s, errorFlags);
    }
    return;
  }

  // GIN peer. Every ncclGin call is made by thread 0 alone (ncclCoopThread); the block joins only
  // for the staging copy. Signals live per context: all ranks use context kGinContext.
  const uint32_t sigBase = (uint32_t)ginSignalBase;
  const uint64_t stageOffset = stagingOffset + (uint64_t)p * slotBytes;  // my staging for p
  if (tid == 0) {
    ncclGin gin{comm, kGinContext};
    const uint64_t s = *seq + 1;
    *seq = s;
    gin.signal(world, p, ncclGin_SignalInc{ready_signal(sigBase, rank, c, nranks, maxChunks)}, ncclCoopThread(),
               ncclGin_None{}, cuda::thread_scope_thread, cuda::thread_scope_system);
    sharedOk = gin_wait_signal_geq(gin, ready_signal(sigBase, p, c, nranks, maxChunks), s, errorFlags);
    sharedSeq = s;
  }
  __syncthreads();
  if (!sharedOk) return;  // timed out: p may still read its slot; put nothing
  const uint64_t s = sharedSeq;
  uint8_t* stage = (uint8_t*)ncclGetLocalPointer(window, stageOffset);
  gin_copy_bytes(stage + lo, send + srcOffset + lo, hi - lo, tid, nthreads);
  const uint64_t countStage = countStagingOffset + (uint64_t)p * 8u;  // my count for p, staged in registered memory
  if (sendsCount && tid == 0) *(uint64_t*)ncclGetLocalPointer(window, countStage) = count;
  __syncthreads();
  if (tid == 0) {
    ncclGin gin{comm, kGinContext};
    // the count first: the data signal below comes after every earlier put of this context to p
    if (sendsCount)
      gin.put(world, p, window, recvCountsOffset + (uint64_t)rank * 8u, window, countStage, 8, ncclGin_None{}, ncclGin_None{},
              ncclCoopThread(), ncclGin_None{}, cuda::thread_scope_thread, cuda::thread_scope_system);
    if (hi == lo)  // all-to-all-v: nothing to send in this chunk, but the receiver waits for its signal
      gin.signal(world, p, ncclGin_SignalInc{data_signal(sigBase, rank, c, maxChunks)}, ncclCoopThread(), ncclGin_None{},
                 cuda::thread_scope_thread, cuda::thread_scope_system);
    for (uint64_t off = lo; off < hi; off += kMaxPutBytes) {
      const uint64_t n = hi - off < kMaxPutBytes ? hi - off : kMaxPutBytes;
      if (off + n < hi) {
        gin.put(world, p, window, slotOffset + off, window, stageOffset + off, n, ncclGin_None{}, ncclGin_None{},
                ncclCoopThread(), ncclGin_None{}, cuda::thread_scope_thread, cuda::thread_scope_system);
      } else {
        gin.put(world, p, window, slotOffset + off, window, stageOffset + off, n,
                ncclGin_SignalInc{data_signal(sigBase, rank, c, maxChunks)}, ncclGin_None{}, ncclCoopThread(),
                ncclGin_None{}, cuda::thread_scope_thread, cuda::thread_scope_system);
      }
    }
    // Flush (the API's "source reusable" guarantee) only after a successful wait: with a dead peer
    // it could spin on a completion that never comes, and the kernel must not hang.
    if (gin_wait_signal_geq(gin, data_signal(sigBase, p, c, maxChunks), s, errorFlags)) gin.flush(ncclCoopThread());
  }
}

}  // namespace gin_hybrid_detail

// Resets the protocol state of gin_a2a_hybrid on this rank. Must not overlap any gin_a2a_hybrid
// call on any rank: run it on every rank, then a barrier across ranks (e.g. any NCCL collective
// enqueued behind it on the same stream) before the first call, so no peer's ready/done store or
// signal increment of that call can land before the reset. Any grid (grid-stride).
GIN_KERNEL void gin_a2a_hybrid_reset(const __grid_constant__ ncclDevComm devComm,
                                     const GinA2aHybridResetArgs a) {
  const ncclWindow_t window = (ncclWindow_t)a.window;
  const uint64_t lsaSignalOffset = a.lsaSignalOffset;
  const int32_t ginSignalBase = a.ginSignalBase, nranks = a.nranks, maxChunksPerPeer = a.maxChunksPerPeer;
  uint64_t* const seqState = a.seqState;
  uint32_t* const errorFlags = a.errorFlags;
  const ncclTeam world = ncclTeamWorld(devComm);
  const ncclTeam lsa = ncclTeamLsa(devComm);
  const bool needGin = lsa.nRanks < world.nRanks;
  bool ok = window != nullptr && seqState != nullptr && nranks >= 1 && devComm.nRanks == nranks &&
            maxChunksPerPeer >= 1 && (lsaSignalOffset & 7u) == 0;
  // Signals exist only where the devComm has GIN; reset them whenever it has (a single-node run
  // may still have asked for them).
  const bool haveGin = devComm.ginConnectionCount > 0;
  const uint64_t nSignals = gin_hybrid_gin_signal_count(nranks, maxChunksPerPeer);
  const bool signalsFit = ginSignalBase >= 0 && devComm.ginSignalCount >= 0 &&
                          (uint64_t)ginSignalBase + nSignals <= (uint64_t)devComm.ginSignalCount;
  if (ok && needGin) ok = haveGin && !devComm.ginIsRailed && signalsFit;
  if (!ok) {
    if (gin_global_thread_id() == 0) gin_error_set(errorFlags, GIN_ERR_BAD_ARGS);
    return;
  }
  const uint64_t entries = (uint64_t)nranks * (uint64_t)maxChunksPerPeer;
  uint64_t* flags = (uint64_t*)ncclGetLocalPointer(window, lsaSignalOffset);
  for (uint64_t i = gin_global_thread_id(); i < entries; i += gin_grid_threads()) {
    seqState[i] = 0;
    flags[i] = 0;            // ready[*][*]
    flags[entries + i] = 0;  // done[*][*]
  }
  if (haveGin && signalsFit) {
    ncclGin gin{devComm, gin_hybrid_detail::kGinContext};
    for (uint64_t i = gin_global_thread_id(); i < nSignals; i += gin_grid_threads())
      gin.resetSignal((ncclGinSignal_t)((uint64_t)ginSignalBase + i));
  }
}

// ================================================================================================
// Entry point. Grid: nranks * chunksPerPeer blocks (1-D), all co-resident; blockDim.x <= 1024, a
// multiple of 32 recommended; no dynamic shared memory. Arguments: abi/a2a.h (GinA2aHybridArgs, GinA2avHybridArgs).
// The struct is a plain by-value parameter (also read in place): as __grid_constant__, nvcc 13.0
// recomputes the LSA copy loop's addresses inside the loop (68 -> 94 instructions per round, sm_90).
// ================================================================================================
GIN_KERNEL void __launch_bounds__(GIN_HYBRID_MAX_THREADS)
gin_a2a_hybrid(const __grid_constant__ ncclDevComm devComm, const GinA2aHybridArgs a) {
  gin_hybrid_detail::hybrid_block<false>(devComm, (ncclWindow_t)a.window, a.send, 0, a.bytesPerPeer, nullptr, nullptr,
                                         a.recvOffset, a.slotBytes, 0, a.stagingOffset, 0, a.lsaSignalOffset,
                                         a.ginSignalBase, a.seqState, a.rank, a.nranks, a.chunksPerPeer,
                                         a.maxChunksPerPeer, a.errorFlags);
}

// All-to-all-v: sendCounts / sendOffsets (uint64 per peer, device memory) give each message; rank
// r's message from source s lies at recvOffset + s*slotBytes, its length at recvCountsOffset + s*8.
// countStagingOffset: nranks uint64 of this window for the counts sent through GIN. Same grid,
// LSA signal area and GIN signals as gin_a2a_hybrid (of its own window and seqState).
GIN_KERNEL void __launch_bounds__(GIN_HYBRID_MAX_THREADS)
gin_a2av_hybrid(const __grid_constant__ ncclDevComm devComm, const GinA2avHybridArgs a) {
  gin_hybrid_detail::hybrid_block<true>(devComm, (ncclWindow_t)a.window, a.send, a.sendBytes, 0, a.sendCounts,
                                        a.sendOffsets, a.recvOffset, a.slotBytes, a.recvCountsOffset, a.stagingOffset,
                                        a.countStagingOffset, a.lsaSignalOffset, a.ginSignalBase, a.seqState, a.rank,
                                        a.nranks, a.chunksPerPeer, a.maxChunksPerPeer, a.errorFlags);
}
