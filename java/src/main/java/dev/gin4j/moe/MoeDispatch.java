package dev.gin4j.moe;

import dev.gin4j.gpu.DeviceBuffer;
import dev.gin4j.gpu.Event;
import dev.gin4j.gpu.PinnedBuffer;

import java.lang.foreign.ValueLayout;

/**
 * What a dispatch leaves on one rank, all on the device: in the instance's buffers, valid until
 * the next dispatch, or in the caller's where the dispatch was given {@link MoeOutputs}:
 * {@code rows} holds the received rows expert-major over the local experts (expert 0's rows first,
 * then by source rank, then by token), capacity rows long, bf16 {@code [capacity][hidden]} (an fp8
 * instance: scaled fp8 rows of {@link MoeConfig#dispatchRowBytes} bytes, see {@link Fp8Rows});
 * {@code counts} int32 rows per local expert; {@code weights} f32 per row. Pass it to
 * {@link MoeAllToAll#combine} with the expert outputs (bf16, one row per received row) in the same
 * layout. Only the instance that made a handle accepts it, and only until its next dispatch.
 *
 * <p>For a grouped GEMM: with {@link MoeAllToAll#expertOffsets(boolean)} on, {@link #offsets()}
 * holds where each local expert's rows start; with {@link MoeAllToAll#hostCounts(boolean)} on,
 * {@link #hostCounts()} and {@link #hostOffsets()} give the same numbers on the host once the
 * dispatch's stream has run past its copy. Both are the instance's, valid until its next dispatch.
 */
public final class MoeDispatch {
    private final MoeAllToAll owner;
    private final int localIndex, numTokens;
    private final long sequence;
    private final DeviceBuffer rows, counts, weights, offsets;
    private final PinnedBuffer hostCopy;
    private final Event hostCopied;

    MoeDispatch(MoeAllToAll owner, int localIndex, int numTokens, long sequence, DeviceBuffer rows, DeviceBuffer counts, DeviceBuffer weights,
                DeviceBuffer offsets, PinnedBuffer hostCopy, Event hostCopied) {
        this.owner = owner;
        this.localIndex = localIndex;
        this.numTokens = numTokens;
        this.sequence = sequence;
        this.rows = rows;
        this.counts = counts;
        this.weights = weights;
        this.offsets = offsets;
        this.hostCopy = hostCopy;
        this.hostCopied = hostCopied;
    }

    MoeAllToAll owner() { return owner; }
    /** {@return the local rank (index into the group's local ranks) this dispatch ran on} */
    public int localIndex() { return localIndex; }
    /** {@return T: the tokens this rank dispatched} */
    public int numTokens() { return numTokens; }
    /** {@return this rank's dispatch number on its instance (1 for the first)} */
    public long sequence() { return sequence; }
    /** {@return the received rows, expert-major (see the class comment)} */
    public DeviceBuffer rows() { return rows; }
    /** {@return the int32 rows received per local expert ({@code [L]})} */
    public DeviceBuffer counts() { return counts; }
    /** {@return the f32 router weight per received row} */
    public DeviceBuffer weights() { return weights; }

    /**
     * int32 {@code [L + 1]} on the device: {@code offsets[e]} is the row of {@link #rows()} where
     * local expert {@code e}'s rows start, {@code offsets[L]} the end of the last expert's block
     * (an exclusive prefix sum of {@link #counts()}, each rounded up to
     * {@link MoeConfig#expertAlignment()}: with alignment 1, {@code offsets[L]} is the number of
     * rows received), written on the dispatch's stream after the dispatch. Rows
     * {@code [offsets[e] + counts[e], offsets[e + 1])} are padding, never written. The instance's
     * buffer, valid until its next dispatch.
     * @return the offsets
     * @throws IllegalStateException when the dispatch ran with {@link MoeAllToAll#expertOffsets(boolean)} and
     *         {@link MoeAllToAll#hostCounts(boolean)} off
     */
    public DeviceBuffer offsets() {
        if (offsets == null)
            throw new IllegalStateException(this + " computed no expert offsets: call moe.expertOffsets(true) (or hostCounts(true)) before the dispatch");
        return offsets;
    }

    /**
     * Whether the host copy of this dispatch's counts and offsets has landed (the dispatch's stream
     * has run past it), without waiting.
     * @return true once {@link #hostCounts()} returns without waiting
     * @throws IllegalStateException when the dispatch made no host copy, or a later dispatch replaced it
     */
    public boolean hostCountsReady() {
        requireHostCopy();
        return hostCopied.isComplete();
    }

    /**
     * Rows received per local expert ({@code [L]}), read on the host: waits for the copy queued at
     * the end of this dispatch (not for later work on the stream).
     * @return a fresh array of the counts
     * @throws IllegalStateException when the dispatch made no host copy ({@link MoeAllToAll#hostCounts(boolean)}
     *         was off), or a later dispatch on the instance replaced it
     */
    public int[] hostCounts() { return readHost(false); }

    /**
     * {@link #offsets()} read on the host ({@code [L + 1]}; the last is the end of the last block): waits
     * as {@link #hostCounts()} does.
     * @return a fresh array of the offsets
     * @throws IllegalStateException as {@link #hostCounts()}
     */
    public int[] hostOffsets() { return readHost(true); }

    /** The host words: counts [L], then offsets [L + 1]. */
    private int[] readHost(boolean offsets) {
        requireHostCopy();
        hostCopied.synchronize();
        requireHostCopy();  // still this dispatch's copy after the wait
        int L = owner.localExperts();
        return hostCopy.host().asSlice(offsets ? 4L * L : 0, offsets ? 4L * (L + 1) : 4L * L).toArray(ValueLayout.JAVA_INT);
    }

    private void requireHostCopy() {
        if (hostCopy == null)
            throw new IllegalStateException(this + " made no host copy of its counts: call moe.hostCounts(true) before the dispatch");
        owner.ensureOpen();
        owner.requireCompleted(localIndex, "reading " + this + "'s host counts");
        long last = owner.lastSequence(localIndex);
        if (last != sequence)
            throw new IllegalStateException(this + ": dispatch " + last + " on the instance has replaced its host counts (they are the instance's until its next dispatch)");
    }

    @Override public String toString() { return "MoeDispatch[local rank " + localIndex + ", T = " + numTokens + ", call " + sequence + "]"; }
}
