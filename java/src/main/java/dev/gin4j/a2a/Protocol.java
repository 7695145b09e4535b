package dev.gin4j.a2a;

/**
 * How the GIN backend moves bytes. {@link #AUTO} picks by size; the others force one for
 * benchmarks and tests.
 */
public enum Protocol {
    AUTO,
    /** Small messages: 8-byte words that carry their own flag into a double-buffered staging area; one one-way latency. */
    LL,
    /**
     * Medium messages: 128-byte lines of 120 payload bytes and an 8-byte flag, each stored by one warp
     * instruction, into a double-buffered staging area; one one-way latency, 6.7 % extra bytes. Relies on
     * NVLink delivering such a line whole (as NCCL's LL128 does on sm_90); not validated on AMD, so
     * {@link #AUTO} never picks it there (forcing it on AMD is an experiment, not a supported mode).
     */
    LL128,
    /** Larger messages: 16-byte stores straight into the peer's receive slot, per-chunk ready and done flags. */
    DIRECT
}
