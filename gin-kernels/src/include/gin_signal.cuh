// gin_signal.cuh - the wait on a GIN signal, for the GIN code objects only (NCCL >= 2.29.7's device
// API: the includer has included <nccl_device.h> and <nccl_device/gin.h> before this file).
#pragma once

#include "gin_sync.cuh"

// Whether the communicator was aborted: ncclDevComm.abortFlag, which NCCL leaves null in a user's
// device communicator and gin4j's DeviceComm points at a word the group raises before
// ncclCommAbort (docs/failures.md, "Dying peers"). Null: nothing can raise it.
GIN_DEVICE_INLINE bool gin_comm_aborted(const ncclDevComm& comm) {
  const volatile uint32_t* word = comm.abortFlag;
  return word != nullptr && *word != 0;
}

// One thread waits until GIN signal `id` (own rank, gin's context) reaches `least`; every poll is
// an acquire read. ncclGin::waitSignal has no time-out, hence this loop. It gives up, setting
// GIN_ERR_TIMEOUT (so the kernel's other waits give up too), after GIN_WAIT_TIMEOUT_NS, once
// another wait of the kernel gave up, or once the communicator is aborted: a peer that died then
// ends the kernel when the host aborts the group, not 10 s later. The abort word is read at the
// time-out clock's cadence (every 1,024 polls after the first 1,024), so a short wait never reads it.
GIN_DEVICE_INLINE bool gin_wait_signal_geq(const ncclGin& gin, ncclGinSignal_t id, uint64_t least, uint32_t* errorFlags) {
  uint64_t start = 0;
  for (uint32_t spins = 0;; ++spins) {
    if (gin.readSignal(id, 64, cuda::memory_order_acquire) >= least) return true;
    if (gin_wait_timed_out(spins, start, errorFlags)) return false;
    if (spins > GIN_WAIT_FREE_SPINS && ((spins - GIN_WAIT_FREE_SPINS) & 1023u) == 0 && gin_comm_aborted(gin.comm)) {
      gin_error_set(errorFlags, GIN_ERR_TIMEOUT);
      return false;
    }
  }
}
