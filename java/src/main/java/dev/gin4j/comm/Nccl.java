package dev.gin4j.comm;

import dev.gin4j.bindings.NativeLibrary;

import java.lang.foreign.MemorySegment;

import static dev.gin4j.bindings.nccl.nccl_h.*;

/**
 * The collective library as loaded: NCCL ({@code libnccl.so.2}) or RCCL ({@code librccl.so.1}),
 * which exports the same names. Status checking lives here.
 */
public final class Nccl {
    private Nccl() {}

    private static final String[] RESULT_NAMES = {
            "ncclSuccess", "ncclUnhandledCudaError", "ncclSystemError", "ncclInternalError",
            "ncclInvalidArgument", "ncclInvalidUsage", "ncclRemoteError", "ncclInProgress"};

    /** Whether NCCL or RCCL could be loaded. */
    public static boolean isAvailable() { return NativeLibrary.NCCL.isAvailable(); }

    /** Which file was loaded and its version, or what was tried. */
    public static String describe() { return NativeLibrary.NCCL.describe(); }

    /** "RCCL" when the loaded file is RCCL, else "NCCL". */
    public static String flavour() { return describe().contains("rccl") ? "RCCL" : "NCCL"; }

    private static int cachedVersion;

    /** NCCL_VERSION_CODE of the loaded library, e.g. 22803 for 2.28.3. */
    public static int version() {
        int v = cachedVersion;
        if (v == 0) {
            try (var arena = java.lang.foreign.Arena.ofConfined()) {
                MemorySegment out = arena.allocate(java.lang.foreign.ValueLayout.JAVA_INT);
                check("ncclGetVersion", ncclGetVersion(out), MemorySegment.NULL);
                cachedVersion = v = out.get(java.lang.foreign.ValueLayout.JAVA_INT, 0);
            }
        }
        return v;
    }

    /** A version code as "2.29.7". */
    public static String versionString(int code) {
        return code >= 10000 ? (code / 10000) + "." + (code / 100) % 100 + "." + code % 100 : (code / 1000) + "." + (code / 100) % 10 + "." + code % 100;
    }

    static void check(String call, int rc, MemorySegment comm) {
        if (rc != 0) throw error(call, rc, comm);
    }

    /**
     * ncclSystemError, ncclInternalError, ncclRemoteError: a peer, the network or NCCL itself failed,
     * and the communicator is not to be used again (gin4j aborts it), unlike after a refused argument
     * or usage, or a CUDA error such as a failed allocation, which leave it as it was.
     */
    static boolean leavesCommunicatorBroken(int rc) {
        return rc == 2 || rc == 3 || rc == 6;
    }

    static CommException error(String call, int rc, MemorySegment comm) {
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
