package dev.gin4j.a2a;

import dev.gin4j.comm.Backend;
import dev.gin4j.bindings.a2a.GinA2avArgs;
import dev.gin4j.bindings.a2a.GinA2avHybridArgs;
import dev.gin4j.bindings.a2a.GinA2avStagedArgs;
import dev.gin4j.internal.comm.Groups;
import dev.gin4j.internal.gpu.Checks;
import dev.gin4j.comm.CommException;
import dev.gin4j.comm.CommGroup;
import dev.gin4j.comm.Communicator;
import dev.gin4j.comm.ErrorCheck;
import dev.gin4j.internal.comm.KernelErrors;
import dev.gin4j.gpu.DeviceBuffer;
import dev.gin4j.gpu.KernelArgs;
import dev.gin4j.gpu.LaunchConfig;
import dev.gin4j.gpu.NativeResource;
import dev.gin4j.gpu.Stream;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.List;

/**
 * All-to-all-v with counts on the device: each rank sends {@code sendCounts[p]} bytes from
 * {@code sendOffsets[p]} of its input to rank p (two device arrays of {@code worldSize} uint64).
 * The receiver gets the bytes from rank s in slot s of {@link #output(int)} (at
 * {@code s * capacityPerPeer}) and the byte count in {@link #receivedCounts(int)} (uint64 per source).
 * <p>GIN: counts never visit the host, so a call can run inside a captured graph. A count above
 * the capacity is clamped and reported by {@link #checkErrors}. HOST: the counts are copied to
 * the host, exchanged with an all-to-all, and the data moves with grouped ncclSend/ncclRecv, as
 * PyTorch's all_to_all_single does. Both backends treat a count or offset that does not fit the
 * same way: a count above the capacity, or a range past the end of the input, is clamped (an offset
 * past the end sends nothing), the exchange goes on with the clamped counts on every rank, and
 * {@link #checkErrors} reports it. (Refusing on the one rank that saw it would leave the others
 * waiting in the exchange.)
 * <p>Caller-owned outputs: {@link #run(DeviceBuffer, DeviceBuffer, DeviceBuffer, DeviceBuffer, Stream)}
 * and its list form write the received bytes into the caller's buffer instead, in the layout of
 * {@link #output(int)} (slot s at {@code s * capacityPerPeer}, its first
 * {@code receivedCounts[s]} bytes valid), where they stay until the caller reuses it: the
 * instance never writes it again. The counts still go to {@link #receivedCounts(int)}, valid
 * until the next call. The output must hold {@code worldSize * capacityPerPeer} bytes, be on the
 * rank's device and share no byte with the input, the send counts and offsets, or this object's
 * own memory (the window, or HOST's receive and count buffers); any alignment. HOST: NCCL
 * receives straight into it, no copy. GIN: only a registered window is reachable by the peers'
 * kernels, so the data still lands in this object's window, and since the counts are on the
 * device only, the call adds one local device-to-device copy of the whole receive area,
 * {@code worldSize * capacityPerPeer} bytes whatever was received, from there into the output,
 * queued on the call's stream after the exchange (captured with it in a graph); the
 * instance-owned output stays zero-copy. The next call may reuse the window once that copy has
 * run: a next call on the same stream is ordered after it; one on another stream must wait for
 * this call (an event recorded after it on its stream), as any two calls on one rank must.
 */
public final class AllToAllV extends NativeResource {
    private final CommGroup group;
    private final Backend backend;
    private final long capacityPerPeer;
    private final GinState gin;
    private final Arena arena = Arena.ofShared();
    private final List<DeviceBuffer> hostOutputs = new ArrayList<>(), hostCounts = new ArrayList<>(), hostSendCounts = new ArrayList<>();
    private final List<KernelErrors> hostWords = new ArrayList<>();
    private final String[] hostClamped;  // HOST: what the last calls clamped, per local rank, until checkErrors reports it
    private Protocol protocol = Protocol.AUTO;

    private AllToAllV(CommGroup group, Backend backend, long capacityPerPeer) {
        this.group = group;
        this.backend = backend;
        this.capacityPerPeer = capacityPerPeer;
        this.hostClamped = new String[group.localCount()];
        try {
            this.gin = backend == Backend.GIN ? new GinState(group, capacityPerPeer) : null;
            if (backend == Backend.HOST) {  // failing together: else the others would wait in the first exchange
                Groups.failTogether(group, "allocating the all-to-all-v's buffers", () -> {
                    for (Communicator c : group.ranks()) {
                        hostOutputs.add(c.device().allocate(AllToAll.outputBytes(capacityPerPeer, group.worldSize()), arena));
                        hostCounts.add(c.device().allocate(8L * group.worldSize(), arena));
                        hostSendCounts.add(c.device().allocate(8L * group.worldSize(), arena));
                    }
                });
            }
        } catch (RuntimeException e) {
            close();
            throw e;
        }
    }

    /**
     * Collective: every rank must create it with the same capacity and backend.
     *
     * @param group the ranks that exchange
     * @param capacityPerPeer the receive slot size per source rank in bytes, at least 1
     * @param backend who moves the data
     * @return the all-to-all-v; close it when done
     * @throws IllegalArgumentException when the arguments are wrong on any rank, or differ between ranks (every rank throws)
     */
    public static AllToAllV create(CommGroup group, long capacityPerPeer, Backend backend) {
        AllToAll.checkCreate(group, capacityPerPeer, backend, "capacityPerPeer", "all-to-all-v");
        return new AllToAllV(group, backend, capacityPerPeer);
    }

    /** {@return the backend this all-to-all-v was created with} */
    public Backend backend() { return backend; }

    /** {@return the launch shape of a GIN call on local rank 0, sized by the capacity (the counts are on the device); null for HOST} */
    public Plan plan() { return gin == null ? null : gin.plan(capacityPerPeer, protocol, 0, false); }
    /** {@return the receive slot size per source rank, in bytes: counts above it are clamped} */
    public long capacityPerPeer() { return capacityPerPeer; }

    /**
     * As {@link AllToAll#protocol}: every rank must use the same protocol in a call.
     *
     * @param p the protocol, or {@link Protocol#AUTO}
     * @return this all-to-all-v
     */
    public AllToAllV protocol(Protocol p) {
        if (p == null) throw new IllegalArgumentException("protocol must not be null (Protocol.AUTO picks by size)");
        this.protocol = p;
        return this;
    }

    /**
     * Receive slots of local rank {@code i}: slot s at {@code s * capacityPerPeer}. After a call into
     * a caller-owned output they hold no result to rely on (GIN passed that call's data through
     * them, HOST left them as they were).
     *
     * @param localIndex the local rank, in [0, localCount)
     * @return its receive slots, {@code worldSize * capacityPerPeer} bytes
     */
    public DeviceBuffer output(int localIndex) {
        Groups.checkLocalIndex(group, localIndex);
        ensureOpen();
        return backend == Backend.GIN ? gin.window.region(localIndex, "recv") : hostOutputs.get(localIndex);
    }

    /**
     * uint64 bytes received from each source, on the device: those of the last call, with or
     * without a caller-owned output, valid until the next call.
     *
     * @param localIndex the local rank, in [0, localCount)
     * @return its {@code worldSize} received counts
     */
    public DeviceBuffer receivedCounts(int localIndex) {
        Groups.checkLocalIndex(group, localIndex);
        ensureOpen();
        return backend == Backend.GIN ? gin.window.region(localIndex, "counts") : hostCounts.get(localIndex);
    }

    /**
     * One process per GPU (a group with one local rank): {@link #output(int)} of its rank.
     * @return the receive slots
     * @throws IllegalStateException when this process drives several local ranks
     */
    public DeviceBuffer output() {
        requireOneLocalRank("output()");
        return output(0);
    }

    /**
     * One process per GPU (a group with one local rank): {@link #receivedCounts(int)} of its rank.
     * @return the received counts
     * @throws IllegalStateException when this process drives several local ranks
     */
    public DeviceBuffer receivedCounts() {
        requireOneLocalRank("receivedCounts()");
        return receivedCounts(0);
    }

    /**
     * One process per GPU (a group with one local rank): {@link #run(List, List, List, List)} of its
     * input, send counts and offsets on its stream.
     * @param input the input
     * @param sendCounts {@code worldSize} uint64 byte counts, one per destination rank
     * @param sendOffsets {@code worldSize} uint64 byte offsets into the input, one per destination rank
     * @param stream the stream the call is queued on
     * @throws IllegalStateException when this process drives several local ranks
     */
    public void run(DeviceBuffer input, DeviceBuffer sendCounts, DeviceBuffer sendOffsets, Stream stream) {
        requireOneLocalRank("run(input, sendCounts, sendOffsets, stream)");
        run(List.of(input), List.of(sendCounts), List.of(sendOffsets), List.of(stream));
    }

    /**
     * One process per GPU (a group with one local rank): {@link #run(List, List, List, List, List)}
     * of its input into its output, with its send counts and offsets on its stream.
     * @param input the input
     * @param output the output, {@code worldSize * capacityPerPeer} bytes at least: slot s at {@code s * capacityPerPeer}
     * @param sendCounts {@code worldSize} uint64 byte counts, one per destination rank
     * @param sendOffsets {@code worldSize} uint64 byte offsets into the input, one per destination rank
     * @param stream the stream the call is queued on
     * @throws IllegalStateException when this process drives several local ranks
     * @throws IllegalArgumentException for an output that is null, too small, on another device, or
     *         overlaps the input, the counts, the offsets or this object's memory (and as the form without an output)
     */
    public void run(DeviceBuffer input, DeviceBuffer output, DeviceBuffer sendCounts, DeviceBuffer sendOffsets, Stream stream) {
        requireOneLocalRank("run(input, output, sendCounts, sendOffsets, stream)");
        run(List.of(input), java.util.Collections.singletonList(output), List.of(sendCounts), List.of(sendOffsets), List.of(stream));
    }

    /** Refuses a call without a local rank index where the process drives several local ranks. */
    private void requireOneLocalRank(String call) {
        ensureOpen();
        Groups.requireOneLocalRank(group, call);
    }

    /**
     * Exchanges, on every local rank, {@code sendCounts[p]} bytes from {@code sendOffsets[p]} of
     * the input to rank p (uint64 counts and offsets on the device, one per rank); what rank s
     * sent lands in receive slot s of {@link #output(int)}, its size in
     * {@link #receivedCounts(int)}. One input, count array, offset array and stream per local
     * rank, in local rank order. A count or range that does not fit is clamped and reported by
     * {@link #checkErrors} (see the class comment).
     *
     * @param inputs one input per local rank, in local rank order
     * @param sendCounts per local rank: {@code worldSize} uint64 byte counts, 8-byte aligned
     * @param sendOffsets per local rank: {@code worldSize} uint64 byte offsets into its input, 8-byte aligned
     * @param streams one stream per local rank, in local rank order
     * @throws IllegalArgumentException when the lists, sizes, alignment or devices do not fit, or a buffer overlaps what the call writes
     * @throws IllegalStateException for HOST when a stream captures a graph
     */
    public void run(List<DeviceBuffer> inputs, List<DeviceBuffer> sendCounts, List<DeviceBuffer> sendOffsets, List<Stream> streams) {
        exchange(inputs, false, null, sendCounts, sendOffsets, streams);
    }

    /**
     * As {@link #run(List, List, List, List)}, into the caller's outputs: what rank s sent lands in
     * slot s of the rank's output (at {@code s * capacityPerPeer}), its size in
     * {@link #receivedCounts(int)}; the output keeps it until the caller reuses it. HOST writes the
     * outputs directly; GIN adds one device-to-device copy of {@code worldSize * capacityPerPeer}
     * bytes per rank on its stream (see the class comment).
     *
     * @param inputs one input per local rank, in local rank order
     * @param outputs one output per local rank, in local rank order: {@code worldSize * capacityPerPeer}
     *        bytes at least, on the rank's device, any alignment, sharing no byte with the inputs,
     *        counts, offsets, each other or this object's memory
     * @param sendCounts per local rank: {@code worldSize} uint64 byte counts, 8-byte aligned
     * @param sendOffsets per local rank: {@code worldSize} uint64 byte offsets into its input, 8-byte aligned
     * @param streams one stream per local rank, in local rank order
     * @throws IllegalArgumentException when the lists, sizes, alignment or devices do not fit, or a
     *         buffer overlaps what it must not (each message names which)
     * @throws IllegalStateException for HOST when a stream captures a graph
     */
    public void run(List<DeviceBuffer> inputs, List<DeviceBuffer> outputs, List<DeviceBuffer> sendCounts, List<DeviceBuffer> sendOffsets, List<Stream> streams) {
        exchange(inputs, true, outputs, sendCounts, sendOffsets, streams);
    }

    /** Both forms of run: into this object's receive area, or ({@code callerOwned}) into the caller's {@code outputs}. */
    private void exchange(List<DeviceBuffer> inputs, boolean callerOwned, List<DeviceBuffer> outputs, List<DeviceBuffer> sendCounts, List<DeviceBuffer> sendOffsets,
                          List<Stream> streams) {
        ensureOpen();
        group.ensureOpen();  // GIN kernels store through the peer mappings that went with its communicators
        int local = group.localCount(), n = group.worldSize();
        if (inputs.size() != local || sendCounts.size() != local || sendOffsets.size() != local || streams.size() != local)
            throw new IllegalArgumentException("one input, count array, offset array and stream per local rank expected (" + local + "), got "
                    + inputs.size() + ", " + sendCounts.size() + ", " + sendOffsets.size() + ", " + streams.size());
        Groups.checkStreams(group, streams);
        if (callerOwned) CallerOutputs.requireOnePerLocalRank(outputs, local);
        for (int i = 0; i < local; i++) {
            Communicator c = group.rank(i);
            for (DeviceBuffer b : List.of(inputs.get(i), sendCounts.get(i), sendOffsets.get(i)))
                if (b.device() != c.device()) throw new IllegalArgumentException("a buffer of " + c + " is on " + b.device());
            if (sendCounts.get(i).byteSize() < 8L * n || sendOffsets.get(i).byteSize() < 8L * n)
                throw new IllegalArgumentException("send counts and offsets of " + c + " must hold " + n + " uint64 values (" + 8 * n + " bytes)");
            long countsAt = sendCounts.get(i).address(), offsetsAt = sendOffsets.get(i).address();
            if (countsAt % 8 != 0 || offsetsAt % 8 != 0)  // the kernels load them as uint64
                throw new IllegalArgumentException("send counts and offsets of " + c + " must be 8-byte aligned (uint64), got addresses 0x" + Long.toHexString(countsAt) + " and 0x" + Long.toHexString(offsetsAt));
            refuseOverlapWithWritten(i, c, inputs.get(i), "input");
            refuseOverlapWithWritten(i, c, sendCounts.get(i), "send counts");
            refuseOverlapWithWritten(i, c, sendOffsets.get(i), "send offsets");
            if (callerOwned) checkOutput(i, c, inputs.get(i), outputs.get(i), sendCounts.get(i), sendOffsets.get(i));
        }
        if (callerOwned) CallerOutputs.requireDisjoint(outputs, group.ranks());
        if (backend == Backend.HOST) {
            Checks.refuseCapture(streams, "a HOST all-to-all-v, which reads the counts on the host (use Backend.GIN for graphs),");
            runHost(inputs, callerOwned ? outputs : hostOutputs, sendCounts, sendOffsets, streams);
            return;
        }
        // counts are on the device: size the launch by capacity so every rank launches the same grid
        for (int i = 0; i < local; i++) {
            launch(i, inputs.get(i), sendCounts.get(i), sendOffsets.get(i), streams.get(i));
            if (callerOwned) {
                // the counts are on the device only: the whole receive area, whatever was received (class comment)
                long bytes = capacityPerPeer * n;
                outputs.get(i).slice(0, bytes).copyFrom(gin.window.region(i, "recv").slice(0, bytes), streams.get(i));
            }
        }
    }

    /** A caller-owned output of local rank {@code i}: given, large enough, on its device, apart from what the call reads and this object's memory. */
    private void checkOutput(int i, Communicator c, DeviceBuffer in, DeviceBuffer out, DeviceBuffer counts, DeviceBuffer offsets) {
        int n = group.worldSize();
        DeviceBuffer[] owned = backend == Backend.GIN ? new DeviceBuffer[] {gin.window.buffer(i)} : new DeviceBuffer[] {hostOutputs.get(i), hostCounts.get(i)};
        CallerOutputs.check(c, c.device(), out, capacityPerPeer * n, n + " slots of capacityPerPeer = " + capacityPerPeer + " bytes",
                new DeviceBuffer[] {in, counts, offsets}, new String[] {"input", "send counts", "send offsets"}, owned,
                backend == Backend.GIN ? "this all-to-all-v's window (receive area, counts, staging, signals)" : "this all-to-all-v's receive area or received counts");
    }

    /** GIN: queues local rank {@code i}'s kernel, sized by the capacity. */
    private void launch(int i, DeviceBuffer in, DeviceBuffer sendCounts, DeviceBuffer sendOffsets, Stream s) {
        int n = group.worldSize();
        Plan plan = gin.plan(capacityPerPeer, protocol, i, false);
        GinState.Rank r = gin.ranks.get(i);
        s.noteUse(this);  // a graph captured from it replays into this instance's window, over the group's peer mappings
        s.noteUse(group);
        if (gin.hybrid) {
            // peers on other nodes: LSA stores inside the node, GIN puts with signals across (nccl_gin_a2a.cu)
            MemorySegment h = r.hybridVArgs.struct();
            r.hybridVArgs.setPointerField(GinA2avHybridArgs.send$offset(), in).setPointerField(GinA2avHybridArgs.sendCounts$offset(), sendCounts)
                    .setPointerField(GinA2avHybridArgs.sendOffsets$offset(), sendOffsets);
            GinA2avHybridArgs.sendBytes(h, in.byteSize());
            GinA2avHybridArgs.slotBytes(h, capacityPerPeer);
            GinA2avHybridArgs.chunksPerPeer(h, plan.chunksPerPeer());
            r.hybridVKernel.launch(s, LaunchConfig.of(n * plan.chunksPerPeer(), plan.threads()), r.hybridVArgs);
            return;
        }
        // the direct, LL and LL128 kernels wait for prior grids first: they may start while the previous kernel drains
        LaunchConfig cfg = LaunchConfig.of(n * plan.chunksPerPeer(), plan.threads()).asProgrammaticDependent();
        if (plan.protocol() == Protocol.LL || plan.protocol() == Protocol.LL128) {
            // the rest of the struct (staging, counters, peers) was set when the instance was made (GinState.Rank.setFixedArgs)
            KernelArgs a = plan.protocol() == Protocol.LL ? r.llVArgs : r.ll128VArgs;
            MemorySegment st = a.struct();
            a.setPointerField(GinA2avStagedArgs.send$offset(), in).setPointerField(GinA2avStagedArgs.sendCounts$offset(), sendCounts)
                    .setPointerField(GinA2avStagedArgs.sendOffsets$offset(), sendOffsets);
            GinA2avStagedArgs.sendBytes(st, in.byteSize());
            GinA2avStagedArgs.slotBytes(st, capacityPerPeer);
            GinA2avStagedArgs.chunksPerPeer(st, plan.chunksPerPeer());
            (plan.protocol() == Protocol.LL ? r.llV : r.ll128V).launch(s, cfg, a);
        } else {
            KernelArgs a = r.directVArgs;
            MemorySegment st = a.struct();
            a.setPointerField(GinA2avArgs.send$offset(), in).setPointerField(GinA2avArgs.sendCounts$offset(), sendCounts)
                    .setPointerField(GinA2avArgs.sendOffsets$offset(), sendOffsets);
            GinA2avArgs.sendBytes(st, in.byteSize());
            GinA2avArgs.slotBytes(st, capacityPerPeer);
            GinA2avArgs.chunksPerPeer(st, plan.chunksPerPeer());
            r.directV.launch(s, cfg, a);
        }
    }

    /** What a call writes on local rank {@code i}: GIN, the whole window (receive slots, counts, staging, signals); HOST, the output and count buffers. */
    private void refuseOverlapWithWritten(int i, Communicator c, DeviceBuffer b, String what) {
        String written = "this all-to-all-v's receive area or received counts";
        if (backend == Backend.GIN) {
            Checks.requireDisjoint(c, what, b, gin.window.buffer(i), written);
        } else {
            Checks.requireDisjoint(c, what, b, hostOutputs.get(i), written);
            Checks.requireDisjoint(c, what, b, hostCounts.get(i), written);
        }
    }

    /** HOST: counts to the host, the count exchange, then grouped ncclSend/ncclRecv straight into {@code recv} (slot s at {@code s * capacityPerPeer}). */
    private void runHost(List<DeviceBuffer> inputs, List<DeviceBuffer> recv, List<DeviceBuffer> sendCounts, List<DeviceBuffer> sendOffsets, List<Stream> streams) {
        int local = group.localCount(), n = group.worldSize();
        long[][] sc = new long[local][], so = new long[local][], rc = new long[local][], ro = new long[local][n];
        List<DeviceBuffer> countSend = new ArrayList<>();
        for (int i = 0; i < local; i++) {
            Groups.await(group, streams.get(i), "a HOST all-to-all-v (reading the send counts)");
            sc[i] = sendCounts.get(i).readLongs(n, streams.get(i));
            so[i] = sendOffsets.get(i).readLongs(n, streams.get(i));
            List<String> clamped = new ArrayList<>();
            for (int p = 0; p < n; p++) {
                String wrong = clamp(sc[i], so[i], p, inputs.get(i).byteSize(), capacityPerPeer);
                if (wrong != null) clamped.add("to rank " + p + ": " + wrong);
                ro[i][p] = p * capacityPerPeer;
            }
            // the first call that clamped is kept until checkErrors (the kernels' error word is sticky too)
            if (!clamped.isEmpty() && hostClamped[i] == null) hostClamped[i] = group.rank(i) + " clamped what it sent " + String.join("; ", clamped);
            hostSendCounts.get(i).copyFromHost(MemorySegment.ofArray(sc[i]), streams.get(i));  // what is sent, clamped
            countSend.add(hostSendCounts.get(i));
        }
        group.allToAll(countSend, hostCounts, 8, streams);   // who sends me how much
        for (int i = 0; i < local; i++) {
            Groups.await(group, streams.get(i), "a HOST all-to-all-v (the count exchange)");
            rc[i] = hostCounts.get(i).readLongs(n, streams.get(i));
        }
        group.allToAllV(inputs, sc, so, recv, rc, ro, streams);
    }

    /**
     * The GIN kernel's rule (a2a.cu, resolve_count), with counts and offsets as the kernel reads them
     * (unsigned 64-bit): an offset past the end sends nothing, a range past the end is cut there, a
     * count above the capacity is cut to it. Clamps counts[p] / offsets[p] in place; returns what was
     * wrong, or null.
     */
    static String clamp(long[] counts, long[] offsets, int p, long sendBytes, long capacity) {
        long count = counts[p], offset = offsets[p];
        String wrong = null;
        if (Long.compareUnsigned(offset, sendBytes) > 0) {
            wrong = "offset " + Long.toUnsignedString(offset) + " is past the input's " + sendBytes + " bytes; nothing was sent";
            offset = 0;
            count = 0;
        } else if (Long.compareUnsigned(count, sendBytes - offset) > 0) {
            wrong = "the range [" + offset + ", " + offset + " + " + Long.toUnsignedString(count) + ") goes past the input's " + sendBytes + " bytes; clamped to " + (sendBytes - offset);
            count = sendBytes - offset;
        }
        if (Long.compareUnsigned(count, capacity) > 0) {
            wrong = (wrong == null ? "" : wrong + "; ") + Long.toUnsignedString(count) + " bytes are above the capacity of " + capacity + " bytes per peer; clamped to it";
            count = capacity;
        }
        counts[p] = count;
        offsets[p] = offset;
        return wrong;
    }

    /**
     * Synchronizes the streams (one per local rank, in order) and throws if a call clamped a count
     * or range (both backends) or a kernel reported an error (time-out, bad arguments); a time-out
     * also aborts the group.
     * @param streams the streams the calls were queued on, one per local rank, in order
     * @throws CommException naming what each rank reported
     */
    public void checkErrors(List<Stream> streams) {
        ensureOpen();
        Groups.checkStreams(group, streams);
        if (backend != Backend.GIN) {
            Groups.await(group, streams, "a HOST all-to-all-v");
            CommException first = null;
            for (int i = 0; i < hostClamped.length; i++) {
                if (hostClamped[i] == null) continue;
                CommException e = new CommException("HOST all-to-all-v: " + hostClamped[i]);
                hostClamped[i] = null;  // reported once, as the kernels' error word is cleared
                if (first == null) first = e;
                else first.addSuppressed(e);
            }
            if (first != null) throw first;
            return;
        }
        KernelErrors.checkAll("GIN all-to-all-v", gin.errorWords(), streams, group);
    }

    /**
     * One process per GPU (a group with one local rank): {@link #checkErrors(List)} of its stream.
     * @param stream the stream the calls were queued on
     * @throws IllegalStateException when this process drives several local ranks
     */
    public void checkErrors(Stream stream) {
        requireOneLocalRank("checkErrors(stream)");
        checkErrors(List.of(stream));
    }

    /**
     * The check of {@link #checkErrors(List)}, reported later without waiting now (see
     * {@link ErrorCheck}): queued on each stream (one per local rank, in order) after the calls
     * already there. HOST: what the calls so far clamped (found on the host) goes into this check
     * and is not reported again.
     * @param streams the streams the calls were queued on, one per local rank, in order
     * @return the check, to poll or await
     * @throws IllegalStateException when a stream captures a graph
     */
    public ErrorCheck errorsAfter(List<Stream> streams) {
        ensureOpen();
        Groups.checkStreams(group, streams);
        if (backend == Backend.GIN)
            return KernelErrors.later("GIN all-to-all-v", this, gin.errorWords(), streams, null, group);
        Checks.refuseCapture(streams, "a later error check of the HOST all-to-all-v, which reads the error words on the host,");  // before the words are made
        List<String> clamped = new ArrayList<>();
        for (String c : hostClamped) clamped.add(c == null ? null : "HOST all-to-all-v: " + c);
        ErrorCheck check = KernelErrors.later("HOST all-to-all-v", this, hostWords(), streams, clamped, group);
        java.util.Arrays.fill(hostClamped, null);  // reported by this check, once
        return check;
    }

    /**
     * One process per GPU (a group with one local rank): {@link #errorsAfter(List)} of its stream.
     * @param stream the stream the calls were queued on
     * @return the check, to poll or await
     * @throws IllegalStateException when this process drives several local ranks
     */
    public ErrorCheck errorsAfter(Stream stream) {
        requireOneLocalRank("errorsAfter(stream)");
        return errorsAfter(List.of(stream));
    }

    /** HOST: error words no kernel sets, made at the first later check, so that its checks work as GIN's. */
    private synchronized List<KernelErrors> hostWords() {
        for (int i = hostWords.size(); i < group.localCount(); i++) {
            try (Stream setup = group.rank(i).device().createStream()) {
                hostWords.add(new KernelErrors(group.rank(i).device(), arena, setup));
                setup.synchronize();
            }
        }
        return hostWords;
    }

    @Override protected void release() {
        releaseAll(() -> { if (gin != null) gin.close(); }, arena::close);
    }

    @Override public String describe() { return "AllToAllV (" + backend + ", capacity " + capacityPerPeer + " bytes per peer)"; }
}
