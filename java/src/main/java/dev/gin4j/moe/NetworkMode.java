package dev.gin4j.moe;

/**
 * How a {@code Backend.GIN} MoE exchange whose ranks span several nodes moves rows between nodes
 * ({@link MoeAllToAll#networkMode(NetworkMode)}). Inside one node there is one path and this
 * setting has no effect.
 */
public enum NetworkMode {
    /**
     * {@link #HIGH_THROUGHPUT} where some node has two or more ranks and the instance's
     * {@code maxTokens} is at least {@link MoeAllToAll#AUTO_HIGH_THROUGHPUT_TOKENS} (prefill and
     * training batches), else {@link #LOW_LATENCY}. Decided from the configuration and the node
     * table, which every rank shares, never from a call's token count (ranks may differ in it).
     */
    AUTO,
    /**
     * One row per (token, destination rank), put straight into that rank's receive section: the
     * fewest hops, for decode and small batches. Bytes between nodes: tokens x distinct destination
     * ranks x row bytes.
     */
    LOW_LATENCY,
    /**
     * One row per (token, destination node), put into one entry rank of that node, which forwards
     * it to the node's ranks that the token goes to; the combine reduces inside the node first.
     * Bytes between nodes: tokens x distinct destination nodes x row bytes.
     */
    HIGH_THROUGHPUT
}
