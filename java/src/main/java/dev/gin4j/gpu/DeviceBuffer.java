package dev.gin4j.gpu;


import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.concurrent.atomic.AtomicLong;

/**
 * A range of device memory. Its {@link #segment()} carries the device address, the size and the
 * owning {@link Arena}'s lifetime, for bounds and slicing only: it must never be read or written
 * on the host (that would touch unmapped memory). Host access goes through the copy methods.
 *
 * <p>Ordering. gin4j's {@link Stream}s are non-blocking streams: they do not wait for the
 * runtime's default stream, nor it for them. The host copies come in three forms:
 * <ul>
 * <li>With a stream ({@link #copyToHost(MemorySegment, Stream)}, {@link #copyFromHost(MemorySegment, Stream)},
 *     {@link #toByteArray(Stream)}, {@link #readLongs(int, Stream)}, {@link #readInts(int, Stream)}):
 *     queued on that stream after the work already there, and returning once the stream has run it.
 *     The usual form: read a result on the stream that made it.</li>
 * <li>Asynchronous ({@link #copyToHostAsync}, {@link #copyFromHostAsync}): queued on the stream and
 *     returning at once; truly overlapped with the host where the host side is pinned
 *     ({@link PinnedBuffer#host()}).</li>
 * <li>Without a stream ({@link #copyToHost(MemorySegment)}, {@link #copyFromHost(MemorySegment)},
 *     {@link #toByteArray()}, {@link #readLongs(int)}, {@link #readInts(int)}): these first wait
 *     for <em>all</em> work on the device (every stream: gin4j's, wrapped ones, other libraries'),
 *     then copy and wait. Always correct after any stream's work, but they stall the whole device:
 *     for tests, setup and small results. Since a device-wide wait is not allowed while a stream of
 *     the device captures a graph, they are refused then (use a stream form on a stream that does
 *     not capture, or copy after the capture ends).</li>
 * </ul>
 * The other operations ({@link #copyFrom}, {@link #fill}, {@link #fill32}) are ordered on the
 * stream they are given.
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
        if (!arena.scope().isAlive()) throw new IllegalStateException("cannot allocate " + bytes + " bytes on " + device + ": the arena is closed");
        // the runtimes refuse 0-byte allocations; a small real one keeps every address valid
        long ptr = device.driver().malloc(device.ordinal(), Math.max(bytes, 256));
        LIVE_BYTES.addAndGet(bytes);  // counted before the arena takes it: a refusal frees (and uncounts) it at once
        LIVE_COUNT.incrementAndGet();
        MemorySegment seg = ownedBy(arena, ptr, bytes, () -> {
            LIVE_BYTES.addAndGet(-bytes);
            LIVE_COUNT.decrementAndGet();
            device.driver().free(device.ordinal(), ptr);
        });
        return new DeviceBuffer(device, seg);
    }

    /**
     * Wraps device memory allocated elsewhere on {@code device}: by another library (a PyTorch
     * tensor's {@code data_ptr()}, {@code cudaMalloc} / {@code hipMalloc} through JCuda or JavaCPP,
     * NCCL's {@code ncclMemAlloc}, a CUDA/HIP caching allocator), so that gin4j's calls read or write
     * it in place. gin4j never frees it; its maker does. {@code deviceRange} is a native segment of
     * the device address and size ({@code MemorySegment.ofAddress(ptr).reinterpret(bytes, arena, null)}),
     * scoped to an arena that closes no later than the memory is freed, so that gin4j refuses use
     * after that (for a caching allocator: no later than the block goes back to the cache). The
     * address must be device memory of {@code device} (CUDA: allocated in its primary context, or
     * managed memory), which gin4j cannot check; the segment is never read on the host. Work queued
     * on gin4j streams that uses it must be finished (or ordered by an event) before other code frees
     * or reuses it, as with any memory shared between streams.
     *
     * @param device the device the memory belongs to
     * @param deviceRange a native segment of the device address and size, scoped to an arena that closes no later than the memory is freed
     * @return a buffer over that memory, which gin4j never frees
     * @throws IllegalArgumentException for a heap segment or address 0
     * @throws NullPointerException for a null device
     */
    public static DeviceBuffer wrap(Device device, MemorySegment deviceRange) {
        java.util.Objects.requireNonNull(device, "DeviceBuffer.wrap needs the device the memory belongs to, got null");
        if (!deviceRange.isNative() || deviceRange.address() == 0)
            throw new IllegalArgumentException("wrap needs a native segment holding a device address, got " + (deviceRange.isNative() ? "address 0" : "a heap segment"));
        return new DeviceBuffer(device, deviceRange);
    }

    /** {@return the number of device buffers allocated by gin4j and not yet freed (their arenas still open)} */
    public static long liveCount() { return LIVE_COUNT.get(); }

    /** {@return the device the memory is on} */
    public Device device() { return device; }
    /** {@return the device address range; never dereference it on the host} */
    public MemorySegment segment() { return segment; }
    /** {@return the size in bytes} */
    public long byteSize() { return segment.byteSize(); }

    /**
     * {@return the device address, after checking that the memory is still alive}
     *
     * @throws IllegalStateException if the memory was freed (its arena is closed)
     */
    public long address() {
        if (!segment.scope().isAlive()) throw new IllegalStateException("device buffer of " + segment.byteSize() + " bytes on " + device + " was freed (its arena is closed)");
        return segment.address();
    }

    /**
     * {@return true when {@code other} is on the same device and the two share at least one byte}
     *
     * @param other the buffer to compare with
     */
    public boolean overlaps(DeviceBuffer other) {
        if (other.device != device || byteSize() == 0 || other.byteSize() == 0) return false;
        long a = segment.address(), b = other.segment.address();
        return a < b + other.byteSize() && b < a + byteSize();
    }

    /**
     * A view of {@code [offset, offset + length)} of this buffer.
     *
     * @param offset the first byte of the view
     * @param length the view's size in bytes
     * @return the view, on the same memory (nothing is copied)
     * @throws IndexOutOfBoundsException if the range is not inside this buffer
     */
    public DeviceBuffer slice(long offset, long length) {
        if (offset < 0 || length < 0 || offset > byteSize() - length) {
            throw new IndexOutOfBoundsException("slice [" + offset + ", " + offset + "+" + length + ") is outside this device buffer of " + byteSize() + " bytes");
        }
        return new DeviceBuffer(device, segment.asSlice(offset, length));
    }

    private void checkLength(long bytes, long other, String what) {
        if (bytes != other) throw new IllegalArgumentException(what + " has " + other + " bytes but this device buffer has " + bytes);
    }

    /**
     * Copies all of {@code host} (same size as this buffer, heap or native) to the device, after
     * waiting for all work on the device (every stream), and waits until the copy is done: correct
     * after any stream's work, at the price of a device-wide wait (see the class comment).
     * @param host the bytes to copy, as many as this buffer holds
     * @throws IllegalStateException when {@code host}'s arena is closed, or a gin4j stream of this
     *         device is capturing a graph (a device-wide wait is not allowed then)
     * @throws WrongThreadException when {@code host}'s arena is confined to another thread
     * @throws IllegalArgumentException when {@code host}'s size differs from this buffer's
     */
    public void copyFromHost(MemorySegment host) {
        checkHost(host, false);
        checkLength(byteSize(), host.byteSize(), "host segment");
        if (byteSize() == 0) return;
        waitForDevice("copyFromHost");
        if (host.isNative()) {
            device.driver().copyToDevice(device.ordinal(), address(), host, byteSize(), 0, false);
        } else {
            try (Arena a = Arena.ofConfined()) {
                MemorySegment staged = a.allocate(host.byteSize(), 16).copyFrom(host);
                device.driver().copyToDevice(device.ordinal(), address(), staged, byteSize(), 0, false);
            }
        }
    }

    /**
     * Copies this buffer into {@code host} (same size, heap or native), after waiting for all work
     * on the device (every stream), and waits: correct after any stream's work, at the price of a
     * device-wide wait (see the class comment).
     * @param host where the bytes go, as many as this buffer holds
     * @throws IllegalStateException when {@code host}'s arena is closed, or a gin4j stream of this
     *         device is capturing a graph (a device-wide wait is not allowed then)
     * @throws WrongThreadException when {@code host}'s arena is confined to another thread
     * @throws IllegalArgumentException when {@code host} is read-only or its size differs from this buffer's
     */
    public void copyToHost(MemorySegment host) {
        checkHost(host, true);
        checkLength(byteSize(), host.byteSize(), "host segment");
        if (byteSize() == 0) return;
        waitForDevice("copyToHost");
        if (host.isNative()) {
            device.driver().copyToHost(device.ordinal(), host, address(), byteSize(), 0, false);
        } else {
            try (Arena a = Arena.ofConfined()) {
                MemorySegment staged = a.allocate(host.byteSize(), 16);
                device.driver().copyToHost(device.ordinal(), staged, address(), byteSize(), 0, false);
                host.copyFrom(staged);
            }
        }
    }

    /** The device-wide wait before a copy without a stream; refused while a gin4j stream of the device captures. */
    private void waitForDevice(String operation) {
        String capturing = device.capturingStream();
        if (capturing != null)
            throw new IllegalStateException(operation + " without a stream waits for all work on " + device + ", which the runtime does not allow while "
                    + capturing + " captures a graph: pass a stream that does not capture (" + operation + "(host, stream)), or copy after endCapture");
        device.synchronize();
    }

    /**
     * Copies all of {@code host} (same size as this buffer, heap or native) to the device, ordered
     * on {@code stream} after the work already queued there, and returns once the stream has run it
     * (so {@code host} may be reused at once). Only {@code stream} is waited for, not the device.
     * @param host the bytes to copy, as many as this buffer holds
     * @param stream the stream the copy is ordered on, of this buffer's device
     * @throws IllegalStateException when {@code host}'s arena is closed, or {@code stream} is
     *         capturing a graph (this waits for it on the host)
     * @throws WrongThreadException when {@code host}'s arena is confined to another thread
     * @throws IllegalArgumentException when the sizes differ or {@code stream} is on another device
     */
    public void copyFromHost(MemorySegment host, Stream stream) {
        checkHost(host, false);
        checkLength(byteSize(), host.byteSize(), "host segment");
        checkWaitable(stream, "copyFromHost");
        if (byteSize() == 0) return;
        if (host.isNative()) {
            device.driver().copyToDevice(device.ordinal(), address(), host, byteSize(), stream.handle(), true);
            stream.synchronize();
        } else {
            try (Arena a = Arena.ofConfined()) {
                MemorySegment staged = a.allocate(host.byteSize(), 16).copyFrom(host);
                device.driver().copyToDevice(device.ordinal(), address(), staged, byteSize(), stream.handle(), true);
                stream.synchronize();  // before the staging memory is freed
            }
        }
    }

    /**
     * Copies this buffer into {@code host} (same size, heap or native), ordered on {@code stream}
     * after the work already queued there (a kernel's result is read on the stream that made it),
     * and returns once the copy is done. Only {@code stream} is waited for, not the device.
     * @param host where the bytes go, as many as this buffer holds
     * @param stream the stream the copy is ordered on, of this buffer's device
     * @throws IllegalStateException when {@code host}'s arena is closed, or {@code stream} is
     *         capturing a graph (this waits for it on the host)
     * @throws WrongThreadException when {@code host}'s arena is confined to another thread
     * @throws IllegalArgumentException when {@code host} is read-only, the sizes differ, or
     *         {@code stream} is on another device
     */
    public void copyToHost(MemorySegment host, Stream stream) {
        checkHost(host, true);
        checkLength(byteSize(), host.byteSize(), "host segment");
        checkWaitable(stream, "copyToHost");
        if (byteSize() == 0) return;
        if (host.isNative()) {
            device.driver().copyToHost(device.ordinal(), host, address(), byteSize(), stream.handle(), true);
            stream.synchronize();
        } else {
            try (Arena a = Arena.ofConfined()) {
                MemorySegment staged = a.allocate(host.byteSize(), 16);
                device.driver().copyToHost(device.ordinal(), staged, address(), byteSize(), stream.handle(), true);
                stream.synchronize();
                host.copyFrom(staged);
            }
        }
    }

    /** A stream a stream-ordered copy waits for on the host: this device's, open, not capturing. */
    private void checkWaitable(Stream stream, String operation) {
        requireStream(stream, operation);
        device.check(stream.device(), "stream");
        stream.handle();  // a closed stream is refused here, naming it
        if (stream.isCapturing())
            throw new IllegalStateException(operation + "(host, stream) waits for the stream on the host, which cannot be captured in a graph ("
                    + stream.describe() + " is capturing): use the Async form inside a capture");
    }

    /**
     * Copies a native (off-heap or pinned) host segment to the device, ordered on {@code stream}.
     * The runtime reads {@code host} after this returns: keep its memory alive (its arena open)
     * and unchanged until the stream is synchronized (or an event recorded after it completes).
     * The copy overlaps the host's work only from pinned memory ({@link PinnedBuffer#host()}); from
     * other native memory the runtime may stage it and return later.
     * @param host a native segment of the bytes to copy, as many as this buffer holds
     * @param stream the stream the copy is ordered on, of this buffer's device
     * @throws IllegalStateException when {@code host}'s arena is closed
     * @throws WrongThreadException when {@code host}'s arena is confined to another thread
     */
    public void copyFromHostAsync(MemorySegment host, Stream stream) {
        checkHost(host, false);
        checkLength(byteSize(), host.byteSize(), "host segment");
        requireNative(host);
        device.check(stream.device(), "stream");
        if (byteSize() == 0) return;
        device.driver().copyToDevice(device.ordinal(), address(), host, byteSize(), stream.handle(), true);
        noteHostCopy(host, stream);
    }

    /**
     * Copies this buffer to a native (off-heap or pinned) host segment, ordered on {@code stream}.
     * The runtime writes {@code host} after this returns: keep its memory alive (its arena open)
     * until the stream is synchronized (or an event recorded after it completes), and read it only then.
     * Only into pinned memory ({@link PinnedBuffer#host()}) does this return at once; into other
     * native memory the runtime returns once the copy is done.
     * @param host a native segment where the bytes go, as many as this buffer holds
     * @param stream the stream the copy is ordered on, of this buffer's device
     * @throws IllegalStateException when {@code host}'s arena is closed
     * @throws WrongThreadException when {@code host}'s arena is confined to another thread
     * @throws IllegalArgumentException when {@code host} is read-only
     */
    public void copyToHostAsync(MemorySegment host, Stream stream) {
        checkHost(host, true);
        checkLength(byteSize(), host.byteSize(), "host segment");
        requireNative(host);
        device.check(stream.device(), "stream");
        if (byteSize() == 0) return;
        device.driver().copyToHost(device.ordinal(), host, address(), byteSize(), stream.handle(), true);
        noteHostCopy(host, stream);
    }

    /**
     * A host segment must be alive and usable from this thread, and writable when a copy writes it:
     * refused here with a message that says which, before the runtime is called.
     */
    private static void checkHost(MemorySegment host, boolean written) {
        if (!host.scope().isAlive()) {
            throw new IllegalStateException("host segment of " + host.byteSize() + " bytes at 0x" + Long.toHexString(host.address()) + " is no longer alive (its arena is closed)");
        }
        if (!host.isAccessibleBy(Thread.currentThread())) {
            throw new WrongThreadException("host segment of " + host.byteSize() + " bytes belongs to a confined arena of another thread; copy from that thread");
        }
        if (written && host.isReadOnly()) {
            throw new IllegalArgumentException("host segment of " + host.byteSize() + " bytes is read-only, but a device-to-host copy writes it");
        }
    }

    /**
     * Native memory at {@code ptr} handed to {@code arena}, which runs {@code free} when it closes.
     * Where the arena refuses it (closed meanwhile, or confined to another thread) {@code free} runs
     * at once and the refusal is thrown.
     */
    static MemorySegment ownedBy(Arena arena, long ptr, long bytes, Runnable free) {
        try {
            return MemorySegment.ofAddress(ptr).reinterpret(bytes, arena, s -> free.run());
        } catch (RuntimeException e) {
            try {
                free.run();
            } catch (RuntimeException f) {
                e.addSuppressed(f);
            }
            throw e;
        }
    }

    private void noteHostCopy(MemorySegment host, Stream stream) {
        stream.noteUse(this);
        stream.noteUse(host);
    }

    private static void requireNative(MemorySegment host) {
        if (!host.isNative()) throw new IllegalArgumentException("asynchronous copies need an off-heap host segment (Arena-allocated or pinned), not a heap segment");
    }

    /**
     * Copies {@code src} (same size; this device or a peer) into this buffer, ordered on {@code stream}.
     *
     * @param src the buffer to copy from, of the same size
     * @param stream the stream the copy is ordered on, of this buffer's device
     */
    public void copyFrom(DeviceBuffer src, Stream stream) {
        checkLength(byteSize(), src.byteSize(), "source device buffer");
        device.check(stream.device(), "stream");
        if (byteSize() == 0) return;
        if (src.device == device) {
            device.driver().copyOnDevice(device.ordinal(), address(), src.address(), byteSize(), stream.handle(), true);
        } else {
            device.driver().copyPeer(address(), device.ordinal(), src.address(), src.device.ordinal(), byteSize(), stream.handle(), true);
        }
        stream.noteUse(this);
        stream.noteUse(src);
    }

    /**
     * Sets every byte to {@code value}, ordered on {@code stream}.
     *
     * @param value the byte to write
     * @param stream the stream the fill is ordered on, of this buffer's device
     */
    public void fill(byte value, Stream stream) {
        device.check(stream.device(), "stream");
        if (byteSize() == 0) return;
        device.driver().memset8(device.ordinal(), address(), value, byteSize(), stream.handle(), true);
        stream.noteUse(this);
    }

    /**
     * Sets every 32-bit word to {@code value} (address 4-byte aligned, size a multiple of 4), ordered on {@code stream}.
     *
     * @param value the 32-bit word to write
     * @param stream the stream the fill is ordered on, of this buffer's device
     * @throws IllegalArgumentException if the size is not a multiple of 4 or the address is not 4-byte aligned
     */
    public void fill32(int value, Stream stream) {
        if (byteSize() % 4 != 0) throw new IllegalArgumentException("fill32 needs a size that is a multiple of 4, got " + byteSize());
        if (byteSize() != 0 && address() % 4 != 0) {
            throw new IllegalArgumentException("fill32 needs a 4-byte aligned address, but this buffer starts at 0x" + Long.toHexString(segment.address())
                    + " (a slice at an offset that is not a multiple of 4?)");
        }
        device.check(stream.device(), "stream");
        if (byteSize() == 0) return;
        device.driver().memset32(device.ordinal(), address(), value, byteSize() / 4, stream.handle(), true);
        stream.noteUse(this);
    }

    /**
     * Reads the whole buffer into a new heap array, after waiting for all work on the device (as
     * {@link #copyToHost(MemorySegment)}; for tests, setup and small results).
     *
     * @return the buffer's bytes
     */
    public byte[] toByteArray() { return readBytes(null); }

    /**
     * Reads the whole buffer into a new heap array, ordered on {@code stream} (as
     * {@link #copyToHost(MemorySegment, Stream)}).
     *
     * @param stream the stream whose work the read follows
     * @return the buffer's bytes
     */
    public byte[] toByteArray(Stream stream) { return readBytes(requireStream(stream, "toByteArray")); }

    private byte[] readBytes(Stream stream) {
        if (byteSize() > Integer.MAX_VALUE - 16) throw new IllegalStateException("buffer of " + byteSize() + " bytes does not fit a Java array");
        byte[] out = new byte[(int) byteSize()];
        copyOut(MemorySegment.ofArray(out), stream);
        return out;
    }

    /**
     * The first {@code n} 64-bit values, after waiting for all work on the device (as {@link #copyToHost(MemorySegment)}).
     *
     * @param n how many values to read
     * @return the values
     */
    public long[] readLongs(int n) { return longs(n, null); }

    /**
     * The first {@code n} 64-bit values, ordered on {@code stream} (as {@link #copyToHost(MemorySegment, Stream)}).
     *
     * @param n how many values to read
     * @param stream the stream whose work the read follows
     * @return the values
     */
    public long[] readLongs(int n, Stream stream) { return longs(n, requireStream(stream, "readLongs")); }

    private long[] longs(int n, Stream stream) {
        checkRead(n, 8, "64-bit");
        try (Arena a = Arena.ofConfined()) {
            MemorySegment h = a.allocate(8L * n, 8);
            slice(0, 8L * n).copyOut(h, stream);
            return h.toArray(ValueLayout.JAVA_LONG);
        }
    }

    /**
     * The first {@code n} 32-bit values, after waiting for all work on the device (as {@link #copyToHost(MemorySegment)}).
     *
     * @param n how many values to read
     * @return the values
     */
    public int[] readInts(int n) { return ints(n, null); }

    /**
     * The first {@code n} 32-bit values, ordered on {@code stream} (as {@link #copyToHost(MemorySegment, Stream)}).
     *
     * @param n how many values to read
     * @param stream the stream whose work the read follows
     * @return the values
     */
    public int[] readInts(int n, Stream stream) { return ints(n, requireStream(stream, "readInts")); }

    private int[] ints(int n, Stream stream) {
        checkRead(n, 4, "32-bit");
        try (Arena a = Arena.ofConfined()) {
            MemorySegment h = a.allocate(4L * n, 4);
            slice(0, 4L * n).copyOut(h, stream);
            return h.toArray(ValueLayout.JAVA_INT);
        }
    }

    /** A device-to-host copy on {@code stream}, or with a device-wide wait where it is null. */
    private void copyOut(MemorySegment host, Stream stream) {
        if (stream == null) copyToHost(host);
        else copyToHost(host, stream);
    }

    private static Stream requireStream(Stream stream, String operation) {
        return java.util.Objects.requireNonNull(stream, () -> operation + "(.., stream) needs a stream (the one whose work it follows), got null; the form without a stream waits for the whole device");
    }

    private void checkRead(int n, int width, String what) {
        if (n < 0) throw new IllegalArgumentException("cannot read " + n + " " + what + " values: the count must be >= 0");
        if ((long) width * n > byteSize()) {
            throw new IndexOutOfBoundsException("cannot read " + n + " " + what + " values (" + (long) width * n + " bytes) from a device buffer of " + byteSize() + " bytes");
        }
    }

    @Override public String toString() { return "device buffer of " + byteSize() + " bytes at 0x" + Long.toHexString(segment.address()) + " on " + device; }
}
