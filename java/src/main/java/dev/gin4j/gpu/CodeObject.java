package dev.gin4j.gpu;

import dev.gin4j.internal.gpu.KernelLibrary;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.concurrent.ConcurrentHashMap;

/** A loaded GPU code object (cubin/fatbin or hsaco): the module its kernels come from. */
public final class CodeObject extends NativeResource {
    private final Device device;
    private final String name;
    private final long module;
    private final Map<String, Kernel> kernels = new ConcurrentHashMap<>();

    CodeObject(Device device, String name, byte[] image) {
        this.device = device;
        this.name = name;
        this.module = created(() -> {
            Objects.requireNonNull(image, () -> "code object '" + name + "': image is null");
            if (image.length == 0) throw new IllegalArgumentException("code object '" + name + "' is empty");
            return load(device, name, image);
        });
    }

    private static long load(Device device, String name, byte[] image) {
        try (Arena a = Arena.ofConfined()) {
            // the loaders read the image during the call only
            MemorySegment copy = a.allocate(image.length + 1L, 16);
            MemorySegment.copy(image, 0, copy, ValueLayout.JAVA_BYTE, 0, image.length);
            return device.driver().moduleLoad(device.ordinal(), copy);
        } catch (GpuException e) {
            String arch = archOf(device);
            String en = e.errorName();
            boolean wrongImage = en.contains("NO_BINARY_FOR_GPU") || en.contains("NoBinaryForGpu") || en.contains("INVALID_IMAGE")
                    || en.contains("InvalidImage") || en.contains("InvalidKernelFile") || en.contains("INVALID_PTX") || en.contains("UNSUPPORTED_PTX_VERSION");
            throw new GpuException("cannot load code object '" + name + "' on " + device + " (architecture " + arch + ")"
                    + (wrongImage ? ": its image has no code this device can run (built for another architecture?); " + KernelLibrary.rebuildHint(arch) : ""), e);
        }
    }

    private static String archOf(Device device) {
        try {
            return device.arch();
        } catch (RuntimeException e) {
            return "unknown (" + e.getMessage() + ")";
        }
    }

    /** {@return the device the code object is loaded on} */
    public Device device() { return device; }
    /** {@return the name it was loaded under} */
    public String name() { return name; }

    long module() {
        ensureOpen();
        return module;
    }

    /**
     * Looks a kernel up once; later calls return the same {@link Kernel}.
     *
     * @param kernelName the kernel's symbol name in the code object
     * @return the kernel
     * @throws GpuException if the code object has no kernel of that name (the message lists the kernels the library's manifest names)
     */
    public Kernel kernel(String kernelName) {
        ensureOpen();
        Objects.requireNonNull(kernelName, "kernel name");
        return kernels.computeIfAbsent(kernelName, k -> new Kernel(this, k, function(k)));
    }

    private long function(String kernelName) {
        try {
            return device.driver().moduleFunction(device.ordinal(), module, kernelName);
        } catch (GpuException e) {
            String arch = archOf(device);
            List<String> listed;
            try {
                listed = KernelLibrary.get().kernels(arch, name);
            } catch (RuntimeException m) {
                listed = List.of();
            }
            throw new GpuException("no kernel '" + kernelName + "' found in code object '" + name + "' on " + device + " (architecture " + arch + "); "
                    + (listed.isEmpty() ? "the kernel library's manifest lists no kernels for '" + name + "' on " + arch
                            : "the kernel library's manifest lists these kernels for '" + name + "' on " + arch + ": " + String.join(", ", listed)), e);
        }
    }

    @Override protected void release() { device.driver().moduleUnload(device.ordinal(), module); }
    @Override public String describe() { return "code object '" + name + "' on " + device; }
}
