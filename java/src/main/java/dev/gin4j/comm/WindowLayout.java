package dev.gin4j.comm;

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

    private WindowLayout(Map<String, Region> regions, long size) {
        this.regions = Map.copyOf(regions);
        this.size = size;
    }

    public static Builder builder() { return new Builder(); }

    public long size() { return size; }
    public Map<String, Region> regions() { return regions; }

    public Region region(String name) {
        Region r = regions.get(name);
        if (r == null) throw new IllegalArgumentException("window has no region '" + name + "'; it has " + regions.keySet());
        return r;
    }

    public static final class Builder {
        private final Map<String, Region> regions = new LinkedHashMap<>();
        private long end;

        /** Appends a region aligned to {@code alignment} bytes (a power of two). */
        public Builder region(String name, long size, long alignment) {
            if (size < 0) throw new IllegalArgumentException("region '" + name + "' has negative size " + size);
            if (Long.bitCount(alignment) != 1) throw new IllegalArgumentException("alignment " + alignment + " of region '" + name + "' is not a power of two");
            if (regions.containsKey(name)) throw new IllegalArgumentException("region '" + name + "' is defined twice");
            long off = (end + alignment - 1) & -alignment;
            regions.put(name, new Region(name, off, size));
            end = Math.addExact(off, size);
            return this;
        }

        public WindowLayout build() {
            // windows are registered in whole 4 KiB pages at least; keep the size a page multiple
            long size = Math.max(4096, (end + 4095) & -4096L);
            return new WindowLayout(regions, size);
        }
    }
}
