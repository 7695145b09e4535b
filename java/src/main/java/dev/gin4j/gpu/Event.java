package dev.gin4j.gpu;

/**
 * A point in a stream's work: record it, wait for it, time between two of them. Made by
 * {@link Device#createEvent()}, or by other CUDA/HIP code and handed over with {@link #wrap(long, Device)}.
 */
public final class Event extends NativeResource {
    private final Device device;
    private final long handle;
    private final boolean timing;
    private final boolean owned;  // false: made elsewhere (wrap); close forgets it, never destroys it
    private volatile boolean recorded;
    volatile CapturedUses capture;  // the capture of the stream it was last recorded on (a stream waiting for it joins), or null

    Event(Device device, boolean timing) {
        this.device = device;
        this.timing = timing;
        this.owned = true;
        this.handle = created(() -> device.driver().eventCreate(device.ordinal(), timing));
    }

    private Event(Device device, long handle) {
        this.device = device;
        this.handle = handle;
        this.owned = false;
        // whether it times and whether other code recorded it are unknown here: the runtime refuses what cannot be done
        this.timing = true;
        this.recorded = true;
    }

    /**
     * An event made by other CUDA/HIP code ({@code CUevent} / {@code hipEvent_t}), to record on
     * gin4j's streams or to make them wait for. gin4j does not own it: {@link #close()} only forgets
     * it and never destroys it; its maker destroys it once the wrapper is closed. The handle must
     * belong to {@code device}, which gin4j cannot check. Whether it was made with timing and
     * whether it was recorded elsewhere is not known: {@link #elapsedMillisSince} leaves those checks
     * to the runtime, whose refusal comes as a {@link GpuException}.
     *
     * @param handle the native event handle, not 0
     * @param device the device the event belongs to
     * @return a wrapper that never destroys the event
     * @throws IllegalArgumentException for a 0 handle
     * @throws NullPointerException for a null device
     */
    public static Event wrap(long handle, Device device) {
        if (handle == 0) throw new IllegalArgumentException("Event.wrap needs an event handle made by CUDA/HIP code, got 0 (no event): pass a created event, or use Device.createEvent()");
        java.util.Objects.requireNonNull(device, "Event.wrap needs the device the event belongs to, got null");
        return new Event(device, handle);
    }

    /** {@return whether gin4j made this event and destroys it on {@link #close()} (false for {@link #wrap})} */
    public boolean isOwned() { return owned; }

    /** {@return the device the event belongs to} */
    public Device device() { return device; }

    /** {@return the native handle ({@code CUevent} / {@code hipEvent_t}), after checking the event is open} */
    public long handle() {
        ensureOpen();
        return handle;
    }

    /**
     * Records the event at the current end of {@code stream}'s work (a stream of the same device).
     *
     * @param stream the stream whose work the event marks
     */
    public void record(Stream stream) {
        device.check(stream.device(), "stream");
        device.driver().eventRecord(device.ordinal(), handle(), stream.handle());
        recorded = true;
        capture = stream.activeCapture();  // no note of the event itself: a plain record adds no event to the graph
    }

    /** Waits until the work before the last record of this event has finished. */
    public void synchronize() { device.driver().eventSynchronize(device.ordinal(), handle()); }
    /** {@return whether the work before the last record of this event has finished (true for an event never recorded)} */
    public boolean isComplete() { return device.driver().eventQuery(device.ordinal(), handle()); }

    /**
     * Milliseconds from {@code start} to this event; both recorded and complete, both timing events.
     * @param start the earlier event, of the same device
     * @return the elapsed time in milliseconds
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

    @Override protected void release() { if (owned) device.driver().eventDestroy(device.ordinal(), handle); }
    @Override public String describe() { return (owned ? "event 0x" : "wrapped event 0x") + Long.toHexString(handle) + " on " + device; }
}
