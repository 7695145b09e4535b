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
     * <p>Memory per GPU beside the low-latency sections (the instance allocates both, so that the
     * mode can change per call), with M = maxTokens, N nodes, S = N F entry slots (F = 1 for equal
     * nodes), G ranks in the largest node, L = experts / ranks: {@code (2S + 2N) align256(align256(
     * align16(8 + 4GL) + 12MK) + M rowBytes)} of node sections, {@code 2SG align256(2MH)} of the
     * node's partials, {@code 4SMG + 4MN + 4S(1 + G + GC)} of positions (C the chunks). DeepSeek-V3 bf16 at M = 4096 on 2
     * nodes of 2: about 0.95 GB. Creation refuses a window over half the GPU's memory, naming the parts.
     */
    HIGH_THROUGHPUT
}
