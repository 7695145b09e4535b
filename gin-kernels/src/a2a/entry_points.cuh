// a2a/entry_points.cuh - the extern "C" entry points of the a2a code object, declared once: a2a.cu
// includes it, so its definitions must match, and a test program that links the a2a object
// (test/a2a_test.cu) launches them through these declarations. Arguments: docs/kernels.md, "a2a.cu".
#pragma once

#include "window_layout.cuh"

// Direct protocol (a2a/direct.cuh).
extern "C" __global__ void __launch_bounds__(GIN_A2A_MAX_THREADS)
gin_a2a(const uint8_t* send, uint64_t bytesPerPeer, const uint64_t* peerBases, uint64_t recvOffset,
        uint64_t slotBytes, uint64_t signalOffset, uint64_t* seqState, int32_t rank, int32_t nranks,
        int32_t chunksPerPeer, int32_t maxChunksPerPeer, uint32_t* errorFlags);
extern "C" __global__ void __launch_bounds__(GIN_A2A_MAX_THREADS)
gin_a2av(const uint8_t* send, uint64_t sendBytes, const uint64_t* sendCounts, const uint64_t* sendOffsets,
         const uint64_t* peerBases, uint64_t recvOffset, uint64_t slotBytes, uint64_t recvCountsOffset,
         uint64_t signalOffset, uint64_t* seqState, int32_t rank, int32_t nranks, int32_t chunksPerPeer,
         int32_t maxChunksPerPeer, uint32_t* errorFlags);

// LL protocol (a2a/ll.cuh).
extern "C" __global__ void __launch_bounds__(GIN_A2A_LL_MAX_THREADS)
gin_a2a_ll(const uint8_t* send, uint64_t bytesPerPeer, const uint64_t* peerBases, uint64_t recvOffset,
           uint64_t slotBytes, uint64_t llOffset, uint64_t llCapacity, uint64_t* llSeqState, int32_t rank,
           int32_t nranks, int32_t chunksPerPeer, int32_t maxChunksPerPeer, uint32_t* errorFlags);
extern "C" __global__ void __launch_bounds__(GIN_A2A_LL_MAX_THREADS)
gin_a2av_ll(const uint8_t* send, uint64_t sendBytes, const uint64_t* sendCounts, const uint64_t* sendOffsets,
            const uint64_t* peerBases, uint64_t recvOffset, uint64_t slotBytes, uint64_t recvCountsOffset,
            uint64_t llOffset, uint64_t llCapacity, uint64_t* llSeqState, int32_t rank, int32_t nranks,
            int32_t chunksPerPeer, int32_t maxChunksPerPeer, uint32_t* errorFlags);

// LL128 protocol (a2a/ll128.cuh).
extern "C" __global__ void __launch_bounds__(GIN_A2A_LL128_MAX_THREADS)
gin_a2a_ll128(const uint8_t* send, uint64_t bytesPerPeer, const uint64_t* peerBases, uint64_t recvOffset,
              uint64_t slotBytes, uint64_t ll128Offset, uint64_t ll128Capacity, uint64_t* ll128SeqState,
              int32_t rank, int32_t nranks, int32_t chunksPerPeer, int32_t maxChunksPerPeer, uint32_t* errorFlags);
extern "C" __global__ void __launch_bounds__(GIN_A2A_LL128_MAX_THREADS)
gin_a2av_ll128(const uint8_t* send, uint64_t sendBytes, const uint64_t* sendCounts, const uint64_t* sendOffsets,
               const uint64_t* peerBases, uint64_t recvOffset, uint64_t slotBytes, uint64_t recvCountsOffset,
               uint64_t ll128Offset, uint64_t ll128Capacity, uint64_t* ll128SeqState, int32_t rank, int32_t nranks,
               int32_t chunksPerPeer, int32_t maxChunksPerPeer, uint32_t* errorFlags);

// Copy-engine variant of the uniform all-to-all (a2a/copy_engine.cuh, kernels in a2a.cu).
extern "C" __global__ void gin_a2a_ce_ready(const uint64_t* peerBases, uint64_t signalOffset, uint64_t* seqState,
                                            int32_t rank, int32_t nranks, int32_t maxChunksPerPeer,
                                            uint32_t* errorFlags);
extern "C" __global__ void gin_a2a_ce_done(const uint64_t* peerBases, uint64_t signalOffset, uint64_t* seqState,
                                           int32_t rank, int32_t nranks, int32_t maxChunksPerPeer,
                                           uint32_t* errorFlags);
extern "C" __global__ void __launch_bounds__(GIN_A2A_MAX_THREADS)
gin_a2a_ce_self(const uint8_t* send, uint64_t bytesPerPeer, const uint64_t* peerBases, uint64_t recvOffset,
                uint64_t slotBytes, int32_t rank);
