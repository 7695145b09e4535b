package dev.gin4j.gpu;

import dev.gin4j.testing.Gpus;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;

import static org.junit.jupiter.api.Assertions.*;

/** Streams, events and memory made by other code (here: straight through the runtime), used by gin4j and left alive by it. */
@Tag("gpu")
class WrapGpuTest {
    @Test void wrappedStreamsAndEventsCarryWorkAndOutliveTheirWrappers() {
        GpuRuntime rt = Gpus.runtime();
        Device dev = rt.device(0);
        int ord = dev.ordinal();
        long rawStream = dev.driver().streamCreate(ord), rawEvent = dev.driver().eventCreate(ord, true);
        int live = NativeResource.liveCount();
        try (Arena arena = Arena.ofConfined(); Stream theirs = dev.createStream()) {
            DeviceBuffer foreignMemory;
            try (Arena foreign = Arena.ofConfined()) {
                long bytes = 1 << 20;
                DeviceBuffer owner = dev.allocate(bytes, arena);  // stands for another library's allocation
                foreignMemory = DeviceBuffer.wrap(dev, MemorySegment.ofAddress(owner.address()).reinterpret(bytes, foreign, null));
                try (Stream s = Stream.wrap(rawStream, dev); Event e = Event.wrap(rawEvent, dev); Event start = dev.createEvent()) {
                    assertFalse(s.isOwned() || e.isOwned());
                    try (Stream own = dev.createStream()) { assertTrue(own.isOwned()); }
                    start.record(s);
                    foreignMemory.fill((byte) 0x3c, s);
                    e.record(s);
                    theirs.waitFor(e);  // a gin4j stream ordered after the wrapped stream's work
                    theirs.synchronize();
                    e.synchronize();
                    assertTrue(e.isComplete() && s.isIdle());
                    assertTrue(e.elapsedMillisSince(start) >= 0);
                    assertFalse(s.isCapturing());
                    dev.driver().beginCapture(ord, rawStream);  // a capture begun by other code is seen
                    assertTrue(s.isCapturing());
                    dev.driver().graphDestroy(ord, dev.driver().endCapture(ord, rawStream));
                    assertFalse(s.isCapturing());
                }
                byte[] back = owner.toByteArray();
                for (int i = 0; i < back.length; i += 4093) assertEquals((byte) 0x3c, back[i], "byte " + i);
            }
            assertThrows(IllegalStateException.class, foreignMemory::address, "refused once its arena is closed");
            Stream forgotten = Stream.wrap(rawStream, dev);
            forgotten.close();
            IllegalStateException closed = assertThrows(IllegalStateException.class, forgotten::synchronize);
            assertTrue(closed.getMessage().contains("wrapped stream 0x" + Long.toHexString(rawStream)) && closed.getMessage().contains("is closed"), closed.getMessage());
            // the wrappers are closed; the handles still work, and only their maker destroys them
            dev.driver().eventRecord(ord, rawEvent, rawStream);
            dev.driver().streamSynchronize(ord, rawStream);
            assertTrue(dev.driver().eventQuery(ord, rawEvent));
        } finally {
            dev.driver().eventDestroy(ord, rawEvent);
            dev.driver().streamDestroy(ord, rawStream);
        }
        assertEquals(live, NativeResource.liveCount(), () -> "left open:\n" + NativeResource.liveSummary());
    }
}
