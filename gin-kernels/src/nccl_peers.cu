// nccl_peers.cu: the one kernel that depends on NCCL's device ABI (ncclDevComm by value,
// ncclWindow_t). It turns a symmetric window into the plain peerBases table that every other
// gin4j kernel uses, so only this code object has to be rebuilt per NCCL release.
// Uses only calls present in both NCCL 2.28.3 and 2.29.x: ncclTeamWorld/ncclTeamLsa(devComm),
// ncclTeamRankIsMember, ncclTeamRankToTeam, ncclGetLsaPointer.
#include "include/gin_device.cuh"
#include "abi/a2a.h"  // GinResolvePeersArgs, GIN_PEERS_ERR_NRANKS_MISMATCH (gin-kernels/abi/a2a.h)
#include <nccl.h>
#include <nccl_device.h>

#if !defined(NCCL_VERSION_CODE) || NCCL_VERSION_CODE < 22803
#error "gin_resolve_peers needs the NCCL >= 2.28.3 device API (nccl_device.h)"
#endif

// Arguments: GinResolvePeersArgs (abi/a2a.h), after the device communicator.
// peerBases[p] = address of rank p's window (+ windowOffset) as mapped in this process, for
// p < nranks; 0 where p is not in this rank's load/store-accessible (LSA) team or p is not a
// rank of devComm. peerBases[own rank] is the own window.
GIN_KERNEL void gin_resolve_peers(const ncclDevComm devComm, const GinResolvePeersArgs a) {
  const ncclWindow_t window = (ncclWindow_t)a.window;
  const int32_t nranks = a.nranks;
  uint64_t* const peerBases = a.peerBases;
  uint32_t* const errorFlags = a.errorFlags;
  const ncclTeam world = ncclTeamWorld(devComm);
  const ncclTeam lsa = ncclTeamLsa(devComm);
  if (nranks != world.nRanks && gin_global_thread_id() == 0 && errorFlags != nullptr) {
    atomicOr(errorFlags, GIN_PEERS_ERR_NRANKS_MISMATCH);
  }
  const uint64_t stride = gin_grid_threads();
  for (uint64_t i = gin_global_thread_id(); i < (uint64_t)(nranks > 0 ? nranks : 0); i += stride) {
    const int peer = (int)i;
    uint64_t base = 0;
    if (peer < world.nRanks && ncclTeamRankIsMember(lsa, world, peer)) {
      const int lsaPeer = ncclTeamRankToTeam(lsa, world, peer);
      base = (uint64_t)(uintptr_t)ncclGetLsaPointer(window, (size_t)a.windowOffset, lsaPeer);
    }
    peerBases[i] = base;
  }
}
