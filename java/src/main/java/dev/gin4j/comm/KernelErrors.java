package dev.gin4j.comm;

import dev.gin4j.gpu.Device;
import dev.gin4j.gpu.DeviceBuffer;
import dev.gin4j.gpu.Stream;

import java.lang.foreign.Arena;
import java.util.ArrayList;
import java.util.List;

/**
 * The error word gin4j's kernels set instead of hanging or writing out of bounds
 * ({@code errorFlags}, bits in gin-kernels/src/include/gin_sync.cuh and docs/kernels.md). Kernels only OR
 * bits in; {@link #check} reads the word after the stream is synchronized and throws.
 */
public final class KernelErrors {
    // bit -> meaning, as gin-kernels/src/include/gin_sync.cuh and src/moe/memory_layout.cuh define them
    private static final java.util.Map<Integer, String> BITS = java.util.Map.of(
            0, "a wait for a peer timed out (a peer did not take part, or its kernel failed)",
            1, "a count exceeded its receive capacity and was clamped",
            2, "a send range went past the end of the send buffer and was clamped",
            3, "kernel arguments were inconsistent (grid or sizes); nothing was moved",
            4, "a peer is not load/store reachable from this GPU (no LSA path)",
            8, "an expert id was out of range (< -1 or >= experts) or repeated within a token; it was treated as masked",
            9, "the token count was negative or above the configured maximum and was clamped",
            10, "the MoE configuration or launch shape is outside the kernels' limits; nothing was done",
            11, "received counts or row indices were inconsistent; rows were dropped");

    private final DeviceBuffer word;

    public KernelErrors(Device device, Arena arena, Stream stream) {
        this.word = device.allocate(4, arena);
        word.fill((byte) 0, stream);
    }

    public DeviceBuffer buffer() { return word; }

    /** The bits set so far (a synchronous read). */
    public int read() { return word.readInts(1)[0]; }

    private static final int TIMED_OUT = 1;  // bit 0: after it the kernels' protocol state is undefined (docs/kernels.md)

    /** Throws naming every bit set, and clears the word so the next operation starts clean. */
    public void check(String operation, Stream stream) {
        stream.synchronize();
        int bits = readAndClear(stream);
        if (bits != 0) throw failure(operation, bits);
    }

    /** The bits set once the stream's work is done; the word is cleared if any were. */
    private int readAndClear(Stream stream) {
        int bits = read();
        if (bits != 0) {
            word.fill((byte) 0, stream);
            stream.synchronize();
        }
        return bits;
    }

    private CommException failure(String operation, int bits) {
        return new CommException(operation + " on " + word.device() + " reported: " + String.join("; ", describe(bits)) + " (error bits 0x" + Integer.toHexString(bits) + ")");
    }

    /**
     * {@link #check} of every local rank's word ({@code words.get(i)} after {@code streams.get(i)}):
     * all are read and cleared, so no rank's error is left to be blamed on the next call; throws the
     * first rank's, the others attached as suppressed. A wait for a peer that timed out also aborts
     * the group: the kernels' call counters and flags no longer agree across ranks, and clean-up
     * that is collective (window deregistration) would wait for a peer that may be gone.
     */
    public static void checkAll(String operation, List<KernelErrors> words, List<Stream> streams, CommGroup group) {
        RuntimeException first = null;  // a failed wait (a sticky fault) must not stop the others' reads either
        boolean timedOut = false;
        for (int i = 0; i < words.size(); i++) {
            try {
                group.await(streams.get(i), operation);  // not forever: a HOST exchange whose peer never joins
                int bits = words.get(i).readAndClear(streams.get(i));
                if (bits != 0) {
                    timedOut |= (bits & TIMED_OUT) != 0;
                    throw words.get(i).failure(operation, bits);
                }
            } catch (RuntimeException e) {
                if (first == null) first = e;
                else first.addSuppressed(e);
            }
        }
        if (timedOut) {
            CommException aborted = new CommException(first.getMessage() + "; after a time-out the ranks' kernels no longer agree on their state, so "
                    + group.describe() + " was aborted: close what was built on it and make a new group", first);
            try {
                group.abort();
            } catch (RuntimeException e) {
                aborted.addSuppressed(e);
            }
            throw aborted;
        }
        if (first != null) throw first;
    }

    public static List<String> describe(int bits) {
        List<String> out = new ArrayList<>();
        for (int i = 0; i < 32; i++) {
            if ((bits & (1 << i)) != 0) out.add(BITS.getOrDefault(i, "error bit " + i));
        }
        return out;
    }
}
