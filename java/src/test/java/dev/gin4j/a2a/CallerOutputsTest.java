package dev.gin4j.a2a;

import dev.gin4j.gpu.Device;
import dev.gin4j.gpu.DeviceBuffer;
import dev.gin4j.gpu.NoGpuDevices;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.function.Executable;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.Arrays;
import java.util.List;

import static org.junit.jupiter.api.Assertions.*;

/**
 * The checks of a caller-owned all-to-all output, without a GPU: each refusal names what was
 * wrong and what was expected, and a fitting output (at any alignment) passes, all before any
 * device work (the test runtime fails on any driver call).
 */
class CallerOutputsTest {
    private static final List<Device> DEVICES = NoGpuDevices.devices(2);
    private static final Device GPU0 = DEVICES.get(0), GPU1 = DEVICES.get(1);
    private static final String RANK = "rank 0/4 on " + GPU0, LAYOUT = "4 ranks x 64 bytes per peer";
    private static final long NEED = 256;

    private static DeviceBuffer at(Device d, long address, long bytes) { return NoGpuDevices.buffer(d, address, bytes); }

    /** The uniform all-to-all's check of rank 0: input at 0x10000, the instance's window at 0x80000. */
    private static void check(DeviceBuffer output) {
        CallerOutputs.check(RANK, GPU0, output, NEED, LAYOUT, new DeviceBuffer[] {at(GPU0, 0x10000, NEED)}, new String[] {"input"},
                new DeviceBuffer[] {at(GPU0, 0x80000, 0x10000)}, "this all-to-all's window");
    }

    private static String refused(Executable call) {
        return assertThrows(IllegalArgumentException.class, call).getMessage();
    }

    @Test void aFittingOutputPassesAtAnyAlignment() {
        check(at(GPU0, 0x20000, NEED));
        check(at(GPU0, 0x20003, NEED + 5));  // odd address, larger than needed
        check(at(GPU0, 0x10000 + NEED, NEED));  // right after the input
        check(at(GPU0, 0x80000 - NEED, NEED));  // right before the window
    }

    @Test void aNullOutputNamesWhatIsExpected() {
        String m = refused(() -> check(null));
        assertTrue(m.startsWith(RANK + ": output must be given"), m);
        assertTrue(m.contains(LAYOUT + " = 256 bytes at least, on " + GPU0) && m.contains("got null"), m);
        assertTrue(m.contains("run without an output"), m);
    }

    @Test void aShortOutputNamesItsSizeAndTheNeed() {
        String m = refused(() -> check(at(GPU0, 0x20000, NEED - 1)));
        assertTrue(m.contains("output has 255 bytes; " + LAYOUT + " needs 256"), m);
    }

    @Test void anOutputOnAnotherDeviceNamesBoth() {
        String m = refused(() -> check(at(GPU1, 0x20000, NEED)));
        assertTrue(m.contains("output is on " + GPU1 + ", expected the rank's device, " + GPU0), m);
        // the same addresses on another device are other memory: no overlap is claimed there
        assertFalse(at(GPU1, 0x10000, NEED).overlaps(at(GPU0, 0x10000, NEED)));
    }

    @Test void aFreedOutputIsRefused() {
        DeviceBuffer freed;
        try (Arena a = Arena.ofConfined()) {
            freed = DeviceBuffer.wrap(GPU0, MemorySegment.ofAddress(0x20000).reinterpret(NEED, a, null));
        }
        IllegalStateException e = assertThrows(IllegalStateException.class, () -> check(freed));
        assertTrue(e.getMessage().contains("was freed"), e.getMessage());
    }

    @Test void overlapsWithTheInputOrTheInstancesMemoryAreNamed() {
        for (long start : new long[] {0x10000, 0x10000 - NEED + 1, 0x10000 + NEED - 1}) {
            String m = refused(() -> check(at(GPU0, start, NEED)));
            assertTrue(m.contains(RANK + ": input overlaps the output, which the call writes while it reads input"), m);
        }
        for (long start : new long[] {0x80000, 0x80000 - NEED + 1, 0x8ffff}) {
            String m = refused(() -> check(at(GPU0, start, NEED)));
            assertTrue(m.contains(RANK + ": output overlaps this all-to-all's window, which the call writes itself"), m);
        }
    }

    @Test void allToAllVNamesEveryBufferItReads() {
        DeviceBuffer in = at(GPU0, 0x10000, 4096), counts = at(GPU0, 0x30000, 32), offsets = at(GPU0, 0x30100, 32);
        DeviceBuffer[] reads = {in, counts, offsets};
        String[] names = {"input", "send counts", "send offsets"};
        DeviceBuffer[] owned = {at(GPU0, 0x80000, 0x4000), at(GPU0, 0x90000, 32)};
        String layout = "4 slots of capacityPerPeer = 1024 bytes";
        CallerOutputs.check(RANK, GPU0, at(GPU0, 0x40000, 4096), 4096, layout, reads, names, owned, "the receive area or counts");
        for (int j = 0; j < reads.length; j++) {
            DeviceBuffer over = at(GPU0, reads[j].address() - 8, 4096);
            String m = refused(() -> CallerOutputs.check(RANK, GPU0, over, 4096, layout, reads, names, owned, "the receive area or counts"));
            assertTrue(m.contains(names[j] + " overlaps the output"), m);
        }
        String counted = refused(() -> CallerOutputs.check(RANK, GPU0, at(GPU0, 0x8ff08, 4096), 4096, layout, reads, names, owned, "the receive area or counts"));
        assertTrue(counted.contains("output overlaps the receive area or counts"), counted);
        String small = refused(() -> CallerOutputs.check(RANK, GPU0, at(GPU0, 0x40000, 4095), 4096, layout, reads, names, owned, "the receive area or counts"));
        assertTrue(small.contains("has 4095 bytes; " + layout + " needs 4096"), small);
    }

    @Test void listsNeedOneOutputPerLocalRankAndApartFromEachOther() {
        String none = refused(() -> CallerOutputs.requireOnePerLocalRank(null, 2));
        assertTrue(none.contains("outputs must be given, one buffer per local rank (2), got null"), none);
        String shorter = refused(() -> CallerOutputs.requireOnePerLocalRank(List.of(at(GPU0, 0x1000, 8)), 2));
        assertTrue(shorter.contains("one output per local rank expected (2), got 1"), shorter);
        CallerOutputs.requireOnePerLocalRank(Arrays.asList(null, null), 2);  // a null entry is refused by the per-rank check, by name
        CallerOutputs.requireDisjoint(List.of(at(GPU0, 0x1000, 256), at(GPU1, 0x1000, 256)), List.of("rank 0", "rank 1"));
        CallerOutputs.requireDisjoint(List.of(at(GPU0, 0x1000, 256), at(GPU0, 0x1100, 256)), List.of("rank 0", "rank 1"));
        String shared = refused(() -> CallerOutputs.requireDisjoint(List.of(at(GPU0, 0x1000, 256), at(GPU0, 0x10ff, 256)), List.of("rank 0", "rank 1")));
        assertTrue(shared.contains("the outputs of rank 0 and rank 1 overlap; each local rank needs an output of its own"), shared);
    }
}
