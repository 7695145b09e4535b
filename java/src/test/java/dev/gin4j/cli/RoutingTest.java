package dev.gin4j.cli;

import org.junit.jupiter.api.Test;

import java.util.HashSet;
import java.util.Set;
import java.util.SplittableRandom;

import static org.junit.jupiter.api.Assertions.*;

/** {@code bench moe --routing}: distinct experts per token, the skew it promises, the same hot experts everywhere. */
class RoutingTest {
    private static long[] picks(Routing r, int experts, int k, int tokens, long seed) {
        double[] pop = r.popularity(experts);
        int[] out = new int[k], pool = new int[experts];
        long[] count = new long[experts];
        SplittableRandom random = new SplittableRandom(seed);
        for (int t = 0; t < tokens; t++) {
            Routing.pick(random, pop, experts, k, out, 0, pool);
            Set<Integer> seen = new HashSet<>();
            for (int e : out) {
                assertTrue(e >= 0 && e < experts, "expert " + e + " out of [0, " + experts + ")");
                assertTrue(seen.add(e), "expert " + e + " picked twice by one token");
                count[e]++;
            }
        }
        return count;
    }

    @Test void uniformIsEvenAndZipfIsSkewed() {
        int experts = 256, k = 8, tokens = 20_000;
        double mean = (double) tokens * k / experts;
        long[] u = picks(Routing.UNIFORM, experts, k, tokens, 1);
        for (long c : u) assertTrue(Math.abs(c - mean) < 0.25 * mean, "uniform count " + c + " vs mean " + mean);
        long[] z = picks(Routing.parse("zipf"), experts, k, tokens, 1);
        long max = 0, min = Long.MAX_VALUE;
        for (long c : z) { max = Math.max(max, c); min = Math.min(min, c); }
        assertTrue(max > 10 * mean, "Zipf s=1: the busiest expert should carry > 10x the mean, got " + max / mean);
        assertTrue(max <= tokens, "an expert at most once per token");
        assertTrue(min < 0.5 * mean, "Zipf s=1: the quietest expert should carry < half the mean, got " + min / mean);
    }

    @Test void theHotExpertsAreTheSameForEveryRank() {
        long[] a = picks(Routing.parse("zipf:1.2"), 128, 8, 5000, 7), b = picks(Routing.parse("zipf:1.2"), 128, 8, 5000, 99);
        int hotA = 0, hotB = 0;
        for (int e = 1; e < a.length; e++) { if (a[e] > a[hotA]) hotA = e; if (b[e] > b[hotB]) hotB = e; }
        assertEquals(hotA, hotB, "different seeds (ranks) must share the hot expert");
    }

    @Test void parseSaysWhatIsExpected() {
        assertEquals(Routing.UNIFORM, Routing.parse("uniform"));
        assertEquals(1.0, Routing.parse("zipf").zipfS());
        assertEquals(0.5, Routing.parse("zipf:0.5").zipfS());
        for (String bad : new String[] {"zipf:0", "zipf:-1", "zipf:9", "zipf:x", "skewed", ""}) {
            IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> Routing.parse(bad));
            assertTrue(e.getMessage().contains("--routing " + bad), e.getMessage());
        }
    }
}
