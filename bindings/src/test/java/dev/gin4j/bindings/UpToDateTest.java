package dev.gin4j.bindings;

import static dev.gin4j.bindings.TestSupport.assumeHeaders;
import static dev.gin4j.bindings.TestSupport.assumeOrSkip;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.gin4j.bindings.TestSupport.ArgFile;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.TreeSet;
import java.util.stream.Stream;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** bindings/generate must reproduce the committed sources byte for byte. */
class UpToDateTest {

    @TempDir
    Path out;

    @Test
    void regeneratingReproducesCommittedSources() throws Exception {
        List<ArgFile> libraries = new ArrayList<>();
        for (String lib : List.of("cuda", "hip", "nccl", "moe", "moe_net", "a2a", "basic")) {
            ArgFile args = ArgFile.read(lib);
            assumeHeaders(args);
            libraries.add(args);
        }
        TestSupport.Result clang = TestSupport.run(out, Map.of(), 60,
                List.of("/usr/bin/python3", "-c", "import clang.cindex; clang.cindex.Index.create()"));
        assumeOrSkip(clang.exitCode() == 0,
                "libclang for Python missing (apt-get install python3-clang-19 libclang1-19): " + clang.output().strip());

        Path bindings = TestSupport.bindingsDir();
        Map<String, String> env = Map.of(
                "GIN4J_HEADERS", TestSupport.headerCache().toString(),
                "CUDA_HOME", TestSupport.cudaHome().toString(),
                // the committed sources come from our generator, even where jextract is installed
                "GIN4J_USE_GENERATOR", "1");
        TestSupport.Result gen = TestSupport.run(bindings, env, 300,
                List.of("bash", bindings.resolve("generate").toString(), "--output", out.toString()));
        assertEquals(0, gen.exitCode(), "bindings/generate failed:\n" + gen.output());

        Path committedRoot = bindings.resolve("src/main/java");
        int compared = 0;
        for (ArgFile args : libraries) {
            String recorded = recordedCudaHeaderSha(args);
            if (recorded != null) {
                String actual = sha256(Path.of(args.headers.get(0)));
                if (!recorded.equals(actual)) {
                    // cuda.h comes from the local toolkit, not from the pinned cache
                    System.err.println("SKIPPED " + args.targetPackage + ": " + args.headers.get(0) + " has sha256 "
                            + actual + ", the committed bindings come from " + recorded + " (CUDA 13.0)");
                    continue;
                }
            }
            String pkgPath = args.targetPackage.replace('.', '/');
            Path fresh = out.resolve(pkgPath);
            Path committed = committedRoot.resolve(pkgPath);
            TreeSet<String> freshFiles = list(fresh);
            TreeSet<String> committedFiles = list(committed);
            assertEquals(freshFiles, committedFiles, args.targetPackage
                    + ": generated file set differs from the committed one; run bindings/generate and commit");
            for (String name : freshFiles) {
                byte[] a = Files.readAllBytes(fresh.resolve(name));
                byte[] b = Files.readAllBytes(committed.resolve(name));
                assertTrue(Arrays.equals(a, b), pkgPath + "/" + name
                        + " differs from a fresh bindings/generate; regenerate and commit (never edit by hand)");
                compared++;
            }
        }
        assertTrue(compared > 0, "no generated file compared");
        System.err.println("up to date: " + compared + " generated files identical");
    }

    /** The "# cuda.h sha256 ..." comment of cuda.args, null for the other argfiles. */
    private static String recordedCudaHeaderSha(ArgFile args) throws Exception {
        for (String line : Files.readAllLines(TestSupport.bindingsDir().resolve(args.name + ".args"))) {
            if (line.startsWith("# cuda.h sha256 ")) {
                return line.substring("# cuda.h sha256 ".length()).strip();
            }
        }
        return null;
    }

    private static String sha256(Path file) throws Exception {
        return java.util.HexFormat.of().formatHex(
                java.security.MessageDigest.getInstance("SHA-256").digest(Files.readAllBytes(file)));
    }

    private static TreeSet<String> list(Path dir) throws Exception {
        TreeSet<String> names = new TreeSet<>();
        if (Files.isDirectory(dir)) {
            try (Stream<Path> s = Files.list(dir)) {
                s.forEach(p -> names.add(p.getFileName().toString()));
            }
        }
        return names;
    }
}
