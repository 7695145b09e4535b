package dev.gin4j.internal.comm;

import java.util.LinkedHashMap;
import java.util.Map;

/**
 * Named, aligned regions inside one symmetric window (payload, counters, signals). Computed from
 * the same parameters on every rank, so offsets are identical everywhere.
 */
public final class WindowLayout {
    /** One region: where it starts in the window and how long it is. */
    public record Region(String name, long offset, long size) {}

    private final Map<String, Region> regions;
    private final long size;
    private final long fingerprint;

    private WindowLayout(Map<String, Region> regions, long size) {
        this.regions = Map.copyOf(regions);
        this.size = size;
        long h = 1125899906842597L;
        for (Region r : regions.values()) {  // the builder's insertion order
            h = 31 * h + r.name().hashCode();
            h = 31 * h + r.offset();
            h = 31 * h + r.size();
        }
        this.fingerprint = h;
    }

    /** A builder of an empty layout. */
    public static Builder builder() { return new Builder(); }

    /** The window's size in bytes. */
    public long size() { return size; }
    /** The regions by name, in order. */
    public Map<String, Region> regions() { return regions; }

    /**
     * A hash of the regions (names, offsets, sizes, in order), the same in every JVM: ranks compare
     * it so that two layouts of equal size but different regions are not taken for one another.
     */
    public long fingerprint() { return fingerprint; }

    /**
     * The region of that name.
     * @throws IllegalArgumentException for a name the layout does not have
     */
    public Region region(String name) {
        Region r = regions.get(name);
        if (r == null) throw new IllegalArgumentException("window has no region '" + name + "'; it has " + regions.keySet());
        return r;
    }

    /** Adds regions one after the other, each aligned. */
    public static final class Builder {
        private final Map<String, Region> regions = new LinkedHashMap<>();
        private long end;

        /** Appends a region aligned to {@code alignment} bytes (a power of two). */
        public Builder region(String name, long size, long alignment) {
            if (size < 0) throw new IllegalArgumentException("region '" + name + "' has negative size " + size);
            if (alignment <= 0 || Long.bitCount(alignment) != 1) throw new IllegalArgumentException("alignment " + alignment + " of region '" + name + "' is not a positive power of two");
            if (regions.containsKey(name)) throw new IllegalArgumentException("region '" + name + "' is defined twice");
            try {
                long off = Math.addExact(end, alignment - 1) & -alignment;
                long newEnd = Math.addExact(off, size);
                Math.addExact(newEnd, 4095);  // build() rounds the size up to a page: that must fit too
                regions.put(name, new Region(name, off, size));
                end = newEnd;
            } catch (ArithmeticException e) {
                throw new IllegalArgumentException("region '" + name + "' of " + size + " bytes after " + end + " bytes does not fit a 64-bit window size");
            }
            return this;
        }

        /** The layout of the regions added so far. */
        public WindowLayout build() {
            // windows are registered in whole 4 KiB pages at least; keep the size a page multiple
            long size = Math.max(4096, (end + 4095) & -4096L);  // region() checked that this does not overflow
            return new WindowLayout(regions, size);
        }
    }
}
