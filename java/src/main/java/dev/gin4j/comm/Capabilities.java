package dev.gin4j.comm;

import dev.gin4j.internal.comm.DeviceComm;
import dev.gin4j.internal.comm.NcclDeviceAbi;
import dev.gin4j.bindings.NativeLibrary;
import dev.gin4j.bindings.nccl.ncclCommProperties;
import dev.gin4j.bindings.nccl.nccl_h;
import dev.gin4j.gpu.Device;

import java.io.File;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.List;

/**
 * What the loaded collective library can do here: symmetric windows, the device API (device
 * communicators, LSA) and GIN. Found by asking the library and, where it has no query for it
 * (NCCL 2.28), by trying on a throw-away communicator over the given devices.
 *
 * @param loaded whether NCCL or RCCL was loaded (false: every other finding is false or none)
 * @param version the library's NCCL_VERSION_CODE, or 0 when none was loaded
 * @param windows whether the library exports symmetric windows (ncclMemAlloc and ncclCommWindowRegister)
 * @param deviceApi whether a device communicator could be created over the given devices
 * @param gin whether a device communicator with GIN signals could be created (GIN across nodes)
 * @param ginType the GIN type NCCL reports ({@link #ginType}), or "not probed"
 * @param ginPlugin the GIN plugin setting and file ({@link #describeGinPlugin()})
 * @param notes a summary line, then one line per finding ({@link #report()})
 */
public record Capabilities(boolean loaded, int version, boolean windows, boolean deviceApi, boolean gin, String ginType, String ginPlugin, List<String> notes) {

    /** {@return the collective library found (NCCL or RCCL), its version and file, or why none was loaded} */
    public static String describeLibrary() {
        if (!Nccl.isAvailable()) return "none loaded: " + Nccl.describe();
        return Nccl.flavour() + " " + Nccl.versionString(Nccl.version()) + " (" + Nccl.describe() + ")";
    }

    /** {@return the RDMA devices the kernel exposes (/sys/class/infiniband); GIN across nodes needs one} */
    public static List<String> rdmaDevices() {
        String[] names = new File("/sys/class/infiniband").list();
        return names == null ? List.of() : List.of(names);
    }

    /**
     * What the library and the devices allow: peer access, LSA, GIN.
     *
     * @param devices local GPUs to try a throw-away communicator on (none: the library is only asked)
     * @return the findings
     */
    public static Capabilities probe(List<Device> devices) {
        List<String> notes = new ArrayList<>();
        if (!Nccl.isAvailable()) {
            notes.add("collective library not loaded");
            return new Capabilities(false, 0, false, false, false, "none", describeGinPlugin(), notes);
        }
        int version = Nccl.version();
        boolean windows = NativeLibrary.NCCL.find("ncclCommWindowRegister").isPresent() && NativeLibrary.NCCL.find("ncclMemAlloc").isPresent();
        boolean devApi = NativeLibrary.NCCL.find("ncclDevCommCreate").isPresent();
        notes.add("symmetric windows (ncclMemAlloc + ncclCommWindowRegister): " + (windows ? "exported" : "not exported (needs NCCL >= 2.27)"));
        notes.add("device API (ncclDevCommCreate): " + (devApi ? "exported" : "not exported (needs NCCL >= 2.28)"));
        notes.add("LSA (Backend.GIN inside one node: all-to-all, all-to-all-v, MoE): needs no NCCL device API and no particular NCCL version;"
                + " gin4j maps the peers' windows itself (one process: peer access; one process per GPU: CUDA/HIP IPC handles exchanged over the group)");
        String ginVersion = DeviceComm.ginVersionProblem(version);
        notes.add("GIN across nodes: needs NCCL >= " + Nccl.versionString(DeviceComm.GIN_MIN_VERSION) + ", kernels built against its headers and a GIN-capable"
                + " network or plugin; loaded NCCL " + Nccl.versionString(version) + (ginVersion == null ? " is new enough" : " is too old for it"));
        boolean abiOk = false;
        try {
            NcclDeviceAbi.forLoadedLibrary();
            abiOk = true;
            notes.add("device-API kernels (GIN across nodes only): built for this NCCL version");
        } catch (CommException e) {
            notes.add("device-API kernels (GIN across nodes only): " + e.getMessage());
        }
        List<String> rdma = rdmaDevices();
        boolean gin = false;
        boolean devApiWorks = false;
        String ginType = "not probed", ginPlugin = null;
        if (devApi && windows && abiOk && !devices.isEmpty()) {
            try (CommGroup g = CommGroup.initAll(devices)) {
                try (DeviceComm dc = DeviceComm.create(g, new DeviceComm.Requirements(1, 0, 0))) {
                    devApiWorks = true;
                    notes.add("device communicator with LSA barriers over " + devices.size() + " local GPU(s): created");
                }
                ginType = ginType(g.rank(0));
                ginPlugin = describeGinPlugin();  // after init: NCCL has loaded it
                notes.add("GIN type NCCL reports: " + ginType + "; GIN plugin: " + ginPlugin);
                if (!"none".equals(ginType) && !ginType.startsWith("unknown")) {
                    try (DeviceComm dc = DeviceComm.create(g, new DeviceComm.Requirements(1, 1, 0, true))) {
                        gin = true;
                        notes.add("GIN: device communicator with GIN signals created");
                    } catch (CommException e) {
                        notes.add("GIN: not available: " + e.getMessage());
                    }
                } else if (rdma.isEmpty()) {
                    notes.add("GIN: not available: no RDMA device (/sys/class/infiniband is empty) and no GIN plugin NCCL could use;"
                            + " intranode LSA only (a machine without RDMA runs GIN through the loopback test transport: docs/gin-loopback.md)");
                }
            } catch (RuntimeException e) {
                notes.add("trying a device communicator failed: " + e.getMessage());
            }
        }
        if (ginPlugin == null) {
            ginPlugin = describeGinPlugin();
            notes.add("GIN plugin: " + ginPlugin);
        }
        List<String> summary = new ArrayList<>();
        summary.add("version " + Nccl.versionString(version) + "; symmetric windows: " + (windows ? "yes" : "no") + "; device API: "
                + (devApiWorks ? "yes" : devApi ? "exported, not usable here (see below)" : "no") + "; GIN: " + (gin ? "yes" : "no"));
        summary.addAll(notes);
        return new Capabilities(true, version, windows, devApiWorks, gin, ginType, ginPlugin, summary);
    }

    /** {@return the findings, one per line} */
    public String report() { return String.join("\n", notes); }

    /**
     * The GIN type NCCL reports for this communicator (ncclCommQueryProperties): "none", "proxy"
     * (the CPU's proxy thread posts the GPU's puts: NCCL's own IB proxy, or a plugin such as the
     * loopback transport) or "GDAKI" (the GPU drives the NIC). NCCL before 2.29 has no such query.
     *
     * @param c an open communicator
     * @return the GIN type, or why it cannot be asked
     */
    public static String ginType(Communicator c) {
        if (Nccl.version() < 22900) return "none (NCCL " + Nccl.versionString(Nccl.version()) + " has no GIN plugins; 2.29.7 or newer does)";
        try (Arena a = Arena.ofConfined()) {
            MemorySegment props = a.allocate(ncclCommProperties.layout());
            ncclCommProperties.size(props, ncclCommProperties.layout().byteSize());
            ncclCommProperties.magic(props, 0xcafebeef);  // NCCL_API_MAGIC
            ncclCommProperties.version(props, Nccl.version());
            c.device().makeCurrent();
            Nccl.check("ncclCommQueryProperties", nccl_h.ncclCommQueryProperties(c.handle(), props), c.handle());
            return switch (ncclCommProperties.ginType(props)) {
                case 0 -> "none";
                case 2 -> "proxy";
                case 3 -> "GDAKI";
                default -> "unknown (" + ncclCommProperties.ginType(props) + ")";
            };
        }
    }

    /**
     * What NCCL_GIN_PLUGIN names and, where NCCL loaded one, the GIN plugin file mapped into this
     * process; with what is wrong with the setting, if anything ({@link #ginPluginProblem()}).
     *
     * @return the setting, the loaded plugin and any problem, in one line
     */
    public static String describeGinPlugin() {
        String setting = System.getenv("NCCL_GIN_PLUGIN");
        String loaded = loadedGinPlugin();
        String problem = ginPluginProblem();
        return (setting == null ? "NCCL_GIN_PLUGIN unset (NCCL tries libnccl-gin.so, then its built-in InfiniBand GIN)" : "NCCL_GIN_PLUGIN=" + setting)
                + (loaded != null ? "; loaded: " + loaded : "") + (problem != null ? "; " + problem : "");
    }

    /** A GIN plugin library mapped into this process (NCCL dlopen-ed it), or null. */
    static String loadedGinPlugin() {
        try {
            return java.nio.file.Files.readAllLines(java.nio.file.Path.of("/proc/self/maps")).stream()
                    .map(l -> l.substring(l.lastIndexOf(' ') + 1)).filter(f -> f.contains("libnccl-gin")).findFirst().orElse(null);
        } catch (java.io.IOException | RuntimeException e) {
            return null;
        }
    }

    /**
     * Why NCCL_GIN_PLUGIN cannot give NCCL a GIN plugin, or null where nothing is visibly wrong: a
     * path that does not exist, or a library that exports neither ncclGinPlugin_v12 nor
     * ncclGinPlugin_v11, the interfaces NCCL 2.29 loads. NCCL itself only logs such a plugin and
     * goes on without it.
     *
     * @return what is wrong with NCCL_GIN_PLUGIN, or null
     */
    public static String ginPluginProblem() { return ginPluginProblem(System.getenv("NCCL_GIN_PLUGIN")); }

    /** {@link #ginPluginProblem()} for the given NCCL_GIN_PLUGIN value (null: unset). */
    static String ginPluginProblem(String setting) {
        if (setting == null || setting.isBlank() || setting.equalsIgnoreCase("none") || !setting.contains("/")) return null;
        for (String part : setting.split(",")) {
            java.nio.file.Path path = java.nio.file.Path.of(part.trim());
            if (!java.nio.file.Files.isRegularFile(path))
                return "NCCL_GIN_PLUGIN names " + path + ", which does not exist: NCCL then has no GIN plugin (build the loopback transport with gin-kernels/loopback/build)";
            try {
                java.lang.foreign.SymbolLookup lib = java.lang.foreign.SymbolLookup.libraryLookup(path, Arena.global());
                if (lib.find("ncclGinPlugin_v12").isEmpty() && lib.find("ncclGinPlugin_v11").isEmpty())
                    return path + " exports neither ncclGinPlugin_v12 nor ncclGinPlugin_v11, the GIN plugin interfaces NCCL 2.29 loads: it was built for another NCCL version";
            } catch (IllegalArgumentException e) {
                return "NCCL_GIN_PLUGIN names " + path + ", which cannot be loaded: " + e.getMessage();
            }
        }
        return null;
    }
}
