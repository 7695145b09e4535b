// moe/dispatch_call.cuh - what gin_dispatch's prologue hands to the block's role (the token-path
// or layout-path sender or receiver): the checked arguments and the per-call values derived from them.
#pragma once

#include "routing_layout.cuh"
#include "dispatch_receive.cuh"
#include "token_path_layout.cuh"
#include "fp8.cuh"
#include "trace_slots.cuh"

union DispatchSmem {
  LayoutSmem lay;
  RecvSmem rcv;
  TpRecvSmem tp;
};

struct DispatchCall {
  const uint16_t* x;      // the rows sent: x, or xq in the quantizing fp8 dispatch
  const uint16_t* xBf16;  // the bf16 rows the quantizing fp8 dispatch reads
  uint8_t* xq;
  bool quant;             // quantizing fp8 dispatch: the senders write xq during the kernel
  const int32_t* topkIdx;
  const float* topkWeights;
  uint16_t* recvX;
  float* recvWeights;
  int32_t* recvCounts;
  const uint64_t* peerBases;
  uint8_t* workspace;
  uint32_t* errorFlags;
  Dims d;
  MoeWindowLayout wl;
  MoeWorkspaceLayout ws;
  int* tokenPos;
  int* slotInExpert;
  int* sendList;
  bool fast;              // rowBytes % 16 == 0 and x, recvX 16-byte aligned
  uint8_t* ownWin;
  uint64_t seq, seqHi;    // this call's number n, and n << 32
  uint64_t* state;
  int tid, B, lane, warp;
};
