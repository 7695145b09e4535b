// moe_net/launch_checks.cuh - launch_ok: the dims, window, grid, topology and devComm checks every
// entry point runs first.
#pragma once

#include "topology.cuh"

namespace moe_net {

// The blocks of a whole call of an entry point and how many of them, from block 0, are its sending
// roles: a SEND launch has that grid, a COMPLETE launch the rest (its block b runs role block
// send + b). HT needs a checked topology.
struct Roles {
  uint32_t total, send;
};
GIN_DEVICE_INLINE Roles roles_of(const MoeNetDims& d, const MoeNetTopology& topo, int mode, bool dispatchSide) {
  const uint32_t C = (uint32_t)d.chunks, R = (uint32_t)d.nRanks;
  if (mode == MOE_NET_MODE_LL) return {2u * R * C, R * C};
  if (!dispatchSide) return {C * (uint32_t)ht_combine_blocks_per_chunk(topo, d.nRanks), C * R};
  const uint32_t G = (uint32_t)topo.nodeSize[topo.nodeOf[d.rank]], N = (uint32_t)topo.nodes;
  return {C * (uint32_t)ht_dispatch_blocks_per_chunk(topo, d.rank, d.nRanks), C * (G + N - 1)};
}
GIN_DEVICE_INLINE uint32_t phase_grid(const Roles& r, int phase) {
  return phase == MOE_NET_PHASE_ALL ? r.total : phase == MOE_NET_PHASE_SEND ? r.send : r.total - r.send;
}
// The role block this block runs.
GIN_DEVICE_INLINE int role_block(const Roles& r, int phase) { return (int)blockIdx.x + (phase == MOE_NET_PHASE_COMPLETE ? (int)r.send : 0); }

// Launch checks shared by every entry; every block reaches the same verdict, block 0 reports
// MOE_ERR_CONFIG (or GIN_ERR_BAD_ARGS for a devComm that cannot serve the GIN peers).
GIN_DEVICE_INLINE bool launch_ok(const ncclDevComm& comm, ncclWindow_t window, const MoeNetDims& d, const MoeNetSections& net,
                                 const MoeNetTopology& topo, const MoeNetForward& fwd, int mode, bool dispatchSide, int phase,
                                 const void* workspace, uint32_t* errorFlags) {
  const int R = d.nRanks;
  bool ok = window != nullptr && workspace != nullptr && moe_sizes_ok(R, d.numExperts, d.topK, d.hidden, d.maxTokens) &&
            R <= MOE_NET_MAX_RANKS && d.rank >= 0 && d.rank < R && comm.rank == d.rank && comm.nRanks == R && d.chunks >= 1 &&
            d.numExperts / R <= MOE_NET_MAX_LOCAL_EXPERTS && d.rowBytes > 0 && d.expertAlignment >= 1 &&
            d.expertAlignment <= MOE_MAX_ALIGNMENT &&
            moe_recv_capacity_rows(R, d.numExperts, d.topK, d.maxTokens, d.expertAlignment) < (1ull << 31) &&
            blockDim.x == MOE_NET_THREADS && blockDim.y == 1 && blockDim.z == 1 && gridDim.y == 1 && gridDim.z == 1 && gridDim.x <= MOE_NET_MAX_BLOCKS &&
            (net.sectionBytes & 255u) == 0 && (net.flagOffset & 7u) == 0 && (fwd.countersOffset & 7u) == 0 &&
            phase >= MOE_NET_PHASE_ALL && phase <= MOE_NET_PHASE_COMPLETE;
  if (ok && mode == MOE_NET_MODE_LL) ok = gridDim.x == phase_grid(roles_of(d, topo, mode, dispatchSide), phase);
  if (ok && mode == MOE_NET_MODE_HT) {
    ok = topology_ok(topo, R) && (fwd.htFlagOffset & 7u) == 0 && (fwd.node.flagOffset & 7u) == 0 && (fwd.part.flagOffset & 7u) == 0 &&
         (fwd.node.sectionBytes & 255u) == 0 && (fwd.part.sectionBytes & 255u) == 0 && (fwd.fwdPosOffset & 3u) == 0 &&
         (fwd.nodePosOffset & 3u) == 0 && (fwd.fwdCountOffset & 3u) == 0;
    ok = ok && gridDim.x == phase_grid(roles_of(d, topo, mode, dispatchSide), phase);
    // node peers outside the LSA team (an emulated node) need staging for the forwarded sections
    if (ok && fwd.fwdStageSlots == 0) {
      const ncclTeam world = ncclTeamWorld(comm), lsa = ncclTeamLsa(comm);
      const int D = topo.nodeOf[d.rank];
      for (int q = 0; q < topo.nodeSize[D]; ++q) ok = ok && ncclTeamRankIsMember(lsa, world, node_rank(topo, D, q));
    }
  }
  if (!ok) {
    if (blockIdx.x == 0 && threadIdx.x == 0) gin_error_set(errorFlags, MOE_ERR_CONFIG);
    return false;
  }
  const ncclTeam world = ncclTeamWorld(comm), lsa = ncclTeamLsa(comm);
  if (lsa.nRanks < world.nRanks) {
    ok = comm.ginConnectionCount > 0 && !comm.ginIsRailed && net.signalBase >= 0 &&
         (uint64_t)net.signalBase + 2ull * (uint64_t)R <= (uint64_t)comm.ginSignalCount;
    if (mode == MOE_NET_MODE_HT) {
      const uint64_t S = (uint64_t)topo.nodes * (uint64_t)topo.slotsPerNode, G = (uint64_t)topo.maxNodeSize;
      ok = ok && fwd.htSignalBase >= 0 && (uint64_t)fwd.htSignalBase + 4ull * R <= (uint64_t)comm.ginSignalCount &&
           fwd.node.signalBase >= 0 && (uint64_t)fwd.node.signalBase + 2ull * S * (uint64_t)d.chunks <= (uint64_t)comm.ginSignalCount &&
           fwd.part.signalBase >= 0 && (uint64_t)fwd.part.signalBase + 2ull * S * G * (uint64_t)d.chunks <= (uint64_t)comm.ginSignalCount;
    }
    if (!ok && blockIdx.x == 0 && threadIdx.x == 0) gin_error_set(errorFlags, GIN_ERR_BAD_ARGS);
  }
  return ok;
}

}  // namespace moe_net
