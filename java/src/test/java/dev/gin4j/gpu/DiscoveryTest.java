package dev.gin4j.gpu;

import dev.gin4j.internal.gpu.KernelLibrary;
import dev.gin4j.internal.gpu.NativeAccess;
import dev.gin4j.gpu.hip.HipDriver;
import dev.gin4j.bindings.NativeLibrary;
import org.junit.jupiter.api.Test;

import static org.junit.jupiter.api.Assertions.*;

/** Discovery and error paths that run on any machine. */
class DiscoveryTest {
    @Test void discoveryAlwaysExplainsItself() {
        GpuRuntime.Discovery d = GpuRuntime.discover();
        assertFalse(d.notes().isEmpty(), "discovery must say what it found or what it looked for");
        if (!d.found()) {
            String all = String.join(" ", d.notes());
            assertTrue(all.contains("libcuda") || all.contains("CUDA"), all);
            assertTrue(all.contains("amdhip64") || all.contains("HIP") || all.contains("hip"), all);
            GpuException e = assertThrows(GpuException.class, GpuRuntime::get);
            assertTrue(e.getMessage().startsWith("no GPU runtime found"), e.getMessage());
        }
    }

    @Test void hipWithoutAnAmdGpuReportsNoDevice() {
        if (!NativeLibrary.HIP.isAvailable()) {
            System.err.println("SKIPPED HIP loading test: " + NativeLibrary.HIP.describe() + " (ci/test installs Debian's libamdhip64-5)");
            org.junit.jupiter.api.Assumptions.assumeTrue(false, "HIP runtime not installed");
        }
        GpuRuntime.Discovery d = GpuRuntime.discover();
        org.junit.jupiter.api.Assumptions.assumeFalse(d.found() && !d.runtime().isCuda(), "an AMD GPU is present");
        GpuException e = assertThrows(GpuException.class, HipDriver::open);
        assertEquals("hipGetDeviceCount", e.call(), e.getMessage());
        assertEquals("hipErrorNoDevice", e.errorName(), e.getMessage());
        assertEquals(100, e.code());
    }

    @Test void theRuntimeSettingTakesCudaOrHipOnly() {
        assertNull(GpuRuntime.forcedRuntime(null));
        assertNull(GpuRuntime.forcedRuntime(" "));
        assertEquals("cuda", GpuRuntime.forcedRuntime(" CUDA "));
        assertEquals("hip", GpuRuntime.forcedRuntime("hip"));
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> GpuRuntime.forcedRuntime("foo"));
        assertTrue(e.getMessage().contains("'foo': expected cuda or hip"), e.getMessage());
    }

    @Test void aMissingKernelsFolderIsCalledMissing(@org.junit.jupiter.api.io.TempDir java.nio.file.Path tmp) throws Exception {
        KernelLibrary missing = KernelLibrary.locate(tmp.resolve("no-such-folder").toString());
        String why = missing.folderProblem().orElseThrow();
        assertTrue(why.contains("GIN4J_KERNELS_DIR names " + tmp.resolve("no-such-folder")) && why.contains("which is missing (no such folder)")
                && why.contains("gin-kernels/out/resources"), why);
        GpuException read = assertThrows(GpuException.class, () -> missing.read("sm_90", "moe"));
        assertTrue(read.getMessage().contains("which is missing"), read.getMessage());
        java.nio.file.Path file = java.nio.file.Files.writeString(tmp.resolve("a-file"), "x");
        assertTrue(KernelLibrary.locate(file.toString()).folderProblem().orElseThrow().contains("which is missing (not a folder)"));
        String empty = KernelLibrary.locate(tmp.toString()).folderProblem().orElseThrow();
        assertTrue(empty.contains("which has no dev/gin4j/kernels/manifest.properties"), empty);
        assertTrue(KernelLibrary.locate(null).folderProblem().isEmpty(), "the class path is no folder to miss");
    }

    @Test void nativeAccessIsGrantedInTests() {
        // surefire passes --enable-native-access; without it require() must name the flag
        NativeAccess.require();
        assertTrue(NativeAccess.FLAG_MODULE.contains("dev.gin4j"));
    }
}
