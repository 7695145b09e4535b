package dev.gin4j.gpu;

import java.lang.foreign.MemorySegment;

/** An ordered queue of GPU work on one device (a non-blocking stream). */
public final class Stream extends NativeResource {
    private final Device device;
    private final long handle;
    private volatile CapturedUses capture;  // while capturing (as origin or joined): what the captured work uses
    private volatile boolean captureBegunHere;  // capture was begun on this stream (not joined through an event)

    Stream(Device device) {
        this.device = device;
        this.handle = created(() -> device.driver().streamCreate(device.ordinal()));
    }

    public Device device() { return device; }

    /** The native handle, after checking the stream is open. */
    public long handle() {
        ensureOpen();
        return handle;
    }

    /** Waits until all work queued so far has finished. */
    public void synchronize() { device.driver().streamSynchronize(device.ordinal(), handle()); }

    /** true when all queued work has finished. */
    public boolean isIdle() { return device.driver().streamQuery(device.ordinal(), handle()); }

    /** Later work on this stream waits for {@code event} (recorded on any stream of this device). */
    public void waitFor(Event event) {
        device.check(event.device(), "event");
        device.driver().streamWaitEvent(device.ordinal(), handle(), event.handle());
        CapturedUses joined = event.capture;  // an event recorded on a capturing stream pulls this one into the capture (fork)
        if (joined != null && !joined.ended && activeCapture() == null) capture = joined;
    }

    /** Records {@code event} on this stream (as {@link Event#record}); for timing and cross-stream ordering. */
    public void record(Event event) { event.record(this); }

    /**
     * Starts capturing the work queued on this stream into a graph (until {@link #endCapture()}).
     * gin4j notes what each captured operation uses (device buffers, host segments of asynchronous
     * copies, code objects, instances, communicators), and the graph refuses to replay once one of
     * them is closed or freed. A stream that joins the capture by waiting for an event recorded here
     * notes into the same graph. The HOST backends of MoeAllToAll and AllToAllV refuse to be captured.
     */
    public void beginCapture() {
        device.driver().beginCapture(device.ordinal(), handle());
        capture = new CapturedUses();
        captureBegunHere = true;
    }

    /**
     * Ends the capture and instantiates the graph, ready to {@link Graph#launch(Stream)}. CUDA
     * refuses to instantiate while another stream captures on this thread: with one thread driving
     * several GPUs, capture them one after the other.
     */
    public Graph endCapture() {
        CapturedUses uses = capture;
        long h = handle();  // a closed stream throws here, before the driver sees its handle
        long graph;
        try {
            graph = device.driver().endCapture(device.ordinal(), h);
        } catch (RuntimeException e) {
            // an invalidated capture ends anyway; one ended on the wrong stream or thread goes on
            try {
                if (!device.driver().isCapturing(device.ordinal(), h)) captureEnded(uses);
            } catch (RuntimeException q) {
                e.addSuppressed(q);
            }
            throw e;
        }
        captureEnded(uses);
        return new Graph(device, graph, uses == null ? CapturedUses.Frozen.NONE : uses.freeze());
    }

    private void captureEnded(CapturedUses uses) {
        if (uses != null) uses.ended = true;
        capture = null;
        captureBegunHere = false;
    }

    /** The capture this stream notes into: begun here or joined through an event, and not ended. */
    CapturedUses activeCapture() {
        CapturedUses c = capture;
        return c == null || c.ended ? null : c;
    }

    /** true between {@link #beginCapture()} and {@link #endCapture()}, or while joined to another stream's capture. */
    public boolean isCapturing() { return activeCapture() != null; }

    /**
     * For calls that wait for the host and so cannot go into a graph: refuses, before anything is
     * queued, when one of {@code streams} captures. {@code operation} says what and why.
     */
    public static void refuseCapture(java.util.List<Stream> streams, String operation) {
        for (Stream s : streams)
            if (s.isCapturing()) throw new IllegalStateException(operation + " cannot be captured in a graph (" + s.describe() + " is capturing)");
    }

    /**
     * Notes that the work being queued here uses {@code resource}: while this stream captures, the
     * graph will refuse to replay once {@code resource} is closed. gin4j's own operations call it;
     * call it for what your own kernels use through raw addresses. Nothing happens outside a capture.
     */
    public void noteUse(NativeResource resource) {
        CapturedUses c = activeCapture();
        if (c != null) c.add(resource);
    }

    /** As {@link #noteUse(NativeResource)}, for device memory: the graph refuses to replay once its arena is closed. */
    public void noteUse(DeviceBuffer buffer) {
        CapturedUses c = activeCapture();
        if (c != null) c.add(buffer.segment(), buffer);
    }

    /**
     * As {@link #noteUse(NativeResource)}, for native memory reached through a raw address (pinned
     * host memory, say): the graph refuses to replay once {@code memory}'s arena is closed.
     */
    public void noteUse(MemorySegment memory) {
        CapturedUses c = activeCapture();
        if (c != null) c.add(memory, new Object() {  // named only when its scope is new to the capture
            @Override public String toString() { return "memory segment of " + memory.byteSize() + " bytes at 0x" + Long.toHexString(memory.address()); }
        });
    }

    /** A kernel launch: its code object and the device buffers of its arguments. */
    void noteLaunch(CodeObject codeObject, KernelArgs args) {
        CapturedUses c = activeCapture();
        if (c != null) {
            c.add(codeObject);
            args.noteBuffers(c);
        }
    }

    @Override protected void release() {
        try {
            device.driver().streamDestroy(device.ordinal(), handle);
        } finally {
            // Closed mid-capture: no graph can come of it, so streams that joined it stop noting into it.
            if (captureBegunHere) captureEnded(capture);
        }
    }
    @Override public String describe() { return "stream 0x" + Long.toHexString(handle) + " on " + device; }
}
