// gin-kernels-test: link=moe_gin,moe_host trace-variant
// moe_test.cu - standalone check and benchmark of the MoE code objects (gin-kernels/src/moe_gin.cu,
// moe_host.cu; CUDA runtime only). gin-kernels/build --tests links it against those sources
// compiled as the shipped code objects are (same nvcc flags, sm_90), so the kernels checked are
// the kernels shipped; moe_test_trace is the same program linked against a second build with
// -DGIN4J_TRACE, for --profile.
//
// One process drives every visible GPU as one rank each (one GPU: R = 1, nothing crosses a link), or
// with --ranks R, R ranks with rank r on GPU r % GPUs (how the R = 4 and 8 entry points run on a
// 2-GPU host; the channels are lowered so that the grids of the ranks sharing a GPU fit on it
// together): symmetric windows are plain cudaMalloc buffers made reachable with peer access,
// peerBases tables are built on the host.
// Part 1 (correctness): the GIN kernels run on all GPUs concurrently (one stream each); the HOST
// backend's local kernels run with the exchange emulated by cudaMemcpyPeerAsync of the counted
// rows (the library uses NCCL from Java for it). Everything is checked against a CPU reference:
// rank-tagged rows at their exact recvX positions, recvCounts, recvWeights, GIN == HOST byte for
// byte, combine of fake experts (out = x * (1 + global expert id)) within the bf16 bound, edge
// cases, and 200 back-to-back rounds without host synchronisation. Prints "N passed, M failed".
// Part 2 (timing): GIN dispatch / combine and the HOST local kernels for DeepSeek-V3, Qwen3-30B-A3B
// and Mixtral shapes at 128 and 4096 tokens per rank.
//
//   gin-kernels/build --tests   (bin/moe_test, bin/moe_test_trace)
//   moe_test [--seed N] [--no-bench] [--bench-only] [--channels C] [--ranks R]
//   moe_test_trace --profile [...]
// --profile (moe_test_trace): after each timed shape, one more gated dispatch and combine with
// per-block phase stamps (%globaltimer, GIN_TRACE at the slots of src/moe/trace_slots.cuh), printed
// as median / max over blocks in us from the kernel's first block start on that GPU.
#include "../src/moe/entry_points.cuh"
#include "../src/moe/trace_slots.cuh"

#ifdef GIN4J_TRACE
extern "C" cudaError_t moe_gin_trace_buffer(uint64_t* buf);  // moe_gin.cu, trace builds
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#define CUDA_CHECK(call)                                                                              \
  do {                                                                                                \
    cudaError_t err_ = (call);                                                                        \
    if (err_ != cudaSuccess) {                                                                        \
      fprintf(stderr, "%s:%d: %s failed: %s (%d)\n", __FILE__, __LINE__, #call, cudaGetErrorString(err_), \
              (int)err_);                                                                             \
      exit(2);                                                                                        \
    }                                                                                                 \
  } while (0)

// ------------------------------------------------------------------------------------------------
// bf16 on the host (same rounding as the kernels).
// ------------------------------------------------------------------------------------------------
static float bf2f(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static uint16_t f2bf(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u;
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

// ------------------------------------------------------------------------------------------------
// Test-only device kernels.
// ------------------------------------------------------------------------------------------------
__device__ __forceinline__ float dev_bf2f(uint16_t b) { return __uint_as_float((uint32_t)b << 16); }
__device__ __forceinline__ uint16_t dev_f2bf(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u;
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

// e4m3fn (the format the kernels' fp8 rows take on NVIDIA): sign, 4 exponent bits (bias 7), 3 mantissa
// bits; exponent 0 = subnormal (m * 2^-9); 0x7f / 0xff = NaN.
__host__ __device__ inline float e4m3_value(uint32_t c) {
  const uint32_t E = (c >> 3) & 15u, m = c & 7u;
  const float mag = E == 0 ? ldexpf((float)m, -9) : ldexpf(1.f + (float)m / 8.f, (int)E - 7);
  return (c & 0x80u) ? -mag : mag;
}

// Fake experts: out[row] = in[row] * (1 + global expert id of the row), rows expert-major with
// per-local-expert counts recvCounts[L] (device, no host round trip). One block per row stride.
// in: bf16 rows, or with fp8 scaled fp8 rows (moe_fp8_row_bytes(H) bytes: H codes, then the
// scales), in[row][h] = e4m3(code[h]) * scale[h / 128]; out is bf16 either way.
__global__ void fake_expert_kernel(const uint8_t* in, uint16_t* out, const int* recvCounts, int L, int rank, int H,
                                   int capacityRows, bool fp8) {
  __shared__ int start[MOE_MAX_EXPERTS + 1];
  if (threadIdx.x == 0) {
    int s = 0;
    for (int e = 0; e < L; ++e) {
      start[e] = s;
      int c = recvCounts[e];
      s += c < 0 ? 0 : c;
    }
    start[L] = s;
  }
  __syncthreads();
  const uint64_t inRowBytes = fp8 ? moe_fp8_row_bytes(H) : 2ull * H;
  const int total = start[L] < capacityRows ? start[L] : capacityRows;
  for (int row = blockIdx.x; row < total; row += gridDim.x) {
    int lo = 0, hi = L - 1;  // last e with start[e] <= row
    while (lo < hi) {
      int mid = (lo + hi + 1) >> 1;
      if (start[mid] <= row) lo = mid;
      else hi = mid - 1;
    }
    const float factor = (float)(1 + rank * L + lo);
    const uint8_t* src = in + (uint64_t)row * inRowBytes;
    uint16_t* dst = out + (uint64_t)row * H;
    for (int h = threadIdx.x; h < H; h += blockDim.x) {
      const float v = fp8 ? e4m3_value(src[h]) * ((const float*)(src + H))[h / 128] : dev_bf2f(((const uint16_t*)src)[h]);
      dst[h] = dev_f2bf(v * factor);
    }
  }
}

// Holds a stream until the host writes `expect` into a mapped pinned word, so that timed work on
// all GPUs starts together (gives up after 5 s).
__global__ void gate_kernel(const volatile uint32_t* flag, uint32_t expect) {
  uint64_t t0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  while (*flag < expect) {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    if (t - t0 > 5000000000ull) break;
  }
}

// ------------------------------------------------------------------------------------------------
// Problem description and inputs.
// ------------------------------------------------------------------------------------------------
// ZIPF: skewed routing as real routers produce it: expert e's popularity 1 / (1 + its place)^gZipfS,
// the places a fixed shuffle of the experts (the same on every rank, so every rank has the same hot
// experts, spread over the ranks), K distinct experts per token drawn in proportion to it.
enum Routing { UNIFORM, ZIPF, ONE_EXPERT, RANK0_ONLY, ALL_MASKED, INVALID_IDS };
static double gZipfS = 1.0;  // --routing zipf[:S]
static Routing gBenchRouting = UNIFORM;  // --routing: the bench's

// K distinct experts of E by Zipf popularity (weighted sampling without replacement: the K largest
// of u^(1/w), Efraimidis and Spirakis).
static void zipf_experts(std::mt19937_64& rng, int E, int K, int* row) {
  static thread_local std::vector<double> weight;
  static thread_local int weightE = -1;
  static thread_local double weightS = -1;
  if (weightE != E || weightS != gZipfS) {
    std::vector<int> place(E);
    for (int e = 0; e < E; ++e) place[e] = e;
    std::mt19937_64 fixed(0x5eed0000u + (uint64_t)E);  // not the test's seed: every rank alike
    std::shuffle(place.begin(), place.end(), fixed);
    weight.assign(E, 0.0);
    for (int e = 0; e < E; ++e) weight[e] = 1.0 / pow(1.0 + place[e], gZipfS);
    weightE = E;
    weightS = gZipfS;
  }
  std::uniform_real_distribution<double> uni(1e-300, 1.0);
  std::vector<std::pair<double, int>> key(E);
  for (int e = 0; e < E; ++e) key[e] = {log(uni(rng)) / weight[e], e};
  const int n = std::min(K, E);
  std::partial_sort(key.begin(), key.begin() + n, key.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (int k = 0; k < n; ++k) row[k] = key[k].second;
}

struct Case {
  std::string name;
  int E, K, H, M, C;
  std::vector<int> T;  // per rank (cycled if shorter than the number of ranks)
  Routing routing;
  double maskProb;
  bool fp8 = false;  // scaled fp8 dispatch rows (moe_fp8_row_bytes), bf16 combine
  bool quant = false;  // fp8: bf16 rows in, quantized by the dispatch itself (its xq argument)
};

struct RankInput {
  int T = 0;
  std::vector<uint16_t> x;  // [T][H] bf16; fp8 cases: the values the fp8 rows stand for (exact in bf16)
  std::vector<uint8_t> x8;  // fp8 cases: the dispatch rows, [T][moe_fp8_row_bytes(H)]
  std::vector<uint16_t> xIn;  // quantizing cases: the bf16 rows given to the dispatch (x: their fp8 values)
  std::vector<int> idx;     // [T][K]
  std::vector<float> w;     // [T][K]
  std::vector<int> ev;      // validated ids (CPU reference)
};

// Every value a small positive integer (exact in bf16); columns 0..3 tag rank, token and round.
static uint16_t x_value(int rank, int t, int h, int round) {
  int v;
  if (h == 0) v = rank + 1;
  else if (h == 1) v = (t >> 6) + 1;
  else if (h == 2) v = (t & 63) + 1;
  else if (h == 3) v = (round & 63) + 1;
  else v = 1 + (rank * 37 + t * 11 + h * 5 + round * 3) % 61;
  return f2bf((float)v);
}

static void validate_ids(RankInput& in, int E, int K) {
  in.ev.assign((size_t)in.T * K, -1);
  for (int t = 0; t < in.T; ++t)
    for (int k = 0; k < K; ++k) {
      int e = in.idx[(size_t)t * K + k];
      if (e < -1 || e >= E) e = -1;
      if (e >= 0)
        for (int j = 0; j < k; ++j)
          if (in.ev[(size_t)t * K + j] == e) e = -1;
      in.ev[(size_t)t * K + k] = e;
    }
}

// ------------------------------------------------------------------------------------------------
// CPU reference of moe_fp8_quantize (and of the quantizing dispatch): per 128-element block amax,
// scale and x * (448 / amax) computed as the kernel states them (blocks of bf16 subnormals
// pre-scaled by 2^64), each code the nearest of the 254 finite e4m3fn values found by search (ties
// to the even code), saturated at 448, the sign from the sign bit (-0 -> 0x80).
// ------------------------------------------------------------------------------------------------
static uint8_t ref_e4m3(float q) {
  const float a = std::fabs(q);
  int best = 0;
  float bestD = INFINITY;
  for (int c = 0; c < 0x7f; ++c) {  // magnitudes 0 .. 448 (0x7f is NaN)
    const float d = std::fabs(e4m3_value((uint32_t)c) - a);
    if (d < bestD || (d == bestD && (c & 1) == 0)) {
      best = c;
      bestD = d;
    }
  }
  return (uint8_t)((std::signbit(q) ? 0x80 : 0) | best);  // -0 keeps its sign (e4m3fn has a negative zero)
}

// bf16 rows [T][H] -> scaled fp8 rows [T][moe_fp8_row_bytes(H)] (the padding scales zero).
static std::vector<uint8_t> ref_quantize_rows(const std::vector<uint16_t>& x, int T, int H) {
  const int S = moe_fp8_scales(H);
  const uint64_t rb = moe_fp8_row_bytes(H);
  std::vector<uint8_t> want((size_t)T * rb, 0);
  for (int t = 0; t < T; ++t)
    for (int b = 0; b < S; ++b) {
      const int h1 = std::min(H, b * 128 + 128);
      float amax = 0.f;
      for (int h = b * 128; h < h1; ++h) amax = std::max(amax, std::fabs(bf2f(x[(size_t)t * H + h])));
      const float scale = amax == 0.f ? 1.f : amax / 448.f;
      memcpy(&want[(size_t)t * rb + H + 4 * b], &scale, 4);
      const float pre = amax < 0x1p-100f ? 0x1p64f : 1.f, inv = amax == 0.f ? 0.f : 448.f / (amax * pre);
      for (int h = b * 128; h < h1; ++h) want[(size_t)t * rb + h] = ref_e4m3(bf2f(x[(size_t)t * H + h]) * pre * inv);
    }
  return want;
}

static RankInput make_input(std::mt19937_64& rng, const Case& cs, int R, int rank, int T, int round) {
  RankInput in;
  in.T = T;
  const int E = cs.E, K = cs.K, H = cs.H, L = E / R;
  in.x.resize((size_t)T * H);
  if (cs.quant) {
    // Positive bf16 values of one magnitude range per 128-block (2^-20 .. 2^20, a zero block now
    // and then): the codes round. The rows expected are the CPU reference's quantization, and the
    // combine's reference takes the values they stand for (row_value); x stays unused.
    std::uniform_real_distribution<float> uni(1.f, 2.f);
    std::uniform_int_distribution<int> expo(-20, 20);
    in.xIn.resize((size_t)T * H);
    for (int t = 0; t < T; ++t)
      for (int b = 0; b * 128 < H; ++b) {
        const int e = expo(rng);
        const bool zero = (t * 7 + b) % 23 == 5;
        for (int h = b * 128; h < std::min(H, b * 128 + 128); ++h)
          in.xIn[(size_t)t * H + h] = zero ? 0 : f2bf(ldexpf(uni(rng), e - (int)(uni(rng) * 3.f)));
      }
    in.x8 = ref_quantize_rows(in.xIn, T, H);
  } else if (cs.fp8) {
    // Random positive normal codes (0x08..0x7e) and power-of-two scales: every value and its
    // fake-expert product are exact in bf16, so the combine reference is the bf16 one.
    const uint64_t rb = moe_fp8_row_bytes(H);
    const int S = moe_fp8_scales(H);
    in.x8.assign((size_t)T * rb, 0);
    std::uniform_int_distribution<int> code(0x08, 0x7e), expo(-2, 2);
    for (int t = 0; t < T; ++t) {
      uint8_t* row = &in.x8[(size_t)t * rb];
      std::vector<float> scale(S);
      for (int b = 0; b < S; ++b) {
        scale[b] = ldexpf(1.f, expo(rng));
        memcpy(row + H + 4 * b, &scale[b], 4);
      }
      for (int h = 0; h < H; ++h) {
        row[h] = (uint8_t)code(rng);
        in.x[(size_t)t * H + h] = f2bf(e4m3_value(row[h]) * scale[h / 128]);
      }
    }
  } else {
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < H; ++h) in.x[(size_t)t * H + h] = x_value(rank, t, h, round);
  }
  in.idx.assign((size_t)T * K, -1);
  in.w.resize((size_t)T * K);
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  std::vector<int> perm(E);
  for (int t = 0; t < T; ++t) {
    for (int k = 0; k < K; ++k) in.w[(size_t)t * K + k] = (float)(0.05 + 0.95 * uni(rng));
    int* row = &in.idx[(size_t)t * K];
    switch (cs.routing) {
      case ALL_MASKED: break;
      case ONE_EXPERT: row[0] = E - 1; break;
      case ZIPF:
        zipf_experts(rng, E, K, row);
        for (int k = 0; k < K; ++k)
          if (uni(rng) < cs.maskProb) row[k] = -1;
        break;
      case RANK0_ONLY:
      case UNIFORM:
      case INVALID_IDS: {
        const int pool = cs.routing == RANK0_ONLY ? L : E;
        for (int i = 0; i < pool; ++i) perm[i] = i;
        for (int k = 0; k < K && k < pool; ++k) {
          std::uniform_int_distribution<int> pick(k, pool - 1);
          std::swap(perm[k], perm[pick(rng)]);
          row[k] = uni(rng) < cs.maskProb ? -1 : perm[k];
        }
        if (cs.routing == INVALID_IDS) {
          for (int k = 0; k < K; ++k) {
            const double u = uni(rng);
            if (u < 0.05) row[k] = E + (int)(uni(rng) * 100);         // out of range
            else if (u < 0.10) row[k] = -2 - (int)(uni(rng) * 100);  // below -1
            else if (u < 0.15 && k > 0) row[k] = row[0];             // repeat of slot 0
          }
        }
        break;
      }
    }
  }
  validate_ids(in, E, K);
  return in;
}

// CPU reference of one rank's dispatch result: rows (source, token, k) in expert-major order.
struct RefRow {
  int src, t, k;
};
static void reference_dispatch(const std::vector<RankInput>& in, int R, int E, int K, int d, std::vector<RefRow>& rows,
                               std::vector<int>& counts) {
  const int L = E / R;
  rows.clear();
  counts.assign(L, 0);
  for (int e = 0; e < L; ++e) {
    const int ge = d * L + e;
    for (int s = 0; s < R; ++s)
      for (int t = 0; t < in[s].T; ++t)
        for (int k = 0; k < K; ++k)
          if (in[s].ev[(size_t)t * K + k] == ge) {
            rows.push_back({s, t, k});
            counts[e]++;
          }
  }
}

// Fake expert output of one element (exactly what fake_expert_kernel computes).
// v: the value the dispatched row holds (row_value).
static uint16_t fake_out(float v, int globalExpert) { return f2bf(v * (float)(1 + globalExpert)); }
// Element h of token t's dispatched row as fake_expert_kernel reads it: the bf16 value, or the fp8
// code times its block's scale (a float product, as the kernel computes it).
static float row_value(const RankInput& ri, bool fp8, int H, int t, int h) {
  if (!fp8) return bf2f(ri.x[(size_t)t * H + h]);
  const uint8_t* row = &ri.x8[(size_t)t * moe_fp8_row_bytes(H)];
  float scale;
  memcpy(&scale, row + H + 4 * (h / 128), 4);
  return e4m3_value(row[h]) * scale;
}

// ------------------------------------------------------------------------------------------------
// Per-rank device state for one configuration.
// ------------------------------------------------------------------------------------------------
struct Rank {
  int dev = 0;
  cudaStream_t stream = nullptr;
  // GIN
  uint8_t* window = nullptr;
  uint8_t* ws = nullptr;
  uint64_t* peerBases = nullptr;
  uint32_t* err = nullptr;
  uint16_t *x = nullptr, *recvX = nullptr, *expertOut = nullptr, *y = nullptr;
  uint16_t* xb = nullptr;  // fp8 setups: bf16 rows for the quantizing inputs (Setup::input)
  uint8_t* xq = nullptr;   // fp8 setups: [M] fp8 rows, the quantizing dispatch's scratch
  int *idx = nullptr, *recvCounts = nullptr;
  float *w = nullptr, *recvWeights = nullptr;
  // HOST
  uint8_t* hws = nullptr;
  uint16_t *sendRows = nullptr, *recvBuf = nullptr, *hRecvX = nullptr, *hExpertOut = nullptr, *backBuf = nullptr,
           *returned = nullptr, *hy = nullptr;
  float *sendWeights = nullptr, *recvBufWeights = nullptr, *hRecvWeights = nullptr;
  int *countMatrix = nullptr, *hRecvCounts = nullptr;
};

// A pair of GIN entry points (moe_gin.cu, "Entry points").
using DispatchKernel = decltype(&moe_gin_dispatch);
using Fp8DispatchKernel = decltype(&moe_gin_dispatch_fp8);  // the same struct; these read xq
using CombineKernel = decltype(&moe_gin_combine);
struct Entry {
  std::string name;  // the dispatch's
  DispatchKernel dispatch;  // bf16 entries
  CombineKernel combine;
  Fp8DispatchKernel dispatch8 = nullptr;  // fp8 entries (dispatch null)
};
static const Entry kGenericEntry{"moe_gin_dispatch", moe_gin_dispatch, moe_gin_combine};
static const Entry kTokenPathEntry{"moe_gin_dispatch_tp", moe_gin_dispatch_tp, moe_gin_combine_tp};
// fp8 dispatch entries, each with the bf16 combine of the same reach.
static const Entry kFp8GenericEntry{"moe_gin_dispatch_fp8", nullptr, moe_gin_combine, moe_gin_dispatch_fp8};
static const Entry kFp8TokenPathEntry{"moe_gin_dispatch_fp8_tp", nullptr, moe_gin_combine_tp, moe_gin_dispatch_fp8_tp};
// One rank alone, any shape.
static const Entry kAloneEntry{"moe_gin_dispatch_tp_r1", moe_gin_dispatch_tp_r1, moe_gin_combine_tp_r1};
static const Entry kFp8AloneEntry{"moe_gin_dispatch_fp8_tp_r1", nullptr, moe_gin_combine_tp_r1, moe_gin_dispatch_fp8_tp_r1};
// The entry of MOE_TP_SHAPES (fp8: MOE_TP_FP8_SHAPES) compiled for (R, E, K, H), if there is one.
static bool shaped_entry(int R, int E, int K, int H, Entry& e, bool fp8 = false) {
#define MOE_TEST_SHAPED(R_, E_, K_, H_)                                                                  \
  if (!fp8 && R == R_ && E == E_ && K == K_ && H == H_) {                                              \
    e = {"moe_gin_dispatch_tp_r" #R_ "_e" #E_ "_k" #K_ "_h" #H_, moe_gin_dispatch_tp_r##R_##_e##E_##_k##K_##_h##H_, \
         moe_gin_combine_tp_r##R_##_e##E_##_k##K_##_h##H_};                                           \
    return true;                                                                                       \
  }
  MOE_TP_SHAPES(MOE_TEST_SHAPED)
#undef MOE_TEST_SHAPED
#define MOE_TEST_SHAPED_FP8(R_, E_, K_, H_)                                                             \
  if (fp8 && R == R_ && E == E_ && K == K_ && H == H_) {                                               \
    e = {"moe_gin_dispatch_fp8_tp_r" #R_ "_e" #E_ "_k" #K_ "_h" #H_, nullptr,                          \
         moe_gin_combine_tp_r##R_##_e##E_##_k##K_##_h##H_, moe_gin_dispatch_fp8_tp_r##R_##_e##E_##_k##K_##_h##H_}; \
    return true;                                                                                       \
  }
  MOE_TP_FP8_SHAPES(MOE_TEST_SHAPED_FP8)
#undef MOE_TEST_SHAPED_FP8
  return false;
}
// What the Java side launches (MoeAllToAll.entryPoint): the shape's own token-path entry, else at
// one rank the one-rank entry, else the token-path one; off the token path the generic one. At one
// rank the combine is always the one-rank one (faster than the shaped one-rank combine).
static Entry best_entry(int R, int E, int K, int H, int M, int C, bool fp8 = false) {
  if (!moe_token_path(K, M, C)) return fp8 ? kFp8GenericEntry : kGenericEntry;
  Entry e;
  if (shaped_entry(R, E, K, H, e, fp8)) {
    if (R == 1) e.combine = moe_gin_combine_tp_r1;
    return e;
  }
  if (R == 1) return fp8 ? kFp8AloneEntry : kAloneEntry;
  return fp8 ? kFp8TokenPathEntry : kTokenPathEntry;
}

struct Setup {
  int R, E, K, H, M, C, L;
  Entry entry;  // the kernels gin_dispatch / gin_combine launch
  bool pdl = false;  // launched with programmatic dependent launch (the kernels wait for prior grids)
  bool fp8 = false;  // dispatch rows are scaled fp8 rows (the buffers keep bf16 sizes, never smaller)
  // fp8: what the dispatch gets. ROWS: the fp8 rows (x). QUANT_FUSED: the bf16 rows (xb), quantized
  // by the dispatch into xq. QUANT_KERNEL: moe_fp8_quantize(xb -> xq), then the dispatch of xq.
  enum Input { ROWS, QUANT_FUSED, QUANT_KERNEL } input = ROWS;
  uint64_t rowBytes, capRows, sendCapRows;
  uint64_t dispRowBytes;  // bytes of a dispatch row: rowBytes, or moe_fp8_row_bytes(H)
  MoeWindowLayout wl;
  MoeWorkspaceLayout wsl;
  std::vector<Rank> rk;
};

// The kernels' argument structs (abi/moe.h): rank r's dims with H elements per row.
static MoeDims dims_of(const Setup& s, int r, int H) {
  MoeDims d;
  d.rank = r;
  d.nRanks = s.R;
  d.numExperts = s.E;
  d.topK = s.K;
  d.hidden = H;
  d.maxTokens = s.M;
  d.numChannels = s.C;
  d.expertAlignment = 1;  // packed, as before the field existed
  return d;
}
static MoeFp8QuantizeArgs quantize_args(const uint16_t* x, int T, int H, uint8_t* out, uint32_t* err) {
  MoeFp8QuantizeArgs a;
  a.x = x;
  a.out = out;
  a.errorFlags = err;
  a.numTokens = T;
  a.hidden = H;
  return a;
}

static int gNumGpus = 0;
static int gNumRanks = 0;  // --ranks: R ranks over the GPUs, rank r on GPU r % gNumGpus
static int gSmCount = 0;
static int gRanksPerGpu = 1;
static int dev_of(int rank) { return rank % gNumGpus; }

template <typename T>
static T* dmalloc(size_t bytes) {
  void* p = nullptr;
  CUDA_CHECK(cudaMalloc(&p, bytes < 16 ? 16 : bytes));
  return (T*)p;
}

static Setup make_setup(int E, int K, int H, int M, int C, bool withHost, bool fp8 = false) {
  Setup s;
  s.fp8 = fp8;
  s.R = gNumRanks;
  s.E = E;
  s.K = K;
  s.H = H;
  s.M = M;
  s.C = C;
  s.L = E / s.R;
  if (!moe_sizes_ok(s.R, E, K, H, M) || C < 1 || C > MOE_MAX_CHANNELS) {
    fprintf(stderr, "configuration outside the kernels' limits: R=%d E=%d K=%d H=%d M=%d C=%d\n", s.R, E, K, H, M, C);
    exit(2);
  }
  // Ranks that share a GPU wait for each other inside a call, so all their grids (2C blocks of
  // MOE_THREADS each, one per SM) must be resident together. One rank per GPU needs no such
  // limit: its blocks wait only for lower blocks and for the other GPUs.
  if (gRanksPerGpu > 1 && gRanksPerGpu * 2 * C > gSmCount) {
    fprintf(stderr, "C=%d: %d ranks per GPU need %d SMs for their grids together, the GPU has %d (lower --channels)\n", C,
            gRanksPerGpu, gRanksPerGpu * 2 * C, gSmCount);
    exit(2);
  }
  s.entry = best_entry(s.R, E, K, H, M, C, fp8);
  s.rowBytes = 2ull * H;
  s.dispRowBytes = fp8 ? moe_fp8_row_bytes(H) : s.rowBytes;
  s.capRows = moe_recv_capacity_rows(s.R, E, K, M);
  s.sendCapRows = (uint64_t)M * K;
  s.wl = moe_window_layout(s.R, E, K, H, M);
  s.wsl = moe_workspace_layout(s.R, E, K, M);
  s.rk.resize(s.R);
  std::vector<uint64_t> bases(s.R);
  for (int r = 0; r < s.R; ++r) {
    Rank& q = s.rk[r];
    q.dev = dev_of(r);
    CUDA_CHECK(cudaSetDevice(q.dev));
    CUDA_CHECK(cudaStreamCreateWithFlags(&q.stream, cudaStreamNonBlocking));
    q.window = dmalloc<uint8_t>(s.wl.totalBytes);
    CUDA_CHECK(cudaMemset(q.window, 0, s.wl.totalBytes));
    q.ws = dmalloc<uint8_t>(s.wsl.totalBytes);
    CUDA_CHECK(cudaMemset(q.ws, 0, s.wsl.totalBytes));
    q.peerBases = dmalloc<uint64_t>(8ull * s.R);
    q.err = dmalloc<uint32_t>(4);
    CUDA_CHECK(cudaMemset(q.err, 0, 4));
    q.x = dmalloc<uint16_t>((size_t)M * s.rowBytes);
    q.idx = dmalloc<int>((size_t)M * K * 4);
    q.w = dmalloc<float>((size_t)M * K * 4);
    q.recvX = dmalloc<uint16_t>(s.capRows * s.rowBytes);
    q.expertOut = dmalloc<uint16_t>(s.capRows * s.rowBytes);
    q.recvWeights = dmalloc<float>(s.capRows * 4);
    q.recvCounts = dmalloc<int>(4ull * s.L);
    q.y = dmalloc<uint16_t>((size_t)M * s.rowBytes);
    if (fp8) {
      q.xb = dmalloc<uint16_t>((size_t)M * s.rowBytes);
      q.xq = dmalloc<uint8_t>((size_t)M * s.dispRowBytes);
    }
    if (withHost) {
      q.hws = dmalloc<uint8_t>(s.wsl.totalBytes);
      CUDA_CHECK(cudaMemset(q.hws, 0, s.wsl.totalBytes));
      q.sendRows = dmalloc<uint16_t>(s.sendCapRows * s.rowBytes);
      q.sendWeights = dmalloc<float>(s.sendCapRows * 4);
      q.recvBuf = dmalloc<uint16_t>(s.capRows * s.rowBytes);
      q.recvBufWeights = dmalloc<float>(s.capRows * 4);
      q.countMatrix = dmalloc<int>(4ull * s.R * s.L);
      q.hRecvX = dmalloc<uint16_t>(s.capRows * s.rowBytes);
      q.hExpertOut = dmalloc<uint16_t>(s.capRows * s.rowBytes);
      q.hRecvWeights = dmalloc<float>(s.capRows * 4);
      q.hRecvCounts = dmalloc<int>(4ull * s.L);
      q.backBuf = dmalloc<uint16_t>(s.capRows * s.rowBytes);
      q.returned = dmalloc<uint16_t>(s.sendCapRows * s.rowBytes);
      q.hy = dmalloc<uint16_t>((size_t)M * s.rowBytes);
    }
    bases[r] = (uint64_t)(uintptr_t)q.window;
  }
  for (int r = 0; r < s.R; ++r) {
    CUDA_CHECK(cudaSetDevice(dev_of(r)));
    CUDA_CHECK(cudaMemcpy(s.rk[r].peerBases, bases.data(), 8ull * s.R, cudaMemcpyHostToDevice));
  }
  for (int r = 0; r < s.R; ++r) {
    CUDA_CHECK(cudaSetDevice(dev_of(r)));
    CUDA_CHECK(cudaDeviceSynchronize());
  }
  return s;
}

static void free_setup(Setup& s) {
  for (auto& q : s.rk) {
    CUDA_CHECK(cudaSetDevice(q.dev));
    CUDA_CHECK(cudaDeviceSynchronize());
    void* ptrs[] = {q.window, q.ws, q.peerBases, q.err, q.x, q.idx, q.w, q.recvX, q.expertOut, q.recvWeights,
                    q.recvCounts, q.y, q.hws, q.sendRows, q.sendWeights, q.recvBuf, q.recvBufWeights, q.countMatrix,
                    q.hRecvX, q.hExpertOut, q.hRecvWeights, q.hRecvCounts, q.backBuf, q.returned, q.hy, q.xb, q.xq};
    for (void* p : ptrs)
      if (p) CUDA_CHECK(cudaFree(p));
    CUDA_CHECK(cudaStreamDestroy(q.stream));
  }
  s.rk.clear();
}

static void sync_all(Setup& s) {
  for (auto& q : s.rk) {
    CUDA_CHECK(cudaSetDevice(q.dev));
    CUDA_CHECK(cudaStreamSynchronize(q.stream));
  }
}

static void upload_inputs(Setup& s, const std::vector<RankInput>& in) {
  for (int r = 0; r < s.R; ++r) {
    Rank& q = s.rk[r];
    CUDA_CHECK(cudaSetDevice(q.dev));
    if (in[r].T > 0) {
      if (s.fp8) {
        CUDA_CHECK(cudaMemcpy(q.x, in[r].x8.data(), in[r].x8.size(), cudaMemcpyHostToDevice));
        const std::vector<uint16_t>& xb = in[r].xIn.empty() ? in[r].x : in[r].xIn;  // what the fp8 rows stand for
        CUDA_CHECK(cudaMemcpy(q.xb, xb.data(), xb.size() * 2, cudaMemcpyHostToDevice));
      } else {
        CUDA_CHECK(cudaMemcpy(q.x, in[r].x.data(), in[r].x.size() * 2, cudaMemcpyHostToDevice));
      }
      CUDA_CHECK(cudaMemcpy(q.idx, in[r].idx.data(), in[r].idx.size() * 4, cudaMemcpyHostToDevice));
      CUDA_CHECK(cudaMemcpy(q.w, in[r].w.data(), in[r].w.size() * 4, cudaMemcpyHostToDevice));
    }
  }
}

// Outputs poisoned before each run (bf16 0xFFFF is a NaN, int -1, float NaN).
static void poison_outputs(Setup& s) {
  for (auto& q : s.rk) {
    CUDA_CHECK(cudaSetDevice(q.dev));
    CUDA_CHECK(cudaMemsetAsync(q.recvX, 0xFF, s.capRows * s.rowBytes, q.stream));
    CUDA_CHECK(cudaMemsetAsync(q.expertOut, 0xFF, s.capRows * s.rowBytes, q.stream));
    CUDA_CHECK(cudaMemsetAsync(q.recvWeights, 0xFF, s.capRows * 4, q.stream));
    CUDA_CHECK(cudaMemsetAsync(q.recvCounts, 0xFF, 4ull * s.L, q.stream));
    CUDA_CHECK(cudaMemsetAsync(q.y, 0xFF, (size_t)s.M * s.rowBytes, q.stream));
    if (q.hws) {
      CUDA_CHECK(cudaMemsetAsync(q.sendRows, 0xFF, s.sendCapRows * s.rowBytes, q.stream));
      CUDA_CHECK(cudaMemsetAsync(q.recvBuf, 0xFF, s.capRows * s.rowBytes, q.stream));
      CUDA_CHECK(cudaMemsetAsync(q.hRecvX, 0xFF, s.capRows * s.rowBytes, q.stream));
      CUDA_CHECK(cudaMemsetAsync(q.hExpertOut, 0xFF, s.capRows * s.rowBytes, q.stream));
      CUDA_CHECK(cudaMemsetAsync(q.hRecvWeights, 0xFF, s.capRows * 4, q.stream));
      CUDA_CHECK(cudaMemsetAsync(q.hRecvCounts, 0xFF, 4ull * s.L, q.stream));
      CUDA_CHECK(cudaMemsetAsync(q.backBuf, 0xFF, s.capRows * s.rowBytes, q.stream));
      CUDA_CHECK(cudaMemsetAsync(q.returned, 0xFF, s.sendCapRows * s.rowBytes, q.stream));
      CUDA_CHECK(cudaMemsetAsync(q.hy, 0xFF, (size_t)s.M * s.rowBytes, q.stream));
    }
  }
}

// ------------------------------------------------------------------------------------------------
// Launchers.
// ------------------------------------------------------------------------------------------------
// Grid 2C x MOE_THREADS on rank r's stream; with s.pdl the programmatic-stream-serialization
// attribute lets the kernel start while the previous one on the stream drains.
template <typename Kernel, typename... Args>
static void gin_launch(Setup& s, int r, Kernel kernel, Args... args) {
  Rank& q = s.rk[r];
  CUDA_CHECK(cudaSetDevice(q.dev));
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(2 * s.C);
  cfg.blockDim = dim3(MOE_THREADS);
  cfg.stream = q.stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = s.pdl ? 1 : 0;
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, args...));
}
static void gin_dispatch(Setup& s, int r, const uint16_t* x, const int* idx, const float* w, int T, uint8_t* xq = nullptr) {
  Rank& q = s.rk[r];
  MoeGinDispatchArgs a;
  a.x = x;
  a.topkIdx = idx;
  a.topkWeights = w;
  a.recvX = (uint16_t*)q.recvX;
  a.recvWeights = (float*)q.recvWeights;
  a.recvCounts = (int*)q.recvCounts;
  a.peerBases = (const uint64_t*)q.peerBases;
  a.workspace = (uint8_t*)q.ws;
  a.errorFlags = (uint32_t*)q.err;
  a.xq = xq;
  a.dims = dims_of(s, r, s.H);
  a.numTokens = T;
  gin_launch(s, r, s.entry.dispatch8 ? s.entry.dispatch8 : s.entry.dispatch, a);
}
// moe_fp8_quantize's grid of 256-thread blocks for T rows, as Fp8Rows launches it (4 blocks of 128
// elements per warp).
static int quantize_grid(int T, int H) { return std::max(1, std::min(8 * gSmCount, (T * moe_fp8_scales(H) + 31) / 32)); }
// moe_fp8_quantize over T rows of x into out on rank r's stream.
static void quantize_rows(Setup& s, int r, const uint16_t* x, int T, uint8_t* out) {
  Rank& q = s.rk[r];
  CUDA_CHECK(cudaSetDevice(q.dev));
  moe_fp8_quantize<<<quantize_grid(T, s.H), 256, 0, q.stream>>>(quantize_args(x, T, s.H, out, q.err));
  CUDA_CHECK(cudaGetLastError());
}
// Rank r's dispatch of its inputs (x, idx, w of the setup) the way s.input says.
static void dispatch_rank(Setup& s, int r, int T) {
  Rank& q = s.rk[r];
  if (s.input == Setup::QUANT_FUSED) {
    gin_dispatch(s, r, q.xb, q.idx, q.w, T, q.xq);
  } else if (s.input == Setup::QUANT_KERNEL) {
    quantize_rows(s, r, q.xb, T, q.xq);
    gin_dispatch(s, r, (const uint16_t*)q.xq, q.idx, q.w, T);
  } else {
    gin_dispatch(s, r, q.x, q.idx, q.w, T);
  }
}
// expertOutRows: rows q.expertOut may be read at (-1: the receive capacity).
static void gin_combine(Setup& s, int r, int T, uint16_t* y, int expertOutRows = -1) {
  Rank& q = s.rk[r];
  MoeGinCombineArgs a;
  a.expertOut = (const uint16_t*)q.expertOut;
  a.recvWeights = (const float*)q.recvWeights;
  a.y = y;
  a.peerBases = (const uint64_t*)q.peerBases;
  a.workspace = (uint8_t*)q.ws;
  a.errorFlags = (uint32_t*)q.err;
  a.dims = dims_of(s, r, s.H);
  a.numTokens = T;
  a.expertOutRows = expertOutRows < 0 ? (int)s.capRows : expertOutRows;
  gin_launch(s, r, s.entry.combine, a);
}
// moe_gin_row_values on rank r's stream: one f32 per received row (vals) back to g[T][K].
static void gin_row_values(Setup& s, int r, const float* vals, int T, float* g) {
  Rank& q = s.rk[r];
  CUDA_CHECK(cudaSetDevice(q.dev));
  MoeGinRowValuesArgs a;
  a.rowValues = vals;
  a.g = g;
  a.peerBases = (const uint64_t*)q.peerBases;
  a.workspace = q.ws;
  a.errorFlags = q.err;
  a.dims = dims_of(s, r, s.H);
  a.numTokens = T;
  moe_gin_row_values<<<s.C, MOE_THREADS, 0, q.stream>>>(a);
  CUDA_CHECK(cudaGetLastError());
}
static void fake_expert(Setup& s, int r, const uint16_t* in, uint16_t* out, const int* counts) {
  Rank& q = s.rk[r];
  CUDA_CHECK(cudaSetDevice(q.dev));
  fake_expert_kernel<<<2 * gSmCount, 256, 0, q.stream>>>((const uint8_t*)in, out, counts, s.L, r, s.H, (int)s.capRows, s.fp8);
  CUDA_CHECK(cudaGetLastError());
}

static const int kHostThreads = 512;
static int host_grid(uint64_t warps) {
  uint64_t blocks = (warps * 32 + kHostThreads - 1) / kHostThreads;
  if (blocks < 1) blocks = 1;
  if (blocks > (uint64_t)gSmCount * 4) blocks = (uint64_t)gSmCount * 4;
  return (int)blocks;
}

// The HOST kernels' argument structs for rank r (q = s.rk[r]).
static MoeHostLayoutArgs host_layout_args(const Setup& s, int r, int T) {
  const Rank& q = s.rk[r];
  MoeHostLayoutArgs a;
  a.topkIdx = q.idx;
  a.workspace = q.hws;
  a.errorFlags = q.err;
  a.dims = dims_of(s, r, s.H);
  a.numTokens = T;
  return a;
}
static MoeHostPackArgs host_pack_args(const Setup& s, int r, const uint16_t* x, int T) {
  const Rank& q = s.rk[r];
  MoeHostPackArgs a;
  a.x = x;
  a.topkIdx = q.idx;
  a.topkWeights = q.w;
  a.workspace = q.hws;
  a.sendRows = q.sendRows;
  a.sendWeights = q.sendWeights;
  a.errorFlags = q.err;
  a.dims = dims_of(s, r, s.H);
  a.numTokens = T;
  return a;
}
static MoeHostPermuteArgs host_permute_args(const Setup& s, int r) {
  const Rank& q = s.rk[r];
  MoeHostPermuteArgs a;
  a.recvBuf = q.recvBuf;
  a.recvBufWeights = q.recvBufWeights;
  a.countMatrix = q.countMatrix;
  a.recvX = q.hRecvX;
  a.recvWeights = q.hRecvWeights;
  a.recvCounts = q.hRecvCounts;
  a.errorFlags = q.err;
  a.dims = dims_of(s, r, s.H);
  return a;
}
static MoeHostUnpermuteArgs host_unpermute_args(const Setup& s, int r, const uint16_t* expertOut, int H) {
  const Rank& q = s.rk[r];
  MoeHostUnpermuteArgs a;
  a.expertOut = expertOut;
  a.countMatrix = q.countMatrix;
  a.backBuf = q.backBuf;
  a.errorFlags = q.err;
  a.dims = dims_of(s, r, H);
  return a;
}
static MoeHostCombineArgs host_combine_args(const Setup& s, int r, const uint16_t* returned, int T) {
  const Rank& q = s.rk[r];
  MoeHostCombineArgs a;
  a.returned = returned;
  a.topkIdx = q.idx;
  a.topkWeights = q.w;
  a.workspace = q.hws;
  a.y = q.hy;
  a.errorFlags = q.err;
  a.dims = dims_of(s, r, s.H);
  a.numTokens = T;
  return a;
}

// HOST backend, full round trip with the exchanges emulated by peer copies. Host-side counts
// come from the layout (the library exchanges them with ncclAlltoAll and copies them to the host).
struct HostCounts {
  std::vector<std::vector<int>> expertCount, expertOffset;  // [rank][E], [rank][E+1]
};

static void host_layout_all(Setup& s, const std::vector<int>& T) {
  for (int r = 0; r < s.R; ++r) {
    Rank& q = s.rk[r];
    CUDA_CHECK(cudaSetDevice(q.dev));
    moe_host_layout<<<s.C, MOE_THREADS, 0, q.stream>>>(host_layout_args(s, r, T[r]));
    CUDA_CHECK(cudaGetLastError());
  }
}

static HostCounts host_read_counts(Setup& s) {
  HostCounts hc;
  hc.expertCount.resize(s.R);
  hc.expertOffset.resize(s.R);
  sync_all(s);
  for (int r = 0; r < s.R; ++r) {
    CUDA_CHECK(cudaSetDevice(dev_of(r)));
    hc.expertCount[r].resize(s.E);
    hc.expertOffset[r].resize(s.E + 1);
    CUDA_CHECK(cudaMemcpy(hc.expertCount[r].data(), s.rk[r].hws + s.wsl.expertCount, 4ull * s.E, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(hc.expertOffset[r].data(), s.rk[r].hws + s.wsl.expertOffset, 4ull * (s.E + 1),
                          cudaMemcpyDeviceToHost));
  }
  return hc;
}

// Rows s sends to d (device-side order: global experts of d, token order).
static int rows_between(const HostCounts& hc, int s, int d, int L) {
  return hc.expertOffset[s][(d + 1) * L] - hc.expertOffset[s][d * L];
}

static void host_upload_count_matrix(Setup& s, const HostCounts& hc) {
  for (int d = 0; d < s.R; ++d) {
    std::vector<int> m((size_t)s.R * s.L);
    for (int src = 0; src < s.R; ++src)
      for (int e = 0; e < s.L; ++e) m[(size_t)src * s.L + e] = hc.expertCount[src][d * s.L + e];
    CUDA_CHECK(cudaSetDevice(dev_of(d)));
    CUDA_CHECK(cudaMemcpy(s.rk[d].countMatrix, m.data(), m.size() * 4, cudaMemcpyHostToDevice));
  }
}

static void host_pack_all(Setup& s, const std::vector<int>& T) {
  for (int r = 0; r < s.R; ++r) {
    Rank& q = s.rk[r];
    CUDA_CHECK(cudaSetDevice(q.dev));
    // quantizing inputs: moe_fp8_quantize first, as the Java HOST path does
    const bool quant = s.input != Setup::ROWS;
    if (quant) quantize_rows(s, r, q.xb, T[r], q.xq);
    (s.fp8 ? moe_host_pack_fp8 : moe_host_pack)<<<host_grid((uint64_t)T[r]), kHostThreads, 0, q.stream>>>(
        host_pack_args(s, r, quant ? (const uint16_t*)q.xq : q.x, T[r]));
    CUDA_CHECK(cudaGetLastError());
  }
}

// Emulated exchange: d receives from every s (source-major) into recvBuf, or the way back.
// back: from backBuf to returned, rows of backRowBytes (0: s.rowBytes).
static void host_exchange(Setup& s, const HostCounts& hc, bool back, uint64_t backRowBytes = 0) {
  const uint64_t rb = backRowBytes != 0 ? backRowBytes : s.rowBytes;
  std::vector<cudaEvent_t> ev(s.R);
  for (int r = 0; r < s.R; ++r) {
    CUDA_CHECK(cudaSetDevice(dev_of(r)));
    CUDA_CHECK(cudaEventCreateWithFlags(&ev[r], cudaEventDisableTiming));
    CUDA_CHECK(cudaEventRecord(ev[r], s.rk[r].stream));
  }
  for (int r = 0; r < s.R; ++r) {  // every stream waits for every producer's kernels
    CUDA_CHECK(cudaSetDevice(dev_of(r)));
    for (int o = 0; o < s.R; ++o) CUDA_CHECK(cudaStreamWaitEvent(s.rk[r].stream, ev[o], 0));
  }
  for (int d = 0; d < s.R; ++d) {
    uint64_t recvRow = 0;  // row in d's source-major buffer
    for (int src = 0; src < s.R; ++src) {
      const int n = rows_between(hc, src, d, s.L);
      const uint64_t sendRow = (uint64_t)hc.expertOffset[src][d * s.L];
      if (n > 0) {
        if (!back) {
          CUDA_CHECK(cudaSetDevice(dev_of(src)));
          CUDA_CHECK(cudaMemcpyPeerAsync((uint8_t*)s.rk[d].recvBuf + recvRow * s.dispRowBytes, dev_of(d),
                                         (uint8_t*)s.rk[src].sendRows + sendRow * s.dispRowBytes, dev_of(src),
                                         n * s.dispRowBytes, s.rk[src].stream));
          CUDA_CHECK(cudaMemcpyPeerAsync(s.rk[d].recvBufWeights + recvRow, dev_of(d), s.rk[src].sendWeights + sendRow, dev_of(src),
                                         4ull * n, s.rk[src].stream));
        } else {
          CUDA_CHECK(cudaSetDevice(dev_of(d)));
          CUDA_CHECK(cudaMemcpyPeerAsync((uint8_t*)s.rk[src].returned + sendRow * rb, dev_of(src),
                                         (uint8_t*)s.rk[d].backBuf + recvRow * rb, dev_of(d), n * rb, s.rk[d].stream));
        }
      }
      recvRow += (uint64_t)n;
    }
  }
  for (int r = 0; r < s.R; ++r) {
    CUDA_CHECK(cudaSetDevice(dev_of(r)));
    CUDA_CHECK(cudaEventRecord(ev[r], s.rk[r].stream));
  }
  for (int r = 0; r < s.R; ++r) {
    CUDA_CHECK(cudaSetDevice(dev_of(r)));
    for (int o = 0; o < s.R; ++o) CUDA_CHECK(cudaStreamWaitEvent(s.rk[r].stream, ev[o], 0));
  }
  sync_all(s);
  for (int r = 0; r < s.R; ++r) {
    CUDA_CHECK(cudaSetDevice(dev_of(r)));
    CUDA_CHECK(cudaEventDestroy(ev[r]));
  }
}

static void host_permute_all(Setup& s) {
  for (int r = 0; r < s.R; ++r) {
    Rank& q = s.rk[r];
    CUDA_CHECK(cudaSetDevice(q.dev));
    (s.fp8 ? moe_host_permute_fp8 : moe_host_permute)<<<host_grid(s.capRows), kHostThreads, 0, q.stream>>>(
        host_permute_args(s, r));
    CUDA_CHECK(cudaGetLastError());
  }
}
static void host_unpermute_all(Setup& s) {
  for (int r = 0; r < s.R; ++r) {
    Rank& q = s.rk[r];
    CUDA_CHECK(cudaSetDevice(q.dev));
    moe_host_unpermute<<<host_grid(s.capRows), kHostThreads, 0, q.stream>>>(host_unpermute_args(s, r, q.hExpertOut, s.H));
    CUDA_CHECK(cudaGetLastError());
  }
}
static void host_combine_all(Setup& s, const std::vector<int>& T) {
  for (int r = 0; r < s.R; ++r) {
    Rank& q = s.rk[r];
    CUDA_CHECK(cudaSetDevice(q.dev));
    moe_host_combine<<<host_grid((uint64_t)T[r]), kHostThreads, 0, q.stream>>>(host_combine_args(s, r, q.returned, T[r]));
    CUDA_CHECK(cudaGetLastError());
  }
}

// ------------------------------------------------------------------------------------------------
// Checks.
// ------------------------------------------------------------------------------------------------
static int gPassed = 0, gFailed = 0;
static void record(bool ok, const std::string& what, const std::string& detail) {
  if (ok) {
    ++gPassed;
  } else {
    ++gFailed;
    printf("  FAIL %s: %s\n", what.c_str(), detail.c_str());
  }
}

struct DispatchResult {
  std::vector<int> counts;
  std::vector<uint8_t> rows;   // [total][dispatch row bytes]
  std::vector<float> weights;  // [total]
};

static DispatchResult read_dispatch(Setup& s, int r, const uint16_t* recvX, const float* recvWeights,
                                    const int* recvCounts, int expectTotal) {
  DispatchResult d;
  CUDA_CHECK(cudaSetDevice(dev_of(r)));
  d.counts.resize(s.L);
  CUDA_CHECK(cudaMemcpy(d.counts.data(), recvCounts, 4ull * s.L, cudaMemcpyDeviceToHost));
  const uint64_t n = (uint64_t)std::max(0, expectTotal);
  d.rows.resize(n * s.dispRowBytes);
  d.weights.resize(n);
  if (n > 0) {
    CUDA_CHECK(cudaMemcpy(d.rows.data(), recvX, n * s.dispRowBytes, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(d.weights.data(), recvWeights, n * 4, cudaMemcpyDeviceToHost));
  }
  return d;
}

// Compares one rank's dispatch result with the CPU reference; returns "" or the first mismatch.
static std::string check_dispatch(const Setup& s, const std::vector<RankInput>& in, int d, const DispatchResult& got) {
  std::vector<RefRow> rows;
  std::vector<int> counts;
  reference_dispatch(in, s.R, s.E, s.K, d, rows, counts);
  char buf[256];
  for (int e = 0; e < s.L; ++e)
    if (got.counts[e] != counts[e]) {
      snprintf(buf, sizeof buf, "rank %d recvCounts[%d] = %d, expected %d", d, e, got.counts[e], counts[e]);
      return buf;
    }
  for (size_t i = 0; i < rows.size(); ++i) {
    const RefRow& rr = rows[i];
    // the input row as bytes: the fp8 row, or the bf16 row
    const uint8_t* have = &got.rows[i * s.dispRowBytes];
    const uint8_t* want = s.fp8 ? &in[rr.src].x8[(size_t)rr.t * s.dispRowBytes] : (const uint8_t*)&in[rr.src].x[(size_t)rr.t * s.H];
    if (memcmp(want, have, s.dispRowBytes) != 0) {
      size_t b = 0;
      while (want[b] == have[b]) ++b;
      if (s.fp8) {
        snprintf(buf, sizeof buf, "rank %d recvX fp8 row %zu (source %d token %d slot %d): byte %zu = 0x%02x, expected 0x%02x",
                 d, i, rr.src, rr.t, rr.k, b, have[b], want[b]);
      } else {
        uint16_t hv[3] = {0, 0, 0}, got16, want16;  // the element that differs, and the row's tags
        memcpy(hv, have, std::min<size_t>(6, s.rowBytes));
        memcpy(&got16, have + (b & ~(size_t)1), 2);
        memcpy(&want16, want + (b & ~(size_t)1), 2);
        snprintf(buf, sizeof buf,
                 "rank %d recvX row %zu (source %d token %d slot %d): column %zu = %g (tags %g,%g,%g), expected %g",
                 d, i, rr.src, rr.t, rr.k, b / 2, bf2f(got16), bf2f(hv[0]), bf2f(hv[1]), bf2f(hv[2]), bf2f(want16));
      }
      return buf;
    }
    const float ww = in[rr.src].w[(size_t)rr.t * s.K + rr.k];
    if (memcmp(&ww, &got.weights[i], 4) != 0) {
      snprintf(buf, sizeof buf, "rank %d recvWeights[%zu] = %g, expected %g", d, i, got.weights[i], ww);
      return buf;
    }
  }
  return "";
}

// y of rank r against the CPU reference; returns the max relative error, -1 on a hard mismatch.
static double check_combine(const Setup& s, const std::vector<RankInput>& in, int r, const std::vector<uint16_t>& y,
                            double bound, std::string& detail) {
  const RankInput& ri = in[r];
  double maxRel = 0.0;
  char buf[256];
  for (int t = 0; t < ri.T; ++t) {
    for (int h = 0; h < s.H; ++h) {
      double ref = 0.0;
      for (int k = 0; k < s.K; ++k) {
        const int e = ri.ev[(size_t)t * s.K + k];
        if (e < 0) continue;
        ref += (double)ri.w[(size_t)t * s.K + k] * (double)bf2f(fake_out(row_value(ri, s.fp8, s.H, t, h), e));
      }
      const double got = bf2f(y[(size_t)t * s.H + h]);
      if (ref == 0.0) {
        if (got != 0.0) {
          snprintf(buf, sizeof buf, "rank %d y[%d][%d] = %g, expected 0 (all slots masked)", r, t, h, got);
          detail = buf;
          return -1.0;
        }
        continue;
      }
      const double rel = std::fabs(got - ref) / std::fabs(ref);
      if (!(rel <= bound)) {
        snprintf(buf, sizeof buf, "rank %d y[%d][%d] = %.6g, expected %.6g (relative error %.3g > %.3g)", r, t, h, got,
                 ref, rel, bound);
        detail = buf;
        return -1.0;
      }
      maxRel = std::max(maxRel, rel);
    }
  }
  return maxRel;
}

static std::vector<uint32_t> read_errors(Setup& s, bool host) {
  std::vector<uint32_t> out(s.R);
  for (int r = 0; r < s.R; ++r) {
    CUDA_CHECK(cudaSetDevice(dev_of(r)));
    CUDA_CHECK(cudaMemcpy(&out[r], s.rk[r].err, 4, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemset(s.rk[r].err, 0, 4));
  }
  (void)host;
  return out;
}

// Bounds of the combine error (bf16 unit roundoff u = 2^-8; all terms positive): HOST rounds once
// (y), GIN twice (the per-rank partial crossing NVLink, then y).
static const double kHostBound = 0.00392, kGinBound = 0.00786;

// ------------------------------------------------------------------------------------------------
// One f32 per received row back to its (token, k) (the router weights' gradient), both
// backends, after run_case's dispatches. Row (source s, token t, slot k) of rank d's layout holds
// 1 + ((s * M + t) * K + k) + call * 2^20 (exact in f32 at these sizes); s must get that value at
// [t][k], and 0 for masked slots. GIN: moe_gin_row_values on every rank, three calls back to back
// (its buffers alternate by call parity, so the third reuses the first's: the write-after-read
// wait). HOST: moe_host_unpermute of 4-byte rows, the exchange back, moe_host_row_values_in.
// ------------------------------------------------------------------------------------------------
static void check_row_values(Setup& s, const std::vector<RankInput>& in, const std::vector<int>& T, const HostCounts& hc,
                             const std::string& tag) {
  constexpr int kCalls = 3;
  const uint64_t perRank = (uint64_t)s.M * s.K;
  auto value = [&](uint64_t src, uint64_t t, uint64_t k, int call) { return (float)(1 + (src * s.M + t) * s.K + k + ((uint64_t)call << 20)); };
  std::vector<std::vector<float*>> vals(kCalls, std::vector<float*>(s.R)), g(kCalls + 1, std::vector<float*>(s.R));  // g[kCalls]: HOST
  for (int r = 0; r < s.R; ++r) {
    std::vector<RefRow> rows;
    std::vector<int> counts;
    reference_dispatch(in, s.R, s.E, s.K, r, rows, counts);
    CUDA_CHECK(cudaSetDevice(dev_of(r)));
    for (int c = 0; c < kCalls; ++c) {
      std::vector<float> v(std::max<size_t>(1, rows.size()));
      for (size_t i = 0; i < rows.size(); ++i) v[i] = value(rows[i].src, rows[i].t, rows[i].k, c);
      vals[c][r] = dmalloc<float>(v.size() * 4);
      CUDA_CHECK(cudaMemcpy(vals[c][r], v.data(), v.size() * 4, cudaMemcpyHostToDevice));
    }
    for (int c = 0; c <= kCalls; ++c) {
      g[c][r] = dmalloc<float>(perRank * 4);
      CUDA_CHECK(cudaMemset(g[c][r], 0xFF, perRank * 4));  // NaN
    }
  }
  sync_all(s);
  for (int c = 0; c < kCalls; ++c)
    for (int r = 0; r < s.R; ++r) gin_row_values(s, r, vals[c][r], T[r], g[c][r]);
  for (int r = 0; r < s.R; ++r) {
    Rank& q = s.rk[r];
    CUDA_CHECK(cudaSetDevice(q.dev));
    moe_host_unpermute<<<host_grid(s.capRows), kHostThreads, 0, q.stream>>>(
        host_unpermute_args(s, r, (const uint16_t*)vals[0][r], 2));
    CUDA_CHECK(cudaGetLastError());
  }
  host_exchange(s, hc, true, 4);
  for (int r = 0; r < s.R; ++r) {
    Rank& q = s.rk[r];
    CUDA_CHECK(cudaSetDevice(q.dev));
    MoeHostRowValuesArgs a;
    a.returned = (const float*)q.returned;
    a.topkIdx = q.idx;
    a.workspace = q.hws;
    a.g = g[kCalls][r];
    a.errorFlags = q.err;
    a.dims = dims_of(s, r, s.H);
    a.numTokens = T[r];
    moe_host_row_values_in<<<host_grid(perRank / 32 + 1), kHostThreads, 0, q.stream>>>(a);
    CUDA_CHECK(cudaGetLastError());
  }
  sync_all(s);
  const std::vector<uint32_t> err = read_errors(s, false);
  for (int r = 0; r < s.R; ++r) {
    const size_t n = (size_t)T[r] * s.K;
    int bad[kCalls + 1] = {};
    std::string first;
    CUDA_CHECK(cudaSetDevice(dev_of(r)));
    for (int c = 0; c <= kCalls; ++c) {
      std::vector<float> got(std::max<size_t>(1, n));
      CUDA_CHECK(cudaMemcpy(got.data(), g[c][r], got.size() * 4, cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < n; ++i) {
        const int t = (int)(i / s.K), k = (int)(i % s.K);
        const float want = in[r].ev[i] >= 0 ? value(r, t, k, c < kCalls ? c : 0) : 0.f;
        if (got[i] == want) continue;
        ++bad[c];
        if (first.empty()) {
          char b[160];
          snprintf(b, sizeof b, "first: %s call %d t=%d k=%d: want %.0f got %g", c < kCalls ? "GIN" : "HOST", c, t, k, want, got[i]);
          first = b;
        }
      }
    }
    char b[128];
    snprintf(b, sizeof b, "wrong of %zu: GIN calls %d / %d / %d, HOST %d; errorFlags 0x%x; ", n, bad[0], bad[1], bad[2], bad[3], err[r]);
    record(bad[0] + bad[1] + bad[2] + bad[3] == 0 && err[r] == 0u, tag + " rank " + std::to_string(r) + " row values to (t, k)", b + first);
  }
  for (int r = 0; r < s.R; ++r) {
    CUDA_CHECK(cudaSetDevice(dev_of(r)));
    for (int c = 0; c < kCalls; ++c) CUDA_CHECK(cudaFree(vals[c][r]));
    for (int c = 0; c <= kCalls; ++c) CUDA_CHECK(cudaFree(g[c][r]));
  }
}

// ------------------------------------------------------------------------------------------------
// One correctness case: GIN and HOST dispatch + fake experts + combine, all checks.
// ------------------------------------------------------------------------------------------------
// entry: the GIN kernels to run (they must accept the case; the checks are the same for all).
static void run_case(const Case& cs, std::mt19937_64& rng, const Entry& entry) {
  Setup s = make_setup(cs.E, cs.K, cs.H, cs.M, cs.C, true, cs.fp8);
  s.entry = entry;
  s.input = cs.quant ? Setup::QUANT_FUSED : Setup::ROWS;
  std::vector<int> T(s.R);
  for (int r = 0; r < s.R; ++r) T[r] = cs.T[r % cs.T.size()];
  std::vector<RankInput> in(s.R);
  for (int r = 0; r < s.R; ++r) in[r] = make_input(rng, cs, s.R, r, T[r], 0);
  printf("case %-28s R=%d E=%d K=%d H=%d M=%d C=%d T=[", cs.name.c_str(), s.R, cs.E, cs.K, cs.H, cs.M, cs.C);
  for (int r = 0; r < s.R; ++r) printf("%s%d", r ? "," : "", T[r]);
  printf("] %s%s\n", entry.name.c_str(), cs.quant ? " (bf16 in, quantizing)" : "");
  upload_inputs(s, in);
  const uint32_t expectErr = cs.routing == INVALID_IDS ? MOE_ERR_EXPERT_ID : 0u;

  // GIN: dispatch on all ranks, fake experts, combine.
  poison_outputs(s);
  for (int r = 0; r < s.R; ++r) dispatch_rank(s, r, T[r]);
  for (int r = 0; r < s.R; ++r) fake_expert(s, r, s.rk[r].recvX, s.rk[r].expertOut, s.rk[r].recvCounts);
  for (int r = 0; r < s.R; ++r) gin_combine(s, r, T[r], s.rk[r].y);
  sync_all(s);
  std::vector<uint32_t> ginErr = read_errors(s, false);

  // HOST: layout, counts to host, pack, exchange, permute, fake experts, unpermute, exchange back, combine.
  host_layout_all(s, T);
  HostCounts hc = host_read_counts(s);
  host_upload_count_matrix(s, hc);
  host_pack_all(s, T);
  host_exchange(s, hc, false);
  host_permute_all(s);
  for (int r = 0; r < s.R; ++r) fake_expert(s, r, s.rk[r].hRecvX, s.rk[r].hExpertOut, s.rk[r].hRecvCounts);
  host_unpermute_all(s);
  host_exchange(s, hc, true);
  host_combine_all(s, T);
  sync_all(s);
  std::vector<uint32_t> hostErr = read_errors(s, true);

  for (int r = 0; r < s.R; ++r) {
    char tag[160];
    snprintf(tag, sizeof tag, "%s rank %d (%s)", cs.name.c_str(), r, entry.name.c_str());
    std::vector<RefRow> refRows;
    std::vector<int> refCounts;
    reference_dispatch(in, s.R, s.E, s.K, r, refRows, refCounts);
    const int total = (int)refRows.size();
    DispatchResult g = read_dispatch(s, r, s.rk[r].recvX, s.rk[r].recvWeights, s.rk[r].recvCounts, total);
    DispatchResult h = read_dispatch(s, r, s.rk[r].hRecvX, s.rk[r].hRecvWeights, s.rk[r].hRecvCounts, total);
    std::string e1 = check_dispatch(s, in, r, g);
    record(e1.empty(), std::string(tag) + " GIN dispatch", e1);
    std::string e2 = check_dispatch(s, in, r, h);
    record(e2.empty(), std::string(tag) + " HOST dispatch", e2);
    const bool same = g.counts == h.counts && g.rows == h.rows &&
                      (g.weights.empty() || memcmp(g.weights.data(), h.weights.data(), g.weights.size() * 4) == 0);
    record(same, std::string(tag) + " GIN == HOST layout", "recvX / recvWeights / recvCounts differ");

    std::vector<uint16_t> yg((size_t)T[r] * s.H), yh((size_t)T[r] * s.H);
    CUDA_CHECK(cudaSetDevice(dev_of(r)));
    if (T[r] > 0) {
      CUDA_CHECK(cudaMemcpy(yg.data(), s.rk[r].y, yg.size() * 2, cudaMemcpyDeviceToHost));
      CUDA_CHECK(cudaMemcpy(yh.data(), s.rk[r].hy, yh.size() * 2, cudaMemcpyDeviceToHost));
    }
    std::string d1, d2;
    const double rg = check_combine(s, in, r, yg, kGinBound, d1);
    record(rg >= 0, std::string(tag) + " GIN combine", d1);
    const double rh = check_combine(s, in, r, yh, kHostBound, d2);
    record(rh >= 0, std::string(tag) + " HOST combine", d2);
    char ebuf[160];
    snprintf(ebuf, sizeof ebuf, "errorFlags GIN 0x%x HOST 0x%x, expected 0x%x", ginErr[r], hostErr[r],
             r < s.R && T[r] > 0 ? expectErr : 0u);
    const uint32_t want = T[r] > 0 ? expectErr : 0u;
    // Invalid ids are reported by the rank that holds them; 0 tokens hold none.
    record(ginErr[r] == want && hostErr[r] == want, std::string(tag) + " error flags", ebuf);
    printf("  rank %d: %d rows received, combine max rel. error GIN %.2e HOST %.2e\n", r, total, rg, rh);
  }
  check_row_values(s, in, T, hc, cs.name + " (" + entry.name + ")");
  free_setup(s);
}

// ------------------------------------------------------------------------------------------------
// Entry points launched on instances they are not for: MOE_ERR_CONFIG on every rank, and nothing
// written (recvCounts and y keep their poison). A token-path entry on a layout-path instance, and a
// shape's entry on an instance of another shape.
// ------------------------------------------------------------------------------------------------
// dispatchOnly: only the entry's dispatch is expected to refuse (the fp8 entries share the bf16
// combines, which accept the instance); the combine is not launched.
// misalignedXq (fp8 entries): a quantizing dispatch whose xq is 8 bytes off 16-byte alignment.
static void refusal_case(const char* what, int E, int K, int H, int M, int C, const Entry& entry, std::mt19937_64& rng,
                         bool dispatchOnly = false, bool misalignedXq = false) {
  Setup s = make_setup(E, K, H, M, C, false, misalignedXq);
  s.entry = entry;
  Case cs{what, E, K, H, M, C, {M}, UNIFORM, 0.0};
  std::vector<RankInput> in(s.R);
  for (int r = 0; r < s.R; ++r) in[r] = make_input(rng, cs, s.R, r, M, 0);
  upload_inputs(s, in);
  poison_outputs(s);
  for (int r = 0; r < s.R; ++r) {
    Rank& q = s.rk[r];
    if (misalignedXq) gin_dispatch(s, r, q.xb, q.idx, q.w, M, q.xq + 8);
    else gin_dispatch(s, r, q.x, q.idx, q.w, M);
  }
  sync_all(s);
  std::vector<uint32_t> errD = read_errors(s, false);
  if (!dispatchOnly)
    for (int r = 0; r < s.R; ++r) gin_combine(s, r, M, s.rk[r].y);
  sync_all(s);
  std::vector<uint32_t> errC = read_errors(s, false);
  if (dispatchOnly) errC.assign(s.R, MOE_ERR_CONFIG);  // not launched
  for (int r = 0; r < s.R; ++r) {
    std::vector<uint32_t> counts(s.L);
    std::vector<uint16_t> y((size_t)M * s.H);
    CUDA_CHECK(cudaSetDevice(dev_of(r)));
    CUDA_CHECK(cudaMemcpy(counts.data(), s.rk[r].recvCounts, 4ull * s.L, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(y.data(), s.rk[r].y, y.size() * 2, cudaMemcpyDeviceToHost));
    bool untouched = true;
    for (uint32_t c : counts) untouched &= c == 0xFFFFFFFFu;
    for (uint16_t v : y) untouched &= v == 0xFFFFu;
    char detail[160];
    snprintf(detail, sizeof detail, "errorFlags dispatch 0x%x combine 0x%x (expected 0x%x each), outputs %s", errD[r], errC[r],
             MOE_ERR_CONFIG, untouched ? "untouched" : "WRITTEN");
    record(errD[r] == MOE_ERR_CONFIG && errC[r] == MOE_ERR_CONFIG && untouched,
           std::string("refusal: ") + what + " rank " + std::to_string(r) + " (" + entry.name + ")", detail);
  }
  free_setup(s);
}

// A combine told that expertOut holds one row fewer than the dispatch received (expertOutRows):
// MOE_ERR_EXPERT_ROWS and nothing else on every rank that received rows, none on the others; then a
// combine of the same dispatch with the whole expertOut reports nothing (the call still completed
// on every rank, so the protocol state is intact).
static void short_expert_out_case(const char* what, int E, int K, int H, int M, int C, const Entry& entry, std::mt19937_64& rng) {
  Setup s = make_setup(E, K, H, M, C, false);
  s.entry = entry;
  Case cs{what, E, K, H, M, C, {M}, UNIFORM, 0.0};
  std::vector<RankInput> in(s.R);
  for (int r = 0; r < s.R; ++r) in[r] = make_input(rng, cs, s.R, r, M, 0);
  upload_inputs(s, in);
  poison_outputs(s);
  for (int r = 0; r < s.R; ++r) gin_dispatch(s, r, s.rk[r].x, s.rk[r].idx, s.rk[r].w, M);
  sync_all(s);
  std::vector<uint32_t> errD = read_errors(s, false);
  std::vector<int> rows(s.R, 0);
  for (int r = 0; r < s.R; ++r) {
    std::vector<int> counts(s.L);
    CUDA_CHECK(cudaSetDevice(dev_of(r)));
    CUDA_CHECK(cudaMemcpy(counts.data(), s.rk[r].recvCounts, 4ull * s.L, cudaMemcpyDeviceToHost));
    for (int c : counts) rows[r] += c;
  }
  for (int r = 0; r < s.R; ++r) gin_combine(s, r, M, s.rk[r].y, rows[r] > 0 ? rows[r] - 1 : 0);
  sync_all(s);
  std::vector<uint32_t> errShort = read_errors(s, false);
  for (int r = 0; r < s.R; ++r) gin_combine(s, r, M, s.rk[r].y);
  sync_all(s);
  std::vector<uint32_t> errFull = read_errors(s, false);
  for (int r = 0; r < s.R; ++r) {
    const uint32_t want = rows[r] > 0 ? MOE_ERR_EXPERT_ROWS : 0u;
    char detail[200];
    snprintf(detail, sizeof detail, "%d rows received; errorFlags dispatch 0x%x, short combine 0x%x (expected 0x%x), full combine 0x%x (expected 0)",
             rows[r], errD[r], errShort[r], want, errFull[r]);
    record(errD[r] == 0 && errShort[r] == want && errFull[r] == 0,
           std::string("short expertOut: ") + what + " rank " + std::to_string(r) + " (" + entry.name + ")", detail);
  }
  free_setup(s);
}

static void run_entry_refusals(std::mt19937_64& rng) {
  const int R = gNumRanks;
  printf("case entry refusals: token-path entries on a layout-path instance, a shape's entry on another shape\n");
  refusal_case("token-path entry, M*K = 4800", 16 * R, 8, 256, 600, 8, kTokenPathEntry, rng);
  if (R != 1) {
    refusal_case("one-rank entry", 16 * R, 8, 256, 64, 4, kAloneEntry, rng);
    refusal_case("one-rank fp8 entry", 16 * R, 8, 256, 64, 4, kFp8AloneEntry, rng, true);
  }
  Entry shaped;
  if (shaped_entry(R, 256, 8, 7168, shaped)) {
    refusal_case("DeepSeek-V3 entry, H=256", 16 * R, 8, 256, 64, 4, shaped, rng);
    refusal_case("DeepSeek-V3 entry, K=4", 256, 4, 7168, 64, 4, shaped, rng);
  } else {
    printf("  skipped: no DeepSeek-V3 token-path entry compiled for %d ranks (MOE_TP_SHAPES)\n", R);
  }
  // fp8 rows need H % 16 == 0 (16-byte vectors of codes, then of scales)
  refusal_case("fp8 entry, H=200", 16 * R, 4, 200, 64, 4, kFp8TokenPathEntry, rng, true);
  refusal_case("fp8 entry, H=600 layout path", 16 * R, 8, 600, 600, 4, kFp8GenericEntry, rng, true);
  // the quantizing dispatch needs xq 16-byte aligned (its rows are read as 16-byte vectors)
  refusal_case("fp8 quantizing, xq misaligned", 16 * R, 4, 256, 64, 4, kFp8TokenPathEntry, rng, true, true);
  refusal_case("fp8 quantizing, xq misaligned, layout path", 16 * R, 8, 256, 600, 4, kFp8GenericEntry, rng, true, true);
  printf("case short expertOut: a combine whose expertOut holds one row fewer than the dispatch received\n");
  short_expert_out_case("token path", 16 * R, 8, 256, 64, 4, best_entry(R, 16 * R, 8, 256, 64, 4), rng);
  short_expert_out_case("layout path", 16 * R, 8, 256, 600, 4, kGenericEntry, rng);
}

// ------------------------------------------------------------------------------------------------
// moe_fp8_quantize against the CPU reference (ref_quantize_rows). Inputs mix magnitudes from
// 2^-130 to 2^44, negative values, zero blocks and values that land on e4m3 subnormals; outputs
// are poisoned.
// ------------------------------------------------------------------------------------------------
static void run_fp8_quantize(std::mt19937_64& rng) {
  printf("case fp8 quantize (moe_fp8_quantize vs CPU reference)\n");
  std::uniform_real_distribution<float> uni(0.f, 1.f);
  std::uniform_int_distribution<int> ex(-40, 40);
  struct Q { int H, T; };
  for (Q qc : {Q{16, 3}, Q{272, 37}, Q{7168, 64}, Q{2048, 0}, Q{128, 1}}) {
    const int H = qc.H, T = qc.T, S = moe_fp8_scales(H);
    const uint64_t rb = moe_fp8_row_bytes(H);
    std::vector<uint16_t> x((size_t)T * H);
    for (int t = 0; t < T; ++t)
      for (int b = 0; b < S; ++b) {
        const int kind = (t + b) % 4;  // 0: wide magnitudes, 1: all zero, 2: one block scale, 3: tiny + subnormal codes
        const int base = ex(rng);
        for (int h = b * 128; h < std::min(H, b * 128 + 128); ++h) {
          float v = 0.f;
          if (kind == 0) v = ldexpf(uni(rng) + 0.5f, ex(rng));
          else if (kind == 2) v = ldexpf(uni(rng) + 0.5f, base + (int)(uni(rng) * 4.f));
          else if (kind == 3) v = ldexpf(uni(rng), base - (int)(uni(rng) * 20.f));  // down to 2^-20 of the max: e4m3 subnormals and zeros
          if (kind == 1 && t % 3 == 1) v = ldexpf(uni(rng) + 0.5f, -110 - (int)(uni(rng) * 20.f));  // bf16 subnormals (the 2^64 pre-scale)
          if (kind != 1 && uni(rng) < 0.4f) v = -v;
          x[(size_t)t * H + h] = f2bf(v);
        }
      }
    const std::vector<uint8_t> want = ref_quantize_rows(x, T, H);
    CUDA_CHECK(cudaSetDevice(0));
    uint16_t* dx = dmalloc<uint16_t>(x.size() * 2);
    uint8_t* dout = dmalloc<uint8_t>(want.size() + 16);
    uint32_t* derr = dmalloc<uint32_t>(4);
    CUDA_CHECK(cudaMemset(derr, 0, 4));
    if (T > 0) CUDA_CHECK(cudaMemcpy(dx, x.data(), x.size() * 2, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(dout, 0xAB, want.size() + 16));
    moe_fp8_quantize<<<std::max(1, std::min(264, (T * S + 7) / 8)), 256>>>(quantize_args(dx, T, H, dout, derr));
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<uint8_t> got(want.size() + 16);
    uint32_t err = 0;
    CUDA_CHECK(cudaMemcpy(got.data(), dout, got.size(), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(&err, derr, 4, cudaMemcpyDeviceToHost));
    char detail[200] = "";
    bool ok = err == 0;
    if (!ok) snprintf(detail, sizeof detail, "errorFlags 0x%x", err);
    for (size_t i = 0; ok && i < want.size(); ++i)
      if (got[i] != want[i]) {
        const size_t t = i / rb, o = i % rb;
        if (o < (size_t)H)
          snprintf(detail, sizeof detail, "token %zu element %zu: code 0x%02x, expected 0x%02x (x = %g)", t, o, got[i], want[i],
                   bf2f(x[t * H + o]));
        else
          snprintf(detail, sizeof detail, "token %zu scale byte %zu: 0x%02x, expected 0x%02x", t, o - H, got[i], want[i]);
        ok = false;
      }
    for (size_t i = want.size(); ok && i < got.size(); ++i)
      if (got[i] != 0xAB) {
        snprintf(detail, sizeof detail, "byte %zu past the last row written", i - want.size());
        ok = false;
      }
    record(ok, "fp8 quantize H=" + std::to_string(H) + " T=" + std::to_string(T), detail);
    // H % 16 != 0 is refused, nothing written
    CUDA_CHECK(cudaMemset(dout, 0xAB, want.size() + 16));
    moe_fp8_quantize<<<4, 256>>>(quantize_args(dx, T, H + 8, dout, derr));
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(got.data(), dout, got.size(), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(&err, derr, 4, cudaMemcpyDeviceToHost));
    bool untouched = true;
    for (uint8_t b : got) untouched &= b == 0xAB;
    record(err == MOE_ERR_CONFIG && untouched, "fp8 quantize refuses H=" + std::to_string(H + 8),
           "errorFlags 0x" + std::to_string(err) + (untouched ? "" : ", output written"));
    CUDA_CHECK(cudaFree(dx));
    CUDA_CHECK(cudaFree(dout));
    CUDA_CHECK(cudaFree(derr));
  }
}

// ------------------------------------------------------------------------------------------------
// 200 back-to-back rounds without host synchronisation: per round a decoy dispatch (other routing),
// the real dispatch, fake experts, combine, a second combine, and moe_gin_row_values of the
// received weights (which must give back each token's weights, 0 where masked); every result
// copied aside on the device, all checked at the end.
// ------------------------------------------------------------------------------------------------
// channels = 5: the token path (<= 32 tokens per channel); 2: the layout path (48).
// pdl: every dispatch and combine launched with programmatic dependent launch.
static void run_back_to_back(std::mt19937_64& rng, int rounds, int channels, bool pdl) {
  Case cs{std::string(channels <= 2 ? "back-to-back layout path" : "back-to-back token path") + (pdl ? " PDL" : ""), 32, 4,
          264, 96, channels, {96}, UNIFORM, 0.1};
  if (cs.E % gNumRanks != 0) cs.E = 16 * gNumRanks;
  Setup s = make_setup(cs.E, cs.K, cs.H, cs.M, cs.C, false);
  s.pdl = pdl;
  printf("case %-28s R=%d E=%d K=%d H=%d M=%d C=%d, %d rounds, %s\n", cs.name.c_str(), s.R, cs.E, cs.K, cs.H, cs.M, cs.C,
         rounds, s.entry.name.c_str());
  std::vector<std::vector<RankInput>> in(rounds, std::vector<RankInput>(s.R));
  for (int i = 0; i < rounds; ++i)
    for (int r = 0; r < s.R; ++r) {
      const int T = (i * 37 + r * 53) % (cs.M + 1);  // includes 0 and M over the rounds
      in[i][r] = make_input(rng, cs, s.R, r, T, i);
    }
  const size_t xStride = (size_t)cs.M * s.H, kStride = (size_t)cs.M * cs.K;
  struct Bufs {
    uint16_t *x, *y1, *y2;
    int *idx, *counts;
    float *w, *g;  // g: moe_gin_row_values of the received weights, which must give back w
  };
  std::vector<Bufs> b(s.R);
  for (int r = 0; r < s.R; ++r) {
    CUDA_CHECK(cudaSetDevice(dev_of(r)));
    b[r].x = dmalloc<uint16_t>(rounds * xStride * 2);
    b[r].y1 = dmalloc<uint16_t>(rounds * xStride * 2);
    b[r].y2 = dmalloc<uint16_t>(rounds * xStride * 2);
    b[r].idx = dmalloc<int>(rounds * kStride * 4);
    b[r].w = dmalloc<float>(rounds * kStride * 4);
    b[r].counts = dmalloc<int>((size_t)rounds * s.L * 4);
    b[r].g = dmalloc<float>(rounds * kStride * 4);
    CUDA_CHECK(cudaMemset(b[r].g, 0xFF, rounds * kStride * 4));  // NaN
    CUDA_CHECK(cudaMemset(b[r].y1, 0xFF, rounds * xStride * 2));
    CUDA_CHECK(cudaMemset(b[r].y2, 0xFF, rounds * xStride * 2));
    for (int i = 0; i < rounds; ++i) {
      const RankInput& ri = in[i][r];
      if (ri.T == 0) continue;
      CUDA_CHECK(cudaMemcpy(b[r].x + i * xStride, ri.x.data(), ri.x.size() * 2, cudaMemcpyHostToDevice));
      CUDA_CHECK(cudaMemcpy(b[r].idx + i * kStride, ri.idx.data(), ri.idx.size() * 4, cudaMemcpyHostToDevice));
      CUDA_CHECK(cudaMemcpy(b[r].w + i * kStride, ri.w.data(), ri.w.size() * 4, cudaMemcpyHostToDevice));
    }
    CUDA_CHECK(cudaDeviceSynchronize());
  }
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < rounds; ++i) {
    const int decoy = (i + 1) % rounds;
    // Launch order interleaves ranks per step, so no rank's queue waits on work not yet enqueued.
    for (int r = 0; r < s.R; ++r)
      gin_dispatch(s, r, b[r].x + decoy * xStride, b[r].idx + decoy * kStride, b[r].w + decoy * kStride,
                   in[decoy][r].T);
    for (int r = 0; r < s.R; ++r)
      gin_dispatch(s, r, b[r].x + i * xStride, b[r].idx + i * kStride, b[r].w + i * kStride, in[i][r].T);
    for (int r = 0; r < s.R; ++r) {
      fake_expert(s, r, s.rk[r].recvX, s.rk[r].expertOut, s.rk[r].recvCounts);
      CUDA_CHECK(cudaMemcpyAsync(b[r].counts + (size_t)i * s.L, s.rk[r].recvCounts, 4ull * s.L,
                                 cudaMemcpyDeviceToDevice, s.rk[r].stream));
    }
    for (int r = 0; r < s.R; ++r) gin_combine(s, r, in[i][r].T, b[r].y1 + i * xStride);
    for (int r = 0; r < s.R; ++r) gin_combine(s, r, in[i][r].T, b[r].y2 + i * xStride);
    for (int r = 0; r < s.R; ++r) gin_row_values(s, r, s.rk[r].recvWeights, in[i][r].T, b[r].g + i * kStride);
  }
  sync_all(s);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<uint32_t> err = read_errors(s, false);
  int badRounds = 0;
  std::string first;
  double maxRel = 0;
  for (int i = 0; i < rounds; ++i) {
    for (int r = 0; r < s.R; ++r) {
      std::vector<RefRow> rows;
      std::vector<int> counts;
      reference_dispatch(in[i], s.R, s.E, s.K, r, rows, counts);
      std::vector<int> got(s.L);
      CUDA_CHECK(cudaSetDevice(dev_of(r)));
      CUDA_CHECK(cudaMemcpy(got.data(), b[r].counts + (size_t)i * s.L, 4ull * s.L, cudaMemcpyDeviceToHost));
      std::string why;
      if (got != counts) why = "recvCounts differ from the reference";
      const int T = in[i][r].T;
      std::vector<uint16_t> y1((size_t)T * s.H), y2((size_t)T * s.H);
      if (T > 0) {
        CUDA_CHECK(cudaMemcpy(y1.data(), b[r].y1 + i * xStride, y1.size() * 2, cudaMemcpyDeviceToHost));
        CUDA_CHECK(cudaMemcpy(y2.data(), b[r].y2 + i * xStride, y2.size() * 2, cudaMemcpyDeviceToHost));
      }
      std::string d;
      double rel = check_combine(s, in[i], r, y1, kGinBound, d);
      if (rel < 0 && why.empty()) why = "combine: " + d;
      maxRel = std::max(maxRel, rel);
      if (why.empty() && y1 != y2) why = "second combine differs from the first";
      std::vector<float> g(std::max<size_t>(1, (size_t)T * s.K));
      CUDA_CHECK(cudaMemcpy(g.data(), b[r].g + i * kStride, g.size() * 4, cudaMemcpyDeviceToHost));
      for (size_t j = 0; j < (size_t)T * s.K && why.empty(); ++j) {
        const float want = in[i][r].ev[j] >= 0 ? in[i][r].w[j] : 0.f;
        if (g[j] != want) why = "row values: slot " + std::to_string(j) + " got " + std::to_string(g[j]) + " want " + std::to_string(want);
      }
      if (!why.empty()) {
        ++badRounds;
        if (first.empty()) first = "round " + std::to_string(i) + " rank " + std::to_string(r) + ": " + why;
      }
    }
  }
  record(badRounds == 0, "back-to-back rounds", std::to_string(badRounds) + " bad (rank, round) pairs; first: " + first);
  bool errOk = true;
  for (uint32_t e : err) errOk &= e == 0;
  char ebuf[64];
  snprintf(ebuf, sizeof ebuf, "errorFlags rank0 0x%x", err[0]);
  record(errOk, "back-to-back error flags", ebuf);
  printf("  %d rounds (2 dispatch + 2 combine + row values each) in %.1f ms, combine max rel. error %.2e\n", rounds, secs * 1e3,
         maxRel);
  for (int r = 0; r < s.R; ++r) {
    CUDA_CHECK(cudaSetDevice(dev_of(r)));
    CUDA_CHECK(cudaFree(b[r].x));
    CUDA_CHECK(cudaFree(b[r].y1));
    CUDA_CHECK(cudaFree(b[r].y2));
    CUDA_CHECK(cudaFree(b[r].idx));
    CUDA_CHECK(cudaFree(b[r].w));
    CUDA_CHECK(cudaFree(b[r].counts));
    CUDA_CHECK(cudaFree(b[r].g));
  }
  free_setup(s);
}

// ------------------------------------------------------------------------------------------------
// Timing.
// ------------------------------------------------------------------------------------------------
struct Gate {
  uint32_t* host = nullptr;
  uint32_t value = 0;
};

// Times `op` on every rank between events that follow a shared gate; returns the max over ranks.
template <typename Op>
static float timed_all_ranks(Setup& s, Gate& g, std::vector<cudaEvent_t>& ev0, std::vector<cudaEvent_t>& ev1, Op op) {
  // Every stream idle first: work still queued before a gate (the fake experts before a combine)
  // would hold one rank's gate while the others start, and its tail would count in their times.
  sync_all(s);
  ++g.value;
  for (int r = 0; r < s.R; ++r) {
    CUDA_CHECK(cudaSetDevice(dev_of(r)));
    gate_kernel<<<1, 1, 0, s.rk[r].stream>>>(g.host, g.value);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaEventRecord(ev0[r], s.rk[r].stream));
  }
  op();
  for (int r = 0; r < s.R; ++r) {
    CUDA_CHECK(cudaSetDevice(dev_of(r)));
    CUDA_CHECK(cudaEventRecord(ev1[r], s.rk[r].stream));
  }
  *(volatile uint32_t*)g.host = g.value;
  sync_all(s);
  float worst = 0.f;
  for (int r = 0; r < s.R; ++r) {
    float ms = 0.f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, ev0[r], ev1[r]));
    worst = std::max(worst, ms);
  }
  return worst * 1000.f;
}

static float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.f : v[v.size() / 2];
}

struct Shape {
  const char* name;
  int H, E, K;
  bool fp8 = false;  // scaled fp8 dispatch rows (the combine is bf16 either way)
};

static bool gProfile = false;

// Per-GPU profile buffers: [2 kernels][GIN_TRACE_BLOCKS][GIN_TRACE_SLOTS] %globaltimer, then the
// same of SM cycles (zeroed before each use).
static const size_t kProfWords = GIN_TRACE_WORDS;
static std::vector<uint64_t*> gProfBuf;
static void profile_enable(Setup& s, bool on) {
  if (gProfBuf.empty()) {
    for (int r = 0; r < s.R; ++r) {
      CUDA_CHECK(cudaSetDevice(dev_of(r)));
      gProfBuf.push_back(dmalloc<uint64_t>(8 * kProfWords));
    }
  }
  for (int r = 0; r < s.R; ++r) {
    CUDA_CHECK(cudaSetDevice(dev_of(r)));
    CUDA_CHECK(cudaDeviceSynchronize());
    uint64_t* p = on ? gProfBuf[r] : nullptr;
    if (on) CUDA_CHECK(cudaMemset(p, 0, 8 * kProfWords));
#ifdef GIN4J_TRACE
    CUDA_CHECK(moe_gin_trace_buffer(p));
#endif
    CUDA_CHECK(cudaDeviceSynchronize());
  }
}

struct ProfRole {
  const char* name;
  int kernel, b0, b1;  // blocks [b0, b1)
  std::vector<std::pair<int, const char*>> slots;  // MoeTraceSlot (kernel * GIN_TRACE_SLOTS + n), label
};

static void profile_print(Setup& s, const char* what, float gatedUs) {
  const int C = s.C;
  std::vector<ProfRole> roles = {
      {"dispatch sender", 0, 0, C,
       {{MOE_TRACE_DISPATCH_ENTRY, "entry"}, {MOE_TRACE_DISPATCH_PROLOGUE, "prologue: checks and layouts done (then a barrier)"},
        {MOE_TRACE_SMALL_LAYOUT_CLEARED, "small layout: counters cleared"},
        {MOE_TRACE_SMALL_LAYOUT_WALKED, "small layout: ids walked"},
        {MOE_TRACE_SENDER_ROUTED, "routing counted (+ positions if <= 32 tok/block)"}, {MOE_TRACE_SENDER_OFFSETS, "start offsets known"},
        {MOE_TRACE_SENDER_TABLES, "LEADER count tables stored (LL words)"}, {MOE_TRACE_SENDER_POSITIONS, "positions released"},
        {MOE_TRACE_SENDER_SENT, "remote slots sent"},
        {MOE_TRACE_SENDER_JOINS_OWN, "tables read (joins own items; absent: skipped)"}, {MOE_TRACE_SENDER_END, "own items done / end"},
        {MOE_TRACE_TP_SENDER_IDS, "token path: thread 0's token out (pre-barrier)"},
        {MOE_TRACE_SENDER_QUANTIZED, "thread 0's warp quantized its share"},
        {MOE_TRACE_TP_SENDER_SENDS, "token path: ids pushed, masks (sends start)"},
        {MOE_TRACE_TP_SENDER_END, "token path: tokenPos, chanStartTo / end"}}},
      {"dispatch receiver", 0, C, 2 * C,
       {{MOE_TRACE_DISPATCH_ENTRY, "entry"}, {MOE_TRACE_RECEIVER_TABLES, "count tables read"},
        {MOE_TRACE_TP_WALK_CLEARED, "token path: counters cleared (remote T probed)"},
        {MOE_TRACE_TP_WALK_FIRST, "token path: thread 0's first (own) tokens counted"},
        {MOE_TRACE_TP_WALK_COUNTED, "token path: thread 0's tokens counted"}, {MOE_TRACE_TP_WALK_DONE, "token path: walk barrier passed"},
        {MOE_TRACE_TP_RECEIVER_LAYOUT, "token path: layout done (scan, items)"},
        {MOE_TRACE_TP_RECEIVER_QUANT_SEEN, "token path: warp 0 saw sender c's fp8 rows"},
        {MOE_TRACE_RECEIVER_QUANTIZED, "layout path: its share of the fp8 rows released"},
        {MOE_TRACE_TP_RECEIVER_FIRST_OWN, "token path: warp 0's first own item"},
        {MOE_TRACE_RECEIVER_FIRST_REMOTE, "warp 0: first remote item landed"},
        {MOE_TRACE_RECEIVER_END, "remote + claimed own items done / end"}}},
      {"combine producer", 1, 0, C,
       {{MOE_TRACE_COMBINE_ENTRY, "entry (before the prologue)"}, {MOE_TRACE_PRODUCER_SENT, "partials sent"},
        {MOE_TRACE_CONSUMER_END, "one rank: y done (these blocks consume too)"}}},
      {"combine consumer", 1, C, 2 * C,
       {{MOE_TRACE_COMBINE_ENTRY, "entry (before the prologue)"}, {MOE_TRACE_CONSUMER_FIRST, "warp 0: first partials landed"},
        {MOE_TRACE_CONSUMER_END, "y done"}}},
  };
  printf("  profile %s (gated call %.1f us, slowest rank):\n", what, gatedUs);
  for (int r = 0; r < s.R; ++r) {
    std::vector<uint64_t> h(kProfWords);
    CUDA_CHECK(cudaSetDevice(dev_of(r)));
    CUDA_CHECK(cudaMemcpy(h.data(), gProfBuf[r], h.size() * 8, cudaMemcpyDeviceToHost));
    const size_t cyc0 = GIN_TRACE_WORDS / 2;
    // sl: a slot of kernel k, n or k * GIN_TRACE_SLOTS + n
    auto at = [&](int k, int b, int sl) { return h[((size_t)k * GIN_TRACE_BLOCKS + b) * GIN_TRACE_SLOTS + sl % GIN_TRACE_SLOTS]; };
    auto cyc = [&](int k, int b, int sl) { return h[cyc0 + ((size_t)k * GIN_TRACE_BLOCKS + b) * GIN_TRACE_SLOTS + sl % GIN_TRACE_SLOTS]; };
    for (const ProfRole& role : roles) {
      uint64_t ref = ~0ull, lastStart = 0;
      for (int b = 0; b < 2 * C; ++b) {
        const uint64_t v = at(role.kernel, b, 0);
        if (v) ref = std::min(ref, v), lastStart = std::max(lastStart, v);
      }
      if (ref == ~0ull) continue;
      // SM clock: cycles over timer ns between each block's first and last stamp, summed over
      // the role's blocks (the timer's steps average out).
      double sumCyc = 0, sumNs = 0;
      for (int b = role.b0; b < role.b1; ++b) {
        uint64_t g0 = ~0ull, g1 = 0, c0 = 0, c1 = 0;
        for (int sl = 0; sl < GIN_TRACE_SLOTS; ++sl) {
          const uint64_t g = at(role.kernel, b, sl);
          if (!g) continue;
          if (g < g0) g0 = g, c0 = cyc(role.kernel, b, sl);
          if (g > g1) g1 = g, c1 = cyc(role.kernel, b, sl);
        }
        if (g1 > g0) sumCyc += (double)(c1 - c0), sumNs += (double)(g1 - g0);
      }
      const double ghz = sumNs > 0 ? sumCyc / sumNs : 0.0;
      std::vector<double> st;
      for (int b = role.b0; b < role.b1; ++b)
        if (at(role.kernel, b, 0)) st.push_back((at(role.kernel, b, 0) - ref) * 1e-3);
      std::sort(st.begin(), st.end());
      printf("    rank %d %-18s start           med %6.2f max %6.2f us (%zu blocks; last block of the grid starts at %.2f; "
             "SM clock %.3f GHz)\n",
             r, role.name, st.empty() ? 0.0 : st[st.size() / 2], st.empty() ? 0.0 : st.back(), st.size(),
             (lastStart - ref) * 1e-3, ghz);
      for (auto& sl : role.slots) {
        // Per block: its "start" on the timer (aligned across blocks), plus cycles since "start"
        // at the measured clock (exact within the block). Signed: entry stamps precede "start".
        std::vector<double> v, vt;
        for (int b = role.b0; b < role.b1; ++b) {
          if (!at(role.kernel, b, sl.first) || !at(role.kernel, b, 0)) continue;
          const double base = (double)(int64_t)(at(role.kernel, b, 0) - ref) * 1e-3;
          const double dc = (double)(int64_t)(cyc(role.kernel, b, sl.first) - cyc(role.kernel, b, 0));
          v.push_back(base + (ghz > 0 ? dc / ghz * 1e-3 : 0.0));
          vt.push_back((double)(int64_t)(at(role.kernel, b, sl.first) - ref) * 1e-3);
        }
        if (v.empty()) continue;
        std::sort(v.begin(), v.end());
        std::sort(vt.begin(), vt.end());
        printf("    rank %d %-18s %-44s med %6.2f max %6.2f us (%zu blocks; timer alone: med %6.2f)\n", r, role.name,
               sl.second, v[v.size() / 2], v.back(), v.size(), vt[vt.size() / 2]);
      }
    }
  }
}

// moe_fp8_quantize alone on GPU 0, DeepSeek-V3's hidden size: median of 20 launches (device events).
static void bench_quantize() {
  const int H = 7168;
  for (int T : {128, 4096}) {
    CUDA_CHECK(cudaSetDevice(0));
    uint16_t* x = dmalloc<uint16_t>((size_t)T * H * 2);
    uint8_t* out = dmalloc<uint8_t>((size_t)T * moe_fp8_row_bytes(H));
    uint32_t* err = dmalloc<uint32_t>(4);
    CUDA_CHECK(cudaMemset(x, 0x3f, (size_t)T * H * 2));
    CUDA_CHECK(cudaMemset(err, 0, 4));
    cudaEvent_t a, b;
    CUDA_CHECK(cudaEventCreate(&a));
    CUDA_CHECK(cudaEventCreate(&b));
    const int grid = quantize_grid(T, H);
    std::vector<float> t;
    for (int i = 0; i < 25; ++i) {
      CUDA_CHECK(cudaEventRecord(a));
      moe_fp8_quantize<<<grid, 256>>>(quantize_args(x, T, H, out, err));
      CUDA_CHECK(cudaEventRecord(b));
      CUDA_CHECK(cudaEventSynchronize(b));
      float ms = 0.f;
      CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
      if (i >= 5) t.push_back(ms * 1000.f);
    }
    uint32_t e = 0;
    CUDA_CHECK(cudaMemcpy(&e, err, 4, cudaMemcpyDeviceToHost));
    std::sort(t.begin(), t.end());
    const double bytes = (double)T * (2.0 * H + (double)moe_fp8_row_bytes(H));
    printf("fp8 quantize H=%d T=%4d: %7.1f us, %6.1f GB/s (bf16 read + fp8 rows written)%s\n", H, T, t[t.size() / 2],
           bytes / (t[t.size() / 2] * 1e3), e ? "  (errorFlags set!)" : "");
    record(e == 0, "bench fp8 quantize error flags", "errorFlags nonzero");
    CUDA_CHECK(cudaEventDestroy(a));
    CUDA_CHECK(cudaEventDestroy(b));
    CUDA_CHECK(cudaFree(x));
    CUDA_CHECK(cudaFree(out));
    CUDA_CHECK(cudaFree(err));
  }
}

// only: the name of the one shape to time (--shape), null = all. False if no shape has that name.
static bool run_bench(std::mt19937_64& rng, int channels, const char* only) {
  const Shape shapes[] = {{"DeepSeek-V3", 7168, 256, 8},         {"Qwen3-30B-A3B", 2048, 128, 8}, {"Mixtral", 4096, 8, 2},
                          {"DeepSeek fp8", 7168, 256, 8, true}, {"Qwen3 fp8", 2048, 128, 8, true}};
  if (only != nullptr && std::none_of(std::begin(shapes), std::end(shapes), [&](const Shape& sh) { return !strcmp(only, sh.name); })) {
    fprintf(stderr, "--shape \"%s\": expected one of", only);
    for (const Shape& sh : shapes) fprintf(stderr, " \"%s\"", sh.name);
    fprintf(stderr, "\n");
    return false;
  }
  bench_quantize();
  const int tokens[] = {128, 4096};
  const int warm = 5, iters = 20;
  Gate g;
  CUDA_CHECK(cudaSetDevice(0));
  CUDA_CHECK(cudaHostAlloc((void**)&g.host, 64, cudaHostAllocMapped | cudaHostAllocPortable));
  *(volatile uint32_t*)g.host = 0;
  char routing[64] = "uniform routing";
  if (gBenchRouting == ZIPF) snprintf(routing, sizeof routing, "Zipf routing (s = %.2f)", gZipfS);
  printf("\nTiming: %d ranks on %d GPUs, C=%d channels (grid %d x %d threads), median of %d after %d warm-ups, %s.\n",
         gNumRanks, gNumGpus, channels, 2 * channels, MOE_THREADS, iters, warm, routing);
  printf("GIN columns: one launch each, all ranks released together by a gate kernel; time = slowest rank.\n");
  printf("GB/s = (token rows that cross NVLink from one rank, i.e. tokens x remote destination ranks, once per\n"
         "       rank however many experts it hits there) x row bytes (2H; fp8: H + 4 per 128, padded) / time.  HOST columns: local kernels only on\n"
         "       rank 0 (layout + pack + permute | unpermute + combine), the NCCL exchanges excluded.\n");
  printf("%-14s %6s | %11s %8s | %11s %8s | %10s %10s | %9s %9s\n", "shape", "tokens", "GIN disp us", "GB/s",
         "GIN comb us", "GB/s", "NVLink MB", "rows/rank", "HOST d us", "HOST c us");
  for (const Shape& sh : shapes) {
    if (only != nullptr && strcmp(only, sh.name) != 0) continue;
    for (int T : tokens) {
      if (sh.E % gNumRanks != 0) continue;
      Case cs{sh.name, sh.E, sh.K, sh.H, T, channels, {T}, gBenchRouting, 0.0, sh.fp8};
      Setup s = make_setup(sh.E, sh.K, sh.H, T, channels, true, sh.fp8);
      std::vector<RankInput> in(s.R);
      std::vector<int> Ts(s.R, T);
      for (int r = 0; r < s.R; ++r) in[r] = make_input(rng, cs, s.R, r, T, 0);
      upload_inputs(s, in);
      std::vector<cudaEvent_t> ev0(s.R), ev1(s.R);
      for (int r = 0; r < s.R; ++r) {
        CUDA_CHECK(cudaSetDevice(dev_of(r)));
        CUDA_CHECK(cudaEventCreate(&ev0[r]));
        CUDA_CHECK(cudaEventCreate(&ev1[r]));
      }
      // NVLink rows of rank 0: tokens x remote ranks they go to.
      uint64_t crossRows = 0, recvRows = 0;
      {
        const int L = s.L;
        for (int t = 0; t < in[0].T; ++t) {
          uint32_t mask = 0;
          for (int k = 0; k < s.K; ++k)
            if (in[0].ev[(size_t)t * s.K + k] >= 0) mask |= 1u << (in[0].ev[(size_t)t * s.K + k] / L);
          mask &= ~1u;
          crossRows += __builtin_popcount(mask);
        }
        std::vector<RefRow> rr;
        std::vector<int> cnt;
        reference_dispatch(in, s.R, s.E, s.K, 0, rr, cnt);
        recvRows = rr.size();
        if (gBenchRouting != UNIFORM) {  // how skewed: the busiest expert and rank against the mean
          std::vector<long> perExpert(s.E, 0), perRank(s.R, 0);
          for (int dr = 0; dr < s.R; ++dr) {
            reference_dispatch(in, s.R, s.E, s.K, dr, rr, cnt);
            perRank[dr] = (long)rr.size();
            for (int l = 0; l < s.L; ++l) perExpert[dr * s.L + l] = cnt[l];
          }
          const double meanE = (double)std::accumulate(perExpert.begin(), perExpert.end(), 0L) / s.E;
          const double meanR = (double)std::accumulate(perRank.begin(), perRank.end(), 0L) / s.R;
          printf("%-14s %6d   routing: busiest expert %ld rows (%.1fx the mean), busiest rank %ld rows (%.2fx)\n", sh.name, T,
                 *std::max_element(perExpert.begin(), perExpert.end()), *std::max_element(perExpert.begin(), perExpert.end()) / meanE,
                 *std::max_element(perRank.begin(), perRank.end()), *std::max_element(perRank.begin(), perRank.end()) / meanR);
        }
      }
      const double crossBytes = (double)crossRows * s.dispRowBytes;
      // The entry the Java side takes, the same with programmatic dependent launch, and where the
      // first is a token-path one the generic entry too, alternately in the same loop (same-run
      // A/B). Per variant: gated single calls, and 8 calls back to back after the gate (/ 8: the
      // steady state that pipelined Java calls see).
      // fp8 shapes also time bf16 rows in: quantized by the dispatch (xq), and moe_fp8_quantize
      // followed by the dispatch of its rows.
      struct Variant {
        Entry entry;
        bool pdl;
        Setup::Input input = Setup::ROWS;
        std::string name() const {
          const char* in = input == Setup::QUANT_FUSED ? " (bf16 in, quantizing)"
                           : input == Setup::QUANT_KERNEL ? " (bf16 in: moe_fp8_quantize, then fp8 rows)" : "";
          return entry.name + (pdl ? " + PDL" : "") + in;
        }
      };
      const Entry best = s.entry;
      std::vector<Variant> variants{{best, false}, {best, true}};
      const Entry generic = sh.fp8 ? kFp8GenericEntry : kGenericEntry;
      if (best.name != generic.name) variants.push_back({generic, false});
      if (sh.fp8) {
        variants.push_back({best, false, Setup::QUANT_FUSED});
        variants.push_back({best, true, Setup::QUANT_FUSED});
        variants.push_back({best, false, Setup::QUANT_KERNEL});
        variants.push_back({best, true, Setup::QUANT_KERNEL});
      }
      const int nb = 8;
      std::vector<std::vector<float>> vd(variants.size()), vc(variants.size()), vbd(variants.size()), vbc(variants.size());
      for (int i = 0; i < warm + iters; ++i) {
        for (size_t v = 0; v < variants.size(); ++v) {
          s.entry = variants[v].entry;
          s.pdl = variants[v].pdl;
          s.input = variants[v].input;
          const float a = timed_all_ranks(s, g, ev0, ev1, [&] {
            for (int r = 0; r < s.R; ++r) dispatch_rank(s, r, T);
          });
          for (int r = 0; r < s.R; ++r) fake_expert(s, r, s.rk[r].recvX, s.rk[r].expertOut, s.rk[r].recvCounts);
          const float b = timed_all_ranks(s, g, ev0, ev1, [&] {
            for (int r = 0; r < s.R; ++r) gin_combine(s, r, T, s.rk[r].y);
          });
          const float ba = timed_all_ranks(s, g, ev0, ev1, [&] {
            for (int j = 0; j < nb; ++j)
              for (int r = 0; r < s.R; ++r) dispatch_rank(s, r, T);
          });
          const float bb = timed_all_ranks(s, g, ev0, ev1, [&] {
            for (int j = 0; j < nb; ++j)
              for (int r = 0; r < s.R; ++r) gin_combine(s, r, T, s.rk[r].y);
          });
          if (i >= warm) {
            vd[v].push_back(a);
            vc[v].push_back(b);
            vbd[v].push_back(ba / nb);
            vbc[v].push_back(bb / nb);
          }
        }
      }
      s.entry = best;
      s.pdl = false;
      s.input = Setup::ROWS;
      std::vector<float>& td = vd[0];
      std::vector<float>& tc = vc[0];
      if (gProfile) {
        // One profiled gated region: `calls` rounds of `call` on every rank; the stamps are the
        // last round's (each call overwrites them).
        auto profiled = [&](const char* what, int calls, auto call) {
          profile_enable(s, true);
          const float us = timed_all_ranks(s, g, ev0, ev1, [&] {
            for (int i = 0; i < calls; ++i)
              for (int r = 0; r < s.R; ++r) call(r);
          });
          profile_enable(s, false);
          profile_print(s, what, us / calls);
        };
        auto dispatchCall = [&](int r) { dispatch_rank(s, r, T); };
        auto combineCall = [&](int r) { gin_combine(s, r, T, s.rk[r].y); };
        auto experts = [&] {
          for (int r = 0; r < s.R; ++r) fake_expert(s, r, s.rk[r].recvX, s.rk[r].expertOut, s.rk[r].recvCounts);
        };
        printf("%-14s %6d\n", sh.name, T);
        profiled("dispatch", 1, dispatchCall);
        experts();
        profiled("combine", 1, combineCall);
        // The same in steady state: 8 calls back to back after the gate.
        profiled("dispatch, the last of 8 back to back (the column: all 8 / 8)", nb, dispatchCall);
        experts();
        profiled("combine, the last of 8 back to back (the column: all 8 / 8)", nb, combineCall);
        if (sh.fp8) {  // the same entry quantizing bf16 rows itself
          s.input = Setup::QUANT_FUSED;
          profiled("dispatch, bf16 in, quantizing", 1, dispatchCall);
          profiled("dispatch, bf16 in, quantizing, the last of 8 back to back", nb, dispatchCall);
          s.input = Setup::ROWS;
        }
      }
      // moe_gin_row_values after the last dispatch: one f32 per received row back to
      // its (token, k); the rows' weights stand in for the values.
      std::vector<float*> rowOut(s.R);
      for (int r = 0; r < s.R; ++r) {
        CUDA_CHECK(cudaSetDevice(dev_of(r)));
        rowOut[r] = dmalloc<float>((size_t)s.M * s.K * 4);
      }
      auto rowValuesCall = [&](int r) { gin_row_values(s, r, s.rk[r].recvWeights, T, rowOut[r]); };
      std::vector<float> rvGated, rvBack;
      for (int i = 0; i < warm + iters; ++i) {
        const float a = timed_all_ranks(s, g, ev0, ev1, [&] {
          for (int r = 0; r < s.R; ++r) rowValuesCall(r);
        });
        const float b = timed_all_ranks(s, g, ev0, ev1, [&] {
          for (int j = 0; j < nb; ++j)
            for (int r = 0; r < s.R; ++r) rowValuesCall(r);
        });
        if (i >= warm) {
          rvGated.push_back(a);
          rvBack.push_back(b / nb);
        }
      }
      for (int r = 0; r < s.R; ++r) {
        CUDA_CHECK(cudaSetDevice(dev_of(r)));
        CUDA_CHECK(cudaFree(rowOut[r]));
      }
      std::vector<uint32_t> err = read_errors(s, false);
      bool errOk = true;
      for (uint32_t e : err) errOk &= e == 0;
      // HOST local kernels on rank 0 (counts exchanged once up front; the sizes do not change).
      host_layout_all(s, Ts);
      HostCounts hc = host_read_counts(s);
      host_upload_count_matrix(s, hc);
      host_pack_all(s, Ts);
      host_exchange(s, hc, false);
      std::vector<float> hd, hcomb;
      cudaEvent_t e[6];
      CUDA_CHECK(cudaSetDevice(0));
      for (auto& x : e) CUDA_CHECK(cudaEventCreate(&x));
      Rank& q = s.rk[0];
      for (int i = 0; i < warm + iters; ++i) {
        CUDA_CHECK(cudaSetDevice(0));
        CUDA_CHECK(cudaEventRecord(e[0], q.stream));
        moe_host_layout<<<s.C, MOE_THREADS, 0, q.stream>>>(host_layout_args(s, 0, T));
        (s.fp8 ? moe_host_pack_fp8 : moe_host_pack)<<<host_grid(T), kHostThreads, 0, q.stream>>>(host_pack_args(s, 0, q.x, T));
        (s.fp8 ? moe_host_permute_fp8 : moe_host_permute)<<<host_grid(s.capRows), kHostThreads, 0, q.stream>>>(
            host_permute_args(s, 0));
        CUDA_CHECK(cudaEventRecord(e[1], q.stream));
        moe_host_unpermute<<<host_grid(s.capRows), kHostThreads, 0, q.stream>>>(host_unpermute_args(s, 0, q.hRecvX, s.H));
        moe_host_combine<<<host_grid(T), kHostThreads, 0, q.stream>>>(host_combine_args(s, 0, q.sendRows, T));
        CUDA_CHECK(cudaEventRecord(e[2], q.stream));
        CUDA_CHECK(cudaGetLastError());
        CUDA_CHECK(cudaStreamSynchronize(q.stream));
        float a = 0, b = 0;
        CUDA_CHECK(cudaEventElapsedTime(&a, e[0], e[1]));
        CUDA_CHECK(cudaEventElapsedTime(&b, e[1], e[2]));
        if (i >= warm) {
          hd.push_back(a * 1000.f);
          hcomb.push_back(b * 1000.f);
        }
      }
      for (auto& x : e) CUDA_CHECK(cudaEventDestroy(x));
      const float md = median(td), mc = median(tc);
      printf("%-14s %6d | %11.1f %8.1f | %11.1f %8.1f | %10.1f %10llu | %9.1f %9.1f%s\n", sh.name, T, md,
             crossBytes / (md * 1e3), mc, crossBytes / (mc * 1e3), crossBytes / 1e6, (unsigned long long)recvRows,
             median(hd), median(hcomb), errOk ? "" : "  (errorFlags set!)");
      for (size_t v = 0; v < variants.size(); ++v)
        printf("%-14s %6s   %s: gated %.1f / %.1f us, 8 back to back %.1f / %.1f us per call (dispatch / combine)\n", "", "",
               variants[v].name().c_str(), median(vd[v]), median(vc[v]), median(vbd[v]), median(vbc[v]));
      printf("%-14s %6s   moe_gin_row_values (one f32 per row back to its (token, k)): gated %.1f us, 8 back to back %.1f us per call\n",
             "", "", median(rvGated), median(rvBack));
      record(errOk, std::string("bench ") + sh.name + " error flags", "errorFlags nonzero during timing");
      for (int r = 0; r < s.R; ++r) {
        CUDA_CHECK(cudaSetDevice(dev_of(r)));
        CUDA_CHECK(cudaEventDestroy(ev0[r]));
        CUDA_CHECK(cudaEventDestroy(ev1[r]));
      }
      free_setup(s);
    }
  }
  CUDA_CHECK(cudaFreeHost(g.host));
  return true;
}

int main(int argc, char** argv) {
  uint64_t seed = (uint64_t)std::chrono::high_resolution_clock::now().time_since_epoch().count();
  bool bench = true, tests = true;
  int channels = 0;
  const char* onlyShape = nullptr;  // --shape NAME: time only that row of the table
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--seed") && i + 1 < argc) seed = strtoull(argv[++i], nullptr, 10);
    else if (!strcmp(argv[i], "--no-bench")) bench = false;
    else if (!strcmp(argv[i], "--bench-only")) tests = false;
    else if (!strcmp(argv[i], "--channels") && i + 1 < argc) channels = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--profile")) {
#ifdef GIN4J_TRACE
      gProfile = true;
#else
      fprintf(stderr, "--profile: this build has no trace stamps; run moe_test_trace (gin-kernels/build --tests)\n");
      return 2;
#endif
    }
    else if (!strcmp(argv[i], "--ranks") && i + 1 < argc) gNumRanks = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--shape") && i + 1 < argc) onlyShape = argv[++i];
    else if (!strcmp(argv[i], "--routing") && i + 1 < argc) {
      const char* r = argv[++i];
      if (!strcmp(r, "uniform")) gBenchRouting = UNIFORM;
      else if (!strncmp(r, "zipf", 4) && (r[4] == 0 || r[4] == ':')) {
        gBenchRouting = ZIPF;
        if (r[4] == ':') gZipfS = atof(r + 5);
        if (!(gZipfS > 0 && gZipfS <= 4)) {
          fprintf(stderr, "--routing %s: the Zipf exponent must be in (0, 4]\n", r);
          return 2;
        }
      } else {
        fprintf(stderr, "--routing %s: expected uniform or zipf[:S]\n", r);
        return 2;
      }
    }
    else {
      fprintf(stderr, "usage: %s [--seed N] [--no-bench] [--bench-only] [--channels C] [--profile] [--ranks R] [--shape NAME] [--routing uniform|zipf[:S]]\n", argv[0]);
      return 2;
    }
  }
  CUDA_CHECK(cudaGetDeviceCount(&gNumGpus));
  if (gNumGpus < 1) {
    fprintf(stderr, "moe_test needs a GPU (found none)\n");
    return 2;
  }
  // One GPU: one rank (R = 1), every token stays local; the same checks, no link crossed.
  if (gNumGpus > MOE_MAX_RANKS) gNumGpus = MOE_MAX_RANKS;
  // --ranks R: R ranks, rank r on GPU r % GPUs (more ranks than GPUs: the R = 4 and 8 kernels on a
  // 2-GPU host; ranks on one GPU reach each other through local memory, the others over NVLink).
  if (gNumRanks == 0) gNumRanks = gNumGpus;
  if (gNumRanks < 1 || gNumRanks > MOE_MAX_RANKS) {
    fprintf(stderr, "--ranks %d: expected 1..%d\n", gNumRanks, MOE_MAX_RANKS);
    return 2;
  }
  if (gNumGpus > gNumRanks) gNumGpus = gNumRanks;
  if (gProfile && gNumRanks > gNumGpus) {
    fprintf(stderr, "--profile needs one rank per GPU (the profile buffer is per GPU); got %d ranks on %d GPUs\n",
            gNumRanks, gNumGpus);
    return 2;
  }
  for (int a = 0; a < gNumGpus; ++a) {
    CUDA_CHECK(cudaSetDevice(a));
    for (int b = 0; b < gNumGpus; ++b) {
      if (a == b) continue;
      int can = 0;
      CUDA_CHECK(cudaDeviceCanAccessPeer(&can, a, b));
      if (!can) {
        fprintf(stderr, "GPU %d cannot access GPU %d (peer access needed for the LSA windows)\n", a, b);
        return 2;
      }
      cudaError_t e = cudaDeviceEnablePeerAccess(b, 0);
      if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) CUDA_CHECK(e);
      (void)cudaGetLastError();
    }
  }
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  gSmCount = prop.multiProcessorCount;
  gRanksPerGpu = (gNumRanks + gNumGpus - 1) / gNumGpus;
  if (channels <= 0) channels = std::min(MOE_MAX_CHANNELS, gSmCount / (2 * gRanksPerGpu));
  printf("moe_test: %d ranks on %d GPUs (%s, %d SMs), seed %llu\n", gNumRanks, gNumGpus, prop.name, gSmCount,
         (unsigned long long)seed);
  std::mt19937_64 rng(seed);

  if (tests) {
    const int R = gNumRanks;
    const int Cd = channels;
    std::vector<Case> cases = {
        {"uniform", 16 * R, 4, 256, 256, Cd, {256, 200}, UNIFORM, 0.1},
        {"uniform few channels", 8 * R, 4, 256, 300, 3, {300, 77}, UNIFORM, 0.1},
        {"one channel", 8 * R, 2, 128, 64, 1, {64, 50}, UNIFORM, 0.1},
        {"H=2050", 4 * R, 2, 2050, 64, 7, {64, 33}, UNIFORM, 0.1},
        {"H=7", 4 * R, 3, 7, 40, 4, {40, 39}, UNIFORM, 0.1},
        {"H=7168 DeepSeek-like", 256, 8, 7168, 128, Cd, {128}, UNIFORM, 0.0},
        {"Qwen-like", 128, 8, 2048, 512, Cd, {512, 480}, UNIFORM, 0.05},
        {"T=0 everywhere", 8 * R, 4, 256, 64, 4, {0}, UNIFORM, 0.1},
        {"T=0 on rank 0", 8 * R, 4, 256, 64, 4, {0, 64}, UNIFORM, 0.1},
        {"T=1", 8 * R, 4, 256, 64, Cd, {1}, UNIFORM, 0.0},
        {"every token to one expert", 8 * R, 4, 256, 128, 6, {128, 100}, ONE_EXPERT, 0.0},
        {"only rank 0 receives", 8 * R, 4, 256, 128, 6, {128, 97}, RANK0_ONLY, 0.0},
        {"all slots masked", 8 * R, 4, 256, 64, 4, {64}, ALL_MASKED, 0.0},
        {"K=1", 8 * R, 1, 256, 128, 8, {128, 127}, UNIFORM, 0.0},
        {"one expert per rank (L=1)", R, 2, 200, 96, 5, {96, 90}, UNIFORM, 0.1},
        {"invalid ids masked", 8 * R, 4, 256, 128, 6, {128, 111}, INVALID_IDS, 0.0},
        {"Mixtral-like", 8, 2, 4096, 256, Cd, {256, 255}, UNIFORM, 0.0},
        // T*K > 4096 on rank 0: the two-level layout (histograms + lower-block waits); rank 1 the
        // one-level one (each block counts the lower tokens itself). Same positions either way.
        {"two-level layout T*K > 4096", 16 * R, 8, 64, 9000, Cd, {9000, 500}, UNIFORM, 0.05},
        // Skewed routing (Zipf popularity, hot experts shared by every rank) on the
        // token path, the layout path and the two-level layout: crowded counters and histograms.
        {"Zipf DeepSeek-like", 256, 8, 7168, 128, Cd, {128, 100}, ZIPF, 0.0},
        {"Zipf layout path", 16 * R, 8, 256, 600, Cd, {600, 333}, ZIPF, 0.05},
        {"Zipf two-level layout", 16 * R, 8, 64, 9000, Cd, {9000, 500}, ZIPF, 0.05},
        // maxTokens*K = 4096 is the token path's limit (Qwen-like above sits on it); one
        // token more takes the layout path. And a token-path instance with <= 32 tokens per
        // channel at few channels (C = 4, M = 128).
        {"layout path M*K = 4104", 16 * R, 8, 256, 513, Cd, {513, 400}, UNIFORM, 0.05},
        {"token path 32 per channel", 16 * R, 8, 256, 128, 4, {128, 127}, UNIFORM, 0.05},
        // The token-path combine's LL128 lines (120 payload bytes; lane 7 of a line
        // carries 8 bytes of the row's tail region): one line exactly (H = 60), rows of several
        // 16-line passes with a partial tail (H = 1100), rows of 24 bytes (element path, rows not
        // 16-byte aligned), and DeepSeek-wide rows with a single token.
        {"token path H=60 one line", 8 * R, 4, 60, 64, 4, {64, 41}, UNIFORM, 0.1},
        {"token path H=1100 passes", 8 * R, 4, 1100, 96, 6, {96, 70}, UNIFORM, 0.1},
        {"token path H=12 odd rows", 8 * R, 3, 12, 40, 3, {40, 33}, UNIFORM, 0.1},
        {"token path H=7168 T=1", 256, 8, 7168, 128, Cd, {1}, UNIFORM, 0.0},
        // Scaled fp8 dispatch rows (moe_fp8_row_bytes: H codes + f32 scales per 128,
        // padded to 16 bytes), bf16 combine. Both paths, the shapes with fp8 entries of their own,
        // a short last scale block (H = 272: 3 scales + 1 pad), the smallest rows (H = 16, 32
        // bytes), the two-level layout, and empty ranks.
        {"fp8 DeepSeek-like", 256, 8, 7168, 128, Cd, {128, 101}, UNIFORM, 0.0, true},
        {"fp8 Qwen-like", 128, 8, 2048, 512, Cd, {512, 480}, UNIFORM, 0.05, true},
        {"fp8 layout path", 16 * R, 8, 256, 600, Cd, {600, 333}, UNIFORM, 0.05, true},
        {"fp8 H=272 short scale block", 8 * R, 4, 272, 64, 4, {64, 50}, UNIFORM, 0.1, true},
        {"fp8 H=16", 8 * R, 4, 16, 96, 5, {96, 80}, UNIFORM, 0.1, true},
        {"fp8 two-level layout", 16 * R, 8, 64, 9000, Cd, {9000, 500}, UNIFORM, 0.05, true},
        {"fp8 T=0 on rank 0", 8 * R, 4, 256, 64, 4, {0, 64}, UNIFORM, 0.1, true},
        // bf16 rows in, quantized by the dispatch (xq); rows checked byte for byte
        // against the CPU reference quantizer. Both paths, the shape entries, a short scale block.
        {"fp8 quantizing DeepSeek-like", 256, 8, 7168, 128, Cd, {128, 101}, UNIFORM, 0.0, true, true},
        {"fp8 quantizing Qwen-like", 128, 8, 2048, 512, Cd, {512, 480}, UNIFORM, 0.05, true, true},
        {"fp8 quantizing layout path", 16 * R, 8, 256, 600, Cd, {600, 333}, UNIFORM, 0.05, true, true},
        {"fp8 quantizing two-level", 16 * R, 8, 64, 9000, Cd, {9000, 500}, UNIFORM, 0.05, true, true},
        {"fp8 quantizing H=272", 8 * R, 4, 272, 64, 4, {64, 50}, UNIFORM, 0.1, true, true},
        {"fp8 quantizing T=0 on rank 0", 8 * R, 4, 256, 64, 4, {0, 64}, UNIFORM, 0.1, true, true},
        // ~31 tokens per channel at C = 66, bf16 rows of 2048 (the quantizing split
        // between sender and receiver c at a realistic hidden size).
        {"fp8 quantizing 31 per channel", 16 * R, 8, 2048, 2100, Cd, {2100, 1500}, UNIFORM, 0.05, true, true},
    };
    for (const Case& cs : cases) {
      if (cs.E % R != 0 || cs.K > cs.E) {
        printf("case %-28s skipped: needs E %% R == 0 and K <= E (E=%d, R=%d, K=%d)\n", cs.name.c_str(), cs.E, R, cs.K);
        continue;
      }
      // The entry the Java side takes, and the less specific ones that also accept the case.
      const Entry best = best_entry(R, cs.E, cs.K, cs.H, cs.M, cs.C, cs.fp8);
      const Entry& tp = cs.fp8 ? kFp8TokenPathEntry : kTokenPathEntry;
      const Entry& generic = cs.fp8 ? kFp8GenericEntry : kGenericEntry;
      run_case(cs, rng, best);
      if (best.name != tp.name && moe_token_path(cs.K, cs.M, cs.C)) run_case(cs, rng, tp);
      if (best.name != generic.name) run_case(cs, rng, generic);
    }
    run_entry_refusals(rng);
    run_fp8_quantize(rng);
    run_back_to_back(rng, 200, 5, false);
    run_back_to_back(rng, 100, 2, false);
    run_back_to_back(rng, 100, 5, true);
    run_back_to_back(rng, 50, 2, true);
    printf("\n%d passed, %d failed\n", gPassed, gFailed);
  }
  if (bench && !run_bench(rng, channels, onlyShape)) return 2;
  if (!tests) printf("\n%d passed, %d failed\n", gPassed, gFailed);
  return gFailed == 0 ? 0 : 1;
}
