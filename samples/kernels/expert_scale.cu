// A user's own expert, compiled by samples/kernels/build and launched by MoeUserKernelSample between
// dispatch and combine: out[row] = bf16(scale[e] * rows[row]) for every received row, where e is the
// local expert the row belongs to. The dispatch lays rows out expert-major (expert 0's counts[0]
// rows first, then expert 1's, ...), so a row's expert follows from the per-expert counts, which
// the kernel reads on the device: no host round trip between dispatch and combine.
#include <stdint.h>

__device__ static float bf16_to_float(uint16_t b) { return __uint_as_float((uint32_t) b << 16); }

// round to nearest even, as the host's Bf16.fromFloat (finite inputs)
__device__ static uint16_t float_to_bf16(float f) {
  uint32_t u = __float_as_uint(f);
  return (uint16_t) ((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

extern "C" __global__ void expert_scale_bf16(const uint16_t* rows, uint16_t* out, const int32_t* counts,
                                             const float* scales, int32_t localExperts, int32_t hidden) {
  int32_t total = 0;
  for (int32_t e = 0; e < localExperts; e++) total += counts[e];
  for (int32_t row = blockIdx.x; row < total; row += gridDim.x) {
    int32_t e = 0, start = 0;
    while (row >= start + counts[e]) start += counts[e++];
    float s = scales[e];
    for (int32_t h = threadIdx.x; h < hidden; h += blockDim.x) {
      size_t i = (size_t) row * hidden + h;
      out[i] = float_to_bf16(s * bf16_to_float(rows[i]));
    }
  }
}
