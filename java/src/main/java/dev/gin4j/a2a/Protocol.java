package dev.gin4j.a2a;

/**
 * How the GIN backend moves bytes. {@link #AUTO} picks by size; the others force one for
 * benchmarks and tests.
 */
public enum Protocol {
    /** Picks by size: LL, LL128 or DIRECT (and COPY_ENGINE for large messages where it is measured faster). */
    AUTO,
    /**
     * Small messages: 8-byte words that carry their own flag into a double-buffered staging area; one one-way
     * latency, twice the bytes. {@link #AUTO}'s choice up to 128 KiB per peer on AMD; on NVIDIA LL128 was faster
     * at every size measured (4 KiB and up).
     */
    LL,
    /**
     * Small and medium messages (up to 2 MiB per peer under {@link #AUTO} on NVIDIA): 128-byte lines of 120 payload bytes and an 8-byte flag, each stored by one warp
     * instruction, into a double-buffered staging area; one one-way latency, 6.7 % extra bytes. Relies on
     * NVLink delivering such a line whole (as NCCL's LL128 does on sm_90); not validated on AMD, so
     * {@link #AUTO} never picks it there (forcing it on AMD is an experiment, not a supported mode).
     */
    LL128,
    /** Larger messages: 16-byte stores straight into the peer's receive slot, per-chunk ready and done flags. */
    DIRECT,
    /**
     * The largest uniform messages: the copy engines move the remote slots (they carry ~5 % more over
     * H200's NVLink than SM stores), enqueued between a ready-handshake kernel and a done kernel; a
     * kernel on a second stream copies the self slot. Uniform all-to-all only (all-to-all-v runs
     * {@link #DIRECT}: its counts live on the device); LSA peers only. {@link #AUTO} picks it on
     * NVIDIA only. If a peer is late past the kernels' time-out, the copies still run (an engine
     * cannot be told to skip): the error is reported and that call's results are invalid.
     */
    COPY_ENGINE
}
