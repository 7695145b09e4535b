// gin_device.cuh: portability basics shared by every gin4j kernel source.
// One source compiles with nvcc (CUDA, sm_90/sm_100) and with clang -x hip (gfx942).
#pragma once

#if defined(__CUDACC_RTC__) || defined(__HIPCC_RTC__)
  // NVRTC / hiprtc (shaped MoE entries compiled at run time, dev.gin4j.internal.moe.ShapedEntries): no
  // system headers there. The fixed-width types as glibc defines them on x86-64 Linux, so the code
  // is the one nvcc makes; the runtime's device builtins come predefined.
  typedef signed char int8_t;
  typedef short int16_t;
  typedef int int32_t;
  typedef long int64_t;
  typedef unsigned char uint8_t;
  typedef unsigned short uint16_t;
  typedef unsigned int uint32_t;
  typedef unsigned long uint64_t;
  typedef unsigned long uintptr_t;
#else
  #include <stdint.h>
#endif

#if defined(__HIPCC_RTC__)
  #define GIN_HIP 1
  #define GIN_CUDA 0
#elif defined(__HIP__) || defined(__HIPCC__)
  #include <hip/hip_runtime.h>
  #define GIN_HIP 1
  #define GIN_CUDA 0
#elif defined(__CUDACC_RTC__)
  #define GIN_HIP 0
  #define GIN_CUDA 1
#else
  #include <cuda_runtime.h>
  #define GIN_HIP 0
  #define GIN_CUDA 1
#endif

// Every kernel entry point: unmangled, so the Java side looks it up by its plain name.
#define GIN_KERNEL extern "C" __global__
#define GIN_EXTERN_C_GLOBAL extern "C" __global__
// Kernels take their argument struct as const __grid_constant__ (read in place from the parameter
// space, never copied); HIP passes kernel arguments that way without the qualifier.
#if GIN_HIP && !defined(__grid_constant__)
#define __grid_constant__
#endif
#define GIN_DEVICE_INLINE __device__ __forceinline__

// Lanes per warp (CUDA) or wavefront (AMD). A compile-time constant so it can size arrays;
// gfx942 (MI300) runs wave64, every NVIDIA GPU warp32.
#if GIN_HIP
  #if defined(__AMDGCN_WAVEFRONT_SIZE)
    #define GIN_WARP_SIZE __AMDGCN_WAVEFRONT_SIZE
  #else
    #define GIN_WARP_SIZE 64
  #endif
#else
  #define GIN_WARP_SIZE 32
#endif

// 16-byte vector: the widest single load/store on both vendors.
typedef uint4 gin_vec16_t;

// Programmatic dependent launch (NVIDIA sm_90+): a kernel launched with the PDL attribute may start
// while the kernel before it in the stream still runs; this waits until every grid it depends on
// has completed and its memory is visible. Call it before the first access to memory an earlier
// kernel may write. Without the attribute (and on AMD, which has no PDL) it returns at once.
GIN_DEVICE_INLINE void gin_wait_prior_grids() {
#if !GIN_HIP && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lane index inside the warp/wavefront.
GIN_DEVICE_INLINE uint32_t gin_lane_id() {
#if GIN_HIP
  return __lane_id();
#else
  uint32_t lane;
  asm volatile("mov.u32 %0, %%laneid;" : "=r"(lane));
  return lane;
#endif
}

GIN_DEVICE_INLINE uint32_t gin_warp_id_in_block() {
  return threadIdx.x / GIN_WARP_SIZE;
}

// 64-bit global thread index and grid stride for 1-D grid-stride loops; 64-bit because
// element counts are uint64 and blockIdx.x * blockDim.x overflows 32 bits on large grids.
GIN_DEVICE_INLINE uint64_t gin_global_thread_id() {
  return (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
}

GIN_DEVICE_INLINE uint64_t gin_grid_threads() {
  return (uint64_t)gridDim.x * blockDim.x;
}

GIN_DEVICE_INLINE bool gin_is_aligned(const void* p, uintptr_t alignment) {
  return ((uintptr_t)p & (alignment - 1)) == 0;
}
