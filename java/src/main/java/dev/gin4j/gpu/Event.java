package dev.gin4j.gpu;

/** A point in a stream's work: record it, wait for it, time between two of them. */
public final class Event extends NativeResource {
    private final Device device;
    private final long handle;
    private final boolean timing;
    private volatile boolean recorded;
    volatile CapturedUses capture;  // the capture of the stream it was last recorded on (a stream waiting for it joins), or null

    Event(Device device, boolean timing) {
        this.device = device;
        this.timing = timing;
        this.handle = created(() -> device.driver().eventCreate(device.ordinal(), timing));
    }

    public Device device() { return device; }

    public long handle() {
        ensureOpen();
        return handle;
    }

    public void record(Stream stream) {
        device.check(stream.device(), "stream");
        device.driver().eventRecord(device.ordinal(), handle(), stream.handle());
        recorded = true;
        capture = stream.activeCapture();  // no note of the event itself: a plain record adds no event to the graph
    }

    public void synchronize() { device.driver().eventSynchronize(device.ordinal(), handle()); }
    public boolean isComplete() { return device.driver().eventQuery(device.ordinal(), handle()); }

    /**
     * Milliseconds from {@code start} to this event; both recorded and complete, both timing events.
     * @throws IllegalStateException when either event was never recorded, or was created without timing
     */
    public float elapsedMillisSince(Event start) {
        device.check(start.device, "start event");
        if (!timing || !start.timing) throw new IllegalStateException("elapsed time needs two timing events; one was created without timing");
        if (!start.recorded || !recorded) {
            throw new IllegalStateException("elapsed time needs both events recorded on a stream first: "
                    + (start.recorded ? "" : "the start event " + start.describe() + " was never recorded")
                    + (!start.recorded && !recorded ? " and " : "")
                    + (recorded ? "" : "the end event " + describe() + " was never recorded"));
        }
        return device.driver().eventElapsedMillis(device.ordinal(), start.handle(), handle());
    }

    @Override protected void release() { device.driver().eventDestroy(device.ordinal(), handle); }
    @Override public String describe() { return "event 0x" + Long.toHexString(handle) + " on " + device; }
}
