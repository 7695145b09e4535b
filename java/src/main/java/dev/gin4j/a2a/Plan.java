package dev.gin4j.a2a;

/**
 * One launch shape of the GIN kernels: protocol, chunks per peer (grid = ranks x chunks) and
 * threads per block. Chosen by size from measurements on 2 H200 over NVLink (gin-kernels/KERNELS.md).
 */
public record Plan(Protocol protocol, int chunksPerPeer, int threads) {
    /** Largest per-peer message the LL protocol is used for by default, and the LL staging capacity. */
    public static final long LL_MAX_BYTES_PER_PEER = 128 * 1024;
    /** Where {@link Protocol#AUTO} switches from LL to LL128 (NVIDIA only; provisional until measured). */
    public static final long LL128_MIN_BYTES_PER_PEER = 64 * 1024;
    /** Largest per-peer message LL128 is used for by default, and the LL128 staging capacity (provisional). */
    public static final long LL128_MAX_BYTES_PER_PEER = 4L * 1024 * 1024;
    public static final int MAX_CHUNKS_PER_PEER = 64;

    public Plan {
        if (protocol == Protocol.AUTO) throw new IllegalArgumentException("a plan names a concrete protocol");
        if (chunksPerPeer < 1 || chunksPerPeer > MAX_CHUNKS_PER_PEER) throw new IllegalArgumentException("chunks per peer " + chunksPerPeer + " outside [1, " + MAX_CHUNKS_PER_PEER + "]");
        int max = protocol == Protocol.DIRECT ? 1024 : 512;
        if (threads < 32 || threads > max || threads % 32 != 0) throw new IllegalArgumentException("threads " + threads + " must be a multiple of 32 in [32, " + max + "] for " + protocol);
    }

    /** The default plan on NVIDIA (LL128 allowed under {@link Protocol#AUTO}); {@code forced} overrides the protocol. */
    public static Plan choose(long bytesPerPeer, Protocol forced) {
        return choose(bytesPerPeer, forced, true);
    }

    /**
     * The default plan for a per-peer message size; {@code forced} overrides the protocol.
     * {@code ll128Auto}: whether {@link Protocol#AUTO} may pick LL128 (false on AMD, where it is not validated).
     */
    public static Plan choose(long bytesPerPeer, Protocol forced, boolean ll128Auto) {
        Protocol p = forced != Protocol.AUTO ? forced : auto(bytesPerPeer, ll128Auto);
        if (p == Protocol.LL) {
            if (bytesPerPeer <= 2 * 1024) return new Plan(p, 1, 256);
            if (bytesPerPeer <= 8 * 1024) return new Plan(p, 4, 512);
            return new Plan(p, 16, 512);
        }
        if (p == Protocol.LL128) {
            // provisional (predictions in KERNELS.md, to be replaced by a2a_test's pipelined table):
            // about 32 KiB per block, 1..32 chunks of 512 threads
            long chunks = Math.max(1, Math.min(32, (bytesPerPeer + 32 * 1024 - 1) / (32 * 1024)));
            return new Plan(p, (int) chunks, bytesPerPeer <= 4 * 1024 ? 256 : 512);
        }
        // measured on 2 H200 (gin-kernels/test/a2a_test timing table): many small CTAs win up to 16 MiB per rank
        if (bytesPerPeer <= 64 * 1024) return new Plan(p, 1, 512);
        if (bytesPerPeer <= 512 * 1024) return new Plan(p, 32, 512);
        if (bytesPerPeer <= 8L * 1024 * 1024) return new Plan(p, 64, 512);
        return new Plan(p, 32, 512);
    }

    private static Protocol auto(long bytesPerPeer, boolean ll128Auto) {
        if (!ll128Auto) return bytesPerPeer <= LL_MAX_BYTES_PER_PEER ? Protocol.LL : Protocol.DIRECT;
        if (bytesPerPeer <= LL128_MIN_BYTES_PER_PEER) return Protocol.LL;
        return bytesPerPeer <= LL128_MAX_BYTES_PER_PEER ? Protocol.LL128 : Protocol.DIRECT;
    }
}
