package dev.gin4j.a2a;

/**
 * One launch shape of the GIN kernels: protocol, chunks per peer (grid = ranks x chunks) and
 * threads per block. Chosen by size from measurements on 2 H200 over NVLink (gin-kernels/KERNELS.md).
 */
public record Plan(Protocol protocol, int chunksPerPeer, int threads) {
    /** Largest per-peer message the LL protocol is used for by default, and the LL staging capacity. */
    public static final long LL_MAX_BYTES_PER_PEER = 128 * 1024;
    /** Where {@link Protocol#AUTO} switches from LL to LL128 (NVIDIA only; a2a_test run 13: LL wins up to 16 KiB per rank, LL128 from 64 KiB). */
    public static final long LL128_MIN_BYTES_PER_PEER = 16 * 1024;
    /** Largest per-peer message LL128 is used for by default, and the LL128 staging capacity (run 13: direct wins from 4 MiB per rank). */
    public static final long LL128_MAX_BYTES_PER_PEER = 1024 * 1024;
    /** Above this per-peer size {@link Protocol#AUTO} uses the copy engines (NVIDIA only; nvlink_probe run 12: they win from 32 MiB per peer). */
    public static final long COPY_ENGINE_MIN_BYTES_PER_PEER = 16L * 1024 * 1024;
    /** Blocks of the self-slot copy kernel of {@link Protocol#COPY_ENGINE} (nvlink_probe: 16-32 keep up with the engines). */
    public static final int COPY_ENGINE_SELF_BLOCKS = 32;
    public static final int MAX_CHUNKS_PER_PEER = 64;

    public Plan {
        if (protocol == Protocol.AUTO) throw new IllegalArgumentException("a plan names a concrete protocol");
        if (chunksPerPeer < 1 || chunksPerPeer > MAX_CHUNKS_PER_PEER) throw new IllegalArgumentException("chunks per peer " + chunksPerPeer + " outside [1, " + MAX_CHUNKS_PER_PEER + "]");
        int max = protocol == Protocol.DIRECT ? 1024 : 512;
        if (threads < 32 || threads > max || threads % 32 != 0) throw new IllegalArgumentException("threads " + threads + " must be a multiple of 32 in [32, " + max + "] for " + protocol);
    }

    /** The default plan on NVIDIA (LL128 and the copy engines allowed under {@link Protocol#AUTO}); {@code forced} overrides the protocol. */
    public static Plan choose(long bytesPerPeer, Protocol forced) {
        return choose(bytesPerPeer, forced, true);
    }

    /**
     * The default plan for a per-peer message size; {@code forced} overrides the protocol.
     * {@code nvidia}: whether {@link Protocol#AUTO} may pick the protocols measured on NVIDIA only,
     * LL128 and the copy engines (false on AMD, where they are not validated). For
     * {@link Protocol#COPY_ENGINE}, {@code chunksPerPeer} is the block count of the self-slot copy.
     */
    public static Plan choose(long bytesPerPeer, Protocol forced, boolean nvidia) {
        Protocol p = forced != Protocol.AUTO ? forced : auto(bytesPerPeer, nvidia);
        if (p == Protocol.COPY_ENGINE) return new Plan(p, COPY_ENGINE_SELF_BLOCKS, 512);
        if (p == Protocol.LL) {
            if (bytesPerPeer <= 2 * 1024) return new Plan(p, 1, 256);
            if (bytesPerPeer <= 8 * 1024) return new Plan(p, 4, 512);
            return new Plan(p, 16, 512);
        }
        if (p == Protocol.LL128) {
            // a2a_test run 13, pipelined: 16x512 best at 32 KiB per peer, 32x512 at 128 KiB-2 MiB per peer
            if (bytesPerPeer <= 4 * 1024) return new Plan(p, 1, 256);
            if (bytesPerPeer <= 64 * 1024) return new Plan(p, 16, 512);
            return new Plan(p, 32, 512);
        }
        // measured on 2 H200 (gin-kernels/test/a2a_test timing table): many small CTAs win up to 16 MiB per rank
        if (bytesPerPeer <= 64 * 1024) return new Plan(p, 1, 512);
        if (bytesPerPeer <= 512 * 1024) return new Plan(p, 32, 512);
        if (bytesPerPeer <= 8L * 1024 * 1024) return new Plan(p, 64, 512);
        return new Plan(p, 32, 512);
    }

    private static Protocol auto(long bytesPerPeer, boolean nvidia) {
        if (!nvidia) return bytesPerPeer <= LL_MAX_BYTES_PER_PEER ? Protocol.LL : Protocol.DIRECT;
        if (bytesPerPeer <= LL128_MIN_BYTES_PER_PEER) return Protocol.LL;
        if (bytesPerPeer <= LL128_MAX_BYTES_PER_PEER) return Protocol.LL128;
        return bytesPerPeer <= COPY_ENGINE_MIN_BYTES_PER_PEER ? Protocol.DIRECT : Protocol.COPY_ENGINE;
    }
}
