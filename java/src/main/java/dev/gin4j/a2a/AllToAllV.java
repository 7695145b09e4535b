package dev.gin4j.a2a;

import dev.gin4j.comm.CommGroup;
import dev.gin4j.comm.Communicator;
import dev.gin4j.gpu.DeviceBuffer;
import dev.gin4j.gpu.KernelArgs;
import dev.gin4j.gpu.LaunchConfig;
import dev.gin4j.gpu.Stream;

import java.lang.foreign.Arena;
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
 * PyTorch's all_to_all_single does.
 */
public final class AllToAllV implements AutoCloseable {
    private final CommGroup group;
    private final Backend backend;
    private final long capacityPerPeer;
    private final GinState gin;
    private final Arena arena = Arena.ofShared();
    private final List<DeviceBuffer> hostOutputs = new ArrayList<>(), hostCounts = new ArrayList<>();
    private Protocol protocol = Protocol.AUTO;

    private AllToAllV(CommGroup group, Backend backend, long capacityPerPeer) {
        if (capacityPerPeer < 1) throw new IllegalArgumentException("capacityPerPeer must be >= 1, got " + capacityPerPeer);
        this.group = group;
        this.backend = backend;
        this.capacityPerPeer = capacityPerPeer;
        this.gin = backend == Backend.GIN ? new GinState(group, capacityPerPeer) : null;
        if (backend == Backend.HOST) {
            for (Communicator c : group.ranks()) {
                hostOutputs.add(c.device().allocate(Math.multiplyExact(capacityPerPeer, (long) group.worldSize()), arena));
                hostCounts.add(c.device().allocate(8L * group.worldSize(), arena));
            }
        }
    }

    /** Collective: every rank must create it with the same capacity and backend. */
    public static AllToAllV create(CommGroup group, long capacityPerPeer, Backend backend) {
        return new AllToAllV(group, backend, capacityPerPeer);
    }

    public Backend backend() { return backend; }
    public long capacityPerPeer() { return capacityPerPeer; }

    public AllToAllV protocol(Protocol p) {
        this.protocol = p;
        return this;
    }

    /** Receive slots of local rank {@code i}: slot s at {@code s * capacityPerPeer}. */
    public DeviceBuffer output(int localIndex) {
        return backend == Backend.GIN ? gin.window.region(localIndex, "recv") : hostOutputs.get(localIndex);
    }

    /** uint64 bytes received from each source, on the device. */
    public DeviceBuffer receivedCounts(int localIndex) {
        return backend == Backend.GIN ? gin.window.region(localIndex, "counts") : hostCounts.get(localIndex);
    }

    public void run(List<DeviceBuffer> inputs, List<DeviceBuffer> sendCounts, List<DeviceBuffer> sendOffsets, List<Stream> streams) {
        int local = group.localCount(), n = group.worldSize();
        if (inputs.size() != local || sendCounts.size() != local || sendOffsets.size() != local || streams.size() != local)
            throw new IllegalArgumentException("one input, count array, offset array and stream per local rank expected (" + local + ")");
        for (int i = 0; i < local; i++) {
            Communicator c = group.rank(i);
            for (DeviceBuffer b : List.of(inputs.get(i), sendCounts.get(i), sendOffsets.get(i)))
                if (b.device() != c.device()) throw new IllegalArgumentException("a buffer of " + c + " is on " + b.device());
            if (streams.get(i).device() != c.device()) throw new IllegalArgumentException("stream of " + c + " is on " + streams.get(i).device());
            if (sendCounts.get(i).byteSize() < 8L * n || sendOffsets.get(i).byteSize() < 8L * n)
                throw new IllegalArgumentException("send counts and offsets of " + c + " must hold " + n + " uint64 values (" + 8 * n + " bytes)");
        }
        if (backend == Backend.HOST) {
            runHost(inputs, sendCounts, sendOffsets, streams);
            return;
        }
        if (gin.hybrid) throw new UnsupportedOperationException("all-to-all-v with peers on other nodes (GIN) is not available yet: use Backend.HOST");
        // counts are on the device: size the launch by capacity so every rank launches the same grid
        for (int i = 0; i < local; i++) {
            Plan plan = gin.plan(capacityPerPeer, protocol, i, false);
            GinState.Rank r = gin.ranks.get(i);
            DeviceBuffer in = inputs.get(i);
            // the direct, LL and LL128 kernels wait for prior grids first: they may start while the previous kernel drains
            LaunchConfig cfg = LaunchConfig.of(n * plan.chunksPerPeer(), plan.threads()).asProgrammaticDependent();
            long peerBases = gin.peers.table(i).address();
            if (plan.protocol() == Protocol.LL) {
                KernelArgs a = r.llVArgs;
                a.setPointer(0, in.address()).setLong(1, in.byteSize()).setPointer(2, sendCounts.get(i).address()).setPointer(3, sendOffsets.get(i).address())
                        .setPointer(4, peerBases).setLong(5, gin.offset("recv")).setLong(6, capacityPerPeer).setLong(7, gin.offset("counts"))
                        .setLong(8, gin.offset("ll")).setLong(9, gin.llCapacity).setPointer(10, r.llSeq.address())
                        .setInt(11, r.comm.rank()).setInt(12, n).setInt(13, plan.chunksPerPeer()).setInt(14, Plan.MAX_CHUNKS_PER_PEER).setPointer(15, r.errors.buffer().address());
                r.llV.launch(streams.get(i), cfg, a);
            } else if (plan.protocol() == Protocol.LL128) {
                KernelArgs a = r.ll128VArgs;
                a.setPointer(0, in.address()).setLong(1, in.byteSize()).setPointer(2, sendCounts.get(i).address()).setPointer(3, sendOffsets.get(i).address())
                        .setPointer(4, peerBases).setLong(5, gin.offset("recv")).setLong(6, capacityPerPeer).setLong(7, gin.offset("counts"))
                        .setLong(8, gin.offset("ll128")).setLong(9, gin.ll128Capacity).setPointer(10, r.ll128Seq.address())
                        .setInt(11, r.comm.rank()).setInt(12, n).setInt(13, plan.chunksPerPeer()).setInt(14, Plan.MAX_CHUNKS_PER_PEER).setPointer(15, r.errors.buffer().address());
                r.ll128V.launch(streams.get(i), cfg, a);
            } else {
                KernelArgs a = r.directVArgs;
                a.setPointer(0, in.address()).setLong(1, in.byteSize()).setPointer(2, sendCounts.get(i).address()).setPointer(3, sendOffsets.get(i).address())
                        .setPointer(4, peerBases).setLong(5, gin.offset("recv")).setLong(6, capacityPerPeer).setLong(7, gin.offset("counts"))
                        .setLong(8, gin.offset("signals")).setPointer(9, r.seq.address())
                        .setInt(10, r.comm.rank()).setInt(11, n).setInt(12, plan.chunksPerPeer()).setInt(13, Plan.MAX_CHUNKS_PER_PEER).setPointer(14, r.errors.buffer().address());
                r.directV.launch(streams.get(i), cfg, a);
            }
        }
    }

    private void runHost(List<DeviceBuffer> inputs, List<DeviceBuffer> sendCounts, List<DeviceBuffer> sendOffsets, List<Stream> streams) {
        int local = group.localCount(), n = group.worldSize();
        long[][] sc = new long[local][], so = new long[local][], rc = new long[local][], ro = new long[local][n];
        List<DeviceBuffer> countSend = new ArrayList<>();
        for (int i = 0; i < local; i++) {
            streams.get(i).synchronize();
            sc[i] = sendCounts.get(i).readLongs(n);
            so[i] = sendOffsets.get(i).readLongs(n);
            for (int p = 0; p < n; p++) {
                if (sc[i][p] > capacityPerPeer)
                    throw new IllegalArgumentException(group.rank(i) + " sends " + sc[i][p] + " bytes to rank " + p + ", above the capacity of " + capacityPerPeer + " bytes per peer");
                if (so[i][p] + sc[i][p] > inputs.get(i).byteSize())
                    throw new IllegalArgumentException(group.rank(i) + ": send range for rank " + p + " ends at " + (so[i][p] + sc[i][p]) + ", past the input's " + inputs.get(i).byteSize() + " bytes");
                ro[i][p] = p * capacityPerPeer;
            }
            countSend.add(sendCounts.get(i));
        }
        group.allToAll(countSend, hostCounts, 8, streams);   // who sends me how much
        for (int i = 0; i < local; i++) {
            streams.get(i).synchronize();
            rc[i] = hostCounts.get(i).readLongs(n);
        }
        group.allToAllV(inputs, sc, so, hostOutputs, rc, ro, streams);
    }

    /** Synchronizes and throws if a kernel reported an error (clamped counts, time-out, bad arguments). */
    public void checkErrors(List<Stream> streams) {
        if (backend != Backend.GIN) {
            streams.forEach(Stream::synchronize);
            return;
        }
        for (int i = 0; i < gin.ranks.size(); i++) gin.ranks.get(i).errors.check("GIN all-to-all-v", streams.get(i));
    }

    @Override public void close() {
        if (gin != null) gin.close();
        arena.close();
    }
}
