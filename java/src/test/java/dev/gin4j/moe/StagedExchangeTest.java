package dev.gin4j.moe;

import org.junit.jupiter.api.Test;

import java.util.ArrayList;
import java.util.List;

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
    void aSendRefusesOtherCallsUntilItsCompletionIsQueued() {
        StagedExchange x = new StagedExchange();
        x.requireNone("rank 0", "a dispatch");  // nothing pending: accepted
        List<String> ran = new ArrayList<>();
        x.begin("rank 0", StagedExchange.Kind.DISPATCH, null, false, () -> ran.add("launch"), () -> ran.add("after"));
        assertTrue(x.isPending());
        IllegalStateException e = assertThrows(IllegalStateException.class, () -> x.requireNone("rank 0", "combine"));
        assertTrue(e.getMessage().contains("rank 0: combine while the dispatchSend") && e.getMessage().contains("call complete"), e.getMessage());
        assertThrows(IllegalStateException.class, () -> x.begin("rank 0", StagedExchange.Kind.COMBINE, null, false, () -> {}, () -> {}));
        x.complete("rank 0", null, false);
        assertEquals(List.of("launch", "after"), ran);
        assertFalse(x.isPending());
        x.requireNone("rank 0", "a dispatch");
        IllegalStateException none = assertThrows(IllegalStateException.class, () -> x.complete("rank 0", null, false));
        assertTrue(none.getMessage().contains("complete without a dispatchSend or combineSend"), none.getMessage());
    }

    @Test
    void aCompleteOutsideTheSendsCaptureStateIsRefusedAndTheSendStaysPending() {
        StagedExchange x = new StagedExchange();
        x.begin("rank 1", StagedExchange.Kind.COMBINE, null, true, () -> {}, () -> {});
        IllegalStateException e = assertThrows(IllegalStateException.class, () -> x.complete("rank 1", null, false));
        assertTrue(e.getMessage().contains("combineSend was queued inside a graph capture and complete outside"), e.getMessage());
        assertTrue(x.isPending());
        x.complete("rank 1", null, true);
        assertFalse(x.isPending());
    }

    @Test
    void aFailedCompleteLaunchLeavesTheExchangePendingAndRunsNothingAfter() {
        StagedExchange x = new StagedExchange();
        List<String> ran = new ArrayList<>();
        boolean[] fail = {true};
        x.begin("rank 2", StagedExchange.Kind.DISPATCH, null, false, () -> {
            if (fail[0]) throw new IllegalStateException("launch failed");
            ran.add("launch");
        }, () -> ran.add("after"));
        assertThrows(IllegalStateException.class, () -> x.complete("rank 2", null, false));
        assertTrue(x.isPending(), "the device counted a call whose second half did not run: the rank must not pass for completed");
        assertEquals(List.of(), ran);
        fail[0] = false;
        x.complete("rank 2", null, false);
        assertEquals(List.of("launch", "after"), ran);
        assertFalse(x.isPending());
    }
}
