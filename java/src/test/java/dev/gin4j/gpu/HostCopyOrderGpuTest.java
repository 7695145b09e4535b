package dev.gin4j.gpu;

import dev.gin4j.testing.Gpus;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.Arrays;
import java.util.Random;
import java.util.function.BiFunction;

import static org.junit.jupiter.api.Assertions.*;

/**
 * Host copies right after work queued on gin4j's (non-blocking) streams: every form sees that
 * work's result. Each round keeps a stream busy for tens of milliseconds with fills of a large
 * buffer before the work whose result is read, so a copy that did not wait would see the poison.
 */
@Tag("gpu")
class HostCopyOrderGpuTest {
    private static final int POISON = 0xDEADBEEF;
    private static final int WORDS = 1 << 18;  // 1 MiB checked per round
    private final Random random = new Random();
    private int liveBefore;
    private long buffersBefore;

    @BeforeEach void countResources() { liveBefore = NativeResource.liveCount(); buffersBefore = DeviceBuffer.liveCount(); }

    @AfterEach void everythingClosed() {
        assertEquals(liveBefore, NativeResource.liveCount(), () -> "native objects left open:\n" + NativeResource.liveSummary());
        assertEquals(buffersBefore, DeviceBuffer.liveCount(), "device buffers left allocated");
    }

    /** Keeps {@code s} busy: fills of 512 MiB, some tens of milliseconds on any current GPU. */
    private void keepBusy(DeviceBuffer busy, Stream s) {
        for (int i = 0; i < 60; i++) busy.fill32(random.nextInt(), s);
    }

    private int[] freshRandom() {
        int[] v = new int[WORDS];
        for (int i = 0; i < WORDS; i++) {
            v[i] = random.nextInt();
            if (v[i] == POISON) v[i] = 1;
        }
        return v;
    }

    private static void assertAllEqual(int[] want, int[] got, String form) {
        assertEquals(want.length, got.length, form + ": length");
        for (int i = 0; i < want.length; i++)
            if (want[i] != got[i]) fail(form + ": word " + i + " is 0x" + Integer.toHexString(got[i]) + ", expected 0x" + Integer.toHexString(want[i])
                    + (got[i] == POISON ? " (the poison: the copy did not wait for the stream's work)" : ""));
    }

    private static int[] ints(byte[] b) {
        int[] out = new int[b.length / 4];
        MemorySegment.copy(MemorySegment.ofArray(b), ValueLayout.JAVA_INT_UNALIGNED, 0, MemorySegment.ofArray(out), ValueLayout.JAVA_INT_UNALIGNED, 0, out.length);
        return out;
    }

    private static int[] ints(long[] l) {
        int[] out = new int[l.length * 2];
        MemorySegment.copy(MemorySegment.ofArray(l), ValueLayout.JAVA_INT_UNALIGNED, 0, MemorySegment.ofArray(out), ValueLayout.JAVA_INT_UNALIGNED, 0, out.length);
        return out;
    }

    @Test void readsRightAfterStreamWorkSeeItsResult() {
        Device dev = Gpus.runtime().device(0);
        try (Arena arena = Arena.ofConfined(); Stream s = dev.createStream(); Stream other = dev.createStream()) {
            DeviceBuffer busy = dev.allocate(512L << 20, arena), src = dev.allocate(4L * WORDS, arena), target = dev.allocate(4L * WORDS, arena);
            // each form reads target right after "busy work, then src -> target" was queued, on the
            // stream it is given or (forms without a stream) on another gin4j stream
            record Form(String name, boolean withStream, BiFunction<DeviceBuffer, Stream, int[]> read) {}
            Form[] forms = {
                    new Form("toByteArray()", false, (b, st) -> ints(b.toByteArray())),
                    new Form("toByteArray(stream)", true, (b, st) -> ints(b.toByteArray(st))),
                    new Form("readInts(n)", false, (b, st) -> b.readInts(WORDS)),
                    new Form("readInts(n, stream)", true, (b, st) -> b.readInts(WORDS, st)),
                    new Form("readLongs(n)", false, (b, st) -> ints(b.readLongs(WORDS / 2))),
                    new Form("readLongs(n, stream)", true, (b, st) -> ints(b.readLongs(WORDS / 2, st))),
                    new Form("copyToHost(heap)", false, (b, st) -> { int[] h = new int[WORDS]; Arrays.fill(h, POISON); b.copyToHost(MemorySegment.ofArray(h)); return h; }),
                    new Form("copyToHost(heap, stream)", true, (b, st) -> { int[] h = new int[WORDS]; Arrays.fill(h, POISON); b.copyToHost(MemorySegment.ofArray(h), st); return h; }),
                    new Form("copyToHost(native)", false, (b, st) -> {
                        try (Arena a = Arena.ofConfined()) {
                            MemorySegment h = a.allocate(4L * WORDS, 4).fill((byte) 0xEE);
                            b.copyToHost(h);
                            return h.toArray(ValueLayout.JAVA_INT);
                        }
                    }),
                    new Form("copyToHost(pinned, stream)", true, (b, st) -> {
                        try (Arena a = Arena.ofConfined()) {
                            MemorySegment h = dev.allocatePinned(4L * WORDS, a).host().fill((byte) 0xEE);
                            b.copyToHost(h, st);
                            return h.toArray(ValueLayout.JAVA_INT);
                        }
                    }),
            };
            for (Form f : forms) {
                int[] want = freshRandom();
                src.copyFromHost(MemorySegment.ofArray(want));
                target.fill32(POISON, s);
                s.synchronize();
                Stream work = f.withStream ? s : other;
                keepBusy(busy, work);
                target.copyFrom(src, work);
                assertAllEqual(want, f.read.apply(target, s), f.name);
                other.synchronize();
                s.synchronize();
            }
        }
    }

    @Test void writesRightAfterStreamWorkAreNotOverwrittenByIt() {
        Device dev = Gpus.runtime().device(0);
        try (Arena arena = Arena.ofConfined(); Stream s = dev.createStream(); Stream other = dev.createStream()) {
            DeviceBuffer busy = dev.allocate(512L << 20, arena), target = dev.allocate(4L * WORDS, arena);
            for (int form = 0; form < 4; form++) {
                int[] want = freshRandom();
                boolean withStream = form % 2 == 1;
                Stream work = withStream ? s : other;
                keepBusy(busy, work);
                target.fill32(POISON, work);  // queued before the upload: must not land after it
                MemorySegment host = form < 2 ? MemorySegment.ofArray(want) : Arena.ofAuto().allocate(4L * WORDS, 4).copyFrom(MemorySegment.ofArray(want));
                if (withStream) target.copyFromHost(host, s);
                else target.copyFromHost(host);
                other.synchronize();
                s.synchronize();
                assertAllEqual(want, target.readInts(WORDS, s), (withStream ? "copyFromHost(host, stream)" : "copyFromHost(host)") + (form < 2 ? " from the heap" : " from native memory"));
            }
        }
    }

    @Test void badStreamsAndCapturesAreRefusedBeforeAnyCopy() {
        Device dev = Gpus.runtime().device(0);
        try (Arena arena = Arena.ofConfined(); Stream s = dev.createStream()) {
            DeviceBuffer b = dev.allocate(64, arena);
            int value = random.nextInt();
            b.fill32(value, s);
            NullPointerException npe = assertThrows(NullPointerException.class, () -> b.readInts(1, null));
            assertTrue(npe.getMessage().contains("readInts") && npe.getMessage().contains("needs a stream"), npe.getMessage());
            assertThrows(NullPointerException.class, () -> b.copyToHost(MemorySegment.ofArray(new byte[64]), null));
            IllegalArgumentException size = assertThrows(IllegalArgumentException.class, () -> b.copyToHost(MemorySegment.ofArray(new byte[63]), s));
            assertTrue(size.getMessage().contains("63"), size.getMessage());
            assertThrows(IllegalArgumentException.class, () -> b.copyToHost(MemorySegment.ofArray(new byte[64]).asReadOnly(), s), "read-only host memory");
            Stream closed = dev.createStream();
            closed.close();
            IllegalStateException gone = assertThrows(IllegalStateException.class, () -> b.readInts(1, closed));
            assertTrue(gone.getMessage().contains("is closed"), gone.getMessage());

            try (Stream capturing = dev.createStream()) {
                capturing.beginCapture();
                b.fill32(~value, capturing);
                IllegalStateException inCapture = assertThrows(IllegalStateException.class, () -> b.readInts(1, capturing));
                assertTrue(inCapture.getMessage().contains("capturing"), inCapture.getMessage());
                IllegalStateException deviceWide = assertThrows(IllegalStateException.class, () -> b.readInts(1));
                assertTrue(deviceWide.getMessage().contains("captures a graph") && deviceWide.getMessage().contains(capturing.describe()), deviceWide.getMessage());
                assertThrows(IllegalStateException.class, () -> b.copyFromHost(MemorySegment.ofArray(new byte[64])));
                try (Graph g = capturing.endCapture()) {
                    assertNotNull(g);
                }
            }
            int[] got = b.readInts(16);  // no capture any more: the device-wide form works again
            for (int i = 0; i < 16; i++) assertEquals(value, got[i], "word " + i + ": the captured fill was never launched");
        }
    }
}
