package dev.gin4j.gpu;

import dev.gin4j.bindings.NativeLibrary;
import dev.gin4j.gpu.cuda.CudaDriver;
import dev.gin4j.gpu.driver.Driver;
import dev.gin4j.gpu.hip.HipDriver;

import java.util.ArrayList;
import java.util.List;
import java.util.Locale;

/**
 * The GPU runtime found on this machine: the CUDA driver ({@code libcuda}) or HIP
 * ({@code libamdhip64}). Chosen once per process: the environment variable {@code GIN4J_RUNTIME}
 * (or system property {@code gin4j.runtime}) set to {@code cuda} or {@code hip} forces one;
 * otherwise CUDA is tried first, then HIP.
 */
public final class GpuRuntime {
    /** The outcome of looking for a runtime: the runtime, or null and why each candidate failed. */
    public record Discovery(GpuRuntime runtime, List<String> notes) {
        public boolean found() { return runtime != null; }
    }

    private static volatile Discovery discovery;

    private final Driver driver;
    private final List<Device> devices;

    private GpuRuntime(Driver driver) {
        this.driver = driver;
        List<Device> list = new ArrayList<>();
        for (int i = 0; i < driver.deviceCount(); i++) list.add(new Device(this, i));
        this.devices = List.copyOf(list);
    }

    /** Looks for a runtime once per process and reports what it found and why others were not used. */
    public static Discovery discover() {
        Discovery d = discovery;
        if (d == null) {
            synchronized (GpuRuntime.class) {
                d = discovery;
                if (d == null) discovery = d = probe();
            }
        }
        return d;
    }

    /** The runtime, or a GpuException that says what was looked for and where. */
    public static GpuRuntime get() {
        Discovery d = discover();
        if (d.runtime == null) throw new GpuException("no GPU runtime found: " + String.join("; ", d.notes));
        return d.runtime;
    }

    private static Discovery probe() {
        NativeAccess.require();
        String forced = System.getProperty("gin4j.runtime", System.getenv("GIN4J_RUNTIME"));
        List<String> order = forced == null ? List.of("cuda", "hip") : List.of(forced.toLowerCase(Locale.ROOT));
        List<String> notes = new ArrayList<>();
        if (forced != null) notes.add("runtime forced to '" + forced + "' by GIN4J_RUNTIME / gin4j.runtime");
        for (String name : order) {
            try {
                Driver driver = switch (name) {
                    case "cuda" -> CudaDriver.open();
                    case "hip" -> HipDriver.open();
                    default -> throw new IllegalArgumentException("unknown runtime '" + name + "': expected cuda or hip");
                };
                if (driver.deviceCount() == 0) {
                    notes.add(driver.name() + " " + driver.versionString() + " loaded but reports no device");
                    continue;
                }
                notes.add("using " + driver.name() + " " + driver.versionString() + " (" + driver.libraryDescription() + ")");
                return new Discovery(new GpuRuntime(driver), List.copyOf(notes));
            } catch (GpuException | IllegalArgumentException | UnsatisfiedLinkError e) {
                notes.add(name + ": " + e.getMessage());
            }
        }
        if (forced == null) {
            notes.add("looked for the CUDA driver (GIN4J_CUDA_LIBRARY, else libcuda.so.1 through the system loader) and HIP (GIN4J_HIP_LIBRARY, else libamdhip64.so*): "
                    + NativeLibrary.CUDA.describe() + " | " + NativeLibrary.HIP.describe());
        }
        return new Discovery(null, List.copyOf(notes));
    }

    Driver driver() { return driver; }

    /** "CUDA driver" or "HIP". */
    public String name() { return driver.name(); }
    public int version() { return driver.version(); }
    public String versionString() { return driver.versionString(); }
    public String libraryDescription() { return driver.libraryDescription(); }
    public boolean isCuda() { return driver instanceof CudaDriver; }
    public List<Device> devices() { return devices; }

    public Device device(int ordinal) {
        if (ordinal < 0 || ordinal >= devices.size()) {
            throw new IllegalArgumentException("device " + ordinal + " does not exist: " + name() + " reports " + devices.size() + " device(s)");
        }
        return devices.get(ordinal);
    }
}
