/* gin-kernels/abi/basic.h - the argument structs of the basic code object's kernels that the
 * library itself launches (the others, gin_fill_u32 and friends, keep plain parameter lists: they
 * test the positional launch path that users' own kernels take). Generated into Java
 * (dev.gin4j.bindings.basic) and checked against gcc by LayoutTest, as abi/moe.h. Plain C11 with
 * <stdint.h> only. Changing a struct means bumping GIN_BASIC_ABI_VERSION. */
#ifndef GIN4J_ABI_BASIC_H
#define GIN4J_ABI_BASIC_H

#include <stdint.h>

/* Version of this ABI. */
#define GIN_BASIC_ABI_VERSION 1

/* gin_hold_sms: each block holds its SM for ns nanoseconds of the device clock. */
typedef struct GinHoldSmsArgs {
  uint32_t* marks;               /* host-mapped [2 * grid]: [block] = 1 at its start, [grid + block] = 1 at its end */
  uint64_t ns;
} GinHoldSmsArgs;

#endif /* GIN4J_ABI_BASIC_H */
