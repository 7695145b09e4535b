package dev.gin4j.moe;

import dev.gin4j.gpu.Stream;

/**
 * One rank's staged exchange: a {@code dispatchSend} or {@code combineSend} whose
 * {@code complete} has not been queued yet. Every other MoE call on the rank is refused until it
 * is, so that the sections a send wrote are not reused before the peers read them; the complete
 * must be queued on the send's stream and, like the send, inside a graph capture or outside one,
 * so that a replay never runs one half without the other.
 */
final class StagedExchange {
    enum Kind {
        DISPATCH("dispatchSend"), COMBINE("combineSend");

        final String call;

        Kind(String call) { this.call = call; }
    }

    private Kind pending;
    private Stream stream;
    private boolean captured;
    private Runnable launch, after;

    /** Refuses {@code operation} while an exchange is sent and not completed. */
    void requireNone(String rank, String operation) {
        if (pending != null)
            throw new IllegalStateException(rank + ": " + operation + " while the " + pending.call + " on " + stream
                    + " is not completed: call complete on that stream first");
    }

    /**
     * After a send was queued on {@code stream} ({@code captured}: inside a graph capture):
     * {@code launch} queues the rest of the exchange, {@code after} what follows it on the
     * stream (run once the launch was queued).
     */
    void begin(String rank, Kind kind, Stream stream, boolean captured, Runnable launch, Runnable after) {
        requireNone(rank, kind.call);
        this.pending = kind;
        this.stream = stream;
        this.captured = captured;
        this.launch = launch;
        this.after = after;
    }

    /**
     * Queues the pending exchange's rest, if it was sent on {@code stream} with the same capture
     * state. The exchange stays pending when the launch fails (a complete may be tried again);
     * it is done once the launch was queued, and {@code after} runs then.
     */
    void complete(String rank, Stream stream, boolean captured) {
        if (pending == null) throw new IllegalStateException(rank + ": complete without a dispatchSend or combineSend before it");
        if (stream != this.stream)
            throw new IllegalArgumentException(rank + ": complete on " + stream + ", but the " + pending.call + " was queued on " + this.stream
                    + ": complete it on the same stream");
        if (captured != this.captured)
            throw new IllegalStateException(rank + ": the " + pending.call + " was queued " + (this.captured ? "inside" : "outside") + " a graph capture and complete "
                    + (captured ? "inside" : "outside") + " one: capture both halves together, or neither (a replay must run both)");
        launch.run();
        Runnable then = after;
        pending = null;
        this.stream = null;
        launch = null;
        after = null;
        then.run();
    }

    boolean isPending() { return pending != null; }
}
