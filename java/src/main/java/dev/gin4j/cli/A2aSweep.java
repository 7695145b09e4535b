package dev.gin4j.cli;

import dev.gin4j.a2a.AllToAll;
import dev.gin4j.comm.Backend;
import dev.gin4j.a2a.Plan;
import dev.gin4j.a2a.Protocol;
import dev.gin4j.comm.CommGroup;
import dev.gin4j.gpu.Device;
import dev.gin4j.gpu.DeviceBuffer;
import dev.gin4j.gpu.Event;
import dev.gin4j.gpu.Stream;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.SplittableRandom;

/**
 * The all-to-all sweep behind {@code gin4j bench a2a} and the JMH report: for each size, GIN and
 * HOST in the same process on the same buffers, timed with device events (start event recorded on
 * every rank's stream before the launches, end event after; time = the slowest rank), median of
 * {@code iters} after {@code warmup}. Size = bytes each rank sends in total (nccl-tests' "size");
 * algBw = size / time; busBw = algBw * (n-1)/n. Each size is checked once: the GIN result must
 * equal the HOST result byte for byte, on fresh random input.
 */
public final class A2aSweep {
    /** Batches of back-to-back calls in the pipelined measurement; the median is reported. */
    static final int PIPELINED_BATCHES = 5;

    /** One measured row. */
    public record Row(long sizeBytes, Backend backend, String plan, double medianUs, double minUs, double algBwGBs, double busBwGBs, double cpuUsPerRank, double pipelinedUs) {}

    private A2aSweep() {}

    public static List<Row> run(CommGroup g, long[] sizes, List<Backend> backends, Protocol protocol, int warmup, int iters, java.io.PrintStream log) {
        int n = g.worldSize(), local = g.localCount();
        long maxSize = Arrays.stream(sizes).max().orElse(0);
        long maxPerPeer = Math.max(1, maxSize / n);
        List<Row> rows = new ArrayList<>();
        List<Stream> streams = new ArrayList<>();
        List<Event> starts = new ArrayList<>(), ends = new ArrayList<>();
        SplittableRandom random = new SplittableRandom();
        try (Arena arena = Arena.ofShared();
             AllToAll gin = backends.contains(Backend.GIN) ? AllToAll.create(g, maxPerPeer, Backend.GIN).protocol(protocol) : null;
             AllToAll host = backends.contains(Backend.HOST) ? AllToAll.create(g, maxPerPeer, Backend.HOST) : null) {
            List<DeviceBuffer> inputs = new ArrayList<>();
            for (int i = 0; i < local; i++) {
                Device d = g.rank(i).device();
                streams.add(d.createStream());
                starts.add(d.createEvent());
                ends.add(d.createEvent());
                inputs.add(d.allocate(maxPerPeer * n, arena));
            }
            // let the JIT compile the call path before anything is timed (a cold Java launch costs tens of us)
            long small = Math.min(maxPerPeer, 4096);
            for (Backend b : backends) {
                AllToAll a = b == Backend.GIN ? gin : host;
                for (int it = 0; it < 3000; it++) {
                    a.run(inputs, small, streams);
                    if (it % 100 == 99) streams.forEach(Stream::synchronize);
                }
                a.checkErrors(streams);
            }
            for (long size : sizes) {
                long perPeer = size / n;
                // fresh random input: generated on the host once per size, 64 MiB at most, repeated
                for (int i = 0; i < local; i++) fillRandom(inputs.get(i).slice(0, perPeer * n), random, arena);
                if (gin != null && host != null && perPeer > 0) {
                    gin.run(inputs, perPeer, streams);
                    gin.checkErrors(streams);
                    host.run(inputs, perPeer, streams);
                    host.checkErrors(streams);
                    for (int i = 0; i < local; i++) {
                        if (!Arrays.equals(gin.result(i).toByteArray(), host.result(i).toByteArray()))
                            throw new IllegalStateException("GIN and HOST all-to-all results differ at " + size + " bytes on local rank " + i);
                    }
                }
                for (Backend b : backends) {
                    AllToAll a = b == Backend.GIN ? gin : host;
                    double[] us = new double[iters], cpu = new double[iters];
                    for (int it = -warmup; it < iters; it++) {
                        for (int i = 0; i < local; i++) starts.get(i).record(streams.get(i));
                        long c0 = System.nanoTime();
                        a.run(inputs, perPeer, streams);
                        if (it >= 0) cpu[it] = (System.nanoTime() - c0) / 1e3 / local;
                        for (int i = 0; i < local; i++) ends.get(i).record(streams.get(i));
                        double worst = 0;
                        for (int i = 0; i < local; i++) {
                            ends.get(i).synchronize();
                            worst = Math.max(worst, ends.get(i).elapsedMillisSince(starts.get(i)) * 1000.0);
                        }
                        if (it >= 0) us[it] = worst;
                    }
                    // pipelined, as nccl-tests times: iters calls back to back between two events, per call;
                    // the start event follows one untimed call, which every rank finishes only when all
                    // have started (the ranks' processes reach this point at different times); median of batches
                    double[] pipes = new double[PIPELINED_BATCHES];
                    for (int batch = 0; batch < PIPELINED_BATCHES; batch++) {
                        a.run(inputs, perPeer, streams);
                        for (int i = 0; i < local; i++) starts.get(i).record(streams.get(i));
                        for (int it = 0; it < iters; it++) a.run(inputs, perPeer, streams);
                        for (int i = 0; i < local; i++) {
                            ends.get(i).record(streams.get(i));
                            ends.get(i).synchronize();
                            pipes[batch] = Math.max(pipes[batch], ends.get(i).elapsedMillisSince(starts.get(i)) * 1000.0 / iters);
                        }
                    }
                    Arrays.sort(pipes);
                    double pipe = pipes[PIPELINED_BATCHES / 2];
                    a.checkErrors(streams);
                    Arrays.sort(us);
                    double med = us[iters / 2];
                    double alg = size / (med * 1e-6) / 1e9;
                    String plan = b == Backend.GIN ? describe(a.plan(perPeer)) : "ncclAlltoAll";
                    Arrays.sort(cpu);
                    Row r = new Row(size, b, plan, med, us[0], alg, alg * (n - 1) / n, cpu[iters / 2], pipe);
                    rows.add(r);
                    if (log != null) log.printf("%12d  %-4s  %-18s %10.2f us  algBw %8.2f GB/s  busBw %8.2f GB/s  (pipelined %.2f us; Java CPU %.2f us per rank)%n", size, b, plan, med, alg, r.busBwGBs(), pipe, r.cpuUsPerRank());
                }
            }
        } finally {
            streams.forEach(Stream::close);
            starts.forEach(Event::close);
            ends.forEach(Event::close);
        }
        return rows;
    }

    static String describe(Plan p) {
        return p.protocol() == dev.gin4j.a2a.Protocol.COPY_ENGINE ? "COPY_ENGINE +self " + p.chunksPerPeer() + "x" + p.threads()
                : p.protocol() + " " + p.chunksPerPeer() + "x" + p.threads();
    }

    static void fillRandom(DeviceBuffer b, SplittableRandom random, Arena arena) {
        long chunk = Math.min(b.byteSize(), 64L << 20);
        if (chunk == 0) return;
        MemorySegment host = arena.allocate(chunk, 16);
        for (long off = 0; off < chunk; off += 8) {
            if (off + 8 <= chunk) host.set(java.lang.foreign.ValueLayout.JAVA_LONG_UNALIGNED, off, random.nextLong());
            else for (long k = off; k < chunk; k++) host.set(java.lang.foreign.ValueLayout.JAVA_BYTE, k, (byte) random.nextInt());
        }
        for (long off = 0; off < b.byteSize(); off += chunk) {
            long len = Math.min(chunk, b.byteSize() - off);
            b.slice(off, len).copyFromHost(host.asSlice(0, len));
        }
    }
}
