// moe_net/targets.cuh - per-peer targets: where a writer's section for a peer goes (LSA stores, or a
// staging section for GIN puts), how it is published (a flag add, or puts with a signal) and how a
// reader waits for it.
#pragma once

#include "sections.cuh"
#include "../include/gin_signal.cuh"  // the GIN signal wait (ends at the time-out or the abort)

namespace moe_net {

// ------------------------------------------------------------------------------------------------
// Where a writer's section for peer p goes, and how it is published. Over LSA (p in this rank's
// LSA team): stores straight into p's section at window offset `recv`, then a system-scope add to
// p's flag word at `flag`. Otherwise: stores into this rank's staging section at `stage`, then
// ncclGin puts of the written pieces to `recv` on p, the last with an increment of p's signal.
// ------------------------------------------------------------------------------------------------
struct Target {
  uint8_t* bytes;
  bool lsa;
  int lsaPeer;
  int peer;
  uint64_t recv, stage, flag;
  int signal;
};

GIN_DEVICE_INLINE Target target(const ncclDevComm& comm, ncclWindow_t window, int p, uint64_t recv, uint64_t stage, uint64_t flag,
                                int signal) {
  const ncclTeam world = ncclTeamWorld(comm), lsa = ncclTeamLsa(comm);
  Target t;
  t.peer = p;
  t.recv = recv;
  t.stage = stage;
  t.flag = flag;
  t.signal = signal;
  t.lsa = ncclTeamRankIsMember(lsa, world, p);
  t.lsaPeer = t.lsa ? ncclTeamRankToTeam(lsa, world, p) : -1;
  t.bytes = t.lsa ? (uint8_t*)ncclGetLsaPointer(window, recv, t.lsaPeer) : (uint8_t*)ncclGetLocalPointer(window, stage);
  return t;
}

// The low-latency target of writer `rank` for reader p in an exchange: p's receive section and flag
// [parity][rank], this rank's staging section [parity][p], p's signal [parity][rank].
GIN_DEVICE_INLINE Target ll_target(const ncclDevComm& comm, ncclWindow_t window, const MoeNetSections& net, int parity, int rank, int R,
                                   int p, uint64_t flagOffset, int signalBase) {
  return target(comm, window, p, section(net.recvOffset, net, parity, R, rank), section(net.stageOffset, net, parity, R, p),
                flagOffset + 8ull * ((uint64_t)parity * R + rank), signalBase + parity * R + rank);
}

// Thread 0, after the block's stores into the target: over LSA one system-scope add to the peer's
// flag; over GIN the puts of the pieces [lo, hi) (at most kPieces), the last with a signal increment
// (NCCL shows a signal only after its put's payload and every earlier put of the context to that
// peer), or the signal alone when nothing is to be put; then a flush.
template <int kPieces>
GIN_DEVICE_INLINE void publish(const ncclDevComm& comm, ncclWindow_t window, const Target& t, const uint64_t (&lo)[kPieces],
                               const uint64_t (&hi)[kPieces]) {
  if (t.lsa) {
    gin_fence_acq_rel_sys();
    atomicAdd_system((unsigned long long*)ncclGetLsaPointer(window, t.flag, t.lsaPeer), 1ull);
    return;
  }
  const ncclTeam world = ncclTeamWorld(comm);
  ncclGin gin{comm, kGinContext};
  const ncclGinSignal_t sig = (ncclGinSignal_t)t.signal;
  int last = -1;
  for (int i = 0; i < kPieces; ++i)
    if (hi[i] > lo[i]) last = i;
  if (last < 0) {
    gin.signal(world, t.peer, ncclGin_SignalInc{sig}, ncclCoopThread(), ncclGin_None{}, cuda::thread_scope_thread,
               cuda::thread_scope_system);
    gin.flush(ncclCoopThread());
    return;
  }
  for (int i = 0; i <= last; ++i) {
    for (uint64_t off = lo[i]; off < hi[i]; off += kMaxPutBytes) {
      const uint64_t n = hi[i] - off < kMaxPutBytes ? hi[i] - off : kMaxPutBytes;
      if (i == last && off + n == hi[i])
        gin.put(world, t.peer, window, t.recv + off, window, t.stage + off, n, ncclGin_SignalInc{sig}, ncclGin_None{}, ncclCoopThread(),
                ncclGin_None{}, cuda::thread_scope_thread, cuda::thread_scope_system);
      else
        gin.put(world, t.peer, window, t.recv + off, window, t.stage + off, n, ncclGin_None{}, ncclGin_None{}, ncclCoopThread(),
                ncclGin_None{}, cuda::thread_scope_thread, cuda::thread_scope_system);
    }
  }
  // The kernel ends only once the network has taken every source byte: the caller may then reuse or
  // free the staging (close the instance, say). Without it, a put still queued when the stream went
  // idle read freed memory. NCCL's flush ends at the transport's completions, error completions
  // included, or at the communicator's abort.
  gin.flush(ncclCoopThread());
}

// One thread waits until writer w's flag word (this rank's window offset `flag`, when w is in the
// LSA team) or GIN signal `signal` reaches `threshold`. False if it gave up (GIN_ERR_TIMEOUT set).
GIN_DEVICE_INLINE bool wait_one(const ncclDevComm& comm, ncclWindow_t window, int w, uint64_t flag, int signal, uint64_t threshold,
                                uint32_t* errorFlags) {
  const ncclTeam world = ncclTeamWorld(comm), lsa = ncclTeamLsa(comm);
  if (ncclTeamRankIsMember(lsa, world, w)) return gin_wait_geq_acquire_polls((const uint64_t*)ncclGetLocalPointer(window, flag), threshold, errorFlags);
  ncclGin gin{comm, kGinContext};
  return gin_wait_signal_geq(gin, (ncclGinSignal_t)signal, threshold, errorFlags);  // also ends at the communicator's abort
}

// Threads 0..R-1 each wait for source tid's low-latency sections (flag / signal [parity][tid]).
// False for every thread if any wait timed out (the caller then touches nothing).
GIN_DEVICE_INLINE bool wait_all_sources(const ncclDevComm& comm, ncclWindow_t window, const MoeNetSections& net, int parity,
                                        int R, uint64_t threshold, uint32_t* errorFlags) {
  bool ok = true;
  const int s = (int)threadIdx.x;
  if (s < R) ok = wait_one(comm, window, s, net.flagOffset + 8ull * ((uint64_t)parity * R + s), net.signalBase + parity * R + s, threshold, errorFlags);
  return !__syncthreads_or(!ok);
}

}  // namespace moe_net
