package dev.gin4j.comm;

import dev.gin4j.gpu.CodeObject;
import dev.gin4j.gpu.Device;
import dev.gin4j.gpu.DeviceBuffer;
import dev.gin4j.gpu.KernelArgs;
import dev.gin4j.gpu.LaunchConfig;
import dev.gin4j.gpu.Stream;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Random;

/**
 * One rank of the one-process-per-GPU tests, started by {@link TwoProcessGpuTest} with RANK,
 * WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT and GIN4J_TEST_SEED set. Exits 0 and prints
 * "RANK r OK" when its checks pass.
 */
public final class RankMain {
    public static void main(String[] args) throws Exception {
        String scenario = args.length > 0 ? args[0] : "exchange";
        long seed = Long.parseLong(System.getenv().getOrDefault("GIN4J_TEST_SEED", "1"));
        int rank = Integer.parseInt(System.getenv("RANK"));
        try (CommGroup g = CommGroup.fromEnvironment(); Arena arena = Arena.ofShared()) {
            switch (scenario) {
                case "exchange" -> exchange(g, rank, seed, arena);
                case "mismatch" -> mismatch(g, rank);
                case "alltoall" -> allToAll(g, rank, seed, arena);
                case "oneRankFails" -> oneRankFails(g, rank, seed, arena);
                default -> throw new IllegalArgumentException("unknown scenario " + scenario);
            }
        }
        System.out.println("RANK " + rank + " OK");
        System.exit(0);
    }

    /** Every rank derives every rank's data from the shared seed, so it can check what arrived. */
    private static byte[] dataOf(long seed, int rank, int bytes) {
        byte[] b = new byte[bytes];
        new Random(seed * 1_000_003 + rank).nextBytes(b);
        return b;
    }

    private static void exchange(CommGroup g, int rank, long seed, Arena arena) {
        Device d = g.rank(0).device();
        int world = g.worldSize();
        WindowLayout layout = WindowLayout.builder().region("payload", 1 << 20, 4096).build();
        try (SymmetricWindow w = SymmetricWindow.allocate(g, layout); Stream s = d.createStream()) {
            PeerTable peers = PeerTable.resolve(w, arena);
            if (!peers.allReachable()) throw new AssertionError("not every peer is load/store reachable: " + Arrays.toString(peers.bases(0)));
            w.region(0, "payload").fill((byte) 0xee, s);
            s.synchronize();
            g.allGatherLongs(new long[] {rank}); // everyone poisoned before anyone writes
            int n = (1 << 20) / 4;
            byte[] mine = dataOf(seed, rank, 4 * n);
            int peer = (rank + 1) % world;
            try (CodeObject basic = d.loadKernels("basic")) {
                DeviceBuffer src = d.allocate(mine.length, arena);
                src.copyFromHost(MemorySegment.ofArray(mine));
                KernelArgs a = KernelArgs.of(arena, KernelArgs.Type.POINTER, KernelArgs.Type.POINTER, KernelArgs.Type.I64);
                a.setPointer(0, src).setPointer(1, peers.bases(0)[peer] + layout.region("payload").offset()).setLong(2, n);
                basic.kernel("gin_add_peer_u32").launch(s, LaunchConfig.of(64, 256), a);
                s.synchronize();
            }
            g.allGatherLongs(new long[] {rank}); // everyone has written
            int from = (rank - 1 + world) % world;
            var exp = MemorySegment.ofArray(dataOf(seed, from, 4 * n));
            var got = MemorySegment.ofArray(w.region(0, "payload").toByteArray());
            for (int k = 0; k < n; k++) {
                int e = exp.getAtIndex(java.lang.foreign.ValueLayout.JAVA_INT_UNALIGNED, k) + 1;
                int v = got.getAtIndex(java.lang.foreign.ValueLayout.JAVA_INT_UNALIGNED, k);
                if (e != v) throw new AssertionError("rank " + rank + " word " + k + ": expected " + e + " got " + v);
            }
            // host baseline all-to-all across processes
            long perPeer = 10_007;
            byte[] sendBytes = dataOf(seed + 7, rank, (int) (perPeer * world));
            DeviceBuffer send = d.allocate(perPeer * world, arena), recv = d.allocate(perPeer * world, arena);
            send.copyFromHost(MemorySegment.ofArray(sendBytes));
            recv.fill((byte) 0x11, s);
            g.allToAll(List.of(send), List.of(recv), perPeer, List.of(s));
            s.synchronize();
            byte[] r = recv.toByteArray();
            for (int src = 0; src < world; src++) {
                byte[] theirs = dataOf(seed + 7, src, (int) (perPeer * world));
                if (!Arrays.equals(Arrays.copyOfRange(theirs, (int) (rank * perPeer), (int) ((rank + 1) * perPeer)),
                        Arrays.copyOfRange(r, (int) (src * perPeer), (int) ((src + 1) * perPeer)))) {
                    throw new AssertionError("host all-to-all: rank " + rank + " got wrong bytes from " + src);
                }
            }
        }
    }

    /** GIN (by size, and through the copy engines) and HOST uniform all-to-all across processes, several sizes, checked against every rank's data. */
    private static void allToAll(CommGroup g, int rank, long seed, Arena arena) {
        Device d = g.rank(0).device();
        int world = g.worldSize();
        try (Stream s = d.createStream();
             dev.gin4j.a2a.AllToAll gin = dev.gin4j.a2a.AllToAll.create(g, 1 << 22, dev.gin4j.a2a.Backend.GIN);
             dev.gin4j.a2a.AllToAll host = dev.gin4j.a2a.AllToAll.create(g, 1 << 22, dev.gin4j.a2a.Backend.HOST)) {
            int call = 0;
            for (long perPeer : new long[] {1, 4095, 65536, 1 << 22}) {
                // GIN by size, GIN through the copy engines (peer windows mapped by NCCL in this process), HOST
                for (int variant = 0; variant < 3; variant++) {
                    dev.gin4j.a2a.AllToAll a = variant == 2 ? host : gin.protocol(variant == 0 ? dev.gin4j.a2a.Protocol.AUTO : dev.gin4j.a2a.Protocol.COPY_ENGINE);
                    long tag = seed + 1000 * (++call);
                    byte[] mine = dataOf(tag, rank, (int) (perPeer * world));
                    DeviceBuffer in = d.allocate(mine.length, arena);
                    in.copyFromHost(MemorySegment.ofArray(mine));
                    a.output(0).slice(0, perPeer * world).fill((byte) 0x6b, s);
                    a.run(0, in, perPeer, s);
                    a.checkErrors(List.of(s));
                    byte[] got = a.result(0).toByteArray();
                    for (int src = 0; src < world; src++) {
                        byte[] theirs = dataOf(tag, src, (int) (perPeer * world));
                        if (!Arrays.equals(theirs, (int) (rank * perPeer), (int) ((rank + 1) * perPeer), got, (int) (src * perPeer), (int) ((src + 1) * perPeer))) {
                            throw new AssertionError(a.backend() + (variant == 1 ? " (copy engines)" : "") + " all-to-all of " + perPeer + " bytes per peer: rank " + rank + " got wrong bytes from " + src);
                        }
                    }
                }
            }
        }
    }

    /**
     * A collective step that fails on rank 1 only: every rank throws at once (none waits in the next
     * collective), rank 1 its own error and the others one naming rank 1, and the group still works.
     */
    private static void oneRankFails(CommGroup g, int rank, long seed, Arena arena) {
        IllegalStateException mine = new IllegalStateException("rank 1's own failure");
        try {
            g.failTogether("a step that fails on rank 1", rank == 1 ? mine : null);
            throw new AssertionError("rank 1 failed, yet failTogether returned on rank " + rank);
        } catch (IllegalStateException e) {
            if (e != mine) throw new AssertionError("rank " + rank + " got another failure than its own: " + e, e);
        } catch (CommException e) {
            if (rank == 1 || !e.getMessage().contains("a step that fails on rank 1 failed on rank(s) [1]"))
                throw new AssertionError("rank " + rank + ": unclear message: " + e.getMessage(), e);
        }
        // a window whose memory rank 1 cannot get: rank 1 fills its GPU first (1 GiB at a time), then
        // gives 2 GiB back, room for the small collectives below but not for the window's 4 GiB
        Device d = g.rank(0).device();
        long windowBytes = 4L << 30;
        try (Arena hog = Arena.ofShared()) {
            List<DeviceBuffer> held = new ArrayList<>();
            if (rank == 1) {
                try (Arena spare = Arena.ofShared()) {
                    d.allocate(1L << 30, spare);
                    d.allocate(1L << 30, spare);
                    try {
                        while (true) held.add(d.allocate(1L << 30, hog));
                    } catch (RuntimeException full) {
                        System.out.println("rank 1 holds " + held.size() + " GiB and frees 2: " + full.getMessage());
                    }
                }
            }
            g.allGatherLongs(new long[] {held.size()});  // rank 1 is full before any rank allocates the window
            try {
                SymmetricWindow.allocate(g, WindowLayout.builder().region("payload", windowBytes, 4096).build()).close();
                throw new AssertionError("rank 1 had no room for " + windowBytes + " bytes, yet the window was made on rank " + rank);
            } catch (CommException e) {
                String expected = rank == 1 ? "ncclMemAlloc(" + windowBytes + " bytes)" : "failed on rank(s) [1]";
                if (!e.getMessage().contains(expected)) throw new AssertionError("rank " + rank + ": expected '" + expected + "' in: " + e.getMessage(), e);
                System.out.println("rank " + rank + " window refused together: " + e.getMessage());
            }
        }
        // the group still works: a HOST all-to-all, checked against every rank's data
        int world = g.worldSize();
        long perPeer = 4099;
        byte[] sendBytes = dataOf(seed + 11, rank, (int) (perPeer * world));
        try (Stream s = d.createStream()) {
            DeviceBuffer send = d.allocate(perPeer * world, arena), recv = d.allocate(perPeer * world, arena);
            send.copyFromHost(MemorySegment.ofArray(sendBytes));
            recv.fill((byte) 0x3c, s);
            g.allToAll(List.of(send), List.of(recv), perPeer, List.of(s));
            g.await(s, "the all-to-all after the failed steps");
            byte[] r = recv.toByteArray();
            for (int src = 0; src < world; src++) {
                byte[] theirs = dataOf(seed + 11, src, (int) (perPeer * world));
                if (!Arrays.equals(theirs, (int) (rank * perPeer), (int) ((rank + 1) * perPeer), r, (int) (src * perPeer), (int) ((src + 1) * perPeer)))
                    throw new AssertionError("all-to-all after the failed steps: rank " + rank + " got wrong bytes from " + src);
            }
        }
    }

    private static void mismatch(CommGroup g, int rank) {
        WindowLayout layout = WindowLayout.builder().region("payload", 4096L * (rank + 1), 4096).build();
        try {
            SymmetricWindow.allocate(g, layout).close();
            throw new AssertionError("window sizes differ across ranks but allocation succeeded");
        } catch (CommException e) {
            if (!e.getMessage().contains("mismatch") || !e.getMessage().contains("rank")) throw new AssertionError("unclear message: " + e.getMessage());
            System.out.println("rank " + rank + " refused as expected: " + e.getMessage());
        }
        // MoE: a rank given another configuration is named on every rank, before anything waits on it
        for (dev.gin4j.a2a.Backend b : dev.gin4j.a2a.Backend.values()) {
            try {
                dev.gin4j.moe.MoeAllToAll.create(g, dev.gin4j.moe.MoeConfig.bf16(256, 8, 2, 64 * (rank + 1), b)).close();
                throw new AssertionError(b + ": MoE configurations differ across ranks but create succeeded");
            } catch (IllegalArgumentException e) {
                if (!e.getMessage().contains("same MoeConfig") || !e.getMessage().contains("rank 1 has (hidden 256, maxTokens 128"))
                    throw new AssertionError(b + ": unclear message: " + e.getMessage());
                System.out.println("rank " + rank + " MoE " + b + " refused as expected: " + e.getMessage());
            }
        }
    }
}
