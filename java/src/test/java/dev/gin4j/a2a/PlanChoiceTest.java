package dev.gin4j.a2a;

import dev.gin4j.testing.SetupLog;
import org.junit.jupiter.api.Test;

import java.util.ArrayList;
import java.util.List;
import java.util.logging.Level;

import static org.junit.jupiter.api.Assertions.*;

/**
 * The launch plan a GIN call takes before the residency fit (what GinState.plan asks PlanChoice),
 * and the DEBUG line that says it: once per distinct choice, naming the protocol, the grid and why.
 * Pure: no GPU.
 */
class PlanChoiceTest {
    private static final String OVER = "communicator group of 2 local rank(s) of 2";
    private static final long LL = 64 * 1024, LL128 = Plan.LL128_MAX_BYTES_PER_PEER;

    private static PlanChoice lsa(boolean nvidia) { return new PlanChoice(OVER, 2, nvidia, false, LL, LL128); }

    @Test void autoOnNvidiaTakesPlanChooseAndSaysSoOncePerPlan() {
        PlanChoice c = lsa(true);
        List<Plan> taken = new ArrayList<>();
        List<String> log = SetupLog.debug(() -> {
            taken.add(c.choose(4096, Protocol.AUTO, true));
            taken.add(c.choose(4096, Protocol.AUTO, true));  // the same call again
            taken.add(c.choose(4000, Protocol.AUTO, true));  // another size, the same plan
            taken.add(c.choose(1 << 20, Protocol.AUTO, true));  // another plan
        });
        assertEquals(Plan.choose(4096, 2, Protocol.AUTO, true), taken.get(0));
        assertEquals(new Plan(Protocol.LL128, 4, 512), taken.get(0));
        assertEquals(taken.get(0), taken.get(2));
        assertEquals(new Plan(Protocol.LL128, 64, 512), taken.get(3));
        assertEquals(2, log.size(), "one line per distinct plan, not per call: " + log);
        String first = log.get(0);
        assertTrue(first.startsWith("FINE GIN all-to-all over " + OVER + ": 4096 bytes per peer take LL128, 4 chunks per peer x 512 threads"), first);
        assertTrue(first.contains("AUTO by size (NVIDIA"), first);
        assertTrue(log.get(1).contains("1048576 bytes per peer take LL128, 64 chunks per peer x 512 threads"), log.get(1));
    }

    @Test void autoElsewhereSaysWhyNotLl128() {
        PlanChoice c = lsa(false);
        List<String> log = SetupLog.debug(() -> assertEquals(Protocol.LL, c.choose(4096, Protocol.AUTO, true).protocol()));
        assertEquals(1, log.size(), log.toString());
        assertTrue(log.get(0).contains("take LL, 4 chunks per peer x 512 threads") && log.get(0).contains("not NVIDIA: LL or DIRECT only"), log.get(0));
    }

    @Test void aForcedProtocolTooLargeForItsStagingRunsDirectAndTheLineSaysWhy() {
        PlanChoice c = lsa(true);
        List<Plan> taken = new ArrayList<>();
        List<String> log = SetupLog.debug(() -> {
            taken.add(c.choose(LL + 1, Protocol.LL, true));
            taken.add(c.choose(LL, Protocol.LL, true));  // fits: LL
            taken.add(c.choose(LL128 + 1, Protocol.LL128, true));
        });
        assertEquals(Plan.choose(LL + 1, 2, Protocol.DIRECT), taken.get(0));
        assertEquals(Protocol.LL, taken.get(1).protocol());
        assertEquals(Protocol.DIRECT, taken.get(2).protocol());
        assertEquals(3, log.size(), log.toString());
        assertTrue(log.get(0).contains((LL + 1) + " bytes per peer take DIRECT") && log.get(0).contains("LL as forced")
                && log.get(0).contains("picked LL, but the LL staging is smaller (" + LL + " bytes per peer)"), log.get(0));
        assertTrue(log.get(1).contains("take LL, 16 chunks per peer") && !log.get(1).contains("but"), log.get(1));
        assertTrue(log.get(2).contains("picked LL128, but the LL128 staging is smaller (" + LL128 + " bytes per peer)"), log.get(2));
    }

    @Test void theHybridKernelAndAllToAllVRunDirectAndTheLineSaysWhy() {
        PlanChoice hybrid = new PlanChoice(OVER, 2, true, true, LL, LL128);
        List<String> log = SetupLog.debug(() -> assertEquals(Protocol.DIRECT, hybrid.choose(4096, Protocol.AUTO, true).protocol()));
        assertEquals(1, log.size(), log.toString());
        assertTrue(log.get(0).contains("picked LL128, but some peer is outside the LSA team") && !log.get(0).contains("bytes per peer)"), log.get(0));

        long big = Plan.COPY_ENGINE_MIN_PEER_BYTES + 1;  // AUTO's copy engines on 2 ranks
        PlanChoice c = lsa(true);
        List<Plan> taken = new ArrayList<>();
        log = SetupLog.debug(() -> {
            taken.add(c.choose(big, Protocol.AUTO, true));
            taken.add(c.choose(big, Protocol.AUTO, false));
        });
        assertEquals(Protocol.COPY_ENGINE, taken.get(0).protocol());
        assertEquals(Protocol.DIRECT, taken.get(1).protocol());
        assertEquals(2, log.size(), log.toString());
        assertTrue(log.get(0).startsWith("FINE GIN all-to-all over") && log.get(0).contains("take COPY_ENGINE, " + Plan.COPY_ENGINE_SELF_BLOCKS + " self-copy blocks"), log.get(0));
        assertTrue(log.get(1).startsWith("FINE GIN all-to-all-v over") && log.get(1).contains("take DIRECT")
                && log.get(1).contains("picked COPY_ENGINE, but all-to-all-v cannot use the copy engines"), log.get(1));
    }

    @Test void aShrunkPlanIsLoggedOnceAndAnUnchangedOneNot() {
        PlanChoice c = lsa(true);
        Plan plan = new Plan(Protocol.DIRECT, 64, 512), shrunk = new Plan(Protocol.DIRECT, 16, 512);
        List<String> log = SetupLog.debug(() -> {
            assertSame(shrunk, c.fitted(plan, shrunk, "device 0 (H200)", 40));
            c.fitted(plan, shrunk, "device 0 (H200)", 40);
            c.fitted(plan, plan, "device 0 (H200)", 4000);
        });
        assertEquals(1, log.size(), log.toString());
        assertTrue(log.get(0).contains("DIRECT, 64 chunks per peer x 512 threads shrunk to 16 chunks per peer, since device 0 (H200) holds 40 resident blocks"), log.get(0));
    }

    @Test void nothingIsLoggedOrRememberedWhileDebugIsOff() {
        PlanChoice c = lsa(true);
        List<String> off = SetupLog.during(Level.INFO, () -> assertEquals(new Plan(Protocol.LL128, 4, 512), c.choose(4096, Protocol.AUTO, true)));
        assertEquals(List.of(), off);
        // a choice made while DEBUG was off is still said once DEBUG is on
        List<String> on = SetupLog.debug(() -> c.choose(4096, Protocol.AUTO, true));
        assertEquals(1, on.size(), on.toString());
    }
}
