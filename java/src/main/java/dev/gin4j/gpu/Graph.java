package dev.gin4j.gpu;

/** A captured and instantiated stream graph: replays all captured work with one launch. */
public final class Graph extends NativeResource {
    private final Device device;
    private final long graph;
    private final long exec;
    private volatile CapturedUses.Frozen uses;

    Graph(Device device, long graph, CapturedUses.Frozen uses) {
        this.device = device;
        this.graph = graph;
        this.uses = uses;
        this.exec = created(() -> {
            try {
                return device.driver().graphInstantiate(device.ordinal(), graph);
            } catch (Throwable t) {
                try {
                    device.driver().graphDestroy(device.ordinal(), graph);
                } catch (Throwable d) {
                    t.addSuppressed(d); // the instantiation failure is the one to report
                }
                throw t;
            }
        });
    }

    /** {@return the device the graph runs on} */
    public Device device() { return device; }

    /** {@return how many objects and memory scopes the captured work was noted to use (see {@link Stream#beginCapture()})} */
    public int noteCount() { return uses.size(); }

    /**
     * Replays the graph on {@code stream}.
     * @param stream the stream to replay on, of the graph's device
     * @throws IllegalStateException when something the captured work uses was closed or freed
     *     since the capture (a replay would touch memory that may be someone else's by now)
     */
    public void launch(Stream stream) {
        ensureOpen();
        device.check(stream.device(), "stream");
        String gone = uses.firstGone();
        if (gone != null) throw new IllegalStateException(describe() + " cannot be replayed: " + gone
                + "; a replay would touch memory that may belong to someone else by now. Close this graph and capture again while what it uses is open");
        device.driver().graphLaunch(device.ordinal(), exec, stream.handle());
    }

    @Override protected void release() {
        uses = CapturedUses.Frozen.NONE;  // no longer keeps what it noted reachable
        releaseAll(() -> device.driver().graphExecDestroy(device.ordinal(), exec),
                () -> device.driver().graphDestroy(device.ordinal(), graph));
    }

    @Override public String describe() { return "graph 0x" + Long.toHexString(exec) + " on " + device; }
}
