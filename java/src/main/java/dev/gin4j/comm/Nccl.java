package dev.gin4j.comm;

import dev.gin4j.bindings.NativeLibrary;
import dev.gin4j.internal.comm.NcclStatus;

import java.lang.foreign.MemorySegment;

import static dev.gin4j.bindings.nccl.nccl_h.*;

/**
 * The collective library as loaded: NCCL ({@code libnccl.so.2}) or RCCL ({@code librccl.so.1}),
 * which exports the same names.
 */
public final class Nccl {
    private Nccl() {}

    /** {@return whether NCCL or RCCL could be loaded} */
    public static boolean isAvailable() { return NativeLibrary.NCCL.isAvailable(); }

    /** {@return which file was loaded and its version, or what was tried} */
    public static String describe() { return NativeLibrary.NCCL.describe(); }

    /** {@return "RCCL" when the loaded file is RCCL, else "NCCL"} */
    public static String flavour() { return describe().contains("rccl") ? "RCCL" : "NCCL"; }

    private static int cachedVersion;

    /** {@return the NCCL_VERSION_CODE of the loaded library, e.g. 22803 for 2.28.3} */
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

    /**
     * A version code as "2.29.7".
     *
     * @param code a version code ({@link #version()})
     * @return the version, readable
     */
    public static String versionString(int code) {
        return code >= 10000 ? (code / 10000) + "." + (code / 100) % 100 + "." + code % 100 : (code / 1000) + "." + (code / 100) % 10 + "." + code % 100;
    }

    static void check(String call, int rc, MemorySegment comm) { NcclStatus.check(call, rc, comm); }

    static boolean leavesCommunicatorBroken(int rc) { return NcclStatus.leavesCommunicatorBroken(rc); }

    static CommException error(String call, int rc, MemorySegment comm) { return NcclStatus.error(call, rc, comm); }
}
