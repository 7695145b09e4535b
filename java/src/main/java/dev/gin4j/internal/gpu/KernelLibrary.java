package dev.gin4j.internal.gpu;

import dev.gin4j.gpu.GpuException;
import dev.gin4j.gpu.CodeObject;
import dev.gin4j.gpu.Device;

import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Optional;
import java.util.Properties;
import java.util.TreeSet;

/**
 * The precompiled code objects gin4j ships ({@code gin-kernels/}): found under
 * {@code dev/gin4j/kernels/} in the folder named by {@code GIN4J_KERNELS_DIR} (or system property
 * {@code gin4j.kernels.dir}) when set, else on the class path (inside the library jar). Its
 * {@code manifest.properties} lists each object per architecture, the kernels in it and the NCCL
 * headers the NCCL-dependent objects were compiled against.
 */
public final class KernelLibrary {
    private static final String ROOT = "dev/gin4j/kernels/";
    private static volatile KernelLibrary instance;

    private final Path folder;       // null: class path
    private final Properties manifest;
    private final String problem;    // why GIN4J_KERNELS_DIR gives no manifest, or null

    /** Setup decisions, at DEBUG: where the code objects come from. */
    private static final System.Logger LOG = System.getLogger("dev.gin4j");

    private KernelLibrary(Path folder, Properties manifest, String problem) {
        this.folder = folder;
        this.manifest = manifest;
        this.problem = problem;
    }

    /** The kernel library of this process: GIN4J_KERNELS_DIR where set, else the code objects shipped in the jar. */
    public static KernelLibrary get() {
        KernelLibrary k = instance;
        if (k == null) {
            synchronized (KernelLibrary.class) {
                if (instance == null) instance = locate();
                k = instance;
            }
        }
        return k;
    }

    private static KernelLibrary locate() { return locate(System.getProperty("gin4j.kernels.dir", System.getenv("GIN4J_KERNELS_DIR"))); }

    /** The library of {@code dir} (GIN4J_KERNELS_DIR; null or empty: the jar's), logged at DEBUG. */
    public static KernelLibrary locate(String dir) {
        KernelLibrary k = find(dir);
        LOG.log(System.Logger.Level.DEBUG, () -> "kernels: " + k.source());
        return k;
    }

    private static KernelLibrary find(String dir) {
        Properties p = new Properties();
        if (dir != null && !dir.isEmpty()) {
            Path f = Path.of(dir);
            Path m = f.resolve(ROOT + "manifest.properties");
            String problem = null;
            if (!Files.isDirectory(f)) {
                problem = "GIN4J_KERNELS_DIR names " + f.toAbsolutePath() + ", which is missing (" + (Files.exists(f) ? "not a folder" : "no such folder")
                        + "); expected a kernel build's resources folder (gin-kernels/out/resources), or unset it to use the kernels in the jar";
            } else if (!Files.isRegularFile(m)) {
                problem = "GIN4J_KERNELS_DIR names " + f.toAbsolutePath() + ", which has no " + ROOT + "manifest.properties; expected a kernel build's resources folder (gin-kernels/out/resources)";
            } else {
                try (InputStream in = Files.newInputStream(m)) {
                    p.load(in);
                } catch (IOException e) {
                    throw new UncheckedIOException("cannot read " + m, e);
                }
            }
            return new KernelLibrary(f, p, problem);
        }
        try (InputStream in = resource(ROOT + "manifest.properties")) {
            if (in != null) p.load(in);
        } catch (IOException e) {
            throw new UncheckedIOException("cannot read the kernel manifest", e);
        }
        return new KernelLibrary(null, p, null);
    }

    // through the module: a named module's resources are not visible through its class loader
    private static InputStream resource(String name) throws IOException {
        return KernelLibrary.class.getModule().getResourceAsStream(name);
    }

    /** Where code objects are read from, for messages. */
    public String source() {
        return folder != null ? folder.resolve(ROOT) + " (GIN4J_KERNELS_DIR)" : "the class path (" + ROOT + ")";
    }

    /** Whether the library carries a manifest (which kernels each code object holds). */
    public boolean hasManifest() { return !manifest.isEmpty(); }

    /** Why the folder GIN4J_KERNELS_DIR names gives no code objects (missing, or no manifest in it), if so. */
    public Optional<String> folderProblem() { return Optional.ofNullable(problem); }
    /** The manifest as read (empty where there is none). */
    public Properties manifest() { return manifest; }

    /** A manifest value, if present. */
    public Optional<String> property(String key) { return Optional.ofNullable(manifest.getProperty(key)); }

    /**
     * The problem, if the code objects were not compiled with version {@code expected} of an
     * argument header's ABI ({@code macro}, e.g. {@code MOE_NET_ABI_VERSION}: gin-kernels/build
     * writes {@code abi.<macro>} from gin-kernels/abi/): a struct whose size changed is caught at
     * launch by the parameter sizes, one whose fields moved or changed meaning only here. Empty
     * where it matches, or where there is no manifest (then no code object loads at all).
     */
    public Optional<String> abiMismatch(String macro, int expected) {
        if (!hasManifest()) return Optional.empty();
        String built = manifest.getProperty("abi." + macro);
        if (String.valueOf(expected).equals(built)) return Optional.empty();
        return Optional.of("the code objects in " + source() + (built == null ? " name no " + macro + " (a build older than this library)" : " were built with "
                + macro + " " + built) + ", this library's is " + expected + ": the kernels and the jar come from different builds (rebuild the kernels with "
                + "gin-kernels/build, or unset GIN4J_KERNELS_DIR to use the jar's own)");
    }

    /** Architectures with at least one code object. */
    public List<String> architectures() {
        TreeSet<String> archs = new TreeSet<>();
        for (String k : manifest.stringPropertyNames()) {
            String[] parts = k.split("\\.");
            if (parts.length == 3 && parts[0].equals("object")) archs.add(parts[1]);
        }
        return new ArrayList<>(archs);
    }

    /** Code object names shipped for {@code arch}. */
    public List<String> objects(String arch) {
        TreeSet<String> names = new TreeSet<>();
        String prefix = "object." + arch + ".";
        for (String k : manifest.stringPropertyNames()) {
            if (k.startsWith(prefix) && k.indexOf('.', prefix.length()) < 0) names.add(k.substring(prefix.length()));
        }
        return new ArrayList<>(names);
    }

    /** The kernels the manifest lists for an object. */
    public List<String> kernels(String arch, String object) {
        String v = manifest.getProperty("object." + arch + "." + object + ".kernels", "");
        return v.isEmpty() ? List.of() : List.of(v.split(","));
    }

    /** How to build code objects for {@code arch} (gin-kernels/build takes NVIDIA architectures by name; AMD is gfx942 only). */
    public static String rebuildHint(String arch) {
        if (arch.startsWith("sm_")) return "rebuild with gin-kernels/build --arch " + arch;
        if (arch.equals("gfx942")) return "rebuild with gin-kernels/build --amd";
        return "gin-kernels/build makes code objects for NVIDIA sm_NN and AMD gfx942 only, not " + arch;
    }

    /** The bytes of an object for {@code arch}, or an exception that says what ships. */
    public byte[] read(String arch, String object) {
        String rel = manifest.getProperty("object." + arch + "." + object);
        if (rel == null) {
            throw new GpuException("no code object '" + object + "' for " + arch + " in " + source()
                    + (hasManifest() ? "; it ships objects for " + architectures() : problem != null ? "; " + problem : "; no manifest found: build the kernels with gin-kernels/build")
                    + "; " + rebuildHint(arch));
        }
        try {
            if (folder != null) return Files.readAllBytes(folder.resolve(ROOT + rel));
            try (InputStream in = resource(ROOT + rel)) {
                if (in == null) throw new GpuException("manifest names " + ROOT + rel + " but it is not on the class path");
                return in.readAllBytes();
            }
        } catch (IOException e) {
            throw new UncheckedIOException("cannot read code object " + rel + " from " + source(), e);
        }
    }

    /** A file of the library by its path under dev/gin4j/kernels/ (e.g. the kernel sources, src/...). */
    public byte[] readResource(String rel) {
        try {
            if (folder != null) return Files.readAllBytes(folder.resolve(ROOT + rel));
            try (InputStream in = resource(ROOT + rel)) {
                if (in == null) throw new GpuException("the manifest names " + ROOT + rel + " but it is not on the class path");
                return in.readAllBytes();
            }
        } catch (IOException e) {
            throw new UncheckedIOException("cannot read " + rel + " from " + source(), e);
        }
    }

    /** Loads the code object {@code object} shipped with gin4j for {@code device}'s architecture. */
    public static CodeObject load(Device device, String object) {
        return device.loadCodeObject(object, get().read(device.arch(), object));
    }
}
