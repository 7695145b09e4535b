package dev.gin4j.comm;

import dev.gin4j.gpu.Device;
import dev.gin4j.gpu.DeviceBuffer;
import dev.gin4j.gpu.Graph;
import dev.gin4j.gpu.Stream;
import dev.gin4j.moe.Fp8Rows;
import dev.gin4j.moe.MoeAllToAll;
import dev.gin4j.moe.MoeConfig;
import dev.gin4j.moe.MoeDispatch;
import dev.gin4j.moe.MoeOutputs;
import dev.gin4j.moe.MoeReference;
import dev.gin4j.moe.NetworkMode;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.SplittableRandom;

/**
 * The MoE exchange across nodes (gin-kernels/src/nccl_gin_moe.cu) on ranks that pose as separate
 * hosts on one GPU, linked by the loopback GIN transport: every row crosses through ncclGin puts.
 * {@code GIN4J_TEST_MOE_MODES} (comma-separated {@link NetworkMode}s, default AUTO) says which modes
 * each case runs in; {@code GIN4J_EMULATED_NODE_SIZE} groups the ranks into emulated nodes (then the
 * high-throughput mode's hop inside a node travels through the transport too, and is counted);
 * {@code GIN4J_TEST_MOE_CASES=short} runs the shorter case list (no T=4096 unless
 * {@code GIN4J_TEST_MOE_LARGE=1}; T=4096 runs in the last listed mode only).
 * {@code GIN4J_TEST_MOE_PHASES} (comma-separated, default all: cases, staged, pairs, replays, outputs; repeated = pairs, replays)
 * runs some of the phases, so that a run of three or four processes, which takes longer than one
 * device call, can be split over several.
 * Each case checks every received row, weight and count against the CPU reference (and, once, byte
 * for byte against HOST), the combine within bf16 tolerance, and the transport's counters against
 * the bytes the rule allows: per dispatch, to each peer, (tokens going there) x (row bytes) plus
 * the metadata (the header, {@code align16(8 + 4L)} bytes, and 12K bytes per token); per combine,
 * (tokens received from that peer) x 2H bytes. Every rank draws every rank's inputs from the seed.
 */
final class LoopbackGinMoeRank {
    private LoopbackGinMoeRank() {}

    private static final long START = System.nanoTime();

    /** One line of progress, flushed at once, with the seconds since this rank started (a rank killed at its limit shows where it was). */
    static void say(int rank, String what) {
        System.out.printf("rank %d [%.1f s] %s%n", rank, (System.nanoTime() - START) / 1e9, what);
        System.out.flush();
    }

    /** One case: shape, tokens per rank (by rank), routing, rows. */
    record Case(String name, int hidden, int experts, int k, int maxTokens, int[] tokens, MoeReference.Routing routing, boolean fp8) {}

    /** The emulated node grouping the ranks run under (each rank its own node without GIN4J_EMULATED_NODE_SIZE). */
    record Nodes(int world, int size) {
        static Nodes fromEnvironment(int world) {
            String v = System.getenv("GIN4J_EMULATED_NODE_SIZE");
            return new Nodes(world, v == null || v.isBlank() ? 1 : Integer.parseInt(v.trim()));
        }
        int nodeOf(int r) { return r / size; }
        int nodes() { return (world + size - 1) / size; }
        int sizeOf(int d) { return Math.min(size, world - d * size); }
        int localOf(int r) { return r % size; }
        /** The entry rank of node d for sender s (MoeTopology's rule: local(s) mod size(d)). */
        int entry(int s, int d) { return d * size + localOf(s) % sizeOf(d); }
        int slotsPerNode() {
            int f = 1;
            for (int a = 0; a < nodes(); a++) for (int b = 0; b < nodes(); b++) f = Math.max(f, (sizeOf(a) + sizeOf(b) - 1) / sizeOf(b));
            return f;
        }
        /** The HT kernels' blocks per unit and role (MoeNetwork.highThroughputChunks). */
        int htChunks(int channels) {
            int n = nodes(), f = slotsPerNode(), most = world + (n - 1) * f + world;
            for (int r = 0; r < world; r++) { int g = sizeOf(nodeOf(r)); most = Math.max(most, g + (n - 1) + (n - 1) * f * g + world); }
            return Math.max(1, Math.min(channels / world, 256 / most));
        }
    }

    static void run(CommGroup g, int rank, long seed, Arena arena) {
        int world = g.worldSize();
        List<NetworkMode> modes = new ArrayList<>();
        for (String m : System.getenv().getOrDefault("GIN4J_TEST_MOE_MODES", "AUTO").split(",")) modes.add(NetworkMode.valueOf(m.trim()));
        boolean full = !"short".equals(System.getenv("GIN4J_TEST_MOE_CASES")), large = full || "1".equals(System.getenv("GIN4J_TEST_MOE_LARGE"));
        Nodes nodes = Nodes.fromEnvironment(world);
        List<Case> cases = new ArrayList<>();
        int[] skewed = new int[world];
        for (int r = 0; r < world; r++) skewed[r] = r == 0 ? 128 : (r == 1 ? 1 : 37);
        cases.add(new Case("small odd hidden", 200, 4 * world, 3, 128, skewed, MoeReference.Routing.SOME_MASKED, false));
        cases.add(new Case("nothing to the last rank", 256, 4 * world, 2, 64, fill(world, 64), MoeReference.Routing.NOTHING_TO_LAST_RANK, false));
        cases.add(new Case("no tokens", 256, 4 * world, 2, 64, fill(world, 0), MoeReference.Routing.UNIFORM, false));
        int[][] models = {{7168, 256, 8}, {2048, 128, 8}, {4096, 8, 2}, {2880, 128, 4}};
        String[] names = {"DeepSeek-V3", "Qwen3-30B-A3B", "Mixtral", "gpt-oss"};
        for (int m = 0; m < models.length; m++) {
            if (models[m][1] % world != 0) continue;
            for (int t : full ? new int[] {1, 128} : new int[] {m % 2 == 0 ? 1 : 128})
                cases.add(new Case(names[m] + " T=" + t, models[m][0], models[m][1], models[m][2], 128, fill(world, t), MoeReference.Routing.UNIFORM, false));
        }
        if (256 % world == 0) {
            if (large) cases.add(new Case("DeepSeek-V3 T=4096", 7168, 256, 8, 4096, fill(world, 4096), MoeReference.Routing.UNIFORM, false));
            cases.add(new Case("DeepSeek-V3 fp8 T=128", 7168, 256, 8, 128, fill(world, 128), MoeReference.Routing.SOME_MASKED, true));
        }
        int[] small = skewed.clone();
        for (int i = 0; i < small.length; i++) small[i] = Math.min(small[i], 64);
        cases.add(new Case("fp8 small", 256, 4 * world, 3, 64, small, MoeReference.Routing.SOME_MASKED, true));
        Counters counters = new Counters();
        Device d = g.rank(0).device();
        java.util.Set<NetworkMode> hostCompared = new java.util.HashSet<>();  // once per mode, byte for byte against HOST
        java.util.Set<String> phases = phases();
        for (Case c : phases.contains("cases") ? cases : List.<Case>of()) {
            say(rank, "case " + c.name() + ": start");
            // the largest case in the last listed mode only: the time of the whole run stays bounded
            List<NetworkMode> caseModes = c.maxTokens() >= 4096 ? modes.subList(modes.size() - 1, modes.size()) : modes;
            for (NetworkMode mode : caseModes) runCase(g, rank, seed + c.name().hashCode(), arena, d, c, counters, hostCompared.add(mode), mode, nodes);
        }
        if (phases.contains("staged")) {
            say(rank, "staged calls: start");
            for (NetworkMode mode : modes) staged(g, rank, seed, arena, d, mode);
        }
        // With both modes (two emulated nodes of two): the pairs alternate between the modes, and
        // only the high-throughput mode is replayed, since only its path depends on the nodes (the
        // low-latency one is the 4-rank test's); each phase then fits in one device call.
        if (phases.contains("pairs")) {
            say(rank, "back-to-back pairs: start");
            if (modes.size() > 1) backToBack(g, rank, seed, arena, d, NetworkMode.AUTO, modes);
            else backToBack(g, rank, seed, arena, d, modes.get(0), null);
        }
        if (phases.contains("replays")) {
            say(rank, "graph replays: start");
            replays(g, rank, seed, arena, d, modes.get(modes.size() - 1));
        }
        if (phases.contains("outputs")) {
            say(rank, "grouped GEMM: start");
            groupedGemm(g, rank, seed, arena, d);
            for (NetworkMode mode : modes) alignedIntoCallersBuffers(g, rank, seed, arena, d, mode);
        }
        say(rank, "phases " + phases + " done");
    }

    /** Every phase, in the order they run. */
    static final List<String> ALL_PHASES = List.of("cases", "staged", "pairs", "replays", "outputs");

    /**
     * All by default; GIN4J_TEST_MOE_PHASES picks some (comma-separated; {@code repeated} stands for
     * pairs and replays), so a long run can be split (each rank's log says which ran).
     */
    static java.util.Set<String> phases() {
        String v = System.getenv("GIN4J_TEST_MOE_PHASES");
        if (v == null || v.isBlank()) return new java.util.LinkedHashSet<>(ALL_PHASES);
        java.util.Set<String> named = new java.util.HashSet<>();
        for (String p : v.split(",")) {
            String name = p.trim();
            if (name.equals("repeated")) named.addAll(List.of("pairs", "replays"));
            else if (ALL_PHASES.contains(name)) named.add(name);
            else throw new IllegalArgumentException("GIN4J_TEST_MOE_PHASES: '" + name + "' is none of " + ALL_PHASES + " or repeated (pairs and replays)");
        }
        java.util.Set<String> picked = new java.util.LinkedHashSet<>(ALL_PHASES);
        picked.retainAll(named);
        return picked;
    }

    /**
     * Across nodes: expert offsets and host counts on request, checked against the reference on
     * every rank (the layout itself is runCase's; an aligned layout is alignedIntoCallersBuffers').
     */
    private static void groupedGemm(CommGroup g, int rank, long seed, Arena arena, Device d) {
        int world = g.worldSize();
        Case c = new Case("grouped GEMM", 256, 4 * world, 3, 64, fill(world, 41), MoeReference.Routing.SOME_MASKED, false);
        try (Stream s = d.createStream()) {
            MoeReference.Input[] in = inputs(c, world, seed + 77, d, arena, s);
            try (MoeAllToAll moe = MoeAllToAll.create(g, MoeConfig.bf16(c.hidden(), c.experts(), c.k(), c.maxTokens(), Backend.GIN))) {
                moe.hostCounts(true);
                DeviceBuffer x = RankMain.upload(d, arena, in[rank].x()), idx = RankMain.upload(d, arena, in[rank].idx()), w = RankMain.upload(d, arena, in[rank].w());
                MoeDispatch first = moe.dispatch(0, x, idx, w, in[rank].tokens(), s);
                moe.checkErrors(List.of(s));
                first.offsets().fill((byte) 0x5a, s);
                MoeDispatch h = moe.dispatch(0, x, idx, w, in[rank].tokens(), s);
                int[] counts = MoeReference.expected(in, rank, 2 * c.hidden(), c.experts(), c.k()).counts();
                int[] want = new int[counts.length + 1];
                for (int e = 0; e < counts.length; e++) want[e + 1] = want[e] + counts[e];
                int[] hostCounts = h.hostCounts(), hostOffsets = h.hostOffsets();
                moe.checkErrors(List.of(s));
                int[] offsets = h.offsets().readInts(counts.length + 1, s);
                if (!Arrays.equals(counts, hostCounts) || !Arrays.equals(want, hostOffsets) || !Arrays.equals(want, offsets))
                    throw new AssertionError("across nodes, rank " + rank + ": counts " + Arrays.toString(counts) + " offsets " + Arrays.toString(want) + ", got host "
                            + Arrays.toString(hostCounts) + " / " + Arrays.toString(hostOffsets) + ", device " + Arrays.toString(offsets));
                System.out.println("rank " + rank + " MoE across nodes, grouped GEMM: offsets " + Arrays.toString(offsets) + " and host counts checked");
            }
        }
    }

    private static final byte POISON = (byte) 0x5a;

    /** A row value that names its origin: source rank, token and slot k in the mantissa, the sign from t + k (so -1.x values come back too). */
    static float rowValue(int source, int t, int k) {
        int bits = 0x3f800000 | ((source * 131071 + t * 37 + k * 7919) & 0x7fffff);
        return Float.intBitsToFloat(((t + k) & 1) == 0 ? bits : bits | 0x80000000);
    }

    /**
     * A rank that dies between two exchanges across nodes, in the one mode GIN4J_TEST_MOE_MODES
     * names: a first dispatch and combine are checked, then rank 0 halts without closing anything,
     * and the others' next dispatch must fail within the host-wait time-out, with their group
     * aborted; a combine after it is refused. The dispatch's puts to the dead peer complete with
     * the transport's error, NCCL reports it, the group raises the abort word and aborts, and the
     * kernel's waits and flushes end at that word: well within half the kernel's own 10 s time-out.
     */
    static void peerDies(CommGroup g, int rank, long seed, Arena arena) throws InterruptedException {
        int world = g.worldSize();
        NetworkMode mode = NetworkMode.valueOf(System.getenv().getOrDefault("GIN4J_TEST_MOE_MODES", "AUTO").trim());
        Case c = new Case("dying peer", 256, 4 * world, 2, 64, fill(world, 48), MoeReference.Routing.SOME_MASKED, false);
        Device d = g.rank(0).device();
        try (Stream s = d.createStream(); MoeAllToAll moe = MoeAllToAll.create(g, MoeConfig.bf16(c.hidden(), c.experts(), c.k(), c.maxTokens(), Backend.GIN)).networkMode(mode)) {
            MoeReference.Input[] in = inputs(c, world, seed + 5, d, arena, s);
            DeviceBuffer x = RankMain.upload(d, arena, in[rank].x()), idx = RankMain.upload(d, arena, in[rank].idx()), w = RankMain.upload(d, arena, in[rank].w());
            MoeDispatch h = moe.dispatch(0, x, idx, w, in[rank].tokens(), s);
            MoeReference.Layout exp = MoeReference.expected(in, rank, (int) moe.config().dispatchRowBytes(), c.experts(), c.k());
            DeviceBuffer out = RankMain.upload(d, arena, MoeReference.expertOut(in, exp, c.hidden(), moe.capacityRows()));
            DeviceBuffer y = moe.combine(h, out, s);
            moe.checkErrors(List.of(s));
            String off = MoeReference.combineMismatch(in[rank], MemorySegment.ofArray(y.toByteArray()), c.hidden(), c.k(), true);
            if (off != null) throw new AssertionError("before rank 0 dies (" + moe.effectiveNetworkMode() + "): y on rank " + rank + " " + off);
            RankMain.rankZeroHalts(g, rank);
            long start = System.nanoTime();
            MoeDispatch late = null;
            try {
                late = moe.dispatch(0, x, idx, w, in[rank].tokens(), s);
                moe.checkErrors(List.of(s));
                throw new AssertionError("a MoE dispatch across nodes with a dead rank returned");
            } catch (RuntimeException e) {  // the kernel's own time-out, NCCL's report or the host wait, whichever comes first
                double took = (System.nanoTime() - start) / 1e9, limit = g.hostWaitTimeout().toNanos() / 1e9;
                System.out.printf("rank %d: the MoE exchange across nodes (%s) with a dead peer failed after %.1f s: %s%n", rank, moe.effectiveNetworkMode(), took,
                        e.getMessage());
                if (took > limit + 1) throw new AssertionError("it failed only after " + took + " s, beyond the " + limit + " s time-out", e);
                if (took >= 5) throw new AssertionError("it failed only after " + took + " s: the kernel's waits did not end at the group's abort, before their 10 s time-out", e);
                if (!g.isClosed()) throw new AssertionError("the group is still open after a peer died", e);
            }
            if (late != null) {  // null where the dispatch itself was refused
                try {
                    moe.combine(late, out, s);
                    throw new AssertionError("a combine on the aborted group was accepted");
                } catch (IllegalStateException e) {
                    System.out.println("rank " + rank + ": the combine after it is refused: " + e.getMessage());
                }
            }
        }
    }

    /**
     * Across nodes, expert alignment and the caller's buffers together: each rank dispatches into
     * its own poisoned rows, weights and counts at its own alignment (16 on even ranks, 3 on odd:
     * the alignment only places what a rank receives, so ranks may differ), then combines into its
     * own poisoned y. Every expert's block starts at its aligned offset, the padding rows and the
     * rows past the last block keep the poison, the instance's own buffers are not written, and y
     * matches the reference (the padding rows' expert outputs are 1e30, so a combine that read one
     * would show) with the rows past T untouched.
     */
    private static void alignedIntoCallersBuffers(CommGroup g, int rank, long seed, Arena arena, Device d, NetworkMode mode) {
        int world = g.worldSize(), alignment = rank % 2 == 0 ? 16 : 3;
        Case c = new Case("aligned", 256, 4 * world, 3, 64, fill(world, 41), MoeReference.Routing.SOME_MASKED, false);
        MoeConfig cfg = MoeConfig.bf16(c.hidden(), c.experts(), c.k(), c.maxTokens(), Backend.GIN).withExpertAlignment(alignment);
        String what = "aligned " + alignment + ", caller's buffers, " + mode + ", rank " + rank;
        try (Stream s = d.createStream(); MoeAllToAll moe = MoeAllToAll.create(g, cfg).networkMode(mode)) {
            moe.expertOffsets(true);
            MoeReference.Input[] in = inputs(c, world, seed + 91, d, arena, s);
            int L = moe.localExperts(), rowBytes = (int) cfg.dispatchRowBytes(), hidden = c.hidden(), tokens = in[rank].tokens();
            long cap = moe.capacityRows();
            DeviceBuffer x = RankMain.upload(d, arena, in[rank].x()), idx = RankMain.upload(d, arena, in[rank].idx()), w = RankMain.upload(d, arena, in[rank].w());
            MoeDispatch own = moe.dispatch(0, x, idx, w, tokens, s);  // the instance's buffers: poisoned, they must stay so
            moe.checkErrors(List.of(s));
            DeviceBuffer ownY = moe.combine(own, RankMain.upload(d, arena, new short[Math.toIntExact(cap * hidden)]), s);
            moe.checkErrors(List.of(s));
            for (DeviceBuffer b : List.of(own.rows(), own.weights(), own.counts(), ownY)) b.fill(POISON, s);
            DeviceBuffer rows = d.allocate(cap * rowBytes, arena), weights = d.allocate(4 * cap, arena), counts = d.allocate(4L * L, arena),
                    y = d.allocate((long) c.maxTokens() * 2 * hidden, arena);
            for (DeviceBuffer b : List.of(rows, weights, counts, y)) b.fill(POISON, s);
            MoeDispatch h = moe.dispatch(0, x, idx, w, tokens, new MoeOutputs(rows, weights, counts), s);
            moe.checkErrors(List.of(s));
            if (h.rows() != rows || h.weights() != weights || h.counts() != counts) throw new AssertionError(what + ": the handle does not name the caller's buffers");
            MoeReference.Layout exp = MoeReference.expected(in, rank, rowBytes, c.experts(), c.k());
            int[] starts = MoeReference.alignedStarts(exp.counts(), alignment);
            int[] offsets = h.offsets().readInts(L + 1, s), gotCounts = counts.readInts(L, s);
            if (!Arrays.equals(starts, offsets) || !Arrays.equals(exp.counts(), gotCounts))
                throw new AssertionError(what + ": offsets " + Arrays.toString(offsets) + " counts " + Arrays.toString(gotCounts) + ", expected "
                        + Arrays.toString(starts) + " / " + Arrays.toString(exp.counts()));
            byte[] got = rows.toByteArray(s);
            int[] wts = weights.readInts((int) cap, s);
            int poisonWord = (POISON & 0xff) * 0x01010101;
            short[] eo = new short[Math.toIntExact(cap * hidden)];
            Arrays.fill(eo, Bf16.fromFloat(1e30f));  // the combine must read no row but the received ones
            float[] rowValues = new float[Math.toIntExact(cap)];
            Arrays.fill(rowValues, Float.NaN);  // padding rows: returnRowValues must read none of them
            int packed = 0;
            for (int e = 0; e < L; e++) {
                for (int j = 0; j < exp.counts()[e]; j++, packed++) {
                    int row = offsets[e] + j;
                    if (!Arrays.equals(exp.rows().get(packed), Arrays.copyOfRange(got, row * rowBytes, (row + 1) * rowBytes)))
                        throw new AssertionError(what + ": expert " + e + " row " + j + " at " + row + " differs from the reference");
                    if (Float.floatToRawIntBits(exp.weights().get(packed)) != wts[row]) throw new AssertionError(what + ": the weight of row " + row + " differs");
                    int[] o = exp.origin().get(packed);
                    for (int k = 0; k < hidden; k++) eo[row * hidden + k] = Bf16.fromFloat(in[o[0]].values()[o[1] * hidden + k] * (1 + o[2]));
                    rowValues[row] = rowValue(o[0], o[1], o[3]);
                }
                for (int row = offsets[e] + exp.counts()[e]; row < (e + 1 < L ? offsets[e + 1] : cap); row++) {
                    for (int b = 0; b < rowBytes; b++)
                        if (got[row * rowBytes + b] != POISON) throw new AssertionError(what + ": row " + row + " (after expert " + e + "'s block) was written at byte " + b);
                    if (wts[row] != poisonWord) throw new AssertionError(what + ": the weight of padding row " + row + " was written");
                }
            }
            for (DeviceBuffer b : List.of(own.rows(), own.weights(), own.counts()))
                for (byte v : b.toByteArray(s)) if (v != POISON) throw new AssertionError(what + ": the dispatch into the caller's buffers wrote the instance's");
            DeviceBuffer yr = moe.combine(h, RankMain.upload(d, arena, eo), y, s);
            moe.checkErrors(List.of(s));
            if (yr.address() != y.address()) throw new AssertionError(what + ": combine returned " + yr + ", not the caller's y");
            byte[] yb = y.toByteArray(s);
            String off = MoeReference.combineMismatch(in[rank], MemorySegment.ofArray(yb), hidden, c.k(), true);
            if (off != null) throw new AssertionError(what + ": y " + off);
            for (int b = tokens * 2 * hidden; b < yb.length; b++) if (yb[b] != POISON) throw new AssertionError(what + ": y was written past T rows, at byte " + b);
            for (byte v : ownY.toByteArray(s)) if (v != POISON) throw new AssertionError(what + ": the combine into the caller's y wrote the instance's");
            // returnRowValues over the aligned layout of the caller's rows
            int[] values = tokens == 0 ? new int[0] : moe.returnRowValues(h, RankMain.upload(d, arena, rowValues), s).readInts(tokens * c.k(), s);
            moe.checkErrors(List.of(s));
            for (int t = 0; t < tokens; t++)
                for (int q = 0; q < c.k(); q++) {
                    int want = in[rank].idx()[t * c.k() + q] >= 0 ? Float.floatToRawIntBits(rowValue(rank, t, q)) : 0;
                    if (values[t * c.k() + q] != want)
                        throw new AssertionError(what + ": returnRowValues, token " + t + " k " + q + ": bits 0x" + Integer.toHexString(values[t * c.k() + q]) + ", expected 0x"
                                + Integer.toHexString(want));
                }
            System.out.println("rank " + rank + " MoE across nodes, " + moe.effectiveNetworkMode() + " at alignment " + alignment
                    + " into the caller's rows, weights, counts and y: offsets " + Arrays.toString(offsets) + ", padding untouched, y and row values checked");
        }
    }

    static int[] fill(int n, int v) { int[] a = new int[n]; Arrays.fill(a, v); return a; }

    /** LoopbackGinRank's counters (that class is the one place that reads the transport). */
    static final class Counters {
        final LoopbackGinRank.Counters c = new LoopbackGinRank.Counters();
        long[][] all(int world) { return c.all(world); }
    }

    static MoeReference.Input[] inputs(Case c, int world, long seed, Device d, Arena arena, Stream s) {
        MoeReference.Input[] in = new MoeReference.Input[world];
        for (int r = 0; r < world; r++) {
            MoeReference.Input bf = MoeReference.input(new SplittableRandom(seed * 31 + r), r, world, c.tokens()[r], c.hidden(), c.experts(), c.k(), c.routing());
            if (!c.fp8()) { in[r] = bf; continue; }
            // the fp8 rows every rank's dispatch makes from its bf16 x (the fake experts keep the bf16 values)
            try (Fp8Rows q = new Fp8Rows(d)) {
                DeviceBuffer x = RankMain.upload(d, arena, bf.rows());
                DeviceBuffer out = q.quantize(x, bf.tokens(), c.hidden(), arena, s);
                q.checkErrors(s);
                byte[] rows = bf.tokens() == 0 ? new byte[0] : out.slice(0, bf.tokens() * Fp8Rows.rowBytes(c.hidden())).toByteArray();
                in[r] = new MoeReference.Input(bf.tokens(), rows, bf.values(), bf.idx(), bf.w(), bf.rows());
            }
        }
        return in;
    }

    private static void runCase(CommGroup g, int rank, long seed, Arena arena, Device d, Case c, Counters counters, boolean compareHost,
                                NetworkMode mode, Nodes nodes) {
        int world = g.worldSize();
        try (Stream s = d.createStream()) {
            MoeReference.Input[] in = inputs(c, world, seed, d, arena, s);
            byte[] ginRows = null;
            for (Backend b : compareHost ? List.of(Backend.GIN, Backend.HOST) : List.of(Backend.GIN)) {
                MoeConfig cfg = c.fp8() ? MoeConfig.fp8FromBf16(c.hidden(), c.experts(), c.k(), c.maxTokens(), b)
                        : MoeConfig.bf16(c.hidden(), c.experts(), c.k(), c.maxTokens(), b);
                say(rank, c.name() + " " + b + " " + mode + ": create");
                try (MoeAllToAll moe = MoeAllToAll.create(g, cfg).networkMode(mode)) {
                    say(rank, c.name() + " " + b + ": created, dispatching");
                    if (b == Backend.GIN && !dev.gin4j.internal.moe.MoeReports.dispatchKernelName(moe).contains("moe_net_dispatch"))
                        throw new AssertionError("every peer is on another host, but the exchange runs " + dev.gin4j.internal.moe.MoeReports.dispatchKernelName(moe));
                    boolean ht = b == Backend.GIN && moe.effectiveNetworkMode() == NetworkMode.HIGH_THROUGHPUT;
                    if (b == Backend.GIN && ht != dev.gin4j.internal.moe.MoeReports.dispatchKernelName(moe).contains("moe_net_dispatch_ht"))
                        throw new AssertionError(mode + " runs as " + moe.effectiveNetworkMode() + " but launches " + dev.gin4j.internal.moe.MoeReports.dispatchKernelName(moe));
                    int rowBytes = (int) cfg.dispatchRowBytes();
                    DeviceBuffer x = RankMain.upload(d, arena, in[rank].x()), idx = RankMain.upload(d, arena, in[rank].idx()),
                            w = RankMain.upload(d, arena, in[rank].w());
                    // a first dispatch gives the result buffers (the instance's own, rewritten by every
                    // dispatch); they are poisoned, and the second dispatch (the other parity) must fill them
                    MoeDispatch first = moe.dispatch(0, x, idx, w, in[rank].tokens(), s);
                    moe.checkErrors(List.of(s));
                    first.rows().fill((byte) 0x5a, s);
                    first.weights().fill((byte) 0x7f, s);
                    first.counts().fill((byte) 0x33, s);
                    long[][] before = counters.all(world);
                    MoeDispatch h = moe.dispatch(0, x, idx, w, in[rank].tokens(), s);
                    moe.checkErrors(List.of(s));
                    long[][] afterDispatch = counters.all(world);
                    say(rank, c.name() + " " + b + ": two dispatches done");
                    byte[] got = checkLayout(h, in, rank, rowBytes, c, b);
                    if (b == Backend.GIN) {
                        ginRows = got;
                        if (ht) expectHtDispatchTraffic(before, afterDispatch, in, rank, rowBytes, c, nodes, nodes.htChunks(moe.channels()));
                        else expectDispatchTraffic(before, afterDispatch, in, rank, rowBytes, c, chunks(moe, world));
                    } else if (!Arrays.equals(ginRows, got)) {
                        throw new AssertionError(c.name() + ": GIN across nodes and HOST layouts differ on rank " + rank);
                    }
                    MoeReference.Layout exp = MoeReference.expected(in, rank, rowBytes, c.experts(), c.k());
                    DeviceBuffer out = RankMain.upload(d, arena, MoeReference.expertOut(in, exp, c.hidden(), moe.capacityRows()));
                    for (boolean weighted : new boolean[] {true, false}) {
                        DeviceBuffer y = weighted ? moe.combine(h, out, s) : moe.combineUnweighted(h, out, s);
                        moe.checkErrors(List.of(s));
                        String off = MoeReference.combineMismatch(in[rank], MemorySegment.ofArray(y.toByteArray()), c.hidden(), c.k(), weighted);
                        if (off != null) throw new AssertionError(c.name() + " " + b + (weighted ? "" : " unweighted") + ": y on rank " + rank + " " + off);
                    }
                    long[][] afterCombine = counters.all(world);
                    if (b == Backend.GIN && ht) expectHtCombineTraffic(afterDispatch, afterCombine, in, rank, c, 2, nodes, nodes.htChunks(moe.channels()), 2L * c.hidden(), "combine");
                    else if (b == Backend.GIN) expectCombineTraffic(afterDispatch, afterCombine, in, rank, c, 2, chunks(moe, world), 2L * c.hidden(), "combine");
                    // returnRowValues: each received row's value names its origin (source, token, k), so every (t, k) must get its own back
                    float[] rowValues = new float[Math.toIntExact(moe.capacityRows())];
                    for (int r = 0; r < exp.rows().size(); r++) { int[] o = exp.origin().get(r); rowValues[r] = rowValue(o[0], o[1], o[3]); }
                    DeviceBuffer rv = RankMain.upload(d, arena, rowValues);
                    moe.returnRowValues(h, rv, s).fill((byte) 0x5a, s);  // the instance's buffer, poisoned before the checked call
                    moe.checkErrors(List.of(s));  // that call's traffic is counted before the snapshot
                    long[][] beforeValues = counters.all(world);
                    DeviceBuffer returned = moe.returnRowValues(h, rv, s);
                    moe.checkErrors(List.of(s));
                    int tokens = in[rank].tokens(), k = c.k();
                    int[] gotValues = tokens == 0 ? new int[0] : returned.readInts(tokens * k, s);
                    for (int t = 0; t < tokens; t++)
                        for (int q = 0; q < k; q++) {
                            int want = in[rank].idx()[t * k + q] >= 0 ? Float.floatToRawIntBits(rowValue(rank, t, q)) : 0;
                            if (gotValues[t * k + q] != want)
                                throw new AssertionError(c.name() + " " + b + ": returnRowValues on rank " + rank + ", token " + t + " k " + q + ": bits 0x"
                                        + Integer.toHexString(gotValues[t * k + q]) + ", expected 0x" + Integer.toHexString(want));
                        }
                    // one call; its rows are [topK] f32, so its traffic is the combine's with 4 x topK bytes a row
                    if (b == Backend.GIN && ht) expectHtCombineTraffic(beforeValues, counters.all(world), in, rank, c, 1, nodes, nodes.htChunks(moe.channels()), 4L * k, "row values");
                    else if (b == Backend.GIN) expectCombineTraffic(beforeValues, counters.all(world), in, rank, c, 1, chunks(moe, world), 4L * k, "row values");
                    // a combine after the row values (the same exchange, back to bf16 rows) is whole again
                    DeviceBuffer yAgain = moe.combine(h, out, s);
                    moe.checkErrors(List.of(s));
                    String offAgain = MoeReference.combineMismatch(in[rank], MemorySegment.ofArray(yAgain.toByteArray()), c.hidden(), c.k(), true);
                    if (offAgain != null) throw new AssertionError(c.name() + " " + b + ": the combine after returnRowValues: y on rank " + rank + " " + offAgain);
                    say(rank, "MoE across nodes, " + c.name() + " " + b + (b == Backend.GIN ? " " + moe.effectiveNetworkMode() : "") + ": " + exp.rows().size()
                            + " rows received, layout, weights, counts, y and row values checked");
                }
            }
        }
    }

    /** The exchange kernel's blocks per peer and role (MoeNetwork: channels / R, within a 256-block grid). */
    static int chunks(MoeAllToAll moe, int world) { return Math.max(1, Math.min(moe.channels() / world, 256 / (2 * world))); }

    /** Counts, every row byte and every weight of the expert-major result against the reference; returns the rows. */
    private static byte[] checkLayout(MoeDispatch h, MoeReference.Input[] in, int rank, int rowBytes, Case c, Backend b) {
        MoeReference.Layout exp = MoeReference.expected(in, rank, rowBytes, c.experts(), c.k());
        int rows = exp.rows().size();
        int[] counts = new int[c.experts() / in.length];
        MemorySegment.copy(MemorySegment.ofArray(h.counts().toByteArray()), ValueLayout.JAVA_INT_UNALIGNED, 0, counts, 0, counts.length);
        if (!Arrays.equals(exp.counts(), counts))
            throw new AssertionError(c.name() + " " + b + ": per-expert counts on rank " + rank + ": expected " + Arrays.toString(exp.counts()) + " got " + Arrays.toString(counts));
        byte[] got = rows == 0 ? new byte[0] : h.rows().slice(0, (long) rows * rowBytes).toByteArray();
        float[] weights = new float[rows];
        if (rows > 0) MemorySegment.copy(MemorySegment.ofArray(h.weights().slice(0, 4L * rows).toByteArray()), ValueLayout.JAVA_FLOAT_UNALIGNED, 0, weights, 0, rows);
        for (int r = 0; r < rows; r++) {
            int[] o = exp.origin().get(r);
            if (!Arrays.equals(exp.rows().get(r), 0, rowBytes, got, r * rowBytes, (r + 1) * rowBytes) || exp.weights().get(r) != weights[r])
                throw new AssertionError(c.name() + " " + b + ": rank " + rank + " row " + r + " (source " + o[0] + " token " + o[1] + " expert " + o[2] + ") or its weight differs");
        }
        return got;
    }

    /** Tokens of {@code src} with at least one expert on rank {@code dst}. */
    static long tokensTo(MoeReference.Input src, int dst, int experts, int k, int world) {
        int l = experts / world;
        long n = 0;
        for (int t = 0; t < src.tokens(); t++) {
            boolean any = false;
            for (int q = 0; q < k; q++) { int e = src.idx()[t * k + q]; any |= e >= 0 && e / l == dst; }
            if (any) n++;
        }
        return n;
    }

    static long align(long v, long a) { return (v + a - 1) / a * a; }

    /**
     * The traffic of one call is read on the sending side: every kernel flushes its puts before it
     * ends, so once this rank's call is done its transport has taken all it sent in the call, and
     * nothing of the next call yet. (The receiving side's counts are not per call: a peer ahead by
     * one call may already have sent into the other parity's sections.) Counters: [q][0..2] = puts,
     * signals and bytes this process sent to rank q.
     */
    private static long[] sent(long[][] before, long[][] after, int q) {
        return new long[] {after[q][0] - before[q][0], after[q][1] - before[q][1], after[q][2] - before[q][2]};
    }

    /**
     * One dispatch's traffic from this rank to each peer q: rows = this rank's tokens going to q x
     * row bytes (once per token, however many of q's experts it picked), metadata = the header + 12K
     * bytes per token; at most two puts and exactly one signal per block (chunk); nothing to itself.
     */
    private static void expectDispatchTraffic(long[][] before, long[][] after, MoeReference.Input[] in, int rank, int rowBytes, Case c, int chunks) {
        int world = in.length;
        long header = align(8 + 4L * (c.experts() / world), 16);
        for (int q = 0; q < world; q++) {
            long[] t = sent(before, after, q);
            long puts = t[0], signals = t[1], bytes = t[2];
            long n = tokensTo(in[rank], q, c.experts(), c.k(), world), rows = n * rowBytes, meta = header + 12L * c.k() * n;
            boolean ok = q == rank ? puts == 0 && signals == 0 && bytes == 0 : bytes == rows + meta && puts <= 2L * chunks && signals == chunks;
            if (!ok) throw new AssertionError(c.name() + ": dispatch rank " + rank + " -> " + q + ": " + puts + " puts, " + signals + " signals, " + bytes
                    + " bytes; expected " + (rows + meta) + " bytes (" + n + " tokens x " + rowBytes + " row bytes + " + meta + " of metadata), at most "
                    + 2 * chunks + " puts and " + chunks + " signals");
            if (q != rank) System.out.printf("rank %d -> %d, %s dispatch: %d puts, %d signals, %d bytes on the network (rows %d = %d tokens x %d, metadata %d)%n",
                    rank, q, c.name(), puts, signals, bytes, rows, n, rowBytes, meta);
        }
    }

    /** {@code calls} combines' traffic from this rank to each peer q: one bf16 partial per token q sent here, at most one put and one signal per block. */
    /** {@code row}: the bytes of a partial row, 2 x hidden for a combine, 4 x topK for returnRowValues ({@code what}). */
    private static void expectCombineTraffic(long[][] before, long[][] after, MoeReference.Input[] in, int rank, Case c, int calls, int chunks, long row, String what) {
        int world = in.length;
        for (int q = 0; q < world; q++) {
            long[] t = sent(before, after, q);
            long puts = t[0], signals = t[1], bytes = t[2];
            long n = tokensTo(in[q], rank, c.experts(), c.k(), world), want = calls * n * row;
            boolean ok = q == rank ? puts == 0 && signals == 0 && bytes == 0 : bytes == want && puts <= (long) calls * chunks && signals == (long) calls * chunks;
            if (!ok) throw new AssertionError(c.name() + ": " + calls + " x " + what + " rank " + rank + " -> " + q + ": " + puts + " puts, " + signals + " signals, "
                    + bytes + " bytes; expected " + want + " (" + n + " partial rows of " + row + " bytes per call)");
            if (q != rank) System.out.printf("rank %d -> %d, %s %s: %d bytes on the network per call (%d partials x %d)%n", rank, q, c.name(), what, bytes / calls, n, row);
        }
    }

    /** Tokens of {@code src} with at least one expert on a rank of node {@code node}. */
    static long tokensToNode(MoeReference.Input src, int node, Nodes nodes, int experts, int k) {
        int l = experts / nodes.world();
        long n = 0;
        for (int t = 0; t < src.tokens(); t++) {
            boolean any = false;
            for (int q = 0; q < k; q++) { int e = src.idx()[t * k + q]; any |= e >= 0 && nodes.nodeOf(e / l) == node; }
            if (any) n++;
        }
        return n;
    }

    /**
     * One high-throughput dispatch's traffic from this rank to each peer q. To a rank q of another
     * node that is this rank's entry there: this rank's node section, (its tokens going to q's node)
     * x row bytes + metadata (header {@code align16(8 + 4GL)} + 12K per token); to the other ranks
     * of other nodes nothing. To a node peer q: this rank's own low-latency section for q, and one
     * forwarded section for each sender s of another node that this rank is the entry for, each
     * (s's tokens going to q) x row bytes + {@code align16(8 + 4L)} + 12K per token. At most two puts
     * and one signal per chunk and section, and one put more per forwarded section (its last chunk
     * puts the header apart when its rows do not start at position 0).
     */
    private static void expectHtDispatchTraffic(long[][] before, long[][] after, MoeReference.Input[] in, int rank, int rowBytes, Case c, Nodes nodes, int chunks) {
        int world = in.length, l = c.experts() / world, mine = nodes.nodeOf(rank);
        long header = align(8 + 4L * l, 16), nodeHeader = align(8 + 4L * nodes.size() * l, 16), between = 0, inside = 0, minimum = 0;
        for (int q = 0; q < world; q++) {
            long[] t = sent(before, after, q);
            long puts = t[0], signals = t[1], bytes = t[2];
            int theirs = nodes.nodeOf(q);
            long want = 0, sections = 0, rows = 0;
            if (q == rank) {
                // nothing to itself
            } else if (theirs != mine) {
                if (nodes.entry(rank, theirs) == q) {
                    long n = tokensToNode(in[rank], theirs, nodes, c.experts(), c.k());
                    want = n * rowBytes + nodeHeader + 12L * c.k() * n;
                    rows = n * rowBytes;
                    sections = 1;
                }
                between += bytes;
            } else {
                long n = tokensTo(in[rank], q, c.experts(), c.k(), world);
                want = n * rowBytes + header + 12L * c.k() * n;
                sections = 1;
                for (int s = 0; s < world; s++) {
                    if (nodes.nodeOf(s) == mine || nodes.entry(s, mine) != rank) continue;
                    long m = tokensTo(in[s], q, c.experts(), c.k(), world);
                    want += m * rowBytes + header + 12L * c.k() * m;
                    sections++;
                }
                inside += bytes;
            }
            // a forwarded section's last chunk may put its header apart: one put more per forwarded section
            long mostPuts = 2L * chunks * sections + (theirs == mine ? Math.max(0, sections - 1) : 0);
            boolean ok = bytes == want && puts <= mostPuts && signals == chunks * sections;
            if (!ok) throw new AssertionError(c.name() + ": HT dispatch rank " + rank + " -> " + q + " (nodes " + mine + " -> " + theirs + "): " + puts + " puts, "
                    + signals + " signals, " + bytes + " bytes; expected " + want + " bytes in " + sections + " section(s), at most " + mostPuts
                    + " puts and " + chunks * sections + " signals");
            minimum += rows;
            if (q != rank && bytes > 0) System.out.printf("rank %d -> %d, %s HT dispatch (%s): %d puts, %d signals, %d bytes%n", rank, q, c.name(),
                    theirs == mine ? "inside the node" : "between nodes", puts, signals, bytes);
        }
        System.out.printf("rank %d, %s HT dispatch: %d bytes sent between nodes (rows %d = once per (token, node)), %d inside the node%n", rank, c.name(), between, minimum, inside);
    }

    /**
     * {@code calls} high-throughput combines' traffic from this rank to each peer q. To a node peer
     * q: this rank's partials for q's own tokens (one bf16 row per token of q that came here), and,
     * for each sender s of another node that q is the entry for, this rank's partials for s (one per
     * token of s that came here). To a rank q of another node whose entry in this node is this rank:
     * one node partial per token of q that went to this node. At most one put and one signal per
     * chunk and section.
     */
    /** As expectCombineTraffic, in the high-throughput mode. */
    private static void expectHtCombineTraffic(long[][] before, long[][] after, MoeReference.Input[] in, int rank, Case c, int calls, Nodes nodes, int chunks,
                                               long row, String what) {
        int world = in.length, mine = nodes.nodeOf(rank);
        for (int q = 0; q < world; q++) {
            long[] t = sent(before, after, q);
            long puts = t[0], signals = t[1], bytes = t[2];
            int theirs = nodes.nodeOf(q);
            long want = 0, sections = 0;
            if (q == rank) {
                // nothing to itself
            } else if (theirs != mine) {
                if (nodes.entry(q, mine) == rank) {
                    want = tokensToNode(in[q], mine, nodes, c.experts(), c.k()) * row;
                    sections = 1;
                }
            } else {
                want = tokensTo(in[q], rank, c.experts(), c.k(), world) * row;
                sections = 1;
                for (int s = 0; s < world; s++) {
                    if (nodes.nodeOf(s) == mine || nodes.entry(s, mine) != q) continue;
                    want += tokensTo(in[s], rank, c.experts(), c.k(), world) * row;
                    sections++;
                }
            }
            want *= calls;
            boolean ok = bytes == want && puts <= (long) calls * chunks * sections && signals == (long) calls * chunks * sections;
            if (!ok) throw new AssertionError(c.name() + ": " + calls + " x HT " + what + " rank " + rank + " -> " + q + ": " + puts + " puts, " + signals + " signals, "
                    + bytes + " bytes; expected " + want + " in " + sections + " section(s) per call");
            if (q != rank && bytes > 0) System.out.printf("rank %d -> %d, %s HT %s: %d bytes per call (%s)%n", rank, q, c.name(), what, bytes / calls,
                    theirs == mine ? "inside the node" : "between nodes");
        }
    }

    /**
     * Staged calls: dispatchSend, other work on the stream, complete; the same for the combine. The
     * results are checked in full after each completion (outputs poisoned before), out-of-order
     * calls are refused without harm, 200 staged pairs back to back and 200 replays of a captured
     * staged pair stay correct. Prints the device time of the sends and the completions against
     * whole calls in the same loop (loopback GIN: no network speed follows from them) and the CPU
     * time of each Java call.
     */
    private static void staged(CommGroup g, int rank, long seed, Arena arena, Device d, NetworkMode mode) {
        int world = g.worldSize();
        Case c = new Case("staged", 1024, 8 * world, 4, 256, fill(world, 200), MoeReference.Routing.SOME_MASKED, false);
        try (Stream s = d.createStream(); Stream other = d.createStream();
             MoeAllToAll moe = MoeAllToAll.create(g, MoeConfig.bf16(c.hidden(), c.experts(), c.k(), c.maxTokens(), Backend.GIN)).networkMode(mode)) {
            int rowBytes = (int) moe.config().dispatchRowBytes();
            TwoInputs two = TwoInputs.upload(c, rank, seed + 11, moe, d, arena, s);
            MoeReference.Input[][] in = two.in();
            DeviceBuffer[][] dev = two.dev();
            DeviceBuffer[] out = two.out();
            DeviceBuffer work = d.allocate(64L << 20, arena);  // stands for compute queued between send and complete
            int tokens = c.tokens()[rank];
            for (int variant = 0; variant < 2; variant++) {
                final int v = variant;
                MoeDispatch h = moe.dispatchSend(0, dev[v][0], dev[v][1], dev[v][2], tokens, s);
                expectRefused(() -> moe.dispatch(0, dev[v][0], dev[v][1], dev[v][2], tokens, s), IllegalStateException.class, "not completed", rank);
                expectRefused(() -> moe.combine(h, out[v], s), IllegalStateException.class, "not completed", rank);
                expectRefused(() -> moe.complete(0, other), IllegalArgumentException.class, "same stream", rank);
                work.fill((byte) v, s);
                moe.complete(0, s);
                expectRefused(() -> moe.complete(0, s), IllegalStateException.class, "without a dispatchSend or combineSend", rank);
                moe.checkErrors(List.of(s));
                checkLayout(h, in[v], rank, rowBytes, c, Backend.GIN);
                h.rows().fill((byte) 0x5a, s);  // the next staged dispatch must write every row again
                h.weights().fill((byte) 0x7f, s);
                h.counts().fill((byte) 0x33, s);
                for (boolean weighted : new boolean[] {true, false}) {
                    MoeDispatch again = moe.dispatchSend(0, dev[v][0], dev[v][1], dev[v][2], tokens, s);
                    moe.complete(0, s);
                    moe.checkErrors(List.of(s));
                    checkLayout(again, in[v], rank, rowBytes, c, Backend.GIN);
                    moe.dispatch(0, dev[v][0], dev[v][1], dev[v][2], tokens, s).rows();  // a whole call between staged ones
                    MoeDispatch last = moe.dispatch(0, dev[v][0], dev[v][1], dev[v][2], tokens, s);
                    DeviceBuffer y = weighted ? moe.combineSend(last, out[v], s) : moe.combineUnweightedSend(last, out[v], s);
                    expectRefused(() -> moe.dispatchSend(0, dev[v][0], dev[v][1], dev[v][2], tokens, s), IllegalStateException.class, "not completed", rank);
                    work.fill((byte) 1, s);
                    moe.complete(0, s);
                    moe.checkErrors(List.of(s));
                    String off = MoeReference.combineMismatch(in[v][rank], MemorySegment.ofArray(y.toByteArray()), c.hidden(), c.k(), weighted);
                    if (off != null) throw new AssertionError("staged " + mode + (weighted ? "" : " unweighted") + " combine: y on rank " + rank + " " + off);
                    y.fill((byte) 0x5a, s);
                }
            }
            say(rank, "staged " + moe.effectiveNetworkMode() + ": single calls checked");
            timeStaged(moe, rank, dev, out, tokens, s);
            MoeDispatch h = null;
            DeviceBuffer y = null;
            for (int i = 0; i < 200; i++) {
                int v = i % 2;
                h = moe.dispatchSend(0, dev[v][0], dev[v][1], dev[v][2], tokens, s);
                moe.complete(0, s);
                y = moe.combineSend(h, out[v], s);
                moe.complete(0, s);
            }
            moe.checkErrors(List.of(s));
            checkLayout(h, in[1], rank, rowBytes, c, Backend.GIN);
            String off = MoeReference.combineMismatch(in[1][rank], MemorySegment.ofArray(y.toByteArray()), c.hidden(), c.k(), true);
            if (off != null) throw new AssertionError("after 200 staged pairs (" + mode + "): y on rank " + rank + " " + off);
            s.synchronize();
            s.beginCapture();
            h = moe.dispatchSend(0, dev[0][0], dev[0][1], dev[0][2], tokens, s);
            work.fill((byte) 2, s);
            moe.complete(0, s);
            y = moe.combineSend(h, out[0], s);
            moe.complete(0, s);
            try (Graph graph = s.endCapture()) {
                h.rows().fill((byte) 0x5a, s);
                y.fill((byte) 0x5a, s);
                for (int i = 0; i < 200; i++) graph.launch(s);
                moe.checkErrors(List.of(s));
            }
            checkLayout(h, in[0], rank, rowBytes, c, Backend.GIN);
            off = MoeReference.combineMismatch(in[0][rank], MemorySegment.ofArray(y.toByteArray()), c.hidden(), c.k(), true);
            if (off != null) throw new AssertionError("after 200 replays of a staged pair (" + mode + "): y on rank " + rank + " " + off);
            say(rank, "MoE across nodes, staged " + moe.effectiveNetworkMode() + ": sends, completions, refusals, 200 pairs and 200 graph replays checked");
        }
    }

    /**
     * Two input variants (seeds {@code seed} and {@code seed + 1}) for calls that alternate: every
     * rank's inputs, this rank's x / topkIdx / topkWeights on the device, and the expert outputs
     * of each variant's reference layout.
     */
    private record TwoInputs(MoeReference.Input[][] in, DeviceBuffer[][] dev, DeviceBuffer[] out) {
        static TwoInputs upload(Case c, int rank, long seed, MoeAllToAll moe, Device d, Arena arena, Stream s) {
            int world = c.tokens().length, rowBytes = (int) moe.config().dispatchRowBytes();
            MoeReference.Input[][] in = {inputs(c, world, seed, d, arena, s), inputs(c, world, seed + 1, d, arena, s)};
            DeviceBuffer[][] dev = new DeviceBuffer[2][];
            DeviceBuffer[] out = new DeviceBuffer[2];
            for (int v = 0; v < 2; v++) {
                dev[v] = new DeviceBuffer[] {RankMain.upload(d, arena, in[v][rank].x()), RankMain.upload(d, arena, in[v][rank].idx()), RankMain.upload(d, arena, in[v][rank].w())};
                MoeReference.Layout exp = MoeReference.expected(in[v], rank, rowBytes, c.experts(), c.k());
                out[v] = RankMain.upload(d, arena, MoeReference.expertOut(in[v], exp, c.hidden(), moe.capacityRows()));
            }
            return new TwoInputs(in, dev, out);
        }
    }

    private static void expectRefused(Runnable call, Class<? extends RuntimeException> type, String says, int rank) {
        try {
            call.run();
        } catch (RuntimeException e) {
            if (type.isInstance(e) && e.getMessage() != null && e.getMessage().contains(says)) return;
            throw new AssertionError("rank " + rank + ": expected " + type.getSimpleName() + " saying '" + says + "', got " + e, e);
        }
        throw new AssertionError("rank " + rank + ": expected " + type.getSimpleName() + " saying '" + says + "', but the call was accepted");
    }

    /**
     * Device time (events, median of 50) of a whole dispatch and combine against the send and the
     * complete of staged ones, in the same loop, and the CPU time of each Java call (thread CPU
     * time, mean). The send of a kernel that puts ends once the transport has read its bytes.
     */
    private static void timeStaged(MoeAllToAll moe, int rank, DeviceBuffer[][] dev, DeviceBuffer[] out, int tokens, Stream s) {
        Device d = s.device();
        int n = 50;
        double[][] t = new double[6][n];  // whole dispatch, whole combine, dispatch send, dispatch complete, combine send, combine complete
        double[] cpu = new double[6];
        try (dev.gin4j.gpu.Event e0 = d.createEvent(true); dev.gin4j.gpu.Event e1 = d.createEvent(true); dev.gin4j.gpu.Event e2 = d.createEvent(true)) {
            Steps steps = new Steps(s, e0, e1, e2, t, cpu);
            MoeDispatch[] h = new MoeDispatch[1];
            for (int i = 0; i < n; i++) {
                int v = i % 2;
                steps.time(i, 0, () -> h[0] = moe.dispatch(0, dev[v][0], dev[v][1], dev[v][2], tokens, s), () -> moe.combine(h[0], out[v], s));
                steps.time(i, 2, () -> h[0] = moe.dispatchSend(0, dev[v][0], dev[v][1], dev[v][2], tokens, s), () -> moe.complete(0, s));
                steps.time(i, 4, () -> moe.combineSend(h[0], out[v], s), () -> moe.complete(0, s));
            }
        }
        moe.checkErrors(List.of(s));
        double[] med = new double[6];
        for (int k = 0; k < 6; k++) { Arrays.sort(t[k]); med[k] = t[k][n / 2]; }
        System.out.printf("rank %d staged %s, device us (median of %d): dispatch %.1f = send %.1f + complete %.1f; combine %.1f = send %.1f + complete %.1f. "
                        + "CPU us per Java call: dispatch %.1f, combine %.1f, dispatchSend %.1f, complete %.1f, combineSend %.1f, complete %.1f%n",
                rank, moe.effectiveNetworkMode(), n, med[0], med[2], med[3], med[1], med[4], med[5],
                cpu[0] / n, cpu[1] / n, cpu[2] / n, cpu[3] / n, cpu[4] / n, cpu[5] / n);
    }

    /** Two Java calls queued on one stream, timed: events around each, and each call's thread CPU time. */
    private record Steps(Stream s, dev.gin4j.gpu.Event e0, dev.gin4j.gpu.Event e1, dev.gin4j.gpu.Event e2, double[][] t, double[] cpu) {
        private static final java.lang.management.ThreadMXBean MX = java.lang.management.ManagementFactory.getThreadMXBean();

        /** Sample i: first into t[k] / cpu[k], second into t[k + 1] / cpu[k + 1] (device µs, CPU µs summed). */
        void time(int i, int k, Runnable first, Runnable second) {
            e0.record(s);
            long c0 = MX.getCurrentThreadCpuTime();
            first.run();
            long c1 = MX.getCurrentThreadCpuTime();
            e1.record(s);
            second.run();
            long c2 = MX.getCurrentThreadCpuTime();
            e2.record(s);
            e2.synchronize();
            t[k][i] = e1.elapsedMillisSince(e0) * 1e3;
            t[k + 1][i] = e2.elapsedMillisSince(e1) * 1e3;
            cpu[k] += (c1 - c0) / 1e3;
            cpu[k + 1] += (c2 - c1) / 1e3;
        }
    }

    /** The small case both repeated phases run (every rank sends and receives). */
    private static Case repeatedCase(int world) {
        return new Case("repeated", 256, 4 * world, 2, 32, fill(world, 32), MoeReference.Routing.SOME_MASKED, false);
    }

    /**
     * 1,000 dispatch + combine pairs back to back, inputs alternating between two routings (and,
     * with {@code alternate}, the mode changing every third pair): the last results checked in full.
     */
    private static void backToBack(CommGroup g, int rank, long seed, Arena arena, Device d, NetworkMode mode, List<NetworkMode> alternate) {
        Case c = repeatedCase(g.worldSize());
        String what = alternate == null ? mode.toString() : "alternating " + alternate;
        try (Stream s = d.createStream(); MoeAllToAll moe = MoeAllToAll.create(g, MoeConfig.bf16(c.hidden(), c.experts(), c.k(), c.maxTokens(), Backend.GIN)).networkMode(mode)) {
            int rowBytes = (int) moe.config().dispatchRowBytes();
            TwoInputs two = TwoInputs.upload(c, rank, seed + 1, moe, d, arena, s);
            DeviceBuffer[][] dev = two.dev();
            DeviceBuffer[] out = two.out();
            say(rank, "back-to-back pairs: created");
            long start = System.nanoTime();
            MoeDispatch h = null;
            DeviceBuffer y = null;
            for (int i = 0; i < 1000; i++) {
                int v = i % 2;
                // alternating: the mode changes every third pair, so both parities meet both modes
                if (alternate != null) moe.networkMode(alternate.get((i / 3) % alternate.size()));
                h = moe.dispatch(0, dev[v][0], dev[v][1], dev[v][2], c.tokens()[rank], s);
                y = moe.combine(h, out[v], s);
            }
            moe.checkErrors(List.of(s));
            System.out.printf("rank %d: 1000 back-to-back MoE dispatch + combine pairs across nodes (%s): %.1f us per pair%n", rank, what, (System.nanoTime() - start) / 1e3 / 1000);
            checkLayout(h, two.in()[1], rank, rowBytes, c, Backend.GIN);
            String off = MoeReference.combineMismatch(two.in()[1][rank], MemorySegment.ofArray(y.toByteArray()), c.hidden(), c.k(), true);
            if (off != null) throw new AssertionError("after 1000 back-to-back pairs (" + what + "): y on rank " + rank + " " + off);
        }
    }

    /**
     * One dispatch + combine pair captured into a graph and replayed 1,000 times, its outputs
     * poisoned before the replays: the last results checked in full.
     */
    private static void replays(CommGroup g, int rank, long seed, Arena arena, Device d, NetworkMode mode) {
        Case c = repeatedCase(g.worldSize());
        try (Stream s = d.createStream(); MoeAllToAll moe = MoeAllToAll.create(g, MoeConfig.bf16(c.hidden(), c.experts(), c.k(), c.maxTokens(), Backend.GIN)).networkMode(mode)) {
            int rowBytes = (int) moe.config().dispatchRowBytes();
            TwoInputs two = TwoInputs.upload(c, rank, seed + 1, moe, d, arena, s);
            DeviceBuffer[][] dev = two.dev();
            say(rank, "graph replays: created");
            // one pair of the other routing first: the capture is not the instance's first use
            moe.combine(moe.dispatch(0, dev[1][0], dev[1][1], dev[1][2], c.tokens()[rank], s), two.out()[1], s);
            moe.checkErrors(List.of(s));
            s.beginCapture();
            MoeDispatch h = moe.dispatch(0, dev[0][0], dev[0][1], dev[0][2], c.tokens()[rank], s);
            DeviceBuffer y = moe.combine(h, two.out()[0], s);
            try (Graph graph = s.endCapture()) {
                h.rows().fill((byte) 0x5a, s);
                y.fill((byte) 0x5a, s);
                long start = System.nanoTime();
                for (int i = 0; i < 1000; i++) graph.launch(s);
                moe.checkErrors(List.of(s));
                System.out.printf("rank %d: a captured MoE dispatch + combine across nodes (%s) replayed 1000 times: %.1f us per replay%n", rank, mode, (System.nanoTime() - start) / 1e3 / 1000);
            }
            checkLayout(h, two.in()[0], rank, rowBytes, c, Backend.GIN);
            String off = MoeReference.combineMismatch(two.in()[0][rank], MemorySegment.ofArray(y.toByteArray()), c.hidden(), c.k(), true);
            if (off != null) throw new AssertionError("after 1000 graph replays (" + mode + "): y on rank " + rank + " " + off);
        }
    }
}
