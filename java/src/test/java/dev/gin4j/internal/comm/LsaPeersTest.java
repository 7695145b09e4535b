package dev.gin4j.internal.comm;

import dev.gin4j.comm.CommException;
import dev.gin4j.comm.Nccl;
import dev.gin4j.gpu.IpcMemory;
import org.junit.jupiter.api.Test;

import java.util.Arrays;
import java.util.HashMap;
import java.util.Map;
import java.util.Random;

import static org.junit.jupiter.api.Assertions.*;

/**
 * The CPU side of gin4j's own LSA mapping ({@link LsaPeers}): the frames the ranks all-gather
 * (host key, pid, IPC handle), which ranks count as one host, the reachability masks the ranks
 * agree on, and the refusal of GIN across nodes by an NCCL older than 2.29.7.
 */
class LsaPeersTest {
    private final Random random = new Random();

    /** PeerTable.hostOfRank's numbering: equal host keys, one host; hosts numbered in the order of their lowest rank. */
    @Test void hostIndicesFollowTheLowestRank() {
        Map<String, String> a = Map.of("GIN4J_HOSTID", "a"), b = Map.of("GIN4J_HOSTID", "b");
        long ka = LsaPeers.hostKey(a, "m"), kb = LsaPeers.hostKey(b, "m");
        assertArrayEquals(new int[] {0, 1, 0, 1}, PeerTable.hostIndices(new long[] {kb, ka, kb, ka}));
        assertArrayEquals(new int[] {0, 0, 0}, PeerTable.hostIndices(new long[] {ka, ka, ka}));
    }

    @Test void framesCarryEveryRanksHostPidAndHandle() {
        for (int n : new int[] {1, 2, 3, 8, 17}) {
            long[] keys = random.longs(n).toArray(), pids = random.longs(n, 1, Long.MAX_VALUE).toArray();
            byte[][] handles = new byte[n][IpcMemory.HANDLE_BYTES];
            long[] all = new long[n * LsaPeers.FRAME_LONGS];
            for (int r = 0; r < n; r++) {
                random.nextBytes(handles[r]);
                long[] f = LsaPeers.encode(keys[r], pids[r], handles[r]);
                assertEquals(LsaPeers.FRAME_LONGS, f.length);
                System.arraycopy(f, 0, all, r * LsaPeers.FRAME_LONGS, f.length);  // as the all-gather lays them out: rank order
            }
            for (int r = 0; r < n; r++) {
                LsaPeers.Frame f = LsaPeers.decode(all, r);
                assertEquals(keys[r], f.hostKey(), "rank " + r + " of " + n);
                assertEquals(pids[r], f.pid());
                assertArrayEquals(handles[r], f.handle(), "rank " + r + " of " + n);
            }
        }
    }

    @Test void badFramesAreRefusedNamingTheRank() {
        byte[] h = new byte[IpcMemory.HANDLE_BYTES];
        long[] all = new long[2 * LsaPeers.FRAME_LONGS];
        System.arraycopy(LsaPeers.encode(1, 2, h), 0, all, 0, LsaPeers.FRAME_LONGS);
        System.arraycopy(LsaPeers.encode(3, 4, h), 0, all, LsaPeers.FRAME_LONGS, LsaPeers.FRAME_LONGS);
        all[LsaPeers.FRAME_LONGS] = 0x1234;  // rank 1 runs another frame format
        CommException other = assertThrows(CommException.class, () -> LsaPeers.decode(all, 1));
        assertTrue(other.getMessage().contains("rank 1") && other.getMessage().contains("same gin4j version"), other.getMessage());
        assertEquals(1, LsaPeers.decode(all, 0).hostKey());
        CommException cut = assertThrows(CommException.class, () -> LsaPeers.decode(Arrays.copyOf(all, all.length - 1), 0));
        assertTrue(cut.getMessage().contains("whole frames"), cut.getMessage());
        assertThrows(CommException.class, () -> LsaPeers.decode(all, 2));
        IllegalArgumentException shortHandle = assertThrows(IllegalArgumentException.class, () -> LsaPeers.encode(1, 2, new byte[63]));
        assertTrue(shortHandle.getMessage().contains("64 bytes"), shortHandle.getMessage());
    }

    @Test void oneHostIsOneMachineAndOneEmulatedHostId() {
        String machine = "node7/" + random.nextLong();
        long plain = LsaPeers.hostKey(Map.of(), machine);
        assertEquals(plain, LsaPeers.hostKey(Map.of("GIN4J_HOSTID", " "), machine), "a blank GIN4J_HOSTID is none");
        assertNotEquals(plain, LsaPeers.hostKey(Map.of(), "node8/1"), "another machine");
        // NCCL_HOSTID makes processes of one machine separate hosts, as NCCL takes them
        long a = LsaPeers.hostKey(Map.of("NCCL_HOSTID", "host-0"), machine), b = LsaPeers.hostKey(Map.of("NCCL_HOSTID", "host-1"), machine);
        assertNotEquals(a, b);
        assertNotEquals(plain, a);
        // GIN4J_HOSTID decides over NCCL_HOSTID: ranks that are separate hosts for NCCL can be one for gin4j
        Map<String, String> r0 = new HashMap<>(Map.of("NCCL_HOSTID", "host-0", "GIN4J_HOSTID", "one")), r1 = new HashMap<>(Map.of("NCCL_HOSTID", "host-1", "GIN4J_HOSTID", "one"));
        assertEquals(LsaPeers.hostKey(r0, machine), LsaPeers.hostKey(r1, machine));
        // but never two machines
        assertNotEquals(LsaPeers.hostKey(r0, machine), LsaPeers.hostKey(r1, "node8/1"));
        assertFalse(LsaPeers.machineIdentity().isBlank());
    }

    @Test void reachabilityMasksSurviveTheAllGather() {
        for (int n : new int[] {1, 2, 63, 64, 65, 130}) {
            boolean[][] maps = new boolean[n][n];
            int words = (n + 63) / 64;
            long[] gathered = new long[words * n];
            for (int r = 0; r < n; r++) {
                long[] bases = new long[n];
                for (int p = 0; p < n; p++) {
                    maps[r][p] = p == r || random.nextInt(3) > 0;
                    bases[p] = maps[r][p] ? 0x7f00_0000_0000L + 4096L * p : 0;
                }
                long[] m = LsaPeers.reachMask(bases);
                assertEquals(words, m.length);
                System.arraycopy(m, 0, gathered, r * words, words);
            }
            for (int r = 0; r < n; r++)
                for (int p = 0; p < n; p++) assertEquals(maps[r][p], LsaPeers.reaches(gathered, n, r, p), n + " ranks: " + r + " -> " + p);
            assertThrows(CommException.class, () -> LsaPeers.reaches(Arrays.copyOf(gathered, gathered.length + 1), n, 0, 0));
        }
    }

    @Test void ginAcrossNodesNeedsNccl2297AndSaysSoWithTheVersions() {
        for (int old : new int[] {22803, 22809, 22903}) {
            String m = DeviceComm.ginVersionProblem(old);
            assertNotNull(m);
            assertTrue(m.contains(Nccl.versionString(old)) && m.contains("2.29.7") && m.contains("Backend.HOST") && m.contains("any NCCL version"), m);
        }
        assertNull(DeviceComm.ginVersionProblem(22907));
        assertNull(DeviceComm.ginVersionProblem(23001));
    }
}
