package dev.gin4j.moe;

import dev.gin4j.comm.Backend;
import org.junit.jupiter.api.Test;

import java.util.HashSet;
import java.util.Map;
import java.util.Set;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

/** The node table of the exchange across nodes (MoeTopology), the mode choice and the window's memory refusal: host-side logic only. */
class MoeTopologyTest {

    @Test void nodesAreNumberedByTheirLowestRankAndRanksByRankOrder() {
        MoeTopology t = MoeTopology.of(new int[] {3, 2, 3, 2, 0});
        assertEquals(3, t.nodes);
        assertArrayEquals(new int[] {0, 1, 0, 1, 2}, t.nodeOf);
        assertArrayEquals(new int[] {0, 0, 1, 1, 0}, t.localOf);
        assertArrayEquals(new int[] {0, 2, 1, 3, 4}, t.nodeRank);
        assertEquals(2, t.maxNodeSize);
        assertEquals(2, t.slotsPerNode, "a node of 2 senders into a node of 1 rank: two senders share its one entry");
        assertEquals("3 nodes of [2, 2, 1] ranks", t.describe());
    }

    @Test void equalNodesEntryIsTheRankOfTheSameLocalIndex() {
        MoeTopology t = MoeTopology.emulated(8, 4);
        assertEquals(2, t.nodes);
        assertEquals(1, t.slotsPerNode);
        for (int s = 0; s < 8; s++) {
            int other = 1 - t.nodeOf[s];
            int e = t.entry(s, other);
            assertEquals(other * 4 + s % 4, e);
            assertEquals(s, t.slotSource(e, t.slot(s, other)), "the entry serves the sender in its slot");
        }
        assertEquals("2 nodes of 4 ranks (emulated: GIN4J_EMULATED_NODE_SIZE)", t.describe());
    }

    /** Every (sender, other node) pair has one entry and one slot there, no slot serves two senders, and every served slot names its sender. */
    @Test void everySenderHasExactlyOneSlotAtEachOtherNodesEntry() {
        for (int[] nodes : new int[][] {{0, 0, 0, 1}, {0, 1, 2, 3}, {0, 0, 1, 1, 1, 2}, {0, 1, 1, 1, 1, 1, 1, 1}, {0, 0, 0, 0, 0, 0, 0, 0}}) {
            MoeTopology t = MoeTopology.of(nodes);
            int r = nodes.length;
            Set<String> used = new HashSet<>();
            for (int s = 0; s < r; s++)
                for (int d = 0; d < t.nodes; d++) {
                    if (d == t.nodeOf[s]) continue;
                    int e = t.entry(s, d), sigma = t.slot(s, d);
                    assertEquals(d, t.nodeOf[e]);
                    assertTrue(sigma >= 0 && sigma < t.slots());
                    assertTrue(used.add(e + "/" + sigma), "slot " + sigma + " of rank " + e + " serves two senders");
                    assertEquals(s, t.slotSource(e, sigma));
                }
            for (int e = 0; e < r; e++)
                for (int sigma = 0; sigma < t.slots(); sigma++)
                    if (t.slotSource(e, sigma) >= 0) assertTrue(used.contains(e + "/" + sigma), "rank " + e + " slot " + sigma + " names a sender that does not use it");
            for (int q = 0; q < r; q++) assertTrue(t.dispatchBlocksPerChunk(q) <= t.maxBlocksPerChunk());
        }
    }

    @Test void oneRankPerNodeAndOneNode() {
        MoeTopology own = MoeTopology.emulated(3, 1);
        assertEquals(3, own.nodes);
        assertEquals(1, own.maxNodeSize);
        assertEquals(1 + 2 + 2 + 3, own.dispatchBlocksPerChunk(0));
        assertEquals(3 + 2 + 3, own.combineBlocksPerChunk());
        MoeTopology one = MoeTopology.of(new int[] {0, 0, 0});
        assertEquals(1, one.nodes);
        assertEquals(-1, one.slotSource(0, 0));
    }

    @Test void theLastEmulatedNodeMayBeSmaller() {
        MoeTopology t = MoeTopology.emulated(5, 2);
        assertEquals(3, t.nodes);
        assertEquals(1, t.nodeSize[2]);
        assertEquals(2, t.slotsPerNode);
    }

    @Test void emulatedNodeSizeIsReadOnlyWhereSetAndRefusedWhenBad() {
        assertEquals(0, MoeTopology.emulatedNodeSize(Map.of()));
        assertEquals(0, MoeTopology.emulatedNodeSize(Map.of("GIN4J_EMULATED_NODE_SIZE", " ")));
        assertEquals(2, MoeTopology.emulatedNodeSize(Map.of("GIN4J_EMULATED_NODE_SIZE", " 2 ")));
        IllegalArgumentException bad = assertThrows(IllegalArgumentException.class, () -> MoeTopology.emulatedNodeSize(Map.of("GIN4J_EMULATED_NODE_SIZE", "two")));
        assertTrue(bad.getMessage().contains("GIN4J_EMULATED_NODE_SIZE") && bad.getMessage().contains("\"two\""), bad.getMessage());
        IllegalArgumentException zero = assertThrows(IllegalArgumentException.class, () -> MoeTopology.emulatedNodeSize(Map.of("GIN4J_EMULATED_NODE_SIZE", "0")));
        assertTrue(zero.getMessage().contains(">= 1") && zero.getMessage().contains("got 0"), zero.getMessage());
    }

    @Test void badTablesAreRefusedNamingTheRank() {
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> MoeTopology.of(new int[] {0, 7}));
        assertTrue(e.getMessage().contains("rank 1") && e.getMessage().contains("[0, 2)"), e.getMessage());
        IllegalArgumentException many = assertThrows(IllegalArgumentException.class, () -> MoeTopology.of(new int[17]));
        assertTrue(many.getMessage().contains("1 to 16 ranks, got 17"), many.getMessage());
    }

    @Test void autoTakesHighThroughputOnlyForLargeBatchesAndNodesOfSeveralRanks() {
        MoeConfig small = MoeConfig.bf16(7168, 256, 8, 128, Backend.GIN), large = MoeConfig.bf16(7168, 256, 8, 4096, Backend.GIN);
        assertEquals(NetworkMode.LOW_LATENCY, MoeNetwork.autoMode(small, MoeTopology.emulated(4, 2)));
        assertEquals(NetworkMode.HIGH_THROUGHPUT, MoeNetwork.autoMode(large, MoeTopology.emulated(4, 2)));
        assertEquals(NetworkMode.LOW_LATENCY, MoeNetwork.autoMode(large, MoeTopology.emulated(4, 1)), "one rank per node: nothing to forward");
    }

    @Test void highThroughputIsRefusedWhereItsGridWouldNotFit() {
        int[] lopsided = new int[16];
        lopsided[15] = 1;  // 15 ranks and 1: 15 slots per entry
        MoeTopology t = MoeTopology.of(lopsided);
        String why = MoeNetwork.highThroughputUnavailable(t);
        assertTrue(why != null && why.contains("257 blocks") && why.contains("LOW_LATENCY"), why);
        assertEquals(NetworkMode.LOW_LATENCY, MoeNetwork.autoMode(MoeConfig.bf16(7168, 256, 8, 4096, Backend.GIN), t));
        assertEquals(null, MoeNetwork.highThroughputUnavailable(MoeTopology.emulated(16, 8)));
    }

    @Test void chunksKeepEveryGridWithin256Blocks() {
        for (int r : new int[] {2, 4, 8, 16})
            for (int g : new int[] {1, 2, 4, 8}) {
                if (g > r) continue;
                MoeTopology t = MoeTopology.emulated(r, g);
                int c = MoeNetwork.highThroughputChunks(128, t);
                assertTrue(c >= 1 && c * t.maxBlocksPerChunk() <= 256 || c == 1, r + " ranks, nodes of " + g + ": " + c + " chunks x " + t.maxBlocksPerChunk());
                assertTrue(MoeNetwork.lowLatencyChunks(128, r) * 2 * r <= 256);
            }
    }

    /**
     * Staged calls split each HT launch at its sending roles: a send's grid is the direct and node
     * senders (dispatch) or the partial senders (combine), counted from block 0 in the kernels'
     * role order, and it leaves the complete launch at least the receivers (launch_checks.cuh
     * roles_of refuses any other grid).
     */
    @Test void stagedSendsTakeTheSendingRolesOfEachHighThroughputLaunch() {
        for (int r : new int[] {2, 3, 4, 6, 8, 16})
            for (int g : new int[] {1, 2, 4, 8}) {
                if (g > r) continue;
                MoeTopology t = MoeTopology.emulated(r, g);
                for (int rank = 0; rank < r; rank++) {
                    int size = t.nodeSize[t.nodeOf[rank]];
                    assertEquals(size + t.nodes - 1, t.dispatchSendBlocksPerChunk(rank), r + " ranks, nodes of " + g + ", rank " + rank);
                    int rest = t.dispatchBlocksPerChunk(rank) - t.dispatchSendBlocksPerChunk(rank);
                    assertEquals((t.nodes - 1) * t.slotsPerNode * size + r, rest, "forwarders and receivers of rank " + rank);
                }
                assertEquals(r, t.combineSendBlocksPerChunk());
                assertEquals((t.nodes - 1) * t.slotsPerNode + r, t.combineBlocksPerChunk() - t.combineSendBlocksPerChunk(), "node reducers and reducers");
            }
    }

    /** The window formula of MoeNetwork's javadoc, part by part, and the refusal that names the parts. */
    @Test void windowBytesFollowTheFormulaAndTooLargeIsRefusedWithTheNumbers() {
        MoeConfig cfg = MoeConfig.bf16(7168, 256, 8, 4096, Backend.GIN);
        MoeTopology t = MoeTopology.of(new int[] {0, 0, 1, 1});
        int chunks = 5;  // the high-throughput chunks: one flag and signal per chunk of a node section
        MoeNetwork.Geometry g = MoeNetwork.Geometry.of(cfg, t, chunks);
        long m = 4096, k = 8, l = 64, h = 7168, rb = 2 * h;
        long disp = align(align(align(8 + 4 * l, 16) + 12 * m * k, 256) + m * rb, 256), comb = align(2 * m * h, 256);
        long node = align(align(align(8 + 4 * 2 * l, 16) + 12 * m * k, 256) + m * rb, 256);
        assertEquals(disp, g.dispatchSection());
        assertEquals(comb, g.combineSection());
        assertEquals(node, g.nodeSection());
        assertEquals(16 * (disp + comb), g.lowLatencyBytes());
        assertEquals((2 * 2 + 2 * 2) * node, g.nodeBytes());
        assertEquals(2 * 2 * 2 * comb, g.partBytes());
        assertEquals(0, g.fwdStageBytes(), "real nodes: forwarding stores over LSA, nothing staged");
        assertEquals(4L * 2 * m * 2 + 4 * m * 2 + 4 * 2 * (1 + 2 + 2 * chunks), g.positionBytes());
        assertEquals(8 * 4 + 2 * 2 * chunks + 2 * 2 * 2 * chunks, g.signals());
        assertEquals(8 * (4 * 4 + 4 * 4 + 2 * 2 * chunks + 2 * 2 * 2 * chunks) + 8 * 2 * 256 * 4, g.flagBytes());
        MoeNetwork.Geometry emulated = MoeNetwork.Geometry.of(cfg, MoeTopology.emulated(4, 2), chunks);
        assertEquals(2 * 2 * 2 * disp, emulated.fwdStageBytes(), "emulated nodes stage the forwarded sections for GIN");
        g.checkFits(4 * g.windowBytes(), cfg);
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> g.checkFits(g.windowBytes(), cfg));
        assertTrue(e.getMessage().contains("needs a window of") && e.getMessage().contains("node sections") && e.getMessage().contains("maxTokens 4096")
                && e.getMessage().contains("lower maxTokens"), e.getMessage());
    }

    private static long align(long v, long a) { return (v + a - 1) / a * a; }
}
