// moe/routing.cuh - per-launch sizes (Dims, the entry points' fixed shapes), token ranges of the
// channels, expert-id validation, the block scan, and the launch checks every kernel runs first.
#pragma once

#include "memory_layout.cuh"
#include "warp_loads.cuh"

namespace moe_detail {

// ------------------------------------------------------------------------------------------------
// Per-launch scalars derived from the arguments (registers; never a kernel argument).
// ------------------------------------------------------------------------------------------------
struct Dims {
  int R, rank, E, L, K, H, M, C, T;
  int A;  // expert block alignment in rows (moe_alignment of MoeDims.expertAlignment; make_dims: 1)
  uint64_t rowBytes;
};

GIN_DEVICE_INLINE Dims make_dims(int rank, int nRanks, int numExperts, int topK, int hidden, int maxTokens,
                                 int numChannels, int numTokens) {
  Dims d;
  d.R = nRanks;
  d.rank = rank;
  d.E = numExperts;
  d.L = nRanks > 0 ? numExperts / nRanks : 0;
  d.K = topK;
  d.H = hidden;
  d.M = maxTokens;
  d.C = numChannels;
  d.T = numTokens < 0 ? 0 : (numTokens > maxTokens ? maxTokens : numTokens);
  d.A = 1;
  d.rowBytes = 2ull * (uint64_t)(hidden > 0 ? hidden : 0);
  return d;
}

// What a kernel entry point fixes at compile time. kTokenPathOnly: the entry runs only
// instances on the token path (moe_token_path), so the layout path is not compiled into it; kR, kE,
// kK, kH (0 = from the arguments): a model shape. With the shape fixed the compiler folds the
// layout arithmetic, divisions by R and L and the loops over ranks and top-k ids (the prologue
// alone: ~1.6 -> ~0.6 us), and the smaller kernel starts faster from cold. DeepSeek-V3, 128 tokens,
// same run: 8 calls back to back 19.5 / 15.1 us per dispatch / combine vs 22.1 / 15.9 generic.
// kFp8 (dispatch entries only): the rows are scaled fp8 rows (moe_fp8_row_bytes), not bf16.
template <bool kTokenPathOnly, int kR, int kE, int kK, int kH, bool kFp8 = false>
struct MoeShape {
  static constexpr bool tokenPathOnly = kTokenPathOnly;
  static constexpr bool fp8 = kFp8;
  // True if the launch arguments are this entry's to run (the caller gets MOE_ERR_CONFIG if not).
  GIN_DEVICE_INLINE static bool accepts(int R, int E, int K, int H, int M, int C) {
    return (kR == 0 || R == kR) && (kE == 0 || E == kE) && (kK == 0 || K == kK) && (kH == 0 || H == kH) &&
           (!kTokenPathOnly || moe_token_path(K, M, C)) && (!kFp8 || moe_fp8_hidden_ok(H));
  }
  // d with the fixed sizes as constants (once accepts() held).
  GIN_DEVICE_INLINE static void fix(Dims& d) {
    if (kR != 0) d.R = kR;
    if (kE != 0) d.E = kE;
    if (kR != 0 && kE != 0) d.L = kE / (kR != 0 ? kR : 1);  // (the guard only silences a warning)
    if (kK != 0) d.K = kK;
    if (kH != 0) {
      d.H = kH;
      d.rowBytes = 2ull * (uint64_t)kH;
    }
    if (kFp8) d.rowBytes = moe_fp8_row_bytes(d.H);
  }
};
using MoeAnyShape = MoeShape<false, 0, 0, 0, 0>;

// Part i of T tokens cut into n parts: [i*T/n, (i+1)*T/n).
GIN_DEVICE_INLINE void token_part(int T, int i, int n, int& t0, int& t1) {
  t0 = (int)((int64_t)i * T / n);
  t1 = (int)((int64_t)(i + 1) * T / n);
}
// Token range of channel c: [c*T/C, (c+1)*T/C). Dispatch senders and combine consumers share it.
GIN_DEVICE_INLINE void token_range(const Dims& d, int c, int& t0, int& t1) { token_part(d.T, c, d.C, t0, t1); }
// The combine consumer's tokens. With remote ranks, channel c's (the remote producers send the
// partials of channel c's slots). Alone (R = 1) there is nothing to produce, so every
// one of the 2C blocks consumes, block b part b of 2C: the producers' C SMs used to idle.
GIN_DEVICE_INLINE void consumer_tokens(const Dims& d, int c, int& t0, int& t1) {
  if (d.R == 1) token_part(d.T, (int)blockIdx.x, 2 * d.C, t0, t1);
  else token_range(d, c, t0, t1);
}
// The quantizing dispatch's layout path: sender c quantizes tokens [t0, quant_split) of its range,
// receiver c (idle until the count tables come) the rest, [quant_split, t1). Sender c lays out the
// routing first (~18 us at 4096 tokens while the receivers quantize), hence the smaller share
// (DeepSeek-V3 4096 tokens on one H200: a quarter 133.7 us per call at one rank, a
// third 135.5, a half 138.8).
GIN_DEVICE_INLINE int quant_split(int t0, int t1) { return t0 + (t1 - t0) / 4; }

// ev[0..K) in place: ids < -1 or >= E, and repeats of an earlier slot, become -1. True if any did.
GIN_DEVICE_INLINE bool validate_experts(int* ev, const Dims& d) {
  bool bad = false;
#pragma unroll
  for (int k = 0; k < MOE_MAX_TOPK; ++k) {
    if (k >= d.K) break;
    int e = ev[k];
    if (e < -1 || e >= d.E) {
      bad = true;
      e = -1;
    } else if (e >= 0) {
#pragma unroll
      for (int j = 0; j < k; ++j) {
        if (ev[j] == e) {
          bad = true;
          e = -1;
        }
      }
    }
    ev[k] = e;
  }
  return bad;
}

// Validated expert ids of token t: ids < -1 or >= E, and repeats of an earlier slot, become -1.
GIN_DEVICE_INLINE void token_experts(const int* topkIdx, int t, const Dims& d, int* ev, bool report,
                                     uint32_t* errorFlags) {
  // Fully unrolled with constant indices (loops break at K), so ev[] stays in registers: with a
  // dynamic index it lived in local memory and the dependent compare chain cost ~1-3 us per token
  // (a routing written that way took 21-33 us at 4096 tokens). Callers index ev[] the same way.
  const int* row = topkIdx + (uint64_t)t * (uint64_t)d.K;
#pragma unroll
  for (int k = 0; k < MOE_MAX_TOPK; ++k) {
    if (k >= d.K) break;
    ev[k] = row[k];  // all loads issued before the first compare
  }
  if (validate_experts(ev, d) && report) gin_error_set(errorFlags, MOE_ERR_EXPERT_ID);
}

// Ids one per lane, in groups of Kp lanes (a power of two <= 32; a group = one token, lane k of
// the group = id k): true where e >= 0 and a lower lane of the group holds e too (token_experts'
// repeat rule, which masks that id).
GIN_DEVICE_INLINE bool id_repeats_lower(int e, int k, int Kp) {
  // Kp - 1 shuffles within the group, rather than __match_any_sync on NVIDIA, which costs the
  // receivers' walk ~0.7 us per source (DeepSeek-V3 128 tokens: own ids 1.5 -> 0.8 us).
  bool dup = false;
  for (int j = 1; j < Kp; ++j) {
    const int o = shfl_up_w(e, j, Kp);
    if (k >= j && e >= 0 && o == e) dup = true;
  }
  return dup;
}

// The token walks of the layout one id per lane: groups of Kp lanes (K rounded up to a
// power of two) hold one token, lane k of the group its id k, a block takes blockDim / Kp tokens
// per round, as the token path does; here it replaces one token per thread with its
// K ids in a dependent chain (~500 instructions per token, the 4096-token layout's ~7 us routing
// count and ~9 us positions at 62 tokens per block).
GIN_DEVICE_INLINE int id_group_size(int K) {
  int Kp = 1;
  while (Kp < K) Kp <<= 1;
  return Kp;
}
// Lane k's id of token t, validated by token_experts' rule (out of range, then a repeat of a lower
// lane's id: -1, bad = true); -1 for t >= tEnd or k >= K. Whole warp (shuffles).
GIN_DEVICE_INLINE int lane_expert(const int* topkIdx, int t, int tEnd, int k, int Kp, const Dims& d, bool& bad) {
  int e = -1;
  bad = false;
  if (t < tEnd && k < d.K) {
    e = topkIdx[(uint64_t)t * d.K + k];
    if (e < -1 || e >= d.E) {
      bad = true;
      e = -1;
    }
  }
  if (id_repeats_lower(e, k, Kp)) {
    bad = true;
    e = -1;
  }
  return e;
}
// True on the lowest lane of the group whose valid id lives on that id's rank (a token counts once
// per destination rank).
GIN_DEVICE_INLINE bool lane_first_of_rank(int e, int k, int Kp, const Dims& d) {
  const int r = e >= 0 ? e / d.L : -1;
  return !id_repeats_lower(r, k, Kp) && r >= 0;
}

// In-place exclusive scan of a[0..n) in shared memory by the whole block; returns the total.
// tmp: at least blockDim.x / warp size ints of shared memory. Must be called by every thread of the
// block (block size a multiple of the warp size). Warp shuffles: 3 barriers instead of the
// 2 * log2(blockDim) of a shared-memory ladder (~1-2 us at 512 threads).
GIN_DEVICE_INLINE int block_exclusive_scan(int* a, int n, int* tmp) {
  const int B = (int)blockDim.x, tid = (int)threadIdx.x;
  const int lane = (int)gin_lane_id(), warp = tid / GIN_WARP_SIZE, nw = B / GIN_WARP_SIZE;
  const int per = (n + B - 1) / B;
  const int begin = moe_min_i(n, tid * per), end = moe_min_i(n, begin + per);
  int sum = 0;
  for (int i = begin; i < end; ++i) sum += a[i];
  int inc = sum;
#pragma unroll
  for (int off = 1; off < GIN_WARP_SIZE; off <<= 1) {
    const int v = shfl_up_i(inc, off);
    if (lane >= off) inc += v;
  }
  if (lane == GIN_WARP_SIZE - 1) tmp[warp] = inc;
  __syncthreads();
  if (warp == 0) {
    int w = lane < nw ? tmp[lane] : 0;
#pragma unroll
    for (int off = 1; off < GIN_WARP_SIZE; off <<= 1) {
      const int v = shfl_up_i(w, off);
      if (lane >= off) w += v;
    }
    if (lane < nw) tmp[lane] = w;
  }
  __syncthreads();
  int run = (warp > 0 ? tmp[warp - 1] : 0) + inc - sum;
  for (int i = begin; i < end; ++i) {
    const int x = a[i];
    a[i] = run;
    run += x;
  }
  const int total = tmp[nw - 1];
  __syncthreads();
  return total;
}

// The launch checks that read only the arguments and the launch shape (no memory), so an entry
// launched with PDL can run them before gin_wait_prior_grids, under the previous kernel's drain.
// Every block reaches the same verdict.
GIN_DEVICE_INLINE bool launch_args_ok(const Dims& d, int blocksPerChannel, bool needRank, const void* must1, const void* must2) {
  // At A = 1 moe_sizes_ok has checked the capacity: the short cut spares every thread a second
  // E / R (a 32-bit division, ~40 instructions) before its first load.
  return moe_sizes_ok(d.R, d.E, d.K, d.H, d.M) && d.A >= 1 && d.A <= MOE_MAX_ALIGNMENT &&
         (d.A == 1 || moe_recv_capacity_rows(d.R, d.E, d.K, d.M, d.A) < (1ull << 31)) && d.C >= 1 &&
         d.C <= MOE_MAX_CHANNELS &&
         blockDim.x == MOE_THREADS && blockDim.y == 1 && blockDim.z == 1 && gridDim.y == 1 &&
         gridDim.z == 1 && gridDim.x == (unsigned)(blocksPerChannel * d.C) && must1 != nullptr &&
         must2 != nullptr && (!needRank || (d.rank >= 0 && d.rank < d.R));
}

// A verdict reported: MOE_ERR_CONFIG by block 0 when !ok. After gin_wait_prior_grids (a kernel or
// copy before this one in the stream may still be writing the error word).
GIN_DEVICE_INLINE bool config_ok(bool ok, uint32_t* errorFlags) {
  if (!ok && blockIdx.x == 0 && threadIdx.x == 0) gin_error_set(errorFlags, MOE_ERR_CONFIG);
  return ok;
}

// Common launch checks; every block reaches the same verdict, block 0 reports it.
GIN_DEVICE_INLINE bool launch_ok(const Dims& d, int blocksPerChannel, bool needRank, const void* must1,
                                 const void* must2, uint32_t* errorFlags) {
  return config_ok(launch_args_ok(d, blocksPerChannel, needRank, must1, must2), errorFlags);
}

GIN_DEVICE_INLINE bool peers_ok(const uint64_t* peerBases, int R, uint32_t* errorFlags) {
  bool ok = true;
  for (int p = 0; p < R; ++p) ok &= peerBases[p] != 0 && (peerBases[p] & 15u) == 0;
  if (!ok && blockIdx.x == 0 && threadIdx.x == 0) gin_error_set(errorFlags, GIN_ERR_NO_LSA_PATH);
  return ok;
}

GIN_DEVICE_INLINE uint64_t* state_of(uint8_t* workspace) {
  return (uint64_t*)workspace;  // state words sit at offset 0
}

// Reads this block's call counter (+1) into *seqOut for every thread; thread 0 stores it back at
// the end via store_seq. Every block of a launch holds the same value (all start equal, all +1).
GIN_DEVICE_INLINE uint64_t load_seq(uint64_t* counter, uint64_t* sharedSeq) {
  if (threadIdx.x == 0) *sharedSeq = *counter + 1;
  __syncthreads();
  return *sharedSeq;
}

}  // namespace moe_detail

using namespace moe_detail;
