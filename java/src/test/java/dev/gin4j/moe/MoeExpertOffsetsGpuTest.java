package dev.gin4j.moe;

import dev.gin4j.comm.Backend;
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
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.SplittableRandom;

import static org.junit.jupiter.api.Assertions.*;

/**
 * Per-expert offsets on the device and host counts on request (for a grouped GEMM), on both
 * backends, one process driving every GPU (one rank on a one-GPU host): every offset, every count
 * on the device and on the host, over fresh random routing of two dispatches of different sizes,
 * with the offsets poisoned in between; the host copy's validity rules; and the combine after.
 */
@Tag("gpu")
@TestInstance(TestInstance.Lifecycle.PER_CLASS)
class MoeExpertOffsetsGpuTest {
    private static final int HIDDEN = 128, K = 4, MAX_TOKENS = 64;
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

    private int experts() { return 8 * n; }

    private DeviceBuffer upload(Device d, Arena a, MemorySegment host) {
        DeviceBuffer b = d.allocate(Math.max(host.byteSize(), 16), a);
        if (host.byteSize() > 0) b.slice(0, host.byteSize()).copyFromHost(host);
        return b;
    }

    private record Inputs(Input[] in, List<DeviceBuffer> xs, List<DeviceBuffer> ids, List<DeviceBuffer> ws, int[] tokens) {}

    private Inputs inputs(Arena a, int minTokens, int maxTokens, Routing routing) {
        Input[] in = new Input[n];
        List<DeviceBuffer> xs = new ArrayList<>(), ids = new ArrayList<>(), ws = new ArrayList<>();
        int[] tokens = new int[n];
        for (int i = 0; i < n; i++) {
            tokens[i] = minTokens + random.nextInt(maxTokens - minTokens + 1);
            in[i] = MoeReference.input(random, i, n, tokens[i], HIDDEN, experts(), K, routing);
            xs.add(upload(devs.get(i), a, MemorySegment.ofArray(in[i].x())));
            ids.add(upload(devs.get(i), a, MemorySegment.ofArray(in[i].idx())));
            ws.add(upload(devs.get(i), a, MemorySegment.ofArray(in[i].w())));
        }
        return new Inputs(in, xs, ids, ws, tokens);
    }

    private static int[] exclusivePrefix(int[] counts) {
        int[] o = new int[counts.length + 1];
        for (int e = 0; e < counts.length; e++) o[e + 1] = o[e] + counts[e];
        return o;
    }

    @Test void offsetsAndHostCountsMatchTheReferenceOnBothBackends() {
        for (Backend backend : Backend.values())
            for (Routing routing : new Routing[] {Routing.UNIFORM, Routing.SOME_MASKED, Routing.ONE_EXPERT})
                checkOffsets(backend, routing);
    }

    private void checkOffsets(Backend backend, Routing routing) {
        MoeConfig cfg = MoeConfig.bf16(HIDDEN, experts(), K, MAX_TOKENS, backend);
        String what = backend + " " + routing;
        try (Arena a = Arena.ofShared(); MoeAllToAll moe = MoeAllToAll.create(group, cfg)) {
            int L = moe.localExperts();
            moe.hostCounts(true);
            List<MoeDispatch> first = null;
            for (int call = 0; call < 2; call++) {
                // two calls of different sizes: stale offsets or host words of the first would not match the second
                Inputs in = call == 0 ? inputs(a, 1, MAX_TOKENS / 2, routing) : inputs(a, MAX_TOKENS / 2 + 1, MAX_TOKENS, routing);
                if (first != null)
                    for (int i = 0; i < n; i++) {
                        first.get(i).offsets().fill((byte) 0xa5, streams.get(i));
                        first.get(i).counts().fill((byte) 0xa5, streams.get(i));
                    }
                List<MoeDispatch> hs = moe.dispatch(in.xs(), in.ids(), in.ws(), in.tokens(), streams);
                for (int d = 0; d < n; d++) {
                    Layout exp = MoeReference.expected(in.in(), d, 2 * HIDDEN, cfg.experts(), K);
                    int[] want = exclusivePrefix(exp.counts());
                    MoeDispatch h = hs.get(d);
                    // the host copy first: it waits for its own event, not for a stream synchronize
                    assertArrayEquals(exp.counts(), h.hostCounts(), what + ", call " + call + ", rank " + d + ": host counts");
                    assertArrayEquals(want, h.hostOffsets(), what + ", call " + call + ", rank " + d + ": host offsets");
                    assertTrue(h.hostCountsReady(), what + ": ready once read");
                    assertArrayEquals(exp.counts(), h.counts().readInts(L, streams.get(d)), what + ", call " + call + ", rank " + d + ": device counts");
                    assertArrayEquals(want, h.offsets().readInts(L + 1, streams.get(d)), what + ", call " + call + ", rank " + d + ": device offsets");
                    assertEquals(exp.rows().size(), h.hostOffsets()[L], what + ": the last offset is the rows received");
                }
                moe.checkErrors(streams);
                if (first != null) {
                    IllegalStateException stale = assertThrows(IllegalStateException.class, first.getFirst()::hostCounts);
                    assertTrue(stale.getMessage().contains("replaced"), stale.getMessage());
                }
                first = hs;
            }
            // the combine after a dispatch with offsets: unchanged
            Inputs in = inputs(a, 1, MAX_TOKENS, routing);
            List<MoeDispatch> hs = moe.dispatch(in.xs(), in.ids(), in.ws(), in.tokens(), streams);
            List<DeviceBuffer> outs = new ArrayList<>();
            for (int d = 0; d < n; d++) {
                Layout exp = MoeReference.expected(in.in(), d, 2 * HIDDEN, cfg.experts(), K);
                short[] eo = MoeReference.expertOut(in.in(), exp, HIDDEN, moe.capacityRows());
                outs.add(upload(devs.get(d), a, MemorySegment.ofArray(eo)));
            }
            List<DeviceBuffer> y = moe.combine(hs, outs, streams);
            moe.checkErrors(streams);
            for (int d = 0; d < n; d++) {
                MemorySegment yh = MemorySegment.ofArray(y.get(d).slice(0, 2L * in.tokens()[d] * HIDDEN).toByteArray());
                String bad = MoeReference.combineMismatch(in.in()[d], yh, HIDDEN, K, true);
                assertNull(bad, what + ", rank " + d + ": " + bad);
            }
        }
    }

    @Test void offsetsAloneNeedNoHostCopyAndOffMeansNone() {
        try (Arena a = Arena.ofShared(); MoeAllToAll moe = MoeAllToAll.create(group, MoeConfig.bf16(HIDDEN, experts(), K, MAX_TOKENS, Backend.GIN))) {
            Inputs in = inputs(a, 1, MAX_TOKENS, Routing.UNIFORM);
            List<MoeDispatch> off = moe.dispatch(in.xs(), in.ids(), in.ws(), in.tokens(), streams);
            moe.checkErrors(streams);
            IllegalStateException e = assertThrows(IllegalStateException.class, off.getFirst()::offsets);
            assertTrue(e.getMessage().contains("expertOffsets(true)"), e.getMessage());
            e = assertThrows(IllegalStateException.class, off.getFirst()::hostCounts);
            assertTrue(e.getMessage().contains("hostCounts(true)"), e.getMessage());
            moe.expertOffsets(true);
            List<MoeDispatch> on = moe.dispatch(in.xs(), in.ids(), in.ws(), in.tokens(), streams);
            for (int d = 0; d < n; d++) {
                int[] want = exclusivePrefix(MoeReference.expected(in.in(), d, 2 * HIDDEN, experts(), K).counts());
                assertArrayEquals(want, on.get(d).offsets().readInts(moe.localExperts() + 1, streams.get(d)), "rank " + d + ": " + Arrays.toString(want));
                assertThrows(IllegalStateException.class, on.get(d)::hostCountsReady);
            }
            moe.checkErrors(streams);
        }
    }

    @Test void hostCountsAreRefusedUnderCaptureAndOffsetsAreCaptured() {
        try (Arena a = Arena.ofShared(); MoeAllToAll moe = MoeAllToAll.create(group, MoeConfig.bf16(HIDDEN, experts(), K, MAX_TOKENS, Backend.GIN))) {
            Inputs in = inputs(a, 1, MAX_TOKENS, Routing.UNIFORM);
            moe.hostCounts(true);
            streams.forEach(Stream::beginCapture);
            IllegalStateException e;
            try {
                e = assertThrows(IllegalStateException.class, () -> moe.dispatch(in.xs(), in.ids(), in.ws(), in.tokens(), streams));
            } finally {
                for (Stream s : streams) s.endCapture().close();
            }
            assertTrue(e.getMessage().contains("hostCounts(false)"), e.getMessage());
            moe.hostCounts(false).expertOffsets(true);
            List<MoeDispatch> hs = new ArrayList<>();
            List<dev.gin4j.gpu.Graph> graphs = new ArrayList<>();
            streams.forEach(Stream::beginCapture);
            try {
                hs.addAll(moe.dispatch(in.xs(), in.ids(), in.ws(), in.tokens(), streams));
            } finally {
                for (Stream s : streams) graphs.add(s.endCapture());
            }
            try {
                for (int d = 0; d < n; d++) hs.get(d).offsets().fill((byte) 0xa5, streams.get(d));
                for (int d = 0; d < n; d++) graphs.get(d).launch(streams.get(d));
                for (int d = 0; d < n; d++) {
                    int[] want = exclusivePrefix(MoeReference.expected(in.in(), d, 2 * HIDDEN, experts(), K).counts());
                    assertArrayEquals(want, hs.get(d).offsets().readInts(moe.localExperts() + 1, streams.get(d)), "rank " + d + ": the replayed offsets");
                }
                moe.checkErrors(streams);
            } finally {
                graphs.forEach(dev.gin4j.gpu.Graph::close);
            }
        }
    }
}
