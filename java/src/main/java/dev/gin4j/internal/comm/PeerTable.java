package dev.gin4j.internal.comm;

import dev.gin4j.bindings.a2a.GinResolvePeersArgs;
import dev.gin4j.comm.CommException;
import dev.gin4j.comm.CommGroup;
import dev.gin4j.internal.gpu.KernelLibrary;
import dev.gin4j.gpu.CodeObject;
import dev.gin4j.gpu.DeviceBuffer;
import dev.gin4j.gpu.KernelArgs;
import dev.gin4j.gpu.LaunchConfig;
import dev.gin4j.gpu.Stream;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.List;

/**
 * For each local rank, a device array of {@code worldSize} addresses: where each rank's copy of a
 * symmetric window is mapped in this process (0 where a peer is not load/store reachable).
 * Kernels store into peers through it. For a window gin4j maps itself
 * ({@link SymmetricWindow#allocate}) the addresses come from that mapping (peer access in one
 * process, CUDA / HIP IPC with one process per GPU), with any NCCL version. For a window registered
 * with NCCL ({@link SymmetricWindow#allocateRegistered}): one process driving all GPUs shares one
 * address space, so the table is the ranks' own window addresses ({@code ncclMemAlloc} grants peer
 * access); with one process per GPU, NCCL maps peers' windows at registration and the device API
 * tells where ({@code ncclGetLsaPointer}, in the gin_resolve_peers kernel, built against the
 * headers of the NCCL that loads it).
 */
public final class PeerTable {
    private final List<DeviceBuffer> tables;
    private final List<long[]> host;
    private final String source;
    private final boolean allReachable;
    private final String unreachable;

    private PeerTable(List<DeviceBuffer> tables, List<long[]> host, String source) {
        this(tables, host, source, host.stream().allMatch(b -> java.util.Arrays.stream(b).allMatch(a -> a != 0)), "");
    }

    private PeerTable(List<DeviceBuffer> tables, List<long[]> host, String source, boolean allReachable, String unreachable) {
        this.tables = tables;
        this.host = host;
        this.source = source;
        this.allReachable = allReachable;
        this.unreachable = unreachable;
    }

    /**
     * Collective: whether some peer of {@code group} is not load/store reachable (on another node),
     * the same answer on every rank; found on a small probe window. False for one process.
     */
    public static boolean someoneUnreachable(CommGroup group) {
        if (group.isSingleProcess()) return false;
        try (SymmetricWindow probe = SymmetricWindow.allocate(group, WindowLayout.builder().region("probe", 4096, 4096).build());
             Arena a = Arena.ofConfined()) {
            // together, before the probe's collective release
            return Groups.failTogether(group, "finding where the peers are", () -> !resolve(probe, a).allReachable());
        }
    }

    /**
     * Collective: which host every rank is on, the same table on every rank: result[rank] = the
     * index of its host, hosts numbered in the order of their lowest rank. A host is what
     * {@link #someoneUnreachable} and the window mapping call one: the same machine and the same
     * {@code GIN4J_HOSTID} (else {@code NCCL_HOSTID}) where set. One process: a single host.
     */
    public static int[] hostOfRank(CommGroup group) {
        int world = group.worldSize();
        if (group.isSingleProcess()) return new int[world];
        long key = LsaPeers.hostKey(System.getenv(), LsaPeers.machineIdentity());
        long[] mine = new long[group.ranks().size()];
        java.util.Arrays.fill(mine, key);
        long[] all = group.allGatherLongs(mine)[0];
        return hostIndices(all);
    }

    /** Host indices from one key per rank: equal keys, equal index; numbered by first appearance. */
    static int[] hostIndices(long[] keys) {
        java.util.Map<Long, Integer> index = new java.util.LinkedHashMap<>();
        int[] out = new int[keys.length];
        for (int r = 0; r < keys.length; r++) out[r] = index.computeIfAbsent(keys[r], k -> index.size());
        return out;
    }

    /**
     * The table of {@code window}: from gin4j's own mapping, or for a registered window the way that
     * works for how the group was set up. Local work (no collective); tables live as long as {@code arena}.
     */
    public static PeerTable resolve(SymmetricWindow window, Arena arena) {
        if (!window.isRegistered()) return fromMapping(window, arena);
        return window.group().isSingleProcess() ? direct(window, arena) : fromDeviceApi(window, arena);
    }

    /** A gin4j-mapped window: the addresses its mapping found, the reachability every rank agreed on. */
    private static PeerTable fromMapping(SymmetricWindow window, Arena arena) {
        LsaPeers peers = window.peers();
        CommGroup g = window.group();
        List<DeviceBuffer> tables = new ArrayList<>();
        List<long[]> host = new ArrayList<>();
        for (int i = 0; i < g.localCount(); i++) {
            long[] bases = peers.bases()[i].clone();
            DeviceBuffer t = g.rank(i).device().allocate(8L * bases.length, arena);
            t.copyFromHost(MemorySegment.ofArray(bases.clone()));
            tables.add(t);
            host.add(bases);
        }
        String source = g.isSingleProcess() ? "direct addresses (one process, peer access)" : "CUDA/HIP IPC handles exchanged over the group";
        return new PeerTable(tables, host, source, peers.allReachable(), peers.unreachable());
    }

    /** Single process: the ranks' own window addresses (a registered window, or one gin4j mapped: both grant peer access). */
    public static PeerTable direct(SymmetricWindow window, Arena arena) {
        CommGroup g = window.group();
        if (!g.isSingleProcess()) throw new IllegalStateException("direct peer addresses need one process driving every rank");
        long[] bases = new long[g.worldSize()];
        for (int i = 0; i < g.localCount(); i++) bases[g.rank(i).rank()] = window.buffer(i).address();
        List<DeviceBuffer> tables = new ArrayList<>();
        List<long[]> host = new ArrayList<>();
        for (int i = 0; i < g.localCount(); i++) {
            var dev = g.rank(i).device();
            for (int j = 0; j < g.localCount(); j++) {
                if (i != j && !dev.canAccessPeer(g.rank(j).device())) {
                    throw new CommException(dev + " has no load/store access to " + g.rank(j).device() + ": the GPU-initiated path needs NVLink/xGMI or PCIe peer access");
                }
            }
            DeviceBuffer t = dev.allocate(8L * bases.length, arena);
            t.copyFromHost(MemorySegment.ofArray(bases.clone()));
            tables.add(t);
            host.add(bases.clone());
        }
        return new PeerTable(tables, host, "direct addresses (one process, shared address space)");
    }

    /** A registered window, any process layout: asks NCCL's device API through the gin_resolve_peers kernel. Collective. */
    public static PeerTable fromDeviceApi(SymmetricWindow window, Arena arena) {
        CommGroup g = window.group();
        if (!window.isRegistered()) throw new IllegalArgumentException("NCCL's device API knows only windows registered with NCCL (SymmetricWindow.allocateRegistered); this one gin4j mapped itself");
        List<DeviceBuffer> tables = new ArrayList<>();
        List<long[]> host = new ArrayList<>();
        try (DeviceComm dc = DeviceComm.create(g, new DeviceComm.Requirements(0, 0, 0))) {
            for (int i = 0; i < g.localCount(); i++) {
                var dev = g.rank(i).device();
                try (Stream s = dev.createStream(); CodeObject peers = KernelLibrary.load(dev, "nccl_peers"); Arena tmp = Arena.ofConfined()) {
                    DeviceBuffer t = dev.allocate(8L * g.worldSize(), arena);
                    KernelErrors err = new KernelErrors(dev, tmp, s);
                    NcclDeviceAbi abi = dc.abi();
                    KernelArgs args = KernelArgs.ofStruct(tmp, KernelArgs.Type.struct(abi.devCommSize(), Math.max(abi.devCommAlign(), 1)), GinResolvePeersArgs.layout())
                            .setStruct(0, dc.struct(i).asSlice(0, abi.devCommSize()));
                    MemorySegment a = args.struct();
                    GinResolvePeersArgs.window(a, MemorySegment.ofAddress(window.handle(i).address()));
                    GinResolvePeersArgs.windowOffset(a, 0);
                    GinResolvePeersArgs.nranks(a, g.worldSize());
                    args.setPointerField(GinResolvePeersArgs.peerBases$offset(), t).setPointerField(GinResolvePeersArgs.errorFlags$offset(), err.buffer());
                    t.fill((byte) 0, s);
                    peers.kernel("gin_resolve_peers").launch(s, LaunchConfig.of(1, 64), args);
                    err.check("gin_resolve_peers", s);
                    long[] bases = t.readLongs(g.worldSize(), s);
                    // NCCL maps the symmetric window into its own address range, so even the own
                    // entry may be an alias of the allocation rather than its address: both work.
                    if (bases[g.rank(i).rank()] == 0) throw new CommException("NCCL's device API gives no address for " + g.rank(i) + "'s own window");
                    tables.add(t);
                    host.add(bases);
                }
            }
        }
        return new PeerTable(tables, host, "NCCL device API (ncclGetLsaPointer)");
    }

    /** The device array for local rank {@code localIndex}. */
    public DeviceBuffer table(int localIndex) { return tables.get(localIndex); }

    /** A host copy of local rank {@code localIndex}'s table. */
    public long[] bases(int localIndex) { return host.get(localIndex).clone(); }

    /**
     * Whether every peer of every local rank is load/store reachable; for a gin4j-mapped window,
     * whether every rank reaches every other one, the same answer on every rank.
     */
    public boolean allReachable() { return allReachable; }

    /** Why some peer is not reachable (another host, a window that could not be mapped), or "" where that is not known or all are. */
    public String unreachable() { return unreachable; }

    /** Where the addresses came from (for reports). */
    public String source() { return source; }
}
