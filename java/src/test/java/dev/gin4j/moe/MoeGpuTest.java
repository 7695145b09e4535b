package dev.gin4j.moe;

import dev.gin4j.internal.moe.ShapedEntries;
import dev.gin4j.comm.Backend;
import dev.gin4j.comm.Bf16;
import dev.gin4j.comm.DType;
import dev.gin4j.comm.CommException;
import dev.gin4j.comm.CommGroup;
import dev.gin4j.comm.Nccl;
import dev.gin4j.gpu.Device;
import dev.gin4j.gpu.DeviceBuffer;
import dev.gin4j.gpu.GpuRuntime;
import dev.gin4j.gpu.Graph;
import dev.gin4j.gpu.NativeResource;
import dev.gin4j.gpu.Stream;
import dev.gin4j.testing.Gpus;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestInstance;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.SplittableRandom;

import dev.gin4j.moe.MoeReference.Input;
import dev.gin4j.moe.MoeReference.Layout;
import dev.gin4j.moe.MoeReference.Routing;

import static org.junit.jupiter.api.Assertions.*;

/**
 * MoE dispatch/combine, GIN and HOST, against a CPU reference; one process driving every GPU. With
 * one GPU it runs as one rank (every expert local): the API, layouts, both row types and GIN ==
 * HOST are checked, nothing crosses a link; with two or more, every exchange crosses NVLink too.
 */
@Tag("gpu")
@TestInstance(TestInstance.Lifecycle.PER_CLASS)
class MoeGpuTest {
    private final SplittableRandom random = new SplittableRandom();
    private CommGroup group;
    private List<Device> devs;
    private List<Stream> streams;
    private List<Fp8Rows> quantizers;
    private int n;

    @BeforeAll void setUp() {
        GpuRuntime rt = Gpus.runtimeWithDevices(1);
        Gpus.skipUnless(Nccl.isAvailable(), "no NCCL/RCCL: " + Nccl.describe());
        Gpus.requireKernels(rt, "moe_gin");
        Gpus.requireKernels(rt, "moe_host");
        devs = rt.devices();
        n = devs.size();
        group = CommGroup.initAll(devs);
        streams = new ArrayList<>();
        quantizers = new ArrayList<>();
        for (Device d : devs) {
            streams.add(d.createStream());
            quantizers.add(new Fp8Rows(d));
        }
    }

    @AfterAll void tearDown() {
        if (quantizers != null) quantizers.forEach(Fp8Rows::close);
        if (streams != null) streams.forEach(Stream::close);
        if (group != null) group.close();
    }

    static short bf16(float f) { return Bf16.fromFloat(f); }

    static float f32(short b) { return Bf16.toFloat(b); }

    Input input(int rank, int tokens, int hidden, int experts, int k, Routing routing) {
        return MoeReference.input(random, rank, n, tokens, hidden, experts, k, routing);
    }

    /**
     * The same inputs as scaled fp8 rows, quantized on rank's GPU (Fp8Rows); values = what the rows
     * decode to; x: the fp8 rows, or with fromBf16 the bf16 rows (the dispatch quantizes them).
     */
    Input fp8(int rank, Input bf, int hidden, boolean fromBf16) {
        long rb = Fp8Rows.rowBytes(hidden);
        byte[] rows;
        try (Arena a = Arena.ofShared()) {
            DeviceBuffer x = upload(devs.get(rank), a, MemorySegment.ofArray(bf.rows()));
            DeviceBuffer out = quantizers.get(rank).quantize(x, bf.tokens(), hidden, a, streams.get(rank));
            quantizers.get(rank).checkErrors(streams.get(rank));
            rows = out.slice(0, bf.tokens() * rb).toByteArray();
        }
        float[] values = Fp8RowsGpuTest.decode(rows, bf.tokens(), hidden, devs.get(rank).arch().startsWith("gfx"));
        return new Input(bf.tokens(), rows, values, bf.idx(), bf.w(), fromBf16 ? bf.rows() : rows);
    }

    /** A received row's value for returnRowValues, from its origin (source, token, -, k): exact in f32 for these tests' sizes. */
    private static float rowValue(int[] origin, int k) {
        long v = 1 + ((long) origin[0] * 100_000 + origin[1]) * k + origin[3];
        if (v >= 1 << 24) throw new IllegalStateException("row value " + v + " is not exact in f32");
        return v;
    }

    private DeviceBuffer upload(Device d, Arena a, MemorySegment host) {
        DeviceBuffer b = d.allocate(Math.max(host.byteSize(), 16), a);
        if (host.byteSize() > 0) b.slice(0, host.byteSize()).copyFromHost(host);
        return b;
    }

    /** Per rank: x, topkIdx and topkWeights of 8 tokens of hidden 64 over 8 experts (top-2), uploaded into {@code a}. */
    private record SmallInputs(List<DeviceBuffer> xs, List<DeviceBuffer> ids, List<DeviceBuffer> ws) { }

    private SmallInputs smallInputs(Arena a) {
        List<DeviceBuffer> xs = new ArrayList<>(), ids = new ArrayList<>(), ws = new ArrayList<>();
        for (int i = 0; i < n; i++) {
            Input in = input(i, 8, 64, experts(8), 2, Routing.UNIFORM);
            xs.add(upload(devs.get(i), a, MemorySegment.ofArray(in.rows())));
            ids.add(upload(devs.get(i), a, MemorySegment.ofArray(in.idx())));
            ws.add(upload(devs.get(i), a, MemorySegment.ofArray(in.w())));
        }
        return new SmallInputs(xs, ids, ws);
    }

    /**
     * Runs dispatch + fake experts + combine (weighted: {@code combine}, else {@code combineUnweighted})
     * on one backend and checks everything; returns each rank's received bytes.
     */
    private byte[][] roundTrip(MoeAllToAll moe, Input[] in, int hidden, int experts, int k, String what, boolean weighted) {
        int rowBytes = (int) moe.config().dispatchRowBytes();
        try (Arena a = Arena.ofShared()) {
            List<DeviceBuffer> xs = new ArrayList<>(), ids = new ArrayList<>(), ws = new ArrayList<>();
            int[] tokens = new int[n];
            for (int i = 0; i < n; i++) {
                xs.add(upload(devs.get(i), a, MemorySegment.ofArray(in[i].x())));
                ids.add(upload(devs.get(i), a, MemorySegment.ofArray(in[i].idx())));
                ws.add(upload(devs.get(i), a, MemorySegment.ofArray(in[i].w())));
                tokens[i] = in[i].tokens();
            }
            List<MoeDispatch> handles = moe.dispatch(xs, ids, ws, tokens, streams);
            // once the dispatch is queued the caller may reuse its routing buffers (the next layer's
            // routing, say): combine and returnRowValues must not read them again
            for (int i = 0; i < n; i++) {
                ids.get(i).fill((byte) 0xff, streams.get(i));
                ws.get(i).fill((byte) 0xff, streams.get(i));
            }
            moe.checkErrors(streams);
            byte[][] received = new byte[n][];
            List<DeviceBuffer> outs = new ArrayList<>(), rowValues = new ArrayList<>();
            for (int d = 0; d < n; d++) {
                Layout exp = MoeReference.expected(in, d, rowBytes, experts, k);
                MoeDispatch h = handles.get(d);
                int[] counts = new int[moe.localExperts()];
                MemorySegment.copy(MemorySegment.ofArray(h.counts().toByteArray()), ValueLayout.JAVA_INT_UNALIGNED, 0, counts, 0, counts.length);
                assertArrayEquals(exp.counts(), counts, what + ": per-expert counts on rank " + d);
                int rows = exp.rows().size();
                byte[] got = h.rows().slice(0, (long) rows * rowBytes).toByteArray();
                received[d] = got;
                float[] gw = new float[rows];
                MemorySegment.copy(MemorySegment.ofArray(h.weights().slice(0, 4L * rows).toByteArray()), ValueLayout.JAVA_FLOAT_UNALIGNED, 0, gw, 0, rows);
                for (int r = 0; r < rows; r++) {
                    byte[] want = exp.rows().get(r);
                    int[] o = exp.origin().get(r);
                    int mismatch = Arrays.mismatch(want, 0, rowBytes, got, r * rowBytes, (r + 1) * rowBytes);
                    if (mismatch >= 0) fail(what + ": rank " + d + " row " + r + " (source " + o[0] + " token " + o[1] + " expert " + o[2]
                            + ") byte " + mismatch + ": expected " + want[mismatch] + " got " + got[r * rowBytes + mismatch]);
                    assertEquals(exp.weights().get(r), gw[r], what + ": weight of row " + r + " on rank " + d);
                }
                outs.add(upload(devs.get(d), a, MemorySegment.ofArray(MoeReference.expertOut(in, exp, hidden, moe.capacityRows()))));
                float[] values = new float[(int) moe.capacityRows()];
                for (int r = 0; r < rows; r++) values[r] = rowValue(exp.origin().get(r), k);
                rowValues.add(upload(devs.get(d), a, MemorySegment.ofArray(values)));
            }
            List<DeviceBuffer> ys = weighted ? moe.combine(handles, outs, streams) : moe.combineUnweighted(handles, outs, streams);
            moe.checkErrors(streams);
            for (int s = 0; s < n; s++) {
                String off = MoeReference.combineMismatch(in[s], MemorySegment.ofArray(ys.get(s).toByteArray()), hidden, k, weighted);
                if (off != null) fail(what + (weighted ? "" : " (unweighted)") + ": y on rank " + s + " " + off);
            }
            // each row's value back to its (token, k): the value names them, masked slots get 0
            List<DeviceBuffer> back = moe.returnRowValues(handles, rowValues, streams);
            moe.checkErrors(streams);
            for (int s = 0; s < n; s++) {
                float[] g = new float[in[s].tokens() * k];
                MemorySegment.copy(MemorySegment.ofArray(back.get(s).toByteArray()), ValueLayout.JAVA_FLOAT_UNALIGNED, 0, g, 0, g.length);
                for (int t = 0; t < in[s].tokens(); t++)
                    for (int q = 0; q < k; q++) {
                        float want = in[s].idx()[t * k + q] < 0 ? 0f : rowValue(new int[] {s, t, -1, q}, k);
                        if (g[t * k + q] != want) fail(what + ": returnRowValues on rank " + s + " token " + t + " k " + q + ": expected " + want + " got " + g[t * k + q]);
                    }
            }
            // poison everything this call produced: the next call on the instance must overwrite it all
            for (int i = 0; i < n; i++) {
                handles.get(i).rows().fill((byte) 0xff, streams.get(i));
                handles.get(i).weights().fill((byte) 0xff, streams.get(i));
                handles.get(i).counts().fill((byte) 0xff, streams.get(i));
                ys.get(i).fill((byte) 0xff, streams.get(i));
                back.get(i).fill((byte) 0xff, streams.get(i));
                streams.get(i).synchronize();
            }
            return received;
        }
    }

    /** Token counts for every rank: {@code first} on rank 0, {@code others} on the rest (the tests run on any number of GPUs). */
    private int[] tokens(int first, int others) {
        int[] t = new int[n];
        Arrays.fill(t, others);
        t[0] = first;
        return t;
    }

    /** {@code experts} rounded up to a multiple of the rank count, so they split evenly over any number of GPUs. */
    private int experts(int experts) {
        return (experts + n - 1) / n * n;
    }

    /** What the dispatch moves and what it is handed. */
    enum Rows { BF16, FP8, FP8_FROM_BF16 }

    private void both(int hidden, int experts, int k, int maxTokens, int[] tokens, Routing routing) {
        both(hidden, experts, k, maxTokens, tokens, routing, Rows.BF16);
    }

    private Input[] inputs(int[] tokens, int hidden, int experts, int k, Routing routing, Rows rows) {
        Input[] in = new Input[n];
        for (int i = 0; i < n; i++) {
            in[i] = input(i, tokens[i], hidden, experts, k, routing);
            if (rows != Rows.BF16) in[i] = fp8(i, in[i], hidden, rows == Rows.FP8_FROM_BF16);
        }
        return in;
    }

    private void both(int hidden, int experts, int k, int maxTokens, int[] tokens, Routing routing, Rows rows) {
        both(hidden, experts, k, maxTokens, tokens, routing, rows, 0);
    }

    /** channels: MoeConfig's (0 = from the GPUs). */
    private void both(int hidden, int experts, int k, int maxTokens, int[] tokens, Routing routing, Rows rows, int channels) {
        Input[] in = inputs(tokens, hidden, experts, k, routing, rows);
        String shape = rows + " H=" + hidden + " E=" + experts + " K=" + k + " T=" + Arrays.toString(tokens) + " " + routing + " channels " + channels;
        DType dtype = rows == Rows.BF16 ? DType.BF16 : DType.FP8_E4M3, input = rows == Rows.FP8 ? DType.FP8_E4M3 : DType.BF16;
        try (MoeAllToAll gin = MoeAllToAll.create(group, new MoeConfig(hidden, experts, k, maxTokens, dtype, Backend.GIN, input, channels));
             MoeAllToAll host = MoeAllToAll.create(group, new MoeConfig(hidden, experts, k, maxTokens, dtype, Backend.HOST, input, channels))) {
            if (channels > 0) assertEquals(channels, gin.channels());
            byte[][] g = roundTrip(gin, in, hidden, experts, k, "GIN " + shape, true);
            byte[][] h = roundTrip(host, in, hidden, experts, k, "HOST " + shape, true);
            for (int d = 0; d < n; d++) assertArrayEquals(h[d], g[d], "GIN and HOST layouts differ on rank " + d + ", " + shape);
            // a second round on the same instances with fresh routing: flags and workspaces reset
            // correctly; its combine without the router weights (the backward of dispatch)
            in = inputs(tokens, hidden, experts, k, routing, rows);
            roundTrip(gin, in, hidden, experts, k, "GIN (second call) " + shape, false);
            roundTrip(host, in, hidden, experts, k, "HOST (second call) " + shape, false);
        }
    }

    @Test void deepSeekShapeSmall() {
        both(7168, experts(256), 8, 128, tokens(128, 97), Routing.UNIFORM);
        // DeepSeek-V3 has token-path entry points of its own at 1, 2, 4 and 8 ranks (gin-kernels/moe_shapes.list: the shape as constants)
        try (MoeAllToAll gin = MoeAllToAll.create(group, MoeConfig.bf16(7168, experts(256), 8, 128, Backend.GIN))) {
            // listed at 1, 2, 4 and 8 ranks; other rank counts compiled for the shape where NVRTC is there
            boolean shaped = List.of(1, 2, 4, 8).contains(n) || gin.entrySource() == ShapedEntries.Source.JIT;
            String want = shaped ? "moe_gin_dispatch_tp_r" + n + "_e256_k8_h7168" : n == 1 ? "moe_gin_dispatch_tp_r1" : "moe_gin_dispatch_tp";
            assertEquals(want, gin.dispatchKernelName());
            // one rank: the one-rank combine beside the shaped dispatch, unless GIN4J_MOE_ENTRIES says otherwise
            if (n == 1 && ShapedEntries.mode() == ShapedEntries.Mode.AUTO) assertEquals("moe_gin_combine_tp_r1", gin.combineKernelName());
            else if (shaped) assertEquals("moe_gin_combine_tp_r" + n + "_e256_k8_h7168", gin.combineKernelName());
        }
    }
    @Test void fewChannelsLeaveSmsToCompute() {
        // 4 channels (8 SMs): 32 tokens per channel, still the token path; 2 channels: the layout path
        both(7168, experts(256), 8, 128, tokens(128, 97), Routing.UNIFORM, Rows.BF16, 4);
        both(2048, experts(128), 8, 128, tokens(128, 128), Routing.SOME_MASKED, Rows.BF16, 2);
        try (MoeAllToAll gin = MoeAllToAll.create(group, MoeConfig.bf16(7168, experts(256), 8, 128, Backend.GIN).withChannels(2))) {
            assertEquals(2, gin.channels());
            assertEquals("moe_gin_dispatch", gin.dispatchKernelName(), "64 tokens per channel: the layout path");
        }
    }
    @Test void layoutPath() {
        // maxTokens x topK above 4096: the layout path, through the generic entry point
        both(256, experts(16), 8, 600, tokens(600, 321), Routing.UNIFORM);
        try (MoeAllToAll gin = MoeAllToAll.create(group, MoeConfig.bf16(256, experts(16), 8, 600, Backend.GIN))) {
            assertEquals("moe_gin_dispatch", gin.dispatchKernelName());
        }
    }
    @Test void oddHiddenSizes() {
        both(2050, experts(8), 2, 64, tokens(64, 40), Routing.UNIFORM);
        both(7, experts(16), 4, 33, tokens(33, 1), Routing.SOME_MASKED);
    }
    @Test void edgeCases() {
        both(256, experts(8), 2, 16, tokens(0, 0), Routing.UNIFORM);
        both(256, experts(8), 2, 16, tokens(1, 0), Routing.UNIFORM);
        both(256, experts(8), 2, 16, tokens(16, 16), Routing.ONE_EXPERT);
        both(256, experts(8), 2, 16, tokens(16, 5), Routing.NOTHING_TO_LAST_RANK);
        both(256, experts(8), 2, 16, tokens(16, 16), Routing.ALL_MASKED);
        both(384, experts(8), 1, 32, tokens(32, 31), Routing.UNIFORM);
    }

    @Test void fp8Rows() {
        // token path: DeepSeek-V3's own fp8 entry at 1, 2, 4 and 8 ranks; layout path: the generic fp8 entry
        both(7168, experts(256), 8, 128, tokens(128, 97), Routing.UNIFORM, Rows.FP8);
        both(272, experts(16), 8, 600, tokens(600, 321), Routing.SOME_MASKED, Rows.FP8);
        both(16, experts(8), 2, 16, tokens(0, 16), Routing.UNIFORM, Rows.FP8);
        try (MoeAllToAll tp = MoeAllToAll.create(group, MoeConfig.fp8(7168, experts(256), 8, 128, Backend.GIN));
             MoeAllToAll layout = MoeAllToAll.create(group, MoeConfig.fp8(272, experts(16), 8, 600, Backend.GIN))) {
            boolean shaped = List.of(1, 2, 4, 8).contains(n) || tp.entrySource() == ShapedEntries.Source.JIT;
            String want = shaped ? "moe_gin_dispatch_fp8_tp_r" + n + "_e256_k8_h7168" : n == 1 ? "moe_gin_dispatch_fp8_tp_r1" : "moe_gin_dispatch_fp8_tp";
            assertEquals(want, tp.dispatchKernelName());
            assertEquals("moe_gin_dispatch_fp8", layout.dispatchKernelName());
        }
        IllegalArgumentException odd = assertThrows(IllegalArgumentException.class, () -> MoeConfig.fp8(200, 8, 2, 16, Backend.GIN));
        assertTrue(odd.getMessage().contains("multiple of 16"), odd.getMessage());
    }

    @Test void fp8FromBf16() {
        // bf16 x, quantized by the dispatch (token path: its senders; layout path: its senders and
        // receivers; HOST: moe_fp8_quantize before its pack): the rows must be Fp8Rows.quantize's,
        // byte for byte
        both(7168, experts(256), 8, 128, tokens(128, 97), Routing.UNIFORM, Rows.FP8_FROM_BF16);
        both(272, experts(16), 8, 600, tokens(600, 321), Routing.SOME_MASKED, Rows.FP8_FROM_BF16);
        both(16, experts(8), 2, 16, tokens(0, 16), Routing.UNIFORM, Rows.FP8_FROM_BF16);
        try (Arena a = Arena.ofShared(); MoeAllToAll gin = MoeAllToAll.create(group, MoeConfig.fp8FromBf16(256, experts(8), 2, 16, Backend.GIN))) {
            assertTrue(gin.config().quantizes());
            assertEquals(512, gin.config().inputRowBytes());
            DeviceBuffer x = devs.get(0).allocate(16 * 512 + 16, a), ids = devs.get(0).allocate(16 * 8, a);
            IllegalArgumentException small = assertThrows(IllegalArgumentException.class,
                    () -> gin.dispatch(0, x.slice(0, 15 * 512), ids, ids, 16, streams.get(0)));
            assertTrue(small.getMessage().contains("[16][256] bf16"), small.getMessage());
            IllegalArgumentException unaligned = assertThrows(IllegalArgumentException.class,
                    () -> gin.dispatch(0, x.slice(8, 16 * 512), ids, ids, 16, streams.get(0)));
            assertTrue(unaligned.getMessage().contains("16-byte aligned"), unaligned.getMessage());
        }
        IllegalArgumentException bf16From = assertThrows(IllegalArgumentException.class,
                () -> new MoeConfig(256, 8, 2, 16, DType.BF16, Backend.GIN, DType.FP8_E4M3));
        assertTrue(bf16From.getMessage().contains("dispatch input"), bf16From.getMessage());
    }

    /**
     * A training step's exchanges captured in one graph per GPU (dispatch; combine with the received
     * rows as identity experts; returnRowValues of the received weights), then replayed with fresh
     * inputs copied into the captured buffers before each replay: the kernels' call counters advance
     * on the device alone. Every replay's y and row values are checked in full, poisoned before it.
     */
    @Test void graphReplaysStayCorrect() {
        int hidden = 256, experts = experts(8), k = 4, tokens = 48;
        try (Arena a = Arena.ofShared(); MoeAllToAll gin = MoeAllToAll.create(group, MoeConfig.bf16(hidden, experts, k, 64, Backend.GIN))) {
            List<DeviceBuffer> xs = new ArrayList<>(), ids = new ArrayList<>(), ws = new ArrayList<>(), ys = new ArrayList<>(), gs = new ArrayList<>();
            List<Graph> graphs = new ArrayList<>();
            try {
                // one GPU at a time: CUDA instantiates no graph while another stream of the thread captures
                for (int i = 0; i < n; i++) {
                    xs.add(devs.get(i).allocate(2L * tokens * hidden, a));
                    ids.add(devs.get(i).allocate(4L * tokens * k, a));
                    ws.add(devs.get(i).allocate(4L * tokens * k, a));
                    Stream s = streams.get(i);
                    s.beginCapture();
                    MoeDispatch h = gin.dispatch(i, xs.get(i), ids.get(i), ws.get(i), tokens, s);
                    ys.add(gin.combine(h, h.rows(), s));
                    gs.add(gin.returnRowValues(h, h.weights(), s));
                    graphs.add(s.endCapture());
                }
                for (int replay = 0; replay < 4; replay++) {
                    Input[] in = inputs(tokens(tokens, tokens), hidden, experts, k, Routing.SOME_MASKED, Rows.BF16);
                    for (int i = 0; i < n; i++) {
                        xs.get(i).copyFromHost(MemorySegment.ofArray(in[i].x()));
                        ids.get(i).copyFromHost(MemorySegment.ofArray(in[i].idx()));
                        ws.get(i).copyFromHost(MemorySegment.ofArray(in[i].w()));
                        ys.get(i).fill((byte) 0xff, streams.get(i));
                        gs.get(i).fill((byte) 0xff, streams.get(i));
                    }
                    for (int i = 0; i < n; i++) graphs.get(i).launch(streams.get(i));
                    gin.checkErrors(streams);
                    for (int s = 0; s < n; s++) {
                        MemorySegment y = MemorySegment.ofArray(ys.get(s).toByteArray());
                        float[] g = new float[tokens * k];
                        MemorySegment.copy(MemorySegment.ofArray(gs.get(s).toByteArray()), ValueLayout.JAVA_FLOAT_UNALIGNED, 0, g, 0, g.length);
                        for (int t = 0; t < tokens; t++) {
                            double wsum = 0;
                            for (int q = 0; q < k; q++) {
                                boolean masked = in[s].idx()[t * k + q] < 0;
                                float want = masked ? 0f : in[s].w()[t * k + q];
                                if (g[t * k + q] != want) fail("replay " + replay + ": returnRowValues on rank " + s + " token " + t + " k " + q + ": expected " + want + " got " + g[t * k + q]);
                                if (!masked) wsum += in[s].w()[t * k + q];
                            }
                            for (int h2 = 0; h2 < hidden; h2++) {
                                double x = in[s].values()[t * hidden + h2], ref = wsum * x;
                                float v = f32(y.getAtIndex(ValueLayout.JAVA_SHORT_UNALIGNED, (long) t * hidden + h2));
                                if (!(Math.abs(v - ref) <= 0.016 * Math.abs(ref) + 1e-6))  // as roundTrip: bf16 partials, then y
                                    fail("replay " + replay + ": y on rank " + s + " token " + t + " element " + h2 + ": expected " + ref + " got " + v);
                            }
                        }
                    }
                }
                gin.close();  // the graphs hold its window's and buffers' addresses
                for (int i = 0; i < n; i++) {
                    int gi = i;
                    IllegalStateException e = assertThrows(IllegalStateException.class, () -> graphs.get(gi).launch(streams.get(gi)));
                    assertTrue(e.getMessage().contains("MoeAllToAll") && e.getMessage().contains("was closed"), e.getMessage());
                }
            } finally {
                graphs.forEach(Graph::close);
            }
        }
    }

    @Test void combineNeedsTheLatestHandle() {
        try (Arena a = Arena.ofShared(); MoeAllToAll gin = MoeAllToAll.create(group, MoeConfig.bf16(64, experts(8), 2, 8, Backend.GIN))) {
            SmallInputs in = smallInputs(a);
            List<DeviceBuffer> xs = in.xs(), ids = in.ids(), ws = in.ws(), outs = new ArrayList<>();
            for (int i = 0; i < n; i++) outs.add(devs.get(i).allocate(gin.capacityRows() * 128, a));
            List<MoeDispatch> first = gin.dispatch(xs, ids, ws, tokens(8, 8), streams);
            List<MoeDispatch> second = gin.dispatch(xs, ids, ws, tokens(8, 8), streams);
            IllegalStateException stale = assertThrows(IllegalStateException.class, () -> gin.combine(first, outs, streams));
            assertTrue(stale.getMessage().contains("last dispatch"), stale.getMessage());
            List<DeviceBuffer> values = second.stream().map(MoeDispatch::weights).toList();
            IllegalStateException staleValues = assertThrows(IllegalStateException.class, () -> gin.returnRowValues(first, values, streams));
            assertTrue(staleValues.getMessage().contains("last dispatch"), staleValues.getMessage());
            // Refused on the last rank only: nothing may have been launched for the others (their
            // collective kernels would wait for it until their time-out, which checkErrors reports).
            List<DeviceBuffer> shortValues = new ArrayList<>(values);
            shortValues.set(n - 1, devs.get(n - 1).allocate(16, a));
            IllegalArgumentException small = assertThrows(IllegalArgumentException.class, () -> gin.returnRowValues(second, shortValues, streams));
            assertTrue(small.getMessage().contains("capacity rows"), small.getMessage());
            // a GIN combine takes an expertOut of the received rows (the kernel checks it: MoeOutputsGpuTest), so a short one is no refusal here
            gin.combine(second, outs, streams);
            gin.returnRowValues(second, values, streams);
            gin.checkErrors(streams);
        }
    }

    /** HOST takes its row counts from the host at each dispatch: a capture is refused before anything is queued. */
    @Test void hostCallsRefuseGraphCapture() {
        try (Arena a = Arena.ofShared(); MoeAllToAll host = MoeAllToAll.create(group, MoeConfig.bf16(64, experts(8), 2, 8, Backend.HOST))) {
            SmallInputs in = smallInputs(a);
            List<DeviceBuffer> xs = in.xs(), ids = in.ids(), ws = in.ws();
            Stream s = streams.getLast();
            DeviceBuffer scratch = devs.getLast().allocate(256, a);
            s.beginCapture();
            scratch.fill((byte) 1, s);  // something in the graph besides the refused call
            IllegalStateException refused;
            try {
                refused = assertThrows(IllegalStateException.class, () -> host.dispatch(xs, ids, ws, tokens(8, 8), streams));
            } finally {
                s.endCapture().close();
            }
            assertTrue(refused.getMessage().contains("cannot be captured") && refused.getMessage().contains("Backend.GIN"), refused.getMessage());
            // outside a capture the same call runs, and the instance is intact
            List<MoeDispatch> d = host.dispatch(xs, ids, ws, tokens(8, 8), streams);
            host.combine(d, d.stream().map(MoeDispatch::rows).toList(), streams);
            host.checkErrors(streams);
        }
    }

    @Test void handlesOfOtherInstancesMisalignedBuffersAndClosedInstancesAreRefused() {
        int live = NativeResource.liveCount();
        try (Arena a = Arena.ofShared()) {
            SmallInputs in = smallInputs(a);
            List<DeviceBuffer> xs = in.xs(), ids = in.ids(), ws = in.ws(), outs = new ArrayList<>();
            MoeAllToAll first = MoeAllToAll.create(group, MoeConfig.bf16(64, experts(8), 2, 8, Backend.GIN));
            try (first; MoeAllToAll second = MoeAllToAll.create(group, MoeConfig.bf16(64, experts(8), 2, 8, Backend.GIN))) {
                for (int i = 0; i < n; i++) outs.add(devs.get(i).allocate(first.capacityRows() * 128, a));
                List<MoeDispatch> ofFirst = first.dispatch(xs, ids, ws, tokens(8, 8), streams);
                List<MoeDispatch> ofSecond = second.dispatch(xs, ids, ws, tokens(8, 8), streams);
                // same call number on both instances: only the owner tells them apart
                IllegalArgumentException foreign = assertThrows(IllegalArgumentException.class, () -> second.combine(ofFirst, outs, streams));
                assertTrue(foreign.getMessage().contains("this instance"), foreign.getMessage());
                List<DeviceBuffer> values = ofSecond.stream().map(MoeDispatch::weights).toList();
                assertThrows(IllegalArgumentException.class, () -> second.returnRowValues(ofFirst, values, streams));
                second.combine(ofSecond, outs, streams);
                first.combine(ofFirst, outs, streams);
                second.checkErrors(streams);
                first.checkErrors(streams);
                // an int32 array at an odd address would fault inside the kernel, and the fault would stick to the context
                List<DeviceBuffer> shifted = new ArrayList<>(ids);
                shifted.set(n - 1, ids.get(n - 1).slice(2, ids.get(n - 1).byteSize() - 2));
                IllegalArgumentException misaligned = assertThrows(IllegalArgumentException.class, () -> second.dispatch(xs, shifted, ws, tokens(4, 4), streams));
                assertTrue(misaligned.getMessage().contains("topkIdx (int32) must be 4-byte aligned"), misaligned.getMessage());
                first.close();  // and again when the try ends: a second close does nothing
            }
            IllegalStateException closed = assertThrows(IllegalStateException.class, () -> first.dispatch(xs, ids, ws, tokens(8, 8), streams));
            assertTrue(closed.getMessage().contains("is closed"), closed.getMessage());
            assertThrows(IllegalStateException.class, () -> first.checkErrors(streams));
        }
        assertEquals(live, NativeResource.liveCount(), () -> "left open:\n" + NativeResource.liveSummary());
    }

    /** Results of an earlier call fed straight back as inputs would be overwritten while read: refused by name. */
    @Test void inputsThatOverlapWhatTheCallWritesAreRefused() {
        try (Arena a = Arena.ofShared(); MoeAllToAll moe = MoeAllToAll.create(group, MoeConfig.bf16(64, experts(8), 2, 8, Backend.GIN))) {
            SmallInputs in = smallInputs(a);
            List<DeviceBuffer> xs = in.xs(), ids = in.ids(), ws = in.ws();
            List<MoeDispatch> d = moe.dispatch(xs, ids, ws, tokens(8, 8), streams);
            List<DeviceBuffer> rowsAsX = d.stream().map(MoeDispatch::rows).toList();
            IllegalArgumentException rows = assertThrows(IllegalArgumentException.class, () -> moe.dispatch(rowsAsX, ids, ws, tokens(8, 8), streams));
            assertTrue(rows.getMessage().contains("x overlaps this instance's received rows"), rows.getMessage());
            List<DeviceBuffer> weightsAsW = d.stream().map(MoeDispatch::weights).toList();
            IllegalArgumentException weights = assertThrows(IllegalArgumentException.class, () -> moe.dispatch(xs, ids, weightsAsW, tokens(8, 8), streams));
            assertTrue(weights.getMessage().contains("topkWeights overlaps this instance's received weights"), weights.getMessage());
            List<DeviceBuffer> got = moe.returnRowValues(d, weightsAsW, streams);
            if (n == 1) {  // one rank: the returned [T][K] values are as long as the layout's rows, so only the overlap refuses them
                IllegalArgumentException values = assertThrows(IllegalArgumentException.class, () -> moe.returnRowValues(d, got, streams));
                assertTrue(values.getMessage().contains("rowValues overlaps this instance's returned values"), values.getMessage());
            }
            moe.checkErrors(streams);  // the refused calls queued nothing
        }
    }

    @Test void badInputsAreReported() {
        try (Arena a = Arena.ofShared(); MoeAllToAll gin = MoeAllToAll.create(group, MoeConfig.bf16(128, experts(8), 2, 16, Backend.GIN))) {
            List<DeviceBuffer> xs = new ArrayList<>(), ids = new ArrayList<>(), ws = new ArrayList<>();
            for (int i = 0; i < n; i++) {
                Input in = input(i, 16, 128, experts(8), 2, Routing.UNIFORM);
                if (i == 0) in.idx()[5] = 99;  // out of range
                xs.add(upload(devs.get(i), a, MemorySegment.ofArray(in.rows())));
                ids.add(upload(devs.get(i), a, MemorySegment.ofArray(in.idx())));
                ws.add(upload(devs.get(i), a, MemorySegment.ofArray(in.w())));
            }
            IllegalArgumentException tooMany = assertThrows(IllegalArgumentException.class, () -> gin.dispatch(xs, ids, ws, tokens(17, 16), streams));
            assertTrue(tooMany.getMessage().contains("maxTokens"), tooMany.getMessage());
            IllegalArgumentException shortX = assertThrows(IllegalArgumentException.class, () -> gin.dispatch(ids, ids, ws, tokens(16, 16), streams));
            assertTrue(shortX.getMessage().contains("x has"), shortX.getMessage());
            gin.dispatch(xs, ids, ws, tokens(16, 16), streams);
            CommException e = assertThrows(CommException.class, () -> gin.checkErrors(streams));
            assertTrue(e.getMessage().contains("expert id"), e.getMessage());
        }
        if (n > 1) {  // any expert count splits over one rank
            IllegalArgumentException uneven = assertThrows(IllegalArgumentException.class, () -> MoeAllToAll.create(group, MoeConfig.bf16(128, 2 * n + 1, 2, 16, Backend.GIN)));
            assertTrue(uneven.getMessage().contains("evenly"), uneven.getMessage());
        }
        assertThrows(IllegalArgumentException.class, () -> MoeConfig.bf16(0, 8, 2, 16, Backend.GIN));
        assertThrows(IllegalArgumentException.class, () -> MoeConfig.bf16(128, 8, 9, 16, Backend.GIN));
    }
}
