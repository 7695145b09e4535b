// latency_probe.cu - what do the small steps of a kernel cost on this GPU, in SM cycles and ns?
//
// The question behind it: phases of the MoE dispatch with almost no memory
// traffic (a 128-token id walk, one thread's first load) read 2-5 us on %globaltimer stamps. This
// program measures, on one GPU (and a peer where there is one):
//   timer:  the %globaltimer step (is it 1 us here?) and the SM clock (clock64 cycles per ns over 2 ms)
//   chase:  one thread's dependent loads (pointer chase): L1 hits, L2 hits (ld.global.cg), and loads
//           that miss L2 and the TLB (2 MiB + 4 KiB apart over 1 GiB, after 256 MiB of other writes)
//   sync:   per operation, one thread: ld.acquire.sys, ld.relaxed.sys, fence.acq_rel.sys after a
//           store, st.release.sys (local, peer), a warp's 2 KiB / 14 KiB of peer stores + release
//   smem:   a 512-thread block: clear 256 counters, barrier, 8 shared atomicAdd + 1 atomicOr each
//   contention: one thread's L2-hit loads while ~128 other SMs spin-poll (own words, shared words,
//           with __nanosleep)
//   code:   one warp running ~32 KiB of new straight-line code, then again (instruction fetch)
// Every number is a median over repetitions; each kernel's return code is checked; the chase
// checks that it walked the permutation it was given (the sum of the visited indices).
//
// Build: gin-kernels/build --tests (or nvcc -arch=sm_90 -O3 -o latency_probe latency_probe.cu)
// Run:   latency_probe          Exit status: 0 = done, 1 = a check failed, 2 = CUDA error / no GPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

static void check(cudaError_t e, const char* what, int line) {
  if (e != cudaSuccess) {
    fprintf(stderr, "latency_probe.cu:%d: %s failed: %s (%s)\n", line, what, cudaGetErrorName(e), cudaGetErrorString(e));
    exit(2);
  }
}
#define CK(x) check((x), #x, __LINE__)

__device__ __forceinline__ uint64_t gtime() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ uint64_t cycles() {
  uint64_t c;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(c)::"memory");
  return c;
}

// out: [0] globaltimer changes seen in 20000 reads, [1] smallest step ns, [2] largest step ns,
// [3] clock64 cycles over [4] ns of a ~2 ms spin.
__global__ void k_timer(uint64_t* out) {
  uint64_t prev = gtime(), changes = 0, minStep = ~0ull, maxStep = 0;
  for (int i = 0; i < 20000; ++i) {
    const uint64_t t = gtime();
    if (t != prev) {
      ++changes;
      minStep = min(minStep, t - prev);
      maxStep = max(maxStep, t - prev);
      prev = t;
    }
  }
  const uint64_t g0 = gtime(), c0 = cycles();
  uint64_t g1;
  do g1 = gtime();
  while (g1 - g0 < 2000000ull);
  const uint64_t c1 = cycles();
  out[0] = changes, out[1] = minStep, out[2] = maxStep, out[3] = c1 - c0, out[4] = g1 - g0;
}

// One thread follows next[] n times; out[0] = cycles, out[1] = sum of visited indices.
template <bool kL2>
__global__ void k_chase(const uint32_t* next, int n, uint64_t* out) {
  uint32_t p = 0;
  uint64_t sum = 0;
  const uint64_t c0 = cycles();
  for (int i = 0; i < n; ++i) {
    uint32_t v;
    if (kL2) asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(v) : "l"(next + p) : "memory");
    else asm volatile("ld.global.ca.u32 %0, [%1];" : "=r"(v) : "l"(next + p) : "memory");
    p = v;
    sum += v;
  }
  const uint64_t c1 = cycles();
  out[0] = c1 - c0, out[1] = sum;
}

__global__ void k_write(uint32_t* p, uint64_t n, uint32_t v) {
  for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x) p[i] = v + (uint32_t)i;
}

// Cycles per operation (reps of each, one warp; lane 0 times; out[op]).
// ops: 0 ld.acquire.sys local (dependent), 1 ld.relaxed.sys local (dependent), 2 st + fence.acq_rel.sys,
// 3 st.release.sys local, 4 st.release.sys peer, 5 warp stores 2 KiB to peer + lane 0 st.release.sys,
// 6 the same with 14 KiB, 7 __syncwarp + nothing (loop overhead), 8 fence.acq_rel.gpu after a store.
__global__ void k_sync(uint64_t* local, uint64_t* peer, uint4* peerBulk, int reps, uint64_t* out) {
  const int lane = threadIdx.x;
  uint64_t acc = 0;
  for (int op = 0; op < 9; ++op) {
    if (op >= 4 && op <= 6 && peer == nullptr) {
      if (lane == 0) out[op] = 0;
      continue;
    }
    __syncwarp();
    const uint64_t c0 = cycles();
    for (int i = 0; i < reps; ++i) {
      if (op == 0) {
        if (lane == 0) {
          uint64_t v;
          asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(local + (acc & 1)) : "memory");
          acc += v + 1;
        }
      } else if (op == 1) {
        if (lane == 0) {
          uint64_t v;
          asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(local + (acc & 1)) : "memory");
          acc += v + 1;
        }
      } else if (op == 2) {
        if (lane == 0) {
          asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(local + 8), "l"((uint64_t)i) : "memory");
          asm volatile("fence.acq_rel.sys;" ::: "memory");
        }
      } else if (op == 3) {
        if (lane == 0) asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(local + 16), "l"((uint64_t)i) : "memory");
      } else if (op == 4) {
        if (lane == 0) asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(peer + 16), "l"((uint64_t)i) : "memory");
      } else if (op == 5 || op == 6) {
        const int units = op == 5 ? 128 : 896;  // 16-byte units: 2 KiB, 14 KiB
        for (int u = lane; u < units; u += 32) peerBulk[u] = make_uint4(i, u, 1, 2);
        __syncwarp();
        if (lane == 0) asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(peer + 24), "l"((uint64_t)i) : "memory");
      } else if (op == 7) {
        __syncwarp();
      } else {
        if (lane == 0) {
          asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(local + 32), "l"((uint64_t)i) : "memory");
          asm volatile("fence.acq_rel.gpu;" ::: "memory");
        }
      }
    }
    __syncwarp();
    const uint64_t c1 = cycles();
    if (lane == 0) out[op] = (c1 - c0) / reps;
  }
  if (lane == 0) out[15] = acc;
}

// A 512-thread block: clear 256 counters, barrier, each thread 8 atomicAdd on pseudo-random
// counters and one atomicOr on one of 2 words, barrier. out: [0] clear+barrier, [1] thread 0's
// atomics, [2] the block's atomics to the last barrier, [3] a bare __syncthreads, [4] checksum.
__global__ void __launch_bounds__(512) k_smem(uint64_t* out, uint32_t seed) {
  __shared__ int cnt[256];
  __shared__ uint32_t mask[2];
  const int tid = threadIdx.x;
  const uint64_t c0 = cycles();
  for (int e = tid; e < 256; e += blockDim.x) cnt[e] = 0;
  if (tid < 2) mask[tid] = 0;
  __syncthreads();
  const uint64_t c1 = cycles();
  uint32_t x = seed ^ (tid * 2654435761u);
  for (int k = 0; k < 8; ++k) {
    x = x * 1664525u + 1013904223u;
    atomicAdd(&cnt[x >> 24], 1);
  }
  atomicOr(&mask[tid & 1], 1u << (tid & 31));
  const uint64_t c2 = cycles();
  __syncthreads();
  const uint64_t c3 = cycles();
  __syncthreads();
  const uint64_t c4 = cycles();
  if (tid == 0) {
    int s = 0;
    for (int e = 0; e < 256; ++e) s += cnt[e];
    out[0] = c1 - c0, out[1] = c2 - c1, out[2] = c3 - c1, out[3] = c4 - c3, out[4] = (uint64_t)s;
  }
}

// Instruction fetch: one warp runs the same straight-line body (2048 FFMA in 8 independent chains,
// ~32 KiB of sm_90 code) `passes` times; out[p] = cycles of pass p. Pass 0 of a launch fetches the
// code (from L2 or HBM), later passes run it from the SM's instruction caches.
__global__ void k_code(float* io, int passes, uint64_t* out) {
  float x[8];
  for (int j = 0; j < 8; ++j) x[j] = io[j];
  const float a = io[8], b = io[9];
#pragma unroll 1
  for (int p = 0; p < passes; ++p) {
    const uint64_t c0 = cycles();
#pragma unroll
    for (int i = 0; i < 256; ++i)
#pragma unroll
      for (int j = 0; j < 8; ++j) x[j] = fmaf(x[j], a, b + (float)i);
    float s = 0.f;
    for (int j = 0; j < 8; ++j) s += x[j];
    asm volatile("" ::"f"(s));
    const uint64_t c1 = cycles();
    if (threadIdx.x == 0) out[p] = c1 - c0;
  }
  if (threadIdx.x == 0)
    for (int j = 0; j < 8; ++j) io[16 + j] = x[j];
}

// Pollers: every thread spins with ld.relaxed.sys until the timer passes `untilNs` (what waiting
// lanes do in the MoE kernels). mode 1: each thread its own word (two 128-byte lines per warp);
// mode 2: every lane of a warp the same word, the words of all warps in 32 lines; mode 3: as 1
// with __nanosleep(256) between polls. *started is raised once block 0 runs.
__global__ void k_poll(const uint64_t* words, int mode, uint64_t untilNs, uint32_t* started, uint64_t* sink) {
  const uint32_t gtid = blockIdx.x * blockDim.x + threadIdx.x;
  const uint64_t* p = mode == 2 ? words + ((gtid / 32) % 512) : words + gtid;
  if (blockIdx.x == 0 && threadIdx.x == 0) asm volatile("st.relaxed.gpu.global.u32 [%0], 1;" ::"l"(started) : "memory");
  uint64_t acc = 0;
  while (gtime() < untilNs) {
    uint64_t v;
    asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    acc += v;
    if (mode == 3) __nanosleep(256);
  }
  if (acc == 12345) sink[0] = acc;
}

// Waits for the pollers to run, then one thread chases (L2 hits) and times it.
__global__ void k_chase_under(const uint32_t* next, int n, const uint32_t* started, uint64_t* out) {
  uint32_t st;
  do asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(st) : "l"(started) : "memory");
  while (st == 0);
  uint32_t p = 0;
  uint64_t sum = 0;
  const uint64_t c0 = cycles();
  for (int i = 0; i < n; ++i) {
    uint32_t v;
    asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(v) : "l"(next + p) : "memory");
    p = v;
    sum += v;
  }
  const uint64_t c1 = cycles();
  out[0] = c1 - c0, out[1] = sum;
}

__global__ void k_now(uint64_t* out) { out[0] = gtime(); }

static uint64_t median(std::vector<uint64_t> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int main() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
    printf("latency_probe: SKIP: no CUDA GPU visible\n");
    return 2;
  }
  int bad = 0;
  CK(cudaSetDevice(0));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  uint64_t* dout;
  CK(cudaMalloc(&dout, 64 * 8));
  uint64_t h[16];
  auto fetch = [&](int words) { CK(cudaDeviceSynchronize()); CK(cudaMemcpy(h, dout, words * 8, cudaMemcpyDeviceToHost)); };

  // timer
  k_timer<<<1, 1>>>(dout);
  CK(cudaGetLastError());
  fetch(5);
  const double ghz = (double)h[3] / (double)h[4];
  printf("latency_probe: %s, %d SMs, %d GPUs\n", prop.name, prop.multiProcessorCount, n);
  printf("timer: globaltimer changed %llu times in 20000 reads, steps %llu..%llu ns; SM clock %.3f GHz (clock64 over a %.2f ms spin)\n",
         (unsigned long long)h[0], (unsigned long long)h[1], (unsigned long long)h[2], ghz, h[4] * 1e-6);
  auto ns = [&](double cyc) { return cyc / ghz; };

  // chase
  const uint64_t bigBytes = 1ull << 30;
  uint32_t* big;
  CK(cudaMalloc(&big, bigBytes));
  uint32_t* scratch;
  const uint64_t scratchWords = (256ull << 20) / 4;
  CK(cudaMalloc(&scratch, scratchWords * 4));
  struct ChaseCase {
    const char* name;
    uint64_t strideBytes, spanBytes;
    bool l2, flush;
  } cases[] = {{"L1 hits (ld.ca, 256 B apart in 16 KiB, warm)", 256, 16 << 10, false, false},
               {"L2 hits (ld.cg, 256 B apart in 1 MiB, warm)", 256, 1 << 20, true, false},
               {"HBM, TLB warm (ld.cg, 64 KiB apart in 32 MiB, L2 flushed)", 64 << 10, 32 << 20, true, true},
               {"HBM + TLB misses (ld.cg, 2 MiB + 4 KiB apart in 1 GiB, L2 flushed)", (2 << 20) + 4096, bigBytes, true, true}};
  for (const ChaseCase& c : cases) {
    const uint64_t hops = std::min<uint64_t>(c.spanBytes / c.strideBytes, 256);
    std::vector<uint32_t> order(hops);
    for (uint64_t i = 0; i < hops; ++i) order[i] = (uint32_t)(i * (c.strideBytes / 4));
    // next[order[i]] = order[i + 1]; host writes only the visited words.
    uint64_t expectSum = 0;
    for (uint64_t i = 0; i < hops; ++i) {
      const uint32_t nxt = order[(i + 1) % hops];
      CK(cudaMemcpy(big + order[i], &nxt, 4, cudaMemcpyHostToDevice));
    }
    const int steps = 128;
    for (int i = 0; i < steps; ++i) expectSum += order[(i + 1) % hops];
    std::vector<uint64_t> cyc;
    for (int rep = 0; rep < 7; ++rep) {
      if (c.flush) k_write<<<264, 512>>>(scratch, scratchWords, rep);
      else {
        if (c.l2) k_chase<true><<<1, 1>>>(big, steps, dout);
        else k_chase<false><<<1, 1>>>(big, steps, dout);
      }
      if (c.l2) k_chase<true><<<1, 1>>>(big, steps, dout);
      else k_chase<false><<<1, 1>>>(big, steps, dout);
      CK(cudaGetLastError());
      fetch(2);
      if (h[1] != expectSum) {
        printf("chase %s: FAILED: visited-index sum %llu, expected %llu\n", c.name, (unsigned long long)h[1], (unsigned long long)expectSum);
        ++bad;
      }
      cyc.push_back(h[0]);
    }
    const double per = (double)median(cyc) / steps;
    printf("chase: %-70s %7.1f cycles %7.1f ns per dependent load\n", c.name, per, ns(per));
  }

  // sync operations
  {
    uint64_t* local;
    CK(cudaMalloc(&local, 4096));
    CK(cudaMemset(local, 0, 4096));
    uint64_t* peer = nullptr;
    uint4* peerBulk = nullptr;
    int can = 0;
    if (n >= 2) CK(cudaDeviceCanAccessPeer(&can, 0, 1));
    if (can) {
      CK(cudaDeviceEnablePeerAccess(1, 0));
      CK(cudaSetDevice(1));
      CK(cudaMalloc(&peer, 4096));
      CK(cudaMalloc(&peerBulk, 64 << 10));
      CK(cudaMemset(peer, 0, 4096));
      CK(cudaDeviceSynchronize());
      CK(cudaSetDevice(0));
    } else {
      printf("sync: no peer GPU with peer access: the peer rows are skipped\n");
    }
    const char* names[] = {"ld.acquire.sys local (dependent chain)", "ld.relaxed.sys local (dependent chain)",
                           "st.relaxed.sys + fence.acq_rel.sys", "st.release.sys local", "st.release.sys peer",
                           "warp 2 KiB peer stores + st.release.sys", "warp 14 KiB peer stores + st.release.sys",
                           "loop + __syncwarp only", "st.relaxed.gpu + fence.acq_rel.gpu"};
    std::vector<std::vector<uint64_t>> cyc(9);
    for (int rep = 0; rep < 7; ++rep) {
      k_sync<<<1, 32>>>(local, peer, peerBulk, 64, dout);
      CK(cudaGetLastError());
      fetch(16);
      for (int op = 0; op < 9; ++op) cyc[op].push_back(h[op]);
    }
    for (int op = 0; op < 9; ++op) {
      if ((op >= 4 && op <= 6) && peer == nullptr) continue;
      const double c = median(cyc[op]);
      printf("sync: %-45s %8.0f cycles %8.1f ns per operation\n", names[op], c, ns(c));
    }
  }

  // shared memory walk
  {
    std::vector<uint64_t> c0, c1, c2, c3;
    for (int rep = 0; rep < 9; ++rep) {
      k_smem<<<1, 512>>>(dout, 12345u + rep);
      CK(cudaGetLastError());
      fetch(5);
      if (h[4] != 512 * 8) ++bad, printf("smem: FAILED: %llu increments counted, expected %d\n", (unsigned long long)h[4], 512 * 8);
      c0.push_back(h[0]), c1.push_back(h[1]), c2.push_back(h[2]), c3.push_back(h[3]);
    }
    const double a = median(c0), b = median(c1), c = median(c2), d = median(c3);
    printf("smem: clear 256 + barrier %.0f cycles (%.0f ns); thread 0's 8 atomicAdd + atomicOr %.0f (%.0f ns); "
           "the block's to the barrier %.0f (%.0f ns); bare __syncthreads %.0f (%.0f ns)\n",
           a, ns(a), b, ns(b), c, ns(c), d, ns(d));
  }
  // L2 latency while other SMs poll (the MoE receivers' many waiting lanes)
  {
    const uint64_t stride = 256, hops = 256;
    for (uint64_t i = 0; i < hops; ++i) {
      const uint32_t nxt = (uint32_t)(((i + 1) % hops) * (stride / 4));
      CK(cudaMemcpy(big + i * (stride / 4), &nxt, 4, cudaMemcpyHostToDevice));
    }
    uint64_t expectSum = 0;
    for (int i = 0; i < 128; ++i) expectSum += ((i + 1) % hops) * (stride / 4);
    uint64_t* words;
    uint32_t* started;
    CK(cudaMalloc(&words, 8ull * 132 * 512 + 4096));
    CK(cudaMemset(words, 0, 8ull * 132 * 512 + 4096));
    CK(cudaMalloc(&started, 4));
    cudaStream_t s1, s2;
    CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    const char* modeName[] = {"no pollers", "pollers: 66K threads, own word each", "pollers: 2K warps, 512 shared words",
                              "pollers: own word, __nanosleep(256)"};
    const int pollBlocks = prop.multiProcessorCount - 4;
    for (int mode = 0; mode < 4; ++mode) {
      std::vector<uint64_t> cyc;
      for (int rep = 0; rep < 5; ++rep) {
        CK(cudaMemset(started, 0, 4));
        k_now<<<1, 1>>>(dout + 8);
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
        uint64_t now;
        CK(cudaMemcpy(&now, dout + 8, 8, cudaMemcpyDeviceToHost));
        if (mode > 0) k_poll<<<pollBlocks, 512, 0, s1>>>(words, mode, now + 300000, started, dout + 9);
        else CK(cudaMemset(started, 1, 1));
        CK(cudaGetLastError());
        k_chase_under<<<1, 1, 0, s2>>>(big, 128, started, dout);
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(h, dout, 16, cudaMemcpyDeviceToHost));
        if (h[1] != expectSum) ++bad, printf("poll chase: FAILED: sum %llu expected %llu\n", (unsigned long long)h[1], (unsigned long long)expectSum);
        cyc.push_back(h[0]);
      }
      const double per = (double)median(cyc) / 128;
      printf("contention: L2-hit dependent load with %-40s %7.1f cycles %7.1f ns\n", modeName[mode], per, ns(per));
    }
  }

  // instruction fetch
  {
    float* io;
    CK(cudaMalloc(&io, 64 * 4));
    std::vector<float> init(10, 0.999f);
    init[9] = 0.0f;
    CK(cudaMemcpy(io, init.data(), 10 * 4, cudaMemcpyHostToDevice));
    std::vector<uint64_t> p0, p1, p2, second0;
    for (int rep = 0; rep < 7; ++rep) {
      k_write<<<264, 512>>>(scratch, scratchWords, rep);  // evict the code from L2 too
      k_code<<<1, 32>>>(io, 3, dout);
      CK(cudaGetLastError());
      fetch(3);
      p0.push_back(h[0]), p1.push_back(h[1]), p2.push_back(h[2]);
      k_code<<<1, 32>>>(io, 1, dout);  // straight after: is the code still cached?
      CK(cudaGetLastError());
      fetch(1);
      second0.push_back(h[0]);
    }
    const double a = median(p0), b = median(p1), c = median(p2), d = median(second0);
    printf("code: 2048 FFMA (~32 KiB of code), one warp: pass 0 %.0f cycles (%.2f us), pass 1 %.0f (%.2f us), pass 2 %.0f; "
           "pass 0 of the next launch %.0f (%.2f us) -> fetch ~%.1f ns per KiB of new code\n",
           a, ns(a) * 1e-3, b, ns(b) * 1e-3, c, d, ns(d) * 1e-3, ns(a - b) / 32.0);
    std::vector<uint64_t> g0, g1;
    for (int rep = 0; rep < 7; ++rep) {  // every SM fetching the same code at once
      k_write<<<264, 512>>>(scratch, scratchWords, rep);
      k_code<<<prop.multiProcessorCount, 32>>>(io, 2, dout);
      CK(cudaGetLastError());
      fetch(2);
      g0.push_back(h[0]), g1.push_back(h[1]);
    }
    printf("code: the same on all %d SMs at once (block 0's numbers; which block writes last varies): pass 0 %.0f cycles, pass 1 %.0f\n",
           prop.multiProcessorCount, (double)median(g0), (double)median(g1));
  }
  printf("latency_probe: %s\n", bad ? "FAILED checks above" : "all checks passed");
  return bad ? 1 : 0;
}
