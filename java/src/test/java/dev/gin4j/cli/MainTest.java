package dev.gin4j.cli;

import org.junit.jupiter.api.Test;

import java.io.ByteArrayOutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;

import static org.junit.jupiter.api.Assertions.*;

/** The command line's help and argument errors, without a GPU (none of these may touch one). */
class MainTest {
    private record Result(int status, String out, String err) {}

    private static Result run(String... args) {
        ByteArrayOutputStream out = new ByteArrayOutputStream(), err = new ByteArrayOutputStream();
        int status = Main.run(args, new PrintStream(out, true, StandardCharsets.UTF_8), new PrintStream(err, true, StandardCharsets.UTF_8));
        return new Result(status, out.toString(StandardCharsets.UTF_8), err.toString(StandardCharsets.UTF_8));
    }

    /** The command exits with status 2 (a usage error) and its error message contains every expected piece. */
    private static void assertRefused(String[] args, String... expected) {
        Result r = run(args);
        assertEquals(2, r.status(), String.join(" ", args) + ": " + r.err());
        for (String e : expected) assertTrue(r.err().contains(e), r.err());
    }

    @Test void infoSaysHowCommunicatorsWillBeMade() {
        String defaults = Info.communicatorSettings(java.util.Map.of());
        assertTrue(defaults.contains("communicators: blocking") && defaults.contains("after 300 s"), defaults);
        String nonblocking = Info.communicatorSettings(java.util.Map.of("GIN4J_COMM_NONBLOCKING", "1", "GIN4J_COMM_TIMEOUT_S", "30"));
        assertTrue(nonblocking.contains("communicators: nonblocking") && nonblocking.contains("after 30 s"), nonblocking);
        String bad = Info.communicatorSettings(java.util.Map.of("GIN4J_COMM_TIMEOUT_S", "soon"));
        assertTrue(bad.contains("refused") && bad.contains("GIN4J_COMM_TIMEOUT_S must be a positive number of seconds, got 'soon'"), bad);
        String apart = Info.communicatorSettings(java.util.Map.of("GIN4J_COMM_NONBLOCKING", "1", "NCCL_COMM_BLOCKING", "1"));
        assertTrue(apart.contains("refused") && apart.contains("NCCL_COMM_BLOCKING=1"), apart);
    }

    @Test void benchHelpAnywhereInTheArguments() {
        for (String[] args : new String[][] {{"bench"}, {"bench", "--help"}, {"bench", "moe", "--help"}, {"bench", "a2a", "--min", "4K", "-h"}}) {
            Result r = run(args);
            assertEquals(0, r.status(), String.join(" ", args) + ": " + r.err());
            assertTrue(r.out().contains("usage: gin4j bench a2a") && r.out().contains("deepseek-v3-fp8q"), r.out());
        }
    }

    @Test void unknownCommandsAndBenchmarksSayWhatIsExpected() {
        assertRefused(new String[] {"frobnicate"}, "unknown command 'frobnicate'", "usage: gin4j");
        assertRefused(new String[] {"bench", "nccl"}, "expected a2a or moe");
        assertEquals(0, run("help").status());
        assertRefused(new String[] {"bench", "moe", "--routing", "zipf:0"}, "--routing zipf:0", "(0, 4]");  // refused before any GPU is looked for
        assertRefused(new String[] {"bench", "moe", "--channels", "200"}, "--channels 200: expected 0 (half the SMs) or 1 to 128");
        assertRefused(new String[] {"bench", "moe", "--shapes", "deepseek-v3,gpt-oss"}, "unknown shape 'gpt-oss'", "qwen3-30b-a3b");
        assertRefused(new String[] {"bench", "moe", "--iter", "5"}, "unknown option '--iter'", "--iters");  // misspelt: refused, not run with the defaults
        assertRefused(new String[] {"bench", "moe", "--iters", "0"}, "--iters >= 1");
        assertRefused(new String[] {"bench", "a2a", "--factor", "four"}, "--factor expects an integer, got 'four'");
        assertRefused(new String[] {"bench", "moe", "--tokens", "128,x"}, "--tokens expects comma-separated integers");
        assertRefused(new String[] {"bench", "a2a", "--iters"}, "--iters needs a value");
    }
}
