package dev.gin4j.cli;

import dev.gin4j.comm.Capabilities;
import dev.gin4j.comm.CommGroup;
import dev.gin4j.gpu.Device;
import dev.gin4j.gpu.GpuRuntime;
import dev.gin4j.internal.gpu.KernelLibrary;

import java.io.PrintStream;
import java.util.List;

/** {@code gin4j info}: what gin4j finds on this machine. Always exits 0 when nothing is broken in gin4j itself. */
final class Info {
    private Info() {}

    /** How CommGroup will make communicators here (from the environment), or what is wrong with the settings. */
    static String communicatorSettings(java.util.Map<String, String> env) {
        try {
            CommGroup.Options o = CommGroup.Options.fromEnvironment(env);
            return "communicators: " + (o.nonblocking() ? "nonblocking, NCCL's collective host calls bounded too" : "blocking (GIN4J_COMM_NONBLOCKING=1 bounds NCCL's collective host calls too)")
                    + "; host waits end after " + o.hostWaitTimeout().toSeconds() + " s (GIN4J_COMM_TIMEOUT_S)";
        } catch (IllegalArgumentException e) {
            return "communicator settings refused: " + e.getMessage();
        }
    }

    /** Prints the report as text, or as JSON ({@code info --json}). */
    static int run(PrintStream out, boolean json) {
        InfoReport r = collect(System.getenv());
        out.print(json ? r.json() : r.text());
        return 0;
    }

    static InfoReport collect(java.util.Map<String, String> env) {
        GpuRuntime.Discovery d = GpuRuntime.discover();
        InfoReport r = new InfoReport();
        r.section("gin4j", "gin4j " + version()).put("version", version(), null);
        r.line("");
        KernelLibrary kernels = KernelLibrary.get();
        if (!d.found()) {
            InfoReport.Section gpu = r.section("gpu_runtime", "GPU runtime: none found").put("found", false, null);
            d.notes().forEach(n -> gpu.note("notes", "  - ", n));
            r.line("");
            collectiveLibrary(r, null, env);
            r.line("");
            printKernels(r, kernels, null);
            r.line("");
            gpu.put("hint", "Set GIN4J_CUDA_LIBRARY / GIN4J_HIP_LIBRARY to a library path to use another one",
                    "No GPU here: gin4j looked for the CUDA driver and HIP as listed above. Set GIN4J_CUDA_LIBRARY / GIN4J_HIP_LIBRARY to a library path to use another one.");
            return r;
        }
        GpuRuntime rt = d.runtime();
        InfoReport.Section gpu = r.section("gpu_runtime", null).put("found", true, null)
                .put("name", rt.name(), null).put("version", rt.versionString(), null)
                .put("version_code", rt.version(), "GPU runtime: " + rt.name() + " " + rt.versionString() + " (version code " + rt.version() + ")")
                .put("library", rt.libraryDescription(), "  library: " + rt.libraryDescription());
        d.notes().stream().filter(n -> !n.startsWith("using ")).forEach(n -> gpu.note("notes", "  note: ", n));
        List<Device> devices = rt.devices();
        r.line("Devices: " + devices.size());
        List<java.util.Map<String, Object>> listed = r.list("devices");
        for (Device dev : devices) {
            java.util.Map<String, Object> one = new java.util.LinkedHashMap<>();
            one.put("ordinal", dev.ordinal());
            one.put("name", dev.name());
            one.put("arch", dev.arch());
            one.put("memory_bytes", dev.totalMemory());
            one.put("multiprocessors", dev.multiprocessors());
            one.put("pci_bus_id", dev.pciBusId());
            r.line(String.format(java.util.Locale.ROOT, "  [%d] %s  arch %s  %.1f GiB  %d multiprocessors  PCI %s", dev.ordinal(), dev.name(), dev.arch(),
                    dev.totalMemory() / (1024.0 * 1024 * 1024), dev.multiprocessors(), dev.pciBusId()));
            List<java.util.Map<String, Object>> peers = new java.util.ArrayList<>();
            for (Device peer : devices) {
                if (peer == dev) continue;
                String link = dev.linkKind(peer);
                peers.add(java.util.Map.of("ordinal", peer.ordinal(), "link", link));
                r.line("      peer [" + peer.ordinal() + "]: " + link);
            }
            one.put("peers", peers);
            listed.add(one);
        }
        r.line("");
        collectiveLibrary(r, devices, env);
        r.line("");
        printKernels(r, kernels, devices);
        return r;
    }

    /**
     * The collective library: what is loaded, what it can do over {@code devices} (null: no GPU,
     * not probed), how communicators will be made.
     */
    private static void collectiveLibrary(InfoReport r, List<Device> devices, java.util.Map<String, String> env) {
        String library = Capabilities.describeLibrary();
        InfoReport.Section nccl = r.section("collective_library", null).put("library", library, "Collective library: " + library);
        if (devices != null) {
            Capabilities caps = Capabilities.probe(devices);
            nccl.put("loaded", caps.loaded(), null).put("version", caps.version(), null).put("symmetric_windows", caps.windows(), null)
                    .put("device_api", caps.deviceApi(), null).put("gin", caps.gin(), null)
                    .put("gin_type", caps.ginType(), null).put("gin_plugin", caps.ginPlugin(), null);
            caps.report().lines().forEach(l -> nccl.note("notes", "  ", l));
        }
        String comms = communicatorSettings(env);
        nccl.put("communicators", comms, "  " + comms);
    }

    private static void printKernels(InfoReport r, KernelLibrary kernels, List<Device> devices) {
        InfoReport.Section k = r.section("kernels", null).put("source", kernels.source(), "Kernel code objects: from " + kernels.source());
        if (kernels.folderProblem().isPresent()) {
            k.put("problem", kernels.folderProblem().get(), "  MISSING: " + kernels.folderProblem().get());
            return;
        }
        if (!kernels.hasManifest()) {
            k.put("problem", "no manifest", "  none (no manifest): build them with gin-kernels/build, or point GIN4J_KERNELS_DIR at a build's resources folder");
            return;
        }
        kernels.property("kernels.built").ifPresent(v -> k.put("built", v, "  built: " + v));
        kernels.property("nccl.version").ifPresent(v -> k.put("nccl_version", v, "  NCCL device-API objects built against NCCL headers " + v
                + kernels.property("nccl.include").map(i -> " (" + i + ")").orElse("")));
        kernels.property("nccl.include").ifPresent(i -> k.put("nccl_include", i, null));
        // the cross-node MoE kernels' argument ABI: a kernel folder of another build is refused there
        String netAbi = kernels.abiMismatch("MOE_NET_ABI_VERSION", dev.gin4j.bindings.moenet.moe_net_h.MOE_NET_ABI_VERSION()).map(m -> "MISMATCH: " + m).orElse("matches this library");
        k.put("moe_net_abi", netAbi, "  cross-node MoE argument ABI: " + netAbi);
        InfoReport.Section archs = k.child("architectures");
        for (String arch : kernels.architectures()) {
            archs.put(arch, kernels.objects(arch), "  " + arch + ": " + String.join(", ", kernels.objects(arch)));
        }
        if (devices != null) {
            InfoReport.Section here = k.child("for_this_machine");
            devices.stream().map(Device::arch).distinct().forEach(a -> here.put(a, !kernels.objects(a).isEmpty(), "  for this machine's " + a + ": "
                    + (kernels.objects(a).isEmpty() ? "NONE shipped (" + KernelLibrary.rebuildHint(a) + ")" : "shipped")));
            // MoE shapes outside gin-kernels/moe_shapes.list: compiled on first use, or the generic entry
            devices.stream().map(Device::arch).distinct().forEach(a -> here.put(a + "_shaped_moe", dev.gin4j.internal.moe.ShapedEntries.unavailable(a).isEmpty(),
                    "  " + a + ": " + dev.gin4j.internal.moe.ShapedEntries.describe(a)));
        }
    }

    static String version() {
        String v = Info.class.getPackage().getImplementationVersion();
        return v != null ? v : "0.1.0-SNAPSHOT";
    }
}
