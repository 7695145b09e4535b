package dev.gin4j.moe;

import dev.gin4j.internal.comm.Groups;
import dev.gin4j.internal.gpu.KernelLibrary;
import dev.gin4j.bindings.moe.MoeDims;
import dev.gin4j.bindings.moe.MoeFp8QuantizeArgs;
import dev.gin4j.bindings.moe.MoeHostLayoutArgs;
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
import java.lang.foreign.MemoryLayout;
import java.lang.foreign.MemoryLayout.PathElement;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.StructLayout;
import java.lang.invoke.VarHandle;
import java.util.ArrayList;
import java.util.List;

import static java.lang.foreign.ValueLayout.JAVA_INT;
import static java.lang.foreign.ValueLayout.JAVA_LONG;

/**
 * The MoE exchange of a GIN instance whose ranks span more than one node (some peer outside this
 * rank's LSA team): gin-kernels/src/nccl_gin_moe.cu. Per call, the routing layout
 * ({@code moe_host_layout}, on the instance's workspace), then one exchange kernel: stores into the
 * windows of peers inside the node, {@code ncclGin} puts with signals to the others. A token's row
 * crosses to a destination rank once, whatever number of that rank's experts it picked; the
 * results land expert-major, the same layout as the LSA and HOST paths.
 *
 * <p>Memory per GPU (the symmetric window): {@code 4 R (dispatchSection + combineSection)} bytes,
 * with {@code dispatchSection = align256(align256(align16(8 + 4L) + 12 M K) + M rowBytes)} and
 * {@code combineSection = align256(2 M H)}: receive and staging sections for each of R peers,
 * for two calls in flight. Needs NCCL >= 2.29.7 (the GIN device API) and its code object.
 */
final class MoeNetwork implements AutoCloseable {
    static final int THREADS = 512;      // MOE_NET_THREADS
    static final int MAX_BLOCKS = 256;   // MOE_NET_MAX_BLOCKS
    static final int MAX_LOCAL_EXPERTS = 1024;

    // ---- gin-kernels/abi/moe_net.h, field for field (MoeNetAbiTest checks the offsets against gcc) ----
    static final StructLayout DIMS = MemoryLayout.structLayout(JAVA_INT.withName("rank"), JAVA_INT.withName("nRanks"),
            JAVA_INT.withName("numExperts"), JAVA_INT.withName("topK"), JAVA_INT.withName("hidden"), JAVA_INT.withName("maxTokens"),
            JAVA_INT.withName("rowBytes"), JAVA_INT.withName("chunks")).withName("MoeNetDims");
    static final StructLayout SECTIONS = MemoryLayout.structLayout(JAVA_LONG.withName("recvOffset"), JAVA_LONG.withName("stageOffset"),
            JAVA_LONG.withName("sectionBytes"), JAVA_LONG.withName("metaOffset"), JAVA_LONG.withName("rowsOffset"),
            JAVA_LONG.withName("flagOffset"), JAVA_INT.withName("signalBase"), JAVA_INT.withName("reserved")).withName("MoeNetSections");
    static final StructLayout DISPATCH_ARGS = MemoryLayout.structLayout(JAVA_LONG.withName("window"), DIMS.withName("dims"),
            SECTIONS.withName("net"), JAVA_LONG.withName("x"), JAVA_LONG.withName("topkIdx"), JAVA_LONG.withName("topkWeights"),
            JAVA_LONG.withName("recvX"), JAVA_LONG.withName("recvWeights"), JAVA_LONG.withName("recvCounts"), JAVA_LONG.withName("workspace"),
            JAVA_LONG.withName("errorFlags"), JAVA_LONG.withName("capacityRows"), JAVA_INT.withName("numTokens"),
            JAVA_INT.withName("reserved")).withName("MoeNetDispatchArgs");
    static final StructLayout COMBINE_ARGS = MemoryLayout.structLayout(JAVA_LONG.withName("window"), DIMS.withName("dims"),
            SECTIONS.withName("net"), JAVA_LONG.withName("expertOut"), JAVA_LONG.withName("weights"), JAVA_LONG.withName("y"),
            JAVA_LONG.withName("workspace"), JAVA_LONG.withName("errorFlags"), JAVA_LONG.withName("expertOutRows"),
            JAVA_INT.withName("numTokens"), JAVA_INT.withName("reserved")).withName("MoeNetCombineArgs");
    static final StructLayout RESET_ARGS = MemoryLayout.structLayout(JAVA_INT.withName("signalBase"), JAVA_INT.withName("signalCount"),
            JAVA_LONG.withName("errorFlags")).withName("MoeNetResetArgs");

    private record Field(VarHandle handle, boolean int32) {}
    // looked up once per (struct, path): the dispatch and combine set fields on every call
    private static final java.util.Map<String, Field> FIELDS = new java.util.concurrent.ConcurrentHashMap<>();

    /** Sets field {@code path} (e.g. "dims.rank") of a struct of {@code layout} in {@code s}. */
    static void set(StructLayout layout, MemorySegment s, String path, long value) {
        Field f = FIELDS.computeIfAbsent(layout.name().orElseThrow() + "." + path, k -> {
            PathElement[] elements = java.util.Arrays.stream(path.split("\\.")).map(PathElement::groupElement).toArray(PathElement[]::new);
            return new Field(layout.varHandle(elements), layout.select(elements).byteSize() == 4);
        });
        if (f.int32()) f.handle().set(s, 0L, Math.toIntExact(value));
        else f.handle().set(s, 0L, value);
    }

    /** Where the two exchanges live in the window (the same on every rank). */
    record Geometry(long metaOffset, long rowsOffset, long dispatchSection, long combineSection) {
        static Geometry of(MoeConfig cfg, int nRanks) {
            long m = cfg.maxTokens(), k = cfg.topK(), l = cfg.experts() / nRanks;
            long meta = align(8 + 4 * l, 16);
            long rows = align(meta + 12 * m * k, 256);
            return new Geometry(meta, rows, align(rows + m * cfg.dispatchRowBytes(), 256), align(2 * m * cfg.hidden(), 256));
        }
        /** Window bytes: receive and staging sections of both exchanges, then the LSA flags. */
        long windowBytes(int nRanks) { return 4L * nRanks * (dispatchSection + combineSection) + 4L * 256 * nRanks; }
    }

    static long align(long v, long a) { return (v + a - 1) / a * a; }

    /** A local rank's buffers, owned by the MoeAllToAll. */
    record Buffers(DeviceBuffer workspace, DeviceBuffer recvX, DeviceBuffer recvWeights, DeviceBuffer recvCounts, DeviceBuffer y,
                   DeviceBuffer xq, KernelErrors errors) {}

    private final class Rank {
        final Communicator comm;
        final Buffers b;
        final CodeObject hostCode, netCode;
        final Kernel layout, quantize, dispatch, combine;
        final KernelArgs layoutArgs, quantizeArgs, dispatchArgs, combineArgs;
        final MemorySegment dispatchStruct, combineStruct;

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
                dispatchArgs = KernelArgs.of(arena, devComm, KernelArgs.Type.struct(DISPATCH_ARGS.byteSize(), 8)).setStruct(0, devCommBytes);
                combineArgs = KernelArgs.of(arena, devComm, KernelArgs.Type.struct(COMBINE_ARGS.byteSize(), 8)).setStruct(0, devCommBytes);
                dispatchStruct = arena.allocate(DISPATCH_ARGS);
                combineStruct = arena.allocate(COMBINE_ARGS);
                long windowHandle = window.handle(i).address();
                fillCommon(DISPATCH_ARGS, dispatchStruct, windowHandle, comm.rank(), "dispatch");
                fillCommon(COMBINE_ARGS, combineStruct, windowHandle, comm.rank(), "combine");
                set(DISPATCH_ARGS, dispatchStruct, "recvX", b.recvX().address());
                set(DISPATCH_ARGS, dispatchStruct, "recvWeights", b.recvWeights().address());
                set(DISPATCH_ARGS, dispatchStruct, "recvCounts", b.recvCounts().address());
                set(DISPATCH_ARGS, dispatchStruct, "workspace", b.workspace().address());
                set(DISPATCH_ARGS, dispatchStruct, "errorFlags", b.errors().buffer().address());
                set(DISPATCH_ARGS, dispatchStruct, "capacityRows", b.recvWeights().byteSize() / 4);
                set(COMBINE_ARGS, combineStruct, "workspace", b.workspace().address());
                set(COMBINE_ARGS, combineStruct, "errorFlags", b.errors().buffer().address());
            } catch (RuntimeException e) {
                NativeResource.releaseAll(hostCode::close, net == null ? () -> {} : net::close);
                throw e;
            }
        }

        private void fillCommon(StructLayout l, MemorySegment s, long windowHandle, int rank, String exchange) {
            boolean dispatchSide = exchange.equals("dispatch");
            set(l, s, "window", windowHandle);
            set(l, s, "dims.rank", rank);
            set(l, s, "dims.nRanks", nRanks);
            set(l, s, "dims.numExperts", cfg.experts());
            set(l, s, "dims.topK", cfg.topK());
            set(l, s, "dims.hidden", cfg.hidden());
            set(l, s, "dims.maxTokens", cfg.maxTokens());
            set(l, s, "dims.rowBytes", cfg.dispatchRowBytes());
            set(l, s, "dims.chunks", chunks);
            set(l, s, "net.recvOffset", offset(exchange + "Recv"));
            set(l, s, "net.stageOffset", offset(exchange + "Stage"));
            set(l, s, "net.sectionBytes", dispatchSide ? geometry.dispatchSection() : geometry.combineSection());
            set(l, s, "net.metaOffset", dispatchSide ? geometry.metaOffset() : 0);
            set(l, s, "net.rowsOffset", dispatchSide ? geometry.rowsOffset() : 0);
            set(l, s, "net.flagOffset", offset(exchange + "Flags"));
            set(l, s, "net.signalBase", dispatchSide ? 0 : 2 * nRanks);
        }

        void close() { NativeResource.releaseAll(hostCode::close, netCode::close); }
    }

    private final CommGroup group;
    private final MoeConfig cfg;
    private final int nRanks, channels, chunks;
    private final Geometry geometry;
    private final Arena arena = Arena.ofShared();
    private final SymmetricWindow window;
    private DeviceComm ginComm;  // set once in the constructor; null until then (close after a failed setup)
    private final LaunchConfig exchangeLaunch;
    private final List<Rank> ranks = new ArrayList<>();
    private boolean closed;

    /** Collective: the window, the device communicators with 4R GIN signals, the kernels, the signals reset. */
    MoeNetwork(CommGroup group, MoeConfig cfg, int channels, List<Buffers> buffers) {
        this.group = group;
        this.cfg = cfg;
        this.nRanks = group.worldSize();
        this.channels = channels;
        int local = cfg.experts() / nRanks;
        if (local > MAX_LOCAL_EXPERTS)
            throw new IllegalArgumentException("the cross-node MoE exchange takes at most " + MAX_LOCAL_EXPERTS + " experts per rank, got " + local + " (" + cfg.experts() + " over " + nRanks + " ranks)");
        // blocks per peer in each role: about the channel count in all, within the kernels' 256-block grid
        this.chunks = Math.max(1, Math.min(channels / nRanks, MAX_BLOCKS / (2 * nRanks)));
        this.exchangeLaunch = LaunchConfig.of(2 * nRanks * chunks, THREADS);
        this.geometry = Geometry.of(cfg, nRanks);
        long bytes = geometry.windowBytes(nRanks), memory = group.rank(0).device().totalMemory();
        if (bytes > memory / 2)
            throw new IllegalArgumentException("the cross-node MoE exchange needs a window of " + bytes + " bytes per GPU (4 x " + nRanks + " ranks x ("
                    + geometry.dispatchSection() + " + " + geometry.combineSection() + ") bytes of dispatch and combine sections for maxTokens " + cfg.maxTokens()
                    + "), more than half of the GPU's " + memory + " bytes; lower maxTokens");
        long dispRegion = 2L * nRanks * geometry.dispatchSection(), combRegion = 2L * nRanks * geometry.combineSection();
        this.window = SymmetricWindow.allocateRegistered(group, WindowLayout.builder()  // GIN puts need NCCL's window
                .region("dispatchRecv", dispRegion, 4096).region("dispatchStage", dispRegion, 4096)
                .region("combineRecv", combRegion, 4096).region("combineStage", combRegion, 4096)
                .region("dispatchFlags", 16L * nRanks, 256).region("combineFlags", 16L * nRanks, 256).build());
        try {
            this.ginComm = DeviceComm.create(group, new DeviceComm.Requirements(0, 4 * nRanks, 0, true));
            // no rank may put into a peer before that peer zeroed its window and reset its signals
            Groups.failTogether(group, "setting up the cross-node MoE exchange", () -> {
                for (Communicator c : group.ranks()) {
                    Rank r = new Rank(c, buffers.get(c.localIndex()));
                    ranks.add(r);
                    try (Stream s = c.device().createStream(); Arena a = Arena.ofConfined()) {
                        window.buffer(c.localIndex()).fill((byte) 0, s);
                        MemorySegment reset = a.allocate(RESET_ARGS);
                        set(RESET_ARGS, reset, "signalBase", 0);
                        set(RESET_ARGS, reset, "signalCount", 4L * nRanks);
                        set(RESET_ARGS, reset, "errorFlags", r.b.errors().buffer().address());
                        NcclDeviceAbi abi = ginComm.abi();
                        KernelArgs args = KernelArgs.of(a, KernelArgs.Type.struct(abi.devCommSize(), Math.max(abi.devCommAlign(), 1)),
                                KernelArgs.Type.struct(RESET_ARGS.byteSize(), 8));
                        args.setStruct(0, ginComm.struct(c.localIndex()).asSlice(0, abi.devCommSize())).setStruct(1, reset);
                        r.netCode.kernel("moe_net_reset").launch(s, LaunchConfig.of(1, 256), args);
                        r.b.errors().check("moe_net_reset", s);
                    }
                }
            });
        } catch (RuntimeException e) {
            close();
            throw e;
        }
        System.getLogger("dev.gin4j").log(System.Logger.Level.DEBUG, () -> "MoE exchange across nodes over " + group.describe() + ": "
                + chunks + " blocks per peer and role, window " + bytes + " bytes per GPU");
    }

    private long offset(String region) { return window.layout().region(region).offset(); }

    String dispatchKernelName() { return "moe_host_layout + moe_net_dispatch"; }

    /** The routing layout and the exchange on {@code stream}; inputs checked by the caller. */
    void dispatch(int localIndex, DeviceBuffer x, DeviceBuffer topkIdx, DeviceBuffer topkWeights, int tokens, Stream stream) {
        Rank r = ranks.get(localIndex);
        DeviceBuffer rows = x;
        if (cfg.quantizes()) {
            Fp8Rows.setQuantizeArgs(r.quantizeArgs, x, tokens, cfg.hidden(), r.b.xq(), r.b.errors().buffer());
            r.quantize.launch(stream, Fp8Rows.launchConfig(r.comm.device(), tokens, cfg.hidden()), r.quantizeArgs);
            rows = r.b.xq();
        }
        r.layoutArgs.setPointerField(MoeHostLayoutArgs.topkIdx$offset(), topkIdx);
        MoeHostLayoutArgs.numTokens(r.layoutArgs.struct(), tokens);
        r.layout.launch(stream, LaunchConfig.of(channels, THREADS), r.layoutArgs);
        set(DISPATCH_ARGS, r.dispatchStruct, "x", rows.address());
        set(DISPATCH_ARGS, r.dispatchStruct, "topkIdx", topkIdx.address());
        set(DISPATCH_ARGS, r.dispatchStruct, "topkWeights", topkWeights.address());
        set(DISPATCH_ARGS, r.dispatchStruct, "numTokens", tokens);
        r.dispatchArgs.setStruct(1, r.dispatchStruct);
        r.dispatch.launch(stream, exchangeLaunch, r.dispatchArgs);
    }

    /** The combine exchange of the last dispatch on {@code stream}; {@code weights} null: unweighted. */
    void combine(int localIndex, DeviceBuffer expertOut, DeviceBuffer weights, int tokens, Stream stream) {
        Rank r = ranks.get(localIndex);
        set(COMBINE_ARGS, r.combineStruct, "expertOut", expertOut.address());
        set(COMBINE_ARGS, r.combineStruct, "weights", weights == null ? 0 : weights.address());
        set(COMBINE_ARGS, r.combineStruct, "y", r.b.y().address());
        set(COMBINE_ARGS, r.combineStruct, "expertOutRows", expertOut.byteSize() / (2L * cfg.hidden()));
        set(COMBINE_ARGS, r.combineStruct, "numTokens", tokens);
        r.combineArgs.setStruct(1, r.combineStruct);
        r.combine.launch(stream, exchangeLaunch, r.combineArgs);
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
