package dev.gin4j.a2a;

import dev.gin4j.comm.DType;
import dev.gin4j.comm.Backend;
import dev.gin4j.comm.CommException;
import dev.gin4j.comm.CommGroup;
import dev.gin4j.comm.Nccl;
import dev.gin4j.gpu.Device;
import dev.gin4j.gpu.DeviceBuffer;
import dev.gin4j.gpu.Graph;
import dev.gin4j.gpu.GpuRuntime;
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

import static org.junit.jupiter.api.Assertions.*;

/** GIN all-to-all(-v) against the CPU oracle and the HOST baseline, one process driving every GPU. */
@Tag("gpu")
@TestInstance(TestInstance.Lifecycle.PER_CLASS)
class AllToAllGpuTest {
    private static final long MAX_BYTES_PER_RANK = 1L << 30;
    private final SplittableRandom random = new SplittableRandom();
    private CommGroup group;
    private List<Device> devs;
    private List<Stream> streams;
    private Arena arena;
    private int n;
    private long maxPerPeer;  // 1 GiB per rank, split over the ranks
    private boolean ll128Validated;  // NVIDIA: LL128 relies on NVLink delivering a 128-byte line whole (not validated on AMD)

    @BeforeAll void setUp() {
        GpuRuntime rt = Gpus.runtimeWithDevices(2);
        Gpus.skipUnless(Nccl.isAvailable(), "no NCCL/RCCL: " + Nccl.describe());
        Gpus.requireKernels(rt, "a2a");
        devs = rt.devices();
        n = devs.size();
        maxPerPeer = MAX_BYTES_PER_RANK / n;
        ll128Validated = rt.isCuda();
        if (!ll128Validated) System.err.println("AllToAllGpuTest: LL128 cases skipped: LL128 is not validated on AMD (" + rt.name() + ")");
        group = CommGroup.initAll(devs);
        arena = Arena.ofShared();
        streams = new ArrayList<>();
        for (Device d : devs) streams.add(d.createStream());
    }

    @AfterAll void tearDown() {
        if (streams != null) streams.forEach(Stream::close);
        if (arena != null) arena.close();
        if (group != null) group.close();
    }

    private byte[] randomBytes(long size) {
        byte[] b = new byte[Math.toIntExact(size)];
        for (int i = 0; i < b.length; i += 8) {
            long v = random.nextLong();
            for (int k = 0; k < 8 && i + k < b.length; k++) b[i + k] = (byte) (v >>> (8 * k));
        }
        return b;
    }

    private List<DeviceBuffer> upload(byte[][] data, int extra) {
        List<DeviceBuffer> out = new ArrayList<>();
        for (int i = 0; i < n; i++) {
            DeviceBuffer b = devs.get(i).allocate(data[i].length + extra, arena).slice(extra, data[i].length); // extra: misaligned start
            b.copyFromHost(MemorySegment.ofArray(data[i]));
            out.add(b);
        }
        return out;
    }

    private void poison(AllToAll a, long bytes) {
        for (int i = 0; i < n; i++) a.output(i).slice(0, bytes).fill((byte) 0xab, streams.get(i));
    }

    /** Checks rank i's output against the oracle: block from s is data[s][i*b, (i+1)*b). */
    private void checkUniform(AllToAll a, byte[][] data, long b, String what) {
        for (int i = 0; i < n; i++) {
            byte[] got = a.result(i).toByteArray();
            for (int s = 0; s < n; s++) {
                int from = Math.toIntExact(i * b), to = Math.toIntExact((i + 1) * b);
                if (!Arrays.equals(data[s], from, to, got, Math.toIntExact(s * b), Math.toIntExact((s + 1) * b))) {
                    fail(what + ": rank " + i + " block from " + s + " differs (" + b + " bytes per peer)");
                }
            }
        }
    }

    @Test void uniformEverySizeBothProtocolsMatchesOracleAndHost() {
        try (AllToAll ginA = AllToAll.create(group, maxPerPeer, Backend.GIN); AllToAll host = AllToAll.create(group, maxPerPeer, Backend.HOST)) {
            long[] perPeer = {0, 1, 3, 17, 119, 121, 241, 2047, 2048, 4095, 32768 + 5, 131072, 524288 + 3, (1L << 20) + 1, 4L << 20, 8L << 20, (maxPerPeer / 4) + 9, maxPerPeer};
            for (long b : perPeer) {
                byte[][] data = new byte[n][];
                for (int i = 0; i < n; i++) data[i] = randomBytes(b * n);
                List<DeviceBuffer> in = upload(data, (int) (b % 7));
                List<Protocol> protocols = new ArrayList<>(List.of(Protocol.AUTO));
                if (b <= Plan.LL_MAX_BYTES_PER_PEER) protocols.add(Protocol.LL);
                if (b <= Plan.LL128_MAX_BYTES_PER_PEER && ll128Validated) protocols.add(Protocol.LL128);
                if (b <= Plan.LL128_MAX_BYTES_PER_PEER) protocols.add(Protocol.DIRECT);
                protocols.add(Protocol.COPY_ENGINE);  // any size (AUTO takes it above COPY_ENGINE_MIN_PEER_BYTES sent to peers on NVIDIA)
                for (Protocol p : protocols) {
                    poison(ginA, b * n);
                    ginA.protocol(p).run(in, b, streams);
                    ginA.checkErrors(streams);
                    checkUniform(ginA, data, b, "GIN " + p);
                }
                poison(host, b * n);
                host.run(in, b, streams);
                host.checkErrors(streams);
                checkUniform(host, data, b, "HOST");
            }
            ginA.protocol(Protocol.AUTO);
        }
    }

    @Test void elementTypesAndBadInputs() {
        try (AllToAll a = AllToAll.create(group, 1 << 20, Backend.GIN)) {
            for (DType t : new DType[] {DType.BF16, DType.FP32, DType.INT8}) {
                long count = 1000 + random.nextInt(5000);
                long b = count * t.bytes();
                byte[][] data = new byte[n][];
                for (int i = 0; i < n; i++) data[i] = randomBytes(b * n);
                List<DeviceBuffer> in = upload(data, 0);
                poison(a, b * n);
                a.runElements(in, count, t, streams);
                a.checkErrors(streams);
                checkUniform(a, data, b, "GIN " + t);
            }
            List<DeviceBuffer> small = new ArrayList<>();
            for (Device d : devs) small.add(d.allocate(16, arena));
            IllegalArgumentException tooBig = assertThrows(IllegalArgumentException.class, () -> a.run(small, 2L << 20, streams));
            assertTrue(tooBig.getMessage().contains("created for"), tooBig.getMessage());
            IllegalArgumentException shortIn = assertThrows(IllegalArgumentException.class, () -> a.run(small, 1024, streams));
            assertTrue(shortIn.getMessage().contains("needed"), shortIn.getMessage());
            assertThrows(IllegalArgumentException.class, () -> a.runElements(small, -1, DType.FP32, streams));
            List<DeviceBuffer> swapped = new ArrayList<>(small);
            swapped.set(0, small.get(1));
            swapped.set(1, small.get(0));
            IllegalArgumentException wrongDev = assertThrows(IllegalArgumentException.class, () -> a.run(swapped, 1, streams));
            assertTrue(wrongDev.getMessage().contains("is on"), wrongDev.getMessage());
        }
    }

    @Test void backToBackAndGraphReplaysStayCorrect() {
        long b = 40_000;
        try (AllToAll a = AllToAll.create(group, 1 << 20, Backend.GIN)) {
            List<Protocol> protocols = ll128Validated ? List.of(Protocol.LL, Protocol.LL128, Protocol.DIRECT, Protocol.COPY_ENGINE)
                    : List.of(Protocol.LL, Protocol.DIRECT, Protocol.COPY_ENGINE);
            for (Protocol p : protocols) {
                a.protocol(p);
                byte[][] d0 = new byte[n][], d1 = new byte[n][];
                for (int i = 0; i < n; i++) { d0[i] = randomBytes(b * n); d1[i] = randomBytes(b * n); }
                List<DeviceBuffer> in0 = upload(d0, 0), in1 = upload(d1, 0);
                for (int call = 0; call < 1000; call++) a.run(call % 2 == 0 ? in0 : in1, b, streams);
                a.checkErrors(streams);
                checkUniform(a, d1, b, "1000 back-to-back " + p);
                // graph: capture one call per rank, replay 1000 times alternating inputs through two graphs
                List<Graph> g0 = new ArrayList<>(), g1 = new ArrayList<>();
                try {
                    for (int i = 0; i < n; i++) {
                        streams.get(i).beginCapture();
                        a.run(i, in0.get(i), b, streams.get(i));
                        g0.add(streams.get(i).endCapture());
                        streams.get(i).beginCapture();
                        a.run(i, in1.get(i), b, streams.get(i));
                        g1.add(streams.get(i).endCapture());
                    }
                    for (int rep = 0; rep < 1000; rep++) {
                        for (int i = 0; i < n; i++) (rep % 2 == 0 ? g0 : g1).get(i).launch(streams.get(i));
                    }
                    a.checkErrors(streams);
                    checkUniform(a, d1, b, "1000 graph replays " + p);
                } finally {
                    g0.forEach(Graph::close);
                    g1.forEach(Graph::close);
                }
            }
            a.protocol(Protocol.AUTO);
        }
    }

    /**
     * Protocols switched from call to call on one window (LL, LL128, direct and the copy engines
     * share the receive slots; LL and LL128 have their own staging and counters, the copy engines
     * share the direct protocol's signals): 200 calls each checked, then 1000 back to back
     * without a host sync, checked at the end. Sizes around LL128's 120-byte lines and odd ones.
     */
    @Test void switchingProtocolsCallToCallStaysCorrect() {
        Gpus.skipUnless(ll128Validated, "LL128 is not validated on AMD: protocol switching with LL128 skipped");
        long[] sizes = {1, 119, 120, 121, 240, 241, 4096 + 3, 65536, 100_003, 262_144};
        Protocol[] protocols = {Protocol.LL, Protocol.LL128, Protocol.DIRECT, Protocol.COPY_ENGINE, Protocol.AUTO};
        try (AllToAll a = AllToAll.create(group, 300_000, Backend.GIN)) {
            List<List<DeviceBuffer>> inputs = new ArrayList<>();
            List<byte[][]> datas = new ArrayList<>();
            for (long b : sizes) {
                byte[][] d = new byte[n][];
                for (int i = 0; i < n; i++) d[i] = randomBytes(b * n);
                datas.add(d);
                inputs.add(upload(d, (int) (b % 5)));
            }
            for (int call = 0; call < 200; call++) {
                int k = random.nextInt(sizes.length);
                Protocol p = protocols[random.nextInt(protocols.length)];
                poison(a, sizes[k] * n);
                a.protocol(p).run(inputs.get(k), sizes[k], streams);
                a.checkErrors(streams);
                checkUniform(a, datas.get(k), sizes[k], "call " + call + " " + p);
            }
            int last = 0;
            for (int call = 0; call < 1000; call++) {
                last = random.nextInt(sizes.length);
                a.protocol(protocols[call % protocols.length]).run(inputs.get(last), sizes[last], streams);
            }
            a.checkErrors(streams);
            checkUniform(a, datas.get(last), sizes[last], "1000 back-to-back calls switching protocols");
            a.protocol(Protocol.AUTO);
        }
    }

    @Test void allToAllVForcedLl128MatchesOracle() {
        Gpus.skipUnless(ll128Validated, "LL128 is not validated on AMD: forced LL128 all-to-all-v skipped");
        long cap = 200_003;
        try (AllToAllV gv = AllToAllV.create(group, cap, Backend.GIN)) {
            gv.protocol(Protocol.LL128);
            for (int round = 0; round < 6; round++) {
                long[][] cnt = new long[n][n];
                for (int i = 0; i < n; i++) for (int p = 0; p < n; p++) {
                    cnt[i][p] = switch (round) {
                        case 0 -> 0;
                        case 1 -> 119 + p;                      // around one LL128 line
                        case 2 -> p == 1 ? cap : 0;             // one peer takes everything
                        default -> random.nextInt(5) == 0 ? 0 : random.nextLong(cap + 1);
                    };
                }
                check(gv, cnt, cap, round, false);
            }
            long[][] over = new long[n][n];
            for (long[] row : over) Arrays.fill(row, 241);
            over[1][0] = cap + 1;
            check(gv, over, cap, 98, true);
        }
    }

    /** All-to-all-v cannot use the copy engines (the host does not know the counts): forcing them runs the direct protocol. */
    @Test void allToAllVForcedCopyEngineRunsDirect() {
        long cap = 100_000;
        try (AllToAllV gv = AllToAllV.create(group, cap, Backend.GIN)) {
            gv.protocol(Protocol.COPY_ENGINE);
            for (int round = 0; round < 3; round++) {
                long[][] cnt = new long[n][n];
                for (int i = 0; i < n; i++) for (int p = 0; p < n; p++) cnt[i][p] = random.nextInt(4) == 0 ? 0 : random.nextLong(cap + 1);
                check(gv, cnt, cap, round, false);
            }
        }
    }

    @Test void allToAllVRandomSkewedAndOverCapacity() {
        long cap = 300_000;
        try (AllToAllV gv = AllToAllV.create(group, cap, Backend.GIN); AllToAllV hv = AllToAllV.create(group, cap, Backend.HOST)) {
            for (int round = 0; round < 8; round++) {
                long[][] cnt = new long[n][n];
                for (int i = 0; i < n; i++) for (int p = 0; p < n; p++) {
                    cnt[i][p] = switch (round) {
                        case 0 -> 0;
                        case 1 -> p == 0 ? cap : 0;               // one peer takes everything
                        case 2 -> random.nextInt(64);             // tiny
                        default -> random.nextInt(4) == 0 ? 0 : random.nextLong(cap + 1);
                    };
                }
                check(gv, cnt, cap, round, false);
                check(hv, cnt, cap, round, false);
            }
            long[][] over = new long[n][n];
            for (long[] row : over) Arrays.fill(row, 1000);
            over[0][1] = cap + 4096;
            check(gv, over, cap, 99, true);
        }
    }

    private void check(AllToAllV v, long[][] cnt, long cap, int round, boolean expectClamp) {
        byte[][] data = new byte[n][];
        long[][] off = new long[n][n];
        List<DeviceBuffer> in = new ArrayList<>(), counts = new ArrayList<>(), offs = new ArrayList<>();
        for (int i = 0; i < n; i++) {
            long total = 0;
            for (int p = 0; p < n; p++) { off[i][p] = total; total += cnt[i][p]; }
            data[i] = randomBytes(total + 1);
            DeviceBuffer d = devs.get(i).allocate(data[i].length, arena);
            d.copyFromHost(MemorySegment.ofArray(data[i]));
            in.add(expectClamp ? d.slice(0, data[i].length) : d);
            DeviceBuffer c = devs.get(i).allocate(8L * n, arena), o = devs.get(i).allocate(8L * n, arena);
            c.copyFromHost(MemorySegment.ofArray(cnt[i].clone()));
            o.copyFromHost(MemorySegment.ofArray(off[i].clone()));
            counts.add(c); offs.add(o);
            v.output(i).fill((byte) 0xcd, streams.get(i));
            v.receivedCounts(i).fill((byte) 0xee, streams.get(i));
        }
        if (expectClamp && v.backend() == Backend.GIN) {
            v.run(in, counts, offs, streams);
            CommException e = assertThrows(CommException.class, () -> v.checkErrors(streams));
            assertTrue(e.getMessage().contains("clamped"), e.getMessage());
            return;
        }
        v.run(in, counts, offs, streams);
        v.checkErrors(streams);
        for (int i = 0; i < n; i++) {
            byte[] got = v.output(i).toByteArray();
            long[] rc = new long[n];
            MemorySegment.copy(MemorySegment.ofArray(v.receivedCounts(i).toByteArray()), ValueLayout.JAVA_LONG_UNALIGNED, 0, rc, 0, n);
            for (int s = 0; s < n; s++) {
                assertEquals(cnt[s][i], rc[s], v.backend() + " round " + round + ": count at rank " + i + " from " + s);
                int from = Math.toIntExact(off[s][i]);
                assertTrue(Arrays.equals(data[s], from, from + (int) cnt[s][i], got, (int) (s * cap), (int) (s * cap + cnt[s][i])),
                        v.backend() + " round " + round + ": bytes at rank " + i + " from " + s);
            }
        }
    }
}
