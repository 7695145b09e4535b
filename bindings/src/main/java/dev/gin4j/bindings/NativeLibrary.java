package dev.gin4j.bindings;

import java.lang.foreign.AddressLayout;
import java.lang.foreign.Arena;
import java.lang.foreign.FunctionDescriptor;
import java.lang.foreign.Linker;
import java.lang.foreign.MemoryLayout;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.StructLayout;
import java.lang.foreign.SymbolLookup;
import java.lang.foreign.ValueLayout;
import java.lang.invoke.MethodHandle;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Objects;
import java.util.Optional;
import java.util.function.UnaryOperator;

/**
 * Finds and loads one native library for the generated bindings (hand-written, not generated).
 *
 * <p>Stock jextract hard-codes the {@code -l} name; gin4j lets the user choose the file instead.
 * Resolution happens lazily, once, on the first {@link #find}: if the system property
 * (e.g. {@code gin4j.cuda.library}) or else the environment variable (e.g. {@code GIN4J_CUDA_LIBRARY})
 * names a file, only that file is tried; otherwise the usual sonames are tried in order through
 * the system loader. A library that does not load is not an error until a function needs it:
 * the generated wrappers then throw {@link #missing(String)}.
 *
 * <p>Libraries are loaded into the global arena: they stay mapped for the life of the process,
 * which the driver libraries need anyway (they keep threads and device state).
 */
public final class NativeLibrary {

    /** CUDA driver API ({@code libcuda.so.1}). */
    public static final NativeLibrary CUDA = configured("CUDA driver", "GIN4J_CUDA_LIBRARY", "gin4j.cuda.library",
            List.of("libcuda.so.1"), "cuInit");

    /** HIP runtime ({@code libamdhip64}). */
    public static final NativeLibrary HIP = configured("HIP runtime", "GIN4J_HIP_LIBRARY", "gin4j.hip.library",
            List.of("libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5"), "hipInit");

    /** NCCL, or RCCL which exports the same names. */
    public static final NativeLibrary NCCL = configured("NCCL/RCCL", "GIN4J_NCCL_LIBRARY", "gin4j.nccl.library",
            List.of("libnccl.so.2", "librccl.so.1"), "ncclGetVersion");

    /** NVRTC, the CUDA run-time compiler (the toolkit's, or the nvidia-cuda-nvrtc wheel's); optional. */
    public static final NativeLibrary NVRTC = configured("NVRTC", "GIN4J_NVRTC_LIBRARY", "gin4j.nvrtc.library",
            List.of("libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so", "/usr/local/cuda/lib64/libnvrtc.so.13",
                    "/usr/local/cuda/lib64/libnvrtc.so.12", "/usr/local/cuda/lib64/libnvrtc.so"), "nvrtcVersion");

    private final String name;
    private final String envVar;
    private final String property;
    private final List<String> sonames;
    private final String probeSymbol;
    private final UnaryOperator<String> environment;
    private final UnaryOperator<String> properties;

    // written once under the lock in state(); volatile so the fast path needs no lock
    private volatile State state;

    private record State(SymbolLookup lookup, String loadedAs, String realPath, String version, List<String> tried) {
        boolean loaded() {
            return lookup != null;
        }
    }

    private NativeLibrary(String name, String envVar, String property, List<String> sonames, String probeSymbol,
                          UnaryOperator<String> environment, UnaryOperator<String> properties) {
        this.name = Objects.requireNonNull(name);
        this.envVar = envVar;
        this.property = property;
        this.sonames = List.copyOf(sonames);
        this.probeSymbol = probeSymbol;
        this.environment = environment;
        this.properties = properties;
    }

    /**
     * A library chosen like the built-in instances: system property {@code property}, else
     * environment variable {@code envVar}, else {@code sonames} in order. Nothing is read until first use.
     *
     * @param probeSymbol a symbol the library exports, used to find the file the loader picked (may be null)
     */
    public static NativeLibrary configured(String name, String envVar, String property, List<String> sonames,
                                           String probeSymbol) {
        return new NativeLibrary(name, envVar, property, sonames, probeSymbol, System::getenv, System::getProperty);
    }

    /**
     * A library loaded from exactly these candidates (sonames through the system loader, or paths
     * when they contain a '/'), tried in order, ignoring environment and system properties.
     */
    public static NativeLibrary ofCandidates(String name, List<String> candidates, String probeSymbol) {
        if (candidates.isEmpty()) {
            throw new IllegalArgumentException("no candidates for " + name);
        }
        return new NativeLibrary(name, null, null, candidates, probeSymbol, k -> null, k -> null);
    }

    /** The display name, e.g. "CUDA driver". */
    public String name() {
        return name;
    }

    /** Whether the library loaded (loads it on first call). */
    public boolean isAvailable() {
        return state().loaded();
    }

    /**
     * Which file was loaded (as asked, its real path and the version from the real file name),
     * or everything that was tried and why each failed.
     */
    public String describe() {
        State s = state();
        if (s.loaded()) {
            return name + ": loaded " + s.loadedAs() + " -> " + s.realPath() + " (version " + s.version() + ")";
        }
        return name + ": not loaded; tried " + String.join("; ", s.tried()) + hint();
    }

    /** The address of {@code symbol}, empty if the library did not load or does not export it. */
    public Optional<MemorySegment> find(String symbol) {
        State s = state();
        return s.loaded() ? s.lookup().find(symbol) : Optional.empty();
    }

    /** The error a generated wrapper throws when {@code symbol} cannot be called. */
    public UnsatisfiedLinkError missing(String symbol) {
        State s = state();
        if (s.loaded()) {
            return new UnsatisfiedLinkError("symbol " + symbol + " not found in " + name + " library "
                    + s.realPath() + " (loaded as " + s.loadedAs() + ", version " + s.version()
                    + "): this version does not export it");
        }
        return new UnsatisfiedLinkError("cannot call " + symbol + ": " + name + " library not loaded; tried "
                + String.join("; ", s.tried()) + hint());
    }

    private String hint() {
        if (envVar == null) {
            return "";
        }
        return ". Set " + envVar + " (or -D" + property + "=...) to the library file";
    }

    private State state() {
        State s = state;
        if (s == null) {
            synchronized (this) {
                s = state;
                if (s == null) {
                    s = load();
                    state = s;
                }
            }
        }
        return s;
    }

    private State load() {
        List<String> candidates = new ArrayList<>();
        String source = null;
        String fromProperty = property == null ? null : properties.apply(property);
        String fromEnv = envVar == null ? null : environment.apply(envVar);
        if (fromProperty != null && !fromProperty.isBlank()) {
            candidates.add(fromProperty.trim());
            source = "system property " + property;
        } else if (fromEnv != null && !fromEnv.isBlank()) {
            candidates.add(fromEnv.trim());
            source = "environment variable " + envVar;
        } else {
            candidates.addAll(sonames);
        }
        List<String> tried = new ArrayList<>();
        for (String candidate : candidates) {
            String label = source == null ? candidate : candidate + " (from " + source + ")";
            SymbolLookup lookup;
            try {
                if (candidate.contains("/")) {
                    Path path = Path.of(candidate);
                    if (!Files.exists(path)) {
                        tried.add(label + ": no such file");
                        continue;
                    }
                    lookup = SymbolLookup.libraryLookup(path, Arena.global());
                } else {
                    lookup = SymbolLookup.libraryLookup(candidate, Arena.global());
                }
            } catch (IllegalArgumentException | IllegalCallerException e) {
                tried.add(label + ": " + e.getMessage());
                continue;
            }
            String realPath = realPath(lookup, candidate);
            return new State(lookup, label, realPath, versionOf(realPath, candidate), List.copyOf(tried));
        }
        return new State(null, null, null, null, List.copyOf(tried));
    }

    /** The file the loader mapped: dladdr on a known symbol, else the candidate path itself. */
    private String realPath(SymbolLookup lookup, String candidate) {
        String file = null;
        if (probeSymbol != null) {
            file = lookup.find(probeSymbol).map(NativeLibrary::dladdrFileName).orElse(null);
        }
        if (file == null && candidate.contains("/")) {
            file = candidate;
        }
        if (file == null) {
            return candidate + " (real path unknown)";
        }
        try {
            return Path.of(file).toRealPath().toString();
        } catch (Exception e) {
            return file;
        }
    }

    /** "libcuda.so.580.65.06" -> "580.65.06"; falls back to the soname's suffix. */
    static String versionOf(String realPath, String candidate) {
        for (String file : new String[] {realPath, candidate}) {
            if (file == null) {
                continue;
            }
            String base = Path.of(file.split(" ")[0]).getFileName().toString();
            int at = base.indexOf(".so.");
            if (at >= 0 && at + 4 < base.length()) {
                return base.substring(at + 4);
            }
        }
        return "unknown";
    }

    private static final StructLayout DL_INFO = MemoryLayout.structLayout(
            ValueLayout.ADDRESS.withName("dli_fname"),
            ValueLayout.ADDRESS.withName("dli_fbase"),
            ValueLayout.ADDRESS.withName("dli_sname"),
            ValueLayout.ADDRESS.withName("dli_saddr"));

    private static String dladdrFileName(MemorySegment address) {
        try {
            Linker linker = Linker.nativeLinker();
            Optional<MemorySegment> dladdr = linker.defaultLookup().find("dladdr");
            if (dladdr.isEmpty()) {
                return null;
            }
            MethodHandle handle = linker.downcallHandle(dladdr.get(),
                    FunctionDescriptor.of(ValueLayout.JAVA_INT, ValueLayout.ADDRESS, ValueLayout.ADDRESS));
            try (Arena arena = Arena.ofConfined()) {
                MemorySegment info = arena.allocate(DL_INFO);
                int ok = (int) handle.invokeExact(address, info);
                if (ok == 0) {
                    return null;
                }
                MemorySegment fname = info.get((AddressLayout) DL_INFO.memberLayouts().get(0), 0);
                return fname.equals(MemorySegment.NULL) ? null : fname.reinterpret(4096).getString(0);
            }
        } catch (Throwable e) {
            // only used to describe the library; the library itself loaded fine
            return null;
        }
    }

    @Override
    public String toString() {
        // no side effect: does not load the library
        return state == null ? name + ": not resolved yet" : describe();
    }
}
