// gin_trace.cuh - the kernels' trace hook: per-block time stamps at named points of a kernel, for
// test builds only. Without -DGIN4J_TRACE every hook compiles to nothing, so the shipped code
// objects carry none; a test program links a second build of the same sources with -DGIN4J_TRACE
// and points gin_trace_buffer at a device buffer (null: no stamps).
//
// Buffer: [GIN_TRACE_KERNELS][GIN_TRACE_BLOCKS][GIN_TRACE_SLOTS] %globaltimer words, then the
// same array of SM cycle counters (the timer moves in 1 us steps on some GPUs, too coarse for
// phases of a few us; cycles are exact within a block, and the timer gives the clock rate and the
// alignment across blocks). A slot names kernel k's point n as k * GIN_TRACE_SLOTS + n; thread 0
// of each block stores it.
#pragma once

#include "gin_sync.cuh"  // gin_clock_ns, gin_cycles

#define GIN_TRACE_KERNELS 2
#define GIN_TRACE_BLOCKS 256
#define GIN_TRACE_SLOTS 24
#define GIN_TRACE_WORDS (2ull * GIN_TRACE_KERNELS * GIN_TRACE_BLOCKS * GIN_TRACE_SLOTS)

#ifdef GIN4J_TRACE
// In constant memory: a stamp then reads the pointer from the constant cache (a global load would
// put an L2 round trip, ~0.15-0.25 us, inside every stamped interval).
__constant__ uint64_t* gin_trace_buffer = nullptr;
#define GIN_TRACE(slot)                                                                                         \
  do {                                                                                                          \
    uint64_t* tb_ = gin_trace_buffer;                                                                           \
    if (tb_ != nullptr && threadIdx.x == 0) {                                                                   \
      const uint64_t ix_ = ((uint64_t)((slot) / GIN_TRACE_SLOTS) * GIN_TRACE_BLOCKS + blockIdx.x) * GIN_TRACE_SLOTS + \
                           (uint64_t)((slot) % GIN_TRACE_SLOTS);                                               \
      tb_[ix_] = gin_clock_ns();                                                                                \
      tb_[GIN_TRACE_WORDS / 2 + ix_] = gin_cycles();                                                            \
    }                                                                                                           \
  } while (0)
// A block-wide barrier only while tracing, so that the next stamp covers every warp's work.
#define GIN_TRACE_SYNC()                            \
  do {                                              \
    if (gin_trace_buffer != nullptr) __syncthreads(); \
  } while (0)
// A stamp taken only once `value` (a register a load fills) has arrived: the empty asm reads it.
#if GIN_HIP
#define GIN_TRACE_AFTER(slot, value) GIN_TRACE(slot)
#else
#define GIN_TRACE_AFTER(slot, value) \
  do {                               \
    asm volatile("" ::"r"(value));   \
    GIN_TRACE(slot);                 \
  } while (0)
#endif
#else
#define GIN_TRACE(slot) \
  do {                  \
  } while (0)
#define GIN_TRACE_SYNC() \
  do {                   \
  } while (0)
#define GIN_TRACE_AFTER(slot, value) \
  do {                               \
  } while (0)
#endif
