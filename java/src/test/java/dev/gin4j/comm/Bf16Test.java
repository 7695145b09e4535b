package dev.gin4j.comm;

import org.junit.jupiter.api.Test;

import static org.junit.jupiter.api.Assertions.*;

/** bf16 conversion, without a GPU. */
class Bf16Test {
    @Test void roundsToNearestEvenAndKeepsNaN() {
        assertEquals((short) 0x3f80, Bf16.fromFloat(1f));
        assertEquals(1f, Bf16.toFloat((short) 0x3f80));
        // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: to the even one, 1
        assertEquals((short) 0x3f80, Bf16.fromFloat(1f + 0x1p-8f));
        // 1 + 3 * 2^-8 lies halfway between 1 + 2^-7 (odd) and 1 + 2^-6: to 1 + 2^-6
        assertEquals((short) 0x3f82, Bf16.fromFloat(1f + 3 * 0x1p-8f));
        assertEquals((short) 0x3f81, Bf16.fromFloat(1f + 0x1p-8f + 0x1p-20f));  // just above halfway: up
        assertEquals((short) 0xbf80, Bf16.fromFloat(-1f));
        assertEquals((short) 0x7f80, Bf16.fromFloat(Float.POSITIVE_INFINITY));
        assertEquals((short) 0x7f80, Bf16.fromFloat(Float.MAX_VALUE), "rounds up to infinity, as in hardware");
        assertTrue(Float.isNaN(Bf16.toFloat(Bf16.fromFloat(Float.intBitsToFloat(0x7f800001)))), "a NaN with only low mantissa bits stays NaN");
        for (int b = 0; b < 0x10000; b++) {
            float f = Bf16.toFloat((short) b);
            if (!Float.isNaN(f)) assertEquals((short) b, Bf16.fromFloat(f), "bf16 0x" + Integer.toHexString(b) + " round-trips");
        }
    }
}
