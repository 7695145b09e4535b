package dev.gin4j.moe;

import org.junit.jupiter.api.Test;

import static org.junit.jupiter.api.Assertions.assertDoesNotThrow;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

/** The opt-in that MoE across nodes asks for (GIN4J_MOE_ACROSS_NODES), on the CPU. */
class MoeAcrossNodesOptInTest {
    @Test void experimentalLetsItRun() {
        assertDoesNotThrow(() -> MoeNetwork.requireOptIn("experimental"));
    }

    @Test void unsetIsRefusedNamingTheSettingAndTheAlternative() {
        for (String unset : new String[] {null, ""}) {
            UnsupportedOperationException e = assertThrows(UnsupportedOperationException.class, () -> MoeNetwork.requireOptIn(unset));
            assertTrue(e.getMessage().contains("GIN4J_MOE_ACROSS_NODES=experimental") && e.getMessage().contains("Backend.HOST"), e.getMessage());
        }
    }

    @Test void anotherValueIsABadSettingNamingWhatWasExpected() {
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> MoeNetwork.requireOptIn("yes"));
        assertTrue(e.getMessage().contains("'yes'") && e.getMessage().contains("expected 'experimental'"), e.getMessage());
    }
}
