package dev.gin4j.a2a;

/**
 * How the GIN backend moves bytes. {@link #AUTO} picks by size; the others force one for
 * benchmarks and tests.
 */
public enum Protocol {
    AUTO,
    /** Small messages: 8-byte words that carry their own flag into a double-buffered staging area; one one-way latency. */
    LL,
    /** Larger messages: 16-byte stores straight into the peer's receive slot, per-chunk ready and done flags. */
    DIRECT
}
