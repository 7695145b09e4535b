// hbm_probe.cu - what HBM rate do the MoE 4096-token access patterns reach on one GPU?
//
// The question behind it (issue 7, session 8): the DeepSeek-V3 4096-token dispatch and combine move
// ~530 MB through HBM per rank (32,768 expert rows of 14 KB and 4,096 token rows). At R = 1 (no
// link) moe_test measured them at ~182 / ~188 us, ~2.9 TB/s. Is that the memory, or the code?
// This program times, on one GPU:
//   read / write: a plain stream over 470 MB with every SM busy (1056 blocks), and a
//                 device-to-device cudaMemcpyAsync (the roofline);
//   reduce:       y[t] = sum of K gathered rows (fp32 sums of bf16, one bf16 rounding), one warp
//                 per (token, 2 KB pass), 4 x 16 bytes per lane, 2 rows of loads in flight (the
//                 shape of moe.cu's warp_reduce_seg without its L2 prefetch);
//   expand:       each token row to K gathered rows (the shape of warp_expand_seg);
// with 66 blocks (one MoE role's half of the grid) and 132 (every SM), 512 threads each.
// Checks: the expand's every output word against the source's fill pattern, and the reduce's
// every output word against the bf16 sum of K rows of that pattern (device-side counts).
//
// Session 8 (one H200, checks passed): read 4.21 TB/s, write 4.16, memcpy 4.10; reduce K = 8 at
// 66 / 132 blocks 2.96 / 3.93 TB/s, expand 2.80 / 3.48 TB/s. The MoE kernels at R = 1 (one role
// busy, 66 SMs) run at the 66-block rate: with 512 threads and 128 registers per SM the patterns
// are bound by the loads one SM keeps in flight, not by HBM.
//
// Build: nvcc -arch=sm_90 -O3 -std=c++17 -o hbm_probe hbm_probe.cu
// Exit status: 0 = checks passed, 1 = a mismatch, 2 = CUDA error.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

static void check(cudaError_t e, const char* what, int line) {
  if (e != cudaSuccess) {
    fprintf(stderr, "hbm_probe.cu:%d: %s failed: %s\n", line, what, cudaGetErrorString(e));
    exit(2);
  }
}
#define CK(x) check((x), #x, __LINE__)

struct alignas(16) V {
  uint32_t a, b, c, d;
};
__device__ __forceinline__ void add_bf16x8(float* acc, V v) {
  const uint32_t w[4] = {v.a, v.b, v.c, v.d};
  for (int i = 0; i < 4; ++i) {
    acc[2 * i] += __uint_as_float(w[i] << 16);
    acc[2 * i + 1] += __uint_as_float(w[i] & 0xffff0000u);
  }
}
__device__ __forceinline__ uint32_t bf16_round(float f) {  // round to nearest even
  const uint32_t u = __float_as_uint(f);
  return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}
constexpr int kU = 4;  // 16-byte vectors per lane per pass

// One warp per (token, pass of 32 x kU vectors); rows gathered through idx[t * K + k].
__global__ void __launch_bounds__(512, 1) reduce_k(const V* in, V* out, const int* idx, int T, int K, int rowVecs) {
  const int lane = threadIdx.x & 31, warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int nw = (gridDim.x * blockDim.x) >> 5, passes = (rowVecs + 32 * kU - 1) / (32 * kU);
  for (int it = warp; it < T * passes; it += nw) {
    const int t = it / passes, p = it % passes;
    float acc[kU][8] = {};
    for (int k0 = 0; k0 < K; k0 += 2) {
      V r[2][kU];
      for (int g = 0; g < 2; ++g)
        for (int u = 0; u < kU; ++u) {
          const int v = p * 32 * kU + u * 32 + lane;
          r[g][u] = V{0, 0, 0, 0};
          if (k0 + g < K && v < rowVecs) r[g][u] = in[(size_t)idx[t * K + k0 + g] * rowVecs + v];
        }
      for (int g = 0; g < 2; ++g)
        for (int u = 0; u < kU; ++u) add_bf16x8(acc[u], r[g][u]);
    }
    for (int u = 0; u < kU; ++u) {
      const int v = p * 32 * kU + u * 32 + lane;
      uint32_t w[4];
      for (int i = 0; i < 4; ++i) w[i] = bf16_round(acc[u][2 * i]) | (bf16_round(acc[u][2 * i + 1]) << 16);
      if (v < rowVecs) out[(size_t)t * rowVecs + v] = V{w[0], w[1], w[2], w[3]};
    }
  }
}
__global__ void __launch_bounds__(512, 1) expand_k(const V* in, V* out, const int* idx, int T, int K, int rowVecs) {
  const int lane = threadIdx.x & 31, warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int nw = (gridDim.x * blockDim.x) >> 5, passes = (rowVecs + 32 * kU - 1) / (32 * kU);
  for (int it = warp; it < T * passes; it += nw) {
    const int t = it / passes, p = it % passes;
    V r[kU];
    for (int u = 0; u < kU; ++u) {
      const int v = p * 32 * kU + u * 32 + lane;
      r[u] = V{0, 0, 0, 0};
      if (v < rowVecs) r[u] = in[(size_t)t * rowVecs + v];
    }
    for (int k = 0; k < K; ++k) {
      const size_t o = (size_t)idx[t * K + k] * rowVecs;
      for (int u = 0; u < kU; ++u) {
        const int v = p * 32 * kU + u * 32 + lane;
        if (v < rowVecs) out[o + v] = r[u];
      }
    }
  }
}
__global__ void read_k(const V* in, size_t n, uint32_t* sink) {
  uint32_t x = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const V v = in[i];
    x ^= v.a ^ v.d;
  }
  if (x == 0x9e3779b9u) *sink = x;  // keeps the loads
}
__global__ void fill_k(V* out, size_t n, uint32_t w) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    out[i] = V{w, w, w, w};
}
__global__ void count_mismatch_k(const V* p, size_t n, uint32_t w, unsigned long long* bad) {
  unsigned long long b = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const V v = p[i];
    b += (v.a != w) + (v.b != w) + (v.c != w) + (v.d != w);
  }
  if (b) atomicAdd(bad, b);
}

int main() {
  int dev = 0;
  if (cudaGetDeviceCount(&dev) != cudaSuccess || dev < 1) {
    fprintf(stderr, "hbm_probe needs a GPU (found none)\n");
    return 2;
  }
  const int H = 7168, K = 8, T = 4096, rowVecs = H * 2 / 16, rows = T * K;  // DeepSeek-V3, 4096 tokens
  const size_t big = (size_t)rows * rowVecs;                                // 16-byte vectors, 470 MB
  V *in, *out;
  int* idx;
  uint32_t* sink;
  unsigned long long* bad;
  CK(cudaMalloc(&in, big * 16));
  CK(cudaMalloc(&out, big * 16));
  CK(cudaMalloc(&idx, rows * sizeof(int)));
  CK(cudaMalloc(&sink, 4));
  CK(cudaMalloc(&bad, 8));
  // Expert rows in a random permutation (every output row written once by expand).
  std::vector<int> perm(rows);
  for (int i = 0; i < rows; ++i) perm[i] = i;
  std::mt19937 rng(std::random_device{}());
  std::shuffle(perm.begin(), perm.end(), rng);
  CK(cudaMemcpy(idx, perm.data(), rows * sizeof(int), cudaMemcpyHostToDevice));
  // Fill pattern: every bf16 1.5 + a random small power-of-two step (exact sums of K = 8 rows).
  const uint32_t h = 0x3fc0u + (uint32_t)(rng() % 4) * 0x10u, fillWord = h | (h << 16);
  fill_k<<<1056, 512>>>(in, big, fillWord);
  CK(cudaGetLastError());
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  int failures = 0;
  auto expect = [&](const char* what, size_t n, uint32_t w) {
    CK(cudaMemset(bad, 0, 8));
    count_mismatch_k<<<1056, 512>>>(out, n, w, bad);
    CK(cudaGetLastError());
    unsigned long long hb = 0;
    CK(cudaMemcpy(&hb, bad, 8, cudaMemcpyDeviceToHost));
    if (hb) {
      printf("  CHECK FAILED %s: %llu of %zu words wrong\n", what, hb, n * 4);
      ++failures;
    }
  };
  auto timeit = [&](const char* name, double bytes, auto launch) {
    for (int i = 0; i < 3; ++i) launch();
    CK(cudaGetLastError());
    std::vector<float> ts;
    for (int i = 0; i < 15; ++i) {
      CK(cudaEventRecord(a));
      launch();
      CK(cudaEventRecord(b));
      CK(cudaEventSynchronize(b));
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, a, b));
      ts.push_back(ms * 1000);
    }
    CK(cudaGetLastError());
    std::sort(ts.begin(), ts.end());
    printf("%-46s %8.1f us  %5.2f TB/s (%.0f MB)\n", name, ts[7], bytes / ts[7] / 1e6, bytes / 1e6);
  };
  // Reduce output: K rows of h summed exactly in fp32, then rounded.
  const float hv = __builtin_bit_cast(float, h << 16);
  const uint32_t sumH = __builtin_bit_cast(uint32_t, hv * (float)K) >> 16, sumWord = sumH | (sumH << 16);
  const double rowB = (double)H * 2;
  timeit("read 470 MB (1056 blocks x 512)", big * 16.0, [&] { read_k<<<1056, 512>>>(in, big, sink); });
  timeit("write 470 MB (1056 blocks x 512)", big * 16.0, [&] { fill_k<<<1056, 512>>>(out, big, 0u); });
  timeit("cudaMemcpyAsync D2D 235 MB (read + write)", big * 16.0,
         [&] { CK(cudaMemcpyAsync(out, in, big * 8, cudaMemcpyDeviceToDevice)); });
  for (int blocks : {66, 132}) {
    char n[96];
    fill_k<<<1056, 512>>>(out, big, 0xdeadbeefu);  // poison
    snprintf(n, sizeof n, "expand K=8 T=4096, %d blocks", blocks);
    timeit(n, rowB * (rows + T), [&] { expand_k<<<blocks, 512>>>(in, out, idx, T, K, rowVecs); });
    expect(n, big, fillWord);
    fill_k<<<1056, 512>>>(out, big, 0xdeadbeefu);
    snprintf(n, sizeof n, "reduce K=8 T=4096, %d blocks", blocks);
    timeit(n, rowB * (rows + T), [&] { reduce_k<<<blocks, 512>>>(in, out, idx, T, K, rowVecs); });
    expect(n, (size_t)T * rowVecs, sumWord);
  }
  CK(cudaDeviceSynchronize());
  printf(failures ? "%d check(s) failed\n" : "checks passed\n", failures);
  return failures ? 1 : 0;
}
