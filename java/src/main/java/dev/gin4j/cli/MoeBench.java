package dev.gin4j.cli;

import dev.gin4j.bindings.basic.GinHoldSmsArgs;
import dev.gin4j.internal.moe.MoeReports;
import dev.gin4j.internal.gpu.KernelLibrary;
import dev.gin4j.comm.Backend;
import dev.gin4j.comm.DType;
import dev.gin4j.comm.CommGroup;
import dev.gin4j.gpu.CodeObject;
import dev.gin4j.gpu.Device;
import dev.gin4j.gpu.DeviceBuffer;
import dev.gin4j.gpu.Event;
import dev.gin4j.gpu.GpuRuntime;
import dev.gin4j.gpu.Graph;
import dev.gin4j.gpu.Kernel;
import dev.gin4j.gpu.KernelArgs;
import dev.gin4j.gpu.LaunchConfig;
import dev.gin4j.moe.MoeAllToAll;
import dev.gin4j.moe.MoeConfig;
import dev.gin4j.moe.MoeDispatch;
import dev.gin4j.moe.Fp8Rows;
import dev.gin4j.gpu.Stream;
import dev.gin4j.gpu.PinnedBuffer;

import java.io.IOException;
import java.io.PrintStream;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.lang.invoke.VarHandle;
import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Locale;
import java.util.SplittableRandom;

/**
 * {@code gin4j bench moe}: dispatch and combine, GIN and HOST in one process on the same inputs,
 * uniform random top-k routing (or Zipf-skewed, {@code --routing zipf[:S]}, see {@link Routing}), identity experts (expertOut = the received rows). Device events
 * around each call on every rank (slowest rank, median); CPU time of the Java call itself is
 * reported too. GB/s = (tokens x remote destination ranks they go to, each token counted once per
 * rank) x row bytes / time: the bytes that must cross NVLink (rows of 2H bytes; an fp8 dispatch's
 * rows are scaled fp8 rows, {@code Fp8Rows.rowBytes(H)}).
 */
final class MoeBench {
    /** input: what x holds (the row type, or BF16 that an fp8 dispatch quantizes itself). */
    record Shape(String name, int hidden, int experts, int topK, DType dtype, DType input) {
        Shape(String name, int hidden, int experts, int topK, DType dtype) { this(name, hidden, experts, topK, dtype, dtype); }
    }
    record Row(String shape, int tokens, Backend backend, double dispatchUs, double combineUs, double dispatchPipeUs, double combinePipeUs,
               double dispatchCpuUs, double combineCpuUs, double dispatchThreadCpuUs, double combineThreadCpuUs, double graphUs, double graphThreadCpuUs,
               double valuesUs, double valuesPipeUs, double valuesThreadCpuUs,
               long crossingBytes, long dispatchCrossingBytes, String kernel, double busiestExpert, int channels,
               double dispatchBesideUs, double combineBesideUs) {}

    static final List<Shape> SHAPES = List.of(new Shape("deepseek-v3", 7168, 256, 8, DType.BF16), new Shape("qwen3-30b-a3b", 2048, 128, 8, DType.BF16),
            new Shape("mixtral", 4096, 8, 2, DType.BF16), new Shape("deepseek-v3-fp8", 7168, 256, 8, DType.FP8_E4M3),
            new Shape("deepseek-v3-fp8q", 7168, 256, 8, DType.FP8_E4M3, DType.BF16),
            // not in gin-kernels/moe_shapes.list: their shaped entries are compiled on first use
            new Shape("gpt-oss", 2880, 128, 4, DType.BF16), new Shape("qwen3-235b", 4096, 128, 8, DType.BF16),
            new Shape("kimi-k2", 7168, 384, 8, DType.BF16), new Shape("deepseek-v2", 5120, 160, 6, DType.BF16));

    /** A shape by name, or a bf16 shape written hidden/experts/topk (e.g. 2880/128/4). */
    static Shape shape(String name) {
        for (Shape s : SHAPES) if (s.name().equals(name)) return s;
        String[] p = name.split("/");
        if (p.length == 3) {
            try {
                int h = Integer.parseInt(p[0].trim()), e = Integer.parseInt(p[1].trim()), k = Integer.parseInt(p[2].trim());
                if (h > 0 && e > 0 && k > 0) return new Shape(name, h, e, k, DType.BF16);
            } catch (NumberFormatException ignored) {
                // reported below
            }
        }
        throw new IllegalArgumentException("--shapes: unknown shape '" + name + "', expected some of " + SHAPES.stream().map(Shape::name).toList()
                + " or hidden/experts/topk with positive integers (e.g. 2880/128/4)");
    }

    /** Calls back to back in the pipelined measurement. */
    static final int PIPELINED = 20;
    /** Pipelined batches; the median is reported. */
    static final int BATCHES = 5;

    /**
     * Calls of the throwaway run before the first measured shape. HotSpot compiles a method with C2
     * only after ~10^4 invocations; 1500 warm-up calls of the first shape left part of the call path
     * in the interpreter or C1 while that shape was measured (2026-11-30: its per-call and CPU times
     * came out 1.5-2x the later rows' in 2 of 3 runs, and only in the first row).
     */
    static final int JIT_WARMUP_CALLS = 20_000;

    private MoeBench() {}

    static int run(String[] args, PrintStream out) throws IOException {
        Bench.checkOptions(args, List.of("--tokens", "--shapes", "--entries", "--routing", "--channels", "--network", "--iters", "--warmup", "--out"));
        // --network: the mode of GIN across nodes (MoeAllToAll.networkMode); nothing changes inside one node
        String network = Bench.option(args, "--network", "auto");
        try {
            System.setProperty("gin4j.moe.network", dev.gin4j.moe.NetworkMode.valueOf(network.toUpperCase(Locale.ROOT).replace('-', '_')).name());
        } catch (IllegalArgumentException e) {
            throw new IllegalArgumentException("--network: expected auto, low-latency or high-throughput, got '" + network + "'");
        }
        int iters = Bench.intOption(args, "--iters", "20", 1);
        int warmup = Bench.intOption(args, "--warmup", "10", 0);  // GIN runs at least 1500
        String tokenList = Bench.option(args, "--tokens", "128,4096");
        int[] tokenCounts;
        try {
            tokenCounts = Arrays.stream(tokenList.split(",")).mapToInt(s -> Integer.parseInt(s.trim())).toArray();
        } catch (NumberFormatException e) {
            throw new IllegalArgumentException("--tokens expects comma-separated integers, got '" + tokenList + "'");
        }
        // each count is the instance's maxTokens too, which must be >= 1
        for (int t : tokenCounts) if (t < 1) throw new IllegalArgumentException("--tokens " + tokenList + ": expected token counts >= 1, got " + t);
        List<String> names = List.of(Bench.option(args, "--shapes", "deepseek-v3,qwen3-30b-a3b,mixtral,deepseek-v3-fp8,deepseek-v3-fp8q").split(","));
        List<Shape> shapes = names.stream().map(MoeBench::shape).toList();
        // --entries auto,generic: each shape once per way of choosing the GIN token-path entry (GIN4J_MOE_ENTRIES)
        List<String> entryModes = List.of(Bench.option(args, "--entries", System.getProperty("gin4j.moe.entries", "auto")).split(","));
        for (String e : entryModes)
            if (!List.of("auto", "jit", "generic").contains(e)) throw new IllegalArgumentException("--entries: expected some of auto, jit, generic, got '" + e + "'");
        Path json = Bench.outPath(args, "moe.json");
        Routing routing = Routing.parse(Bench.option(args, "--routing", "uniform"));
        int channels = Bench.intOption(args, "--channels", "0");  // 0: MoeConfig's default (the whole GPU)
        if (channels < 0 || channels > 128) throw new IllegalArgumentException("--channels " + channels + ": expected 0 (half the SMs) or 1 to 128");
        GpuRuntime rt = GpuRuntime.get();
        List<Row> rows = new ArrayList<>();
        double[] floor;
        String mode;
        try (CommGroup g = Bench.openGroup(rt)) {
            mode = Bench.modeNote(g);
            floor = launchFloor(g.rank(0).device());
            for (int i = 0; i < floor.length; i++) floor[i] = Bench.slowest(g, floor[i]);
            System.setProperty("gin4j.moe.entries", entryModes.getFirst());
            measure(g, shapes.getFirst(), Arrays.stream(tokenCounts).min().getAsInt(), Backend.GIN, routing, channels, JIT_WARMUP_CALLS, 1);
            for (Shape named : shapes) {
                for (String entries : entryModes)
                for (int tokens : tokenCounts) {
                    System.setProperty("gin4j.moe.entries", entries);
                    Shape shape = entryModes.size() == 1 ? named : new Shape(named.name() + "/" + entries, named.hidden(), named.experts(), named.topK(), named.dtype(), named.input());
                    for (Backend b : List.of(Backend.GIN, Backend.HOST)) {
                        Row m = measure(g, shape, tokens, b, routing, channels, warmup, iters);
                        Row r = new Row(m.shape(), m.tokens(), m.backend(), Bench.slowest(g, m.dispatchUs()), Bench.slowest(g, m.combineUs()),
                                Bench.slowest(g, m.dispatchPipeUs()), Bench.slowest(g, m.combinePipeUs()),
                                Bench.slowest(g, m.dispatchCpuUs()), Bench.slowest(g, m.combineCpuUs()),
                                Bench.slowest(g, m.dispatchThreadCpuUs()), Bench.slowest(g, m.combineThreadCpuUs()),
                                Bench.slowest(g, m.graphUs()), Bench.slowest(g, m.graphThreadCpuUs()),
                                Bench.slowest(g, m.valuesUs()), Bench.slowest(g, m.valuesPipeUs()), Bench.slowest(g, m.valuesThreadCpuUs()),
                                m.crossingBytes(), m.dispatchCrossingBytes(), m.kernel(), m.busiestExpert(), m.channels(),
                                Bench.slowest(g, m.dispatchBesideUs()), Bench.slowest(g, m.combineBesideUs()));
                        rows.add(r);
                        if (Bench.reports(g)) out.printf(Locale.ROOT, "%-15s T=%5d %-4s dispatch %9.1f us  combine %9.1f us  pipelined %9.1f / %9.1f us  (per call: wall %.1f / %.1f us, thread CPU %.1f / %.1f us)"
                                + "  returnRowValues %.1f us (pipelined %.1f, thread CPU %.1f)  busiest expert %.1fx the mean  %s"
                                + (Double.isNaN(r.dispatchBesideUs()) ? "" : String.format(Locale.ROOT, "  beside compute on the other SMs: pipelined %.1f / %.1f us", r.dispatchBesideUs(), r.combineBesideUs())) + "%n",
                                shape.name(), tokens, b, r.dispatchUs(), r.combineUs(), r.dispatchPipeUs(), r.combinePipeUs(), r.dispatchCpuUs(), r.combineCpuUs(),
                                r.dispatchThreadCpuUs(), r.combineThreadCpuUs(), r.valuesUs(), r.valuesPipeUs(), r.valuesThreadCpuUs(), r.busiestExpert(), r.kernel());
                    }
                }
            }
            if (!Bench.reports(g)) return 0;
        }
        out.println();
        out.print(mode);
        out.println("GIN channels: " + rows.getFirst().channels() + " (grid " + 2 * rows.getFirst().channels() + " blocks of 512 threads, one per SM)"
                + (channels == 0 ? ", from the GPUs" : ", --channels"));
        out.println("routing: " + routing + (routing.zipfS() == 0 ? "" : " (busiest expert's rows / the mean, this process's tokens: "
                + rows.stream().filter(r -> r.backend() == Backend.GIN).map(r -> String.format(Locale.ROOT, "%s T=%d %.1fx", r.shape(), r.tokens(), r.busiestExpert())).toList() + ")"));
        out.println("shape           tokens | GIN disp us   GB/s | GIN comb us   GB/s | HOST disp us | HOST comb us | HOST/GIN (d+c) | GIN pipelined d / c us | HOST pipelined d / c us | GIN wall us/call | GIN thread CPU us/call | graph us | graph CPU us | row values GIN / HOST us | GIN / HOST pipelined us");
        for (int i = 0; i + 1 < rows.size(); i += 2) {
            Row gr = rows.get(i), hr = rows.get(i + 1);
            out.printf(Locale.ROOT, "%-15s %6d | %11.1f %6.1f | %11.1f %6.1f | %12.1f | %12.1f | %13.2fx | %10.1f / %9.1f | %11.1f / %9.1f | %.1f / %.1f | %.1f / %.1f | %8.1f | %12.1f | %8.1f / %8.1f | %8.1f / %8.1f%n", gr.shape(), gr.tokens(),
                    gr.dispatchUs(), gr.dispatchCrossingBytes() / (gr.dispatchUs() * 1e3), gr.combineUs(), gr.crossingBytes() / (gr.combineUs() * 1e3),
                    hr.dispatchUs(), hr.combineUs(), (hr.dispatchUs() + hr.combineUs()) / (gr.dispatchUs() + gr.combineUs()),
                    gr.dispatchPipeUs(), gr.combinePipeUs(), hr.dispatchPipeUs(), hr.combinePipeUs(), gr.dispatchCpuUs(), gr.combineCpuUs(),
                    gr.dispatchThreadCpuUs(), gr.combineThreadCpuUs(), gr.graphUs(), gr.graphThreadCpuUs(), gr.valuesUs(), hr.valuesUs(), gr.valuesPipeUs(), hr.valuesPipeUs());
        }
        out.println("(GB/s: tokens x remote ranks they go to x row bytes (2H; the fp8 dispatch: H + 4 per 128 elements, padded to 16), per rank, over the call time; time = slowest rank, median of device events"
                + " around each call, the launch included; pipelined = " + PIPELINED + " dispatches back to back after one untimed one, then " + PIPELINED
                + " combines of the last one, device time / " + PIPELINED + ", median of " + BATCHES + " batches, the nccl-tests way; wall us/call = System.nanoTime around"
                + " each call, median; thread CPU = the calling thread's CPU time over the pipelined launches / calls; graph = dispatch + combine captured"
                + " in one CUDA graph per GPU, " + PIPELINED + " replays back to back, device time and thread CPU per replay, median of " + BATCHES + " batches;"
                + " row values = returnRowValues of one f32 per received row after the combine, per call and " + PIPELINED + " back to back after the last dispatch)");
        out.printf(Locale.ROOT, "launch floor, same thread and loop (%d launches back to back, median of %d batches, slowest rank): empty kernel %.2f us"
                + " of thread CPU per launch on an idle GPU, %.2f us queued behind a busy one; making the device current %.2f us;"
                + " replaying a captured graph of the empty kernel %.2f us%n",
                PIPELINED, FLOOR_BATCHES, floor[0], floor[1], floor[2], floor[3]);
        StringBuilder sb = new StringBuilder("{\n  \"benchmark\": \"moe\",\n  \"gpus\": " + rt.devices().size()
                + String.format(Locale.ROOT, ",\n  \"empty_launch_thread_cpu_us\": %.3f,\n  \"empty_launch_busy_gpu_thread_cpu_us\": %.3f,\n  \"make_current_thread_cpu_us\": %.3f,\n  \"empty_graph_replay_thread_cpu_us\": %.3f",
                        floor[0], floor[1], floor[2], floor[3])
                + ",\n  \"routing\": \"" + routing + "\""
                + ",\n  \"gin_channels\": " + (rows.isEmpty() ? 0 : rows.getFirst().channels())
                + ",\n  \"rows\": [\n");
        for (int i = 0; i < rows.size(); i++) {
            Row r = rows.get(i);
            sb.append(String.format(Locale.ROOT, "    {\"shape\": \"%s\", \"tokens\": %d, \"backend\": \"%s\", \"dispatch_us\": %.2f, \"combine_us\": %.2f, \"dispatch_pipelined_us\": %.2f, \"combine_pipelined_us\": %.2f, \"dispatch_cpu_us\": %.2f, \"combine_cpu_us\": %.2f, \"dispatch_thread_cpu_us\": %.2f, \"combine_thread_cpu_us\": %.2f, \"graph_us\": %s, \"graph_thread_cpu_us\": %s, \"row_values_us\": %.2f, \"row_values_pipelined_us\": %.2f, \"row_values_thread_cpu_us\": %.2f, \"crossing_bytes\": %d, \"dispatch_crossing_bytes\": %d, \"kernel\": \"%s\", \"busiest_expert_vs_mean\": %.2f, \"dispatch_beside_compute_us\": %s, \"combine_beside_compute_us\": %s}%s%n",
                    r.shape(), r.tokens(), r.backend(), r.dispatchUs(), r.combineUs(), r.dispatchPipeUs(), r.combinePipeUs(), r.dispatchCpuUs(), r.combineCpuUs(), r.dispatchThreadCpuUs(), r.combineThreadCpuUs(), jsonNumber(r.graphUs()), jsonNumber(r.graphThreadCpuUs()), r.valuesUs(), r.valuesPipeUs(), r.valuesThreadCpuUs(), r.crossingBytes(), r.dispatchCrossingBytes(), r.kernel(), r.busiestExpert(), jsonNumber(r.dispatchBesideUs()), jsonNumber(r.combineBesideUs()), i + 1 < rows.size() ? "," : ""));
        }
        Files.writeString(json, sb.append("  ]\n}\n").toString());
        out.println("wrote " + json);
        return 0;
    }

    static Row measure(CommGroup g, Shape shape, int tokens, Backend backend, Routing routing, int channels, int warmup, int iters) {
        int n = g.worldSize(), local = g.localCount(), k = shape.topK(), h = shape.hidden();
        SplittableRandom random = new SplittableRandom(42);
        List<Stream> streams = new ArrayList<>();
        List<Event> e0 = new ArrayList<>(), e1 = new ArrayList<>(), e2 = new ArrayList<>(), e3 = new ArrayList<>();
        try (Arena a = Arena.ofShared(); MoeAllToAll moe = MoeAllToAll.create(g, new MoeConfig(h, shape.experts(), k, tokens, shape.dtype(), backend, shape.input(), channels))
                .networkMode(dev.gin4j.moe.NetworkMode.valueOf(System.getProperty("gin4j.moe.network", "AUTO")))) {
            List<DeviceBuffer> xs = new ArrayList<>(), ids = new ArrayList<>(), ws = new ArrayList<>(), outs = new ArrayList<>();
            long crossingTokens = 0;
            double[] popularity = routing.popularity(shape.experts());
            long[] perExpert = new long[shape.experts()];
            int[] pool = new int[shape.experts()];
            for (int i = 0; i < local; i++) {
                Device d = g.rank(i).device();
                streams.add(d.createStream());
                e0.add(d.createEvent()); e1.add(d.createEvent()); e2.add(d.createEvent()); e3.add(d.createEvent());
                short[] x = new short[tokens * h];
                for (int j = 0; j < x.length; j++) x[j] = (short) (0x3f00 | random.nextInt(0x80)); // bf16 in [0.5, 1)
                int[] idx = new int[tokens * k];
                float[] w = new float[tokens * k];
                for (int t = 0; t < tokens; t++) {
                    Routing.pick(random, popularity, shape.experts(), k, idx, t * k, pool);
                    boolean[] to = new boolean[n];
                    for (int s = 0; s < k; s++) { int e = idx[t * k + s]; w[t * k + s] = random.nextFloat(); to[e / (shape.experts() / n)] = true; perExpert[e]++; }
                    for (int d2 = 0; d2 < n; d2++) if (to[d2] && d2 != g.rank(i).rank()) crossingTokens++;
                }
                DeviceBuffer xb = upload(d, a, MemorySegment.ofArray(x));
                if (shape.input() == DType.FP8_E4M3) {  // the dispatch takes scaled fp8 rows: quantize on the device
                    try (Fp8Rows q = new Fp8Rows(d)) {
                        xb = q.quantize(xb, tokens, h, a, streams.get(i));
                        q.checkErrors(streams.get(i));
                    }
                }
                xs.add(xb);
                ids.add(upload(d, a, MemorySegment.ofArray(idx)));
                ws.add(upload(d, a, MemorySegment.ofArray(w)));
            }
            int[] tk = new int[local];
            Arrays.fill(tk, tokens);
            double[] dUs = new double[iters], cUs = new double[iters], dCpu = new double[iters], cCpu = new double[iters], vUs = new double[iters];
            // returnRowValues (the router weights' gradient in training) with the received weights as the row values
            List<DeviceBuffer> rowValues = new ArrayList<>();
            // the JIT compiles the call path only after thousands of calls: warm GIN (cheap) long enough
            // that the CPU time per call measures compiled code, as in a training loop
            int warm = backend == Backend.GIN ? Math.max(warmup, 1500) : warmup;
            for (int it = -warm; it < iters; it++) {
                for (int i = 0; i < local; i++) e0.get(i).record(streams.get(i));
                long t0 = System.nanoTime();
                List<MoeDispatch> hs = moe.dispatch(xs, ids, ws, tk, streams);
                long t1 = System.nanoTime();
                for (int i = 0; i < local; i++) e1.get(i).record(streams.get(i));
                if (outs.isEmpty()) {  // identity experts: the received rows; an fp8 dispatch's are smaller than the bf16 outputs
                    for (int i = 0; i < local; i++) {
                        DeviceBuffer out = hs.get(i).rows();
                        if (shape.dtype() != DType.BF16) {
                            out = g.rank(i).device().allocate(moe.capacityRows() * moe.config().combineRowBytes(), a);
                            out.fill((byte) 0, streams.get(i));
                        }
                        outs.add(out);
                    }
                }
                long t2 = System.nanoTime();
                moe.combine(hs, outs, streams);
                long t3 = System.nanoTime();
                for (int i = 0; i < local; i++) e2.get(i).record(streams.get(i));
                if (rowValues.isEmpty()) hs.forEach(hd -> rowValues.add(hd.weights()));
                moe.returnRowValues(hs, rowValues, streams);
                for (int i = 0; i < local; i++) e3.get(i).record(streams.get(i));
                double dw = 0, cw = 0, vw = 0;
                for (int i = 0; i < local; i++) {
                    e3.get(i).synchronize();
                    dw = Math.max(dw, e1.get(i).elapsedMillisSince(e0.get(i)) * 1e3);
                    cw = Math.max(cw, e2.get(i).elapsedMillisSince(e1.get(i)) * 1e3);
                    vw = Math.max(vw, e3.get(i).elapsedMillisSince(e2.get(i)) * 1e3);
                }
                if (it >= 0) {
                    dUs[it] = dw; cUs[it] = cw; vUs[it] = vw;
                    dCpu[it] = (t1 - t0) / 1e3 / local; cCpu[it] = (t3 - t2) / 1e3 / local;
                }
            }
            // Pipelined: the launches queue behind each other, as behind the router's GEMM in a model,
            // so neither the launch cost nor the ranks' start skew is in the time.
            // The thread's CPU time over those launches is the host cost per call (no waiting in it for GIN).
            ThreadMXBean cpu = ManagementFactory.getThreadMXBean();
            double[] dp = new double[BATCHES], cp = new double[BATCHES], dc = new double[BATCHES], cc = new double[BATCHES], vp = new double[BATCHES], vc = new double[BATCHES];
            for (int batch = 0; batch < BATCHES; batch++) {
                long[] cpuNs = new long[2];
                List<MoeDispatch> last = pipelinedBatch(moe, xs, ids, ws, tk, outs, streams, e0, e1, e2, cpuNs);
                long c4 = cpu.getCurrentThreadCpuTime();
                for (int it = 0; it < PIPELINED; it++) moe.returnRowValues(last, rowValues, streams);
                long c5 = cpu.getCurrentThreadCpuTime();
                for (int i = 0; i < local; i++) e3.get(i).record(streams.get(i));
                for (int i = 0; i < local; i++) {
                    e3.get(i).synchronize();
                    dp[batch] = Math.max(dp[batch], e1.get(i).elapsedMillisSince(e0.get(i)) * 1e3 / PIPELINED);
                    cp[batch] = Math.max(cp[batch], e2.get(i).elapsedMillisSince(e1.get(i)) * 1e3 / PIPELINED);
                    vp[batch] = Math.max(vp[batch], e3.get(i).elapsedMillisSince(e2.get(i)) * 1e3 / PIPELINED);
                }
                dc[batch] = cpuNs[0] / 1e3 / PIPELINED / local;
                cc[batch] = cpuNs[1] / 1e3 / PIPELINED / local;
                vc[batch] = (c5 - c4) / 1e3 / PIPELINED / local;
            }
            double[] graph = backend == Backend.GIN ? graphReplays(moe, xs, ids, ws, tk, outs, streams, e0, e1) : new double[] {Double.NaN, Double.NaN};
            double[] beside = backend == Backend.GIN && channels > 0 ? besideCompute(g, moe, xs, ids, ws, tk, outs, streams, e0, e1, e2, median(dp) + median(cp))
                    : new double[] {Double.NaN, Double.NaN};
            moe.checkErrors(streams);
            return new Row(shape.name(), tokens, backend, median(dUs), median(cUs), median(dp), median(cp), median(dCpu), median(cCpu),
                    median(dc), median(cc), graph[0], graph[1], median(vUs), median(vp), median(vc), crossingTokens * moe.config().combineRowBytes() / local,
                    crossingTokens * moe.config().dispatchRowBytes() / local,
                    MoeReports.dispatchKernelName(moe) + (backend == Backend.GIN ? " [" + MoeReports.entrySource(moe).name().toLowerCase(Locale.ROOT) + "]" : ""),
                    Arrays.stream(perExpert).max().orElse(0) / ((double) tokens * local * k / shape.experts()), moe.channels(), beside[0], beside[1]);
        } finally {
            streams.forEach(Stream::close);
            e0.forEach(Event::close); e1.forEach(Event::close); e2.forEach(Event::close); e3.forEach(Event::close);
        }
    }

    /**
     * One pipelined batch: an untimed dispatch (every rank finishes it only when all have started, so
     * the processes' different arrival times stay out of the batch), then PIPELINED dispatches between
     * events e0 and e1 and PIPELINED combines of the last one between e1 and e2. cpuNs[0] / cpuNs[1]:
     * this thread's CPU time over the dispatch / combine launches. Returns the last dispatch's handles.
     */
    static List<MoeDispatch> pipelinedBatch(MoeAllToAll moe, List<DeviceBuffer> xs, List<DeviceBuffer> ids, List<DeviceBuffer> ws, int[] tk,
                                            List<DeviceBuffer> outs, List<Stream> streams, List<Event> e0, List<Event> e1, List<Event> e2, long[] cpuNs) {
        ThreadMXBean cpu = ManagementFactory.getThreadMXBean();
        List<MoeDispatch> last = moe.dispatch(xs, ids, ws, tk, streams);
        for (int i = 0; i < streams.size(); i++) e0.get(i).record(streams.get(i));
        long c0 = cpu.getCurrentThreadCpuTime();
        for (int it = 0; it < PIPELINED; it++) last = moe.dispatch(xs, ids, ws, tk, streams);
        long c1 = cpu.getCurrentThreadCpuTime();
        for (int i = 0; i < streams.size(); i++) e1.get(i).record(streams.get(i));
        long c2 = cpu.getCurrentThreadCpuTime();
        for (int it = 0; it < PIPELINED; it++) moe.combine(last, outs, streams);
        long c3 = cpu.getCurrentThreadCpuTime();
        for (int i = 0; i < streams.size(); i++) e2.get(i).record(streams.get(i));
        cpuNs[0] = c1 - c0;
        cpuNs[1] = c3 - c2;
        return last;
    }

    /**
     * The pipelined dispatch and combine again while {@code gin_hold_sms} holds every SM the exchange
     * was not given (SMs - 2C blocks with the most shared memory a block may have, so nothing else
     * with shared memory shares their SMs), as compute kernels on another stream would: times equal
     * to the pipelined ones say the exchange needs no more than its 2C SMs. The holding blocks are
     * all resident before the first dispatch, and a batch counts only if none had ended by the time
     * it was done (else it runs again with a hold twice as long). Returns the dispatch and combine us
     * per call (median of the batches), NaN on every rank when some GPU has no SM left over.
     */
    static double[] besideCompute(CommGroup g, MoeAllToAll moe, List<DeviceBuffer> xs, List<DeviceBuffer> ids, List<DeviceBuffer> ws, int[] tk,
                                  List<DeviceBuffer> outs, List<Stream> streams, List<Event> e0, List<Event> e1, List<Event> e2, double aloneUs) {
        int local = streams.size();
        long fewestFree = Long.MAX_VALUE;
        for (Stream st : streams) fewestFree = Math.min(fewestFree, st.device().multiprocessors() - 2L * moe.channels());
        if (-Bench.slowest(g, -fewestFree) < 1) return new double[] {Double.NaN, Double.NaN};  // decided alike on every rank
        List<CodeObject> codes = new ArrayList<>();
        List<Stream> side = new ArrayList<>();
        try (Arena a = Arena.ofConfined()) {
            List<Kernel> hold = new ArrayList<>();
            List<LaunchConfig> grids = new ArrayList<>();
            List<PinnedBuffer> marks = new ArrayList<>();  // [block]: started, [grid + block]: ended
            List<KernelArgs> args = new ArrayList<>();
            for (int i = 0; i < local; i++) {
                Device d = streams.get(i).device();
                int free = d.multiprocessors() - 2 * moe.channels(), smem = d.maxSharedBytesPerBlock();
                CodeObject code = KernelLibrary.load(d, "basic");
                codes.add(code);
                Kernel k = code.kernel("gin_hold_sms");
                k.setMaxDynamicSharedBytes(smem);
                hold.add(k);
                grids.add(LaunchConfig.of(free, 1024).withSharedBytes(smem));
                PinnedBuffer m = d.allocatePinned(8L * free, a);
                marks.add(m);
                KernelArgs holdArgs = KernelArgs.ofStruct(a, GinHoldSmsArgs.layout());
                GinHoldSmsArgs.marks(holdArgs.struct(), MemorySegment.ofAddress(m.deviceAddress()));
                args.add(holdArgs);
                side.add(d.createStream());
            }
            double holdUs = 3 * aloneUs * PIPELINED + 2000;
            double[] dp = new double[BATCHES], cp = new double[BATCHES];
            for (int batch = 0; batch < BATCHES; ) {
                for (int i = 0; i < local; i++) {
                    marks.get(i).host().fill((byte) 0);
                    GinHoldSmsArgs.ns(args.get(i).struct(), (long) (holdUs * 1e3));
                    hold.get(i).launch(side.get(i), grids.get(i), args.get(i));
                }
                boolean held = true;
                try {
                    for (int i = 0; i < local; i++)
                        if (!awaitMarks(marks.get(i), 0, grids.get(i).gridX()))
                            throw new IllegalStateException("gin_hold_sms: not all " + grids.get(i).gridX() + " holding blocks started within 5 s on " + streams.get(i).device());
                    pipelinedBatch(moe, xs, ids, ws, tk, outs, streams, e0, e1, e2, new long[2]);
                    double d = 0, c = 0;
                    for (int i = 0; i < local; i++) {
                        e2.get(i).synchronize();
                        int grid = grids.get(i).gridX();
                        for (int b = 0; b < grid; b++) held &= (int) INT.getVolatile(marks.get(i).host(), 4L * (grid + b)) == 0;
                        d = Math.max(d, e1.get(i).elapsedMillisSince(e0.get(i)) * 1e3 / PIPELINED);
                        c = Math.max(c, e2.get(i).elapsedMillisSince(e1.get(i)) * 1e3 / PIPELINED);
                    }
                    // every rank must agree whether the batch counts (a rank whose hold ended early retries them all)
                    if (Bench.slowest(g, held ? 0 : 1) == 0) { dp[batch] = d; cp[batch] = c; batch++; }
                    else if ((holdUs *= 2) > 60e6) throw new IllegalStateException("gin_hold_sms: the holding blocks keep ending before the batch does");
                } finally {
                    side.forEach(Stream::synchronize);
                }
            }
            return new double[] {median(dp), median(cp)};
        } finally {
            side.forEach(Stream::close);
            codes.forEach(CodeObject::close);
        }
    }

    private static final VarHandle INT = ValueLayout.JAVA_INT.varHandle();

    /** Waits (at most 5 s) until words [from, from + n) of the marks are all set; false if they were not. */
    private static boolean awaitMarks(PinnedBuffer marks, int from, int n) {
        long deadline = System.nanoTime() + 5_000_000_000L;
        for (int b = from; b < from + n; b++)
            while ((int) INT.getVolatile(marks.host(), 4L * b) == 0)
                if (System.nanoTime() > deadline) return false;
        return true;
    }

    /**
     * A model step captured in a CUDA graph: dispatch + combine captured once per GPU, then replayed
     * back to back. Returns device us and the thread's CPU us per replay (per GPU).
     */
    static double[] graphReplays(MoeAllToAll moe, List<DeviceBuffer> xs, List<DeviceBuffer> ids, List<DeviceBuffer> ws, int[] tk,
                                 List<DeviceBuffer> outs, List<Stream> streams, List<Event> e0, List<Event> e1) {
        int local = streams.size();
        ThreadMXBean cpu = ManagementFactory.getThreadMXBean();
        List<Graph> graphs = new ArrayList<>();
        try {
            // one GPU at a time: CUDA instantiates no graph while another stream of the thread captures
            for (int i = 0; i < local; i++) {
                Stream s = streams.get(i);
                s.beginCapture();
                moe.combine(moe.dispatch(i, xs.get(i), ids.get(i), ws.get(i), tk[i], s), outs.get(i), s);
                graphs.add(s.endCapture());
            }
            double[] us = new double[BATCHES], cpuUs = new double[BATCHES];
            for (int batch = 0; batch < BATCHES; batch++) {
                for (int i = 0; i < local; i++) graphs.get(i).launch(streams.get(i));  // untimed, as above
                for (int i = 0; i < local; i++) e0.get(i).record(streams.get(i));
                long c0 = cpu.getCurrentThreadCpuTime();
                for (int it = 0; it < PIPELINED; it++) for (int i = 0; i < local; i++) graphs.get(i).launch(streams.get(i));
                long c1 = cpu.getCurrentThreadCpuTime();
                for (int i = 0; i < local; i++) e1.get(i).record(streams.get(i));
                for (int i = 0; i < local; i++) {
                    e1.get(i).synchronize();
                    us[batch] = Math.max(us[batch], e1.get(i).elapsedMillisSince(e0.get(i)) * 1e3 / PIPELINED);
                }
                cpuUs[batch] = (c1 - c0) / 1e3 / PIPELINED / local;
            }
            return new double[] {median(us), median(cpuUs)};
        } finally {
            graphs.forEach(Graph::close);
        }
    }

    static final int FLOOR_BATCHES = 50;
    static final long BUSY_BYTES = 256L << 20;

    /**
     * What the driver alone costs this thread, measured like the pipelined calls above: CPU time per
     * launch of the empty kernel 1 x 1 on an idle GPU and queued behind a busy one (a 256 MiB fill by
     * the driver's memset, as the pipelined GIN calls queue behind each other), per cuCtxSetCurrent / hipSetDevice (what
     * a launch would pay if it switched devices every time; it only asks), and per replay of a
     * captured graph holding the empty kernel. The gap between a launch and a GIN call is ours.
     */
    static double[] launchFloor(Device d) {
        ThreadMXBean cpu = ManagementFactory.getThreadMXBean();
        try (Arena a = Arena.ofConfined(); Stream s = d.createStream(); CodeObject code = KernelLibrary.load(d, "basic")) {
            Kernel empty = code.kernel("gin_empty");
            KernelArgs none = KernelArgs.none(a);
            DeviceBuffer busy = d.allocate(BUSY_BYTES, a);
            LaunchConfig one = LaunchConfig.of(1, 1);
            s.beginCapture();
            empty.launch(s, one, none);
            try (Graph graph = s.endCapture()) {
                for (int i = 0; i < 2000; i++) { empty.launch(s, one, none); d.makeCurrent(); graph.launch(s); }  // compiled code only
                s.synchronize();
                double[][] v = new double[4][FLOOR_BATCHES];
                for (int b = 0; b < FLOOR_BATCHES; b++) {
                    long c0 = cpu.getCurrentThreadCpuTime();
                    for (int i = 0; i < PIPELINED; i++) empty.launch(s, one, none);
                    long c1 = cpu.getCurrentThreadCpuTime();
                    s.synchronize();
                    busy.fill32(7, s);
                    long c2 = cpu.getCurrentThreadCpuTime();
                    for (int i = 0; i < PIPELINED; i++) empty.launch(s, one, none);
                    long c3 = cpu.getCurrentThreadCpuTime();
                    for (int i = 0; i < PIPELINED; i++) d.makeCurrent();
                    long c4 = cpu.getCurrentThreadCpuTime();
                    for (int i = 0; i < PIPELINED; i++) graph.launch(s);
                    long c5 = cpu.getCurrentThreadCpuTime();
                    s.synchronize();
                    v[0][b] = (c1 - c0) / 1e3 / PIPELINED; v[1][b] = (c3 - c2) / 1e3 / PIPELINED; v[2][b] = (c4 - c3) / 1e3 / PIPELINED;
                    v[3][b] = (c5 - c4) / 1e3 / PIPELINED;
                }
                return new double[] {median(v[0]), median(v[1]), median(v[2]), median(v[3])};
            }
        }
    }

    private static DeviceBuffer upload(Device d, Arena a, MemorySegment host) {
        DeviceBuffer b = d.allocate(Math.max(16, host.byteSize()), a);
        b.slice(0, host.byteSize()).copyFromHost(host);
        return b;
    }

    /** JSON has no NaN: HOST rows have no graph numbers and write null. */
    private static String jsonNumber(double v) { return Double.isNaN(v) ? "null" : String.format(Locale.ROOT, "%.2f", v); }

    private static double median(double[] v) {
        double[] c = v.clone();
        Arrays.sort(c);
        return c[c.length / 2];
    }
}
