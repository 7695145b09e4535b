package dev.gin4j.gpu;

/** A captured and instantiated stream graph: replays all captured work with one launch. */
public final class Graph extends NativeResource {
    private final Device device;
    private final long graph;
    private final long exec;

    Graph(Device device, long graph) {
        this.device = device;
        this.graph = graph;
        long e;
        try {
            e = device.driver().graphInstantiate(device.ordinal(), graph);
        } catch (Throwable t) {
            constructionFailed();
            try {
                device.driver().graphDestroy(device.ordinal(), graph);
            } catch (Throwable d) {
                t.addSuppressed(d); // the instantiation failure is the one to report
            }
            throw t;
        }
        this.exec = e;
    }

    public Device device() { return device; }

    /** Replays the graph on {@code stream}. */
    public void launch(Stream stream) {
        ensureOpen();
        device.check(stream.device(), "stream");
        device.driver().graphLaunch(device.ordinal(), exec, stream.handle());
    }

    @Override protected void release() {
        releaseAll(() -> device.driver().graphExecDestroy(device.ordinal(), exec),
                () -> device.driver().graphDestroy(device.ordinal(), graph));
    }

    @Override public String describe() { return "graph 0x" + Long.toHexString(exec) + " on " + device; }
}
