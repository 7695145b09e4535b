package dev.gin4j.a2a;

/**
 * One launch shape of the GIN kernels: protocol, chunks per peer (grid = ranks x chunks) and
 * threads per block. Chosen by size from measurements on 2 H200 over NVLink (gin-kernels/KERNELS.md).
 */
public record Plan(Protocol protocol, int chunksPerPeer, int threads) {
    /** Largest per-peer message the LL protocol is used for by default, and the LL staging capacity. */
    public static final long LL_MAX_BYTES_PER_PEER = 128 * 1024;
    public static final int MAX_CHUNKS_PER_PEER = 64;

    public Plan {
        if (protocol == Protocol.AUTO) throw new IllegalArgumentException("a plan names a concrete protocol");
        if (chunksPerPeer < 1 || chunksPerPeer > MAX_CHUNKS_PER_PEER) throw new IllegalArgumentException("chunks per peer " + chunksPerPeer + " outside [1, " + MAX_CHUNKS_PER_PEER + "]");
        int max = protocol == Protocol.LL ? 512 : 1024;
        if (threads < 32 || threads > max || threads % 32 != 0) throw new IllegalArgumentException("threads " + threads + " must be a multiple of 32 in [32, " + max + "] for " + protocol);
    }

    /** The default plan for a per-peer message size; {@code forced} overrides the protocol. */
    public static Plan choose(long bytesPerPeer, Protocol forced) {
        Protocol p = forced != Protocol.AUTO ? forced : bytesPerPeer <= LL_MAX_BYTES_PER_PEER ? Protocol.LL : Protocol.DIRECT;
        if (p == Protocol.LL) {
            if (bytesPerPeer <= 2 * 1024) return new Plan(p, 1, 256);
            if (bytesPerPeer <= 8 * 1024) return new Plan(p, 4, 512);
            return new Plan(p, 16, 512);
        }
        // measured on 2 H200 (gin-kernels/test/a2a_test timing table): many small CTAs win up to 16 MiB per rank
        if (bytesPerPeer <= 64 * 1024) return new Plan(p, 1, 512);
        if (bytesPerPeer <= 512 * 1024) return new Plan(p, 32, 512);
        if (bytesPerPeer <= 8L * 1024 * 1024) return new Plan(p, 64, 512);
        return new Plan(p, 32, 512);
    }
}
