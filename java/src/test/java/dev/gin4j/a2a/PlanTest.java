package dev.gin4j.a2a;

import dev.gin4j.internal.comm.WindowLayout;
import org.junit.jupiter.api.Test;

import static org.junit.jupiter.api.Assertions.*;

/** Protocol choice and window layout of the GIN all-to-all, without a GPU. */
class PlanTest {
    @Test void autoPicksLl128ThenDirectThenCopyEnginesOnNvidia() {
        assertEquals(Protocol.LL128, Plan.choose(0, 2, Protocol.AUTO, true).protocol());
        assertEquals(Protocol.LL128, Plan.choose(4096, 2, Protocol.AUTO, true).protocol());
        assertEquals(Protocol.LL128, Plan.choose(Plan.LL128_MAX_BYTES_PER_PEER, 2, Protocol.AUTO, true).protocol());
        assertEquals(Protocol.DIRECT, Plan.choose(Plan.LL128_MAX_BYTES_PER_PEER + 1, 2, Protocol.AUTO, true).protocol());
        assertEquals(Protocol.DIRECT, Plan.choose(Plan.COPY_ENGINE_MIN_PEER_BYTES, 2, Protocol.AUTO, true).protocol());
        Plan ce = Plan.choose(Plan.COPY_ENGINE_MIN_PEER_BYTES + 1, 2, Protocol.AUTO, true);
        assertEquals(Protocol.COPY_ENGINE, ce.protocol());
        assertEquals(Plan.COPY_ENGINE_SELF_BLOCKS, ce.chunksPerPeer(), "copy engines: chunksPerPeer is the self-copy grid");
        // the three-argument form is the NVIDIA choice
        assertEquals(Protocol.LL128, Plan.choose(512 * 1024, 2, Protocol.AUTO).protocol());
    }

    @Test void copyEnginesFromTheBytesThatLeaveTheGpu() {
        // 4 ranks: 32 MiB per peer is 96 MiB to peers (measured: copy engines 290 vs direct 308 us); 16 MiB per peer is 48 MiB (a tie: direct)
        assertEquals(Protocol.COPY_ENGINE, Plan.choose(32L << 20, 4, Protocol.AUTO, true).protocol());
        assertEquals(Protocol.DIRECT, Plan.choose(16L << 20, 4, Protocol.AUTO, true).protocol());
        assertEquals(Protocol.DIRECT, Plan.choose(32L << 20, 2, Protocol.AUTO, true).protocol());
        // one rank sends nothing to peers: never the copy engines
        assertEquals(Protocol.DIRECT, Plan.choose(1L << 30, 1, Protocol.AUTO, true).protocol());
        assertThrows(IllegalArgumentException.class, () -> Plan.choose(1024, 0, Protocol.AUTO, true));
        // direct above 512 KiB per peer: 64 chunks of 512 threads per peer
        assertEquals(new Plan(Protocol.DIRECT, 64, 512), Plan.choose(16L << 20, 4, Protocol.DIRECT));
    }

    @Test void autoNeverPicksLl128OnAmd() {
        for (long b = 1; b <= 64L << 20; b *= 2) {
            Protocol p = Plan.choose(b, 2, Protocol.AUTO, false).protocol();
            assertNotEquals(Protocol.LL128, p, "AUTO on AMD at " + b + " bytes per peer");
            assertEquals(b <= Plan.LL_MAX_BYTES_PER_PEER ? Protocol.LL : Protocol.DIRECT, p, b + " bytes per peer");
        }
        assertEquals(Protocol.DIRECT, Plan.choose(1L << 30, 2, Protocol.AUTO, false).protocol(), "AUTO on AMD never picks the copy engines");
        // forcing stays possible (an experiment on AMD)
        assertEquals(Protocol.LL128, Plan.choose(1 << 20, 2, Protocol.LL128, false).protocol());
    }

    @Test void ll128PlansFitTheKernelLimits() {
        for (long b : new long[] {0, 1, 120, 4096, 4097, 65537, 1 << 20, 4L << 20, 64L << 20}) {
            Plan p = Plan.choose(b, 2, Protocol.LL128);
            assertEquals(Protocol.LL128, p.protocol());
            assertTrue(p.threads() <= 512 && p.threads() % 64 == 0, "LL128 threads " + p.threads() + " at " + b);
            assertTrue(p.chunksPerPeer() >= 1 && p.chunksPerPeer() <= Plan.MAX_CHUNKS_PER_PEER, "LL128 chunks " + p.chunksPerPeer() + " at " + b);
        }
        assertThrows(IllegalArgumentException.class, () -> new Plan(Protocol.LL128, 4, 1024));
        assertDoesNotThrow(() -> new Plan(Protocol.DIRECT, 4, 1024));
    }

    @Test void ll128StagingMatchesTheKernelFormula() {
        // gin_a2a_ll128_slot_stride: 128 * (1 header line + ceil(capacity / 120) data lines)
        assertEquals(128 * 2, GinState.ll128SlotStride(1));
        assertEquals(128 * 2, GinState.ll128SlotStride(120));
        assertEquals(128 * 3, GinState.ll128SlotStride(121));
        assertEquals(128 * (1 + 34953), GinState.ll128SlotStride(4L << 20));
        assertEquals(16 + 16 * 2, GinState.llSlotStride(9));
        int nranks = 3;
        long slot = 1_000_003, ll = 65536, ll128 = 1_000_003;
        WindowLayout w = GinState.layout(nranks, slot, ll, ll128, false);
        WindowLayout.Region r = w.region("ll128");
        assertEquals(0, r.offset() % 128, "LL128 lines must be 128-byte aligned");
        assertEquals(2L * nranks * GinState.ll128SlotStride(ll128), r.size());
        // no region overlaps another
        var regions = w.regions().values().stream().sorted((a, b) -> Long.compare(a.offset(), b.offset())).toList();
        for (int i = 1; i < regions.size(); i++)
            assertTrue(regions.get(i - 1).offset() + regions.get(i - 1).size() <= regions.get(i).offset(), regions.get(i - 1) + " overlaps " + regions.get(i));
        assertTrue(w.size() >= regions.get(regions.size() - 1).offset() + regions.get(regions.size() - 1).size());
    }
}
