package dev.gin4j.comm;

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
public interface ErrorCheck {
    /**
     * Whether every stream has run past the check's point, so that {@link #poll()} reports; does
     * not throw for errors the kernels reported (only for a closed instance or a runtime failure).
     * @return true once {@link #poll()} would report
     * @throws IllegalStateException when the instance that made the check was closed before it reported
     */
    boolean isDone();

    /**
     * Without waiting: {@code false} while a stream has not yet run past the check's point;
     * {@code true} once it has and the calls before it reported nothing.
     * @return true for a clean result, false while not yet known
     * @throws CommException what the calls before the check reported, as {@code checkErrors} words it
     *         (every local rank's, the first thrown and the others suppressed)
     * @throws IllegalStateException when the instance that made the check was closed before it reported
     */
    boolean poll();

    /**
     * Waits until the check reports, then as {@link #poll()}. With a communicator group it waits as
     * {@code checkErrors} does (for all work queued on the streams so far, within the group's
     * host-wait time-out, watching NCCL's asynchronous errors); {@link dev.gin4j.moe.Fp8Rows}' check
     * waits for its event.
     * @throws CommException what the calls before the check reported, or a failed wait
     * @throws IllegalStateException when the instance that made the check was closed before it reported
     */
    void await();
}
