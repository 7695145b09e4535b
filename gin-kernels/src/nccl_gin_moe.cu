// nccl_gin_moe.cu - MoE dispatch and combine across nodes over NCCL's device API: per peer, stores
// into its window when it is in this rank's LSA team (same node), ncclGin puts with signals when it
// is not. One row crosses to a destination rank once per token, however many of that rank's experts
// the token picked (the low-latency rule: tokens x distinct destination ranks x row bytes).
//
//   moe_net_dispatch  after moe_host_layout (moe_host code object) on the same MoE workspace and
//                     stream: sender blocks pack each destination's rows and slot metadata into a
//                     section (staged locally for a GIN peer, then two puts), receiver blocks wait
//                     for every source, then place the rows expert-major into recvX, the same
//                     layout, byte for byte, as the LSA and HOST paths.
//   moe_net_combine   the inverse: expert-side blocks reduce each received token's rows into one
//                     bf16 partial per (token, expert rank) and send it back; source-side blocks
//                     add the partials of every rank the token went to into y.
//                     With rowValues set, the same exchange returns one f32 per received row to
//                     its (token, k) instead (returnRowValues).
//   moe_net_reset     zeroes the instance's GIN signals once, before the first call (then a
//                     barrier across ranks).
//
// Calls alternate between two section sets (parity n % 2), so back-to-back calls need no ready
// handshake and no reset: a writer of call n + 2 reuses the sections of call n only after the
// reader's call n + 1 data reached it, which the reader sent after its call n had ended (stream
// order), and a GIN writer's staging of call n was read by the NIC before its data landed.
//
// The device code is in moe_net/, one header per part of the data path: sections (chunk shares,
// parity, call counters), targets (LSA stores or GIN puts; publish, wait), topology, launch_checks,
// dispatch and combine (both modes), ht_forward and ht_node_reduce (the high-throughput hop through
// a node's entry rank).
// Arguments and window layout: gin-kernels/abi/moe_net.h; protocol notes: docs/kernels.md.
// Needs the GIN device API (NCCL >= 2.29.7); gin-kernels/build skips it against older headers.
#include "moe/routing.cuh"
#include <nccl.h>
#include <nccl_device.h>

#if !defined(NCCL_VERSION_CODE) || NCCL_VERSION_CODE < 22907 || !__has_include(<nccl_device/gin.h>)
#error "nccl_gin_moe.cu needs NCCL's GIN device API (nccl_device/gin.h) from NCCL >= 2.29.7; gin-kernels/build skips it for older headers"
#endif
#include <nccl_device/gin.h>

#include "../abi/moe_net.h"

#include "moe_net/sections.cuh"
#include "moe_net/targets.cuh"
#include "moe_net/topology.cuh"
#include "moe_net/launch_checks.cuh"
#include "moe_net/dispatch.cuh"
#include "moe_net/combine.cuh"
#include "moe_net/ht_forward.cuh"
#include "moe_net/ht_node_reduce.cuh"

// A combine needs expertOut and y; the row values call rowValues and tokenValues, and its [K] word
// rows must fit the sections' bf16 [H] rows (Java refuses a shape where they do not).
GIN_DEVICE_INLINE bool combine_args_ok(const MoeNetCombineArgs& a) {
  const bool ioOk = a.rowValues != nullptr ? a.tokenValues != nullptr && 2 * a.dims.topK <= a.dims.hidden : a.expertOut != nullptr && a.y != nullptr;
  return ioOk && a.numTokens >= 0 && a.numTokens <= a.dims.maxTokens;
}

// ================================================================================================
// Entry points, 1-D grids of MOE_NET_THREADS. Low-latency: 2 * R * chunks blocks; blocks
// [0, R*chunks) are the senders (peer = block / chunks), the rest receive. HT dispatch, per chunk
// in this order: the direct senders (one per rank of this node), the node senders (one per other
// node), the forwarders (one per (slot of another node, rank of this node)), the receivers (one per
// source). HT combine: the partial senders (one per source), the node reducers (one per slot of
// another node), the reducers. Every role waits only on roles before it (on this GPU or a peer's),
// senders never wait, and a GPU schedules blocks in index order, so every wait ends (a full grid
// resident is not needed).
// Staged calls (a.phase): a SEND launch runs the sending roles only (LL: the senders; HT dispatch:
// the direct and node senders; HT combine: the partial senders), the COMPLETE launch after it on
// the stream runs the others. SEND never waits; COMPLETE's roles wait only on SEND roles of this
// rank or its peers, or on COMPLETE roles before them, so the split keeps every wait finite.
// ================================================================================================
extern "C" __global__ void __launch_bounds__(MOE_NET_THREADS)
moe_net_dispatch(const __grid_constant__ ncclDevComm devComm, const __grid_constant__ MoeNetDispatchArgs a) {
  using namespace moe_net;
  __shared__ uint64_t sharedWords[4];
  const ncclWindow_t window = (ncclWindow_t)(uintptr_t)a.window;
  if (!launch_ok(devComm, window, a.dims, a.net, a.topo, a.fwd, MOE_NET_MODE_LL, true, a.phase, a.workspace, a.errorFlags)) return;
  const MoeNetDims& d = a.dims;
  if ((a.numTokens < 0 || a.numTokens > d.maxTokens || a.x == nullptr || a.topkIdx == nullptr || a.topkWeights == nullptr ||
       a.recvX == nullptr || a.recvWeights == nullptr || a.recvCounts == nullptr)) {
    if (blockIdx.x == 0 && threadIdx.x == 0) gin_error_set(a.errorFlags, MOE_ERR_CONFIG);
    return;
  }
  uint64_t* counters = counters_of(window, a.fwd, 0);
  const Call call = begin_call(counters, MOE_NET_MODE_LL, a.phase, sharedWords);
  if (call.count == 0) {  // a COMPLETE before any call of this mode (Java pairs every other COMPLETE with its SEND)
    if (blockIdx.x == 0 && threadIdx.x == 0) gin_error_set(a.errorFlags, MOE_ERR_CONFIG);
    return;
  }
  const int parity = call.parity, senders = d.nRanks * d.chunks;
  const int role = role_block(roles_of(d, a.topo, MOE_NET_MODE_LL, true), a.phase);
  if (role < senders) {
    dispatch_send(devComm, a, role / d.chunks, role % d.chunks, parity, a.net.flagOffset, a.net.signalBase);
  } else {
    const int b = role - senders;
    if (wait_all_sources(devComm, window, a.net, parity, d.nRanks, (uint64_t)d.chunks * call.count, a.errorFlags))
      dispatch_receive(devComm, a, b / d.chunks, b % d.chunks, parity);
  }
  __syncthreads();
  end_call(counters, call);
}

extern "C" __global__ void __launch_bounds__(MOE_NET_THREADS)
moe_net_combine(const __grid_constant__ ncclDevComm devComm, const __grid_constant__ MoeNetCombineArgs a) {
  using namespace moe_net;
  __shared__ uint64_t sharedWords[4];
  const ncclWindow_t window = (ncclWindow_t)(uintptr_t)a.window;
  if (!launch_ok(devComm, window, a.dims, a.net, a.topo, a.fwd, MOE_NET_MODE_LL, false, a.phase, a.workspace, a.errorFlags)) return;
  const MoeNetDims& d = a.dims;
  uint64_t* state = state_of(a.workspace);
  if (!combine_args_ok(a)) {
    if (blockIdx.x == 0 && threadIdx.x == 0) gin_error_set(a.errorFlags, MOE_ERR_CONFIG);
    return;
  }
  if ((uint64_t)a.numTokens != state[MOE_STATE_DISPATCH_TOKENS]) {
    if (blockIdx.x == 0 && threadIdx.x == 0) gin_error_set(a.errorFlags, MOE_ERR_TOKENS);
  }
  uint64_t* counters = counters_of(window, a.fwd, 1);
  const Call call = begin_call(counters, MOE_NET_MODE_LL, a.phase, sharedWords);
  if (call.count == 0) {  // a COMPLETE before any call of this mode (Java pairs every other COMPLETE with its SEND)
    if (blockIdx.x == 0 && threadIdx.x == 0) gin_error_set(a.errorFlags, MOE_ERR_CONFIG);
    return;
  }
  const int parity = call.parity, R = d.nRanks, senders = R * d.chunks;
  const int role = role_block(roles_of(d, a.topo, MOE_NET_MODE_LL, false), a.phase);
  if (role < senders) {
    const int p = role / d.chunks;
    const Target t = ll_target(devComm, window, a.net, parity, d.rank, R, p, a.net.flagOffset, a.net.signalBase);
    combine_send(devComm, a, p, role % d.chunks, parity, t);
  } else if (wait_all_sources(devComm, window, a.net, parity, R, (uint64_t)d.chunks * call.count, a.errorFlags)) {
    combine_reduce(a, window, role - senders, senders, parity, false);
  }
  __syncthreads();
  end_call(counters, call);
}

extern "C" __global__ void __launch_bounds__(MOE_NET_THREADS)
moe_net_dispatch_ht(const __grid_constant__ ncclDevComm devComm, const __grid_constant__ MoeNetDispatchArgs a) {
  using namespace moe_net;
  __shared__ uint64_t sharedWords[4];
  const ncclWindow_t window = (ncclWindow_t)(uintptr_t)a.window;
  if (!launch_ok(devComm, window, a.dims, a.net, a.topo, a.fwd, MOE_NET_MODE_HT, true, a.phase, a.workspace, a.errorFlags)) return;
  const MoeNetDims& d = a.dims;
  const MoeNetTopology& topo = a.topo;
  if ((a.numTokens < 0 || a.numTokens > d.maxTokens || a.x == nullptr || a.topkIdx == nullptr || a.topkWeights == nullptr ||
       a.recvX == nullptr || a.recvWeights == nullptr || a.recvCounts == nullptr)) {
    if (blockIdx.x == 0 && threadIdx.x == 0) gin_error_set(a.errorFlags, MOE_ERR_CONFIG);
    return;
  }
  uint64_t* counters = counters_of(window, a.fwd, 0);
  const Call call = begin_call(counters, MOE_NET_MODE_HT, a.phase, sharedWords);
  if (call.count == 0) {  // a COMPLETE before any call of this mode (Java pairs every other COMPLETE with its SEND)
    if (blockIdx.x == 0 && threadIdx.x == 0) gin_error_set(a.errorFlags, MOE_ERR_CONFIG);
    return;
  }
  const uint64_t threshold = (uint64_t)d.chunks * call.count;
  const int R = d.nRanks, C = d.chunks, myNode = topo.nodeOf[d.rank], Gm = topo.nodeSize[myNode], N = topo.nodes;
  const int remoteSlots = (N - 1) * topo.slotsPerNode;
  int b = role_block(roles_of(d, topo, MOE_NET_MODE_HT, true), a.phase);
  if (b < Gm * C) {
    dispatch_send(devComm, a, node_rank(topo, myNode, b / C), b % C, call.parity, a.fwd.htFlagOffset, a.fwd.htSignalBase);
  } else if ((b -= Gm * C) < (N - 1) * C) {
    ht_node_send(devComm, a, remote_node(topo, d.rank, b / C), b % C, call.parity);
  } else if ((b -= (N - 1) * C) < remoteSlots * Gm * C) {
    const int unit = b / C;
    ht_forward(devComm, a, remote_slot(topo, d.rank, unit / Gm), unit % Gm, b % C, call.parity, call.count);
  } else {
    b -= remoteSlots * Gm * C;
    const int s = b / C;
    // source s's section comes from s itself (this node) or from this node's entry rank for s
    bool ok = true;
    if ((int)threadIdx.x < R) {
      const int src = (int)threadIdx.x, w = topo.nodeOf[src] == myNode ? src : entry_of(topo, src, myNode);
      ok = wait_one(devComm, window, w, a.fwd.htFlagOffset + 8ull * ((uint64_t)call.parity * R + src), a.fwd.htSignalBase + call.parity * R + src,
                    threshold, a.errorFlags);
    }
    if (!__syncthreads_or(!ok)) dispatch_receive(devComm, a, s, b % C, call.parity);
  }
  __syncthreads();
  end_call(counters, call);
}

extern "C" __global__ void __launch_bounds__(MOE_NET_THREADS)
moe_net_combine_ht(const __grid_constant__ ncclDevComm devComm, const __grid_constant__ MoeNetCombineArgs a) {
  using namespace moe_net;
  __shared__ uint64_t sharedWords[4];
  const ncclWindow_t window = (ncclWindow_t)(uintptr_t)a.window;
  if (!launch_ok(devComm, window, a.dims, a.net, a.topo, a.fwd, MOE_NET_MODE_HT, false, a.phase, a.workspace, a.errorFlags)) return;
  const MoeNetDims& d = a.dims;
  const MoeNetTopology& topo = a.topo;
  const MoeNetForward& f = a.fwd;
  uint64_t* state = state_of(a.workspace);
  if (!combine_args_ok(a)) {
    if (blockIdx.x == 0 && threadIdx.x == 0) gin_error_set(a.errorFlags, MOE_ERR_CONFIG);
    return;
  }
  if ((uint64_t)a.numTokens != state[MOE_STATE_DISPATCH_TOKENS]) {
    if (blockIdx.x == 0 && threadIdx.x == 0) gin_error_set(a.errorFlags, MOE_ERR_TOKENS);
  }
  uint64_t* counters = counters_of(window, f, 1);
  const Call call = begin_call(counters, MOE_NET_MODE_HT, a.phase, sharedWords);
  if (call.count == 0) {  // a COMPLETE before any call of this mode (Java pairs every other COMPLETE with its SEND)
    if (blockIdx.x == 0 && threadIdx.x == 0) gin_error_set(a.errorFlags, MOE_ERR_CONFIG);
    return;
  }
  const uint64_t threshold = (uint64_t)d.chunks * call.count;
  const int R = d.nRanks, C = d.chunks, parity = call.parity, myNode = topo.nodeOf[d.rank];
  const int S = topo.nodes * topo.slotsPerNode, G = topo.maxNodeSize, remoteSlots = (topo.nodes - 1) * topo.slotsPerNode;
  int b = role_block(roles_of(d, topo, MOE_NET_MODE_HT, false), a.phase);
  if (b < R * C) {
    const int s = b / C;
    Target t;
    if (topo.nodeOf[s] == myNode) {
      t = ll_target(devComm, window, a.net, parity, d.rank, R, s, f.htFlagOffset + 16ull * R, f.htSignalBase + 2 * R);
    } else {  // to this node's entry for s, as node peer localOf[rank] of its slot for s
      // each chunk on its own flag / signal, so the entry reduces a chunk once it is there
      const int e = entry_of(topo, s, myNode), sigma = slot_of(topo, s, myNode), q = topo.localOf[d.rank];
      const uint64_t idx = ((uint64_t)parity * S + sigma) * G + q, unit = part_chunk(parity, S, sigma, G, q, C, b % C);
      t = target(devComm, window, e, f.part.recvOffset + idx * f.part.sectionBytes, section(a.net.stageOffset, a.net, parity, R, s),
                 f.part.flagOffset + 8ull * unit, f.part.signalBase + (int)unit);
    }
    combine_send(devComm, a, s, b % C, parity, t);
  } else if ((b -= R * C) < remoteSlots * C) {
    ht_node_reduce(devComm, a, remote_slot(topo, d.rank, b / C), b % C, parity, call.count);
  } else {
    b -= remoteSlots * C;
    // the writers: this node's ranks, and this rank's entry in every other node
    bool ok = true;
    if ((int)threadIdx.x < R) {
      const int w = (int)threadIdx.x, D = topo.nodeOf[w];
      if (D == myNode || entry_of(topo, d.rank, D) == w)
        ok = wait_one(devComm, window, w, f.htFlagOffset + 8ull * (2ull * R + (uint64_t)parity * R + w), f.htSignalBase + 2 * R + parity * R + w,
                      threshold, a.errorFlags);
    }
    if (!__syncthreads_or(!ok)) combine_reduce(a, window, b, R * C, parity, true);
  }
  __syncthreads();
  end_call(counters, call);
}

// Once per devComm on every rank before the first call, then a barrier across ranks. Any grid.
extern "C" __global__ void moe_net_reset(const __grid_constant__ ncclDevComm devComm, const __grid_constant__ MoeNetResetArgs a) {
  const bool ok = a.signalBase >= 0 && a.signalCount >= 0 &&
                  (devComm.ginConnectionCount == 0 || (uint64_t)a.signalBase + (uint64_t)a.signalCount <= (uint64_t)devComm.ginSignalCount);
  if (!ok) {
    if (gin_global_thread_id() == 0) gin_error_set(a.errorFlags, GIN_ERR_BAD_ARGS);
    return;
  }
  if (devComm.ginConnectionCount == 0) return;  // one node: no GIN signals exist
  ncclGin gin{devComm, moe_net::kGinContext};
  for (uint64_t i = gin_global_thread_id(); i < (uint64_t)a.signalCount; i += gin_grid_threads())
    gin.resetSignal((ncclGinSignal_t)(a.signalBase + (int)i));
}
