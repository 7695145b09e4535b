package dev.gin4j.cli;

import org.junit.jupiter.api.Test;

import java.io.ByteArrayOutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.Map;

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
        assertRefused(new String[] {"bench", "moe", "--network", "fast"}, "--network: expected auto, low-latency or high-throughput, got 'fast'");
        assertRefused(new String[] {"bench", "moe", "--shapes", "deepseek-v3,gpt-o55"}, "unknown shape 'gpt-o55'", "qwen3-30b-a3b");
        assertRefused(new String[] {"bench", "moe", "--iter", "5"}, "unknown option '--iter'", "--iters");  // misspelt: refused, not run with the defaults
        assertRefused(new String[] {"bench", "moe", "--iters", "0"}, "--iters 0: expected an integer >= 1");
        assertRefused(new String[] {"bench", "a2a", "--factor", "four"}, "--factor expects an integer, got 'four'");
        assertRefused(new String[] {"bench", "moe", "--tokens", "128,x"}, "--tokens expects comma-separated integers");
        assertRefused(new String[] {"bench", "a2a", "--iters"}, "--iters needs a value");
    }

    @Test void everyBadOptionIsNamedWithItsValidValuesOrRange() {
        assertRefused(new String[] {"bench", "a2a", "--backends", "FOO"}, "--backends FOO: expected some of [gin, host], comma-separated");
        assertRefused(new String[] {"bench", "a2a", "--backends", "GIN,nccl"}, "--backends nccl: expected some of [gin, host]");
        assertRefused(new String[] {"bench", "a2a", "--protocol", "fast"}, "--protocol fast: expected one of [auto, ll, ll128, direct, copy_engine]");
        assertRefused(new String[] {"bench", "a2a", "--min", "4Q"}, "--min 4Q: expected a size in bytes (examples: 4096, 64K, 16M, 1G)");
        assertRefused(new String[] {"bench", "a2a", "--max", "99999999999G"}, "--max 99999999999G: expected a size in bytes");
        assertRefused(new String[] {"bench", "a2a", "--min", "0"}, "--min 0: expected a size >= 1 byte");
        assertRefused(new String[] {"bench", "a2a", "--min", "4K", "--max", "1K"}, "--max 1K: expected a size >= --min (4096 bytes)");
        assertRefused(new String[] {"bench", "a2a", "--factor", "1"}, "--factor 1: expected an integer >= 2");
        assertRefused(new String[] {"bench", "a2a", "--warmup", "-1"}, "--warmup -1: expected an integer >= 0");
        assertRefused(new String[] {"bench", "a2a", "--iters", "5", "--iters", "6"}, "--iters is given twice; expected it once");
        assertRefused(new String[] {"bench", "a2a", "--out", "/no/such/folder/a2a.json"}, "--out /no/such/folder/a2a.json: the folder /no/such/folder does not exist");
        assertRefused(new String[] {"bench", "moe", "--tokens", "128,0"}, "--tokens 128,0: expected token counts >= 1, got 0");
        assertRefused(new String[] {"bench", "moe", "--warmup", "-3"}, "--warmup -3: expected an integer >= 0");
        assertRefused(new String[] {"info", "--jsn"}, "gin4j info: unknown option '--jsn', expected --json");
    }

    @Test void versionIsPrinted() {
        for (String flag : new String[] {"--version", "version"}) {
            Result r = run(flag);
            assertEquals(0, r.status(), r.err());
            assertTrue(r.out().matches("gin4j \\S+\\R"), r.out());
        }
        assertTrue(run("help").out().contains("--version"));
    }

    @Test void anUnknownRuntimeSettingExitsNonZeroNamingTheValidOnes() {
        String before = System.getProperty("gin4j.runtime");
        System.setProperty("gin4j.runtime", "foo");  // as GIN4J_RUNTIME=foo, which this JVM cannot set for itself
        try {
            assertRefused(new String[] {"info"}, "GIN4J_RUNTIME (or -Dgin4j.runtime) is 'foo': expected cuda or hip, or unset");
            assertRefused(new String[] {"info", "--json"}, "expected cuda or hip");
            assertRefused(new String[] {"bench", "a2a"}, "expected cuda or hip");
        } finally {
            if (before == null) System.clearProperty("gin4j.runtime");
            else System.setProperty("gin4j.runtime", before);
        }
    }

    @Test void infoJsonHoldsWhatInfoPrintsWhereThereIsNoGpu() {
        dev.gin4j.gpu.GpuRuntime.Discovery d = dev.gin4j.gpu.GpuRuntime.discover();
        dev.gin4j.testing.Gpus.skipUnless(!d.found(), "info --json without a GPU: this machine has one (the GPU path probes communicators)");
        Result text = run("info"), json = run("info", "--json");
        assertEquals(0, text.status(), text.err());
        assertEquals(0, json.status(), json.err());
        Map<?, ?> root = (Map<?, ?>) new JsonReader(json.out()).read();
        assertEquals(List.of("gin4j", "gpu_runtime", "collective_library", "kernels"), List.copyOf(root.keySet()));
        Map<?, ?> gpu = (Map<?, ?>) root.get("gpu_runtime");
        assertEquals(false, gpu.get("found"));
        for (Object note : (List<?>) gpu.get("notes")) assertTrue(text.out().contains("  - " + note), note + " in\n" + text.out());
        Map<?, ?> nccl = (Map<?, ?>) root.get("collective_library");
        assertTrue(text.out().contains("Collective library: " + nccl.get("library")), text.out());
        assertTrue(text.out().contains("  " + nccl.get("communicators")), text.out());
        assertEquals(Info.version(), ((Map<?, ?>) root.get("gin4j")).get("version"));
        Map<?, ?> kernels = (Map<?, ?>) root.get("kernels");
        assertTrue(text.out().contains("Kernel code objects: from " + kernels.get("source")), text.out());
        if (kernels.containsKey("built"))  // kernels built here: their argument ABI is this library's
            assertEquals("matches this library", kernels.get("moe_net_abi"), text.out());
        // the no-GPU account: each runtime once, on lines of their own
        assertTrue(text.out().lines().noneMatch(l -> l.length() > 400), text.out());
        String all = text.out();
        assertEquals(all.indexOf("CUDA driver: not loaded"), all.lastIndexOf("CUDA driver: not loaded"), all);
    }

    @Test void benchWithoutAGpuSaysSoOnceAndExitsNonZero() {
        dev.gin4j.gpu.GpuRuntime.Discovery d = dev.gin4j.gpu.GpuRuntime.discover();
        dev.gin4j.testing.Gpus.skipUnless(!d.found(), "bench without a GPU: this machine has one (bench would run)");
        String network = System.getProperty("gin4j.moe.network");  // bench moe sets it before it looks for a GPU
        try {
            for (String[] args : new String[][] {{"bench", "a2a"}, {"bench", "moe"}, {"bench", "a2a", "--min", "64K", "--max", "1M", "--backends", "HOST"},
                    {"bench", "moe", "--tokens", "128", "--shapes", "mixtral"}}) {
                String what = String.join(" ", args);
                Result r = run(args);
                assertEquals(1, r.status(), what + " exits non-zero, and not as a usage error (2): " + r.err());
                assertEquals("", r.out(), what + ": nothing on stdout before the GPU is looked for");
                // one message: the headline once, then each runtime's account once, on a line of its own
                List<String> lines = r.err().lines().toList();
                assertEquals("gin4j bench: no GPU runtime found:", lines.getFirst(), r.err());
                assertEquals(r.err().indexOf("no GPU runtime found"), r.err().lastIndexOf("no GPU runtime found"), r.err());
                assertEquals(1 + d.notes().size(), lines.size(), "the headline and one line per note: " + r.err());
                for (String note : d.notes()) {
                    assertTrue(lines.contains("  " + note), note + " in\n" + r.err());
                    assertEquals(r.err().indexOf(note), r.err().lastIndexOf(note), "said once: " + note);
                }
                for (String l : lines) assertTrue(l.length() <= 300, "a line of " + l.length() + " characters: " + l);
                assertFalse(r.err().contains("Exception") || r.err().contains("\tat "), "no stack trace or exception class: " + r.err());
            }
        } finally {
            if (network == null) System.clearProperty("gin4j.moe.network");
            else System.setProperty("gin4j.moe.network", network);
        }
    }

    @Test void infoReportJsonEscapesAndNests() {
        InfoReport r = new InfoReport();
        r.section("a", "headline").put("s", "quote \" back\\ slash\nnew line\u0001", "line one").put("n", 42, null).put("b", true, null).put("z", null, null)
                .note("notes", "  - ", "first").child("inner").put("list", List.of("x", "y"), "  x, y");
        r.list("items").add(Map.of("k", 1.5));
        assertEquals("headline\nline one\n  - first\n  x, y\n", r.text());
        Map<?, ?> root = (Map<?, ?>) new JsonReader(r.json()).read();
        Map<?, ?> a = (Map<?, ?>) root.get("a");
        assertEquals("quote \" back\\ slash\nnew line\u0001", a.get("s"));
        assertEquals(42.0, a.get("n"));
        assertEquals(true, a.get("b"));
        assertTrue(a.containsKey("z") && a.get("z") == null);
        assertEquals(List.of("first"), a.get("notes"));
        assertEquals(List.of("x", "y"), ((Map<?, ?>) a.get("inner")).get("list"));
        assertEquals(1.5, ((Map<?, ?>) ((List<?>) root.get("items")).get(0)).get("k"));
    }

    /** Just enough JSON to read the report back: objects keep their key order; numbers come back as doubles. */
    private static final class JsonReader {
        private final String s;
        private int i;

        JsonReader(String s) { this.s = s; }

        Object read() {
            Object v = value();
            space();
            assertEquals(s.length(), i, "trailing text after the JSON value");
            return v;
        }

        private void space() { while (i < s.length() && Character.isWhitespace(s.charAt(i))) i++; }

        private void expect(char c) {
            space();
            assertEquals(c, s.charAt(i), "at " + i + " of\n" + s);
            i++;
        }

        private Object value() {
            space();
            char c = s.charAt(i);
            if (c == '{') {
                Map<String, Object> m = new java.util.LinkedHashMap<>();
                i++;
                space();
                if (s.charAt(i) == '}') { i++; return m; }
                do {
                    space();
                    String k = string();
                    expect(':');
                    m.put(k, value());
                    space();
                } while (s.charAt(i++) == ',');
                assertEquals('}', s.charAt(i - 1), "at " + i);
                return m;
            }
            if (c == '[') {
                List<Object> l = new java.util.ArrayList<>();
                i++;
                space();
                if (s.charAt(i) == ']') { i++; return l; }
                do { l.add(value()); space(); } while (s.charAt(i++) == ',');
                assertEquals(']', s.charAt(i - 1), "at " + i);
                return l;
            }
            if (c == '"') return string();
            for (String word : new String[] {"true", "false", "null"}) {
                if (s.startsWith(word, i)) { i += word.length(); return word.equals("null") ? null : Boolean.valueOf(word); }
            }
            int start = i;
            while (i < s.length() && "+-0123456789.eE".indexOf(s.charAt(i)) >= 0) i++;
            return Double.valueOf(s.substring(start, i));
        }

        private String string() {
            assertEquals('"', s.charAt(i), "a string at " + i);
            StringBuilder b = new StringBuilder();
            for (i++; s.charAt(i) != '"'; i++) {
                char c = s.charAt(i);
                if (c != '\\') { b.append(c); continue; }
                c = s.charAt(++i);
                switch (c) {
                    case 'n' -> b.append('\n');
                    case 'r' -> b.append('\r');
                    case 't' -> b.append('\t');
                    case 'u' -> { b.append((char) Integer.parseInt(s.substring(i + 1, i + 5), 16)); i += 4; }
                    default -> b.append(c);
                }
            }
            i++;
            return b.toString();
        }
    }
}
