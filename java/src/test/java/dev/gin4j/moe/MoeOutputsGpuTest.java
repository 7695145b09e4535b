package dev.gin4j.moe;

import dev.gin4j.comm.Backend;
import dev.gin4j.comm.DType;
import dev.gin4j.comm.CommException;
import dev.gin4j.comm.CommGroup;
import dev.gin4j.comm.Nccl;
import dev.gin4j.gpu.Device;
import dev.gin4j.gpu.DeviceBuffer;
import dev.gin4j.gpu.GpuRuntime;
import dev.gin4j.gpu.Stream;
import dev.gin4j.moe.MoeReference.Input;
import dev.gin4j.moe.MoeReference.Layout;
import dev.gin4j.moe.MoeReference.Routing;
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

import static org.junit.jupiter.api.Assertions.*;

/**
 * Caller-owned results (MoeOutputs for the dispatch, y for the combine) and a combine whose
 * expertOut holds only the received rows, on both backends, one process driving every GPU; and
 * the refusal of every bad output buffer.
 */
@Tag("gpu")
@TestInstance(TestInstance.Lifecycle.PER_CLASS)
class MoeOutputsGpuTest {
    private static final int HIDDEN = 128, K = 2, MAX_TOKENS = 32, GUARD = 64;
    private static final byte POISON = (byte) 0xff, OWN_POISON = (byte) 0x5a;
    private final SplittableRandom random = new SplittableRandom();
    private CommGroup group;
    private List<Device> devs;
    private List<Stream> streams;
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
        for (Device d : devs) streams.add(d.createStream());
    }

    @AfterAll void tearDown() {
        if (streams != null) streams.forEach(Stream::close);
        if (group != null) group.close();
    }

    private int experts() { return (8 + n - 1) / n * n; }

    private DeviceBuffer upload(Device d, Arena a, MemorySegment host) {
        DeviceBuffer b = d.allocate(Math.max(host.byteSize(), 16), a);
        if (host.byteSize() > 0) b.slice(0, host.byteSize()).copyFromHost(host);
        return b;
    }

    /**
     * {@code bytes} of poisoned memory on {@code d}, followed by GUARD poisoned bytes that no call
     * may write: the returned slice is the first {@code bytes} (see {@link #assertGuardIntact}).
     */
    private DeviceBuffer poisoned(Device d, Arena a, long bytes) {
        DeviceBuffer b = d.allocate(bytes + GUARD, a);
        Stream s = streams.get(devs.indexOf(d));
        b.fill(POISON, s);
        s.synchronize();
        return b.slice(0, bytes);
    }

    /** The GUARD bytes after {@code b} (a slice made by {@link #poisoned}) are all still poison. */
    private static void assertGuardIntact(DeviceBuffer b, String what) {
        DeviceBuffer wide = DeviceBuffer.wrap(b.device(), MemorySegment.ofAddress(b.address()).reinterpret(b.byteSize() + GUARD));
        byte[] after = wide.slice(b.byteSize(), GUARD).toByteArray();
        for (int i = 0; i < after.length; i++) if (after[i] != POISON) fail(what + ": byte " + i + " past its end was written (0x" + Integer.toHexString(after[i] & 0xff) + ")");
    }

    private record Inputs(Input[] in, List<DeviceBuffer> xs, List<DeviceBuffer> ids, List<DeviceBuffer> ws, int[] tokens) {}

    /** Fresh random routing and rows for every rank (16 to 32 tokens each), uploaded into {@code a}. */
    private Inputs inputs(Arena a, boolean fp8) {
        Input[] in = new Input[n];
        List<DeviceBuffer> xs = new ArrayList<>(), ids = new ArrayList<>(), ws = new ArrayList<>();
        int[] tokens = new int[n];
        for (int i = 0; i < n; i++) {
            tokens[i] = 16 + random.nextInt(MAX_TOKENS - 16 + 1);
            in[i] = MoeReference.input(random, i, n, tokens[i], HIDDEN, experts(), K, Routing.UNIFORM);
            if (fp8) in[i] = fp8Rows(i, in[i]);
            xs.add(upload(devs.get(i), a, MemorySegment.ofArray(in[i].x())));
            ids.add(upload(devs.get(i), a, MemorySegment.ofArray(in[i].idx())));
            ws.add(upload(devs.get(i), a, MemorySegment.ofArray(in[i].w())));
        }
        return new Inputs(in, xs, ids, ws, tokens);
    }

    /** The same tokens as scaled fp8 rows (Fp8Rows on rank's GPU); the dispatch moves those rows. */
    private Input fp8Rows(int rank, Input bf) {
        try (Arena a = Arena.ofShared(); Fp8Rows q = new Fp8Rows(devs.get(rank))) {
            DeviceBuffer x = upload(devs.get(rank), a, MemorySegment.ofArray(bf.rows()));
            DeviceBuffer out = q.quantize(x, bf.tokens(), HIDDEN, a, streams.get(rank));
            q.checkErrors(streams.get(rank));
            byte[] rows = out.slice(0, bf.tokens() * Fp8Rows.rowBytes(HIDDEN)).toByteArray();
            float[] values = Fp8RowsGpuTest.decode(rows, bf.tokens(), HIDDEN, devs.get(rank).arch().startsWith("gfx"));
            return new Input(bf.tokens(), rows, values, bf.idx(), bf.w(), rows);
        }
    }

    @Test void dispatchAndCombineIntoCallerBuffers() {
        for (Backend backend : Backend.values()) {
            roundTripIntoCallerBuffers(backend, false);
        }
        roundTripIntoCallerBuffers(Backend.GIN, true);
    }

    private void roundTripIntoCallerBuffers(Backend backend, boolean fp8) {
        MoeConfig cfg = fp8 ? MoeConfig.fp8(HIDDEN, experts(), K, MAX_TOKENS, backend) : MoeConfig.bf16(HIDDEN, experts(), K, MAX_TOKENS, backend);
        String what = backend + (fp8 ? " fp8" : " bf16");
        try (Arena a = Arena.ofShared(); MoeAllToAll moe = MoeAllToAll.create(group, cfg)) {
            int rowBytes = (int) cfg.dispatchRowBytes(), outRowBytes = (int) cfg.combineRowBytes();
            long cap = moe.capacityRows();
            // the instance's own buffers, from a dispatch without outputs: poisoned, they must stay so
            Inputs first = inputs(a, fp8);
            List<MoeDispatch> own = moe.dispatch(first.xs(), first.ids(), first.ws(), first.tokens(), streams);
            moe.checkErrors(streams);
            for (int i = 0; i < n; i++) {
                own.get(i).rows().fill(OWN_POISON, streams.get(i));
                own.get(i).weights().fill(OWN_POISON, streams.get(i));
                own.get(i).counts().fill(OWN_POISON, streams.get(i));
                streams.get(i).synchronize();
            }

            Inputs in = inputs(a, fp8);
            List<MoeOutputs> outputs = new ArrayList<>();
            for (int i = 0; i < n; i++)
                outputs.add(new MoeOutputs(poisoned(devs.get(i), a, cap * rowBytes), poisoned(devs.get(i), a, 4 * cap), poisoned(devs.get(i), a, 4L * moe.localExperts())));
            List<MoeDispatch> handles = moe.dispatch(in.xs(), in.ids(), in.ws(), in.tokens(), outputs, streams);
            moe.checkErrors(streams);
            List<DeviceBuffer> expertOut = new ArrayList<>(), ys = new ArrayList<>();
            for (int d = 0; d < n; d++) {
                MoeDispatch h = handles.get(d);
                MoeOutputs o = outputs.get(d);
                assertEquals(o.rows().address(), h.rows().address(), what + ": the handle's rows are the caller's");
                assertEquals(o.weights().address(), h.weights().address(), what + ": the handle's weights are the caller's");
                assertEquals(o.counts().address(), h.counts().address(), what + ": the handle's counts are the caller's");
                Layout exp = MoeReference.expected(in.in(), d, rowBytes, cfg.experts(), K);
                int rows = exp.rows().size();
                int[] counts = new int[moe.localExperts()];
                MemorySegment.copy(MemorySegment.ofArray(o.counts().toByteArray()), ValueLayout.JAVA_INT_UNALIGNED, 0, counts, 0, counts.length);
                assertArrayEquals(exp.counts(), counts, what + ": per-expert counts on rank " + d);
                byte[] got = o.rows().slice(0, (long) rows * rowBytes).toByteArray();
                float[] gw = new float[rows];
                MemorySegment.copy(MemorySegment.ofArray(o.weights().slice(0, 4L * rows).toByteArray()), ValueLayout.JAVA_FLOAT_UNALIGNED, 0, gw, 0, rows);
                for (int r = 0; r < rows; r++) {
                    int mismatch = Arrays.mismatch(exp.rows().get(r), 0, rowBytes, got, r * rowBytes, (r + 1) * rowBytes);
                    if (mismatch >= 0) fail(what + ": rank " + d + " row " + r + " byte " + mismatch + " differs from the reference");
                    assertEquals(exp.weights().get(r), gw[r], what + ": weight of row " + r + " on rank " + d);
                }
                assertGuardIntact(o.rows(), what + " outputs.rows on rank " + d);
                assertGuardIntact(o.weights(), what + " outputs.weights on rank " + d);
                assertGuardIntact(o.counts(), what + " outputs.counts on rank " + d);
                for (DeviceBuffer b : List.of(own.get(d).rows(), own.get(d).weights(), own.get(d).counts())) {
                    byte[] bytes = b.toByteArray();
                    for (int i = 0; i < bytes.length; i++) if (bytes[i] != OWN_POISON) fail(what + ": the instance's own buffer was written at byte " + i + " on rank " + d);
                }
                // expertOut of exactly the received rows (none when nothing came): the fake experts' outputs
                short[] full = MoeReference.expertOut(in.in(), exp, HIDDEN, cap);
                DeviceBuffer eo = upload(devs.get(d), a, MemorySegment.ofArray(Arrays.copyOf(full, rows * HIDDEN))).slice(0, (long) rows * outRowBytes);
                expertOut.add(eo);
                ys.add(poisoned(devs.get(d), a, (long) in.tokens()[d] * outRowBytes));
            }
            for (boolean weighted : new boolean[] {true, false}) {
                List<DeviceBuffer> back = weighted ? moe.combine(handles, expertOut, ys, streams) : moe.combineUnweighted(handles, expertOut, ys, streams);
                moe.checkErrors(streams);
                for (int s = 0; s < n; s++) {
                    assertEquals(ys.get(s).address(), back.get(s).address(), what + ": combine returns the caller's y");
                    String off = MoeReference.combineMismatch(in.in()[s], MemorySegment.ofArray(ys.get(s).toByteArray()), HIDDEN, K, weighted);
                    if (off != null) fail(what + (weighted ? "" : " (unweighted)") + ": y on rank " + s + " " + off);
                    assertGuardIntact(ys.get(s), what + " y on rank " + s);
                    ys.get(s).fill(POISON, streams.get(s));
                    streams.get(s).synchronize();
                }
            }
        }
    }

    @Test void tooFewExpertOutRowsAreReportedNotRead() {
        for (Backend backend : Backend.values()) {
            try (Arena a = Arena.ofShared(); MoeAllToAll moe = MoeAllToAll.create(group, MoeConfig.bf16(HIDDEN, experts(), K, MAX_TOKENS, backend))) {
                Inputs in = inputs(a, false);
                List<MoeDispatch> handles = moe.dispatch(in.xs(), in.ids(), in.ws(), in.tokens(), streams);
                moe.checkErrors(streams);
                List<DeviceBuffer> shortOut = new ArrayList<>();
                for (int d = 0; d < n; d++) {
                    int rows = MoeReference.expected(in.in(), d, 2 * HIDDEN, experts(), K).rows().size();
                    assertTrue(rows > 0, "every rank receives rows with 16+ tokens of top-2 over " + experts() + " experts");
                    // one row short, followed by memory the combine must not read: a guard of poison
                    shortOut.add(poisoned(devs.get(d), a, (long) (rows - 1) * 2 * HIDDEN));
                }
                if (backend == Backend.HOST) {
                    IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> moe.combine(handles, shortOut, streams));
                    assertTrue(e.getMessage().contains("expertOut has") && e.getMessage().contains("received"), e.getMessage());
                    moe.checkErrors(streams);  // nothing was queued
                } else {
                    moe.combine(handles, shortOut, streams);
                    CommException e = assertThrows(CommException.class, () -> moe.checkErrors(streams));
                    assertTrue(e.getMessage().contains("expertOut holds fewer rows than the dispatch received"), e.getMessage());
                    assertTrue(e.getMessage().contains("0x1000"), e.getMessage());
                }
                // the instance still works: a full round with enough rows is correct
                Inputs again = inputs(a, false);
                List<MoeDispatch> h2 = moe.dispatch(again.xs(), again.ids(), again.ws(), again.tokens(), streams);
                List<DeviceBuffer> outs = new ArrayList<>();
                for (int d = 0; d < n; d++) {
                    Layout exp = MoeReference.expected(again.in(), d, 2 * HIDDEN, experts(), K);
                    outs.add(upload(devs.get(d), a, MemorySegment.ofArray(MoeReference.expertOut(again.in(), exp, HIDDEN, moe.capacityRows()))));
                }
                List<DeviceBuffer> ys = moe.combine(h2, outs, streams);
                moe.checkErrors(streams);
                for (int s = 0; s < n; s++) {
                    String off = MoeReference.combineMismatch(again.in()[s], MemorySegment.ofArray(ys.get(s).toByteArray()), HIDDEN, K, true);
                    if (off != null) fail(backend + " after the short expertOut: y on rank " + s + " " + off);
                }
            }
        }
    }

    @Test void badOutputsAreRefusedNamingWhatAndWhy() {
        try (Arena a = Arena.ofShared(); MoeAllToAll moe = MoeAllToAll.create(group, MoeConfig.bf16(HIDDEN, experts(), K, MAX_TOKENS, Backend.GIN))) {
            Inputs in = inputs(a, false);
            Device d0 = devs.get(0);
            long cap = moe.capacityRows(), rowBytes = 2L * HIDDEN;
            DeviceBuffer rows = d0.allocate(cap * rowBytes + 64, a), weights = d0.allocate(4 * cap + 64, a), counts = d0.allocate(4L * moe.localExperts() + 64, a);
            assertRefused(moe, in, new MoeOutputs(rows.slice(0, cap * rowBytes - 2), null, null), "outputs.rows has", "needs " + cap * rowBytes);
            assertRefused(moe, in, new MoeOutputs(null, weights.slice(0, 4 * cap - 4), null), "outputs.weights has", "needs " + 4 * cap);
            assertRefused(moe, in, new MoeOutputs(null, null, counts.slice(0, 4L * moe.localExperts() - 4)), "outputs.counts has", "needs " + 4L * moe.localExperts());
            assertRefused(moe, in, new MoeOutputs(rows.slice(1, cap * rowBytes), null, null), "outputs.rows must be 2-byte aligned", "0x");
            assertRefused(moe, in, new MoeOutputs(null, weights.slice(2, 4 * cap), null), "outputs.weights must be 4-byte aligned", "0x");
            assertRefused(moe, in, new MoeOutputs(null, null, counts.slice(2, 4L * moe.localExperts())), "outputs.counts must be 4-byte aligned", "0x");
            DeviceBuffer shared = d0.allocate(cap * rowBytes + 4 * cap, a);
            assertRefused(moe, in, new MoeOutputs(shared.slice(0, cap * rowBytes), shared.slice(cap * rowBytes - 4, 4 * cap), null),
                    "outputs.rows overlaps outputs.weights", "own memory");
            // x inside the memory given for the weights
            DeviceBuffer x0 = in.xs().getFirst(), aroundX = d0.allocate(Math.max(x0.byteSize(), 4 * cap), a);
            aroundX.slice(0, x0.byteSize()).copyFrom(x0, streams.getFirst());
            streams.getFirst().synchronize();
            List<DeviceBuffer> xs = new ArrayList<>(in.xs());
            xs.set(0, aroundX.slice(0, x0.byteSize()));
            Inputs xInWeights = new Inputs(in.in(), xs, in.ids(), in.ws(), in.tokens());
            assertRefused(moe, xInWeights, new MoeOutputs(null, aroundX.slice(0, 4 * cap), null), "x overlaps outputs.weights", "copy it elsewhere");
            if (n > 1) {
                Device d1 = devs.get(1);
                assertRefused(moe, in, new MoeOutputs(d1.allocate(cap * rowBytes, a), null, null), "outputs.rows is on " + d1, "expected " + d0);
            }
            List<MoeOutputs> withNull = new ArrayList<>(java.util.Collections.nCopies(n, MoeOutputs.INSTANCE_OWNED));
            withNull.set(0, null);
            IllegalArgumentException none = assertThrows(IllegalArgumentException.class, () -> moe.dispatch(in.xs(), in.ids(), in.ws(), in.tokens(), withNull, streams));
            assertTrue(none.getMessage().contains("INSTANCE_OWNED"), none.getMessage());
            moe.checkErrors(streams);  // nothing was queued by the refused calls

            // the combine's y and expertOut; rank 0's weights in memory that a bad y will overlap
            long needY = in.tokens()[0] * rowBytes;
            DeviceBuffer weightsAndY = d0.allocate(Math.max(4 * cap, needY), a);
            List<MoeOutputs> weightsThere = new ArrayList<>(java.util.Collections.nCopies(n, MoeOutputs.INSTANCE_OWNED));
            weightsThere.set(0, new MoeOutputs(null, weightsAndY.slice(0, 4 * cap), null));
            List<MoeDispatch> handles = moe.dispatch(in.xs(), in.ids(), in.ws(), in.tokens(), weightsThere, streams);
            moe.checkErrors(streams);
            List<DeviceBuffer> outs = new ArrayList<>();
            for (int d = 0; d < n; d++) outs.add(devs.get(d).allocate(cap * rowBytes, a));
            assertCombineRefused(moe, handles, outs, d0.allocate(needY - 2, a), "y has", "needs " + needY);
            DeviceBuffer wideY = d0.allocate(needY + 16, a);
            assertCombineRefused(moe, handles, outs, wideY.slice(1, needY), "y (bf16) must be 2-byte aligned", "0x");
            assertCombineRefused(moe, handles, outs, outs.getFirst().slice(0, needY), "expertOut overlaps y", "copy it elsewhere");
            assertCombineRefused(moe, handles, outs, weightsAndY.slice(0, needY), "the dispatch's weights overlaps y", "copy it elsewhere");
            if (n > 1) assertCombineRefused(moe, handles, outs, devs.get(1).allocate(needY, a), "y is on " + devs.get(1), "expected " + d0);
            moe.checkErrors(streams);
        }
    }

    private void assertRefused(MoeAllToAll moe, Inputs in, MoeOutputs bad, String... parts) {
        List<MoeOutputs> outputs = new ArrayList<>(java.util.Collections.nCopies(n, MoeOutputs.INSTANCE_OWNED));
        outputs.set(0, bad);
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> moe.dispatch(in.xs(), in.ids(), in.ws(), in.tokens(), outputs, streams));
        for (String p : parts) assertTrue(e.getMessage().contains(p), "'" + p + "' missing from: " + e.getMessage());
    }

    private void assertCombineRefused(MoeAllToAll moe, List<MoeDispatch> handles, List<DeviceBuffer> outs, DeviceBuffer badY, String... parts) {
        List<DeviceBuffer> ys = new ArrayList<>(java.util.Collections.nCopies(n, (DeviceBuffer) null));
        ys.set(0, badY);
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> moe.combine(handles, outs, ys, streams));
        for (String p : parts) assertTrue(e.getMessage().contains(p), "'" + p + "' missing from: " + e.getMessage());
    }

    @Test void singleRankFormsTakeOutputsToo() {
        Gpus.skipUnless(n == 1, "the one-process-per-GPU forms need a group of one local rank; this one has " + n);
        try (Arena a = Arena.ofShared(); MoeAllToAll moe = MoeAllToAll.create(group, MoeConfig.bf16(HIDDEN, experts(), K, MAX_TOKENS, Backend.GIN))) {
            Inputs in = inputs(a, false);
            long cap = moe.capacityRows();
            MoeOutputs o = MoeOutputs.rows(poisoned(devs.getFirst(), a, cap * 2 * HIDDEN));
            MoeDispatch h = moe.dispatch(in.xs().getFirst(), in.ids().getFirst(), in.ws().getFirst(), in.tokens()[0], o, streams.getFirst());
            assertEquals(o.rows().address(), h.rows().address());
            Layout exp = MoeReference.expected(in.in(), 0, 2 * HIDDEN, experts(), K);
            DeviceBuffer eo = upload(devs.getFirst(), a, MemorySegment.ofArray(MoeReference.expertOut(in.in(), exp, HIDDEN, cap)));
            DeviceBuffer y = poisoned(devs.getFirst(), a, (long) in.tokens()[0] * 2 * HIDDEN);
            DeviceBuffer got = moe.combine(h, eo, y, streams.getFirst());
            moe.checkErrors(streams.getFirst());
            assertEquals(y.address(), got.address());
            byte[] rows = h.rows().slice(0, (long) exp.rows().size() * 2 * HIDDEN).toByteArray();
            for (int r = 0; r < exp.rows().size(); r++)
                assertEquals(-1, Arrays.mismatch(exp.rows().get(r), 0, 2 * HIDDEN, rows, r * 2 * HIDDEN, (r + 1) * 2 * HIDDEN), "row " + r);
            String off = MoeReference.combineMismatch(in.in()[0], MemorySegment.ofArray(y.toByteArray()), HIDDEN, K, true);
            if (off != null) fail("y " + off);
            assertGuardIntact(y, "y");
        }
    }

    @Test void fp8RowsNeedSixteenByteAlignment() {
        try (Arena a = Arena.ofShared(); MoeAllToAll moe = MoeAllToAll.create(group, MoeConfig.fp8(HIDDEN, experts(), K, MAX_TOKENS, Backend.GIN))) {
            Inputs in = inputs(a, true);
            long need = moe.capacityRows() * moe.config().dispatchRowBytes();
            DeviceBuffer rows = devs.getFirst().allocate(need + 16, a);
            assertRefused(moe, in, MoeOutputs.rows(rows.slice(8, need)), "outputs.rows must be 16-byte aligned", "0x");
            moe.checkErrors(streams);
        }
        assertEquals(DType.FP8_E4M3, MoeConfig.fp8(HIDDEN, 8, K, MAX_TOKENS, Backend.GIN).dtype());
    }
}
