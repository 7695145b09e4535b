package dev.gin4j.moe;

import dev.gin4j.internal.comm.Groups;
import dev.gin4j.internal.gpu.Checks;
import dev.gin4j.comm.Backend;
import dev.gin4j.bindings.moe.MoeDims;
import dev.gin4j.bindings.moe.MoeFp8QuantizeArgs;
import dev.gin4j.bindings.moe.MoeGinCombineArgs;
import dev.gin4j.bindings.moe.MoeGinDispatchArgs;
import dev.gin4j.bindings.moe.MoeGinRowValuesArgs;
import dev.gin4j.bindings.moe.MoeHostCombineArgs;
import dev.gin4j.bindings.moe.MoeHostLayoutArgs;
import dev.gin4j.bindings.moe.MoeHostPackArgs;
import dev.gin4j.bindings.moe.MoeHostPermuteArgs;
import dev.gin4j.bindings.moe.MoeHostRowValuesArgs;
import dev.gin4j.bindings.moe.MoeHostUnpermuteArgs;
import dev.gin4j.bindings.moe.MoeLayoutInfo;
import dev.gin4j.bindings.moe.MoeQueryArgs;
import dev.gin4j.bindings.moe.moe_h;
import dev.gin4j.comm.DType;
import dev.gin4j.comm.CommException;
import dev.gin4j.comm.CommGroup;
import dev.gin4j.comm.Communicator;
import dev.gin4j.comm.ErrorCheck;
import dev.gin4j.internal.comm.KernelErrors;
import dev.gin4j.internal.comm.PeerTable;
import dev.gin4j.internal.comm.SymmetricWindow;
import dev.gin4j.internal.comm.WindowLayout;
import dev.gin4j.gpu.CodeObject;
import dev.gin4j.gpu.Device;
import dev.gin4j.gpu.DeviceBuffer;
import dev.gin4j.gpu.Event;
import dev.gin4j.gpu.Kernel;
import dev.gin4j.gpu.KernelArgs;
import dev.gin4j.internal.gpu.KernelLibrary;
import dev.gin4j.internal.moe.MoeReports;
import dev.gin4j.internal.moe.ShapedEntries;
import dev.gin4j.gpu.LaunchConfig;
import dev.gin4j.gpu.NativeResource;
import dev.gin4j.gpu.PinnedBuffer;
import dev.gin4j.gpu.Stream;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.List;
import java.util.Optional;
import java.util.function.Function;

/**
 * MoE dispatch and combine over the ranks of a {@link CommGroup}: experts split evenly, top-k
 * routing, bf16 rows or scaled fp8 rows ({@link Fp8Rows}; {@link MoeConfig#fp8}, or
 * {@link MoeConfig#fp8FromBf16} to have the dispatch quantize bf16 x itself) for the dispatch,
 * bf16 for the combine. {@code dispatch(x[T][H], topkIdx[T][K] int32, topkWeights[T][K] f32)} sends
 * each token once to every rank holding one of its experts and lays the rows out expert-major
 * there; {@code combine(expertOut)} returns {@code y[t] = sum_k w[t][k] * out(t, expert_k)}
 * (fp32 accumulation) to the token's own rank, {@code combineUnweighted} the sum without the weights.
 * <p>{@code topkIdx[t][k]}: an expert id in {@code [0, experts)}, or -1 for a masked slot (skipped,
 * and 0 in what comes back for it). An id out of range or repeated within a token is masked too and
 * reported by {@link #checkErrors}.
 * <p>Training: the same routing lays the rows out the same way every time, so the backward of
 * combine is a dispatch of dy (each expert row receives dy of its token; multiply by the handle's
 * weights for d out), the backward of dispatch is {@code combineUnweighted} of the rows'
 * gradients (dx), and {@code returnRowValues} brings each row's {@code <dy, out>} back as the
 * router weights' gradient. The rows of a dispatch live until the next one: keep a copy of what
 * the expert backward needs.
 * <p>The dispatch reads x, topkIdx and topkWeights in stream order and keeps what the combine and
 * {@code returnRowValues} need (HOST copies the routing): once it is queued, the caller may
 * overwrite them on the same stream, with the next layer's routing say. A handle works only with
 * the instance that made it, until that rank's next dispatch. Buffers must be aligned to their
 * element (2 bytes for rows, 4 for ids, weights and row values).
 * <p>{@link Backend#GIN}: one kernel each way; counts are computed and exchanged on the device,
 * rows are stored into the peers' symmetric windows, no host synchronization, capturable in a
 * graph. {@link Backend#HOST}: the TorchTitan-style baseline (count all-to-all, counts to the host,
 * grouped ncclSend/ncclRecv of one row per (token, expert), permute), with identical layouts.
 * The GIN kernels run on 2 x {@link #channels()} SMs ({@link MoeConfig#withChannels}: fewer leave
 * SMs to compute on other streams). {@link #create} compares every rank's {@link MoeConfig} and
 * refuses, naming the rank, where one differs.
 * Kernels and layouts: gin-kernels/src/moe_gin.cu (GIN), moe_host.cu (HOST), their phases in
 * gin-kernels/src/moe/, and docs/kernels.md; every kernel takes one argument struct of
 * gin-kernels/abi/moe.h, filled here by field name through its generated layout
 * ({@code dev.gin4j.bindings.moe}).
 */
public final class MoeAllToAll extends NativeResource {
    static {  // gin4j's reports reach what the instance runs through MoeReports, not through the exported class
        MoeReports.install(new MoeReports.Reports() {
            @Override public ShapedEntries.Source entrySource(MoeAllToAll moe) { return moe.entrySource(); }
            @Override public String dispatchKernelName(MoeAllToAll moe) { return moe.dispatchKernelName(); }
        });
    }

    private static final int THREADS = 512;

    private final CommGroup group;
    private final MoeConfig cfg;
    private final int nRanks, localExperts, channels;
    // GIN dispatch / combine: 2 x channels blocks, programmatic dependent launch (the kernels wait
    // for prior grids before anything else, so they may start while the previous kernel drains)
    private final LaunchConfig ginLaunch;
    private final MemorySegment info;           // MoeLayoutInfo of moe_query_layout (host copy)
    private static final System.Logger LOG = System.getLogger("dev.gin4j");
    // set by entryPoint / RankState.entry while the ranks are created (the same for every rank)
    private volatile ShapedEntries.Source entrySource = ShapedEntries.Source.GENERIC;
    private final Arena arena = Arena.ofShared();
    private final SymmetricWindow window;       // GIN only
    private final PeerTable peers;              // GIN inside one node only
    private final MoeNetwork network;           // GIN across nodes only (some peer outside the LSA team)
    private final boolean acrossNodes;          // set before the ranks' state: the LSA entries are then not loaded
    private volatile NetworkMode networkMode = NetworkMode.AUTO;  // across nodes: the next dispatches' mode
    private final List<RankState> ranks = new ArrayList<>();
    private volatile boolean expertOffsets, hostCounts;  // off by default: each costs a launch or a copy per dispatch

    /** Per local rank: kernels, argument structs, buffers. */
    private final class RankState {
        final Communicator comm;
        final Device device;
        final int warpSize;  // 32 on NVIDIA, 64 on AMD CDNA: the HOST kernels' grids count warps of it
        final CodeObject code;
        final DeviceBuffer workspace, recvX, recvWeights, recvCounts, y;
        // 1.0f per received row (GIN) or per (token, k) (HOST): the weights of combineUnweighted
        final DeviceBuffer unitWeights;
        final KernelErrors errors;
        final Kernel dispatch, combine, layout, pack, permute, unpermute, hostCombine, quantize;
        // one argument struct per kernel (abi/moe.h): dims, workspace and error word set here, the rest per call
        final KernelArgs dispatchArgs, combineArgs, layoutArgs, packArgs, permuteArgs, unpermuteArgs, hostCombineArgs, quantizeArgs;
        // returnRowValues: GIN, one kernel (moe_gin_row_values); HOST, 4-byte rows back the way the
        // rows came (valuesSend, valuesRecv), then moe_host_row_values_in; both, [maxTokens][topK] f32 out
        final Kernel values;
        final KernelArgs valuesArgs;
        final DeviceBuffer valuesSend, valuesRecv, tokenValues;
        // fp8 from bf16 (cfg.quantizes()): the fp8 rows of x, [maxTokens][dispatchRowBytes], written
        // by the GIN dispatch itself, or by moe_fp8_quantize before the HOST pack
        final DeviceBuffer xq;
        // HOST backend buffers
        DeviceBuffer sendRows, sendWeights, recvBuf, recvBufWeights, countMatrix, backBuf, returned;
        // HOST: the routing of the last dispatch, which the combine and returnRowValues read again;
        // copied, so that the caller may reuse its topkIdx / topkWeights buffers after the dispatch as on GIN
        DeviceBuffer routingIdx, routingWeights;
        long lastSequence;  // dispatches so far on this rank; a handle names the one it came from
        final StagedExchange staged = new StagedExchange();  // a dispatchSend / combineSend not completed yet
        final List<CodeObject> compiledCode = new ArrayList<>();  // shaped entries compiled for this shape (ShapedEntries)
        long[] recvRowsFrom, recvRowOffset, sendRowsTo, sendRowOffset;  // HOST: the last dispatch's row counts
        long expertRowsEnd;  // HOST: one past the last received row in recvX (the rows received, plus the alignment's padding before the last expert)
        // expert offsets (expertOffsets / hostCounts on): moe_expert_offsets of the dispatch's counts into offsets [L + 1]
        final Kernel offsetsKernel;
        final KernelArgs offsetsArgs;
        final DeviceBuffer offsets;
        // hostCounts on: counts [L] then offsets [L + 1] copied here at the end of each dispatch, hostCopied recorded after
        final PinnedBuffer hostCopy;
        Event hostCopied;  // made on the first dispatch that copies; closed with the instance

        /** The GIN entry of {@code base} for this instance (see entryPoint): from the code object, or compiled for the shape. */
        Kernel entry(String base) {
            String name = entryPoint(base, device);
            if (!name.startsWith(shapedPrefix(base))) return code.kernel(name);
            if (KernelLibrary.get().kernels(device.arch(), kernelObject()).contains(name) && ShapedEntries.mode() != ShapedEntries.Mode.JIT) return code.kernel(name);
            entrySource = ShapedEntries.Source.JIT;
            CodeObject compiled = ShapedEntries.load(device, base.endsWith("_fp8"), nRanks, cfg.experts(), cfg.topK(), cfg.hidden());
            compiledCode.add(compiled);  // closed with the instance
            return compiled.kernel(name);
        }

        /** The HOST kernels' launch: one warp (NVIDIA) or wavefront (AMD) per item, 256-thread blocks, at most 4096 of them. */
        LaunchConfig warpLaunch(long warps) {
            int perBlock = 256 / warpSize;
            return LaunchConfig.of((int) Math.max(1, Math.min(4096, (warps + perBlock - 1) / perBlock)), 256);
        }

        RankState(Communicator comm, Stream setup) {
            this.comm = comm;
            this.device = comm.device();
            this.warpSize = device.warpSize();
            this.code = KernelLibrary.load(device, kernelObject());
            try {
                long capRows = MoeLayoutInfo.recvCapacityRows(info), dispatchRow = cfg.dispatchRowBytes(), combineRow = cfg.combineRowBytes();
                workspace = device.allocate(MoeLayoutInfo.workspaceBytes(info), arena);
                workspace.fill((byte) 0, setup);
                recvX = device.allocate(capRows * dispatchRow, arena);
                recvWeights = device.allocate(capRows * 4, arena);
                recvCounts = device.allocate(4L * localExperts, arena);
                y = device.allocate((long) cfg.maxTokens() * combineRow, arena);
                unitWeights = device.allocate(4L * Math.max(capRows, (long) cfg.maxTokens() * cfg.topK()), arena);
                unitWeights.fill32(Float.floatToRawIntBits(1f), setup);
                errors = new KernelErrors(device, arena, setup);
                boolean isFp8 = cfg.dtype() == DType.FP8_E4M3;
                String fp8 = isFp8 ? "_fp8" : "";  // the fp8 dispatch entries; the combine is bf16
                // only this backend's kernels: each lookup asks the runtime for the parameters' sizes
                boolean gin = cfg.backend() == Backend.GIN;
                dispatch = gin && !acrossNodes ? entry("moe_gin_dispatch" + fp8) : null;  // across nodes: MoeNetwork's kernels
                combine = gin && !acrossNodes ? entry("moe_gin_combine") : null;
                layout = gin ? null : code.kernel("moe_host_layout");
                pack = gin ? null : code.kernel("moe_host_pack" + fp8);
                permute = gin ? null : code.kernel("moe_host_permute" + fp8);
                unpermute = gin ? null : code.kernel("moe_host_unpermute");
                hostCombine = gin ? null : code.kernel("moe_host_combine");
                quantize = cfg.quantizes() && !gin ? code.kernel("moe_fp8_quantize") : null;  // the GIN dispatch quantizes itself
                quantizeArgs = KernelArgs.ofStruct(arena, MoeFp8QuantizeArgs.layout());
                xq = cfg.quantizes() ? device.allocate((long) cfg.maxTokens() * dispatchRow, arena) : null;
                dispatchArgs = KernelArgs.ofStruct(arena, MoeGinDispatchArgs.layout());
                setDims(MoeGinDispatchArgs.dims(dispatchArgs.struct()), cfg.hidden());
                // the fp8 entries read xq (null: x holds fp8 rows already); the bf16 entries ignore it
                dispatchArgs.setPointerField(MoeGinDispatchArgs.workspace$offset(), workspace).setPointerField(MoeGinDispatchArgs.errorFlags$offset(), errors.buffer())
                        .setPointerField(MoeGinDispatchArgs.xq$offset(), xq);
                combineArgs = KernelArgs.ofStruct(arena, MoeGinCombineArgs.layout());
                setDims(MoeGinCombineArgs.dims(combineArgs.struct()), cfg.hidden());
                combineArgs.setPointerField(MoeGinCombineArgs.workspace$offset(), workspace).setPointerField(MoeGinCombineArgs.errorFlags$offset(), errors.buffer());
                layoutArgs = KernelArgs.ofStruct(arena, MoeHostLayoutArgs.layout());
                setDims(MoeHostLayoutArgs.dims(layoutArgs.struct()), cfg.hidden());
                layoutArgs.setPointerField(MoeHostLayoutArgs.workspace$offset(), workspace).setPointerField(MoeHostLayoutArgs.errorFlags$offset(), errors.buffer());
                packArgs = KernelArgs.ofStruct(arena, MoeHostPackArgs.layout());
                setDims(MoeHostPackArgs.dims(packArgs.struct()), cfg.hidden());
                packArgs.setPointerField(MoeHostPackArgs.workspace$offset(), workspace).setPointerField(MoeHostPackArgs.errorFlags$offset(), errors.buffer());
                permuteArgs = KernelArgs.ofStruct(arena, MoeHostPermuteArgs.layout());
                setDims(MoeHostPermuteArgs.dims(permuteArgs.struct()), cfg.hidden());
                permuteArgs.setPointerField(MoeHostPermuteArgs.errorFlags$offset(), errors.buffer());
                unpermuteArgs = KernelArgs.ofStruct(arena, MoeHostUnpermuteArgs.layout());  // dims.hidden per call: rows or 4-byte values
                setDims(MoeHostUnpermuteArgs.dims(unpermuteArgs.struct()), cfg.hidden());
                unpermuteArgs.setPointerField(MoeHostUnpermuteArgs.errorFlags$offset(), errors.buffer());
                hostCombineArgs = KernelArgs.ofStruct(arena, MoeHostCombineArgs.layout());
                setDims(MoeHostCombineArgs.dims(hostCombineArgs.struct()), cfg.hidden());
                hostCombineArgs.setPointerField(MoeHostCombineArgs.workspace$offset(), workspace).setPointerField(MoeHostCombineArgs.errorFlags$offset(), errors.buffer());
                tokenValues = device.allocate(4L * cfg.maxTokens() * cfg.topK(), arena);
                offsetsKernel = code.kernel("moe_expert_offsets");
                offsets = device.allocate(4L * (localExperts + 1), arena);
                offsetsArgs = KernelArgs.of(arena, KernelArgs.Type.POINTER, KernelArgs.Type.POINTER, KernelArgs.Type.I32, KernelArgs.Type.I32, KernelArgs.Type.POINTER)
                        .setPointer(1, offsets).setInt(2, localExperts).setInt(3, cfg.expertAlignment()).setPointer(4, errors.buffer());
                hostCopy = device.allocatePinned(4L * (2L * localExperts + 1), arena);
                if (cfg.backend() == Backend.GIN) {
                    values = code.kernel("moe_gin_row_values");
                    valuesArgs = KernelArgs.ofStruct(arena, MoeGinRowValuesArgs.layout());
                    setDims(MoeGinRowValuesArgs.dims(valuesArgs.struct()), cfg.hidden());
                    valuesArgs.setPointerField(MoeGinRowValuesArgs.workspace$offset(), workspace).setPointerField(MoeGinRowValuesArgs.errorFlags$offset(), errors.buffer())
                            .setPointerField(MoeGinRowValuesArgs.g$offset(), tokenValues);
                    valuesSend = null;
                    valuesRecv = null;
                } else {
                    values = code.kernel("moe_host_row_values_in");
                    valuesArgs = KernelArgs.ofStruct(arena, MoeHostRowValuesArgs.layout());
                    setDims(MoeHostRowValuesArgs.dims(valuesArgs.struct()), cfg.hidden());
                    valuesArgs.setPointerField(MoeHostRowValuesArgs.workspace$offset(), workspace).setPointerField(MoeHostRowValuesArgs.errorFlags$offset(), errors.buffer())
                            .setPointerField(MoeHostRowValuesArgs.g$offset(), tokenValues);
                    valuesSend = device.allocate(4L * capRows, arena);
                    valuesRecv = device.allocate(4L * MoeLayoutInfo.sendCapacityRows(info), arena);
                }
                if (cfg.backend() == Backend.HOST) {
                    long sendRowsCap = MoeLayoutInfo.sendCapacityRows(info);
                    sendRows = device.allocate(sendRowsCap * dispatchRow, arena);
                    sendWeights = device.allocate(sendRowsCap * 4, arena);
                    recvBuf = device.allocate(capRows * dispatchRow, arena);
                    recvBufWeights = device.allocate(capRows * 4, arena);
                    countMatrix = device.allocate(4L * nRanks * localExperts, arena);
                    backBuf = device.allocate(capRows * combineRow, arena);
                    returned = device.allocate(sendRowsCap * combineRow, arena);
                    routingIdx = device.allocate(4L * cfg.maxTokens() * cfg.topK(), arena);
                    routingWeights = device.allocate(4L * cfg.maxTokens() * cfg.topK(), arena);
                }
            } catch (RuntimeException e) {
                code.close();  // the buffers go with the instance's arena; this state never joins ranks
                compiledCode.forEach(CodeObject::close);
                throw e;
            }
        }

        /** An argument struct's MoeDims: this rank and the instance's shape, with {@code hidden} elements per row. */
        void setDims(MemorySegment dims, int hidden) {
            MoeDims.rank(dims, comm.rank());
            MoeDims.nRanks(dims, nRanks);
            MoeDims.numExperts(dims, cfg.experts());
            MoeDims.topK(dims, cfg.topK());
            MoeDims.hidden(dims, hidden);
            MoeDims.maxTokens(dims, cfg.maxTokens());
            MoeDims.numChannels(dims, channels);
            MoeDims.expertAlignment(dims, cfg.expertAlignment());
        }
    }

    private MoeAllToAll(CommGroup group, MoeConfig cfg) {
        this.group = group;
        this.cfg = cfg;
        try {
            this.nRanks = group.worldSize();
            this.channels = agreeOnSetup(group, cfg);  // first: a rank with another configuration must not fail alone below
            if (cfg.experts() % nRanks != 0) {
                throw new IllegalArgumentException(cfg.experts() + " experts do not split evenly over " + nRanks + " ranks");
            }
            this.localExperts = cfg.experts() / nRanks;
            this.ginLaunch = LaunchConfig.of(2 * channels, THREADS).asProgrammaticDependent();
            // the window below is collective: a rank that cannot load the kernels must not leave the others waiting in it
            this.info = Groups.failTogether(group, "loading the MoE kernels", () -> {
                MemorySegment q = queryLayout(group.rank(0).device());
                if (MoeLayoutInfo.windowBytes(q) == 0) {
                    throw new IllegalArgumentException("the MoE kernels refuse this shape (ranks " + nRanks + ", experts " + cfg.experts() + ", topK " + cfg.topK()
                            + ", hidden " + cfg.hidden() + ", maxTokens " + cfg.maxTokens() + "): see the limits in docs/kernels.md (at most 16 ranks, 2048 experts, top-32; maxTokens x topK,"
                            + " maxTokens x ranks and the receive capacity in rows below 2^31)");
                }
                return q;
            });
            this.acrossNodes = cfg.backend() == Backend.GIN && PeerTable.someoneUnreachable(group);  // the same on every rank: from the group's shared host table
            if (acrossNodes)  // a refusal on one rank is every rank's, before the collectives below
                Groups.failTogether(group, "checking the cross-node MoE kernels", () -> KernelLibrary.get().abiMismatch("MOE_NET_ABI_VERSION", MoeNetwork.ABI_VERSION)
                        .ifPresent(m -> { throw new IllegalStateException(m); }));
            this.window = cfg.backend() == Backend.GIN && !acrossNodes
                    ? SymmetricWindow.allocate(group, WindowLayout.builder().region("moe", MoeLayoutInfo.windowBytes(info), 4096).build()) : null;
            // every rank's window is zero before any rank can signal into it, and a rank whose setup
            // failed must not leave the others waiting here (its close below deregisters collectively)
            this.peers = Groups.failTogether(group, "setting up the MoE exchange's kernels and buffers", () -> {
                PeerTable peerTable = window == null ? null : PeerTable.resolve(window, arena);
                if (peerTable != null && !peerTable.allReachable()) throw new CommException("the GIN MoE exchange needs every rank load/store reachable (one node; " + peerTable.unreachable() + "); use Backend.HOST");
                for (Communicator c : group.ranks()) {
                    try (Stream s = c.device().createStream()) {
                        ranks.add(new RankState(c, s));
                        // the whole window, not only the flags: count tables and LL128 lines outside the
                        // flag area carry call-number tags, which stale bytes at a reused address could match
                        if (window != null) window.region(c.localIndex(), "moe").fill((byte) 0, s);
                        s.synchronize();
                    }
                }
                return peerTable;
            });
            this.network = acrossNodes ? new MoeNetwork(group, cfg, channels, ranks.stream()
                    .map(r -> new MoeNetwork.Buffers(r.workspace, r.xq, r.errors, capacityRows())).toList()) : null;
        } catch (RuntimeException e) {
            close();
            throw e;
        }
    }

    /**
     * Every rank must run the kernels with the same configuration and channel count C (docs/kernels.md:
     * the same C on every rank; the HOST exchange sizes its NCCL calls from the configuration). A
     * mismatch would show only as a kernel time-out or an NCCL hang, so the ranks compare them here.
     * C is the configuration's, or (0) comes from the GPU with the fewest SMs (SMs / 2, at most 128).
     */
    private static int agreeOnSetup(CommGroup group, MoeConfig cfg) {
        long[][] mine = new long[group.localCount()][];
        for (int i = 0; i < mine.length; i++) mine[i] = new long[] {group.rank(i).device().multiprocessors(), packShape(cfg), packTypes(cfg)};
        // every local rank receives the same world-wide view: row 0 serves
        long[] all = group.allGatherLongs(mine)[0];
        int world = all.length / 3;
        long[] allSms = new long[world], allShape = new long[world], allTypes = new long[world];
        for (int r = 0; r < world; r++) { allSms[r] = all[3 * r]; allShape[r] = all[3 * r + 1]; allTypes[r] = all[3 * r + 2]; }
        String mismatch = setupMismatch(allShape, allTypes);
        if (mismatch != null) throw new IllegalArgumentException(mismatch);
        return cfg.channels() > 0 ? cfg.channels() : channelsFor(allSms);
    }

    static long packShape(MoeConfig c) { return (long) c.hidden() << 32 | c.maxTokens(); }

    static long packTypes(MoeConfig c) {
        return (long) c.experts() << 32 | (long) c.channels() << 24 | (long) c.topK() << 16 | c.dtype().ordinal() << 8 | c.backend().ordinal() << 4 | c.input().ordinal();
    }

    private static String describe(long shape, long types) {
        long channels = (types >>> 24) & 0xff;
        return "hidden " + (shape >>> 32) + ", maxTokens " + (int) shape + ", experts " + (types >>> 32) + ", topK " + ((types >>> 16) & 0xff)
                + ", rows " + DType.values()[(int) (types >>> 8) & 0xf] + ", backend " + Backend.values()[(int) (types >>> 4) & 0xf]
                + ", input " + DType.values()[(int) types & 0xf] + ", channels " + (channels == 0 ? "auto" : channels);
    }

    /** Null if every rank's configuration (by rank) equals rank 0's, else what differs. */
    static String setupMismatch(long[] shapeByRank, long[] typesByRank) {
        for (int r = 1; r < shapeByRank.length; r++)
            if (shapeByRank[r] != shapeByRank[0] || typesByRank[r] != typesByRank[0])
                return "every rank must create MoeAllToAll with the same MoeConfig: rank " + r + " has (" + describe(shapeByRank[r], typesByRank[r])
                        + "), rank 0 has (" + describe(shapeByRank[0], typesByRank[0]) + ")";
        return null;
    }

    /** C for the GPUs of every rank: half the SMs of the smallest, 1 to 128. */
    static int channelsFor(long[] smsByRank) {
        long min = Long.MAX_VALUE;
        for (long v : smsByRank) min = Math.min(min, v);
        return (int) Math.max(1, Math.min(128, min / 2));
    }

    /**
     * Collective: every rank creates it with the same configuration (checked: a difference is an error on every rank).
     * @param group the ranks that exchange tokens; it must stay open while the instance is used
     * @param config the shape of the exchange, the same on every rank
     * @return the exchange; close it when done (it frees its window, buffers and kernels)
     * @throws IllegalArgumentException for a null argument, configurations that differ between ranks, experts that do not
     *         split evenly over the ranks, or a shape the kernels refuse
     * @throws CommException on the other ranks where one rank's part of the setup failed (naming it)
     */
    public static MoeAllToAll create(CommGroup group, MoeConfig config) {
        if (group == null || config == null) throw new IllegalArgumentException("a communicator group and a MoeConfig must be given, got " + group + " / " + config);
        group.ensureOpen();
        MoeAllToAll moe = new MoeAllToAll(group, config);
        System.getLogger("dev.gin4j").log(System.Logger.Level.DEBUG, () -> "MoE exchange over " + group.describe() + ": " + config
                + ", " + moe.channels + " channels, dispatch kernel " + moe.dispatchKernelName());
        return moe;
    }

    /** The code object of this instance's backend: each has its kernels and moe_query_layout. */
    private String kernelObject() { return cfg.backend() == Backend.GIN ? "moe_gin" : "moe_host"; }

    /** moe_query_layout's MoeLayoutInfo for this instance's shape, copied to the host (all zero: the kernels refuse the shape). */
    private MemorySegment queryLayout(Device d) {
        try (Arena a = Arena.ofConfined(); Stream s = d.createStream(); CodeObject code = KernelLibrary.load(d, kernelObject())) {
            DeviceBuffer out = d.allocate(MoeLayoutInfo.sizeof(), a);
            KernelArgs args = KernelArgs.ofStruct(a, MoeQueryArgs.layout());
            MemorySegment dims = MoeQueryArgs.dims(args.struct());
            MoeDims.nRanks(dims, nRanks);
            MoeDims.numExperts(dims, cfg.experts());
            MoeDims.topK(dims, cfg.topK());
            MoeDims.hidden(dims, cfg.hidden());
            MoeDims.maxTokens(dims, cfg.maxTokens());
            MoeDims.numChannels(dims, channels);
            MoeDims.expertAlignment(dims, cfg.expertAlignment());
            args.setPointerField(MoeQueryArgs.out$offset(), out);
            code.kernel("moe_query_layout").launch(s, LaunchConfig.of(1, 1), args);
            s.synchronize();
            MemorySegment q = arena.allocate(MoeLayoutInfo.layout());
            MemorySegment.copy(MemorySegment.ofArray(out.toByteArray()), 0, q, 0, MoeLayoutInfo.sizeof());
            long version = MoeLayoutInfo.version(q);
            if (MoeLayoutInfo.windowBytes(q) != 0 && version != moe_h.MOE_ABI_VERSION())
                throw new IllegalStateException("the MoE kernels report ABI version " + version + ", this library knows " + moe_h.MOE_ABI_VERSION()
                        + ": the code objects and the jar come from different builds");
            return q;
        }
    }

    /**
     * The most specific GIN entry point of {@code base} the code object has for this instance: on the
     * token path, the one compiled for this shape ({@code base_tp_r<R>_e<E>_k<K>_h<H>}, sizes as
     * constants), else at one rank {@code base_tp_r1}, else {@code base_tp}; otherwise, or where the
     * manifest lists none of them, {@code base} (docs/kernels.md, "Entry points"). At one rank the
     * combine is {@code moe_gin_combine_tp_r1} even beside a shaped dispatch (AUTO): it measured
     * faster than the shaped one-rank combine (docs/performance.md).
     */
    private String entryPoint(String base, Device device) {
        if (MoeLayoutInfo.tokenPath(info) != 1) return base;
        List<String> shipped = KernelLibrary.get().kernels(device.arch(), kernelObject());
        String shaped = shapedPrefix(base) + nRanks + "_e" + cfg.experts() + "_k" + cfg.topK() + "_h" + cfg.hidden();
        ShapedEntries.Mode mode = ShapedEntries.mode();
        // entrySource stays the dispatch's: the combine is chosen after it
        if (nRanks == 1 && mode == ShapedEntries.Mode.AUTO && base.equals("moe_gin_combine") && shipped.contains(base + "_tp_r1")) return base + "_tp_r1";
        if (mode != ShapedEntries.Mode.GENERIC) {
            if (mode == ShapedEntries.Mode.AUTO && shipped.contains(shaped)) { entrySource = ShapedEntries.Source.PRECOMPILED; return shaped; }
            Optional<String> why = ShapedEntries.unavailable(device.arch());
            if (why.isEmpty()) return shaped;  // compiled for this shape (RankState.entry), also at one rank
            if (mode == ShapedEntries.Mode.JIT) throw new IllegalStateException("GIN4J_MOE_ENTRIES=jit: " + why.get());
            LOG.log(System.Logger.Level.DEBUG, () -> "moe: no " + shaped + " precompiled; " + why.get());
        }
        entrySource = ShapedEntries.Source.GENERIC;
        if (nRanks == 1 && shipped.contains(base + "_tp_r1")) return base + "_tp_r1";  // one rank, any shape
        return shipped.contains(base + "_tp") ? base + "_tp" : base;
    }

    private static String shapedPrefix(String base) { return base + "_tp_r"; }

    /** Where this instance's GIN token-path entries come from (precompiled, compiled at run time, generic); GENERIC off the token path and on HOST. */
    ShapedEntries.Source entrySource() { return entrySource; }

    /**
     * {@link NetworkMode#AUTO} picks {@link NetworkMode#HIGH_THROUGHPUT} from this {@code maxTokens}
     * on, where some node has two or more ranks.
     */
    public static final int AUTO_HIGH_THROUGHPUT_TOKENS = 256;

    /**
     * How the following dispatches (and each one's combine) move rows between nodes, for a GIN
     * instance whose ranks span nodes; inside one node, and for HOST, there is one path and the
     * setting changes nothing. Every rank must make the same choice for the same call (a mismatch
     * shows as a kernel time-out). May change between any two dispatches, without a reset; a combine
     * always runs in the mode of the dispatch it reverses.
     * @param mode AUTO, LOW_LATENCY or HIGH_THROUGHPUT
     * @return this instance
     * @throws IllegalArgumentException for a null mode
     * @throws IllegalStateException for HIGH_THROUGHPUT on a node table whose HT grids would exceed 256 blocks (very unequal nodes)
     */
    public MoeAllToAll networkMode(NetworkMode mode) {
        if (mode == null) throw new IllegalArgumentException("networkMode must be AUTO, LOW_LATENCY or HIGH_THROUGHPUT, got null");
        if (network != null) network.resolve(mode);  // a node table the HT kernels cannot serve is refused here, with the reason
        this.networkMode = mode;
        return this;
    }

    /** {@return the mode the next dispatch uses as set ({@link NetworkMode#AUTO} by default)} */
    public NetworkMode networkMode() { return networkMode; }

    /**
     * The mode the next dispatch runs in: {@link #networkMode()} with AUTO resolved, across nodes;
     * {@code null} where there is no exchange across nodes (one node, or HOST).
     * @return LOW_LATENCY or HIGH_THROUGHPUT, or null inside one node and for HOST
     */
    public NetworkMode effectiveNetworkMode() { return network == null ? null : network.resolve(networkMode); }

    /** The dispatch kernel this instance launches, or for HOST "host kernels + NCCL" (for reports). */
    String dispatchKernelName() {
        if (network != null) return network.dispatchKernelName(networkMode);
        return cfg.backend() == Backend.GIN ? ranks.getFirst().dispatch.name() : "host kernels + NCCL";
    }

    /** The combine kernel of a GIN instance inside one node, else null (for tests). */
    String combineKernelName() {
        return network == null && cfg.backend() == Backend.GIN ? ranks.getFirst().combine.name() : null;
    }

    /** {@return the configuration it was created with} */
    public MoeConfig config() { return cfg; }
    /** {@return C: the GIN kernels run 2C blocks (one per SM); {@link MoeConfig#channels()}, or half the SMs of the smallest GPU} */
    public int channels() { return channels; }
    /** {@return the experts on each rank: experts / ranks} */
    public int localExperts() { return localExperts; }
    /** {@return the rows the receive buffers hold: ranks x maxTokens x min(topK, localExperts), plus localExperts x (expertAlignment - 1)} */
    public long capacityRows() { return MoeLayoutInfo.recvCapacityRows(info); }

    /**
     * From the next dispatch on, whether each dispatch also leaves {@link MoeDispatch#offsets()}:
     * int32 {@code [L + 1]}, where each local expert's rows start in the received rows (exclusive
     * prefix of the counts; the last entry is the number of rows received), for a grouped GEMM's
     * group offsets. One single-block kernel on the dispatch's stream after the dispatch, on every
     * backend: no host wait, captured with the dispatch. Off by default (a launch per dispatch).
     * Local to this process: ranks may choose differently.
     * @param on whether dispatches compute the offsets
     * @return this instance
     */
    public MoeAllToAll expertOffsets(boolean on) {
        ensureOpen();
        expertOffsets = on;
        return this;
    }

    /**
     * From the next dispatch on, whether each dispatch also copies its counts and offsets into
     * pinned host memory, stream-ordered at its end, and records an event after the copy: then
     * {@link MoeDispatch#hostCounts()} and {@link MoeDispatch#hostOffsets()} read them on the host
     * once that event has completed (they wait for it; {@link MoeDispatch#hostCountsReady()} asks
     * without waiting). These are the per-call statistics: rows received per local expert, and
     * their total ({@code hostOffsets()[L]}). Implies {@link #expertOffsets(boolean)}. Refused on a
     * stream that captures a graph. Off by default (two small copies and an event per dispatch).
     * Local to this process: ranks may choose differently.
     * @param on whether dispatches copy their counts to the host
     * @return this instance
     */
    public MoeAllToAll hostCounts(boolean on) {
        ensureOpen();
        hostCounts = on;
        return this;
    }

    /** The last dispatch number of local rank {@code localIndex}, for handles that read results later. */
    long lastSequence(int localIndex) { return ranks.get(localIndex).lastSequence; }

    private static void requireAligned(RankState r, DeviceBuffer b, int bytes, String what) {
        if (b.address() % bytes != 0)
            throw new IllegalArgumentException(r.comm + ": " + what + " must be " + bytes + "-byte aligned, its address is 0x" + Long.toHexString(b.address()));
    }

    /** A rank's dispatch results: the caller's buffers where given ({@link MoeOutputs}), else the instance's. */
    private record Results(DeviceBuffer rows, DeviceBuffer weights, DeviceBuffer counts) {}

    private Results results(RankState r, MoeOutputs o) {
        return new Results(o.rows() != null ? o.rows() : r.recvX, o.weights() != null ? o.weights() : r.recvWeights,
                o.counts() != null ? o.counts() : r.recvCounts);
    }

    /**
     * The caller's output buffers of one rank's dispatch: size, alignment, device, and no overlap
     * with each other or with the inputs (the dispatch reads x, topkIdx, topkWeights while it writes them).
     */
    private void checkOutputs(RankState r, MoeOutputs o, DeviceBuffer x, DeviceBuffer idx, DeviceBuffer w) {
        if (o == null) throw new IllegalArgumentException(r.comm + ": outputs must be given (MoeOutputs.INSTANCE_OWNED for the instance's buffers), got null");
        long cap = capacityRows(), rowBytes = cfg.dispatchRowBytes();
        int rowAlign = cfg.dtype() == DType.FP8_E4M3 ? 16 : 2;
        String rowsWhat = cfg.dtype() == DType.FP8_E4M3 ? "[" + cap + "] scaled fp8 rows of " + rowBytes + " bytes" : "[" + cap + "][" + cfg.hidden() + "] bf16";
        checkOutput(r, o.rows(), "outputs.rows", cap * rowBytes, rowAlign, "capacity rows " + rowsWhat);
        checkOutput(r, o.weights(), "outputs.weights", 4 * cap, 4, "[" + cap + "] f32 (capacity rows)");
        checkOutput(r, o.counts(), "outputs.counts", 4L * localExperts, 4, "[" + localExperts + "] int32 (local experts)");
        DeviceBuffer[] outs = {o.rows(), o.weights(), o.counts()};
        String[] outNames = {"outputs.rows", "outputs.weights", "outputs.counts"};
        DeviceBuffer[] ins = {x, idx, w};
        String[] inNames = {"x", "topkIdx", "topkWeights"};
        for (int i = 0; i < outs.length; i++) {
            if (outs[i] == null) continue;
            for (int j = i + 1; j < outs.length; j++)
                if (outs[j] != null && outs[i].overlaps(outs[j]))
                    throw new IllegalArgumentException(r.comm + ": " + outNames[i] + " overlaps " + outNames[j] + ": the dispatch writes both; give each its own memory");
            for (int j = 0; j < ins.length; j++) Checks.requireDisjoint(r.comm, inNames[j], ins[j], outs[i], outNames[i]);
        }
    }

    private static void checkOutput(RankState r, DeviceBuffer b, String what, long need, int align, String shape) {
        if (b == null) return;
        if (b.byteSize() < need) throw new IllegalArgumentException(r.comm + ": " + what + " has " + b.byteSize() + " bytes; " + shape + " needs " + need);
        requireAligned(r, b, align, what);
        if (b.device() != r.device) throw new IllegalArgumentException(r.comm + ": " + what + " is on " + b.device() + ", expected " + r.device);
    }

    private void checkInputs(RankState r, DeviceBuffer x, DeviceBuffer idx, DeviceBuffer w, int tokens, Stream stream) {
        ensureOpen();
        group.ensureOpen();  // the kernels store through the peer mappings that went with its communicators
        r.staged.requireNone(r.comm.toString(), "a dispatch");
        if (tokens < 0 || tokens > cfg.maxTokens()) throw new IllegalArgumentException(r.comm + ": T = " + tokens + " tokens is outside [0, maxTokens = " + cfg.maxTokens() + "]");
        long needX = (long) tokens * cfg.inputRowBytes(), needK = 4L * tokens * cfg.topK();
        if (x.byteSize() < needX) {
            String rows = cfg.input() == DType.FP8_E4M3 ? tokens + " scaled fp8 rows of " + cfg.inputRowBytes() + " bytes (Fp8Rows)" : "[" + tokens + "][" + cfg.hidden() + "] bf16";
            throw new IllegalArgumentException(r.comm + ": x has " + x.byteSize() + " bytes; " + rows + " needs " + needX);
        }
        if (cfg.quantizes() && x.address() % 16 != 0)
            throw new IllegalArgumentException(r.comm + ": x must be 16-byte aligned for the quantizing fp8 dispatch, its address is 0x" + Long.toHexString(x.address()));
        requireAligned(r, x, 2, "x");  // the row movers copy 2-byte units at the least
        requireAligned(r, idx, 4, "topkIdx (int32)");
        requireAligned(r, w, 4, "topkWeights (f32)");
        if (idx.byteSize() < needK) throw new IllegalArgumentException(r.comm + ": topkIdx has " + idx.byteSize() + " bytes; [" + tokens + "][" + cfg.topK() + "] int32 needs " + needK);
        if (w.byteSize() < needK) throw new IllegalArgumentException(r.comm + ": topkWeights has " + w.byteSize() + " bytes; [" + tokens + "][" + cfg.topK() + "] f32 needs " + needK);
        if (x.device() != r.device) throw new IllegalArgumentException("x of " + r.comm + " is on " + x.device());
        if (idx.device() != r.device) throw new IllegalArgumentException("topkIdx of " + r.comm + " is on " + idx.device());
        if (w.device() != r.device) throw new IllegalArgumentException("topkWeights of " + r.comm + " is on " + w.device());
        if (stream.device() != r.device) throw new IllegalArgumentException("stream of " + r.comm + " is on " + stream.device());
        requireDisjointFromDispatchResults(r, x, "x");
        requireDisjointFromDispatchResults(r, idx, "topkIdx");
        requireDisjointFromDispatchResults(r, w, "topkWeights");
    }

    /** An input the dispatch would read while writing its results (an earlier dispatch's, fed back): refused, not corrupted. */
    private static void requireDisjointFromDispatchResults(RankState r, DeviceBuffer in, String what) {
        Checks.requireDisjoint(r.comm, what, in, r.recvX, "this instance's received rows");
        Checks.requireDisjoint(r.comm, what, in, r.recvWeights, "this instance's received weights");
        Checks.requireDisjoint(r.comm, what, in, r.recvCounts, "this instance's per-expert counts");
    }

    /**
     * One local rank ({@code localIndex} in {@code [0, localCount)}): queues the dispatch on
     * {@code stream} and returns where its results will be. Every rank must dispatch (a
     * collective); T may differ per rank. HOST with several local ranks takes the list form.
     * @param localIndex the local rank, in [0, localCount)
     * @param x the tokens: {@code tokens} rows of {@link MoeConfig#inputRowBytes()} bytes (bf16 {@code [T][hidden]}, or scaled fp8
     *        rows), on the rank's device; 16-byte aligned for a quantizing fp8 dispatch, else 2-byte
     * @param topkIdx int32 {@code [T][topK]} expert ids, -1 for a masked slot
     * @param topkWeights f32 {@code [T][topK]} router weights
     * @param tokens T, in [0, maxTokens]; may differ per rank
     * @param stream the stream the call is queued on, on the rank's device
     * @return the handle: where the results are once the stream gets there, valid until the rank's next dispatch
     * @throws IllegalArgumentException for T outside [0, maxTokens], or a buffer or stream that is too small, misaligned, on
     *         another device, or overlapping the instance's results
     * @throws IllegalStateException while a dispatchSend or combineSend on the rank is not completed, for HOST with several
     *         local ranks (use the list form), or on a stream that captures a graph for HOST or with {@link #hostCounts(boolean)} on
     * @throws IndexOutOfBoundsException for a local rank index outside [0, localCount)
     */
    public MoeDispatch dispatch(int localIndex, DeviceBuffer x, DeviceBuffer topkIdx, DeviceBuffer topkWeights, int tokens, Stream stream) {
        return dispatch(localIndex, x, topkIdx, topkWeights, tokens, MoeOutputs.INSTANCE_OWNED, stream);
    }

    /**
     * {@link #dispatch(int, DeviceBuffer, DeviceBuffer, DeviceBuffer, int, Stream)} into the
     * caller's buffers where {@code outputs} names them (see {@link MoeOutputs} for their sizes and
     * alignment); the returned handle's rows, weights and counts are those buffers.
     * @param localIndex the local rank, in [0, localCount)
     * @param x the tokens: {@code tokens} rows of {@link MoeConfig#inputRowBytes()} bytes (bf16 {@code [T][hidden]}, or scaled fp8
     *        rows), on the rank's device; 16-byte aligned for a quantizing fp8 dispatch, else 2-byte
     * @param topkIdx int32 {@code [T][topK]} expert ids, -1 for a masked slot
     * @param topkWeights f32 {@code [T][topK]} router weights
     * @param tokens T, in [0, maxTokens]; may differ per rank
     * @param outputs the caller's result buffers, or {@link MoeOutputs#INSTANCE_OWNED} for the instance's
     * @param stream the stream the call is queued on, on the rank's device
     * @return the handle: where the results are once the stream gets there, valid until the rank's next dispatch
     * @throws IllegalArgumentException for T outside [0, maxTokens], a null outputs, or a buffer or stream that is too small, misaligned, on
     *         another device, or overlapping the instance's results
     * @throws IllegalStateException while a dispatchSend or combineSend on the rank is not completed, for HOST with several
     *         local ranks (use the list form), or on a stream that captures a graph for HOST or with {@link #hostCounts(boolean)} on
     * @throws IndexOutOfBoundsException for a local rank index outside [0, localCount)
     */
    public MoeDispatch dispatch(int localIndex, DeviceBuffer x, DeviceBuffer topkIdx, DeviceBuffer topkWeights, int tokens, MoeOutputs outputs, Stream stream) {
        RankState r = rank(localIndex);
        if (cfg.backend() != Backend.GIN) {
            if (group.localCount() > 1) throw new IllegalStateException("HOST dispatch with several local ranks must be issued for all of them together: use the list form");
            return dispatch(List.of(x), List.of(topkIdx), List.of(topkWeights), new int[] {tokens}, java.util.Collections.singletonList(outputs), List.of(stream)).getFirst();
        }
        checkInputs(r, x, topkIdx, topkWeights, tokens, stream);
        checkOutputs(r, outputs, x, topkIdx, topkWeights);
        return ginDispatch(localIndex, r, x, topkIdx, topkWeights, tokens, results(r, outputs), stream, MoeNetwork.Phase.ALL);
    }

    /**
     * GIN, inputs checked: the dispatch launch. {@code phase} SEND (across nodes only): the sending
     * roles now, the rest and the offsets and host copy at {@link #complete}.
     */
    private MoeDispatch ginDispatch(int localIndex, RankState r, DeviceBuffer x, DeviceBuffer topkIdx, DeviceBuffer topkWeights, int tokens, Results out, Stream stream,
                                    MoeNetwork.Phase phase) {
        boolean offsets = expertOffsets || hostCounts, copy = hostCounts;  // read once: the same for the launch and the handle
        if (copy && stream.isCapturing())
            throw new IllegalStateException(r.comm + ": hostCounts(true) copies the counts to the host at each dispatch, which a graph cannot replay for a "
                    + "handle made at capture time: turn it off (moe.hostCounts(false)) for dispatches you capture");
        long seq = r.lastSequence + 1;  // per rank: ranks may be driven from different threads
        KernelArgs a = r.dispatchArgs;
        // fp8 from bf16: the dispatch quantizes x into r.xq (set at creation) itself, one launch on
        // both paths (1x H200, DeepSeek-V3, one rank: 128 tokens 0.3-0.5 us over ready fp8 rows;
        // 4096 tokens 133.7 us against 138.0 for moe_fp8_quantize and then the dispatch, 2026-12-01).
        a.setPointerField(MoeGinDispatchArgs.x$offset(), x).setPointerField(MoeGinDispatchArgs.topkIdx$offset(), topkIdx)
                .setPointerField(MoeGinDispatchArgs.topkWeights$offset(), topkWeights)
                .setPointerField(MoeGinDispatchArgs.recvX$offset(), out.rows()).setPointerField(MoeGinDispatchArgs.recvWeights$offset(), out.weights())
                .setPointerField(MoeGinDispatchArgs.recvCounts$offset(), out.counts());
        if (peers != null) a.setPointerField(MoeGinDispatchArgs.peerBases$offset(), peers.table(localIndex));  // across nodes: no LSA table
        MoeGinDispatchArgs.numTokens(a.struct(), tokens);
        r.lastSequence = seq;  // first: after a failed launch no earlier handle may pass for the last dispatch
        noteUse(stream);  // a graph captured from it replays into this instance's window and buffers
        if (network != null) network.dispatch(localIndex, x, topkIdx, topkWeights, tokens, out.rows(), out.weights(), out.counts(), stream, networkMode, phase);
        else r.dispatch.launch(stream, ginLaunch, a);
        if (copy && r.hostCopied == null) r.hostCopied = r.device.createEvent(false);  // the handle holds it from now on
        if (phase == MoeNetwork.Phase.SEND) {
            r.staged.begin(r.comm.toString(), StagedExchange.Kind.DISPATCH, stream, stream.isCapturing(), () -> network.complete(localIndex, false, stream),
                    () -> afterDispatch(r, out.counts(), offsets, copy, stream));
        } else {
            afterDispatch(r, out.counts(), offsets, copy, stream);
        }
        return new MoeDispatch(this, localIndex, tokens, seq, out.rows(), out.counts(), out.weights(), offsets ? r.offsets : null, copy ? r.hostCopy : null,
                copy ? r.hostCopied : null);
    }

    /**
     * After a dispatch on {@code stream}: the expert offsets of {@code counts} (one block of
     * moe_expert_offsets), and with {@code copy} the counts and offsets into the rank's pinned
     * words, then the rank's event. All stream-ordered: nothing here waits for the host.
     */
    private void afterDispatch(RankState r, DeviceBuffer counts, boolean offsets, boolean copy, Stream stream) {
        if (!offsets) return;
        r.offsetsArgs.setPointer(0, counts);
        r.offsetsKernel.launch(stream, LaunchConfig.of(1, 256), r.offsetsArgs);
        if (!copy) return;
        long countBytes = 4L * localExperts;
        counts.slice(0, countBytes).copyToHostAsync(r.hostCopy.host().asSlice(0, countBytes), stream);
        r.offsets.copyToHostAsync(r.hostCopy.host().asSlice(countBytes, 4L * (localExperts + 1)), stream);
        if (r.hostCopied == null) r.hostCopied = r.device.createEvent(false);
        r.hostCopied.record(stream);
    }

    /**
     * Every local rank at once (the only form for HOST with several local ranks).
     * @param x each local rank's tokens, in local rank order (as in the single-rank form)
     * @param topkIdx each local rank's int32 {@code [T][topK]} expert ids
     * @param topkWeights each local rank's f32 {@code [T][topK]} router weights
     * @param tokens each local rank's T
     * @param streams each local rank's stream, in local rank order
     * @return one handle per local rank, in local rank order
     * @throws IllegalArgumentException for a list that does not hold one entry per local rank, or a rank's input that the
     *         single-rank form refuses (every rank is checked before any launch)
     * @throws IllegalStateException as the single-rank form
     */
    public List<MoeDispatch> dispatch(List<DeviceBuffer> x, List<DeviceBuffer> topkIdx, List<DeviceBuffer> topkWeights, int[] tokens, List<Stream> streams) {
        return dispatch(x, topkIdx, topkWeights, tokens, java.util.Collections.nCopies(group.localCount(), MoeOutputs.INSTANCE_OWNED), streams);
    }

    /**
     * {@link #dispatch(List, List, List, int[], List)} into the caller's buffers: one
     * {@link MoeOutputs} per local rank, in order.
     * @param x each local rank's tokens, in local rank order (as in the single-rank form)
     * @param topkIdx each local rank's int32 {@code [T][topK]} expert ids
     * @param topkWeights each local rank's f32 {@code [T][topK]} router weights
     * @param tokens each local rank's T
     * @param outputs each local rank's result buffers ({@link MoeOutputs#INSTANCE_OWNED} for the instance's), in local rank order
     * @param streams each local rank's stream, in local rank order
     * @return one handle per local rank, in local rank order
     * @throws IllegalArgumentException for a list that does not hold one entry per local rank, or a rank's input that the
     *         single-rank form refuses (every rank is checked before any launch)
     * @throws IllegalStateException as the single-rank form
     */
    public List<MoeDispatch> dispatch(List<DeviceBuffer> x, List<DeviceBuffer> topkIdx, List<DeviceBuffer> topkWeights, int[] tokens, List<MoeOutputs> outputs,
                                      List<Stream> streams) {
        int local = group.localCount();
        if (x.size() != local || topkIdx.size() != local || topkWeights.size() != local || tokens.length != local || outputs.size() != local || streams.size() != local)
            throw new IllegalArgumentException("one x, topkIdx, topkWeights, token count, outputs and stream per local rank expected (" + local + "), got " + x.size() + ", "
                    + topkIdx.size() + ", " + topkWeights.size() + ", " + tokens.length + ", " + outputs.size() + ", " + streams.size());
        // Every rank's inputs before any launch: a GIN kernel launched for rank 0 would otherwise wait
        // for rank 1's until its time-out when rank 1's are refused.
        List<Results> results = new ArrayList<>();
        for (int i = 0; i < local; i++) {
            RankState r = ranks.get(i);
            checkInputs(r, x.get(i), topkIdx.get(i), topkWeights.get(i), tokens[i], streams.get(i));
            checkOutputs(r, outputs.get(i), x.get(i), topkIdx.get(i), topkWeights.get(i));
            results.add(results(r, outputs.get(i)));
        }
        List<MoeDispatch> out = new ArrayList<>();
        if (cfg.backend() == Backend.GIN) {
            for (int i = 0; i < local; i++)
                out.add(ginDispatch(i, ranks.get(i), x.get(i), topkIdx.get(i), topkWeights.get(i), tokens[i], results.get(i), streams.get(i), MoeNetwork.Phase.ALL));
            return out;
        }
        Checks.refuseCapture(streams, "a HOST dispatch" + FROM_HOST);
        for (RankState r : ranks) r.lastSequence++;  // first: a dispatch that fails half-way leaves no handle valid
        noteUse(streams);
        hostDispatch(x, topkIdx, topkWeights, tokens, results, streams);
        boolean offsets = expertOffsets || hostCounts, copy = hostCounts;
        for (int i = 0; i < local; i++) {
            RankState r = ranks.get(i);
            Results res = results.get(i);
            afterDispatch(r, res.counts(), offsets, copy, streams.get(i));
            out.add(new MoeDispatch(this, i, tokens[i], r.lastSequence, res.rows(), res.counts(), res.weights(), offsets ? r.offsets : null,
                    copy ? r.hostCopy : null, copy ? r.hostCopied : null));
        }
        return out;
    }

    /** moe_fp8_quantize: bf16 x -> the fp8 rows in r.xq. */
    private void quantizeRows(RankState r, DeviceBuffer x, int tokens, Stream stream) {
        Fp8Rows.setQuantizeArgs(r.quantizeArgs, x, tokens, cfg.hidden(), r.xq, r.errors.buffer());
        r.quantize.launch(stream, Fp8Rows.launchConfig(r.device, tokens, cfg.hidden()), r.quantizeArgs);
    }

    private void hostDispatch(List<DeviceBuffer> x, List<DeviceBuffer> idx, List<DeviceBuffer> w, int[] tokens, List<Results> results, List<Stream> streams) {
        int local = group.localCount(), L = localExperts;
        long rowBytes = cfg.dispatchRowBytes();
        // 1. routing layout on every rank (same code as the GIN kernel: identical positions)
        for (int i = 0; i < local; i++) {
            RankState r = ranks.get(i);
            r.layoutArgs.setPointerField(MoeHostLayoutArgs.topkIdx$offset(), idx.get(i));
            MoeHostLayoutArgs.numTokens(r.layoutArgs.struct(), tokens[i]);
            r.layout.launch(streams.get(i), LaunchConfig.of(channels, THREADS), r.layoutArgs);
            DeviceBuffer rows = x.get(i);
            if (cfg.quantizes()) {
                quantizeRows(r, rows, tokens[i], streams.get(i));
                rows = r.xq;
            }
            r.packArgs.setPointerField(MoeHostPackArgs.x$offset(), rows).setPointerField(MoeHostPackArgs.topkIdx$offset(), idx.get(i))
                    .setPointerField(MoeHostPackArgs.topkWeights$offset(), w.get(i)).setPointerField(MoeHostPackArgs.sendRows$offset(), r.sendRows)
                    .setPointerField(MoeHostPackArgs.sendWeights$offset(), r.sendWeights);
            MoeHostPackArgs.numTokens(r.packArgs.struct(), tokens[i]);
            r.pack.launch(streams.get(i), r.warpLaunch(tokens[i]), r.packArgs);
            long routingBytes = 4L * tokens[i] * cfg.topK();
            r.routingIdx.slice(0, routingBytes).copyFrom(idx.get(i).slice(0, routingBytes), streams.get(i));
            r.routingWeights.slice(0, routingBytes).copyFrom(w.get(i).slice(0, routingBytes), streams.get(i));
        }
        // 2. counts per (destination, local expert): all-to-all, then to the host
        List<DeviceBuffer> countSend = new ArrayList<>(), countRecv = new ArrayList<>();
        for (RankState r : ranks) {
            countSend.add(r.workspace.slice(MoeLayoutInfo.wsExpertCount(info), 4L * cfg.experts()));
            countRecv.add(r.countMatrix);
        }
        group.allToAll(countSend, countRecv, 4L * L, streams);
        long[][] sc = new long[local][], so = new long[local][], rc = new long[local][], ro = new long[local][];
        long[][] scw = new long[local][], sow = new long[local][], rcw = new long[local][], row = new long[local][];
        for (int i = 0; i < local; i++) {
            RankState r = ranks.get(i);
            Groups.await(group, streams.get(i), "a HOST MoE dispatch (the count exchange)");
            int[] matrix = r.countMatrix.readInts(nRanks * L, streams.get(i));
            int[] expertOffset = r.workspace.slice(MoeLayoutInfo.wsExpertOffset(info), 4L * (cfg.experts() + 1)).readInts(cfg.experts() + 1, streams.get(i));
            int[] rowsTo = r.workspace.slice(MoeLayoutInfo.wsRowsTo(info), 4L * nRanks).readInts(nRanks, streams.get(i));
            r.recvRowsFrom = new long[nRanks]; r.recvRowOffset = new long[nRanks]; r.sendRowsTo = new long[nRanks]; r.sendRowOffset = new long[nRanks];
            long off = 0;
            for (int s = 0; s < nRanks; s++) {
                long rows = 0;
                for (int e = 0; e < L; e++) rows += matrix[s * L + e];
                r.recvRowsFrom[s] = rows;
                r.recvRowOffset[s] = off;
                off += rows;
                r.sendRowsTo[s] = rowsTo[s];
                r.sendRowOffset[s] = expertOffset[s * L];
            }
            if (off > capacityRows()) throw new CommException(r.comm + " would receive " + off + " rows, above the capacity of " + capacityRows());
            long end = 0;
            for (int e = 0; e < L; e++) {
                long tot = 0;
                for (int s = 0; s < nRanks; s++) tot += matrix[s * L + e];
                long a = cfg.expertAlignment();
                end += e == L - 1 ? tot : (tot + a - 1) / a * a;
            }
            r.expertRowsEnd = end;
            sc[i] = scale(r.sendRowsTo, rowBytes); so[i] = scale(r.sendRowOffset, rowBytes);
            rc[i] = scale(r.recvRowsFrom, rowBytes); ro[i] = scale(r.recvRowOffset, rowBytes);
            scw[i] = scale(r.sendRowsTo, 4); sow[i] = scale(r.sendRowOffset, 4);
            rcw[i] = scale(r.recvRowsFrom, 4); row[i] = scale(r.recvRowOffset, 4);
        }
        // 3. one row per (token, expert) to the expert's rank, with its weight
        List<DeviceBuffer> sRows = new ArrayList<>(), rRows = new ArrayList<>(), sW = new ArrayList<>(), rW = new ArrayList<>();
        for (RankState r : ranks) { sRows.add(r.sendRows); rRows.add(r.recvBuf); sW.add(r.sendWeights); rW.add(r.recvBufWeights); }
        group.allToAllV(sRows, sc, so, rRows, rc, ro, streams);
        group.allToAllV(sW, scw, sow, rW, rcw, row, streams);
        // 4. source-major -> expert-major
        for (int i = 0; i < local; i++) {
            RankState r = ranks.get(i);
            long rows = r.recvRowOffset[nRanks - 1] + r.recvRowsFrom[nRanks - 1];
            r.permuteArgs.setPointerField(MoeHostPermuteArgs.recvBuf$offset(), r.recvBuf).setPointerField(MoeHostPermuteArgs.recvBufWeights$offset(), r.recvBufWeights)
                    .setPointerField(MoeHostPermuteArgs.countMatrix$offset(), r.countMatrix).setPointerField(MoeHostPermuteArgs.recvX$offset(), results.get(i).rows())
                    .setPointerField(MoeHostPermuteArgs.recvWeights$offset(), results.get(i).weights())
                    .setPointerField(MoeHostPermuteArgs.recvCounts$offset(), results.get(i).counts());
            r.permute.launch(streams.get(i), r.warpLaunch(rows), r.permuteArgs);
        }
    }

    private static long[] scale(long[] v, long f) {
        long[] o = new long[v.length];
        for (int i = 0; i < v.length; i++) o[i] = v[i] * f;
        return o;
    }

    /** The handle's rank, if the handle is of this instance's last dispatch there. */
    private RankState handleRank(MoeDispatch handle, String operation) {
        ensureOpen();
        group.ensureOpen();
        if (handle.owner() != this) throw new IllegalArgumentException(operation + " needs a handle of this instance's dispatch; " + handle + " comes from " + handle.owner().describe());
        RankState r = rank(handle.localIndex());
        r.staged.requireNone(r.comm.toString(), operation);
        if (handle.sequence() != r.lastSequence) throw new IllegalStateException(r.comm + ": " + operation + " needs the handle of the last dispatch (call " + r.lastSequence + "), got one of call " + handle.sequence());
        return r;
    }

    /**
     * A combine's inputs and output on the handle's rank: expertOut at least the rows the dispatch
     * received where the host knows that count (HOST), else any whole number of rows (GIN: the kernel
     * reads none past them); y ({@code null}: the instance's) at least T rows; nothing written overlaps what is read.
     */
    private RankState checkHandle(MoeDispatch handle, DeviceBuffer expertOut, DeviceBuffer y, Stream stream, boolean weighted) {
        RankState r = handleRank(handle, "combine");
        requireAligned(r, expertOut, 2, "expertOut (bf16)");
        long rowBytes = cfg.combineRowBytes();
        if (cfg.backend() != Backend.GIN) {
            long received = r.expertRowsEnd;
            if (expertOut.byteSize() < received * rowBytes)
                throw new IllegalArgumentException(r.comm + ": expertOut has " + expertOut.byteSize() + " bytes; the dispatch received " + received + " rows of "
                        + rowBytes + " bytes (hidden bf16" + (cfg.expertAlignment() > 1 ? ", up to the last expert's last row at alignment " + cfg.expertAlignment() : "")
                        + "), which need " + received * rowBytes);
        }
        if (expertOut.device() != r.device) throw new IllegalArgumentException("expertOut of " + r.comm + " is on " + expertOut.device() + ", expected " + r.device);
        if (stream.device() != r.device) throw new IllegalArgumentException("stream of " + r.comm + " is on " + stream.device() + ", expected " + r.device);
        if (y == null) {
            Checks.requireDisjoint(r.comm, "expertOut", expertOut, r.y, "this instance's combine output y");  // reachable where capacity rows = maxTokens (one rank, top-1)
            if (weighted) Checks.requireDisjoint(r.comm, "the dispatch's weights", handle.weights(), r.y, "this instance's combine output y");  // a caller's weights
            return r;
        }
        long needY = (long) handle.numTokens() * rowBytes;
        if (y.byteSize() < needY)
            throw new IllegalArgumentException(r.comm + ": y has " + y.byteSize() + " bytes; [" + handle.numTokens() + "][" + cfg.hidden() + "] bf16 (the dispatch's tokens) needs " + needY);
        requireAligned(r, y, 2, "y (bf16)");
        if (y.device() != r.device) throw new IllegalArgumentException(r.comm + ": y is on " + y.device() + ", expected " + r.device);
        Checks.requireDisjoint(r.comm, "expertOut", expertOut, y, "y");
        if (weighted) Checks.requireDisjoint(r.comm, "the dispatch's weights", handle.weights(), y, "y");  // the GIN combine reads them
        return r;
    }

    /** Rows of expertOut the GIN combine may read: its whole rows, at most the receive capacity. */
    private long expertOutRows(DeviceBuffer expertOut) {
        return Math.min(capacityRows(), expertOut.byteSize() / cfg.combineRowBytes());
    }

    /**
     * One local rank: y[T][H] bf16 for the tokens of that rank's last dispatch. y is this instance's
     * buffer, valid until the next combine or combineUnweighted on the rank: copy it to keep it, or
     * pass your own ({@link #combine(MoeDispatch, DeviceBuffer, DeviceBuffer, Stream)}).
     * <p>{@code expertOut}: bf16 {@code [rows][hidden]} in the dispatch's layout. It may hold fewer
     * rows than {@link #capacityRows()}, as long as it holds the rows the dispatch received (the
     * sum of the handle's counts; with {@link MoeConfig#expertAlignment()} above 1, up to the last
     * expert's last row: {@code offsets[L - 1] + counts[L - 1]}). HOST knows that count on the host and refuses a smaller
     * expertOut here. GIN knows it only on the device: a combine that finds more received rows than
     * expertOut holds reads none past its end, leaves those rows out of y, and
     * {@link #checkErrors} reports it ("expertOut holds fewer rows than the dispatch received").
     * HOST with several local ranks takes the list form.
     * @param handle the handle of the rank's last dispatch on this instance
     * @param expertOut bf16 expert outputs, one {@code hidden} row per received row in the dispatch's layout, on the rank's device
     * @param stream the stream the call is queued on, on the rank's device
     * @return y's first T rows, in the instance's buffer
     * @throws IllegalArgumentException for a handle of another instance, an expertOut that is misaligned, on another device,
     *         overlapping the instance's y or (HOST) below the rows received, or a stream on another device
     * @throws IllegalStateException for a handle older than the rank's last dispatch, while a staged call on the rank is not
     *         completed, or for HOST with several local ranks (use the list form) or on a stream that captures a graph
     */
    public DeviceBuffer combine(MoeDispatch handle, DeviceBuffer expertOut, Stream stream) {
        return combine(handle, expertOut, null, stream, true);
    }

    /**
     * {@link #combine(MoeDispatch, DeviceBuffer, Stream)} into the caller's {@code y} (bf16, at
     * least {@code [T][hidden]}, 2-byte aligned, on the rank's device, disjoint from expertOut and
     * from the handle's weights); null means the instance's. Returns y's first T rows.
     * @param handle the handle of the rank's last dispatch on this instance
     * @param expertOut bf16 expert outputs, one {@code hidden} row per received row in the dispatch's layout, on the rank's device
     * @param y the caller's bf16 output, at least {@code [T][hidden]}, or null for the instance's
     * @param stream the stream the call is queued on, on the rank's device
     * @return y's first T rows
     * @throws IllegalArgumentException for a handle of another instance, an expertOut or y that is misaligned, on another
     *         device or overlapping what the combine reads, a y below T rows or (HOST) an expertOut below the rows received,
     *         or a stream on another device
     * @throws IllegalStateException for a handle older than the rank's last dispatch, while a staged call on the rank is not
     *         completed, or for HOST with several local ranks (use the list form) or on a stream that captures a graph
     */
    public DeviceBuffer combine(MoeDispatch handle, DeviceBuffer expertOut, DeviceBuffer y, Stream stream) {
        return combine(handle, expertOut, y, stream, true);
    }

    /**
     * {@code y[t] = sum_k out(t, expert_k)}, without the router weights: in training, the gradient of
     * x from the gradients of the received rows (the backward of dispatch). Otherwise as
     * {@link #combine(MoeDispatch, DeviceBuffer, Stream)}.
     * @param handle the handle of the rank's last dispatch on this instance
     * @param expertOut bf16 expert outputs, one {@code hidden} row per received row in the dispatch's layout, on the rank's device
     * @param stream the stream the call is queued on, on the rank's device
     * @return y's first T rows, in the instance's buffer
     * @throws IllegalArgumentException for a handle of another instance, an expertOut that is misaligned, on another device,
     *         overlapping the instance's y or (HOST) below the rows received, or a stream on another device
     * @throws IllegalStateException for a handle older than the rank's last dispatch, while a staged call on the rank is not
     *         completed, or for HOST with several local ranks (use the list form) or on a stream that captures a graph
     */
    public DeviceBuffer combineUnweighted(MoeDispatch handle, DeviceBuffer expertOut, Stream stream) {
        return combine(handle, expertOut, null, stream, false);
    }

    /**
     * {@link #combineUnweighted(MoeDispatch, DeviceBuffer, Stream)} into the caller's {@code y}, as {@link #combine(MoeDispatch, DeviceBuffer, DeviceBuffer, Stream)}.
     * @param handle the handle of the rank's last dispatch on this instance
     * @param expertOut bf16 expert outputs, one {@code hidden} row per received row in the dispatch's layout, on the rank's device
     * @param y the caller's bf16 output, at least {@code [T][hidden]}, or null for the instance's
     * @param stream the stream the call is queued on, on the rank's device
     * @return y's first T rows
     * @throws IllegalArgumentException for a handle of another instance, an expertOut or y that is misaligned, on another
     *         device or overlapping what the combine reads, a y below T rows or (HOST) an expertOut below the rows received,
     *         or a stream on another device
     * @throws IllegalStateException for a handle older than the rank's last dispatch, while a staged call on the rank is not
     *         completed, or for HOST with several local ranks (use the list form) or on a stream that captures a graph
     */
    public DeviceBuffer combineUnweighted(MoeDispatch handle, DeviceBuffer expertOut, DeviceBuffer y, Stream stream) {
        return combine(handle, expertOut, y, stream, false);
    }

    private DeviceBuffer combine(MoeDispatch handle, DeviceBuffer expertOut, DeviceBuffer y, Stream stream, boolean weighted) {
        if (cfg.backend() != Backend.GIN) {
            if (group.localCount() > 1) throw new IllegalStateException("HOST combine with several local ranks must be issued for all of them together: use the list form");
            return combine(List.of(handle), List.of(expertOut), java.util.Collections.singletonList(y), List.of(stream), weighted).getFirst();
        }
        return ginCombine(checkHandle(handle, expertOut, y, stream, weighted), handle, expertOut, y, stream, weighted, MoeNetwork.Phase.ALL);
    }

    /** GIN, inputs checked: the combine launch (y null: the instance's); {@code phase} SEND across nodes only. */
    private DeviceBuffer ginCombine(RankState r, MoeDispatch handle, DeviceBuffer expertOut, DeviceBuffer y, Stream stream, boolean weighted, MoeNetwork.Phase phase) {
        DeviceBuffer out = y != null ? y : r.y;
        if (network != null) {
            noteUse(stream);
            network.combine(handle.localIndex(), expertOut, weighted ? handle.weights() : null, out, handle.numTokens(), stream, phase);
            if (phase == MoeNetwork.Phase.SEND)
                r.staged.begin(r.comm.toString(), StagedExchange.Kind.COMBINE, stream, stream.isCapturing(), () -> network.complete(handle.localIndex(), true, stream),
                        () -> {});
            return out.slice(0, (long) handle.numTokens() * cfg.combineRowBytes());
        }
        KernelArgs a = r.combineArgs;
        a.setPointerField(MoeGinCombineArgs.expertOut$offset(), expertOut).setPointerField(MoeGinCombineArgs.recvWeights$offset(), weighted ? handle.weights() : r.unitWeights)
                .setPointerField(MoeGinCombineArgs.y$offset(), out).setPointerField(MoeGinCombineArgs.peerBases$offset(), peers.table(handle.localIndex()));
        MoeGinCombineArgs.numTokens(a.struct(), handle.numTokens());
        MoeGinCombineArgs.expertOutRows(a.struct(), (int) expertOutRows(expertOut));
        noteUse(stream);
        r.combine.launch(stream, ginLaunch, a);
        return out.slice(0, (long) handle.numTokens() * cfg.combineRowBytes());
    }

    /**
     * Every local rank at once (the only form for HOST with several local ranks); each y valid until the next combine there.
     * @param handles each local rank's handle of its last dispatch, in local rank order
     * @param expertOut each local rank's expert outputs, as in the single-rank form
     * @param streams each local rank's stream, in local rank order
     * @return each local rank's y (first T rows, the instance's buffer), in local rank order
     * @throws IllegalArgumentException for a list that does not hold one entry per local rank, handles out of local rank
     *         order, or a rank's input that the single-rank form refuses (every rank is checked before any launch)
     * @throws IllegalStateException as the single-rank form
     */
    public List<DeviceBuffer> combine(List<MoeDispatch> handles, List<DeviceBuffer> expertOut, List<Stream> streams) {
        return combine(handles, expertOut, null, streams, true);
    }

    /**
     * {@link #combine(List, List, List)} into the caller's y, one per local rank (an entry or the list null: the instance's).
     * @param handles each local rank's handle of its last dispatch, in local rank order
     * @param expertOut each local rank's expert outputs, as in the single-rank form
     * @param y each local rank's bf16 output or null for the instance's; the list itself may be null (all the instance's)
     * @param streams each local rank's stream, in local rank order
     * @return each local rank's y (first T rows), in local rank order
     * @throws IllegalArgumentException for a list that does not hold one entry per local rank, handles out of local rank
     *         order, or a rank's input that the single-rank form refuses (every rank is checked before any launch)
     * @throws IllegalStateException as the single-rank form
     */
    public List<DeviceBuffer> combine(List<MoeDispatch> handles, List<DeviceBuffer> expertOut, List<DeviceBuffer> y, List<Stream> streams) {
        return combine(handles, expertOut, y, streams, true);
    }

    /**
     * {@link #combineUnweighted(MoeDispatch, DeviceBuffer, Stream)} for every local rank at once; each result valid until the next combine there.
     * @param handles each local rank's handle of its last dispatch, in local rank order
     * @param expertOut each local rank's expert outputs, as in the single-rank form
     * @param streams each local rank's stream, in local rank order
     * @return each local rank's y (first T rows, the instance's buffer), in local rank order
     * @throws IllegalArgumentException for a list that does not hold one entry per local rank, handles out of local rank
     *         order, or a rank's input that the single-rank form refuses (every rank is checked before any launch)
     * @throws IllegalStateException as the single-rank form
     */
    public List<DeviceBuffer> combineUnweighted(List<MoeDispatch> handles, List<DeviceBuffer> expertOut, List<Stream> streams) {
        return combine(handles, expertOut, null, streams, false);
    }

    /**
     * {@link #combineUnweighted(List, List, List)} into the caller's y, one per local rank (an entry or the list null: the instance's).
     * @param handles each local rank's handle of its last dispatch, in local rank order
     * @param expertOut each local rank's expert outputs, as in the single-rank form
     * @param y each local rank's bf16 output or null for the instance's; the list itself may be null (all the instance's)
     * @param streams each local rank's stream, in local rank order
     * @return each local rank's y (first T rows), in local rank order
     * @throws IllegalArgumentException for a list that does not hold one entry per local rank, handles out of local rank
     *         order, or a rank's input that the single-rank form refuses (every rank is checked before any launch)
     * @throws IllegalStateException as the single-rank form
     */
    public List<DeviceBuffer> combineUnweighted(List<MoeDispatch> handles, List<DeviceBuffer> expertOut, List<DeviceBuffer> y, List<Stream> streams) {
        return combine(handles, expertOut, y, streams, false);
    }

    private List<DeviceBuffer> combine(List<MoeDispatch> handles, List<DeviceBuffer> expertOut, List<DeviceBuffer> y, List<Stream> streams, boolean weighted) {
        int local = checkLists(handles, expertOut, streams, "expert output");
        if (y != null && y.size() != local) throw new IllegalArgumentException("one y (or null) per local rank expected (" + local + "), got " + y.size());
        List<DeviceBuffer> ys = new ArrayList<>();
        for (int i = 0; i < local; i++) ys.add(y == null ? null : y.get(i));
        for (int i = 0; i < local; i++) checkHandle(handles.get(i), expertOut.get(i), ys.get(i), streams.get(i), weighted);  // all before any launch
        List<DeviceBuffer> out = new ArrayList<>();
        if (cfg.backend() == Backend.GIN) {
            for (int i = 0; i < local; i++) out.add(ginCombine(ranks.get(i), handles.get(i), expertOut.get(i), ys.get(i), streams.get(i), weighted, MoeNetwork.Phase.ALL));
            return out;
        }
        Checks.refuseCapture(streams, "a HOST combine" + FROM_HOST);
        noteUse(streams);
        hostSendBack(expertOut, cfg.hidden(), r -> r.backBuf, r -> r.returned, streams);
        long rowBytes = cfg.combineRowBytes();
        for (int i = 0; i < local; i++) {
            RankState r = ranks.get(i);
            MoeDispatch h = handles.get(i);
            DeviceBuffer yi = ys.get(i) != null ? ys.get(i) : r.y;
            r.hostCombineArgs.setPointerField(MoeHostCombineArgs.returned$offset(), r.returned).setPointerField(MoeHostCombineArgs.topkIdx$offset(), r.routingIdx)
                    .setPointerField(MoeHostCombineArgs.topkWeights$offset(), weighted ? r.routingWeights : r.unitWeights).setPointerField(MoeHostCombineArgs.y$offset(), yi);
            MoeHostCombineArgs.numTokens(r.hostCombineArgs.struct(), h.numTokens());
            r.hostCombine.launch(streams.get(i), r.warpLaunch(h.numTokens()), r.hostCombineArgs);
            out.add(yi.slice(0, (long) h.numTokens() * rowBytes));
        }
        return out;
    }


    // ---------------------------------------------------------------------------------------------
    // Staged calls: the send half now, the rest at complete, so compute can run in between
    // ---------------------------------------------------------------------------------------------

    /**
     * The send half of {@link #dispatch(int, DeviceBuffer, DeviceBuffer, DeviceBuffer, int, Stream)}:
     * queues the routing layout and the kernel's puts and stores on {@code stream} and returns;
     * {@link #complete(int, Stream)} on the same stream queues the wait for the peers' rows and
     * their placement. Work queued on the stream in between (the shared expert, attention of
     * another micro-batch) runs while the rows travel. The handle's rows, weights and counts are
     * valid once the completion has run on the stream. Until {@code complete}, every other MoE call
     * on the rank is refused, {@link #checkErrors} and a handle's host counts included; peers may
     * use staged or whole calls as they like. The peers' kernels wait for this rank's completion
     * within their time-out (10 s): the work between send and complete must end well before it.
     * <p>Across nodes ({@link Backend#GIN} with peers outside the LSA team) the send returns once
     * the network has read its bytes, in both network modes. Inside one node and on
     * {@link Backend#HOST} the send queues the whole dispatch (nothing is left to overlap there)
     * and {@code complete} queues nothing. Into the instance's buffers only.
     * @param localIndex the local rank, in [0, localCount)
     * @param x the tokens: {@code tokens} rows of {@link MoeConfig#inputRowBytes()} bytes (bf16 {@code [T][hidden]}, or scaled fp8
     *        rows), on the rank's device; 16-byte aligned for a quantizing fp8 dispatch, else 2-byte
     * @param topkIdx int32 {@code [T][topK]} expert ids, -1 for a masked slot
     * @param topkWeights f32 {@code [T][topK]} router weights
     * @param tokens T, in [0, maxTokens]; may differ per rank
     * @param stream the stream the send is queued on, on the rank's device; {@code complete} takes the same one
     * @return the handle; its rows, weights and counts are valid once the completion has run on the stream
     * @throws IllegalArgumentException for T outside [0, maxTokens], or a buffer or stream that is too small, misaligned, on
     *         another device, or overlapping the instance's results
     * @throws IndexOutOfBoundsException for a local rank index outside [0, localCount)
     * @throws IllegalStateException while an earlier send on the rank is not completed, or for
     *     HOST with several local ranks (use the list form of the whole call)
     */
    public MoeDispatch dispatchSend(int localIndex, DeviceBuffer x, DeviceBuffer topkIdx, DeviceBuffer topkWeights, int tokens, Stream stream) {
        RankState r = rank(localIndex);
        if (cfg.backend() != Backend.GIN || network == null) {
            MoeDispatch h = dispatch(localIndex, x, topkIdx, topkWeights, tokens, stream);
            r.staged.begin(r.comm.toString(), StagedExchange.Kind.DISPATCH, stream, stream.isCapturing(), () -> {}, () -> {});
            return h;
        }
        checkInputs(r, x, topkIdx, topkWeights, tokens, stream);
        checkOutputs(r, MoeOutputs.INSTANCE_OWNED, x, topkIdx, topkWeights);
        return ginDispatch(localIndex, r, x, topkIdx, topkWeights, tokens, results(r, MoeOutputs.INSTANCE_OWNED), stream, MoeNetwork.Phase.SEND);
    }

    /**
     * One process per GPU: {@link #dispatchSend(int, DeviceBuffer, DeviceBuffer, DeviceBuffer, int, Stream)} for local rank 0.
     * @param x the tokens: {@code tokens} rows of {@link MoeConfig#inputRowBytes()} bytes (bf16 {@code [T][hidden]}, or scaled fp8
     *        rows), on the rank's device; 16-byte aligned for a quantizing fp8 dispatch, else 2-byte
     * @param topkIdx int32 {@code [T][topK]} expert ids, -1 for a masked slot
     * @param topkWeights f32 {@code [T][topK]} router weights
     * @param tokens T, in [0, maxTokens]; may differ per rank
     * @param stream the stream the send is queued on, on the rank's device; {@code complete} takes the same one
     * @return the handle; its rows, weights and counts are valid once the completion has run on the stream
     * @throws IllegalStateException when this process drives several local ranks
     */
    public MoeDispatch dispatchSend(DeviceBuffer x, DeviceBuffer topkIdx, DeviceBuffer topkWeights, int tokens, Stream stream) {
        requireOneLocalRank("dispatchSend(x, topkIdx, topkWeights, tokens, stream)");
        return dispatchSend(0, x, topkIdx, topkWeights, tokens, stream);
    }

    /**
     * The send half of {@link #combine(MoeDispatch, DeviceBuffer, Stream)}: the expert side's
     * partial sums go out now; {@link #complete(int, Stream)} on the same stream queues the wait
     * and the reduction into y. The returned y is valid once the completion has run on the stream.
     * As {@link #dispatchSend}: staged across nodes, whole inside a node and on HOST.
     * @param handle the handle of the rank's last dispatch on this instance
     * @param expertOut bf16 expert outputs, one {@code hidden} row per received row in the dispatch's layout, on the rank's device
     * @param stream the stream the send is queued on, on the rank's device; {@code complete} takes the same one
     * @return y's first T rows, in the instance's buffer
     * @throws IllegalArgumentException for a handle of another instance, an expertOut that is misaligned, on another device,
     *         overlapping the instance's y or (HOST) below the rows received, or a stream on another device
     * @throws IllegalStateException for a handle older than the rank's last dispatch, while an earlier send on the rank is not
     *         completed, or for HOST with several local ranks (use the list form) or on a stream that captures a graph
     */
    public DeviceBuffer combineSend(MoeDispatch handle, DeviceBuffer expertOut, Stream stream) {
        return combineSend(handle, expertOut, stream, true);
    }

    /**
     * The send half of {@link #combineUnweighted(MoeDispatch, DeviceBuffer, Stream)}, as {@link #combineSend}.
     * @param handle the handle of the rank's last dispatch on this instance
     * @param expertOut bf16 expert outputs, one {@code hidden} row per received row in the dispatch's layout, on the rank's device
     * @param stream the stream the send is queued on, on the rank's device; {@code complete} takes the same one
     * @return y's first T rows, in the instance's buffer
     * @throws IllegalArgumentException for a handle of another instance, an expertOut that is misaligned, on another device,
     *         overlapping the instance's y or (HOST) below the rows received, or a stream on another device
     * @throws IllegalStateException for a handle older than the rank's last dispatch, while an earlier send on the rank is not
     *         completed, or for HOST with several local ranks (use the list form) or on a stream that captures a graph
     */
    public DeviceBuffer combineUnweightedSend(MoeDispatch handle, DeviceBuffer expertOut, Stream stream) {
        return combineSend(handle, expertOut, stream, false);
    }

    private DeviceBuffer combineSend(MoeDispatch handle, DeviceBuffer expertOut, Stream stream, boolean weighted) {
        if (cfg.backend() != Backend.GIN || network == null) {
            DeviceBuffer y = combine(handle, expertOut, null, stream, weighted);
            RankState r = rank(handle.localIndex());
            r.staged.begin(r.comm.toString(), StagedExchange.Kind.COMBINE, stream, stream.isCapturing(), () -> {}, () -> {});
            return y;
        }
        return ginCombine(checkHandle(handle, expertOut, null, stream, weighted), handle, expertOut, null, stream, weighted, MoeNetwork.Phase.SEND);
    }

    /**
     * Queues the rest of local rank {@code localIndex}'s last {@link #dispatchSend},
     * {@link #combineSend} or {@link #combineUnweightedSend} on {@code stream}, the stream it was
     * sent on: the wait for the peers' bytes (each wait ends with the kernels' time-out, as in a
     * whole call), then the rows' placement or the reduction. Capturable in a graph, in the same
     * capture as its send: a replay must run both halves. When its launch fails the exchange
     * stays pending (try again, or close the instance).
     * @param localIndex the local rank, in [0, localCount)
     * @param stream the stream the send was queued on
     * @throws IllegalStateException when nothing was sent on the rank, or the send was queued inside a
     *     graph capture and this call is not (or the other way round)
     * @throws IllegalArgumentException when {@code stream} is not the send's stream
     */
    public void complete(int localIndex, Stream stream) {
        ensureOpen();
        group.ensureOpen();
        RankState r = rank(localIndex);
        noteUse(stream);
        r.staged.complete(r.comm.toString(), stream, stream.isCapturing());
    }

    /**
     * One process per GPU: {@link #complete(int, Stream)} for local rank 0.
     * @param stream the stream the send was queued on
     * @throws IllegalStateException when this process drives several local ranks
     */
    public void complete(Stream stream) {
        requireOneLocalRank("complete(stream)");
        complete(0, stream);
    }

    /**
     * One f32 per received row back to its token's rank: {@code g[t][k] = rowValues[row of (t, expert_k)]}
     * for the tokens of the handle's dispatch, 0 where slot k is masked. In training this returns
     * the router weights' gradient, {@code dL/dw[t][k] = <dy[t], out(t, expert_k)>}: dispatch dy
     * with the same routing, take each received row's dot product of its dy and its expert output
     * into {@code rowValues}, and pass them here.
     * <p>{@code rowValues}: f32 per row of the handle's layout (its {@code rows}' order), at least
     * capacity rows long, on this rank's device. Returns {@code [T][topK]} f32 in this instance's
     * buffer, valid until the next call. A collective: every rank calls it after the same dispatch.
     * GIN: one kernel, GPU-initiated like the dispatch (the values go into the token ranks' windows).
     * GIN across nodes: the combine's exchange in the dispatch's mode, a {@code [topK]} f32 row per
     * token in place of its bf16 row (so it needs {@code hidden >= 2 x topK}); every rank makes its
     * combines and row values calls in the same order. HOST: the rows' way back with 4-byte rows
     * (with several local ranks, use the list form).
     * @param handle the handle of the rank's last dispatch on this instance
     * @param rowValues f32 per row of the handle's layout, at least capacity rows, 4-byte aligned, on the rank's device
     * @param stream the stream the call is queued on, on the rank's device
     * @return {@code [T][topK]} f32 in this instance's buffer, valid until the next call
     * @throws IllegalArgumentException for a handle of another instance, or a rowValues or stream that is too small, misaligned,
     *         on another device or overlapping the returned values
     * @throws IllegalStateException for a handle older than the rank's last dispatch, while a staged call on the rank is not
     *         completed, or for HOST with several local ranks (use the list form) or on a stream that captures a graph
     * @throws UnsupportedOperationException for GIN across nodes with hidden below 2 x topK (use Backend.HOST for it)
     */
    public DeviceBuffer returnRowValues(MoeDispatch handle, DeviceBuffer rowValues, Stream stream) {
        if (cfg.backend() != Backend.GIN) {
            if (group.localCount() > 1) throw new IllegalStateException("HOST returnRowValues with several local ranks must be issued for all of them together: use the list form");
            return returnRowValues(List.of(handle), List.of(rowValues), List.of(stream)).getFirst();
        }
        return ginRowValues(checkRowValues(handle, rowValues, stream), handle, rowValues, stream);
    }

    /** GIN, inputs checked: the row values launch. */
    private DeviceBuffer ginRowValues(RankState r, MoeDispatch handle, DeviceBuffer rowValues, Stream stream) {
        if (network != null) {
            noteUse(stream);
            network.returnRowValues(handle.localIndex(), rowValues, capacityRows(), r.tokenValues, handle.numTokens(), stream);
            return r.tokenValues.slice(0, 4L * handle.numTokens() * cfg.topK());
        }
        r.valuesArgs.setPointerField(MoeGinRowValuesArgs.rowValues$offset(), rowValues).setPointerField(MoeGinRowValuesArgs.peerBases$offset(), peers.table(handle.localIndex()));
        MoeGinRowValuesArgs.numTokens(r.valuesArgs.struct(), handle.numTokens());
        noteUse(stream);
        r.values.launch(stream, LaunchConfig.of(channels, THREADS), r.valuesArgs);
        return r.tokenValues.slice(0, 4L * handle.numTokens() * cfg.topK());
    }

    /**
     * The list forms after a dispatch take one handle, buffer and stream per local rank, handles in
     * local rank order (the HOST paths index buffers by position). Returns the local rank count.
     */
    private int checkLists(List<MoeDispatch> handles, List<DeviceBuffer> buffers, List<Stream> streams, String what) {
        int local = group.localCount();
        if (handles.size() != local || buffers.size() != local || streams.size() != local)
            throw new IllegalArgumentException("one handle, " + what + " and stream per local rank expected (" + local + "), got " + handles.size() + ", "
                    + buffers.size() + ", " + streams.size());
        for (int i = 0; i < local; i++)
            if (handles.get(i).localIndex() != i) throw new IllegalArgumentException("handle " + i + " of the list is of local rank " + handles.get(i).localIndex() + ": one per local rank, in order");
        return local;
    }

    private RankState checkRowValues(MoeDispatch handle, DeviceBuffer rowValues, Stream stream) {
        RankState r = handleRank(handle, "returnRowValues");
        requireAligned(r, rowValues, 4, "rowValues (f32)");
        if (rowValues.byteSize() < 4 * capacityRows()) throw new IllegalArgumentException(r.comm + ": rowValues has " + rowValues.byteSize() + " bytes; the dispatch's layout needs up to " + 4 * capacityRows() + " (capacity rows x f32)");
        if (rowValues.device() != r.device) throw new IllegalArgumentException("rowValues of " + r.comm + " is on " + rowValues.device());
        if (stream.device() != r.device) throw new IllegalArgumentException("stream of " + r.comm + " is on " + stream.device());
        Checks.requireDisjoint(r.comm, "rowValues", rowValues, r.tokenValues, "this instance's returned values");
        if (network != null && 2 * cfg.topK() > cfg.hidden())  // the values travel in the combine's sections, a [topK] f32 row in each bf16 [hidden] row
            throw new UnsupportedOperationException(r.comm + ": returnRowValues across nodes needs hidden >= 2 x topK, got hidden " + cfg.hidden() + ", topK " + cfg.topK()
                    + "; use Backend.HOST for this shape");
        return r;
    }

    /**
     * {@link #returnRowValues(MoeDispatch, DeviceBuffer, Stream)} for every local rank at once (handles in local rank order).
     * @param handles each local rank's handle of its last dispatch, in local rank order
     * @param rowValues each local rank's f32 row values, as in the single-rank form
     * @param streams each local rank's stream, in local rank order
     * @return each local rank's {@code [T][topK]} f32, in local rank order
     * @throws IllegalArgumentException for a list that does not hold one entry per local rank, handles out of local rank
     *         order, or a rank's input that the single-rank form refuses (every rank is checked before any launch)
     * @throws IllegalStateException as the single-rank form
     * @throws UnsupportedOperationException for GIN across nodes with hidden below 2 x topK (use Backend.HOST for it)
     */
    public List<DeviceBuffer> returnRowValues(List<MoeDispatch> handles, List<DeviceBuffer> rowValues, List<Stream> streams) {
        int local = checkLists(handles, rowValues, streams, "row values buffer");
        for (int i = 0; i < local; i++) checkRowValues(handles.get(i), rowValues.get(i), streams.get(i));  // all before any launch
        List<DeviceBuffer> out = new ArrayList<>();
        if (cfg.backend() == Backend.GIN) {
            for (int i = 0; i < local; i++) out.add(ginRowValues(ranks.get(i), handles.get(i), rowValues.get(i), streams.get(i)));
            return out;
        }
        Checks.refuseCapture(streams, "a HOST returnRowValues" + FROM_HOST);
        noteUse(streams);
        hostSendBack(rowValues, 2, r -> r.valuesSend, r -> r.valuesRecv, streams);  // an f32 per row: "hidden = 2" bf16 elements, bits unchanged
        for (int i = 0; i < local; i++) {
            RankState r = ranks.get(i);
            int tokens = handles.get(i).numTokens();
            r.valuesArgs.setPointerField(MoeHostRowValuesArgs.returned$offset(), r.valuesRecv).setPointerField(MoeHostRowValuesArgs.topkIdx$offset(), r.routingIdx);
            MoeHostRowValuesArgs.numTokens(r.valuesArgs.struct(), tokens);
            r.values.launch(streams.get(i), r.warpLaunch((long) tokens * cfg.topK() / r.warpSize + 1), r.valuesArgs);  // a thread per (token, k)
            out.add(r.tokenValues.slice(0, 4L * tokens * cfg.topK()));
        }
        return out;
    }

    /**
     * HOST, every local rank: expert-major rows of {@code hidden} bf16 elements ({@code rows}, the
     * last dispatch's layout) back to the ranks they came from, the way they came: unpermuted into
     * {@code staging} (source-major), then the exchange into {@code returned} (send-row order); both
     * are each rank's own buffers for this use.
     */
    private void hostSendBack(List<DeviceBuffer> rows, int hidden, Function<RankState, DeviceBuffer> stagingOf, Function<RankState, DeviceBuffer> returnedOf,
                              List<Stream> streams) {
        int local = group.localCount();
        long rowBytes = 2L * hidden;
        long[][] sc = new long[local][], so = new long[local][], rc = new long[local][], ro = new long[local][];
        List<DeviceBuffer> staging = new ArrayList<>(), returned = new ArrayList<>();
        for (int i = 0; i < local; i++) {
            RankState r = ranks.get(i);
            staging.add(stagingOf.apply(r));
            returned.add(returnedOf.apply(r));
            long n = r.recvRowOffset[nRanks - 1] + r.recvRowsFrom[nRanks - 1];
            r.unpermuteArgs.setPointerField(MoeHostUnpermuteArgs.expertOut$offset(), rows.get(i)).setPointerField(MoeHostUnpermuteArgs.countMatrix$offset(), r.countMatrix)
                    .setPointerField(MoeHostUnpermuteArgs.backBuf$offset(), staging.get(i));
            MoeDims.hidden(MoeHostUnpermuteArgs.dims(r.unpermuteArgs.struct()), hidden);
            r.unpermute.launch(streams.get(i), r.warpLaunch(n), r.unpermuteArgs);
            // what this rank received from s returns to s
            sc[i] = scale(r.recvRowsFrom, rowBytes); so[i] = scale(r.recvRowOffset, rowBytes);
            rc[i] = scale(r.sendRowsTo, rowBytes); ro[i] = scale(r.sendRowOffset, rowBytes);
        }
        group.allToAllV(staging, sc, so, returned, rc, ro, streams);
    }

    /**
     * HOST calls cannot go into a graph: the dispatch waits for its counts on the host (CUDA refuses
     * that inside a capture, after part of the call was queued), and a captured combine would replay
     * the row counts of the dispatch before the capture for every later dispatch. A constant, so
     * that the refusals' messages are not built on every call.
     */
    private static final String FROM_HOST = ", which takes its row counts from the host at each dispatch (use Backend.GIN for graphs),";

    /** While a stream captures: the graph uses this instance and its communicators (see {@link Stream#noteUse}). */
    private void noteUse(Stream stream) {
        stream.noteUse(this);
        stream.noteUse(group);
    }

    private void noteUse(List<Stream> streams) {
        for (Stream s : streams) noteUse(s);
    }

    /**
     * Refuses a check of the kernels while a local rank's staged send is not completed: with
     * several local ranks, a peer's whole call would wait for that rank's completion, which is not
     * queued yet, until its time-out.
     */
    private void requireNothingStaged(String operation) {
        for (RankState r : ranks) r.staged.requireNone(r.comm.toString(), operation);
    }

    /** Refuses reading a handle's host counts before its staged dispatch completed (they are the previous dispatch's until then). */
    void requireCompleted(int localIndex, String operation) {
        RankState r = rank(localIndex);
        r.staged.requireNone(r.comm.toString(), operation);
    }

    private RankState rank(int localIndex) {
        Groups.checkLocalIndex(group, localIndex);
        return ranks.get(localIndex);
    }

    /**
     * Synchronizes and throws if a kernel reported bad input (expert ids, token counts) or a time-out, which also aborts the group (KernelErrors.checkAll). One stream per local rank.
     * @param streams the streams the calls were queued on, one per local rank, in order
     * @throws CommException naming what each rank's kernels reported (the reports are cleared)
     */
    public void checkErrors(List<Stream> streams) {
        ensureOpen();
        Groups.checkStreams(group, streams);
        requireNothingStaged("checkErrors");
        KernelErrors.checkAll("MoE exchange", ranks.stream().map(r -> r.errors).toList(), streams, group);
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
     * {@link ErrorCheck}): queued on each stream (one per local rank, in order) after the
     * dispatches, combines and row-value returns already there; its {@link ErrorCheck#poll()}
     * reports them once the streams get there, with the text {@code checkErrors} gives.
     * @param streams the streams the calls were queued on, one per local rank, in order
     * @return the check, to poll or await
     * @throws IllegalStateException when a stream captures a graph
     */
    public ErrorCheck errorsAfter(List<Stream> streams) {
        ensureOpen();
        Groups.checkStreams(group, streams);
        requireNothingStaged("errorsAfter");
        return KernelErrors.later("MoE exchange", this, ranks.stream().map(r -> r.errors).toList(), streams, null, group);
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

    /**
     * One process per GPU (a group with one local rank): the dispatch of its tokens, as
     * {@link #dispatch(int, DeviceBuffer, DeviceBuffer, DeviceBuffer, int, Stream)} for local rank 0.
     * @param x the tokens: {@code tokens} rows of {@link MoeConfig#inputRowBytes()} bytes (bf16 {@code [T][hidden]}, or scaled fp8
     *        rows), on the rank's device; 16-byte aligned for a quantizing fp8 dispatch, else 2-byte
     * @param topkIdx int32 {@code [T][topK]} expert ids, -1 for a masked slot
     * @param topkWeights f32 {@code [T][topK]} router weights
     * @param tokens T, in [0, maxTokens]; may differ per rank
     * @param stream the stream the call is queued on, on the rank's device
     * @return the handle: where the results are once the stream gets there, valid until the rank's next dispatch
     * @throws IllegalStateException when this process drives several local ranks
     */
    public MoeDispatch dispatch(DeviceBuffer x, DeviceBuffer topkIdx, DeviceBuffer topkWeights, int tokens, Stream stream) {
        requireOneLocalRank("dispatch(x, topkIdx, topkWeights, tokens, stream)");
        return dispatch(0, x, topkIdx, topkWeights, tokens, stream);
    }

    /**
     * One process per GPU: {@link #dispatch(DeviceBuffer, DeviceBuffer, DeviceBuffer, int, Stream)}
     * into the caller's buffers where {@code outputs} names them ({@link MoeOutputs}).
     * @param x the tokens: {@code tokens} rows of {@link MoeConfig#inputRowBytes()} bytes (bf16 {@code [T][hidden]}, or scaled fp8
     *        rows), on the rank's device; 16-byte aligned for a quantizing fp8 dispatch, else 2-byte
     * @param topkIdx int32 {@code [T][topK]} expert ids, -1 for a masked slot
     * @param topkWeights f32 {@code [T][topK]} router weights
     * @param tokens T, in [0, maxTokens]; may differ per rank
     * @param outputs the caller's result buffers, or {@link MoeOutputs#INSTANCE_OWNED} for the instance's
     * @param stream the stream the call is queued on, on the rank's device
     * @return the handle: where the results are once the stream gets there, valid until the rank's next dispatch
     * @throws IllegalStateException when this process drives several local ranks
     */
    public MoeDispatch dispatch(DeviceBuffer x, DeviceBuffer topkIdx, DeviceBuffer topkWeights, int tokens, MoeOutputs outputs, Stream stream) {
        requireOneLocalRank("dispatch(x, topkIdx, topkWeights, tokens, outputs, stream)");
        return dispatch(0, x, topkIdx, topkWeights, tokens, outputs, stream);
    }

    /** Refuses a call without a local rank index where the process drives several local ranks. */
    private void requireOneLocalRank(String call) {
        ensureOpen();
        Groups.requireOneLocalRank(group, call);
    }

    /** Releases every rank's kernels, the window and the buffers; each step runs even if one before it failed. */
    @Override protected void release() {
        List<Runnable> steps = new ArrayList<>();
        if (network != null) steps.add(network::close);
        for (RankState r : ranks) {
            steps.add(() -> { if (r.hostCopied != null) r.hostCopied.close(); });
            steps.add(r.code::close);
            for (CodeObject c : r.compiledCode) steps.add(c::close);
        }
        steps.add(() -> { if (window != null) window.close(); });
        steps.add(arena::close);
        releaseAll(steps.toArray(Runnable[]::new));
    }

    @Override public String describe() {
        return "MoeAllToAll (" + (cfg == null ? "being created" : cfg.backend() + ", hidden " + cfg.hidden() + ", experts " + cfg.experts() + ", topK " + cfg.topK())
                + (group == null ? "" : ", " + group.localCount() + " local rank(s) of " + group.worldSize()) + ")";
    }
}
