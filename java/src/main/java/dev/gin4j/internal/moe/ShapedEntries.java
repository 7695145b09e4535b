package dev.gin4j.internal.moe;

import dev.gin4j.bindings.NativeLibrary;
import dev.gin4j.bindings.nvrtc.nvrtc_h;
import dev.gin4j.gpu.CodeObject;
import dev.gin4j.gpu.Device;
import dev.gin4j.gpu.GpuException;
import dev.gin4j.internal.gpu.KernelLibrary;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.SymbolLookup;
import java.lang.foreign.ValueLayout;
import java.nio.charset.StandardCharsets;
import java.nio.file.AtomicMoveNotSupportedException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.Arrays;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.concurrent.ConcurrentHashMap;
import java.util.stream.Stream;

/**
 * The MoE token-path entries with the model shape as constants ({@code moe_gin_dispatch_tp_r<R>_e<E>_k<K>_h<H>},
 * {@code moe_gin_combine_tp_...}, {@code moe_gin_dispatch_fp8_tp_...}) for shapes that
 * {@code gin-kernels/moe_shapes.list} does not precompile: compiled on first use with NVRTC from the kernel
 * sources the jar carries ({@code dev/gin4j/kernels/src/}, manifest {@code jit.sources}, {@code jit.flags}), and
 * kept on disk in {@code GIN4J_CACHE_DIR} (else {@code ~/.cache/gin4j}), keyed by a hash of the sources,
 * flags, NVRTC version, architecture and shape.
 * <p>{@code GIN4J_MOE_ENTRIES} (or system property {@code gin4j.moe.entries}) chooses: {@code auto} (default:
 * the precompiled entry, else a compiled one, else the generic {@code _tp} / {@code _tp_r1}), {@code jit}
 * (compile even a listed shape), {@code generic} (the generic token-path entry, for comparisons). Without
 * libnvrtc (a machine with the driver only) or on HIP (hiprtc is not wired up yet) {@code auto} falls back to
 * the generic entry and says why at DEBUG on logger {@code dev.gin4j} and in {@code gin4j info}.
 */
public final class ShapedEntries {
    private static final System.Logger LOG = System.getLogger("dev.gin4j");
    private static final String SRC_ROOT = "src/";

    /** How the token-path entry is chosen (GIN4J_MOE_ENTRIES). */
    public enum Mode { AUTO, JIT, GENERIC }

    /** Where an instance's entry came from, for reports. */
    public enum Source { PRECOMPILED, JIT, GENERIC }

    // compiled cubins per architecture and shape, for the life of the process (each instance loads its own module)
    private static final Map<String, byte[]> CUBINS = new ConcurrentHashMap<>();
    private static volatile boolean builtinsLoaded;

    private ShapedEntries() {}

    /** The mode in force now (read at each MoeAllToAll.create, so a benchmark may switch it between instances). */
    public static Mode mode() {
        String v = System.getProperty("gin4j.moe.entries", System.getenv("GIN4J_MOE_ENTRIES"));
        if (v == null || v.isBlank()) return Mode.AUTO;
        return switch (v.trim().toLowerCase()) {
            case "auto" -> Mode.AUTO;
            case "jit" -> Mode.JIT;
            case "generic" -> Mode.GENERIC;
            default -> throw new IllegalArgumentException("GIN4J_MOE_ENTRIES / gin4j.moe.entries is '" + v + "'; expected auto, jit or generic");
        };
    }

    /** Why shaped entries cannot be compiled on {@code arch} here, or empty where they can. */
    public static Optional<String> unavailable(String arch) {
        if (!arch.startsWith("sm_")) {
            return Optional.of("run-time compile of shaped MoE entries is CUDA-only for now (hiprtc for " + arch + " is not wired up); unlisted shapes use the generic entry");
        }
        if (!NativeLibrary.NVRTC.isAvailable()) return Optional.of(NativeLibrary.NVRTC.describe() + "; unlisted shapes use the generic entry (set GIN4J_NVRTC_LIBRARY)");
        if (KernelLibrary.get().property("jit.sources").isEmpty()) {
            return Optional.of("the kernel library " + KernelLibrary.get().source() + " carries no kernel sources (manifest jit.sources); rebuild with gin-kernels/build");
        }
        return Optional.empty();
    }

    /** One line for {@code gin4j info}: NVRTC, the cache folder, the mode. */
    public static String describe(String arch) {
        Optional<String> why = unavailable(arch);
        return why.map(w -> "shaped MoE entries: precompiled list only (" + w + ")")
                .orElseGet(() -> "shaped MoE entries: compiled on first use with " + NativeLibrary.NVRTC.describe() + ", cache " + cacheDir())
                + "; GIN4J_MOE_ENTRIES=" + mode().name().toLowerCase();
    }

    /** GIN4J_CACHE_DIR, else ~/.cache/gin4j. */
    public static Path cacheDir() {
        String dir = System.getProperty("gin4j.cache.dir", System.getenv("GIN4J_CACHE_DIR"));
        return dir != null && !dir.isBlank() ? Path.of(dir) : Path.of(System.getProperty("user.home"), ".cache", "gin4j");
    }

    /** The entry names a shaped program holds: dispatch + combine (bf16) or the fp8 dispatch. */
    public static List<String> entryNames(boolean fp8, int ranks, int experts, int topK, int hidden) {
        String shape = "_tp_r" + ranks + "_e" + experts + "_k" + topK + "_h" + hidden;
        return fp8 ? List.of("moe_gin_dispatch_fp8" + shape) : List.of("moe_gin_dispatch" + shape, "moe_gin_combine" + shape);
    }

    /**
     * The shaped program loaded on {@code device}, compiled (or read from the cache) on first use; the
     * caller owns the code object and closes it (the cubin stays in memory for the next instance).
     */
    public static CodeObject load(Device device, boolean fp8, int ranks, int experts, int topK, int hidden) {
        String key = device.arch() + "/" + (fp8 ? "fp8" : "bf16") + "_r" + ranks + "_e" + experts + "_k" + topK + "_h" + hidden;
        byte[] bytes = CUBINS.computeIfAbsent(key, k -> cubin(device.arch(), fp8, ranks, experts, topK, hidden));
        return device.loadCodeObject("moe_gin_jit_" + key.substring(key.indexOf('/') + 1), bytes);
    }

    /**
     * The cubin of one shaped program for {@code arch}: from the cache when a valid file is there, else
     * compiled with NVRTC and written to the cache atomically. A cache file holds the SHA-256 of the cubin,
     * then the cubin; one that does not match (truncated, corrupt) is logged and rebuilt.
     */
    public static byte[] cubin(String arch, boolean fp8, int ranks, int experts, int topK, int hidden) {
        unavailable(arch).ifPresent(w -> { throw new IllegalStateException(w); });
        Map<String, byte[]> sources = sources();
        List<String> flags = flags(arch);
        String shapesHeader = shapesHeader(fp8, ranks, experts, topK, hidden);
        String version = nvrtcVersion();
        MessageDigest keyHash = sha256();
        sources.forEach((name, bytes) -> { keyHash.update(name.getBytes(StandardCharsets.UTF_8)); keyHash.update(bytes); });
        keyHash.update((String.join(" ", flags) + "\n" + version + "\n" + arch + "\n" + shapesHeader).getBytes(StandardCharsets.UTF_8));
        String name = "moe-" + arch + "-" + (fp8 ? "fp8" : "bf16") + "-r" + ranks + "-e" + experts + "-k" + topK + "-h" + hidden
                + "-" + HexFormat.of().formatHex(keyHash.digest()).substring(0, 16) + ".cubin";
        Path file = cacheDir().resolve(name);
        byte[] cached = readValid(file);
        if (cached != null) {
            LOG.log(System.Logger.Level.DEBUG, () -> "shaped MoE entries: " + entryNames(fp8, ranks, experts, topK, hidden) + " from the cache " + file);
            return cached;
        }
        long t0 = System.nanoTime();
        byte[] cubin = compile(sources, shapesHeader, flags);
        LOG.log(System.Logger.Level.INFO, () -> String.format("shaped MoE entries: compiled %s for %s with NVRTC %s in %.1f s -> %s",
                entryNames(fp8, ranks, experts, topK, hidden), arch, version, (System.nanoTime() - t0) / 1e9, file));
        write(file, cubin);
        return cubin;
    }

    /** The cached cubin if the file is there and its checksum holds; null otherwise (logged when corrupt). */
    public static byte[] readValid(Path file) {
        if (!Files.isRegularFile(file)) return null;
        try {
            byte[] all = Files.readAllBytes(file);
            if (all.length > 32) {
                byte[] body = Arrays.copyOfRange(all, 32, all.length);
                if (Arrays.equals(sha256().digest(body), Arrays.copyOf(all, 32))) return body;
            }
            LOG.log(System.Logger.Level.INFO, () -> "shaped MoE entries: cache file " + file + " is corrupt (checksum mismatch, " + all.length + " bytes); compiling again");
        } catch (IOException e) {
            LOG.log(System.Logger.Level.INFO, () -> "shaped MoE entries: cannot read cache file " + file + " (" + e + "); compiling again");
        }
        return null;
    }

    private static void write(Path file, byte[] cubin) {
        try {
            Files.createDirectories(file.getParent());
            Path tmp = Files.createTempFile(file.getParent(), file.getFileName().toString(), ".tmp");
            byte[] all = new byte[32 + cubin.length];
            System.arraycopy(sha256().digest(cubin), 0, all, 0, 32);
            System.arraycopy(cubin, 0, all, 32, cubin.length);
            Files.write(tmp, all);
            try {
                Files.move(tmp, file, StandardCopyOption.ATOMIC_MOVE, StandardCopyOption.REPLACE_EXISTING);
            } catch (AtomicMoveNotSupportedException e) {
                Files.move(tmp, file, StandardCopyOption.REPLACE_EXISTING);
            }
        } catch (IOException e) {
            // the compiled code is still used; only the next process compiles again
            LOG.log(System.Logger.Level.INFO, () -> "shaped MoE entries: cannot write the cache file " + file + ": " + e);
        }
    }

    /** The moe_shapes.h of one shaped program: the one shape, bf16 (dispatch + combine) or fp8 (dispatch). */
    public static String shapesHeader(boolean fp8, int ranks, int experts, int topK, int hidden) {
        String x = "X(" + ranks + ", " + experts + ", " + topK + ", " + hidden + ")";
        return "#pragma once\n#define MOE_TP_SHAPES(X) " + (fp8 ? "" : x) + "\n#define MOE_TP_FP8_SHAPES(X) " + (fp8 ? x : "") + "\n";
    }

    /** NVRTC's options: the build's device flags (manifest jit.flags) and the architecture, as nvcc -arch=sm_XX gets. */
    public static List<String> flags(String arch) {
        String f = KernelLibrary.get().property("jit.flags").orElse("-std=c++17");
        return Stream.concat(Stream.of("-arch=" + arch), Arrays.stream(f.trim().split("\\s+")).filter(s -> !s.isEmpty())).toList();
    }

    /** The kernel sources of the jar (or GIN4J_KERNELS_DIR), by path relative to src/. */
    public static Map<String, byte[]> sources() {
        KernelLibrary lib = KernelLibrary.get();
        Map<String, byte[]> m = new java.util.TreeMap<>();
        for (String rel : lib.property("jit.sources").orElse("").split(",")) {
            if (!rel.isEmpty()) m.put(rel, lib.readResource(SRC_ROOT + rel));
        }
        return m;
    }

    static String nvrtcVersion() {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment major = a.allocate(ValueLayout.JAVA_INT), minor = a.allocate(ValueLayout.JAVA_INT);
            check(nvrtc_h.nvrtcVersion(major, minor), "nvrtcVersion", null);
            return major.get(ValueLayout.JAVA_INT, 0) + "." + minor.get(ValueLayout.JAVA_INT, 0);
        }
    }

    // libnvrtc opens libnvrtc-builtins.so.<major>.<minor> by soname; when libnvrtc came from a folder the
    // loader does not search (GIN4J_NVRTC_LIBRARY, a wheel), load it from there first so that lookup finds it.
    private static void loadBuiltins() {
        if (builtinsLoaded) return;
        synchronized (ShapedEntries.class) {
            if (builtinsLoaded) return;
            String d = NativeLibrary.NVRTC.describe();
            int at = d.indexOf(" -> ");
            if (at >= 0) {
                Path real = Path.of(d.substring(at + 4, d.lastIndexOf(" (version ")));
                try (Stream<Path> files = Files.list(real.getParent())) {
                    files.filter(p -> p.getFileName().toString().matches("libnvrtc-builtins\\.so\\.\\d+\\.\\d+"))
                            .findFirst().ifPresent(p -> SymbolLookup.libraryLookup(p, Arena.global()));
                } catch (IOException | RuntimeException e) {
                    LOG.log(System.Logger.Level.DEBUG, () -> "shaped MoE entries: no libnvrtc-builtins next to " + real + " (" + e + "); NVRTC searches for it itself");
                }
            }
            builtinsLoaded = true;
        }
    }

    /** Writes the sources and moe_shapes.h into a scratch folder, compiles the shaped program, returns the cubin. */
    private static byte[] compile(Map<String, byte[]> sources, String shapesHeader, List<String> flags) {
        loadBuiltins();
        Path dir;
        try {
            Files.createDirectories(cacheDir());
            dir = Files.createTempDirectory(cacheDir(), "src-");
            for (Map.Entry<String, byte[]> e : sources.entrySet()) {
                Path p = dir.resolve(e.getKey());
                Files.createDirectories(p.getParent());
                Files.write(p, e.getValue());
            }
            Files.writeString(dir.resolve("moe_shapes.h"), shapesHeader);
        } catch (IOException e) {
            throw new UncheckedIOException("cannot write the MoE kernel sources under " + cacheDir() + " for NVRTC", e);
        }
        String program = "#include \"moe/shaped_entries.cuh\"\nMOE_TP_SHAPES(MOE_TP_ENTRIES)\nMOE_TP_FP8_SHAPES(MOE_TP_FP8_ENTRIES)\n";
        try (Arena a = Arena.ofConfined()) {
            MemorySegment prog = a.allocate(ValueLayout.ADDRESS);
            check(nvrtc_h.nvrtcCreateProgram(prog, a.allocateFrom(program), a.allocateFrom("moe_shaped.cu"), 0, MemorySegment.NULL, MemorySegment.NULL),
                    "nvrtcCreateProgram", null);
            MemorySegment p = prog.get(ValueLayout.ADDRESS, 0);
            try {
                List<String> opts = Stream.concat(flags.stream(), Stream.of("-I" + dir)).toList();
                MemorySegment argv = a.allocate(ValueLayout.ADDRESS, opts.size());
                for (int i = 0; i < opts.size(); i++) argv.setAtIndex(ValueLayout.ADDRESS, i, a.allocateFrom(opts.get(i)));
                int rc = nvrtc_h.nvrtcCompileProgram(p, opts.size(), argv);
                check(rc, "nvrtcCompileProgram " + opts, rc == 0 ? null : log(a, p));
                MemorySegment size = a.allocate(ValueLayout.JAVA_LONG);
                check(nvrtc_h.nvrtcGetCUBINSize(p, size), "nvrtcGetCUBINSize", null);
                MemorySegment out = a.allocate(size.get(ValueLayout.JAVA_LONG, 0));
                check(nvrtc_h.nvrtcGetCUBIN(p, out), "nvrtcGetCUBIN", null);
                return out.toArray(ValueLayout.JAVA_BYTE);
            } finally {
                nvrtc_h.nvrtcDestroyProgram(prog);
            }
        } finally {
            deleteTree(dir);
        }
    }

    private static String log(Arena a, MemorySegment p) {
        MemorySegment size = a.allocate(ValueLayout.JAVA_LONG);
        if (nvrtc_h.nvrtcGetProgramLogSize(p, size) != 0) return "(no log)";
        MemorySegment log = a.allocate(Math.max(1, size.get(ValueLayout.JAVA_LONG, 0)));
        return nvrtc_h.nvrtcGetProgramLog(p, log) != 0 ? "(no log)" : log.getString(0);
    }

    private static void check(int rc, String call, String log) {
        if (rc == 0) return;
        String err = nvrtc_h.nvrtcGetErrorString(rc).reinterpret(256).getString(0);
        throw new GpuException(call + " failed: " + err + " (" + rc + ")" + (log == null ? "" : ":\n" + log));
    }

    private static void deleteTree(Path dir) {
        try (Stream<Path> all = Files.walk(dir)) {
            all.sorted(java.util.Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
        } catch (IOException e) {
            LOG.log(System.Logger.Level.DEBUG, () -> "shaped MoE entries: could not remove " + dir + ": " + e);
        }
    }

    private static MessageDigest sha256() {
        try {
            return MessageDigest.getInstance("SHA-256");
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException(e);
        }
    }
}
