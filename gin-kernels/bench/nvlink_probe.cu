// nvlink_probe.cu - how fast can bytes cross the NVLink between two GPUs, both directions loaded?
//
// The question behind it: the all-to-all target "256 MiB per rank in <= 330 us" needs the 128 MiB
// that cross the link in each direction to move at >= 407 GB/s. This program times the ways a
// kernel (or the copy engine) can move N bytes from each GPU to the other at the same time:
//   push: GPU i loads its own buffer and stores into GPU j's buffer (what gin_a2a does)
//   pull: GPU i loads GPU j's buffer and stores into its own (receiver-driven)
//   ce:   cudaMemcpyPeerAsync on both GPUs (copy engines)
// and, shaped like a 2-rank all-to-all of 2N bytes per rank (N crosses, N stays):
//   a2a push: one kernel copies both halves (the local one and the remote one, as gin_a2a does)
//   a2a ce:   the copy engine moves the remote half while a kernel on a second stream copies the local one
// and two ways to load the link from more than one engine at once (does the link carry more than
// either engine alone?):
//   ce x2:    two cudaMemcpyPeerAsync of half the bytes each, on two streams
//   ce + push: the copy engine moves P % of the bytes while a kernel on a second stream pushes the rest
// for several grid sizes, with both GPUs released together by a gate kernel. Every result is
// checked element by element against the source (fresh random data, poisoned destinations).
//
// Build: gin-kernels/build --tests (or nvcc -arch=sm_90 -O3 -o nvlink_probe nvlink_probe.cu)
// Run:   nvlink_probe [MiB per direction, default 128]
// Exit status: 0 = all checks passed, 1 = a mismatch, 2 = CUDA error or fewer than 2 GPUs.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <vector>

static void check(cudaError_t e, const char* what, int line) {
  if (e != cudaSuccess) {
    fprintf(stderr, "nvlink_probe.cu:%d: %s failed: %s (%s)\n", line, what, cudaGetErrorName(e), cudaGetErrorString(e));
    exit(2);
  }
}
#define CK(x) check((x), #x, __LINE__)

// Holds a stream until the host writes `expect` into a mapped word (gives up after 5 s).
__global__ void gate(const volatile uint32_t* flag, uint32_t expect) {
  uint64_t t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  while (*flag < expect && t - t0 < 5000000000ull);
}

// dst[i] = src[i] for n 16-byte units; 4 independent loads in flight per thread before the stores.
__global__ void __launch_bounds__(1024) copy16(const uint4* __restrict__ src, uint4* __restrict__ dst, uint64_t n) {
  const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
  uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    uint4 a = src[i], b = src[i + stride], c = src[i + 2 * stride], d = src[i + 3 * stride];
    dst[i] = a; dst[i + stride] = b; dst[i + 2 * stride] = c; dst[i + 3 * stride] = d;
  }
  for (; i < n; i += stride) dst[i] = src[i];
}

__global__ void fill_random(uint4* p, uint64_t n, uint64_t seed) {
  for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x) {
    uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
    x ^= x >> 31; x *= 0xBF58476D1CE4E5B9ull; x ^= x >> 27; x *= 0x94D049BB133111EBull; x ^= x >> 33;
    p[i] = make_uint4((uint32_t)x, (uint32_t)(x >> 32), (uint32_t)(x * 3), (uint32_t)((x * 5) >> 32));
  }
}

__global__ void count_mismatch(const uint4* a, const uint4* b, uint64_t n, unsigned long long* bad) {
  unsigned long long mine = 0;
  for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x) {
    uint4 x = a[i], y = b[i];
    mine += (x.x != y.x) | (x.y != y.y) | (x.z != y.z) | (x.w != y.w);
  }
  if (mine) atomicAdd(bad, mine);
}

// src[i] -> dst[i] for two buffer pairs in one launch: blocks split evenly between the pairs.
__global__ void __launch_bounds__(1024) copy16_pair(const uint4* __restrict__ s0, uint4* __restrict__ d0,
                                                    const uint4* __restrict__ s1, uint4* __restrict__ d1, uint64_t n) {
  const int half = gridDim.x / 2, b = blockIdx.x % half;
  const uint4* src = blockIdx.x < half ? s0 : s1;
  uint4* dst = blockIdx.x < half ? d0 : d1;
  const uint64_t stride = (uint64_t)half * blockDim.x;
  uint64_t i = (uint64_t)b * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    uint4 a = src[i], c = src[i + stride], d = src[i + 2 * stride], e = src[i + 3 * stride];
    dst[i] = a; dst[i + stride] = c; dst[i + 2 * stride] = d; dst[i + 3 * stride] = e;
  }
  for (; i < n; i += stride) dst[i] = src[i];
}

enum Mode { PUSH, PULL, CE, A2A_PUSH, A2A_CE, CE2, CE_PUSH };
static const char* kModeName[] = {"push (SM stores to the peer)", "pull (SM loads from the peer)", "copy engine (cudaMemcpyPeerAsync)",
                                  "a2a push (one kernel, both halves)", "a2a ce (CE remote + kernel local)", "ce x2 (two copies, two streams)",
                                  "ce + push"};

int main(int argc, char** argv) {
  const uint64_t mib = argc > 1 ? strtoull(argv[1], nullptr, 10) : 128;
  const uint64_t bytes = mib << 20, units = bytes / 16;
  int ndev = 0;
  CK(cudaGetDeviceCount(&ndev));
  if (ndev < 2) { fprintf(stderr, "nvlink_probe: needs 2 GPUs, found %d\n", ndev); return 2; }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::vector<uint4*> src(2), dst(2), local(2);  // local: where the a2a modes put the half that stays
  std::vector<cudaStream_t> st(2), side(2);
  std::vector<cudaEvent_t> fork(2), join(2);
  std::vector<cudaEvent_t> e0(2), e1(2);
  std::vector<unsigned long long*> bad(2);
  for (int g = 0; g < 2; ++g) {
    CK(cudaSetDevice(g));
    int can = 0;
    CK(cudaDeviceCanAccessPeer(&can, g, 1 - g));
    if (!can) { fprintf(stderr, "nvlink_probe: GPU %d cannot access GPU %d\n", g, 1 - g); return 2; }
    CK(cudaDeviceEnablePeerAccess(1 - g, 0));
    CK(cudaMalloc(&src[g], bytes));
    CK(cudaMalloc(&dst[g], bytes));
    CK(cudaMalloc(&local[g], bytes));
    CK(cudaStreamCreateWithFlags(&side[g], cudaStreamNonBlocking));
    CK(cudaEventCreateWithFlags(&fork[g], cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&join[g], cudaEventDisableTiming));
    CK(cudaMalloc(&bad[g], sizeof(unsigned long long)));
    CK(cudaStreamCreateWithFlags(&st[g], cudaStreamNonBlocking));
    CK(cudaEventCreate(&e0[g]));
    CK(cudaEventCreate(&e1[g]));
  }
  uint32_t* flag = nullptr;
  CK(cudaHostAlloc(&flag, sizeof(uint32_t), cudaHostAllocMapped | cudaHostAllocPortable));
  *flag = 0;
  uint32_t gateValue = 0;
  uint64_t seed = 0x5eed0000ull ^ (uint64_t)time(nullptr);
  int failures = 0;

  printf("nvlink_probe: %s x2, %llu MiB from each GPU to the other at the same time; GB/s = bytes per direction / time (slowest GPU); a2a modes: 2N bytes per rank, N of them cross\n",
         prop.name, (unsigned long long)mib);
  printf("%-36s %6s %7s | %9s %8s | %s\n", "mode", "CTAs", "threads", "median us", "GB/s", "check");
  struct Cfg { Mode mode; int ctas, threads, cePercent = 0; };
  std::vector<Cfg> cfgs;
  for (Mode m : {PUSH, PULL})
    for (int ctas : {32, 66, 132, 264})
      for (int threads : {512, 1024}) cfgs.push_back({m, ctas, threads});
  cfgs.push_back({CE, 0, 0});
  for (int ctas : {132, 264}) cfgs.push_back({A2A_PUSH, ctas, 512});
  for (int ctas : {16, 32, 66}) cfgs.push_back({A2A_CE, ctas, 512});
  cfgs.push_back({CE2, 0, 0});
  for (int pct : {60, 75, 85, 92})
    for (int ctas : {16, 32, 66}) cfgs.push_back({CE_PUSH, ctas, 512, pct});

  for (const Cfg& c : cfgs) {
    std::vector<float> times;
    uint64_t badTotal = 0;
    for (int it = 0; it < 7; ++it) {  // 2 warm-ups, 5 timed; fresh data and a poisoned destination each time
      ++seed;
      for (int g = 0; g < 2; ++g) {
        CK(cudaSetDevice(g));
        fill_random<<<264, 512, 0, st[g]>>>(src[g], units, seed * 2 + g);
        CK(cudaGetLastError());
        CK(cudaMemsetAsync(dst[g], 0xA5, bytes, st[g]));
        CK(cudaMemsetAsync(local[g], 0x5A, bytes, st[g]));
        CK(cudaStreamSynchronize(st[g]));
      }
      ++gateValue;
      for (int g = 0; g < 2; ++g) {
        CK(cudaSetDevice(g));
        gate<<<1, 1, 0, st[g]>>>(flag, gateValue);
        CK(cudaGetLastError());
        CK(cudaEventRecord(e0[g], st[g]));
        // data of GPU g must end in dst[1-g] in every mode
        if (c.mode == PUSH) copy16<<<c.ctas, c.threads, 0, st[g]>>>(src[g], dst[1 - g], units);        // g stores remotely
        else if (c.mode == PULL) copy16<<<c.ctas, c.threads, 0, st[g]>>>(src[1 - g], dst[g], units);   // g loads remotely
        else if (c.mode == CE) CK(cudaMemcpyPeerAsync(dst[1 - g], 1 - g, src[g], g, bytes, st[g]));
        else if (c.mode == A2A_PUSH) copy16_pair<<<c.ctas, c.threads, 0, st[g]>>>(src[g], dst[1 - g], src[g], local[g], units);
        else if (c.mode == CE2 || c.mode == CE_PUSH) {  // the first part by the copy engine on st, the rest on side
          const uint64_t ceUnits = c.mode == CE2 ? units / 2 : units * c.cePercent / 100;
          CK(cudaEventRecord(fork[g], st[g]));
          CK(cudaStreamWaitEvent(side[g], fork[g], 0));
          CK(cudaMemcpyPeerAsync(dst[1 - g], 1 - g, src[g], g, ceUnits * 16, st[g]));
          if (c.mode == CE2) CK(cudaMemcpyPeerAsync(dst[1 - g] + ceUnits, 1 - g, src[g] + ceUnits, g, (units - ceUnits) * 16, side[g]));
          else copy16<<<c.ctas, c.threads, 0, side[g]>>>(src[g] + ceUnits, dst[1 - g] + ceUnits, units - ceUnits);
          CK(cudaGetLastError());
          CK(cudaEventRecord(join[g], side[g]));
          CK(cudaStreamWaitEvent(st[g], join[g], 0));
        } else {  // A2A_CE: fork a side stream for the local half, join before the end event
          CK(cudaEventRecord(fork[g], st[g]));
          CK(cudaStreamWaitEvent(side[g], fork[g], 0));
          copy16<<<c.ctas, c.threads, 0, side[g]>>>(src[g], local[g], units);
          CK(cudaGetLastError());
          CK(cudaMemcpyPeerAsync(dst[1 - g], 1 - g, src[g], g, bytes, st[g]));
          CK(cudaEventRecord(join[g], side[g]));
          CK(cudaStreamWaitEvent(st[g], join[g], 0));
        }
        CK(cudaGetLastError());
        CK(cudaEventRecord(e1[g], st[g]));
      }
      *(volatile uint32_t*)flag = gateValue;
      float worst = 0.f;
      for (int g = 0; g < 2; ++g) {
        CK(cudaSetDevice(g));
        CK(cudaStreamSynchronize(st[g]));
        float ms = 0.f;
        CK(cudaEventElapsedTime(&ms, e0[g], e1[g]));
        worst = std::max(worst, ms);
      }
      for (int g = 0; g < 2; ++g) {  // dst[g] must equal src[1-g] everywhere (read over the link)
        CK(cudaSetDevice(g));
        CK(cudaMemsetAsync(bad[g], 0, sizeof(unsigned long long), st[g]));
        count_mismatch<<<264, 512, 0, st[g]>>>(dst[g], src[1 - g], units, bad[g]);
        CK(cudaGetLastError());
        if (c.mode == A2A_PUSH || c.mode == A2A_CE) {
          count_mismatch<<<264, 512, 0, st[g]>>>(local[g], src[g], units, bad[g]);
          CK(cudaGetLastError());
        }
        unsigned long long b = 0;
        CK(cudaMemcpyAsync(&b, bad[g], sizeof(b), cudaMemcpyDeviceToHost, st[g]));
        CK(cudaStreamSynchronize(st[g]));
        badTotal += b;
      }
      if (it >= 2) times.push_back(worst * 1000.f);
    }
    std::sort(times.begin(), times.end());
    float med = times[times.size() / 2];
    if (badTotal) ++failures;
    char name[64];
    if (c.mode == CE_PUSH) snprintf(name, sizeof name, "ce %d %% + push %d %%", c.cePercent, 100 - c.cePercent);
    else snprintf(name, sizeof name, "%s", kModeName[c.mode]);
    printf("%-36s %6d %7d | %9.1f %8.1f | %s\n", name, c.ctas, c.threads, med, bytes / (med * 1e3), badTotal ? "MISMATCH" : "ok");
  }
  printf("nvlink_probe: %s\n", failures ? "FAILED (mismatches above)" : "all results checked, every 16-byte unit");
  return failures ? 1 : 0;
}
