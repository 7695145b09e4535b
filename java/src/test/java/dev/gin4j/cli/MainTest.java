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
        Result r = run("frobnicate");
        assertEquals(2, r.status());
        assertTrue(r.err().contains("unknown command 'frobnicate'") && r.err().contains("usage: gin4j"), r.err());
        r = run("bench", "nccl");
        assertEquals(2, r.status());
        assertTrue(r.err().contains("expected a2a or moe"), r.err());
        assertEquals(0, run("help").status());
        r = run("bench", "moe", "--routing", "zipf:0");  // refused before any GPU is looked for
        assertEquals(2, r.status());
        assertTrue(r.err().contains("--routing zipf:0") && r.err().contains("(0, 4]"), r.err());
        r = run("bench", "moe", "--channels", "200");
        assertEquals(2, r.status());
        assertTrue(r.err().contains("--channels 200: expected 0 (half the SMs) or 1 to 128"), r.err());
        r = run("bench", "moe", "--shapes", "deepseek-v3,gpt-oss");
        assertEquals(2, r.status());
        assertTrue(r.err().contains("unknown shape 'gpt-oss'") && r.err().contains("qwen3-30b-a3b"), r.err());
        r = run("bench", "moe", "--iter", "5");  // misspelt: refused, not run with the defaults
        assertEquals(2, r.status());
        assertTrue(r.err().contains("unknown option '--iter'") && r.err().contains("--iters"), r.err());
        r = run("bench", "moe", "--iters", "0");
        assertEquals(2, r.status());
        assertTrue(r.err().contains("--iters >= 1"), r.err());
        r = run("bench", "a2a", "--factor", "four");
        assertEquals(2, r.status());
        assertTrue(r.err().contains("--factor expects an integer, got 'four'"), r.err());
        r = run("bench", "moe", "--tokens", "128,x");
        assertEquals(2, r.status());
        assertTrue(r.err().contains("--tokens expects comma-separated integers"), r.err());
        r = run("bench", "a2a", "--iters");
        assertEquals(2, r.status());
        assertTrue(r.err().contains("--iters needs a value"), r.err());
    }
}
