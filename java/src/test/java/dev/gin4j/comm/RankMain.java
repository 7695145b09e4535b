package dev.gin4j.comm;

import dev.gin4j.internal.comm.PeerTable;
import dev.gin4j.internal.comm.SymmetricWindow;
import dev.gin4j.internal.comm.WindowLayout;
import dev.gin4j.internal.gpu.KernelLibrary;
import dev.gin4j.a2a.AllToAll;
import dev.gin4j.a2a.AllToAllV;
import dev.gin4j.a2a.Protocol;
import dev.gin4j.gpu.CodeObject;
import dev.gin4j.gpu.Device;
import dev.gin4j.gpu.DeviceBuffer;
import dev.gin4j.gpu.KernelArgs;
import dev.gin4j.gpu.LaunchConfig;
import dev.gin4j.gpu.Stream;
import dev.gin4j.moe.MoeAllToAll;
import dev.gin4j.moe.MoeConfig;
import dev.gin4j.moe.MoeDispatch;
import dev.gin4j.moe.MoeReference;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.SplittableRandom;

/**
 * One rank of the one-process-per-GPU tests, started by {@link TwoProcessGpuTest} with RANK,
 * WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, GIN4J_TEST_SEED and GIN4J_TEST_PLACEMENT set.
 * Exits 0 and prints "RANK r OK" when its checks pass.
 */
public final class RankMain {
    /**
     * Every rank on the one GPU, each posing as its own host (TwoProcessGpuTest.Placement): NCCL
     * links them by sockets and has no device communicator for them, so the GPU-initiated paths
     * must be refused, clearly, on every rank, and the host-initiated ones must work.
     */
    static final boolean ONE_GPU_AS_HOSTS = "one-gpu-as-hosts".equals(System.getenv("GIN4J_TEST_PLACEMENT"));
    /** Every rank on the one GPU, separate hosts for NCCL but one for gin4j (GIN4J_HOSTID): LSA over CUDA / HIP IPC. */
    static final boolean ONE_GPU_ONE_HOST = "one-gpu-one-host".equals(System.getenv("GIN4J_TEST_PLACEMENT"));

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
                case "moe" -> moe(g, rank, seed, arena);
                case "moeGroupedGemm" -> moeGroupedGemm(g, rank, seed, arena);
                case "peerDies" -> peerDies(g, rank, seed, arena, true);
                case "peerDiesBeforeConnecting" -> peerDies(g, rank, seed, arena, false);
                case "peerDiesThenClose" -> peerDiesThenClose(g, rank, seed, arena);
                case "ginAllToAll" -> LoopbackGinRank.allToAll(g, rank, seed, arena);
                case "ginPeerDies" -> LoopbackGinRank.peerDies(g, rank, seed, arena);
                case "ginMoe" -> LoopbackGinMoeRank.run(g, rank, seed, arena);
                case "ginMoePeerDies" -> LoopbackGinMoeRank.peerDies(g, rank, seed, arena);
                default -> throw new IllegalArgumentException("unknown scenario " + scenario);
            }
        }
        System.out.println("RANK " + rank + " OK");
        System.exit(0);
    }

    /**
     * On ranks posing as hosts: {@code what} must be refused on this rank, at create, with the reason
     * (no device communicator, or an NCCL too old for GIN across nodes) and the way out (Backend.HOST).
     */
    private static void expectNoDeviceComm(String what, Runnable attempt) {
        try {
            attempt.run();
        } catch (CommException e) {
            String m = e.getMessage();
            boolean reason = m.contains("NCCL made no device communicator") || m.contains("needs NCCL >= 2.29.7") || m.contains("load/store reachable")
                    || m.contains("device-API version mismatch");
            if (!reason || !m.contains("Backend.HOST"))
                throw new AssertionError(what + ": unclear refusal: " + m, e);
            System.out.println(what + " refused as expected: " + m);
            return;
        }
        throw new AssertionError(what + " was set up although NCCL links these ranks only by sockets");
    }

    /** A HOST all-to-all of {@code perPeer} bytes per peer, poisoned first and checked against every rank's data. */
    private static void hostAllToAll(CommGroup g, int rank, long tag, long perPeer, Arena arena, String what) {
        Device d = g.rank(0).device();
        int world = g.worldSize();
        try (Stream s = d.createStream()) {
            DeviceBuffer send = d.allocate(perPeer * world, arena), recv = d.allocate(perPeer * world, arena);
            send.copyFromHost(MemorySegment.ofArray(dataOf(tag, rank, (int) (perPeer * world))));
            recv.fill((byte) 0x3c, s);
            g.allToAll(send, recv, perPeer, s);  // one process per GPU: the one-buffer form
            g.await(s, what);
            byte[] r = recv.toByteArray();
            for (int src = 0; src < world; src++) {
                byte[] theirs = dataOf(tag, src, (int) (perPeer * world));
                if (!Arrays.equals(theirs, (int) (rank * perPeer), (int) ((rank + 1) * perPeer), r, (int) (src * perPeer), (int) ((src + 1) * perPeer)))
                    throw new AssertionError(what + ": rank " + rank + " got wrong bytes from " + src);
            }
        }
    }

    /** Every rank derives every rank's data from the shared seed, so it can check what arrived. */
    static byte[] dataOf(long seed, int rank, int bytes) {
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
            if (ONE_GPU_AS_HOSTS) {
                // other hosts for gin4j too: no peer mapped, on every rank, and the reason given
                long[] bases = peers.bases(0);
                for (int p = 0; p < world; p++)
                    if ((p == rank) != (bases[p] != 0)) throw new AssertionError("rank " + rank + ": peer table " + Arrays.toString(bases) + " maps another host's window");
                if (peers.allReachable() || !peers.unreachable().contains("another host"))
                    throw new AssertionError("ranks posing as hosts taken for one LSA team: " + peers.unreachable());
                System.out.println("the peer table: other hosts, as expected: " + peers.unreachable());
                hostAllToAll(g, rank, seed + 7, 10_007, arena, "host all-to-all");
                return;
            }
            if (!peers.allReachable()) throw new AssertionError("not every peer is load/store reachable: " + Arrays.toString(peers.bases(0)) + ": " + peers.unreachable());
            System.out.println("rank " + rank + ": every peer mapped (" + peers.source() + ") with " + Nccl.describe());
            w.region(0, "payload").fill((byte) 0xee, s);
            s.synchronize();
            g.allGatherLongs(new long[] {rank}); // everyone poisoned before anyone writes
            int n = (1 << 20) / 4;
            byte[] mine = dataOf(seed, rank, 4 * n);
            int peer = (rank + 1) % world;
            try (CodeObject basic = KernelLibrary.load(d, "basic")) {
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
            hostAllToAll(g, rank, seed + 7, 10_007, arena, "host all-to-all");
        }
    }

    /**
     * GIN (by size, and through the copy engines) and HOST uniform all-to-all across processes,
     * several sizes, checked against every rank's data; on ranks posing as hosts GIN is refused.
     */
    private static void allToAll(CommGroup g, int rank, long seed, Arena arena) {
        Device d = g.rank(0).device();
        int world = g.worldSize();
        if (ONE_GPU_AS_HOSTS)
            expectNoDeviceComm("the GIN all-to-all", () -> AllToAll.create(g, 1 << 22, Backend.GIN).close());
        try (Stream s = d.createStream();
             AllToAll gin = ONE_GPU_AS_HOSTS ? null : AllToAll.create(g, 1 << 22, Backend.GIN);
             AllToAll host = AllToAll.create(g, 1 << 22, Backend.HOST)) {
            // GIN by size, GIN through the copy engines (peer windows mapped by NCCL in this process), HOST
            Map<String, AllToAll> variants = new LinkedHashMap<>();
            if (gin != null) {
                variants.put("GIN", gin.protocol(Protocol.AUTO));
                variants.put("GIN (copy engines)", gin.protocol(Protocol.COPY_ENGINE));
            }
            variants.put("HOST", host);
            int call = 0;
            for (long perPeer : new long[] {1, 4095, 65536, 1 << 22}) {
                for (var v : variants.entrySet()) {
                    AllToAll a = v.getValue();
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
                            throw new AssertionError(v.getKey() + " all-to-all of " + perPeer + " bytes per peer: rank " + rank + " got wrong bytes from " + src);
                        }
                    }
                }
            }
        }
        allToAllV(g, rank, seed, arena, 300_000, !ONE_GPU_AS_HOSTS, null);
    }

    /**
     * All-to-all-v (counts on the device) on each backend that can run here, rounds of zero counts,
     * one peer taking everything, tiny and random counts; every rank derives every rank's counts
     * and bytes from the shared seed and checks what it received and the counts it was told.
     */
    static void allToAllV(CommGroup g, int rank, long seed, Arena arena, long cap, boolean withGin, LoopbackGinRank.Counters counters) {
        Device d = g.rank(0).device();
        int n = g.worldSize();
        try (Stream s = d.createStream();
             AllToAllV gin = withGin ? AllToAllV.create(g, cap, Backend.GIN) : null;
             AllToAllV host = AllToAllV.create(g, cap, Backend.HOST)) {
            for (int round = 0; round < 6; round++) {
                SplittableRandom random = new SplittableRandom(seed * 7919 + round);
                long[][] cnt = new long[n][n];
                for (int i = 0; i < n; i++) for (int p = 0; p < n; p++) {
                    cnt[i][p] = switch (round) {
                        case 0 -> 0;
                        case 1 -> p == 0 ? cap : 0;  // one peer takes everything
                        case 2 -> random.nextInt(64);
                        case 3 -> cap;  // every peer the whole capacity
                        default -> random.nextInt(4) == 0 ? 0 : random.nextLong(cap + 1);
                    };
                }
                long[][] off = new long[n][n];
                byte[][] data = new byte[n][];
                for (int i = 0; i < n; i++) {
                    long total = 0;
                    for (int p = 0; p < n; p++) { off[i][p] = total; total += cnt[i][p]; }
                    data[i] = dataOf(seed + 5000 + round, i, (int) total + 1);
                }
                for (AllToAllV v : gin == null ? List.of(host) : List.of(gin, host)) {
                    v.output(0).fill((byte) 0xcd, s);
                    v.receivedCounts(0).fill((byte) 0xee, s);
                    long[][] before = counters != null && v == gin ? counters.all(n) : null;
                    v.run(List.of(upload(d, arena, data[rank])), List.of(upload(d, arena, cnt[rank])), List.of(upload(d, arena, off[rank])), List.of(s));
                    v.checkErrors(List.of(s));
                    if (before != null) LoopbackGinRank.expectAllToAllV(counters, before, rank, cnt[rank], gin.plan().chunksPerPeer(), round);
                    byte[] got = v.output(0).toByteArray();
                    long[] told = new long[n];
                    MemorySegment.copy(MemorySegment.ofArray(v.receivedCounts(0).toByteArray()), ValueLayout.JAVA_LONG_UNALIGNED, 0, told, 0, n);
                    for (int src = 0; src < n; src++) {
                        int from = Math.toIntExact(off[src][rank]), count = (int) cnt[src][rank];
                        if (told[src] != count || !Arrays.equals(data[src], from, from + count, got, (int) (src * cap), (int) (src * cap) + count))
                            throw new AssertionError(v.backend() + " all-to-all-v round " + round + ": rank " + rank + " got " + told[src]
                                    + " bytes from " + src + " (expected " + count + ") or wrong bytes");
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
        // gives 2 GiB back, room for the small collectives below but not for the window's 4 GiB (on
        // one GPU shared by the ranks, no rank gets it: each then throws its own error)
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
                String expected = rank == 1 || ONE_GPU_AS_HOSTS || ONE_GPU_ONE_HOST ? "(" + windowBytes + " bytes)" : "failed on rank(s) [1]";
                if (!e.getMessage().contains(expected)) throw new AssertionError("rank " + rank + ": expected '" + expected + "' in: " + e.getMessage(), e);
                System.out.println("rank " + rank + " window refused together: " + e.getMessage());
            }
        }
        hostAllToAll(g, rank, seed + 11, 4099, arena, "the all-to-all after the failed steps");  // the group still works
    }

    /**
     * MoE dispatch, fake experts and combine across processes, on each backend that can run here
     * (HOST; GIN too on a GPU each, where the two layouts must be identical), against the CPU
     * reference: every rank draws every rank's inputs from the shared seed. The ranks send unequal
     * token counts, some slots masked; hidden 200 is no multiple of 16 (the element paths).
     */
    private static void moe(CommGroup g, int rank, long seed, Arena arena) {
        int world = g.worldSize(), hidden = 200, experts = 4 * world, k = 3, maxTokens = 64;
        MoeReference.Input[] in = new MoeReference.Input[world];
        for (int r = 0; r < world; r++)
            in[r] = MoeReference.input(new SplittableRandom(seed * 31 + r), r, world, r == 0 ? maxTokens : 37, hidden, experts, k, MoeReference.Routing.SOME_MASKED);
        List<Backend> backends = ONE_GPU_AS_HOSTS ? List.of(Backend.HOST) : List.of(Backend.GIN, Backend.HOST);
        if (ONE_GPU_AS_HOSTS)
            expectNoDeviceComm("the GIN MoE exchange", () -> MoeAllToAll.create(g, MoeConfig.bf16(hidden, experts, k, maxTokens, Backend.GIN)).close());
        Device d = g.rank(0).device();
        byte[] firstRows = null;
        for (Backend b : backends) {
            try (MoeAllToAll moe = MoeAllToAll.create(g, MoeConfig.bf16(hidden, experts, k, maxTokens, b)); Stream s = d.createStream()) {
                int rowBytes = (int) moe.config().dispatchRowBytes();
                MoeDispatch h = moe.dispatch(0, upload(d, arena, in[rank].x()), upload(d, arena, in[rank].idx()), upload(d, arena, in[rank].w()), in[rank].tokens(), s);
                moe.checkErrors(List.of(s));
                MoeReference.Layout exp = MoeReference.expected(in, rank, rowBytes, experts, k);
                int rows = exp.rows().size();
                int[] counts = new int[moe.localExperts()];
                MemorySegment.copy(MemorySegment.ofArray(h.counts().toByteArray()), ValueLayout.JAVA_INT_UNALIGNED, 0, counts, 0, counts.length);
                if (!Arrays.equals(exp.counts(), counts))
                    throw new AssertionError(b + ": per-expert counts on rank " + rank + ": expected " + Arrays.toString(exp.counts()) + " got " + Arrays.toString(counts));
                byte[] got = h.rows().slice(0, (long) rows * rowBytes).toByteArray();
                float[] weights = new float[rows];
                MemorySegment.copy(MemorySegment.ofArray(h.weights().slice(0, 4L * rows).toByteArray()), ValueLayout.JAVA_FLOAT_UNALIGNED, 0, weights, 0, rows);
                for (int r = 0; r < rows; r++) {
                    int[] o = exp.origin().get(r);
                    if (!Arrays.equals(exp.rows().get(r), 0, rowBytes, got, r * rowBytes, (r + 1) * rowBytes) || exp.weights().get(r) != weights[r])
                        throw new AssertionError(b + ": rank " + rank + " row " + r + " (source " + o[0] + " token " + o[1] + " expert " + o[2] + ") or its weight differs");
                }
                if (firstRows != null && !Arrays.equals(firstRows, got)) throw new AssertionError("GIN and HOST layouts differ on rank " + rank);
                firstRows = got;
                DeviceBuffer out = upload(d, arena, MoeReference.expertOut(in, exp, hidden, moe.capacityRows()));
                DeviceBuffer y = moe.combine(h, out, s);
                moe.checkErrors(List.of(s));
                String off = MoeReference.combineMismatch(in[rank], MemorySegment.ofArray(y.toByteArray()), hidden, k, true);
                if (off != null) throw new AssertionError(b + ": y on rank " + rank + " " + off);
                System.out.println("rank " + rank + " MoE " + b + ": " + rows + " rows received, y checked");
            }
        }
    }

    /**
     * For a grouped GEMM across processes: expert offsets and host counts on request, and an expert
     * alignment that differs per rank (rank r aligns to 1 + 7r rows: 1, 8, ...; it only places what
     * a rank receives), on HOST and, with a GPU each, GIN. The received rows and weights are
     * poisoned before the checked dispatch; every row and weight is checked at its aligned place,
     * every padding row and weight still poison, every offset and count on the device and the host;
     * then the combine of expert outputs laid out aligned, the padding outputs huge.
     */
    private static void moeGroupedGemm(CommGroup g, int rank, long seed, Arena arena) {
        int world = g.worldSize(), hidden = 128, experts = 4 * world, k = 3, maxTokens = 64, alignment = 1 + 7 * rank;
        byte poison = (byte) 0x6c;
        MoeReference.Input[] in = new MoeReference.Input[world];
        for (int r = 0; r < world; r++)
            in[r] = MoeReference.input(new SplittableRandom(seed * 131 + r), r, world, r == 0 ? maxTokens : 23, hidden, experts, k, MoeReference.Routing.SOME_MASKED);
        List<Backend> backends = ONE_GPU_AS_HOSTS ? List.of(Backend.HOST) : List.of(Backend.GIN, Backend.HOST);
        Device d = g.rank(0).device();
        for (Backend b : backends) {
            MoeConfig cfg = MoeConfig.builder().hidden(hidden).experts(experts).topK(k).maxTokensPerRank(maxTokens).backend(b).expertAlignment(alignment).build();
            try (MoeAllToAll moe = MoeAllToAll.create(g, cfg); Stream s = d.createStream()) {
                int rowBytes = (int) cfg.dispatchRowBytes(), L = moe.localExperts();
                long cap = moe.capacityRows();
                if (cap != (long) world * maxTokens * Math.min(k, L) + (long) L * (alignment - 1))
                    throw new AssertionError(b + ": capacity " + cap + " on rank " + rank + " does not hold the padding of alignment " + alignment);
                moe.hostCounts(true);
                DeviceBuffer x = upload(d, arena, in[rank].x()), idx = upload(d, arena, in[rank].idx()), w = upload(d, arena, in[rank].w());
                MoeDispatch first = moe.dispatch(0, x, idx, w, in[rank].tokens(), s);
                moe.checkErrors(List.of(s));
                first.rows().fill(poison, s);
                first.weights().fill(poison, s);
                first.offsets().fill(poison, s);
                MoeDispatch h = moe.dispatch(0, x, idx, w, in[rank].tokens(), s);
                MoeReference.Layout exp = MoeReference.expected(in, rank, rowBytes, experts, k);
                int[] starts = new int[L + 1];
                for (int e = 0; e < L; e++) starts[e + 1] = starts[e] + (exp.counts()[e] + alignment - 1) / alignment * alignment;
                int[] hostCounts = h.hostCounts(), hostOffsets = h.hostOffsets();  // before any synchronize: they wait for their own copy
                moe.checkErrors(List.of(s));
                if (!Arrays.equals(exp.counts(), hostCounts)) throw new AssertionError(b + ": host counts on rank " + rank + ": expected " + Arrays.toString(exp.counts()) + " got " + Arrays.toString(hostCounts));
                if (!Arrays.equals(starts, hostOffsets)) throw new AssertionError(b + ": host offsets on rank " + rank + ": expected " + Arrays.toString(starts) + " got " + Arrays.toString(hostOffsets));
                int[] offsets = h.offsets().readInts(L + 1, s), counts = h.counts().readInts(L, s);
                if (!Arrays.equals(starts, offsets) || !Arrays.equals(exp.counts(), counts))
                    throw new AssertionError(b + ": device offsets/counts on rank " + rank + ": " + Arrays.toString(offsets) + " / " + Arrays.toString(counts));
                byte[] rows = h.rows().slice(0, cap * rowBytes).toByteArray(s);
                int[] wts = h.weights().slice(0, 4 * cap).readInts((int) cap, s);
                short[] eo = new short[Math.toIntExact(cap * hidden)];
                int packed = 0;
                for (int e = 0; e < L; e++) {
                    for (int j = 0; j < exp.counts()[e]; j++, packed++) {
                        int row = offsets[e] + j;
                        int[] o = exp.origin().get(packed);
                        if (!Arrays.equals(exp.rows().get(packed), 0, rowBytes, rows, row * rowBytes, (row + 1) * rowBytes)
                                || Float.floatToRawIntBits(exp.weights().get(packed)) != wts[row])
                            throw new AssertionError(b + ": rank " + rank + " row " + row + " (expert " + e + ", source " + o[0] + " token " + o[1] + ") or its weight differs");
                        for (int c = 0; c < hidden; c++) eo[row * hidden + c] = Bf16.fromFloat(in[o[0]].values()[o[1] * hidden + c] * (1 + o[2]));
                    }
                    for (int row = offsets[e] + exp.counts()[e]; row < offsets[e + 1]; row++) {
                        for (int c = 0; c < rowBytes; c++)
                            if (rows[row * rowBytes + c] != poison) throw new AssertionError(b + ": rank " + rank + " padding row " + row + " was written");
                        if (wts[row] != (poison & 0xff) * 0x01010101) throw new AssertionError(b + ": rank " + rank + " padding weight " + row + " was written");
                        Arrays.fill(eo, row * hidden, (row + 1) * hidden, Bf16.fromFloat(1e30f));
                    }
                }
                DeviceBuffer y = moe.combine(h, upload(d, arena, eo), s);
                moe.checkErrors(List.of(s));
                String off = MoeReference.combineMismatch(in[rank], MemorySegment.ofArray(y.slice(0, (long) in[rank].tokens() * 2 * hidden).toByteArray(s)), hidden, k, true);
                if (off != null) throw new AssertionError(b + ": y on rank " + rank + " after the aligned dispatch " + off);
                System.out.println("rank " + rank + " MoE grouped GEMM " + b + ": alignment " + alignment + ", " + exp.rows().size() + " rows, offsets "
                        + Arrays.toString(offsets) + ", host counts, padding and y checked");
            }
        }
    }

    static DeviceBuffer upload(Device d, Arena arena, Object array) {
        MemorySegment host = switch (array) {
            case byte[] b -> MemorySegment.ofArray(b);
            case int[] i -> MemorySegment.ofArray(i);
            case float[] f -> MemorySegment.ofArray(f);
            case short[] h -> MemorySegment.ofArray(h);
            case long[] l -> MemorySegment.ofArray(l);
            default -> throw new IllegalArgumentException("not an array: " + array);
        };
        DeviceBuffer b = d.allocate(Math.max(host.byteSize(), 16), arena);
        if (host.byteSize() > 0) b.slice(0, host.byteSize()).copyFromHost(host);
        return b;
    }

    /**
     * Collective: once every rank is past the collectives before, rank 0 halts without closing
     * anything; the others return a second later, when it is gone.
     */
    static void rankZeroHalts(CommGroup g, int rank) throws InterruptedException {
        g.allGatherLongs(new long[] {rank});
        if (rank == 0) {
            System.out.println("RANK 0 OK (halting without closing anything)");
            System.out.flush();
            Runtime.getRuntime().halt(0);
        }
        Thread.sleep(1000);
    }

    /**
     * Rank 0 dies (halts, closing nothing) after a HOST all-to-all with rank 1, or, when
     * {@code connected} is false, before the ranks ever exchanged anything point to point. Rank 1's
     * next HOST all-to-all must then fail within the host-wait time-out (GIN4J_COMM_TIMEOUT_S),
     * naming the wait, and leave the group closed; nothing may hang.
     */
    private static void peerDies(CommGroup g, int rank, long seed, Arena arena, boolean connected) throws InterruptedException {
        if (connected) hostAllToAll(g, rank, seed + 13, 4099, arena, "the all-to-all before rank 0 dies");
        rankZeroHalts(g, rank);
        long timeout = g.hostWaitTimeout().toNanos(), start = System.nanoTime();
        try {
            hostAllToAll(g, rank, seed + 17, 4099, arena, "the all-to-all after rank 0 died");
            throw new AssertionError("an all-to-all with a dead rank returned");
        } catch (CommException e) {
            long took = System.nanoTime() - start;
            System.out.printf("rank %d: the all-to-all with a dead peer failed after %.1f s: %s%n", rank, took / 1e9, e.getMessage());
            if (took > timeout + 20_000_000_000L) throw new AssertionError("it failed only after " + took / 1e9 + " s, the time-out is " + timeout / 1e9 + " s", e);
            if (!g.isClosed()) throw new AssertionError("the group is still open after a peer died", e);
            if (!e.getMessage().contains("all-to-all")) throw new AssertionError("the error does not say what failed: " + e.getMessage(), e);
            // over sockets NCCL sees the closed connection: reported, not left to the time-out
            if (connected && (ONE_GPU_AS_HOSTS || ONE_GPU_ONE_HOST) && (!e.getMessage().contains("ncclRemoteError") || took > timeout / 2))
                throw new AssertionError("NCCL's report of the dead peer was expected well before the time-out: " + e.getMessage(), e);
        }
    }

    /**
     * Rank 0 halts after an all-to-all with rank 1; rank 1 queues another, does not wait for it, and
     * closes the group: the close must end (NCCL has reported the dead peer by then), not wait for
     * the exchange that never completes.
     */
    private static void peerDiesThenClose(CommGroup g, int rank, long seed, Arena arena) throws InterruptedException {
        hostAllToAll(g, rank, seed + 19, 4099, arena, "the all-to-all before rank 0 dies");
        rankZeroHalts(g, rank);
        Device d = g.rank(0).device();
        Stream s = d.createStream();
        DeviceBuffer send = d.allocate(2 * 4099, arena), recv = d.allocate(2 * 4099, arena);
        g.allToAll(List.of(send), List.of(recv), 4099, List.of(s));
        Thread.sleep(3000);  // NCCL's proxy sees the closed socket meanwhile
        long start = System.nanoTime();
        try {
            g.close();  // blocking: aborted at NCCL's report; nonblocking: the finalize ends at it and throws
            System.out.printf("rank %d: the group closed in %.1f s%n", rank, (System.nanoTime() - start) / 1e9);
        } catch (CommException e) {
            System.out.printf("rank %d: the close threw after %.1f s: %s%n", rank, (System.nanoTime() - start) / 1e9, e.getMessage());
        }
        long took = System.nanoTime() - start;
        if (took > g.hostWaitTimeout().toNanos() + 20_000_000_000L) throw new AssertionError("the close took " + took / 1e9 + " s");
        if (!g.isClosed()) throw new AssertionError("the group is still open");
        s.close();
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
        for (dev.gin4j.comm.Backend b : dev.gin4j.comm.Backend.values()) {
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
