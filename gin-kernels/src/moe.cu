// moe.cu - MoE dispatch and combine (expert-parallel token exchange) for both backends.
//
//   GIN (GPU-initiated, LSA windows; no host round trip, graph-capturable):
//     moe_gin_dispatch   1 launch: routing layout + send (each token once per destination rank)
//                        + receive/expand into the expert-major recvX.
//     moe_gin_combine    1 launch: expert-side weighted partial sums per (token, rank), sent back
//                        once per destination rank, and the source-side fp32 reduction into y.
//   HOST (TorchTitan style; the exchanges are ncclAlltoAll / ncclSend / ncclRecv from Java):
//     moe_host_layout, moe_host_pack, moe_host_permute, moe_host_unpermute, moe_host_combine.
//   moe_query_layout     writes the window and workspace layouts (the Java side sizes both).
//
// Signatures, grids, window/workspace layouts, error bits and the ordering arguments are in
// docs/kernels.md, section "moe.cu"; the short form of each argument sits next to the code.
#include "gin_sync.cuh"

// ------------------------------------------------------------------------------------------------
// Limits and constants (mirrored in docs/kernels.md).
// ------------------------------------------------------------------------------------------------
#ifndef MOE_THREADS
#define MOE_THREADS 512                             // blockDim.x of dispatch, combine, host_layout
#endif
#define MOE_WARPS (MOE_THREADS / GIN_WARP_SIZE)     // 16 on NVIDIA, 8 on AMD (wave64)
#define MOE_MAX_WARPS 16                            // sizes the per-warp flag arrays
#define MOE_MAX_RANKS 16
#define MOE_MAX_EXPERTS 2048
#define MOE_MAX_TOPK 32
#define MOE_MAX_CHANNELS 128
#define MOE_MAX_BLOCKS (2 * MOE_MAX_CHANNELS)
#define MOE_TILE_WORDS 3072  // layout tile: experts x 32-token chunks bitmasks (E * chunks <= this)
#define MOE_MAX_HOST_THREADS 1024                   // blockDim.x limit of the other host kernels

// Error bits (bits 0-7 are gin_sync's, e.g. GIN_ERR_TIMEOUT = 1 and GIN_ERR_NO_LSA_PATH = 16).
#define MOE_ERR_EXPERT_ID (1u << 8)   // topkIdx entry < -1, >= E, or repeated in a token: masked
#define MOE_ERR_TOKENS (1u << 9)      // numTokens < 0 or > maxTokens: clamped to [0, maxTokens]
#define MOE_ERR_CONFIG (1u << 10)     // launch geometry / sizes outside the limits: nothing done
#define MOE_ERR_COUNTS (1u << 11)     // received counts or row indices inconsistent: rows dropped

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

// Optional phase timing (test builds only: moe_test.cu defines MOE_PROFILE before including this
// file and points moe_profile_buf at a device buffer for one call; null = no stamps). Thread 0
// of each block stores %globaltimer into [kernel 0 dispatch / 1 combine][block][slot].
// The same slots follow in a second array [2][MOE_MAX_BLOCKS][MOE_PROF_SLOTS] holding the SM's
// cycle counter (%globaltimer moves in 1 us steps on some GPUs, too coarse for phases
// of a few us; cycles are exact within a block, and the timer gives the clock rate and the
// alignment across blocks).
#define MOE_PROF_SLOTS 24
#ifdef MOE_PROFILE
// In constant memory: a stamp then reads the pointer from the constant cache (a global load here
// put an L2 round trip, ~0.15-0.25 us, inside every stamped interval).
__constant__ uint64_t* moe_profile_buf = nullptr;
#define MOE_PROF(kernel, slot)                                                                              \
  do {                                                                                                      \
    uint64_t* pb_ = moe_profile_buf;                                                                        \
    if (pb_ != nullptr && threadIdx.x == 0) {                                                               \
      const uint64_t ix_ = ((uint64_t)(kernel) * MOE_MAX_BLOCKS + blockIdx.x) * MOE_PROF_SLOTS + (slot);   \
      pb_[ix_] = gin_clock_ns();                                                                            \
      pb_[2ull * MOE_MAX_BLOCKS * MOE_PROF_SLOTS + ix_] = gin_cycles();                                     \
    }                                                                                                       \
  } while (0)
// A block-wide barrier only while profiling (so that a stamp covers every warp's work).
#define MOE_PROF_SYNC()                        \
  do {                                         \
    if (moe_profile_buf != nullptr) __syncthreads(); \
  } while (0)
// A stamp taken only once `value` (a register a load fills) has arrived: the empty asm reads it.
#if GIN_HIP
#define MOE_PROF_AFTER(kernel, slot, value) MOE_PROF(kernel, slot)
#else
#define MOE_PROF_AFTER(kernel, slot, value)  \
  do {                                       \
    asm volatile("" ::"r"(value));           \
    MOE_PROF(kernel, slot);                  \
  } while (0)
#endif
#else
#define MOE_PROF(kernel, slot) \
  do {                         \
  } while (0)
#define MOE_PROF_SYNC() \
  do {                  \
  } while (0)
#define MOE_PROF_AFTER(kernel, slot, value) \
  do {                                      \
  } while (0)
#endif

// moe_query_layout output words.
#define MOE_Q_WINDOW_BYTES 0
#define MOE_Q_WINDOW_FLAGS_OFFSET 1
#define MOE_Q_WINDOW_FLAGS_BYTES 2
#define MOE_Q_WORKSPACE_BYTES 3
#define MOE_Q_WORKSPACE_STATE_BYTES 4
#define MOE_Q_RECV_CAPACITY_ROWS 5
#define MOE_Q_SEND_CAPACITY_ROWS 6
#define MOE_Q_WS_EXPERT_COUNT 7
#define MOE_Q_WS_EXPERT_OFFSET 8
#define MOE_Q_WS_ROWS_TO 9
#define MOE_Q_WS_TOKENS_TO 10
#define MOE_Q_WS_SLOT_IN_EXPERT 11
#define MOE_Q_WS_TOKEN_POS 12
#define MOE_Q_ROW_STRIDE 13
#define MOE_Q_VERSION 14
#define MOE_Q_TOKEN_PATH 15  // 1: the instance takes the token path (moe_token_path) at numChannels
#define MOE_Q_WORDS 16
#define MOE_LAYOUT_VERSION 1

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
#ifndef MOE_TOKEN_PATH_IDS
#define MOE_TOKEN_PATH_IDS 4096  // overridable only to test both paths at small sizes (host emulation)
#endif
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
// Model shapes (ranks, experts, top-k, hidden) with token-path entry points of their own, compiled
// with these sizes as constants (see "Entry points" below): DeepSeek-V3, Qwen3-30B-A3B and
// Mixtral 8x7B at 2, 4 and 8 ranks (expert parallelism inside one node).
#define MOE_TP_SHAPES(X)                                           \
  X(2, 256, 8, 7168) X(4, 256, 8, 7168) X(8, 256, 8, 7168)         \
  X(2, 128, 8, 2048) X(4, 128, 8, 2048) X(8, 128, 8, 2048)         \
  X(2, 8, 2, 4096) X(4, 8, 2, 4096) X(8, 8, 2, 4096)
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

// Rows this rank can receive: every source token once per local expert it picked.
__host__ __device__ inline uint64_t moe_recv_capacity_rows(int R, int E, int K, int M) {
  int L = E / R;
  return (uint64_t)R * (uint64_t)M * (uint64_t)moe_min_i(K, L);
}

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

namespace moe_detail {

// ------------------------------------------------------------------------------------------------
// Small portable helpers.
// ------------------------------------------------------------------------------------------------
GIN_DEVICE_INLINE int shfl_up_i(int v, int delta) {
#if GIN_HIP
  return __shfl_up(v, (unsigned)delta);
#else
  return __shfl_up_sync(0xffffffffu, v, (unsigned)delta);
#endif
}
// shfl_up_i within groups of `width` lanes (a power of two).
GIN_DEVICE_INLINE int shfl_up_w(int v, int delta, int width) {
#if GIN_HIP
  return __shfl_up(v, (unsigned)delta, width);
#else
  return __shfl_up_sync(0xffffffffu, v, (unsigned)delta, width);
#endif
}
GIN_DEVICE_INLINE float shfl_f(float v, int src) { return __int_as_float(gin_shfl_int(__float_as_int(v), src)); }
GIN_DEVICE_INLINE const uint8_t* shfl_ptr(const uint8_t* p, int src) {
  uint64_t u = (uint64_t)(uintptr_t)p;
  uint32_t lo = (uint32_t)gin_shfl_int((int)(uint32_t)u, src);
  uint32_t hi = (uint32_t)gin_shfl_int((int)(uint32_t)(u >> 32), src);
  return (const uint8_t*)(uintptr_t)(((uint64_t)hi << 32) | lo);
}

// Lanes of the warp/wavefront where p holds (bit = lane).
GIN_DEVICE_INLINE uint64_t ballot(bool p) {
#if GIN_HIP
  return (uint64_t)__ballot(p);
#else
  return (uint64_t)__ballot_sync(0xffffffffu, p);
#endif
}

// A ballot as narrow as the warp (32-bit masks on NVIDIA: fewer registers in the reductions).
#if GIN_WARP_SIZE > 32
typedef uint64_t lanemask_t;
GIN_DEVICE_INLINE int lanemask_ffs(lanemask_t m) { return __ffsll((long long)m) - 1; }
#else
typedef uint32_t lanemask_t;
GIN_DEVICE_INLINE int lanemask_ffs(lanemask_t m) { return __ffs((int)m) - 1; }
#endif

// Execution + memory barrier of one warp/wavefront.
GIN_DEVICE_INLINE void syncwarp() {
#if GIN_HIP
  __builtin_amdgcn_fence(__ATOMIC_ACQ_REL, "wavefront");
  __builtin_amdgcn_wave_barrier();
#else
  __syncwarp();
#endif
}

// Loads of data written during this kernel by another block or another GPU (after the matching
// acquire): never through the non-coherent path, and not kept in L1.
GIN_DEVICE_INLINE int ld_fresh_i32(const int* p) {
#if GIN_HIP
  return __hip_atomic_load(p, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
#else
  return __ldcg(p);
#endif
}
GIN_DEVICE_INLINE int4 ld_fresh_i32x4(const int* p) {  // p 16-byte aligned
#if GIN_HIP
  return make_int4(ld_fresh_i32(p), ld_fresh_i32(p + 1), ld_fresh_i32(p + 2), ld_fresh_i32(p + 3));
#else
  return __ldcg((const int4*)p);
#endif
}
GIN_DEVICE_INLINE uint16_t ld_fresh_u16(const uint16_t* p) {
#if GIN_HIP
  return *(const volatile uint16_t*)p;
#else
  return __ldcg((const unsigned short*)p);
#endif
}
GIN_DEVICE_INLINE gin_u128 ld16_fresh(const void* p) {
  gin_u128 v;
#if GIN_HIP
  v.lo = __hip_atomic_load((const uint64_t*)p, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
  v.hi = __hip_atomic_load((const uint64_t*)p + 1, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
#else
  asm volatile("ld.global.cg.v2.u64 {%0, %1}, [%2];" : "=l"(v.lo), "=l"(v.hi) : "l"(p));
#endif
  return v;
}
GIN_DEVICE_INLINE uint64_t ld8_fresh(const void* p) {
#if GIN_HIP
  return __hip_atomic_load((const uint64_t*)p, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
#else
  uint64_t v;
  asm volatile("ld.global.cg.u64 %0, [%1];" : "=l"(v) : "l"(p));
  return v;
#endif
}
template <bool kFresh>
GIN_DEVICE_INLINE gin_u128 ld16(const void* p) {
  return kFresh ? ld16_fresh(p) : gin_ld16_stream(p);
}
// ld16 at p + kOff bytes (an immediate of the instruction): a reduction pass keeps one address
// register pair per row instead of one per vector in flight (16 vectors per lane).
template <bool kFresh, int kOff>
GIN_DEVICE_INLINE gin_u128 ld16_at(const uint8_t* p) {
#if GIN_HIP
  return ld16<kFresh>(p + kOff);
#else
  gin_u128 v;
  if (kFresh)
    asm volatile("ld.global.cg.v2.u64 {%0, %1}, [%2+%3];" : "=l"(v.lo), "=l"(v.hi) : "l"(p), "n"(kOff));
  else
    asm volatile("ld.global.nc.L1::no_allocate.v2.u64 {%0, %1}, [%2+%3];" : "=l"(v.lo), "=l"(v.hi) : "l"(p), "n"(kOff));
  return v;
#endif
}
template <bool kFresh>
GIN_DEVICE_INLINE uint16_t ld_u16(const uint16_t* p) {
  return kFresh ? ld_fresh_u16(p) : *p;
}

GIN_DEVICE_INLINE float bf16_to_f32(uint32_t b) { return __uint_as_float((b & 0xffffu) << 16); }

// Round to nearest even; NaN stays NaN.
GIN_DEVICE_INLINE uint32_t f32_to_bf16(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u;
  u += 0x7fffu + ((u >> 16) & 1u);
  return u >> 16;
}

GIN_DEVICE_INLINE void acc_bf16x8(float* acc, gin_u128 v, float w) {
#pragma unroll
  for (int i = 0; i < 4; ++i) acc[i] += w * bf16_to_f32((uint32_t)(v.lo >> (16 * i)));
#pragma unroll
  for (int i = 0; i < 4; ++i) acc[4 + i] += w * bf16_to_f32((uint32_t)(v.hi >> (16 * i)));
}

GIN_DEVICE_INLINE gin_u128 pack_bf16x8(const float* acc) {
  gin_u128 v;
  v.lo = (uint64_t)f32_to_bf16(acc[0]) | ((uint64_t)f32_to_bf16(acc[1]) << 16) |
         ((uint64_t)f32_to_bf16(acc[2]) << 32) | ((uint64_t)f32_to_bf16(acc[3]) << 48);
  v.hi = (uint64_t)f32_to_bf16(acc[4]) | ((uint64_t)f32_to_bf16(acc[5]) << 16) |
         ((uint64_t)f32_to_bf16(acc[6]) << 32) | ((uint64_t)f32_to_bf16(acc[7]) << 48);
  return v;
}

// ------------------------------------------------------------------------------------------------
// Per-launch scalars derived from the arguments (registers; never a kernel argument).
// ------------------------------------------------------------------------------------------------
struct Dims {
  int R, rank, E, L, K, H, M, C, T;
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

// ------------------------------------------------------------------------------------------------
// Row movers (one warp per row segment). `fast`: rowBytes % 16 == 0 and all bases 16-byte aligned.
// A segment is the byte range [b0, b1) of a row (b0, b1 multiples of 16 on the fast path; even
// otherwise), see row_split.
// ------------------------------------------------------------------------------------------------
constexpr int kExpandUnroll = 4;   // 16-byte vectors in flight per lane when copying
// Reductions: 4 output vectors per lane per pass (a pass covers 2 KB of a row per warp)
// and rows in groups of 2 with all their loads in flight (8 x 16 bytes per lane, as before), so a
// pass makes 64 bytes per lane in ceil(entries / 2) round trips. Rounds 2-5 used 2 x 4 (32 bytes per
// lane in ceil(entries / 4) round trips): the producers reached ~300 GB/s at 4096 tokens and a
// 2 KB segment at 128 tokens took two dependent passes. 4 x 4 and 4 x 3 need 140-150 registers
// (ptxas: 88-160 byte stack frames at the 128-register cap of 512 threads).
constexpr int kReduceUnroll = 4;   // output vectors per lane per pass
constexpr int kReduceGroup = 2;    // rows (own + partials) whose loads are in flight together

// Work items: a list of n rows is cut into n * nseg items, item i = (row i / nseg, segment
// i % nseg), so that a call with few rows per channel still keeps every warp of the block busy
// with one load round trip each (small calls are latency-bound: a 14 KB row done by one warp is
// 7 dependent round trips), while many rows give nseg = 1 (one flag per row, as before). Sender
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

// ------------------------------------------------------------------------------------------------
// Routing layout, shared by moe_gin_dispatch (its sender blocks) and moe_host_layout.
// Block c of C owns tokens [c*T/C, (c+1)*T/C). Positions are deterministic: the row of (t, e) among
// this rank's rows for expert e is the number of tokens t' < t that picked e (slotInExpert), the
// slot of t towards rank d is the number of tokens t' < t going to d (tokenPos). Each block
//   1. counts its tokens per expert / destination and publishes the histogram (histReady[c] = seq),
//   2. sums the histograms of blocks < c (it waits only for lower blocks, so blocks dispatched in
//      index order always progress) = its starting offsets; the last block also gets the totals,
//   3. walks its tokens in tiles of 32-token chunks: per expert a 32-bit mask per chunk (atomicOr,
//      order-free), a scan over chunks, then position = prefix + popc(mask below the token).
// ------------------------------------------------------------------------------------------------
struct LayoutSmem {
  int cntE[MOE_MAX_EXPERTS];  // this block's rows per expert
  int runE[MOE_MAX_EXPERTS];  // rows of lower blocks per expert, then running position
  int cntD[MOE_MAX_RANKS];    // this block's tokens per destination
  int runD[MOE_MAX_RANKS];
  int prefD[MOE_MAX_RANKS];   // tokens of lower blocks per destination (= this channel's first slot)
  uint32_t maskD[MOE_MAX_RANKS];  // small layout: bit i = own token t0 + i goes to rank r (slot order)
  uint32_t tokDest[32];           // token-path sender: bit r = own token t0 + j goes to rank r
  union {
    struct {
      uint32_t bits[MOE_TILE_WORDS];  // [E][chunks] token masks
      int pre[MOE_TILE_WORDS];        // [E][chunks] position of the chunk's first hit
      uint32_t dbits[MOE_MAX_RANKS * 32];
      int dpre[MOE_MAX_RANKS * 32];
    } tile;
    struct {
      int histD[MOE_MAX_CHANNELS * MOE_MAX_RANKS];          // [C][R] of every block
      int chanStart[MOE_MAX_RANKS * (MOE_MAX_CHANNELS + 1)];  // [R][C+1]
    } lead;
  } u;
  int scanTmp[MOE_THREADS];
  int ok;
};

struct RecvSmem {
  int cnt[MOE_MAX_EXPERTS];      // [R][L] rows from source s for local expert e
  int rowBase[MOE_MAX_EXPERTS];  // [R][L] first recvX row of (s, e)
  int slots[MOE_MAX_RANKS];      // slots source s sends us
  int lo[MOE_MAX_RANKS];         // this channel's slot range of source s
  int hi[MOE_MAX_RANKS];
  int bad[MOE_MAX_RANKS];        // validation of source s's table
  unsigned long long sum[MOE_MAX_RANKS];
  int nseg[MOE_MAX_RANKS];       // receiver: row split of source s's channel (= its sender's)
  unsigned long long segBytes[MOE_MAX_RANKS];
  int itemEnd[MOE_MAX_RANKS];    // receiver: end of the q-th remote source's items, q = 1..R-1 ([0] = 0)
  int scanTmp[MOE_THREADS];
  int ok;
};

// Token-path receiver: the layout of every source's tokens at this rank, computed here
// from the sources' id lists, restricted to this rank's experts and to what channel c needs.
struct TpRecvSmem {
  int cnt[MOE_MAX_EXPERTS];        // [R][L] rows from source s for local expert e
  int rowBase[MOE_MAX_EXPERTS];    // [R][L] recvX row of channel c's first row of (s, e)
  int run[MOE_MAX_EXPERTS];        // [R][L] rows of s's tokens before channel c
  uint32_t mask[MOE_MAX_EXPERTS];  // [R][L] bit j: s's token t0s + j (channel c) picked e
  int hist[MOE_MAX_RANKS * MOE_MAX_CHANNELS];  // receiver 0: [s][channel] tokens of s coming here
  int Ts[MOE_MAX_RANKS];           // T of each source in this call
  int t0s[MOE_MAX_RANKS];          // channel c's first token of source s
  int t1s[MOE_MAX_RANKS];          // and the end of its range
  int splitNseg[33];               // row_split(rowBytes, n) for n = 0..32 tokens of a channel
  unsigned long long splitSegBytes[33];
  int runD[MOE_MAX_RANKS];         // s's tokens before channel c coming here (= channel's first slot)
  uint32_t maskD[MOE_MAX_RANKS];   // bit j: s's token t0s + j comes here
  int slots[MOE_MAX_RANKS];        // s's tokens coming here
  int nseg[MOE_MAX_RANKS];         // items per token: own (self) row_split segments, remote LL128 passes
  unsigned long long segBytes[MOE_MAX_RANKS];
  int itemEnd[MOE_MAX_RANKS + 1];  // end of the q-th source's items (q = 0: self, then rank + q)
  // Per remote source, in shared memory rather than registers through the item loop (the window
  // offsets as live 64-bit registers cost the kernel a stack frame on sm_90): its staging rows,
  // metadata (section of s in this window) and id list of this call.
  const uint8_t* stage[MOE_MAX_RANKS];
  const uint8_t* meta[MOE_MAX_RANKS];
  const uint64_t* ids[MOE_MAX_RANKS];
  int* slotRows;  // workspace arrays written here (likewise parked in shared memory)
  int* slotsFrom;
  int* chanStartFrom;
  int scanTmp[MOE_THREADS];
};

union DispatchSmem {
  LayoutSmem lay;
  RecvSmem rcv;
  TpRecvSmem tp;
};

// Step 1: histogram of the block's tokens into smem and into this block's rows of histE / histD.
GIN_DEVICE_INLINE void layout_histogram(LayoutSmem& s, const int* topkIdx, const Dims& d, int t0, int t1,
                                        int* histERow, int* histDRow, uint32_t* errorFlags) {
  const int tid = (int)threadIdx.x, B = (int)blockDim.x;
  for (int e = tid; e < d.E; e += B) s.cntE[e] = 0;
  for (int r = tid; r < d.R; r += B) s.cntD[r] = 0;
  __syncthreads();
  const int Kp = id_group_size(d.K), k = tid & (Kp - 1), per = B / Kp;
  for (int base = t0; base < t1; base += per) {  // block-uniform
    bool bad;
    const int e = lane_expert(topkIdx, base + tid / Kp, t1, k, Kp, d, bad);
    if (gin_warp_any(bad) && gin_lane_id() == 0) gin_error_set(errorFlags, MOE_ERR_EXPERT_ID);
    if (e >= 0) atomicAdd(&s.cntE[e], 1);
    if (lane_first_of_rank(e, k, Kp, d)) atomicAdd(&s.cntD[e / d.L], 1);
  }
  __syncthreads();
  for (int e = tid; e < d.E; e += B) histERow[e] = s.cntE[e];
  for (int r = tid; r < d.R; r += B) histDRow[r] = s.cntD[r];
}

// One-level layout (T*K <= kDirectLayoutIds = 4096, i.e. up to 512 tokens at top-8; at 65536 ids
// the last block's walk over all 32K ids of 4096 tokens takes ~33 us, and with the two-level walks
// one id per lane Mixtral at 4096 tokens, 8192 ids, R = 1, 8 back to back, takes 50.8 us two-level
// against 58.2 one-level): block c
// counts the ids of tokens [0, t0) itself (runE / runD / prefD: its starting offsets) and its own
// tokens [t0, t1) (cntE / cntD), straight from topkIdx: no histogram publication and no wait for
// other blocks (at 128 tokens the two-level steps 1-2 cost ~11-13 us of flag and fence latency;
// this reads at most T*K ids, 4 KB there). The leader (lead = last block, t1 = T) also counts
// tokens per (channel, destination) into u.lead.histD for chanStart. Same numbers as steps 1-2.
#ifndef MOE_DIRECT_LAYOUT_IDS
#define MOE_DIRECT_LAYOUT_IDS 4096  // overridable only to test both layouts at small sizes
#endif
constexpr int64_t kDirectLayoutIds = MOE_DIRECT_LAYOUT_IDS;
GIN_DEVICE_INLINE bool layout_is_direct(const Dims& d) { return (int64_t)d.T * (int64_t)d.K <= kDirectLayoutIds; }

GIN_DEVICE_INLINE void layout_direct(LayoutSmem& s, const int* topkIdx, const Dims& d, int t0, int t1, bool lead,
                                     uint32_t* errorFlags) {
  const int tid = (int)threadIdx.x, B = (int)blockDim.x;
  for (int e = tid; e < d.E; e += B) {
    s.cntE[e] = 0;
    s.runE[e] = 0;
  }
  for (int r = tid; r < d.R; r += B) {
    s.cntD[r] = 0;
    s.runD[r] = 0;
  }
  if (lead)
    for (int i = tid; i < d.C * d.R; i += B) s.u.lead.histD[i] = 0;
  __syncthreads();
  int ev[MOE_MAX_TOPK];
  for (int t = tid; t < t1; t += B) {
    const bool own = t >= t0;
    token_experts(topkIdx, t, d, ev, own, errorFlags);  // each token reported by its own block only
    int* ce = own ? s.cntE : s.runE;
    int* cd = own ? s.cntD : s.runD;
    uint32_t destMask = 0;
#pragma unroll
    for (int k = 0; k < MOE_MAX_TOPK; ++k) {
      if (k >= d.K) break;
      if (ev[k] < 0) continue;
      atomicAdd(&ce[ev[k]], 1);
      destMask |= 1u << (ev[k] / d.L);
    }
    // Channel of t: the largest j with j*T/C <= t (token_range's partition).
    const int ch = lead ? (int)(((int64_t)(t + 1) * d.C - 1) / d.T) : 0;
    while (destMask) {
      const int r = __ffs((int)destMask) - 1;
      destMask &= destMask - 1;
      atomicAdd(&cd[r], 1);
      if (lead) atomicAdd(&s.u.lead.histD[ch * d.R + r], 1);
    }
  }
  __syncthreads();
  for (int r = tid; r < d.R; r += B) s.prefD[r] = s.runD[r];
  __syncthreads();
}

// Small blocks of the one-level layout: when the block owns at most 32 tokens (every
// top-8 call up to 2112 tokens at C = 66), routing and positions are one walk over the ids: lower
// tokens are counted into runE / runD, own token t sets bit t - t0 of the 32-bit masks held in
// cntE / cntD, so after one barrier the position of (t, e) is runE[e] + popc(mask[e] below t) and
// the slot of t towards d is runD[d] + popc(maskD[d] below t). Running layout_positions after
// the count walk instead (a second walk, a 3072-word tile to clear, three more barriers) puts the
// positions at 13.4 us against routing counted at 5.9 for DeepSeek-V3 at 128 tokens. Same numbers as
// layout_direct + layout_positions; ends with cntE / cntD holding counts again and prefD = runD.
GIN_DEVICE_INLINE bool layout_is_small(const Dims& d, int t0, int t1) { return layout_is_direct(d) && t1 - t0 <= 32; }

// underWalk() is called by every thread between the clearing barrier and the id walk (the
// dispatch's write-after-read probes: their acquires then overlap the walk instead of delaying
// the first barrier). After small_walk, cntD[r] holds the own tokens' masks (bit i =
// token t0 + i goes to r), after small_positions counts again (and maskD the masks).
template <class UnderWalk>
GIN_DEVICE_INLINE void small_walk(LayoutSmem& s, const int* topkIdx, const Dims& d, int t0, int t1, bool lead,
                                  uint32_t* errorFlags, const UnderWalk& underWalk) {
  const int tid = (int)threadIdx.x, B = (int)blockDim.x;
  for (int e = tid; e < d.E; e += B) {
    s.cntE[e] = 0;
    s.runE[e] = 0;
  }
  for (int r = tid; r < d.R; r += B) {
    s.cntD[r] = 0;
    s.runD[r] = 0;
  }
  if (lead)
    for (int i = tid; i < d.C * d.R; i += B) s.u.lead.histD[i] = 0;
  __syncthreads();
  MOE_PROF(0, 8);  // (dispatch only) counters cleared
  underWalk();
  int ev[MOE_MAX_TOPK];
  for (int t = tid; t < t1; t += B) {
    const bool own = t >= t0;
    token_experts(topkIdx, t, d, ev, own, errorFlags);  // each token reported by its own block only
    const int bit = (int)(1u << ((t - t0) & 31));
    uint32_t destMask = 0;
#pragma unroll
    for (int k = 0; k < MOE_MAX_TOPK; ++k) {
      if (k >= d.K) break;
      if (ev[k] < 0) continue;
      if (own) atomicOr(&s.cntE[ev[k]], bit);
      else atomicAdd(&s.runE[ev[k]], 1);
      destMask |= 1u << (ev[k] / d.L);
    }
    const int ch = lead ? (int)(((int64_t)(t + 1) * d.C - 1) / d.T) : 0;
    while (destMask) {
      const int r = __ffs((int)destMask) - 1;
      destMask &= destMask - 1;
      if (own) atomicOr(&s.cntD[r], bit);
      else atomicAdd(&s.runD[r], 1);
      if (lead) atomicAdd(&s.u.lead.histD[ch * d.R + r], 1);
    }
  }
  __syncthreads();
  MOE_PROF(0, 9);  // ids walked (counts and masks)
}
GIN_DEVICE_INLINE void small_positions(LayoutSmem& s, const int* topkIdx, const Dims& d, int t0, int t1,
                                       int* slotInExpert, int* tokenPos, int* sendList) {
  const int tid = (int)threadIdx.x, B = (int)blockDim.x;
  int ev[MOE_MAX_TOPK];
  // Positions of the own tokens (ids again: L1 hits of this block's first walk).
  for (int i = tid; i < t1 - t0; i += B) {
    const int t = t0 + i;
    const uint32_t below = (1u << i) - 1u;
    token_experts(topkIdx, t, d, ev, false, nullptr);
#pragma unroll
    for (int k = 0; k < MOE_MAX_TOPK; ++k) {
      if (k >= d.K) break;
      const int e = ev[k];
      slotInExpert[(uint64_t)t * d.K + k] = e < 0 ? -1 : s.runE[e] + __popc((uint32_t)s.cntE[e] & below);
    }
    for (int r = 0; r < d.R; ++r) {
      const uint32_t m = (uint32_t)s.cntD[r];
      int pos = -1;
      if ((m >> i) & 1u) {
        pos = s.runD[r] + __popc(m & below);
        sendList[(uint64_t)r * d.M + pos] = t;
      }
      tokenPos[(uint64_t)t * d.R + r] = pos;
    }
  }
  __syncthreads();  // masks read; back to counts
  for (int e = tid; e < d.E; e += B) s.cntE[e] = __popc((uint32_t)s.cntE[e]);
  for (int r = tid; r < d.R; r += B) {
    s.maskD[r] = (uint32_t)s.cntD[r];  // the senders' slot -> token map (no sendList round trip)
    s.cntD[r] = __popc((uint32_t)s.cntD[r]);
    s.prefD[r] = s.runD[r];
  }
  __syncthreads();
}


template <class UnderWalk>
GIN_DEVICE_INLINE void layout_direct_small(LayoutSmem& s, const int* topkIdx, const Dims& d, int t0, int t1, bool lead,
                                           int* slotInExpert, int* tokenPos, int* sendList, uint32_t* errorFlags,
                                           const UnderWalk& underWalk) {
  small_walk(s, topkIdx, d, t0, t1, lead, errorFlags, underWalk);
  small_positions(s, topkIdx, d, t0, t1, slotInExpert, tokenPos, sendList);
}

// Publishes this block's histogram rows (written by all threads) with one release.
GIN_DEVICE_INLINE void publish_local(uint64_t* flag, uint64_t value) {
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) gin_st_release_sys(flag, value);
}

// Step 2: runE / runD / prefD = sums over blocks < c. Returns false after a timeout.
GIN_DEVICE_INLINE bool layout_prefix(LayoutSmem& s, const Dims& d, int c, const int* histE, const int* histD,
                                     const uint64_t* histReady, uint64_t seq, uint32_t* errorFlags) {
  const int tid = (int)threadIdx.x, B = (int)blockDim.x;
  if (tid == 0) s.ok = 1;
  for (int e = tid; e < d.E; e += B) s.runE[e] = 0;
  for (int r = tid; r < d.R; r += B) s.runD[r] = 0;
  __syncthreads();
  bool ok = true;
  for (int b = tid; b < c; b += B) ok &= gin_wait_geq(histReady + b, seq, errorFlags);
  if (!ok) s.ok = 0;
  __syncthreads();  // acquire by thread b, then the barrier: every thread may read block b's rows
  // Column sums: thread (g, u) adds unit u (4 experts when E % 4 == 0: one 16-byte load, rows
  // are 16-byte aligned then) of rows g, g+G, ... < c with 8 loads in flight, then one shared add
  // per expert and group (G-way at most), not a shared atomic per loaded int (up to C*E of them
  // into the same E words).
  const int per = (d.E & 3) == 0 ? 4 : 1;
  const int units = d.E / per;
  const int G = units >= B ? 1 : B / units;
  for (int idx = tid; idx < units * G; idx += B) {
    const int u = idx % units, g = idx / units;
    int acc0 = 0, acc1 = 0, acc2 = 0, acc3 = 0;
    for (int b0 = g; b0 < c; b0 += 8 * G) {
      int4 v[8];
#pragma unroll
      for (int q = 0; q < 8; ++q) {
        const int b = b0 + q * G;
        const int* src = histE + (uint64_t)b * (uint64_t)d.E + (uint64_t)u * (uint64_t)per;
        v[q] = b >= c ? make_int4(0, 0, 0, 0) : (per == 4 ? ld_fresh_i32x4(src) : make_int4(ld_fresh_i32(src), 0, 0, 0));
      }
#pragma unroll
      for (int q = 0; q < 8; ++q) {
        acc0 += v[q].x;
        acc1 += v[q].y;
        acc2 += v[q].z;
        acc3 += v[q].w;
      }
    }
    const int accs[4] = {acc0, acc1, acc2, acc3};
#pragma unroll
    for (int q = 0; q < 4; ++q)
      if (q < per && accs[q] != 0) atomicAdd(&s.runE[u * per + q], accs[q]);
  }
  const int nD = c * d.R;
  for (int i = tid; i < nD; i += B) {
    const int v = ld_fresh_i32(histD + i);
    if (v != 0) atomicAdd(&s.runD[i % d.R], v);
  }
  __syncthreads();
  for (int r = tid; r < d.R; r += B) s.prefD[r] = s.runD[r];
  __syncthreads();
  return s.ok != 0;
}

// Last block only: channel boundaries per destination, chanStart[r][j] = sum_{b<j} histD[b][r]
// for j in [0, C], into smem (u.lead) and workspace chanStartTo; totals into expertCount/tokensTo.
// histD: the published rows (two-level layout), or nullptr when layout_direct already filled
// u.lead.histD.
// cntIsMask: called between small_walk and small_positions (token path), where cntE holds the
// own tokens' masks.
// Exclusive prefix over channels j < C of h[j * stride] by one warp: lane l sums channels
// [l*per, (l+1)*per), a shuffle scan gives the lanes' starts, then out(j, prefix) per channel;
// returns the total to every lane (one thread per (r, j) summing up to C shared words costs
// ~1-2 us).
template <class Out>
GIN_DEVICE_INLINE int warp_chan_scan(const int* h, int stride, int C, const Out& out) {
  const int lane = (int)gin_lane_id();
  const int per = (C + GIN_WARP_SIZE - 1) / GIN_WARP_SIZE;
  const int j0 = moe_min_i(C, lane * per), j1 = moe_min_i(C, j0 + per);
  int sum = 0;
  for (int j = j0; j < j1; ++j) sum += h[j * stride];
  int inc = sum;
#pragma unroll
  for (int off = 1; off < GIN_WARP_SIZE; off <<= 1) {
    const int v = shfl_up_i(inc, off);
    if (lane >= off) inc += v;
  }
  int run = inc - sum;
  for (int j = j0; j < j1; ++j) {
    out(j, run);
    run += h[j * stride];
  }
  return gin_shfl_int(inc, GIN_WARP_SIZE - 1);
}

// chanStartTo[r][j] = tokens of channels < j going to r (j <= C; [C] = all of them) from the
// per-(channel, destination) counts in s.u.lead.histD, also kept in s.u.lead.chanStart; one warp
// per destination.
GIN_DEVICE_INLINE void lead_chan_start(LayoutSmem& s, const Dims& d, int* chanStartTo) {
  const int warp = (int)threadIdx.x / GIN_WARP_SIZE, nw = (int)blockDim.x / GIN_WARP_SIZE;
  for (int r = warp; r < d.R; r += nw) {
    const int total = warp_chan_scan(s.u.lead.histD + r, d.R, d.C, [&](int j, int v) {
      s.u.lead.chanStart[r * (d.C + 1) + j] = v;
      chanStartTo[r * (MOE_MAX_CHANNELS + 1) + j] = v;
    });
    if (gin_lane_id() == 0) {
      s.u.lead.chanStart[r * (d.C + 1) + d.C] = total;
      chanStartTo[r * (MOE_MAX_CHANNELS + 1) + d.C] = total;
    }
  }
}

GIN_DEVICE_INLINE void layout_lead_totals(LayoutSmem& s, const Dims& d, const int* histD, int* expertCount,
                                          int* tokensTo, int* chanStartTo, bool cntIsMask = false) {
  const int tid = (int)threadIdx.x, B = (int)blockDim.x;
  const int last = d.C - 1;
  if (histD != nullptr) {
    for (int i = tid; i < d.C * d.R; i += B) {
      const int b = i / d.R;
      s.u.lead.histD[i] = b < last ? ld_fresh_i32(histD + i) : s.cntD[i % d.R];
    }
    __syncthreads();
  }
  lead_chan_start(s, d, chanStartTo);
  for (int e = tid; e < d.E; e += B) expertCount[e] = s.runE[e] + (cntIsMask ? __popc((uint32_t)s.cntE[e]) : s.cntE[e]);
  __syncthreads();
  for (int r = tid; r < d.R; r += B) tokensTo[r] = s.u.lead.chanStart[r * (d.C + 1) + d.C];
}

// Token-path sender, after its sends: what the combine reads of the sending side, from
// destination masks alone: tokenPos of the own tokens (slot of t towards r = own tokens t' < t
// going to r, -1 if t does not go to r) and, in the last block, chanStartTo and the dispatch's T.
// The small layout's per-expert walk and positions are not needed here (they would cost 4-5 us
// after the sends, the end of the kernel); slotInExpert, sendList, expertCount and tokensTo of a GIN workspace are read
// by nothing (the HOST path keeps its own workspace). s.runD and (last block) s.u.lead.histD must
// be zero and s.tokDest hold the own tokens' destinations (bit r) on entry.
GIN_DEVICE_INLINE void tp_send_positions(LayoutSmem& s, const int* topkIdx, const Dims& d, int c, int t0, int t1,
                                         int* tokenPos, int* chanStartTo, uint64_t* state) {
  const int tid = (int)threadIdx.x, B = (int)blockDim.x;
  const int lane = (int)gin_lane_id(), warp = tid / GIN_WARP_SIZE;
  const bool last = c == d.C - 1;
  // Lower tokens per destination (the last block: every token, per channel too), one id per lane
  // as in tp_recv_layout: groups of Kp lanes hold one token's ids.
  const int tEnd = last ? d.T : t0;
  const int Kp = id_group_size(d.K), lgK = __ffs(Kp) - 1;
  const int perWarp = GIN_WARP_SIZE >> lgK, k = lane & (Kp - 1), sub = lane >> lgK;
  for (int f0 = warp * perWarp; f0 < tEnd; f0 += (B / GIN_WARP_SIZE) * perWarp) {  // warp-uniform
    const int f = f0 + sub;
    int e = -1;
    if (f < tEnd && k < d.K) {
      e = topkIdx[(uint64_t)f * d.K + k];
      if (e < 0 || e >= d.E) e = -1;
    }
    uint32_t dm = e >= 0 ? 1u << (e / d.L) : 0u;
    for (int off = Kp >> 1; off > 0; off >>= 1) dm |= (uint32_t)gin_shfl_xor_int((int)dm, off);  // within the group
    const bool lead = k == 0 && f < tEnd;
    for (int r = 0; r < d.R; ++r) {
      const lanemask_t m = (lanemask_t)moe_detail::ballot(lead && f < t0 && ((dm >> r) & 1u) != 0u);
      if (lane == 0 && m != 0)
        atomicAdd(&s.runD[r], __popc((uint32_t)m) + (GIN_WARP_SIZE > 32 ? __popc((uint32_t)((uint64_t)m >> 32)) : 0));
    }
    if (last && lead) {
      const int ch = ((f + 1) * d.C - 1) / d.T;  // token_range's channel of f (< 2^31: M*C bounded)
      for (uint32_t m = dm; m != 0u; m &= m - 1u) atomicAdd(&s.u.lead.histD[ch * d.R + __ffs((int)m) - 1], 1);
    }
  }
  __syncthreads();
  if (warp == 0) {  // own token t0 + lane (<= 32 of them)
    const int t = t0 + lane;
    const uint32_t dm = lane < 32 ? s.tokDest[lane & 31] : 0u;
    const lanemask_t below = (lanemask_t)(((uint64_t)1 << lane) - 1);
    for (int r = 0; r < d.R; ++r) {
      const bool to = ((dm >> r) & 1u) != 0u;
      const lanemask_t m = (lanemask_t)moe_detail::ballot(to);
      const lanemask_t mb = m & below;
      if (t < t1)
        tokenPos[(uint64_t)t * d.R + r] =
            to ? s.runD[r] + __popc((uint32_t)mb) + (GIN_WARP_SIZE > 32 ? __popc((uint32_t)((uint64_t)mb >> 32)) : 0) : -1;
    }
  }
  if (last) {
    lead_chan_start(s, d, chanStartTo);
    if (tid == 0) state[MOE_STATE_DISPATCH_TOKENS] = (uint64_t)d.T;
  }
}

// Step 3: final positions of the block's tokens. runE/runD hold the block's starting offsets.
GIN_DEVICE_INLINE void layout_positions(LayoutSmem& s, const int* topkIdx, const Dims& d, int t0, int t1,
                                        int* slotInExpert, int* tokenPos, int* sendList) {
  const int tid = (int)threadIdx.x, B = (int)blockDim.x;
  const int NC = moe_min_i(32, MOE_TILE_WORDS / d.E);  // chunks per tile (>= 1 since E <= 2048)
  const int tileTokens = 32 * NC;
  const int Kp = id_group_size(d.K), k = tid & (Kp - 1), per = B / Kp;
  for (int tb = t0; tb < t1; tb += tileTokens) {
    const int nt = moe_min_i(tileTokens, t1 - tb);
    const int nch = (nt + 31) >> 5;
    for (int i = tid; i < d.E * NC; i += B) s.u.tile.bits[i] = 0;
    for (int i = tid; i < d.R * NC; i += B) s.u.tile.dbits[i] = 0;
    __syncthreads();
    for (int i0 = 0; i0 < nt; i0 += per) {  // block-uniform
      const int i = i0 + tid / Kp, ch = i >> 5;
      const uint32_t bit = 1u << (i & 31);
      bool bad;
      const int e = lane_expert(topkIdx, tb + i, tb + nt, k, Kp, d, bad);
      if (e >= 0) atomicOr(&s.u.tile.bits[e * NC + ch], bit);
      if (lane_first_of_rank(e, k, Kp, d)) atomicOr(&s.u.tile.dbits[(e / d.L) * NC + ch], bit);
    }
    __syncthreads();
    for (int i = tid; i < d.E + d.R; i += B) {
      if (i < d.E) {
        int run = s.runE[i];
        for (int ch = 0; ch < nch; ++ch) {
          s.u.tile.pre[i * NC + ch] = run;
          run += __popc(s.u.tile.bits[i * NC + ch]);
        }
        s.runE[i] = run;
      } else {
        const int r = i - d.E;
        int run = s.runD[r];
        for (int ch = 0; ch < nch; ++ch) {
          s.u.tile.dpre[r * NC + ch] = run;
          run += __popc(s.u.tile.dbits[r * NC + ch]);
        }
        s.runD[r] = run;
      }
    }
    __syncthreads();
    for (int i0 = 0; i0 < nt; i0 += per) {  // block-uniform
      const int i = i0 + tid / Kp, t = tb + i, ch = i >> 5;
      const uint32_t bit = 1u << (i & 31), below = bit - 1u;
      bool bad;
      const int e = lane_expert(topkIdx, t, tb + nt, k, Kp, d, bad);
      if (i >= nt) continue;  // after the shuffles
      if (k < d.K)
        slotInExpert[(uint64_t)t * d.K + k] =
            e < 0 ? -1 : s.u.tile.pre[e * NC + ch] + __popc(s.u.tile.bits[e * NC + ch] & below);
      for (int r = k; r < d.R; r += Kp) {
        const uint32_t m = s.u.tile.dbits[r * NC + ch];
        int pos = -1;
        if (m & bit) {
          pos = s.u.tile.dpre[r * NC + ch] + __popc(m & below);
          sendList[(uint64_t)r * d.M + pos] = t;
        }
        tokenPos[(uint64_t)t * d.R + r] = pos;
      }
    }
    __syncthreads();
  }
}

// Count table of source src for call seq in the window at win: two buffers by call parity, so a
// leader never waits before writing its table (the buffer it writes was last read in call n-2,
// and every reader of call n-2 on the owner finished before the owner's call n-1 could end: see
// docs/kernels.md). LL words: (seq << 32) | uint32 value, one single-copy-atomic 8-byte store each, so
// a word whose high half is seq's low 32 bits carries this call's value (no fence, no flag).
GIN_DEVICE_INLINE uint64_t* count_table(const uint8_t* win, const MoeWindowLayout& wl, int src, int R, uint64_t seq) {
  return (uint64_t*)(win + wl.counts + ((seq & 1ull) * (uint64_t)R + (uint64_t)src) * wl.countStride);
}
GIN_DEVICE_INLINE bool ll_tag_ok(uint64_t w, uint64_t seq) { return (uint32_t)(w >> 32) == (uint32_t)seq; }
// Token path: source src's id list of call seq in the window at win (word 0 = T, then the ids);
// double-buffered by call parity exactly like the count tables (same write-after-read argument).
GIN_DEVICE_INLINE uint64_t* ids_area(const uint8_t* win, const MoeWindowLayout& wl, int src, int R, uint64_t seq) {
  return (uint64_t*)(win + wl.dispIds + ((seq & 1ull) * (uint64_t)R + (uint64_t)src) * wl.idsStride);
}
// One table word of call seq into out: block = poll until it is there (timeout: out = 0, false),
// otherwise one probe (false when it is not there yet).
GIN_DEVICE_INLINE bool ll_table_get(const uint64_t* p, uint64_t seq, bool block, uint32_t* errorFlags, int& out) {
  uint64_t w = gin_ld_relaxed_sys(p);
  if (!ll_tag_ok(w, seq)) {
    out = 0;
    if (!block) return false;
    uint64_t start = 0;
    for (uint32_t spins = 0;; ++spins) {
      w = gin_ld_relaxed_sys(p);
      if (ll_tag_ok(w, seq)) break;
      if (gin_wait_timed_out(spins, start, errorFlags)) return false;
    }
  }
  out = (int)(uint32_t)w;
  return true;
}

// Count tables of every source of call seq (LL words in this rank's window): cnt, slots, channel
// c's slot range per source, validation (a source whose numbers cannot be right contributes
// nothing, never out of bounds) and rowBase[s][e] = expertStart[e] + sum_{s'<s} cnt[s'][e].
// recvCountsOut (optional) receives the per-expert totals. block = false: a probe that returns
// false (nothing else done) when any word of this call is missing. Whole block; ends with a
// barrier. The loads of all R*L = E count words are in flight together (<= 4 per thread), the
// checks are warp reductions (adding every count into a 64-bit shared word with atomics, a
// compare-and-swap loop with 128 lanes on one word at L = 128, costs ~5 us).
GIN_DEVICE_INLINE bool recv_tables(RecvSmem& s, const Dims& d, int c, const uint8_t* ownWin, const MoeWindowLayout& wl,
                                   uint64_t seq, bool block, int* recvCountsOut, uint32_t* errorFlags) {
  const int tid = (int)threadIdx.x, B = (int)blockDim.x;
  const int lane = (int)gin_lane_id(), warp = tid / GIN_WARP_SIZE, nw = B / GIN_WARP_SIZE;
  if (tid == 0) s.ok = 1;
  // Blocking read: one thread per source polls one word (this channel's lo) until it carries the
  // tag, then the block reads every word (nearly all there by then), rather than all R*L word
  // threads of all C receiver blocks spinning (DeepSeek-V3: ~17K threads) on the few L2 lines
  // that the senders' own loads and the peer's table stores go through.
  if (block && tid < d.R) {
    int unused = 0;
    (void)ll_table_get(count_table(ownWin, wl, tid, d.R, seq) + d.L + 1 + c, seq, true, errorFlags, unused);
  }
  __syncthreads();
  const int n = d.R * d.L;
  bool missing = false;
  for (int i0 = tid; i0 < n; i0 += 4 * B) {
    uint64_t w[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int i = i0 + u * B;
      w[u] = i < n ? gin_ld_relaxed_sys(count_table(ownWin, wl, i / d.L, d.R, seq) + i % d.L) : 0ull;
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int i = i0 + u * B;
      if (i >= n) continue;
      int v = (int)(uint32_t)w[u];
      if (!ll_tag_ok(w[u], seq) && !ll_table_get(count_table(ownWin, wl, i / d.L, d.R, seq) + i % d.L, seq, block, errorFlags, v))
        missing = true;
      s.cnt[i] = v;
    }
  }
  for (int src = tid; src < d.R; src += B) {
    const uint64_t* table = count_table(ownWin, wl, src, d.R, seq);
    int sl = 0, lo = 0, hi = 0;
    bool got = ll_table_get(table + d.L, seq, block, errorFlags, sl);
    got &= ll_table_get(table + d.L + 1 + c, seq, block, errorFlags, lo);
    got &= ll_table_get(table + d.L + 2 + c, seq, block, errorFlags, hi);
    if (!got) missing = true;
    s.slots[src] = sl;
    s.lo[src] = lo;
    s.hi[src] = hi;
  }
  if (missing) s.ok = 0;  // every writer stores the same value
  __syncthreads();
  if (!block && s.ok == 0) {
    __syncthreads();  // every thread read s.ok before the next writer of it
    return false;
  }
  for (int src = warp; src < d.R; src += nw) {  // one warp per source (warp-uniform loop)
    unsigned long long sum = 0ull;
    bool bad = false;
    for (int e = lane; e < d.L; e += GIN_WARP_SIZE) {
      const int v = s.cnt[src * d.L + e];
      if (v < 0 || v > d.M) bad = true;
      else sum += (unsigned long long)v;
    }
#pragma unroll
    for (int off = GIN_WARP_SIZE / 2; off > 0; off >>= 1) sum += gin_shfl_u64(sum, lane ^ off);
    const bool anyBad = moe_detail::ballot(bad) != 0ull;
    if (lane == 0) {
      s.sum[src] = sum;
      s.bad[src] = anyBad ? 1 : 0;
    }
  }
  __syncthreads();
  const unsigned long long maxRowsPerSource = (unsigned long long)d.M * (unsigned long long)moe_min_i(d.K, d.L);
  for (int src = tid; src < d.R; src += B) {
    const bool bad = s.bad[src] != 0 || s.slots[src] < 0 || s.slots[src] > d.M || s.lo[src] < 0 ||
                     s.lo[src] > s.hi[src] || s.hi[src] > s.slots[src] || s.sum[src] > maxRowsPerSource;
    s.bad[src] = bad ? 1 : 0;
    if (bad) {
      gin_error_set(errorFlags, MOE_ERR_COUNTS);
      s.slots[src] = 0;
      s.lo[src] = s.hi[src] = 0;
    }
  }
  __syncthreads();
  for (int i = tid; i < d.R * d.L; i += B)
    if (s.bad[i / d.L]) s.cnt[i] = 0;
  __syncthreads();
  for (int e = tid; e < d.L; e += B) {
    int tot = 0;
    for (int src = 0; src < d.R; ++src) tot += s.cnt[src * d.L + e];
    s.rowBase[e] = tot;
    if (recvCountsOut != nullptr) recvCountsOut[e] = tot;
  }
  __syncthreads();
  block_exclusive_scan(s.rowBase, d.L, s.scanTmp);
  for (int e = tid; e < d.L; e += B) {
    int run = s.rowBase[e];
    for (int src = 0; src < d.R; ++src) {
      s.rowBase[src * d.L + e] = run;
      run += s.cnt[src * d.L + e];
    }
  }
  __syncthreads();
  return true;
}

// Own tokens of channel c (slots [lo, hi) of this rank's slots to itself) go into recvX straight
// from x, as (slot, segment) items that sender c and receiver c claim from one counter (the low
// 32 bits of claimWord = state HIST_READY[c], reset to n << 32 by sender c when it published the
// positions): whoever is free takes the next item (receiver warps between remote items that have
// not landed yet, sender warps after their sends), so the own work overlaps the NVLink traffic
// and spreads over both halves of the grid. Needs the block's tables (recv_tables); the caller
// has seen claimWord >= n << 32 (positions written). Returns false when no item was left.
struct OwnWork {
  int lo, n, items;
  RowSplit sp;
};
GIN_DEVICE_INLINE OwnWork own_work(const RecvSmem& rs, const Dims& d) {
  OwnWork w;
  w.lo = rs.lo[d.rank];
  w.n = rs.hi[d.rank] - rs.lo[d.rank];
  w.sp = row_split(d.rowBytes, w.n);
  w.items = w.n * w.sp.nseg;
  return w;
}
// kXFresh: x was written during this kernel (the quantizing fp8 dispatch's rows): coherent loads.
template <bool kXFresh>
GIN_DEVICE_INLINE bool own_claim_item(const RecvSmem& rs, const OwnWork& ow, const Dims& d, uint64_t* claimWord,
                                      const uint16_t* x, const int32_t* topkIdx, const float* topkWeights,
                                      const int* sendList, const int* slotInExpert, int* slotRows, uint16_t* recvX,
                                      float* recvWeights, bool fast, uint32_t* errorFlags) {
  const int lane = (int)gin_lane_id();
  int i = 0;
  if (lane == 0) i = (int)(uint32_t)atomicAdd((unsigned long long*)claimWord, 1ull);
  i = gin_shfl_int(i, 0);
  if (i >= ow.items) return false;
  const int j = i / ow.sp.nseg, seg = i - j * ow.sp.nseg;
  uint64_t b0, b1;
  seg_range(ow.sp, seg, d.rowBytes, b0, b1);
  const int slot = ow.lo + j;
  // sendList / slotInExpert were written by sender c during this kernel: coherent loads.
  const int t = ld_fresh_i32(sendList + (uint64_t)d.rank * d.M + slot);
  const bool tokenOk = t >= 0 && t < d.T;
  const uint8_t* src = (const uint8_t*)x + (uint64_t)(tokenOk ? t : 0) * d.rowBytes;
  // The row's first pass, the ids, positions and weights in flight together (not the weight
  // after the ids and the row after the weight's store: 3 round trips after sendList).
  gin_u128 pass[kExpandUnroll];
  if (fast && tokenOk) expand_load_pass<kXFresh>(pass, src, b0 >> 4, b1 >> 4);
  int row = -1;
  float wt = 0.f;
  if (lane < d.K && tokenOk) {
    const int e = topkIdx[(uint64_t)t * d.K + lane];
    const int sl = ld_fresh_i32(slotInExpert + (uint64_t)t * d.K + lane);
    const float w = topkWeights[(uint64_t)t * d.K + lane];
    if (sl >= 0 && e / d.L == d.rank) {
      const int le = e - d.rank * d.L;
      if (sl < rs.cnt[d.rank * d.L + le]) {
        row = rs.rowBase[d.rank * d.L + le] + sl;
        wt = w;
      } else if (seg == 0) {
        gin_error_set(errorFlags, MOE_ERR_COUNTS);
      }
    }
  }
  if (seg == 0) {
    if (lane < d.K) slotRows[((uint64_t)d.rank * d.M + slot) * d.K + lane] = row;
    if (row >= 0) recvWeights[row] = wt;
  }
  if (tokenOk) warp_expand_seg<kXFresh>(src, (uint8_t*)recvX, d.rowBytes, row, d.K, fast, b0, b1, pass, fast);
  return true;
}

// Common launch checks; every block reaches the same verdict, block 0 reports it.
GIN_DEVICE_INLINE bool launch_ok(const Dims& d, int blocksPerChannel, bool needRank, const void* must1,
                                 const void* must2, uint32_t* errorFlags) {
  bool ok = moe_sizes_ok(d.R, d.E, d.K, d.H, d.M) && d.C >= 1 && d.C <= MOE_MAX_CHANNELS &&
            blockDim.x == MOE_THREADS && blockDim.y == 1 && blockDim.z == 1 && gridDim.y == 1 &&
            gridDim.z == 1 && gridDim.x == (unsigned)(blocksPerChannel * d.C) && must1 != nullptr &&
            must2 != nullptr && (!needRank || (d.rank >= 0 && d.rank < d.R));
  if (!ok && blockIdx.x == 0 && threadIdx.x == 0) gin_error_set(errorFlags, MOE_ERR_CONFIG);
  return ok;
}

// After launch_ok: the entry point's Shape accepts the arguments (else MOE_ERR_CONFIG, block 0
// reports it), and d takes Shape's fixed sizes as constants.
template <class Shape>
GIN_DEVICE_INLINE bool shape_ok(Dims& d, uint32_t* errorFlags) {
  if (!Shape::accepts(d.R, d.E, d.K, d.H, d.M, d.C)) {
    if (blockIdx.x == 0 && threadIdx.x == 0) gin_error_set(errorFlags, MOE_ERR_CONFIG);
    return false;
  }
  Shape::fix(d);
  return true;
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

// ================================================================================================
// moe_query_layout: out[MOE_Q_*] = window / workspace sizes and a few offsets the Java side needs.
// Grid 1, block 1.
// ================================================================================================
GIN_KERNEL void moe_query_layout(int32_t nRanks, int32_t numExperts, int32_t topK, int32_t hidden,
                                 int32_t maxTokens, int32_t numChannels, uint64_t* out) {
  if (threadIdx.x != 0 || blockIdx.x != 0 || out == nullptr) return;
  for (int i = 0; i < MOE_Q_WORDS; ++i) out[i] = 0;
  if (!moe_sizes_ok(nRanks, numExperts, topK, hidden, maxTokens)) return;  // all zero = refused
  const MoeWindowLayout w = moe_window_layout(nRanks, numExperts, topK, hidden, maxTokens);
  const MoeWorkspaceLayout s = moe_workspace_layout(nRanks, numExperts, topK, maxTokens);
  out[MOE_Q_WINDOW_BYTES] = w.totalBytes;
  out[MOE_Q_WINDOW_FLAGS_OFFSET] = w.flagsOffset;
  out[MOE_Q_WINDOW_FLAGS_BYTES] = w.flagsBytes;
  out[MOE_Q_WORKSPACE_BYTES] = s.totalBytes;
  out[MOE_Q_WORKSPACE_STATE_BYTES] = 8ull * MOE_STATE_WORDS;
  out[MOE_Q_RECV_CAPACITY_ROWS] = moe_recv_capacity_rows(nRanks, numExperts, topK, maxTokens);
  out[MOE_Q_SEND_CAPACITY_ROWS] = (uint64_t)maxTokens * (uint64_t)topK;
  out[MOE_Q_WS_EXPERT_COUNT] = s.expertCount;
  out[MOE_Q_WS_EXPERT_OFFSET] = s.expertOffset;
  out[MOE_Q_WS_ROWS_TO] = s.rowsTo;
  out[MOE_Q_WS_TOKENS_TO] = s.tokensTo;
  out[MOE_Q_WS_SLOT_IN_EXPERT] = s.slotInExpert;
  out[MOE_Q_WS_TOKEN_POS] = s.tokenPos;
  out[MOE_Q_ROW_STRIDE] = w.rowStride;
  out[MOE_Q_VERSION] = MOE_LAYOUT_VERSION;
  out[MOE_Q_TOKEN_PATH] = moe_token_path(topK, maxTokens, numChannels) ? 1 : 0;
}

// ------------------------------------------------------------------------------------------------
// LL128 rows (the token path: dispatch staging and combine partials),
// as gin_a2a_ll128: a 128-byte line = 120 payload bytes + an 8-byte flag = the call number n,
// stored by the 8 lanes of one lane group with one warp store instruction; a reader polls a line
// until its flag is n, so the data proves itself (no progress word, no release fence).
// Payload mapping (keeps 16-byte alignment of the rows): in line L of a row of nl lines, lane j < 7
// of the group carries row bytes [112 L + 16 j, +16), lane 7 carries [112 nl + 8 L, +8) (the row's
// tail region) in its low word and the flag in its high word. Bytes past the row are zero.
// A warp pass covers kTpUnroll lines per group: 16 lines (1,920 payload bytes) on NVIDIA.
// ------------------------------------------------------------------------------------------------
constexpr int kTpUnroll = 4;
constexpr int kTpGroups = GIN_WARP_SIZE / 8;
constexpr int kTpPassLines = kTpUnroll * kTpGroups;

GIN_DEVICE_INLINE uint64_t tp_chunk_off(int L, int j, int nl) {
  return j < 7 ? 112ull * (uint64_t)L + 16ull * (uint64_t)j : 112ull * (uint64_t)nl + 8ull * (uint64_t)L;
}

// 16 (wide) or 8 bytes of a row at byte offset off; zero past rowBytes. fast: rowBytes % 16 == 0
// and the row 16-byte aligned, so a chunk is either wholly inside the row or wholly past it.
template <bool kFresh>
GIN_DEVICE_INLINE gin_u128 tp_load_chunk(const uint8_t* row, uint64_t off, bool wide, uint64_t rowBytes, bool fast) {
  gin_u128 v;
  v.lo = 0;
  v.hi = 0;
  if (off >= rowBytes) return v;
  if (fast) {
    if (wide) v = kFresh ? ld16_fresh(row + off) : gin_ld16_stream(row + off);
    else v.lo = kFresh ? ld8_fresh(row + off) : gin_ld8_stream(row + off);
  } else {
    for (int i = 0; i < (wide ? 8 : 4); ++i) {
      const uint64_t b = off + 2ull * (uint64_t)i;
      if (b >= rowBytes) break;
      const uint64_t e = (uint64_t)ld_u16<kFresh>((const uint16_t*)(row + b));
      if (i < 4) v.lo |= e << (16 * i);
      else v.hi |= e << (16 * (i - 4));
    }
  }
  return v;
}
GIN_DEVICE_INLINE void tp_store_chunk(uint8_t* row, uint64_t off, bool wide, uint64_t rowBytes, bool fast, gin_u128 v) {
  if (off >= rowBytes) return;
  if (fast) {
    if (wide) gin_st16(row + off, v);
    else *(uint64_t*)(row + off) = v.lo;
  } else {
    for (int i = 0; i < (wide ? 8 : 4); ++i) {
      const uint64_t b = off + 2ull * (uint64_t)i;
      if (b >= rowBytes) break;
      ((uint16_t*)(row + b))[0] = (uint16_t)((i < 4 ? v.lo : v.hi) >> (16 * (i & 3)));
    }
  }
}

// Sends lines [L0, L0 + kTpPassLines) of a row as LL128 lines with `flag` (the dispatch's token
// path). kFresh: the row was written during this kernel (coherent loads).
template <bool kFresh>
GIN_DEVICE_INLINE void tp_send_pass(const uint8_t* row, uint8_t* lines, uint64_t rowBytes, int nl, int L0, uint64_t flag,
                                    bool fast) {
  const int lane = (int)gin_lane_id(), g = lane >> 3, j = lane & 7;
  const bool wide = j < 7;
  gin_u128 v[kTpUnroll];
#pragma unroll
  for (int u = 0; u < kTpUnroll; ++u) {
    const int L = L0 + u * kTpGroups + g;
    v[u].lo = 0;
    v[u].hi = 0;
    if (L < nl) v[u] = tp_load_chunk<kFresh>(row, tp_chunk_off(L, j, nl), wide, rowBytes, fast);
  }
  syncwarp();  // the 8 lanes of a line converged: one store instruction per line
#pragma unroll
  for (int u = 0; u < kTpUnroll; ++u) {
    const int L = L0 + u * kTpGroups + g;
    gin_ll128_store16(L < nl, lines + (uint64_t)L * 128ull + 16ull * (uint64_t)j, v[u].lo, wide ? v[u].hi : flag);
  }
}

// This lane's chunks of lines L0 + u * kTpGroups + group (u < kTpUnroll) of an LL128 row, each
// line re-read whole until its flag (lane 7 of the group) is `flag`: payload and flag come from
// one read of the line. Gives up after gin_sync's timeout (GIN_ERR_TIMEOUT).
GIN_DEVICE_INLINE void tp_wait_lines(const uint8_t* base, int nl, int L0, uint64_t flag, uint64_t (&lo)[kTpUnroll],
                                     uint64_t (&hi)[kTpUnroll], uint32_t* errorFlags) {
  const int lane = (int)gin_lane_id(), g = lane >> 3, j = lane & 7;
  syncwarp();
#pragma unroll
  for (int u = 0; u < kTpUnroll; ++u) {
    const int L = L0 + u * kTpGroups + g;
    lo[u] = 0;
    hi[u] = 0;
    gin_ll128_load16(L < nl, base + (uint64_t)L * 128ull + 16ull * (uint64_t)j, lo[u], hi[u]);
  }
  uint32_t pending = 0;
  uint64_t start = 0;
  for (uint32_t spins = 0;; ++spins) {
#pragma unroll
    for (int u = 0; u < kTpUnroll; ++u) {
      const uint64_t f = gin_shfl_u64(hi[u], (lane & ~7) | 7);  // the line's flag, from lane 7 of the group
      const bool live = L0 + u * kTpGroups + g < nl;
      if (live && f != flag) pending |= 1u << u;
      else pending &= ~(1u << u);
    }
    if (!gin_warp_any(pending != 0)) break;
    if (gin_wait_timed_out(spins, start, errorFlags)) break;
    syncwarp();
#pragma unroll
    for (int u = 0; u < kTpUnroll; ++u)
      gin_ll128_load16(((pending >> u) & 1u) != 0, base + (uint64_t)(L0 + u * kTpGroups + g) * 128ull + 16ull * (uint64_t)j,
                       lo[u], hi[u]);
  }
}

constexpr int kTpWalkRounds = 2;  // token rounds of the receivers' walk with loads in flight together

// Token-path receiver, before its items (the walk one id per lane):
// every source's T and ids -> what channel c needs in s (rows per (source, local expert),
// rowBase, the channel's masks, runD, item ends); receiver 0 also recvCounts and hist. A function
// of its own so that bench/walk_probe.cu times the same code outside the exchange and checks it
// against a host reference.
GIN_DEVICE_INLINE void tp_recv_layout(TpRecvSmem& s, const Dims& d, int c, const MoeWindowLayout& wl,
                                      const uint8_t* ownWin, uint8_t* workspace, const MoeWorkspaceLayout& ws,
                                      uint64_t seq, const int32_t* topkIdx, int32_t* recvCounts,
                                      uint32_t* errorFlags) {
  const int tid = (int)threadIdx.x, B = (int)blockDim.x;
  const int lane = (int)gin_lane_id(), warp = tid / GIN_WARP_SIZE;
  // The walk's lane roles (below): groups of Kp lanes (K rounded up to a power of two) hold the
  // ids of one token, a warp takes 32 / Kp tokens per round.
  const int Kp = id_group_size(d.K), lgK = __ffs(Kp) - 1;
  const int perWarp = GIN_WARP_SIZE >> lgK, k = lane & (Kp - 1), sub = lane >> lgK;
  const int nWarps = B / GIN_WARP_SIZE, step = nWarps * perWarp;
  // This lane's own ids of its first walk rounds, loaded before the sources' T arrive: the walk
  // starts with them (same-run A/B against loading them in the walk: DeepSeek-V3 and
  // Qwen3 128-token dispatch ~0.2 us faster, three rounds of three).
  int ownFirst[kTpWalkRounds];
#pragma unroll
  for (int u = 0; u < kTpWalkRounds; ++u) {
    const int t = warp * perWarp + u * step + sub;
    ownFirst[u] = t < d.T && k < d.K ? topkIdx[(uint64_t)t * d.K + k] : -1;
  }
  if (tid < d.R) {
    if (tid == d.rank) {
      s.Ts[tid] = d.T;
      s.t0s[tid] = (int)((int64_t)c * d.T / d.C);
      s.t1s[tid] = (int)((int64_t)(c + 1) * d.T / d.C);
    } else {  // a remote source's T: one probe now, -1 if it is not here yet (the walk then polls)
      int T = 0;
      s.Ts[tid] = ll_table_get(ids_area(ownWin, wl, tid, d.R, seq), seq, false, errorFlags, T) ? T : -1;
    }
    const uint64_t sec = (uint64_t)moe_peer_section(tid, d.rank, d.R);  // unused for self
    s.stage[tid] = ownWin + wl.dispRows + sec * d.M * wl.dispSlotStride;
    s.meta[tid] = ownWin + wl.dispMeta + sec * d.M * wl.metaStride;
    s.ids[tid] = ids_area(ownWin, wl, tid, d.R, seq) + 1;
    if (tid == 0) {
      s.slotRows = (int*)(workspace + ws.slotRows);
      s.slotsFrom = (int*)(workspace + ws.slotsFrom);
      s.chanStartFrom = (int*)(workspace + ws.chanStartFrom);
    }
    s.runD[tid] = 0;
    s.maskD[tid] = 0u;
    s.slots[tid] = 0;
  }
  // The item split of every possible channel size (a channel has <= 32 tokens of a source on the
  // token path), off the critical path: the walk then only looks it up.
  for (int n = B - 1 - tid; n <= 32; n += B) {  // the last threads (the first ones poll T)
    const RowSplit sp = row_split(d.rowBytes, n);
    s.splitNseg[n] = sp.nseg;
    s.splitSegBytes[n] = sp.segBytes;
  }
  for (int i = tid; i < d.R * d.L; i += B) {
    s.cnt[i] = 0;
    s.run[i] = 0;
    s.mask[i] = 0u;
  }
  if (c == 0)
    for (int i = tid; i < d.R * d.C; i += B) s.hist[i] = 0;
  __syncthreads();
  MOE_PROF(0, 17);  // counters cleared (the remote sources' T may still be on the way)
  // The walk, one id per lane: groups of Kp lanes (K rounded up to a power of two) hold the ids
  // of one token (lane k: id k), a warp takes 32 / Kp tokens per round, two rounds at a time with
  // every load in flight first; source by source (one token per thread with its ids in registers
  // would be ~500 dependent instructions per token, 1.5-3 us per block).
  const int nw = moe_id_words(d.K);
  const int lo = d.rank * d.L;
  const lanemask_t groupBits = (lanemask_t)(((uint64_t)1 << Kp) - 1);
  for (int q = 0; q < d.R; ++q) {
    const int src = (d.rank + q) % d.R;  // own ids first (already loaded), then the remote sources
    const bool self = src == d.rank;
    // A remote source's T (word 0 of its id list): the probe's value, or lane 0 of each warp polls
    // it here, so that the own walk runs while it is on the way (until then every
    // block waited for every T before its walk).
    int Tsrc = d.T;
    if (!self) {
      Tsrc = gin_shfl_int(s.Ts[src], 0);  // warp-uniform (warp 0 may be writing it)
      if (Tsrc < 0) {
        if (lane == 0) (void)ll_table_get(s.ids[src] - 1, seq, true, errorFlags, Tsrc);
        Tsrc = gin_shfl_int(Tsrc, 0);
      }
      if (Tsrc < 0 || Tsrc > d.M) {
        if (lane == 0) gin_error_set(errorFlags, MOE_ERR_COUNTS);
        Tsrc = 0;
      }
      if (warp == 0 && lane == 0) s.Ts[src] = Tsrc;  // for the items, after the walk's barrier
    }
    const int ct0 = (int)((int64_t)c * Tsrc / d.C), ct1 = (int)((int64_t)(c + 1) * Tsrc / d.C);
    if (!self && warp == 0 && lane == 0) {
      s.t0s[src] = ct0;
      s.t1s[src] = ct1;
    }
    const uint64_t* words = s.ids[src];
    int nHere = 0, nBefore = 0;  // lane 0: this warp's tokens of src coming here (before channel c)
    for (int tw = warp * perWarp; tw < Tsrc; tw += kTpWalkRounds * step) {  // warp-uniform
      int e[kTpWalkRounds];
      uint64_t v[kTpWalkRounds];
#pragma unroll
      for (int u = 0; u < kTpWalkRounds; ++u) {
        const int t = tw + u * step + sub;
        e[u] = -1;
        v[u] = 0;
        if (t < Tsrc && k < d.K) {
          if (self) e[u] = tw == warp * perWarp ? ownFirst[u] : topkIdx[(uint64_t)t * d.K + k];
          else v[u] = gin_ld_relaxed_sys(words + (uint32_t)(t * nw + (k >> 1)));
        }
      }
#pragma unroll
      for (int u = 0; u < kTpWalkRounds; ++u) {
        const int t = tw + u * step + sub;
        if (!self && t < Tsrc && k < d.K) {
          if (!ll_tag_ok(v[u], seq)) {
            const uint64_t* w = words + (uint32_t)(t * nw + (k >> 1));
            uint64_t start = 0;
            for (uint32_t spins = 0;; ++spins) {
              v[u] = gin_ld_relaxed_sys(w);
              if (ll_tag_ok(v[u], seq)) break;
              if (gin_wait_timed_out(spins, start, errorFlags)) {
                v[u] = seq << 32 | 0xffffffffull;  // both ids masked
                break;
              }
            }
          }
          const uint32_t h = (uint32_t)(v[u] >> (16 * (k & 1))) & 0xffffu;
          e[u] = h == 0xffffu ? -1 : (int)h;
        }
      }
#pragma unroll
      for (int u = 0; u < kTpWalkRounds; ++u) {
        const int t = tw + u * step + sub;
        int ev = e[u];
        if (ev >= d.E) ev = -1;
        if (ev < 0) ev = -1;
        const bool dup = id_repeats_lower(ev, k, Kp);  // masked (token_experts' rule)
        const bool local = !dup && (unsigned)(ev - lo) < (unsigned)d.L;
        const bool before = t < ct0, inCh = !before && t < ct1;
        const uint32_t bit = inCh ? 1u << (t - ct0) : 0u;
        if (local) {
          const int i = src * d.L + (ev - lo);
          atomicAdd(&s.cnt[i], 1);
          if (before) atomicAdd(&s.run[i], 1);
          else if (inCh) atomicOr(&s.mask[i], bit);
        }
        const lanemask_t lm = (lanemask_t)moe_detail::ballot(local);
        const bool here = k == 0 && ((lm >> (sub * Kp)) & groupBits) != 0;  // t < Tsrc implied
        const lanemask_t hb = (lanemask_t)moe_detail::ballot(here);
        const lanemask_t bb = (lanemask_t)moe_detail::ballot(here && before);
        nHere += __popc((uint32_t)hb) + (GIN_WARP_SIZE > 32 ? __popc((uint32_t)((uint64_t)hb >> 32)) : 0);
        nBefore += __popc((uint32_t)bb) + (GIN_WARP_SIZE > 32 ? __popc((uint32_t)((uint64_t)bb >> 32)) : 0);
        if (here) {
          if (inCh) atomicOr(&s.maskD[src], bit);
          if (c == 0) atomicAdd(&s.hist[src * d.C + ((t + 1) * d.C - 1) / Tsrc], 1);  // < 2^31: M, C bounded
        }
      }
      if (tw == warp * perWarp && q == 0) MOE_PROF(0, 18);  // thread 0: its warp's first (own) tokens counted
    }
    if (lane == 0 && nHere) {
      atomicAdd(&s.slots[src], nHere);
      if (nBefore) atomicAdd(&s.runD[src], nBefore);
    }
  }
  MOE_PROF(0, 19);  // thread 0's tokens counted (before the barrier)
  __syncthreads();
  MOE_PROF(0, 20);  // every source's ids walked
  // rowBase[s][e] = expertStart[e] + sum_{s' < s} cnt[s'][e] + run[s][e]: thread i takes local
  // experts [i*per, (i+1)*per) (per = 1 up to L = 512), warp scans of their rows, the warp totals
  // through shared memory after one barrier (one block scan with three barriers and
  // thread 0 alone on the item ends costs ~2 us). The last warp finds the item ends meanwhile.
  int* warpTot = s.scanTmp;
  const int per = (d.L + B - 1) / B;  // experts per thread (1 for L <= 512)
  const int e0 = moe_min_i(d.L, tid * per), e1 = moe_min_i(d.L, e0 + per);
  int sum = 0;
  for (int e = e0; e < e1; ++e) {
    int tot = 0;
    for (int q = 0; q < d.R; ++q) tot += s.cnt[q * d.L + e];
    if (c == 0) recvCounts[e] = tot;
    sum += tot;
  }
  int inc = sum;
#pragma unroll
  for (int off = 1; off < GIN_WARP_SIZE; off <<= 1) {
    const int v = shfl_up_i(inc, off);
    if (lane >= off) inc += v;
  }
  if (lane == GIN_WARP_SIZE - 1) warpTot[warp] = inc;
  if (warp == nWarps - 1) {  // item ends: own tokens first (they wait for nothing), then rank + q
    int items = 0;
    if (lane < d.R) {
      // Own tokens: row_split segments of x; remote ones: passes of kTpPassLines LL128 lines.
      const int src = (d.rank + lane) % d.R;
      const int n = __popc(s.maskD[src]);
      const int nl = (int)moe_row_lines(d.rowBytes);
      s.nseg[src] = lane == 0 ? s.splitNseg[n] : (nl + kTpPassLines - 1) / kTpPassLines;
      s.segBytes[src] = s.splitSegBytes[n];
      items = n * s.nseg[src];
    }
    int incI = items;
#pragma unroll
    for (int off = 1; off < GIN_WARP_SIZE; off <<= 1) {
      const int v = shfl_up_i(incI, off);
      if (lane >= off) incI += v;
    }
    if (lane < d.R) s.itemEnd[lane + 1] = incI;
    if (lane == 0) s.itemEnd[0] = 0;
  }
  __syncthreads();
  int run = inc - sum;
  if (e0 < e1)
    for (int w = 0; w < warp; ++w) run += warpTot[w];
  for (int e = e0; e < e1; ++e)
    for (int q = 0; q < d.R; ++q) {
      s.rowBase[q * d.L + e] = run + s.run[q * d.L + e];
      run += s.cnt[q * d.L + e];
    }
}

// ================================================================================================
// Scaled fp8 rows from bf16 rows: moe_fp8_quantize and the quantizing fp8 dispatch.
// Per 128-element block of a row (the last may be short): amax = max |x|, scale = amax / FMAX
// (1 where amax = 0), code = e4m3(x * (FMAX / amax)), rounded to nearest even and saturated to
// +-FMAX. FMAX = 448 for e4m3fn (NVIDIA), 240 for e4m3fnuz (gfx942, the format its fp8 units take).
// Non-finite inputs give non-finite scales or codes. out: [T][moe_fp8_row_bytes(H)], the padding
// scales zero.
// ================================================================================================
namespace moe_detail {
#if GIN_HIP
constexpr bool kFp8Fnuz = true;
#else
constexpr bool kFp8Fnuz = false;
#endif
constexpr float kFp8Max = kFp8Fnuz ? 240.f : 448.f;

// Round to nearest even, saturate to +-kFp8Max (a ≥ 0 here; the sign is added by the caller).
GIN_DEVICE_INLINE uint32_t fp8_e4m3_magnitude(float a) {
  constexpr int kBias = kFp8Fnuz ? 8 : 7;
  if (a >= kFp8Max) a = kFp8Max;
  const float minNormal = ldexpf(1.f, 1 - kBias);
  if (a < minNormal) return (uint32_t)rintf(ldexpf(a, kBias + 2));  // subnormal steps of 2^(-bias-2); 8 = the min normal
  int e;
  const float f = frexpf(a, &e);                                    // a = f * 2^e, f in [0.5, 1)
  uint32_t m = (uint32_t)rintf((2.f * f - 1.f) * 8.f), E = (uint32_t)(e - 1 + kBias);
  if (m == 8u) {
    m = 0u;
    ++E;
  }
  return (E << 3) | m;
}
GIN_DEVICE_INLINE uint32_t fp8_e4m3(float v) {
  if (v != v) return kFp8Fnuz ? 0x80u : 0x7fu;  // NaN
  const uint32_t mag = fp8_e4m3_magnitude(fabsf(v));
  if (kFp8Fnuz && mag == 0u) return 0u;           // fnuz has no negative zero (0x80 is its NaN)
  return ((__float_as_uint(v) >> 31) << 7) | mag;  // the sign bit, as the hardware conversion keeps it
}
// Four codes, v[0] in the low byte. sm_89+: the hardware conversion (same rounding, saturation and
// signed zero as fp8_e4m3; MOE_FP8_SOFTWARE forces the software one, to compare the two).
GIN_DEVICE_INLINE uint32_t fp8_e4m3x4(const float (&v)[4]) {
#if !GIN_HIP && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890 && !defined(MOE_FP8_SOFTWARE)
  uint16_t lo, hi;  // cvt puts its first source in the upper byte
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(lo) : "f"(v[1]), "f"(v[0]));
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(hi) : "f"(v[3]), "f"(v[2]));
  return (uint32_t)lo | ((uint32_t)hi << 16);
#else
  uint32_t c = 0u;
#pragma unroll
  for (int i = 0; i < 4; ++i) c |= fp8_e4m3(v[i]) << (8 * i);
  return c;
#endif
}

// Per 16-bit half, the larger (unsigned).
GIN_DEVICE_INLINE uint32_t max_u16x2(uint32_t a, uint32_t b) {
#if GIN_HIP
  const uint32_t al = a & 0xffffu, bl = b & 0xffffu, ah = a >> 16, bh = b >> 16;
  return (al > bl ? al : bl) | ((ah > bh ? ah : bh) << 16);
#else
  return __vmaxu2(a, b);
#endif
}
// Tokens [t0, t0 + n) of x (bf16 rows of H) -> scaled fp8 rows out[t] (moe_fp8_row_bytes(H) bytes
// each), by warps warpIdx of nWarps (warp-uniform arguments; every lane of a warp calls). A group of
// kQuantLanes lanes per (token, 128-block), each lane 128 / kQuantLanes elements (chunks of 8, one
// 16-byte load each, chunk j * kQuantLanes + lane of the block), kQuantUnroll blocks per group at a
// time with all their loads in flight: one load per lane at a time kept an H200 at ~1.3 TB/s
// (4096 x 7168: 68 us), latency- not bandwidth-bound. H % 16 == 0, x 16-byte and out 8-byte aligned
// (the callers check). moe_fp8_quantize runs it over the grid, the quantizing dispatch over a
// block's share of its channel's tokens.
template <int kQuantLanes, int kQuantUnroll>
GIN_DEVICE_INLINE void fp8_quantize_tokens_by(const uint16_t* x, int hidden, uint8_t* out, uint64_t t0, uint64_t n,
                                              uint64_t warpIdx, uint64_t nWarps) {
  constexpr int kChunks = 16 / kQuantLanes, kGroups = GIN_WARP_SIZE / kQuantLanes;
  static_assert(kQuantLanes == 16 || kQuantLanes == 8 || kQuantLanes == 4 || kQuantLanes == 2, "a block is 16 chunks of 8 elements");
  const int S = moe_fp8_scales(hidden), Sp = (S + 3) / 4 * 4;
  const uint64_t rowBytes = moe_fp8_row_bytes(hidden);
  const int lane = (int)gin_lane_id(), sub = lane % kQuantLanes, grp = lane / kQuantLanes;
  constexpr uint64_t kPerWarp = (uint64_t)kGroups * kQuantUnroll;  // blocks a warp takes per iteration
  const uint64_t items = n * (uint64_t)S;
  const bool items32 = items < (1ull << 32);  // 32-bit item arithmetic (a 64-bit division is a long call)
  for (uint64_t base = warpIdx * kPerWarp; base < items; base += nWarps * kPerWarp) {  // warp-uniform
    uint32_t w[kQuantUnroll][kChunks][4];  // the lane's bf16 values of block u, chunk j, two per word
    uint64_t t[kQuantUnroll];
    int b[kQuantUnroll];
#pragma unroll
    for (int u = 0; u < kQuantUnroll; ++u) {
      const uint64_t it = base + (uint64_t)(u * kGroups + grp);
      t[u] = items32 ? (uint64_t)((uint32_t)it / (uint32_t)S) : it / (uint64_t)S;
      b[u] = (int)(it - t[u] * (uint64_t)S);
      t[u] += t0;
#pragma unroll
      for (int j = 0; j < kChunks; ++j) {
        const int h0 = b[u] * 128 + (j * kQuantLanes + sub) * 8;  // H % 16 == 0: a chunk is all in the row or none
        gin_u128 raw;
        raw.lo = raw.hi = 0;
        if (it < items && h0 < hidden) raw = *(const gin_u128*)(x + t[u] * (uint64_t)hidden + (uint64_t)h0);
        w[u][j][0] = (uint32_t)raw.lo;
        w[u][j][1] = (uint32_t)(raw.lo >> 32);
        w[u][j][2] = (uint32_t)raw.hi;
        w[u][j][3] = (uint32_t)(raw.hi >> 32);
      }
    }
#pragma unroll
    for (int u = 0; u < kQuantUnroll; ++u) {
      // amax over the group on the bf16 bits (the float form with a NaN test per
      // element is ~2x the instructions): |x| as 15-bit magnitudes order like the values, a NaN
      // above every number; canonical NaN as before.
      uint32_t m2 = 0u;
#pragma unroll
      for (int j = 0; j < kChunks; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) m2 = max_u16x2(m2, w[u][j][i] & 0x7fff7fffu);
      int m = (int)((m2 & 0xffffu) > (m2 >> 16) ? (m2 & 0xffffu) : (m2 >> 16));
#pragma unroll
      for (int o = kQuantLanes / 2; o > 0; o >>= 1) {
        const int other = gin_shfl_xor_int(m, o);
        m = other > m ? other : m;
      }
      if (m > 0x7f80) m = 0x7fc0;
      if (base + (uint64_t)(u * kGroups + grp) >= items) continue;
      const float amax = __uint_as_float((uint32_t)m << 16);
      uint8_t* row = out + t[u] * rowBytes;
      // x * (FMAX / amax): one division per block, not per element (a division each kept the kernel
      // ALU-bound: 45 us at 4096 x 7168). Blocks of bf16 subnormals are scaled up by 2^64 first
      // (exact), else FMAX / amax overflows; (x * 2^64) * inv, as x * (2^64 * inv) may overflow.
      const bool tiny = amax < 0x1p-100f;
      const float pre = tiny ? 0x1p64f : 1.f;
      const float inv = amax == 0.f ? 0.f : kFp8Max / (amax * pre);
#pragma unroll
      for (int j = 0; j < kChunks; ++j) {
        const int h0 = b[u] * 128 + (j * kQuantLanes + sub) * 8;
        if (h0 >= hidden) continue;
        float q[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) q[i] = bf16_to_f32(w[u][j][i / 2] >> (16 * (i & 1)));
        if (tiny) {
#pragma unroll
          for (int i = 0; i < 8; ++i) q[i] *= pre;
        }
#pragma unroll
        for (int i = 0; i < 8; ++i) q[i] *= inv;
        const float q0[4] = {q[0], q[1], q[2], q[3]}, q1[4] = {q[4], q[5], q[6], q[7]};
        *(uint64_t*)(row + h0) = (uint64_t)fp8_e4m3x4(q0) | ((uint64_t)fp8_e4m3x4(q1) << 32);
      }
      float* scales = (float*)(row + hidden);
      if (sub == 0) {
        scales[b[u]] = amax == 0.f ? 1.f : amax / kFp8Max;
        if (b[u] == S - 1)
          for (int p = S; p < Sp; ++p) scales[p] = 0.f;  // padding
      }
    }
  }
}
// The lane grouping by work per warp (1x H200, DeepSeek-V3): where one iteration of
// 8-lane groups covers a warp's share (2 tokens per sender block at 128 tokens: 112 blocks over 16
// warps) they take it in one round, with every warp busy; 4-lane groups would leave half the warps
// idle (+1.3 us to "quantized"), 16-lane groups need two rounds (+0.7 us).
// Above that, 4-lane groups keep the most loads in flight: at 4 tokens per block 21.0 against 21.3
// (8-lane) and 25 us (16-lane) per gated call, and moe_fp8_quantize at 4096 x 7168 ~30 us
// against 35 (16-lane). Two lanes per block (moe_fp8_quantize at 4096 tokens: 1.8-2.0 TB/s) and 4
// blocks per group (the dispatch at its 128-register limit) were slower.
GIN_DEVICE_INLINE void fp8_quantize_tokens(const uint16_t* x, int hidden, uint8_t* out, uint64_t t0, uint64_t n,
                                           uint64_t warpIdx, uint64_t nWarps) {
  const uint64_t items = n * (uint64_t)moe_fp8_scales(hidden);
  if (items <= nWarps * (GIN_WARP_SIZE / 8) * 2) fp8_quantize_tokens_by<8, 2>(x, hidden, out, t0, n, warpIdx, nWarps);
  else fp8_quantize_tokens_by<4, 2>(x, hidden, out, t0, n, warpIdx, nWarps);
}
}  // namespace moe_detail

// ================================================================================================
// moe_gin_dispatch and its token-path entries (body: gin_dispatch; "Entry points" below).
// Grid 2*C blocks of MOE_THREADS: blocks [0, C) are senders (channel c = token range c), blocks
// [C, 2C) receivers (channel c = the slots that the senders of channel c of every
// source produce). Per call seq n (per-block counters in the workspace state):
//  sender c:  routing layout (one-level: counts the lower tokens itself; two-level: steps 1-2,
//             claim[c] = (n << 32) - 1, waits for lower blocks only);
//             last sender (the leader): totals; writes our count table (per local expert of d,
//             slots, chanStart[C+1]) as LL words tagged n into buffer n % 2 of every rank d's
//             window (own included): no wait, no fence, no flag;
//             layout step 3, claim[c] = n << 32 (positions published, own-item
//             claim counter reset; local);
//             for each remote d with slots: wait dispConsumed[d][*] >= n-1 (all of d's receivers
//             finished reading our previous staging), then warp w sends slots j = w, w+W, ... of
//             the channel: row + metadata into d's staging, fence, dispProgress[rank][c][w] =
//             (n << 32) | (slots done by w) in d's window.
//  receiver c: polls the LL table words of every source until tagged n; rowBase[s][e] = expertStart[e] +
//             sum_{s'<s} count[s'][e]; expands each remote source's items of channel c as they
//             land, claiming own-token items (source = x) from claim[c] while the next remote
//             item is not there yet, then the own items left; row = rowBase[s][e] + slotInExpert;
//             at the start of call n+1 it writes dispConsumed[rank][c] = n into every remote
//             source's window (staging WAR). Sender c, when the tables were already there after its
//             sends, claims own items too.
// Receiver 0 also writes recvCounts, slotsFrom and chanStartFrom (kept for combine).
// Token path (moe_token_path: M*K <= 4096 and <= 32 tokens per channel, the same choice
// on every rank): senders push their tokens' ids (LL words, by call parity) and then each row to
// staging slot = token index right after the id walk; receivers lay out every source themselves;
// the senders' positions follow their sends. Same outputs and workspace arrays (docs/kernels.md).
// ================================================================================================
template <class Shape>
GIN_DEVICE_INLINE void gin_dispatch(const uint16_t* x, const int32_t* topkIdx, const float* topkWeights,
                                     int32_t numTokens, uint16_t* recvX, float* recvWeights, int32_t* recvCounts,
                                     const uint64_t* peerBases, uint8_t* workspace, uint32_t* errorFlags, int32_t rank,
                                     int32_t nRanks, int32_t numExperts, int32_t topK, int32_t hidden,
                                     int32_t maxTokens, int32_t numChannels, uint8_t* xq = nullptr) {
  __shared__ __align__(16) DispatchSmem sm;
  __shared__ uint64_t sharedSeq;
  __shared__ uint64_t sharedBases[MOE_MAX_RANKS];
  __shared__ int sharedOwnLeft;  // sender: own-token items left to claim after the sends (block-uniform)
  // Token-path sender: what tp_send_positions writes, parked here across the sends (output
  // pointers held in registers through the send loop cost the kernel a stack frame on sm_90).
  __shared__ int* tpTokenPos;
  __shared__ int* tpChanStartTo;
  __shared__ uint64_t* tpState;
  gin_wait_prior_grids();  // launched with PDL: nothing below may run before the previous kernel is done
  MOE_PROF(0, 10);  // entry, before the checks and the prologue's loads
  const int tid = (int)threadIdx.x, B = (int)blockDim.x;
  uint64_t* state = state_of(workspace);
  // The prologue's loads first, by different threads (as the token-path combine's): the peers' window bases into shared memory and this block's call counter; the
  // checks and the layout arithmetic run under their round trip, one barrier collects them. They
  // read only what the checks then validate (guarded: at most MOE_MAX_RANKS bases, counters of
  // blocks < 2 * MOE_MAX_CHANNELS). Before, peers_ok's loads, ~0.7 us of layout arithmetic and
  // load_seq's round trip ran one after the other: ~2 us from entry to "start".
  if (peerBases != nullptr && tid < nRanks && tid < MOE_MAX_RANKS) sharedBases[tid] = peerBases[tid];
  else if (tid == MOE_MAX_RANKS && workspace != nullptr && blockIdx.x < 2 * MOE_MAX_CHANNELS)
    sharedSeq = state[MOE_STATE_SEQ_DISPATCH + blockIdx.x] + 1;
  Dims dims = make_dims(rank, nRanks, numExperts, topK, hidden, maxTokens, numChannels, numTokens);
  if (!launch_ok(dims, 2, true, workspace, peerBases, errorFlags) || !shape_ok<Shape>(dims, errorFlags)) return;
  const Dims d = dims;
  if (recvX == nullptr || recvWeights == nullptr || recvCounts == nullptr || topkIdx == nullptr ||
      topkWeights == nullptr || (x == nullptr && d.T > 0)) {
    if (blockIdx.x == 0 && threadIdx.x == 0) gin_error_set(errorFlags, MOE_ERR_CONFIG);
    return;
  }
  if ((numTokens < 0 || numTokens > maxTokens) && blockIdx.x == 0 && threadIdx.x == 0)
    gin_error_set(errorFlags, MOE_ERR_TOKENS);
  // The quantizing fp8 dispatch (fp8 entries with xq != null): x holds bf16 rows, and
  // sender c turns its own tokens into scaled fp8 rows in xq[t] (fp8_quantize_tokens) before it
  // sends any; from then on every path reads xq as it reads x otherwise. Its rows are written
  // during the kernel, so the fp8 entries read x with coherent loads (kXFresh).
  constexpr bool kXFresh = Shape::fp8;
  const bool quant = Shape::fp8 && xq != nullptr;
  const uint16_t* const xBf16 = x;
  if (quant) {
    if (!gin_is_aligned(x, 16) || !gin_is_aligned(xq, 16) || !gin_is_aligned(recvX, 16)) {
      if (blockIdx.x == 0 && threadIdx.x == 0) gin_error_set(errorFlags, MOE_ERR_CONFIG);
      return;
    }
    x = (const uint16_t*)xq;
  }
  const int lane = (int)gin_lane_id(), warp = tid / GIN_WARP_SIZE;
  const MoeWindowLayout wl = moe_window_layout(d.R, d.E, d.K, d.H, d.M);
  const MoeWorkspaceLayout ws = moe_workspace_layout(d.R, d.E, d.K, d.M);
  int* tokenPos = (int*)(workspace + ws.tokenPos);
  int* slotInExpert = (int*)(workspace + ws.slotInExpert);
  int* sendList = (int*)(workspace + ws.sendList);
  const bool fast = (d.rowBytes & 15u) == 0 && gin_is_aligned(x, 16) && gin_is_aligned(recvX, 16);
  const bool tokenPath = Shape::tokenPathOnly || moe_token_path(d.K, d.M, d.C);
  MOE_PROF_AFTER(0, 23, (uint32_t)(wl.totalBytes + ws.totalBytes));  // checks and layouts done
  __syncthreads();
  bool basesOk = true;
  for (int p = 0; p < d.R; ++p) basesOk &= sharedBases[p] != 0 && (sharedBases[p] & 15u) == 0;
  if (!basesOk) {
    if (blockIdx.x == 0 && tid == 0) gin_error_set(errorFlags, GIN_ERR_NO_LSA_PATH);
    return;
  }
  uint8_t* ownWin = (uint8_t*)sharedBases[d.rank];
  const uint64_t seq = sharedSeq;
  const uint64_t seqHi = seq << 32;
  // Staging write-after-read: receiver c tells every remote source that it finished
  // reading that source's staging in call n-1 (dispConsumed[rank][c] = n-1), here at the start of
  // call n instead of with a release at the end of call n-1. Call n-1 is complete before this call
  // starts (stream order; with PDL, gin_wait_prior_grids above), so its staging loads have all
  // returned: a relaxed store is enough, and the release's system fence (~1 us at the end of every
  // dispatch, measured) is gone. Every call writes it, so a source's call n waits at most for this
  // rank's call n to start.
  if ((int)blockIdx.x >= d.C && tid < d.R && tid != d.rank)
    gin_st_relaxed_sys((uint64_t*)((uint8_t*)sharedBases[tid] + wl.dispConsumed) +
                           (uint64_t)moe_peer_section(d.rank, tid, d.R) * MOE_MAX_CHANNELS + ((int)blockIdx.x - d.C),
                       seq - 1);

  if (tokenPath && (int)blockIdx.x < d.C) {
    // ------------------------------------------------------------------ token-path sender
    // Rows go out at once, into the receiver's staging slot = the token's own index (a token goes
    // to rank r iff one of its ids is in r's range), after the token's ids as LL words into every
    // remote rank's id list; the receivers run the layout themselves. Before the sends only what
    // they need: the ids pushed (range-checked; the receivers drop repeats
    // with the same rule as the layout) and each own token's destination ranks, one warp per token
    // with lane k on id k, rather than the small layout's whole id walk first (4-6 us, one token
    // per thread). What the combine reads of the sending side (tokenPos; the last block's
    // chanStartTo and T) follows the sends, from destination masks alone (tp_send_positions).
    LayoutSmem& s = sm.lay;
    const int c = (int)blockIdx.x;
    MOE_PROF(0, 0);
    int t0, t1;
    token_range(d, c, t0, t1);
    // Write-after-read on the remote staging: as in the layout path (all of r's receivers of the
    // previous call are done; one acquire per flag by the last threads, waited for if missing).
    const int warFlags = (d.R - 1) * d.C;
    auto warFlag = [&](int i) -> const uint64_t* {
      const int r = (d.rank + 1 + i / d.C) % d.R;
      return (const uint64_t*)(ownWin + wl.dispConsumed) +
             (uint64_t)moe_peer_section(r, d.rank, d.R) * MOE_MAX_CHANNELS + (uint64_t)(i % d.C);
    };
    bool warSeen = true;
    for (int i = B - 1 - tid; i < warFlags; i += B) warSeen &= gin_ld_acquire_sys(warFlag(i)) >= seq - 1;
    if (c == 0 && tid == B - GIN_WARP_SIZE)  // T into every remote rank's id list (word 0)
      for (int r = 0; r < d.R; ++r)
        if (r != d.rank)
          gin_st_relaxed_sys(ids_area((const uint8_t*)peerBases[r], wl, d.rank, d.R, seq), seqHi | (uint64_t)(uint32_t)d.T);
    {
      const int nw = moe_id_words(d.K);
      const int Kp = id_group_size(d.K);  // the repeat check's lane group (lanes >= K hold -1)
      if (tid >= t1 - t0 && tid < 32) s.tokDest[tid] = 0u;  // no token there
      for (int j = warp; j < t1 - t0; j += MOE_WARPS) {  // own token t0 + j (<= 32 on the token path)
        const int t = t0 + j;
        int e = -1;
        bool bad = false;
        if (t < t1 && lane < d.K) {
          e = topkIdx[(uint64_t)t * d.K + lane];
          bad = e < -1 || e >= d.E;
          if (e < 0 || e >= d.E) e = -1;
        }
        // Reported here, by the token's own block (the ids go out range-checked only; every
        // receiver drops repeats by the same rule).
        bad |= id_repeats_lower(e, lane & (Kp - 1), Kp);
        if (gin_warp_any(bad) && lane == 0) gin_error_set(errorFlags, MOE_ERR_EXPERT_ID);
        // Ids 2i and 2i + 1 into word i of the token's list in every remote rank's window.
        const int hi = gin_shfl_int(e, (2 * lane + 1) % GIN_WARP_SIZE);
        const int lo = gin_shfl_int(e, (2 * lane) % GIN_WARP_SIZE);
        if (t < t1 && lane < nw) {
          const uint32_t a = (uint32_t)lo & 0xffffu;
          const uint32_t b = 2 * lane + 1 < d.K ? (uint32_t)hi & 0xffffu : 0xffffu;
          for (int q = 1; q < d.R; ++q) {
            const int r = (d.rank + q) % d.R;
            uint64_t* dst = ids_area((const uint8_t*)peerBases[r], wl, d.rank, d.R, seq) + 1 + (uint64_t)t * (uint64_t)nw;
            gin_st_relaxed_sys(dst + lane, seqHi | (uint64_t)(a | (b << 16)));
          }
        }
        // Destination ranks of the token: one bit per rank, OR-ed over the lanes.
        uint32_t dm = e >= 0 ? 1u << (e / d.L) : 0u;
#pragma unroll
        for (int off = GIN_WARP_SIZE / 2; off > 0; off >>= 1) dm |= (uint32_t)gin_shfl_xor_int((int)dm, off);
        if (lane == 0) s.tokDest[j] = dm;
      }
    }
    MOE_PROF(0, 16);  // thread 0: its token's ids out and destinations known (then the write-after-read waits)
    if (quant) {
      // Every warp, after its token's ids (2 ranks on one H200, DeepSeek-V3, 128
      // tokens: only the warps without ids quantizing was 0.5 us slower). One round of loads per
      // warp where the share allows it (fp8_quantize_tokens' lane grouping).
      fp8_quantize_tokens(xBf16, d.H, xq, (uint64_t)t0, (uint64_t)(t1 - t0), (uint64_t)warp, MOE_WARPS);
      MOE_PROF(0, 13);  // thread 0: its warp's share of the fp8 rows stored
    }
    for (int r = tid; r < d.R; r += B) s.runD[r] = 0;  // tp_send_positions' counters
    if (c == d.C - 1)
      for (int i = tid; i < d.C * d.R; i += B) s.u.lead.histD[i] = 0;
    if (!warSeen)
      for (int i = B - 1 - tid; i < warFlags; i += B) (void)gin_wait_geq(warFlag(i), seq - 1, errorFlags);
    if (tid == 0) {
      tpTokenPos = tokenPos;
      tpChanStartTo = (int*)(workspace + ws.chanStartTo);
      tpState = state;
    }
#if GIN_HIP
    if (quant) __threadfence();  // every wave's xq stores before the one release below
#endif
    __syncthreads();  // destinations known; the write-after-read acquires before any staging store
    // Our fp8 rows are in xq: receiver c's own items may read them (the barrier orders every
    // thread's xq stores before the release).
    if (quant && tid == B - GIN_WARP_SIZE) gin_st_release_gpu(state + MOE_STATE_QUANT_READY + c, seq);
    MOE_PROF(0, 11);
    {
      for (int q = 1; q < d.R; ++q) {
        const int r = (d.rank + 1 + (c + q - 1) % (d.R - 1)) % d.R;
        const uint32_t mr = (uint32_t)moe_detail::ballot(lane < 32 && ((s.tokDest[lane & 31] >> r) & 1u) != 0u);  // bit j: token t0 + j
        const int cnt = __popc(mr);
        if (cnt == 0) continue;
        // Section base in r's window (staging rows and metadata are offsets from it).
        uint8_t* peerWin = (uint8_t*)peerBases[r];
        const uint64_t sec = (uint64_t)moe_peer_section(d.rank, r, d.R);
        // Items (token, pass of kTpPassLines lines): the channel's tokens to r in token order (cnt
        // of them), each row as LL128 lines with flag n into staging slot t (until then
        // row_split segments, each followed by a release of the warp's progress word: a system
        // fence per item on the critical path). Pass 0 also carries the token's K weights, as LL
        // words (n << 32 | bits) in the slot's metadata (the receiver has the ids already).
        const int nl = (int)moe_row_lines(d.rowBytes);
        const int npass = (nl + kTpPassLines - 1) / kTpPassLines;
        const int items = cnt * npass;
        for (int i = warp; i < items; i += MOE_WARPS) {
          const int j = i / npass, pass = i - j * npass;
          uint32_t m = mr;
          for (int u = 0; u < j; ++u) m &= m - 1u;
          const int t = t0 + __ffs((int)m) - 1;
          const uint64_t slotIx = sec * (uint64_t)d.M + (uint64_t)t;  // staging slot = token index
          if (pass == 0 && lane < d.K)
            gin_st_relaxed_sys((uint64_t*)(peerWin + wl.dispMeta + slotIx * wl.metaStride) + lane,
                               seqHi | (uint64_t)__float_as_uint(topkWeights[(uint64_t)t * d.K + lane]));
          tp_send_pass<kXFresh>((const uint8_t*)x + (uint64_t)t * d.rowBytes, peerWin + wl.dispRows + slotIx * wl.dispSlotStride,
                       d.rowBytes, nl, pass * kTpPassLines, seq, fast);
        }
      }
      MOE_PROF_SYNC();
      MOE_PROF(0, 5);
    }
    tp_send_positions(s, topkIdx, d, c, t0, t1, *(int* volatile*)&tpTokenPos, *(int* volatile*)&tpChanStartTo,
                      *(uint64_t* volatile*)&tpState);
    MOE_PROF_SYNC();
    MOE_PROF(0, 12);
  } else if (tokenPath) {
    // ------------------------------------------------------------------ token-path receiver
    // Every source's id list (own: topkIdx) -> this rank's layout of every source restricted to
    // what channel c needs: rows per (source, local expert) for rowBase, and for s's tokens of
    // channel c (token range by s's T) the rows before them (run) and bit masks (mask), the slots
    // before them (runD) and which come here (maskD). Slots, rows and slotRows come out exactly as
    // the layout path's (positions by token order per source). Receiver 0 also writes recvCounts,
    // slotsFrom and chanStartFrom.
    TpRecvSmem& s = sm.tp;
    const int c = (int)blockIdx.x - d.C;
    MOE_PROF(0, 0);
    tp_recv_layout(s, d, c, wl, ownWin, workspace, ws, seq, topkIdx, recvCounts, errorFlags);
    const int nw = moe_id_words(d.K);
    __syncthreads();
    MOE_PROF(0, 11);
    if (c == 0) {
      // What the combine reads: slots per source and their channel boundaries (one warp per
      // source, a shuffle scan over the channels' counts). Before the items: after them, its
      // pointers held through the item loop cost the kernel a stack frame on sm_90.
      int* slotsFrom = *(int* volatile*)&s.slotsFrom;
      int* chanStartFrom = *(int* volatile*)&s.chanStartFrom;
      const int nwarps = B / GIN_WARP_SIZE;
      for (int src = warp; src < d.R; src += nwarps) {
        (void)warp_chan_scan(s.hist + src * d.C, 1, d.C,
                             [&](int j, int v) { chanStartFrom[src * (MOE_MAX_CHANNELS + 1) + j] = v; });
        if (lane == 0) {
          chanStartFrom[src * (MOE_MAX_CHANNELS + 1) + d.C] = s.slots[src];
          slotsFrom[src] = s.slots[src];
        }
      }
    }
    int* slotRows = *(int* volatile*)&s.slotRows;
    const int capacity = (int)moe_recv_capacity_rows(d.R, d.E, d.K, d.M);
    const int totalItems = s.itemEnd[d.R];
    bool firstRemote = true;
    bool quantSeen = !quant;  // the quantizing dispatch: sender c's fp8 rows of our own tokens are in xq
    for (int g = warp; g < totalItems; g += MOE_WARPS) {
      int q = 0;
      while (g >= s.itemEnd[q + 1]) ++q;
      const int src = (d.rank + q) % d.R;
      const bool self = q == 0;
      const int i = g - s.itemEnd[q];
      RowSplit sp;
      sp.nseg = s.nseg[src];
      sp.segBytes = s.segBytes[src];
      const int j = i / sp.nseg, seg = i - j * sp.nseg;
      uint64_t b0, b1;
      seg_range(sp, seg, d.rowBytes, b0, b1);
      uint32_t m = s.maskD[src];
      for (int u = 0; u < j; ++u) m &= m - 1u;
      const int bit = __ffs((int)m) - 1;
      const int t = s.t0s[src] + bit;
      const int slot = s.runD[src] + j;
      // An own item's loads first, all in flight together: the row's pass and the token's weights
      // with its ids below (ids, then the pass, then the weights would be three dependent
      // round trips, ~0.8 us each at one rank, before the item's first store).
      gin_u128 pass[kExpandUnroll];
      float wt = 0.f;
      const uint8_t* xRow = (const uint8_t*)x + (uint64_t)t * d.rowBytes;
      if (self) {
        if (!quantSeen) {
          if (lane == 0) (void)gin_wait_geq(state + MOE_STATE_QUANT_READY + c, seq, errorFlags);
          syncwarp();  // lane 0's acquire, then the barrier: every lane may read xq
          quantSeen = true;
          if (warp == 0) MOE_PROF(0, 14);  // thread 0: sender c's fp8 rows seen
        }
        if (fast) expand_load_pass<kXFresh>(pass, xRow, b0 >> 4, b1 >> 4);
        if (seg == 0 && lane < d.K) wt = topkWeights[(uint64_t)t * d.K + lane];
      }
      // Lane k's id of token t (before any flag: the ids are here), validated like token_experts
      // (range, then a repeat of an earlier slot's id is masked).
      int e = -1;
      if (lane < d.K) {
        if (self) {
          e = topkIdx[(uint64_t)t * d.K + lane];
        } else {
          const uint64_t w = gin_ld_relaxed_sys(s.ids[src] + (uint32_t)(t * nw + (lane >> 1)));
          const uint32_t v = (uint32_t)(w >> (16 * (lane & 1))) & 0xffffu;
          e = v == 0xffffu ? -1 : (int)v;
        }
        if (e < 0 || e >= d.E) e = -1;
      }
      bool dup = false;
      for (int k = 0; k < d.K; ++k) {
        const int o = gin_shfl_int(e, k);
        if (k < lane && e >= 0 && o == e) dup = true;
      }
      int row = -1;
      if (e >= 0 && !dup && e / d.L == d.rank) {
        const int ix = src * d.L + (e - d.rank * d.L);
        row = s.rowBase[ix] + __popc(s.mask[ix] & ((1u << bit) - 1u));
        if (row < 0 || row >= capacity) {
          if (seg == 0) gin_error_set(errorFlags, MOE_ERR_COUNTS);
          row = -1;
        }
      }
      if (self) {
        if (seg == 0) {
          if (lane < d.K) slotRows[((uint64_t)src * d.M + slot) * d.K + lane] = row;
          if (row >= 0) recvWeights[row] = wt;
        }
        warp_expand_seg<kXFresh>(xRow, (uint8_t*)recvX, d.rowBytes, row, d.K, fast, b0, b1, pass, fast);
        if (g == warp && warp == 0) MOE_PROF(0, 21);  // thread 0: warp 0's first own item copied
      } else {
        // Pass `seg` of the token's LL128 row (lines seg * kTpPassLines ...), each line polled until
        // it carries this call's flag; pass 0 also the token's weights (LL words, polled likewise).
        const int nl = (int)moe_row_lines(d.rowBytes);
        const uint64_t* wWord = (const uint64_t*)(s.meta[src] + (uint64_t)t * (uint32_t)wl.metaStride) + lane;
        uint64_t wv = 0;
        if (seg == 0 && row >= 0) wv = gin_ld_relaxed_sys(wWord);
        uint64_t lo[kTpUnroll], hi[kTpUnroll];
        tp_wait_lines(s.stage[src] + (uint64_t)t * (uint32_t)wl.dispSlotStride, nl, seg * kTpPassLines, seq, lo, hi, errorFlags);
        if (firstRemote) {
          if (warp == 0) MOE_PROF(0, 2);  // thread 0: warp 0's first remote item landed
          firstRemote = false;
        }
        if (seg == 0) {
          if (row >= 0) {
            uint32_t spins = 0;
            uint64_t start = 0;
            while (!ll_tag_ok(wv, seq) && !gin_wait_timed_out(spins++, start, errorFlags)) wv = gin_ld_relaxed_sys(wWord);
            wt = __uint_as_float((uint32_t)wv);
          }
          if (lane < d.K) slotRows[((uint64_t)src * d.M + slot) * d.K + lane] = row;
          if (row >= 0) recvWeights[row] = wt;
        }
        // The pass's chunks to every target row (lane k's row), as the combine consumer stores y.
        const int gj = lane & 7;
        for (int k = 0; k < d.K; ++k) {
          const int rk = gin_shfl_int(row, k);
          if (rk < 0) continue;
          uint8_t* dst = (uint8_t*)recvX + (uint64_t)rk * d.rowBytes;
#pragma unroll
          for (int u = 0; u < kTpUnroll; ++u) {
            const int L = seg * kTpPassLines + u * kTpGroups + (lane >> 3);
            gin_u128 v;
            v.lo = lo[u];
            v.hi = gj < 7 ? hi[u] : 0ull;
            if (L < nl) tp_store_chunk(dst, tp_chunk_off(L, gj, nl), gj < 7, d.rowBytes, fast, v);
          }
        }
      }
    }
    MOE_PROF_SYNC();
    MOE_PROF(0, 3);  // staging write-after-read: dispConsumed at the start of the next call
  } else if ((int)blockIdx.x < d.C) {
    // ------------------------------------------------------------------ sender / layout block
    LayoutSmem& s = sm.lay;
    const int c = (int)blockIdx.x;
    MOE_PROF(0, 0);
    // Write-after-read on every remote rank's staging (ranges move between calls, so all of its
    // receivers of the previous call must be done): thread i probes flag i now, under the routing
    //; a flag not there yet is waited for only after the routing, before the barrier
    // that precedes the sends. No warp polls all C flags (3 dependent acquires per lane at C = 66)
    // between the positions and its first store.
    const int warFlags = (d.R - 1) * d.C;
    auto warFlag = [&](int i) -> const uint64_t* {
      const int r = (d.rank + 1 + i / d.C) % d.R;
      return (const uint64_t*)(ownWin + wl.dispConsumed) +
             (uint64_t)moe_peer_section(r, d.rank, d.R) * MOE_MAX_CHANNELS + (uint64_t)(i % d.C);
    };
    // The last threads probe (flag i: thread B - 1 - i, ...): an acquire holds back its thread's
    // later loads, and at small T those threads have no token of the routing walk.
    bool warSeen = true;  // every flag of this thread probed at >= n - 1
    auto probeWar = [&]() {
      for (int i = B - 1 - tid; i < warFlags; i += B) warSeen &= gin_ld_acquire_sys(warFlag(i)) >= seq - 1;
    };
    int t0, t1;
    token_range(d, c, t0, t1);
    int* histE = (int*)(workspace + ws.histE);
    int* histD = (int*)(workspace + ws.histD);
    uint64_t* claimWord = state + MOE_STATE_HIST_READY + c;
    const bool direct = layout_is_direct(d);
    const bool small = layout_is_small(d, t0, t1);
    if (small) {
      // Probes under the id walk (before the clearing barrier the
      // acquires' latency is most of the 2.2 us to "counters cleared" at 128 tokens).
      layout_direct_small(s, topkIdx, d, t0, t1, c == d.C - 1, slotInExpert, tokenPos, sendList, errorFlags, probeWar);
      MOE_PROF(0, 1);  // routing counted and positions written
    } else if (direct) {
      probeWar();
      layout_direct(s, topkIdx, d, t0, t1, c == d.C - 1, errorFlags);
      MOE_PROF(0, 1);
    } else {
      probeWar();
      layout_histogram(s, topkIdx, d, t0, t1, histE + (uint64_t)c * d.E, histD + (uint64_t)c * d.R, errorFlags);
      publish_local(claimWord, (seq << 32) - 1);
      MOE_PROF(0, 1);
      layout_prefix(s, d, c, histE, histD, state + MOE_STATE_HIST_READY, (seq << 32) - 1, errorFlags);
    }
    MOE_PROF(0, 2);

    if (c == d.C - 1) {
      // Leader: totals, then the count tables every receiver needs before it can place any row.
      layout_lead_totals(s, d, direct ? nullptr : histD, (int*)(workspace + ws.expertCount),
                         (int*)(workspace + ws.tokensTo), (int*)(workspace + ws.chanStartTo));
      if (tid == 0) state[MOE_STATE_DISPATCH_TOKENS] = (uint64_t)d.T;
      // Our table into every rank's window (own included) as LL words in the buffer of this
      // call's parity: no write-after-read wait (for d's dispConsumed of call n-1), no fence and
      // no flag release (a fence.acq_rel.sys here waits behind the other senders' row stores on
      // NVLink: tables released at 56-64 us at 4096 tokens).
      // Remote ranks first (their receivers are the ones that wait longest).
      const int entries = d.L + 2 + d.C;
      for (int i = tid; i < d.R * entries; i += B) {
        const int r = (d.rank + 1 + i / entries) % d.R, k = i % entries;
        int v;
        if (k < d.L) v = s.runE[r * d.L + k] + s.cntE[r * d.L + k];
        else if (k == d.L) v = s.u.lead.chanStart[r * (d.C + 1) + d.C];
        else v = s.u.lead.chanStart[r * (d.C + 1) + (k - d.L - 1)];
        gin_st_relaxed_sys(count_table((const uint8_t*)peerBases[r], wl, d.rank, d.R, seq) + k,
                           (seq << 32) | (uint64_t)(uint32_t)v);
      }
      __syncthreads();  // u.lead is reused by the tiles below
      MOE_PROF(0, 3);
    }

    if (!small) layout_positions(s, topkIdx, d, t0, t1, slotInExpert, tokenPos, sendList);
    // The quantizing dispatch: this channel's fp8 rows, before the barrier and the positions'
    // release below (which every own-item reader acquires, and which precedes our sends). We
    // take the first quarter of the range; receiver c, idle until the count tables come, the rest
    // (quant_split), and releases quantReady[c] = n: our acquire of it, then the barrier, order
    // its xq stores before the positions' release.
    if (quant) {
      const int tm = quant_split(t0, t1);
      fp8_quantize_tokens(xBf16, d.H, xq, (uint64_t)t0, (uint64_t)(tm - t0), (uint64_t)warp, MOE_WARPS);
      MOE_PROF(0, 13);
      if (tid == 0) (void)gin_wait_geq(state + MOE_STATE_QUANT_READY + c, seq, errorFlags);
    }
    if (!warSeen)
      for (int i = B - 1 - tid; i < warFlags; i += B) (void)gin_wait_geq(warFlag(i), seq - 1, errorFlags);
#if GIN_HIP
    __threadfence();  // every wave's position stores before the one release below
#endif
    // Positions (this block's global writes) visible to every warp; and the write-after-read
    // acquires above, then this barrier: every warp may store into the peers' staging.
    __syncthreads();
    // Positions published and the own-item claim counter of this call reset (n << 32): the
    // barrier orders every thread's position stores before the release (cumulative). The last
    // warp releases it: at small T it has no send item, so the release's fence delays no send.
    if (tid == B - GIN_WARP_SIZE) gin_st_release_sys(claimWord, seq << 32);
    MOE_PROF(0, 4);

    // Send this channel's slots to every remote rank (rotated so channels spread over peers).
    for (int q = 1; q < d.R; ++q) {
      const int r = (d.rank + 1 + (c + q - 1) % (d.R - 1)) % d.R;
      const int lo = s.prefD[r], cnt = s.cntD[r];
      if (cnt == 0) continue;
      uint8_t* peerWin = (uint8_t*)peerBases[r];
      const uint64_t sec = (uint64_t)moe_peer_section(d.rank, r, d.R);
      uint8_t* rowsBase = peerWin + wl.dispRows + sec * d.M * wl.rowStride;
      uint8_t* metaBase = peerWin + wl.dispMeta + sec * d.M * wl.metaStride;
      uint64_t* progress = (uint64_t*)(peerWin + wl.dispProgress) + (sec * MOE_MAX_CHANNELS + c) * MOE_MAX_WARPS + warp;
      // Items (slot j, segment): warp w sends items w, w+W, ...; its progress word counts them.
      const RowSplit sp = row_split(d.rowBytes, cnt);
      const int items = cnt * sp.nseg;
      int done = 0;
      for (int i = warp; i < items; i += MOE_WARPS) {
        const int j = i / sp.nseg, seg = i - j * sp.nseg;
        uint64_t b0, b1;
        seg_range(sp, seg, d.rowBytes, b0, b1);
        const int slot = lo + j;
        int t;
        if (small) {
          // Small layout: slot lo + j is the own token of the j-th set bit of maskD[r] (from
          // shared memory instead of one sendList round trip before the row loads).
          uint32_t m = s.maskD[r];
          for (int q = 0; q < j; ++q) m &= m - 1u;
          t = t0 + __ffs((int)m) - 1;
        } else {
          t = ld_fresh_i32(sendList + (uint64_t)r * d.M + slot);
        }
        const uint8_t* src = (const uint8_t*)x + (uint64_t)t * d.rowBytes;
        uint8_t* dst = rowsBase + (uint64_t)slot * wl.rowStride;
        // Segment 0 carries the slot's metadata: its loads go out with the row's (they
        // followed the row copy, two more round trips before segment 0's release, and every
        // other segment of the slot waits for segment 0 at the receiver).
        int me = -1, msl = -1;
        float mw = 0.f;
        if (seg == 0 && lane < d.K) {
          me = topkIdx[(uint64_t)t * d.K + lane];
          msl = ld_fresh_i32(slotInExpert + (uint64_t)t * d.K + lane);
          mw = topkWeights[(uint64_t)t * d.K + lane];
        }
        if (fast) {
          const uint64_t vEnd = b1 >> 4;
          // No L2 prefetch here: the sends are NVLink-bound at ~0.3 GB/s per warp, so
          // a whole-row prefetch sits in L2 for ~50 us and is mostly evicted before the
          // loads come (x read twice from HBM; sends' max 195 -> 205 us at 4096 tokens).
          for (uint64_t v0 = b0 >> 4; v0 < vEnd; v0 += (uint64_t)GIN_WARP_SIZE * kExpandUnroll) {
            gin_u128 v[kExpandUnroll];
#pragma unroll
            for (int u = 0; u < kExpandUnroll; ++u) {
              const uint64_t vi = v0 + (uint64_t)lane + (uint64_t)u * GIN_WARP_SIZE;
              if (vi < vEnd) v[u] = ld16<kXFresh>(src + (vi << 4));
            }
#pragma unroll
            for (int u = 0; u < kExpandUnroll; ++u) {
              const uint64_t vi = v0 + (uint64_t)lane + (uint64_t)u * GIN_WARP_SIZE;
              if (vi < vEnd) gin_st16(dst + (vi << 4), v[u]);
            }
          }
        } else {
          gin_copy_bytes(dst + b0, src + b0, b1 - b0, (uint32_t)lane, GIN_WARP_SIZE);
        }
        if (seg == 0 && lane < d.K) {  // the slot's metadata travels with its segment 0
          const bool mine = msl >= 0 && me / d.L == r;  // sl >= 0 implies e is a validated id
          int* meta = (int*)(metaBase + (uint64_t)slot * wl.metaStride);
          meta[lane] = mine ? me - r * d.L : -1;
          meta[d.K + lane] = mine ? msl : -1;
          ((float*)meta)[2 * d.K + lane] = mine ? mw : 0.f;
        }
        ++done;
        // bar.warp.sync orders every lane's stores before lane 0's release (cumulative), and the
        // release's own system fence covers the warp's stores: no separate per-lane fence.
        syncwarp();
        if (lane == 0) gin_st_release_sys(progress, seqHi | (uint64_t)done);
      }
    }
    MOE_PROF_SYNC();
    MOE_PROF(0, 5);

    // Own tokens of this channel: when every source's count table is already here (a
    // non-blocking probe: a sender never waits for the leader, a higher block, or a peer's leader)
    // the sender joins receiver c in claiming own-token items; otherwise receiver c does every
    // own item. The tables are double-buffered, so these reads need no consumed flag.
    // Not even the probe when receiver c already claimed every own item (the claim
    // counter has reached this channel's own items, known from the layout: slots to ourselves
    // = cntD[rank]); at 128 tokens the probe cost ~4 us after the sends and found nothing left.
    if (tid == 0) {
      const int ownSlots = s.cntD[d.rank];
      const int ownItems = ownSlots * row_split(d.rowBytes, ownSlots).nseg;
      // This call's claims only (the reset to n << 32 is another warp's store, unordered with
      // this load: an older value means "probe", as before). Skipping is always safe: receiver c
      // takes every own item left at its end.
      const uint64_t w = gin_ld_relaxed_sys(claimWord);
      sharedOwnLeft = (w >> 32) == seq && (int)(uint32_t)w >= ownItems ? 0 : 1;
    }
    __syncthreads();  // every warp is done with sm.lay before sm.rcv (same storage) is written
    RecvSmem& rs = sm.rcv;
    const bool takeOwn = sharedOwnLeft != 0 && recv_tables(rs, d, c, ownWin, wl, seq, false, nullptr, errorFlags);
    if (takeOwn) {
      MOE_PROF(0, 6);
      const OwnWork ow = own_work(rs, d);
      while (own_claim_item<kXFresh>(rs, ow, d, claimWord, x, topkIdx, topkWeights, sendList, slotInExpert,
                            (int*)(workspace + ws.slotRows), recvX, recvWeights, fast, errorFlags)) {
      }
    }
    MOE_PROF_SYNC();
    MOE_PROF(0, 7);
  } else {
    // ------------------------------------------------------------------ receiver block
    RecvSmem& s = sm.rcv;
    const int c = (int)blockIdx.x - d.C;
    MOE_PROF(0, 0);
    if (quant) {
      // The quantizing dispatch: our part of sender c's token range into xq while the senders
      // lay out the routing, then quantReady[c] = n (the barrier orders every warp's stores
      // before the release; sender c waits for it before it publishes its positions).
      int t0, t1;
      token_range(d, c, t0, t1);
      const int tm = quant_split(t0, t1);
      fp8_quantize_tokens(xBf16, d.H, xq, (uint64_t)tm, (uint64_t)(t1 - tm), (uint64_t)warp, MOE_WARPS);
#if GIN_HIP
      __threadfence();
#endif
      __syncthreads();
      if (tid == B - GIN_WARP_SIZE) gin_st_release_gpu(state + MOE_STATE_QUANT_READY + c, seq);
      MOE_PROF(0, 15);  // receiver: its part of the fp8 rows stored and released
    }
    (void)recv_tables(s, d, c, ownWin, wl, seq, true, c == 0 ? recvCounts : nullptr, errorFlags);
    MOE_PROF(0, 1);
    if (c == 0) {
      int* slotsFrom = (int*)(workspace + ws.slotsFrom);
      int* chanStartFrom = (int*)(workspace + ws.chanStartFrom);
      for (int src = tid; src < d.R; src += B) slotsFrom[src] = s.slots[src];
      for (int i = tid; i < d.R * (d.C + 1); i += B) {
        const int src = i / (d.C + 1), j = i % (d.C + 1);
        int v = 0;
        (void)ll_table_get(count_table(ownWin, wl, src, d.R, seq) + d.L + 1 + j, seq, true, errorFlags, v);
        if (v < 0 || v > s.slots[src]) v = s.slots[src] < 0 ? 0 : s.slots[src];
        chanStartFrom[src * (MOE_MAX_CHANNELS + 1) + j] = v;
      }
    }
    // Remote sources' items as one list (q = 1..R-1 in order), spread over all warps: item i of
    // source src was sent by sender warp i % W as its (i / W + 1)-th item.
    if (tid == 0) {
      s.itemEnd[0] = 0;
      for (int q = 1; q < d.R; ++q) {
        const int src = (d.rank + q) % d.R;
        const RowSplit sp = row_split(d.rowBytes, s.hi[src] - s.lo[src]);
        s.nseg[src] = sp.nseg;
        s.segBytes[src] = sp.segBytes;
        s.itemEnd[q] = s.itemEnd[q - 1] + (s.hi[src] - s.lo[src]) * sp.nseg;
      }
    }
    __syncthreads();
    int* slotRows = (int*)(workspace + ws.slotRows);
    uint8_t* recvBase = (uint8_t*)recvX;
    const int totalItems = d.R > 1 ? s.itemEnd[d.R - 1] : 0;
    // Own-token items (shared with sender c through the claim counter): a warp takes one whenever
    // its next remote item has not landed yet, so the own work overlaps the NVLink traffic.
    // ownState: 0 = sender c's positions not seen yet, 1 = claiming, 2 = none left.
    uint64_t* claimWord = state + MOE_STATE_HIST_READY + c;
    const OwnWork ow = own_work(s, d);
    int ownState = ow.items > 0 ? 0 : 2;
    auto tryOwn = [&]() -> bool {
      if (ownState == 0) {
        int seen = 0;
        if (lane == 0) seen = gin_ld_acquire_sys(claimWord) >= (seq << 32) ? 1 : 0;
        seen = gin_shfl_int(seen, 0);
        syncwarp();  // lane 0's acquire, then the barrier: every lane may read the positions
        if (!seen) return false;
        ownState = 1;
      }
      if (ownState == 2) return false;
      if (own_claim_item<kXFresh>(s, ow, d, claimWord, x, topkIdx, topkWeights, sendList, slotInExpert, slotRows, recvX,
                         recvWeights, fast, errorFlags))
        return true;
      ownState = 2;
      return false;
    };
    for (int g = warp; g < totalItems; g += MOE_WARPS) {
      int q = 1;
      while (g >= s.itemEnd[q]) ++q;
      const int src = (d.rank + q) % d.R;
      const int i = g - s.itemEnd[q - 1];
      RowSplit sp;
      sp.nseg = s.nseg[src];
      sp.segBytes = s.segBytes[src];
      const int j = i / sp.nseg, seg = i - j * sp.nseg;
      uint64_t b0, b1;
      seg_range(sp, seg, d.rowBytes, b0, b1);
      const int slot = s.lo[src] + j;
      const uint64_t sec = (uint64_t)moe_peer_section(src, d.rank, d.R);
      const uint8_t* rowsBase = ownWin + wl.dispRows + sec * d.M * wl.rowStride;
      const uint8_t* metaBase = ownWin + wl.dispMeta + sec * d.M * wl.metaStride;
      const uint64_t* progress = (const uint64_t*)(ownWin + wl.dispProgress) + (sec * MOE_MAX_CHANNELS + c) * MOE_MAX_WARPS;
      // Lane 0 waits for this item, lane 1 for the slot's segment 0 (it carried the metadata);
      // the warp barrier then orders every lane's reads after those acquires.
      const int i0 = j * sp.nseg;
      const uint64_t need0 = seqHi | (uint64_t)(i / MOE_WARPS + 1), need1 = seqHi | (uint64_t)(i0 / MOE_WARPS + 1);
      while (ownState != 2) {  // not landed yet: an own item meanwhile
        bool landed = true;
        if (lane == 0) landed = gin_ld_relaxed_sys(progress + i % MOE_WARPS) >= need0;
        else if (lane == 1 && seg != 0) landed = gin_ld_relaxed_sys(progress + i0 % MOE_WARPS) >= need1;
        if (moe_detail::ballot(!landed) == 0 || !tryOwn()) break;
      }
      if (lane == 0) (void)gin_wait_geq(progress + i % MOE_WARPS, seqHi | (uint64_t)(i / MOE_WARPS + 1), errorFlags);
      else if (lane == 1 && seg != 0)
        (void)gin_wait_geq(progress + i0 % MOE_WARPS, seqHi | (uint64_t)(i0 / MOE_WARPS + 1), errorFlags);
      syncwarp();
      if (g == warp) MOE_PROF(0, 2);  // thread 0: warp 0's first item landed
      // The staging segment's first pass and the slot's metadata in flight together (not
      // metadata -> weight -> staging, three dependent round trips per item).
      const uint8_t* stageRow = rowsBase + (uint64_t)slot * wl.rowStride;
      gin_u128 pass[kExpandUnroll];
      if (fast) expand_load_pass<true>(pass, stageRow, b0 >> 4, b1 >> 4);
      int row = -1;
      float wt = 0.f;
      if (lane < d.K) {
        const int* meta = (const int*)(metaBase + (uint64_t)slot * wl.metaStride);
        const int le = ld_fresh_i32(meta + lane);
        const int sl = ld_fresh_i32(meta + d.K + lane);
        const int wbits = ld_fresh_i32(meta + 2 * d.K + lane);
        if (le >= 0 && le < d.L && sl >= 0 && sl < s.cnt[src * d.L + le]) {
          row = s.rowBase[src * d.L + le] + sl;
          wt = __int_as_float(wbits);
        } else if (le != -1) {
          if (seg == 0) gin_error_set(errorFlags, MOE_ERR_COUNTS);
        }
        if (seg == 0) slotRows[((uint64_t)src * d.M + slot) * d.K + lane] = row;
      }
      if (seg == 0 && row >= 0) recvWeights[row] = wt;
      warp_expand_seg<true>(stageRow, recvBase, d.rowBytes, row, d.K, fast, b0, b1, pass, fast);
    }
    // The own items nobody took yet (sender c is a lower block: waiting for its positions keeps
    // progress).
    if (ownState == 0) {
      if (lane == 0) (void)gin_wait_geq(claimWord, seq << 32, errorFlags);
      syncwarp();
      ownState = 1;
    }
    while (ownState == 1) {
      if (!own_claim_item<kXFresh>(s, ow, d, claimWord, x, topkIdx, topkWeights, sendList, slotInExpert, slotRows, recvX,
                          recvWeights, fast, errorFlags))
        ownState = 2;
    }
    MOE_PROF_SYNC();
    MOE_PROF(0, 3);  // staging write-after-read: dispConsumed is stored at the start of the next call,
                     // not released here (a release here costs ~1 us per dispatch)
  }
  if (tid == 0) state[MOE_STATE_SEQ_DISPATCH + blockIdx.x] = seq;
}

// One combine role's items, shared by producers (kConsumer = false: the slots [first, first + n)
// that source slotSrc sent us in this channel, partials into its window) and consumers
// (kConsumer = true: tokens [first, first + n), y), one loop for both.
// Per-lane metadata runs ahead of the rows: the next item's slotRows entry (and, for
// the consumer, the tokenPos words two items ahead) are loaded while the current item reduces, so
// an item's first row loads wait for nothing but their own addresses (not slotRows ->
// recvWeights -> rows, three dependent round trips per item; consumer: tokenPos -> slotRows ->
// recvWeights -> rows). The weight of a row is loaded with the rows (warp_reduce_seg uses it last).
struct CombineCtx {
  // Kept in shared memory (one per block and source) and read where used: as registers, the
  // context stood beside the 12 x 16-byte loads and 32 accumulators of a pass and spilled.
  int R, rank, K, M;
  uint64_t rowBytes;
  const uint8_t* expertOut;
  const float* recvWeights;
  const int* slotRows;  // [R][M][K] recvX row of (received slot, k), from the dispatch
  int capacity;         // rows of expertOut
  bool fast;
  uint64_t seqHi;
  uint32_t* errorFlags;
  int slotSrc;          // whose received slots the own rows come from (producer: the source; consumer: self)
  uint8_t* out;         // row j of the items goes to out + (first + j) * outStride (first: argument)
  uint64_t outStride;
  uint64_t* progress;   // combProgress words of channel c, section 0 (+ warp; consumer: + section *
                        // MOE_MAX_CHANNELS * MOE_MAX_WARPS): producer in the source's window, consumer in ours
  const int* tokenPos;       // consumer only, and the fields below
  const uint8_t* ownWin;
  uint64_t combRows, rowStride;
  const int* lo;  // [R] this channel's first slot at rank r (shared memory)
  const int* hi;
};

template <bool kConsumer>
GIN_DEVICE_INLINE void combine_items(const CombineCtx& cx, int first, int n, const RowSplit sp) {
  const CombineCtx& d = cx;  // R, rank, K, M, rowBytes
  const int lane = (int)gin_lane_id(), warp = (int)threadIdx.x / GIN_WARP_SIZE;
  const int items = n * sp.nseg;
  // Consumer, lane r < R: tokenPos[t][r] of item i's token (its slot at rank r, or -1).
  auto posOf = [&](int i) -> int {
    if (!kConsumer || i >= items || lane >= d.R) return -1;
    return cx.tokenPos[(uint64_t)(first + i / sp.nseg) * d.R + (uint64_t)lane];
  };
  // Lane k < K: slotRows entry k of item i's slot (consumer: its own slot, from lane rank's pos).
  auto rowOf = [&](int i, int pos) -> int {
    if (i >= items) return -1;  // warp-uniform
    const int slot = kConsumer ? gin_shfl_int(pos, d.rank) : first + i / sp.nseg;
    if (lane >= d.K || slot < 0 || slot >= d.M) return -1;
    return cx.slotRows[((uint64_t)cx.slotSrc * d.M + (uint64_t)slot) * d.K + (uint64_t)lane];
  };
  int posC = posOf(warp), posN = posOf(warp + MOE_WARPS);
  int rowC = rowOf(warp, posC);
  int done = 0;
  for (int i = warp; i < items; i += MOE_WARPS) {
    const int rowN = rowOf(i + MOE_WARPS, posN);  // posN landed during the previous item
    const int posNN = posOf(i + 2 * MOE_WARPS);
    const int j = i / sp.nseg, seg = i - j * sp.nseg;
    uint64_t b0, b1;
    seg_range(sp, seg, d.rowBytes, b0, b1);
    int row = rowC;
    float wt = 0.f;
    if (lane < d.K) {
      if (row >= cx.capacity || row < -1) {
        if (seg == 0) gin_error_set(cx.errorFlags, MOE_ERR_COUNTS);
        row = -1;
      }
      if (row >= 0) wt = cx.recvWeights[row];
    }
    uint8_t* out = cx.out + (uint64_t)(first + j) * cx.outStride;
    if (kConsumer) {
      // Remote partials: lane r waits for the producer items of rank r that cover this segment
      // (the producer's split follows from hi[r] - lo[r]).
      const uint8_t* extra = nullptr;
      const uint64_t* prog = nullptr;
      int pi0 = 0, npi = 0;
      if (lane < d.R && lane != d.rank && posC >= 0) {
        const int pj = posC - cx.lo[lane];
        if (pj < 0 || posC >= cx.hi[lane]) {
          if (seg == 0) gin_error_set(cx.errorFlags, MOE_ERR_COUNTS);
        } else {
          const uint64_t sec = (uint64_t)moe_peer_section(lane, d.rank, d.R);
          const RowSplit psp = row_split(d.rowBytes, cx.hi[lane] - cx.lo[lane]);
          const int sA = (int)(b0 / psp.segBytes), sB = (int)((b1 - 1) / psp.segBytes);
          prog = cx.progress + sec * MOE_MAX_CHANNELS * MOE_MAX_WARPS;
          pi0 = pj * psp.nseg + sA;
          npi = sB - sA + 1;
          extra = cx.ownWin + cx.combRows + (sec * d.M + (uint64_t)posC) * cx.rowStride;
        }
      }
      auto waitPartials = [&]() {
        for (int pi = pi0; pi < pi0 + npi; ++pi)
          (void)gin_wait_geq(prog + pi % MOE_WARPS, cx.seqHi | (uint64_t)(pi / MOE_WARPS + 1), cx.errorFlags);
        syncwarp();  // lane r's acquires, then the barrier: every lane may read r's partial
        if (i == warp) MOE_PROF(1, 1);  // thread 0: warp 0's first partials landed
      };
      warp_reduce_seg(cx.expertOut, d.rowBytes, row, wt, d.K, extra, d.R, out, cx.fast, b0, b1, waitPartials);
    } else {
      // (write-after-read on the partial area: waited for in the kernel's prologue)
      warp_reduce_seg(cx.expertOut, d.rowBytes, row, wt, d.K, nullptr, 0, out, cx.fast, b0, b1, NoWait{});
      ++done;
      syncwarp();  // every lane's partial stores before lane 0's release (cumulative)
      if (lane == 0) gin_st_release_sys(cx.progress + warp, cx.seqHi | (uint64_t)done);
    }
    rowC = rowN;
    posC = posN;
    posN = posNN;
  }
}

// ------------------------------------------------------------------------------------------------
// Combine, token path (the dispatch's token-path sizes: M*K <= MOE_TOKEN_PATH_IDS and at
// most 32 tokens per channel). Partials travel as LL128 lines (see "LL128 rows" above), in buffer
// n % 2 of the source's window. The consumer sums each line as it lands (no progress word, no
// release fence, no consumed flag, nothing ever cleared).
// ------------------------------------------------------------------------------------------------
// Asks L2 for the row bytes of lines [L0, L1) of one row (main and tail ranges), as prefetch_l2.
GIN_DEVICE_INLINE void tp_prefetch_lines(const uint8_t* row, uint64_t rowBytes, int nl, int L0, int L1, bool fast) {
  if (!fast) return;
  uint64_t a = 112ull * (uint64_t)L0, b = 112ull * (uint64_t)L1;
  if (b > rowBytes) b = rowBytes;
  if (a < b) prefetch_l2(row + a, (uint32_t)(b - a));
  a = 112ull * (uint64_t)nl + 8ull * (uint64_t)L0;
  b = 112ull * (uint64_t)nl + 8ull * (uint64_t)L1;
  if (b > rowBytes) b = rowBytes;
  a &= ~15ull;  // prefetch wants 16-byte multiples
  b = (b + 15ull) & ~15ull;
  if (b > rowBytes) b = rowBytes;
  if (a < b) prefetch_l2(row + a, (uint32_t)(b - a));
}

// acc[u] += sum over lanes k < nk with myRow >= 0 (lane order) of w_k * bytes of row_k under this
// lane's chunk of line L0 + u * kTpGroups + group. Fast path: rows in groups of kReduceGroup with
// all their loads in flight, one address per row (a lane's chunks of a pass are a fixed stride
// apart: 112 * kTpGroups bytes in the main region, 8 * kTpGroups in the tail); element loads
// otherwise (odd sizes, one row at a time).
GIN_DEVICE_INLINE void tp_sum_own(float (&acc)[kTpUnroll][8], const uint8_t* rowsBase, uint64_t rowBytes, int myRow,
                                  float myW, int nk, int nl, int L0, bool fast) {
  const int lane = (int)gin_lane_id(), g = lane >> 3, j = lane & 7;
  const bool wide = j < 7;
  lanemask_t mOwn = (lanemask_t)moe_detail::ballot(lane < nk && myRow >= 0);
  const uint64_t off0 = tp_chunk_off(L0 + g, j, nl);
  const uint64_t stride = wide ? 112ull * kTpGroups : 8ull * kTpGroups;
  if (!fast) {
    while (mOwn) {
      const int k = lanemask_ffs(mOwn);
      mOwn &= mOwn - 1;
      const int row = gin_shfl_int(myRow, k);
      const float w = shfl_f(myW, k);
      const uint8_t* src = rowsBase + (uint64_t)(row < 0 ? 0 : row) * rowBytes;
      for (int u = 0; u < kTpUnroll; ++u)
        if (L0 + u * kTpGroups + g < nl) acc_bf16x8(acc[u], tp_load_chunk<false>(src, off0 + (uint64_t)u * stride, wide, rowBytes, false), w);
    }
    return;
  }
  // Chunks of this lane inside the row (a whole chunk or none on the fast path).
  uint32_t live = 0;
#pragma unroll
  for (int u = 0; u < kTpUnroll; ++u)
    if (L0 + u * kTpGroups + g < nl && off0 + (uint64_t)u * stride < rowBytes) live |= 1u << u;
  while (mOwn) {
    const uint8_t* src[kReduceGroup];
    int wl[kReduceGroup];
#pragma unroll
    for (int q = 0; q < kReduceGroup; ++q) {
      wl[q] = -1;
      src[q] = rowsBase;
      if (mOwn) {
        const int k = lanemask_ffs(mOwn);
        mOwn &= mOwn - 1;
        const int row = gin_shfl_int(myRow, k);
        wl[q] = k;
        src[q] = rowsBase + (uint64_t)(row < 0 ? 0 : row) * rowBytes + off0;
      }
    }
    gin_u128 r[kReduceGroup][kTpUnroll];
#pragma unroll
    for (int q = 0; q < kReduceGroup; ++q)
#pragma unroll
      for (int u = 0; u < kTpUnroll; ++u) {
        r[q][u].lo = 0;
        r[q][u].hi = 0;
        if (wl[q] >= 0 && ((live >> u) & 1u)) {
          const uint8_t* a = src[q] + (uint64_t)u * stride;
          if (wide) r[q][u] = gin_ld16_stream(a);
          else r[q][u].lo = gin_ld8_stream(a);
        }
      }
#pragma unroll
    for (int q = 0; q < kReduceGroup; ++q) {
      if (wl[q] < 0) continue;  // warp-uniform
      const float wq = shfl_f(myW, wl[q]);
#pragma unroll
      for (int u = 0; u < kTpUnroll; ++u)
        if ((live >> u) & 1u) acc_bf16x8(acc[u], r[q][u], wq);
    }
  }
}

// Producer: lines [L0, L0 + kTpPassLines) of one slot's partial into the LL128 lines at `lines`
// (a peer's window), flag = call number n.
GIN_DEVICE_INLINE void tp_produce_pass(const uint8_t* rowsBase, uint64_t rowBytes, int myRow, float myW, int nk,
                                       uint8_t* lines, int nl, int L0, uint64_t flag, bool fast) {
  const int lane = (int)gin_lane_id(), g = lane >> 3, j = lane & 7;
  float acc[kTpUnroll][8];
#pragma unroll
  for (int u = 0; u < kTpUnroll; ++u)
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[u][i] = 0.f;
  tp_sum_own(acc, rowsBase, rowBytes, myRow, myW, nk, nl, L0, fast);
  syncwarp();  // the 8 lanes of a line converged: one store instruction per line
#pragma unroll
  for (int u = 0; u < kTpUnroll; ++u) {
    const int L = L0 + u * kTpGroups + g;
    const gin_u128 v = pack_bf16x8(acc[u]);
    gin_ll128_store16(L < nl, lines + (uint64_t)L * 128ull + 16ull * (uint64_t)j, v.lo, j < 7 ? v.hi : flag);
  }
}

// Consumer: lines [L0, L0 + kTpPassLines) of y[t] = own rows (lane k) + the partial lines of each
// remote rank (lane r: the slot's line base in our window, or null), in rank order, one rounding.
// Each line is polled until its flag is n (payload and flag from one read of the line). yRow null:
// the lines are waited for but nothing is stored (a token past the caller's y).
GIN_DEVICE_INLINE void tp_consume_pass(const uint8_t* rowsBase, uint64_t rowBytes, int myRow, float myW, int nk,
                                       const uint8_t* myLines, int nr, uint8_t* yRow, int nl, int L0, uint64_t flag,
                                       bool fast, uint32_t* errorFlags, bool first) {
  const int lane = (int)gin_lane_id(), g = lane >> 3, j = lane & 7;
  const bool wide = j < 7;
  float acc[kTpUnroll][8];
#pragma unroll
  for (int u = 0; u < kTpUnroll; ++u)
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[u][i] = 0.f;
  if (yRow != nullptr) tp_sum_own(acc, rowsBase, rowBytes, myRow, myW, nk, nl, L0, fast);
  lanemask_t mExt = (lanemask_t)moe_detail::ballot(lane < nr && myLines != nullptr);
  while (mExt) {
    const int r = lanemask_ffs(mExt);
    mExt &= mExt - 1;
    const uint8_t* base = shfl_ptr(myLines, r);
    uint64_t lo[kTpUnroll], hi[kTpUnroll];
    tp_wait_lines(base, nl, L0, flag, lo, hi, errorFlags);
    if (first) MOE_PROF(1, 1);  // thread 0: warp 0's first partial lines landed
    first = false;
#pragma unroll
    for (int u = 0; u < kTpUnroll; ++u) {
      gin_u128 v;
      v.lo = lo[u];
      v.hi = wide ? hi[u] : 0ull;
      if (L0 + u * kTpGroups + g < nl) acc_bf16x8(acc[u], v, 1.f);
    }
  }
  if (yRow == nullptr) return;
#pragma unroll
  for (int u = 0; u < kTpUnroll; ++u) {
    const int L = L0 + u * kTpGroups + g;
    if (L < nl) tp_store_chunk(yRow, tp_chunk_off(L, j, nl), wide, rowBytes, fast, pack_bf16x8(acc[u]));
  }
}

// The token-path combine (moe_gin_combine's body when moe_token_path(K, M, C)); see docs/kernels.md
// ("moe_gin_combine"). Call n = this block's counter + 1; partial lines go to buffer n % 2.
//  producer c: for each remote source r, the slots [lo, hi) of r's channel c (chanStartFrom), items
//    (slot, pass of kTpPassLines lines) cut into contiguous ranges per warp; a source with no slot
//    in this channel gets a hello word (n) instead, so that its consumer c still sees this call.
//  consumer c: tokens of channel c, items (token, pass) likewise; every line of every slot of the
//    channel is read (no late stores), and a remote rank with no slot here is waited for by its
//    hello word: every consumer block observes every remote producer's call n, which is what makes
//    the parity buffers safe to rewrite without a consumed flag (docs/kernels.md).
struct TpCombSmem {
  uint64_t bases[MOE_MAX_RANKS];
  int lo[MOE_MAX_RANKS], hi[MOE_MAX_RANKS], slots[MOE_MAX_RANKS];
  uint64_t seq;
  int dispatchT;
  // Parked per-block context (written before the prologue barrier, read where used): held in
  // registers beside a pass's 8 x 16-byte loads and 32 accumulators they spilled.
  const uint8_t* rowsBase;
  const float* recvWeights;
  const int* slotRows;
  const int* tokenPos;
  uint8_t* y;
  uint32_t* errorFlags;
  uint64_t rowBytes, lineStride, combRows, combProgress;
  int nl, PP, capacity, yRows;
  bool fast;
};

// Lane k < K: the recvX row of slot entry `entry`'s expert k (slotRows; -1 = none, out of range
// flags MOE_ERR_COUNTS) and its weight in wt, and this warp's passes [pass, lastPass] of the row
// into L2 now, so the loads of later row groups and passes hit L2. Producer and consumer call it
// once per slot / token they start.
GIN_DEVICE_INLINE int tp_entry_row(const TpCombSmem& s, int K, uint64_t entry, int pass, int lastPass, float& wt) {
  int row = -1;
  wt = 0.f;
  if ((int)gin_lane_id() < K) {
    row = s.slotRows[entry * K + gin_lane_id()];
    if (row >= s.capacity || row < -1) {
      gin_error_set(s.errorFlags, MOE_ERR_COUNTS);
      row = -1;
    }
    if (row >= 0) {
      wt = s.recvWeights[row];
      const int L1 = (lastPass + 1) * kTpPassLines < s.nl ? (lastPass + 1) * kTpPassLines : s.nl;
      tp_prefetch_lines(s.rowsBase + (uint64_t)row * s.rowBytes, s.rowBytes, s.nl, pass * kTpPassLines, L1, s.fast);
    }
  }
  return row;
}

// Not inlined on NVIDIA: inlined into moe_gin_combine beside the layout path, ptxas gave the
// kernel a 16-byte spill at the 128-register cap; as a call, neither has a stack frame. Inlined on
// AMD: as a call, gfx942 needs 76 bytes of scratch per lane; inlined, none (29 SGPR spills to VGPR lanes).
#if GIN_HIP
#define MOE_NOINLINE GIN_DEVICE_INLINE
#else
#define MOE_NOINLINE __device__ __noinline__
#endif
template <class Shape>
MOE_NOINLINE void combine_token_path(const uint16_t* expertOut, const float* recvWeights, int32_t numTokens,
                                     uint16_t* y, const uint64_t* peerBases, uint8_t* workspace,
                                     uint32_t* errorFlags, Dims d) {
  Shape::fix(d);  // the shape's constants inside the call as well (it is not inlined on NVIDIA)
  __shared__ TpCombSmem s;
  const int tid = (int)threadIdx.x;
  const int lane = (int)gin_lane_id(), warp = tid / GIN_WARP_SIZE;
  const bool producer = d.R > 1 && (int)blockIdx.x < d.C;  // alone, every block consumes (consumer_tokens)
  const int c = (int)blockIdx.x < d.C ? (int)blockIdx.x : (int)blockIdx.x - d.C;
  // Prologue: every load the block needs before its items, issued together by different
  // threads (peer bases, call counter, dispatch T, channel ranges), then one barrier, not
  // peerBases -> dispatch T -> counter and ranges -> write-after-read acquires -> barrier, four
  // dependent round trips (~2.5 us from entry to "start"); the token path has no acquire here.
  {
    const MoeWorkspaceLayout ws = moe_workspace_layout(d.R, d.E, d.K, d.M);
    uint64_t* state = state_of(workspace);
    if (tid < d.R) {
      s.bases[tid] = peerBases[tid];
    } else if (tid >= 16 && tid < 16 + d.R) {
      const int r = tid - 16;
      const int* cs = (const int*)(workspace + (producer ? ws.chanStartFrom : ws.chanStartTo)) + r * (MOE_MAX_CHANNELS + 1) + c;
      s.lo[r] = cs[0];
      s.hi[r] = cs[1];
      s.slots[r] = producer ? ((const int*)(workspace + ws.slotsFrom))[r] : d.M;
    } else if (tid == 32) {
      s.seq = state[MOE_STATE_SEQ_COMBINE + blockIdx.x] + 1;
      s.dispatchT = (int)state[MOE_STATE_DISPATCH_TOKENS];
    } else if (tid == 33) {
      const MoeWindowLayout wl = moe_window_layout(d.R, d.E, d.K, d.H, d.M);
      s.rowsBase = (const uint8_t*)expertOut;
      s.recvWeights = recvWeights;
      s.slotRows = (const int*)(workspace + ws.slotRows);
      s.tokenPos = (const int*)(workspace + ws.tokenPos);
      s.y = (uint8_t*)y;
      s.errorFlags = errorFlags;
      s.rowBytes = d.rowBytes;
      s.nl = (int)moe_comb_lines(d.H);
      s.lineStride = 128ull * (uint64_t)s.nl;
      s.PP = (s.nl + kTpPassLines - 1) / kTpPassLines;  // passes per row
      s.combRows = wl.combRows;
      s.combProgress = wl.combProgress;
      s.capacity = (int)moe_recv_capacity_rows(d.R, d.E, d.K, d.M);
      s.yRows = numTokens < 0 ? 0 : numTokens;
      s.fast = (d.rowBytes & 15u) == 0 && gin_is_aligned(expertOut, 16) && gin_is_aligned(y, 16);
    }
  }
  __syncthreads();
  bool ok = true;
  for (int p = 0; p < d.R; ++p) ok &= s.bases[p] != 0 && (s.bases[p] & 15u) == 0;
  if (!ok) {
    if (blockIdx.x == 0 && tid == 0) gin_error_set(errorFlags, GIN_ERR_NO_LSA_PATH);
    return;
  }
  {
    const int dispatchT = s.dispatchT;
    if (dispatchT != numTokens && blockIdx.x == 0 && tid == 0) gin_error_set(errorFlags, MOE_ERR_TOKENS);
    d.T = dispatchT < 0 ? 0 : (dispatchT > d.M ? d.M : dispatchT);
  }
  MOE_PROF(1, 0);

  const uint64_t P = (uint64_t)(d.R - 1);
  const int M = d.M;
  // Slots (producer) / tokens (consumer) of rank r in this channel; -1 = invalid range.
  auto count = [M](int r) -> int {
    const int S = s.slots[r], a = s.lo[r], b = s.hi[r];
    if (S < 0 || S > M || a < 0 || a > b || b > S) return -1;
    return b - a;
  };
  if (producer) {
    // ------------------------------------------------------------------ producer (expert side)
    int total = 0;
    for (int r = 0; r < d.R; ++r) {
      if (r == d.rank) continue;
      const int n = count(r);
      if (n < 0) {
        if (tid == 0) gin_error_set(s.errorFlags, MOE_ERR_COUNTS);
      } else {
        total += n * s.PP;
      }
    }
    if (tid < d.R && tid != d.rank && count(tid) == 0) {
      uint64_t* hello = (uint64_t*)((uint8_t*)s.bases[tid] + s.combProgress) +
                        ((uint64_t)moe_peer_section(d.rank, tid, d.R) * MOE_MAX_CHANNELS + c) * MOE_MAX_WARPS;
      gin_st_relaxed_sys(hello, s.seq);
    }
    const int i0 = (int)((int64_t)warp * total / MOE_WARPS), i1 = (int)((int64_t)(warp + 1) * total / MOE_WARPS);
    int curR = -1, curSlot = -1, row = -1;
    float wt = 0.f;
    uint8_t* lines = nullptr;
#pragma unroll 1
    for (int i = i0; i < i1; ++i) {
      const int PP = s.PP;
      int r = 0, k = i;
#pragma unroll 1
      for (; r < d.R; ++r) {
        if (r == d.rank) continue;
        const int n = count(r);
        if (n <= 0) continue;
        if (k < n * PP) break;
        k -= n * PP;
      }
      const int slot = s.lo[r] + k / PP, pass = k % PP;
      if (r != curR || slot != curSlot) {
        curR = r;
        curSlot = slot;
        const int lastPass = pass + (i1 - 1 - i) < PP - 1 ? pass + (i1 - 1 - i) : PP - 1;  // this warp's, of the row
        row = tp_entry_row(s, d.K, (uint64_t)r * d.M + (uint64_t)slot, pass, lastPass, wt);
        lines = (uint8_t*)s.bases[r] + s.combRows +
                (((s.seq & 1ull) * P + (uint64_t)moe_peer_section(d.rank, r, d.R)) * d.M + (uint64_t)slot) * s.lineStride;
      }
      tp_produce_pass(s.rowsBase, s.rowBytes, row, wt, d.K, lines, s.nl, pass * kTpPassLines, s.seq, s.fast);
    }
    MOE_PROF_SYNC();
    MOE_PROF(1, 1);
  } else {
    // ------------------------------------------------------------------ consumer (source side)
    int t0, t1;
    consumer_tokens(d, c, t0, t1);
    const int total = (t1 - t0) * s.PP;
    const int i0 = (int)((int64_t)warp * total / MOE_WARPS), i1 = (int)((int64_t)(warp + 1) * total / MOE_WARPS);
    int curT = -1, row = -1;
    float wt = 0.f;
    const uint8_t* myLines = nullptr;
#pragma unroll 1
    for (int i = i0; i < i1; ++i) {
      const int PP = s.PP;
      const int t = t0 + i / PP, pass = i % PP;
      if (t != curT) {
        curT = t;
        const int pos = lane < d.R ? s.tokenPos[(uint64_t)t * d.R + (uint64_t)lane] : -1;
        const int selfPos = gin_shfl_int(pos, d.rank);
        const int lastPass = pass + (i1 - 1 - i) < PP - 1 ? pass + (i1 - 1 - i) : PP - 1;
        row = -1;
        wt = 0.f;
        if (selfPos >= 0 && selfPos < d.M) row = tp_entry_row(s, d.K, (uint64_t)d.rank * d.M + (uint64_t)selfPos, pass, lastPass, wt);
        myLines = nullptr;
        if (lane < d.R && lane != d.rank && pos >= 0) {
          if (pos < s.lo[lane] || pos >= s.hi[lane]) {
            gin_error_set(s.errorFlags, MOE_ERR_COUNTS);
          } else {
            myLines = (const uint8_t*)s.bases[d.rank] + s.combRows +
                      (((s.seq & 1ull) * P + (uint64_t)moe_peer_section(lane, d.rank, d.R)) * d.M + (uint64_t)pos) *
                          s.lineStride;
          }
        }
      }
      uint8_t* yRow = t < s.yRows ? s.y + (uint64_t)t * s.rowBytes : nullptr;
      tp_consume_pass(s.rowsBase, s.rowBytes, row, wt, d.K, myLines, d.R, yRow, s.nl, pass * kTpPassLines, s.seq,
                      s.fast, s.errorFlags, warp == 0 && i == i0);
    }
    // A remote rank with no slot of this channel: its producer c's hello word of call n.
    if (tid < d.R && tid != d.rank && count(tid) == 0) {
      const uint64_t* hello = (const uint64_t*)((const uint8_t*)s.bases[d.rank] + s.combProgress) +
                              ((uint64_t)moe_peer_section(tid, d.rank, d.R) * MOE_MAX_CHANNELS + c) * MOE_MAX_WARPS;
      (void)gin_wait_geq(hello, s.seq, s.errorFlags);
    }
    MOE_PROF_SYNC();
    MOE_PROF(1, 2);
  }
  if (tid == 0) state_of(workspace)[MOE_STATE_SEQ_COMBINE + blockIdx.x] = s.seq;
}

// ================================================================================================
// moe_gin_combine and its token-path entries (body: gin_combine). Grid 2*C blocks of MOE_THREADS,
// same C as the dispatch whose results it uses.
//  producer c (blocks [0, C)), expert side: for each remote source s, the slots of s's channel c
//             (chanStartFrom): wait combConsumed[s][*] >= n-1 in its own window (s's consumers
//             finished reading our previous partials), then warp w reduces slots j = w, w+W, ...:
//             partial = sum_k w_k * expertOut[row_k] (fp32 -> bf16) into s's window, fence,
//             combProgress[rank][c][w] = (n << 32) | (slots done by w) in s's window.
//  alone (R = 1): no producer; every block is a consumer of part b of 2C of the tokens.
//  consumer c (blocks [C, 2C)), source side: tokens of channel c (same T and C as the dispatch):
//             y[t] = sum over own experts of w * expertOut[row] + sum over remote d of the partial
//             from d (after its producer warp's progress word), fp32 -> bf16; then
//             combConsumed[rank][c] = n into every remote rank's window.
// ================================================================================================
template <class Shape>
GIN_DEVICE_INLINE void gin_combine(const uint16_t* expertOut, const float* recvWeights, int32_t numTokens,
                                    uint16_t* y, const uint64_t* peerBases, uint8_t* workspace, uint32_t* errorFlags,
                                    int32_t rank, int32_t nRanks, int32_t numExperts, int32_t topK, int32_t hidden,
                                    int32_t maxTokens, int32_t numChannels) {
  __shared__ uint64_t sharedSeq;
  // Producer: [q] = the q-th remote source's slot count and channel range; consumer: [r] = rank r's.
  __shared__ int lo[MOE_MAX_RANKS], hi[MOE_MAX_RANKS], srcSlots[MOE_MAX_RANKS];
  __shared__ CombineCtx cxs[MOE_MAX_RANKS];
  gin_wait_prior_grids();  // launched with PDL: nothing below may run before the previous kernel is done
  MOE_PROF(1, 10);  // entry, before the prologue (write-after-read waits, ranges, load_seq)
  Dims d = make_dims(rank, nRanks, numExperts, topK, hidden, maxTokens, numChannels, numTokens);
  if (!launch_ok(d, 2, true, workspace, peerBases, errorFlags) || !shape_ok<Shape>(d, errorFlags)) return;
  if (expertOut == nullptr || recvWeights == nullptr || (y == nullptr && d.T > 0)) {
    if (blockIdx.x == 0 && threadIdx.x == 0) gin_error_set(errorFlags, MOE_ERR_CONFIG);
    return;
  }
  if (Shape::tokenPathOnly || moe_token_path(d.K, d.M, d.C)) {
    combine_token_path<Shape>(expertOut, recvWeights, numTokens, y, peerBases, workspace, errorFlags, d);
    return;
  }
  if (!peers_ok(peerBases, d.R, errorFlags)) return;
  uint64_t* state = state_of(workspace);
  // The token partition must be the dispatch's: use its T (y must have at least T rows).
  const int dispatchT = (int)state[MOE_STATE_DISPATCH_TOKENS];
  if (dispatchT != numTokens) {
    if (blockIdx.x == 0 && threadIdx.x == 0) gin_error_set(errorFlags, MOE_ERR_TOKENS);
  }
  d.T = dispatchT < 0 ? 0 : (dispatchT > d.M ? d.M : dispatchT);
  const int yRows = numTokens < 0 ? 0 : numTokens;

  const int tid = (int)threadIdx.x, B = (int)blockDim.x;
  const MoeWindowLayout wl = moe_window_layout(d.R, d.E, d.K, d.H, d.M);
  const MoeWorkspaceLayout ws = moe_workspace_layout(d.R, d.E, d.K, d.M);
  const int* slotRows = (const int*)(workspace + ws.slotRows);
  const int capacity = (int)moe_recv_capacity_rows(d.R, d.E, d.K, d.M);
  uint8_t* ownWin = (uint8_t*)peerBases[d.rank];
  const bool fast = (d.rowBytes & 15u) == 0 && gin_is_aligned(expertOut, 16) && gin_is_aligned(y, 16);
  // Channel boundaries into shared memory before load_seq's barrier (the same round trip
  // as the call counter instead of one more after it). Producer: source q's slot count and this
  // channel's slot range [a, b); consumer: this channel's slot range [lo, hi) at every rank.
  // Per-role context (cxs[q]: producer, the q-th remote source; cxs[0]: consumer) likewise.
  const bool producer = d.R > 1 && (int)blockIdx.x < d.C;  // alone, every block consumes (consumer_tokens)
  const int c = (int)blockIdx.x < d.C ? (int)blockIdx.x : (int)blockIdx.x - d.C;
  if (producer) {
    const int* slotsFrom = (const int*)(workspace + ws.slotsFrom);
    const int* chanStartFrom = (const int*)(workspace + ws.chanStartFrom);
    for (int q = 1 + tid; q < d.R; q += B) {
      const int src = (d.rank + 1 + (c + q - 1) % (d.R - 1)) % d.R;
      srcSlots[q] = slotsFrom[src];
      lo[q] = chanStartFrom[src * (MOE_MAX_CHANNELS + 1) + c];
      hi[q] = chanStartFrom[src * (MOE_MAX_CHANNELS + 1) + c + 1];
    }
  } else {
    const int* chanStartTo = (const int*)(workspace + ws.chanStartTo);
    for (int r = tid; r < d.R; r += B) {
      lo[r] = chanStartTo[r * (MOE_MAX_CHANNELS + 1) + c];
      hi[r] = chanStartTo[r * (MOE_MAX_CHANNELS + 1) + c + 1];
    }
  }
  for (int q = producer ? 1 + tid : tid; q < (producer ? d.R : 1); q += B) {
    CombineCtx& x = cxs[q];
    x.R = d.R;
    x.rank = d.rank;
    x.K = d.K;
    x.M = d.M;
    x.rowBytes = d.rowBytes;
    x.expertOut = (const uint8_t*)expertOut;
    x.recvWeights = recvWeights;
    x.slotRows = slotRows;
    x.capacity = capacity;
    x.fast = fast;
    x.errorFlags = errorFlags;
    x.tokenPos = (const int*)(workspace + ws.tokenPos);
    x.ownWin = ownWin;
    x.combRows = wl.combRows;
    x.rowStride = wl.rowStride;
    x.lo = lo;
    x.hi = hi;
    if (producer) {
      const int src = (d.rank + 1 + (c + q - 1) % (d.R - 1)) % d.R;
      uint8_t* peerWin = (uint8_t*)peerBases[src];
      const uint64_t sec = (uint64_t)moe_peer_section(d.rank, src, d.R);
      x.slotSrc = src;
      x.out = peerWin + wl.combRows + sec * d.M * wl.rowStride;
      x.outStride = wl.rowStride;
      x.progress = (uint64_t*)(peerWin + wl.combProgress) + (sec * MOE_MAX_CHANNELS + c) * MOE_MAX_WARPS;
    } else {
      x.slotSrc = d.rank;
      x.out = (uint8_t*)y;
      x.outStride = d.rowBytes;
      x.progress = (uint64_t*)(ownWin + wl.combProgress) + (uint64_t)c * MOE_MAX_WARPS;
    }
  }
  if (producer) {
    // WAR on every remote source's partial area: its C consumers finished reading our partials of
    // the previous call (n - 1 = this block's call counter, read by each waiting thread itself so
    // that the waits overlap load_seq). One acquire per flag, all in flight together (the last
    // threads: no prologue load of theirs is held back), then the barriers below; no warp
    // polls all C flags (3 dependent acquires per lane at C = 66) before its first store.
    const int n = (d.R - 1) * d.C;
    if (B - 1 - tid < n) {
      const uint64_t prev = *(volatile uint64_t*)(state + MOE_STATE_SEQ_COMBINE + blockIdx.x);
      for (int i = B - 1 - tid; i < n; i += B) {
        const int q = 1 + i / d.C, cc = i % d.C;
        const int src = (d.rank + 1 + (c + q - 1) % (d.R - 1)) % d.R;
        const uint64_t* consumed = (const uint64_t*)(ownWin + wl.combConsumed) +
                                   (uint64_t)moe_peer_section(src, d.rank, d.R) * MOE_MAX_CHANNELS + cc;
        (void)gin_wait_geq(consumed, prev, errorFlags);
      }
    }
  }
  const uint64_t seq = load_seq(state + MOE_STATE_SEQ_COMBINE + blockIdx.x, &sharedSeq);
  if (tid < MOE_MAX_RANKS) cxs[tid].seqHi = seq << 32;  // read only after the barrier below
  __syncthreads();  // the acquires above, then the barriers: every warp may store into the windows
  MOE_PROF(1, 0);

  if (producer) {
    // ------------------------------------------------------------------ producer (expert side)
    for (int q = 1; q < d.R; ++q) {
      const int S = srcSlots[q], a = lo[q], b = hi[q];
      if (S < 0 || S > d.M || a < 0 || a > b || b > S) {
        if (tid == 0) gin_error_set(errorFlags, MOE_ERR_COUNTS);
        continue;
      }
      if (a == b) continue;
      combine_items<false>(cxs[q], a, b - a, row_split(d.rowBytes, b - a));
    }
    MOE_PROF_SYNC();
    MOE_PROF(1, 1);
  } else {
    // ------------------------------------------------------------------ consumer (source side)
    int t0, t1;
    consumer_tokens(d, c, t0, t1);
    if (t1 > yRows) t1 = yRows;  // never write past the y the caller passed
    // Items (token, segment) over all warps, at least 2 segments per row: after a
    // token's partial lands, a warp has half a row left to reduce, not a whole one (the consumer's
    // tail behind the producers at 4096 tokens was ~50 us). Each producer's split follows from
    // its slot count (hi - lo).
    if (t1 > t0) combine_items<true>(cxs[0], t0, t1 - t0, row_split(d.rowBytes, t1 - t0, 2));
    __syncthreads();
    MOE_PROF(1, 2);
    if (tid < d.R && tid != d.rank) {
      uint64_t* f = (uint64_t*)((uint8_t*)peerBases[tid] + wl.combConsumed) +
                    (uint64_t)moe_peer_section(d.rank, tid, d.R) * MOE_MAX_CHANNELS + c;
      gin_st_release_sys(f, seq);
    }
  }
  if (tid == 0) state[MOE_STATE_SEQ_COMBINE + blockIdx.x] = seq;
}

// ================================================================================================
// Entry points. moe_gin_dispatch / moe_gin_combine run any accepted instance, either
// path. The token-path entries run only instances on the token path (moe_token_path; anything else
// gets MOE_ERR_CONFIG) and leave the layout path out: moe_gin_{dispatch,combine}_tp for any shape,
// ..._tp_r1 for any shape at one rank, and one pair per shape of MOE_TP_SHAPES, named
// ..._tp_r<R>_e<E>_k<K>_h<H>, for that shape only.
// The Java side takes the most specific entry the code object has (docs/kernels.md, "Entry points").
// All entries of an instance share its window and workspace protocol: any mix of them is valid.
// ================================================================================================
#define MOE_DISPATCH_PARAMS                                                                                    \
  const uint16_t *x, const int32_t *topkIdx, const float *topkWeights, int32_t numTokens, uint16_t *recvX,      \
      float *recvWeights, int32_t *recvCounts, const uint64_t *peerBases, uint8_t *workspace,                  \
      uint32_t *errorFlags, int32_t rank, int32_t nRanks, int32_t numExperts, int32_t topK, int32_t hidden,     \
      int32_t maxTokens, int32_t numChannels
#define MOE_DISPATCH_ARGS                                                                                      \
  x, topkIdx, topkWeights, numTokens, recvX, recvWeights, recvCounts, peerBases, workspace, errorFlags, rank,  \
      nRanks, numExperts, topK, hidden, maxTokens, numChannels
#define MOE_COMBINE_PARAMS                                                                                     \
  const uint16_t *expertOut, const float *recvWeights, int32_t numTokens, uint16_t *y,                         \
      const uint64_t *peerBases, uint8_t *workspace, uint32_t *errorFlags, int32_t rank, int32_t nRanks,       \
      int32_t numExperts, int32_t topK, int32_t hidden, int32_t maxTokens, int32_t numChannels
#define MOE_COMBINE_ARGS                                                                                       \
  expertOut, recvWeights, numTokens, y, peerBases, workspace, errorFlags, rank, nRanks, numExperts, topK,      \
      hidden, maxTokens, numChannels

GIN_KERNEL void __launch_bounds__(MOE_THREADS, 1) moe_gin_dispatch(MOE_DISPATCH_PARAMS) {
  gin_dispatch<MoeAnyShape>(MOE_DISPATCH_ARGS);
}
GIN_KERNEL void __launch_bounds__(MOE_THREADS, 1) moe_gin_combine(MOE_COMBINE_PARAMS) {
  gin_combine<MoeAnyShape>(MOE_COMBINE_ARGS);
}
GIN_KERNEL void __launch_bounds__(MOE_THREADS, 1) moe_gin_dispatch_tp(MOE_DISPATCH_PARAMS) {
  gin_dispatch<MoeShape<true, 0, 0, 0, 0>>(MOE_DISPATCH_ARGS);
}
GIN_KERNEL void __launch_bounds__(MOE_THREADS, 1) moe_gin_combine_tp(MOE_COMBINE_PARAMS) {
  gin_combine<MoeShape<true, 0, 0, 0, 0>>(MOE_COMBINE_ARGS);
}
// One rank alone, any model shape: with R = 1 a constant the remote parts fold away
// (one H200, 128 tokens, 8 back to back: dispatch / combine 13.2-14.0 / 11.0 -> 12.5-13.0 / 10.6 us
// for DeepSeek-V3, 8.6 / 6.2 -> 8.1 / 5.7 for Mixtral, against moe_gin_dispatch_tp / _combine_tp).
GIN_KERNEL void __launch_bounds__(MOE_THREADS, 1) moe_gin_dispatch_tp_r1(MOE_DISPATCH_PARAMS) {
  gin_dispatch<MoeShape<true, 1, 0, 0, 0>>(MOE_DISPATCH_ARGS);
}
GIN_KERNEL void __launch_bounds__(MOE_THREADS, 1) moe_gin_combine_tp_r1(MOE_COMBINE_PARAMS) {
  gin_combine<MoeShape<true, 1, 0, 0, 0>>(MOE_COMBINE_ARGS);
}
#define MOE_TP_ENTRIES(R, E, K, H)                                                                      \
  GIN_KERNEL void __launch_bounds__(MOE_THREADS, 1) moe_gin_dispatch_tp_r##R##_e##E##_k##K##_h##H(      \
      MOE_DISPATCH_PARAMS) {                                                                            \
    gin_dispatch<MoeShape<true, R, E, K, H>>(MOE_DISPATCH_ARGS);                                        \
  }                                                                                                     \
  GIN_KERNEL void __launch_bounds__(MOE_THREADS, 1) moe_gin_combine_tp_r##R##_e##E##_k##K##_h##H(       \
      MOE_COMBINE_PARAMS) {                                                                             \
    gin_combine<MoeShape<true, R, E, K, H>>(MOE_COMBINE_ARGS);                                          \
  }
MOE_TP_SHAPES(MOE_TP_ENTRIES)

// fp8 dispatch: the same kernels moving scaled fp8 rows (moe_fp8_row_bytes(hidden)
// bytes each; recvX holds such rows, H % 16 == 0, else MOE_ERR_CONFIG), with one more argument,
// xq: null = x holds fp8 rows already; else x holds bf16 rows [T][H] and the kernel
// quantizes them into xq ([maxTokens][moe_fp8_row_bytes(hidden)] scratch, as moe_fp8_quantize
// would; x, xq and recvX 16-byte aligned, else MOE_ERR_CONFIG) before sending them. The combine of
// an fp8 dispatch is the bf16 one (expert outputs are bf16), any of the entries above.
#define MOE_DISPATCH_FP8_PARAMS MOE_DISPATCH_PARAMS, uint8_t *xq
#define MOE_DISPATCH_FP8_ARGS MOE_DISPATCH_ARGS, xq
GIN_KERNEL void __launch_bounds__(MOE_THREADS, 1) moe_gin_dispatch_fp8(MOE_DISPATCH_FP8_PARAMS) {
  gin_dispatch<MoeShape<false, 0, 0, 0, 0, true>>(MOE_DISPATCH_FP8_ARGS);
}
GIN_KERNEL void __launch_bounds__(MOE_THREADS, 1) moe_gin_dispatch_fp8_tp(MOE_DISPATCH_FP8_PARAMS) {
  gin_dispatch<MoeShape<true, 0, 0, 0, 0, true>>(MOE_DISPATCH_FP8_ARGS);
}
GIN_KERNEL void __launch_bounds__(MOE_THREADS, 1) moe_gin_dispatch_fp8_tp_r1(MOE_DISPATCH_FP8_PARAMS) {
  gin_dispatch<MoeShape<true, 1, 0, 0, 0, true>>(MOE_DISPATCH_FP8_ARGS);
}
// The shapes whose models ship fp8 checkpoints (DeepSeek-V3, Qwen3-30B-A3B) get fp8 token-path
// entries of their own (Qwen3, 2 ranks on one H200, 128 tokens, gated: 15.3 us against 18.5 through
// moe_gin_dispatch_fp8_tp); each entry adds ~0.1 MB of code per architecture to the jar.
#define MOE_TP_FP8_SHAPES(X)                                       \
  X(2, 256, 8, 7168) X(4, 256, 8, 7168) X(8, 256, 8, 7168)         \
  X(2, 128, 8, 2048) X(4, 128, 8, 2048) X(8, 128, 8, 2048)
#define MOE_TP_FP8_ENTRIES(R, E, K, H)                                                                  \
  GIN_KERNEL void __launch_bounds__(MOE_THREADS, 1) moe_gin_dispatch_fp8_tp_r##R##_e##E##_k##K##_h##H(  \
      MOE_DISPATCH_FP8_PARAMS) {                                                                        \
    gin_dispatch<MoeShape<true, R, E, K, H, true>>(MOE_DISPATCH_FP8_ARGS);                              \
  }
MOE_TP_FP8_SHAPES(MOE_TP_FP8_ENTRIES)

// ================================================================================================
// HOST backend: local kernels around the Java side's ncclAlltoAll / ncclSend / ncclRecv.
// ================================================================================================

// moe_host_layout: the routing layout (same positions as the GIN dispatch) plus expertOffset
// (exclusive scan of expertCount: send rows are ordered by global expert id, hence by destination
// rank, and by token within an expert) and rowsTo[d]. Grid C blocks of MOE_THREADS (C <= 128;
// block c waits only for blocks < c).
GIN_KERNEL void __launch_bounds__(MOE_THREADS, 1)
moe_host_layout(const int32_t* topkIdx, int32_t numTokens, uint8_t* workspace, uint32_t* errorFlags,
                int32_t nRanks, int32_t numExperts, int32_t topK, int32_t maxTokens, int32_t numChannels) {
  __shared__ __align__(16) LayoutSmem s;
  __shared__ uint64_t sharedSeq;
  const Dims d = make_dims(0, nRanks, numExperts, topK, 1, maxTokens, numChannels, numTokens);
  if (!launch_ok(d, 1, false, workspace, topkIdx, errorFlags)) return;
  if ((numTokens < 0 || numTokens > maxTokens) && blockIdx.x == 0 && threadIdx.x == 0)
    gin_error_set(errorFlags, MOE_ERR_TOKENS);
  const int tid = (int)threadIdx.x, B = (int)blockDim.x;
  const MoeWorkspaceLayout ws = moe_workspace_layout(d.R, d.E, d.K, d.M);
  uint64_t* state = state_of(workspace);
  const uint64_t seq = load_seq(state + MOE_STATE_SEQ_LAYOUT + blockIdx.x, &sharedSeq);
  const int c = (int)blockIdx.x;
  int t0, t1;
  token_range(d, c, t0, t1);
  int* histE = (int*)(workspace + ws.histE);
  int* histD = (int*)(workspace + ws.histD);
  // A HOST instance has its own workspace: the dispatch's HIST_READY words are free to use here.
  const bool direct = layout_is_direct(d);
  if (direct) {
    layout_direct(s, topkIdx, d, t0, t1, c == d.C - 1, errorFlags);
  } else {
    layout_histogram(s, topkIdx, d, t0, t1, histE + (uint64_t)c * d.E, histD + (uint64_t)c * d.R, errorFlags);
    publish_local(state + MOE_STATE_HIST_READY + c, (seq << 32) - 1);
    layout_prefix(s, d, c, histE, histD, state + MOE_STATE_HIST_READY, (seq << 32) - 1, errorFlags);
  }
  if (c == d.C - 1) {
    int* expertCount = (int*)(workspace + ws.expertCount);
    layout_lead_totals(s, d, direct ? nullptr : histD, expertCount, (int*)(workspace + ws.tokensTo),
                       (int*)(workspace + ws.chanStartTo));
    if (tid == 0) state[MOE_STATE_DISPATCH_TOKENS] = (uint64_t)d.T;
    for (int e = tid; e < d.E; e += B) s.cntE[e] += s.runE[e];  // totals; runE stays for step 3
    __syncthreads();
    const int total = block_exclusive_scan(s.cntE, d.E, s.scanTmp);
    int* expertOffset = (int*)(workspace + ws.expertOffset);
    int* rowsTo = (int*)(workspace + ws.rowsTo);
    for (int e = tid; e < d.E; e += B) expertOffset[e] = s.cntE[e];
    if (tid == 0) expertOffset[d.E] = total;
    for (int r = tid; r < d.R; r += B)
      rowsTo[r] = (r + 1 < d.R ? s.cntE[(r + 1) * d.L] : total) - s.cntE[r * d.L];
    __syncthreads();
  }
  layout_positions(s, topkIdx, d, t0, t1, (int*)(workspace + ws.slotInExpert), (int*)(workspace + ws.tokenPos),
                   (int*)(workspace + ws.sendList));
  if (tid == 0) state[MOE_STATE_SEQ_LAYOUT + blockIdx.x] = seq;
}

// HOST backend: the send-row position of token t's slot k (its expert's send offset + the token's
// slot in that expert), or -1 for a masked slot; an impossible position sets MOE_ERR_COUNTS.
GIN_DEVICE_INLINE int host_send_row(const int* slotInExpert, const int* expertOffset, const int32_t* topkIdx,
                                    const Dims& d, uint64_t t, int k, uint64_t capacity, uint32_t* errorFlags) {
  const int sl = slotInExpert[t * d.K + k];
  if (sl < 0) return -1;
  const int e = topkIdx[t * d.K + k];
  const int64_t p = (e >= 0 && e < d.E) ? (int64_t)expertOffset[e] + sl : -1;
  if (p >= 0 && (uint64_t)p < capacity) return (int)p;
  gin_error_set(errorFlags, MOE_ERR_COUNTS);
  return -1;
}

// moe_host_pack: sendRows[expertOffset[e] + slotInExpert[t][k]] = x[t], sendWeights[same] =
// topkWeights[t][k] for every non-masked (t, k). One warp per token; any grid, any block size that
// is a multiple of the warp size (<= 1024).
template <bool kFp8>
GIN_DEVICE_INLINE void host_pack(const uint16_t* x, const int32_t* topkIdx, const float* topkWeights, int32_t numTokens,
                                 const uint8_t* workspace, uint16_t* sendRows, float* sendWeights, uint32_t* errorFlags,
                                 int32_t nRanks, int32_t numExperts, int32_t topK, int32_t hidden, int32_t maxTokens) {
  Dims d = make_dims(0, nRanks, numExperts, topK, hidden, maxTokens, 1, numTokens);
  if (kFp8) d.rowBytes = moe_fp8_row_bytes(d.H);
  if (!moe_sizes_ok(d.R, d.E, d.K, d.H, d.M) || (kFp8 && !moe_fp8_hidden_ok(d.H)) || blockDim.x % GIN_WARP_SIZE != 0 || workspace == nullptr ||
      topkIdx == nullptr || topkWeights == nullptr || sendRows == nullptr || sendWeights == nullptr ||
      (x == nullptr && d.T > 0)) {
    if (blockIdx.x == 0 && threadIdx.x == 0) gin_error_set(errorFlags, MOE_ERR_CONFIG);
    return;
  }
  const MoeWorkspaceLayout ws = moe_workspace_layout(d.R, d.E, d.K, d.M);
  const int* slotInExpert = (const int*)(workspace + ws.slotInExpert);
  const int* expertOffset = (const int*)(workspace + ws.expertOffset);
  const int lane = (int)gin_lane_id();
  const uint64_t warpsTotal = (uint64_t)gridDim.x * (blockDim.x / GIN_WARP_SIZE);
  const uint64_t capacity = (uint64_t)d.M * (uint64_t)d.K;
  const bool fast = (d.rowBytes & 15u) == 0 && gin_is_aligned(x, 16) && gin_is_aligned(sendRows, 16);
  for (uint64_t t = (uint64_t)blockIdx.x * (blockDim.x / GIN_WARP_SIZE) + threadIdx.x / GIN_WARP_SIZE;
       t < (uint64_t)d.T; t += warpsTotal) {
    const int pos = lane < d.K ? host_send_row(slotInExpert, expertOffset, topkIdx, d, t, lane, capacity, errorFlags) : -1;
    if (pos >= 0) sendWeights[pos] = topkWeights[t * d.K + lane];
    warp_expand_row<false>((const uint8_t*)x + t * d.rowBytes, (uint8_t*)sendRows, d.rowBytes, pos, d.K, fast);
  }
}
#define MOE_HOST_PACK_PARAMS                                                                                   \
  const uint16_t *x, const int32_t *topkIdx, const float *topkWeights, int32_t numTokens, const uint8_t *workspace, \
      uint16_t *sendRows, float *sendWeights, uint32_t *errorFlags, int32_t nRanks, int32_t numExperts,         \
      int32_t topK, int32_t hidden, int32_t maxTokens
#define MOE_HOST_PACK_ARGS                                                                                     \
  x, topkIdx, topkWeights, numTokens, workspace, sendRows, sendWeights, errorFlags, nRanks, numExperts, topK,  \
      hidden, maxTokens
GIN_KERNEL void moe_host_pack(MOE_HOST_PACK_PARAMS) { host_pack<false>(MOE_HOST_PACK_ARGS); }
// Scaled fp8 rows (moe_fp8_row_bytes(hidden) bytes in x and sendRows); same arguments.
GIN_KERNEL void moe_host_pack_fp8(MOE_HOST_PACK_PARAMS) { host_pack<true>(MOE_HOST_PACK_ARGS); }

// Shared by permute / unpermute: received rows are ordered source-major (s, then local expert e,
// then token); recvX is expert-major (e, then s, then token). countMatrix[s][e] = rows from s for
// local expert e (device int32 [R][L], from the count exchange).
// kFp8: the rows are scaled fp8 rows (moe_fp8_row_bytes), not bf16.
template <bool kToExpertMajor, bool kFp8 = false>
GIN_DEVICE_INLINE void host_permute(const uint16_t* in, const float* inWeights, const int32_t* countMatrix,
                                    uint16_t* out, float* outWeights, int32_t* recvCounts, uint32_t* errorFlags,
                                    int nRanks, int numExperts, int topK, int hidden, int maxTokens) {
  __shared__ int cnt[MOE_MAX_EXPERTS], srcOff[MOE_MAX_EXPERTS], dstOff[MOE_MAX_EXPERTS];
  __shared__ int scanTmp[MOE_MAX_HOST_THREADS];
  __shared__ int totalRows;
  Dims d = make_dims(0, nRanks, numExperts, topK, hidden, maxTokens, 1, 0);
  if (kFp8) d.rowBytes = moe_fp8_row_bytes(d.H);
  if (!moe_sizes_ok(d.R, d.E, d.K, d.H, d.M) || (kFp8 && !moe_fp8_hidden_ok(d.H)) || blockDim.x % GIN_WARP_SIZE != 0 ||
      blockDim.x > MOE_MAX_HOST_THREADS || in == nullptr || out == nullptr || countMatrix == nullptr ||
      (kToExpertMajor && (inWeights == nullptr || outWeights == nullptr))) {
    if (blockIdx.x == 0 && threadIdx.x == 0) gin_error_set(errorFlags, MOE_ERR_CONFIG);
    return;
  }
  const int tid = (int)threadIdx.x, B = (int)blockDim.x, n = d.R * d.L;
  const int capacity = (int)moe_recv_capacity_rows(d.R, d.E, d.K, d.M);
  // Every block derives the same offsets; a bad matrix (negative, or more than fits) moves nothing.
  for (int i = tid; i < n; i += B) {
    const int v = countMatrix[i];
    cnt[i] = v;
    srcOff[i] = v;
  }
  if (tid == 0) totalRows = 0;
  __syncthreads();
  if (tid == 0) {
    int64_t sum = 0;
    bool bad = false;
    for (int i = 0; i < n; ++i) {
      if (cnt[i] < 0 || cnt[i] > d.M) bad = true;
      sum += cnt[i] < 0 ? 0 : cnt[i];
    }
    if (bad || sum > capacity) {
      if (blockIdx.x == 0) gin_error_set(errorFlags, MOE_ERR_COUNTS);
      totalRows = -1;
    }
  }
  __syncthreads();
  if (totalRows < 0) return;  // uniform: every thread of every block returns
  const int total = block_exclusive_scan(srcOff, n, scanTmp);  // source-major offsets
  // Expert-major: dstOff[s][e] = sum of all rows of experts < e + rows of (s' < s, e).
  for (int e = tid; e < d.L; e += B) {
    int tot = 0;
    for (int s = 0; s < d.R; ++s) tot += cnt[s * d.L + e];
    dstOff[e] = tot;  // scanned below (only the first L entries)
    if (kToExpertMajor && blockIdx.x == 0 && recvCounts != nullptr) recvCounts[e] = tot;
  }
  __syncthreads();
  block_exclusive_scan(dstOff, d.L, scanTmp);
  for (int e = tid; e < d.L; e += B) {
    int run = dstOff[e];
    for (int s = 0; s < d.R; ++s) {
      dstOff[s * d.L + e] = run;
      run += cnt[s * d.L + e];
    }
  }
  __syncthreads();
  const bool fast = (d.rowBytes & 15u) == 0 && gin_is_aligned(in, 16) && gin_is_aligned(out, 16);
  const int lane = (int)gin_lane_id();
  const uint64_t warpsTotal = (uint64_t)gridDim.x * (blockDim.x / GIN_WARP_SIZE);
  for (uint64_t j = (uint64_t)blockIdx.x * (blockDim.x / GIN_WARP_SIZE) + threadIdx.x / GIN_WARP_SIZE;
       j < (uint64_t)total; j += warpsTotal) {
    // Last (s, e) with srcOff <= j: entries with zero rows share the next one's offset.
    int lo = 0, hi = n - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) >> 1;
      if ((uint64_t)srcOff[mid] <= j) lo = mid;
      else hi = mid - 1;
    }
    const uint64_t dst = (uint64_t)dstOff[lo] + (j - (uint64_t)srcOff[lo]);
    const uint64_t from = kToExpertMajor ? j : dst;
    const uint64_t to = kToExpertMajor ? dst : j;
    warp_expand_row<false>((const uint8_t*)in + from * d.rowBytes, (uint8_t*)out, d.rowBytes,
                           lane == 0 ? (int)to : -1, 1, fast);
    if (kToExpertMajor && lane == 0) outWeights[to] = inWeights[from];
  }
}

// moe_host_permute: recvBuf (source-major, as received) -> recvX (expert-major), with weights;
// writes recvCounts[L]. Any grid, block size a multiple of the warp size (<= 1024).
GIN_KERNEL void moe_host_permute(const uint16_t* recvBuf, const float* recvBufWeights, const int32_t* countMatrix,
                                 uint16_t* recvX, float* recvWeights, int32_t* recvCounts, uint32_t* errorFlags,
                                 int32_t nRanks, int32_t numExperts, int32_t topK, int32_t hidden, int32_t maxTokens) {
  host_permute<true>(recvBuf, recvBufWeights, countMatrix, recvX, recvWeights, recvCounts, errorFlags, nRanks,
                     numExperts, topK, hidden, maxTokens);
}
// The same for scaled fp8 rows (moe_fp8_row_bytes(hidden) bytes in recvBuf and recvX).
GIN_KERNEL void moe_host_permute_fp8(const uint16_t* recvBuf, const float* recvBufWeights, const int32_t* countMatrix,
                                     uint16_t* recvX, float* recvWeights, int32_t* recvCounts, uint32_t* errorFlags,
                                     int32_t nRanks, int32_t numExperts, int32_t topK, int32_t hidden, int32_t maxTokens) {
  host_permute<true, true>(recvBuf, recvBufWeights, countMatrix, recvX, recvWeights, recvCounts, errorFlags, nRanks,
                           numExperts, topK, hidden, maxTokens);
}

// moe_host_unpermute: expertOut (expert-major) -> backBuf (source-major, ready to send back).
GIN_KERNEL void moe_host_unpermute(const uint16_t* expertOut, const int32_t* countMatrix, uint16_t* backBuf,
                                   uint32_t* errorFlags, int32_t nRanks, int32_t numExperts, int32_t topK,
                                   int32_t hidden, int32_t maxTokens) {
  host_permute<false>(expertOut, nullptr, countMatrix, backBuf, nullptr, nullptr, errorFlags, nRanks, numExperts,
                      topK, hidden, maxTokens);
}

// moe_host_combine: y[t] = sum_k topkWeights[t][k] * returned[expertOffset[e] + slotInExpert[t][k]]
// in fp32 (returned rows are in send-row order). One warp per token; any grid.
GIN_KERNEL void moe_host_combine(const uint16_t* returned, const int32_t* topkIdx, const float* topkWeights,
                                 int32_t numTokens, const uint8_t* workspace, uint16_t* y, uint32_t* errorFlags,
                                 int32_t nRanks, int32_t numExperts, int32_t topK, int32_t hidden, int32_t maxTokens) {
  const Dims d = make_dims(0, nRanks, numExperts, topK, hidden, maxTokens, 1, numTokens);
  if (!moe_sizes_ok(d.R, d.E, d.K, d.H, d.M) || blockDim.x % GIN_WARP_SIZE != 0 || workspace == nullptr ||
      topkIdx == nullptr || topkWeights == nullptr || (d.T > 0 && (returned == nullptr || y == nullptr))) {
    if (blockIdx.x == 0 && threadIdx.x == 0) gin_error_set(errorFlags, MOE_ERR_CONFIG);
    return;
  }
  const MoeWorkspaceLayout ws = moe_workspace_layout(d.R, d.E, d.K, d.M);
  const int* slotInExpert = (const int*)(workspace + ws.slotInExpert);
  const int* expertOffset = (const int*)(workspace + ws.expertOffset);
  const int lane = (int)gin_lane_id();
  const uint64_t warpsTotal = (uint64_t)gridDim.x * (blockDim.x / GIN_WARP_SIZE);
  const uint64_t capacity = (uint64_t)d.M * (uint64_t)d.K;
  const bool fast = (d.rowBytes & 15u) == 0 && gin_is_aligned(returned, 16) && gin_is_aligned(y, 16);
  for (uint64_t t = (uint64_t)blockIdx.x * (blockDim.x / GIN_WARP_SIZE) + threadIdx.x / GIN_WARP_SIZE;
       t < (uint64_t)d.T; t += warpsTotal) {
    const int pos = lane < d.K ? host_send_row(slotInExpert, expertOffset, topkIdx, d, t, lane, capacity, errorFlags) : -1;
    const float w = pos >= 0 ? topkWeights[t * d.K + lane] : 0.f;
    warp_reduce_row((const uint8_t*)returned, d.rowBytes, pos, w, d.K, (uint8_t*)y + t * d.rowBytes, fast);
  }
}

// ================================================================================================
// One f32 per received row back to its (token, k) at the token's rank: in training,
// the router weights' gradient dL/dw[t][k] = <dy[t], out(t, expert_k)>, one dot product per
// received row on the expert side. Both use the last dispatch's layouts (workspace); out of range
// row indices set MOE_ERR_COUNTS and give 0; masked slots give 0.
// moe_gin_row_values (GPU-initiated, one launch): grid C blocks of MOE_THREADS (C = the dispatch's
// channels; all blocks of all ranks resident together, as the dispatch's). Call n, block b:
//  expert side: for every rank s, slots [b*S/C, (b+1)*S/C) of the S = slotsFrom[s] slots s sent
//    here: v[j][k] = rowValues[slotRows[s][j][k]], 0 where that slot's k made no row here, stored
//    as the LL word (n << 32 | bits of v) into s's window at valRows[n % 2][this rank][j][k]: the
//    word proves itself, so no fence, no ready flag, no barrier across blocks (session
//    12 released a flag per block and every block waited for all R*C of them). Buffer n % 2 was
//    last read by s in call n - 2: first wait for valConsumed[s] >= n - 2 in our window, which s
//    stores at the start of its call n - 1 (its call n - 2 is complete then: a relaxed store, as
//    the dispatch's dispConsumed).
//  token side: tokens [b*T/C, (b+1)*T/C): g[t][k] = sum over the ranks r that token t went to
//    (j = tokenPos[t][r] >= 0) of valRows[n % 2][r][j][k], each polled until it carries n; one of
//    them made a row for slot k, the others stored 0.
// moe_host_row_values_in (HOST, after moe_host_unpermute of 4-byte rows and the rows' way back):
// g[t][k] = returned[expertOffset[e] + slotInExpert[t][k]].
// ================================================================================================
constexpr int kRowValuesBatch = 4;
GIN_KERNEL void __launch_bounds__(MOE_THREADS, 1)
    moe_gin_row_values(const float* rowValues, int32_t numTokens, float* g, const uint64_t* peerBases, uint8_t* workspace,
                       uint32_t* errorFlags, int32_t rank, int32_t nRanks, int32_t numExperts, int32_t topK,
                       int32_t hidden, int32_t maxTokens, int32_t numChannels) {
  __shared__ uint64_t sharedSeq;
  __shared__ int sharedSlots[MOE_MAX_RANKS];
  const int tid = (int)threadIdx.x, B = (int)blockDim.x, C = numChannels, b = (int)blockIdx.x;
  Dims d = make_dims(rank, nRanks, numExperts, topK, hidden, maxTokens, numChannels, numTokens);  // H: the window layout
  if (!launch_ok(d, 1, true, workspace, peerBases, errorFlags) || !peers_ok(peerBases, d.R, errorFlags)) return;
  if (rowValues == nullptr || (numTokens > 0 && g == nullptr)) {
    if (b == 0 && tid == 0) gin_error_set(errorFlags, MOE_ERR_CONFIG);
    return;
  }
  uint64_t* state = state_of(workspace);
  // The token partition is the dispatch's (tokenPos holds its T tokens); g gets numTokens rows. A
  // mismatch is reported but the call goes on: the other ranks wait for our values.
  const int dispatchT = (int)state[MOE_STATE_DISPATCH_TOKENS];
  if (dispatchT != numTokens && b == 0 && tid == 0) gin_error_set(errorFlags, MOE_ERR_TOKENS);
  d.T = dispatchT < 0 ? 0 : (dispatchT > d.M ? d.M : dispatchT);
  const int gRows = numTokens < 0 ? 0 : numTokens;
  const MoeWindowLayout wl = moe_window_layout(d.R, d.E, d.K, d.H, d.M);
  const MoeWorkspaceLayout ws = moe_workspace_layout(d.R, d.E, d.K, d.M);
  uint8_t* ownWin = (uint8_t*)peerBases[d.rank];
  const int* slotsFrom = (const int*)(workspace + ws.slotsFrom);
  // Prologue, one round trip: thread s < R reads the call counter, how many slots s sent here, and
  // waits until s's call n - 2 has read buffer n % 2; block 0 tells every rank that our call n - 1
  // has read its values (it is complete).
  if (tid < d.R) {
    const uint64_t n = state[MOE_STATE_SEQ_ROW_VALUES + b] + 1;
    if (tid == 0) sharedSeq = n;
    const int S = slotsFrom[tid];
    sharedSlots[tid] = S < 0 ? 0 : (S > d.M ? d.M : S);
    if (b == 0) gin_st_relaxed_sys((uint64_t*)((uint8_t*)peerBases[tid] + wl.valConsumed) + d.rank, n - 1);
    if (n >= 2) (void)gin_wait_geq((const uint64_t*)(ownWin + wl.valConsumed) + tid, n - 2, errorFlags);
  }
  __syncthreads();
  const uint64_t seq = sharedSeq, tag = seq << 32;
  const uint64_t perRank = (uint64_t)d.M * (uint64_t)d.K, parity = seq & 1ull;

  // Expert side. kRowValuesBatch items per thread in flight: each loop's loads all issued before
  // its stores (the LL stores are asm volatile with a memory clobber, which the compiler does not
  // move loads across: one item at a time was two dependent round trips per item).
  const int* slotRows = (const int*)(workspace + ws.slotRows);
  const uint64_t capacity = moe_recv_capacity_rows(d.R, d.E, d.K, d.M);
  for (int s = 0; s < d.R; ++s) {
    const int S = sharedSlots[s];
    const uint64_t end = (uint64_t)((int64_t)(b + 1) * S / C) * (uint64_t)d.K;
    uint64_t* dst = (uint64_t*)((uint8_t*)peerBases[s] + wl.valRows) + (parity * (uint64_t)d.R + (uint64_t)d.rank) * perRank;
    const int* rows = slotRows + (uint64_t)s * perRank;
    for (uint64_t i0 = (uint64_t)((int64_t)b * S / C) * (uint64_t)d.K + (uint64_t)tid; i0 < end; i0 += kRowValuesBatch * (uint64_t)B) {
      int row[kRowValuesBatch];
      float v[kRowValuesBatch];
#pragma unroll
      for (int u = 0; u < kRowValuesBatch; ++u) {
        const uint64_t i = i0 + (uint64_t)u * B;
        row[u] = i < end ? rows[i] : -1;
      }
#pragma unroll
      for (int u = 0; u < kRowValuesBatch; ++u) {
        v[u] = 0.f;
        if (row[u] >= 0 && (uint64_t)row[u] < capacity) v[u] = rowValues[row[u]];
        else if (row[u] >= 0) gin_error_set(errorFlags, MOE_ERR_COUNTS);
      }
#pragma unroll
      for (int u = 0; u < kRowValuesBatch; ++u) {
        const uint64_t i = i0 + (uint64_t)u * B;
        if (i < end) gin_st_relaxed_sys(dst + i, tag | (uint64_t)__float_as_uint(v[u]));
      }
    }
  }

  // Token side: per item the R positions, then the R words, each group of loads in flight together;
  // only a word that has not landed yet is polled.
  const int* tokenPos = (const int*)(workspace + ws.tokenPos);
  const uint64_t* vals = (const uint64_t*)(ownWin + wl.valRows) + parity * (uint64_t)d.R * perRank;
  int t0, t1;
  token_range(d, b, t0, t1);
  if (t1 > gRows) t1 = gRows;
  for (uint64_t i = (uint64_t)t0 * d.K + tid; i < (uint64_t)(t1 > t0 ? t1 : t0) * d.K; i += (uint64_t)B) {
    const uint64_t t = i / (uint64_t)d.K, k = i - t * (uint64_t)d.K;
    float v = 0.f;
    for (int r0 = 0; r0 < d.R; r0 += kRowValuesBatch) {
      int j[kRowValuesBatch];
      uint64_t w[kRowValuesBatch];
#pragma unroll
      for (int u = 0; u < kRowValuesBatch; ++u) {
        j[u] = r0 + u < d.R ? tokenPos[t * (uint64_t)d.R + (uint64_t)(r0 + u)] : -1;
        if (j[u] >= d.M) {
          gin_error_set(errorFlags, MOE_ERR_COUNTS);
          j[u] = -1;
        }
      }
#pragma unroll
      for (int u = 0; u < kRowValuesBatch; ++u)
        w[u] = j[u] >= 0 ? gin_ld_relaxed_sys(vals + (uint64_t)(r0 + u) * perRank + (uint64_t)j[u] * d.K + k) : 0;
#pragma unroll
      for (int u = 0; u < kRowValuesBatch; ++u) {
        if (j[u] < 0) continue;
        int bits = (int)(uint32_t)w[u];
        if (ll_tag_ok(w[u], seq) ||
            ll_table_get(vals + (uint64_t)(r0 + u) * perRank + (uint64_t)j[u] * d.K + k, seq, true, errorFlags, bits))
          v += __int_as_float(bits);
      }
    }
    g[i] = v;
  }
  // The prologue's barrier: every thread of this block has read the counter.
  if (tid == 0) state[MOE_STATE_SEQ_ROW_VALUES + b] = seq;
}

GIN_KERNEL void moe_host_row_values_in(const float* returned, const int32_t* topkIdx, int32_t numTokens,
                                       const uint8_t* workspace, float* g, uint32_t* errorFlags, int32_t nRanks,
                                       int32_t numExperts, int32_t topK, int32_t maxTokens) {
  const Dims d = make_dims(0, nRanks, numExperts, topK, 1, maxTokens, 1, numTokens);
  if (!moe_sizes_ok(d.R, d.E, d.K, d.H, d.M) || numTokens < 0 || numTokens > maxTokens || workspace == nullptr ||
      (numTokens > 0 && (returned == nullptr || topkIdx == nullptr || g == nullptr))) {
    if (blockIdx.x == 0 && threadIdx.x == 0) gin_error_set(errorFlags, MOE_ERR_CONFIG);
    return;
  }
  const MoeWorkspaceLayout ws = moe_workspace_layout(d.R, d.E, d.K, d.M);
  const int* slotInExpert = (const int*)(workspace + ws.slotInExpert);
  const int* expertOffset = (const int*)(workspace + ws.expertOffset);
  const uint64_t capacity = (uint64_t)d.M * (uint64_t)d.K, n = (uint64_t)numTokens * (uint64_t)d.K;
  for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x) {
    const uint64_t t = i / (uint64_t)d.K;
    const int pos = host_send_row(slotInExpert, expertOffset, topkIdx, d, t, (int)(i - t * (uint64_t)d.K), capacity, errorFlags);
    g[i] = pos >= 0 ? returned[pos] : 0.f;
  }
}

// ================================================================================================
// moe_fp8_quantize: bf16 rows -> scaled fp8 rows (fp8_quantize_tokens over the grid),
// the input of the fp8 dispatch entries when they do not quantize themselves. H % 16 == 0 (else
// MOE_ERR_CONFIG); x 16-byte and out 8-byte aligned (else MOE_ERR_CONFIG). Any grid, any block
// size that is a multiple of the warp size.
// ================================================================================================
GIN_KERNEL void moe_fp8_quantize(const uint16_t* x, int32_t numTokens, int32_t hidden, uint8_t* out, uint32_t* errorFlags) {
  if (numTokens < 0 || !moe_fp8_hidden_ok(hidden) || blockDim.x % GIN_WARP_SIZE != 0 ||
      (numTokens > 0 && (x == nullptr || out == nullptr)) || !gin_is_aligned(x, 16) || !gin_is_aligned(out, 8)) {
    if (blockIdx.x == 0 && threadIdx.x == 0) gin_error_set(errorFlags, MOE_ERR_CONFIG);
    return;
  }
  const uint64_t warpsPerBlock = blockDim.x / GIN_WARP_SIZE;
  moe_detail::fp8_quantize_tokens(x, hidden, out, 0, (uint64_t)numTokens,
                                  (uint64_t)blockIdx.x * warpsPerBlock + threadIdx.x / GIN_WARP_SIZE,
                                  (uint64_t)gridDim.x * warpsPerBlock);
}
