package dev.gin4j.gpu;

import org.junit.jupiter.api.Test;

import java.lang.foreign.Arena;
import java.lang.foreign.MemoryLayout;
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

    @Test void settersCheckTheSlotsType() {
        try (Arena arena = Arena.ofConfined()) {
            KernelArgs args = KernelArgs.of(arena, KernelArgs.Type.I32, KernelArgs.Type.F32, KernelArgs.Type.POINTER, KernelArgs.Type.I64,
                    KernelArgs.Type.F64, KernelArgs.Type.struct(4, 4));
            // same sizes, other kinds: every one refused, naming the index, the slot's type and the setter
            IllegalArgumentException floatOnInt = assertThrows(IllegalArgumentException.class, () -> args.setFloat(0, 1f));
            assertTrue(floatOnInt.getMessage().contains("argument 0 is int32") && floatOnInt.getMessage().contains("setFloat"), floatOnInt.getMessage());
            IllegalArgumentException intOnFloat = assertThrows(IllegalArgumentException.class, () -> args.setInt(1, 1));
            assertTrue(intOnFloat.getMessage().contains("argument 1 is float") && intOnFloat.getMessage().contains("setInt"), intOnFloat.getMessage());
            IllegalArgumentException doubleOnPointer = assertThrows(IllegalArgumentException.class, () -> args.setDouble(2, 1.0));
            assertTrue(doubleOnPointer.getMessage().contains("argument 2 is pointer") && doubleOnPointer.getMessage().contains("setDouble"), doubleOnPointer.getMessage());
            assertThrows(IllegalArgumentException.class, () -> args.setLong(2, 1));
            assertThrows(IllegalArgumentException.class, () -> args.setPointer(3, 1));
            assertThrows(IllegalArgumentException.class, () -> args.setDouble(3, 1));
            assertThrows(IllegalArgumentException.class, () -> args.setLong(4, 1));
            IllegalArgumentException intOnStruct = assertThrows(IllegalArgumentException.class, () -> args.setInt(5, 1));
            assertTrue(intOnStruct.getMessage().contains("setStruct"), intOnStruct.getMessage());
            IllegalArgumentException structOnInt = assertThrows(IllegalArgumentException.class, () -> args.setStruct(0, arena.allocate(4)));
            assertTrue(structOnInt.getMessage().contains("argument 0 is int32") && structOnInt.getMessage().contains("setStruct"), structOnInt.getMessage());
            IllegalStateException untouched = assertThrows(IllegalStateException.class, () -> args.checkComplete("k"));
            assertTrue(untouched.getMessage().contains("argument 0 was never set"), "a refused setter marks nothing set: " + untouched.getMessage());

            args.setInt(0, 1).setFloat(1, 1f).setPointer(2, 0).setLong(3, 1).setDouble(4, 1).setStruct(5, arena.allocate(4));
            args.checkComplete("k");
            // an equal type made elsewhere is the same type
            KernelArgs.of(arena, new KernelArgs.Type("int32", 4, 4)).setInt(0, 3).checkComplete("k");
            assertThrows(IllegalArgumentException.class, () -> KernelArgs.of(arena, KernelArgs.Type.I32, null));
        }
    }

    @Test void oneStructArgumentIsFilledByField() {
        try (Arena arena = Arena.ofConfined()) {
            // struct { void* p; int32_t n; int32_t m; void* q; }, as a generated layout names it
            MemoryLayout layout = MemoryLayout.structLayout(ValueLayout.ADDRESS.withName("p"), ValueLayout.JAVA_INT.withName("n"),
                    ValueLayout.JAVA_INT.withName("m"), ValueLayout.ADDRESS.withName("q")).withName("Pair");
            KernelArgs args = KernelArgs.ofStruct(arena, layout);
            assertEquals(1, args.count());
            assertEquals(24, args.type(0).size());
            assertEquals(8, args.type(0).alignment());
            assertTrue(args.type(0).name().startsWith("Pair"), args.type(0).name());
            args.checkComplete("k");  // zeroed and set from the start
            MemorySegment st = args.struct();
            assertEquals(24, st.byteSize());
            for (int i = 0; i < 24; i++) assertEquals(0, st.get(ValueLayout.JAVA_BYTE, i));
            st.set(ValueLayout.JAVA_INT, 8, 7);
            st.set(ValueLayout.JAVA_INT, 12, -3);
            args.setPointerField(16, null);
            MemorySegment p0 = args.params().reinterpret(8).get(ValueLayout.ADDRESS, 0).reinterpret(24);
            assertEquals(7, p0.get(ValueLayout.JAVA_INT, 8));
            assertEquals(-3, p0.get(ValueLayout.JAVA_INT, 12));
            assertEquals(0, p0.get(ValueLayout.JAVA_LONG, 16));
            IllegalArgumentException odd = assertThrows(IllegalArgumentException.class, () -> args.setPointerField(12, null));
            assertTrue(odd.getMessage().contains("offset 12") && odd.getMessage().contains("Pair"), odd.getMessage());
            assertThrows(IllegalArgumentException.class, () -> args.setPointerField(24, null));
            assertThrows(IllegalArgumentException.class, () -> args.setPointerField(-8, null));
            IllegalStateException notStruct = assertThrows(IllegalStateException.class, () -> KernelArgs.of(arena, KernelArgs.Type.I32).struct());
            assertTrue(notStruct.getMessage().contains("ofStruct"), notStruct.getMessage());
        }
    }

    /** A leading by-value argument (the ncclDevComm) and then the struct: the struct sits at its C offset, the leading one must be set. */
    @Test void leadingArgumentThenStruct() {
        try (Arena arena = Arena.ofConfined()) {
            java.util.Random rnd = new java.util.Random();
            long leadingSize = 8 * (1 + rnd.nextInt(100)) + 4;  // not a multiple of 8: the struct is aligned up after it
            MemoryLayout layout = MemoryLayout.structLayout(ValueLayout.JAVA_LONG.withName("p"), ValueLayout.JAVA_INT.withName("n"),
                    MemoryLayout.paddingLayout(4)).withName("Args");
            KernelArgs args = KernelArgs.ofStruct(arena, KernelArgs.Type.struct(leadingSize, 4), layout);
            assertEquals(2, args.count());
            IllegalStateException unset = assertThrows(IllegalStateException.class, () -> args.checkComplete("k"));
            assertTrue(unset.getMessage().contains("argument 0"), unset.getMessage());
            MemorySegment leading = arena.allocate(leadingSize);
            for (long i = 0; i < leadingSize; i++) leading.set(ValueLayout.JAVA_BYTE, i, (byte) rnd.nextInt());
            args.setStruct(0, leading);
            args.checkComplete("k");
            long p = rnd.nextLong() & ~7L;
            int n = rnd.nextInt();
            args.struct().set(ValueLayout.JAVA_INT, 8, n);
            args.setPointerField(0, null);
            args.struct().set(ValueLayout.JAVA_LONG, 0, p);
            assertEquals(16, args.struct().byteSize());
            MemorySegment params = args.params().reinterpret(16);
            MemorySegment p0 = params.get(ValueLayout.ADDRESS, 0).reinterpret(leadingSize);
            MemorySegment p1 = params.get(ValueLayout.ADDRESS, 8).reinterpret(16);
            assertEquals((leadingSize + 7) / 8 * 8, p1.address() - p0.address(), "the struct is 8-byte aligned after the leading argument");
            assertEquals(-1, MemorySegment.mismatch(p0, 0, leadingSize, leading, 0, leadingSize));
            assertEquals(p, p1.get(ValueLayout.JAVA_LONG, 0));
            assertEquals(n, p1.get(ValueLayout.JAVA_INT, 8));
            assertThrows(IllegalArgumentException.class, () -> args.setPointerField(16, null));
            assertThrows(IllegalArgumentException.class, () -> KernelArgs.ofStruct(arena, null, layout));
            KernelArgs none = KernelArgs.none(arena);
            assertEquals(0, none.count());
            none.checkComplete("k");
        }
    }

    @Test void typesAreValidated() {
        assertThrows(IllegalArgumentException.class, () -> new KernelArgs.Type("x", 0, 4));
        assertThrows(IllegalArgumentException.class, () -> new KernelArgs.Type("x", -4, 4));
        assertThrows(IllegalArgumentException.class, () -> new KernelArgs.Type("x", 4, 0));
        assertThrows(IllegalArgumentException.class, () -> new KernelArgs.Type("x", 4, 3));
        assertThrows(IllegalArgumentException.class, () -> new KernelArgs.Type("x", 8, Long.MIN_VALUE));
        assertThrows(IllegalArgumentException.class, () -> new KernelArgs.Type(null, 4, 4));
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> new KernelArgs.Type("weird", 12, 6));
        assertTrue(e.getMessage().contains("'weird'") && e.getMessage().contains("power of two"), e.getMessage());
        assertEquals(16, KernelArgs.Type.struct(24, 16).alignment());
    }

    @Test void shapeChecksUseTheDeviceLimits() {
        int[] grid = {Integer.MAX_VALUE, 65535, 65535}, block = {1024, 1024, 64};
        Kernel.checkShape("k", new LaunchConfig(Integer.MAX_VALUE, 65535, 65535, 1024, 1, 64, 0, false, false), grid, block);
        IllegalArgumentException y = assertThrows(IllegalArgumentException.class, () -> Kernel.checkShape("k", new LaunchConfig(1, 65536, 1, 1, 1, 1, 0, false, false), grid, block));
        assertTrue(y.getMessage().contains("kernel k") && y.getMessage().contains("grid 1x65536x1"), y.getMessage());
        assertThrows(IllegalArgumentException.class, () -> Kernel.checkShape("k", new LaunchConfig(1, 1, 65536, 1, 1, 1, 0, false, false), grid, block));
        IllegalArgumentException z = assertThrows(IllegalArgumentException.class, () -> Kernel.checkShape("k", new LaunchConfig(1, 1, 1, 1, 1, 65, 0, false, false), grid, block));
        assertTrue(z.getMessage().contains("block 1x1x65") && z.getMessage().contains("1024x1024x64"), z.getMessage());
        assertThrows(IllegalArgumentException.class, () -> Kernel.checkShape("k", new LaunchConfig(1, 1, 1, 2048, 1, 1, 0, false, false), grid, block));
        assertEquals("grid 4x2x1, block 128x2x1, 512 bytes of dynamic shared memory, cooperative",
                new LaunchConfig(4, 2, 1, 128, 2, 1, 512, true, false).toString());
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
