package dev.gin4j.comm;

/** Who moves the data. */
public enum Backend {
    /** GPU-initiated: gin4j's kernels store into peers' symmetric windows (LSA) and raise flags; no CPU in the loop. */
    GIN,
    /** Host-initiated baseline: NCCL/RCCL's ncclAlltoAll or grouped ncclSend/ncclRecv, launched by the CPU. */
    HOST
}
