// a2a/entry_points.cuh - the extern "C" entry points of the a2a code object, declared once: a2a.cu
// includes it, so its definitions must match, and a test program that links the a2a object
// (test/a2a_test.cu) launches them through these declarations. Each takes its argument struct of
// abi/a2a.h by value (read in place from the parameter space, as const __grid_constant__).
#pragma once

#include "window_layout.cuh"
#include "abi/a2a.h"  // gin-kernels/abi/a2a.h (the build passes -I gin-kernels)

// Direct protocol (a2a/direct.cuh).
GIN_KERNEL void __launch_bounds__(GIN_A2A_MAX_THREADS) gin_a2a(const __grid_constant__ GinA2aArgs a);
GIN_KERNEL void __launch_bounds__(GIN_A2A_MAX_THREADS) gin_a2av(const __grid_constant__ GinA2avArgs a);

// LL protocol (a2a/ll.cuh).
GIN_KERNEL void __launch_bounds__(GIN_A2A_LL_MAX_THREADS) gin_a2a_ll(const __grid_constant__ GinA2aStagedArgs a);
GIN_KERNEL void __launch_bounds__(GIN_A2A_LL_MAX_THREADS) gin_a2av_ll(const __grid_constant__ GinA2avStagedArgs a);

// LL128 protocol (a2a/ll128.cuh).
GIN_KERNEL void __launch_bounds__(GIN_A2A_LL128_MAX_THREADS) gin_a2a_ll128(const __grid_constant__ GinA2aStagedArgs a);
GIN_KERNEL void __launch_bounds__(GIN_A2A_LL128_MAX_THREADS) gin_a2av_ll128(const __grid_constant__ GinA2avStagedArgs a);

// Copy-engine variant of the uniform all-to-all (a2a/copy_engine.cuh, kernels in a2a.cu).
GIN_KERNEL void gin_a2a_ce_ready(const __grid_constant__ GinA2aCeSignalArgs a);
GIN_KERNEL void gin_a2a_ce_done(const __grid_constant__ GinA2aCeSignalArgs a);
GIN_KERNEL void __launch_bounds__(GIN_A2A_MAX_THREADS) gin_a2a_ce_self(const __grid_constant__ GinA2aCeSelfArgs a);
