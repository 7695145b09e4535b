// moe/row_movers.cuh - copying rows to their expert rows (expand) and weighted sums of rows
// (reduce), one warp per row segment.
#pragma once

#include "routing.cuh"

namespace moe_detail {

// ------------------------------------------------------------------------------------------------
// Row movers (one warp per row segment). `fast`: rowBytes % 16 == 0 and all bases 16-byte aligned.
// A segment is the byte range [b0, b1) of a row (b0, b1 multiples of 16 on the fast path; even
// otherwise), see row_split.
// ------------------------------------------------------------------------------------------------
constexpr int kExpandUnroll = 4;   // 16-byte vectors in flight per lane when copying
// Reductions: 4 output vectors per lane per pass (a pass covers 2 KB of a row per warp)
// and rows in groups of 2 with all their loads in flight (8 x 16 bytes per lane), so a pass makes
// 64 bytes per lane in ceil(entries / 2) round trips. 2 x 4 (32 bytes per lane in
// ceil(entries / 4) round trips) kept the producers at ~300 GB/s at 4096 tokens, and a 2 KB segment
// at 128 tokens took two dependent passes. 4 x 4 and 4 x 3 need 140-150 registers (ptxas: 88-160
// byte stack frames at the 128-register cap of 512 threads).
constexpr int kReduceUnroll = 4;   // output vectors per lane per pass
constexpr int kReduceGroup = 2;    // rows (own + partials) whose loads are in flight together

// Work items: a list of n rows is cut into n * nseg items, item i = (row i / nseg, segment
// i % nseg), so that a call with few rows per channel still keeps every warp of the block busy
// with one load round trip each (small calls are latency-bound: a 14 KB row done by one warp is
// 7 dependent round trips), while many rows give nseg = 1 (one flag per row). Sender
// and receiver derive the same split from (rowBytes, n) alone. Segments are whole warp passes
// (multiples of 32 lanes x 16 bytes), every segment non-empty.
struct RowSplit {
  int nseg;
  uint64_t segBytes;
};
// minSeg: at least that many segments where the row has enough warp passes (the combine consumer
// asks for 2, see combine_items).
__host__ __device__ __forceinline__ RowSplit row_split(uint64_t rowBytes, int n, int minSeg = 1) {
  const uint64_t units = (rowBytes + 15) >> 4;  // 16-byte units (the last may be partial)
  uint64_t want = n > 0 ? (uint64_t)((MOE_WARPS + n - 1) / n) : 1ull;
  if (want < (uint64_t)minSeg) want = (uint64_t)minSeg;
  const uint64_t maxSeg = units / GIN_WARP_SIZE > 0 ? units / GIN_WARP_SIZE : 1ull;
  if (want > maxSeg) want = maxSeg;
  uint64_t segUnits = (units + want - 1) / want;
  segUnits = (segUnits + GIN_WARP_SIZE - 1) / GIN_WARP_SIZE * GIN_WARP_SIZE;
  RowSplit r;
  r.nseg = (int)((units + segUnits - 1) / segUnits);
  r.segBytes = segUnits * 16ull;
  return r;
}
GIN_DEVICE_INLINE void seg_range(const RowSplit& sp, int seg, uint64_t rowBytes, uint64_t& b0, uint64_t& b1) {
  b0 = (uint64_t)seg * sp.segBytes;
  b1 = b0 + sp.segBytes < rowBytes ? b0 + sp.segBytes : rowBytes;
}

// Asks L2 to fetch [p, p + bytes) (p and bytes multiples of 16) without holding a register: the
// reductions' extra memory-level parallelism beyond the loads that registers can hold.
// A hint only (no data returned, no ordering); nothing on AMD.
GIN_DEVICE_INLINE void prefetch_l2(const uint8_t* p, uint32_t bytes) {
#if !GIN_HIP && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#else
  (void)p;
  (void)bytes;
#endif
}

// This lane's vectors of the copy pass starting at vector v0 of a segment ending at vEnd.
template <bool kFresh>
GIN_DEVICE_INLINE void expand_load_pass(gin_u128 (&r)[kExpandUnroll], const uint8_t* src, uint64_t v0, uint64_t vEnd) {
  const int lane = (int)gin_lane_id();
#pragma unroll
  for (int u = 0; u < kExpandUnroll; ++u) {
    const uint64_t v = v0 + (uint64_t)lane + (uint64_t)u * GIN_WARP_SIZE;
    if (v < vEnd) r[u] = ld16<kFresh>(src + (v << 4));
  }
}

// Copies bytes [b0, b1) of one source row to the rows myRow of lanes 0..nTargets-1 (-1 = none)
// of dstBase. kFresh: the source was written during this kernel (window staging), so no
// non-coherent loads. pass0Loaded (fast path only): r already holds the segment's first pass
// (expand_load_pass(r, src, b0 >> 4, b1 >> 4)), issued by the caller together with the item's
// metadata loads (one load round trip per item instead of three).
template <bool kFresh>
GIN_DEVICE_INLINE void warp_expand_seg(const uint8_t* src, uint8_t* dstBase, uint64_t rowBytes, int myRow,
                                       int nTargets, bool fast, uint64_t b0, uint64_t b1,
                                       gin_u128 (&r)[kExpandUnroll], bool pass0Loaded) {
  const int lane = (int)gin_lane_id();
  if (fast) {
    const uint64_t vEnd = b1 >> 4;
    constexpr uint64_t kPassVecs = (uint64_t)GIN_WARP_SIZE * kExpandUnroll;
    for (uint64_t v0 = b0 >> 4; v0 < vEnd; v0 += kPassVecs) {
      // The next pass into L2 while this one is copied (prefetching the whole
      // segment at its start fails: at 4096 tokens a warp copies a 14 KB row in ~40 us, so most of
      // the prefetched lines are evicted before use and read from HBM twice).
      const uint64_t nv0 = v0 + kPassVecs;
      if (lane == 0 && nv0 < vEnd) prefetch_l2(src + (nv0 << 4), (uint32_t)((vEnd - nv0 < kPassVecs ? vEnd - nv0 : kPassVecs) << 4));
      if (!(pass0Loaded && v0 == (b0 >> 4))) expand_load_pass<kFresh>(r, src, v0, vEnd);
      for (int k = 0; k < nTargets; ++k) {
        const int row = gin_shfl_int(myRow, k);
        if (row < 0) continue;
        uint8_t* dst = dstBase + (uint64_t)row * rowBytes;
#pragma unroll
        for (int u = 0; u < kExpandUnroll; ++u) {
          const uint64_t v = v0 + (uint64_t)lane + (uint64_t)u * GIN_WARP_SIZE;
          if (v < vEnd) gin_st16(dst + (v << 4), r[u]);
        }
      }
    }
  } else {
    // Any hidden size / alignment: element by element (bf16 rows are always 2-byte aligned).
    const uint64_t e0 = b0 >> 1, e1 = b1 >> 1;
    const uint16_t* s16 = (const uint16_t*)src;
    for (int k = 0; k < nTargets; ++k) {
      const int row = gin_shfl_int(myRow, k);
      if (row < 0) continue;
      uint16_t* dst = (uint16_t*)(dstBase + (uint64_t)row * rowBytes);
      for (uint64_t i = e0 + (uint64_t)lane; i < e1; i += GIN_WARP_SIZE) dst[i] = ld_u16<kFresh>(s16 + i);
    }
  }
}
template <bool kFresh>
GIN_DEVICE_INLINE void warp_expand_seg(const uint8_t* src, uint8_t* dstBase, uint64_t rowBytes, int myRow,
                                       int nTargets, bool fast, uint64_t b0, uint64_t b1) {
  gin_u128 r[kExpandUnroll];
  warp_expand_seg<kFresh>(src, dstBase, rowBytes, myRow, nTargets, fast, b0, b1, r, false);
}

template <bool kFresh>
GIN_DEVICE_INLINE void warp_expand_row(const uint8_t* src, uint8_t* dstBase, uint64_t rowBytes, int myRow,
                                       int nTargets, bool fast) {
  warp_expand_seg<kFresh>(src, dstBase, rowBytes, myRow, nTargets, fast, 0, rowBytes);
}

// Vectors u < nv of one reduction pass of this lane (p = its first vector; the next are a warp
// width of vectors apart), all loads issued before any is used.
template <bool kFresh, int U>
struct PassLoader {
  static GIN_DEVICE_INLINE void run(gin_u128* r, const uint8_t* p, int nv) {
    PassLoader<kFresh, U - 1>::run(r, p, nv);
    constexpr int kOff = (U - 1) * GIN_WARP_SIZE * 16;
    if (nv > U - 1) r[U - 1] = ld16_at<kFresh, kOff>(p);
  }
};
template <bool kFresh>
struct PassLoader<kFresh, 0> {
  static GIN_DEVICE_INLINE void run(gin_u128*, const uint8_t*, int) {}
};
template <bool kFresh>
GIN_DEVICE_INLINE void load_pass(gin_u128 (&r)[kReduceUnroll], const uint8_t* p, int nv) {
  PassLoader<kFresh, kReduceUnroll>::run(r, p, nv);
}

struct NoWait {
  GIN_DEVICE_INLINE void operator()() const {}
};

// Bytes [b0, b1) of out = bf16( sum_{k < nk, row_k >= 0} w_k * rowsBase[row_k]
//                               + sum_{lanes j < nExtra, extra_j != 0} extra_j ), fp32 accumulation.
// rowsBase rows are stable for the kernel; extra rows were written during it (window partials).
// waitExtras() is called once by the whole warp, right after the loads of the first group of own
// rows were issued (before they are summed) and before any extra row is read or any byte of out
// is stored: it waits for the extras' flags (consumer) or for the window's write-after-read flags
// (producer) and orders the warp, so its flag round trips overlap the first loads. Lane k holds
// (myRow, myW), lane j holds myExtra. Summation order = lane order (fixed), own rows first.
template <class WaitExtras>
GIN_DEVICE_INLINE void warp_reduce_seg(const uint8_t* rowsBase, uint64_t rowBytes, int myRow, float myW, int nk,
                                       const uint8_t* myExtra, int nExtra, uint8_t* out, bool fast, uint64_t b0,
                                       uint64_t b1, const WaitExtras& waitExtras) {
  const int lane = (int)gin_lane_id();
  bool waited = false;
  if (fast) {
    const uint64_t vEnd = b1 >> 4;
    const lanemask_t rowMask = (lanemask_t)ballot(lane < nk && myRow >= 0);
    const lanemask_t extraMask = (lanemask_t)ballot(lane < nExtra && myExtra != nullptr);
    // Lane k's own row k in L2 one pass ahead (and the first pass itself, whose groups after the
    // first then hit L2): the loads of a pass are limited to kReduceGroup rows by registers.
    const uint8_t* myRowPtr = lane < nk && myRow >= 0 ? rowsBase + (uint64_t)myRow * rowBytes : nullptr;
    constexpr uint64_t kPassBytes = (uint64_t)GIN_WARP_SIZE * kReduceUnroll * 16;
    if (myRowPtr != nullptr) prefetch_l2(myRowPtr + b0, (uint32_t)(b1 - b0 < kPassBytes ? b1 - b0 : kPassBytes));
    for (uint64_t v0 = b0 >> 4; v0 < vEnd; v0 += (uint64_t)GIN_WARP_SIZE * kReduceUnroll) {
      {
        const uint64_t nb0 = (v0 << 4) + kPassBytes;
        if (myRowPtr != nullptr && nb0 < b1) prefetch_l2(myRowPtr + nb0, (uint32_t)(b1 - nb0 < kPassBytes ? b1 - nb0 : kPassBytes));
      }
      float acc[kReduceUnroll][8];
#pragma unroll
      for (int u = 0; u < kReduceUnroll; ++u)
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[u][i] = 0.f;
      // Entries (own rows in lane order, then extras in lane order: a fixed summation order) in
      // groups of kReduceGroup with all their loads in flight; later passes load own rows and
      // extras together (one round trip per pass where they fit one group).
      const uint64_t first = v0 + (uint64_t)lane;  // this lane's vectors: first + u * warp size
      const int nv = first >= vEnd ? 0 : (int)moe_min_i(kReduceUnroll, (int)((vEnd - first + GIN_WARP_SIZE - 1) / GIN_WARP_SIZE));
      lanemask_t mOwn = rowMask, mExt = waited ? extraMask : 0u;
      for (;;) {
        if ((mOwn | mExt) == 0) {
          if (waited) break;
          waitExtras();  // no own row in this segment: wait, then the extras
          waited = true;
          mExt = extraMask;
          continue;
        }
        // Addresses first, loads next, weights last: the loads need only the row indices, so
        // a weight still in flight (recvWeights, loaded with the rows) never delays them.
        const uint8_t* src[kReduceGroup];
        int wl[kReduceGroup];  // lane holding the entry's weight, or -1 (a partial: weight 1)
        bool has[kReduceGroup], fresh[kReduceGroup];
#pragma unroll
        for (int g = 0; g < kReduceGroup; ++g) {
          has[g] = (mOwn | mExt) != 0;
          fresh[g] = mOwn == 0;
          src[g] = rowsBase;
          wl[g] = -1;
          if (mOwn) {
            const int k = lanemask_ffs(mOwn);
            mOwn &= mOwn - 1;
            const int row = gin_shfl_int(myRow, k);
            wl[g] = k;
            src[g] = rowsBase + (uint64_t)(row < 0 ? 0 : row) * rowBytes;
          } else if (mExt) {
            const int j = lanemask_ffs(mExt);
            mExt &= mExt - 1;
            src[g] = shfl_ptr(myExtra, j);
          }
        }
        gin_u128 r[kReduceGroup][kReduceUnroll];
#pragma unroll
        for (int g = 0; g < kReduceGroup; ++g) {
          const uint8_t* p = src[g] + (first << 4);
          if (has[g]) {
            if (fresh[g]) load_pass<true>(r[g], p, nv);
            else load_pass<false>(r[g], p, nv);
          }
        }
        if (!waited) {
          // First group of the segment (own rows only): the wait's flag polls go out while its
          // loads are in flight (not after summing them); the extras follow
          // the own rows, so the summation order is unchanged.
          waitExtras();
          waited = true;
          mExt = extraMask;
        }
#pragma unroll
        for (int g = 0; g < kReduceGroup; ++g) {
          const float wg = wl[g] >= 0 ? shfl_f(myW, wl[g]) : 1.f;  // wl[g] is warp-uniform
#pragma unroll
          for (int u = 0; u < kReduceUnroll; ++u)
            if (has[g] && u < nv) acc_bf16x8(acc[u], r[g][u], wg);
        }
      }
#pragma unroll
      for (int u = 0; u < kReduceUnroll; ++u)
        if (u < nv) gin_st16(out + ((first + (uint64_t)u * GIN_WARP_SIZE) << 4), pack_bf16x8(acc[u]));
    }
  } else {
    const uint64_t e0 = b0 >> 1, e1 = b1 >> 1;
    uint16_t* o16 = (uint16_t*)out;
    for (uint64_t i0 = e0; i0 < e1; i0 += GIN_WARP_SIZE) {
      const uint64_t i = i0 + (uint64_t)lane;
      float acc = 0.f;
      for (int k = 0; k < nk; ++k) {
        const int row = gin_shfl_int(myRow, k);
        const float w = shfl_f(myW, k);
        if (row < 0 || i >= e1) continue;
        acc += w * bf16_to_f32(((const uint16_t*)(rowsBase + (uint64_t)row * rowBytes))[i]);
      }
      if (!waited) {
        waitExtras();
        waited = true;
      }
      for (int j = 0; j < nExtra; ++j) {
        const uint8_t* src = shfl_ptr(myExtra, j);
        if (src == nullptr || i >= e1) continue;
        acc += bf16_to_f32(ld_fresh_u16((const uint16_t*)src + i));
      }
      if (i < e1) o16[i] = (uint16_t)f32_to_bf16(acc);
    }
  }
  if (!waited) waitExtras();  // empty range: the warp still keeps the wait protocol
}

GIN_DEVICE_INLINE void warp_reduce_row(const uint8_t* rowsBase, uint64_t rowBytes, int myRow, float myW, int nk,
                                       uint8_t* out, bool fast) {
  warp_reduce_seg(rowsBase, rowBytes, myRow, myW, nk, nullptr, 0, out, fast, 0, rowBytes, NoWait{});
}

}  // namespace moe_detail
