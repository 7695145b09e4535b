package dev.gin4j.gpu;

import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicBoolean;

/**
 * Base of every gin4j object that owns a native handle: idempotent close, use-after-close caught
 * with a message naming the object, and a process-wide registry of live objects so tests can assert
 * that everything they opened was closed. The use-after-close check is made when a call starts:
 * close an object only once no other thread is inside a call on it (or on what is built on it).
 * {@link dev.gin4j.comm.CommGroup#abort()} is the one close meant for another thread.
 */
public abstract class NativeResource implements AutoCloseable {
    private static final Map<NativeResource, String> LIVE = new ConcurrentHashMap<>();
    private final AtomicBoolean closed = new AtomicBoolean();

    /** Registers the new object as live (see {@link #liveCount()}). */
    protected NativeResource() {
        LIVE.put(this, getClass().getSimpleName());
    }

    /**
     * For a constructor whose native handle is made by {@code make}: returns the handle, or, when
     * {@code make} throws, takes the object out of the live registry (this base class registered it
     * first) and rethrows. {@code make} frees whatever it had created before its failure itself.
     *
     * @param make creates the native handle
     * @return the handle {@code make} returned
     */
    protected final long created(java.util.function.LongSupplier make) {
        try {
            return make.getAsLong();
        } catch (Throwable t) {
            constructionFailed();
            throw t;
        }
    }

    /**
     * For a constructor that fails after this base class registered the object (it does so first):
     * takes the object out of the live registry and marks it closed, without calling
     * {@link #release()}, since the handle it would release was never created. {@link #created}
     * does this for the usual case.
     */
    protected final void constructionFailed() {
        if (closed.compareAndSet(false, true)) LIVE.remove(this);
    }

    /** Releases the native handle; called once. */
    protected abstract void release();

    /** {@return what this object is, for messages ("stream 0x7f.. on device 0")} */
    public abstract String describe();

    /** {@return whether {@link #close()} was called} */
    public final boolean isClosed() { return closed.get(); }

    /**
     * Checks that this object is still open.
     * @throws IllegalStateException when this object was closed
     */
    public final void ensureOpen() {
        if (closed.get()) throw new IllegalStateException(describe() + " is closed");
    }

    @Override
    public final void close() {
        if (closed.compareAndSet(false, true)) {
            LIVE.remove(this);
            release();
        }
    }

    /**
     * Runs every step, even when one before it throws, then throws the first failure with the later
     * ones attached as suppressed: for releasing several things, so that one failing release (after
     * a sticky GPU fault, say) does not leak the rest.
     *
     * @param steps the release steps, run in order
     */
    public static void releaseAll(Runnable... steps) {
        RuntimeException first = null;
        for (Runnable step : steps) {
            try {
                step.run();
            } catch (RuntimeException e) {
                if (first == null) first = e;
                else first.addSuppressed(e);
            }
        }
        if (first != null) throw first;
    }

    /** {@return the number of native objects (streams, events, code objects, graphs, ...) not yet closed} */
    public static int liveCount() { return LIVE.size(); }

    /** {@return descriptions of the objects not yet closed, one a line, for test failure messages} */
    public static String liveSummary() {
        StringBuilder sb = new StringBuilder();
        LIVE.keySet().forEach(r -> sb.append(r.describe()).append('\n'));
        return sb.toString();
    }
}
