package dev.gin4j.gpu;

import org.junit.jupiter.api.Test;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;

import static org.junit.jupiter.api.Assertions.*;

class KernelArgsTest {
    @Test void slotsAreAlignedAndHoldTheValues() {
        try (Arena arena = Arena.ofConfined()) {
            KernelArgs args = KernelArgs.of(arena, KernelArgs.Type.I32, KernelArgs.Type.struct(80, 16), KernelArgs.Type.F32, KernelArgs.Type.POINTER, KernelArgs.Type.I64);
            MemorySegment st = arena.allocate(80);
            for (int i = 0; i < 80; i++) st.set(ValueLayout.JAVA_BYTE, i, (byte) (i * 7 + 1));
            args.setInt(0, -5).setStruct(1, st).setFloat(2, 2.5f).setPointer(3, 0xdeadbeef000L).setLong(4, Long.MIN_VALUE);
            args.checkComplete("k");
            MemorySegment params = args.params().reinterpret(5 * 8L);
            MemorySegment p0 = params.getAtIndex(ValueLayout.ADDRESS, 0).reinterpret(4);
            MemorySegment p1 = params.getAtIndex(ValueLayout.ADDRESS, 1).reinterpret(80);
            MemorySegment p2 = params.getAtIndex(ValueLayout.ADDRESS, 2).reinterpret(4);
            MemorySegment p3 = params.getAtIndex(ValueLayout.ADDRESS, 3).reinterpret(8);
            MemorySegment p4 = params.getAtIndex(ValueLayout.ADDRESS, 4).reinterpret(8);
            assertEquals(-5, p0.get(ValueLayout.JAVA_INT, 0));
            assertEquals(0, p1.address() % 16, "struct slot must keep the struct's 16-byte alignment");
            assertEquals(16, p1.address() - p0.address(), "int at 0, struct padded to 16");
            for (int i = 0; i < 80; i++) assertEquals((byte) (i * 7 + 1), p1.get(ValueLayout.JAVA_BYTE, i));
            assertEquals(2.5f, p2.get(ValueLayout.JAVA_FLOAT, 0));
            assertEquals(0, p3.address() % 8);
            assertEquals(0xdeadbeef000L, p3.get(ValueLayout.JAVA_LONG, 0));
            assertEquals(Long.MIN_VALUE, p4.get(ValueLayout.JAVA_LONG, 0));
        }
    }

    @Test void wrongUseIsReported() {
        try (Arena arena = Arena.ofConfined()) {
            KernelArgs args = KernelArgs.of(arena, KernelArgs.Type.I32, KernelArgs.Type.POINTER);
            IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> args.setLong(0, 1));
            assertTrue(e.getMessage().contains("argument 0 is int32"), e.getMessage());
            assertThrows(IndexOutOfBoundsException.class, () -> args.setInt(2, 1));
            args.setInt(0, 1);
            IllegalStateException unset = assertThrows(IllegalStateException.class, () -> args.checkComplete("kern"));
            assertTrue(unset.getMessage().contains("argument 1 was never set"), unset.getMessage());
            KernelArgs s = KernelArgs.of(arena, KernelArgs.Type.struct(24, 8));
            assertThrows(IllegalArgumentException.class, () -> s.setStruct(0, arena.allocate(16)));
        }
        assertThrows(IllegalArgumentException.class, () -> KernelArgs.Type.struct(8, 3));
    }

    @Test void launchConfigRejectsEmptyShapes() {
        assertThrows(IllegalArgumentException.class, () -> LaunchConfig.of(0, 32));
        assertThrows(IllegalArgumentException.class, () -> LaunchConfig.of(1, 0));
        assertThrows(IllegalArgumentException.class, () -> LaunchConfig.of(1, 32).withSharedBytes(-1));
        assertEquals(256, LaunchConfig.of(4, 256).threadsPerBlock());
        IllegalArgumentException both = assertThrows(IllegalArgumentException.class, () -> LaunchConfig.of(1, 32).asCooperative().asProgrammaticDependent());
        assertTrue(both.getMessage().contains("cooperative or programmatic-dependent"), both.getMessage());
        assertTrue(LaunchConfig.of(2, 64).asProgrammaticDependent().withSharedBytes(128).programmaticDependent());
    }
}
