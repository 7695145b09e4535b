package dev.gin4j.internal.comm;

import dev.gin4j.comm.CommException;

import java.lang.foreign.MemorySegment;

import static dev.gin4j.bindings.nccl.nccl_h.*;

/** NCCL/RCCL result codes turned into {@link CommException}s with NCCL's own messages. */
public final class NcclStatus {
    private NcclStatus() {}

    private static final String[] RESULT_NAMES = {
            "ncclSuccess", "ncclUnhandledCudaError", "ncclSystemError", "ncclInternalError",
            "ncclInvalidArgument", "ncclInvalidUsage", "ncclRemoteError", "ncclInProgress"};

    /** Throws {@link #error} unless {@code rc} is ncclSuccess. */
    public static void check(String call, int rc, MemorySegment comm) {
        if (rc != 0) throw error(call, rc, comm);
    }

    /**
     * ncclSystemError, ncclInternalError, ncclRemoteError: a peer, the network or NCCL itself failed,
     * and the communicator is not to be used again (gin4j aborts it), unlike after a refused argument
     * or usage, or a CUDA error such as a failed allocation, which leave it as it was.
     */
    public static boolean leavesCommunicatorBroken(int rc) {
        return rc == 2 || rc == 3 || rc == 6;
    }

    /** The exception for {@code call} returning {@code rc}, with NCCL's message and last error on {@code comm}. */
    public static CommException error(String call, int rc, MemorySegment comm) {
        String name = rc >= 0 && rc < RESULT_NAMES.length ? RESULT_NAMES[rc] : "ncclResult_t " + rc;
        String detail;
        try {
            detail = ncclGetErrorString(rc).reinterpret(4096).getString(0);
            MemorySegment last = ncclGetLastError(comm);
            if (!last.equals(MemorySegment.NULL)) {
                String l = last.reinterpret(4096).getString(0);
                if (!l.isEmpty()) detail += "; last error: " + l;
            }
        } catch (RuntimeException | LinkageError e) {
            detail = "(no message: " + e.getMessage() + ")";
        }
        return new CommException(call, rc, name, detail);
    }
}
