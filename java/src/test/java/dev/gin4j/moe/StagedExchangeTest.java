package dev.gin4j.moe;

import org.junit.jupiter.api.Test;

import java.util.concurrent.atomic.AtomicInteger;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * The staged calls' order on one rank: send, then complete, nothing else between (the refusal of a
 * complete on another stream needs real streams: LoopbackGinMoeRank checks it on the GPU).
 */
class StagedExchangeTest {
    @Test
    void aSendRefusesOtherCallsUntilItsCompletionIsTaken() {
        StagedExchange x = new StagedExchange();
        x.requireNone("rank 0", "a dispatch");  // nothing pending: accepted
        AtomicInteger ran = new AtomicInteger();
        x.begin("rank 0", StagedExchange.Kind.DISPATCH, null, ran::incrementAndGet);
        assertTrue(x.isPending());
        IllegalStateException e = assertThrows(IllegalStateException.class, () -> x.requireNone("rank 0", "combine"));
        assertTrue(e.getMessage().contains("rank 0: combine while the dispatchSend") && e.getMessage().contains("call complete"), e.getMessage());
        assertThrows(IllegalStateException.class, () -> x.begin("rank 0", StagedExchange.Kind.COMBINE, null, () -> {}));
        x.take("rank 0", null).run();
        assertEquals(1, ran.get());
        assertFalse(x.isPending());
        x.requireNone("rank 0", "a dispatch");
        IllegalStateException none = assertThrows(IllegalStateException.class, () -> x.take("rank 0", null));
        assertTrue(none.getMessage().contains("complete without a dispatchSend or combineSend"), none.getMessage());
    }
}
