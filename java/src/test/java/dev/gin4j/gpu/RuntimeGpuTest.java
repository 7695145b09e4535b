package dev.gin4j.gpu;

import dev.gin4j.internal.gpu.KernelLibrary;
import dev.gin4j.testing.Gpus;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.Random;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;

import static org.junit.jupiter.api.Assertions.*;

/** The runtime layer on a real GPU: code objects, launches, copies, events, graphs, peers, errors. */
@Tag("gpu")
class RuntimeGpuTest {
    private final Random random = new Random();
    private int liveBefore;
    private long buffersBefore;

    @BeforeEach void countResources() { liveBefore = NativeResource.liveCount(); buffersBefore = DeviceBuffer.liveCount(); }

    @AfterEach void everythingClosed() {
        assertEquals(liveBefore, NativeResource.liveCount(), () -> "native objects left open:\n" + NativeResource.liveSummary());
        assertEquals(buffersBefore, DeviceBuffer.liveCount(), "device buffers left allocated");
    }

    @Test void deviceListingMatchesNvidiaSmi() throws Exception {
        GpuRuntime rt = Gpus.runtime();
        Gpus.skipUnless(rt.isCuda(), "nvidia-smi comparison needs the CUDA driver");
        Process p;
        try {
            p = new ProcessBuilder("nvidia-smi", "--query-gpu=name", "--format=csv,noheader").start();
        } catch (java.io.IOException e) {
            Gpus.skipUnless(false, "nvidia-smi not runnable: " + e.getMessage());
            return;
        }
        long count;
        try (BufferedReader r = new BufferedReader(new InputStreamReader(p.getInputStream()))) {
            count = r.lines().filter(l -> !l.isBlank()).count();
        }
        assertEquals(0, p.waitFor());
        assertEquals(count, rt.devices().size(), "device count from the CUDA driver vs nvidia-smi");
        for (Device d : rt.devices()) {
            assertTrue(d.arch().matches("sm_\\d+"), d.arch());
            assertTrue(d.totalMemory() > (1L << 30));
            assertTrue(d.multiprocessors() > 0);
            assertEquals(32, d.warpSize(), "NVIDIA warps are 32 threads");
            assertTrue(d.maxSharedBytesPerBlock() >= 48 << 10, "opt-in shared memory per block: " + d.maxSharedBytesPerBlock());
            assertFalse(d.name().isBlank());
        }
    }

    @Test void fillScaleCopyOnFreshRandomData() {
        GpuRuntime rt = Gpus.runtime();
        Gpus.requireKernels(rt, "basic");
        Device dev = rt.device(0);
        try (Arena arena = Arena.ofConfined(); Stream s = dev.createStream(); CodeObject basic = KernelLibrary.load(dev, "basic")) {
            int n = 1_000_003;
            // fill
            DeviceBuffer buf = dev.allocate(4L * n, arena);
            buf.fill((byte) 0x5a, s);
            int value = random.nextInt();
            KernelArgs fill = KernelArgs.of(arena, KernelArgs.Type.POINTER, KernelArgs.Type.I64, KernelArgs.Type.I32);
            fill.setPointer(0, buf).setLong(1, n).setInt(2, value);
            basic.kernel("gin_fill_u32").launch(s, LaunchConfig.of(120, 256), fill);
            s.synchronize();
            MemorySegment host = arena.allocate(4L * n);
            buf.copyToHost(host);
            for (int i = 0; i < n; i++) assertEquals(value, host.getAtIndex(ValueLayout.JAVA_INT, i), "fill at " + i);

            // scale
            MemorySegment in = arena.allocate(4L * n);
            for (int i = 0; i < n; i++) in.setAtIndex(ValueLayout.JAVA_FLOAT, i, (float) random.nextGaussian());
            DeviceBuffer src = dev.allocate(4L * n, arena), dst = dev.allocate(4L * n, arena);
            src.copyFromHost(in);
            dst.fill((byte) 0xff, s); // NaN poison
            float alpha = 1.5f + random.nextFloat();
            KernelArgs scale = KernelArgs.of(arena, KernelArgs.Type.POINTER, KernelArgs.Type.POINTER, KernelArgs.Type.I64, KernelArgs.Type.F32);
            scale.setPointer(0, src).setPointer(1, dst).setLong(2, n).setFloat(3, alpha);
            basic.kernel("gin_scale_f32").launch(s, LaunchConfig.of(264, 512), scale);
            s.synchronize();
            dst.copyToHost(host);
            for (int i = 0; i < n; i++) assertEquals(alpha * in.getAtIndex(ValueLayout.JAVA_FLOAT, i), host.getAtIndex(ValueLayout.JAVA_FLOAT, i), "scale at " + i);

            // copy with odd offsets and length
            byte[] bytes = new byte[777_777];
            random.nextBytes(bytes);
            DeviceBuffer a = dev.allocate(bytes.length + 64, arena), b = dev.allocate(bytes.length + 64, arena);
            DeviceBuffer from = a.slice(3, bytes.length), to = b.slice(11, bytes.length);
            from.copyFromHost(MemorySegment.ofArray(bytes));
            b.fill((byte) 0xa5, s);
            KernelArgs copy = KernelArgs.of(arena, KernelArgs.Type.POINTER, KernelArgs.Type.POINTER, KernelArgs.Type.I64);
            copy.setPointer(0, from).setPointer(1, to).setLong(2, bytes.length);
            basic.kernel("gin_copy_bytes").launch(s, LaunchConfig.of(100, 256), copy);
            s.synchronize();
            assertArrayEquals(bytes, to.toByteArray());
            byte[] guard = b.slice(0, 11).toByteArray();
            for (byte g : guard) assertEquals((byte) 0xa5, g, "copy wrote before its destination");
        }
    }

    @Test void programmaticDependentLaunchesStayOrdered() {
        GpuRuntime rt = Gpus.runtime();
        Gpus.requireKernels(rt, "basic");
        Device dev = rt.device(0);
        try (Arena arena = Arena.ofConfined(); Stream s = dev.createStream(); CodeObject basic = KernelLibrary.load(dev, "basic")) {
            int n = 4_000_037;
            DeviceBuffer buf = dev.allocate(4L * n, arena);
            int base = random.nextInt();
            KernelArgs fill = KernelArgs.of(arena, KernelArgs.Type.POINTER, KernelArgs.Type.I64, KernelArgs.Type.I32);
            fill.setPointer(0, buf).setLong(1, n).setInt(2, base);
            basic.kernel("gin_fill_u32").launch(s, LaunchConfig.of(120, 256), fill);
            // 60 read-modify-write kernels back to back, each allowed to start while the one before
            // drains; each lets the next start at once, so a wait that did not hold would lose additions
            Kernel add = basic.kernel("gin_add_after_prior_u32");
            KernelArgs args = KernelArgs.of(arena, KernelArgs.Type.POINTER, KernelArgs.Type.I64, KernelArgs.Type.I32);
            int expected = base;
            for (int i = 0; i < 60; i++) {
                int delta = random.nextInt();
                expected += delta;
                args.setPointer(0, buf).setLong(1, n).setInt(2, delta);
                add.launch(s, LaunchConfig.of(1 + random.nextInt(64), 256).asProgrammaticDependent(), args);
            }
            s.synchronize();
            MemorySegment host = arena.allocate(4L * n);
            buf.copyToHost(host);
            for (int i = 0; i < n; i++) assertEquals(expected, host.getAtIndex(ValueLayout.JAVA_INT, i), "element " + i + " after 60 chained additions");
        }
    }

    @Test void structPassedByValue() {
        GpuRuntime rt = Gpus.runtime();
        Gpus.requireKernels(rt, "basic");
        Device dev = rt.device(0);
        try (Arena arena = Arena.ofConfined(); Stream s = dev.createStream(); CodeObject basic = KernelLibrary.load(dev, "basic")) {
            MemorySegment st = arena.allocate(80, 16);
            byte a = (byte) random.nextInt(); long b = random.nextLong(); float[] c = new float[5];
            short d = (short) random.nextInt(); byte[] e = new byte[13]; int g = random.nextInt(); double h = random.nextDouble(); byte[] tail = new byte[7];
            random.nextBytes(e); random.nextBytes(tail);
            st.set(ValueLayout.JAVA_BYTE, 0, a);
            st.set(ValueLayout.JAVA_LONG, 8, b);
            for (int i = 0; i < 5; i++) { c[i] = random.nextFloat(); st.set(ValueLayout.JAVA_FLOAT, 16 + 4L * i, c[i]); }
            st.set(ValueLayout.JAVA_SHORT, 36, d);
            MemorySegment.copy(e, 0, st, ValueLayout.JAVA_BYTE, 38, 13);
            st.set(ValueLayout.JAVA_INT, 52, g);
            st.set(ValueLayout.JAVA_DOUBLE, 56, h);
            MemorySegment.copy(tail, 0, st, ValueLayout.JAVA_BYTE, 64, 7);
            DeviceBuffer out = dev.allocate(32 * 8, arena);
            out.fill((byte) 0x77, s);
            // a scalar before the struct forces the struct slot's alignment to matter
            KernelArgs args = KernelArgs.of(arena, KernelArgs.Type.struct(80, 16), KernelArgs.Type.POINTER);
            args.setStruct(0, st).setPointer(1, out);
            basic.kernel("gin_sum_struct").launch(s, LaunchConfig.of(1, 32), args);
            s.synchronize();
            MemorySegment w = arena.allocate(32 * 8);
            out.copyToHost(w);
            long[] words = w.toArray(ValueLayout.JAVA_LONG);
            long[] expect = new long[31];
            int k = 0;
            expect[k++] = a; expect[k++] = b;
            for (float f : c) expect[k++] = Float.floatToRawIntBits(f) & 0xffffffffL;
            expect[k++] = d;
            for (byte x : e) expect[k++] = x & 0xff;
            expect[k++] = g; expect[k++] = Double.doubleToRawLongBits(h);
            for (byte x : tail) expect[k++] = x & 0xff;
            expect[k++] = 80;
            long sum = 0xcbf29ce484222325L;
            for (int i = 0; i < 31; i++) {
                assertEquals(expect[i], words[i], "struct word " + i);
                sum ^= expect[i];
                sum *= 0x100000001b3L;
            }
            assertEquals(sum, words[31], "checksum");
        }
    }

    /**
     * A graph holds raw addresses: once a buffer its work uses is freed, or its code object closed,
     * a replay is refused by name instead of writing memory that may be someone else's. Work of a
     * stream that joined the capture through an event counts too.
     */
    @Test void graphsRefuseToReplayAfterTheirMemoryOrKernelsAreGone() {
        GpuRuntime rt = Gpus.runtime();
        Gpus.requireKernels(rt, "basic");
        Device dev = rt.device(0);
        try (Arena arena = Arena.ofConfined(); Stream s = dev.createStream(); Stream side = dev.createStream();
             Event fork = dev.createEvent(); Event join = dev.createEvent()) {
            int n = 4096;
            int v = random.nextInt();
            Arena scratch = Arena.ofConfined(), scratch2 = Arena.ofConfined();
            CodeObject basic = KernelLibrary.load(dev, "basic");
            try {
                DeviceBuffer buf = dev.allocate(4L * n, scratch), copy = dev.allocate(4L * n, arena), buf2 = dev.allocate(4L * n, scratch2);
                KernelArgs fill = KernelArgs.of(arena, KernelArgs.Type.POINTER, KernelArgs.Type.I64, KernelArgs.Type.I32).setPointer(0, buf).setLong(1, n).setInt(2, v);
                assertFalse(s.isCapturing());
                s.beginCapture();
                assertTrue(s.isCapturing());
                basic.kernel("gin_fill_u32").launch(s, LaunchConfig.of(4, 256), fill);
                copy.copyFrom(buf, s);
                try (Graph g = s.endCapture(); Graph g2 = captureFill(s, basic, arena, copy, v ^ 1)) {
                    assertFalse(s.isCapturing());
                    assertEquals(3, g.noteCount(), "the code object, buf's arena, copy's arena");
                    assertEquals(2, g2.noteCount(), "the code object and, from the kernel's arguments alone, copy's arena");

                    // fork / join: side joins the capture through fork and its launch is noted
                    s.beginCapture();
                    fork.record(s);
                    side.waitFor(fork);
                    assertTrue(side.isCapturing(), "side joined s's capture");
                    KernelArgs fill2 = KernelArgs.of(arena, KernelArgs.Type.POINTER, KernelArgs.Type.I64, KernelArgs.Type.I32).setPointer(0, buf2).setLong(1, n).setInt(2, ~v);
                    basic.kernel("gin_fill_u32").launch(side, LaunchConfig.of(4, 256), fill2);
                    join.record(side);
                    s.waitFor(join);
                    try (Graph g3 = s.endCapture()) {
                        assertFalse(side.isCapturing(), "the capture side joined has ended");
                        assertEquals(2, g3.noteCount(), "the code object and buf2's arena, noted on the joined stream");
                        buf2.fill((byte) 0, s);
                        g3.launch(s);
                        s.synchronize();
                        int[] got2 = buf2.readInts(n);
                        for (int i = 0; i < n; i++) assertEquals(~v, got2[i], "buf2 word " + i + " after the fork/join replay");
                        scratch2.close();
                        IllegalStateException joined = assertThrows(IllegalStateException.class, () -> g3.launch(s));
                        assertTrue(joined.getMessage().contains("device buffer of " + 4L * n + " bytes") && joined.getMessage().contains("freed"), joined.getMessage());
                    }

                    copy.fill((byte) 0, s);
                    g.launch(s);
                    s.synchronize();
                    int[] got = copy.readInts(n);
                    for (int i = 0; i < n; i++) assertEquals(v, got[i], "word " + i + " after the replay");
                    scratch.close();
                    IllegalStateException freed = assertThrows(IllegalStateException.class, () -> g.launch(s));
                    assertTrue(freed.getMessage().contains("device buffer of " + 4L * n + " bytes") && freed.getMessage().contains("freed"), freed.getMessage());
                    g2.launch(s);  // its own memory is alive
                    s.synchronize();
                    assertEquals(v ^ 1, copy.readInts(1)[0]);
                    basic.close();
                    IllegalStateException closed = assertThrows(IllegalStateException.class, () -> g2.launch(s));
                    assertTrue(closed.getMessage().contains(basic.describe()) && closed.getMessage().contains("was closed"), closed.getMessage());
                }
            } finally {
                if (scratch.scope().isAlive()) scratch.close();
                if (scratch2.scope().isAlive()) scratch2.close();
                basic.close();
            }
        }
    }

    /**
     * A stream closed in the middle of its capture gives no graph, so a stream that joined that
     * capture through an event stops noting into it; the device stays usable.
     */
    @Test void closingACapturingStreamEndsTheCaptureOfStreamsThatJoinedIt() {
        Device dev = Gpus.runtime().device(0);
        try (Arena arena = Arena.ofConfined(); Stream side = dev.createStream(); Event fork = dev.createEvent()) {
            Stream origin = dev.createStream();
            origin.beginCapture();
            fork.record(origin);
            side.waitFor(fork);
            assertTrue(side.isCapturing(), "side joined origin's capture");
            try {
                origin.close();
            } catch (GpuException e) {
                System.out.println("[closing a capturing stream] the driver refused the destroy: " + e.getMessage());
            }
            assertFalse(side.isCapturing(), "origin was closed mid-capture: side no longer notes into it");
            try (Stream fresh = dev.createStream()) {
                int n = 1024, v = random.nextInt();
                DeviceBuffer buf = dev.allocate(4L * n, arena);
                buf.fill32(v, fresh);
                fresh.synchronize();
                int[] got = buf.readInts(n);
                for (int i = 0; i < n; i++) assertEquals(v, got[i], "word " + i + " after the capture was abandoned");
            }
        }
    }

    private static Graph captureFill(Stream s, CodeObject code, Arena arena, DeviceBuffer out, int value) {
        KernelArgs fill = KernelArgs.of(arena, KernelArgs.Type.POINTER, KernelArgs.Type.I64, KernelArgs.Type.I32).setPointer(0, out).setLong(1, out.byteSize() / 4).setInt(2, value);
        s.beginCapture();
        code.kernel("gin_fill_u32").launch(s, LaunchConfig.of(4, 256), fill);
        return s.endCapture();
    }

    @Test void eventsTimeAndGraphsReplay() {
        GpuRuntime rt = Gpus.runtime();
        Gpus.requireKernels(rt, "basic");
        Device dev = rt.device(0);
        try (Arena arena = Arena.ofConfined(); Stream s = dev.createStream(); CodeObject basic = KernelLibrary.load(dev, "basic");
             Event start = dev.createEvent(); Event end = dev.createEvent()) {
            int n = 1 << 20;
            DeviceBuffer buf = dev.allocate(4L * n, arena);
            KernelArgs fill = KernelArgs.of(arena, KernelArgs.Type.POINTER, KernelArgs.Type.I64, KernelArgs.Type.I32);
            int v1 = random.nextInt();
            fill.setPointer(0, buf).setLong(1, n).setInt(2, v1);
            Kernel k = basic.kernel("gin_fill_u32");
            start.record(s);
            k.launch(s, LaunchConfig.of(132, 256), fill);
            end.record(s);
            end.synchronize();
            assertTrue(end.isComplete());
            float ms = end.elapsedMillisSince(start);
            assertTrue(ms > 0 && ms < 1000, "elapsed " + ms);

            // capture: fill with v2, then scale is not involved; replay after poisoning
            int v2 = v1 ^ 0x1234567;
            fill.setInt(2, v2);
            s.beginCapture();
            k.launch(s, LaunchConfig.of(132, 256), fill);
            try (Graph g = s.endCapture()) {
                for (int rep = 0; rep < 3; rep++) {
                    buf.fill((byte) 0, s);
                    g.launch(s);
                    s.synchronize();
                    MemorySegment host = arena.allocate(4L * n);
                    buf.copyToHost(host);
                    for (int i = 0; i < n; i += 997) assertEquals(v2, host.getAtIndex(ValueLayout.JAVA_INT, i));
                    assertEquals(v2, host.getAtIndex(ValueLayout.JAVA_INT, n - 1));
                }
            }
        }
    }

    @Test void peerCopyAndPeerStores() {
        GpuRuntime rt = Gpus.runtimeWithDevices(2);
        Gpus.requireKernels(rt, "basic");
        Device d0 = rt.device(0), d1 = rt.device(1);
        Gpus.skipUnless(d0.canAccessPeer(d1), "devices 0 and 1 have no peer access");
        d0.enablePeerAccess(d1);
        try (Arena arena = Arena.ofConfined(); Stream s0 = d0.createStream(); CodeObject basic = KernelLibrary.load(d0, "basic")) {
            int n = 300_001;
            byte[] data = new byte[4 * n];
            random.nextBytes(data);
            DeviceBuffer a = d0.allocate(data.length, arena), b = d1.allocate(data.length, arena), c = d1.allocate(data.length, arena);
            a.copyFromHost(MemorySegment.ofArray(data));
            try (Stream s1 = d1.createStream()) {
                b.fill((byte) 0x33, s1);
                s1.synchronize();
                b.copyFrom(a, s1); // peer copy device 0 -> device 1
                s1.synchronize();
                c.fill((byte) 0x44, s1);
                s1.synchronize();
            }
            assertArrayEquals(data, b.toByteArray());
            KernelArgs args = KernelArgs.of(arena, KernelArgs.Type.POINTER, KernelArgs.Type.POINTER, KernelArgs.Type.I64);
            args.setPointer(0, a).setPointer(1, c).setLong(2, n);
            basic.kernel("gin_add_peer_u32").launch(s0, LaunchConfig.of(64, 256), args);
            s0.synchronize();
            MemorySegment got = MemorySegment.ofArray(c.toByteArray()), src = MemorySegment.ofArray(data);
            for (int i = 0; i < n; i++) {
                assertEquals(src.getAtIndex(ValueLayout.JAVA_INT_UNALIGNED, i) + 1, got.getAtIndex(ValueLayout.JAVA_INT_UNALIGNED, i), "peer store at " + i);
            }
        }
    }

    @Test void hostMemoryEventsShapesAndLaunchFailuresAreChecked() throws Exception {
        GpuRuntime rt = Gpus.runtime();
        Gpus.requireKernels(rt, "basic");
        Device dev = rt.device(0);
        try (Arena arena = Arena.ofConfined(); Stream s = dev.createStream(); CodeObject basic = KernelLibrary.load(dev, "basic");
             Event start = dev.createEvent(); Event end = dev.createEvent()) {
            DeviceBuffer buf = dev.allocate(4096, arena), other = dev.allocate(4096, arena);
            IllegalArgumentException heapWrap = assertThrows(IllegalArgumentException.class, () -> DeviceBuffer.wrap(dev, MemorySegment.ofArray(new byte[64])));
            assertTrue(heapWrap.getMessage().contains("heap segment"), heapWrap.getMessage());

            // host segments: a freed one is refused before the runtime sees its address, a read-only one is not written
            MemorySegment freed;
            try (Arena h = Arena.ofConfined()) {
                freed = h.allocate(4096);
            }
            assertThrows(IllegalStateException.class, () -> buf.copyToHost(freed));
            assertThrows(IllegalStateException.class, () -> buf.copyFromHost(freed));
            assertThrows(IllegalStateException.class, () -> buf.copyToHostAsync(freed, s));
            assertThrows(IllegalStateException.class, () -> buf.copyFromHostAsync(freed, s));
            assertThrows(IllegalArgumentException.class, () -> buf.copyToHost(arena.allocate(4096).asReadOnly()));
            assertThrows(IllegalArgumentException.class, () -> buf.copyToHostAsync(arena.allocate(4096).asReadOnly(), s));
            MemorySegment confined = arena.allocate(4096);
            ExecutionException foreign = assertThrows(ExecutionException.class, () -> CompletableFuture.runAsync(() -> buf.copyToHost(confined)).get());
            assertInstanceOf(WrongThreadException.class, foreign.getCause());

            // the host copies as segments: synchronous, asynchronous, heap-staged
            MemorySegment in = arena.allocate(4096), out = arena.allocate(4096);
            for (int i = 0; i < 1024; i++) in.setAtIndex(ValueLayout.JAVA_INT, i, random.nextInt());
            buf.copyFromHostAsync(in, s);
            other.copyFrom(buf, s);
            other.copyToHostAsync(out, s);
            s.synchronize();
            assertEquals(-1, in.mismatch(out), "async round trip");
            byte[] heap = new byte[4096];
            other.copyToHost(MemorySegment.ofArray(heap));
            assertEquals(-1, in.mismatch(MemorySegment.ofArray(heap)), "sync copy to a heap segment");
            buf.copyFromHost(in.asReadOnly());

            // reads and fills
            assertThrows(IllegalArgumentException.class, () -> buf.readLongs(-1));
            assertThrows(IndexOutOfBoundsException.class, () -> buf.readLongs(513));
            assertThrows(IndexOutOfBoundsException.class, () -> buf.readInts(1025));
            assertEquals(512, buf.readLongs(512).length);
            IllegalArgumentException misaligned = assertThrows(IllegalArgumentException.class, () -> buf.slice(2, 64).fill32(1, s));
            assertTrue(misaligned.getMessage().contains("4-byte aligned"), misaligned.getMessage());
            buf.slice(4, 64).fill32(0x01020304, s);
            s.synchronize();
            assertEquals(0x01020304, buf.slice(4, 64).readInts(16)[15]);

            // events must be recorded before they time anything
            IllegalStateException unrecorded = assertThrows(IllegalStateException.class, () -> end.elapsedMillisSince(start));
            assertTrue(unrecorded.getMessage().contains("never recorded"), unrecorded.getMessage());
            start.record(s);
            assertThrows(IllegalStateException.class, () -> end.elapsedMillisSince(start));

            // shapes beyond the device's limits are refused before the runtime; a refused launch names the kernel and its shape
            Kernel k = basic.kernel("gin_fill_u32");
            KernelArgs args = KernelArgs.of(arena, KernelArgs.Type.POINTER, KernelArgs.Type.I64, KernelArgs.Type.I32).setPointer(0, buf).setLong(1, 1024).setInt(2, 5);
            int[] grid = dev.maxGridDims(), block = dev.maxBlockDims();
            if (grid[1] < Integer.MAX_VALUE) {
                IllegalArgumentException tall = assertThrows(IllegalArgumentException.class, () -> k.launch(s, new LaunchConfig(1, grid[1] + 1, 1, 32, 1, 1, 0, false, false), args));
                assertTrue(tall.getMessage().contains("largest grid"), tall.getMessage());
            }
            if (block[2] < k.maxThreadsPerBlock()) {
                IllegalArgumentException deep = assertThrows(IllegalArgumentException.class, () -> k.launch(s, new LaunchConfig(1, 1, 1, 1, 1, block[2] + 1, 0, false, false), args));
                assertTrue(deep.getMessage().contains("largest block"), deep.getMessage());
            }
            int coResident = k.occupancy(256, 0) * dev.multiprocessors();
            GpuException tooLarge = assertThrows(GpuException.class, () -> k.launch(s, LaunchConfig.of(coResident + 1, 256).asCooperative(), args));
            assertTrue(tooLarge.getMessage().contains("gin_fill_u32") && tooLarge.getMessage().contains("grid " + (coResident + 1) + "x1x1") && tooLarge.getMessage().contains("cooperative"),
                    tooLarge.getMessage());
            assertFalse(tooLarge.errorName().isEmpty(), "the runtime's error name is kept");
            k.launch(s, LaunchConfig.of(4, 256), args);
            end.record(s);
            end.synchronize();
            assertTrue(end.elapsedMillisSince(start) >= 0);
            assertEquals(5, buf.readInts(1024)[1023], "the stream still works after a refused launch");

            // a kernel of a closed code object
            Kernel stale;
            try (CodeObject again = KernelLibrary.load(dev, "basic")) {
                stale = again.kernel("gin_fill_u32");
            }
            assertThrows(IllegalStateException.class, () -> stale.setMaxDynamicSharedBytes(1024));
            assertThrows(IllegalStateException.class, () -> stale.occupancy(256, 0));

            // an argument list that does not match the compiled parameters (CUDA tells their sizes;
            // HIP cannot): the runtime would read past the list or shift the values
            if (rt.isCuda()) {
                KernelArgs tooFew = KernelArgs.of(arena, KernelArgs.Type.POINTER, KernelArgs.Type.I64).setPointer(0, buf).setLong(1, 1024);
                IllegalArgumentException few = assertThrows(IllegalArgumentException.class, () -> k.launch(s, LaunchConfig.of(1, 256), tooFew));
                assertTrue(few.getMessage().contains("takes 3 parameters") && few.getMessage().contains("has 2"), few.getMessage());
                KernelArgs shifted = KernelArgs.of(arena, KernelArgs.Type.POINTER, KernelArgs.Type.I32, KernelArgs.Type.I32).setPointer(0, buf).setInt(1, 1024).setInt(2, 5);
                IllegalArgumentException sizes = assertThrows(IllegalArgumentException.class, () -> k.launch(s, LaunchConfig.of(1, 256), shifted));
                assertTrue(sizes.getMessage().contains("[8, 8, 4]"), sizes.getMessage());
                k.launch(s, LaunchConfig.of(4, 256), args);  // the right list still launches after a refused one
                s.synchronize();
            }

            // memory allocated for another thread's confined arena is freed again (everythingClosed checks the count)
            long free0 = dev.memoryInfo()[0];
            ExecutionException wrong = assertThrows(ExecutionException.class, () -> CompletableFuture.runAsync(() -> dev.allocate(1L << 30, arena)).get());
            assertInstanceOf(WrongThreadException.class, wrong.getCause());
            assertThrows(ExecutionException.class, () -> CompletableFuture.runAsync(() -> dev.allocatePinned(1 << 20, arena)).get());
            assertTrue(dev.memoryInfo()[0] > free0 - (1L << 29), "the 1 GiB allocated for a foreign arena was freed");

            // an image for another architecture of the same vendor names the object and this device's architecture
            String vendor = dev.arch().substring(0, 2);
            for (String arch : KernelLibrary.get().architectures()) {
                if (arch.equals(dev.arch()) || !arch.startsWith(vendor) || !KernelLibrary.get().objects(arch).contains("basic")) continue;
                byte[] image = KernelLibrary.get().read(arch, "basic");
                try {
                    dev.loadCodeObject("basic", image).close(); // a compatible image (same major architecture) loads
                } catch (GpuException e) {
                    assertTrue(e.getMessage().contains("'basic'") && e.getMessage().contains(dev.arch()), e.getMessage());
                }
            }
        }
    }

    @Test void badInputGivesExceptionsNotCrashes() {
        GpuRuntime rt = Gpus.runtime();
        Gpus.requireKernels(rt, "basic");
        Device dev = rt.device(0);
        try (Arena arena = Arena.ofConfined(); Stream s = dev.createStream(); CodeObject basic = KernelLibrary.load(dev, "basic")) {
            Kernel k = basic.kernel("gin_fill_u32");
            DeviceBuffer buf = dev.allocate(1024, arena);
            KernelArgs args = KernelArgs.of(arena, KernelArgs.Type.POINTER, KernelArgs.Type.I64, KernelArgs.Type.I32);
            IllegalStateException unset = assertThrows(IllegalStateException.class, () -> k.launch(s, LaunchConfig.of(1, 32), args));
            assertTrue(unset.getMessage().contains("argument 0"), unset.getMessage());
            args.setPointer(0, buf).setLong(1, 256).setInt(2, 1);
            IllegalArgumentException tooMany = assertThrows(IllegalArgumentException.class, () -> k.launch(s, LaunchConfig.of(1, 4096), args));
            assertTrue(tooMany.getMessage().contains("threads per block"), tooMany.getMessage());
            GpuException oom = assertThrows(GpuException.class, () -> dev.allocate(1L << 52, arena));
            assertTrue(oom.errorName().contains("OUT_OF_MEMORY") || oom.errorName().contains("OutOfMemory"), oom.getMessage());
            GpuException noKernel = assertThrows(GpuException.class, () -> basic.kernel("no_such_kernel"));
            assertTrue(noKernel.getMessage().contains("no_such_kernel"), noKernel.getMessage());
            // names the code object and the architecture, and lists what the manifest has for it
            assertTrue(noKernel.getMessage().contains("'basic'") && noKernel.getMessage().contains(dev.arch()), noKernel.getMessage());
            assertTrue(noKernel.getMessage().contains("gin_fill_u32"), noKernel.getMessage());
            IllegalArgumentException floatOnInt = assertThrows(IllegalArgumentException.class, () -> args.setFloat(2, 1f));
            assertTrue(floatOnInt.getMessage().contains("argument 2 is int32"), floatOnInt.getMessage());
            assertThrows(IndexOutOfBoundsException.class, () -> buf.slice(1000, 100));
            assertThrows(IllegalArgumentException.class, () -> buf.copyFromHost(MemorySegment.ofArray(new byte[3])));
        }
        Stream closed = dev.createStream();
        closed.close();
        closed.close(); // idempotent
        IllegalStateException use = assertThrows(IllegalStateException.class, closed::synchronize);
        assertTrue(use.getMessage().contains("closed"), use.getMessage());
        DeviceBuffer freed;
        try (Arena arena = Arena.ofConfined()) {
            freed = dev.allocate(64, arena);
        }
        assertThrows(IllegalStateException.class, freed::address);
    }
}
