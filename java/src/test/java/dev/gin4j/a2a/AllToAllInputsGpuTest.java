package dev.gin4j.a2a;

import dev.gin4j.comm.Backend;
import dev.gin4j.comm.CommGroup;
import dev.gin4j.comm.Nccl;
import dev.gin4j.gpu.Device;
import dev.gin4j.gpu.DeviceBuffer;
import dev.gin4j.gpu.GpuRuntime;
import dev.gin4j.gpu.Stream;
import dev.gin4j.testing.Gpus;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.SplittableRandom;

import static org.junit.jupiter.api.Assertions.*;

/**
 * Inputs the kernels could not read safely are refused before anything is queued, on both
 * backends: a result fed straight back (peers write it during the call) and, for all-to-all-v,
 * count or offset arrays the kernels could not load as uint64. The exchange still works after.
 * On a blocking and on a nonblocking group (NCCL's host calls polled: window registration, device
 * communicators, the HOST enqueue, the close). Runs on one GPU (every local GPU where there are more).
 */
@Tag("gpu")
class AllToAllInputsGpuTest {
    private final SplittableRandom random = new SplittableRandom();

    @Test void resultsFedBackAndMisalignedCountsAreRefused() {
        GpuRuntime rt = Gpus.runtimeWithDevices(1);
        Gpus.skipUnless(Nccl.isAvailable(), "no NCCL/RCCL: " + Nccl.describe());
        Gpus.requireKernels(rt, "a2a");
        List<Device> devs = rt.devices();
        long perPeer = 256;
        String ncclMode = System.getenv("NCCL_COMM_BLOCKING");  // NCCL obeys it over the configuration: only the mode it allows
        for (boolean nonblocking : new boolean[] {false, true}) {
            if (ncclMode != null && !ncclMode.trim().equals(nonblocking ? "0" : "1")) {
                System.err.println("SKIPPED the " + (nonblocking ? "nonblocking" : "blocking") + " pass: NCCL_COMM_BLOCKING=" + ncclMode + " in the environment");
                continue;
            }
            exchangeAfterRefusals(devs, perPeer, new CommGroup.Options(Duration.ofSeconds(120), nonblocking));
        }
    }

    private void exchangeAfterRefusals(List<Device> devs, long perPeer, CommGroup.Options options) {
        int n = devs.size();
        try (CommGroup g = CommGroup.initAll(devs, options); Arena arena = Arena.ofShared()) {
            List<Stream> streams = new ArrayList<>();
            try {
                for (Device d : devs) streams.add(d.createStream());
                // refused after the ranks compared their arguments: every rank throws together
                IllegalArgumentException zero = assertThrows(IllegalArgumentException.class, () -> AllToAll.create(g, 0, Backend.GIN));
                assertTrue(zero.getMessage().contains("maxBytesPerPeer must be >= 1, got 0"), zero.getMessage());
                IllegalArgumentException noBackend = assertThrows(IllegalArgumentException.class, () -> AllToAllV.create(g, 64, null));
                assertTrue(noBackend.getMessage().contains("a backend must be given"), noBackend.getMessage());
                for (Backend backend : Backend.values()) {
                    try (AllToAll a = AllToAll.create(g, 4096, backend); AllToAllV v = AllToAllV.create(g, 4096, backend)) {
                        List<DeviceBuffer> results = new ArrayList<>(), vResults = new ArrayList<>(), in = new ArrayList<>(), counts = new ArrayList<>(), offs = new ArrayList<>();
                        byte[][] data = new byte[n][];
                        for (int i = 0; i < n; i++) {
                            results.add(a.output(i).slice(0, perPeer * n));
                            vResults.add(v.output(i).slice(0, perPeer * n));
                            data[i] = new byte[(int) (perPeer * n)];
                            for (int b = 0; b < data[i].length; b++) data[i][b] = (byte) random.nextInt();
                            DeviceBuffer x = devs.get(i).allocate(data[i].length, arena);
                            x.copyFromHost(MemorySegment.ofArray(data[i]));
                            in.add(x);
                            long[] c = new long[n], o = new long[n];
                            for (int p = 0; p < n; p++) { c[p] = perPeer; o[p] = p * perPeer; }
                            // 8 spare bytes in front: the slice at 4 is misaligned, the one at 8 is not
                            DeviceBuffer cb = devs.get(i).allocate(8L * n + 8, arena), ob = devs.get(i).allocate(8L * n + 8, arena);
                            cb.slice(8, 8L * n).copyFromHost(MemorySegment.ofArray(c));
                            ob.slice(8, 8L * n).copyFromHost(MemorySegment.ofArray(o));
                            counts.add(cb);
                            offs.add(ob);
                        }
                        String what = backend + (options.nonblocking() ? ", nonblocking" : "") + ": ";
                        IllegalArgumentException fedBack = assertThrows(IllegalArgumentException.class, () -> a.run(results, perPeer, streams), what);
                        assertTrue(fedBack.getMessage().contains("overlaps this all-to-all's receive area"), what + fedBack.getMessage());
                        List<DeviceBuffer> aligned = counts.stream().map(b -> b.slice(8, 8L * n)).toList(), alignedOffs = offs.stream().map(b -> b.slice(8, 8L * n)).toList();
                        List<DeviceBuffer> misaligned = counts.stream().map(b -> b.slice(4, 8L * n)).toList();
                        IllegalArgumentException odd = assertThrows(IllegalArgumentException.class, () -> v.run(in, misaligned, alignedOffs, streams), what);
                        assertTrue(odd.getMessage().contains("8-byte aligned"), what + odd.getMessage());
                        IllegalArgumentException vFedBack = assertThrows(IllegalArgumentException.class, () -> v.run(vResults, aligned, alignedOffs, streams), what);
                        assertTrue(vFedBack.getMessage().contains("overlaps this all-to-all-v's receive area"), what + vFedBack.getMessage());
                        // nothing was queued by the refused calls: both still deliver every byte
                        for (int i = 0; i < n; i++) {
                            a.output(i).fill((byte) 0x5a, streams.get(i));
                            v.output(i).fill((byte) 0x5a, streams.get(i));
                        }
                        a.run(in, perPeer, streams);
                        v.run(in, aligned, alignedOffs, streams);
                        a.checkErrors(streams);
                        v.checkErrors(streams);
                        for (int r = 0; r < n; r++) {
                            byte[] got = a.result(r).toByteArray(), gotV = v.output(r).toByteArray();  // all-to-all-v: slot s at s * capacity
                            for (int s = 0; s < n; s++)
                                for (int b = 0; b < perPeer; b++) {
                                    byte want = data[s][(int) (r * perPeer + b)];
                                    assertEquals(want, got[(int) (s * perPeer + b)], what + "all-to-all rank " + r + " from " + s + " byte " + b);
                                    assertEquals(want, gotV[(int) (s * v.capacityPerPeer() + b)], what + "all-to-all-v rank " + r + " from " + s + " byte " + b);
                                }
                        }
                    }
                }
            } finally {
                streams.forEach(Stream::close);
            }
        }
    }
}
