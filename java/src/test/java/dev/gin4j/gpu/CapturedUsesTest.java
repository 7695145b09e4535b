package dev.gin4j.gpu;

import org.junit.jupiter.api.Test;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;

import static org.junit.jupiter.api.Assertions.*;

/** The bookkeeping behind Graph.launch's refusal (no GPU: host memory and a plain resource stand for what a capture notes). */
class CapturedUsesTest {
    /** A resource with nothing native behind it: what is checked is only its closed state. */
    static final class Named extends NativeResource {
        private final String name;
        Named(String name) { this.name = name; }
        @Override protected void release() { }
        @Override public String describe() { return name; }
    }

    @Test void firstGoneNamesTheFirstClosedResourceOrFreedArenaAndOnlyThen() {
        Arena kept = Arena.ofConfined();
        Arena freed = Arena.ofConfined();
        try (Named instance = new Named("instance A"); Named other = new Named("instance B")) {
            CapturedUses uses = new CapturedUses();
            MemorySegment a = kept.allocate(64), b = freed.allocate(64);
            uses.add(instance);
            uses.add(instance);                       // noted twice, kept once
            uses.add(a, "buffer a");
            uses.add(a.asSlice(8, 8), "slice of a");  // the same arena: one scope
            uses.add(b, "buffer b");
            uses.add(MemorySegment.ofAddress(4096).reinterpret(16), "global range");  // never freed
            CapturedUses.Frozen f = uses.freeze();
            assertEquals(4, f.size(), "one resource and three scopes (kept, freed, global)");
            assertNull(f.firstGone(), "everything alive");

            other.close();                            // not noted: does not matter
            assertNull(f.firstGone());
            freed.close();
            String gone = f.firstGone();
            assertNotNull(gone);
            assertTrue(gone.startsWith("buffer b") && gone.contains("freed"), gone);
            instance.close();
            gone = f.firstGone();
            assertTrue(gone.startsWith("instance A") && gone.contains("was closed"), "resources are checked first: " + gone);

            assertEquals(0, uses.freeze().size(), "the sets are emptied by the first freeze");
        } finally {
            kept.close();
            if (freed.scope().isAlive()) freed.close();
        }
    }
}
