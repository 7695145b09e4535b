package dev.gin4j.comm;

import org.junit.jupiter.api.Test;

import java.nio.file.Files;
import java.nio.file.Path;

import static org.junit.jupiter.api.Assertions.*;

/** What gin4j says about an NCCL_GIN_PLUGIN setting that cannot give NCCL a GIN plugin (no GPU needed). */
class GinPluginSettingTest {

    @Test void unsetNoneAndPlainNamesAreLeftToNccl() {
        assertNull(Capabilities.ginPluginProblem(null));
        assertNull(Capabilities.ginPluginProblem("none"));
        assertNull(Capabilities.ginPluginProblem("loopback"));  // NCCL looks for libnccl-gin-loopback.so on its library path
    }

    @Test void aMissingFileIsNamed() {
        String p = Capabilities.ginPluginProblem("/nonexistent/libnccl-gin-x.so");
        assertNotNull(p);
        assertTrue(p.contains("/nonexistent/libnccl-gin-x.so") && p.contains("does not exist"), p);
    }

    /** A library that loads but is no GIN plugin (the C math library): built for no NCCL GIN interface. */
    @Test void aLibraryWithoutTheGinPluginSymbolsIsNamed() {
        Path libm = Path.of("/lib/x86_64-linux-gnu/libm.so.6");
        org.junit.jupiter.api.Assumptions.assumeTrue(Files.isRegularFile(libm), "no " + libm + " on this machine");
        String p = Capabilities.ginPluginProblem(libm.toString());
        assertNotNull(p);
        assertTrue(p.contains("ncclGinPlugin_v12") && p.contains("another NCCL version"), p);
    }

    @Test void theLoopbackTransportPasses() {
        Path plugin = Path.of(System.getProperty("user.dir")).resolveSibling("gin-kernels/out/loopback/libnccl-gin-loopback.so");
        org.junit.jupiter.api.Assumptions.assumeTrue(Files.isRegularFile(plugin), "the loopback transport is not built (gin-kernels/loopback/build): " + plugin);
        assertNull(Capabilities.ginPluginProblem(plugin.toString()));
    }
}
