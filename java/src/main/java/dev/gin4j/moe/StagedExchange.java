package dev.gin4j.moe;

import dev.gin4j.gpu.Stream;

/**
 * One rank's staged exchange: a {@code dispatchSend} or {@code combineSend} whose
 * {@code complete} has not been queued yet. Every other MoE call on the rank is refused until it
 * is, so that the sections a send wrote are not reused before the peers read them.
 */
final class StagedExchange {
    enum Kind {
        DISPATCH("dispatchSend"), COMBINE("combineSend");

        final String call;

        Kind(String call) { this.call = call; }
    }

    private Kind pending;
    private Stream stream;
    private Runnable completion;

    /** Refuses {@code operation} while an exchange is sent and not completed. */
    void requireNone(String rank, String operation) {
        if (pending != null)
            throw new IllegalStateException(rank + ": " + operation + " while the " + pending.call + " on " + stream
                    + " is not completed: call complete on that stream first");
    }

    /** After a send was queued on {@code stream}: {@code completion} queues the rest of it. */
    void begin(String rank, Kind kind, Stream stream, Runnable completion) {
        requireNone(rank, kind.call);
        this.pending = kind;
        this.stream = stream;
        this.completion = completion;
    }

    /** The pending exchange's completion, if it was sent on {@code stream}; no longer pending after. */
    Runnable take(String rank, Stream stream) {
        if (pending == null) throw new IllegalStateException(rank + ": complete without a dispatchSend or combineSend before it");
        if (stream != this.stream)
            throw new IllegalArgumentException(rank + ": complete on " + stream + ", but the " + pending.call + " was queued on " + this.stream
                    + ": complete it on the same stream");
        Runnable c = completion;
        pending = null;
        this.stream = null;
        completion = null;
        return c;
    }

    boolean isPending() { return pending != null; }
}
