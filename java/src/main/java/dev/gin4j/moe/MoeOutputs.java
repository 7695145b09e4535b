package dev.gin4j.moe;

import dev.gin4j.gpu.DeviceBuffer;

/**
 * Caller-owned buffers for one rank's dispatch results, in place of the instance's own; a null
 * component means the instance's buffer (the default). The dispatch writes them as it writes its
 * own and the returned {@link MoeDispatch} names them: {@code rows} the received rows expert-major
 * ({@link MoeAllToAll#capacityRows()} x {@link MoeConfig#dispatchRowBytes()} bytes at least),
 * {@code weights} f32 per row (4 x capacity rows bytes), {@code counts} int32 per local expert
 * (4 x {@link MoeAllToAll#localExperts()} bytes). Rows 16-byte aligned for fp8 rows, 2-byte for
 * bf16 (16 bytes gives the vector path); weights and counts 4-byte aligned. On the rank's device,
 * disjoint from each other and from the dispatch's inputs: checked at the call, which names what
 * was wrong. The instance never frees or reuses them: the rows of a dispatch stay there after the
 * next dispatch into other buffers (no copy for the expert backward).
 *
 * @param rows    the received rows, or null for the instance's
 * @param weights the received rows' router weights, or null for the instance's
 * @param counts  rows per local expert, or null for the instance's
 */
public record MoeOutputs(DeviceBuffer rows, DeviceBuffer weights, DeviceBuffer counts) {
    /** Every result in the instance's own buffers: what the dispatch without outputs does. */
    public static final MoeOutputs INSTANCE_OWNED = new MoeOutputs(null, null, null);

    /**
     * Only the rows in {@code rows}; weights and counts in the instance's buffers.
     * @param rows the caller's buffer for the received rows (size and alignment as the class comment says)
     * @return outputs that name only {@code rows}
     */
    public static MoeOutputs rows(DeviceBuffer rows) { return new MoeOutputs(rows, null, null); }
}
