package dev.gin4j.moe;

import org.junit.jupiter.api.Test;

import static org.junit.jupiter.api.Assertions.*;

/** A dispatch handle without offsets or host copy says which option to turn on, without a GPU. */
class MoeDispatchHandleTest {
    private final MoeDispatch plain = new MoeDispatch(null, 0, 5, 1, null, null, null, null, null, null);

    @Test void offsetsNameTheOptionThatMakesThem() {
        IllegalStateException e = assertThrows(IllegalStateException.class, plain::offsets);
        assertTrue(e.getMessage().contains("moe.expertOffsets(true)") && e.getMessage().contains("call 1"), e.getMessage());
    }

    @Test void hostCountsNameTheOptionThatMakesThem() {
        for (org.junit.jupiter.api.function.Executable read : new org.junit.jupiter.api.function.Executable[] {plain::hostCounts, plain::hostOffsets, plain::hostCountsReady}) {
            IllegalStateException e = assertThrows(IllegalStateException.class, read);
            assertTrue(e.getMessage().contains("moe.hostCounts(true)"), e.getMessage());
        }
    }
}
