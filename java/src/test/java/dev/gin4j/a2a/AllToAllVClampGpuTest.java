package dev.gin4j.a2a;

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
import dev.gin4j.testing.Gpus;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.SplittableRandom;

import static org.junit.jupiter.api.Assertions.*;

/**
 * Counts that do not fit are clamped the same way on both backends, the exchange still completes
 * on every rank, and checkErrors reports it once. Runs on one GPU (every local GPU where there are more).
 */
@Tag("gpu")
class AllToAllVClampGpuTest {
    private static final long CAP = 4096;
    private final SplittableRandom random = new SplittableRandom();

    @Test void overCapacityAndPastTheInputAreClampedAndReportedOnBothBackends() throws InterruptedException {
        GpuRuntime rt = Gpus.runtimeWithDevices(1);
        Gpus.skipUnless(Nccl.isAvailable(), "no NCCL/RCCL: " + Nccl.describe());
        Gpus.requireKernels(rt, "a2a");
        int live = NativeResource.liveCount();
        List<Device> devs = rt.devices();
        int n = devs.size();
        try (CommGroup g = CommGroup.initAll(devs); Arena arena = Arena.ofShared()) {
            List<Stream> streams = new ArrayList<>();
            try {
                for (Device d : devs) streams.add(d.createStream());
                for (Backend backend : Backend.values()) {
                    try (AllToAllV v = AllToAllV.create(g, CAP, backend)) {
                        // rank 0 sends 4096 + 1000 bytes to the last rank (clamped to 4096), and to rank 0 from
                        // an offset past its input (nothing); every other (source, peer) sends 1000 bytes
                        long[][] cnt = new long[n][n], off = new long[n][n], want = new long[n][n];
                        byte[][] data = new byte[n][];
                        for (int i = 0; i < n; i++) {
                            data[i] = new byte[(int) (CAP + 1000L * n + 64)];
                            for (int b = 0; b < data[i].length; b++) data[i][b] = (byte) random.nextInt();
                            long at = 0;
                            for (int p = 0; p < n; p++) { cnt[i][p] = 1000; off[i][p] = at; at += 1000; want[i][p] = 1000; }
                        }
                        cnt[0][n - 1] = CAP + 1000; off[0][n - 1] = 64; want[0][n - 1] = CAP;
                        if (n > 1) { cnt[0][0] = 1000; off[0][0] = Long.MAX_VALUE - 16; want[0][0] = 0; }
                        List<DeviceBuffer> in = new ArrayList<>(), counts = new ArrayList<>(), offs = new ArrayList<>();
                        for (int i = 0; i < n; i++) {
                            DeviceBuffer d = devs.get(i).allocate(data[i].length, arena);
                            d.copyFromHost(MemorySegment.ofArray(data[i]));
                            DeviceBuffer c = devs.get(i).allocate(8L * n, arena), o = devs.get(i).allocate(8L * n, arena);
                            c.copyFromHost(MemorySegment.ofArray(cnt[i].clone()));
                            o.copyFromHost(MemorySegment.ofArray(off[i].clone()));
                            in.add(d); counts.add(c); offs.add(o);
                            v.output(i).fill((byte) 0xcd, streams.get(i));
                            v.receivedCounts(i).fill((byte) 0xee, streams.get(i));
                        }
                        v.run(in, counts, offs, streams);
                        CommException e = assertThrows(CommException.class, () -> v.checkErrors(streams), backend + ": clamping must be reported");
                        assertTrue(e.getMessage().contains("clamped"), backend + ": " + e.getMessage());
                        for (int i = 0; i < n; i++) {
                            byte[] got = v.output(i).toByteArray();
                            long[] rc = v.receivedCounts(i).readLongs(n);
                            for (int s = 0; s < n; s++) {
                                assertEquals(want[s][i], rc[s], backend + ": count at rank " + i + " from " + s);
                                int from = (int) Math.min(off[s][i], data[s].length);
                                assertTrue(Arrays.equals(data[s], from, from + (int) want[s][i], got, (int) (s * CAP), (int) (s * CAP + want[s][i])),
                                        backend + ": bytes at rank " + i + " from " + s);
                            }
                        }
                        v.checkErrors(streams);  // reported once: the next check is clean

                        // the same call checked later (errorsAfter): the same report, with the same text, and only once
                        for (int i = 0; i < n; i++) {
                            v.output(i).fill((byte) 0xcd, streams.get(i));
                            v.receivedCounts(i).fill((byte) 0xee, streams.get(i));
                        }
                        v.run(in, counts, offs, streams);
                        ErrorCheck later = v.errorsAfter(streams);
                        CommException laterError = assertThrows(CommException.class, () -> SingleRankAndLaterChecksGpuTest.pollUntilDone(later), backend + ": the later check must report the clamping");
                        assertEquals(e.getMessage(), laterError.getMessage(), backend + ": the later check words it as checkErrors does");
                        assertSame(laterError, assertThrows(CommException.class, later::poll), backend + ": the outcome stays");
                        for (int i = 0; i < n; i++)
                            assertEquals(want[0][i], v.receivedCounts(i).readLongs(n, streams.get(i))[0], backend + ": count at rank " + i + " from 0 (second call)");
                        v.checkErrors(streams);  // the later check took the report: nothing left
                        // a clean call, checked later: nothing reported
                        for (int i = 0; i < n; i++) {
                            long[] fits = new long[n];
                            for (int p = 0; p < n; p++) fits[p] = 1000L * p;
                            counts.get(i).copyFromHost(MemorySegment.ofArray(new long[n]), streams.get(i));  // zero bytes to every peer
                            offs.get(i).copyFromHost(MemorySegment.ofArray(fits), streams.get(i));
                        }
                        v.run(in, counts, offs, streams);
                        ErrorCheck clean = v.errorsAfter(streams);
                        assertTrue(SingleRankAndLaterChecksGpuTest.pollUntilDone(clean), backend + ": a clean call reports nothing");
                        for (int i = 0; i < n; i++) {
                            long[] rc = v.receivedCounts(i).readLongs(n, streams.get(i));
                            for (int src = 0; src < n; src++) assertEquals(0, rc[src], backend + ": zero bytes at rank " + i + " from " + src);
                        }
                    }
                }
            } finally {
                streams.forEach(Stream::close);
            }
        }
        assertEquals(live, NativeResource.liveCount(), () -> "left open:\n" + NativeResource.liveSummary());
    }
}
