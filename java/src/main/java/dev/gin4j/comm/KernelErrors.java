package dev.gin4j.comm;

import dev.gin4j.gpu.Device;
import dev.gin4j.gpu.DeviceBuffer;
import dev.gin4j.gpu.Stream;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.ArrayList;
import java.util.List;

/**
 * The error word gin4j's kernels set instead of hanging or writing out of bounds
 * ({@code errorFlags}, bits in gin-kernels/src/gin_sync.cuh and KERNELS.md). Kernels only OR
 * bits in; {@link #check} reads the word after the stream is synchronized and throws.
 */
public final class KernelErrors {
    private static final String[] BITS = {
            "a wait for a peer timed out (a peer did not take part, or its kernel failed)",
            "a count exceeded its receive capacity and was clamped",
            "a send range went past the end of the send buffer and was clamped",
            "kernel arguments were inconsistent (grid or sizes); nothing was moved",
            "a peer is not load/store reachable from this GPU (no LSA path)",
            "an expert id was out of range and was treated as masked",
            "more rows arrived than the receive capacity; the excess was dropped",
    };

    private final DeviceBuffer word;

    public KernelErrors(Device device, Arena arena, Stream stream) {
        this.word = device.allocate(4, arena);
        word.fill((byte) 0, stream);
    }

    public DeviceBuffer buffer() { return word; }

    /** The bits set so far (a synchronous read). */
    public int read() {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment h = a.allocate(4);
            word.copyToHost(h);
            return h.get(ValueLayout.JAVA_INT, 0);
        }
    }

    /** Throws naming every bit set, and clears the word so the next operation starts clean. */
    public void check(String operation, Stream stream) {
        stream.synchronize();
        int bits = read();
        if (bits != 0) {
            word.fill((byte) 0, stream);
            stream.synchronize();
            throw new CommException(operation + " on " + word.device() + " reported: " + String.join("; ", describe(bits)) + " (error bits 0x" + Integer.toHexString(bits) + ")");
        }
    }

    public static List<String> describe(int bits) {
        List<String> out = new ArrayList<>();
        for (int i = 0; i < 32; i++) {
            if ((bits & (1 << i)) != 0) out.add(i < BITS.length ? BITS[i] : "error bit " + i);
        }
        return out;
    }
}
