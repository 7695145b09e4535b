package dev.gin4j.internal.comm;

import dev.gin4j.comm.CommException;
import dev.gin4j.comm.CommGroup;
import dev.gin4j.comm.ErrorCheck;

import dev.gin4j.gpu.NativeResource;
import dev.gin4j.gpu.Stream;

import java.lang.foreign.ValueLayout;
import java.util.List;

/** The {@link ErrorCheck} the exchanges return: one pinned word and event per local rank, read once every stream has run past them. */
public final class PendingErrorCheck implements ErrorCheck {
    /** One local rank: its word, the slot its copy lands in, its stream, and what its host part found (or null). */
    record Entry(KernelErrors words, KernelErrors.Slot slot, Stream stream, String hostFailure) {}

    private final String operation;
    private final NativeResource owner;
    private final CommGroup group;
    private final List<Entry> entries;
    private boolean reported;
    private RuntimeException failure;

    PendingErrorCheck(String operation, NativeResource owner, CommGroup group, List<Entry> entries) {
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
    @Override public synchronized boolean isDone() {
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
    @Override public synchronized boolean poll() {
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
    @Override public void await() {
        synchronized (this) {
            if (reported) {
                report();
                return;
            }
            requireOwnerOpen();
        }
        for (Entry e : entries) {
            if (group != null) Groups.await(group, e.stream(), "a later error check of the " + operation);
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
