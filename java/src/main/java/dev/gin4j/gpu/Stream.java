package dev.gin4j.gpu;

/** An ordered queue of GPU work on one device (a non-blocking stream). */
public final class Stream extends NativeResource {
    private final Device device;
    private final long handle;

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
    }

    /** Records a new event here; convenience for timing and cross-stream ordering. */
    public void record(Event event) { event.record(this); }

    /** Starts capturing the work queued on this stream into a graph (until {@link #endCapture()}). */
    public void beginCapture() { device.driver().beginCapture(device.ordinal(), handle()); }

    /**
     * Ends the capture and instantiates the graph, ready to {@link Graph#launch(Stream)}. CUDA
     * refuses to instantiate while another stream captures on this thread: with one thread driving
     * several GPUs, capture them one after the other.
     */
    public Graph endCapture() {
        long graph = device.driver().endCapture(device.ordinal(), handle());
        return new Graph(device, graph);
    }

    @Override protected void release() { device.driver().streamDestroy(device.ordinal(), handle); }
    @Override public String describe() { return "stream 0x" + Long.toHexString(handle) + " on " + device; }
}
