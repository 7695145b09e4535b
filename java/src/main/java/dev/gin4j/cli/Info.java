package dev.gin4j.cli;

import dev.gin4j.comm.Capabilities;
import dev.gin4j.comm.CommGroup;
import dev.gin4j.gpu.Device;
import dev.gin4j.gpu.GpuRuntime;
import dev.gin4j.gpu.KernelLibrary;

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

    static int run(PrintStream out) {
        GpuRuntime.Discovery d = GpuRuntime.discover();
        out.println("gin4j " + version());
        out.println();
        KernelLibrary kernels = KernelLibrary.get();
        if (!d.found()) {
            out.println("GPU runtime: none found");
            d.notes().forEach(n -> out.println("  - " + n));
            out.println();
            out.println("Collective library: " + Capabilities.describeLibrary());
            out.println("  " + communicatorSettings(System.getenv()));
            out.println();
            printKernels(out, kernels, null);
            out.println();
            out.println("No GPU here: gin4j looked for the CUDA driver and HIP as listed above. Set GIN4J_CUDA_LIBRARY / GIN4J_HIP_LIBRARY to a library path to use another one.");
            return 0;
        }
        GpuRuntime rt = d.runtime();
        out.println("GPU runtime: " + rt.name() + " " + rt.versionString() + " (version code " + rt.version() + ")");
        out.println("  library: " + rt.libraryDescription());
        d.notes().stream().filter(n -> !n.startsWith("using ")).forEach(n -> out.println("  note: " + n));
        List<Device> devices = rt.devices();
        out.println("Devices: " + devices.size());
        for (Device dev : devices) {
            out.printf("  [%d] %s  arch %s  %.1f GiB  %d multiprocessors  PCI %s%n", dev.ordinal(), dev.name(), dev.arch(),
                    dev.totalMemory() / (1024.0 * 1024 * 1024), dev.multiprocessors(), dev.pciBusId());
            for (Device peer : devices) {
                if (peer != dev) out.println("      peer [" + peer.ordinal() + "]: " + dev.linkKind(peer));
            }
        }
        out.println();
        out.println("Collective library: " + Capabilities.describeLibrary());
        Capabilities.probe(devices).report().lines().forEach(l -> out.println("  " + l));
        out.println("  " + communicatorSettings(System.getenv()));
        out.println();
        printKernels(out, kernels, devices);
        return 0;
    }

    private static void printKernels(PrintStream out, KernelLibrary kernels, List<Device> devices) {
        out.println("Kernel code objects: from " + kernels.source());
        if (!kernels.hasManifest()) {
            out.println("  none (no manifest): build them with gin-kernels/build, or point GIN4J_KERNELS_DIR at a build's resources folder");
            return;
        }
        kernels.property("kernels.built").ifPresent(v -> out.println("  built: " + v));
        kernels.property("nccl.version").ifPresent(v -> out.println("  NCCL device-API objects built against NCCL headers " + v
                + kernels.property("nccl.include").map(i -> " (" + i + ")").orElse("")));
        for (String arch : kernels.architectures()) {
            out.println("  " + arch + ": " + String.join(", ", kernels.objects(arch)));
        }
        if (devices != null) {
            devices.stream().map(Device::arch).distinct().forEach(a -> out.println("  for this machine's " + a + ": "
                    + (kernels.objects(a).isEmpty() ? "NONE shipped (" + KernelLibrary.rebuildHint(a) + ")" : "shipped")));
        }
    }

    static String version() {
        String v = Info.class.getPackage().getImplementationVersion();
        return v != null ? v : "0.1.0-SNAPSHOT";
    }
}
