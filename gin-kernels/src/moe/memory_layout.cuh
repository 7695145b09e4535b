// moe/memory_layout.cuh - what the MoE kernels agree on, host and device: limits, workspace state
// words, the window and workspace layouts, and the token-path choice. The kernels' arguments, the
// layout query's result and the error bits are the ABI header's (abi/moe.h).
#pragma once

#include "../include/gin_device.cuh"
#include "abi/moe.h"  // gin-kernels/abi/moe.h (the build passes -I gin-kernels; NVRTC gets it beside the sources)

// ------------------------------------------------------------------------------------------------
// Limits and constants (mirrored in docs/kernels.md).
// ------------------------------------------------------------------------------------------------
#define MOE_THREADS 512                             // blockDim.x of dispatch, combine, host_layout
#define MOE_WARPS (MOE_THREADS / GIN_WARP_SIZE)     // 16 on NVIDIA, 8 on AMD (wave64)
#define MOE_MAX_WARPS 16                            // sizes the per-warp flag arrays
#define MOE_MAX_RANKS 16
#define MOE_MAX_EXPERTS 2048
#define MOE_MAX_TOPK 32
#define MOE_MAX_CHANNELS 128
#define MOE_MAX_BLOCKS (2 * MOE_MAX_CHANNELS)
#define MOE_TILE_WORDS 3072  // layout tile: experts x 32-token chunks bitmasks (E * chunks <= this)
#define MOE_MAX_HOST_THREADS 1024                   // blockDim.x limit of the other host kernels
#define MOE_MAX_ALIGNMENT 1024                      // MoeDims.expertAlignment: rows per expert block boundary

// Error bits: MOE_ERR_* in abi/moe.h.

// Workspace state words (uint64, zeroed once at creation; offsets in words).
#define MOE_STATE_SEQ_DISPATCH 0      // [MOE_MAX_BLOCKS] call counter per dispatch block
#define MOE_STATE_SEQ_COMBINE 256     // [MOE_MAX_BLOCKS] per combine block
#define MOE_STATE_SEQ_LAYOUT 512      // [MOE_MAX_CHANNELS] per host_layout block
// Layout block c of call n (dispatch sender c, or host_layout block c): (n << 32) - 1 = histogram
// published (two-level layout only), n << 32 = positions published; the dispatch then adds one per
// claimed own-token item (the low 32 bits are the claim counter of call n, reset by that store).
#define MOE_STATE_HIST_READY 640      // [MOE_MAX_CHANNELS]
// Quantizing fp8 dispatch on the token path: sender c stores n here once its tokens' fp8 rows are
// in xq (receiver c's own items wait for it; the layout path's positions release covers them).
#define MOE_STATE_QUANT_READY 768     // [MOE_MAX_CHANNELS]
#define MOE_STATE_DISPATCH_TOKENS 1020  // T of the last dispatch (combine reads it)
#define MOE_STATE_SEQ_ROW_VALUES 1024  // [MOE_MAX_CHANNELS] per moe_gin_row_values block
#define MOE_STATE_WORDS 1152

// ------------------------------------------------------------------------------------------------
// Layouts (host and device). Every offset is in bytes from the window / workspace base.
// ------------------------------------------------------------------------------------------------
__host__ __device__ inline uint64_t moe_align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

// Window section of data that `writer` stores into `owner`'s window: 0..R-2 (nothing for self).
__host__ __device__ inline int moe_peer_section(int writer, int owner, int nRanks) {
  int p = writer - owner - 1;
  return p < 0 ? p + nRanks : p;
}

__host__ __device__ inline int moe_min_i(int a, int b) { return a < b ? a : b; }

// Token-indexed dispatch for small instances: M*K <= MOE_TOKEN_PATH_IDS ids and at most
// 32 tokens per channel (ceil(M/C) <= 32). Decided from (M, K, C) alone, which every rank and
// every call of an instance share, never from T (T may differ per call and per rank).
#define MOE_TOKEN_PATH_IDS 4096
__host__ __device__ inline bool moe_token_path_sizes(int K, int M) {
  return (int64_t)M * (int64_t)K <= (int64_t)MOE_TOKEN_PATH_IDS;
}
// Not on AMD: the token path's LL128 lines trust all 128 bytes once the flag in the last 8 has
// landed, which holds for one 128-byte warp store on NVIDIA; gfx9 GPUs only keep 64 bytes whole
// (RCCL's LL128 lines are 64 bytes there), so a reader could take a line whose first half is
// stale. The layout path's release/acquire progress words hold on both.
__host__ __device__ inline bool moe_token_path(int K, int M, int C) {
#if GIN_HIP
  (void)K, (void)M, (void)C;
  return false;
#else
  return moe_token_path_sizes(K, M) && C >= 1 && (M + C - 1) / C <= 32;
#endif
}
// LL words per token in the id lists: two 16-bit ids per word (0xffff = masked).
__host__ __device__ inline int moe_id_words(int K) { return (K + 1) / 2; }

// LL128 lines (120 payload bytes + an 8-byte flag each) that carry a row of rowBytes bytes.
__host__ __device__ inline uint64_t moe_row_lines(uint64_t rowBytes) { return (rowBytes + 119ull) / 120ull; }
// Combine partials on the token path: ceil(2H / 120) lines per (call parity, expert-rank
// section, slot); see combine_token_path. A bf16 dispatch row on the token path takes as many.
__host__ __device__ inline uint64_t moe_comb_lines(int H) { return moe_row_lines(2ull * (uint64_t)H); }

// Scaled fp8 rows (the fp8 dispatch entries): H e4m3 bytes (e4m3fn on NVIDIA, e4m3fnuz
// on gfx942), then one f32 scale per 128 elements (the last block may be short), the scales padded
// with zeros to a multiple of 4 (16 bytes), so that x[h] = e4m3(row[h]) * scale[h / 128]. Packed in
// one row, a token is one contiguous copy on every path; H % 16 == 0 keeps the rows 16-byte vectors.
// Never more than a bf16 row (2H bytes), so the window's bf16 staging holds it.
__host__ __device__ inline int moe_fp8_scales(int H) { return (H + 127) / 128; }
__host__ __device__ inline uint64_t moe_fp8_row_bytes(int H) {
  return (uint64_t)H + 16ull * (uint64_t)((moe_fp8_scales(H) + 3) / 4);
}
__host__ __device__ inline bool moe_fp8_hidden_ok(int H) { return H >= 16 && H % 16 == 0; }

// Rows this rank can receive: every source token once per local expert it picked, plus the
// padding of A-row aligned expert blocks (at most A - 1 rows after each of the L experts).
__host__ __device__ inline uint64_t moe_recv_capacity_rows(int R, int E, int K, int M, int A = 1) {
  int L = E / R;
  return (uint64_t)R * (uint64_t)M * (uint64_t)moe_min_i(K, L) + (uint64_t)L * (uint64_t)(A > 1 ? A - 1 : 0);
}
// MoeDims.expertAlignment as the kernels use it: 0 and 1 mean packed blocks.
__host__ __device__ inline int moe_alignment(int32_t expertAlignment) { return expertAlignment > 1 ? expertAlignment : 1; }
// Where local expert e's block starts moves by the aligned size of the block before it.
__host__ __device__ inline int moe_expert_block_rows(int rows, int A) { return A > 1 ? (rows + A - 1) / A * A : rows; }

struct MoeWindowLayout {
  uint64_t rowBytes, rowStride, metaStride, countStride;
  uint64_t dispSlotStride;  // bytes per staging slot: rowStride; token-path sizes: the larger of that
                            // and 128 * moe_comb_lines(H) (the token path sends rows as LL128 lines)
  uint64_t dispRows;      // [R-1 sections][M slots][dispSlotStride]   staging rows, by source section
  uint64_t dispMeta;      // [R-1][M][metaStride]: int32 localExpert[K], int32 slotInExpert[K], f32 weight[K]
  uint64_t counts;        // [2 call parities][R sources][countStride]: LL words (call << 32 | value) of
                          // count[L], slots, chanStart[C+1]
  uint64_t combRows;      // [R-1][M][rowStride]   combine partials, by expert-rank section (token-path
                          // sizes: [2 call parities][R-1][M][128 * moe_comb_lines(H)] LL128 lines)
  uint64_t flagsOffset;   // start of the flag area (must be zero before the first call)
  uint64_t dispProgress;  // uint64 [R-1][MOE_MAX_CHANNELS][MOE_MAX_WARPS]
  uint64_t dispConsumed;  // uint64 [R-1][MOE_MAX_CHANNELS]
  uint64_t combProgress;  // uint64 [R-1][MOE_MAX_CHANNELS][MOE_MAX_WARPS]
  uint64_t combConsumed;  // uint64 [R-1][MOE_MAX_CHANNELS]
  uint64_t dispIds;       // token path only (else 0 bytes): [2 call parities][R sources][idsStride] LL
                          // words (call << 32 | payload): word 0 = T, then token t's ids at words
                          // 1 + t*ceil(K/2) + k/2 (16-bit half k % 2); zeroed with the flags
  uint64_t idsStride;
  // moe_gin_row_values: LL words (call << 32 | f32 bits) [2 call parities][R expert ranks][M slots]
  // [K], what expert rank r found for slot j of our tokens sent there; valConsumed uint64 [R]
  // (token rank s done reading its call n's values).
  uint64_t valRows, valConsumed;
  uint64_t flagsBytes, totalBytes;
};

__host__ __device__ inline MoeWindowLayout moe_window_layout(int R, int E, int K, int H, int M) {
  MoeWindowLayout w;
  const uint64_t P = R > 1 ? (uint64_t)(R - 1) : 0;
  const uint64_t L = (uint64_t)(E / R);
  const uint64_t slots = P * (uint64_t)M;
  w.rowBytes = 2ull * (uint64_t)H;
  w.rowStride = moe_align_up(w.rowBytes, 16);
  w.metaStride = moe_align_up(12ull * (uint64_t)K, 16);
  w.countStride = moe_align_up(8ull * (L + 2 + MOE_MAX_CHANNELS), 16);
  w.dispSlotStride = w.rowStride;
  if (moe_token_path_sizes(K, M) && 128ull * moe_comb_lines(H) > w.dispSlotStride) w.dispSlotStride = 128ull * moe_comb_lines(H);
  uint64_t o = 0;
  w.dispRows = o;
  o = moe_align_up(o + slots * w.dispSlotStride, 256);
  w.dispMeta = o;
  o = moe_align_up(o + slots * w.metaStride, 256);
  w.counts = o;
  o = moe_align_up(o + 2ull * (uint64_t)R * w.countStride, 256);
  w.combRows = o;
  o = moe_align_up(o + (moe_token_path_sizes(K, M) ? 2ull * slots * 128ull * moe_comb_lines(H) : slots * w.rowStride), 256);
  w.flagsOffset = o;
  w.dispProgress = o;
  o += 8ull * P * MOE_MAX_CHANNELS * MOE_MAX_WARPS;
  w.dispConsumed = o;
  o += 8ull * P * MOE_MAX_CHANNELS;
  w.combProgress = o;
  o += 8ull * P * MOE_MAX_CHANNELS * MOE_MAX_WARPS;
  w.combConsumed = o;
  o += 8ull * P * MOE_MAX_CHANNELS;
  w.idsStride = moe_token_path_sizes(K, M) ? moe_align_up(8ull * (1ull + (uint64_t)M * (uint64_t)moe_id_words(K)), 16) : 0;
  o = moe_align_up(o, 256);
  w.dispIds = o;
  o += 2ull * (uint64_t)R * w.idsStride;
  o = moe_align_up(o, 256);
  w.valConsumed = o;
  o = moe_align_up(o + 8ull * (uint64_t)R, 256);
  w.valRows = o;
  o = moe_align_up(o + 2ull * (uint64_t)R * (uint64_t)M * (uint64_t)K * 8ull, 256);
  w.flagsBytes = o - w.flagsOffset;
  w.totalBytes = o;
  return w;
}

// Local (non-window) device memory of one MoE instance; zeroed once at creation (at least the
// state words). Arrays are int32 unless noted.
struct MoeWorkspaceLayout {
  uint64_t state;          // uint64 [MOE_STATE_WORDS]
  uint64_t tokenPos;       // [M][R]  index of token t among this rank's tokens going to rank d, or -1
  uint64_t slotInExpert;   // [M][K]  index of (t, expert k) among this rank's rows for that expert, or -1
  uint64_t sendList;       // [R][M]  token of slot i to rank d (inverse of tokenPos)
  uint64_t expertCount;    // [E]     this rank's rows per global expert
  uint64_t expertOffset;   // [E+1]   host_layout only: exclusive scan of expertCount (send-row order)
  uint64_t tokensTo;       // [R]     tokens going to each rank (slots)
  uint64_t rowsTo;         // [R]     host_layout only: rows going to each rank
  uint64_t chanStartTo;    // [R][MOE_MAX_CHANNELS+1] first slot to rank d of each token channel
  uint64_t histE;          // [MOE_MAX_CHANNELS][E] per-block expert histograms (scratch)
  uint64_t histD;          // [MOE_MAX_CHANNELS][R] per-block destination histograms (scratch)
  uint64_t slotRows;       // [R][M][K] recvX row of (received slot, k), or -1 (dispatch -> combine)
  uint64_t slotsFrom;      // [R]     slots received from each source
  uint64_t chanStartFrom;  // [R][MOE_MAX_CHANNELS+1] source s's channel boundaries in its slots to us
  uint64_t totalBytes;
};

__host__ __device__ inline MoeWorkspaceLayout moe_workspace_layout(int R, int E, int K, int M) {
  MoeWorkspaceLayout w;
  const uint64_t r = (uint64_t)R, e = (uint64_t)E, k = (uint64_t)K, m = (uint64_t)M;
  uint64_t o = 0;
  w.state = o;
  o = moe_align_up(o + 8ull * MOE_STATE_WORDS, 256);
  w.tokenPos = o;
  o = moe_align_up(o + 4ull * m * r, 256);
  w.slotInExpert = o;
  o = moe_align_up(o + 4ull * m * k, 256);
  w.sendList = o;
  o = moe_align_up(o + 4ull * r * m, 256);
  w.expertCount = o;
  o = moe_align_up(o + 4ull * e, 256);
  w.expertOffset = o;
  o = moe_align_up(o + 4ull * (e + 1), 256);
  w.tokensTo = o;
  o = moe_align_up(o + 4ull * r, 256);
  w.rowsTo = o;
  o = moe_align_up(o + 4ull * r, 256);
  w.chanStartTo = o;
  o = moe_align_up(o + 4ull * r * (MOE_MAX_CHANNELS + 1), 256);
  w.histE = o;
  o = moe_align_up(o + 4ull * MOE_MAX_CHANNELS * e, 256);
  w.histD = o;
  o = moe_align_up(o + 4ull * MOE_MAX_CHANNELS * r, 256);
  w.slotRows = o;
  o = moe_align_up(o + 4ull * r * m * k, 256);
  w.slotsFrom = o;
  o = moe_align_up(o + 4ull * r, 256);
  w.chanStartFrom = o;
  o = moe_align_up(o + 4ull * r * (MOE_MAX_CHANNELS + 1), 256);
  w.totalBytes = o;
  return w;
}

// Sizes every kernel accepts (the same check on host and device).
__host__ __device__ inline bool moe_sizes_ok(int R, int E, int K, int H, int M) {
  if (R < 1 || R > MOE_MAX_RANKS || E < R || E > MOE_MAX_EXPERTS || E % R != 0) return false;
  if (K < 1 || K > MOE_MAX_TOPK || H < 1 || M < 1) return false;
  // int32 row indices: receive capacity and send rows stay below 2^31.
  if (moe_recv_capacity_rows(R, E, K, M) >= (1ull << 31) || (uint64_t)M * (uint64_t)K >= (1ull << 31)) return false;
  if ((uint64_t)M * (uint64_t)R >= (1ull << 31)) return false;
  return true;
}
