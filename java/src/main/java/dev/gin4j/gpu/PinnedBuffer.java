package dev.gin4j.gpu;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;

/**
 * Page-locked host memory: {@link #host()} is an ordinary readable and writable host segment, and
 * {@link #deviceAddress()} is where kernels on the device see the same bytes.
 */
public final class PinnedBuffer {
    private final Device device;
    private final MemorySegment host;
    private final long deviceAddress;

    private PinnedBuffer(Device device, MemorySegment host, long deviceAddress) {
        this.device = device;
        this.host = host;
        this.deviceAddress = deviceAddress;
    }

    static PinnedBuffer allocate(Device device, long bytes, Arena arena) {
        if (bytes < 0) throw new IllegalArgumentException("cannot allocate " + bytes + " bytes: size must be >= 0");
        if (!arena.scope().isAlive()) throw new IllegalStateException("cannot allocate " + bytes + " pinned bytes for " + device + ": the arena is closed");
        long ptr = device.driver().hostAlloc(device.ordinal(), Math.max(bytes, 64));
        MemorySegment seg = DeviceBuffer.ownedBy(arena, ptr, bytes, () -> device.driver().hostFree(device.ordinal(), ptr));
        long dev = device.driver().hostDevicePointer(device.ordinal(), ptr);  // on failure the arena still frees the memory
        return new PinnedBuffer(device, seg, dev);
    }

    /** {@return the device whose kernels see this memory} */
    public Device device() { return device; }
    /** {@return the host view: read and write it freely (synchronize first if a kernel writes it)} */
    public MemorySegment host() { return host; }
    /** {@return the size in bytes} */
    public long byteSize() { return host.byteSize(); }

    /**
     * {@return the address kernels on {@link #device()} use for these bytes, after checking the memory is still alive}
     *
     * @throws IllegalStateException if the memory was freed (its arena is closed)
     */
    public long deviceAddress() {
        if (!host.scope().isAlive()) throw new IllegalStateException("pinned buffer of " + host.byteSize() + " bytes was freed (its arena is closed)");
        return deviceAddress;
    }
}
