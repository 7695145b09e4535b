// moe/shaped_entries.cuh - the token-path entries with the model shape as constants, named
// moe_gin_{dispatch,combine}_tp_r<R>_e<E>_k<K>_h<H> and moe_gin_dispatch_fp8_tp_r<R>_e<E>_k<K>_h<H>.
// moe_gin.cu instantiates them for the shapes of gin-kernels/moe_shapes.list (MOE_TP_SHAPES,
// MOE_TP_FP8_SHAPES in the generated moe_shapes.h); dev.gin4j.internal.moe.ShapedEntries compiles the same
// macros for any other shape with NVRTC on first use.
#pragma once

#include "entry_points.cuh"
#include "dispatch.cuh"
#include "combine.cuh"

#define MOE_TP_ENTRIES(R, E, K, H)                                                                      \
  GIN_KERNEL void __launch_bounds__(MOE_THREADS, 1) moe_gin_dispatch_tp_r##R##_e##E##_k##K##_h##H(      \
      MOE_DISPATCH_PARAMS) {                                                                            \
    gin_dispatch<MoeShape<true, R, E, K, H>>(a);                                        \
  }                                                                                                     \
  GIN_KERNEL void __launch_bounds__(MOE_THREADS, 1) moe_gin_combine_tp_r##R##_e##E##_k##K##_h##H(       \
      MOE_COMBINE_PARAMS) {                                                                             \
    gin_combine<MoeShape<true, R, E, K, H>>(a);                                          \
  }

#define MOE_TP_FP8_ENTRIES(R, E, K, H)                                                                  \
  GIN_KERNEL void __launch_bounds__(MOE_THREADS, 1) moe_gin_dispatch_fp8_tp_r##R##_e##E##_k##K##_h##H(  \
      MOE_DISPATCH_PARAMS) {                                                                        \
    gin_dispatch<MoeShape<true, R, E, K, H, true>>(a);                              \
  }
