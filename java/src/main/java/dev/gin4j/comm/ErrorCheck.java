package dev.gin4j.comm;

import dev.gin4j.gpu.NativeResource;
import dev.gin4j.gpu.Stream;

import java.lang.foreign.ValueLayout;
import java.util.List;

/**
 * A check of the kernels' error words that reports later, without stalling the pipeline: made by
 * {@code errorsAfter(streams)} of an exchange ({@link dev.gin4j.a2a.AllToAll#errorsAfter},
 * {@link dev.gin4j.a2a.AllToAllV#errorsAfter}, {@link dev.gin4j.moe.MoeAllToAll#errorsAfter},
 * {@link dev.gin4j.moe.Fp8Rows#errorsAfter}), which queues on each stream, after the work already
 * there, an asynchronous copy of the error word into pinned memory, a clear of the word and an
 * event, and returns at once. Once the streams have run that far, {@link #poll()} reports what
 * the calls queued before it (and after the previous check or {@code checkErrors}) found wrong,
 * with the same text as the synchronous {@code checkErrors}: it returns {@code true} for a clean
 * result and throws the {@link CommException} {@code checkErrors} would have thrown otherwise.
 * A kernel time-out also aborts the group then, as {@code checkErrors} does.
 *
 * <pre>{@code
 * ErrorCheck check = moe.errorsAfter(stream);   // queued, nothing waits
 * ...                                           // queue the next micro-batch
 * if (check.poll()) { ... }                     // true: clean; false: not there yet; throws: an error
 * }</pre>
 *
 * <p>The outcome is computed once: later calls of {@link #poll()} or {@link #await()} return
 * {@code true} again or throw the same exception again. Each check holds a small pinned word and
 * an event per local rank until it has reported, then gives them back for reuse; poll or await
 * every check you make (an instance refuses more than 256 unreported checks per rank). Polling
 * only looks at the events: it cannot see a HOST exchange stuck on a peer that never joins, nor
 * NCCL's asynchronous errors; {@link #await()} waits as {@code checkErrors} does and sees both.
 * Thread-safe.
 */
public final class ErrorCheck {
    /** One local rank: its word, the slot its copy lands in, its stream, and what its host part found (or null). */
    record Entry(KernelErrors words, KernelErrors.Slot slot, Stream stream, String hostFailure) {}

    private final String operation;
    private final NativeResource owner;
    private final CommGroup group;
    private final List<Entry> entries;
    private boolean reported;
    private RuntimeException failure;

    ErrorCheck(String operation, NativeResource owner, CommGroup group, List<Entry> entries) {
        this.operation = operation;
        this.owner = owner;
        this.group = group;
        this.entries = List.copyOf(entries);
    }

    /**
     * Whether every stream has run past the check's point, so that {@link #poll()} reports; does
     * not throw for errors the kernels reported (only for a closed instance or a runtime failure).
     * @throws IllegalStateException when the instance that made the check was closed before it reported
     */
    public synchronized boolean isDone() {
        if (reported) return true;
        requireOwnerOpen();
        for (Entry e : entries)
            if (!e.slot().done().isComplete()) return false;
        return true;
    }

    /**
     * Without waiting: {@code false} while a stream has not yet run past the check's point;
     * {@code true} once it has and the calls before it reported nothing.
     * @throws CommException what the calls before the check reported, as {@code checkErrors} words it
     *         (every local rank's, the first thrown and the others suppressed)
     * @throws IllegalStateException when the instance that made the check was closed before it reported
     */
    public synchronized boolean poll() {
        if (!isDone()) return false;
        report();
        return true;
    }

    /**
     * Waits until the check reports, then as {@link #poll()}. With a communicator group it waits as
     * {@code checkErrors} does (for all work queued on the streams so far, within the group's
     * host-wait time-out, watching NCCL's asynchronous errors); {@link dev.gin4j.moe.Fp8Rows}' check
     * waits for its event.
     * @throws CommException what the calls before the check reported, or a failed wait
     * @throws IllegalStateException when the instance that made the check was closed before it reported
     */
    public void await() {
        synchronized (this) {
            if (reported) {
                report();
                return;
            }
            requireOwnerOpen();
        }
        for (Entry e : entries) {
            if (group != null) group.await(e.stream(), "a later error check of the " + operation);
            else e.slot().done().synchronize();
        }
        poll();
    }

    private void requireOwnerOpen() {
        if (owner.isClosed() || entries.stream().anyMatch(e -> !e.words().isAlive()))
            throw new IllegalStateException(owner.describe() + " was closed before this error check reported: poll or await checks before closing what made them");
    }

    /** Reads every rank's copied word once, gives the slots back, and throws or returns as the outcome says. */
    private void report() {
        if (!reported) {
            RuntimeException first = null;
            boolean timedOut = false;
            for (Entry e : entries) {
                int bits = e.slot().copy().host().get(ValueLayout.JAVA_INT, 0);
                e.words().release(e.slot());
                RuntimeException rank = null;
                if (e.hostFailure() != null) rank = new CommException(e.hostFailure());
                if (bits != 0) {
                    timedOut |= KernelErrors.timedOut(bits);
                    CommException kernels = e.words().failure(operation, bits);
                    if (rank == null) rank = kernels;
                    else rank.addSuppressed(kernels);
                }
                if (rank == null) continue;
                if (first == null) first = rank;
                else first.addSuppressed(rank);
            }
            reported = true;
            try {
                KernelErrors.throwCollected(first, timedOut, group);
            } catch (RuntimeException f) {
                failure = f;
            }
        }
        if (failure != null) throw failure;
    }

    @Override public String toString() {
        return "error check of the " + operation + " on " + entries.size() + " stream(s)" + (reported ? failure == null ? ": clean" : ": failed" : "");
    }
}
