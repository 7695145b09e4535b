// gin-kernels-test: link=a2a
// a2a_test.cu - standalone correctness test and benchmark for the all-to-all kernels of a2a.cu.
//
// One process drives every GPU of the machine (N = cudaGetDeviceCount() >= 2), one symmetric
// window per GPU (cudaMalloc), peer access between all pairs, one stream per GPU; every "rank" is
// launched on its own stream without a host sync in between, so all ranks run concurrently.
// No NCCL, no MPI. gin-kernels/build --tests links it against src/a2a.cu compiled as the shipped
// code object is (same nvcc flags, sm_90), so the library kernels checked and timed are the ones
// shipped; the test-only variants below are instantiated here from the same protocol headers.
//
// Build: gin-kernels/build --tests   (bin/a2a_test)
// Run:   a2a_test            correctness, the timing table, then the large-size candidates
//        a2a_test --quick    skips the 256 MiB checks and timing sizes above 64 MiB
//        a2a_test --no-timing | --timing-only | --variants-only | --no-variants
// Exit status: 0 when every check passed, 1 on any mismatch, 2 on a CUDA error or bad setup.
//
// Sizes in the correctness part are bytes per peer (so odd sizes are possible); sizes in the
// timing table are bytes per rank (the whole send buffer, as nccl-tests counts them):
// algBw = bytes each rank sends / time, busBw = algBw * (N-1)/N.
#include "../src/a2a/entry_points.cuh"            // the shipped kernels (linked from the a2a object)
#include "../src/a2a/direct_copy_candidates.cuh"  // a2a_direct and the test-only remote copies
#include "../src/a2a/ll128.cuh"                   // a2a_ll128, for the unroll variants

#include <algorithm>
#include <cstddef>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

// ------------------------------------------------------------------------------------------------
// Errors and constants
// ------------------------------------------------------------------------------------------------
static void cuda_check(cudaError_t e, const char* what, const char* file, int line) {
  if (e != cudaSuccess) {
    fprintf(stderr, "%s:%d: %s failed: %s (%s)\n", file, line, what, cudaGetErrorName(e), cudaGetErrorString(e));
    exit(2);
  }
}
#define CK(x) cuda_check((x), #x, __FILE__, __LINE__)

constexpr int kMaxChunks = 128;                  // maxChunksPerPeer: layout of signals and counters
constexpr uint64_t kLlCapacity = 2ull << 20;     // payload bytes per peer the LL staging holds
constexpr uint64_t kLl128Capacity = 16ull << 20; // payload bytes per peer the LL128 staging holds
constexpr uint64_t kGuard = 256;                 // poisoned bytes checked after each slot's data
constexpr uint64_t kSendSlack = 64;              // room for misaligned send pointers
constexpr uint64_t kGranule = 4096;

// Test-only variants of gin_a2a (same arguments, same protocol; docs/kernels.md, "Design choices
// and what they rest on"), timed next to it and not used by Java:
//   A2A_U4 / A2A_U16  4 / 16 loads in flight per thread (the library uses GIN_COPY_UNROLL = 8)
//   A2A_HINT          remote copy with L1::no_allocate + L2 evict_first hints on loads and stores
//   A2A_SELF4         self slot copied by chunks/4 blocks of its group (the rest exit at once)
//   A2A_NOSELF        diagnostic: no self copy at all (pure NVLink time; self slot NOT written)
//   A2A_TMA4 / TMA8   remote copy by TMA bulk copies through shared memory, 4 x 32 KiB / 8 x 8 KiB
//   A2A_LL128_U4 / U8 gin_a2a_ll128 with 4 / 8 warp stores per round per warp (library: 2, the fastest on 2x H200)
enum Kind {
  A2A = 0, A2AV = 1, A2A_LL = 2, A2AV_LL = 3, A2A_U4 = 4, A2A_U16 = 5,
  A2A_HINT = 6, A2A_SELF4 = 7, A2A_NOSELF = 8, A2A_TMA4 = 9, A2A_TMA8 = 10,
  A2A_LL128 = 11, A2AV_LL128 = 12, A2A_LL128_U4 = 13, A2A_LL128_U8 = 14
};
static const char* kind_name(int k) {
  static const char* names[] = {"gin_a2a",       "gin_a2av",       "gin_a2a_ll",      "gin_a2av_ll",
                                "test_a2a_u4",   "test_a2a_u16",   "test_a2a_hint",   "test_a2a_self4",
                                "test_a2a_noself", "test_a2a_tma4", "test_a2a_tma8", "gin_a2a_ll128",
                                "gin_a2av_ll128", "test_a2a_ll128_u4", "test_a2a_ll128_u8"};
  return names[k];
}
// Test-only kernels (timed and checked, never a library configuration).
static bool is_variant(int k) { return (k >= A2A_U4 && k <= A2A_TMA8) || k >= A2A_LL128_U4; }
static bool is_tma(int k) { return k == A2A_TMA4 || k == A2A_TMA8; }

using TmaCopy4x32K = gin_a2a_detail::TmaCopy<4, 32768>;
using TmaCopy8x8K = gin_a2a_detail::TmaCopy<8, 8192>;

template <int kUnroll, class RemoteCopy, int kSelfDiv>
__global__ void __launch_bounds__(512) test_a2a_variant(const __grid_constant__ GinA2aArgs a) {
  gin_a2a_detail::a2a_direct<false, kUnroll, RemoteCopy, kSelfDiv>(a.send, 0, a.bytesPerPeer, nullptr, nullptr,
                                                                   a.peerBases, a.recvOffset, a.slotBytes, 0,
                                                                   a.signalOffset, a.seqState, a.rank, a.nranks,
                                                                   a.chunksPerPeer, a.maxChunksPerPeer, a.errorFlags);
}
// LL128 with 4 / 8 warp stores per round per warp instead of the library's GIN_LL128_UNROLL = 2
// (same protocol, staging and counters as gin_a2a_ll128, so they may share them).
template <int kUnroll>
__global__ void __launch_bounds__(GIN_A2A_LL128_MAX_THREADS) test_a2a_ll128_variant(const __grid_constant__ GinA2aStagedArgs a) {
  gin_a2a_detail::a2a_ll128<false, kUnroll>(a.send, 0, a.bytesPerPeer, nullptr, nullptr, a.peerBases, a.recvOffset,
                                            a.slotBytes, 0, a.stagingOffset, a.stagingCapacity, a.seqState, a.rank,
                                            a.nranks, a.chunksPerPeer, a.maxChunksPerPeer, a.errorFlags);
}
using KernelFn = void (*)(GinA2aArgs);
// The uniform direct kernel of a kind (gin_a2a or a variant); nullptr for the others.
static KernelFn direct_kernel_of(int k) {
  using gin_a2a_detail::HintedCopy;
  using gin_a2a_detail::VectorCopy;
  switch (k) {
    case A2A: return gin_a2a;
    case A2A_U4: return test_a2a_variant<4, VectorCopy<4>, 1>;
    case A2A_U16: return test_a2a_variant<16, VectorCopy<16>, 1>;
    case A2A_HINT: return test_a2a_variant<8, HintedCopy<8>, 1>;
    case A2A_SELF4: return test_a2a_variant<8, VectorCopy<8>, 4>;
    case A2A_NOSELF: return test_a2a_variant<8, VectorCopy<8>, 0>;
    case A2A_TMA4: return test_a2a_variant<8, TmaCopy4x32K, 1>;
    case A2A_TMA8: return test_a2a_variant<8, TmaCopy8x8K, 1>;
    default: return nullptr;
  }
}
// Dynamic shared memory a kind is launched with (the TMA rings; the kernels fall back to the
// vector copy if it were missing).
static uint32_t dyn_smem_of(int k) {
  return k == A2A_TMA4 ? TmaCopy4x32K::kSharedBytes : k == A2A_TMA8 ? TmaCopy8x8K::kSharedBytes : 0u;
}
__host__ __device__ inline bool is_ll(int k) { return k == A2A_LL || k == A2AV_LL; }
__host__ __device__ inline bool is_ll128(int k) {
  return k == A2A_LL128 || k == A2AV_LL128 || k == A2A_LL128_U4 || k == A2A_LL128_U8;
}
__host__ __device__ inline bool is_v(int k) { return k == A2AV || k == A2AV_LL || k == A2AV_LL128; }
static const char* protocol_name(int k) { return is_ll(k) ? "LL" : is_ll128(k) ? "LL128" : "direct"; }

// ------------------------------------------------------------------------------------------------
// Data: byte k of rank s's send buffer in a run with seed x is gen_byte(x, k). Shared by the device
// generator, the device verifier and the CPU oracle.
// ------------------------------------------------------------------------------------------------
__host__ __device__ inline uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
__host__ __device__ inline uint64_t gen_word(uint64_t seed, uint64_t w) { return mix64(w + seed * 0x100000001B3ull); }
__host__ __device__ inline uint8_t gen_byte(uint64_t seed, uint64_t k) {
  return (uint8_t)(gen_word(seed, k >> 3) >> ((k & 7) * 8));
}
__host__ __device__ inline uint64_t seed_of(uint64_t run, int rank) {
  return mix64(run * 0x2545F4914F6CDD1Dull + (uint64_t)rank * 0x9E3779B97F4A7C15ull + 0x5eedull);
}
// Device-generated all-to-all-v layout (back-to-back and graph runs): count from s to d, and its
// offset in s's send buffer (segments in peer order with 0..12-byte gaps, so offsets are odd).
__host__ __device__ inline uint64_t vcount(uint64_t seed, int s, int d, uint64_t maxCount) {
  uint64_t h = mix64(seed ^ ((uint64_t)s * 131 + (uint64_t)d * 7919 + 17));
  switch (h & 7) {
    case 0: return 0;
    case 1: return maxCount;
    // Small odd counts, but never above maxCount: the poisoned area (and the caller's count
    // tables) are sized from maxCount. (An unclamped h % 17 once made the verifier read guard
    // bytes nobody had poisoned: the 403 "mismatches" of the first back-to-back runs.)
    case 2: return h % 17 < maxCount ? h % 17 : maxCount;
    default: return (h >> 8) % (maxCount + 1);
  }
}
__host__ __device__ inline uint64_t vgap(uint64_t seed, int s, int d) {
  return (mix64(seed ^ ((uint64_t)s * 977 + (uint64_t)d * 31 + 5)) >> 40) % 13;
}
__host__ __device__ inline uint64_t voffset(uint64_t seed, int s, int d, uint64_t maxCount) {
  uint64_t off = 0;
  for (int e = 0; e < d; ++e) off += vcount(seed, s, e, maxCount) + vgap(seed, s, e);
  return off + vgap(seed, s, d);
}

// ------------------------------------------------------------------------------------------------
// Helper kernels
// ------------------------------------------------------------------------------------------------
__global__ void fill_kernel(uint8_t* dst, uint64_t n, uint64_t seed) {
  for (uint64_t k = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; k < n; k += (uint64_t)gridDim.x * blockDim.x)
    dst[k] = gen_byte(seed, k);
}

// Generator for device-driven runs: reads the run number from *runWord (so graph replays see fresh
// data), fills the send buffer and, for all-to-all-v, the count and offset tables.
__global__ void gen_kernel(uint8_t* send, int kind, uint64_t bpp, uint64_t maxCount, const uint64_t* runWord,
                           int phase, int me, int n, uint64_t* sendCounts, uint64_t* sendOffsets) {
  const uint64_t run = *runWord * 8 + phase;
  const uint64_t seed = seed_of(run, me);
  uint64_t total;
  if (is_v(kind)) {
    total = voffset(seed, me, n - 1, maxCount) + vcount(seed, me, n - 1, maxCount);
    if (blockIdx.x == 0 && threadIdx.x < (unsigned)n) {
      sendCounts[threadIdx.x] = vcount(seed, me, threadIdx.x, maxCount);
      sendOffsets[threadIdx.x] = voffset(seed, me, threadIdx.x, maxCount);
    }
  } else {
    total = (uint64_t)n * bpp;
  }
  for (uint64_t k = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; k < total; k += (uint64_t)gridDim.x * blockDim.x)
    send[k] = gen_byte(seed, k);
}

// Diagnostics of the device-verified runs (one per rank, device memory, zeroed before a run):
// per call index the number of bad bytes/counts and the errorFlags word seen right after the
// exchange, per (call, source) the first bad offset, and a log of the first kDiagLog bad
// bytes/counts with what was read and what was expected.
constexpr int kDiagCalls = 1024;   // call indices (back-to-back: iteration; graph: phase)
constexpr int kDiagSrcs = 8;       // sources tracked per call
constexpr int kDiagLog = 64;
constexpr uint64_t kCountOffset = ~0ull;  // FailRecord::offset of a recvCounts mismatch
struct FailRecord {
  uint32_t call;
  int32_t src;
  uint64_t run;     // run word (seeds) of the call
  uint64_t offset;  // byte offset in the slot (kCountOffset: the recvCounts entry)
  uint64_t got, want;
  uint64_t cnt;     // bytes expected in the slot
};
struct Diag {
  unsigned long long callBad[kDiagCalls];
  uint32_t callErr[kDiagCalls];
  unsigned long long firstBad[kDiagCalls][kDiagSrcs];  // ~0 = none
  uint32_t logCount;
  FailRecord log[kDiagLog];
};

__device__ void diag_note(Diag* diag, int call, int src, uint64_t run, uint64_t offset, uint64_t got, uint64_t want,
                          uint64_t cnt) {
  if (diag == nullptr) return;
  const int ci = call % kDiagCalls;
  if (src < kDiagSrcs) atomicMin(&diag->firstBad[ci][src], (unsigned long long)offset);
  uint32_t i = atomicAdd(&diag->logCount, 1u);
  if (i < kDiagLog) diag->log[i] = FailRecord{(uint32_t)call, src, run, offset, got, want, cnt};
}

// Device-side verifier for runs without host syncs: compares every received byte, the poisoned
// guard after each slot's data and (a2av) the received count; counts mismatches and checked bytes.
// With `diag`, also records where (see Diag); each thread logs only its first bad byte per source.
__global__ void verify_kernel(const uint8_t* window, uint64_t recvOffset, uint64_t slotBytes, uint64_t recvCountsOffset,
                              int kind, uint64_t bpp, uint64_t maxCount, uint64_t capacity, const uint64_t* runWord,
                              int phase, int me, int n, uint8_t poison, uint64_t guardMax,
                              unsigned long long* mismatches, unsigned long long* checked, Diag* diag, int callIndex,
                              const uint32_t* errorFlags) {
  const uint64_t run = *runWord * 8 + phase;
  unsigned long long bad = 0;
  if (diag != nullptr && blockIdx.x == 0 && threadIdx.x == 0)
    diag->callErr[callIndex % kDiagCalls] |= *(const volatile uint32_t*)errorFlags;
  for (int s = 0; s < n; ++s) {
    const uint64_t seed = seed_of(run, s);
    uint64_t cnt, off;
    if (is_v(kind)) {
      cnt = vcount(seed, s, me, maxCount);
      off = voffset(seed, s, me, maxCount);
    } else {
      cnt = bpp;
      off = (uint64_t)me * bpp;
    }
    if (cnt > capacity) cnt = capacity;
    const uint64_t guard = slotBytes - cnt < guardMax ? slotBytes - cnt : guardMax;
    if (blockIdx.x == 0 && threadIdx.x == 0) {
      if (is_v(kind)) {
        const uint64_t got = ((const uint64_t*)(window + recvCountsOffset))[s];
        if (got != cnt) {
          ++bad;
          diag_note(diag, callIndex, s, run, kCountOffset, got, cnt, cnt);
        }
      }
      atomicAdd(checked, (unsigned long long)(cnt + guard));
    }
    const uint8_t* slot = window + recvOffset + (uint64_t)s * slotBytes;
    bool logged = false;
    for (uint64_t k = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; k < cnt + guard;
         k += (uint64_t)gridDim.x * blockDim.x) {
      uint8_t want = k < cnt ? gen_byte(seed, off + k) : poison;
      if (slot[k] != want) {
        ++bad;
        if (!logged) diag_note(diag, callIndex, s, run, k, slot[k], want, cnt);
        logged = true;
      }
    }
  }
  if (bad) {
    atomicAdd(mismatches, bad);
    if (diag != nullptr) atomicAdd(&diag->callBad[callIndex % kDiagCalls], bad);
  }
}

__global__ void bump_kernel(uint64_t* runWord) { *runWord += 1; }

// Holds a stream until the host releases every GPU at once, so launch skew between GPUs does
// not show up as kernel time. Gives up after 10 s.
__global__ void gate_kernel(const volatile uint32_t* hostFlag, uint32_t value, uint32_t* timedOut) {
  uint64_t t0 = gin_clock_ns();
  while (*hostFlag < value) {
    if (gin_clock_ns() - t0 > 10000000000ull) {
      *timedOut = 1;
      break;
    }
  }
}

// ------------------------------------------------------------------------------------------------
// Setup: one "rank" per GPU
// ------------------------------------------------------------------------------------------------
struct Rank {
  int dev = 0;
  cudaStream_t stream = nullptr;
  uint8_t* window = nullptr;
  uint8_t* sendBase = nullptr;
  uint64_t* peerBases = nullptr;
  uint64_t* seqDirect = nullptr;
  uint64_t* seqLl = nullptr;
  uint64_t* seqLl128 = nullptr;
  uint32_t* errorFlags = nullptr;
  uint64_t* sendCounts = nullptr;
  uint64_t* sendOffsets = nullptr;
  uint64_t* runWord = nullptr;
  unsigned long long* mismatches = nullptr;  // [0] mismatches, [1] checked bytes
  Diag* diag = nullptr;                      // where the device-verified runs went wrong
  uint32_t* gateTimedOut = nullptr;
  cudaEvent_t ev0 = nullptr, ev1 = nullptr;
  int numSms = 0;
};

struct Layout {
  uint64_t slotBytes = 0;         // default receive slot (uniform tests)
  uint64_t recvOffset = 0;
  uint64_t recvCountsOffset = 0;  // nranks uint64
  uint64_t signalOffset = 0;
  uint64_t llOffset = 0;
  uint64_t ll128Offset = 0;       // 128-byte aligned (4096 here)
  uint64_t windowBytes = 0;
  uint64_t sendCap = 0;           // usable bytes of each send buffer (after the slack)
};

static int g_n = 0;
static std::vector<Rank> g_ranks;
static Layout g_layout;
static volatile uint32_t* g_hostGate = nullptr;
static uint32_t g_gateValue = 0;
static int g_passed = 0, g_failed = 0;

static uint64_t round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

static void setup(uint64_t maxBytesPerPeer) {
  CK(cudaGetDeviceCount(&g_n));
  if (g_n < 2) {
    fprintf(stderr, "a2a_test: needs at least 2 GPUs, found %d\n", g_n);
    exit(2);
  }
  g_ranks.resize(g_n);
  for (int i = 0; i < g_n; ++i) {
    for (int j = 0; j < g_n; ++j) {
      if (i == j) continue;
      int can = 0;
      CK(cudaDeviceCanAccessPeer(&can, i, j));
      if (!can) {
        fprintf(stderr, "a2a_test: GPU %d cannot access GPU %d (peer access is required for the LSA path)\n", i, j);
        exit(2);
      }
      CK(cudaSetDevice(i));
      cudaError_t e = cudaDeviceEnablePeerAccess(j, 0);
      if (e == cudaErrorPeerAccessAlreadyEnabled) (void)cudaGetLastError();
      else CK(e);
    }
  }
  Layout& L = g_layout;
  L.slotBytes = round_up(maxBytesPerPeer + kGuard, kGranule);
  L.recvOffset = 0;
  L.recvCountsOffset = round_up(L.recvOffset + (uint64_t)g_n * L.slotBytes, kGranule);
  L.signalOffset = round_up(L.recvCountsOffset + 8ull * g_n, kGranule);
  L.llOffset = round_up(L.signalOffset + gin_a2a_signal_bytes(g_n, kMaxChunks), kGranule);
  L.ll128Offset = round_up(L.llOffset + gin_a2a_ll_staging_bytes(g_n, kLlCapacity), kGranule);
  L.windowBytes = round_up(L.ll128Offset + gin_a2a_ll128_staging_bytes(g_n, kLl128Capacity), kGranule);
  L.sendCap = (uint64_t)g_n * maxBytesPerPeer + (2ull << 20);

  CK(cudaHostAlloc((void**)&g_hostGate, sizeof(uint32_t), cudaHostAllocMapped | cudaHostAllocPortable));
  *g_hostGate = 0;
  std::vector<uint64_t> bases(g_n);
  for (int r = 0; r < g_n; ++r) {
    Rank& R = g_ranks[r];
    R.dev = r;
    CK(cudaSetDevice(r));
    CK(cudaDeviceGetAttribute(&R.numSms, cudaDevAttrMultiProcessorCount, r));
    CK(cudaStreamCreateWithFlags(&R.stream, cudaStreamNonBlocking));
    CK(cudaMalloc(&R.window, L.windowBytes));
    CK(cudaMemset(R.window, 0, L.windowBytes));  // signals and staging start at 0 (= "no call yet")
    CK(cudaMalloc(&R.sendBase, L.sendCap + kSendSlack));
    CK(cudaMalloc(&R.peerBases, 8ull * g_n));
    CK(cudaMalloc(&R.seqDirect, 8ull * gin_a2a_seq_entries(g_n, kMaxChunks)));
    CK(cudaMalloc(&R.seqLl, 8ull * gin_a2a_seq_entries(g_n, kMaxChunks)));
    CK(cudaMemset(R.seqDirect, 0, 8ull * gin_a2a_seq_entries(g_n, kMaxChunks)));
    CK(cudaMemset(R.seqLl, 0, 8ull * gin_a2a_seq_entries(g_n, kMaxChunks)));
    CK(cudaMalloc(&R.seqLl128, 8ull * gin_a2a_seq_entries(g_n, kMaxChunks)));
    CK(cudaMemset(R.seqLl128, 0, 8ull * gin_a2a_seq_entries(g_n, kMaxChunks)));
    CK(cudaMalloc(&R.errorFlags, 4));
    CK(cudaMemset(R.errorFlags, 0, 4));
    CK(cudaMalloc(&R.sendCounts, 8ull * g_n));
    CK(cudaMalloc(&R.sendOffsets, 8ull * g_n));
    CK(cudaMalloc(&R.runWord, 8));
    CK(cudaMemset(R.runWord, 0, 8));
    CK(cudaMalloc(&R.mismatches, 16));
    CK(cudaMemset(R.mismatches, 0, 16));
    CK(cudaMalloc(&R.diag, sizeof(Diag)));
    CK(cudaMalloc(&R.gateTimedOut, 4));
    CK(cudaMemset(R.gateTimedOut, 0, 4));
    CK(cudaEventCreate(&R.ev0));
    CK(cudaEventCreate(&R.ev1));
    for (int k : {A2A_TMA4, A2A_TMA8})
      CK(cudaFuncSetAttribute((const void*)direct_kernel_of(k), cudaFuncAttributeMaxDynamicSharedMemorySize,
                              (int)dyn_smem_of(k)));
    bases[r] = (uint64_t)(uintptr_t)R.window;  // one process: the peer's pointer is valid here (UVA)
  }
  for (int r = 0; r < g_n; ++r) {
    CK(cudaSetDevice(r));
    CK(cudaMemcpy(g_ranks[r].peerBases, bases.data(), 8ull * g_n, cudaMemcpyHostToDevice));
    CK(cudaDeviceSynchronize());
  }
  printf("a2a_test: %d GPUs, window %.1f MiB per GPU (slot %.1f MiB, LL staging %.1f MiB, LL128 staging %.1f MiB, "
         "signals %llu B)\n", g_n, L.windowBytes / 1048576.0, L.slotBytes / 1048576.0,
         gin_a2a_ll_staging_bytes(g_n, kLlCapacity) / 1048576.0,
         gin_a2a_ll128_staging_bytes(g_n, kLl128Capacity) / 1048576.0,
         (unsigned long long)gin_a2a_signal_bytes(g_n, kMaxChunks));
}

static void sync_all() {
  for (int r = 0; r < g_n; ++r) {
    CK(cudaSetDevice(r));
    CK(cudaStreamSynchronize(g_ranks[r].stream));
  }
}

// ------------------------------------------------------------------------------------------------
// One call of a kernel on one rank
// ------------------------------------------------------------------------------------------------
struct Call {
  int kind = A2A;
  int chunks = 1;
  int threads = 256;
  uint64_t bpp = 0;          // uniform: bytes per peer
  int misalign = 0;          // send pointer = sendBase + misalign
  uint64_t slotBytes = 0;    // 0: the layout's default slot
  uint64_t sendBytes = 0;    // a2av: bytes the kernel may read from the send pointer (0: all of it)
};

static uint64_t slot_of(const Call& c) { return c.slotBytes ? c.slotBytes : g_layout.slotBytes; }
static uint64_t capacity_of(const Call& c) {
  uint64_t s = slot_of(c);
  return is_ll(c.kind) ? std::min(s, kLlCapacity) : is_ll128(c.kind) ? std::min(s, kLl128Capacity) : s;
}

static void launch(int r, const Call& c, cudaStream_t stream) {
  Rank& R = g_ranks[r];
  const Layout& L = g_layout;
  const uint8_t* send = R.sendBase + c.misalign;
  const uint64_t slot = slot_of(c);
  const uint64_t sendBytes = c.sendBytes ? c.sendBytes : L.sendCap + kSendSlack - c.misalign;
  dim3 grid(g_n * c.chunks), block(c.threads);
  // The kind's struct of abi/a2a.h, every field set.
  const GinA2aArgs u{send, c.bpp, R.peerBases, L.recvOffset, slot, L.signalOffset, R.seqDirect, r, g_n, c.chunks,
                     kMaxChunks, R.errorFlags};
  const GinA2avArgs v{send, sendBytes, R.sendCounts, R.sendOffsets, R.peerBases, L.recvOffset, slot,
                      L.recvCountsOffset, L.signalOffset, R.seqDirect, r, g_n, c.chunks, kMaxChunks, R.errorFlags};
  const GinA2aStagedArgs ul{send, c.bpp, R.peerBases, L.recvOffset, slot, L.llOffset, kLlCapacity, R.seqLl, r, g_n,
                            c.chunks, kMaxChunks, R.errorFlags};
  const GinA2avStagedArgs vl{send, sendBytes, R.sendCounts, R.sendOffsets, R.peerBases, L.recvOffset, slot,
                             L.recvCountsOffset, L.llOffset, kLlCapacity, R.seqLl, r, g_n, c.chunks, kMaxChunks,
                             R.errorFlags};
  const GinA2aStagedArgs u128{send, c.bpp, R.peerBases, L.recvOffset, slot, L.ll128Offset, kLl128Capacity, R.seqLl128,
                              r, g_n, c.chunks, kMaxChunks, R.errorFlags};
  const GinA2avStagedArgs v128{send, sendBytes, R.sendCounts, R.sendOffsets, R.peerBases, L.recvOffset, slot,
                               L.recvCountsOffset, L.ll128Offset, kLl128Capacity, R.seqLl128, r, g_n, c.chunks,
                               kMaxChunks, R.errorFlags};
  switch (c.kind) {
    case A2A: gin_a2a<<<grid, block, 0, stream>>>(u); break;
    case A2AV: gin_a2av<<<grid, block, 0, stream>>>(v); break;
    case A2A_LL: gin_a2a_ll<<<grid, block, 0, stream>>>(ul); break;
    case A2AV_LL: gin_a2av_ll<<<grid, block, 0, stream>>>(vl); break;
    case A2A_LL128: gin_a2a_ll128<<<grid, block, 0, stream>>>(u128); break;
    case A2A_LL128_U4:
    case A2A_LL128_U8:
      (c.kind == A2A_LL128_U4 ? test_a2a_ll128_variant<4> : test_a2a_ll128_variant<8>)<<<grid, block, 0, stream>>>(u128);
      break;
    case A2AV_LL128: gin_a2av_ll128<<<grid, block, 0, stream>>>(v128); break;
    default:  // test-only variants of gin_a2a: same arguments
      direct_kernel_of(c.kind)<<<grid, block, dyn_smem_of(c.kind), stream>>>(u);
      break;
  }
  CK(cudaGetLastError());
}

static std::string describe(const Call& c) {
  char b[160];
  snprintf(b, sizeof b, "%s chunks=%d threads=%d%s misalign=%d slot=%llu", kind_name(c.kind), c.chunks, c.threads,
           is_v(c.kind) ? "" : (" bpp=" + std::to_string(c.bpp)).c_str(), c.misalign,
           (unsigned long long)slot_of(c));
  return b;
}

// Every block of a call must be resident at once (blocks wait for their peer's counterpart).
static bool grid_fits(const Call& c) {
  int perSm = 0;
  const void* fn = c.kind == A2AV      ? (const void*)gin_a2av
                   : c.kind == A2A_LL  ? (const void*)gin_a2a_ll
                   : c.kind == A2AV_LL ? (const void*)gin_a2av_ll
                   : c.kind == A2A_LL128 ? (const void*)gin_a2a_ll128
                   : c.kind == A2AV_LL128 ? (const void*)gin_a2av_ll128
                   : c.kind == A2A_LL128_U4 ? (const void*)test_a2a_ll128_variant<4>
                   : c.kind == A2A_LL128_U8 ? (const void*)test_a2a_ll128_variant<8>
                                       : (const void*)direct_kernel_of(c.kind);
  CK(cudaSetDevice(0));
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&perSm, fn, c.threads, dyn_smem_of(c.kind)));
  return (uint64_t)perSm * g_ranks[0].numSms >= (uint64_t)g_n * c.chunks;
}

static void record(bool ok, const std::string& what) {
  if (ok) ++g_passed;
  else {
    ++g_failed;
    printf("FAIL %s\n", what.c_str());
  }
}

// ------------------------------------------------------------------------------------------------
// CPU oracle
// ------------------------------------------------------------------------------------------------
// Index of the first byte of got[0, count) that differs from gen_byte(seed, base + j), or of the
// first byte of got[count, count + guard) that is not the poison; UINT64_MAX when all match.
static uint64_t first_mismatch(const uint8_t* got, uint64_t count, uint64_t guard, uint64_t seed, uint64_t base,
                               uint8_t poison) {
  uint64_t j = 0;
  while (j < count) {
    uint64_t k = base + j;
    uint64_t w = gen_word(seed, k >> 3);
    uint64_t lim = std::min<uint64_t>(count - j, 8 - (k & 7));
    for (uint64_t t = 0; t < lim; ++t, ++j)
      if (got[j] != (uint8_t)(w >> (((k + t) & 7) * 8))) return j;
  }
  for (uint64_t t = 0; t < guard; ++t)
    if (got[count + t] != poison) return count + t;
  return UINT64_MAX;
}

struct Expect {
  std::vector<std::vector<uint64_t>> count;   // [dst][src] bytes that must arrive
  std::vector<std::vector<uint64_t>> base;    // [dst][src] offset of those bytes in src's data
  std::vector<uint64_t> seed;                 // [src]
  std::vector<uint32_t> errorBits;            // [rank] expected errorFlags
  bool checkCounts = false;
};

// Copies every slot (data + guard) and the counts back and compares them with the oracle.
static bool check_outputs(const Call& c, const Expect& e, uint8_t poison) {
  const uint64_t slot = slot_of(c);
  bool ok = true;
  std::vector<std::vector<uint8_t>> host(g_n * g_n);
  std::vector<uint32_t> flags(g_n);
  std::vector<std::vector<uint64_t>> counts(g_n, std::vector<uint64_t>(g_n));
  for (int d = 0; d < g_n; ++d) {
    CK(cudaSetDevice(d));
    for (int s = 0; s < g_n; ++s) {
      uint64_t guard = std::min(kGuard, slot - e.count[d][s]);
      auto& h = host[d * g_n + s];
      h.resize(e.count[d][s] + guard);
      if (!h.empty())
        CK(cudaMemcpy(h.data(), g_ranks[d].window + g_layout.recvOffset + (uint64_t)s * slot, h.size(),
                      cudaMemcpyDeviceToHost));
    }
    CK(cudaMemcpy(&flags[d], g_ranks[d].errorFlags, 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(counts[d].data(), g_ranks[d].window + g_layout.recvCountsOffset, 8ull * g_n, cudaMemcpyDeviceToHost));
  }
  std::vector<uint64_t> bad(g_n * g_n);
  std::vector<std::thread> workers;
  for (int i = 0; i < g_n * g_n; ++i)
    workers.emplace_back([&, i] {
      int d = i / g_n, s = i % g_n;
      bad[i] = first_mismatch(host[i].data(), e.count[d][s], host[i].size() - e.count[d][s], e.seed[s], e.base[d][s],
                              poison);
    });
  for (auto& w : workers) w.join();
  for (int d = 0; d < g_n; ++d) {
    for (int s = 0; s < g_n; ++s) {
      uint64_t j = bad[d * g_n + s];
      if (j != UINT64_MAX) {
        const uint8_t got = host[d * g_n + s][j];
        const bool inData = j < e.count[d][s];
        printf("  mismatch: rank %d, slot from %d, byte %llu of %llu (%s): got 0x%02x, want 0x%02x\n", d, s,
               (unsigned long long)j, (unsigned long long)e.count[d][s], inData ? "data" : "guard after data",
               got, inData ? gen_byte(e.seed[s], e.base[d][s] + j) : poison);
        ok = false;
      }
      if (e.checkCounts && counts[d][s] != e.count[d][s]) {
        printf("  count mismatch: rank %d, recvCounts[%d] = %llu, want %llu\n", d, s, (unsigned long long)counts[d][s],
               (unsigned long long)e.count[d][s]);
        ok = false;
      }
    }
    if (flags[d] != e.errorBits[d]) {
      printf("  errorFlags on rank %d = 0x%x, want 0x%x\n", d, flags[d], e.errorBits[d]);
      ok = false;
    }
  }
  return ok;
}

static uint64_t g_run = 1000;  // run number for host-driven checks (seeds)

// Poisons every receive slot and the counts, clears errorFlags, on every rank.
static uint8_t poison_all(uint64_t run) {
  uint8_t poison = (uint8_t)(0xA5 ^ (run * 29));
  for (int r = 0; r < g_n; ++r) {
    CK(cudaSetDevice(r));
    CK(cudaMemsetAsync(g_ranks[r].window + g_layout.recvOffset, poison, g_layout.recvCountsOffset + 8ull * g_n,
                       g_ranks[r].stream));
    CK(cudaMemsetAsync(g_ranks[r].errorFlags, 0, 4, g_ranks[r].stream));
  }
  return poison;
}

static void fill_send(int r, const Call& c, uint64_t nbytes, uint64_t seed) {
  CK(cudaSetDevice(r));
  if (nbytes)
    fill_kernel<<<std::min<uint64_t>(4096, (nbytes + 255) / 256), 256, 0, g_ranks[r].stream>>>(
        g_ranks[r].sendBase + c.misalign, nbytes, seed);
  CK(cudaGetLastError());
}

static void launch_all(const Call& c) {
  for (int r = 0; r < g_n; ++r) {
    CK(cudaSetDevice(r));
    launch(r, c, g_ranks[r].stream);
  }
}

// Uniform all-to-all: fresh data, poisoned outputs, every byte checked.
static void test_uniform(const Call& c) {
  const uint64_t run = ++g_run;
  Expect e;
  e.count.assign(g_n, std::vector<uint64_t>(g_n));
  e.base.assign(g_n, std::vector<uint64_t>(g_n));
  e.errorBits.assign(g_n, 0);
  for (int s = 0; s < g_n; ++s) e.seed.push_back(seed_of(run, s));
  uint64_t moved = std::min(c.bpp, capacity_of(c));
  for (int d = 0; d < g_n; ++d)
    for (int s = 0; s < g_n; ++s) {
      e.count[d][s] = moved;
      e.base[d][s] = (uint64_t)d * c.bpp;
    }
  if (moved < c.bpp)
    for (int r = 0; r < g_n; ++r) e.errorBits[r] = GIN_ERR_COUNT_CLAMPED;
  uint8_t poison = poison_all(run);
  for (int r = 0; r < g_n; ++r) fill_send(r, c, (uint64_t)g_n * c.bpp, e.seed[r]);
  sync_all();
  launch_all(c);
  sync_all();
  record(check_outputs(c, e, poison), describe(c));
}

// All-to-all-v with a host-chosen count matrix cnt[s][d], offsets off[s][d], send sizes sendBytes[s].
static void test_v(const Call& proto, const std::vector<std::vector<uint64_t>>& cnt,
                   const std::vector<std::vector<uint64_t>>& off, const std::vector<uint64_t>& sendBytes,
                   const std::string& scenario) {
  const uint64_t run = ++g_run;
  Expect e;
  e.checkCounts = true;
  e.count.assign(g_n, std::vector<uint64_t>(g_n));
  e.base.assign(g_n, std::vector<uint64_t>(g_n));
  e.errorBits.assign(g_n, 0);
  for (int s = 0; s < g_n; ++s) e.seed.push_back(seed_of(run, s));
  const uint64_t cap = capacity_of(proto);
  for (int s = 0; s < g_n; ++s)
    for (int d = 0; d < g_n; ++d) {
      uint64_t n = cnt[s][d], o = off[s][d];
      if (o > sendBytes[s]) {
        n = 0;
        o = 0;
        e.errorBits[s] |= GIN_ERR_SEND_RANGE;
      } else if (n > sendBytes[s] - o) {
        n = sendBytes[s] - o;
        e.errorBits[s] |= GIN_ERR_SEND_RANGE;
      }
      if (n > cap) {
        n = cap;
        e.errorBits[s] |= GIN_ERR_COUNT_CLAMPED;
      }
      e.count[d][s] = n;
      e.base[d][s] = o;
    }
  uint8_t poison = poison_all(run);
  for (int s = 0; s < g_n; ++s) {
    // The data really extends past sendBytes (so a kernel that ignored the bound would copy
    // plausible bytes), but only sendBytes may be read.
    uint64_t fillTo = sendBytes[s];
    for (int d = 0; d < g_n; ++d) fillTo = std::max(fillTo, std::min(off[s][d] + cnt[s][d], g_layout.sendCap));
    fill_send(s, proto, fillTo, e.seed[s]);
    CK(cudaSetDevice(s));
    CK(cudaMemcpyAsync(g_ranks[s].sendCounts, cnt[s].data(), 8ull * g_n, cudaMemcpyHostToDevice, g_ranks[s].stream));
    CK(cudaMemcpyAsync(g_ranks[s].sendOffsets, off[s].data(), 8ull * g_n, cudaMemcpyHostToDevice, g_ranks[s].stream));
  }
  sync_all();
  for (int s = 0; s < g_n; ++s) {
    Call c = proto;
    c.sendBytes = sendBytes[s];
    CK(cudaSetDevice(s));
    launch(s, c, g_ranks[s].stream);
  }
  sync_all();
  record(check_outputs(proto, e, poison), describe(proto) + " scenario=" + scenario);
}

// Simple deterministic host PRNG for scenarios.
struct Rng {
  uint64_t x;
  explicit Rng(uint64_t s) : x(s) {}
  uint64_t next() { return x = mix64(x); }
  uint64_t below(uint64_t n) { return n ? next() % n : 0; }
  double unit() { return (next() >> 11) * (1.0 / 9007199254740992.0); }
};

static void v_scenarios(const Call& proto, Rng& rng) {
  const uint64_t cap = capacity_of(proto);
  auto layout = [&](const std::vector<std::vector<uint64_t>>& cnt, std::vector<std::vector<uint64_t>>& off,
                    std::vector<uint64_t>& sendBytes) {
    off.assign(g_n, std::vector<uint64_t>(g_n));
    sendBytes.assign(g_n, 0);
    for (int s = 0; s < g_n; ++s) {
      // Segments in a shuffled peer order with odd gaps: offsets need not follow peer order.
      std::vector<int> order(g_n);
      for (int d = 0; d < g_n; ++d) order[d] = d;
      for (int d = g_n - 1; d > 0; --d) std::swap(order[d], order[rng.below(d + 1)]);
      uint64_t pos = rng.below(9);
      for (int d : order) {
        off[s][d] = pos;
        pos += cnt[s][d] + rng.below(13);
      }
      sendBytes[s] = pos;
    }
  };
  std::vector<std::vector<uint64_t>> cnt(g_n, std::vector<uint64_t>(g_n)), off;
  std::vector<uint64_t> sendBytes;
  // 1. random skewed counts, including zeros
  for (int s = 0; s < g_n; ++s)
    for (int d = 0; d < g_n; ++d) {
      double u = rng.unit();
      cnt[s][d] = rng.below(4) == 0 ? 0 : (uint64_t)(u * u * u * (double)cap);
    }
  layout(cnt, off, sendBytes);
  test_v(proto, cnt, off, sendBytes, "skewed");
  // 2. one peer takes everything (a different one per sender, self included)
  int taker = (int)rng.below(g_n);
  for (int s = 0; s < g_n; ++s)
    for (int d = 0; d < g_n; ++d) cnt[s][d] = d == (taker + s) % g_n ? cap : 0;
  layout(cnt, off, sendBytes);
  test_v(proto, cnt, off, sendBytes, "one-peer-takes-all");
  // 3. all zero
  for (auto& row : cnt) std::fill(row.begin(), row.end(), 0);
  layout(cnt, off, sendBytes);
  test_v(proto, cnt, off, sendBytes, "all-zero");
  // 4. an over-capacity count per sender: clamped to the slot, error bit 1
  for (int s = 0; s < g_n; ++s)
    for (int d = 0; d < g_n; ++d) cnt[s][d] = d == (s + 1) % g_n ? cap + 1 + rng.below(1000) : rng.below(cap / 3);
  layout(cnt, off, sendBytes);
  test_v(proto, cnt, off, sendBytes, "over-capacity");
  // 5. counts past the end of the send buffer: clamped to it, error bit 2
  for (int s = 0; s < g_n; ++s)
    for (int d = 0; d < g_n; ++d) cnt[s][d] = 1 + rng.below(cap / 4);
  layout(cnt, off, sendBytes);
  for (int s = 0; s < g_n; ++s) {
    uint64_t last = 0;
    for (int d = 0; d < g_n; ++d) last = std::max(last, off[s][d]);
    sendBytes[s] = last + 1;  // the last segment keeps one byte
  }
  off[0][g_n - 1] = sendBytes[0] + 100;  // and one offset lies beyond the buffer: count 0
  test_v(proto, cnt, off, sendBytes, "send-range");
}

// ------------------------------------------------------------------------------------------------
// Back-to-back runs without host syncs, and CUDA graph replays, verified on the device
// ------------------------------------------------------------------------------------------------
struct DevCall {
  Call call;
  uint64_t maxCount = 0;  // a2av: largest generated count
  int phase = 0;
};

// Enqueues poison -> generate -> exchange -> verify for one call on rank r; the verifier files
// what it finds under `callIndex` in the rank's Diag.
static void enqueue_checked_call(int r, const DevCall& dc, uint8_t poison, int callIndex) {
  Rank& R = g_ranks[r];
  const Call& c = dc.call;
  const uint64_t slot = slot_of(c);
  const uint64_t used = std::min(slot, (is_v(c.kind) ? dc.maxCount : c.bpp) + kGuard);
  for (int s = 0; s < g_n; ++s)
    CK(cudaMemsetAsync(R.window + g_layout.recvOffset + (uint64_t)s * slot, poison, used, R.stream));
  CK(cudaMemsetAsync(R.window + g_layout.recvCountsOffset, poison, 8ull * g_n, R.stream));
  gen_kernel<<<64, 256, 0, R.stream>>>(R.sendBase + c.misalign, c.kind, c.bpp, dc.maxCount, R.runWord, dc.phase, r,
                                       g_n, R.sendCounts, R.sendOffsets);
  CK(cudaGetLastError());
  launch(r, c, R.stream);
  verify_kernel<<<64, 256, 0, R.stream>>>(R.window, g_layout.recvOffset, slot, g_layout.recvCountsOffset, c.kind,
                                          c.bpp, dc.maxCount, capacity_of(c), R.runWord, dc.phase, r, g_n, poison, kGuard,
                                          R.mismatches, R.mismatches + 1, R.diag, callIndex, R.errorFlags);
  CK(cudaGetLastError());
}

// Bytes the verifier will check for this call (data + guard over all pairs). Also checks the
// test itself: every checked guard byte must lie in the area enqueue_checked_call poisoned.
static uint64_t expected_checked(const DevCall& dc, uint64_t runWord) {
  const Call& c = dc.call;
  const uint64_t slot = slot_of(c), cap = capacity_of(c);
  const uint64_t used = std::min(slot, (is_v(c.kind) ? dc.maxCount : c.bpp) + kGuard);
  uint64_t total = 0;
  for (int d = 0; d < g_n; ++d)
    for (int s = 0; s < g_n; ++s) {
      uint64_t cnt = is_v(c.kind) ? vcount(seed_of(runWord * 8 + dc.phase, s), s, d, dc.maxCount) : c.bpp;
      cnt = std::min(cnt, cap);
      const uint64_t guard = std::min(kGuard, slot - cnt);
      if (cnt + guard > used) {
        printf("  TEST BUG: %s maxCount=%llu: verifier checks %llu bytes of slot %d on rank %d, only %llu poisoned\n",
               describe(c).c_str(), (unsigned long long)dc.maxCount, (unsigned long long)(cnt + guard), s, d,
               (unsigned long long)used);
        ++g_failed;
      }
      total += cnt + guard;
    }
  return total;
}

static void reset_diag() {
  for (int r = 0; r < g_n; ++r) {
    CK(cudaSetDevice(r));
    CK(cudaMemset(g_ranks[r].diag, 0, sizeof(Diag)));
    CK(cudaMemset((char*)g_ranks[r].diag + offsetof(Diag, firstBad), 0xFF, sizeof(Diag::firstBad)));
  }
}

// Byte `k` of rank d's slot from s as call dc with run word `runWord` leaves it: data (0..255),
// or -1 where the call leaves the poisoned guard / untouched bytes.
static int expected_slot_byte(const DevCall& dc, uint64_t runWord, int d, int s, uint64_t k) {
  const uint64_t seed = seed_of(runWord * 8 + dc.phase, s);
  uint64_t cnt, off;
  if (is_v(dc.call.kind)) {
    cnt = vcount(seed, s, d, dc.maxCount);
    off = voffset(seed, s, d, dc.maxCount);
  } else {
    cnt = dc.call.bpp;
    off = (uint64_t)d * dc.call.bpp;
  }
  cnt = std::min(cnt, capacity_of(dc.call));
  return k < cnt ? gen_byte(seed, off + k) : -1;
}

// After a device-verified run: prints, per failing call, what ran (and what ran before it), bad
// bytes and errorFlags per rank, the first bad offset per source, then the logged bad bytes with a
// guess of where the byte came from (stale data of the previous call, the previous poison, data
// of the next call written too early, ...). `calls[i]` is the call filed under index i; calls
// run in index order (cyclic: graph replays, index 0 follows the last). `runWordOf(i, recordRun,
// delta)` gives the run word of the call `delta` (-1, 0, +1) steps from call i in stream order;
// `poisonOf(i)` the poison of call i.
template <typename RunWordOf, typename PoisonOf>
static void report_diag(const std::vector<DevCall>& calls, RunWordOf runWordOf, PoisonOf poisonOf, bool cyclic) {
  const int ncalls = (int)calls.size();
  std::vector<Diag> host(g_n);
  for (int r = 0; r < g_n; ++r) {
    CK(cudaSetDevice(r));
    CK(cudaMemcpy(&host[r], g_ranks[r].diag, sizeof(Diag), cudaMemcpyDeviceToHost));
  }
  auto prev = [&](int i) { return i > 0 ? i - 1 : (cyclic ? ncalls - 1 : -1); };
  auto next = [&](int i) { return i + 1 < ncalls ? i + 1 : (cyclic ? 0 : -1); };
  int shown = 0, failing = 0, firstErr = -1;
  for (int i = 0; i < std::min(ncalls, kDiagCalls); ++i) {
    bool bad = false;
    for (int r = 0; r < g_n; ++r) {
      bad |= host[r].callBad[i] != 0;
      if (host[r].callErr[i] && firstErr < 0) firstErr = i;
    }
    if (!bad) continue;
    ++failing;
    if (shown++ >= 12) continue;
    const DevCall& dc = calls[i];
    printf("  call %d: %s maxCount=%llu\n", i, describe(dc.call).c_str(), (unsigned long long)dc.maxCount);
    if (prev(i) >= 0)
      printf("    after call %d: %s maxCount=%llu\n", prev(i), describe(calls[prev(i)].call).c_str(),
             (unsigned long long)calls[prev(i)].maxCount);
    for (int r = 0; r < g_n; ++r) {
      printf("    rank %d: %llu bad, errorFlags after it 0x%x; first bad offset per source:", r, host[r].callBad[i],
             host[r].callErr[i]);
      for (int s = 0; s < std::min(g_n, kDiagSrcs); ++s) {
        unsigned long long o = host[r].firstBad[i][s];
        if (o == ~0ull) printf(" [%d] -", s);
        else if (o == kCountOffset) printf(" [%d] count", s);
        else printf(" [%d] %llu", s, o);
      }
      printf("\n");
    }
  }
  if (failing) printf("  %d call(s) with bad bytes/counts\n", failing);
  if (firstErr >= 0) {
    printf("  first call after which errorFlags were set: %d (%s)", firstErr, describe(calls[firstErr].call).c_str());
    if (prev(firstErr) >= 0) printf(", after call %d (%s)", prev(firstErr), describe(calls[prev(firstErr)].call).c_str());
    printf("\n");
  }
  for (int r = 0; r < g_n; ++r) {
    const uint32_t nlog = std::min<uint32_t>(host[r].logCount, kDiagLog);
    if (host[r].logCount) printf("  rank %d: %u bad bytes/counts logged (first %u):\n", r, host[r].logCount, nlog);
    for (uint32_t k = 0; k < nlog && k < 24; ++k) {
      const FailRecord& f = host[r].log[k];
      const int i = (int)f.call % kDiagCalls;
      if (i >= ncalls) continue;
      if (f.offset == kCountOffset) {
        printf("    call %u rank %d: recvCounts[%d] = %llu (0x%llx), want %llu\n", f.call, r, f.src,
               (unsigned long long)f.got, (unsigned long long)f.got, (unsigned long long)f.want);
        continue;
      }
      std::string from;
      const int pi = prev(i), ni = next(i);
      const uint8_t got = (uint8_t)f.got;
      if (got == poisonOf(i)) from = "this call's poison (byte never written)";
      else if (pi >= 0 && got == poisonOf(pi)) from = "poison of the previous call (poison overwritten? memset ran late?)";
      else if (pi >= 0 && expected_slot_byte(calls[pi], runWordOf(i, f.run, -1), r, f.src, f.offset) == got)
        from = "data of the previous call (stale)";
      else if (ni >= 0 && expected_slot_byte(calls[ni], runWordOf(i, f.run, +1), r, f.src, f.offset) == got)
        from = "data of the next call (written too early)";
      else if (got == 0) from = "zero";
      else from = "unexplained";
      printf("    call %u rank %d src %d byte %llu (%s, count %llu): got 0x%02x want 0x%02x  <- %s\n", f.call, r, f.src,
             (unsigned long long)f.offset, f.offset < f.cnt ? "data" : "guard", (unsigned long long)f.cnt, got,
             (unsigned)(uint8_t)f.want, from.c_str());
    }
  }
}

static bool read_device_results(const std::string& what, uint64_t wantChecked) {
  unsigned long long mism = 0, checked = 0;
  bool ok = true;
  for (int r = 0; r < g_n; ++r) {
    unsigned long long m[2];
    uint32_t flags = 0;
    CK(cudaSetDevice(r));
    CK(cudaMemcpy(m, g_ranks[r].mismatches, 16, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&flags, g_ranks[r].errorFlags, 4, cudaMemcpyDeviceToHost));
    mism += m[0];
    checked += m[1];
    if (flags) {
      printf("  %s: errorFlags on rank %d = 0x%x, want 0\n", what.c_str(), r, flags);
      ok = false;
    }
    CK(cudaMemset(g_ranks[r].mismatches, 0, 16));
  }
  if (mism) {
    printf("  %s: %llu mismatching bytes/counts\n", what.c_str(), mism);
    ok = false;
  }
  if (checked != wantChecked) {
    printf("  %s: verifier checked %llu bytes, want %llu (a verify kernel did not run?)\n", what.c_str(), checked,
           (unsigned long long)wantChecked);
    ok = false;
  }
  return ok;
}

static uint64_t read_run_word() {
  uint64_t w = 0;
  CK(cudaSetDevice(0));
  CK(cudaMemcpy(&w, g_ranks[0].runWord, 8, cudaMemcpyDeviceToHost));
  return w;
}

// 1000 calls in a row, no host sync: kinds, sizes, chunk counts and alignment change from call to
// call (same sequence on every rank), each call verified on the device by the next kernel in the
// stream, which is exactly the reader the write-after-read protection must respect.
// Mixed: all six library kernels (direct, LL, LL128; uniform and v) interleaved on one window.
// ll128Stress: only the LL128 kernels at 64 KiB-1 MiB per peer, where receivers poll lines while
// they arrive (a line seen with its flag but not its payload would show as stale bytes).
static void test_back_to_back(int iterations, uint64_t rngSeed, bool ll128Stress = false) {
  sync_all();
  for (int r = 0; r < g_n; ++r) {
    CK(cudaSetDevice(r));
    CK(cudaMemset(g_ranks[r].errorFlags, 0, 4));
    CK(cudaMemset(g_ranks[r].mismatches, 0, 16));
  }
  reset_diag();
  Rng rng(rngSeed);
  static const uint64_t mixedSizes[] = {0,    1,    3,    8,     17,    64,    119,   120,  121,
                                        241,  255,  1000, 4095,  4096,  12345, 65536, 65539, 131072};
  static const uint64_t stressSizes[] = {65536, 65539, 262144, 262147, 524288, 1000003, 1048576};
  static const int mixedKinds[] = {A2A, A2AV, A2A_LL, A2AV_LL, A2A_LL128, A2AV_LL128};
  static const int stressKinds[] = {A2A_LL128, A2AV_LL128};
  static const int mixedChunks[] = {1, 2, 3, 4, 8};
  static const int stressChunks[] = {1, 4, 8, 16, 32};
  static const int threadChoices[] = {64, 128, 256, 512};
  const uint64_t* sizes = ll128Stress ? stressSizes : mixedSizes;
  const uint64_t nsizes = ll128Stress ? sizeof stressSizes / 8 : sizeof mixedSizes / 8;
  const int* kinds = ll128Stress ? stressKinds : mixedKinds;
  const uint64_t nkinds = ll128Stress ? 2 : 6;
  const int* chunkChoices = ll128Stress ? stressChunks : mixedChunks;
  uint64_t run = read_run_word(), wantChecked = 0;
  std::vector<DevCall> calls;
  auto poisonOf = [](int it) { return (uint8_t)(0x3C + it); };
  auto t0 = std::chrono::steady_clock::now();
  for (int it = 0; it < iterations; ++it) {
    DevCall dc;
    dc.call.kind = kinds[rng.below(nkinds)];
    dc.call.chunks = chunkChoices[rng.below(5)];
    dc.call.threads = threadChoices[rng.below(4)];
    dc.call.bpp = sizes[rng.below(nsizes)];
    dc.call.misalign = (int)rng.below(4) * 3;
    // sometimes odd-sized, unaligned slots (stress: 1 MiB + 13, so every size fits)
    dc.call.slotBytes = rng.below(2) ? 0 : (ll128Stress ? (1ull << 20) + 13 : 131072 + 256 + 13);
    dc.maxCount = std::min<uint64_t>(sizes[rng.below(nsizes)], capacity_of(dc.call));
    dc.phase = 0;
    calls.push_back(dc);
    for (int r = 0; r < g_n; ++r) {
      CK(cudaSetDevice(r));
      enqueue_checked_call(r, dc, poisonOf(it), it);
      bump_kernel<<<1, 1, 0, g_ranks[r].stream>>>(g_ranks[r].runWord);
    }
    wantChecked += expected_checked(dc, run + it);
  }
  sync_all();
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  char what[128];
  snprintf(what, sizeof what, "%d back-to-back calls (%s, sequence %llu), %.1f ms", iterations,
           ll128Stress ? "LL128 stress, 64 KiB-1 MiB" : "mixed kinds/sizes/chunks", (unsigned long long)rngSeed, ms);
  bool ok = read_device_results(what, wantChecked);
  if (!ok)
    report_diag(
        calls, [&](int i, uint64_t, int delta) { return run + (uint64_t)(i + delta); }, poisonOf, false);
  record(ok, what);
  if (ok) printf("ok   %s\n", what);
}

// One graph per GPU capturing four verified calls (both protocols, uniform and v), replayed
// `replays` times; the generator reads the run number from device memory, so every replay
// moves fresh data.
static void test_graph(int replays) {
  sync_all();
  for (int r = 0; r < g_n; ++r) {
    CK(cudaSetDevice(r));
    CK(cudaMemset(g_ranks[r].errorFlags, 0, 4));
    CK(cudaMemset(g_ranks[r].mismatches, 0, 16));
  }
  std::vector<DevCall> calls(6);
  calls[0].call = {A2A_LL, 1, 256, 4099, 3, 0, 0};
  calls[1].call = {A2AV, 4, 512, 0, 1, 0, 0};
  calls[1].maxCount = 40000;
  calls[2].call = {A2A_LL128, 8, 512, 300001, 5, 0, 0};
  calls[3].call = {A2A, 2, 512, 65536 + 5, 0, 0, 0};
  calls[4].call = {A2AV_LL128, 4, 256, 0, 2, 0, 0};
  calls[4].maxCount = 70000;
  calls[5].call = {A2AV_LL, 2, 256, 0, 6, 0, 0};
  calls[5].maxCount = 9000;
  const int ncalls = (int)calls.size();
  for (int i = 0; i < ncalls; ++i) calls[i].phase = i;
  auto poisonOf = [](int i) { return (uint8_t)(0x71 + 13 * i); };
  reset_diag();

  std::vector<cudaGraphExec_t> execs(g_n);
  for (int r = 0; r < g_n; ++r) {
    CK(cudaSetDevice(r));
    cudaGraph_t graph;
    CK(cudaStreamBeginCapture(g_ranks[r].stream, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < ncalls; ++i) enqueue_checked_call(r, calls[i], poisonOf(i), i);
    bump_kernel<<<1, 1, 0, g_ranks[r].stream>>>(g_ranks[r].runWord);
    CK(cudaStreamEndCapture(g_ranks[r].stream, &graph));
    CK(cudaGraphInstantiate(&execs[r], graph, 0));
    CK(cudaGraphDestroy(graph));
  }
  uint64_t run = read_run_word(), wantChecked = 0;
  for (int it = 0; it < replays; ++it)
    for (int i = 0; i < ncalls; ++i) wantChecked += expected_checked(calls[i], run + it);
  auto t0 = std::chrono::steady_clock::now();
  for (int it = 0; it < replays; ++it)
    for (int r = 0; r < g_n; ++r) {
      CK(cudaSetDevice(r));
      CK(cudaGraphLaunch(execs[r], g_ranks[r].stream));
    }
  sync_all();
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  for (int r = 0; r < g_n; ++r) {
    CK(cudaSetDevice(r));
    CK(cudaGraphExecDestroy(execs[r]));
  }
  char what[96];
  snprintf(what, sizeof what, "%d graph replays x %d verified calls, %.1f ms", replays, ncalls, ms);
  bool ok = read_device_results(what, wantChecked);
  if (!ok)
    report_diag(
        calls,
        [ncalls](int i, uint64_t recordRun, int delta) {
          // recordRun = runWord*8 + phase of call i; neighbours across the replay boundary differ by one.
          uint64_t w = recordRun / 8;
          return i + delta < 0 ? w - 1 : (i + delta > ncalls - 1 ? w + 1 : w);
        },
        poisonOf, true);
  record(ok, what);
  if (ok) printf("ok   %s\n", what);
}

// ------------------------------------------------------------------------------------------------
// Timing
// ------------------------------------------------------------------------------------------------
// Runs `body(r)` for every rank behind a gate, times it with per-GPU events, returns the max over
// GPUs in microseconds.
template <typename Body>
static double gated_time_us(Body body) {
  const uint32_t value = ++g_gateValue;
  for (int r = 0; r < g_n; ++r) {
    Rank& R = g_ranks[r];
    CK(cudaSetDevice(r));
    gate_kernel<<<1, 1, 0, R.stream>>>(g_hostGate, value, R.gateTimedOut);
    CK(cudaGetLastError());
    CK(cudaEventRecord(R.ev0, R.stream));
    body(r);
    CK(cudaEventRecord(R.ev1, R.stream));
  }
  *g_hostGate = value;
  sync_all();
  float worst = 0;
  for (int r = 0; r < g_n; ++r) {
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, g_ranks[r].ev0, g_ranks[r].ev1));
    worst = std::max(worst, ms);
  }
  return worst * 1000.0;
}

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static double time_call(const Call& c, int warmups, int iters) {
  for (int i = 0; i < warmups; ++i) gated_time_us([&](int r) { launch(r, c, g_ranks[r].stream); });
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) t.push_back(gated_time_us([&](int r) { launch(r, c, g_ranks[r].stream); }));
  return median(t);
}

static double time_call_pipelined(const Call& c, int iters) {
  return gated_time_us([&](int r) {
           for (int i = 0; i < iters; ++i) launch(r, c, g_ranks[r].stream);
         }) /
         iters;
}

static void memcpy_body(int r, uint64_t bpp) {
  Rank& R = g_ranks[r];
  for (int step = 0; step < g_n; ++step) {
    int p = (r + step) % g_n;  // rotated: at each step every GPU sends to one peer and receives from one
    uint8_t* dst = g_ranks[p].window + g_layout.recvOffset + (uint64_t)r * g_layout.slotBytes;
    const uint8_t* src = R.sendBase + (uint64_t)p * bpp;
    if (p == r) CK(cudaMemcpyAsync(dst, src, bpp, cudaMemcpyDeviceToDevice, R.stream));
    else CK(cudaMemcpyPeerAsync(dst, p, src, r, bpp, R.stream));
  }
}

// Checks the outputs of the last timed call on the device (data of the timing seed).
static bool verify_timing_output(const Call& c, uint64_t run) {
  for (int r = 0; r < g_n; ++r) {
    CK(cudaSetDevice(r));
    CK(cudaMemcpy(g_ranks[r].runWord, &run, 8, cudaMemcpyHostToDevice));
  }
  uint64_t checked = 0;
  for (int r = 0; r < g_n; ++r) {
    Rank& R = g_ranks[r];
    CK(cudaSetDevice(r));
    verify_kernel<<<1024, 256, 0, R.stream>>>(R.window, g_layout.recvOffset, g_layout.slotBytes,
                                              g_layout.recvCountsOffset, A2A, c.bpp, 0, capacity_of(c), R.runWord, 0,
                                              r, g_n, 0, 0, R.mismatches, R.mismatches + 1, nullptr, 0,
                                              R.errorFlags);
    CK(cudaGetLastError());
  }
  sync_all();  // timing runs do not poison, so the verifier checks data bytes only (guard 0)
  unsigned long long total = 0;
  for (int r = 0; r < g_n; ++r) {
    unsigned long long m[2];
    CK(cudaSetDevice(r));
    CK(cudaMemcpy(m, g_ranks[r].mismatches, 16, cudaMemcpyDeviceToHost));
    CK(cudaMemset(g_ranks[r].mismatches, 0, 16));
    total += m[0];
    checked += m[1];
  }
  (void)checked;
  return total == 0;
}

// Library configurations the timing sections try (protocol, chunks per peer, threads).
struct TimingCfg {
  int kind, chunks, threads;
};
static const TimingCfg kTimingCfgs[] = {
    {A2A_LL, 1, 256},     {A2A_LL, 1, 512},     {A2A_LL, 2, 512},     {A2A_LL, 4, 512},     {A2A_LL, 8, 512},
    {A2A_LL, 16, 512},    {A2A_LL128, 1, 256},  {A2A_LL128, 1, 512},  {A2A_LL128, 2, 512},  {A2A_LL128, 4, 512},
    {A2A_LL128, 8, 512},  {A2A_LL128, 16, 256}, {A2A_LL128, 16, 512}, {A2A_LL128, 32, 256}, {A2A_LL128, 32, 512},
    {A2A_LL128, 64, 512}, {A2A_LL128_U4, 16, 512}, {A2A_LL128_U4, 32, 512}, {A2A_LL128_U8, 8, 512},
    {A2A_LL128_U8, 16, 512}, {A2A_LL128_U8, 32, 512}, {A2A, 1, 256},        {A2A, 1, 512},        {A2A, 2, 1024},       {A2A, 4, 1024},
    {A2A, 8, 1024},       {A2A, 16, 1024},      {A2A, 24, 1024},      {A2A, 32, 1024},      {A2A, 48, 1024},
    {A2A, 64, 1024},      {A2A, 8, 512},        {A2A, 16, 512},       {A2A, 32, 512},       {A2A, 64, 512},
    {A2A, 96, 512},       {A2A, 128, 512}};

// Whether a configuration is worth timing at c.bpp (capacity, enough bytes per chunk, grid fits).
// The call a timing configuration makes at bpp bytes per peer.
static Call call_of(const TimingCfg& f, uint64_t bpp) {
  Call c;
  c.kind = f.kind;
  c.chunks = f.chunks;
  c.threads = f.threads;
  c.bpp = bpp;
  return c;
}

static bool timing_cfg_applies(const Call& c) {
  if (is_ll(c.kind) && c.bpp > kLlCapacity) return false;
  if (is_ll128(c.kind) && c.bpp > kLl128Capacity) return false;
  if (c.chunks > 1 && c.bpp / (uint64_t)c.chunks < (is_ll(c.kind) || is_ll128(c.kind) ? 2048u : 16384u)) return false;
  if (c.bpp / (uint64_t)c.chunks > (64ull << 20)) return false;  // too few blocks to matter; slow to time
  return grid_fits(c);
}

// nccl-tests style: for each size, every configuration of each protocol timed as 20 calls back to
// back behind one gate (time / 20; median of 3 such runs, after one warm-up run); prints the best
// configuration of each protocol side by side, then every configuration.
static void pipelined_table(bool quick) {
  printf("\nPipelined (nccl-tests style): 20 calls back to back behind one gate, time/20, median of 3 runs after a\n");
  printf("warm-up run; best configuration per protocol; size = bytes per rank. Output of the last call checked.\n\n");
  printf("%10s | %-16s %8s | %-16s %8s | %-16s %8s | %s\n", "size", "LL", "us", "LL128", "us", "direct", "us",
         "winner");
  std::vector<std::string> detail;
  const uint64_t maxSize = quick ? (16ull << 20) : (64ull << 20);
  for (uint64_t size = 4096; size <= maxSize; size *= 4) {
    const uint64_t bpp = size / g_n, moved = bpp * g_n, run = 700000 + size;
    for (int r = 0; r < g_n; ++r) {
      Call c;
      fill_send(r, c, moved, seed_of(run * 8, r));
    }
    sync_all();
    double best[3] = {1e30, 1e30, 1e30};
    Call bestCall[3];
    for (const TimingCfg& f : kTimingCfgs) {
      Call c = call_of(f, bpp);
      if (!timing_cfg_applies(c)) continue;
      (void)time_call_pipelined(c, 20);
      std::vector<double> t;
      for (int i = 0; i < 3; ++i) t.push_back(time_call_pipelined(c, 20));
      const double us = median(t);
      const bool ok = verify_timing_output(c, run);
      record(ok, "pipelined output " + describe(c));
      char line[160];
      snprintf(line, sizeof line, "%10llu  %-18s chunks=%-3d threads=%-5d %9.2f us pipelined %8.1f GB/s%s",
               (unsigned long long)size, kind_name(c.kind), c.chunks, c.threads, us, moved / us / 1e3,
               ok ? "" : "  WRONG OUTPUT");
      detail.push_back(line);
      if (is_variant(c.kind)) continue;  // listed, but not a library configuration
      const int pi = is_ll(c.kind) ? 0 : is_ll128(c.kind) ? 1 : 2;
      if (us < best[pi]) {
        best[pi] = us;
        bestCall[pi] = c;
      }
    }
    char name[3][32], val[3][16];
    int winner = 0;
    for (int i = 0; i < 3; ++i) {
      if (best[i] < best[winner]) winner = i;
      if (best[i] < 1e29) {
        snprintf(name[i], sizeof name[i], "%dx%d", bestCall[i].chunks, bestCall[i].threads);
        snprintf(val[i], sizeof val[i], "%.2f", best[i]);
      } else {
        snprintf(name[i], sizeof name[i], "-");
        snprintf(val[i], sizeof val[i], "-");
      }
    }
    printf("%10llu | %-16s %8s | %-16s %8s | %-16s %8s | %s\n", (unsigned long long)size, name[0], val[0], name[1],
           val[1], name[2], val[2], winner == 0 ? "LL" : winner == 1 ? "LL128" : "direct");
    fflush(stdout);
  }
  printf("\nAll configurations, pipelined:\n");
  for (auto& l : detail) printf("%s\n", l.c_str());
}

static void timing_table(bool quick) {
  printf("\nTiming: median of 20 gated calls after 5 warm-ups, per-GPU events, max over %d GPUs.\n", g_n);
  printf("size = bytes per rank (send buffer); algBw = size/time; busBw = algBw*(n-1)/n; GB = 1e9 B.\n");
  printf("'pipe' = 20 calls back to back, time/20. memcpy = self cudaMemcpyAsync, then cudaMemcpyPeerAsync per peer in rotated order.\n\n");
  std::vector<std::string> detail;
  printf("%10s | %-22s %9s %9s %9s | %9s %9s %9s | %9s | %9s %9s\n", "size", "best GIN config", "us", "algBw",
         "busBw", "LL us", "LL128 us", "direct us", "pipe us", "memcpy us", "algBw");
  const uint64_t maxSize = quick ? (64ull << 20) : (1ull << 30);
  for (uint64_t size = 4096; size <= maxSize; size *= 4) {
    const uint64_t bpp = size / g_n;
    const uint64_t moved = bpp * g_n;
    const uint64_t run = 900000 + size;
    for (int r = 0; r < g_n; ++r) {
      Call c;
      fill_send(r, c, moved, seed_of(run * 8, r));
    }
    sync_all();
    double best = 1e30, bestLl = 1e30, bestLl128 = 1e30, bestDirect = 1e30;
    Call bestCall;
    for (const TimingCfg& f : kTimingCfgs) {
      Call c = call_of(f, bpp);
      if (!timing_cfg_applies(c)) continue;
      double us = time_call(c, 5, 20);
      bool ok = verify_timing_output(c, run);
      record(ok, "timing output " + describe(c));
      char line[160];
      snprintf(line, sizeof line, "%10llu  %-12s chunks=%-3d threads=%-5d %10.2f us %8.1f GB/s%s",
               (unsigned long long)size, kind_name(c.kind), c.chunks, c.threads, us, moved / us / 1e3,
               ok ? "" : "  WRONG OUTPUT");
      detail.push_back(line);
      if (is_variant(c.kind)) continue;  // listed, but not a library configuration
      if (is_ll(c.kind)) bestLl = std::min(bestLl, us);
      else if (is_ll128(c.kind)) bestLl128 = std::min(bestLl128, us);
      else bestDirect = std::min(bestDirect, us);
      if (us < best) {
        best = us;
        bestCall = c;
      }
    }
    double pipe = time_call_pipelined(bestCall, 20);
    std::vector<double> mt;
    for (int i = 0; i < 25; ++i) {
      double t = gated_time_us([&](int r) { memcpy_body(r, bpp); });
      if (i >= 5) mt.push_back(t);
    }
    double mcp = median(mt);
    char cfgName[40];
    snprintf(cfgName, sizeof cfgName, "%s %dx%d", protocol_name(bestCall.kind), bestCall.chunks, bestCall.threads);
    double alg = moved / best / 1e3;
    char llText[24], ll128Text[24];
    if (bestLl < 1e29) snprintf(llText, sizeof llText, "%.2f", bestLl);
    else snprintf(llText, sizeof llText, "-");
    if (bestLl128 < 1e29) snprintf(ll128Text, sizeof ll128Text, "%.2f", bestLl128);
    else snprintf(ll128Text, sizeof ll128Text, "-");
    printf("%10llu | %-22s %9.2f %9.1f %9.1f | %9s %9s %9.2f | %9.2f | %9.2f %9.1f\n", (unsigned long long)size,
           cfgName, best, alg, alg * (g_n - 1) / g_n, llText, ll128Text, bestDirect, pipe, mcp, moved / mcp / 1e3);
    fflush(stdout);
  }
  printf("\nAll configurations (median us, algBw):\n");
  for (auto& l : detail) printf("%s\n", l.c_str());
  for (int r = 0; r < g_n; ++r) {
    uint32_t t = 0;
    CK(cudaSetDevice(r));
    CK(cudaMemcpy(&t, g_ranks[r].gateTimedOut, 4, cudaMemcpyDeviceToHost));
    if (t) printf("WARNING: the timing gate on GPU %d timed out; its times include launch skew\n", r);
  }
}


// ------------------------------------------------------------------------------------------------
// Large-size candidates (test-only variants of gin_a2a; docs/kernels.md, "Design choices and
// what they rest on"): correctness on odd sizes and alignments, then timing next to gin_a2a.
// ------------------------------------------------------------------------------------------------
static void variant_checks(bool quick) {
  const int before = g_failed;
  // Every variant that writes all slots; TMA last: a fault there aborts the run (exit 2), and the
  // lines printed before it stay valid.
  for (int kind : {A2A_U4, A2A_U16, A2A_HINT, A2A_SELF4, A2A_TMA8, A2A_TMA4}) {
    if (is_tma(kind)) {
      printf("checking %s (a CUDA error from here on is this TMA kernel's fault)\n", kind_name(kind));
      fflush(stdout);
    }
    std::vector<uint64_t> sizes = {1, 17, 4095, 65536, 12345, 1000003, (16ull << 20) + 7};
    if (!quick) sizes.push_back(64ull << 20);
    for (uint64_t bpp : sizes)
      for (int chunks : {1, 4, 32})
        for (int misalign : {0, 1, 13}) {
          if (bpp >= (16ull << 20) && chunks < 32) continue;
          Call c;
          c.kind = kind;
          c.chunks = chunks;
          c.threads = chunks == 1 ? 256 : 512;
          c.bpp = bpp;
          c.misalign = misalign;
          if (grid_fits(c)) test_uniform(c);
        }
    // 8-byte-aligned odd slots (slot 1 starts 8 bytes past a 16-byte boundary): with the send
    // pointer 8 bytes off, rank 1's bytes for rank 0 reach the 16-byte-aligned body after an
    // 8-byte head (TMA / hinted path with head and tail), rank 0's for rank 1 do not (fallback).
    for (uint64_t bpp : {500000ull, 1000003ull}) {
      Call c;
      c.kind = kind;
      c.chunks = 4;
      c.threads = 512;
      c.bpp = bpp;
      c.misalign = 8;
      c.slotBytes = (1ull << 20) + 40;
      if (grid_fits(c)) test_uniform(c);
    }
  }
  printf("large-size candidate checks: %d failed\n", g_failed - before);
  fflush(stdout);
}

static void variant_table(bool quick) {
  printf("\nLarge-size candidates (test-only kernels, docs/kernels.md): median of 20 gated calls after 5 warm-ups,\n");
  printf("two interleaved rounds over all configurations; 'vs base' = best round against gin_a2a 32x512's best round.\n");
  printf("test_a2a_noself is a diagnostic (no self copy: the time of the NVLink part alone; output not checked).\n\n");
  struct Cfg {
    int kind, chunks, threads;
  };
  static const Cfg cfgs[] = {{A2A, 32, 512},        {A2A, 64, 512},      {A2A, 16, 1024},     {A2A_U4, 64, 512},
                             {A2A_U16, 16, 512},    {A2A_HINT, 32, 512}, {A2A_HINT, 64, 512}, {A2A_SELF4, 32, 512},
                             {A2A_SELF4, 64, 512},  {A2A_NOSELF, 32, 512}, {A2A_TMA8, 32, 512}, {A2A_TMA8, 64, 512},
                             {A2A_TMA4, 16, 512},   {A2A_TMA4, 32, 512}, {A2A_TMA4, 64, 512}};
  const int ncfg = (int)(sizeof cfgs / sizeof cfgs[0]);
  const uint64_t maxSize = quick ? (64ull << 20) : (1ull << 30);
  for (uint64_t size = 16ull << 20; size <= maxSize; size *= 4) {
    const uint64_t bpp = size / g_n, moved = bpp * g_n, run = 900000 + size;
    for (int r = 0; r < g_n; ++r) {
      Call c;
      fill_send(r, c, moved, seed_of(run * 8, r));
    }
    sync_all();
    std::vector<double> t[2];
    std::vector<std::string> status(ncfg);
    for (int round = 0; round < 2; ++round)
      for (int i = 0; i < ncfg; ++i) {
        Call c;
        c.kind = cfgs[i].kind;
        c.chunks = cfgs[i].chunks;
        c.threads = cfgs[i].threads;
        c.bpp = bpp;
        if (!grid_fits(c)) {
          t[round].push_back(-1);
          status[i] = "  (grid does not fit)";
          continue;
        }
        t[round].push_back(time_call(c, 5, 20));
        if (round == 0 && c.kind != A2A_NOSELF) {
          bool ok = verify_timing_output(c, run);
          record(ok, "timing output " + describe(c));
          if (!ok) status[i] = "  WRONG OUTPUT";
        }
      }
    const double base = std::min(t[0][0], t[1][0]);
    for (int i = 0; i < ncfg; ++i) {
      if (t[0][i] < 0) {
        printf("%10llu  %-16s chunks=%-3d threads=%-5d%s\n", (unsigned long long)size, kind_name(cfgs[i].kind),
               cfgs[i].chunks, cfgs[i].threads, status[i].c_str());
        continue;
      }
      const double best = std::min(t[0][i], t[1][i]);
      printf("%10llu  %-16s chunks=%-3d threads=%-5d %9.2f %9.2f us  best %9.2f us %7.1f GB/s  vs base %+6.1f%%%s\n",
             (unsigned long long)size, kind_name(cfgs[i].kind), cfgs[i].chunks, cfgs[i].threads, t[0][i], t[1][i],
             best, moved / best / 1e3, (best / base - 1.0) * 100.0, status[i].c_str());
    }
    fflush(stdout);
  }
}
// ------------------------------------------------------------------------------------------------
int main(int argc, char** argv) {
  bool quick = false, timing = true, correctness = true, variants = true, variantsOnly = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--quick") quick = true;
    else if (a == "--no-timing") timing = false;
    else if (a == "--timing-only") correctness = false;
    else if (a == "--variants-only") {
      correctness = timing = false;
      variantsOnly = true;
    }
    else if (a == "--no-variants") variants = false;
    else {
      fprintf(stderr, "usage: %s [--quick] [--no-timing | --timing-only | --variants-only] [--no-variants]\n", argv[0]);
      return 2;
    }
  }
  int ndev = 0;
  CK(cudaGetDeviceCount(&ndev));
  const uint64_t bigPerPeer = quick ? (16ull << 20) : (ndev <= 2 ? (256ull << 20) : (64ull << 20));
  const uint64_t timingPerPeer = (quick ? (64ull << 20) : (1ull << 30)) / (uint64_t)std::max(ndev, 2);
  setup(std::max(bigPerPeer, timingPerPeer));
  auto t0 = std::chrono::steady_clock::now();

  if (correctness) {
    // Uniform: every size, both protocols, a few chunk/thread shapes, misaligned send pointers.
    std::vector<uint64_t> sizes = {0,      1,      3,         17,           119,         120,         121,
                                   239,    240,    241,       4095,         4096,        65536,       1ull << 20,
                                   16ull << 20,    bigPerPeer, 12345,       1000003,     (16ull << 20) + 7,
                                   262144 + 5,     (4ull << 20) + 3};
    if (quick) sizes.erase(std::remove(sizes.begin(), sizes.end(), bigPerPeer), sizes.end());
    std::sort(sizes.begin(), sizes.end());
    sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
    struct Shape {
      int kind, chunks, threads;
    };
    const Shape shapes[] = {{A2A, 1, 256},      {A2A, 4, 512},        {A2A, 32, 1024},       {A2A_LL, 1, 256},
                            {A2A_LL, 4, 512},   {A2A_LL128, 1, 256},  {A2A_LL128, 4, 512},   {A2A_LL128, 16, 512},
                            {A2A_LL128, 32, 512}};
    for (uint64_t bpp : sizes) {
      for (const Shape& sh : shapes) {
        if (is_ll(sh.kind) && bpp > kLlCapacity) continue;
        if (is_ll128(sh.kind) && bpp > kLl128Capacity) continue;  // overflow: its own check below
        if (is_ll128(sh.kind) && sh.chunks == 32 && bpp < 4096) continue;
        if (bpp >= (16ull << 20) && sh.chunks < 32) continue;  // big sizes: bandwidth shape only
        for (int misalign : {0, 1, 13}) {
          if (bpp >= (16ull << 20) && misalign == 13) continue;
          Call c;
          c.kind = sh.kind;
          c.chunks = sh.chunks;
          c.threads = sh.threads;
          c.bpp = bpp;
          c.misalign = misalign;
          if (!grid_fits(c)) continue;
          test_uniform(c);
        }
      }
    }
    // LL and LL128 capacity overflow on a uniform call: clamped, error bit 1.
    {
      Call c;
      c.kind = A2A_LL;
      c.chunks = 2;
      c.threads = 256;
      c.bpp = kLlCapacity + 100;
      test_uniform(c);
      c.kind = A2A_LL128;
      c.chunks = 16;
      c.threads = 512;
      c.bpp = kLl128Capacity + 7;
      test_uniform(c);
    }
    // The LL128 unroll variants (timed below) on odd sizes and misaligned inputs.
    for (int kind : {A2A_LL128_U4, A2A_LL128_U8})
      for (uint64_t bpp : {1ull, 241ull, 65536ull + 1, 1000003ull, 4ull << 20})
        for (int misalign : {0, 13}) {
          Call c;
          c.kind = kind;
          c.chunks = bpp > 65536 ? 16 : 2;
          c.threads = 512;
          c.bpp = bpp;
          c.misalign = misalign;
          test_uniform(c);
        }
    // LL128 into odd-sized slots: every source slot starts at a different alignment (8-byte
    // aligned and odd), so the unpack takes its 4-byte and byte paths; send pointers misaligned too.
    for (uint64_t slot : {(1ull << 20) + 40, (1ull << 20) + 13, (1ull << 20) + 6})
      for (uint64_t bpp : {241ull, 65536ull + 1, 1000003ull})
        for (int misalign : {0, 4, 13}) {
          Call c;
          c.kind = A2A_LL128;
          c.chunks = 4;
          c.threads = 256;
          c.bpp = bpp;
          c.misalign = misalign;
          c.slotBytes = slot;
          test_uniform(c);
        }
    printf("uniform checks: %d passed, %d failed\n", g_passed, g_failed);

    // All-to-all-v: odd-sized slots (1 MiB + 40: slots are only 8-byte aligned), host scenarios.
    Rng rng(12345);
    for (int kind : {A2AV, A2AV_LL, A2AV_LL128})
      for (int chunks : {1, 4})
        for (int misalign : {0, 5}) {
          Call proto;
          proto.kind = kind;
          proto.chunks = chunks;
          proto.threads = kind == A2AV ? 512 : 256;
          proto.misalign = misalign;
          proto.slotBytes = (1ull << 20) + 40;
          v_scenarios(proto, rng);
        }
    printf("after all-to-all-v checks: %d passed, %d failed\n", g_passed, g_failed);

    // Three independent 1000-call sequences (each call verified on the device, ~50 ms each), then
    // two LL128-only stress sequences at 64 KiB-1 MiB per peer.
    for (uint64_t seq : {77ull, 4242ull, 90001ull}) test_back_to_back(1000, seq);
    for (uint64_t seq : {128ull, 120120ull}) test_back_to_back(1000, seq, true);
    test_graph(1000);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    printf("\ncorrectness: %d passed, %d failed (%.1f s)\n", g_passed, g_failed, s);
  }
  if (timing) {
    timing_table(quick);
    pipelined_table(quick);
  }
  if (variants) {
    // After the library's checks and table, so a fault in a candidate cannot cost their results.
    printf("\n");
    if (correctness || variantsOnly) variant_checks(quick);
    if (timing || variantsOnly) variant_table(quick);
  }
  double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  printf("\n%d passed, %d failed in total (%.1f s)\n", g_passed, g_failed, total);
  return g_failed ? 1 : 0;
}
