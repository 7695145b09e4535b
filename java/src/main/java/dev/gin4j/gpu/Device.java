package dev.gin4j.gpu;

import dev.gin4j.gpu.driver.Driver;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;

/** One GPU. Obtained from {@link GpuRuntime#devices()}; lives as long as the process. */
public final class Device {
    private final GpuRuntime runtime;
    private final int ordinal;
    private volatile String name, arch;
    private volatile int[] maxGrid, maxBlock;
    private final java.util.Set<Stream> capturing = java.util.concurrent.ConcurrentHashMap.newKeySet();  // gin4j streams that began a capture and have not ended it

    Device(GpuRuntime runtime, int ordinal) {
        this.runtime = runtime;
        this.ordinal = ordinal;
    }

    Driver driver() { return runtime.driver(); }
    /** {@return the runtime this device belongs to} */
    public GpuRuntime runtime() { return runtime; }
    /** {@return the runtime's index of this device (0-based, as CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES leave them)} */
    public int ordinal() { return ordinal; }

    /** {@return the device's name as the runtime reports it ("NVIDIA H200", ...)} */
    public String name() {
        String n = name;
        return n != null ? n : (name = driver().deviceName(ordinal));
    }

    /** {@return the architecture as compilers name it: {@code sm_90}, {@code gfx942}} */
    public String arch() {
        String a = arch;
        return a != null ? a : (arch = driver().arch(ordinal));
    }

    /** {@return the device memory in bytes} */
    public long totalMemory() { return driver().totalMemory(ordinal); }
    /** {@return the number of streaming multiprocessors (NVIDIA) or compute units (AMD)} */
    public int multiprocessors() { return driver().multiprocessors(ordinal); }
    /** {@return the threads per warp (NVIDIA: 32) or wavefront (AMD CDNA: 64)} */
    public int warpSize() { return driver().warpSize(ordinal); }
    /** {@return the most shared memory one block may use, in bytes (with {@link Kernel#setMaxDynamicSharedBytes} above 48 KiB on NVIDIA)} */
    public int maxSharedBytesPerBlock() { return driver().maxSharedBytesPerBlock(ordinal); }
    /** {@return the largest grid, {x, y, z} blocks (a copy)} */
    public int[] maxGridDims() { return maxGrid().clone(); }
    /** {@return the largest block, {x, y, z} threads (a copy; a kernel may allow fewer threads in all, see {@link Kernel#maxThreadsPerBlock()})} */
    public int[] maxBlockDims() { return maxBlock().clone(); }

    int[] maxGrid() {
        int[] g = maxGrid;
        return g != null ? g : (maxGrid = driver().maxGridDims(ordinal));
    }

    int[] maxBlock() {
        int[] b = maxBlock;
        return b != null ? b : (maxBlock = driver().maxBlockDims(ordinal));
    }

    /** {@return the PCI bus id ("0000:19:00.0")} */
    public String pciBusId() { return driver().pciBusId(ordinal); }
    /** {@return {free, total} bytes of device memory} */
    public long[] memoryInfo() { return driver().memoryInfo(ordinal); }

    /**
     * Whether kernels on this device can load and store {@code peer}'s memory once {@link #enablePeerAccess} was called.
     *
     * @param peer another device of the same runtime
     * @return true if peer access between the two is possible
     * @throws IllegalArgumentException if {@code peer} belongs to another runtime
     */
    public boolean canAccessPeer(Device peer) { return driver().canAccessPeer(ordinal, sameRuntime(peer).ordinal); }
    /**
     * How this device and {@code peer} are linked, as far as the runtime tells ("NVLink", "XGMI", "PCIe", ...).
     *
     * @param peer another device of the same runtime
     * @return the kind of link
     * @throws IllegalArgumentException if {@code peer} belongs to another runtime
     */
    public String linkKind(Device peer) { return driver().linkKind(ordinal, sameRuntime(peer).ordinal); }

    /**
     * Lets kernels on this device load and store the peer's memory. Does nothing when {@code peer} is this device.
     *
     * @param peer the device whose memory kernels here may then access
     * @throws GpuException if this device cannot access {@code peer}
     */
    public void enablePeerAccess(Device peer) {
        if (peer == this) return;
        if (!canAccessPeer(peer)) throw new GpuException(this + " cannot access " + peer + " (no peer access between them)");
        driver().enablePeerAccess(ordinal, peer.ordinal);
    }

    private Device sameRuntime(Device other) {
        if (other.runtime != runtime) throw new IllegalArgumentException(other + " belongs to another runtime");
        return other;
    }

    /** Makes this device current for the calling thread (CUDA: its primary context). */
    public void makeCurrent() { driver().makeCurrent(ordinal); }

    /** Waits for all work on this device. */
    public void synchronize() { driver().synchronize(ordinal); }

    /**
     * Allocates device memory freed when {@code arena} closes. Zero bytes gives an empty buffer.
     *
     * @param bytes the size in bytes
     * @param arena the arena whose closing frees the memory
     * @return the new buffer
     */
    public DeviceBuffer allocate(long bytes, Arena arena) { return DeviceBuffer.allocate(this, bytes, arena); }

    /**
     * Allocates page-locked host memory, readable by the host and by kernels on this device.
     *
     * @param bytes the size in bytes
     * @param arena the arena whose closing frees the memory
     * @return the new buffer
     */
    public PinnedBuffer allocatePinned(long bytes, Arena arena) { return PinnedBuffer.allocate(this, bytes, arena); }

    /** {@return a new non-blocking stream on this device; close it when done} */
    public Stream createStream() { return new Stream(this); }
    /** {@return a new timing event on this device; close it when done} */
    public Event createEvent() { return new Event(this, true); }
    /**
     * A new event on this device, timing or not (a non-timing event is cheaper to record and wait for); close it when done.
     *
     * @param timing whether the event records times for {@link Event#elapsedMillisSince}
     * @return the new event
     */
    public Event createEvent(boolean timing) { return new Event(this, timing); }

    /**
     * Loads a code object (cubin/fatbin on NVIDIA, hsaco on AMD) from its bytes.
     *
     * @param name the name to load it under (used in messages)
     * @param image the code object's bytes, read during the call only
     * @return the loaded code object; close it when done
     * @throws GpuException if the image does not load on this device (e.g. built for another architecture)
     */
    public CodeObject loadCodeObject(String name, byte[] image) { return new CodeObject(this, name, image); }

    /** A capture was begun on {@code stream} ({@link Stream#beginCapture}) or ended there (ended true). */
    void noteCapture(Stream stream, boolean ended) {
        if (ended) capturing.remove(stream);
        else capturing.add(stream);
    }

    /** One gin4j stream of this device that is capturing a graph, described, or null (captures begun by other code on wrapped streams are not seen). */
    String capturingStream() {
        for (Stream s : capturing) return s.describe();
        return null;
    }

    void check(Device other, String what) {
        if (other != this) throw new IllegalArgumentException(what + " is on " + other + " but this operation runs on " + this);
    }

    @Override public String toString() { return "device " + ordinal + " (" + runtime.name() + ")"; }
}
