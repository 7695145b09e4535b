package dev.gin4j.a2a;

import dev.gin4j.comm.CommGroup;
import dev.gin4j.comm.Communicator;
import dev.gin4j.comm.KernelErrors;
import dev.gin4j.comm.PeerTable;
import dev.gin4j.comm.SymmetricWindow;
import dev.gin4j.comm.WindowLayout;
import dev.gin4j.gpu.CodeObject;
import dev.gin4j.gpu.Device;
import dev.gin4j.gpu.DeviceBuffer;
import dev.gin4j.gpu.Kernel;
import dev.gin4j.gpu.KernelArgs;
import dev.gin4j.gpu.Stream;

import java.lang.foreign.Arena;
import java.util.ArrayList;
import java.util.List;

import static dev.gin4j.gpu.KernelArgs.Type.I32;
import static dev.gin4j.gpu.KernelArgs.Type.I64;
import static dev.gin4j.gpu.KernelArgs.Type.POINTER;

/**
 * What the GIN kernels need per local rank, made once: the symmetric window (signals, LL staging,
 * receive counts, receive slots), the peer table, sequence counters, the error word and the
 * kernels' argument lists. Window layout as in gin-kernels/KERNELS.md (a2a.cu).
 */
final class GinState implements AutoCloseable {
    final CommGroup group;
    final int nranks;
    final long slotCapacity;   // bytes per source slot in "recv"
    final long llCapacity;     // LL staging capacity per source
    final SymmetricWindow window;
    final PeerTable peers;
    final Arena arena = Arena.ofShared();
    final List<Rank> ranks = new ArrayList<>();

    /** Per local rank: kernels and argument lists reused by every call. */
    static final class Rank {
        final Communicator comm;
        final CodeObject code;
        final Kernel direct, ll, directV, llV;
        final KernelArgs directArgs, llArgs, directVArgs, llVArgs;
        final DeviceBuffer seq, llSeq;
        final KernelErrors errors;
        final java.util.Map<Long, Integer> residentBlocks = new java.util.concurrent.ConcurrentHashMap<>();

        Rank(Communicator comm, CodeObject code, Arena arena, Stream setup) {
            this.comm = comm;
            this.code = code;
            Device d = comm.device();
            direct = code.kernel("gin_a2a");
            ll = code.kernel("gin_a2a_ll");
            directV = code.kernel("gin_a2av");
            llV = code.kernel("gin_a2av_ll");
            // gin_a2a(send, bytesPerPeer, peerBases, recvOffset, slotBytes, signalOffset, seqState, rank, nranks, chunks, maxChunks, errorFlags)
            directArgs = KernelArgs.of(arena, POINTER, I64, POINTER, I64, I64, I64, POINTER, I32, I32, I32, I32, POINTER);
            // gin_a2a_ll(send, bytesPerPeer, peerBases, recvOffset, slotBytes, llOffset, llCapacity, llSeqState, rank, nranks, chunks, maxChunks, errorFlags)
            llArgs = KernelArgs.of(arena, POINTER, I64, POINTER, I64, I64, I64, I64, POINTER, I32, I32, I32, I32, POINTER);
            // gin_a2av(send, sendBytes, sendCounts, sendOffsets, peerBases, recvOffset, slotBytes, recvCountsOffset, signalOffset, seqState, rank, nranks, chunks, maxChunks, errorFlags)
            directVArgs = KernelArgs.of(arena, POINTER, I64, POINTER, POINTER, POINTER, I64, I64, I64, I64, POINTER, I32, I32, I32, I32, POINTER);
            // gin_a2av_ll(send, sendBytes, sendCounts, sendOffsets, peerBases, recvOffset, slotBytes, recvCountsOffset, llOffset, llCapacity, llSeqState, rank, nranks, chunks, maxChunks, errorFlags)
            llVArgs = KernelArgs.of(arena, POINTER, I64, POINTER, POINTER, POINTER, I64, I64, I64, I64, I64, POINTER, I32, I32, I32, I32, POINTER);
            long seqBytes = 8L * comm.size() * Plan.MAX_CHUNKS_PER_PEER;
            seq = d.allocate(seqBytes, arena);
            llSeq = d.allocate(seqBytes, arena);
            seq.fill((byte) 0, setup);
            llSeq.fill((byte) 0, setup);
            errors = new KernelErrors(d, arena, setup);
        }
    }

    static WindowLayout layout(int nranks, long slotCapacity, long llCapacity) {
        long stride = 16 + 16 * ((llCapacity + 7) / 8);
        return WindowLayout.builder()
                .region("signals", 16L * nranks * Plan.MAX_CHUNKS_PER_PEER, 128)
                .region("ll", 2L * nranks * stride, 128)
                .region("counts", 8L * nranks, 128)
                .region("recv", Math.multiplyExact(slotCapacity, (long) nranks), 4096)
                .build();
    }

    GinState(CommGroup group, long slotCapacity) {
        this.group = group;
        this.nranks = group.worldSize();
        this.slotCapacity = slotCapacity;
        this.llCapacity = Math.max(64, Math.min(slotCapacity, Plan.LL_MAX_BYTES_PER_PEER));
        this.window = SymmetricWindow.allocate(group, layout(nranks, slotCapacity, llCapacity));
        try {
            this.peers = PeerTable.resolve(window, arena);
            if (!peers.allReachable()) {
                throw new dev.gin4j.comm.CommException("the GIN all-to-all needs every peer load/store reachable (one node over NVLink/xGMI); "
                        + "peers without an LSA path would need GIN puts, which this build does not run. Use Backend.HOST.");
            }
            for (Communicator c : group.ranks()) {
                try (Stream s = c.device().createStream()) {
                    ranks.add(new Rank(c, c.device().loadKernels("a2a"), arena, s));
                    // signals and staging start at zero: sequence numbers begin at 1
                    window.buffer(c.localIndex()).fill((byte) 0, s);
                    s.synchronize();
                }
            }
            // no rank may start signalling before every rank has zeroed its window
            group.allGatherLongs(new long[group.localCount()]);
        } catch (RuntimeException e) {
            close();
            throw e;
        }
    }

    long offset(String region) { return window.layout().region(region).offset(); }

    /**
     * The plan itself, or one with fewer chunks per peer, such that every block of the grid is
     * resident at once (the kernels' blocks wait for each other; a grid larger than the GPU holds
     * would end in a time-out). Same answer on every rank for the same GPU model.
     */
    Plan fit(Plan plan, int localIndex) {
        Rank r = ranks.get(localIndex);
        var kernel = plan.protocol() == Protocol.LL ? r.ll : r.direct;
        long key = ((long) plan.protocol().ordinal() << 32) | plan.threads();
        int resident = r.residentBlocks.computeIfAbsent(key, k -> kernel.occupancy(plan.threads(), 0) * r.comm.device().multiprocessors());
        int chunks = plan.chunksPerPeer();
        while (chunks > 1 && (long) chunks * nranks > resident) chunks /= 2;
        if ((long) chunks * nranks > resident) {
            throw new dev.gin4j.comm.CommException(nranks + " ranks need " + nranks + " resident blocks of " + plan.threads() + " threads, but " + r.comm.device() + " holds " + resident);
        }
        return chunks == plan.chunksPerPeer() ? plan : new Plan(plan.protocol(), chunks, plan.threads());
    }

    @Override public void close() {
        for (Rank r : ranks) r.code.close();
        window.close();
        arena.close();
    }
}
