package dev.gin4j.moe;

import dev.gin4j.comm.Backend;
import dev.gin4j.comm.CommException;
import dev.gin4j.comm.CommGroup;
import dev.gin4j.comm.ErrorCheck;
import dev.gin4j.comm.Nccl;
import dev.gin4j.gpu.Device;
import dev.gin4j.gpu.DeviceBuffer;
import dev.gin4j.gpu.GpuRuntime;
import dev.gin4j.gpu.NativeResource;
import dev.gin4j.gpu.Stream;
import dev.gin4j.moe.MoeReference.Input;
import dev.gin4j.moe.MoeReference.Layout;
import dev.gin4j.moe.MoeReference.Routing;
import dev.gin4j.testing.Gpus;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.List;
import java.util.SplittableRandom;

import static org.junit.jupiter.api.Assertions.*;

/**
 * Later error checks of the MoE exchange and of Fp8Rows ({@code errorsAfter}): a bad expert id is
 * reported with checkErrors' text, a clean call reports nothing; and the one-process-per-GPU
 * forms (no lists) on a group of one local rank, refused where a process drives several.
 */
@Tag("gpu")
class MoeLaterChecksGpuTest {
    private static final int HIDDEN = 128, EXPERTS = 8, K = 2, TOKENS = 16;
    private final SplittableRandom random = new SplittableRandom();

    private static DeviceBuffer upload(Device d, Arena a, MemorySegment host, Stream s) {
        DeviceBuffer b = d.allocate(Math.max(host.byteSize(), 16), a);
        if (host.byteSize() > 0) b.slice(0, host.byteSize()).copyFromHost(host, s);
        return b;
    }

    private static boolean pollUntilDone(ErrorCheck check) throws InterruptedException {
        long deadline = System.nanoTime() + 120_000_000_000L;
        while (!check.poll()) {
            if (System.nanoTime() > deadline) fail(check + " did not complete within two minutes");
            Thread.sleep(1);
        }
        return true;
    }

    /** Dispatches fresh random tokens on every local rank (rank 0's token 2 given expert {@code badId} where it is not null) and checks the counts of a clean one. */
    private void dispatch(MoeAllToAll moe, List<Device> devs, List<Stream> streams, Arena a, Integer badId) {
        int n = devs.size();
        Input[] in = new Input[n];
        List<DeviceBuffer> xs = new ArrayList<>(), ids = new ArrayList<>(), ws = new ArrayList<>();
        for (int i = 0; i < n; i++) {
            in[i] = MoeReference.input(random, i, n, TOKENS, HIDDEN, EXPERTS * n, K, Routing.UNIFORM);
            if (i == 0 && badId != null) in[i].idx()[2 * K] = badId;
            xs.add(upload(devs.get(i), a, MemorySegment.ofArray(in[i].rows()), streams.get(i)));
            ids.add(upload(devs.get(i), a, MemorySegment.ofArray(in[i].idx()), streams.get(i)));
            ws.add(upload(devs.get(i), a, MemorySegment.ofArray(in[i].w()), streams.get(i)));
        }
        int[] tokens = new int[n];
        java.util.Arrays.fill(tokens, TOKENS);
        List<MoeDispatch> handles = n == 1 ? List.of(moe.dispatch(xs.getFirst(), ids.getFirst(), ws.getFirst(), TOKENS, streams.getFirst()))
                : moe.dispatch(xs, ids, ws, tokens, streams);
        if (badId != null) return;
        for (int d = 0; d < n; d++) {
            Layout exp = MoeReference.expected(in, d, (int) moe.config().dispatchRowBytes(), EXPERTS * n, K);
            assertArrayEquals(exp.counts(), handles.get(d).counts().readInts(moe.localExperts(), streams.get(d)), moe.config().backend() + ": per-expert counts on rank " + d);
        }
    }

    @Test void aBadExpertIdIsReportedByTheLaterCheckAndACleanCallByNothing() throws Exception {
        GpuRuntime rt = Gpus.runtimeWithDevices(1);
        Gpus.skipUnless(Nccl.isAvailable(), "no NCCL/RCCL: " + Nccl.describe());
        Gpus.requireKernels(rt, "moe_gin");
        Gpus.requireKernels(rt, "moe_host");
        int live = NativeResource.liveCount();
        List<Device> devs = rt.devices();
        int n = devs.size();
        try (CommGroup g = CommGroup.initAll(devs); Arena a = Arena.ofShared()) {
            List<Stream> streams = new ArrayList<>();
            try {
                for (Device d : devs) streams.add(d.createStream());
                for (Backend backend : Backend.values()) {
                    try (MoeAllToAll moe = MoeAllToAll.create(g, MoeConfig.bf16(HIDDEN, EXPERTS * n, K, TOKENS, backend))) {
                        // clean: the later check reports nothing
                        dispatch(moe, devs, streams, a, null);
                        ErrorCheck clean = moe.errorsAfter(streams);
                        assertTrue(pollUntilDone(clean), backend + ": a clean dispatch reports nothing");
                        // a bad id: checkErrors' report, then the same from a later check
                        int bad = EXPERTS * n + 1 + random.nextInt(1000);
                        dispatch(moe, devs, streams, a, bad);
                        CommException sync = assertThrows(CommException.class, () -> moe.checkErrors(streams), backend.toString());
                        assertTrue(sync.getMessage().contains("expert id"), sync.getMessage());
                        dispatch(moe, devs, streams, a, bad);
                        ErrorCheck later = moe.errorsAfter(streams);
                        CommException reported = assertThrows(CommException.class, () -> pollUntilDone(later), backend + ": the later check must report the bad id");
                        assertEquals(sync.getMessage(), reported.getMessage(), backend + ": the later check words it as checkErrors does");
                        assertSame(reported, assertThrows(CommException.class, later::await), backend + ": the outcome stays");
                        moe.checkErrors(streams);  // the later check cleared the word: nothing left for the next check
                        // clean again: the clear left nothing behind for the next later check
                        dispatch(moe, devs, streams, a, null);
                        ErrorCheck after = moe.errorsAfter(streams);
                        after.await();
                        assertTrue(after.poll(), backend + ": a clean dispatch after a reported one reports nothing");
                        if (n == 1) {
                            moe.checkErrors(streams.getFirst());
                            assertTrue(pollUntilDone(moe.errorsAfter(streams.getFirst())));
                        } else {
                            IllegalStateException several = assertThrows(IllegalStateException.class, () -> moe.errorsAfter(streams.getFirst()));
                            assertTrue(several.getMessage().contains("one process per GPU"), several.getMessage());
                            assertThrows(IllegalStateException.class, () -> moe.checkErrors(streams.getFirst()));
                            DeviceBuffer x = devs.getFirst().allocate(2L * TOKENS * HIDDEN, a);
                            IllegalStateException dispatch = assertThrows(IllegalStateException.class, () -> moe.dispatch(x, x, x, TOKENS, streams.getFirst()));
                            assertTrue(dispatch.getMessage().contains("drives " + n + " local ranks"), dispatch.getMessage());
                        }
                        assertThrows(IllegalArgumentException.class, () -> moe.errorsAfter(List.of()), "no stream per local rank");
                    }
                }
            } finally {
                streams.forEach(Stream::close);
            }
        }
        assertEquals(live, NativeResource.liveCount(), () -> "left open:\n" + NativeResource.liveSummary());
    }

    @Test void fp8QuantizeChecksLater() throws Exception {
        GpuRuntime rt = Gpus.runtimeWithDevices(1);
        Gpus.requireKernels(rt, "moe_host");
        Device dev = rt.device(0);
        int live = NativeResource.liveCount();
        try (Arena a = Arena.ofShared(); Stream s = dev.createStream(); Fp8Rows q = new Fp8Rows(dev)) {
            short[] x = new short[TOKENS * HIDDEN];
            for (int i = 0; i < x.length; i++) x[i] = MoeGpuTest.bf16((float) random.nextGaussian());
            DeviceBuffer in = upload(dev, a, MemorySegment.ofArray(x), s), out = dev.allocate(TOKENS * Fp8Rows.rowBytes(HIDDEN), a);
            out.fill((byte) 0x7f, s);
            q.quantize(in, TOKENS, HIDDEN, out, s);
            ErrorCheck check = q.errorsAfter(s);
            assertTrue(pollUntilDone(check), "a clean quantize reports nothing");
            // every element decodes to within an e4m3 step of its input
            float[] got = Fp8RowsGpuTest.decode(out.toByteArray(s), TOKENS, HIDDEN, dev.arch().startsWith("gfx"));
            for (int i = 0; i < x.length; i++) {
                float want = MoeGpuTest.f32(x[i]);
                assertEquals(want, got[i], Math.abs(want) / 8 + 1e-2f, "element " + i);
            }
            try (Stream capturing = dev.createStream()) {
                capturing.beginCapture();
                assertThrows(IllegalStateException.class, () -> q.errorsAfter(capturing));
                capturing.endCapture().close();
            }
            q.quantize(in, TOKENS, HIDDEN, out, s);
            ErrorCheck orphan = q.errorsAfter(s);
            s.synchronize();
            q.close();
            assertThrows(IllegalStateException.class, orphan::poll, "the quantizer was closed before the check reported");
        }
        assertEquals(live, NativeResource.liveCount(), () -> "left open:\n" + NativeResource.liveSummary());
    }
}
