package dev.gin4j.internal.moe;

import dev.gin4j.bindings.NativeLibrary;
import dev.gin4j.internal.gpu.KernelLibrary;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.stream.Stream;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * The run-time compile of shaped MoE entries, on the CPU (NVRTC needs no GPU): an unlisted shape's cubin
 * holds the expected entries, the cache is hit the second time, a corrupt cache file is rebuilt, and a
 * listed shape compiled at run time is set beside the precompiled one, function by function.
 * libnvrtc: GIN4J_NVRTC_LIBRARY, else the toolkit's, else .cache/nvrtc/&lt;version&gt;/lib (ci/nvrtc).
 */
class ShapedEntriesTest {
    static Path cache;

    @BeforeAll
    static void setUp() throws Exception {
        if (System.getenv("GIN4J_NVRTC_LIBRARY") == null && System.getProperty("gin4j.nvrtc.library") == null) {
            Path here = Path.of(System.getProperty("user.dir")).toAbsolutePath();
            Path root = Files.isDirectory(here.resolve(".cache/nvrtc")) ? here.resolve(".cache/nvrtc") : here.getParent().resolve(".cache/nvrtc");
            if (Files.isDirectory(root)) {
                try (Stream<Path> s = Files.list(root)) {
                    s.map(d -> d.resolve("lib/libnvrtc.so.13")).filter(Files::isRegularFile).sorted().reduce((a, b) -> b)
                            .ifPresent(p -> System.setProperty("gin4j.nvrtc.library", p.toString()));
                }
            }
        }
        cache = Files.createTempDirectory("gin4j-jit-test");
        System.setProperty("gin4j.cache.dir", cache.toString());
        String why = ShapedEntries.unavailable("sm_90").orElse(null);
        if (why == null && !KernelLibrary.get().kernels("sm_90", "moe_gin").contains("moe_gin_dispatch_tp")) why = "no sm_90 moe_gin code object in the kernel library";
        if (why != null) {
            System.err.println("SKIPPED ShapedEntriesTest: " + why);
            Assumptions.assumeTrue(false, why);
        }
        System.err.println("ShapedEntriesTest: " + NativeLibrary.NVRTC.describe());
    }

    @Test
    void unlistedShapeCompilesHitsTheCacheAndRebuildsACorruptFile() throws Exception {
        // gpt-oss: hidden 2880, 128 experts, top-4, 2 ranks
        byte[] first = ShapedEntries.cubin("sm_90", false, 2, 128, 4, 2880);
        Map<String, byte[]> text = textSections(first);
        for (String name : List.of("moe_gin_dispatch_tp_r2_e128_k4_h2880", "moe_gin_combine_tp_r2_e128_k4_h2880")) {
            assertTrue(text.containsKey(name), name + " in the compiled cubin; it has " + text.keySet());
        }
        Path file;
        try (Stream<Path> s = Files.list(cache)) {
            List<Path> files = s.filter(p -> p.toString().endsWith(".cubin")).toList();
            assertEquals(1, files.size(), "one cache file: " + files);
            file = files.getFirst();
        }
        long written = Files.getLastModifiedTime(file).toMillis();
        long t0 = System.nanoTime();
        byte[] second = ShapedEntries.cubin("sm_90", false, 2, 128, 4, 2880);
        double seconds = (System.nanoTime() - t0) / 1e9;
        assertArrayEquals(first, second, "the cached cubin");
        assertEquals(written, Files.getLastModifiedTime(file).toMillis(), "a cache hit leaves the file alone");
        assertTrue(seconds < 2, "a cache hit takes no compile: " + seconds + " s");

        byte[] corrupt = Files.readAllBytes(file);
        corrupt[corrupt.length / 2] ^= 0x5a;
        Files.write(file, corrupt);
        assertEquals(null, ShapedEntries.readValid(file), "the corrupt file is detected");
        byte[] rebuilt = ShapedEntries.cubin("sm_90", false, 2, 128, 4, 2880);
        assertArrayEquals(first, rebuilt, "NVRTC compiles the same cubin again");
        assertNotNull(ShapedEntries.readValid(file), "the cache file is valid again");
    }

    @Test
    void listedShapeBesideThePrecompiledOne() {
        // Mixtral at 2 ranks is in moe_shapes.list: the same entry names; the code is reported function by
        // function (NVRTC's front end and nvcc's differ, and even nvcc's code of one entry depends on the
        // other entries in its translation unit: cicc's inlining sees every caller).
        byte[] jit = ShapedEntries.cubin("sm_90", false, 2, 8, 2, 4096);
        Map<String, byte[]> shipped = textSections(KernelLibrary.get().read("sm_90", "moe_gin"));
        for (Map.Entry<String, byte[]> e : textSections(jit).entrySet()) {
            byte[] pre = shipped.get(e.getKey());
            assertNotNull(pre, e.getKey() + " is precompiled too");
            System.err.printf("ShapedEntriesTest: %s: NVRTC %d bytes of SASS, nvcc %d, %s%n", e.getKey(), e.getValue().length, pre.length,
                    Arrays.equals(pre, e.getValue()) ? "identical" : "different code");
        }
        assertEquals(List.of("moe_gin_combine_tp_r2_e8_k2_h4096", "moe_gin_dispatch_tp_r2_e8_k2_h4096"),
                textSections(jit).keySet().stream().sorted().toList());
    }

    /** The .text.&lt;function&gt; sections of a cubin (ELF64): each function's machine code. */
    static Map<String, byte[]> textSections(byte[] elf) {
        ByteBuffer b = ByteBuffer.wrap(elf).order(ByteOrder.LITTLE_ENDIAN);
        long shoff = b.getLong(0x28);
        int shentsize = Short.toUnsignedInt(b.getShort(0x3A)), shnum = Short.toUnsignedInt(b.getShort(0x3C)), shstrndx = Short.toUnsignedInt(b.getShort(0x3E));
        long strOff = b.getLong((int) (shoff + (long) shstrndx * shentsize + 0x18));
        Map<String, byte[]> m = new LinkedHashMap<>();
        for (int i = 0; i < shnum; i++) {
            int h = (int) (shoff + (long) i * shentsize);
            int nameAt = (int) (strOff + b.getInt(h));
            int end = nameAt;
            while (elf[end] != 0) end++;
            String name = new String(elf, nameAt, end - nameAt, StandardCharsets.US_ASCII);
            if (!name.startsWith(".text.")) continue;
            int off = (int) b.getLong(h + 0x18), size = (int) b.getLong(h + 0x20);
            m.put(name.substring(6), Arrays.copyOfRange(elf, off, off + size));
        }
        return m;
    }
}
