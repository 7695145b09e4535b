package dev.gin4j.internal.gpu;

import dev.gin4j.gpu.DeviceBuffer;
import dev.gin4j.gpu.Stream;

import java.util.List;

/** Argument checks the exchanges share. */
public final class Checks {
    private Checks() {}

    /**
     * Refuses {@code input} when it shares a byte with {@code written}, which a call writes while it
     * reads its inputs (an earlier call's result fed straight back, say): one rule for every
     * exchange and both backends. The message is built only when it throws.
     */
    public static void requireDisjoint(Object owner, String inputName, DeviceBuffer input, DeviceBuffer written, String writtenName) {
        if (input.overlaps(written))
            throw new IllegalArgumentException(owner + ": " + inputName + " overlaps " + writtenName + ", which the call writes while it reads " + inputName
                    + " (both backends refuse it alike); copy it elsewhere first");
    }

    /** Refuses {@code operation} (one that waits for the host) on streams that capture a graph. */
    public static void refuseCapture(List<Stream> streams, String operation) {
        for (Stream s : streams)
            if (s.isCapturing()) throw new IllegalStateException(operation + " cannot be captured in a graph (" + s.describe() + " is capturing)");
    }
}
