package dev.gin4j.moe;

import dev.gin4j.gpu.DeviceBuffer;

/**
 * What a dispatch leaves on one rank, all on the device: in the instance's buffers, valid until
 * the next dispatch, or in the caller's where the dispatch was given {@link MoeOutputs}:
 * {@code rows} holds the received rows expert-major over the local experts (expert 0's rows first,
 * then by source rank, then by token), capacity rows long, bf16 {@code [capacity][hidden]} (an fp8
 * instance: scaled fp8 rows of {@link MoeConfig#dispatchRowBytes} bytes, see {@link Fp8Rows});
 * {@code counts} int32 rows per local expert; {@code weights} f32 per row. Pass it to
 * {@link MoeAllToAll#combine} with the expert outputs (bf16, one row per received row) in the same
 * layout. Only the instance that made a handle accepts it, and only until its next dispatch.
 */
public final class MoeDispatch {
    private final MoeAllToAll owner;
    private final int localIndex, numTokens;
    private final long sequence;
    private final DeviceBuffer rows, counts, weights;

    MoeDispatch(MoeAllToAll owner, int localIndex, int numTokens, long sequence, DeviceBuffer rows, DeviceBuffer counts, DeviceBuffer weights) {
        this.owner = owner;
        this.localIndex = localIndex;
        this.numTokens = numTokens;
        this.sequence = sequence;
        this.rows = rows;
        this.counts = counts;
        this.weights = weights;
    }

    MoeAllToAll owner() { return owner; }
    /** The local rank (index into the group's local ranks) this dispatch ran on. */
    public int localIndex() { return localIndex; }
    /** T: the tokens this rank dispatched. */
    public int numTokens() { return numTokens; }
    /** This rank's dispatch number on its instance (1 for the first). */
    public long sequence() { return sequence; }
    /** The received rows, expert-major (see the class comment). */
    public DeviceBuffer rows() { return rows; }
    /** int32 rows received per local expert. */
    public DeviceBuffer counts() { return counts; }
    /** f32 router weight per received row. */
    public DeviceBuffer weights() { return weights; }

    @Override public String toString() { return "MoeDispatch[local rank " + localIndex + ", T = " + numTokens + ", call " + sequence + "]"; }
}
