// moe_net/sections.cuh - the cross-node MoE exchange's basics: chunk shares, window sections of a
// parity, and the call counters that give each call its parity.
// Included by nccl_gin_moe.cu after its check of the NCCL headers (GIN device API, NCCL >= 2.29.7).
#pragma once

#include "../moe/routing.cuh"
#include <nccl.h>
#include <nccl_device.h>
#include <nccl_device/gin.h>

#include "abi/moe_net.h"  // gin-kernels/abi/moe_net.h (the build passes -I gin-kernels)

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

// The flag / signal index of chunk c of slot sigma's node section (HT dispatch): [parity][slot][chunk].
GIN_DEVICE_INLINE uint64_t node_chunk(int parity, int S, int sigma, int chunks, int c) {
  return ((uint64_t)parity * (uint64_t)S + (uint64_t)sigma) * (uint64_t)chunks + (uint64_t)c;
}

// The flag / signal index of chunk c of node peer q's partials for slot sigma (HT combine):
// [parity][slot][peer][chunk].
GIN_DEVICE_INLINE uint64_t part_chunk(int parity, int S, int sigma, int G, int q, int chunks, int c) {
  return (((uint64_t)parity * (uint64_t)S + (uint64_t)sigma) * (uint64_t)G + (uint64_t)q) * (uint64_t)chunks + (uint64_t)c;
}

// A warp's walk over the H columns of a row, kWidth columns per lane and step: every lane runs
// every step (`on` false past the row's end), so the full-warp shuffles inside f always meet all
// 32 lanes. A loop bounded per lane (h = lane * kWidth; h < H) would leave the lanes past the end
// out of the shuffles, and on sm_70+ the warp then waits forever (no time-out can end it).
template <int kWidth, typename F>
GIN_DEVICE_INLINE void for_columns(int H, uint32_t lane, F&& f) {
  for (int h0 = 0; h0 < H; h0 += kWidth * GIN_WARP_SIZE) {
    const int h = h0 + (int)lane * kWidth;
    f(h, h < H);
  }
}

GIN_DEVICE_INLINE uint64_t section(uint64_t base, const MoeNetSections& net, int parity, int R, int index) {
  return base + ((uint64_t)parity * (uint64_t)R + (uint64_t)index) * net.sectionBytes;
}

// ------------------------------------------------------------------------------------------------
// Call counters. Per exchange, 256 slots of {low-latency calls of parity 0, of parity 1, HT calls
// of parity 0, of parity 1}. Block b reads slot b and, at its end, writes the updated counts into
// every slot b + k * gridDim.x, so the next launch reads the same counts in every block whatever
// its grid (the two modes and phases have different grids). Call n (all modes, from 1) uses section parity
// n % 2; a flag or signal of one mode and parity reaches chunks x (that mode's calls of that
// parity so far) in call n where each of its writers adds one per chunk and call, and that count
// alone where it has one writer per chunk (the HT node and partial chunks: node_chunk, part_chunk).
// ------------------------------------------------------------------------------------------------
struct Call {
  uint64_t words[4];
  uint64_t n;
  int parity;
  uint64_t count;  // this mode's calls of this parity, this one included
  bool advances;   // this launch began the call (it writes the counters at its end)
};

// A launch of the whole call or its SEND phase begins a new call; a COMPLETE launch continues the
// call the SEND before it on the stream began (the counters already count it). A COMPLETE with no
// call of this mode begun gets count 0: launch_ok's caller refuses it.
GIN_DEVICE_INLINE Call begin_call(const uint64_t* counters, int mode, int phase, uint64_t* shared4) {
  if (threadIdx.x < 4) shared4[threadIdx.x] = counters[4ull * blockIdx.x + threadIdx.x];
  __syncthreads();
  Call c;
  c.advances = phase != MOE_NET_PHASE_COMPLETE;
  c.n = c.advances ? 1 : 0;
  for (int i = 0; i < 4; ++i) {
    c.words[i] = shared4[i];
    c.n += c.words[i];
  }
  c.parity = (int)(c.n & 1u);
  c.count = c.advances ? ++c.words[2 * mode + c.parity] : c.words[2 * mode + c.parity];
  return c;
}

GIN_DEVICE_INLINE void end_call(uint64_t* counters, const Call& c) {
  if (!c.advances) return;
  if (threadIdx.x < 4)
    for (uint32_t slot = blockIdx.x; slot < MOE_NET_MAX_BLOCKS; slot += gridDim.x) counters[4ull * slot + threadIdx.x] = c.words[threadIdx.x];
}

GIN_DEVICE_INLINE uint64_t* counters_of(ncclWindow_t window, const MoeNetForward& f, int exchange) {
  return (uint64_t*)ncclGetLocalPointer(window, f.countersOffset) + (uint64_t)exchange * 4ull * MOE_NET_MAX_BLOCKS;
}

// Bytes of one combine partial row in the sections: a bf16 [H] row, or a [K] word row for the row values call.
GIN_DEVICE_INLINE uint64_t combine_row_bytes(const MoeNetCombineArgs& a) {
  return a.rowValues != nullptr ? 4ull * (uint64_t)a.dims.topK : 2ull * (uint64_t)a.dims.hidden;
}

}  // namespace moe_net
