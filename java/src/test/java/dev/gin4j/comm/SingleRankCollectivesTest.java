package dev.gin4j.comm;

import dev.gin4j.gpu.DeviceBuffer;
import dev.gin4j.gpu.Stream;
import dev.gin4j.internal.comm.Groups;
import dev.gin4j.testing.SetupLog;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.function.Executable;

import java.lang.foreign.MemorySegment;
import java.lang.reflect.Constructor;
import java.lang.reflect.Field;
import java.time.Duration;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.function.Consumer;

import static org.junit.jupiter.api.Assertions.*;

/**
 * The one-process-per-GPU forms of CommGroup's collectives, without a GPU. No public factory makes
 * a CommGroup without NCCL and a GPU, so the group here is made through its private constructor
 * and given communicators with NULL handles and no device (reflection: the test runs on the class
 * path): enough for the checks made before any NCCL call. Its ranks are taken out again before the
 * close, so that no NCCL call is ever made.
 */
class SingleRankCollectivesTest {

    /** Runs {@code body} on a group of {@code localRanks} fake local ranks of {@code worldSize}, then closes it without NCCL. */
    @SuppressWarnings("unchecked")
    private static void withGroup(int worldSize, int localRanks, Consumer<CommGroup> body) throws ReflectiveOperationException {
        Constructor<CommGroup> make = CommGroup.class.getDeclaredConstructor(int.class, CommGroup.Options.class);
        make.setAccessible(true);
        CommGroup g = make.newInstance(worldSize, CommGroup.Options.blocking(Duration.ofSeconds(7)));
        Field f = CommGroup.class.getDeclaredField("ranks");
        f.setAccessible(true);
        List<Communicator> ranks = (List<Communicator>) f.get(g);
        try {
            for (int i = 0; i < localRanks; i++) ranks.add(new Communicator(g, MemorySegment.NULL, null, i, i));
            body.accept(g);
        } finally {
            ranks.clear();  // no communicator to destroy: the close makes no NCCL call
            g.close();
        }
    }

    /** Every single-rank collective, by the name its refusal must give; null arguments: the refusal comes before any is looked at. */
    private static Map<String, Executable> singleRankCalls(CommGroup g) {
        DeviceBuffer none = null;
        Stream noStream = null;
        Map<String, Executable> calls = new LinkedHashMap<>();
        calls.put("allToAll(send, recv, bytesPerPeer, stream)", () -> g.allToAll(none, none, 64, noStream));
        calls.put("allToAllV(send, sendCounts, sendOffsets, recv, recvCounts, recvOffsets, stream)",
                () -> g.allToAllV(none, new long[2], new long[2], none, new long[2], new long[2], noStream));
        calls.put("allGather(send, recv, bytes, stream)", () -> g.allGather(none, none, 64, noStream));
        calls.put("allReduceSumFloat(send, recv, count, stream)", () -> g.allReduceSumFloat(none, none, 16, noStream));
        calls.put("allGatherLongs(value)", () -> g.allGatherLongs(42L));
        return calls;
    }

    @Test void everySingleRankCollectiveRefusesSeveralLocalRanksNamingTheCall() throws ReflectiveOperationException {
        withGroup(4, 2, g -> {
            for (var call : singleRankCalls(g).entrySet()) {
                IllegalStateException e = assertThrows(IllegalStateException.class, call.getValue(), call.getKey());
                String m = e.getMessage();
                assertTrue(m.startsWith(call.getKey() + " is for one process per GPU (one local rank)"), m);
                assertTrue(m.contains("this process drives 2 local ranks of 4"), m);
                assertTrue(m.contains(call.getKey().startsWith("allGatherLongs") ? "allGatherLongs(long[])" : "the List form"), m);
                assertFalse(m.contains("local rank index"), "CommGroup's collectives have no local-rank-index form: " + m);
            }
        });
    }

    @Test void oneLocalRankGetsPastTheRefusalToTheArgumentChecks() throws ReflectiveOperationException {
        withGroup(2, 1, g -> {
            for (var call : singleRankCalls(g).entrySet()) {
                if (call.getKey().startsWith("allGatherLongs")) continue;  // it allocates on the rank's device at once: a GPU test (CommGpuTest)
                NullPointerException e = assertThrows(NullPointerException.class, call.getValue(), call.getKey());
                assertEquals("the send buffer must not be null", e.getMessage(), call.getKey());
            }
        });
    }

    @Test void theLibrarysOwnSingleRankCallsKeepTheirHint() throws ReflectiveOperationException {
        // AllToAll, AllToAllV and MoeAllToAll refuse through Groups.requireOneLocalRank: they have local-rank-index forms
        withGroup(2, 2, g -> {
            IllegalStateException e = assertThrows(IllegalStateException.class, () -> Groups.requireOneLocalRank(g, "output()"));
            assertEquals("output() is for one process per GPU (one local rank), but this process drives 2 local ranks of 2:"
                    + " pass one per local rank (the List form) or a local rank index", e.getMessage());
        });
        withGroup(2, 1, g -> assertDoesNotThrow(() -> Groups.requireOneLocalRank(g, "output()")));
    }

    @Test void theGroupLogsWhichCollectiveLibraryItRunsOver() throws ReflectiveOperationException {
        List<String> log = SetupLog.debug(() -> {
            try {
                withGroup(3, 0, g -> {});
            } catch (ReflectiveOperationException e) {
                throw new AssertionError(e);
            }
        });
        // here no NCCL is loaded (or one is): the line says which, in Capabilities.describeLibrary's words
        assertEquals(List.of("FINE communicators for 3 ranks over " + Capabilities.describeLibrary() + ", blocking, host waits end after PT7S"), log);
        if (!Nccl.isAvailable()) assertTrue(log.get(0).contains("none loaded: NCCL/RCCL: not loaded; tried "), log.get(0));
    }
}
