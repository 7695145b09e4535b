package dev.gin4j.testing;

import dev.gin4j.gpu.GpuRuntime;
import dev.gin4j.internal.gpu.KernelLibrary;
import org.junit.jupiter.api.Assumptions;

import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;

/** GPU test preconditions: skip with a printed reason (once per reason) where they do not hold. */
public final class Gpus {
    private static final Set<String> SAID = ConcurrentHashMap.newKeySet();

    private Gpus() {}

    public static void skipUnless(boolean condition, String reason) {
        if (!condition) {
            if (SAID.add(reason)) System.err.println("SKIPPED GPU test(s): " + reason);
            Assumptions.assumeTrue(false, reason);
        }
    }

    /** The runtime, or the test is skipped with what was looked for. */
    public static GpuRuntime runtime() {
        GpuRuntime.Discovery d = GpuRuntime.discover();
        skipUnless(d.found(), "no GPU runtime on this machine: " + String.join("; ", d.notes()));
        return d.runtime();
    }

    public static GpuRuntime runtimeWithDevices(int n) {
        GpuRuntime rt = runtime();
        skipUnless(rt.devices().size() >= n, "needs " + n + " GPUs, this machine has " + rt.devices().size());
        return rt;
    }

    /** Skips unless the shipped kernels include {@code object} for the first device's architecture. */
    /**
     * Skips unless the kernel library holds {@code object} for device 0; where GIN4J_REQUIRE_KERNELS=1
     * (ci/gpu-test on a GPU host, which built every code object) a missing one fails instead.
     */
    public static void requireKernels(GpuRuntime rt, String object) {
        String arch = rt.device(0).arch();
        boolean present = KernelLibrary.get().objects(arch).contains(object);
        String why = "no '" + object + "' code object for " + arch + " in " + KernelLibrary.get().source() + " (build with gin-kernels/build)";
        if (!present && "1".equals(System.getenv("GIN4J_REQUIRE_KERNELS"))) throw new AssertionError(why + "; GIN4J_REQUIRE_KERNELS=1 makes that a failure");
        skipUnless(present, why);
    }
}
