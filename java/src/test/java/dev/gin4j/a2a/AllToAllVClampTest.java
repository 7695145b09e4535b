package dev.gin4j.a2a;

import org.junit.jupiter.api.Test;

import static org.junit.jupiter.api.Assertions.*;

/** The HOST all-to-all-v's clamping rule, which must be the GIN kernel's (a2a.cu, resolve_count). */
class AllToAllVClampTest {
    private static final long INPUT = 10_000, CAPACITY = 4_096;

    private static String clamp(long count, long offset, long[] out) {
        long[] c = {7, count}, o = {7, offset};
        String wrong = AllToAllV.clamp(c, o, 1, INPUT, CAPACITY);
        assertEquals(7, c[0], "other peers untouched");
        out[0] = c[1];
        out[1] = o[1];
        return wrong;
    }

    @Test void inRangeIsUntouched() {
        long[] got = new long[2];
        assertNull(clamp(CAPACITY, INPUT - CAPACITY, got));
        assertArrayEquals(new long[] {CAPACITY, INPUT - CAPACITY}, got);
        assertNull(clamp(0, INPUT, got));  // an empty range at the very end
        assertArrayEquals(new long[] {0, INPUT}, got);
    }

    @Test void aboveCapacityIsClampedToIt() {
        long[] got = new long[2];
        String wrong = clamp(CAPACITY + 1, 0, got);
        assertArrayEquals(new long[] {CAPACITY, 0}, got);
        assertTrue(wrong.contains("above the capacity of 4096"), wrong);
    }

    @Test void rangesPastTheInputAreCutThenCapped() {
        long[] got = new long[2];
        String wrong = clamp(3_000, INPUT - 1_000, got);
        assertArrayEquals(new long[] {1_000, INPUT - 1_000}, got);
        assertTrue(wrong.contains("past the input's 10000 bytes"), wrong);
        // a negative count is a huge unsigned one, as the kernel reads it: cut to the input, then to the capacity
        wrong = clamp(-1, 0, got);
        assertArrayEquals(new long[] {CAPACITY, 0}, got);
        assertTrue(wrong.contains("18446744073709551615") && wrong.contains("capacity"), wrong);
    }

    @Test void offsetsPastTheInputSendNothingWithoutOverflow() {
        long[] got = new long[2];
        String wrong = clamp(64, Long.MAX_VALUE - 16, got);  // offset + count would wrap negative
        assertArrayEquals(new long[] {0, 0}, got);
        assertTrue(wrong.contains("nothing was sent"), wrong);
        wrong = clamp(64, -8, got);
        assertArrayEquals(new long[] {0, 0}, got);
        assertTrue(wrong.contains("18446744073709551608"), wrong);
    }

    @Test void sizesThatOverflowALongAreRefusedByName() {
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> AllToAll.outputBytes(Long.MAX_VALUE / 2, 4));
        assertTrue(e.getMessage().contains("bytes per peer for 4 ranks"), e.getMessage());
    }
}
