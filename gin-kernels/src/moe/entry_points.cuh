// moe/entry_points.cuh - the extern "C" entry points of the MoE code objects, declared once: the
// entry translation units (moe_gin.cu, moe_host.cu) include it, so their definitions must match,
// and a test program that links those objects launches them through these declarations.
#pragma once

#include "memory_layout.cuh"

// The model shapes with token-path entries of their own (moe/shaped_entries.cuh):
// MOE_TP_SHAPES(X) and MOE_TP_FP8_SHAPES(X) call X(R, E, K, H) once per shape. gin-kernels/build
// writes moe_shapes.h from gin-kernels/moe_shapes.list; a run-time compile writes its own.
#include "moe_shapes.h"

// Every entry takes its argument struct of abi/moe.h by value, as const __grid_constant__ (read in
// place from the parameter space), except three where ptxas allocates registers better with a plain
// const parameter (sm_90, nvcc 13.0, against the positional parameters these entries had before):
// moe_gin_dispatch_fp8 (spill stores / loads 44 / 156 bytes with the qualifier, 36 / 76 without,
// 36 / 72 before), moe_host_permute_fp8 (56 registers with, 48 without and before) and
// moe_fp8_quantize (99 with, 86 without and before). The others do as well or better with it
// (moe_gin_dispatch: 4 / 12 bytes with, 16 / 44 without). The bytes passed are the same either way.
#define MOE_DISPATCH_PARAMS const __grid_constant__ MoeGinDispatchArgs a
#define MOE_DISPATCH_FP8_GENERIC_PARAMS const MoeGinDispatchArgs a
#define MOE_COMBINE_PARAMS const __grid_constant__ MoeGinCombineArgs a

// Both objects: the window and workspace sizes (moe/query_layout.cuh).
GIN_KERNEL void moe_query_layout(const __grid_constant__ MoeQueryArgs a);

// moe_gin.cu: GPU-initiated (GIN) dispatch, combine and row values.
GIN_KERNEL void __launch_bounds__(MOE_THREADS, 1) moe_gin_dispatch(MOE_DISPATCH_PARAMS);
GIN_KERNEL void __launch_bounds__(MOE_THREADS, 1) moe_gin_combine(MOE_COMBINE_PARAMS);
GIN_KERNEL void __launch_bounds__(MOE_THREADS, 1) moe_gin_dispatch_tp(MOE_DISPATCH_PARAMS);
GIN_KERNEL void __launch_bounds__(MOE_THREADS, 1) moe_gin_combine_tp(MOE_COMBINE_PARAMS);
GIN_KERNEL void __launch_bounds__(MOE_THREADS, 1) moe_gin_dispatch_tp_r1(MOE_DISPATCH_PARAMS);
GIN_KERNEL void __launch_bounds__(MOE_THREADS, 1) moe_gin_combine_tp_r1(MOE_COMBINE_PARAMS);
#define MOE_TP_DECLARE(R, E, K, H)                                                                              \
  GIN_KERNEL void __launch_bounds__(MOE_THREADS, 1) moe_gin_dispatch_tp_r##R##_e##E##_k##K##_h##H(MOE_DISPATCH_PARAMS); \
  GIN_KERNEL void __launch_bounds__(MOE_THREADS, 1) moe_gin_combine_tp_r##R##_e##E##_k##K##_h##H(MOE_COMBINE_PARAMS);
MOE_TP_SHAPES(MOE_TP_DECLARE)
#undef MOE_TP_DECLARE
GIN_KERNEL void __launch_bounds__(MOE_THREADS, 1) moe_gin_dispatch_fp8(MOE_DISPATCH_FP8_GENERIC_PARAMS);
GIN_KERNEL void __launch_bounds__(MOE_THREADS, 1) moe_gin_dispatch_fp8_tp(MOE_DISPATCH_PARAMS);
GIN_KERNEL void __launch_bounds__(MOE_THREADS, 1) moe_gin_dispatch_fp8_tp_r1(MOE_DISPATCH_PARAMS);
#define MOE_TP_FP8_DECLARE(R, E, K, H) \
  GIN_KERNEL void __launch_bounds__(MOE_THREADS, 1) moe_gin_dispatch_fp8_tp_r##R##_e##E##_k##K##_h##H(MOE_DISPATCH_PARAMS);
MOE_TP_FP8_SHAPES(MOE_TP_FP8_DECLARE)
#undef MOE_TP_FP8_DECLARE
GIN_KERNEL void __launch_bounds__(MOE_THREADS, 1) moe_gin_row_values(const __grid_constant__ MoeGinRowValuesArgs a);

// moe_host.cu: the HOST backend's local kernels (the exchanges are NCCL calls from Java) and the
// fp8 quantizer.
GIN_KERNEL void __launch_bounds__(MOE_THREADS, 1) moe_host_layout(const __grid_constant__ MoeHostLayoutArgs a);
GIN_KERNEL void moe_host_pack(const __grid_constant__ MoeHostPackArgs a);
GIN_KERNEL void moe_host_pack_fp8(const __grid_constant__ MoeHostPackArgs a);
GIN_KERNEL void moe_host_permute(const __grid_constant__ MoeHostPermuteArgs a);
GIN_KERNEL void moe_host_permute_fp8(const MoeHostPermuteArgs a);
GIN_KERNEL void moe_host_unpermute(const __grid_constant__ MoeHostUnpermuteArgs a);
GIN_KERNEL void moe_host_combine(const __grid_constant__ MoeHostCombineArgs a);
GIN_KERNEL void moe_host_row_values_in(const __grid_constant__ MoeHostRowValuesArgs a);
GIN_KERNEL void moe_fp8_quantize(const MoeFp8QuantizeArgs a);
