// a2a.cu - GPU-initiated all-to-all and all-to-all-v inside a node (LSA: every peer's symmetric
// window is reachable by load/store through peerBases). Entry points:
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
// The mechanisms, one header per part (a2a/):
//   window_layout          block-size limits; signal, staging and counter sizes (host and device)
//   blocks                 block -> (peer, chunk), chunk ranges, argument checks, message, self copy
//   direct                 the direct protocol and its remote copy (VectorCopy)
//   ll, ll128              the LL and LL128 protocols
//   copy_engine            the copy-engine variant's argument check and signal exchange
//   entry_points           the extern "C" declarations (a test program links this object)
//   direct_copy_candidates test-only remote copies for the direct protocol (a2a_test; not included here)
// Every entry takes one argument struct of gin-kernels/abi/a2a.h by value (the fields are described
// there). Window layout, grid rules, error bits and the memory-ordering arguments (including the
// proof that the LL protocol needs no ready handshake) are in docs/kernels.md, section "a2a.cu";
// the short form of each argument is repeated next to the code that relies on it.
#include "a2a/entry_points.cuh"
#include "a2a/direct.cuh"
#include "a2a/ll.cuh"
#include "a2a/ll128.cuh"
#include "a2a/copy_engine.cuh"

// ================================================================================================
// Entry points. Grid: nranks * chunksPerPeer blocks (1-D), all co-resident; blockDim.x <= 1024
// (direct) or <= 512 (LL, LL128), a multiple of 32 recommended (LL128: required, a multiple of the
// warp size); no dynamic shared memory. Arguments: abi/a2a.h. Each waits for prior
// grids first (gin_wait_prior_grids), so it may be launched as a programmatic dependent launch.
// ================================================================================================

GIN_KERNEL void __launch_bounds__(GIN_A2A_MAX_THREADS) gin_a2a(const __grid_constant__ GinA2aArgs a) {
  gin_wait_prior_grids();  // programmatic dependent launch: the previous kernel is done
  gin_a2a_detail::a2a_direct<false>(a.send, 0, a.bytesPerPeer, nullptr, nullptr, a.peerBases, a.recvOffset, a.slotBytes, 0,
                                    a.signalOffset, a.seqState, a.rank, a.nranks, a.chunksPerPeer, a.maxChunksPerPeer,
                                    a.errorFlags);
}

GIN_KERNEL void __launch_bounds__(GIN_A2A_MAX_THREADS) gin_a2av(const __grid_constant__ GinA2avArgs a) {
  gin_wait_prior_grids();  // programmatic dependent launch: the previous kernel is done
  gin_a2a_detail::a2a_direct<true>(a.send, a.sendBytes, 0, a.sendCounts, a.sendOffsets, a.peerBases, a.recvOffset,
                                   a.slotBytes, a.recvCountsOffset, a.signalOffset, a.seqState, a.rank, a.nranks,
                                   a.chunksPerPeer, a.maxChunksPerPeer, a.errorFlags);
}

GIN_KERNEL void __launch_bounds__(GIN_A2A_LL_MAX_THREADS) gin_a2a_ll(const __grid_constant__ GinA2aStagedArgs a) {
  gin_wait_prior_grids();  // programmatic dependent launch: the previous kernel is done
  gin_a2a_detail::a2a_ll<false>(a.send, 0, a.bytesPerPeer, nullptr, nullptr, a.peerBases, a.recvOffset, a.slotBytes, 0,
                                a.stagingOffset, a.stagingCapacity, a.seqState, a.rank, a.nranks, a.chunksPerPeer,
                                a.maxChunksPerPeer, a.errorFlags);
}

GIN_KERNEL void __launch_bounds__(GIN_A2A_LL_MAX_THREADS) gin_a2av_ll(const __grid_constant__ GinA2avStagedArgs a) {
  gin_wait_prior_grids();  // programmatic dependent launch: the previous kernel is done
  gin_a2a_detail::a2a_ll<true>(a.send, a.sendBytes, 0, a.sendCounts, a.sendOffsets, a.peerBases, a.recvOffset,
                               a.slotBytes, a.recvCountsOffset, a.stagingOffset, a.stagingCapacity, a.seqState, a.rank,
                               a.nranks, a.chunksPerPeer, a.maxChunksPerPeer, a.errorFlags);
}

GIN_KERNEL void __launch_bounds__(GIN_A2A_LL128_MAX_THREADS) gin_a2a_ll128(const __grid_constant__ GinA2aStagedArgs a) {
  gin_wait_prior_grids();  // programmatic dependent launch: the previous kernel is done
  gin_a2a_detail::a2a_ll128<false>(a.send, 0, a.bytesPerPeer, nullptr, nullptr, a.peerBases, a.recvOffset, a.slotBytes,
                                   0, a.stagingOffset, a.stagingCapacity, a.seqState, a.rank, a.nranks, a.chunksPerPeer,
                                   a.maxChunksPerPeer, a.errorFlags);
}

GIN_KERNEL void __launch_bounds__(GIN_A2A_LL128_MAX_THREADS) gin_a2av_ll128(const __grid_constant__ GinA2avStagedArgs a) {
  gin_wait_prior_grids();  // programmatic dependent launch: the previous kernel is done
  gin_a2a_detail::a2a_ll128<true>(a.send, a.sendBytes, 0, a.sendCounts, a.sendOffsets, a.peerBases, a.recvOffset,
                                  a.slotBytes, a.recvCountsOffset, a.stagingOffset, a.stagingCapacity, a.seqState,
                                  a.rank, a.nranks, a.chunksPerPeer, a.maxChunksPerPeer, a.errorFlags);
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

// Thread p (p != rank): s = ++seqState[p][0]; ready[rank][0] := s in p's window (release), then wait
// ready[p][0] >= s in its own window: p's stream has passed every reader of its earlier results, so
// the copy engine may overwrite p's slot. The copies are enqueued by the host after this kernel
// whatever its outcome (a copy engine cannot be told to skip): a time-out here (a peer more than
// GIN_WAIT_TIMEOUT_NS late) is reported through errorFlags, and that call's results are invalid.
GIN_KERNEL void gin_a2a_ce_ready(const __grid_constant__ GinA2aCeSignalArgs a) {
  using namespace gin_a2a_detail;
  const uint64_t* const peerBases = a.peerBases;
  uint64_t* const seqState = a.seqState;
  uint32_t* const errorFlags = a.errorFlags;
  const int rank = a.rank, nranks = a.nranks, maxChunksPerPeer = a.maxChunksPerPeer;
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
  ce_signal_and_wait(peerBases, a.signalOffset, 0, rank, p, maxChunksPerPeer, s, errorFlags);
}

// Runs after this rank's copies into every peer completed (stream order: a completed copy has
// written the peer's memory), so done[rank][0] := s in p's window (release) follows the data; then
// waits done[p][0] >= s in its own window (acquire): p's data for this rank has landed when the
// kernel ends, and stream order makes it visible to whatever runs next.
GIN_KERNEL void gin_a2a_ce_done(const __grid_constant__ GinA2aCeSignalArgs a) {
  using namespace gin_a2a_detail;
  const uint64_t* const peerBases = a.peerBases;
  uint64_t* const seqState = a.seqState;
  uint32_t* const errorFlags = a.errorFlags;
  const int rank = a.rank, nranks = a.nranks, maxChunksPerPeer = a.maxChunksPerPeer;
  if (!ce_args_ok(peerBases, seqState, rank, nranks, maxChunksPerPeer, errorFlags)) return;
  const int p = (int)threadIdx.x;
  if (p >= nranks || p == rank) return;
  if (peerBases[p] == 0) return;  // reported by gin_a2a_ce_ready
  const uint64_t s = seqState[(uint64_t)p * maxChunksPerPeer];  // advanced by this call's gin_a2a_ce_ready
  const uint64_t doneBase = (uint64_t)nranks * (uint64_t)maxChunksPerPeer;
  ce_signal_and_wait(peerBases, a.signalOffset, doneBase, rank, p, maxChunksPerPeer, s, errorFlags);
}

// Any 1-D grid, block <= 1024: the self slot, send + rank*bytesPerPeer -> own window
// recvOffset + rank*slotBytes, any size and alignment, split in 256-byte-aligned block ranges.
GIN_KERNEL void __launch_bounds__(GIN_A2A_MAX_THREADS) gin_a2a_ce_self(const __grid_constant__ GinA2aCeSelfArgs a) {
  using namespace gin_a2a_detail;
  uint64_t lo, hi;
  chunk_range(a.bytesPerPeer, (int)gridDim.x, (int)blockIdx.x, kDirectGranule, lo, hi);
  copy_self<false>(a.peerBases, a.rank, a.send, (uint64_t)a.rank * a.bytesPerPeer, a.bytesPerPeer, lo, hi, a.recvOffset,
                   a.slotBytes, 0, (int)blockIdx.x, threadIdx.x, blockDim.x);
}
