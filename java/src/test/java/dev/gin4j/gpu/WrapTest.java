package dev.gin4j.gpu;

import org.junit.jupiter.api.Test;

import java.lang.foreign.MemorySegment;

import static org.junit.jupiter.api.Assertions.*;

/** Stream.wrap, Event.wrap and DeviceBuffer.wrap refuse what cannot be a handle or device memory, without a GPU. */
class WrapTest {
    private static final Device DEVICE = new Device(null, 0);  // never asked anything: the checks come first

    @Test void zeroHandlesAreRefusedWithWhatIsExpected() {
        int live = NativeResource.liveCount();
        IllegalArgumentException s = assertThrows(IllegalArgumentException.class, () -> Stream.wrap(0, DEVICE));
        assertTrue(s.getMessage().contains("Stream.wrap needs a stream handle") && s.getMessage().contains("got 0"), s.getMessage());
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> Event.wrap(0, DEVICE));
        assertTrue(e.getMessage().contains("Event.wrap needs an event handle") && e.getMessage().contains("got 0"), e.getMessage());
        assertEquals(live, NativeResource.liveCount(), "a refused wrap registers nothing");
    }

    @Test void aNullDeviceIsRefusedByName() {
        NullPointerException s = assertThrows(NullPointerException.class, () -> Stream.wrap(0x7f00_0000_1000L, null));
        assertTrue(s.getMessage().contains("the device the stream belongs to"), s.getMessage());
        NullPointerException e = assertThrows(NullPointerException.class, () -> Event.wrap(0x7f00_0000_1000L, null));
        assertTrue(e.getMessage().contains("the device the event belongs to"), e.getMessage());
        NullPointerException b = assertThrows(NullPointerException.class, () -> DeviceBuffer.wrap(null, MemorySegment.ofAddress(0x1000).reinterpret(64)));
        assertTrue(b.getMessage().contains("the device the memory belongs to"), b.getMessage());
    }

    @Test void deviceBufferWrapNeedsADeviceAddress() {
        IllegalArgumentException heap = assertThrows(IllegalArgumentException.class, () -> DeviceBuffer.wrap(DEVICE, MemorySegment.ofArray(new byte[64])));
        assertTrue(heap.getMessage().contains("a heap segment"), heap.getMessage());
        IllegalArgumentException zero = assertThrows(IllegalArgumentException.class, () -> DeviceBuffer.wrap(DEVICE, MemorySegment.NULL));
        assertTrue(zero.getMessage().contains("address 0"), zero.getMessage());
    }

    @Test void aWrappedHandleIsNotOwnedAndCloseOnlyForgetsIt() {
        // no runtime call is made for a wrapped handle until it is used; closing one makes none at all
        Stream s = Stream.wrap(0x7f00_0000_1000L, DEVICE);
        Event e = Event.wrap(0x7f00_0000_2000L, DEVICE);
        assertFalse(s.isOwned());
        assertFalse(e.isOwned());
        assertEquals(0x7f00_0000_1000L, s.handle());
        assertEquals(0x7f00_0000_2000L, e.handle());
        s.close();
        e.close();
        assertTrue(s.isClosed() && e.isClosed());
    }
}
