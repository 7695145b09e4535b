package dev.gin4j.cli;

import dev.gin4j.comm.Backend;
import dev.gin4j.a2a.Protocol;
import dev.gin4j.comm.CommGroup;
import dev.gin4j.gpu.GpuRuntime;

import java.io.IOException;
import java.io.PrintStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;

/** {@code gin4j bench a2a|moe}: sweeps with GIN and HOST side by side; writes JSON (and a PNG chart for a2a). */
final class Bench {
    private Bench() {}

    static int run(String[] args, PrintStream out, PrintStream err) throws IOException {
        if (args.length == 0 || java.util.Arrays.asList(args).contains("--help") || java.util.Arrays.asList(args).contains("-h")) {
            out.println("""
                    usage: gin4j bench a2a [--min 4K] [--max 1G] [--factor 4] [--iters 20] [--warmup 5]
                                           [--backends GIN,HOST] [--protocol auto|ll|ll128|direct|copy_engine] [--out a2a.json]
                           gin4j bench moe [--tokens 128,4096] [--shapes deepseek-v3,qwen3-30b-a3b,mixtral,deepseek-v3-fp8,deepseek-v3-fp8q]
                                           [--routing uniform|zipf[:S]] [--channels 0] [--network auto|low-latency|high-throughput]
                                           [--iters 20] [--warmup 10] [--out moe.json]
                    One process drives every local GPU, or one process per GPU when started the torchrun way
                    (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT; the bundle's bin/launch N does that).
                    a2a sizes are bytes each rank sends in total. moe shapes: deepseek-v3 (hidden 7168, 256 experts,
                    top-8), qwen3-30b-a3b (2048, 128, top-8), mixtral (4096, 8, top-2); deepseek-v3-fp8 dispatches
                    scaled fp8 rows, deepseek-v3-fp8q bf16 x quantized by the dispatch. --routing zipf[:S]: skewed
                    routing, expert e picked in proportion to 1 / (1 + its place)^S (S = 1), the same hot experts
                    on every rank; uniform otherwise. --channels C: the GIN kernels on 2C SMs (0: half the SMs, at most
                    128), as MoeConfig.withChannels, also timed beside blocks that hold every other SM. --network: the
                    mode of GIN across nodes (MoeAllToAll.networkMode; auto: by maxTokens and node sizes).""");
            return 0;
        }
        return switch (args[0]) {
            case "a2a" -> a2a(args, out);
            case "moe" -> MoeBench.run(args, out);
            default -> throw new IllegalArgumentException("unknown benchmark '" + args[0] + "': expected a2a or moe");
        };
    }

    /**
     * One process driving every local GPU, or, when launched the torchrun way (RANK, WORLD_SIZE,
     * LOCAL_RANK, MASTER_ADDR, MASTER_PORT set), one rank per process.
     */
    static CommGroup openGroup(GpuRuntime rt) {
        return System.getenv("WORLD_SIZE") != null ? CommGroup.fromEnvironment() : CommGroup.initAll(rt.devices());
    }

    /** A line saying the group is nonblocking (its HOST calls are slower for it), or nothing. */
    static String modeNote(CommGroup g) {
        return g.isNonblocking() ? "NCCL communicators: nonblocking (GIN4J_COMM_NONBLOCKING=1 or NCCL_COMM_BLOCKING=0): every HOST group call also pays for the thread NCCL starts for it\n" : "";
    }

    /** The slowest rank's value of a per-rank measurement (a no-op with one process). */
    static double slowest(CommGroup g, double mine) {
        if (g.isSingleProcess()) return mine;
        long[] all = g.allGatherLongs(new long[] {Double.doubleToRawLongBits(mine)})[0];
        return java.util.Arrays.stream(all).mapToDouble(Double::longBitsToDouble).max().orElse(mine);
    }

    /** Whether this process prints the report (rank 0, or the only process). */
    static boolean reports(CommGroup g) { return g.rank(0).rank() == 0; }

    static String option(String[] args, String name, String dflt) {
        for (int i = 1; i < args.length - 1; i++) if (args[i].equals(name)) return args[i + 1];
        return dflt;
    }

    /** An integer option, or an error that names the option and what it got. */
    static int intOption(String[] args, String name, String dflt) {
        String v = option(args, name, dflt);
        try {
            return Integer.parseInt(v.trim());
        } catch (NumberFormatException e) {
            throw new IllegalArgumentException(name + " expects an integer, got '" + v + "'");
        }
    }

    /** An integer option of at least {@code min}, or an error naming the option, its value and the range. */
    static int intOption(String[] args, String name, String dflt, int min) {
        int v = intOption(args, name, dflt);
        if (v < min) throw new IllegalArgumentException(name + " " + v + ": expected an integer >= " + min);
        return v;
    }

    /** An enum constant named case-insensitively, or an error naming the option, the value and every valid one. */
    static <E extends Enum<E>> E enumValue(String option, String value, Class<E> type) {
        for (E e : type.getEnumConstants()) if (e.name().equalsIgnoreCase(value.trim())) return e;
        throw new IllegalArgumentException(option + " " + value + ": expected " + (option.equals("--backends") ? "some of " : "one of ")
                + java.util.Arrays.stream(type.getEnumConstants()).map(e -> e.name().toLowerCase(Locale.ROOT)).toList()
                + (option.equals("--backends") ? ", comma-separated" : ""));
    }

    /** The --out path, refused when the folder it would be written into does not exist. */
    static Path outPath(String[] args, String dflt) {
        String v = option(args, "--out", dflt);
        Path p = Path.of(v);
        Path parent = p.toAbsolutePath().getParent();
        if (parent != null && !Files.isDirectory(parent)) throw new IllegalArgumentException("--out " + v + ": the folder " + parent + " does not exist");
        return p;
    }

    /** Refuses what is not "--option value" with a known option, once each: a misspelt or repeated one would silently run another setting. */
    static void checkOptions(String[] args, List<String> known) {
        java.util.Set<String> seen = new java.util.HashSet<>();
        for (int i = 1; i < args.length; i += 2) {
            if (!known.contains(args[i]))
                throw new IllegalArgumentException("bench " + args[0] + ": unknown option '" + args[i] + "', expected some of " + known);
            if (i + 1 >= args.length) throw new IllegalArgumentException("bench " + args[0] + ": " + args[i] + " needs a value");
            if (!seen.add(args[i])) throw new IllegalArgumentException("bench " + args[0] + ": " + args[i] + " is given twice; expected it once");
        }
    }

    /** A byte count with an optional K/M/G suffix, or an error naming the option. */
    static long parseSize(String option, String s) {
        String t = s.trim().toUpperCase(Locale.ROOT);
        long mul = 1;
        if (t.endsWith("K")) { mul = 1L << 10; t = t.substring(0, t.length() - 1); }
        else if (t.endsWith("M")) { mul = 1L << 20; t = t.substring(0, t.length() - 1); }
        else if (t.endsWith("G")) { mul = 1L << 30; t = t.substring(0, t.length() - 1); }
        try {
            return Math.multiplyExact(Long.parseLong(t), mul);
        } catch (NumberFormatException | ArithmeticException e) {
            throw new IllegalArgumentException(option + " " + s + ": expected a size in bytes (examples: 4096, 64K, 16M, 1G)");
        }
    }

    private static int a2a(String[] args, PrintStream out) throws IOException {
        checkOptions(args, List.of("--min", "--max", "--factor", "--iters", "--warmup", "--backends", "--protocol", "--out"));
        long min = parseSize("--min", option(args, "--min", "4K")), max = parseSize("--max", option(args, "--max", "1G"));
        if (min < 1) throw new IllegalArgumentException("--min " + option(args, "--min", "4K") + ": expected a size >= 1 byte");
        if (max < min) throw new IllegalArgumentException("--max " + option(args, "--max", "1G") + ": expected a size >= --min (" + min + " bytes)");
        int factor = intOption(args, "--factor", "4", 2);
        int iters = intOption(args, "--iters", "20", 1), warmup = intOption(args, "--warmup", "5", 0);
        List<Backend> backends = new ArrayList<>();
        for (String b : option(args, "--backends", "GIN,HOST").split(",")) {
            Backend backend = enumValue("--backends", b, Backend.class);
            if (!backends.contains(backend)) backends.add(backend);
        }
        Protocol protocol = enumValue("--protocol", option(args, "--protocol", "auto"), Protocol.class);
        Path json = outPath(args, "a2a.json");
        GpuRuntime rt = GpuRuntime.get();
        List<Long> sizes = new ArrayList<>();
        for (long s = min; s <= max; s *= factor) sizes.add(s);
        out.printf("gin4j bench a2a: %d GPUs (%s), sizes %d..%d bytes per rank, median of %d after %d warm-ups%n",
                rt.devices().size(), rt.device(0).name(), min, max, iters, warmup);
        List<A2aSweep.Row> rows;
        try (CommGroup g = openGroup(rt)) {
            rows = A2aSweep.run(g, sizes.stream().mapToLong(Long::longValue).toArray(), backends, protocol, warmup, iters, reports(g) ? out : null);
            List<A2aSweep.Row> merged = new ArrayList<>();
            for (A2aSweep.Row r : rows) {
                double med = slowest(g, r.medianUs()), pipe = slowest(g, r.pipelinedUs()), alg = r.sizeBytes() / (med * 1e-6) / 1e9;
                merged.add(new A2aSweep.Row(r.sizeBytes(), r.backend(), r.plan(), med, r.minUs(), alg, alg * (g.worldSize() - 1) / g.worldSize(), r.cpuUsPerRank(), pipe));
            }
            rows = merged;
            if (!reports(g)) return 0;
            out.print(modeNote(g));
            out.println(g.isSingleProcess() ? "(one process drives all " + g.worldSize() + " GPUs)" : "(one process per GPU, " + g.worldSize() + " ranks; times are the slowest rank's)");
        }
        Report.printA2aTable(rows, out);
        Files.writeString(json, Report.a2aJson(rows, rt));
        Path png = json.resolveSibling(json.getFileName().toString().replaceAll("\\.json$", "") + ".png");
        Report.a2aChart(rows, png);
        out.println("wrote " + json + " and " + png);
        return 0;
    }
}
