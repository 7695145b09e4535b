package dev.gin4j.moe;

import dev.gin4j.gpu.DeviceBuffer;

/**
 * What a dispatch leaves on one rank, all on the device and valid until the next dispatch:
 * {@code rows} holds the received rows expert-major over the local experts (expert 0's rows first,
 * then by source rank, then by token), capacity rows long, bf16 {@code [capacity][hidden]} (an fp8
 * instance: scaled fp8 rows of {@link MoeConfig#dispatchRowBytes} bytes, see {@link Fp8Rows});
 * {@code counts} int32 rows per local expert; {@code weights} f32 per row. Pass it to
 * {@link MoeAllToAll#combine} with the expert outputs (bf16 {@code [capacity][hidden]}) in the same layout.
 */
public record MoeDispatch(int localIndex, int numTokens, long sequence, DeviceBuffer rows, DeviceBuffer counts, DeviceBuffer weights) {}
