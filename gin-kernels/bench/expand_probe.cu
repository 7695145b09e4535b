// expand_probe.cu - how fast can MoE receivers write one source row segment to several target rows?
//
// The question behind it: the DeepSeek-V3 dispatch at 128 tokens per rank writes ~14.7 MB of
// expert-major rows per rank (each 14 KB token row to ~4 rows at R = 2, 8 rows at R = 1), cut into
// 2 KB segments, one warp per segment. At R = 1 (no link) it still takes ~13 us per call, so the
// expansion itself is slow. This program times that access pattern alone, one warp per segment:
//   simt: the lanes load the segment (4 x 16 bytes each) and store it to each target row (what
//         the MoE kernels' warp_expand_seg does); simt.cs: the same with streaming (evict-first) stores
//   tma:  lane 0 moves the segment into shared memory with one bulk copy (cp.async.bulk, sm_90)
//         and writes it to each target row with one bulk store per row: no registers hold data,
//         so a warp has T x 2 KB of stores in flight at once
// for 66 blocks (the receivers' grid) and 132 blocks (every SM), 512 threads each, T = 4 (the R = 2
// shape: 256 source rows) and T = 8 (R = 1: 128 source rows). Timed as 20 launches back to back
// (per launch) and as the span from the first block's start to the last block's end in the last
// launch (%globaltimer). Every target row is checked against its source (fresh random data,
// destinations poisoned before each variant).
//
// Build: nvcc -arch=sm_90 -O3 -o expand_probe expand_probe.cu
// Exit status: 0 = all checks passed, 1 = a mismatch, 2 = CUDA error.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <vector>

static void check(cudaError_t e, const char* what, int line) {
  if (e != cudaSuccess) {
    fprintf(stderr, "expand_probe.cu:%d: %s failed: %s (%s)\n", line, what, cudaGetErrorName(e), cudaGetErrorString(e));
    exit(2);
  }
}
#define CK(x) check((x), #x, __LINE__)

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kSeg = 2048;                 // bytes per segment (one warp pass of 4 x 16 bytes per lane)
constexpr int kRowBytes = 14336;           // DeepSeek-V3 row: 7168 bf16
constexpr int kSegsPerRow = kRowBytes / kSeg;

__device__ __forceinline__ uint64_t now_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Item i = (source row i / 7, segment i % 7); its targets are rows (i / 7) * T + k of dst.
__device__ __forceinline__ void item_addr(int item, int T, uint64_t& srcOff, uint64_t& dstOff0) {
  const int row = item / kSegsPerRow, seg = item % kSegsPerRow;
  srcOff = (uint64_t)row * kRowBytes + (uint64_t)seg * kSeg;
  dstOff0 = (uint64_t)row * T * kRowBytes + (uint64_t)seg * kSeg;
}

__device__ __forceinline__ void span_begin(unsigned long long* span) {
  if (threadIdx.x == 0) atomicMin(&span[0], (unsigned long long)now_ns());
}
__device__ __forceinline__ void span_end(unsigned long long* span) {
  __syncthreads();
  if (threadIdx.x == 0) atomicMax(&span[1], (unsigned long long)now_ns());
}

template <bool kStreamingStores>
__global__ void __launch_bounds__(kThreads, 1) expand_simt(const uint8_t* src, uint8_t* dst, int T, int items,
                                                           unsigned long long* span) {
  span_begin(span);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int item = blockIdx.x * kWarps + warp; item < items; item += gridDim.x * kWarps) {
    uint64_t so, d0;
    item_addr(item, T, so, d0);
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) v[u] = __ldcg((const uint4*)(src + so) + lane + 32 * u);
    for (int k = 0; k < T; ++k) {
      uint4* d = (uint4*)(dst + d0 + (uint64_t)k * kRowBytes);
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        if (kStreamingStores) __stcs(d + lane + 32 * u, v[u]);  // st.global.cs: evict first
        else d[lane + 32 * u] = v[u];
      }
    }
  }
  span_end(span);
}

__global__ void __launch_bounds__(kThreads, 1) expand_tma(const uint8_t* src, uint8_t* dst, int T, int items,
                                                          unsigned long long* span) {
  __shared__ __align__(128) uint8_t buf[kWarps][kSeg];
  __shared__ __align__(8) uint64_t bar[kWarps];
  span_begin(span);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    const uint32_t b = (uint32_t)__cvta_generic_to_shared(&bar[warp]);
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(&buf[warp][0]);
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(b) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    uint32_t phase = 0;
    for (int item = blockIdx.x * kWarps + warp; item < items; item += gridDim.x * kWarps) {
      uint64_t so, d0;
      item_addr(item, T, so, d0);
      // The previous item's bulk stores must have read the buffer before it is refilled.
      asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b), "r"(kSeg) : "memory");
      asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(s),
                   "l"(src + so), "r"(kSeg), "r"(b)
                   : "memory");
      uint32_t done = 0;
      while (!done)
        asm volatile(
            "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
            : "=r"(done)
            : "r"(b), "r"(phase)
            : "memory");
      phase ^= 1u;
      for (int k = 0; k < T; ++k)
        asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst + d0 + (uint64_t)k * kRowBytes),
                     "r"(s), "r"(kSeg)
                     : "memory");
      asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    }
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  }
  span_end(span);
}

// The launch-to-launch floor of the same grid (same arguments, nothing copied).
__global__ void __launch_bounds__(kThreads, 1) empty_kernel(const uint8_t*, uint8_t*, int, int, unsigned long long* span) {
  span_begin(span);
  span_end(span);
}

__global__ void fill_random(uint4* p, uint64_t n, uint64_t seed) {
  for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x) {
    uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    p[i] = make_uint4((uint32_t)x, (uint32_t)(x >> 32), (uint32_t)(x * 3), (uint32_t)(x >> 7));
  }
}

int main() {
  const int maxRows = 256, maxT = 8;
  const size_t srcBytes = (size_t)maxRows * kRowBytes, dstBytes = (size_t)maxRows * maxT * kRowBytes;
  uint8_t *src, *dst;
  unsigned long long* span;
  CK(cudaMalloc(&src, srcBytes));
  CK(cudaMalloc(&dst, dstBytes));
  CK(cudaMalloc(&span, 16));
  const uint64_t seed = (uint64_t)time(nullptr);
  fill_random<<<264, 512>>>((uint4*)src, srcBytes / 16, seed);
  CK(cudaGetLastError());
  std::vector<uint8_t> hs(srcBytes), hd(dstBytes);
  CK(cudaMemcpy(hs.data(), src, srcBytes, cudaMemcpyDeviceToHost));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  const int launches = 20;
  auto run = [&](auto kernel, int grid, int T, int items, float& perLaunch, double& spanUs) {
    const unsigned long long init[2] = {~0ull, 0ull};
    for (int w = 0; w < 3; ++w) kernel<<<grid, kThreads>>>(src, dst, T, items, span);
    CK(cudaGetLastError());
    CK(cudaEventRecord(e0));
    for (int i = 0; i < launches; ++i) {
      if (i == launches - 1) CK(cudaMemcpyAsync(span, init, 16, cudaMemcpyHostToDevice));
      kernel<<<grid, kThreads>>>(src, dst, T, items, span);
    }
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    CK(cudaGetLastError());
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    perLaunch = ms * 1000.f / launches;  // the memcpy before the last launch adds ~2 us / 20
    unsigned long long h[2];
    CK(cudaMemcpy(h, span, 16, cudaMemcpyDeviceToHost));
    spanUs = (double)(h[1] - h[0]) * 1e-3;
  };
  for (int grid : {66, 132}) {
    float per = 0;
    double sp = 0;
    run(empty_kernel, grid, 0, 0, per, sp);
    printf("empty kernel, %3d blocks: %.2f us per launch back to back, span %.2f us\n", grid, per, sp);
  }
  printf("%-7s %6s %3s %6s | %12s %9s %9s | check\n", "mode", "blocks", "T", "items", "us/launch", "span us", "GB/s");
  bool allOk = true;
  for (int T : {4, 8}) {
    const int rows = T == 4 ? 256 : 128, items = rows * kSegsPerRow;
    const size_t written = (size_t)rows * T * kRowBytes;
    for (int mode = 0; mode < 3; ++mode)
      for (int grid : {66, 132}) {
        CK(cudaMemset(dst, 0xFF, dstBytes));
        float per = 0;
        double sp = 0;
        if (mode == 0) run(expand_simt<false>, grid, T, items, per, sp);
        else if (mode == 1) run(expand_simt<true>, grid, T, items, per, sp);
        else run(expand_tma, grid, T, items, per, sp);
        CK(cudaMemcpy(hd.data(), dst, written, cudaMemcpyDeviceToHost));
        bool ok = true;
        for (int r = 0; r < rows && ok; ++r)
          for (int k = 0; k < T && ok; ++k)
            for (int b = 0; b < kRowBytes; ++b)
              if (hd[((size_t)r * T + k) * kRowBytes + b] != hs[(size_t)r * kRowBytes + b]) {
                ok = false;
                break;
              }
        allOk &= ok;
        printf("%-7s %6d %3d %6d | %12.2f %9.2f %9.0f | %s\n", mode == 0 ? "simt" : mode == 1 ? "simt.cs" : "tma", grid, T, items, per, sp,
               written / (sp * 1e3), ok ? "ok" : "MISMATCH");
      }
  }
  printf("expand_probe: %s\n", allOk ? "all rows checked, every byte" : "MISMATCH");
  return allOk ? 0 : 1;
}
