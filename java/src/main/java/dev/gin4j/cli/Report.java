package dev.gin4j.cli;

import dev.gin4j.comm.Backend;
import dev.gin4j.gpu.GpuRuntime;

import java.io.IOException;
import java.io.PrintStream;
import java.nio.file.Path;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.TreeMap;
import java.util.stream.Collectors;

/** Tables, JSON and the chart for the benchmark sweeps. */
final class Report {
    private Report() {}

    static String human(long bytes) {
        if (bytes >= 1L << 30 && bytes % (1L << 30) == 0) return (bytes >> 30) + " GiB";
        if (bytes >= 1L << 20 && bytes % (1L << 20) == 0) return (bytes >> 20) + " MiB";
        if (bytes >= 1L << 10 && bytes % (1L << 10) == 0) return (bytes >> 10) + " KiB";
        return bytes + " B";
    }

    /** GIN and HOST side by side per size, with the HOST/GIN time ratio. */
    static void printA2aTable(List<A2aSweep.Row> rows, PrintStream out) {
        Map<Long, Map<Backend, A2aSweep.Row>> bySize = new TreeMap<>();
        for (A2aSweep.Row r : rows) bySize.computeIfAbsent(r.sizeBytes(), k -> new java.util.EnumMap<>(Backend.class)).put(r.backend(), r);
        out.println();
        out.println("size per rank | GIN us  pipelined (plan)              busBw | HOST us  pipelined  busBw | HOST/GIN per call, pipelined");
        for (var e : bySize.entrySet()) {
            A2aSweep.Row g = e.getValue().get(Backend.GIN), h = e.getValue().get(Backend.HOST);
            out.printf(Locale.ROOT, "%13s | %s | %s | %s%n", human(e.getKey()),
                    g == null ? String.format("%-45s", "-") : String.format(Locale.ROOT, "%7.2f %9.2f (%-16s) %7.1f", g.medianUs(), g.pipelinedUs(), g.plan(), g.busBwGBs()),
                    h == null ? String.format("%-25s", "-") : String.format(Locale.ROOT, "%7.2f %10.2f %6.1f", h.medianUs(), h.pipelinedUs(), h.busBwGBs()),
                    g == null || h == null ? "-" : String.format(Locale.ROOT, "%.2fx, %.2fx", h.medianUs() / g.medianUs(), h.pipelinedUs() / g.pipelinedUs()));
        }
        out.println("(size = bytes each rank sends; busBw = size/time*(n-1)/n from the per-call median; per call = device events around each call,"
                + " slowest rank, median; pipelined = calls back to back / count after one untimed call, median of " + A2aSweep.PIPELINED_BATCHES + " batches, as nccl-tests times)");
    }

    static String a2aJson(List<A2aSweep.Row> rows, GpuRuntime rt) {
        String items = rows.stream().map(r -> String.format(Locale.ROOT,
                "    {\"size_bytes\": %d, \"backend\": \"%s\", \"plan\": \"%s\", \"median_us\": %.3f, \"min_us\": %.3f, \"algbw_gbs\": %.3f, \"busbw_gbs\": %.3f, \"java_cpu_us_per_rank\": %.3f, \"pipelined_us\": %.3f}",
                r.sizeBytes(), r.backend(), r.plan(), r.medianUs(), r.minUs(), r.algBwGBs(), r.busBwGBs(), r.cpuUsPerRank(), r.pipelinedUs())).collect(Collectors.joining(",\n"));
        return "{\n  \"benchmark\": \"all-to-all\",\n  \"gpus\": " + rt.devices().size() + ",\n  \"device\": \"" + rt.device(0).name() + "\",\n"
                + "  \"size_definition\": \"bytes each rank sends in total; algBw = size/time; busBw = algBw*(n-1)/n\",\n  \"rows\": [\n" + items + "\n  ]\n}\n";
    }

    /** Time against size, both axes log2, one line per backend. */
    static void a2aChart(List<A2aSweep.Row> rows, Path file) throws IOException {
        int w = 900, h = 560, left = 90, right = 30, top = 50, bottom = 70;
        Png png = new Png(w, h);
        double minS = rows.stream().mapToDouble(r -> Math.log(r.sizeBytes()) / Math.log(2)).min().orElse(0);
        double maxS = rows.stream().mapToDouble(r -> Math.log(r.sizeBytes()) / Math.log(2)).max().orElse(1);
        double minT = Math.floor(rows.stream().mapToDouble(r -> Math.log(r.medianUs()) / Math.log(2)).min().orElse(0));
        double maxT = Math.ceil(rows.stream().mapToDouble(r -> Math.log(r.medianUs()) / Math.log(2)).max().orElse(1));
        if (maxS == minS) maxS = minS + 1;
        if (maxT == minT) maxT = minT + 1;
        final double s0 = minS, s1 = maxS, t0 = minT, t1 = maxT;
        java.util.function.DoubleUnaryOperator px = s -> left + (s - s0) / (s1 - s0) * (w - left - right);
        java.util.function.DoubleUnaryOperator py = t -> h - bottom - (t - t0) / (t1 - t0) * (h - top - bottom);
        png.line(left, h - bottom, w - right, h - bottom, 0x000000, 2);
        png.line(left, top, left, h - bottom, 0x000000, 2);
        for (double t = t0; t <= t1; t++) {
            int y = (int) py.applyAsDouble(t);
            png.line(left, y, w - right, y, 0xdddddd, 1);
            png.text(8, y - 3, String.format(Locale.ROOT, "%.0f", Math.pow(2, t)), 0x000000, 1);
        }
        for (A2aSweep.Row r : rows) {
            if (r.backend() != Backend.GIN) continue;
            int x = (int) px.applyAsDouble(Math.log(r.sizeBytes()) / Math.log(2));
            png.line(x, h - bottom, x, h - bottom + 5, 0x000000, 1);
            png.text(x - 14, h - bottom + 10, human(r.sizeBytes()).replace(" ", ""), 0x000000, 1);
        }
        png.text(left, 15, "ALL-TO-ALL TIME (US) VS SIZE PER RANK", 0x000000, 2);
        png.text(w / 2 - 60, h - 25, "SIZE PER RANK", 0x000000, 2);
        int[] colors = {0xd62728, 0x1f77b4};
        int k = 0;
        for (Backend b : Backend.values()) {
            List<A2aSweep.Row> line = rows.stream().filter(r -> r.backend() == b).toList();
            if (line.isEmpty()) continue;
            int c = colors[k++ % colors.length];
            for (int i = 1; i < line.size(); i++) {
                png.line((int) px.applyAsDouble(log2(line.get(i - 1).sizeBytes())), (int) py.applyAsDouble(log2(line.get(i - 1).medianUs())),
                        (int) px.applyAsDouble(log2(line.get(i).sizeBytes())), (int) py.applyAsDouble(log2(line.get(i).medianUs())), c, 3);
            }
            for (A2aSweep.Row r : line) png.rect((int) px.applyAsDouble(log2(r.sizeBytes())) - 3, (int) py.applyAsDouble(log2(r.medianUs())) - 3, 7, 7, c);
            png.rect(left + 20, top + 10 + 22 * (k - 1), 30, 6, c);
            png.text(left + 60, top + 8 + 22 * (k - 1), b.name(), c, 2);
        }
        png.write(file);
    }

    private static double log2(double v) { return Math.log(v) / Math.log(2); }
}
