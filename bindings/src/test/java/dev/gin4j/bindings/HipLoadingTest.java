package dev.gin4j.bindings;

import static dev.gin4j.bindings.TestSupport.assumeOrSkip;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.gin4j.bindings.hip.hipDeviceProp_tR0600;
import dev.gin4j.bindings.hip.hip_runtime_api_h;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import org.junit.jupiter.api.Test;

/**
 * Loads a real HIP runtime through the bindings (here: Debian bookworm's libamdhip64-5 5.2.3, on a
 * machine without an AMD GPU) and checks the no-device answer.
 */
class HipLoadingTest {

    private static final String INSTALL = "apt-get install -y --no-install-recommends libamdhip64-5";

    @Test
    void hipGetDeviceCountReportsNoDevice() {
        assumeOrSkip(NativeLibrary.HIP.isAvailable(),
                "no HIP runtime (" + NativeLibrary.HIP.describe() + "); install one with: " + INSTALL);
        System.err.println(NativeLibrary.HIP.describe());
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment count = arena.allocate(hip_runtime_api_h.C_INT);
            count.set(hip_runtime_api_h.C_INT, 0, -1);
            int rc = hip_runtime_api_h.hipGetDeviceCount(count);
            String name = hip_runtime_api_h.hipGetErrorName(rc).getString(0);
            if (rc == hip_runtime_api_h.hipSuccess()) {
                // a machine with an AMD GPU: then there must be one
                assertTrue(count.get(hip_runtime_api_h.C_INT, 0) >= 1, "hipSuccess but device count " + count.get(hip_runtime_api_h.C_INT, 0));
                return;
            }
            assertEquals(100, hip_runtime_api_h.hipErrorNoDevice());
            assertEquals(hip_runtime_api_h.hipErrorNoDevice(), rc, "hipGetDeviceCount returned " + rc + " (" + name + ")");
            assertEquals("hipErrorNoDevice", name);
            String text = hip_runtime_api_h.hipGetErrorString(rc).getString(0);
            assertTrue(!text.isBlank(), "hipGetErrorString is empty");
        }
    }

    @Test
    void symbolAbsentFromThisHipVersionFailsOnFirstUseWithFileAndVersion() {
        assumeOrSkip(NativeLibrary.HIP.isAvailable(),
                "no HIP runtime (" + NativeLibrary.HIP.describe() + "); install one with: " + INSTALL);
        // HIP 5 exports hipGetDeviceProperties only; the R0600 ABI came with HIP 6
        assumeOrSkip(NativeLibrary.HIP.find("hipGetDevicePropertiesR0600").isEmpty(),
                "this HIP runtime exports hipGetDevicePropertiesR0600 (HIP 6): nothing missing to test");
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment props = hipDeviceProp_tR0600.allocate(arena);
            UnsatisfiedLinkError e = assertThrows(UnsatisfiedLinkError.class,
                    () -> hip_runtime_api_h.hipGetDevicePropertiesR0600(props, 0));
            String m = e.getMessage();
            assertTrue(m.contains("hipGetDevicePropertiesR0600"), m);
            assertTrue(m.contains("libamdhip64"), m);
            assertTrue(m.contains("version "), m);
        }
    }
}
