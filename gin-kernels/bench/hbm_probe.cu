// hbm_probe.cu - what HBM rate do the MoE 4096-token access patterns reach on one GPU?
//
// The question behind it: the DeepSeek-V3 4096-token dispatch and combine move
// ~530 MB through HBM per rank (32,768 expert rows of 14 KB and 4,096 token rows). At R = 1 (no
// link) moe_test measured them at ~182 / ~188 us, ~2.9 TB/s. Is that the memory, or the code?
// This program times, on one GPU:
//   read / write: a plain stream over 470 MB with every SM busy (1056 blocks), and a
//                 device-to-device cudaMemcpyAsync (the roofline);
//   reduce:       y[t] = sum of K gathered rows (fp32 sums of bf16, one bf16 rounding), one warp
//                 per (token, 2 KB pass), 4 x 16 bytes per lane, 2 rows of loads in flight (the
//                 shape of the MoE kernels' warp_reduce_seg without its L2 prefetch);
//   expand:       each token row to K gathered rows (the shape of warp_expand_seg);
// with 66 blocks (one MoE role's half of the grid) and 132 (every SM), 512 threads each.
// Checks: the expand's every output word against the source's fill pattern, and the reduce's
// every output word against the bf16 sum of K rows of that pattern (device-side counts).
//
// Measured (one H200, 2026-12-01, commit 7daec63, checks passed): read 4.21 TB/s, write 4.16, memcpy 4.10; reduce K = 8 at
// 66 / 132 blocks 2.96 / 3.93 TB/s, expand 2.80 / 3.48 TB/s. The MoE kernels at R = 1 (one role
// busy, 66 SMs) run at the 66-block rate: with 512 threads and 128 registers per SM the patterns
// are bound by the loads one SM keeps in flight, not by HBM.
//
// Measured (one H200, 2026-12-01, commit cca66e6, checks passed): is the expand's 3.4 TB/s its concurrency or the memory?
// The variants below (more vectors per lane, the next pass loaded ahead, 2-4 blocks or 1024
// threads per SM, one idx load per pass shuffled, evict-first stores, four passes' loads before
// their stores, bulk L2 prefetches ahead, sequential or expert-major target rows) all stay at
// 3.20-3.49 TB/s (151-165 us), while the same scattered stores without the loads reach 3.86 TB/s
// (121 us) and a linear write 4.10-4.15. The 58 MB of reads cost ~33 us among 470 MB of writes, where
// alone they take ~14 us: the read/write mix, not the SMs, bounds the pattern. the MoE kernels' 4096-token
// expansion is at that rate already (see docs/kernels.md, "What bounds the MoE numbers").
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
// Variants of expand: U vectors per lane per pass; kAhead: the next pass's loads issued
// before this pass's stores (two passes in flight per warp).
template <int U, bool kAhead>
__global__ void __launch_bounds__(1024, 1) expand_v(const V* in, V* out, const int* idx, int T, int K, int rowVecs) {
  const int lane = threadIdx.x & 31, warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int nw = (gridDim.x * blockDim.x) >> 5, passes = (rowVecs + 32 * U - 1) / (32 * U);
  auto load = [&](int it, V* r) {
    const int t = it / passes, p = it % passes;
    for (int u = 0; u < U; ++u) {
      const int v = p * 32 * U + u * 32 + lane;
      r[u] = V{0, 0, 0, 0};
      if (it < T * passes && v < rowVecs) r[u] = in[(size_t)t * rowVecs + v];
    }
  };
  V r[U], nx[U];
  load(warp, r);
  for (int it = warp; it < T * passes; it += nw) {
    if (kAhead) load(it + nw, nx);
    const int t = it / passes, p = it % passes;
    for (int k = 0; k < K; ++k) {
      const size_t o = (size_t)idx[t * K + k] * rowVecs;
      for (int u = 0; u < U; ++u) {
        const int v = p * 32 * U + u * 32 + lane;
        if (v < rowVecs) out[o + v] = r[u];
      }
    }
    if (kAhead) for (int u = 0; u < U; ++u) r[u] = nx[u];
    else load(it + nw, r);
  }
}
// Lane k < K holds the pass's row k (one idx load per pass, shuffled to the warp, as the MoE kernels' expand
// does); kMode 0: plain stores, 1: evict-first stores (st.global.cs), 2: no loads at all (the
// values are made up, unchecked: the scattered stores alone).
template <int kMode>
__global__ void __launch_bounds__(512, 1) expand_w(const V* __restrict__ in, V* __restrict__ out, const int* __restrict__ idx,
                                                   int T, int K, int rowVecs) {
  constexpr int U = 4;
  const int lane = threadIdx.x & 31, warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int nw = (gridDim.x * blockDim.x) >> 5, passes = (rowVecs + 32 * U - 1) / (32 * U);
  for (int it = warp; it < T * passes; it += nw) {
    const int t = it / passes, p = it % passes;
    const int myRow = lane < K ? idx[t * K + lane] : 0;
    V r[U];
    for (int u = 0; u < U; ++u) {
      const int v = p * 32 * U + u * 32 + lane;
      r[u] = V{(uint32_t)t, (uint32_t)p, (uint32_t)u, (uint32_t)lane};
      if (kMode != 2 && v < rowVecs) r[u] = in[(size_t)t * rowVecs + v];
    }
    for (int k = 0; k < K; ++k) {
      const size_t o = (size_t)__shfl_sync(0xffffffffu, myRow, k) * rowVecs;
      for (int u = 0; u < U; ++u) {
        const int v = p * 32 * U + u * 32 + lane;
        if (v < rowVecs) {
          if (kMode == 1) __stcs(reinterpret_cast<int4*>(out + o + v), *reinterpret_cast<const int4*>(&r[u]));
          else out[o + v] = r[u];
        }
      }
    }
  }
}
// kItems passes per warp loaded before any of their stores (reads in bursts), or (kPrefetch) one
// lane's bulk L2 prefetch of the pass kDist iterations ahead.
template <int kItems, bool kPrefetch>
__global__ void __launch_bounds__(512, 1) expand_b(const V* __restrict__ in, V* __restrict__ out, const int* __restrict__ idx,
                                                   int T, int K, int rowVecs) {
  constexpr int U = 4, kDist = 3;
  const int lane = threadIdx.x & 31, warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int nw = (gridDim.x * blockDim.x) >> 5, passes = (rowVecs + 32 * U - 1) / (32 * U), n = T * passes;
  for (int it0 = warp * kItems; it0 < n; it0 += nw * kItems) {
    V r[kItems][U];
    int myRow[kItems];
    for (int j = 0; j < kItems; ++j) {
      const int it = it0 + j, t = it / passes, p = it % passes;
      myRow[j] = lane < K && it < n ? idx[t * K + lane] : 0;
      for (int u = 0; u < U; ++u) {
        const int v = p * 32 * U + u * 32 + lane;
        r[j][u] = V{0, 0, 0, 0};
        if (it < n && v < rowVecs) r[j][u] = in[(size_t)t * rowVecs + v];
      }
      if (kPrefetch && lane == 0) {
        const int f = it + kDist * nw * kItems;
        if (f < n) {
          const int ft = f / passes, fp = f % passes;
          const int v0 = fp * 32 * U, nv = min(32 * U, rowVecs - v0);
          asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(in + (size_t)ft * rowVecs + v0), "r"(nv * 16) : "memory");
        }
      }
    }
    for (int j = 0; j < kItems; ++j) {
      const int it = it0 + j, p = it % passes;
      if (it >= n) break;
      for (int k = 0; k < K; ++k) {
        const size_t o = (size_t)__shfl_sync(0xffffffffu, myRow[j], k) * rowVecs;
        for (int u = 0; u < U; ++u) {
          const int v = p * 32 * U + u * 32 + lane;
          if (v < rowVecs) out[o + v] = r[j][u];
        }
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
  // What the expand pattern needs to reach the write stream's rate.
  timeit("write 470 MB (132 blocks x 512)", big * 16.0, [&] { fill_k<<<132, 512>>>(out, big, 0u); });
  auto variant = [&](const char* n, auto launch) {
    fill_k<<<1056, 512>>>(out, big, 0xdeadbeefu);
    timeit(n, rowB * (rows + T), launch);
    expect(n, big, fillWord);
  };
  variant("expand U=4 132x512 (as above, random rows)", [&] { expand_v<4, false><<<132, 512>>>(in, out, idx, T, K, rowVecs); });
  variant("expand U=8 132x512", [&] { expand_v<8, false><<<132, 512>>>(in, out, idx, T, K, rowVecs); });
  variant("expand U=4 ahead 132x512", [&] { expand_v<4, true><<<132, 512>>>(in, out, idx, T, K, rowVecs); });
  variant("expand U=4 264x512", [&] { expand_v<4, false><<<264, 512>>>(in, out, idx, T, K, rowVecs); });
  variant("expand U=4 132x1024", [&] { expand_v<4, false><<<132, 1024>>>(in, out, idx, T, K, rowVecs); });
  variant("expand U=4 528x512", [&] { expand_v<4, false><<<528, 512>>>(in, out, idx, T, K, rowVecs); });
  variant("expand idx shuffled, restrict 132x512", [&] { expand_w<0><<<132, 512>>>(in, out, idx, T, K, rowVecs); });
  variant("expand idx shuffled, st.global.cs 132x512", [&] { expand_w<1><<<132, 512>>>(in, out, idx, T, K, rowVecs); });
  timeit("expand's stores alone (no loads, unchecked)", rowB * rows, [&] { expand_w<2><<<132, 512>>>(in, out, idx, T, K, rowVecs); });
  timeit("expand's stores alone 528x512 (unchecked)", rowB * rows, [&] { expand_w<2><<<528, 512>>>(in, out, idx, T, K, rowVecs); });
  variant("expand 4 passes per warp loaded first 132x512", [&] { expand_b<4, false><<<132, 512>>>(in, out, idx, T, K, rowVecs); });
  variant("expand 1 pass, L2 prefetch 3 ahead 132x512", [&] { expand_b<1, true><<<132, 512>>>(in, out, idx, T, K, rowVecs); });
  variant("expand 2 passes, L2 prefetch 3 ahead 132x512", [&] { expand_b<2, true><<<132, 512>>>(in, out, idx, T, K, rowVecs); });
  {
    std::vector<int> seq(rows);
    for (int i = 0; i < rows; ++i) seq[i] = i;
    CK(cudaMemcpy(idx, seq.data(), rows * sizeof(int), cudaMemcpyHostToDevice));
    variant("expand U=4 132x512, sequential rows", [&] { expand_v<4, false><<<132, 512>>>(in, out, idx, T, K, rowVecs); });
    // expert-major like moe: row of (t, k) = k * T + t (each expert's rows contiguous by token)
    for (int t = 0; t < T; ++t) for (int k = 0; k < K; ++k) seq[t * K + k] = k * T + t;
    CK(cudaMemcpy(idx, seq.data(), rows * sizeof(int), cudaMemcpyHostToDevice));
    variant("expand U=4 132x512, expert-major rows", [&] { expand_v<4, false><<<132, 512>>>(in, out, idx, T, K, rowVecs); });
    variant("expand U=4 528x512, expert-major rows", [&] { expand_v<4, false><<<528, 512>>>(in, out, idx, T, K, rowVecs); });
  }
  CK(cudaDeviceSynchronize());
  printf(failures ? "%d check(s) failed\n" : "checks passed\n", failures);
  return failures ? 1 : 0;
}
