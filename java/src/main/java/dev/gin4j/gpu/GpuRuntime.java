package dev.gin4j.gpu;

import dev.gin4j.internal.gpu.NativeAccess;
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
 * otherwise CUDA is tried first, then HIP. Any other value is refused by {@link #discover()}.
 */
public final class GpuRuntime {
    /**
     * The outcome of looking for a runtime: the runtime, or null and why each candidate failed.
     *
     * @param runtime the runtime found, or null
     * @param notes one line per runtime looked for: which was used, or why not
     */
    public record Discovery(GpuRuntime runtime, List<String> notes) {
        /** {@return whether a runtime was found} */
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

    /**
     * Looks for a runtime once per process and reports what it found and why others were not used.
     * @return the runtime found, if any, and notes on each candidate
     * @throws IllegalArgumentException when GIN4J_RUNTIME / gin4j.runtime is set to neither cuda nor hip
     */
    public static Discovery discover() {
        forcedRuntime(runtimeSetting());  // checked on every call: a bad setting is never answered from the cache
        Discovery d = discovery;
        if (d == null) {
            synchronized (GpuRuntime.class) {
                d = discovery;
                if (d == null) discovery = d = probe();
            }
        }
        return d;
    }

    /**
     * The runtime, or a GpuException that says, one line per runtime, what was looked for and why
     * it was not used.
     *
     * @return the runtime
     * @throws GpuException if no runtime was found (the message has the notes of {@link #discover()})
     */
    public static GpuRuntime get() {
        Discovery d = discover();
        if (d.runtime == null) throw new GpuException("no GPU runtime found:\n  " + String.join("\n  ", d.notes));
        return d.runtime;
    }

    private static String runtimeSetting() { return System.getProperty("gin4j.runtime", System.getenv("GIN4J_RUNTIME")); }

    /**
     * The runtime a GIN4J_RUNTIME / gin4j.runtime value forces ({@code cuda} or {@code hip}), null
     * for none.
     * @throws IllegalArgumentException for any other value, naming the valid ones
     */
    static String forcedRuntime(String setting) {
        if (setting == null || setting.isBlank()) return null;
        String name = setting.trim().toLowerCase(Locale.ROOT);
        if (!name.equals("cuda") && !name.equals("hip"))
            throw new IllegalArgumentException("GIN4J_RUNTIME (or -Dgin4j.runtime) is '" + setting + "': expected cuda or hip, or unset to try CUDA, then HIP");
        return name;
    }

    private static Discovery probe() {
        NativeAccess.require();
        String forced = forcedRuntime(runtimeSetting());
        List<String> order = forced == null ? List.of("cuda", "hip") : List.of(forced);
        List<String> notes = new ArrayList<>();
        if (forced != null) notes.add("runtime forced to " + forced + " by GIN4J_RUNTIME / gin4j.runtime");
        for (String name : order) {
            NativeLibrary library = name.equals("cuda") ? NativeLibrary.CUDA : NativeLibrary.HIP;
            try {
                Driver driver = name.equals("cuda") ? CudaDriver.open() : HipDriver.open();
                if (driver.deviceCount() == 0) {
                    notes.add(driver.name() + " " + driver.versionString() + " loaded but reports no device");
                    continue;
                }
                notes.add("using " + driver.name() + " " + driver.versionString() + " (" + driver.libraryDescription() + ")");
                return new Discovery(new GpuRuntime(driver), List.copyOf(notes));
            } catch (GpuException | UnsatisfiedLinkError e) {
                // not loaded: the message is the library's own account; loaded: which library, then what failed
                notes.add(library.isAvailable() ? library.describe() + ", but " + e.getMessage() : e.getMessage());
            }
        }
        return new Discovery(null, List.copyOf(notes));
    }

    Driver driver() { return driver; }

    /** {@return the runtime's name: "CUDA driver" or "HIP"} */
    public String name() { return driver.name(); }
    /** {@return the runtime's version code (CUDA: 13000 for 13.0; HIP: its driver version)} */
    public int version() { return driver.version(); }
    /** {@return the runtime's version, readable ("13.0")} */
    public String versionString() { return driver.versionString(); }
    /** {@return which library file was loaded, and its version} */
    public String libraryDescription() { return driver.libraryDescription(); }
    /** {@return whether this is the CUDA driver (else HIP)} */
    public boolean isCuda() { return driver instanceof CudaDriver; }
    /** {@return the devices the runtime reports, by ordinal} */
    public List<Device> devices() { return devices; }

    /**
     * The device of that ordinal.
     * @param ordinal the device's index, 0-based
     * @return the device
     * @throws IllegalArgumentException for an ordinal the runtime does not report
     */
    public Device device(int ordinal) {
        if (ordinal < 0 || ordinal >= devices.size()) {
            throw new IllegalArgumentException("device " + ordinal + " does not exist: " + name() + " reports " + devices.size() + " device(s)");
        }
        return devices.get(ordinal);
    }
}
