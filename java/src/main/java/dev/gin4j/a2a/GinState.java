package dev.gin4j.a2a;

import dev.gin4j.bindings.a2a.GinA2aArgs;
import dev.gin4j.bindings.a2a.GinA2aCeSelfArgs;
import dev.gin4j.bindings.a2a.GinA2aCeSignalArgs;
import dev.gin4j.bindings.a2a.GinA2aHybridArgs;
import dev.gin4j.bindings.a2a.GinA2aHybridResetArgs;
import dev.gin4j.bindings.a2a.GinA2aStagedArgs;
import dev.gin4j.bindings.a2a.GinA2avArgs;
import dev.gin4j.bindings.a2a.GinA2avHybridArgs;
import dev.gin4j.bindings.a2a.GinA2avStagedArgs;
import dev.gin4j.internal.comm.Groups;
import dev.gin4j.internal.gpu.KernelLibrary;
import dev.gin4j.comm.CommGroup;
import dev.gin4j.internal.comm.DeviceComm;
import dev.gin4j.internal.comm.NcclDeviceAbi;
import dev.gin4j.comm.Communicator;
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
import dev.gin4j.gpu.LaunchConfig;
import dev.gin4j.gpu.NativeResource;
import dev.gin4j.gpu.Stream;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.List;

/**
 * What the GIN kernels need per local rank, made once: the symmetric window (signals, LL and LL128
 * staging, receive counts, receive slots), the peer table, sequence counters, the error word and
 * the kernels' argument lists (the structs of gin-kernels/abi/a2a.h, generated into
 * {@code dev.gin4j.bindings.a2a}; what stays the same from call to call is set here once). Window
 * layout as in docs/kernels.md (a2a.cu).
 */
final class GinState implements AutoCloseable {
    final CommGroup group;
    final int nranks;
    final long slotCapacity;   // bytes per source slot in "recv"
    final long llCapacity;     // LL staging capacity per source
    final long ll128Capacity;  // LL128 staging capacity per source
    final boolean nvidia;      // AUTO may pick LL128 and the copy engines: NVIDIA only (not validated on AMD)
    final SymmetricWindow window;
    final PeerTable peers;       // LSA only; null for the hybrid kernel, which asks NCCL itself
    final boolean hybrid;        // some peer is reachable only through GIN
    final DeviceComm ginComm;    // hybrid only
    final PlanChoice planChoice; // the plan of a call before the residency fit, logged once per distinct choice
    final Arena arena = Arena.ofShared();
    final List<Rank> ranks = new ArrayList<>();
    private boolean closed;

    /** Per local rank: kernels and argument lists reused by every call. */
    static final class Rank {
        final Communicator comm;
        final CodeObject code;
        final Kernel direct, ll, directV, llV, ll128, ll128V, ceReady, ceDone, ceSelf;
        final KernelArgs directArgs, llArgs, directVArgs, llVArgs, ll128Args, ll128VArgs, ceSignalArgs, ceSelfArgs;
        // copy-engine variant: the self slot runs on a second stream, forked from and joined to the caller's
        Stream ceSide;
        Event ceFork, ceJoin;
        DeviceBuffer[] peerRecv;  // each peer's "recv" region as mapped in this process (null for self), LSA only
        final DeviceBuffer seq, llSeq, ll128Seq;
        final KernelErrors errors;
        final java.util.Map<Long, Integer> residentBlocks = new java.util.concurrent.ConcurrentHashMap<>();
        CodeObject hybridCode;       // nccl_gin_a2a: compiled only against NCCL >= 2.29.7 headers
        Kernel hybridKernel, hybridVKernel;
        KernelArgs hybridArgs, hybridVArgs;

        /** Loads the hybrid kernel and resets its GIN signals (NCCL hands signals out of a pool without zeroing them). */
        void attachHybrid(GinState st, Stream s) {
            int i = comm.localIndex();
            NcclDeviceAbi abi = st.ginComm.abi();
            hybridCode = KernelLibrary.load(comm.device(), "nccl_gin_a2a");
            hybridKernel = hybridCode.kernel("gin_a2a_hybrid");
            KernelArgs.Type devComm = KernelArgs.Type.struct(abi.devCommSize(), Math.max(abi.devCommAlign(), 1));
            MemorySegment devCommBytes = st.ginComm.struct(i).asSlice(0, abi.devCommSize());
            MemorySegment window = MemorySegment.ofAddress(st.window.handle(i).address());
            long recv = st.offset("recv"), staging = st.offset("staging"), signals = st.offset("signals");
            hybridArgs = KernelArgs.ofStruct(st.arena, devComm, GinA2aHybridArgs.layout()).setStruct(0, devCommBytes);
            MemorySegment h = hybridArgs.struct();
            GinA2aHybridArgs.window(h, window);
            GinA2aHybridArgs.recvOffset(h, recv);
            GinA2aHybridArgs.stagingOffset(h, staging);
            GinA2aHybridArgs.lsaSignalOffset(h, signals);
            GinA2aHybridArgs.ginSignalBase(h, 0);
            GinA2aHybridArgs.rank(h, comm.rank());
            GinA2aHybridArgs.nranks(h, st.nranks);
            GinA2aHybridArgs.maxChunksPerPeer(h, Plan.MAX_CHUNKS_PER_PEER);
            hybridArgs.setPointerField(GinA2aHybridArgs.seqState$offset(), seq).setPointerField(GinA2aHybridArgs.errorFlags$offset(), errors.buffer());
            hybridVKernel = hybridCode.kernel("gin_a2av_hybrid");
            hybridVArgs = KernelArgs.ofStruct(st.arena, devComm, GinA2avHybridArgs.layout()).setStruct(0, devCommBytes);
            MemorySegment hv = hybridVArgs.struct();
            GinA2avHybridArgs.window(hv, window);
            GinA2avHybridArgs.recvOffset(hv, recv);
            GinA2avHybridArgs.recvCountsOffset(hv, st.offset("counts"));
            GinA2avHybridArgs.stagingOffset(hv, staging);
            GinA2avHybridArgs.countStagingOffset(hv, st.offset("countStaging"));
            GinA2avHybridArgs.lsaSignalOffset(hv, signals);
            GinA2avHybridArgs.ginSignalBase(hv, 0);
            GinA2avHybridArgs.rank(hv, comm.rank());
            GinA2avHybridArgs.nranks(hv, st.nranks);
            GinA2avHybridArgs.maxChunksPerPeer(hv, Plan.MAX_CHUNKS_PER_PEER);
            hybridVArgs.setPointerField(GinA2avHybridArgs.seqState$offset(), seq).setPointerField(GinA2avHybridArgs.errorFlags$offset(), errors.buffer());
            try (Arena a = Arena.ofConfined()) {
                KernelArgs reset = KernelArgs.ofStruct(a, devComm, GinA2aHybridResetArgs.layout()).setStruct(0, devCommBytes);
                MemorySegment rs = reset.struct();
                GinA2aHybridResetArgs.window(rs, window);
                GinA2aHybridResetArgs.lsaSignalOffset(rs, signals);
                GinA2aHybridResetArgs.ginSignalBase(rs, 0);
                GinA2aHybridResetArgs.nranks(rs, st.nranks);
                GinA2aHybridResetArgs.maxChunksPerPeer(rs, Plan.MAX_CHUNKS_PER_PEER);
                reset.setPointerField(GinA2aHybridResetArgs.seqState$offset(), seq).setPointerField(GinA2aHybridResetArgs.errorFlags$offset(), errors.buffer());
                hybridCode.kernel("gin_a2a_hybrid_reset").launch(s, LaunchConfig.of(1, 256), reset);
                errors.check("gin_a2a_hybrid_reset", s);
            }
        }

        /** Takes {@code code}: closed here if the rank cannot be set up (its buffers belong to {@code arena}). */
        Rank(Communicator comm, CodeObject code, Arena arena, Stream setup) {
            this.comm = comm;
            this.code = code;
            Device d = comm.device();
            try {
                direct = code.kernel("gin_a2a");
                ll = code.kernel("gin_a2a_ll");
                directV = code.kernel("gin_a2av");
                llV = code.kernel("gin_a2av_ll");
                ll128 = code.kernel("gin_a2a_ll128");
                ll128V = code.kernel("gin_a2av_ll128");
                directArgs = KernelArgs.ofStruct(arena, GinA2aArgs.layout());
                directVArgs = KernelArgs.ofStruct(arena, GinA2avArgs.layout());
                llArgs = KernelArgs.ofStruct(arena, GinA2aStagedArgs.layout());
                llVArgs = KernelArgs.ofStruct(arena, GinA2avStagedArgs.layout());
                ll128Args = KernelArgs.ofStruct(arena, GinA2aStagedArgs.layout());
                ll128VArgs = KernelArgs.ofStruct(arena, GinA2avStagedArgs.layout());
                ceReady = code.kernel("gin_a2a_ce_ready");
                ceDone = code.kernel("gin_a2a_ce_done");
                ceSelf = code.kernel("gin_a2a_ce_self");
                ceSignalArgs = KernelArgs.ofStruct(arena, GinA2aCeSignalArgs.layout());
                ceSelfArgs = KernelArgs.ofStruct(arena, GinA2aCeSelfArgs.layout());
                ceSide = d.createStream();
                ceFork = d.createEvent(false);
                ceJoin = d.createEvent(false);
                long seqBytes = 8L * comm.size() * Plan.MAX_CHUNKS_PER_PEER;
                seq = d.allocate(seqBytes, arena);
                llSeq = d.allocate(seqBytes, arena);
                ll128Seq = d.allocate(seqBytes, arena);
                seq.fill((byte) 0, setup);
                llSeq.fill((byte) 0, setup);
                ll128Seq.fill((byte) 0, setup);
                errors = new KernelErrors(d, arena, setup);
            } catch (RuntimeException e) {
                close();
                throw e;
            }
        }

        /**
         * The fields of the LSA kernels' structs that stay the same from call to call: the peer table,
         * the window's offsets, counters, error word, rank and sizes. A call sets the rest (send,
         * sizes, chunks per peer).
         */
        void setFixedArgs(GinState st, long peerBases) {
            MemorySegment table = MemorySegment.ofAddress(peerBases);
            long recv = st.offset("recv"), counts = st.offset("counts"), signals = st.offset("signals");
            int me = comm.rank(), n = st.nranks, maxChunks = Plan.MAX_CHUNKS_PER_PEER;
            MemorySegment a = directArgs.struct();
            GinA2aArgs.peerBases(a, table);
            GinA2aArgs.recvOffset(a, recv);
            GinA2aArgs.signalOffset(a, signals);
            GinA2aArgs.rank(a, me);
            GinA2aArgs.nranks(a, n);
            GinA2aArgs.maxChunksPerPeer(a, maxChunks);
            directArgs.setPointerField(GinA2aArgs.seqState$offset(), seq).setPointerField(GinA2aArgs.errorFlags$offset(), errors.buffer());
            a = directVArgs.struct();
            GinA2avArgs.peerBases(a, table);
            GinA2avArgs.recvOffset(a, recv);
            GinA2avArgs.recvCountsOffset(a, counts);
            GinA2avArgs.signalOffset(a, signals);
            GinA2avArgs.rank(a, me);
            GinA2avArgs.nranks(a, n);
            GinA2avArgs.maxChunksPerPeer(a, maxChunks);
            directVArgs.setPointerField(GinA2avArgs.seqState$offset(), seq).setPointerField(GinA2avArgs.errorFlags$offset(), errors.buffer());
            setStaged(llArgs, table, recv, st.offset("ll"), st.llCapacity, llSeq, me, n);
            setStaged(ll128Args, table, recv, st.offset("ll128"), st.ll128Capacity, ll128Seq, me, n);
            setStagedV(llVArgs, table, recv, counts, st.offset("ll"), st.llCapacity, llSeq, me, n);
            setStagedV(ll128VArgs, table, recv, counts, st.offset("ll128"), st.ll128Capacity, ll128Seq, me, n);
            a = ceSignalArgs.struct();
            GinA2aCeSignalArgs.peerBases(a, table);
            GinA2aCeSignalArgs.signalOffset(a, signals);
            GinA2aCeSignalArgs.rank(a, me);
            GinA2aCeSignalArgs.nranks(a, n);
            GinA2aCeSignalArgs.maxChunksPerPeer(a, maxChunks);
            ceSignalArgs.setPointerField(GinA2aCeSignalArgs.seqState$offset(), seq).setPointerField(GinA2aCeSignalArgs.errorFlags$offset(), errors.buffer());
            a = ceSelfArgs.struct();
            GinA2aCeSelfArgs.peerBases(a, table);
            GinA2aCeSelfArgs.recvOffset(a, recv);
            GinA2aCeSelfArgs.rank(a, me);
        }

        private void setStaged(KernelArgs args, MemorySegment table, long recv, long staging, long capacity, DeviceBuffer counters, int me, int n) {
            MemorySegment a = args.struct();
            GinA2aStagedArgs.peerBases(a, table);
            GinA2aStagedArgs.recvOffset(a, recv);
            GinA2aStagedArgs.stagingOffset(a, staging);
            GinA2aStagedArgs.stagingCapacity(a, capacity);
            GinA2aStagedArgs.rank(a, me);
            GinA2aStagedArgs.nranks(a, n);
            GinA2aStagedArgs.maxChunksPerPeer(a, Plan.MAX_CHUNKS_PER_PEER);
            args.setPointerField(GinA2aStagedArgs.seqState$offset(), counters).setPointerField(GinA2aStagedArgs.errorFlags$offset(), errors.buffer());
        }

        private void setStagedV(KernelArgs args, MemorySegment table, long recv, long counts, long staging, long capacity, DeviceBuffer counters, int me, int n) {
            MemorySegment a = args.struct();
            GinA2avStagedArgs.peerBases(a, table);
            GinA2avStagedArgs.recvOffset(a, recv);
            GinA2avStagedArgs.recvCountsOffset(a, counts);
            GinA2avStagedArgs.stagingOffset(a, staging);
            GinA2avStagedArgs.stagingCapacity(a, capacity);
            GinA2avStagedArgs.rank(a, me);
            GinA2avStagedArgs.nranks(a, n);
            GinA2avStagedArgs.maxChunksPerPeer(a, Plan.MAX_CHUNKS_PER_PEER);
            args.setPointerField(GinA2avStagedArgs.seqState$offset(), counters).setPointerField(GinA2avStagedArgs.errorFlags$offset(), errors.buffer());
        }

        /** The rank's streams, events and code objects; each released even if one before it fails. */
        void close() {
            NativeResource.releaseAll(() -> { if (ceSide != null) ceSide.close(); }, () -> { if (ceFork != null) ceFork.close(); },
                    () -> { if (ceJoin != null) ceJoin.close(); }, code::close, () -> { if (hybridCode != null) hybridCode.close(); });
        }
    }

    /** LL staging bytes per (parity, source): gin_a2a_ll_slot_stride in gin-kernels/src/a2a/window_layout.cuh. */
    static long llSlotStride(long llCapacity) { return 16 + 16 * ((llCapacity + 7) / 8); }

    /** LL128 staging bytes per (parity, source): one header line, one 128-byte line per 120 payload bytes (gin_a2a_ll128_slot_stride). */
    static long ll128SlotStride(long ll128Capacity) { return 128 * (1 + (ll128Capacity + 119) / 120); }

    static WindowLayout layout(int nranks, long slotCapacity, long llCapacity, long ll128Capacity, boolean hybrid) {
        WindowLayout.Builder b = WindowLayout.builder()
                .region("signals", 16L * nranks * Plan.MAX_CHUNKS_PER_PEER, 128)
                .region("ll", 2L * nranks * llSlotStride(llCapacity), 128)
                // LL128 lines must be 128-byte aligned (the kernels check it)
                .region("ll128", Math.multiplyExact(2L * nranks, ll128SlotStride(ll128Capacity)), 128)
                .region("counts", 8L * nranks, 128)
                .region("recv", Math.multiplyExact(slotCapacity, (long) nranks), 4096);
        // GIN puts read from registered memory: blocks (and all-to-all-v counts) for remote peers are staged in the window first
        if (hybrid) b.region("staging", Math.multiplyExact(slotCapacity, (long) nranks), 4096).region("countStaging", 8L * nranks, 128);
        return b.build();
    }

    /**
     * Whether some peer is not load/store reachable (another node): then the hybrid kernel
     * (nccl_gin_a2a.cu) puts to those peers through GIN. Found on a small probe window, since
     * only a registered window tells where peers are mapped.
     */
    private static boolean needsGin(CommGroup group) { return PeerTable.someoneUnreachable(group); }

    GinState(CommGroup group, long slotCapacity) {
        this.group = group;
        this.nranks = group.worldSize();
        this.slotCapacity = slotCapacity;
        this.llCapacity = Math.max(64, Math.min(slotCapacity, Plan.LL_MAX_BYTES_PER_PEER));
        this.ll128Capacity = Math.max(120, Math.min(slotCapacity, Plan.LL128_MAX_BYTES_PER_PEER));
        this.nvidia = group.rank(0).device().runtime().isCuda();
        this.hybrid = needsGin(group);
        this.planChoice = new PlanChoice(group.describe(), nranks, nvidia, hybrid, llCapacity, ll128Capacity);
        System.getLogger("dev.gin4j").log(System.Logger.Level.DEBUG, () -> "GIN all-to-all over " + group.describe() + ": "
                + (hybrid ? "some peer is outside the LSA team: the hybrid kernels, ncclGin puts for those peers" : "every peer load/store reachable (LSA)")
                + ", " + slotCapacity + " bytes per source slot");
        this.window = hybrid ? SymmetricWindow.allocateRegistered(group, layout(nranks, slotCapacity, llCapacity, ll128Capacity, true))  // GIN puts need NCCL's window
                : SymmetricWindow.allocate(group, layout(nranks, slotCapacity, llCapacity, ll128Capacity, false));
        DeviceComm dc = null;
        try {
            if (hybrid) {
                // 2 signals per (source, chunk): data and ready (docs/kernels.md, nccl_gin_a2a.cu)
                dc = DeviceComm.create(group, new DeviceComm.Requirements(0, 2 * nranks * Plan.MAX_CHUNKS_PER_PEER, 0, true));
            }
            this.ginComm = dc;
            // no rank may start signalling before every rank has zeroed its window (and reset its GIN
            // signals), and a rank whose setup failed must not leave the others waiting here
            this.peers = Groups.failTogether(group, "setting up the all-to-all's kernels and buffers", () -> {
                PeerTable peerTable = hybrid ? null : PeerTable.resolve(window, arena);
                setUpRanks(peerTable);
                return peerTable;
            });
        } catch (RuntimeException e) {
            if (dc != null) dc.close();
            close();
            throw e;
        }
    }

    /** Per local rank: kernels, argument lists, a zeroed window, the peers' receive regions (local work, no collective). */
    private void setUpRanks(PeerTable peers) {
        for (Communicator c : group.ranks()) {
            try (Stream s = c.device().createStream()) {
                Rank r = new Rank(c, KernelLibrary.load(c.device(), "a2a"), arena, s);
                ranks.add(r);
                // signals and staging start at zero: sequence numbers begin at 1
                window.buffer(c.localIndex()).fill((byte) 0, s);
                if (hybrid) r.attachHybrid(this, s);
                s.synchronize();
            }
        }
        if (peers != null) {
            long recvOffset = offset("recv"), recvBytes = window.layout().region("recv").size();
            for (Rank r : ranks) {
                r.setFixedArgs(this, peers.table(r.comm.localIndex()).address());
                long[] bases = peers.bases(r.comm.localIndex());
                r.peerRecv = new DeviceBuffer[nranks];
                for (int p = 0; p < nranks; p++) {
                    // physically on GPU p; the copy engine of this rank's GPU reaches it over NVLink
                    if (p != r.comm.rank() && bases[p] != 0)
                        r.peerRecv[p] = DeviceBuffer.wrap(r.comm.device(), MemorySegment.ofAddress(bases[p] + recvOffset).reinterpret(recvBytes, arena, null));
                }
            }
        }
    }

    long offset(String region) { return window.layout().region(region).offset(); }

    /** Every local rank's kernel error word, in local order. */
    List<KernelErrors> errorWords() { return ranks.stream().map(r -> r.errors).toList(); }

    /**
     * The launch shape for {@code bytesPerPeer} on local rank {@code localIndex}: by size (or the
     * forced protocol), direct where the LL / LL128 staging is too small, the hybrid kernel runs or
     * the copy engines cannot ({@code uniform} false: all-to-all-v), and shrunk to what the GPU
     * holds resident.
     */
    Plan plan(long bytesPerPeer, Protocol protocol, int localIndex, boolean uniform) {
        Plan plan = planChoice.choose(bytesPerPeer, protocol, uniform);
        // the copy-engine kernels' blocks never wait for each other: no residency limit
        return plan.protocol() == Protocol.COPY_ENGINE ? plan : fit(plan, localIndex);
    }

    /**
     * The plan itself, or one with fewer chunks per peer, such that every block of the grid is
     * resident at once (the kernels' blocks wait for each other; a grid larger than the GPU holds
     * would end in a time-out). Same answer on every rank for the same GPU model.
     */
    private Plan fit(Plan plan, int localIndex) {
        Rank r = ranks.get(localIndex);
        var kernel = hybrid ? r.hybridKernel : switch (plan.protocol()) {
            case LL -> r.ll;
            case LL128 -> r.ll128;
            default -> r.direct;
        };
        long key = ((long) plan.protocol().ordinal() << 32) | plan.threads();
        int resident = r.residentBlocks.computeIfAbsent(key, k -> kernel.occupancy(plan.threads(), 0) * r.comm.device().multiprocessors());
        int chunks = plan.chunksPerPeer();
        while (chunks > 1 && (long) chunks * nranks > resident) chunks /= 2;
        if ((long) chunks * nranks > resident) {
            throw new dev.gin4j.comm.CommException(nranks + " ranks need " + nranks + " resident blocks of " + plan.threads() + " threads, but " + r.comm.device() + " holds " + resident);
        }
        return chunks == plan.chunksPerPeer() ? plan : planChoice.fitted(plan, new Plan(plan.protocol(), chunks, plan.threads()), r.comm.device(), resident);
    }

    /** Idempotent; every part is released even if one before it fails. */
    @Override public void close() {
        if (closed) return;
        closed = true;
        List<Runnable> steps = new ArrayList<>();
        for (Rank r : ranks) steps.add(r::close);
        steps.add(() -> { if (ginComm != null) ginComm.close(); });
        steps.add(window::close);
        steps.add(arena::close);
        NativeResource.releaseAll(steps.toArray(Runnable[]::new));
    }
}
