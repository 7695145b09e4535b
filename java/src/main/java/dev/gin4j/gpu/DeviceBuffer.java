package dev.gin4j.gpu;

import dev.gin4j.gpu.driver.Driver.CopyKind;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.concurrent.atomic.AtomicLong;

/**
 * A range of device memory. Its {@link #segment()} carries the device address, the size and the
 * owning {@link Arena}'s lifetime, for bounds and slicing only: it must never be read or written
 * on the host (that would touch unmapped memory). Host access goes through the copy methods.
 */
public final class DeviceBuffer {
    private static final AtomicLong LIVE_BYTES = new AtomicLong();
    private static final AtomicLong LIVE_COUNT = new AtomicLong();
    private final Device device;
    private final MemorySegment segment;

    private DeviceBuffer(Device device, MemorySegment segment) {
        this.device = device;
        this.segment = segment;
    }

    static DeviceBuffer allocate(Device device, long bytes, Arena arena) {
        if (bytes < 0) throw new IllegalArgumentException("cannot allocate " + bytes + " bytes: size must be >= 0");
        // the runtimes refuse 0-byte allocations; a small real one keeps every address valid
        long ptr = device.driver().malloc(device.ordinal(), Math.max(bytes, 256));
        LIVE_BYTES.addAndGet(bytes);
        LIVE_COUNT.incrementAndGet();
        MemorySegment seg = MemorySegment.ofAddress(ptr).reinterpret(bytes, arena, s -> {
            LIVE_BYTES.addAndGet(-bytes);
            LIVE_COUNT.decrementAndGet();
            device.driver().free(device.ordinal(), ptr);
        });
        return new DeviceBuffer(device, seg);
    }

    /** Wraps memory allocated elsewhere (by NCCL, for instance) on {@code device}; gin4j does not free it. */
    public static DeviceBuffer wrap(Device device, MemorySegment deviceRange) {
        return new DeviceBuffer(device, deviceRange);
    }

    /** Device buffers allocated by gin4j and not yet freed (their arenas still open). */
    public static long liveCount() { return LIVE_COUNT.get(); }

    public Device device() { return device; }
    /** Device address range; never dereference it on the host. */
    public MemorySegment segment() { return segment; }
    public long byteSize() { return segment.byteSize(); }

    /** The device address, after checking that the memory is still alive. */
    public long address() {
        if (!segment.scope().isAlive()) throw new IllegalStateException("device buffer of " + segment.byteSize() + " bytes on " + device + " was freed (its arena is closed)");
        return segment.address();
    }

    /** A view of {@code [offset, offset + length)} of this buffer. */
    public DeviceBuffer slice(long offset, long length) {
        if (offset < 0 || length < 0 || offset > byteSize() - length) {
            throw new IndexOutOfBoundsException("slice [" + offset + ", " + offset + "+" + length + ") is outside this device buffer of " + byteSize() + " bytes");
        }
        return new DeviceBuffer(device, segment.asSlice(offset, length));
    }

    private void checkLength(long bytes, long other, String what) {
        if (bytes != other) throw new IllegalArgumentException(what + " has " + other + " bytes but this device buffer has " + bytes);
    }

    /** Copies all of {@code host} (same size as this buffer) to the device and waits. */
    public void copyFromHost(MemorySegment host) {
        checkLength(byteSize(), host.byteSize(), "host segment");
        if (byteSize() == 0) return;
        if (host.isNative()) {
            device.driver().copy(device.ordinal(), address(), host.address(), byteSize(), CopyKind.HOST_TO_DEVICE, 0, false);
        } else {
            try (Arena a = Arena.ofConfined()) {
                MemorySegment staged = a.allocate(host.byteSize(), 16).copyFrom(host);
                device.driver().copy(device.ordinal(), address(), staged.address(), byteSize(), CopyKind.HOST_TO_DEVICE, 0, false);
            }
        }
    }

    /** Copies this buffer into {@code host} (same size) and waits. */
    public void copyToHost(MemorySegment host) {
        checkLength(byteSize(), host.byteSize(), "host segment");
        if (byteSize() == 0) return;
        if (host.isNative()) {
            device.driver().copy(device.ordinal(), host.address(), address(), byteSize(), CopyKind.DEVICE_TO_HOST, 0, false);
        } else {
            try (Arena a = Arena.ofConfined()) {
                MemorySegment staged = a.allocate(host.byteSize(), 16);
                device.driver().copy(device.ordinal(), staged.address(), address(), byteSize(), CopyKind.DEVICE_TO_HOST, 0, false);
                host.copyFrom(staged);
            }
        }
    }

    /** Copies a native (off-heap or pinned) host segment to the device, ordered on {@code stream}. */
    public void copyFromHostAsync(MemorySegment host, Stream stream) {
        checkLength(byteSize(), host.byteSize(), "host segment");
        requireNative(host);
        device.check(stream.device(), "stream");
        if (byteSize() == 0) return;
        device.driver().copy(device.ordinal(), address(), host.address(), byteSize(), CopyKind.HOST_TO_DEVICE, stream.handle(), true);
    }

    /** Copies this buffer to a native (off-heap or pinned) host segment, ordered on {@code stream}. */
    public void copyToHostAsync(MemorySegment host, Stream stream) {
        checkLength(byteSize(), host.byteSize(), "host segment");
        requireNative(host);
        device.check(stream.device(), "stream");
        if (byteSize() == 0) return;
        device.driver().copy(device.ordinal(), host.address(), address(), byteSize(), CopyKind.DEVICE_TO_HOST, stream.handle(), true);
    }

    private static void requireNative(MemorySegment host) {
        if (!host.isNative()) throw new IllegalArgumentException("asynchronous copies need an off-heap host segment (Arena-allocated or pinned), not a heap segment");
    }

    /** Copies {@code src} (same size; this device or a peer) into this buffer, ordered on {@code stream}. */
    public void copyFrom(DeviceBuffer src, Stream stream) {
        checkLength(byteSize(), src.byteSize(), "source device buffer");
        device.check(stream.device(), "stream");
        if (byteSize() == 0) return;
        if (src.device == device) {
            device.driver().copy(device.ordinal(), address(), src.address(), byteSize(), CopyKind.DEVICE_TO_DEVICE, stream.handle(), true);
        } else {
            device.driver().copyPeer(address(), device.ordinal(), src.address(), src.device.ordinal(), byteSize(), stream.handle(), true);
        }
    }

    /** Sets every byte to {@code value}, ordered on {@code stream}. */
    public void fill(byte value, Stream stream) {
        device.check(stream.device(), "stream");
        if (byteSize() == 0) return;
        device.driver().memset8(device.ordinal(), address(), value, byteSize(), stream.handle(), true);
    }

    /** Sets every 32-bit word to {@code value} (size must be a multiple of 4), ordered on {@code stream}. */
    public void fill32(int value, Stream stream) {
        if (byteSize() % 4 != 0) throw new IllegalArgumentException("fill32 needs a size that is a multiple of 4, got " + byteSize());
        device.check(stream.device(), "stream");
        if (byteSize() == 0) return;
        device.driver().memset32(device.ordinal(), address(), value, byteSize() / 4, stream.handle(), true);
    }

    /** Reads the whole buffer into a new heap array (a synchronous copy; for tests and small results). */
    public byte[] toByteArray() {
        if (byteSize() > Integer.MAX_VALUE - 16) throw new IllegalStateException("buffer of " + byteSize() + " bytes does not fit a Java array");
        byte[] out = new byte[(int) byteSize()];
        copyToHost(MemorySegment.ofArray(out));
        return out;
    }

    /** The first {@code n} 64-bit values (a synchronous copy; for counts, tables, small results). */
    public long[] readLongs(int n) {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment h = a.allocate(8L * n, 8);
            slice(0, 8L * n).copyToHost(h);
            return h.toArray(ValueLayout.JAVA_LONG);
        }
    }

    /** The first {@code n} 32-bit values (a synchronous copy). */
    public int[] readInts(int n) {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment h = a.allocate(4L * n, 4);
            slice(0, 4L * n).copyToHost(h);
            return h.toArray(ValueLayout.JAVA_INT);
        }
    }

    @Override public String toString() { return "device buffer of " + byteSize() + " bytes at 0x" + Long.toHexString(segment.address()) + " on " + device; }
}
