// basic.cu: the runtime layer's test kernels (launch cost, fills, copies, argument packing,
// peer access). Signatures and the GinTestStruct layout are documented in docs/kernels.md.
// All loops are 1-D grid-stride loops: any grid and block size gives the same result.
#include "include/gin_sync.cuh"  // gin_clock_ns; includes gin_device.cuh
#include "abi/basic.h"    // GinHoldSmsArgs (gin-kernels/abi/basic.h)
#include <stddef.h>

// No arguments, no work: measures the bare launch path.
GIN_KERNEL void gin_empty() {}

// Each block holds its SM for ns nanoseconds of the device clock: a stand-in for compute that
// runs beside an exchange on other SMs (bench moe --channels). marks (host-mapped, 2 x grid words):
// marks[block] = 1 when the block starts, so the host can wait until every block is resident, and
// marks[grid + block] = 1 when it ends, so the host can tell whether the hold outlasted what it
// timed. In between no memory is touched (thread 0 polling a host-mapped word instead
// slowed the exchange on the other SMs ~40x). Launched with the most dynamic shared memory a block
// may have (the launch reserves it whether or not the kernel names it), so no other block that
// uses shared memory can join its SM.
// Arguments: GinHoldSmsArgs (abi/basic.h), the one kernel here that the library launches itself.
GIN_KERNEL void gin_hold_sms(const __grid_constant__ GinHoldSmsArgs a) {
  uint32_t* const marks = a.marks;
  const uint64_t ns = a.ns;
  if (threadIdx.x == 0) {
    *(volatile uint32_t*)(marks + blockIdx.x) = 1u;
    __threadfence_system();
  }
  const uint64_t t0 = gin_clock_ns();
  while (gin_clock_ns() - t0 < ns) {
  }
  __syncthreads();
  if (threadIdx.x == 0) *(volatile uint32_t*)(marks + gridDim.x + blockIdx.x) = 1u;
}

// dst[i] = value for i < n.
GIN_KERNEL void gin_fill_u32(uint32_t* dst, uint64_t n, uint32_t value) {
  const uint64_t stride = gin_grid_threads();
  for (uint64_t i = gin_global_thread_id(); i < n; i += stride) dst[i] = value;
}

// data[i] += add for i < n once every earlier grid on the stream is done, and the next
// programmatic-dependent launch may start at once: chained so, a wait that did not hold would
// lose additions (RuntimeGpuTest checks the sum).
GIN_KERNEL void gin_add_after_prior_u32(uint32_t* data, uint64_t n, uint32_t add) {
  gin_wait_prior_grids();
#if !GIN_HIP && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
#endif
  const uint64_t stride = gin_grid_threads();
  for (uint64_t i = gin_global_thread_id(); i < n; i += stride) data[i] += add;
}

// dst[i] = alpha * src[i] for i < n.
GIN_KERNEL void gin_scale_f32(const float* src, float* dst, uint64_t n, float alpha) {
  const uint64_t stride = gin_grid_threads();
  for (uint64_t i = gin_global_thread_id(); i < n; i += stride) dst[i] = alpha * src[i];
}

// Copies with V-sized accesses once dst is V-aligned; only valid when src and dst have the
// same misalignment modulo sizeof(V), which the caller checks.
template <typename V>
static GIN_DEVICE_INLINE void gin_copy_bytes_vectorized(const uint8_t* src, uint8_t* dst, uint64_t n,
                                                         uint64_t tid, uint64_t stride) {
  const uint64_t width = sizeof(V);
  uint64_t head = (width - ((uintptr_t)dst & (width - 1))) & (width - 1);
  if (head > n) head = n;
  for (uint64_t i = tid; i < head; i += stride) dst[i] = src[i];
  const uint64_t vectors = (n - head) / width;
  const V* srcVec = reinterpret_cast<const V*>(src + head);
  V* dstVec = reinterpret_cast<V*>(dst + head);
  for (uint64_t i = tid; i < vectors; i += stride) dstVec[i] = srcVec[i];
  for (uint64_t i = head + vectors * width + tid; i < n; i += stride) dst[i] = src[i];
}

// dst[i] = src[i] for i < n bytes, any alignment; 16-byte (or 4-byte) accesses where src and
// dst are equally misaligned, bytes otherwise. Regions must not overlap.
GIN_KERNEL void gin_copy_bytes(const uint8_t* src, uint8_t* dst, uint64_t n) {
  const uint64_t tid = gin_global_thread_id();
  const uint64_t stride = gin_grid_threads();
  const uintptr_t relativeMisalignment = (uintptr_t)src ^ (uintptr_t)dst;
  if ((relativeMisalignment & 15) == 0) {
    gin_copy_bytes_vectorized<gin_vec16_t>(src, dst, n, tid, stride);
  } else if ((relativeMisalignment & 3) == 0) {
    gin_copy_bytes_vectorized<uint32_t>(src, dst, n, tid, stride);
  } else {
    for (uint64_t i = tid; i < n; i += stride) dst[i] = src[i];
  }
}

// A by-value kernel argument with padding holes, a 13-byte array and 16-byte alignment, so the
// Java side's struct packing (offsets, alignment, total size) is tested against the compiler's.
struct alignas(16) GinTestStruct {
  int8_t a;         // offset 0
  int64_t b;        // offset 8
  float c[5];       // offset 16
  int16_t d;        // offset 36
  uint8_t e[13];    // offset 38
  int32_t g;        // offset 52
  double h;         // offset 56
  uint8_t tail[7];  // offset 64; size 80 (71 rounded up to the 16-byte alignment)
};
static_assert(offsetof(GinTestStruct, a) == 0, "GinTestStruct.a");
static_assert(offsetof(GinTestStruct, b) == 8, "GinTestStruct.b");
static_assert(offsetof(GinTestStruct, c) == 16, "GinTestStruct.c");
static_assert(offsetof(GinTestStruct, d) == 36, "GinTestStruct.d");
static_assert(offsetof(GinTestStruct, e) == 38, "GinTestStruct.e");
static_assert(offsetof(GinTestStruct, g) == 52, "GinTestStruct.g");
static_assert(offsetof(GinTestStruct, h) == 56, "GinTestStruct.h");
static_assert(offsetof(GinTestStruct, tail) == 64, "GinTestStruct.tail");
static_assert(sizeof(GinTestStruct) == 80 && alignof(GinTestStruct) == 16, "GinTestStruct size/align");

#define GIN_SUM_STRUCT_WORDS 32

// Writes every field of s, widened to int64, into out[0..30] and a checksum of those 31 words
// into out[31] (layout in docs/kernels.md). One thread writes; the rest of any grid does nothing.
GIN_KERNEL void gin_sum_struct(const GinTestStruct s, int64_t* out) {
  if (gin_global_thread_id() != 0) return;
  int64_t words[GIN_SUM_STRUCT_WORDS];
  int w = 0;
  words[w++] = s.a;
  words[w++] = s.b;
  for (int i = 0; i < 5; i++) words[w++] = (int64_t)__float_as_uint(s.c[i]);
  words[w++] = s.d;
  for (int i = 0; i < 13; i++) words[w++] = s.e[i];
  words[w++] = s.g;
  words[w++] = __double_as_longlong(s.h);
  for (int i = 0; i < 7; i++) words[w++] = s.tail[i];
  words[w++] = (int64_t)sizeof(GinTestStruct);
  // FNV-1a over whole 64-bit words: order-sensitive, so a swapped or shifted field shows.
  uint64_t checksum = 0xcbf29ce484222325ull;
  for (int i = 0; i < w; i++) {
    checksum ^= (uint64_t)words[i];
    checksum *= 0x100000001b3ull;
  }
  words[w++] = (int64_t)checksum;
  for (int i = 0; i < w; i++) out[i] = words[i];
}

// peerDst[i] = src[i] + 1 for i < n; peerDst lives on another GPU (peer access test).
GIN_KERNEL void gin_add_peer_u32(const uint32_t* src, uint32_t* peerDst, uint64_t n) {
  const uint64_t stride = gin_grid_threads();
  for (uint64_t i = gin_global_thread_id(); i < n; i += stride) peerDst[i] = src[i] + 1u;
}
