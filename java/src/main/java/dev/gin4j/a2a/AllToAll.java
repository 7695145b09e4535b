package dev.gin4j.a2a;

import dev.gin4j.comm.DType;
import dev.gin4j.comm.Backend;
import dev.gin4j.bindings.a2a.GinA2aArgs;
import dev.gin4j.bindings.a2a.GinA2aCeSelfArgs;
import dev.gin4j.bindings.a2a.GinA2aHybridArgs;
import dev.gin4j.bindings.a2a.GinA2aStagedArgs;
import dev.gin4j.internal.comm.Groups;
import dev.gin4j.internal.gpu.Checks;
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
 * Uniform all-to-all: every rank sends {@code count} elements to every rank. Rank r's input holds
 * the block for rank p at {@code p * count}; after the call, {@link #output(int)} of rank r holds
 * the block from rank s at {@code s * count}. Stream-ordered and, for {@link Backend#GIN},
 * capturable in a graph (a call only launches kernels). One object serves every rank this
 * process drives; call {@link #run} with one input and one stream per local rank.
 * <p>GIN: the kernels copy straight from the input (anywhere in device memory but this object's
 * window) into the peers' windows; the output is a region of this object's symmetric window, valid
 * until the next call: to send a result on, copy it out first (the call refuses an input that
 * overlaps what it writes). HOST: {@code ncclAlltoAll} into a plain device buffer.
 * <p>Caller-owned outputs: {@link #run(DeviceBuffer, DeviceBuffer, long, Stream)} and its list and
 * {@code runElements} forms write the result into the caller's buffer instead, in the same layout
 * (block from rank s at {@code s * bytesPerPeer}), where it stays until the caller reuses it: the
 * instance never writes it again. The output must hold {@code worldSize * bytesPerPeer} bytes, be
 * on the rank's device and share no byte with the input or with this object's own memory (the
 * window, or HOST's receive buffer); any alignment. HOST: NCCL receives straight into it, no copy.
 * GIN: only a registered window is reachable by the peers' kernels, so the data still lands in
 * this object's window and the call adds one local device-to-device copy of
 * {@code worldSize * bytesPerPeer} bytes from there into the output, queued on the call's stream
 * after the exchange (captured with it in a graph); the instance-owned output stays zero-copy. The
 * next call may reuse the window once that copy has run: a next call on the same stream is ordered
 * after it; one on another stream must wait for this call (an event recorded after it on its
 * stream), as any two calls on one rank must. After a call into a caller-owned output,
 * {@link #result(int)} of that rank throws until a call without an output.
 */
public final class AllToAll extends NativeResource {
    private final CommGroup group;
    private final Backend backend;
    private final long maxBytesPerPeer;
    private final GinState gin;
    private final Arena arena;
    private final List<DeviceBuffer> hostOutputs = new ArrayList<>();
    private final List<KernelErrors> hostWords = new ArrayList<>();
    private Protocol protocol = Protocol.AUTO;
    private final long[] lastBytesPerPeer;
    private final boolean[] lastIntoCallerOutput;  // per local rank: the last call wrote into the caller's output

    private AllToAll(CommGroup group, Backend backend, long maxBytesPerPeer) {
        this.group = group;
        this.backend = backend;
        this.maxBytesPerPeer = maxBytesPerPeer;
        this.lastBytesPerPeer = new long[group.localCount()];
        this.lastIntoCallerOutput = new boolean[group.localCount()];
        this.arena = backend == Backend.HOST ? Arena.ofShared() : null;
        try {
            this.gin = backend == Backend.GIN ? new GinState(group, maxBytesPerPeer) : null;
            if (backend == Backend.HOST) {  // failing together: else the others would wait in the first exchange
                Groups.failTogether(group, "allocating the all-to-all's output", () -> {
                    for (Communicator c : group.ranks()) hostOutputs.add(c.device().allocate(outputBytes(maxBytesPerPeer, group.worldSize()), arena));
                });
            }
        } catch (RuntimeException e) {
            close();
            throw e;
        }
    }

    /**
     * The arguments of create, checked before anything is registered or allocated, and compared
     * across ranks (collective; every rank throws together): a rank with another kind of exchange,
     * backend or size would otherwise wait forever in a window allocation the others never make, or
     * exchange with them in the wrong shape. {@code kind} tells AllToAll from AllToAllV.
     */
    static void checkCreate(CommGroup group, long bytesPerPeer, Backend backend, String what, String kind) {
        if (group == null) throw new IllegalArgumentException("a communicator group must be given");
        group.ensureOpen();
        String wrong = backend == null ? "a backend must be given" : bytesPerPeer < 1 ? what + " must be >= 1, got " + bytesPerPeer : null;
        if (wrong == null) {
            try {
                outputBytes(bytesPerPeer, group.worldSize());
            } catch (IllegalArgumentException e) {
                wrong = e.getMessage();
            }
        }
        long[][] mine = new long[group.localCount()][];  // the kind as its String.hashCode, which the JLS fixes: the same in every JVM
        java.util.Arrays.fill(mine, new long[] {kind.hashCode(), backend == null ? -1 : backend.ordinal(), bytesPerPeer, wrong == null ? 0 : 1});
        long[] all = group.allGatherLongs(mine)[0];
        if (wrong != null) throw new IllegalArgumentException(wrong);
        for (int r = 0; r < group.worldSize(); r++) {
            if (all[4 * r + 3] != 0) throw new IllegalArgumentException("rank " + r + " refused its arguments for this " + kind + " (it reports why), so every rank stops");
            if (all[4 * r] != kind.hashCode())
                throw new IllegalArgumentException("rank " + r + " creates another kind of exchange than this " + kind + "; every rank must create the same one, in the same order");
            if (all[4 * r + 1] != backend.ordinal() || all[4 * r + 2] != bytesPerPeer) {
                Backend theirs = Backend.values()[(int) all[4 * r + 1]];
                throw new IllegalArgumentException("rank " + r + " creates this " + kind + " with backend " + theirs + " and " + what + " = " + all[4 * r + 2] + ", rank "
                        + group.rank(0).rank() + " with " + backend + " and " + bytesPerPeer + "; every rank must create it with the same backend and size");
            }
        }
    }

    /** A receive area of {@code ranks} slots, or an error naming the sizes where it would not fit a long. */
    static long outputBytes(long bytesPerPeer, int ranks) {
        try {
            return Math.multiplyExact(bytesPerPeer, (long) ranks);
        } catch (ArithmeticException e) {
            throw new IllegalArgumentException(bytesPerPeer + " bytes per peer for " + ranks + " ranks do not fit a 64-bit size");
        }
    }

    /**
     * Collective: every rank must create it with the same size and backend.
     *
     * @param group the ranks that exchange
     * @param maxBytesPerPeer the most bytes a call may send to each peer, at least 1 (sizes the receive area)
     * @param backend who moves the data
     * @return the all-to-all; close it when done
     * @throws IllegalArgumentException when the arguments are wrong on any rank, or differ between ranks (every rank throws)
     */
    public static AllToAll create(CommGroup group, long maxBytesPerPeer, Backend backend) {
        checkCreate(group, maxBytesPerPeer, backend, "maxBytesPerPeer", "all-to-all");
        return new AllToAll(group, backend, maxBytesPerPeer);
    }

    /** {@return the backend this all-to-all was created with} */
    public Backend backend() { return backend; }
    /** {@return the most bytes per peer a call may move (the size it was created for)} */
    public long maxBytesPerPeer() { return maxBytesPerPeer; }

    /**
     * Forces the GIN protocol for later calls ({@link Protocol#AUTO} picks by size). A forced LL or
     * LL128 above its staging capacity runs as DIRECT. Protocols may change from call to call: all
     * deliver into the same place. Every rank must use the same protocol in a call (a receiver
     * waits for the data in its protocol's format; a mismatch ends in a kernel time-out).
     *
     * @param p the protocol, or {@link Protocol#AUTO}
     * @return this all-to-all
     */
    public AllToAll protocol(Protocol p) {
        if (p == null) throw new IllegalArgumentException("protocol must not be null (Protocol.AUTO picks by size)");
        this.protocol = p;
        return this;
    }

    /**
     * The launch plan a GIN call of {@code bytesPerPeer} takes on local rank 0 (for reports); {@code null} for HOST.
     *
     * @param bytesPerPeer the call's bytes per peer
     * @return the plan, or null
     */
    public Plan plan(long bytesPerPeer) { return gin == null ? null : gin.plan(bytesPerPeer, protocol, 0, true); }

    /**
     * The whole receive area of local rank {@code i}: after a call of {@code b} bytes per peer, its
     * first {@code n*b} bytes are the result. After a call into a caller-owned output it holds no
     * result to rely on (GIN passed that call's data through it, HOST left it as it was).
     *
     * @param localIndex the local rank, in [0, localCount)
     * @return its receive area
     */
    public DeviceBuffer output(int localIndex) {
        Groups.checkLocalIndex(group, localIndex);
        ensureOpen();
        return backend == Backend.GIN ? gin.window.region(localIndex, "recv") : hostOutputs.get(localIndex);
    }

    /**
     * The result of the last call on local rank {@code i}: {@code worldSize * bytesPerPeer} bytes
     * (none before the first call).
     *
     * @param localIndex the local rank, in [0, localCount)
     * @return the first {@code worldSize * bytesPerPeer} bytes of its receive area
     * @throws IllegalStateException when the last call on that rank wrote into a caller-owned
     *         output (the result is there; the receive area holds none)
     */
    public DeviceBuffer result(int localIndex) {
        DeviceBuffer area = output(localIndex);
        if (lastIntoCallerOutput[localIndex])
            throw new IllegalStateException(group.rank(localIndex) + ": the last call wrote its result into the caller's output (run with an output), so this all-to-all's"
                    + " receive area holds no result; read that output, or call run without an output");
        return area.slice(0, lastBytesPerPeer[localIndex] * group.worldSize());
    }

    /**
     * One process per GPU (a group with one local rank): {@link #output(int)} of its rank.
     * @return the receive area
     * @throws IllegalStateException when this process drives several local ranks
     */
    public DeviceBuffer output() {
        requireOneLocalRank("output()");
        return output(0);
    }

    /**
     * One process per GPU (a group with one local rank): {@link #result(int)} of its rank.
     * @return the last call's result
     * @throws IllegalStateException when this process drives several local ranks, or the last call
     *         wrote into a caller-owned output
     */
    public DeviceBuffer result() {
        requireOneLocalRank("result()");
        return result(0);
    }

    /**
     * Exchanges {@code count} elements of {@code type} per peer on every local rank: {@link #run(List, long, List)}
     * with {@code count * type.bytes()} bytes per peer (the {@code run} methods count bytes, the
     * {@code runElements} methods elements).
     * @param inputs one input per local rank, in local rank order
     * @param count elements per peer
     * @param type the element type
     * @param streams one stream per local rank, in local rank order
     * @throws IllegalArgumentException for a negative count, a null type, or a byte size that does not fit a long
     */
    public void runElements(List<DeviceBuffer> inputs, long count, DType type, List<Stream> streams) {
        run(inputs, elementBytes(count, type), streams);
    }

    /**
     * One process per GPU (a group with one local rank): exchanges {@code count} elements of
     * {@code type} per peer, as {@link #runElements(List, long, DType, List)}.
     * @param input the input, {@code worldSize * count} elements
     * @param count elements per peer
     * @param type the element type
     * @param stream the stream the call is queued on
     * @throws IllegalStateException when this process drives several local ranks
     */
    public void runElements(DeviceBuffer input, long count, DType type, Stream stream) {
        run(input, elementBytes(count, type), stream);
    }

    /**
     * Exchanges {@code count} elements of {@code type} per peer on every local rank into the
     * caller's outputs: {@link #run(List, List, long, List)} with {@code count * type.bytes()} bytes per peer.
     * @param inputs one input per local rank, in local rank order
     * @param outputs one output per local rank, in local rank order, {@code worldSize * count} elements each (see the class comment)
     * @param count elements per peer
     * @param type the element type
     * @param streams one stream per local rank, in local rank order
     * @throws IllegalArgumentException for a negative count, a null type, a byte size that does not
     *         fit a long, or lists, sizes, devices or overlaps that do not fit
     */
    public void runElements(List<DeviceBuffer> inputs, List<DeviceBuffer> outputs, long count, DType type, List<Stream> streams) {
        run(inputs, outputs, elementBytes(count, type), streams);
    }

    /**
     * One process per GPU (a group with one local rank): exchanges {@code count} elements of
     * {@code type} per peer into the caller's output, as {@link #runElements(List, List, long, DType, List)}.
     * @param input the input, {@code worldSize * count} elements
     * @param output the output, {@code worldSize * count} elements at least: the block from rank s at {@code s * count}
     * @param count elements per peer
     * @param type the element type
     * @param stream the stream the call is queued on
     * @throws IllegalStateException when this process drives several local ranks
     * @throws IllegalArgumentException for a negative count, a null type, or an output that is
     *         null, too small, on another device, or overlaps the input or this object's memory
     */
    public void runElements(DeviceBuffer input, DeviceBuffer output, long count, DType type, Stream stream) {
        run(input, output, elementBytes(count, type), stream);
    }

    static long elementBytes(long count, DType type) {
        if (type == null) throw new IllegalArgumentException("runElements needs the element type (DType), got null");
        if (count < 0) throw new IllegalArgumentException("count must be >= 0 elements per peer, got " + count);
        try {
            return Math.multiplyExact(count, (long) type.bytes());
        } catch (ArithmeticException e) {
            throw new IllegalArgumentException(count + " elements of " + type + " per peer do not fit a 64-bit byte size");
        }
    }

    /**
     * One process per GPU (a group with one local rank): exchanges {@code bytesPerPeer} bytes per
     * peer, as {@link #run(List, long, List)}.
     * @param input the input, {@code worldSize * bytesPerPeer} bytes
     * @param bytesPerPeer bytes per peer, in [0, {@link #maxBytesPerPeer()}]
     * @param stream the stream the call is queued on
     * @throws IllegalStateException when this process drives several local ranks
     */
    public void run(DeviceBuffer input, long bytesPerPeer, Stream stream) {
        requireOneLocalRank("run(input, bytesPerPeer, stream)");
        run(0, input, bytesPerPeer, stream);
    }

    /**
     * One process per GPU (a group with one local rank): exchanges {@code bytesPerPeer} bytes per
     * peer into the caller's output, as {@link #run(List, List, long, List)}.
     * @param input the input, {@code worldSize * bytesPerPeer} bytes
     * @param output the output, {@code worldSize * bytesPerPeer} bytes at least: the block from rank s at {@code s * bytesPerPeer}
     * @param bytesPerPeer bytes per peer, in [0, {@link #maxBytesPerPeer()}]
     * @param stream the stream the call is queued on
     * @throws IllegalStateException when this process drives several local ranks
     * @throws IllegalArgumentException for an output that is null, too small, on another device,
     *         or overlaps the input or this object's memory (and as the form without an output)
     */
    public void run(DeviceBuffer input, DeviceBuffer output, long bytesPerPeer, Stream stream) {
        requireOneLocalRank("run(input, output, bytesPerPeer, stream)");
        run(0, input, output, bytesPerPeer, stream);
    }

    /** Refuses a call without a local rank index where the process drives several local ranks. */
    private void requireOneLocalRank(String call) {
        ensureOpen();
        Groups.requireOneLocalRank(group, call);
    }

    /**
     * Exchanges {@code bytesPerPeer} bytes per peer on every local rank; inputs hold
     * {@code worldSize * bytesPerPeer} bytes. One input and one stream per local rank, in local
     * rank order.
     *
     * @param inputs one input per local rank, in local rank order
     * @param bytesPerPeer bytes per peer, in [0, {@link #maxBytesPerPeer()}]
     * @param streams one stream per local rank, in local rank order
     * @throws IllegalArgumentException when the lists, sizes or devices do not fit, or an input overlaps the receive area
     */
    public void run(List<DeviceBuffer> inputs, long bytesPerPeer, List<Stream> streams) {
        ensureOpen();
        group.ensureOpen();  // GIN kernels store through the peer mappings that went with its communicators
        int local = group.localCount();
        if (inputs.size() != local || streams.size() != local)
            throw new IllegalArgumentException("one input and one stream per local rank expected (" + local + "), got " + inputs.size() + " and " + streams.size());
        for (int i = 0; i < local; i++) check(i, inputs.get(i), bytesPerPeer, streams.get(i));
        if (backend == Backend.HOST) {
            group.allToAll(inputs, hostOutputs, bytesPerPeer, streams);
            java.util.Arrays.fill(lastBytesPerPeer, bytesPerPeer);
            java.util.Arrays.fill(lastIntoCallerOutput, false);
            return;
        }
        for (int i = 0; i < local; i++) launch(i, inputs.get(i), bytesPerPeer, streams.get(i));
    }

    /**
     * Exchanges {@code bytesPerPeer} bytes per peer on every local rank into the caller's outputs:
     * afterwards rank r's output holds the block from rank s at {@code s * bytesPerPeer}, and keeps
     * it until the caller reuses it. One input, output and stream per local rank, in local rank
     * order. HOST writes the outputs directly; GIN adds one device-to-device copy of
     * {@code worldSize * bytesPerPeer} bytes per rank on its stream (see the class comment).
     *
     * @param inputs one input per local rank, in local rank order
     * @param outputs one output per local rank, in local rank order: {@code worldSize * bytesPerPeer}
     *        bytes at least, on the rank's device, any alignment, sharing no byte with the inputs,
     *        each other or this object's memory
     * @param bytesPerPeer bytes per peer, in [0, {@link #maxBytesPerPeer()}]
     * @param streams one stream per local rank, in local rank order
     * @throws IllegalArgumentException when the lists, sizes or devices do not fit, or an input or
     *         output overlaps what it must not (each message names which)
     */
    public void run(List<DeviceBuffer> inputs, List<DeviceBuffer> outputs, long bytesPerPeer, List<Stream> streams) {
        ensureOpen();
        group.ensureOpen();
        int local = group.localCount();
        if (inputs.size() != local || streams.size() != local)
            throw new IllegalArgumentException("one input and one stream per local rank expected (" + local + "), got " + inputs.size() + " and " + streams.size());
        CallerOutputs.requireOnePerLocalRank(outputs, local);
        for (int i = 0; i < local; i++) {
            check(i, inputs.get(i), bytesPerPeer, streams.get(i));
            checkOutput(i, inputs.get(i), outputs.get(i), bytesPerPeer);
        }
        CallerOutputs.requireDisjoint(outputs, group.ranks());
        if (backend == Backend.HOST) {
            group.allToAll(inputs, outputs, bytesPerPeer, streams);
            java.util.Arrays.fill(lastBytesPerPeer, bytesPerPeer);
            java.util.Arrays.fill(lastIntoCallerOutput, true);
            return;
        }
        for (int i = 0; i < local; i++) {
            launch(i, inputs.get(i), bytesPerPeer, streams.get(i));
            copyOut(i, outputs.get(i), bytesPerPeer, streams.get(i));
        }
    }

    /**
     * Queues local rank {@code i}'s part only: what a graph capture of one rank's stream needs, or
     * one thread per GPU. GIN only when this process drives several ranks (NCCL calls of several
     * local ranks must be grouped: use the list form).
     *
     * @param localIndex the local rank, in [0, localCount)
     * @param input its input, {@code worldSize * bytesPerPeer} bytes
     * @param bytesPerPeer bytes per peer, in [0, {@link #maxBytesPerPeer()}]
     * @param stream its stream
     * @throws IllegalStateException for HOST when this process drives several local ranks
     */
    public void run(int localIndex, DeviceBuffer input, long bytesPerPeer, Stream stream) {
        ensureOpen();
        group.ensureOpen();
        check(localIndex, input, bytesPerPeer, stream);
        if (backend == Backend.HOST) {
            if (group.localCount() > 1) throw new IllegalStateException("HOST all-to-all with " + group.localCount() + " local ranks must be issued for all of them together: use run(List, long, List)");
            group.allToAll(List.of(input), hostOutputs, bytesPerPeer, List.of(stream));
            lastBytesPerPeer[localIndex] = bytesPerPeer;
            lastIntoCallerOutput[localIndex] = false;
            return;
        }
        launch(localIndex, input, bytesPerPeer, stream);
    }

    /**
     * Queues local rank {@code i}'s part only, into the caller's output (as {@link #run(List, List, long, List)}):
     * what a graph capture of one rank's stream needs, or one thread per GPU. GIN only when this
     * process drives several ranks.
     *
     * @param localIndex the local rank, in [0, localCount)
     * @param input its input, {@code worldSize * bytesPerPeer} bytes
     * @param output its output, {@code worldSize * bytesPerPeer} bytes at least (see the class comment)
     * @param bytesPerPeer bytes per peer, in [0, {@link #maxBytesPerPeer()}]
     * @param stream its stream
     * @throws IllegalStateException for HOST when this process drives several local ranks
     * @throws IllegalArgumentException for an output that is null, too small, on another device,
     *         or overlaps the input or this object's memory (and as the form without an output)
     */
    public void run(int localIndex, DeviceBuffer input, DeviceBuffer output, long bytesPerPeer, Stream stream) {
        ensureOpen();
        group.ensureOpen();
        check(localIndex, input, bytesPerPeer, stream);
        checkOutput(localIndex, input, output, bytesPerPeer);
        if (backend == Backend.HOST) {
            if (group.localCount() > 1) throw new IllegalStateException("HOST all-to-all with " + group.localCount() + " local ranks must be issued for all of them together: use run(List, List, long, List)");
            group.allToAll(List.of(input), List.of(output), bytesPerPeer, List.of(stream));
            lastBytesPerPeer[localIndex] = bytesPerPeer;
            lastIntoCallerOutput[localIndex] = true;
            return;
        }
        launch(localIndex, input, bytesPerPeer, stream);
        copyOut(localIndex, output, bytesPerPeer, stream);
    }

    /** A caller-owned output of local rank {@code i}: given, large enough, on its device, apart from the input and this object's memory. */
    private void checkOutput(int i, DeviceBuffer in, DeviceBuffer out, long bytesPerPeer) {
        int n = group.worldSize();
        Communicator c = group.rank(i);
        DeviceBuffer owned = backend == Backend.GIN ? gin.window.buffer(i) : hostOutputs.get(i);
        CallerOutputs.check(c, c.device(), out, bytesPerPeer * n, n + " ranks x " + bytesPerPeer + " bytes per peer", new DeviceBuffer[] {in}, new String[] {"input"},
                new DeviceBuffer[] {owned}, backend == Backend.GIN ? "this all-to-all's window (receive area, staging, signals)" : "this all-to-all's own receive area");
    }

    /**
     * GIN into a caller-owned output: the received blocks, from the window's receive area into the
     * output, on the call's stream after its kernels (the next call's kernels on this stream start
     * after it, so the window is reused only once it has been read).
     */
    private void copyOut(int i, DeviceBuffer out, long bytesPerPeer, Stream s) {
        long bytes = bytesPerPeer * group.worldSize();
        out.slice(0, bytes).copyFrom(gin.window.region(i, "recv").slice(0, bytes), s);
        lastIntoCallerOutput[i] = true;
    }

    private void check(int i, DeviceBuffer in, long bytesPerPeer, Stream stream) {
        int n = group.worldSize();
        if (i < 0 || i >= group.localCount()) throw new IndexOutOfBoundsException("local rank " + i + " does not exist: this process drives " + group.localCount());
        if (bytesPerPeer < 0 || bytesPerPeer > maxBytesPerPeer)
            throw new IllegalArgumentException(bytesPerPeer + " bytes per peer is outside [0, " + maxBytesPerPeer + "], the size this all-to-all was created for");
        Communicator c = group.rank(i);
        if (in.device() != c.device()) throw new IllegalArgumentException("input of " + c + " is on " + in.device());
        if (stream.device() != c.device()) throw new IllegalArgumentException("stream of " + c + " is on " + stream.device());
        if (in.byteSize() < bytesPerPeer * n)
            throw new IllegalArgumentException("input of " + c + " has " + in.byteSize() + " bytes; " + n + " ranks x " + bytesPerPeer + " bytes = " + bytesPerPeer * n + " needed");
        // GIN writes the whole window (receive slots, staging, signals); HOST its output buffer
        Checks.requireDisjoint(c, "input", in, backend == Backend.GIN ? gin.window.buffer(i) : hostOutputs.get(i), "this all-to-all's receive area");
    }

    private void launch(int i, DeviceBuffer in, long bytesPerPeer, Stream s) {
        Plan plan = gin.plan(bytesPerPeer, protocol, i, true);
        GinState.Rank r = gin.ranks.get(i);
        lastBytesPerPeer[i] = bytesPerPeer;
        lastIntoCallerOutput[i] = false;  // copyOut sets it where the call goes on into a caller's output
        int n = gin.nranks;
        s.noteUse(this);  // a graph captured from it replays into this instance's window, over the group's peer mappings
        s.noteUse(group);  // the input is noted with each launch's arguments (KernelArgs.setPointer)
        if (gin.hybrid) {
            // peers on other nodes: LSA stores inside the node, GIN puts with signals across (nccl_gin_a2a.cu)
            MemorySegment h = r.hybridArgs.struct();
            r.hybridArgs.setPointerField(GinA2aHybridArgs.send$offset(), in);
            GinA2aHybridArgs.bytesPerPeer(h, bytesPerPeer);
            GinA2aHybridArgs.slotBytes(h, bytesPerPeer);
            GinA2aHybridArgs.chunksPerPeer(h, plan.chunksPerPeer());
            r.hybridKernel.launch(s, LaunchConfig.of(n * plan.chunksPerPeer(), plan.threads()), r.hybridArgs);
            return;
        }
        // the direct, LL and LL128 kernels wait for prior grids first: they may start while the previous kernel drains
        LaunchConfig cfg = LaunchConfig.of(n * plan.chunksPerPeer(), plan.threads()).asProgrammaticDependent();
        if (plan.protocol() == Protocol.LL || plan.protocol() == Protocol.LL128) {
            // the rest of the struct (staging, counters, peers) was set when the instance was made (GinState.Rank.setFixedArgs)
            KernelArgs a = plan.protocol() == Protocol.LL ? r.llArgs : r.ll128Args;
            MemorySegment st = a.struct();
            a.setPointerField(GinA2aStagedArgs.send$offset(), in);
            GinA2aStagedArgs.bytesPerPeer(st, bytesPerPeer);
            GinA2aStagedArgs.slotBytes(st, bytesPerPeer);
            GinA2aStagedArgs.chunksPerPeer(st, plan.chunksPerPeer());
            (plan.protocol() == Protocol.LL ? r.ll : r.ll128).launch(s, cfg, a);
        } else if (plan.protocol() == Protocol.COPY_ENGINE) {
            launchCopyEngine(r, plan, in, bytesPerPeer, s);
        } else {
            KernelArgs a = r.directArgs;
            MemorySegment st = a.struct();
            a.setPointerField(GinA2aArgs.send$offset(), in);
            GinA2aArgs.bytesPerPeer(st, bytesPerPeer);
            GinA2aArgs.slotBytes(st, bytesPerPeer);
            GinA2aArgs.chunksPerPeer(st, plan.chunksPerPeer());
            r.direct.launch(s, cfg, a);
        }
    }

    /**
     * The copy-engine variant (docs/kernels.md, a2a.cu): the self slot by a kernel on the rank's second
     * stream, forked from {@code s}; on {@code s} the ready handshake, one copy-engine copy per peer
     * into its receive slot for this rank, then (joined) the done kernel.
     */
    private void launchCopyEngine(GinState.Rank r, Plan plan, DeviceBuffer in, long bytesPerPeer, Stream s) {
        int n = gin.nranks, me = r.comm.rank();
        r.ceFork.record(s);
        r.ceSide.waitFor(r.ceFork);
        // peers, offsets, counters and rank were set when the instance was made (GinState.Rank.setFixedArgs)
        MemorySegment self = r.ceSelfArgs.struct();
        r.ceSelfArgs.setPointerField(GinA2aCeSelfArgs.send$offset(), in);
        GinA2aCeSelfArgs.bytesPerPeer(self, bytesPerPeer);
        GinA2aCeSelfArgs.slotBytes(self, bytesPerPeer);
        r.ceSelf.launch(r.ceSide, LaunchConfig.of(plan.chunksPerPeer(), plan.threads()), r.ceSelfArgs);
        LaunchConfig onePerPeer = LaunchConfig.of(1, Math.max(32, (n + 31) / 32 * 32));
        r.ceReady.launch(s, onePerPeer, r.ceSignalArgs);
        // peers in rotated order (me+1, me+2, ...): at each step every GPU sends to one peer and receives
        // from one. In plain order all ranks would first copy into rank 0 (or 1) at once and share its
        // incoming link, which made 1 GiB per rank on 4 GPUs 1.8x slower than ncclAlltoAll (4x H200, 2026-11-30).
        for (int step = 1; step < n; step++) {
            int p = (me + step) % n;
            r.peerRecv[p].slice(me * bytesPerPeer, bytesPerPeer).copyFrom(in.slice(p * bytesPerPeer, bytesPerPeer), s);
        }
        r.ceJoin.record(r.ceSide);
        s.waitFor(r.ceJoin);
        r.ceDone.launch(s, onePerPeer, r.ceSignalArgs);
    }

    /**
     * Synchronizes the streams (one per local rank, in order) and throws if a kernel reported an
     * error (time-out, bad arguments); a time-out also aborts the group. HOST: waits for the
     * streams (within the group's host-wait time-out).
     * @param streams the streams the calls were queued on, one per local rank, in order
     * @throws dev.gin4j.comm.CommException naming what each rank's kernels reported
     */
    public void checkErrors(List<Stream> streams) {
        ensureOpen();
        Groups.checkStreams(group, streams);
        if (backend != Backend.GIN) {
            Groups.await(group, streams, "a HOST all-to-all");
            return;
        }
        KernelErrors.checkAll("GIN all-to-all", gin.errorWords(), streams, group);
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
     * already there; its {@link ErrorCheck#poll()} reports them once the streams get there.
     * @param streams the streams the calls were queued on, one per local rank, in order
     * @return the check, to poll or await
     * @throws IllegalStateException when a stream captures a graph
     */
    public ErrorCheck errorsAfter(List<Stream> streams) {
        ensureOpen();
        Groups.checkStreams(group, streams);
        if (backend == Backend.GIN)
            return KernelErrors.later("GIN all-to-all", this, gin.errorWords(), streams, null, group);
        Checks.refuseCapture(streams, "a later error check of the HOST all-to-all, which reads the error words on the host,");  // before the words are made
        return KernelErrors.later("HOST all-to-all", this, hostWords(), streams, null, group);
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
        releaseAll(() -> { if (gin != null) gin.close(); }, () -> { if (arena != null) arena.close(); });
    }

    @Override public String describe() { return "AllToAll (" + backend + ", " + maxBytesPerPeer + " bytes per peer)"; }
}
