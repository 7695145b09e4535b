package dev.gin4j.gpu;

import java.lang.foreign.MemorySegment;

/**
 * An ordered queue of GPU work on one device: a non-blocking stream made by
 * {@link Device#createStream()}, or one made by other CUDA/HIP code and handed over with
 * {@link #wrap(long, Device)}.
 */
public final class Stream extends NativeResource {
    private final Device device;
    private final long handle;
    private final boolean owned;  // false: made elsewhere (wrap); close forgets it, never destroys it
    private volatile CapturedUses capture;  // while capturing (as origin or joined): what the captured work uses
    private volatile boolean captureBegunHere;  // capture was begun on this stream (not joined through an event)

    Stream(Device device) {
        this.device = device;
        this.owned = true;
        this.handle = created(() -> device.driver().streamCreate(device.ordinal()));
    }

    private Stream(Device device, long handle) {
        this.device = device;
        this.owned = false;
        this.handle = handle;
    }

    /**
     * A stream made by other CUDA/HIP code ({@code CUstream} / {@code hipStream_t}, PyTorch's
     * {@code torch.cuda.Stream.cuda_stream}, a JCuda or JavaCPP stream's address), for gin4j's calls
     * to queue their work on. gin4j does not own it: {@link #close()} only forgets it and never
     * destroys it; its maker destroys it, after the work queued here is done and the wrapper is
     * closed. The handle must belong to {@code device} (CUDA: that device's primary context), which
     * gin4j cannot check. A capture begun by other code on it is seen ({@link #isCapturing()}) but
     * gets none of the replay checks of {@link #beginCapture()}'s graphs.
     *
     * @param handle the native stream handle; 0 (the legacy default stream) is refused
     * @param device the device the stream belongs to
     * @return a wrapper that never destroys the stream
     * @throws IllegalArgumentException for a 0 handle
     * @throws NullPointerException for a null device
     */
    public static Stream wrap(long handle, Device device) {
        if (handle == 0) throw new IllegalArgumentException("Stream.wrap needs a stream handle made by CUDA/HIP code, got 0 (the legacy default stream, which gin4j does not queue on): pass a created stream, or use Device.createStream()");
        java.util.Objects.requireNonNull(device, "Stream.wrap needs the device the stream belongs to, got null");
        return new Stream(device, handle);
    }

    /** {@return whether gin4j made this stream and destroys it on {@link #close()} (false for {@link #wrap})} */
    public boolean isOwned() { return owned; }

    /** {@return the device the stream belongs to} */
    public Device device() { return device; }

    /** {@return the native handle, after checking the stream is open} */
    public long handle() {
        ensureOpen();
        return handle;
    }

    /** Waits until all work queued so far has finished. */
    public void synchronize() { device.driver().streamSynchronize(device.ordinal(), handle()); }

    /** {@return true when all queued work has finished} */
    public boolean isIdle() { return device.driver().streamQuery(device.ordinal(), handle()); }

    /**
     * Later work on this stream waits for {@code event} (recorded on any stream of this device).
     *
     * @param event the event to wait for, of this stream's device
     */
    public void waitFor(Event event) {
        device.check(event.device(), "event");
        device.driver().streamWaitEvent(device.ordinal(), handle(), event.handle());
        CapturedUses joined = event.capture;  // an event recorded on a capturing stream pulls this one into the capture (fork)
        if (joined != null && !joined.ended && activeCapture() == null) capture = joined;
    }

    /**
     * Records {@code event} on this stream (as {@link Event#record}); for timing and cross-stream ordering.
     *
     * @param event the event to record, of this stream's device
     */
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
        device.noteCapture(this, false);
    }

    /**
     * Ends the capture and instantiates the graph, ready to {@link Graph#launch(Stream)}. CUDA
     * refuses to instantiate while another stream captures on this thread: with one thread driving
     * several GPUs, capture them one after the other.
     *
     * @return the instantiated graph; close it when done
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
        if (captureBegunHere) device.noteCapture(this, true);
        if (uses != null) uses.ended = true;
        capture = null;
        captureBegunHere = false;
    }

    /** The capture this stream notes into: begun here or joined through an event, and not ended. */
    CapturedUses activeCapture() {
        CapturedUses c = capture;
        return c == null || c.ended ? null : c;
    }

    /**
     * true between {@link #beginCapture()} and {@link #endCapture()}, or while joined to another
     * stream's capture; for a {@link #wrap wrapped} stream also while a capture begun by other code
     * is under way on it (asked of the runtime).
     *
     * @return whether work queued here is being captured
     */
    public boolean isCapturing() { return activeCapture() != null || !owned && device.driver().isCapturing(device.ordinal(), handle()); }

    /**
     * Notes that the work being queued here uses {@code resource}: while this stream captures, the
     * graph will refuse to replay once {@code resource} is closed. gin4j's own operations call it;
     * call it for what your own kernels use through raw addresses. Nothing happens outside a capture.
     *
     * @param resource what the captured work uses
     */
    public void noteUse(NativeResource resource) {
        CapturedUses c = activeCapture();
        if (c != null) c.add(resource);
    }

    /**
     * As {@link #noteUse(NativeResource)}, for device memory: the graph refuses to replay once its arena is closed.
     *
     * @param buffer the device memory the captured work uses
     */
    public void noteUse(DeviceBuffer buffer) {
        CapturedUses c = activeCapture();
        if (c != null) c.add(buffer.segment(), buffer);
    }

    /**
     * As {@link #noteUse(NativeResource)}, for native memory reached through a raw address (pinned
     * host memory, say): the graph refuses to replay once {@code memory}'s arena is closed.
     *
     * @param memory the native memory the captured work uses
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
            if (owned) device.driver().streamDestroy(device.ordinal(), handle);
        } finally {
            // Closed mid-capture: no graph can come of it, so streams that joined it stop noting into it.
            if (captureBegunHere) captureEnded(capture);
        }
    }
    @Override public String describe() { return (owned ? "stream 0x" : "wrapped stream 0x") + Long.toHexString(handle) + " on " + device; }
}
