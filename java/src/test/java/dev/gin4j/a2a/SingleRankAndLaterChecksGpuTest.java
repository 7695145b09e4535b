package dev.gin4j.a2a;

import dev.gin4j.comm.DType;
import dev.gin4j.comm.Backend;
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
import org.junit.jupiter.api.function.Executable;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.List;
import java.util.SplittableRandom;

import static org.junit.jupiter.api.Assertions.*;

/**
 * The one-process-per-GPU forms (no lists, no local rank index) of AllToAll and AllToAllV on a
 * group of one local rank, their refusal where a process drives several, and the later error
 * checks ({@code errorsAfter}): clean calls report nothing, bad arguments are refused.
 */
@Tag("gpu")
class SingleRankAndLaterChecksGpuTest {
    private final SplittableRandom random = new SplittableRandom();

    private byte[] randomBytes(int n) {
        byte[] b = new byte[n];
        for (int i = 0; i < n; i++) b[i] = (byte) random.nextInt();
        return b;
    }

    /** Polls until the check reports (true: clean), failing after two minutes. */
    static boolean pollUntilDone(ErrorCheck check) throws InterruptedException {
        long deadline = System.nanoTime() + 120_000_000_000L;
        while (!check.poll()) {
            if (System.nanoTime() > deadline) fail(check + " did not complete within two minutes");
            Thread.sleep(1);
        }
        assertTrue(check.isDone());
        return true;
    }

    private static void assertBytes(byte[] want, byte[] got, String what) {
        assertEquals(want.length, got.length, what + ": length");
        for (int i = 0; i < want.length; i++)
            if (want[i] != got[i]) fail(what + ": byte " + i + " is " + got[i] + ", expected " + want[i]);
    }

    @Test void oneLocalRankTakesTheFormsWithoutListsAndChecksLater() throws Exception {
        GpuRuntime rt = Gpus.runtimeWithDevices(1);
        Gpus.skipUnless(Nccl.isAvailable(), "no NCCL/RCCL: " + Nccl.describe());
        Gpus.requireKernels(rt, "a2a");
        int live = NativeResource.liveCount();
        Device dev = rt.device(0);
        int perPeer = 4096;
        try (CommGroup g = CommGroup.initAll(List.of(dev)); Arena arena = Arena.ofShared(); Stream s = dev.createStream()) {
            for (Backend backend : Backend.values()) {
                String what = backend + ": ";
                try (AllToAll a = AllToAll.create(g, perPeer, backend); AllToAllV v = AllToAllV.create(g, perPeer, backend)) {
                    DeviceBuffer in = dev.allocate(perPeer, arena);
                    // elements: perPeer / 4 fp32 values per peer
                    byte[] data = randomBytes(perPeer);
                    in.copyFromHost(MemorySegment.ofArray(data), s);
                    a.output().fill((byte) 0x5a, s);
                    a.runElements(in, perPeer / 4, DType.FP32, s);
                    a.checkErrors(s);
                    assertBytes(data, a.result().toByteArray(s), what + "runElements(input, count, type, stream)");
                    // bytes, checked later
                    byte[] data2 = randomBytes(perPeer);
                    in.copyFromHost(MemorySegment.ofArray(data2), s);
                    a.output().fill((byte) 0x5a, s);
                    a.run(in, perPeer, s);
                    ErrorCheck check = a.errorsAfter(s);
                    assertTrue(pollUntilDone(check), what + "a clean all-to-all reports nothing");
                    assertTrue(check.poll(), what + "the outcome stays");
                    check.await();
                    assertBytes(data2, a.result().toByteArray(s), what + "run(input, bytesPerPeer, stream)");
                    assertEquals(a.output(0).byteSize(), a.output().byteSize());

                    // all-to-all-v: a random count to the one rank, from a random offset
                    long count = 1 + random.nextInt(perPeer - 1), offset = random.nextInt((int) (perPeer - count + 1));
                    DeviceBuffer counts = dev.allocate(8, arena), offsets = dev.allocate(8, arena);
                    counts.copyFromHost(MemorySegment.ofArray(new long[] {count}), s);
                    offsets.copyFromHost(MemorySegment.ofArray(new long[] {offset}), s);
                    v.output().fill((byte) 0x5a, s);
                    v.receivedCounts().fill((byte) 0xee, s);
                    v.run(in, counts, offsets, s);
                    ErrorCheck vCheck = v.errorsAfter(s);
                    assertTrue(pollUntilDone(vCheck), what + "a clean all-to-all-v reports nothing");
                    assertEquals(count, v.receivedCounts().readLongs(1, s)[0], what + "received count");
                    byte[] got = v.output().slice(0, count).toByteArray(s);
                    byte[] want = java.util.Arrays.copyOfRange(data2, (int) offset, (int) (offset + count));
                    assertBytes(want, got, what + "all-to-all-v run(input, counts, offsets, stream)");
                    v.checkErrors(s);

                    // bad arguments: named, and nothing queued
                    IllegalArgumentException negative = assertThrows(IllegalArgumentException.class, () -> a.runElements(in, -1, DType.FP32, s));
                    assertTrue(negative.getMessage().contains("count must be >= 0"), negative.getMessage());
                    IllegalArgumentException noType = assertThrows(IllegalArgumentException.class, () -> a.runElements(in, 1, null, s));
                    assertTrue(noType.getMessage().contains("element type"), noType.getMessage());
                    IllegalArgumentException huge = assertThrows(IllegalArgumentException.class, () -> a.runElements(in, Long.MAX_VALUE / 2, DType.FP32, s));
                    assertTrue(huge.getMessage().contains("do not fit"), huge.getMessage());
                    assertThrows(IllegalArgumentException.class, () -> a.errorsAfter(List.of()), "no stream for the one local rank");
                    assertThrows(IllegalArgumentException.class, () -> v.errorsAfter(List.of(s, s)), "two streams for one local rank");
                    try (Stream capturing = dev.createStream()) {
                        capturing.beginCapture();
                        IllegalStateException captured = assertThrows(IllegalStateException.class, () -> a.errorsAfter(capturing));
                        assertTrue(captured.getMessage().contains("cannot be captured"), captured.getMessage());
                        assertThrows(IllegalStateException.class, () -> v.errorsAfter(capturing));
                        capturing.endCapture().close();
                    }
                    a.checkErrors(s);
                    v.checkErrors(s);
                    // a check that outlives its instance is refused, not read from freed memory
                    a.run(in, perPeer, s);
                    ErrorCheck orphan = a.errorsAfter(s);
                    s.synchronize();
                    a.close();
                    IllegalStateException closed = assertThrows(IllegalStateException.class, orphan::poll);
                    assertTrue(closed.getMessage().contains("was closed before this error check reported"), closed.getMessage());
                    assertThrows(IllegalStateException.class, () -> a.errorsAfter(s));
                }
            }
        }
        assertEquals(live, NativeResource.liveCount(), () -> "left open:\n" + NativeResource.liveSummary());
    }

    @Test void formsWithoutListsAreRefusedWhereAProcessDrivesSeveralRanks() {
        GpuRuntime rt = Gpus.runtimeWithDevices(2);
        Gpus.skipUnless(Nccl.isAvailable(), "no NCCL/RCCL: " + Nccl.describe());
        Gpus.requireKernels(rt, "a2a");
        List<Device> devs = rt.devices();
        try (CommGroup g = CommGroup.initAll(devs); Arena arena = Arena.ofShared()) {
            List<Stream> streams = new ArrayList<>();
            try {
                for (Device d : devs) streams.add(d.createStream());
                Stream s = streams.getFirst();
                DeviceBuffer in = devs.getFirst().allocate(64L * devs.size(), arena), c = devs.getFirst().allocate(8L * devs.size(), arena);
                for (Backend backend : Backend.values()) {
                    try (AllToAll a = AllToAll.create(g, 64, backend); AllToAllV v = AllToAllV.create(g, 64, backend)) {
                        List<Executable> calls = List.of(() -> a.run(in, 64, s), () -> a.runElements(in, 16, DType.FP32, s), () -> a.checkErrors(s),
                                () -> a.errorsAfter(s), a::output, a::result, () -> v.run(in, c, c, s), () -> v.checkErrors(s), () -> v.errorsAfter(s),
                                v::output, v::receivedCounts);
                        for (Executable call : calls) {
                            IllegalStateException e = assertThrows(IllegalStateException.class, call, backend.toString());
                            assertTrue(e.getMessage().contains("one process per GPU") && e.getMessage().contains("drives " + devs.size() + " local ranks"), e.getMessage());
                        }
                        ErrorCheck check = a.errorsAfter(streams);  // the list forms still work
                        check.await();
                        assertTrue(check.poll());
                    }
                }
            } finally {
                streams.forEach(Stream::close);
            }
        }
    }
}
