package dev.gin4j.a2a;


/**
 * One launch shape of the GIN kernels: protocol, chunks per peer (grid = ranks x chunks) and
 * threads per block. Chosen by size from measurements on 2 H200 over NVLink (docs/kernels.md).
 *
 * @param protocol the protocol, never {@link Protocol#AUTO}
 * @param chunksPerPeer blocks per peer, in [1, {@link #MAX_CHUNKS_PER_PEER}] (for {@link Protocol#COPY_ENGINE}: the
 *     blocks of the self-slot copy)
 * @param threads threads per block: a multiple of 32, at most 1024 for {@link Protocol#DIRECT} and 512 for the others
 */
public record Plan(Protocol protocol, int chunksPerPeer, int threads) {
    /** Largest per-peer message the LL protocol is used for by default, and the LL staging capacity. */
    public static final long LL_MAX_BYTES_PER_PEER = 128 * 1024;
    /**
     * Largest per-peer message {@link Protocol#AUTO} sends with LL128 on NVIDIA, and the LL128 staging
     * capacity (a2a_test, 2x H200, 2026-11-30, pipelined: LL128 beats LL from 4 KiB and direct up to 4 MiB per rank).
     */
    public static final long LL128_MAX_BYTES_PER_PEER = 2L * 1024 * 1024;
    /**
     * Above this many bytes sent to peers per rank ((ranks - 1) x per peer), {@link Protocol#AUTO} uses
     * the copy engines on NVIDIA. Bench a2a, pipelined, direct vs copy engines: 2 H200, 32 MiB per
     * peer 101 vs 107 us, 128 MiB per peer 375 vs 363 us; 4 H200 (2026-11-30), 16 MiB per peer 166 vs
     * 163 us, 32 MiB 308 vs 290 us, 64 MiB 599 vs 547 us, 256 MiB 2312 vs 2087 us.
     */
    public static final long COPY_ENGINE_MIN_PEER_BYTES = 64L * 1024 * 1024;
    /** Blocks of the self-slot copy kernel of {@link Protocol#COPY_ENGINE} (nvlink_probe: 16-32 keep up with the engines). */
    public static final int COPY_ENGINE_SELF_BLOCKS = 32;
    /** The most chunks (blocks) per peer a plan may have. */
    public static final int MAX_CHUNKS_PER_PEER = 64;

    /** Checks the plan: a concrete protocol, chunks per peer in [1, MAX_CHUNKS_PER_PEER], and a thread count the protocol takes. */
    public Plan {
        if (protocol == Protocol.AUTO) throw new IllegalArgumentException("a plan names a concrete protocol");
        if (chunksPerPeer < 1 || chunksPerPeer > MAX_CHUNKS_PER_PEER) throw new IllegalArgumentException("chunks per peer " + chunksPerPeer + " outside [1, " + MAX_CHUNKS_PER_PEER + "]");
        int max = protocol == Protocol.DIRECT ? 1024 : 512;
        if (threads < 32 || threads > max || threads % 32 != 0) throw new IllegalArgumentException("threads " + threads + " must be a multiple of 32 in [32, " + max + "] for " + protocol);
    }

    /**
     * The default plan on NVIDIA (LL128 and the copy engines allowed under {@link Protocol#AUTO}); {@code forced} overrides the protocol.
     *
     * @param bytesPerPeer the bytes each rank sends to each peer
     * @param nranks the number of ranks, at least 1
     * @param forced the protocol to use, or {@link Protocol#AUTO} to pick by size
     * @return the plan
     */
    public static Plan choose(long bytesPerPeer, int nranks, Protocol forced) {
        return choose(bytesPerPeer, nranks, forced, true);
    }

    /**
     * The default plan for a per-peer message size among {@code nranks} ranks; {@code forced} overrides the protocol.
     * {@code nvidia}: whether {@link Protocol#AUTO} may pick the protocols measured on NVIDIA only,
     * LL128 and the copy engines (false on AMD, where they are not validated). For
     * {@link Protocol#COPY_ENGINE}, {@code chunksPerPeer} is the block count of the self-slot copy.
     *
     * @param bytesPerPeer the bytes each rank sends to each peer
     * @param nranks the number of ranks, at least 1
     * @param forced the protocol to use, or {@link Protocol#AUTO} to pick by size
     * @param nvidia whether {@link Protocol#AUTO} may pick LL128 and the copy engines
     * @return the plan
     */
    public static Plan choose(long bytesPerPeer, int nranks, Protocol forced, boolean nvidia) {
        if (nranks < 1) throw new IllegalArgumentException("nranks " + nranks + " must be at least 1");
        Protocol p = forced != Protocol.AUTO ? forced : auto(bytesPerPeer, nranks, nvidia);
        if (p == Protocol.COPY_ENGINE) return new Plan(p, COPY_ENGINE_SELF_BLOCKS, 512);
        if (p == Protocol.LL) {
            if (bytesPerPeer <= 2 * 1024) return new Plan(p, 1, 256);
            if (bytesPerPeer <= 8 * 1024) return new Plan(p, 4, 512);
            return new Plan(p, 16, 512);
        }
        if (p == Protocol.LL128) {
            // a2a_test, 2x H200, 2026-11-30, pipelined, best per size (per peer): 2 KiB 1x256, 8 KiB 4x512, 32 KiB 16x256, 128 KiB 32x256, 512 KiB-2 MiB 64x512
            if (bytesPerPeer <= 2 * 1024) return new Plan(p, 1, 256);
            if (bytesPerPeer <= 8 * 1024) return new Plan(p, 4, 512);
            if (bytesPerPeer <= 32 * 1024) return new Plan(p, 16, 256);
            if (bytesPerPeer <= 128 * 1024) return new Plan(p, 32, 256);
            return new Plan(p, 64, 512);
        }
        // a2a_test timing tables: many small CTAs win up to 16 MiB per rank on 2 H200; above that 32 and
        // 64 chunks tie on 2 H200, and 64 wins by 6-10 % on 4 (64 MiB-1 GiB per rank, 2026-11-30)
        if (bytesPerPeer <= 64 * 1024) return new Plan(p, 1, 512);
        if (bytesPerPeer <= 512 * 1024) return new Plan(p, 32, 512);
        return new Plan(p, 64, 512);
    }

    private static Protocol auto(long bytesPerPeer, int nranks, boolean nvidia) {
        if (!nvidia) return bytesPerPeer <= LL_MAX_BYTES_PER_PEER ? Protocol.LL : Protocol.DIRECT;
        if (bytesPerPeer <= LL128_MAX_BYTES_PER_PEER) return Protocol.LL128;
        // the copy engines pay a fixed cost per peer copy: they win once enough bytes leave the GPU
        return bytesPerPeer * (nranks - 1) <= COPY_ENGINE_MIN_PEER_BYTES ? Protocol.DIRECT : Protocol.COPY_ENGINE;
    }
}
