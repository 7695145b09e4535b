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

// The threshold a signal or flag of parity (n % 2) reaches in call n: every chunk adds one per call
// of that parity (calls count from 1).
GIN_DEVICE_INLINE int clamp_count(int v, int M) { return v < 0 ? 0 : (v > M ? M : v); }

GIN_DEVICE_INLINE uint64_t arrived_threshold(uint64_t n, int chunks) { return (uint64_t)chunks * ((n + 1) / 2); }

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

// Where a writer's section for peer p is written: p's receive section [parity][rank] over LSA, or
// this rank's staging section [parity][p] for a GIN peer. Also says which.
struct Target {
  uint8_t* bytes;
  bool lsa;
  int lsaPeer;
};

GIN_DEVICE_INLINE Target target(const ncclDevComm& comm, ncclWindow_t window, const MoeNetSections& net, int parity,
                                int rank, int R, int p) {
  const ncclTeam world = ncclTeamWorld(comm), lsa = ncclTeamLsa(comm);
  Target t;
  t.lsa = ncclTeamRankIsMember(lsa, world, p);
  t.lsaPeer = t.lsa ? ncclTeamRankToTeam(lsa, world, p) : -1;
  t.bytes = t.lsa ? (uint8_t*)ncclGetLsaPointer(window, section(net.recvOffset, net, parity, R, rank), t.lsaPeer)
                  : (uint8_t*)ncclGetLocalPointer(window, section(net.stageOffset, net, parity, R, p));
  return t;
}

// Thread 0, after the block's stores into the target: over LSA one system-scope add to the peer's
// flag [parity][rank]; over GIN the puts of the pieces [lo, hi) (at most two), the last with a
// signal increment (NCCL shows a signal only after its put's payload and every earlier put of the
// context to that peer), or the signal alone when nothing is to be put.
GIN_DEVICE_INLINE void publish(const ncclDevComm& comm, ncclWindow_t window, const MoeNetSections& net, const Target& t,
                               int parity, int rank, int R, int p, const uint64_t (&lo)[2], const uint64_t (&hi)[2]) {
  if (t.lsa) {
    gin_fence_acq_rel_sys();
    uint64_t* flag = (uint64_t*)ncclGetLsaPointer(window, net.flagOffset + 8ull * ((uint64_t)parity * R + rank), t.lsaPeer);
    atomicAdd_system((unsigned long long*)flag, 1ull);
    return;
  }
  const ncclTeam world = ncclTeamWorld(comm);
  ncclGin gin{comm, kGinContext};
  const ncclGinSignal_t sig = (ncclGinSignal_t)(net.signalBase + parity * R + rank);
  const uint64_t stage = section(net.stageOffset, net, parity, R, p), recv = section(net.recvOffset, net, parity, R, rank);
  int last = -1;
  for (int i = 0; i < 2; ++i)
    if (hi[i] > lo[i]) last = i;
  if (last < 0) {
    gin.signal(world, p, ncclGin_SignalInc{sig}, ncclCoopThread(), ncclGin_None{}, cuda::thread_scope_thread,
               cuda::thread_scope_system);
    return;
  }
  for (int i = 0; i <= last; ++i) {
    for (uint64_t off = lo[i]; off < hi[i]; off += kMaxPutBytes) {
      const uint64_t n = hi[i] - off < kMaxPutBytes ? hi[i] - off : kMaxPutBytes;
      if (i == last && off + n == hi[i])
        gin.put(world, p, window, recv + off, window, stage + off, n, ncclGin_SignalInc{sig}, ncclGin_None{}, ncclCoopThread(),
                ncclGin_None{}, cuda::thread_scope_thread, cuda::thread_scope_system);
      else
        gin.put(world, p, window, recv + off, window, stage + off, n, ncclGin_None{}, ncclGin_None{}, ncclCoopThread(),
                ncclGin_None{}, cuda::thread_scope_thread, cuda::thread_scope_system);
    }
  }
}

// Threads 0..R-1 each wait until source tid's sections of this call have arrived (its LSA flag or
// GIN signal [parity][tid] reaches the threshold). False for every thread if any wait timed out
// (GIN_ERR_TIMEOUT set; the caller then touches nothing).
GIN_DEVICE_INLINE bool wait_all_sources(const ncclDevComm& comm, ncclWindow_t window, const MoeNetSections& net, int parity,
                                        int R, uint64_t threshold, uint32_t* errorFlags) {
  bool ok = true;
  const int s = (int)threadIdx.x;
  if (s < R) {
    const ncclTeam world = ncclTeamWorld(comm), lsa = ncclTeamLsa(comm);
    if (ncclTeamRankIsMember(lsa, world, s)) {
      const uint64_t* flag = (const uint64_t*)ncclGetLocalPointer(window, net.flagOffset + 8ull * ((uint64_t)parity * R + s));
      ok = gin_wait_geq_acquire_polls(flag, threshold, errorFlags);
    } else {
      ncclGin gin{comm, kGinContext};
      const ncclGinSignal_t sig = (ncclGinSignal_t)(net.signalBase + parity * R + s);
      uint64_t start = 0;
      for (uint32_t spins = 0;; ++spins) {
        if (gin.readSignal(sig, 64, cuda::memory_order_acquire) >= threshold) break;
        if (gin_wait_timed_out(spins, start, errorFlags)) { ok = false; break; }
      }
    }
  }
  return !__syncthreads_or(!ok);
}

// Launch checks shared by dispatch and combine; every block reaches the same verdict, block 0
// reports MOE_ERR_CONFIG (or GIN_ERR_BAD_ARGS for a devComm that cannot serve the GIN peers).
GIN_DEVICE_INLINE bool launch_ok(const ncclDevComm& comm, ncclWindow_t window, const MoeNetDims& d, const MoeNetSections& net,
                                 const void* workspace, uint32_t* errorFlags) {
  const int R = d.nRanks;
  bool ok = window != nullptr && workspace != nullptr && moe_sizes_ok(R, d.numExperts, d.topK, d.hidden, d.maxTokens) &&
            d.rank >= 0 && d.rank < R && comm.rank == d.rank && comm.nRanks == R && d.chunks >= 1 &&
            d.numExperts / R <= MOE_NET_MAX_LOCAL_EXPERTS && d.rowBytes > 0 && blockDim.x == MOE_NET_THREADS &&
            blockDim.y == 1 && blockDim.z == 1 && gridDim.y == 1 && gridDim.z == 1 &&
            gridDim.x == 2u * (unsigned)R * (unsigned)d.chunks && gridDim.x <= MOE_NET_MAX_BLOCKS &&
            (net.sectionBytes & 255u) == 0 && (net.flagOffset & 7u) == 0;
  if (!ok) {
    if (blockIdx.x == 0 && threadIdx.x == 0) gin_error_set(errorFlags, MOE_ERR_CONFIG);
    return false;
  }
  const ncclTeam world = ncclTeamWorld(comm), lsa = ncclTeamLsa(comm);
  if (lsa.nRanks < world.nRanks) {
    ok = comm.ginConnectionCount > 0 && !comm.ginIsRailed && net.signalBase >= 0 &&
         (uint64_t)net.signalBase + 2ull * (uint64_t)R <= (uint64_t)comm.ginSignalCount;
    if (!ok && blockIdx.x == 0 && threadIdx.x == 0) gin_error_set(errorFlags, GIN_ERR_BAD_ARGS);
  }
  return ok;
}

// ------------------------------------------------------------------------------------------------
// Dispatch sender: block (p, c) writes slots [lo, hi) of its rows to destination p: the slot's
// row (x of token sendList[p][i]) and metadata (for each k: p's local expert or -1, the slot in
// that expert's rows from this rank, the weight); chunk 0 also writes the header (tokens, count[L]).
// ------------------------------------------------------------------------------------------------
GIN_DEVICE_INLINE void dispatch_send(const ncclDevComm& comm, const MoeNetDispatchArgs& a, int p, int c, int parity) {
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
  const Target t = target(comm, window, a.net, parity, d.rank, R, p);
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
    publish(comm, window, a.net, t, parity, d.rank, R, p, pieceLo, pieceHi);
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
GIN_DEVICE_INLINE void combine_send(const ncclDevComm& comm, const MoeNetCombineArgs& a, int p, int c, int parity) {
  const MoeNetDims& d = a.dims;
  const int R = d.nRanks, K = d.topK, M = d.maxTokens, H = d.hidden;
  const ncclWindow_t window = (ncclWindow_t)(uintptr_t)a.window;
  const MoeWorkspaceLayout ws = moe_workspace_layout(R, d.numExperts, K, M);
  const uint64_t n = (uint64_t)clamp_count(((const int*)(a.workspace + ws.slotsFrom))[p], M);
  const int* slotRows = (const int*)(a.workspace + ws.slotRows) + (uint64_t)p * M * K;
  uint64_t lo, hi;
  part(n, d.chunks, c, lo, hi);
  const Target t = target(comm, window, a.net, parity, d.rank, R, p);
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
    publish(comm, window, a.net, t, parity, d.rank, R, p, pieceLo, pieceHi);
  }
}

// Combine, source side: block b of the second half reduces its share of the tokens, after every
// expert rank's partials arrived: y[t] = sum over ranks p that t went to of partial[p][tokenPos[t][p]].
GIN_DEVICE_INLINE void combine_reduce(const MoeNetCombineArgs& a, ncclWindow_t window, int b, int blocks, int parity) {
  const MoeNetDims& d = a.dims;
  const int R = d.nRanks, K = d.topK, M = d.maxTokens, H = d.hidden;
  const MoeWorkspaceLayout ws = moe_workspace_layout(R, d.numExperts, K, M);
  const int* tokenPos = (const int*)(a.workspace + ws.tokenPos);
  const int T = clamp_count(a.numTokens, M);
  const uint32_t lane = gin_lane_id(), warp = threadIdx.x / GIN_WARP_SIZE, warps = blockDim.x / GIN_WARP_SIZE;
  const uint8_t* partials = (const uint8_t*)ncclGetLocalPointer(window, section(a.net.recvOffset, a.net, parity, R, 0));
  const bool vec = H % 8 == 0 && gin_is_aligned(a.y, 16);
  for (int t = b * (int)warps + (int)warp; t < T; t += blocks * (int)warps) {
    int pos = -1;
    if ((int)lane < R) pos = tokenPos[(uint64_t)t * R + lane];
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

}  // namespace moe_net

// ================================================================================================
// Entry points. Grid 2 * R * chunks blocks of MOE_NET_THREADS, 1-D; blocks [0, R*chunks) are the
// senders (peer = block / chunks), the rest receive. Senders never wait, and a GPU schedules blocks
// in index order, so the receivers' waits always end (a full grid resident is not needed).
// ================================================================================================
extern "C" __global__ void __launch_bounds__(MOE_NET_THREADS)
moe_net_dispatch(const __grid_constant__ ncclDevComm devComm, const __grid_constant__ MoeNetDispatchArgs a) {
  using namespace moe_net;
  __shared__ uint64_t sharedSeq;
  const ncclWindow_t window = (ncclWindow_t)(uintptr_t)a.window;
  if (!launch_ok(devComm, window, a.dims, a.net, a.workspace, a.errorFlags)) return;
  const MoeNetDims& d = a.dims;
  if ((a.numTokens < 0 || a.numTokens > d.maxTokens || a.x == nullptr || a.topkIdx == nullptr || a.topkWeights == nullptr ||
       a.recvX == nullptr || a.recvWeights == nullptr || a.recvCounts == nullptr)) {
    if (blockIdx.x == 0 && threadIdx.x == 0) gin_error_set(a.errorFlags, MOE_ERR_CONFIG);
    return;
  }
  uint64_t* state = state_of(a.workspace);
  const uint64_t n = load_seq(state + MOE_STATE_SEQ_DISPATCH + blockIdx.x, &sharedSeq);
  const int parity = (int)(n & 1u), senders = d.nRanks * d.chunks;
  if ((int)blockIdx.x < senders) {
    dispatch_send(devComm, a, (int)blockIdx.x / d.chunks, (int)blockIdx.x % d.chunks, parity);
  } else {
    const int b = (int)blockIdx.x - senders;
    if (wait_all_sources(devComm, window, a.net, parity, d.nRanks, arrived_threshold(n, d.chunks), a.errorFlags))
      dispatch_receive(devComm, a, b / d.chunks, b % d.chunks, parity);
  }
  if (threadIdx.x == 0) state[MOE_STATE_SEQ_DISPATCH + blockIdx.x] = n;
}

extern "C" __global__ void __launch_bounds__(MOE_NET_THREADS)
moe_net_combine(const __grid_constant__ ncclDevComm devComm, const __grid_constant__ MoeNetCombineArgs a) {
  using namespace moe_net;
  __shared__ uint64_t sharedSeq;
  const ncclWindow_t window = (ncclWindow_t)(uintptr_t)a.window;
  if (!launch_ok(devComm, window, a.dims, a.net, a.workspace, a.errorFlags)) return;
  const MoeNetDims& d = a.dims;
  uint64_t* state = state_of(a.workspace);
  if (a.expertOut == nullptr || a.y == nullptr || a.numTokens < 0 || a.numTokens > d.maxTokens) {
    if (blockIdx.x == 0 && threadIdx.x == 0) gin_error_set(a.errorFlags, MOE_ERR_CONFIG);
    return;
  }
  if ((uint64_t)a.numTokens != state[MOE_STATE_DISPATCH_TOKENS]) {
    if (blockIdx.x == 0 && threadIdx.x == 0) gin_error_set(a.errorFlags, MOE_ERR_TOKENS);
  }
  const uint64_t n = load_seq(state + MOE_STATE_SEQ_COMBINE + blockIdx.x, &sharedSeq);
  const int parity = (int)(n & 1u), senders = d.nRanks * d.chunks;
  if ((int)blockIdx.x < senders) {
    combine_send(devComm, a, (int)blockIdx.x / d.chunks, (int)blockIdx.x % d.chunks, parity);
  } else if (wait_all_sources(devComm, window, a.net, parity, d.nRanks, arrived_threshold(n, d.chunks), a.errorFlags)) {
    combine_reduce(a, window, (int)blockIdx.x - senders, senders, parity);
  }
  if (threadIdx.x == 0) state[MOE_STATE_SEQ_COMBINE + blockIdx.x] = n;
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
