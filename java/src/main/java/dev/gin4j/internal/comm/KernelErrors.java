package dev.gin4j.internal.comm;

import dev.gin4j.comm.CommException;
import dev.gin4j.comm.CommGroup;
import dev.gin4j.comm.ErrorCheck;
import dev.gin4j.internal.gpu.Checks;
import dev.gin4j.gpu.Device;
import dev.gin4j.gpu.DeviceBuffer;
import dev.gin4j.gpu.Event;
import dev.gin4j.gpu.NativeResource;
import dev.gin4j.gpu.PinnedBuffer;
import dev.gin4j.gpu.Stream;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.List;

/**
 * The error word gin4j's kernels set instead of hanging or writing out of bounds
 * ({@code errorFlags}, bits in gin-kernels/src/include/gin_sync.cuh and docs/kernels.md). Kernels only OR
 * bits in; {@link #check} reads the word after the stream is synchronized and throws;
 * {@link #later} queues a read for an {@link ErrorCheck} to report without stalling the stream.
 * For gin4j's exchanges; not meant to be used by applications.
 */
public final class KernelErrors {
    // bit -> meaning, as gin-kernels/src/include/gin_sync.cuh and gin-kernels/abi/moe.h define them
    private static final java.util.Map<Integer, String> BITS = java.util.Map.ofEntries(
            java.util.Map.entry(0, "a wait for a peer timed out (a peer did not take part, or its kernel failed)"),
            java.util.Map.entry(1, "a count exceeded its receive capacity and was clamped"),
            java.util.Map.entry(2, "a send range went past the end of the send buffer and was clamped"),
            java.util.Map.entry(3, "kernel arguments were inconsistent (grid or sizes); nothing was moved"),
            java.util.Map.entry(4, "a peer is not load/store reachable from this GPU (no LSA path)"),
            java.util.Map.entry(8, "an expert id was out of range (< -1 or >= experts) or repeated within a token; it was treated as masked"),
            java.util.Map.entry(9, "the token count was negative or above the configured maximum and was clamped"),
            java.util.Map.entry(10, "the MoE configuration or launch shape is outside the kernels' limits; nothing was done"),
            java.util.Map.entry(11, "received counts or row indices were inconsistent; rows were dropped"),
            java.util.Map.entry(12, "expertOut holds fewer rows than the dispatch received; the rows past its end were not read and are missing from y"));

    /** The most {@link ErrorCheck}s of one word not yet reported: more means checks are made and never polled. */
    static final int MAX_PENDING_CHECKS = 256;

    private final DeviceBuffer word;
    private final Arena arena;
    private final ArrayDeque<Slot> freeSlots = new ArrayDeque<>();  // pinned words and events of reported checks, for reuse
    private int pendingChecks;

    /** Where a later check's copy of the word lands (pinned host memory), and the event after it. */
    record Slot(PinnedBuffer copy, Event done) {}

    /**
     * A word on {@code device} in memory of {@code arena}, cleared on {@code stream}; the pinned
     * memory and events of later checks ({@link #later}) are freed when {@code arena} closes.
     */
    public KernelErrors(Device device, Arena arena, Stream stream) {
        this.word = device.allocate(4, arena);
        this.arena = arena;
        word.fill((byte) 0, stream);
    }

    /** The word on the device, for a kernel's error argument. */
    public DeviceBuffer buffer() { return word; }

    /** The bits set so far (a synchronous read, after all work on the device). */
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
        int bits = word.readInts(1, stream)[0];
        if (bits != 0) {
            word.fill((byte) 0, stream);
            stream.synchronize();
        }
        return bits;
    }

    CommException failure(String operation, int bits) {
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
                Groups.await(group, streams.get(i), operation);  // not forever: a HOST exchange whose peer never joins
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
        throwCollected(first, timedOut, group);
    }

    /** Throws {@code first} (if any); after a time-out, wrapped in the group's abort (see {@link #checkAll}). */
    static void throwCollected(RuntimeException first, boolean timedOut, CommGroup group) {
        if (timedOut && group != null) {
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

    static boolean timedOut(int bits) { return (bits & TIMED_OUT) != 0; }

    /**
     * A check of every local rank's word that reports later ({@link ErrorCheck}): on each
     * {@code streams.get(i)}, after the work queued there, an asynchronous copy of
     * {@code words.get(i)} into pinned memory, a clear of the word, and an event; nothing waits.
     * {@code hostFailures}, where not null, holds per rank what the host part of a call already
     * found wrong (null entries for none), reported with the kernels' bits. The same error text
     * as {@link #checkAll}; a time-out aborts {@code group} (null: nothing to abort) when reported.
     * {@code owner} is the instance the words belong to: a check is refused once it is closed.
     *
     * @throws IllegalStateException when a stream captures a graph (the check reads on the host),
     *         or more than {@value #MAX_PENDING_CHECKS} checks of a word were never reported
     */
    public static ErrorCheck later(String operation, NativeResource owner, List<KernelErrors> words, List<Stream> streams, List<String> hostFailures, CommGroup group) {
        if (words.size() != streams.size()) throw new IllegalArgumentException("one stream per error word expected (" + words.size() + "), got " + streams.size());
        Checks.refuseCapture(streams, "a later error check of the " + operation + ", which reads the error words on the host,");
        for (int i = 0; i < words.size(); i++) {
            streams.get(i).handle();  // a closed stream throws here, before anything is queued
            if (streams.get(i).device() != words.get(i).word.device())
                throw new IllegalArgumentException("stream " + i + " is on " + streams.get(i).device() + ", its rank's error word on " + words.get(i).word.device());
        }
        List<PendingErrorCheck.Entry> entries = new ArrayList<>();
        try {
            for (int i = 0; i < words.size(); i++) {
                KernelErrors w = words.get(i);
                entries.add(new PendingErrorCheck.Entry(w, w.queueRead(streams.get(i)), streams.get(i), hostFailures == null ? null : hostFailures.get(i)));
            }
        } catch (RuntimeException e) {
            for (PendingErrorCheck.Entry en : entries) en.words().dropSlot();  // queued: their copies may still land, so the slots are not reused
            throw e;
        }
        return new PendingErrorCheck(operation, owner, group, entries);
    }

    /** Queues copy, clear and event on {@code stream}; the slot is this check's until {@link #release}. */
    private Slot queueRead(Stream stream) {
        Slot slot = takeSlot();
        try {
            word.copyToHostAsync(slot.copy().host().asSlice(0, word.byteSize()), stream);  // the pinned slot is larger than the word
            word.fill((byte) 0, stream);  // stream-ordered after the copy: the next check sees only later bits
            slot.done().record(stream);
            return slot;
        } catch (RuntimeException e) {
            dropSlot();  // part of it may be queued: not reused
            throw e;
        }
    }

    private synchronized Slot takeSlot() {
        if (pendingChecks >= MAX_PENDING_CHECKS)
            throw new IllegalStateException(MAX_PENDING_CHECKS + " later error checks of " + word.device() + " were made and not yet reported: poll() or await() them "
                    + "(each holds pinned memory and an event until it reports)");
        Slot slot = freeSlots.poll();
        if (slot == null) slot = newSlot();
        pendingChecks++;
        return slot;
    }

    /** Pinned memory and an event, both freed when the arena closes. */
    private Slot newSlot() {
        Device device = word.device();
        PinnedBuffer copy = device.allocatePinned(16, arena);
        Event done = device.createEvent(false);
        try {
            MemorySegment.NULL.reinterpret(arena, s -> done.close());  // the event is destroyed with the arena
        } catch (RuntimeException e) {
            done.close();
            throw e;
        }
        return new Slot(copy, done);
    }

    /** A reported check gives its slot back for reuse. */
    synchronized void release(Slot slot) {
        pendingChecks--;
        freeSlots.push(slot);
    }

    /** A check that failed to queue, or was given up before it completed: its slot is not reused (the arena frees it). */
    synchronized void dropSlot() { pendingChecks--; }

    /** The word's device. */
    Device device() { return word.device(); }

    /** Whether the memory of this word (and of its checks' slots) is still alive. */
    boolean isAlive() { return word.segment().scope().isAlive(); }

    /** What each set bit of {@code bits} means, lowest bit first. */
    public static List<String> describe(int bits) {
        List<String> out = new ArrayList<>();
        for (int i = 0; i < 32; i++) {
            if ((bits & (1 << i)) != 0) out.add(BITS.getOrDefault(i, "error bit " + i));
        }
        return out;
    }
}
