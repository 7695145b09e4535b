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
//   moe_net_reset     zeroes the instance's GIN signals once, before the first call (then a
//                     barrier across ranks).
//
// Calls alternate between two section sets (parity n % 2), so back-to-back calls need no ready
// handshake and no reset: a writer of call n + 2 reuses the sections of call n only after the
// reader's call n + 1 data reached it, which the reader sent after its call n had ended (stream
// order), and a GIN writer's staging of call n was read by the NIC before its data landed.
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

namespace moe_net {

constexpr int kGinContext = 0;
constexpr uint64_t kMaxPutBytes = 1ull << 30;

GIN_DEVICE_INLINE int clamp_count(int v, int M) { return v < 0 ? 0 : (v > M ? M : v); }

GIN_DEVICE_INLINE void part(uint64_t n, int parts, int i, uint64_t& lo, uint64_t& hi) {
  const uint64_t per = (n + (uint64_t)parts - 1) / (uint64_t)parts;
  lo = per * (uint64_t)i;
  if (lo > n) lo = n;
  hi = lo + per;
  if (hi > n) hi = n;
}

GIN_DEVICE_INLINE uint64_t section(uint64_t base, const MoeNetSections& net, int parity, int R, int index) {
  return base + ((uint64_t)parity * (uint64_t)R + (uint64_t)index) * net.sectionBytes;
}

// ------------------------------------------------------------------------------------------------
// Call counters. Per exchange, 256 slots of {low-latency calls of parity 0, of parity 1, HT calls
// of parity 0, of parity 1}. Block b reads slot b and, at its end, writes the updated counts into
// every slot b + k * gridDim.x, so the next launch reads the same counts in every block whatever
// its grid (the two modes have different grids). Call n (all modes, from 1) uses section parity
// n % 2; a flag or signal of one mode and parity reaches chunks x (that mode's calls of that
// parity so far) in call n: each of its writers adds one per chunk and call.
// ------------------------------------------------------------------------------------------------
struct Call {
  uint64_t words[4];
  uint64_t n;
  int parity;
  uint64_t count;  // this mode's calls of this parity, this one included
};

GIN_DEVICE_INLINE Call begin_call(const uint64_t* counters, int mode, uint64_t* shared4) {
  if (threadIdx.x < 4) shared4[threadIdx.x] = counters[4ull * blockIdx.x + threadIdx.x];
  __syncthreads();
  Call c;
  c.n = 1;
  for (int i = 0; i < 4; ++i) {
    c.words[i] = shared4[i];
    c.n += c.words[i];
  }
  c.parity = (int)(c.n & 1u);
  c.count = ++c.words[2 * mode + c.parity];
  return c;
}

GIN_DEVICE_INLINE void end_call(uint64_t* counters, const Call& c) {
  if (threadIdx.x < 4)
    for (uint32_t slot = blockIdx.x; slot < MOE_NET_MAX_BLOCKS; slot += gridDim.x) counters[4ull * slot + threadIdx.x] = c.words[threadIdx.x];
}

GIN_DEVICE_INLINE uint64_t* counters_of(ncclWindow_t window, const MoeNetForward& f, int exchange) {
  return (uint64_t*)ncclGetLocalPointer(window, f.countersOffset) + (uint64_t)exchange * 4ull * MOE_NET_MAX_BLOCKS;
}

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
// flag; over GIN the puts of the pieces [lo, hi) (at most two), the last with a signal increment
// (NCCL shows a signal only after its put's payload and every earlier put of the context to that
// peer), or the signal alone when nothing is to be put.
GIN_DEVICE_INLINE void publish(const ncclDevComm& comm, ncclWindow_t window, const Target& t, const uint64_t (&lo)[2], const uint64_t (&hi)[2]) {
  if (t.lsa) {
    gin_fence_acq_rel_sys();
    atomicAdd_system((unsigned long long*)ncclGetLsaPointer(window, t.flag, t.lsaPeer), 1ull);
    return;
  }
  const ncclTeam world = ncclTeamWorld(comm);
  ncclGin gin{comm, kGinContext};
  const ncclGinSignal_t sig = (ncclGinSignal_t)t.signal;
  int last = -1;
  for (int i = 0; i < 2; ++i)
    if (hi[i] > lo[i]) last = i;
  if (last < 0) {
    gin.signal(world, t.peer, ncclGin_SignalInc{sig}, ncclCoopThread(), ncclGin_None{}, cuda::thread_scope_thread,
               cuda::thread_scope_system);
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
}

// One thread waits until writer w's flag word (this rank's window offset `flag`, when w is in the
// LSA team) or GIN signal `signal` reaches `threshold`. False if it timed out (GIN_ERR_TIMEOUT set).
GIN_DEVICE_INLINE bool wait_one(const ncclDevComm& comm, ncclWindow_t window, int w, uint64_t flag, int signal, uint64_t threshold,
                                uint32_t* errorFlags) {
  const ncclTeam world = ncclTeamWorld(comm), lsa = ncclTeamLsa(comm);
  if (ncclTeamRankIsMember(lsa, world, w)) return gin_wait_geq_acquire_polls((const uint64_t*)ncclGetLocalPointer(window, flag), threshold, errorFlags);
  ncclGin gin{comm, kGinContext};
  uint64_t start = 0;
  for (uint32_t spins = 0;; ++spins) {
    if (gin.readSignal((ncclGinSignal_t)signal, 64, cuda::memory_order_acquire) >= threshold) return true;
    if (gin_wait_timed_out(spins, start, errorFlags)) return false;
  }
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

// Launch checks shared by every entry; every block reaches the same verdict, block 0 reports
// MOE_ERR_CONFIG (or GIN_ERR_BAD_ARGS for a devComm that cannot serve the GIN peers).
GIN_DEVICE_INLINE bool launch_ok(const ncclDevComm& comm, ncclWindow_t window, const MoeNetDims& d, const MoeNetSections& net,
                                 const MoeNetTopology& topo, const MoeNetForward& fwd, int mode, bool dispatchSide,
                                 const void* workspace, uint32_t* errorFlags) {
  const int R = d.nRanks;
  bool ok = window != nullptr && workspace != nullptr && moe_sizes_ok(R, d.numExperts, d.topK, d.hidden, d.maxTokens) &&
            R <= MOE_NET_MAX_RANKS && d.rank >= 0 && d.rank < R && comm.rank == d.rank && comm.nRanks == R && d.chunks >= 1 &&
            d.numExperts / R <= MOE_NET_MAX_LOCAL_EXPERTS && d.rowBytes > 0 && blockDim.x == MOE_NET_THREADS &&
            blockDim.y == 1 && blockDim.z == 1 && gridDim.y == 1 && gridDim.z == 1 && gridDim.x <= MOE_NET_MAX_BLOCKS &&
            (net.sectionBytes & 255u) == 0 && (net.flagOffset & 7u) == 0 && (fwd.countersOffset & 7u) == 0;
  if (ok && mode == MOE_NET_MODE_LL) ok = gridDim.x == 2u * (unsigned)R * (unsigned)d.chunks;
  if (ok && mode == MOE_NET_MODE_HT) {
    ok = topology_ok(topo, R) && (fwd.htFlagOffset & 7u) == 0 && (fwd.node.flagOffset & 7u) == 0 && (fwd.part.flagOffset & 7u) == 0 &&
         (fwd.node.sectionBytes & 255u) == 0 && (fwd.part.sectionBytes & 255u) == 0 && (fwd.fwdPosOffset & 3u) == 0 &&
         (fwd.nodePosOffset & 3u) == 0 && (fwd.fwdCountOffset & 3u) == 0 &&
         (uint64_t)gridDim.x == (uint64_t)d.chunks * (uint64_t)(dispatchSide ? ht_dispatch_blocks_per_chunk(topo, d.rank, R)
                                                                            : ht_combine_blocks_per_chunk(topo, R));
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
           fwd.node.signalBase >= 0 && (uint64_t)fwd.node.signalBase + 2ull * S <= (uint64_t)comm.ginSignalCount &&
           fwd.part.signalBase >= 0 && (uint64_t)fwd.part.signalBase + 2ull * S * G <= (uint64_t)comm.ginSignalCount;
    }
    if (!ok && blockIdx.x == 0 && threadIdx.x == 0) gin_error_set(errorFlags, GIN_ERR_BAD_ARGS);
  }
  return ok;
}

// ------------------------------------------------------------------------------------------------
// Dispatch sender: block (p, c) writes slots [lo, hi) of its rows to destination p: the slot's
// row (x of token sendList[p][i]) and metadata (for each k: p's local expert or -1, the slot in
// that expert's rows from this rank, the weight); chunk 0 also writes the header (tokens, count[L]).
// ------------------------------------------------------------------------------------------------
GIN_DEVICE_INLINE void dispatch_send(const ncclDevComm& comm, const MoeNetDispatchArgs& a, int p, int c, int parity, uint64_t flagOffset,
                                     int signalBase) {
  const MoeNetDims& d = a.dims;
  const int R = d.nRanks, K = d.topK, L = d.numExperts / R, M = d.maxTokens;
  const ncclWindow_t window = (ncclWindow_t)(uintptr_t)a.window;
  const MoeWorkspaceLayout ws = moe_workspace_layout(R, d.numExperts, K, M);
  const int* tokensTo = (const int*)(a.workspace + ws.tokensTo);
  const int* sendList = (const int*)(a.workspace + ws.sendList) + (uint64_t)p * M;
  const int* slotInExpert = (const int*)(a.workspace + ws.slotInExpert);
  const int* expertCount = (const int*)(a.workspace + ws.expertCount);
  const uint64_t n = (uint64_t)clamp_count(tokensTo[p], M);
  uint64_t lo, hi;
  part(n, d.chunks, c, lo, hi);
  const Target t = ll_target(comm, window, a.net, parity, d.rank, R, p, flagOffset, signalBase);
  const uint32_t tid = threadIdx.x, lane = gin_lane_id(), warp = tid / GIN_WARP_SIZE, warps = blockDim.x / GIN_WARP_SIZE;
  if (c == 0) {
    if (tid == 0) *(uint64_t*)t.bytes = n;
    for (int j = (int)tid; j < L; j += (int)blockDim.x) ((int32_t*)(t.bytes + 8))[j] = expertCount[p * L + j];
  }
  const uint64_t metaStride = 12ull * (uint64_t)K, rowBytes = (uint64_t)d.rowBytes;
  for (uint64_t i = lo + warp; i < hi; i += warps) {
    const int tok = sendList[i];
    int32_t* meta = (int32_t*)(t.bytes + a.net.metaOffset + i * metaStride);
    if ((int)lane < K) {
      const uint64_t slot = (uint64_t)tok * K + lane;
      const int e = a.topkIdx[slot], sl = slotInExpert[slot];
      const bool here = sl >= 0 && e >= 0 && e / L == p;  // masked, invalid and repeated ids have no slot
      meta[lane] = here ? e - p * L : -1;
      meta[K + lane] = here ? sl : -1;
      ((float*)meta)[2 * K + lane] = a.topkWeights[slot];
    }
    gin_copy_bytes(t.bytes + a.net.rowsOffset + i * rowBytes, (const uint8_t*)a.x + (uint64_t)tok * rowBytes, rowBytes, lane,
                   GIN_WARP_SIZE);
  }
  __syncthreads();
  if (tid == 0) {
    // chunk 0's metadata piece starts at the header; the pieces of a chunk are contiguous per kind
    const uint64_t pieceLo[2] = {c == 0 ? 0 : a.net.metaOffset + lo * metaStride, a.net.rowsOffset + lo * rowBytes};
    const uint64_t pieceHi[2] = {hi > lo || c == 0 ? a.net.metaOffset + hi * metaStride : pieceLo[0], a.net.rowsOffset + hi * rowBytes};
    publish(comm, window, t, pieceLo, pieceHi);
  }
}

// ------------------------------------------------------------------------------------------------
// Dispatch receiver: block (s, c), after every source arrived: the expert-major position of source
// s's rows for each local expert j (all sources' rows of the experts before j, then the rows of
// sources before s for j), then slots [lo, hi) of s's section into recvX / recvWeights, and the
// row of each (slot, k) into the workspace's slotRows for the combine.
// ------------------------------------------------------------------------------------------------
GIN_DEVICE_INLINE void dispatch_receive(const ncclDevComm& comm, const MoeNetDispatchArgs& a, int s, int c, int parity) {
  __shared__ int start[MOE_NET_MAX_LOCAL_EXPERTS], mine[MOE_NET_MAX_LOCAL_EXPERTS], scanTmp[32];
  const MoeNetDims& d = a.dims;
  const int R = d.nRanks, K = d.topK, L = d.numExperts / R, M = d.maxTokens;
  const ncclWindow_t window = (ncclWindow_t)(uintptr_t)a.window;
  const uint32_t tid = threadIdx.x, lane = gin_lane_id(), warp = tid / GIN_WARP_SIZE, warps = blockDim.x / GIN_WARP_SIZE;
  auto sectionOf = [&](int src) { return (const uint8_t*)ncclGetLocalPointer(window, section(a.net.recvOffset, a.net, parity, R, src)); };
  for (int j = (int)tid; j < L; j += (int)blockDim.x) {
    int total = 0;
    for (int src = 0; src < R; ++src) total += ((const int32_t*)(sectionOf(src) + 8))[j];
    start[j] = total;
    mine[j] = ((const int32_t*)(sectionOf(s) + 8))[j];
  }
  __syncthreads();
  const int totalRows = block_exclusive_scan(start, L, scanTmp);
  for (int j = (int)tid; j < L; j += (int)blockDim.x) {
    int pre = 0;
    for (int src = 0; src < s; ++src) pre += ((const int32_t*)(sectionOf(src) + 8))[j];
    start[j] += pre;
  }
  __syncthreads();
  const MoeWorkspaceLayout ws = moe_workspace_layout(R, d.numExperts, K, M);
  const uint8_t* sec = sectionOf(s);
  const uint64_t nRaw = *(const uint64_t*)sec;
  const uint64_t n = nRaw <= (uint64_t)M ? nRaw : (uint64_t)M;
  if (nRaw > (uint64_t)M && c == 0 && tid == 0) gin_error_set(a.errorFlags, MOE_ERR_COUNTS);
  if (c == 0 && tid == 0) ((int*)(a.workspace + ws.slotsFrom))[s] = (int)n;
  if (s == 0 && c == 0) {
    for (int j = (int)tid; j < L; j += (int)blockDim.x) {
      int total = 0;
      for (int src = 0; src < R; ++src) total += ((const int32_t*)(sectionOf(src) + 8))[j];
      a.recvCounts[j] = total;
    }
    if ((uint64_t)totalRows > a.capacityRows && tid == 0) gin_error_set(a.errorFlags, MOE_ERR_COUNTS);
  }
  int* slotRows = (int*)(a.workspace + ws.slotRows) + (uint64_t)s * M * K;
  uint64_t lo, hi;
  part(n, d.chunks, c, lo, hi);
  const uint64_t metaStride = 12ull * (uint64_t)K, rowBytes = (uint64_t)d.rowBytes;
  for (uint64_t i = lo + warp; i < hi; i += warps) {
    const int32_t* meta = (const int32_t*)(sec + a.net.metaOffset + i * metaStride);
    int row = -1;
    float w = 0.f;
    if ((int)lane < K) {
      const int j = meta[lane], sl = meta[K + lane];
      w = ((const float*)meta)[2 * K + lane];
      if (j >= 0) {
        if (j < L && sl >= 0 && sl < mine[j] && (uint64_t)(start[j] + sl) < a.capacityRows) row = start[j] + sl;
        else gin_error_set(a.errorFlags, MOE_ERR_COUNTS);
      }
      slotRows[i * K + lane] = row;
    }
    const uint8_t* src = sec + a.net.rowsOffset + i * rowBytes;
    for (int k = 0; k < K; ++k) {
      const int r = __shfl_sync(0xffffffffu, row, k);
      const float wk = __shfl_sync(0xffffffffu, w, k);
      if (r < 0) continue;
      gin_copy_bytes((uint8_t*)a.recvX + (uint64_t)r * rowBytes, src, rowBytes, lane, GIN_WARP_SIZE);
      if (lane == 0) a.recvWeights[r] = wk;
    }
  }
}

// ------------------------------------------------------------------------------------------------
// Combine, expert side: block (p, c) reduces slots [lo, hi) of the tokens source p sent in the last
// dispatch, sum over k of weight x expertOut[row(slot, k)] in f32, rounded once to bf16, and sends
// the partial rows back into p's combine section [parity][rank].
// ------------------------------------------------------------------------------------------------
GIN_DEVICE_INLINE void combine_send(const ncclDevComm& comm, const MoeNetCombineArgs& a, int p, int c, int parity, const Target& t) {
  const MoeNetDims& d = a.dims;
  const int R = d.nRanks, K = d.topK, M = d.maxTokens, H = d.hidden;
  const ncclWindow_t window = (ncclWindow_t)(uintptr_t)a.window;
  const MoeWorkspaceLayout ws = moe_workspace_layout(R, d.numExperts, K, M);
  const uint64_t n = (uint64_t)clamp_count(((const int*)(a.workspace + ws.slotsFrom))[p], M);
  const int* slotRows = (const int*)(a.workspace + ws.slotRows) + (uint64_t)p * M * K;
  uint64_t lo, hi;
  part(n, d.chunks, c, lo, hi);
  const uint32_t tid = threadIdx.x, lane = gin_lane_id(), warp = tid / GIN_WARP_SIZE, warps = blockDim.x / GIN_WARP_SIZE;
  const bool vec = H % 8 == 0 && gin_is_aligned(a.expertOut, 16);  // 16-byte loads and stores
  for (uint64_t i = lo + warp; i < hi; i += warps) {
    int row = -1;
    float w = 0.f;
    if ((int)lane < K) {
      row = slotRows[i * K + lane];
      if (row >= 0 && (uint64_t)row >= a.expertOutRows) {
        gin_error_set(a.errorFlags, MOE_ERR_COUNTS);
        row = -1;
      }
      if (row >= 0) w = a.weights != nullptr ? a.weights[row] : 1.f;
    }
    uint16_t* out = (uint16_t*)(t.bytes + i * 2ull * (uint64_t)H);
    if (vec) {
      for (int h = (int)lane * 8; h < H; h += 8 * GIN_WARP_SIZE) {
        float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        for (int k = 0; k < K; ++k) {
          const int r = __shfl_sync(0xffffffffu, row, k);
          const float wk = __shfl_sync(0xffffffffu, w, k);
          if (r >= 0) acc_bf16x8(acc, ld16<false>(a.expertOut + (uint64_t)r * H + h), wk);
        }
        const gin_u128 v = pack_bf16x8(acc);
        gin_st16(out + h, v);
      }
    } else {
      for (int h = (int)lane; h < H; h += GIN_WARP_SIZE) {
        float acc = 0.f;
        for (int k = 0; k < K; ++k) {
          const int r = __shfl_sync(0xffffffffu, row, k);
          const float wk = __shfl_sync(0xffffffffu, w, k);
          if (r >= 0) acc += wk * bf16_to_f32(a.expertOut[(uint64_t)r * H + h]);
        }
        out[h] = (uint16_t)f32_to_bf16(acc);
      }
    }
  }
  __syncthreads();
  if (tid == 0) {
    const uint64_t pieceLo[2] = {lo * 2ull * H, 0}, pieceHi[2] = {hi * 2ull * H, 0};
    publish(comm, window, t, pieceLo, pieceHi);
  }
}

// Combine, source side: block b of the reducers takes its share of the tokens, after every writer's
// partials arrived: y[t] = sum over writers p of partial[p][pos(t, p)]. Low-latency: the writers
// are the ranks t went to, pos = tokenPos[t][p]. HT: the ranks of this node that t went to
// (tokenPos), and for each other node D that t went to its entry rank, pos = nodePos[t][D] (one
// partial per (token, node)).
GIN_DEVICE_INLINE void combine_reduce(const MoeNetCombineArgs& a, ncclWindow_t window, int b, int blocks, int parity, bool ht) {
  const MoeNetDims& d = a.dims;
  const int R = d.nRanks, K = d.topK, M = d.maxTokens, H = d.hidden;
  const MoeWorkspaceLayout ws = moe_workspace_layout(R, d.numExperts, K, M);
  const int* tokenPos = (const int*)(a.workspace + ws.tokenPos);
  const int* nodePos = ht ? (const int*)ncclGetLocalPointer(window, a.fwd.nodePosOffset) : nullptr;
  const int T = clamp_count(a.numTokens, M);
  const uint32_t lane = gin_lane_id(), warp = threadIdx.x / GIN_WARP_SIZE, warps = blockDim.x / GIN_WARP_SIZE;
  const uint8_t* partials = (const uint8_t*)ncclGetLocalPointer(window, section(a.net.recvOffset, a.net, parity, R, 0));
  const bool vec = H % 8 == 0 && gin_is_aligned(a.y, 16);
  for (int t = b * (int)warps + (int)warp; t < T; t += blocks * (int)warps) {
    int pos = -1;
    if ((int)lane < R) {
      const int D = a.topo.nodeOf[lane];
      if (!ht || D == a.topo.nodeOf[d.rank]) pos = tokenPos[(uint64_t)t * R + lane];
      else if (entry_of(a.topo, d.rank, D) == (int)lane) pos = nodePos[(uint64_t)t * a.topo.nodes + D];
    }
    uint16_t* y = a.y + (uint64_t)t * H;
    if (vec) {
      for (int h = (int)lane * 8; h < H; h += 8 * GIN_WARP_SIZE) {
        float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        for (int p = 0; p < R; ++p) {
          const int q = __shfl_sync(0xffffffffu, pos, p);
          if (q >= 0)
            acc_bf16x8(acc, ld16<true>(partials + (uint64_t)p * a.net.sectionBytes + ((uint64_t)q * H + h) * 2ull), 1.f);
        }
        gin_st16(y + h, pack_bf16x8(acc));
      }
    } else {
      for (int h = (int)lane; h < H; h += GIN_WARP_SIZE) {
        float acc = 0.f;
        for (int p = 0; p < R; ++p) {
          const int q = __shfl_sync(0xffffffffu, pos, p);
          if (q >= 0) acc += bf16_to_f32(((const uint16_t*)(partials + (uint64_t)p * a.net.sectionBytes))[(uint64_t)q * H + h]);
        }
        y[h] = (uint16_t)f32_to_bf16(acc);
      }
    }
  }
}

// ================================================================================================
// High-throughput mode (MOE_NET_MODE_HT). A token crosses to each other node once: its sender puts
// one row and its metadata into a node section at the node's entry rank (ht_node_send), the entry
// forwards it to every rank of its node that the token goes to, itself included, as that rank's
// low-latency section for the sender (ht_forward; LSA stores, or GIN puts for a node peer outside
// the LSA team), and the ranks place the rows as in the low-latency mode (dispatch_receive). The
// sender's own node gets its sections straight from it (dispatch_send). The combine reverses it:
// the expert ranks send their partials for another node's token to their node's entry for that
// token's sender (combine_send), the entry adds them into one bf16 partial per (token, node)
// (ht_node_reduce), and the source adds the partials of its own node's ranks and of every entry.
// ================================================================================================

// Sums one int per thread over the block (every thread gets the total).
GIN_DEVICE_INLINE int block_sum(int v, int* shared1) {
  if (threadIdx.x == 0) *shared1 = 0;
  __syncthreads();
  if (v != 0) atomicAdd(shared1, v);
  __syncthreads();
  const int total = *shared1;
  __syncthreads();
  return total;
}

// Token t has a slot on a rank of node D (masked, invalid and repeated ids have none).
GIN_DEVICE_INLINE bool token_to_node(const MoeNetDispatchArgs& a, const int* slotInExpert, int t, int D, int L) {
  const int K = a.dims.topK;
  for (int k = 0; k < K; ++k) {
    const int e = a.topkIdx[(uint64_t)t * K + k], sl = slotInExpert[(uint64_t)t * K + k];
    if (sl >= 0 && e >= 0 && e < a.dims.numExperts && a.topo.nodeOf[e / L] == D) return true;
  }
  return false;
}

// Node row u (metadata at meta) has a slot on rank p.
GIN_DEVICE_INLINE bool row_to_rank(const int32_t* meta, int K, int E, int L, int p) {
  for (int k = 0; k < K; ++k) {
    const int e = meta[k];
    if (e >= 0 && e < E && e / L == p) return true;
  }
  return false;
}

// ------------------------------------------------------------------------------------------------
// Node sender: block (D, c) of a rank writes node rows [lo, hi) of its node section for node D
// (tokens in token order that go to some rank of D; row u = the u-th such token) into D's entry
// rank: metadata (per k the global expert id if on D, else -1; slot in that expert; weight) and
// row; chunk 0 also the header (tokens; per rank of D its rows per local expert, from this rank's
// layout). Each block walks all T tokens (a block-wide scan gives u), and records token t's node
// row in nodePos[t][D] for its share of the tokens (the combine adds the node partials from it).
// ------------------------------------------------------------------------------------------------
GIN_DEVICE_INLINE void ht_node_send(const ncclDevComm& comm, const MoeNetDispatchArgs& a, int D, int c, int parity) {
  __shared__ int scan[MOE_NET_THREADS], list[MOE_NET_THREADS], scanTmp[32], total;
  const MoeNetDims& d = a.dims;
  const MoeNetTopology& topo = a.topo;
  const MoeNetForward& f = a.fwd;
  const int R = d.nRanks, K = d.topK, E = d.numExperts, L = E / R, M = d.maxTokens, T = clamp_count(a.numTokens, M), N = topo.nodes;
  const int S = N * topo.slotsPerNode, G = topo.maxNodeSize;
  const ncclWindow_t window = (ncclWindow_t)(uintptr_t)a.window;
  const MoeWorkspaceLayout ws = moe_workspace_layout(R, E, K, M);
  const int* slotInExpert = (const int*)(a.workspace + ws.slotInExpert);
  const int* expertCount = (const int*)(a.workspace + ws.expertCount);
  int* nodePos = (int*)ncclGetLocalPointer(window, f.nodePosOffset);
  const int entry = entry_of(topo, d.rank, D), sigma = slot_of(topo, d.rank, D);
  const Target t = target(comm, window, entry, section(f.node.recvOffset, f.node, parity, S, sigma), section(f.node.stageOffset, f.node, parity, N, D),
                          f.node.flagOffset + 8ull * ((uint64_t)parity * S + sigma), f.node.signalBase + parity * S + sigma);
  const int tid = (int)threadIdx.x, B = (int)blockDim.x;
  const uint32_t lane = gin_lane_id(), warp = threadIdx.x / GIN_WARP_SIZE, warps = blockDim.x / GIN_WARP_SIZE;
  int mine = 0;
  for (int tk = tid; tk < T; tk += B) mine += token_to_node(a, slotInExpert, tk, D, L) ? 1 : 0;
  const int nD = block_sum(mine, &total);
  uint64_t lo, hi, tlo, thi;
  part((uint64_t)nD, d.chunks, c, lo, hi);
  part((uint64_t)T, d.chunks, c, tlo, thi);
  if (c == 0) {
    if (tid == 0) *(uint64_t*)t.bytes = (uint64_t)nD;
    for (int i = tid; i < G * L; i += B) {
      const int q = i / L, j = i % L;
      ((int32_t*)(t.bytes + 8))[i] = q < topo.nodeSize[D] ? expertCount[node_rank(topo, D, q) * L + j] : 0;
    }
  }
  const uint64_t metaStride = 12ull * (uint64_t)K, rowBytes = (uint64_t)d.rowBytes;
  int run = 0;
  for (int base = 0; base < T; base += B) {
    const int tk = base + tid;
    const bool in = tk < T && token_to_node(a, slotInExpert, tk, D, L);
    scan[tid] = in ? 1 : 0;
    __syncthreads();
    const int tot = block_exclusive_scan(scan, B, scanTmp);
    const int u = run + scan[tid];
    if (tk < T && (uint64_t)tk >= tlo && (uint64_t)tk < thi) nodePos[(uint64_t)tk * N + D] = in ? u : -1;
    const int64_t from = (int64_t)lo > run ? (int64_t)lo : run, to = (int64_t)hi < run + tot ? (int64_t)hi : run + tot;
    if (in && u >= from && u < to) list[u - from] = tk;
    __syncthreads();
    for (int64_t i = warp; i < to - from; i += warps) {
      const int tok = list[i];
      const uint64_t row = (uint64_t)(from + i);
      int32_t* meta = (int32_t*)(t.bytes + f.node.metaOffset + row * metaStride);
      if ((int)lane < K) {
        const uint64_t slot = (uint64_t)tok * K + lane;
        const int e = a.topkIdx[slot], sl = slotInExpert[slot];
        const bool here = sl >= 0 && e >= 0 && e < E && topo.nodeOf[e / L] == D;
        meta[lane] = here ? e : -1;
        meta[K + lane] = here ? sl : -1;
        ((float*)meta)[2 * K + lane] = a.topkWeights[slot];
      }
      gin_copy_bytes(t.bytes + f.node.rowsOffset + row * rowBytes, (const uint8_t*)a.x + (uint64_t)tok * rowBytes, rowBytes, lane,
                     GIN_WARP_SIZE);
    }
    run += tot;
    __syncthreads();
  }
  if (tid == 0) {
    const uint64_t pieceLo[2] = {c == 0 ? 0 : f.node.metaOffset + lo * metaStride, f.node.rowsOffset + lo * rowBytes};
    const uint64_t pieceHi[2] = {hi > lo || c == 0 ? f.node.metaOffset + hi * metaStride : pieceLo[0], f.node.rowsOffset + hi * rowBytes};
    publish(comm, window, t, pieceLo, pieceHi);
  }
}

// ------------------------------------------------------------------------------------------------
// Forwarder: block (sigma, q, c) of an entry rank, once slot sigma's node section has arrived,
// writes positions [lo, hi) of node peer q's low-latency section for the slot's sender s: the node
// rows that go to q, in node-row order (= the sender's sendList order for q: both are token order),
// with q's local expert ids, into q's receive section [parity][s] (LSA) or staged for GIN, and
// publishes it on q's HT flag / signal [parity][s]. Chunk 0 writes the header (the count of rows
// and q's per-expert counts from the node header). Each block also records, for its share of the
// node rows, the row's position in q's section in fwdPos[sigma][u][q] (-1: not there), which the
// combine's node reduction reads.
// ------------------------------------------------------------------------------------------------
GIN_DEVICE_INLINE void ht_forward(const ncclDevComm& comm, const MoeNetDispatchArgs& a, int sigma, int q, int c, int parity,
                                  uint64_t threshold) {
  __shared__ int scan[MOE_NET_THREADS], list[MOE_NET_THREADS], scanTmp[32], total;
  const MoeNetDims& d = a.dims;
  const MoeNetTopology& topo = a.topo;
  const MoeNetForward& f = a.fwd;
  const int R = d.nRanks, K = d.topK, E = d.numExperts, L = E / R, M = d.maxTokens;
  const int S = topo.nodes * topo.slotsPerNode, G = topo.maxNodeSize;
  const ncclWindow_t window = (ncclWindow_t)(uintptr_t)a.window;
  const int s = slot_source(topo, d.rank, sigma);
  if (s < 0) return;  // no sender has this rank as entry in this slot
  const int tid = (int)threadIdx.x, B = (int)blockDim.x;
  bool ok = true;
  if (tid == 0)
    ok = wait_one(comm, window, s, f.node.flagOffset + 8ull * ((uint64_t)parity * S + sigma), f.node.signalBase + parity * S + sigma,
                  threshold, a.errorFlags);
  if (__syncthreads_or(!ok)) return;
  const uint8_t* sec = (const uint8_t*)ncclGetLocalPointer(window, section(f.node.recvOffset, f.node, parity, S, sigma));
  const uint64_t nRaw = *(const uint64_t*)sec;
  const int nD = nRaw <= (uint64_t)M ? (int)nRaw : M;
  if (nRaw > (uint64_t)M && q == 0 && c == 0 && tid == 0) gin_error_set(a.errorFlags, MOE_ERR_COUNTS);
  if (q == 0 && c == 0 && tid == 0) ((int*)ncclGetLocalPointer(window, f.fwdCountOffset))[sigma] = nD;
  const int p = node_rank(topo, topo.nodeOf[d.rank], q);
  const uint64_t nodeMetaStride = 12ull * (uint64_t)K, rowBytes = (uint64_t)d.rowBytes;
  int mine = 0;
  for (int u = tid; u < nD; u += B) mine += row_to_rank((const int32_t*)(sec + f.node.metaOffset + u * nodeMetaStride), K, E, L, p) ? 1 : 0;
  const int nq = block_sum(mine, &total);
  uint64_t lo, hi, ulo, uhi;
  part((uint64_t)nq, d.chunks, c, lo, hi);
  part((uint64_t)nD, d.chunks, c, ulo, uhi);
  const uint64_t stage = f.fwdStageOffset + (((uint64_t)parity * S + sigma) * G + q) * a.net.sectionBytes;
  const Target t = target(comm, window, p, section(a.net.recvOffset, a.net, parity, R, s), stage, f.htFlagOffset + 8ull * ((uint64_t)parity * R + s),
                          f.htSignalBase + parity * R + s);
  if (c == 0) {
    if (tid == 0) *(uint64_t*)t.bytes = (uint64_t)nq;
    for (int j = tid; j < L; j += B) ((int32_t*)(t.bytes + 8))[j] = ((const int32_t*)(sec + 8))[q * L + j];
  }
  int* fwdPos = (int*)ncclGetLocalPointer(window, f.fwdPosOffset) + (uint64_t)sigma * M * G;
  const uint32_t lane = gin_lane_id(), warp = threadIdx.x / GIN_WARP_SIZE, warps = blockDim.x / GIN_WARP_SIZE;
  const uint64_t metaStride = 12ull * (uint64_t)K;
  int run = 0;
  for (int base = 0; base < nD; base += B) {
    const int u = base + tid;
    const bool in = u < nD && row_to_rank((const int32_t*)(sec + f.node.metaOffset + u * nodeMetaStride), K, E, L, p);
    scan[tid] = in ? 1 : 0;
    __syncthreads();
    const int tot = block_exclusive_scan(scan, B, scanTmp);
    const int pos = run + scan[tid];
    if (u < nD && (uint64_t)u >= ulo && (uint64_t)u < uhi) fwdPos[(uint64_t)u * G + q] = in ? pos : -1;
    const int64_t from = (int64_t)lo > run ? (int64_t)lo : run, to = (int64_t)hi < run + tot ? (int64_t)hi : run + tot;
    if (in && pos >= from && pos < to) list[pos - from] = u;
    __syncthreads();
    for (int64_t i = warp; i < to - from; i += warps) {
      const int row = list[i];
      const uint64_t at = (uint64_t)(from + i);
      const int32_t* nm = (const int32_t*)(sec + f.node.metaOffset + (uint64_t)row * nodeMetaStride);
      int32_t* meta = (int32_t*)(t.bytes + a.net.metaOffset + at * metaStride);
      if ((int)lane < K) {
        const int e = nm[lane];
        const bool here = e >= 0 && e < E && e / L == p;
        meta[lane] = here ? e - p * L : -1;
        meta[K + lane] = here ? nm[K + lane] : -1;
        meta[2 * K + lane] = nm[2 * K + lane];  // the weight's bits
      }
      gin_copy_bytes(t.bytes + a.net.rowsOffset + at * rowBytes, sec + f.node.rowsOffset + (uint64_t)row * rowBytes, rowBytes, lane, GIN_WARP_SIZE);
    }
    run += tot;
    __syncthreads();
  }
  if (tid == 0) {
    const uint64_t pieceLo[2] = {c == 0 ? 0 : a.net.metaOffset + lo * metaStride, a.net.rowsOffset + lo * rowBytes};
    const uint64_t pieceHi[2] = {hi > lo || c == 0 ? a.net.metaOffset + hi * metaStride : pieceLo[0], a.net.rowsOffset + hi * rowBytes};
    publish(comm, window, t, pieceLo, pieceHi);
  }
}

// ------------------------------------------------------------------------------------------------
// Node reduction: block (sigma, c) of an entry rank, once every rank q of its node sent its partials
// for slot sigma's sender s: node rows [lo, hi), row u = sum over q of partial[q][fwdPos[u][q]] in
// f32, rounded once to bf16, into s's combine section [parity][this rank] (the node partial).
// ------------------------------------------------------------------------------------------------
GIN_DEVICE_INLINE void ht_node_reduce(const ncclDevComm& comm, const MoeNetCombineArgs& a, int sigma, int c, int parity, uint64_t threshold) {
  const MoeNetDims& d = a.dims;
  const MoeNetTopology& topo = a.topo;
  const MoeNetForward& f = a.fwd;
  const int R = d.nRanks, M = d.maxTokens, H = d.hidden;
  const int S = topo.nodes * topo.slotsPerNode, G = topo.maxNodeSize, myNode = topo.nodeOf[d.rank], Gm = topo.nodeSize[myNode];
  const ncclWindow_t window = (ncclWindow_t)(uintptr_t)a.window;
  const int s = slot_source(topo, d.rank, sigma);
  if (s < 0) return;
  const int tid = (int)threadIdx.x;
  bool ok = true;
  if (tid < Gm) {
    const uint64_t idx = ((uint64_t)parity * S + sigma) * G + tid;
    ok = wait_one(comm, window, node_rank(topo, myNode, tid), f.part.flagOffset + 8ull * idx, f.part.signalBase + (int)idx, threshold, a.errorFlags);
  }
  if (__syncthreads_or(!ok)) return;
  const int nD = clamp_count(((const int*)ncclGetLocalPointer(window, f.fwdCountOffset))[sigma], M);
  const int* fwdPos = (const int*)ncclGetLocalPointer(window, f.fwdPosOffset) + (uint64_t)sigma * M * G;
  const uint8_t* partials = (const uint8_t*)ncclGetLocalPointer(window, f.part.recvOffset + ((uint64_t)parity * S + sigma) * G * f.part.sectionBytes);
  uint64_t lo, hi;
  part((uint64_t)nD, d.chunks, c, lo, hi);
  const Target t = target(comm, window, s, section(a.net.recvOffset, a.net, parity, R, d.rank), section(a.net.stageOffset, a.net, parity, R, s),
                          f.htFlagOffset + 8ull * (2ull * R + (uint64_t)parity * R + d.rank), f.htSignalBase + 2 * R + parity * R + d.rank);
  const uint32_t lane = gin_lane_id(), warp = threadIdx.x / GIN_WARP_SIZE, warps = blockDim.x / GIN_WARP_SIZE;
  const bool vec = H % 8 == 0;  // sections are 256-byte aligned, rows 16-byte aligned when H % 8 == 0
  for (uint64_t u = lo + warp; u < hi; u += warps) {
    const int pos = (int)lane < Gm ? fwdPos[u * G + lane] : -1;
    uint16_t* out = (uint16_t*)(t.bytes + u * 2ull * (uint64_t)H);
    if (vec) {
      for (int h = (int)lane * 8; h < H; h += 8 * GIN_WARP_SIZE) {
        float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        for (int q = 0; q < Gm; ++q) {
          const int r = __shfl_sync(0xffffffffu, pos, q);
          if (r >= 0 && r < M) acc_bf16x8(acc, ld16<true>(partials + (uint64_t)q * f.part.sectionBytes + ((uint64_t)r * H + h) * 2ull), 1.f);
        }
        gin_st16(out + h, pack_bf16x8(acc));
      }
    } else {
      for (int h = (int)lane; h < H; h += GIN_WARP_SIZE) {
        float acc = 0.f;
        for (int q = 0; q < Gm; ++q) {
          const int r = __shfl_sync(0xffffffffu, pos, q);
          if (r >= 0 && r < M) acc += bf16_to_f32(((const uint16_t*)(partials + (uint64_t)q * f.part.sectionBytes))[(uint64_t)r * H + h]);
        }
        out[h] = (uint16_t)f32_to_bf16(acc);
      }
    }
  }
  __syncthreads();
  if (tid == 0) {
    const uint64_t pieceLo[2] = {lo * 2ull * H, 0}, pieceHi[2] = {hi * 2ull * H, 0};
    publish(comm, window, t, pieceLo, pieceHi);
  }
}

}  // namespace moe_net

// ================================================================================================
// Entry points, 1-D grids of MOE_NET_THREADS. Low-latency: 2 * R * chunks blocks; blocks
// [0, R*chunks) are the senders (peer = block / chunks), the rest receive. HT dispatch, per chunk
// in this order: the direct senders (one per rank of this node), the node senders (one per other
// node), the forwarders (one per (slot of another node, rank of this node)), the receivers (one per
// source). HT combine: the partial senders (one per source), the node reducers (one per slot of
// another node), the reducers. Every role waits only on roles before it (on this GPU or a peer's),
// senders never wait, and a GPU schedules blocks in index order, so every wait ends (a full grid
// resident is not needed).
// ================================================================================================
extern "C" __global__ void __launch_bounds__(MOE_NET_THREADS)
moe_net_dispatch(const __grid_constant__ ncclDevComm devComm, const __grid_constant__ MoeNetDispatchArgs a) {
  using namespace moe_net;
  __shared__ uint64_t sharedWords[4];
  const ncclWindow_t window = (ncclWindow_t)(uintptr_t)a.window;
  if (!launch_ok(devComm, window, a.dims, a.net, a.topo, a.fwd, MOE_NET_MODE_LL, true, a.workspace, a.errorFlags)) return;
  const MoeNetDims& d = a.dims;
  if ((a.numTokens < 0 || a.numTokens > d.maxTokens || a.x == nullptr || a.topkIdx == nullptr || a.topkWeights == nullptr ||
       a.recvX == nullptr || a.recvWeights == nullptr || a.recvCounts == nullptr)) {
    if (blockIdx.x == 0 && threadIdx.x == 0) gin_error_set(a.errorFlags, MOE_ERR_CONFIG);
    return;
  }
  uint64_t* counters = counters_of(window, a.fwd, 0);
  const Call call = begin_call(counters, MOE_NET_MODE_LL, sharedWords);
  const int parity = call.parity, senders = d.nRanks * d.chunks;
  if ((int)blockIdx.x < senders) {
    dispatch_send(devComm, a, (int)blockIdx.x / d.chunks, (int)blockIdx.x % d.chunks, parity, a.net.flagOffset, a.net.signalBase);
  } else {
    const int b = (int)blockIdx.x - senders;
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
  if (!launch_ok(devComm, window, a.dims, a.net, a.topo, a.fwd, MOE_NET_MODE_LL, false, a.workspace, a.errorFlags)) return;
  const MoeNetDims& d = a.dims;
  uint64_t* state = state_of(a.workspace);
  if (a.expertOut == nullptr || a.y == nullptr || a.numTokens < 0 || a.numTokens > d.maxTokens) {
    if (blockIdx.x == 0 && threadIdx.x == 0) gin_error_set(a.errorFlags, MOE_ERR_CONFIG);
    return;
  }
  if ((uint64_t)a.numTokens != state[MOE_STATE_DISPATCH_TOKENS]) {
    if (blockIdx.x == 0 && threadIdx.x == 0) gin_error_set(a.errorFlags, MOE_ERR_TOKENS);
  }
  uint64_t* counters = counters_of(window, a.fwd, 1);
  const Call call = begin_call(counters, MOE_NET_MODE_LL, sharedWords);
  const int parity = call.parity, R = d.nRanks, senders = R * d.chunks;
  if ((int)blockIdx.x < senders) {
    const int p = (int)blockIdx.x / d.chunks;
    const Target t = ll_target(devComm, window, a.net, parity, d.rank, R, p, a.net.flagOffset, a.net.signalBase);
    combine_send(devComm, a, p, (int)blockIdx.x % d.chunks, parity, t);
  } else if (wait_all_sources(devComm, window, a.net, parity, R, (uint64_t)d.chunks * call.count, a.errorFlags)) {
    combine_reduce(a, window, (int)blockIdx.x - senders, senders, parity, false);
  }
  __syncthreads();
  end_call(counters, call);
}

extern "C" __global__ void __launch_bounds__(MOE_NET_THREADS)
moe_net_dispatch_ht(const __grid_constant__ ncclDevComm devComm, const __grid_constant__ MoeNetDispatchArgs a) {
  using namespace moe_net;
  __shared__ uint64_t sharedWords[4];
  const ncclWindow_t window = (ncclWindow_t)(uintptr_t)a.window;
  if (!launch_ok(devComm, window, a.dims, a.net, a.topo, a.fwd, MOE_NET_MODE_HT, true, a.workspace, a.errorFlags)) return;
  const MoeNetDims& d = a.dims;
  const MoeNetTopology& topo = a.topo;
  if ((a.numTokens < 0 || a.numTokens > d.maxTokens || a.x == nullptr || a.topkIdx == nullptr || a.topkWeights == nullptr ||
       a.recvX == nullptr || a.recvWeights == nullptr || a.recvCounts == nullptr)) {
    if (blockIdx.x == 0 && threadIdx.x == 0) gin_error_set(a.errorFlags, MOE_ERR_CONFIG);
    return;
  }
  uint64_t* counters = counters_of(window, a.fwd, 0);
  const Call call = begin_call(counters, MOE_NET_MODE_HT, sharedWords);
  const uint64_t threshold = (uint64_t)d.chunks * call.count;
  const int R = d.nRanks, C = d.chunks, myNode = topo.nodeOf[d.rank], Gm = topo.nodeSize[myNode], N = topo.nodes;
  const int remoteSlots = (N - 1) * topo.slotsPerNode;
  int b = (int)blockIdx.x;
  if (b < Gm * C) {
    dispatch_send(devComm, a, node_rank(topo, myNode, b / C), b % C, call.parity, a.fwd.htFlagOffset, a.fwd.htSignalBase);
  } else if ((b -= Gm * C) < (N - 1) * C) {
    ht_node_send(devComm, a, remote_node(topo, d.rank, b / C), b % C, call.parity);
  } else if ((b -= (N - 1) * C) < remoteSlots * Gm * C) {
    const int unit = b / C;
    ht_forward(devComm, a, remote_slot(topo, d.rank, unit / Gm), unit % Gm, b % C, call.parity, threshold);
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
  if (!launch_ok(devComm, window, a.dims, a.net, a.topo, a.fwd, MOE_NET_MODE_HT, false, a.workspace, a.errorFlags)) return;
  const MoeNetDims& d = a.dims;
  const MoeNetTopology& topo = a.topo;
  const MoeNetForward& f = a.fwd;
  uint64_t* state = state_of(a.workspace);
  if (a.expertOut == nullptr || a.y == nullptr || a.numTokens < 0 || a.numTokens > d.maxTokens) {
    if (blockIdx.x == 0 && threadIdx.x == 0) gin_error_set(a.errorFlags, MOE_ERR_CONFIG);
    return;
  }
  if ((uint64_t)a.numTokens != state[MOE_STATE_DISPATCH_TOKENS]) {
    if (blockIdx.x == 0 && threadIdx.x == 0) gin_error_set(a.errorFlags, MOE_ERR_TOKENS);
  }
  uint64_t* counters = counters_of(window, f, 1);
  const Call call = begin_call(counters, MOE_NET_MODE_HT, sharedWords);
  const uint64_t threshold = (uint64_t)d.chunks * call.count;
  const int R = d.nRanks, C = d.chunks, parity = call.parity, myNode = topo.nodeOf[d.rank];
  const int S = topo.nodes * topo.slotsPerNode, G = topo.maxNodeSize, remoteSlots = (topo.nodes - 1) * topo.slotsPerNode;
  int b = (int)blockIdx.x;
  if (b < R * C) {
    const int s = b / C;
    Target t;
    if (topo.nodeOf[s] == myNode) {
      t = ll_target(devComm, window, a.net, parity, d.rank, R, s, f.htFlagOffset + 16ull * R, f.htSignalBase + 2 * R);
    } else {  // to this node's entry for s, as node peer localOf[rank] of its slot for s
      const int e = entry_of(topo, s, myNode), sigma = slot_of(topo, s, myNode);
      const uint64_t idx = ((uint64_t)parity * S + sigma) * G + topo.localOf[d.rank];
      t = target(devComm, window, e, f.part.recvOffset + idx * f.part.sectionBytes, section(a.net.stageOffset, a.net, parity, R, s),
                 f.part.flagOffset + 8ull * idx, f.part.signalBase + (int)idx);
    }
    combine_send(devComm, a, s, b % C, parity, t);
  } else if ((b -= R * C) < remoteSlots * C) {
    ht_node_reduce(devComm, a, remote_slot(topo, d.rank, b / C), b % C, parity, threshold);
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
