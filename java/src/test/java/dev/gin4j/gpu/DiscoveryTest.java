package dev.gin4j.gpu;

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

    @Test void nativeAccessIsGrantedInTests() {
        // surefire passes --enable-native-access; without it require() must name the flag
        NativeAccess.require();
        assertTrue(NativeAccess.FLAG_MODULE.contains("dev.gin4j"));
    }
}
