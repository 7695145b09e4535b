package dev.gin4j.a2a;

import dev.gin4j.comm.DType;
import dev.gin4j.internal.comm.KernelErrors;
import dev.gin4j.gpu.Stream;
import org.junit.jupiter.api.Test;

import java.util.Arrays;
import java.util.List;
import java.util.SplittableRandom;

import static org.junit.jupiter.api.Assertions.*;

/** The argument checks of runElements and of the later error checks that need no GPU. */
class ElementCountTest {
    @Test void elementCountsBecomeBytesOrAreRefusedByName() {
        SplittableRandom random = new SplittableRandom();
        for (DType t : DType.values()) {
            long count = random.nextLong(1L << 40);
            assertEquals(count * t.bytes(), AllToAll.elementBytes(count, t), count + " elements of " + t);
            assertEquals(0, AllToAll.elementBytes(0, t));
        }
        IllegalArgumentException negative = assertThrows(IllegalArgumentException.class, () -> AllToAll.elementBytes(-1, DType.BF16));
        assertTrue(negative.getMessage().contains("count must be >= 0 elements per peer, got -1"), negative.getMessage());
        IllegalArgumentException noType = assertThrows(IllegalArgumentException.class, () -> AllToAll.elementBytes(8, null));
        assertTrue(noType.getMessage().contains("element type (DType), got null"), noType.getMessage());
        IllegalArgumentException huge = assertThrows(IllegalArgumentException.class, () -> AllToAll.elementBytes(Long.MAX_VALUE / 2 + 1, DType.BF16));
        assertTrue(huge.getMessage().contains("do not fit a 64-bit byte size"), huge.getMessage());
    }

    @Test void aLaterCheckNeedsOneStreamPerErrorWord() {
        List<Stream> oneStream = Arrays.asList((Stream) null);
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> KernelErrors.later("test exchange", null, List.of(), oneStream, null, null));
        assertTrue(e.getMessage().contains("one stream per error word expected (0), got 1"), e.getMessage());
    }
}
