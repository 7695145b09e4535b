package dev.gin4j.moe;

import dev.gin4j.comm.CommGroup;
import dev.gin4j.internal.comm.PeerTable;

import java.util.Arrays;
import java.util.Map;

/**
 * Which ranks form a node, for the high-throughput exchange across nodes (gin-kernels/abi/moe_net.h,
 * MoeNetTopology): the hosts of the group (the ranks that share NCCL's LSA team, as the window
 * mapping finds them), or, for tests on one GPU only, an emulated grouping from
 * {@code GIN4J_EMULATED_NODE_SIZE} (ranks {@code [k g, (k + 1) g)} form node k; read only where
 * set, never in production). Nodes are numbered by their lowest rank; a node's ranks are in rank
 * order. The entry rank of node D for a sender s of another node is D's rank with local index
 * {@code local(s) % size(D)}; it serves s in slot {@code node(s) F + local(s) / size(D)}, with
 * F = max over node pairs of {@code ceil(size(S) / size(D))} (1 where every node has the same size).
 */
final class MoeTopology {
    /** Test-only: emulated node size (ranks per node) for ranks that NCCL sees as separate hosts on one GPU. */
    static final String EMULATED_NODE_SIZE = "GIN4J_EMULATED_NODE_SIZE";
    static final int MAX_RANKS = 16;  // MOE_NET_MAX_RANKS

    final int[] nodeOf, localOf, nodeStart, nodeSize, nodeRank;
    final int nodes, slotsPerNode, maxNodeSize;
    final boolean emulated;

    private MoeTopology(int[] nodeOfRank, boolean emulated) {
        int world = nodeOfRank.length;
        if (world < 1 || world > MAX_RANKS) throw new IllegalArgumentException("the exchange across nodes takes 1 to " + MAX_RANKS + " ranks, got " + world);
        // renumber the nodes by their lowest rank
        int[] renum = new int[world];
        Arrays.fill(renum, -1);
        int n = 0;
        nodeOf = new int[world];
        for (int r = 0; r < world; r++) {
            int h = nodeOfRank[r];
            if (h < 0 || h >= world) throw new IllegalArgumentException("rank " + r + " has node " + h + "; node ids must be in [0, " + world + ")");
            if (renum[h] < 0) renum[h] = n++;
            nodeOf[r] = renum[h];
        }
        nodes = n;
        nodeSize = new int[MAX_RANKS];
        nodeStart = new int[MAX_RANKS];
        localOf = new int[world];
        for (int r = 0; r < world; r++) localOf[r] = nodeSize[nodeOf[r]]++;
        for (int d = 1; d < nodes; d++) nodeStart[d] = nodeStart[d - 1] + nodeSize[d - 1];
        nodeRank = new int[world];
        for (int r = 0; r < world; r++) nodeRank[nodeStart[nodeOf[r]] + localOf[r]] = r;
        int max = 0, f = 1;
        for (int d = 0; d < nodes; d++) max = Math.max(max, nodeSize[d]);
        for (int s = 0; s < nodes; s++)
            for (int d = 0; d < nodes; d++) f = Math.max(f, (nodeSize[s] + nodeSize[d] - 1) / nodeSize[d]);
        maxNodeSize = max;
        slotsPerNode = f;
        this.emulated = emulated;
    }

    /** The topology of one node id per rank (any ids in [0, ranks); renumbered by lowest rank). */
    static MoeTopology of(int[] nodeOfRank) { return new MoeTopology(nodeOfRank.clone(), false); }

    /** Test-only grouping: ranks [k g, (k + 1) g) form node k (the last node may be smaller). */
    static MoeTopology emulated(int world, int g) {
        if (g < 1) throw new IllegalArgumentException(EMULATED_NODE_SIZE + " must be a rank count >= 1, got " + g);
        int[] node = new int[world];
        for (int r = 0; r < world; r++) node[r] = r / g;
        return new MoeTopology(node, true);
    }

    /**
     * Collective: the group's nodes. {@code GIN4J_EMULATED_NODE_SIZE} in {@code env} (tests on one
     * GPU, where every process is its own NCCL host) groups ranks by that size; otherwise the
     * hosts of {@link PeerTable#hostOfRank}.
     */
    static MoeTopology of(CommGroup group, Map<String, String> env) {
        int g = emulatedNodeSize(env);
        return g > 0 ? emulated(group.worldSize(), g) : of(PeerTable.hostOfRank(group));
    }

    /** {@code GIN4J_EMULATED_NODE_SIZE} from {@code env}: 0 where unset or blank (production), else the size (>= 1). */
    static int emulatedNodeSize(Map<String, String> env) {
        String v = env.get(EMULATED_NODE_SIZE);
        if (v == null || v.isBlank()) return 0;
        int g;
        try {
            g = Integer.parseInt(v.trim());
        } catch (NumberFormatException e) {
            throw new IllegalArgumentException(EMULATED_NODE_SIZE + " must be a whole number of ranks per emulated node (tests on one GPU only), got \"" + v + "\"");
        }
        if (g < 1) throw new IllegalArgumentException(EMULATED_NODE_SIZE + " must be a rank count >= 1 (tests on one GPU only), got " + g);
        return g;
    }

    int ranks() { return nodeOf.length; }

    int nodeRank(int d, int i) { return nodeRank[nodeStart[d] + i]; }

    /** The rank of node d that receives what sender s (of another node) sends to d. */
    int entry(int s, int d) { return nodeRank(d, localOf[s] % nodeSize[d]); }

    /** The slot in which entry(s, d) serves sender s. */
    int slot(int s, int d) { return nodeOf[s] * slotsPerNode + localOf[s] / nodeSize[d]; }

    /** The sender that rank me serves in slot sigma, or -1. */
    int slotSource(int me, int sigma) {
        int src = sigma / slotsPerNode, j = sigma % slotsPerNode, d = nodeOf[me];
        if (src == d || src >= nodes) return -1;
        int li = j * nodeSize[d] + localOf[me];
        return li < nodeSize[src] ? nodeRank(src, li) : -1;
    }

    /** Slots per entry rank: N x F. */
    int slots() { return nodes * slotsPerNode; }

    /** HT dispatch blocks per chunk on rank r: direct senders, node senders, forwarders, receivers. */
    int dispatchBlocksPerChunk(int r) {
        int g = nodeSize[nodeOf[r]];
        return g + (nodes - 1) + (nodes - 1) * slotsPerNode * g + ranks();
    }

    /** Of those, the sending roles (a staged send's grid): direct senders and node senders. */
    int dispatchSendBlocksPerChunk(int r) { return nodeSize[nodeOf[r]] + (nodes - 1); }

    /** HT combine blocks per chunk: partial senders, node reducers, reducers. */
    int combineBlocksPerChunk() { return ranks() + (nodes - 1) * slotsPerNode + ranks(); }

    /** Of those, the sending roles: the partial senders. */
    int combineSendBlocksPerChunk() { return ranks(); }

    /** The most HT blocks per chunk of any launch on any rank. */
    int maxBlocksPerChunk() {
        int m = combineBlocksPerChunk();
        for (int r = 0; r < ranks(); r++) m = Math.max(m, dispatchBlocksPerChunk(r));
        return m;
    }

    /** E.g. "2 nodes of 2 ranks (emulated: GIN4J_EMULATED_NODE_SIZE)". */
    String describe() {
        StringBuilder b = new StringBuilder().append(nodes).append(nodes == 1 ? " node" : " nodes").append(" of ");
        int[] sizes = Arrays.copyOf(nodeSize, nodes);
        if (Arrays.stream(sizes).distinct().count() == 1) b.append(sizes[0]).append(sizes[0] == 1 ? " rank" : " ranks");
        else b.append(Arrays.toString(sizes)).append(" ranks");
        if (emulated) b.append(" (emulated: ").append(EMULATED_NODE_SIZE).append(")");
        return b.toString();
    }
}
