package dev.gin4j.gpu;

import java.lang.foreign.MemorySegment;

/** An ordered queue of GPU work on one device (a non-blocking stream). */
public final class Stream extends NativeResource {
    private final Device device;
    private final long handle;
    private volatile CapturedUses capture;  // while capturing: what the captured work uses

    Stream(Device device) {
        this.device = device;
        long h;
        try {
            h = device.driver().streamCreate(device.ordinal());
        } catch (Throwable t) {
            constructionFailed();
            throw t;
        }
        this.handle = h;
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
        noteUse(event);
    }

    /** Records a new event here; convenience for timing and cross-stream ordering. */
    public void record(Event event) { event.record(this); }

    /**
     * Starts capturing the work queued on this stream into a graph (until {@link #endCapture()}).
     * gin4j notes what each captured operation uses (its buffers, kernels, events, instances), and
     * the graph refuses to replay once one of them is closed or freed. Work that other streams
     * queue after joining the capture through an event is captured but not noted.
     */
    public void beginCapture() {
        device.driver().beginCapture(device.ordinal(), handle());
        capture = new CapturedUses();
    }

    /**
     * Ends the capture and instantiates the graph, ready to {@link Graph#launch(Stream)}. CUDA
     * refuses to instantiate while another stream captures on this thread: with one thread driving
     * several GPUs, capture them one after the other.
     */
    public Graph endCapture() {
        CapturedUses uses = capture;
        capture = null;
        long graph = device.driver().endCapture(device.ordinal(), handle());
        return new Graph(device, graph, uses == null ? CapturedUses.Frozen.NONE : uses.freeze());
    }

    /** true between {@link #beginCapture()} and {@link #endCapture()}. */
    public boolean isCapturing() { return capture != null; }

    /**
     * Notes that the work being queued here uses {@code resource}: while this stream captures, the
     * graph will refuse to replay once {@code resource} is closed. gin4j's own operations call it;
     * call it for what your own kernels use through raw addresses. Nothing happens outside a capture.
     */
    public void noteUse(NativeResource resource) {
        CapturedUses c = capture;
        if (c != null) c.add(resource);
    }

    /** As {@link #noteUse(NativeResource)}, for device memory: the graph refuses to replay once its arena is closed. */
    public void noteUse(DeviceBuffer buffer) {
        CapturedUses c = capture;
        if (c != null) c.add(buffer.segment(), buffer);
    }

    /** A host segment an asynchronous copy reads or writes. */
    void noteUse(MemorySegment host, String what) {
        CapturedUses c = capture;
        if (c != null) c.add(host, what);
    }

    /** A kernel launch: its code object and the device buffers of its arguments. */
    void noteLaunch(CodeObject codeObject, KernelArgs args) {
        CapturedUses c = capture;
        if (c != null) {
            c.add(codeObject);
            args.noteBuffers(c);
        }
    }

    @Override protected void release() { device.driver().streamDestroy(device.ordinal(), handle); }
    @Override public String describe() { return "stream 0x" + Long.toHexString(handle) + " on " + device; }
}
