// moe_net/topology.cuh - nodes, entry ranks and slots (MoeNetTopology), the table's check, and the
// blocks per chunk of the high-throughput launches.
#pragma once

#include "sections.cuh"

namespace moe_net {

// ------------------------------------------------------------------------------------------------
// Topology (MoeNetTopology): node of a rank, the entry rank of node D for sender s, its slot there.
// ------------------------------------------------------------------------------------------------
GIN_DEVICE_INLINE int node_rank(const MoeNetTopology& t, int D, int i) { return t.nodeRank[t.nodeStart[D] + i]; }
GIN_DEVICE_INLINE int entry_of(const MoeNetTopology& t, int s, int D) { return node_rank(t, D, t.localOf[s] % t.nodeSize[D]); }
GIN_DEVICE_INLINE int slot_of(const MoeNetTopology& t, int s, int D) { return t.nodeOf[s] * t.slotsPerNode + t.localOf[s] / t.nodeSize[D]; }
// The source that rank `me` serves as entry in slot sigma, or -1 (no such rank, or its own node).
GIN_DEVICE_INLINE int slot_source(const MoeNetTopology& t, int me, int sigma) {
  const int S = sigma / t.slotsPerNode, j = sigma % t.slotsPerNode, D = t.nodeOf[me];
  if (S == D || S < 0 || S >= t.nodes) return -1;
  const int li = j * t.nodeSize[D] + t.localOf[me];
  return li < t.nodeSize[S] ? node_rank(t, S, li) : -1;
}
// The k-th slot over the nodes other than `me`'s: k in [0, (N - 1) * F).
GIN_DEVICE_INLINE int remote_slot(const MoeNetTopology& t, int me, int k) {
  const int S = k / t.slotsPerNode, own = t.nodeOf[me];
  return (S < own ? S : S + 1) * t.slotsPerNode + k % t.slotsPerNode;
}
GIN_DEVICE_INLINE int remote_node(const MoeNetTopology& t, int me, int k) { return k < t.nodeOf[me] ? k : k + 1; }

// Every rank's place is consistent and the slots suffice (the host computed the table; a bad one
// would make ranks disagree on who sends where, so it is refused before anything is sent).
GIN_DEVICE_INLINE bool topology_ok(const MoeNetTopology& t, int R) {
  if (t.nodes < 1 || t.nodes > R || t.slotsPerNode < 1 || t.maxNodeSize < 1 || t.maxNodeSize > R) return false;
  int sum = 0;
  for (int D = 0; D < t.nodes; ++D) {
    if (t.nodeSize[D] < 1 || t.nodeSize[D] > t.maxNodeSize || t.nodeStart[D] != sum) return false;
    sum += t.nodeSize[D];
  }
  if (sum != R) return false;
  for (int r = 0; r < R; ++r) {
    const int D = t.nodeOf[r];
    if (D < 0 || D >= t.nodes || t.localOf[r] < 0 || t.localOf[r] >= t.nodeSize[D] || node_rank(t, D, t.localOf[r]) != r) return false;
  }
  for (int S = 0; S < t.nodes; ++S)
    for (int D = 0; D < t.nodes; ++D)
      if ((t.nodeSize[S] + t.nodeSize[D] - 1) / t.nodeSize[D] > t.slotsPerNode) return false;
  return true;
}

// Blocks per chunk of each HT launch on rank `me`.
GIN_DEVICE_INLINE int ht_dispatch_blocks_per_chunk(const MoeNetTopology& t, int me, int R) {
  const int G = t.nodeSize[t.nodeOf[me]], N = t.nodes;
  return G + (N - 1) + (N - 1) * t.slotsPerNode * G + R;
}
GIN_DEVICE_INLINE int ht_combine_blocks_per_chunk(const MoeNetTopology& t, int R) { return R + (t.nodes - 1) * t.slotsPerNode + R; }

}  // namespace moe_net
