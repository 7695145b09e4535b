/* gin4j: the NCCL host API that bindings/nccl.args binds, as one C translation unit.
 * jextract reads one C header; NCCL's host API is split over nccl.h and nccl_device/core.h. */
#include <nccl.h>
#ifndef __cplusplus
/* core.h declares ncclGetMultimemDevicePointer with the C++ spelling 'ncclMultimemHandle'
 * (no 'struct'); this typedef lets a C parser read the header. That function is not bound. */
typedef struct ncclMultimemHandle ncclMultimemHandle;
#endif
#include <nccl_device/core.h>
