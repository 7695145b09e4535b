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
        } catch (RuntimeException ex) {
            device.driver().graphDestroy(device.ordinal(), graph);
            throw ex;
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
        try {
            device.driver().graphExecDestroy(device.ordinal(), exec);
        } finally {
            device.driver().graphDestroy(device.ordinal(), graph);
        }
    }

    @Override public String describe() { return "graph 0x" + Long.toHexString(exec) + " on " + device; }
}
