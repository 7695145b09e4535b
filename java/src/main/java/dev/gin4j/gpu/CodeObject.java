package dev.gin4j.gpu;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;

/** A loaded GPU code object (cubin/fatbin or hsaco): the module its kernels come from. */
public final class CodeObject extends NativeResource {
    private final Device device;
    private final String name;
    private final long module;
    private final Map<String, Kernel> kernels = new ConcurrentHashMap<>();

    CodeObject(Device device, String name, byte[] image) {
        if (image.length == 0) throw new IllegalArgumentException("code object '" + name + "' is empty");
        this.device = device;
        this.name = name;
        try (Arena a = Arena.ofConfined()) {
            // the loaders read the image during the call only
            MemorySegment copy = a.allocate(image.length + 1L, 16);
            MemorySegment.copy(image, 0, copy, java.lang.foreign.ValueLayout.JAVA_BYTE, 0, image.length);
            this.module = device.driver().moduleLoad(device.ordinal(), copy);
        }
    }

    public Device device() { return device; }
    public String name() { return name; }

    long module() {
        ensureOpen();
        return module;
    }

    /** Looks a kernel up once; later calls return the same {@link Kernel}. */
    public Kernel kernel(String kernelName) {
        ensureOpen();
        return kernels.computeIfAbsent(kernelName, k -> new Kernel(this, k, device.driver().moduleFunction(device.ordinal(), module, k)));
    }

    @Override protected void release() { device.driver().moduleUnload(device.ordinal(), module); }
    @Override public String describe() { return "code object '" + name + "' on " + device; }
}
