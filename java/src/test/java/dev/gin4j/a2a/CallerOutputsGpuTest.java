package dev.gin4j.a2a;

import dev.gin4j.comm.Backend;
import dev.gin4j.comm.CommGroup;
import dev.gin4j.comm.DType;
import dev.gin4j.comm.Nccl;
import dev.gin4j.gpu.Device;
import dev.gin4j.gpu.DeviceBuffer;
import dev.gin4j.gpu.GpuRuntime;
import dev.gin4j.gpu.Graph;
import dev.gin4j.gpu.NativeResource;
import dev.gin4j.gpu.Stream;
import dev.gin4j.testing.Gpus;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.function.Executable;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.SplittableRandom;

import static org.junit.jupiter.api.Assertions.*;

/**
 * AllToAll and AllToAllV into caller-owned outputs, on both backends: every byte of the caller's
 * output against the oracle (fresh random inputs, outputs poisoned before each call, at odd
 * addresses, with a poisoned guard after them that no call may write), a second call into another
 * output leaves the first untouched, {@code result()} refuses after a call into a caller's output
 * and works again after one without, HOST leaves the instance's receive area as it was (NCCL
 * receives straight into the output), GIN back to back and replayed from graphs alternating two
 * outputs, and the refusals (null, too small, another device, overlap with the input, the counts
 * or the instance's memory). The one-process-per-GPU forms on a group of one rank (one GPU); the
 * list forms on every local GPU (two at least).
 */
@Tag("gpu")
class CallerOutputsGpuTest {
    private static final int MAX = 4096, GUARD = 64;
    private static final byte POISON = (byte) 0xff, OWN_POISON = (byte) 0x5a;
    private final SplittableRandom random = new SplittableRandom();

    /** The ranks this process drives: devices, one stream each, and the arena of the test's buffers. */
    private record Ranks(List<Device> devs, List<Stream> streams, Arena arena) {
        int n() { return devs.size(); }
        Stream s(int i) { return streams.get(i); }
    }

    /** A uniform call into outputs, in one of its forms. */
    private interface Uniform { void run(List<DeviceBuffer> in, List<DeviceBuffer> out, long bytesPerPeer); }
    /** A uniform call of elements into outputs, in one of its forms. */
    private interface Elements { void run(List<DeviceBuffer> in, List<DeviceBuffer> out, long count, DType type); }
    /** An all-to-all-v call into outputs, in one of its forms. */
    private interface VCall { void run(List<DeviceBuffer> in, List<DeviceBuffer> out, List<DeviceBuffer> counts, List<DeviceBuffer> offsets); }

    private static void requireGpus(GpuRuntime rt) {
        Gpus.skipUnless(Nccl.isAvailable(), "no NCCL/RCCL: " + Nccl.describe());
        Gpus.requireKernels(rt, "a2a");
    }

    private static List<Protocol> uniformProtocols(Backend backend, GpuRuntime rt, boolean copyEngine) {
        if (backend == Backend.HOST) return List.of(Protocol.AUTO);
        List<Protocol> p = new ArrayList<>(List.of(Protocol.AUTO, Protocol.LL, Protocol.DIRECT));
        if (rt.isCuda()) p.add(Protocol.LL128);  // LL128 is validated on NVIDIA only
        if (copyEngine) p.add(Protocol.COPY_ENGINE);
        return p;
    }

    @Test void oneRankFormsWriteTheCallersOutputAndRefuseBadOnes() {
        GpuRuntime rt = Gpus.runtimeWithDevices(1);
        requireGpus(rt);
        int live = NativeResource.liveCount();
        Device dev = rt.device(0);
        try (CommGroup g = CommGroup.initAll(List.of(dev)); Arena arena = Arena.ofShared(); Stream s = dev.createStream()) {
            Ranks r = new Ranks(List.of(dev), List.of(s), arena);
            for (Backend backend : Backend.values()) {
                try (AllToAll a = AllToAll.create(g, MAX, backend); AllToAllV v = AllToAllV.create(g, MAX, backend)) {
                    for (Protocol p : uniformProtocols(backend, rt, false)) {
                        String what = backend + " " + p + ", one rank: ";
                        a.protocol(p);
                        v.protocol(p);
                        uniformRound(r, a, (in, out, b) -> a.run(in.get(0), out.get(0), b, s),
                                (in, out, c, t) -> a.runElements(in.get(0), out.get(0), c, t, s), what);
                        vRound(r, v, (in, out, c, o) -> v.run(in.get(0), out.get(0), c.get(0), o.get(0), s), what);
                    }
                    a.protocol(Protocol.AUTO);
                    v.protocol(Protocol.AUTO);
                    uniformRound(r, a, (in, out, b) -> a.run(0, in.get(0), out.get(0), b, s),
                            (in, out, c, t) -> a.runElements(in.get(0), out.get(0), c, t, s), backend + ", run(localIndex, input, output, ..): ");
                    if (backend == Backend.GIN) backToBackAndCaptured(r, a, "GIN, one rank: ");
                    refusalsOnOneRank(rt, r, a, v, backend + ": ");
                }
            }
        }
        assertEquals(live, NativeResource.liveCount(), () -> "left open:\n" + NativeResource.liveSummary());
    }

    @Test void listFormsWriteEveryRanksOutputAndRefuseBadOnes() {
        GpuRuntime rt = Gpus.runtimeWithDevices(2);
        requireGpus(rt);
        List<Device> devs = rt.devices();
        int n = devs.size();
        try (CommGroup g = CommGroup.initAll(devs); Arena arena = Arena.ofShared()) {
            List<Stream> streams = new ArrayList<>();
            try {
                for (Device d : devs) streams.add(d.createStream());
                Ranks r = new Ranks(devs, streams, arena);
                for (Backend backend : Backend.values()) {
                    try (AllToAll a = AllToAll.create(g, MAX, backend); AllToAllV v = AllToAllV.create(g, MAX, backend)) {
                        for (Protocol p : uniformProtocols(backend, rt, true)) {
                            String what = backend + " " + p + ", " + n + " ranks: ";
                            a.protocol(p);
                            uniformRound(r, a, (in, out, b) -> a.run(in, out, b, streams), (in, out, c, t) -> a.runElements(in, out, c, t, streams), what);
                            if (p != Protocol.COPY_ENGINE) {  // all-to-all-v has no copy-engine variant
                                v.protocol(p);
                                vRound(r, v, (in, out, c, o) -> v.run(in, out, c, o, streams), what);
                            }
                        }
                        a.protocol(Protocol.AUTO);
                        v.protocol(Protocol.AUTO);
                        if (backend == Backend.GIN) {
                            // one rank's part at a time (what a graph capture of one stream takes)
                            uniformRound(r, a, (in, out, b) -> { for (int i = 0; i < n; i++) a.run(i, in.get(i), out.get(i), b, streams.get(i)); },
                                    (in, out, c, t) -> a.runElements(in, out, c, t, streams), "GIN, run(localIndex, input, output, ..): ");
                            backToBackAndCaptured(r, a, "GIN, " + n + " ranks: ");
                        }
                        refusalsOfLists(r, a, v, backend + ": ");
                    }
                }
            } finally {
                streams.forEach(Stream::close);
            }
        }
    }

    private byte[] randomBytes(long size) {
        byte[] b = new byte[Math.toIntExact(size)];
        for (int i = 0; i < b.length; i += 8) {
            long x = random.nextLong();
            for (int k = 0; k < 8 && i + k < b.length; k++) b[i + k] = (byte) (x >>> (8 * k));
        }
        return b;
    }

    /** Fresh random bytes for each rank, {@code bytes} each. */
    private byte[][] randomData(int n, long bytes) {
        byte[][] d = new byte[n][];
        for (int i = 0; i < n; i++) d[i] = randomBytes(bytes);
        return d;
    }

    /** Each rank's data on its GPU, at a start of random alignment. */
    private List<DeviceBuffer> upload(Ranks r, byte[][] data) {
        List<DeviceBuffer> out = new ArrayList<>();
        for (int i = 0; i < r.n(); i++) {
            int at = random.nextInt(8);
            DeviceBuffer b = r.devs().get(i).allocate(data[i].length + 8L, r.arena()).slice(at, data[i].length);
            b.copyFromHost(MemorySegment.ofArray(data[i]), r.s(i));
            out.add(b);
        }
        return out;
    }

    /** uint64 values for each rank, on its GPU (8-byte aligned, as the kernels load them). */
    private static List<DeviceBuffer> uploadLongs(Ranks r, long[][] values) {
        List<DeviceBuffer> out = new ArrayList<>();
        for (int i = 0; i < r.n(); i++) {
            DeviceBuffer b = r.devs().get(i).allocate(8L * values[i].length, r.arena());
            b.copyFromHost(MemorySegment.ofArray(values[i]), r.s(i));
            out.add(b);
        }
        return out;
    }

    /**
     * Per rank, {@code bytes} of poisoned memory at an odd address (outputs take any alignment),
     * followed by GUARD poisoned bytes that no call may write (see {@link #assertGuardIntact}).
     */
    private List<DeviceBuffer> poisoned(Ranks r, long bytes) {
        List<DeviceBuffer> out = new ArrayList<>();
        for (int i = 0; i < r.n(); i++) {
            int at = 1 + 2 * random.nextInt(4);
            DeviceBuffer b = r.devs().get(i).allocate(at + bytes + GUARD, r.arena());
            b.fill(POISON, r.s(i));
            out.add(b.slice(at, bytes));
        }
        return out;
    }

    /** The GUARD bytes after {@code b} (a slice made by {@link #poisoned}) are all still poison. */
    private static void assertGuardIntact(Stream s, DeviceBuffer b, String what) {
        DeviceBuffer wide = DeviceBuffer.wrap(b.device(), MemorySegment.ofAddress(b.address()).reinterpret(b.byteSize() + GUARD));
        byte[] after = wide.slice(b.byteSize(), GUARD).toByteArray(s);
        for (int i = 0; i < after.length; i++)
            if (after[i] != POISON) fail(what + ": byte " + i + " past the output's end was written (0x" + Integer.toHexString(after[i] & 0xff) + ")");
    }

    private static List<byte[]> read(Ranks r, List<DeviceBuffer> bufs) {
        List<byte[]> out = new ArrayList<>();
        for (int i = 0; i < r.n(); i++) out.add(bufs.get(i).toByteArray(r.s(i)));
        return out;
    }

    /** Rank i's result: the block from rank s, {@code data[s][i*b, (i+1)*b)}, at {@code s * b}. */
    private static void checkUniform(byte[][] data, List<byte[]> got, long b, String what) {
        int n = data.length;
        for (int i = 0; i < n; i++) {
            assertTrue(got.get(i).length >= n * b, what + ": rank " + i + " result has " + got.get(i).length + " bytes");
            for (int s = 0; s < n; s++)
                for (int k = 0; k < b; k++) {
                    byte want = data[s][(int) (i * b + k)], have = got.get(i)[(int) (s * b + k)];
                    if (want != have) fail(what + ": rank " + i + ", block from " + s + ", byte " + k + " is 0x" + Integer.toHexString(have & 0xff) + ", expected 0x"
                            + Integer.toHexString(want & 0xff) + " (" + b + " bytes per peer)");
                }
        }
    }

    private static void assertAll(byte[] got, byte value, String what) {
        for (int k = 0; k < got.length; k++)
            if (got[k] != value) fail(what + ": byte " + k + " is 0x" + Integer.toHexString(got[k] & 0xff) + ", expected it left at 0x" + Integer.toHexString(value & 0xff));
    }

    /**
     * A call into one output (bytes), a second into another (elements): each checked byte for byte,
     * the first untouched by the second; {@code result()} refused after them and right again after a
     * call without an output, which leaves both outputs as they were.
     */
    private void uniformRound(Ranks r, AllToAll a, Uniform call, Elements elements, String what) {
        int n = r.n();
        for (int i = 0; i < n; i++) a.output(i).fill(OWN_POISON, r.s(i));  // HOST must leave it so
        long b1 = 1 + random.nextInt(MAX);
        byte[][] d1 = randomData(n, n * b1);
        List<DeviceBuffer> out1 = poisoned(r, n * b1);
        call.run(upload(r, d1), out1, b1);
        a.checkErrors(r.streams());
        List<byte[]> got1 = read(r, out1);
        checkUniform(d1, got1, b1, what + "first output");
        for (int i = 0; i < n; i++) {
            assertGuardIntact(r.s(i), out1.get(i), what + "first output of rank " + i);
            int rank = i;
            IllegalStateException noResult = assertThrows(IllegalStateException.class, () -> a.result(rank), what + "result() after a call into the caller's output");
            assertTrue(noResult.getMessage().contains("into the caller's output"), what + noResult.getMessage());
            if (a.backend() == Backend.HOST)  // NCCL received straight into the caller's output
                assertAll(a.output(i).slice(0, n * b1).toByteArray(r.s(i)), OWN_POISON, what + "the instance's receive area of rank " + i);
        }

        long count = 1 + random.nextInt(MAX / 4), b2 = count * DType.FP32.bytes();
        byte[][] d2 = randomData(n, n * b2);
        List<DeviceBuffer> out2 = poisoned(r, n * b2);
        elements.run(upload(r, d2), out2, count, DType.FP32);
        a.checkErrors(r.streams());
        List<byte[]> got2 = read(r, out2);
        checkUniform(d2, got2, b2, what + "second output (elements)");
        for (int i = 0; i < n; i++) {
            assertGuardIntact(r.s(i), out2.get(i), what + "second output of rank " + i);
            assertArrayEquals(got1.get(i), out1.get(i).toByteArray(r.s(i)), what + "the first output of rank " + i + " after the call into the second");
        }

        long b3 = 1 + random.nextInt(MAX);
        byte[][] d3 = randomData(n, n * b3);
        a.run(upload(r, d3), b3, r.streams());
        a.checkErrors(r.streams());
        List<byte[]> own = new ArrayList<>();
        for (int i = 0; i < n; i++) own.add(a.result(i).toByteArray(r.s(i)));
        checkUniform(d3, own, b3, what + "result() after a call without an output");
        for (int i = 0; i < n; i++) {
            assertArrayEquals(got1.get(i), out1.get(i).toByteArray(r.s(i)), what + "the first output of rank " + i + " after a call without an output");
            assertArrayEquals(got2.get(i), out2.get(i).toByteArray(r.s(i)), what + "the second output of rank " + i + " after a call without an output");
        }
    }

    /**
     * Two all-to-all-v calls of random counts and offsets into two outputs: every received byte,
     * the received counts, the guards, the first output untouched by the second call, and (HOST)
     * the instance's receive slots left as they were.
     */
    private void vRound(Ranks r, AllToAllV v, VCall call, String what) {
        int n = r.n();
        long cap = v.capacityPerPeer();
        List<DeviceBuffer> firstOut = null;
        List<byte[]> firstGot = null;
        for (int round = 0; round < 2; round++) {
            String w = what + "all-to-all-v output " + (round + 1) + ": ";
            long[][] counts = new long[n][n], offsets = new long[n][n];
            byte[][] data = new byte[n][];
            for (int i = 0; i < n; i++) {
                data[i] = randomBytes(cap + random.nextInt((int) cap));
                for (int p = 0; p < n; p++) {
                    counts[i][p] = random.nextInt((int) cap + 1);
                    offsets[i][p] = random.nextInt((int) (data[i].length - counts[i][p] + 1));
                }
            }
            for (int i = 0; i < n; i++) {
                v.output(i).fill(OWN_POISON, r.s(i));
                v.receivedCounts(i).fill((byte) 0xee, r.s(i));
            }
            List<DeviceBuffer> out = poisoned(r, n * cap);
            call.run(upload(r, data), out, uploadLongs(r, counts), uploadLongs(r, offsets));
            v.checkErrors(r.streams());
            List<byte[]> got = read(r, out);
            for (int i = 0; i < n; i++) {
                long[] received = v.receivedCounts(i).readLongs(n, r.s(i));
                for (int s = 0; s < n; s++) {
                    assertEquals(counts[s][i], received[s], w + "rank " + i + ", count from " + s);
                    int from = (int) offsets[s][i], len = (int) counts[s][i];
                    if (!Arrays.equals(data[s], from, from + len, got.get(i), (int) (s * cap), (int) (s * cap + len)))
                        fail(w + "rank " + i + ", slot from " + s + " (" + len + " bytes) differs");
                }
                assertGuardIntact(r.s(i), out.get(i), w + "rank " + i);
                if (v.backend() == Backend.HOST)
                    assertAll(v.output(i).toByteArray(r.s(i)), OWN_POISON, w + "the instance's receive slots of rank " + i);
            }
            if (round == 0) {
                firstOut = out;
                firstGot = got;
            } else {
                for (int i = 0; i < n; i++)
                    assertArrayEquals(firstGot.get(i), firstOut.get(i).toByteArray(r.s(i)), w + "the first output of rank " + i + " after the call into the second");
            }
        }
    }

    /**
     * GIN: 200 calls back to back alternating two inputs into two outputs, without a host sync (each
     * call's copy out of the window must precede the next call's writes into it), then two graphs
     * (one per input and output) captured per rank and replayed 200 times alternating.
     */
    private void backToBackAndCaptured(Ranks r, AllToAll a, String what) {
        int n = r.n();
        long b = 1 + random.nextInt(MAX);
        byte[][] d0 = randomData(n, n * b), d1 = randomData(n, n * b);
        List<DeviceBuffer> in0 = upload(r, d0), in1 = upload(r, d1);
        List<DeviceBuffer> out0 = poisoned(r, n * b), out1 = poisoned(r, n * b);
        for (int call = 0; call < 200; call++) a.run(call % 2 == 0 ? in0 : in1, call % 2 == 0 ? out0 : out1, b, r.streams());
        a.checkErrors(r.streams());
        checkUniform(d0, read(r, out0), b, what + "200 back-to-back calls, first output");
        checkUniform(d1, read(r, out1), b, what + "200 back-to-back calls, second output");
        for (int i = 0; i < n; i++) {
            out0.get(i).fill(POISON, r.s(i));
            out1.get(i).fill(POISON, r.s(i));
        }
        List<Graph> g0 = new ArrayList<>(), g1 = new ArrayList<>();
        try {
            for (int i = 0; i < n; i++) {
                r.s(i).beginCapture();
                a.run(i, in0.get(i), out0.get(i), b, r.s(i));
                g0.add(r.s(i).endCapture());
                r.s(i).beginCapture();
                a.run(i, in1.get(i), out1.get(i), b, r.s(i));
                g1.add(r.s(i).endCapture());
            }
            for (int rep = 0; rep < 200; rep++)
                for (int i = 0; i < n; i++) (rep % 2 == 0 ? g0 : g1).get(i).launch(r.s(i));
            a.checkErrors(r.streams());
            checkUniform(d0, read(r, out0), b, what + "200 graph replays, first output");
            checkUniform(d1, read(r, out1), b, what + "200 graph replays, second output");
        } finally {
            g0.forEach(Graph::close);
            g1.forEach(Graph::close);
        }
    }

    private static void refused(Executable call, String expected, String what) {
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class, call, what);
        assertTrue(e.getMessage().contains(expected), what + ": expected a message with '" + expected + "', got: " + e.getMessage());
    }

    /** The one-rank forms refuse bad outputs, naming what was wrong; nothing is queued, and the next good call works. */
    private void refusalsOnOneRank(GpuRuntime rt, Ranks r, AllToAll a, AllToAllV v, String what) {
        Device dev = r.devs().get(0);
        Stream s = r.s(0);
        Arena arena = r.arena();
        long b = 256, cap = v.capacityPerPeer();
        DeviceBuffer in = dev.allocate(b, arena), good = dev.allocate(b, arena);
        in.fill((byte) 1, s);
        a.run(in, b, s);  // a call without an output: a refused call must leave result() usable
        refused(() -> a.run(in, null, b, s), "output must be given", what + "a null output");
        refused(() -> a.run(in, dev.allocate(b - 1, arena), b, s), "has " + (b - 1) + " bytes; 1 ranks x " + b + " bytes per peer needs " + b, what + "a short output");
        refused(() -> a.runElements(in, dev.allocate(b - 1, arena), b / 4, DType.FP32, s), "needs " + b, what + "a short output for elements");
        refused(() -> a.run(in, in, b, s), "input overlaps the output", what + "the input as output");
        DeviceBuffer wide = dev.allocate(2 * b, arena);
        refused(() -> a.run(wide.slice(0, b), wide.slice(b / 2, b), b, s), "input overlaps the output", what + "an output over half the input");
        refused(() -> a.run(in, a.output(), b, s), "overlaps this all-to-all's", what + "the instance's own receive area as output");
        refused(() -> a.run(0, in, a.output().slice(1, b), b, s), "overlaps this all-to-all's", what + "a slice of the instance's receive area, run(localIndex, ..)");

        DeviceBuffer counts = dev.allocate(8, arena), offsets = dev.allocate(8, arena);
        counts.copyFromHost(MemorySegment.ofArray(new long[] {b}), s);
        offsets.copyFromHost(MemorySegment.ofArray(new long[] {0}), s);
        refused(() -> v.run(in, null, counts, offsets, s), "output must be given", what + "all-to-all-v, a null output");
        refused(() -> v.run(in, dev.allocate(cap - 1, arena), counts, offsets, s), "1 slots of capacityPerPeer = " + cap + " bytes needs " + cap, what + "all-to-all-v, a short output");
        DeviceBuffer big = dev.allocate(2 * cap, arena);
        refused(() -> v.run(big.slice(0, cap), big.slice(cap / 2, cap), counts, offsets, s), "input overlaps the output", what + "all-to-all-v, an output over the input");
        DeviceBuffer withCounts = dev.allocate(cap + 16, arena);
        withCounts.slice(8, 8).copyFromHost(MemorySegment.ofArray(new long[] {b}), s);
        refused(() -> v.run(in, withCounts, withCounts.slice(8, 8), offsets, s), "send counts overlaps the output", what + "all-to-all-v, counts inside the output");
        refused(() -> v.run(in, v.output(), counts, offsets, s), "overlaps this all-to-all-v's", what + "all-to-all-v, the instance's receive slots as output");

        if (rt.devices().size() >= 2) {
            Device other = rt.device(1);
            refused(() -> a.run(in, other.allocate(b, arena), b, s), "expected the rank's device", what + "an output on another GPU");
            refused(() -> v.run(in, other.allocate(cap, arena), counts, offsets, s), "expected the rank's device", what + "all-to-all-v, an output on another GPU");
        } else {
            System.err.println("SKIPPED the refusal of an output on another GPU in CallerOutputsGpuTest: this machine has one GPU");
        }

        // nothing was queued by the refused calls; result() still names the last call without an output
        assertAll(a.result().toByteArray(s), (byte) 1, what + "result() after the refused calls");
        good.fill(POISON, s);
        a.run(in, good, b, s);
        a.checkErrors(s);
        assertAll(good.toByteArray(s), (byte) 1, what + "a good call after the refused ones");
        DeviceBuffer vGood = dev.allocate(cap, arena);
        vGood.fill(POISON, s);
        v.run(in, vGood, counts, offsets, s);
        v.checkErrors(s);
        assertAll(vGood.slice(0, b).toByteArray(s), (byte) 1, what + "all-to-all-v, a good call after the refused ones");
    }

    /** The list forms refuse a missing list, one of another length, and outputs on another rank's GPU. */
    private void refusalsOfLists(Ranks r, AllToAll a, AllToAllV v, String what) {
        int n = r.n();
        long b = 64, cap = v.capacityPerPeer();
        List<DeviceBuffer> in = new ArrayList<>(), out = new ArrayList<>(), vOut = new ArrayList<>(), counts = new ArrayList<>();
        for (int i = 0; i < n; i++) {
            Device d = r.devs().get(i);
            in.add(d.allocate(b * n, r.arena()));
            out.add(d.allocate(b * n, r.arena()));
            vOut.add(d.allocate(cap * n, r.arena()));
            counts.add(d.allocate(8L * n, r.arena()));
            counts.get(i).fill((byte) 0, r.s(i));
        }
        refused(() -> a.run(in, null, b, r.streams()), "outputs must be given", what + "no output list");
        refused(() -> a.run(in, out.subList(0, n - 1), b, r.streams()), "one output per local rank expected (" + n + "), got " + (n - 1), what + "a short output list");
        List<DeviceBuffer> swapped = new ArrayList<>(out);
        swapped.set(0, out.get(1));
        swapped.set(1, out.get(0));
        refused(() -> a.run(in, swapped, b, r.streams()), "expected the rank's device", what + "outputs swapped between GPUs");
        refused(() -> a.runElements(in, swapped, b / 4, DType.FP32, r.streams()), "expected the rank's device", what + "outputs swapped between GPUs, elements");
        List<DeviceBuffer> withNull = new ArrayList<>(out);
        withNull.set(n - 1, null);
        refused(() -> a.run(in, withNull, b, r.streams()), "output must be given", what + "a null output in the list");
        refused(() -> v.run(in, null, counts, counts, r.streams()), "outputs must be given", what + "all-to-all-v, no output list");
        refused(() -> v.run(in, vOut.subList(0, 1), counts, counts, r.streams()), "one output per local rank expected (" + n + "), got 1", what + "all-to-all-v, a short output list");
        List<DeviceBuffer> vSwapped = new ArrayList<>(vOut);
        vSwapped.set(0, vOut.get(1));
        vSwapped.set(1, vOut.get(0));
        refused(() -> v.run(in, vSwapped, counts, counts, r.streams()), "expected the rank's device", what + "all-to-all-v, outputs swapped between GPUs");
        List<DeviceBuffer> vOwn = new ArrayList<>(vOut);
        vOwn.set(n - 1, v.output(n - 1));
        refused(() -> v.run(in, vOwn, counts, counts, r.streams()), "overlaps this all-to-all-v's", what + "all-to-all-v, the instance's receive slots in the list");
        // nothing was queued: the exchange still works
        a.run(in, out, b, r.streams());
        v.run(in, vOut, counts, counts, r.streams());
        a.checkErrors(r.streams());
        v.checkErrors(r.streams());
    }
}
