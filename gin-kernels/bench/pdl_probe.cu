// pdl_probe.cu - what would programmatic dependent launch (PDL) save between back-to-back kernels
// shaped like the MoE ones (one 512-thread block per SM, ~47 KB of static shared memory)?
//
// The question behind it: pipelined MoE calls on DeepSeek-V3 at 128 tokens
// spend ~3-5 us between the end of one kernel and the start of the next. With PDL (launch attribute
// programmaticStreamSerialization, and griddepcontrol.wait in the kernel before it reads anything
// the previous kernel wrote) the next grid is set up while the previous one drains. This program
// times 20 launches back to back of a kernel that stays busy for a fixed time, three ways: plain;
// PDL with griddepcontrol.wait and griddepcontrol.launch_dependents at the start; PDL with the wait
// only. Each kernel reads a counter the previous launch bumped (after its wait); at the end the
// counter must equal the number of launches.
// Measured (one H200, 2026-11-30, commit 5f18cf2): plain 4.4 / 5.3 / 8.3 / 13.3 us per launch for 0 / 2 / 5 / 10 us busy;
// PDL with the wait only 3.7 / 4.2 / 7.3 / 12.2: ~1 us less per launch. Then the host side: the
// calling thread's CPU time per launch with <<<>>>, cudaLaunchKernelEx, and cudaLaunchKernelEx + PDL:
// 3.64 / 3.52 / 2.85 us and 4.56 / 4.36 / 3.99 us in two runs a second apart (a PDL launch costs no
// more CPU; the host's launch cost itself moves by ~1 us from run to run).
//
// Build: gin-kernels/build --tests (or nvcc -arch=sm_90 -O3 -o pdl_probe pdl_probe.cu)
// Run:   pdl_probe          Exit status: 0 = done, 1 = the counter check failed, 2 = CUDA error.
#include <cuda_runtime.h>
#include <cstdint>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); exit(2);} } while (0)

__device__ __forceinline__ uint64_t gtime() { uint64_t t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }

// mode 0: plain; 1: wait at start (griddepcontrol.wait), trigger at start; 2: wait at start, no trigger
template <int kMode>
__global__ void __launch_bounds__(512, 1) busy(uint64_t ns, unsigned* sink, int* counter) {
  __shared__ unsigned smem[11800];
  if (kMode >= 1) asm volatile("griddepcontrol.wait;" ::: "memory");
  if (kMode == 1) asm volatile("griddepcontrol.launch_dependents;");
  // read what the previous kernel wrote (must be complete): counter == launches so far
  const int seen = *(volatile int*)counter;
  const uint64_t t0 = gtime();
  unsigned acc = threadIdx.x;
  while (gtime() - t0 < ns) acc = acc * 1664525u + 1013904223u;
  smem[threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.x == 0) sink[blockIdx.x] = smem[(acc & 511)] + seen;
  __syncthreads();
  // last block bumps the counter (all blocks must have read the old value: grid-wide count)
  if (threadIdx.x == 0) {
    __threadfence();
    unsigned prev = atomicAdd((unsigned*)&sink[1023], 1u);
    if (prev == gridDim.x - 1) { sink[1023] = 0; __threadfence(); atomicAdd(counter, 1); }
  }
}

// No work: the host-side launch cost (twelve arguments, as many as GinA2aArgs has fields). Waits for prior grids
// so that it may be launched with PDL.
__global__ void empty12(unsigned* a, uint64_t b, unsigned* c, uint64_t d, uint64_t e, uint64_t f, unsigned* g, int h,
                        int i, int j, int k, int* l) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
}

// cudaLaunchKernelEx's configuration: grid x block on st, with the PDL attribute (in *attr) if pdl.
static cudaLaunchConfig_t launch_config(int grid, int block, cudaStream_t st, bool pdl, cudaLaunchAttribute* attr) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(block);
  cfg.stream = st;
  attr->id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr->val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  return cfg;
}

static double thread_cpu_us() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

int main(int argc, char** argv) {
  int sms = 0; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  unsigned* sink; int* counter;
  CK(cudaMalloc(&sink, 4096 * 4)); CK(cudaMemset(sink, 0, 4096 * 4));
  CK(cudaMalloc(&counter, 4)); CK(cudaMemset(counter, 0, 4));
  cudaStream_t st; CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
  int expect = 0;
  printf("pdl_probe: %d SMs, grid %d x 512, 20 launches back to back, median of 9 batches, us per launch\n", sms, sms);
  printf("%10s | %8s | %8s | %8s\n", "busy us", "plain", "pdl+trig", "pdl wait");
  for (uint64_t ns : {0ull, 2000ull, 5000ull, 10000ull}) {
    float res[3];
    for (int mode = 0; mode < 3; ++mode) {
      std::vector<float> v;
      for (int b = 0; b < 10; ++b) {
        CK(cudaEventRecord(e0, st));
        for (int i = 0; i < 20; ++i) {
          cudaLaunchAttribute at;
          cudaLaunchConfig_t cfg = launch_config(sms, 512, st, mode != 0, &at);
          if (mode == 0) CK(cudaLaunchKernelEx(&cfg, busy<0>, ns, sink, counter));
          else if (mode == 1) CK(cudaLaunchKernelEx(&cfg, busy<1>, ns, sink, counter));
          else CK(cudaLaunchKernelEx(&cfg, busy<2>, ns, sink, counter));
          ++expect;
        }
        CK(cudaEventRecord(e1, st));
        CK(cudaStreamSynchronize(st));
        float ms; CK(cudaEventElapsedTime(&ms, e0, e1));
        if (b) v.push_back(ms * 1000.f / 20);
      }
      std::sort(v.begin(), v.end());
      res[mode] = v[v.size() / 2];
    }
    printf("%10.1f | %8.2f | %8.2f | %8.2f\n", ns / 1000.0, res[0], res[1], res[2]);
  }
  int got = 0; CK(cudaMemcpy(&got, counter, 4, cudaMemcpyDeviceToHost));
  printf("counter %d, expected %d: %s\n", got, expect, got == expect ? "ok" : "MISMATCH");

  // The host side: CPU time of the calling thread per launch of an empty kernel (12 arguments, as
  // the all-to-all kernels have), 64 launches back to back, median of 31 batches: <<<>>>,
  // cudaLaunchKernelEx without attributes, cudaLaunchKernelEx with the PDL attribute.
  printf("host CPU per launch (empty kernel, 64 back to back, median of 31 batches), us:\n");
  const char* names[3] = {"<<<>>>", "LaunchKernelEx", "LaunchKernelEx + PDL"};
  for (int mode = 0; mode < 3; ++mode) {
    std::vector<double> v;
    for (int b = 0; b < 32; ++b) {
      CK(cudaStreamSynchronize(st));
      const double t0 = thread_cpu_us();
      for (int i = 0; i < 64; ++i) {
        if (mode == 0) {
          empty12<<<sms, 256, 0, st>>>(sink, 0, sink, 0, 0, 0, sink, 0, 0, 0, 0, counter);
        } else {
          cudaLaunchAttribute at;
          cudaLaunchConfig_t cfg = launch_config(sms, 256, st, mode == 2, &at);
          CK(cudaLaunchKernelEx(&cfg, empty12, sink, (uint64_t)0, sink, (uint64_t)0, (uint64_t)0, (uint64_t)0, sink, 0, 0, 0, 0, counter));
        }
      }
      const double t1 = thread_cpu_us();
      CK(cudaGetLastError());
      if (b) v.push_back((t1 - t0) / 64);
    }
    std::sort(v.begin(), v.end());
    printf("  %-22s %6.2f\n", names[mode], v[v.size() / 2]);
  }
  CK(cudaStreamSynchronize(st));
  return got == expect ? 0 : 1;
}
