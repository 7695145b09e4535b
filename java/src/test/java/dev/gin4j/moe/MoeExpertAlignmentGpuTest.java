package dev.gin4j.moe;

import dev.gin4j.comm.Backend;
import dev.gin4j.comm.Bf16;
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
 * Expert alignment (MoeConfig.expertAlignment, DeepEP's expert_alignment) on both backends, one
 * process driving every GPU (one rank on a one-GPU host), on the GIN token path (few tokens) and
 * layout path (maxTokens x topK above 4096): fresh random routing; the received rows and weights
 * poisoned before the dispatch; every row and weight checked at its aligned place, every padding
 * row and weight still poison, every offset a multiple of the alignment and equal to the aligned
 * prefix of the reference counts, the capacity grown by L x (A - 1); then the combine of expert
 * outputs laid out aligned, with the padding rows holding huge values it must not read.
 */
@Tag("gpu")
@TestInstance(TestInstance.Lifecycle.PER_CLASS)
class MoeExpertAlignmentGpuTest {
    private static final int HIDDEN = 128, K = 4;
    private static final byte POISON = (byte) 0x7b;
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

    private Inputs inputs(Arena a, int maxTokens, Routing routing) {
        Input[] in = new Input[n];
        List<DeviceBuffer> xs = new ArrayList<>(), ids = new ArrayList<>(), ws = new ArrayList<>();
        int[] tokens = new int[n];
        for (int i = 0; i < n; i++) {
            tokens[i] = 1 + random.nextInt(maxTokens);
            in[i] = MoeReference.input(random, i, n, tokens[i], HIDDEN, experts(), K, routing);
            xs.add(upload(devs.get(i), a, MemorySegment.ofArray(in[i].x())));
            ids.add(upload(devs.get(i), a, MemorySegment.ofArray(in[i].idx())));
            ws.add(upload(devs.get(i), a, MemorySegment.ofArray(in[i].w())));
        }
        return new Inputs(in, xs, ids, ws, tokens);
    }

    @Test void everyRowAtItsAlignedPlaceAndThePaddingUntouched() {
        for (Backend backend : Backend.values())
            for (int alignment : new int[] {1, 3, 16, 128})
                for (int maxTokens : new int[] {64, 1100})  // GIN: token path, then layout path (1100 x 4 > 4096 ids)
                    for (Routing routing : new Routing[] {Routing.UNIFORM, Routing.ONE_EXPERT})
                        check(backend, alignment, maxTokens, routing);
    }

    private void check(Backend backend, int alignment, int maxTokens, Routing routing) {
        MoeConfig cfg = MoeConfig.builder().hidden(HIDDEN).experts(experts()).topK(K).maxTokensPerRank(maxTokens).backend(backend)
                .expertAlignment(alignment).build();
        String what = backend + ", alignment " + alignment + ", maxTokens " + maxTokens + ", " + routing;
        int rowBytes = 2 * HIDDEN;
        try (Arena a = Arena.ofShared(); MoeAllToAll moe = MoeAllToAll.create(group, cfg)) {
            int L = moe.localExperts();
            long packed = (long) n * maxTokens * Math.min(K, L);
            assertEquals(packed + (long) L * (alignment - 1), moe.capacityRows(), what + ": the capacity holds the padding");
            moe.expertOffsets(true);
            // a first dispatch hands out the instance's buffers; poisoned, the second must fill exactly its rows
            Inputs warm = inputs(a, maxTokens, routing);
            List<MoeDispatch> hs = moe.dispatch(warm.xs(), warm.ids(), warm.ws(), warm.tokens(), streams);
            moe.checkErrors(streams);
            for (int d = 0; d < n; d++) {
                hs.get(d).rows().fill(POISON, streams.get(d));
                hs.get(d).weights().fill(POISON, streams.get(d));
                hs.get(d).offsets().fill(POISON, streams.get(d));
            }
            Inputs in = inputs(a, maxTokens, routing);
            hs = moe.dispatch(in.xs(), in.ids(), in.ws(), in.tokens(), streams);
            moe.checkErrors(streams);
            long cap = moe.capacityRows();
            List<DeviceBuffer> outs = new ArrayList<>();
            for (int d = 0; d < n; d++) {
                MoeDispatch h = hs.get(d);
                Layout exp = MoeReference.expected(in.in(), d, rowBytes, cfg.experts(), K);
                int[] starts = MoeReference.alignedStarts(exp.counts(), alignment);
                int[] offsets = h.offsets().readInts(L + 1, streams.get(d));
                assertArrayEquals(starts, offsets, what + ", rank " + d + ": offsets " + Arrays.toString(offsets));
                for (int e = 0; e < L; e++) assertEquals(0, offsets[e] % alignment, what + ": expert " + e + " starts at " + offsets[e]);
                assertArrayEquals(exp.counts(), h.counts().readInts(L, streams.get(d)), what + ", rank " + d + ": counts");
                byte[] rows = h.rows().slice(0, cap * rowBytes).toByteArray(streams.get(d));
                int[] wts = h.weights().slice(0, 4 * cap).readInts((int) cap, streams.get(d));
                int poisonWord = (POISON & 0xff) * 0x01010101;
                int packedIndex = 0;
                short[] eo = new short[Math.toIntExact(cap * HIDDEN)];
                for (int e = 0; e < L; e++) {
                    for (int j = 0; j < exp.counts()[e]; j++, packedIndex++) {
                        int row = offsets[e] + j;
                        byte[] want = exp.rows().get(packedIndex);
                        byte[] got = Arrays.copyOfRange(rows, row * rowBytes, (row + 1) * rowBytes);
                        assertArrayEquals(want, got, what + ", rank " + d + ": expert " + e + " row " + j + " at " + row);
                        assertEquals(Float.floatToRawIntBits(exp.weights().get(packedIndex)), wts[row], what + ", rank " + d + ": weight of row " + row);
                        int[] o = exp.origin().get(packedIndex);
                        for (int x = 0; x < HIDDEN; x++) eo[row * HIDDEN + x] = Bf16.fromFloat(in.in()[o[0]].values()[o[1] * HIDDEN + x] * (1 + o[2]));
                    }
                    for (int row = offsets[e] + exp.counts()[e]; row < offsets[e + 1]; row++) {
                        for (int b = 0; b < rowBytes; b++)
                            if (rows[row * rowBytes + b] != POISON) fail(what + ", rank " + d + ": padding row " + row + " (after expert " + e + ") was written at byte " + b);
                        assertEquals(poisonWord, wts[row], what + ", rank " + d + ": padding weight " + row + " was written");
                        Arrays.fill(eo, row * HIDDEN, (row + 1) * HIDDEN, Bf16.fromFloat(1e30f));  // the combine must not read it
                    }
                }
                for (long row = offsets[L]; row < cap; row++)
                    for (int b = 0; b < rowBytes; b++)
                        if (rows[(int) (row * rowBytes + b)] != POISON) fail(what + ", rank " + d + ": row " + row + " past the last block was written");
                outs.add(upload(devs.get(d), a, MemorySegment.ofArray(eo)));
            }
            List<DeviceBuffer> y = moe.combine(hs, outs, streams);
            moe.checkErrors(streams);
            for (int d = 0; d < n; d++) {
                MemorySegment yh = MemorySegment.ofArray(y.get(d).slice(0, (long) rowBytes * in.tokens()[d]).toByteArray(streams.get(d)));
                String bad = MoeReference.combineMismatch(in.in()[d], yh, HIDDEN, K, true);
                assertNull(bad, what + ", rank " + d + ": combine after the aligned dispatch: " + bad);
            }
        }
    }
}
