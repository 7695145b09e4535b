package dev.gin4j.moe;

import dev.gin4j.internal.comm.Groups;
import dev.gin4j.internal.gpu.KernelLibrary;
import dev.gin4j.bindings.moe.MoeDims;
import dev.gin4j.bindings.moe.MoeFp8QuantizeArgs;
import dev.gin4j.bindings.moe.MoeHostLayoutArgs;
import dev.gin4j.bindings.moenet.MoeNetCombineArgs;
import dev.gin4j.bindings.moenet.MoeNetDims;
import dev.gin4j.bindings.moenet.MoeNetDispatchArgs;
import dev.gin4j.bindings.moenet.MoeNetForward;
import dev.gin4j.bindings.moenet.MoeNetResetArgs;
import dev.gin4j.bindings.moenet.MoeNetSections;
import dev.gin4j.bindings.moenet.MoeNetTopology;
import dev.gin4j.bindings.moenet.moe_net_h;
import dev.gin4j.comm.CommGroup;
import dev.gin4j.comm.Communicator;
import dev.gin4j.internal.comm.DeviceComm;
import dev.gin4j.internal.comm.KernelErrors;
import dev.gin4j.internal.comm.NcclDeviceAbi;
import dev.gin4j.internal.comm.SymmetricWindow;
import dev.gin4j.internal.comm.WindowLayout;
import dev.gin4j.gpu.CodeObject;
import dev.gin4j.gpu.DeviceBuffer;
import dev.gin4j.gpu.Kernel;
import dev.gin4j.gpu.KernelArgs;
import dev.gin4j.gpu.LaunchConfig;
import dev.gin4j.gpu.NativeResource;
import dev.gin4j.gpu.Stream;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.ArrayList;
import java.util.List;

/**
 * The MoE exchange of a GIN instance whose ranks span more than one node (some peer outside this
 * rank's LSA team): gin-kernels/src/nccl_gin_moe.cu, argument structs from gin-kernels/abi/moe_net.h
 * (the generated {@code dev.gin4j.bindings.moenet}). Per call, the routing layout
 * ({@code moe_host_layout}, on the instance's workspace), then one exchange kernel of the call's
 * {@link NetworkMode}: stores into the windows of peers inside the LSA team, {@code ncclGin} puts
 * with signals to the others. Low-latency: a token's row crosses to a destination rank once,
 * whatever number of that rank's experts it picked. High-throughput: once per destination node, to
 * the node's entry rank ({@link MoeTopology}), which forwards it inside the node. Either way the
 * results land expert-major, the same layout as the LSA and HOST paths.
 *
 * <p>Memory per GPU (the symmetric window), with L = E / R, S = N F slots (N nodes, F =
 * {@link MoeTopology#slotsPerNode}, 1 for equal nodes), G = ranks of the largest node:
 * <ul>
 * <li>both modes: {@code 4 R (dispatchSection + combineSection)}, {@code dispatchSection =
 *     align256(align256(align16(8 + 4L) + 12 M K) + M rowBytes)}, {@code combineSection =
 *     align256(2 M H)}: receive and staging sections for each of R peers, two calls in flight;</li>
 * <li>high-throughput in addition: {@code (2 S + 2 N) nodeSection} (node sections received as an
 *     entry, and staged per destination node), {@code nodeSection = align256(align256(align16(8 +
 *     4 G L) + 12 M K) + M rowBytes)}; {@code 2 S G combineSection} (the node's partials at the
 *     entry); {@code 4 S M G + 4 M N + 4 S (1 + G + G C)} bytes of positions; with an emulated node
 *     ({@link MoeTopology#EMULATED_NODE_SIZE}, node peers outside the LSA team) {@code 2 S G
 *     dispatchSection} of forwarding staging;</li>
 * <li>flags and counters: {@code 8 (4 R + 4 R + 2 S C + 2 S G C) + 16384} bytes, C the high-throughput chunks (a flag per chunk of
 *     each node section and of each node peer's partials).</li>
 * </ul>
 * Creation refuses a window over half the GPU's memory, naming the parts. Needs NCCL >= 2.29.7
 * (the GIN device API) and its code object.
 */
final class MoeNetwork implements AutoCloseable {
    static final int THREADS = moe_net_h.MOE_NET_THREADS();
    static final int MAX_BLOCKS = moe_net_h.MOE_NET_MAX_BLOCKS();
    static final int MAX_LOCAL_EXPERTS = moe_net_h.MOE_NET_MAX_LOCAL_EXPERTS();
    static final int ABI_VERSION = moe_net_h.MOE_NET_ABI_VERSION();

    /** Which roles of a call a launch runs: all of them, or its staged send and then its completion. */
    enum Phase {
        ALL(moe_net_h.MOE_NET_PHASE_ALL()), SEND(moe_net_h.MOE_NET_PHASE_SEND()), COMPLETE(moe_net_h.MOE_NET_PHASE_COMPLETE());

        final int code;

        Phase(int code) { this.code = code; }
    }

    /** A launch's grid for {@code phase}: all {@code total} role blocks, the first {@code send}, or the rest. */
    private static LaunchConfig grid(Phase phase, int total, int send) {
        return LaunchConfig.of(switch (phase) { case ALL -> total; case SEND -> send; case COMPLETE -> total - send; }, THREADS);
    }

    /** Where the exchanges live in the window (the same on every rank). */
    record Geometry(int ranks, int nodes, int slots, int maxNodeSize, int nodeChunks, long maxTokens, boolean fwdStaged,
                    long metaOffset, long rowsOffset, long dispatchSection, long combineSection,
                    long nodeMetaOffset, long nodeRowsOffset, long nodeSection) {
        /** {@code nodeChunks}: the high-throughput chunks; each chunk of a node section, and of a node peer's partials, has its own flag and signal. */
        static Geometry of(MoeConfig cfg, MoeTopology topo, int nodeChunks) {
            int r = topo.ranks();
            long m = cfg.maxTokens(), k = cfg.topK(), l = cfg.experts() / r, g = topo.maxNodeSize;
            long meta = align(8 + 4 * l, 16);
            long rows = align(meta + 12 * m * k, 256);
            long nodeMeta = align(8 + 4 * g * l, 16);
            long nodeRows = align(nodeMeta + 12 * m * k, 256);
            return new Geometry(r, topo.nodes, topo.slots(), topo.maxNodeSize, nodeChunks, m, topo.emulated && topo.maxNodeSize > 1, meta, rows,
                    align(rows + m * cfg.dispatchRowBytes(), 256), align(2 * m * cfg.hidden(), 256), nodeMeta, nodeRows,
                    align(nodeRows + m * cfg.dispatchRowBytes(), 256));
        }
        long lowLatencyBytes() { return 4L * ranks * (dispatchSection + combineSection); }
        long nodeBytes() { return (2L * slots + 2L * nodes) * nodeSection; }
        long partBytes() { return 2L * slots * maxNodeSize * combineSection; }
        long fwdStageBytes() { return fwdStaged ? 2L * slots * maxNodeSize * dispatchSection : 0; }
        long positionBytes() { return 4L * slots * maxTokens * maxNodeSize + 4L * maxTokens * nodes + 4L * slots * (1 + maxNodeSize + (long) maxNodeSize * nodeChunks); }
        long flagBytes() { return 8L * (4L * ranks + 4L * ranks + 2L * slots * nodeChunks + 2L * slots * maxNodeSize * nodeChunks) + 8L * 2 * 256 * 4; }
        /** Window bytes, without the regions' alignment padding (at most 4 KiB per region). */
        long windowBytes() { return lowLatencyBytes() + nodeBytes() + partBytes() + fwdStageBytes() + positionBytes() + flagBytes(); }
        /** GIN signals of the instance, in this order: low-latency 4R, HT final 4R, node 2SC (one per chunk), partials 2SGC (one per chunk). */
        int signals() { return partSignalBase() + 2 * slots * maxNodeSize * nodeChunks; }
        int htSignalBase() { return 4 * ranks; }
        int nodeSignalBase() { return 8 * ranks; }
        int partSignalBase() { return nodeSignalBase() + 2 * slots * nodeChunks; }

        /** Refuses a window over half of {@code gpuMemory}, naming every part and how to shrink it. */
        void checkFits(long gpuMemory, MoeConfig cfg) {
            long bytes = windowBytes() + 14 * 4096;
            if (bytes > gpuMemory / 2)
                throw new IllegalArgumentException("the cross-node MoE exchange needs a window of " + bytes + " bytes per GPU, more than half of the GPU's "
                        + gpuMemory + " bytes: low-latency sections 4 x " + ranks + " ranks x (" + dispatchSection + " + " + combineSection + ") = "
                        + lowLatencyBytes() + ", high-throughput node sections (2 x " + slots + " + 2 x " + nodes + ") x " + nodeSection + " = " + nodeBytes()
                        + ", node partials 2 x " + slots + " x " + maxNodeSize + " x " + combineSection + " = " + partBytes()
                        + (fwdStaged ? ", forwarding staging " + fwdStageBytes() : "") + ", positions " + positionBytes() + ", flags " + flagBytes()
                        + " (maxTokens " + cfg.maxTokens() + ", hidden " + cfg.hidden() + ", row bytes " + cfg.dispatchRowBytes() + "); lower maxTokens");
        }
    }

    static long align(long v, long a) { return (v + a - 1) / a * a; }

    /** Blocks per peer (LL) or per unit (HT) and role: about the channel count in all, within the 256-block grid. */
    static int lowLatencyChunks(int channels, int ranks) { return Math.max(1, Math.min(channels / ranks, MAX_BLOCKS / (2 * ranks))); }

    static int highThroughputChunks(int channels, MoeTopology topo) {
        return Math.max(1, Math.min(channels / topo.ranks(), MAX_BLOCKS / topo.maxBlocksPerChunk()));
    }

    /**
     * A local rank's buffers, owned by the MoeAllToAll: its workspace, the fp8 rows a quantizing
     * dispatch makes (else null), its error word, and the rows its receive buffers hold (each
     * dispatch and combine names its outputs).
     */
    record Buffers(DeviceBuffer workspace, DeviceBuffer xq, KernelErrors errors, long capacityRows) {}

    private static MemorySegment ptr(long address) { return MemorySegment.ofAddress(address); }

    private final class Rank {
        final Communicator comm;
        final Buffers b;
        final CodeObject hostCode, netCode;
        final Kernel layout, quantize, dispatch, combine, dispatchHt, combineHt;
        final KernelArgs layoutArgs, quantizeArgs, dispatchArgs, combineArgs;
        final MemorySegment dispatchStruct, combineStruct;
        final int htDispatchBlocks, htDispatchSendBlocks;
        NetworkMode lastDispatch = NetworkMode.LOW_LATENCY;  // the combine runs in the mode of the dispatch before it

        Rank(Communicator comm, Buffers b) {
            this.comm = comm;
            this.b = b;
            int i = comm.localIndex();
            hostCode = KernelLibrary.load(comm.device(), "moe_host");
            CodeObject net = null;
            try {
                net = KernelLibrary.load(comm.device(), "nccl_gin_moe");
                netCode = net;
                layout = hostCode.kernel("moe_host_layout");
                quantize = cfg.quantizes() ? hostCode.kernel("moe_fp8_quantize") : null;
                dispatch = net.kernel("moe_net_dispatch");
                combine = net.kernel("moe_net_combine");
                dispatchHt = net.kernel("moe_net_dispatch_ht");
                combineHt = net.kernel("moe_net_combine_ht");
                htDispatchBlocks = htChunks * topo.dispatchBlocksPerChunk(comm.rank());
                htDispatchSendBlocks = htChunks * topo.dispatchSendBlocksPerChunk(comm.rank());
                // moe_host_layout and moe_fp8_quantize take their structs of gin-kernels/abi/moe.h
                layoutArgs = KernelArgs.ofStruct(arena, MoeHostLayoutArgs.layout());
                MemorySegment dims = MoeHostLayoutArgs.dims(layoutArgs.struct());
                MoeDims.rank(dims, comm.rank());
                MoeDims.nRanks(dims, nRanks);
                MoeDims.numExperts(dims, cfg.experts());
                MoeDims.topK(dims, cfg.topK());
                MoeDims.hidden(dims, cfg.hidden());
                MoeDims.maxTokens(dims, cfg.maxTokens());
                MoeDims.numChannels(dims, channels);
                layoutArgs.setPointerField(MoeHostLayoutArgs.workspace$offset(), b.workspace()).setPointerField(MoeHostLayoutArgs.errorFlags$offset(), b.errors().buffer());
                quantizeArgs = KernelArgs.ofStruct(arena, MoeFp8QuantizeArgs.layout());
                NcclDeviceAbi abi = ginComm.abi();
                KernelArgs.Type devComm = KernelArgs.Type.struct(abi.devCommSize(), Math.max(abi.devCommAlign(), 1));
                MemorySegment devCommBytes = ginComm.struct(i).asSlice(0, abi.devCommSize());
                dispatchArgs = KernelArgs.of(arena, devComm, KernelArgs.Type.struct(MoeNetDispatchArgs.sizeof(), 8)).setStruct(0, devCommBytes);
                combineArgs = KernelArgs.of(arena, devComm, KernelArgs.Type.struct(MoeNetCombineArgs.sizeof(), 8)).setStruct(0, devCommBytes);
                dispatchStruct = arena.allocate(MoeNetDispatchArgs.layout());
                combineStruct = arena.allocate(MoeNetCombineArgs.layout());
                long windowHandle = window.handle(i).address();
                MoeNetDispatchArgs.window(dispatchStruct, windowHandle);
                fillDims(MoeNetDispatchArgs.dims(dispatchStruct), comm.rank());
                fillSections(MoeNetDispatchArgs.net(dispatchStruct), "dispatch");
                fillTopology(MoeNetDispatchArgs.topo(dispatchStruct));
                fillForward(MoeNetDispatchArgs.fwd(dispatchStruct));
                MoeNetDispatchArgs.workspace(dispatchStruct, ptr(b.workspace().address()));
                MoeNetDispatchArgs.errorFlags(dispatchStruct, ptr(b.errors().buffer().address()));
                MoeNetDispatchArgs.capacityRows(dispatchStruct, b.capacityRows());
                MoeNetCombineArgs.window(combineStruct, windowHandle);
                fillDims(MoeNetCombineArgs.dims(combineStruct), comm.rank());
                fillSections(MoeNetCombineArgs.net(combineStruct), "combine");
                fillTopology(MoeNetCombineArgs.topo(combineStruct));
                fillForward(MoeNetCombineArgs.fwd(combineStruct));
                MoeNetCombineArgs.workspace(combineStruct, ptr(b.workspace().address()));
                MoeNetCombineArgs.errorFlags(combineStruct, ptr(b.errors().buffer().address()));
            } catch (RuntimeException e) {
                NativeResource.releaseAll(hostCode::close, net == null ? () -> {} : net::close);
                throw e;
            }
        }

        private void fillDims(MemorySegment d, int rank) {
            MoeNetDims.rank(d, rank);
            MoeNetDims.nRanks(d, nRanks);
            MoeNetDims.numExperts(d, cfg.experts());
            MoeNetDims.topK(d, cfg.topK());
            MoeNetDims.hidden(d, cfg.hidden());
            MoeNetDims.maxTokens(d, cfg.maxTokens());
            MoeNetDims.rowBytes(d, Math.toIntExact(cfg.dispatchRowBytes()));
            MoeNetDims.chunks(d, llChunks);
            MoeNetDims.expertAlignment(d, cfg.expertAlignment());
        }

        private void fillSections(MemorySegment s, String exchange) {
            boolean dispatchSide = exchange.equals("dispatch");
            MoeNetSections.recvOffset(s, offset(exchange + "Recv"));
            MoeNetSections.stageOffset(s, offset(exchange + "Stage"));
            MoeNetSections.sectionBytes(s, dispatchSide ? geometry.dispatchSection() : geometry.combineSection());
            MoeNetSections.metaOffset(s, dispatchSide ? geometry.metaOffset() : 0);
            MoeNetSections.rowsOffset(s, dispatchSide ? geometry.rowsOffset() : 0);
            MoeNetSections.flagOffset(s, offset(exchange + "Flags"));
            MoeNetSections.signalBase(s, dispatchSide ? 0 : 2 * nRanks);
        }

        private void fillTopology(MemorySegment t) {
            MoeNetTopology.nodes(t, topo.nodes);
            MoeNetTopology.slotsPerNode(t, topo.slotsPerNode);
            MoeNetTopology.maxNodeSize(t, topo.maxNodeSize);
            MemorySegment.copy(topo.nodeOf, 0, MoeNetTopology.nodeOf(t), ValueLayout.JAVA_INT, 0, nRanks);
            MemorySegment.copy(topo.localOf, 0, MoeNetTopology.localOf(t), ValueLayout.JAVA_INT, 0, nRanks);
            MemorySegment.copy(topo.nodeStart, 0, MoeNetTopology.nodeStart(t), ValueLayout.JAVA_INT, 0, topo.nodeStart.length);
            MemorySegment.copy(topo.nodeSize, 0, MoeNetTopology.nodeSize(t), ValueLayout.JAVA_INT, 0, topo.nodeSize.length);
            MemorySegment.copy(topo.nodeRank, 0, MoeNetTopology.nodeRank(t), ValueLayout.JAVA_INT, 0, nRanks);
        }

        private void fillForward(MemorySegment f) {
            int r = nRanks, s = topo.slots(), g = topo.maxNodeSize;
            MemorySegment node = MoeNetForward.node(f);
            MoeNetSections.recvOffset(node, offset("nodeRecv"));
            MoeNetSections.stageOffset(node, offset("nodeStage"));
            MoeNetSections.sectionBytes(node, geometry.nodeSection());
            MoeNetSections.metaOffset(node, geometry.nodeMetaOffset());
            MoeNetSections.rowsOffset(node, geometry.nodeRowsOffset());
            MoeNetSections.flagOffset(node, offset("nodeFlags"));
            MoeNetSections.signalBase(node, geometry.nodeSignalBase());
            MemorySegment part = MoeNetForward.part(f);
            MoeNetSections.recvOffset(part, offset("partRecv"));
            MoeNetSections.stageOffset(part, offset("combineStage"));
            MoeNetSections.sectionBytes(part, geometry.combineSection());
            MoeNetSections.flagOffset(part, offset("partFlags"));
            MoeNetSections.signalBase(part, geometry.partSignalBase());
            MoeNetForward.fwdStageOffset(f, offset("fwdStage"));
            MoeNetForward.fwdStageSlots(f, geometry.fwdStaged() ? 2L * s * g : 0);
            MoeNetForward.fwdCountOffset(f, offset("fwdCount"));
            MoeNetForward.fwdPosOffset(f, offset("fwdPos"));
            MoeNetForward.nodePosOffset(f, offset("nodePos"));
            MoeNetForward.countersOffset(f, offset("counters"));
            MoeNetForward.htFlagOffset(f, offset("htFlags"));
            MoeNetForward.htSignalBase(f, geometry.htSignalBase());
        }

        void close() { NativeResource.releaseAll(hostCode::close, netCode::close); }
    }

    private final CommGroup group;
    private final MoeConfig cfg;
    private final MoeTopology topo;
    private final int nRanks, channels, llChunks, htChunks;
    private final Geometry geometry;
    private final NetworkMode autoMode;
    private final Arena arena = Arena.ofShared();
    private final SymmetricWindow window;
    private DeviceComm ginComm;  // set once in the constructor; null until then (close after a failed setup)
    private final List<Rank> ranks = new ArrayList<>();
    private boolean closed;

    /** Collective: the node table, the window, the device communicators with their GIN signals, the kernels, the signals reset. */
    MoeNetwork(CommGroup group, MoeConfig cfg, int channels, List<Buffers> buffers) {
        this.group = group;
        this.cfg = cfg;
        this.nRanks = group.worldSize();
        this.channels = channels;
        int local = cfg.experts() / nRanks;
        if (local > MAX_LOCAL_EXPERTS)
            throw new IllegalArgumentException("the cross-node MoE exchange takes at most " + MAX_LOCAL_EXPERTS + " experts per rank, got " + local + " (" + cfg.experts() + " over " + nRanks + " ranks)");
        this.topo = MoeTopology.of(group, System.getenv());
        this.llChunks = lowLatencyChunks(channels, nRanks);
        this.htChunks = highThroughputChunks(channels, topo);
        this.autoMode = autoMode(cfg, topo);
        this.geometry = Geometry.of(cfg, topo, htChunks);
        geometry.checkFits(group.rank(0).device().totalMemory(), cfg);
        long dispRegion = 2L * nRanks * geometry.dispatchSection(), combRegion = 2L * nRanks * geometry.combineSection();
        int s = topo.slots(), g = topo.maxNodeSize;
        long m = cfg.maxTokens();
        this.window = SymmetricWindow.allocateRegistered(group, WindowLayout.builder()  // GIN puts need NCCL's window
                .region("dispatchRecv", dispRegion, 4096).region("dispatchStage", dispRegion, 4096)
                .region("combineRecv", combRegion, 4096).region("combineStage", combRegion, 4096)
                .region("nodeRecv", 2L * s * geometry.nodeSection(), 4096).region("nodeStage", 2L * topo.nodes * geometry.nodeSection(), 4096)
                .region("partRecv", geometry.partBytes(), 4096).region("fwdStage", geometry.fwdStageBytes(), 4096)
                .region("fwdCount", 4L * s * (1 + g + (long) g * htChunks), 256).region("fwdPos", 4L * s * m * g, 256).region("nodePos", 4L * m * topo.nodes, 256)
                .region("counters", 8L * 2 * 256 * 4, 256)
                .region("dispatchFlags", 16L * nRanks, 256).region("combineFlags", 16L * nRanks, 256).region("htFlags", 32L * nRanks, 256)
                .region("nodeFlags", 16L * s * htChunks, 256).region("partFlags", 16L * s * g * htChunks, 256).build());
        try {
            this.ginComm = DeviceComm.create(group, new DeviceComm.Requirements(0, geometry.signals(), 0, true));
            // no rank may put into a peer before that peer zeroed its window and reset its signals
            Groups.failTogether(group, "setting up the cross-node MoE exchange", () -> {
                for (Communicator c : group.ranks()) {
                    Rank r = new Rank(c, buffers.get(c.localIndex()));
                    ranks.add(r);
                    try (Stream st = c.device().createStream(); Arena a = Arena.ofConfined()) {
                        window.buffer(c.localIndex()).fill((byte) 0, st);
                        MemorySegment reset = a.allocate(MoeNetResetArgs.layout());
                        MoeNetResetArgs.signalBase(reset, 0);
                        MoeNetResetArgs.signalCount(reset, geometry.signals());
                        MoeNetResetArgs.errorFlags(reset, ptr(r.b.errors().buffer().address()));
                        NcclDeviceAbi abi = ginComm.abi();
                        KernelArgs args = KernelArgs.of(a, KernelArgs.Type.struct(abi.devCommSize(), Math.max(abi.devCommAlign(), 1)),
                                KernelArgs.Type.struct(MoeNetResetArgs.sizeof(), 8));
                        args.setStruct(0, ginComm.struct(c.localIndex()).asSlice(0, abi.devCommSize())).setStruct(1, reset);
                        r.netCode.kernel("moe_net_reset").launch(st, LaunchConfig.of(1, 256), args);
                        r.b.errors().check("moe_net_reset", st);
                    }
                }
            });
        } catch (RuntimeException e) {
            close();
            throw e;
        }
        System.getLogger("dev.gin4j").log(System.Logger.Level.DEBUG, () -> "MoE exchange across nodes over " + group.describe() + ", " + topo.describe()
                + ": " + llChunks + " low-latency and " + htChunks + " high-throughput blocks per unit and role, AUTO = " + autoMode
                + ", window " + geometry.windowBytes() + " bytes per GPU");
    }

    /**
     * AUTO: HT where some node has two or more ranks (forwarding saves network bytes), the batches
     * are large, and the HT grids fit (see {@link #highThroughputUnavailable}).
     */
    static NetworkMode autoMode(MoeConfig cfg, MoeTopology topo) {
        return topo.maxNodeSize > 1 && cfg.maxTokens() >= MoeAllToAll.AUTO_HIGH_THROUGHPUT_TOKENS && highThroughputUnavailable(topo) == null
                ? NetworkMode.HIGH_THROUGHPUT : NetworkMode.LOW_LATENCY;
    }

    /** Why the HT kernels cannot run on this node table (a grid of more than 256 blocks at one chunk), or null. */
    static String highThroughputUnavailable(MoeTopology topo) {
        int most = topo.maxBlocksPerChunk();
        return most <= MAX_BLOCKS ? null : "the high-throughput exchange needs " + most + " blocks per launch on " + topo.describe()
                + " (at most " + MAX_BLOCKS + "; nodes of very different sizes need many entry slots); use NetworkMode.LOW_LATENCY";
    }

    NetworkMode resolve(NetworkMode mode) {
        if (mode != NetworkMode.HIGH_THROUGHPUT) return mode == NetworkMode.AUTO ? autoMode : mode;
        String why = highThroughputUnavailable(topo);
        if (why != null) throw new IllegalStateException(why);
        return mode;
    }

    MoeTopology topology() { return topo; }

    int chunks(NetworkMode mode) { return resolve(mode) == NetworkMode.HIGH_THROUGHPUT ? htChunks : llChunks; }

    private long offset(String region) { return window.layout().region(region).offset(); }

    String dispatchKernelName(NetworkMode mode) {
        return resolve(mode) == NetworkMode.HIGH_THROUGHPUT ? "moe_host_layout + moe_net_dispatch_ht" : "moe_host_layout + moe_net_dispatch";
    }

    /**
     * The routing layout and the exchange on {@code stream}, inputs and outputs checked by the caller:
     * the rows, weights and counts land in {@code recvX}, {@code recvWeights} and {@code recvCounts}
     * (the instance's or the caller's, each of at least capacity rows or local experts);
     * {@code phase} ALL, or SEND (the sending roles only; {@link #complete} queues the rest).
     */
    void dispatch(int localIndex, DeviceBuffer x, DeviceBuffer topkIdx, DeviceBuffer topkWeights, int tokens, DeviceBuffer recvX, DeviceBuffer recvWeights,
                  DeviceBuffer recvCounts, Stream stream, NetworkMode mode, Phase phase) {
        Rank r = ranks.get(localIndex);
        boolean ht = resolve(mode) == NetworkMode.HIGH_THROUGHPUT;
        DeviceBuffer rows = x;
        if (cfg.quantizes()) {
            Fp8Rows.setQuantizeArgs(r.quantizeArgs, x, tokens, cfg.hidden(), r.b.xq(), r.b.errors().buffer());
            r.quantize.launch(stream, Fp8Rows.launchConfig(r.comm.device(), tokens, cfg.hidden()), r.quantizeArgs);
            rows = r.b.xq();
        }
        r.layoutArgs.setPointerField(MoeHostLayoutArgs.topkIdx$offset(), topkIdx);
        MoeHostLayoutArgs.numTokens(r.layoutArgs.struct(), tokens);
        r.layout.launch(stream, LaunchConfig.of(channels, THREADS), r.layoutArgs);
        MoeNetDispatchArgs.x(r.dispatchStruct, ptr(rows.address()));
        MoeNetDispatchArgs.topkIdx(r.dispatchStruct, ptr(topkIdx.address()));
        MoeNetDispatchArgs.topkWeights(r.dispatchStruct, ptr(topkWeights.address()));
        MoeNetDispatchArgs.numTokens(r.dispatchStruct, tokens);
        MoeNetDispatchArgs.recvX(r.dispatchStruct, ptr(recvX.address()));
        MoeNetDispatchArgs.recvWeights(r.dispatchStruct, ptr(recvWeights.address()));
        MoeNetDispatchArgs.recvCounts(r.dispatchStruct, ptr(recvCounts.address()));
        MoeNetDims.chunks(MoeNetDispatchArgs.dims(r.dispatchStruct), ht ? htChunks : llChunks);
        r.lastDispatch = ht ? NetworkMode.HIGH_THROUGHPUT : NetworkMode.LOW_LATENCY;
        launchDispatch(r, stream, phase);
    }

    private void launchDispatch(Rank r, Stream stream, Phase phase) {
        MoeNetDispatchArgs.phase(r.dispatchStruct, phase.code);
        r.dispatchArgs.setStruct(1, r.dispatchStruct);
        if (r.lastDispatch == NetworkMode.HIGH_THROUGHPUT) r.dispatchHt.launch(stream, grid(phase, r.htDispatchBlocks, r.htDispatchSendBlocks), r.dispatchArgs);
        else r.dispatch.launch(stream, grid(phase, 2 * nRanks * llChunks, nRanks * llChunks), r.dispatchArgs);
    }

    /**
     * The combine exchange of the last dispatch on {@code stream}, in that dispatch's mode, into
     * {@code y} (the instance's or the caller's, at least T rows); {@code weights} (the dispatch's
     * received weights) null: unweighted; {@code phase} ALL or SEND.
     */
    void combine(int localIndex, DeviceBuffer expertOut, DeviceBuffer weights, DeviceBuffer y, int tokens, Stream stream, Phase phase) {
        launchCombine(ranks.get(localIndex), ptr(expertOut.address()), ptr(weights == null ? 0 : weights.address()), ptr(y.address()),
                MemorySegment.NULL, MemorySegment.NULL, expertOut.byteSize() / (2L * cfg.hidden()), tokens, stream, phase);
    }

    /**
     * The row values call after the last dispatch on {@code stream}, in that dispatch's mode: the
     * combine's exchange with a [K] word row per partial (per token and expert rank, or per token
     * and node for a node partial) in place of its bf16 [H] row, so every rank
     * must make its combines and row values calls in the same order. {@code rowValues}: f32 per
     * received row, {@code rows} of them; {@code tokenValues}: [T][K] f32, the caller's checks done.
     */
    void returnRowValues(int localIndex, DeviceBuffer rowValues, long rows, DeviceBuffer tokenValues, int tokens, Stream stream) {
        launchCombine(ranks.get(localIndex), MemorySegment.NULL, MemorySegment.NULL, MemorySegment.NULL,
                ptr(rowValues.address()), ptr(tokenValues.address()), rows, tokens, stream, Phase.ALL);
    }

    /** One combine launch, in the last dispatch's mode: bf16 rows (expertOut, weights, y) or row values (rowValues, tokenValues), the others null. */
    private void launchCombine(Rank r, MemorySegment expertOut, MemorySegment weights, MemorySegment y, MemorySegment rowValues, MemorySegment tokenValues,
                               long expertOutRows, int tokens, Stream stream, Phase phase) {
        MoeNetCombineArgs.expertOut(r.combineStruct, expertOut);
        MoeNetCombineArgs.weights(r.combineStruct, weights);
        MoeNetCombineArgs.y(r.combineStruct, y);
        MoeNetCombineArgs.rowValues(r.combineStruct, rowValues);
        MoeNetCombineArgs.tokenValues(r.combineStruct, tokenValues);
        MoeNetCombineArgs.expertOutRows(r.combineStruct, expertOutRows);
        MoeNetCombineArgs.numTokens(r.combineStruct, tokens);
        MoeNetDims.chunks(MoeNetCombineArgs.dims(r.combineStruct), r.lastDispatch == NetworkMode.HIGH_THROUGHPUT ? htChunks : llChunks);
        launchCombine(r, stream, phase);
    }

    private void launchCombine(Rank r, Stream stream, Phase phase) {
        MoeNetCombineArgs.phase(r.combineStruct, phase.code);
        r.combineArgs.setStruct(1, r.combineStruct);
        if (r.lastDispatch == NetworkMode.HIGH_THROUGHPUT)
            r.combineHt.launch(stream, grid(phase, htChunks * topo.combineBlocksPerChunk(), htChunks * topo.combineSendBlocksPerChunk()), r.combineArgs);
        else r.combine.launch(stream, grid(phase, 2 * nRanks * llChunks, nRanks * llChunks), r.combineArgs);
    }

    /** The rest of the last SEND on {@code stream}: wait for the peers' sections, forward (HT), place or reduce. */
    void complete(int localIndex, boolean combine, Stream stream) {
        Rank r = ranks.get(localIndex);
        if (combine) launchCombine(r, stream, Phase.COMPLETE);
        else launchDispatch(r, stream, Phase.COMPLETE);
    }

    /** Idempotent; every part is released even if one before it fails. */
    @Override public void close() {
        if (closed) return;
        closed = true;
        List<Runnable> steps = new ArrayList<>();
        for (Rank r : ranks) steps.add(r::close);
        steps.add(() -> { if (ginComm != null) ginComm.close(); });
        steps.add(() -> { if (window != null) window.close(); });
        steps.add(arena::close);
        NativeResource.releaseAll(steps.toArray(Runnable[]::new));
    }
}
