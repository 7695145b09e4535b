// a2a/window_layout.cuh - what an a2a.cu kernel needs of the symmetric window and of its launch:
// block-size limits of the three protocols and the sizes of the signal area, the LL and LL128
// staging areas and the sequence counters (host and device; Java mirrors them, docs/kernels.md,
// "a2a.cu").
#pragma once

#include "../include/gin_sync.cuh"

#define GIN_A2A_MAX_THREADS 1024    // direct kernels: blockDim.x <= 1024
#define GIN_A2A_LL_MAX_THREADS 512  // LL kernels: blockDim.x <= 512 (more registers for pairs in flight)
#define GIN_A2A_LL128_MAX_THREADS 512  // LL128 kernels: blockDim.x <= 512, a multiple of the warp size

// Window layout helpers (host and device), mirrored in docs/kernels.md for the Java side.
// Direct protocol signal area: ready[writer][chunk] then done[writer][chunk], uint64 each.
__host__ __device__ inline uint64_t gin_a2a_signal_bytes(int nranks, int maxChunksPerPeer) {
  return 16ull * (uint64_t)nranks * (uint64_t)maxChunksPerPeer;
}
// LL staging slot for one (parity, source): one 16-byte header pair, then one 16-byte pair of LL
// words per 8 payload bytes.
__host__ __device__ inline uint64_t gin_a2a_ll_slot_stride(uint64_t llCapacity) {
  return 16ull + 16ull * ((llCapacity + 7ull) / 8ull);
}
__host__ __device__ inline uint64_t gin_a2a_ll_staging_bytes(int nranks, uint64_t llCapacity) {
  return 2ull * (uint64_t)nranks * gin_a2a_ll_slot_stride(llCapacity);
}
// LL128 staging slot for one (parity, source): one 128-byte header line (a2av count), then one
// 128-byte line per 120 payload bytes. Lines must be 128-byte aligned (llOffset % 128 == 0).
__host__ __device__ inline uint64_t gin_a2a_ll128_slot_stride(uint64_t ll128Capacity) {
  return 128ull * (1ull + (ll128Capacity + 119ull) / 120ull);
}
__host__ __device__ inline uint64_t gin_a2a_ll128_staging_bytes(int nranks, uint64_t ll128Capacity) {
  return 2ull * (uint64_t)nranks * gin_a2a_ll128_slot_stride(ll128Capacity);
}
// seqState entries (uint64, local device memory, zeroed once) for any protocol.
__host__ __device__ inline uint64_t gin_a2a_seq_entries(int nranks, int maxChunksPerPeer) {
  return (uint64_t)nranks * (uint64_t)maxChunksPerPeer;
}
