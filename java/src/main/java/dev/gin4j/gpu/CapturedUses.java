package dev.gin4j.gpu;

import java.lang.foreign.MemorySegment;
import java.util.LinkedHashMap;
import java.util.LinkedHashSet;
import java.util.Map;
import java.util.Set;

/**
 * What the work captured into a graph uses: the native objects (instances, code objects,
 * communicators) and the memory (device buffers and host segments, by their arena's scope). A
 * graph holds raw addresses and handles, so replaying it after one of them was closed would read
 * and write memory that may belong to someone else by then; {@link Graph#launch} refuses instead.
 */
final class CapturedUses {
    volatile boolean ended;  // the capture ended: streams that joined it through an event note nothing more
    private final Set<NativeResource> resources = new LinkedHashSet<>();
    private final Map<MemorySegment.Scope, String> scopes = new LinkedHashMap<>();  // scope -> the first thing seen in it

    synchronized void add(NativeResource resource) { resources.add(resource); }

    synchronized void add(MemorySegment memory, Object what) {
        scopes.computeIfAbsent(memory.scope(), s -> what.toString());
    }

    /** The uses as arrays, for the check on every replay; the sets are emptied (events and joined streams may still hold this object). */
    synchronized Frozen freeze() {
        Frozen f = new Frozen(resources.toArray(NativeResource[]::new), scopes.keySet().toArray(MemorySegment.Scope[]::new), scopes.values().toArray(String[]::new));
        resources.clear();
        scopes.clear();
        return f;
    }

    record Frozen(NativeResource[] resources, MemorySegment.Scope[] scopes, String[] scopeNames) {
        static final Frozen NONE = new Frozen(new NativeResource[0], new MemorySegment.Scope[0], new String[0]);

        /** What is gone ("X, which its captured work uses, was closed"), or null when everything is still alive. */
        String firstGone() {
            for (NativeResource r : resources) if (r.isClosed()) return r.describe() + ", which its captured work uses, was closed";
            for (int i = 0; i < scopes.length; i++) if (!scopes[i].isAlive()) return scopeNames[i] + ", which its captured work uses, was freed (its arena is closed)";
            return null;
        }

        int size() { return resources.length + scopes.length; }
    }
}
