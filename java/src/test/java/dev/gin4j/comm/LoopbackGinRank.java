package dev.gin4j.comm;

import dev.gin4j.a2a.AllToAll;
import dev.gin4j.a2a.Plan;
import dev.gin4j.gpu.Device;
import dev.gin4j.gpu.DeviceBuffer;
import dev.gin4j.gpu.Graph;
import dev.gin4j.gpu.Stream;

import java.lang.foreign.Arena;
import java.lang.foreign.FunctionDescriptor;
import java.lang.foreign.Linker;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.SymbolLookup;
import java.lang.foreign.ValueLayout;
import java.lang.invoke.MethodHandle;
import java.nio.file.Path;
import java.util.Arrays;
import java.util.List;

/**
 * RankMain's GIN scenarios on ranks that pose as separate hosts on one GPU, linked by the loopback
 * GIN transport (NCCL_GIN_PLUGIN names it; see {@link LoopbackGinGpuTest}): every byte between
 * ranks goes through ncclGin puts and signals, and the transport's counters show what went out.
 */
final class LoopbackGinRank {
    private LoopbackGinRank() {}

    /** The transport's counters of this process ({@code gin4j_loopback_stats} in the plugin NCCL loaded). */
    static final class Counters {
        private final MethodHandle stats;

        Counters() {
            String plugin = System.getenv("NCCL_GIN_PLUGIN");
            if (plugin == null) throw new AssertionError("NCCL_GIN_PLUGIN is not set: these scenarios need the loopback GIN transport");
            // the same file NCCL dlopen-ed: the same library, the same counters
            SymbolLookup lib = SymbolLookup.libraryLookup(Path.of(plugin), Arena.global());
            stats = Linker.nativeLinker().downcallHandle(lib.find("gin4j_loopback_stats").orElseThrow(),
                    FunctionDescriptor.of(ValueLayout.JAVA_INT, ValueLayout.JAVA_INT, ValueLayout.ADDRESS));
        }

        /** {puts, signals, bytes} sent to {@code peer} so far, then received from it. */
        long[] of(int peer) {
            try (Arena a = Arena.ofConfined()) {
                MemorySegment out = a.allocate(ValueLayout.JAVA_LONG, 6);
                int rc = (int) stats.invokeExact(peer, out);
                if (rc != 0) throw new AssertionError("gin4j_loopback_stats(" + peer + ") returned " + rc);
                return out.toArray(ValueLayout.JAVA_LONG);
            } catch (RuntimeException | Error e) {
                throw e;
            } catch (Throwable t) {
                throw new AssertionError(t);
            }
        }

        long[][] all(int world) {
            long[][] c = new long[world][];
            for (int p = 0; p < world; p++) c[p] = of(p);
            return c;
        }
    }

    static final long MAX_PER_PEER = 64L << 20;

    /**
     * The uniform all-to-all through GIN, sizes from 0 bytes to 64 MiB per peer, each checked byte
     * for byte against every rank's data and against HOST, with the puts, signals and bytes the
     * transport counted per peer; then 1,000 calls back to back and a graph replayed 1,000 times.
     */
    static void allToAll(CommGroup g, int rank, long seed, Arena arena) {
        Device d = g.rank(0).device();
        int world = g.worldSize();
        Counters counters = new Counters();
        try (Stream s = d.createStream();
             AllToAll gin = AllToAll.create(g, MAX_PER_PEER, Backend.GIN);
             AllToAll host = AllToAll.create(g, MAX_PER_PEER, Backend.HOST)) {
            int call = 0;
            for (long perPeer : new long[] {0, 1, 4095, 65536, 1 << 20, MAX_PER_PEER}) {
                long tag = seed + 1000L * (++call);
                byte[] mine = RankMain.dataOf(tag, rank, (int) (perPeer * world));
                DeviceBuffer in = d.allocate(Math.max(1, mine.length), arena);
                if (mine.length > 0) in.copyFromHost(MemorySegment.ofArray(mine));
                long[][] before = counters.all(world);
                byte[] viaGin = run(gin, in, perPeer, s, world);
                long[][] after = counters.all(world);
                check(viaGin, tag, rank, perPeer, world, "GIN all-to-all of " + perPeer + " bytes per peer");
                Plan plan = gin.plan(perPeer);
                for (int p = 0; p < world; p++) {
                    long puts = after[p][0] - before[p][0], signals = after[p][1] - before[p][1], bytes = after[p][2] - before[p][2];
                    long wantBytes = p == rank ? 0 : perPeer;  // the own slot is a local copy
                    if (bytes != wantBytes) throw new AssertionError("rank " + rank + " put " + bytes + " bytes to rank " + p + " for " + perPeer + " bytes per peer; the data needs " + wantBytes);
                    // one put per non-empty chunk, signalled; one ready signal per chunk: never a put per small piece
                    long maxPuts = wantBytes == 0 ? 0 : plan.chunksPerPeer();
                    if (puts > maxPuts || (wantBytes > 0 && puts < 1) || signals != 2 * puts)
                        throw new AssertionError("rank " + rank + " -> " + p + ": " + puts + " puts and " + signals + " signals for " + perPeer
                                + " bytes; expected 1 to " + maxPuts + " puts and two signals per put");
                    System.out.printf("rank %d -> %d, %d bytes per peer: %d puts, %d signals, %d bytes on the network (the data needs %d)%n",
                            rank, p, perPeer, puts, signals, bytes, wantBytes);
                }
                byte[] viaHost = run(host, in, perPeer, s, world);
                if (!Arrays.equals(viaGin, viaHost)) throw new AssertionError("GIN and HOST differ for " + perPeer + " bytes per peer on rank " + rank);
            }
            backToBack(g, gin, rank, seed, arena, s, counters);
            graphReplays(g, gin, rank, seed, arena, s, counters);
        }
        // all-to-all-v (counts on the device): zero counts, one peer taking all, tiny, full (up to
        // 32 MiB per peer) and random counts, against the sending ranks' data and against HOST
        RankMain.allToAllV(g, rank, seed, arena, 32L << 20, true, counters);
    }

    /**
     * What one all-to-all-v call put on the network: to each other rank its count (8 bytes of
     * metadata, one put) and its bytes, at most one put per chunk, two signals per chunk (ready,
     * and data, alone where the chunk is empty).
     */
    static void expectAllToAllV(Counters counters, long[][] before, int rank, long[] sent, int chunks, int round) {
        for (int p = 0; p < before.length; p++) {
            long[] now = counters.of(p);
            long puts = now[0] - before[p][0], signals = now[1] - before[p][1], bytes = now[2] - before[p][2];
            long want = p == rank ? 0 : sent[p] + 8;
            boolean ok = p == rank ? puts == 0 && signals == 0 && bytes == 0 : bytes == want && puts >= 1 && puts <= 1 + chunks && signals == 2L * chunks;
            if (!ok) throw new AssertionError("all-to-all-v case " + round + ": rank " + rank + " -> " + p + ": " + puts + " puts, " + signals
                    + " signals, " + bytes + " bytes; expected " + want + " bytes (" + sent[p] + " of data and the 8-byte count), 1 to "
                    + (1 + chunks) + " puts and " + 2 * chunks + " signals");
            if (p != rank) System.out.printf("rank %d -> %d, all-to-all-v case %d: %d puts, %d signals, %d bytes on the network (the data needs %d + 8)%n",
                    rank, p, round, puts, signals, bytes, sent[p]);
        }
    }

    private static byte[] run(AllToAll a, DeviceBuffer in, long perPeer, Stream s, int world) {
        if (perPeer > 0) a.output(0).slice(0, perPeer * world).fill((byte) 0x6b, s);
        a.run(0, in, perPeer, s);
        a.checkErrors(List.of(s));
        return a.result(0).toByteArray();
    }

    private static void check(byte[] got, long tag, int rank, long perPeer, int world, String what) {
        for (int src = 0; src < world; src++) {
            byte[] theirs = RankMain.dataOf(tag, src, (int) (perPeer * world));
            if (!Arrays.equals(theirs, (int) (rank * perPeer), (int) ((rank + 1) * perPeer), got, (int) (src * perPeer), (int) ((src + 1) * perPeer)))
                throw new AssertionError(what + ": rank " + rank + " got wrong bytes from rank " + src);
        }
    }

    private static void expectSent(Counters counters, long[][] before, int rank, int world, long calls, long perPeer, String what) {
        for (int p = 0; p < world; p++) {
            long bytes = counters.of(p)[2] - before[p][2], want = p == rank ? 0 : calls * perPeer;
            if (bytes != want) throw new AssertionError(what + ": rank " + rank + " put " + bytes + " bytes to rank " + p + ", expected " + want);
        }
    }

    /** 1,000 calls queued without a wait between them, inputs alternating; the last one's result checked. */
    private static void backToBack(CommGroup g, AllToAll gin, int rank, long seed, Arena arena, Stream s, Counters counters) {
        int world = g.worldSize();
        long perPeer = 4096;
        DeviceBuffer[] in = new DeviceBuffer[2];
        for (int k = 0; k < 2; k++) {
            in[k] = g.rank(0).device().allocate(perPeer * world, arena);
            in[k].copyFromHost(MemorySegment.ofArray(RankMain.dataOf(seed + 50 + k, rank, (int) (perPeer * world))));
        }
        long[][] before = counters.all(world);
        gin.output(0).slice(0, perPeer * world).fill((byte) 0x6b, s);
        long start = System.nanoTime();
        for (int i = 0; i < 1000; i++) gin.run(0, in[i % 2], perPeer, s);
        gin.checkErrors(List.of(s));
        System.out.printf("rank %d: 1000 back-to-back GIN all-to-alls of %d bytes per peer: %.1f us per call%n", rank, perPeer, (System.nanoTime() - start) / 1e3 / 1000);
        check(gin.result(0).toByteArray(), seed + 51, rank, perPeer, world, "the last of 1000 back-to-back GIN all-to-alls");
        expectSent(counters, before, rank, world, 1000, perPeer, "1000 back-to-back calls");
    }

    /** One GIN call captured into a graph and replayed 1,000 times: correct after the replays, every replay on the network. */
    private static void graphReplays(CommGroup g, AllToAll gin, int rank, long seed, Arena arena, Stream s, Counters counters) {
        int world = g.worldSize();
        long perPeer = 65536;
        DeviceBuffer in = g.rank(0).device().allocate(perPeer * world, arena);
        in.copyFromHost(MemorySegment.ofArray(RankMain.dataOf(seed + 60, rank, (int) (perPeer * world))));
        gin.output(0).slice(0, perPeer * world).fill((byte) 0x6b, s);
        s.synchronize();
        long[][] before = counters.all(world);
        s.beginCapture();
        gin.run(0, in, perPeer, s);
        try (Graph graph = s.endCapture()) {
            long start = System.nanoTime();
            for (int i = 0; i < 1000; i++) graph.launch(s);
            gin.checkErrors(List.of(s));
            System.out.printf("rank %d: a captured GIN all-to-all of %d bytes per peer replayed 1000 times: %.1f us per replay%n", rank, perPeer, (System.nanoTime() - start) / 1e3 / 1000);
        }
        check(gin.result(0).toByteArray(), seed + 60, rank, perPeer, world, "a GIN all-to-all graph after 1000 replays");
        expectSent(counters, before, rank, world, 1000, perPeer, "1000 graph replays");
    }

    /**
     * Rank 0 halts after a GIN all-to-all with the others; their next GIN all-to-all must fail
     * within the time-out (the kernel's wait for rank 0 ends at the group's abort), naming the peer (the transport
     * reports the vanished process to NCCL, whose last error the message carries), and leave the
     * group aborted; nothing may hang.
     */
    static void peerDies(CommGroup g, int rank, long seed, Arena arena) throws InterruptedException {
        Device d = g.rank(0).device();
        int world = g.worldSize();
        long perPeer = 8192;
        try (Stream s = d.createStream(); AllToAll gin = AllToAll.create(g, perPeer, Backend.GIN)) {
            DeviceBuffer in = d.allocate(perPeer * world, arena);
            in.copyFromHost(MemorySegment.ofArray(RankMain.dataOf(seed + 70, rank, (int) (perPeer * world))));
            check(run(gin, in, perPeer, s, world), seed + 70, rank, perPeer, world, "the GIN all-to-all before rank 0 dies");
            RankMain.rankZeroHalts(g, rank);
            long start = System.nanoTime();
            try {
                run(gin, in, perPeer, s, world);
                throw new AssertionError("a GIN all-to-all with a dead rank returned");
            } catch (RuntimeException e) {  // the kernel's time-out or NCCL's report, whichever comes first
                double took = (System.nanoTime() - start) / 1e9;
                System.out.printf("rank %d: the GIN all-to-all with a dead peer failed after %.1f s: %s%n", rank, took, e.getMessage());
                // the transport reports the gone process to NCCL, the group raises the abort word and aborts,
                // and the kernel's wait for the dead peer ends at that word, not at its own 10 s time-out
                double limit = g.hostWaitTimeout().toNanos() / 1e9;
                if (took > limit) throw new AssertionError("it failed only after " + took + " s, beyond the " + limit + " s time-out", e);
                if (took >= 5) throw new AssertionError("it failed only after " + took + " s: the kernel's wait did not end at the group's abort, before its 10 s time-out", e);
                if (!g.isClosed()) throw new AssertionError("the group is still open after a peer died", e);
            }
        }
    }
}
