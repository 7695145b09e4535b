package dev.gin4j.comm;

import dev.gin4j.bindings.NativeLibrary;
import dev.gin4j.gpu.Device;

import java.io.File;
import java.util.ArrayList;
import java.util.List;

/**
 * What the loaded collective library can do here: symmetric windows, the device API (device
 * communicators, LSA) and GIN. Found by asking the library and, where it has no query for it
 * (NCCL 2.28), by trying on a throw-away communicator over the given devices.
 */
public record Capabilities(boolean loaded, int version, boolean windows, boolean deviceApi, boolean gin, List<String> notes) {

    public static String describeLibrary() {
        if (!Nccl.isAvailable()) return "none loaded: " + Nccl.describe();
        return Nccl.flavour() + " " + Nccl.versionString(Nccl.version()) + " (" + Nccl.describe() + ")";
    }

    /** RDMA devices the kernel exposes; GIN across nodes needs one. */
    public static List<String> rdmaDevices() {
        String[] names = new File("/sys/class/infiniband").list();
        return names == null ? List.of() : List.of(names);
    }

    public static Capabilities probe(List<Device> devices) {
        List<String> notes = new ArrayList<>();
        if (!Nccl.isAvailable()) {
            notes.add("collective library not loaded");
            return new Capabilities(false, 0, false, false, false, notes);
        }
        int version = Nccl.version();
        boolean windows = NativeLibrary.NCCL.find("ncclCommWindowRegister").isPresent() && NativeLibrary.NCCL.find("ncclMemAlloc").isPresent();
        boolean devApi = NativeLibrary.NCCL.find("ncclDevCommCreate").isPresent();
        notes.add("symmetric windows (ncclMemAlloc + ncclCommWindowRegister): " + (windows ? "exported" : "not exported (needs NCCL >= 2.27)"));
        notes.add("device API (ncclDevCommCreate): " + (devApi ? "exported" : "not exported (needs NCCL >= 2.28)"));
        boolean abiOk = false;
        try {
            NcclDeviceAbi.forLoadedLibrary();
            abiOk = true;
            notes.add("device-API kernels: built for this NCCL version");
        } catch (CommException e) {
            notes.add("device-API kernels: " + e.getMessage());
        }
        List<String> rdma = rdmaDevices();
        boolean gin = false;
        if (rdma.isEmpty()) {
            notes.add("GIN: not available: no RDMA device (/sys/class/infiniband is empty), so NCCL cannot start GPU-initiated networking; intranode LSA only");
        }
        boolean devApiWorks = false;
        if (devApi && windows && abiOk && !devices.isEmpty()) {
            try (CommGroup g = CommGroup.initAll(devices)) {
                try (DeviceComm dc = DeviceComm.create(g, new DeviceComm.Requirements(1, 0, 0))) {
                    devApiWorks = true;
                    notes.add("device communicator with LSA barriers over " + devices.size() + " local GPU(s): created");
                }
                if (!rdma.isEmpty()) {
                    try (DeviceComm dc = DeviceComm.create(g, new DeviceComm.Requirements(1, 1, 0))) {
                        gin = true;
                        notes.add("GIN: device communicator with GIN signals created");
                    } catch (CommException e) {
                        notes.add("GIN: not available: " + e.getMessage());
                    }
                }
            } catch (RuntimeException e) {
                notes.add("trying a device communicator failed: " + e.getMessage());
            }
        }
        List<String> summary = new ArrayList<>();
        summary.add("version " + Nccl.versionString(version) + "; symmetric windows: " + (windows ? "yes" : "no") + "; device API: "
                + (devApiWorks ? "yes" : devApi ? "exported, not usable here (see below)" : "no") + "; GIN: " + (gin ? "yes" : "no"));
        summary.addAll(notes);
        return new Capabilities(true, version, windows, devApiWorks, gin, summary);
    }

    public String report() { return String.join("\n", notes); }
}
