package dev.gin4j.internal.gpu;

import dev.gin4j.bindings.moenet.moe_net_h;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Optional;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * The argument headers' ABI versions in the kernel manifest: gin-kernels/build writes them, and a
 * kernel folder built with another version (or before they were written) is named as such.
 */
class KernelAbiTest {
    private static final int NET = moe_net_h.MOE_NET_ABI_VERSION();

    private static KernelLibrary folderWith(Path dir, String manifest) throws Exception {
        Path root = dir.resolve("dev/gin4j/kernels");
        Files.createDirectories(root);
        Files.writeString(root.resolve("manifest.properties"), "object.sm_90.nccl_gin_moe=sm_90/nccl_gin_moe.cubin\n" + manifest);
        return KernelLibrary.locate(dir.toString());
    }

    @Test void aMatchingVersionPasses(@TempDir Path dir) throws Exception {
        assertEquals(Optional.empty(), folderWith(dir, "abi.MOE_NET_ABI_VERSION=" + NET + "\n").abiMismatch("MOE_NET_ABI_VERSION", NET));
    }

    @Test void anotherVersionIsNamedWithBoth(@TempDir Path dir) throws Exception {
        String m = folderWith(dir, "abi.MOE_NET_ABI_VERSION=" + (NET - 1) + "\n").abiMismatch("MOE_NET_ABI_VERSION", NET).orElseThrow();
        assertTrue(m.contains("built with MOE_NET_ABI_VERSION " + (NET - 1)) && m.contains("this library's is " + NET) && m.contains("GIN4J_KERNELS_DIR"), m);
    }

    @Test void aManifestWithoutVersionsIsAnOlderBuild(@TempDir Path dir) throws Exception {
        String m = folderWith(dir, "").abiMismatch("MOE_NET_ABI_VERSION", NET).orElseThrow();
        assertTrue(m.contains("name no MOE_NET_ABI_VERSION") && m.contains("older"), m);
    }

    /** The jar's own kernels (where this machine built them) carry the versions of the headers they were compiled with. */
    @Test void theBuiltKernelsCarryTheHeadersVersions() {
        KernelLibrary jar = KernelLibrary.locate(null);
        Assumptions.assumeTrue(jar.hasManifest(), "no kernels on the class path (no nvcc here): nothing to compare");
        assertEquals(Optional.empty(), jar.abiMismatch("MOE_NET_ABI_VERSION", NET), "the manifest: " + jar.property("abi.MOE_NET_ABI_VERSION"));
        assertEquals(String.valueOf(dev.gin4j.bindings.moe.moe_h.MOE_ABI_VERSION()), jar.property("abi.MOE_ABI_VERSION").orElse(null));
    }
}
