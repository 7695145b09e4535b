package dev.gin4j.comm;

import dev.gin4j.gpu.GpuRuntime;
import dev.gin4j.testing.Gpus;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

import java.util.List;
import java.util.Map;

import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * GPU-initiated networking that runs without an RDMA device: two to four processes on one GPU, each
 * posing as its own host, so every peer is outside the LSA team and every byte between ranks goes
 * through NCCL's GIN proxy backend and the loopback GIN transport (gin-kernels/loopback). Runs where
 * NCCL_GIN_PLUGIN names that transport and GIN4J_NCCL_LIBRARY an NCCL >= 2.29.7 (ci/gpu-test's gin
 * phase sets both); elsewhere it skips and says why.
 */
@Tag("gpu")
class LoopbackGinGpuTest {

    private static TwoProcessGpuTest.Placement ranksAsHosts() throws Exception {
        GpuRuntime rt = Gpus.runtimeWithDevices(1);
        String plugin = System.getenv("NCCL_GIN_PLUGIN");
        Gpus.skipUnless(plugin != null && plugin.contains("loopback"), "NCCL_GIN_PLUGIN does not name the loopback GIN transport (it is " + plugin + ")");
        Gpus.skipUnless(Nccl.isAvailable() && Nccl.version() >= 22907, "GIN plugins need NCCL >= 2.29.7; loaded: " + Nccl.describe());
        Gpus.requireKernels(rt, "nccl_gin_a2a");
        return TwoProcessGpuTest.Placement.ONE_GPU_AS_HOSTS;
    }

    private static void allToAll(int world) throws Exception {
        // NCCL's own log says which GIN plugin it took
        List<String> out = TwoProcessGpuTest.runRanks(ranksAsHosts(), "ginAllToAll", Map.of("NCCL_DEBUG", "INFO", "NCCL_DEBUG_SUBSYS", "INIT,NET"), world);
        for (String o : out) {
            assertTrue(o.contains("Assigned GIN plugin gin4j-loopback"), "NCCL did not report taking the loopback GIN plugin:\n" + o);
            assertTrue(o.contains("on the network"), o);
            assertTrue(o.contains("1000 back-to-back GIN all-to-alls") && o.contains("replayed 1000 times") && o.contains("all-to-all-v case 5"), o);
            System.out.println(o.lines().filter(l -> l.startsWith("rank ") || l.contains("GIN plugin") || l.contains("gin4j-loopback"))
                    .reduce("", (a, b) -> a + b + "\n"));
        }
    }

    @Test void twoRanksAllToAllThroughGin() throws Exception { allToAll(2); }

    @Test void threeRanksAllToAllThroughGin() throws Exception { allToAll(3); }

    @Test void fourRanksAllToAllThroughGin() throws Exception { allToAll(4); }

    private static void moe(int world) throws Exception { moe(world, Map.of()); }

    private static List<String> moe(int world, Map<String, String> env) throws Exception {
        TwoProcessGpuTest.Placement placement = ranksAsHosts();  // skips, with the reason, where the transport is missing
        Gpus.requireKernels(Gpus.runtime(), "nccl_gin_moe");
        // 1,000 pairs or graph replays queued back to back take 50 ms (2 ranks) to 0.3 s (4 ranks)
        // each while the processes time-slice the GPU: the one host wait after them needs more than
        // the 60 s default (a stuck rank is still cut by GIN4J_TEST_RANK_LIMIT_S)
        Map<String, String> withWait = new java.util.HashMap<>(env);
        withWait.putIfAbsent("GIN4J_COMM_TIMEOUT_S", "900");
        List<String> out = TwoProcessGpuTest.runRanks(placement, "ginMoe", withWait, world);
        java.util.Set<String> phases = LoopbackGinMoeRank.phases();
        if (phases.size() < LoopbackGinMoeRank.ALL_PHASES.size()) System.out.println("GIN4J_TEST_MOE_PHASES: only " + phases + " of " + LoopbackGinMoeRank.ALL_PHASES + " run");
        for (String o : out) {
            assertTrue(o.contains("phases " + phases + " done"), o);
            if (phases.contains("cases"))
                assertTrue((o.contains("MoE across nodes, DeepSeek-V3 fp8 T=128 GIN") || world == 3) && o.contains("dispatch: ") && o.contains("combine: "), o);
            if (phases.contains("pairs")) assertTrue(o.contains("1000 back-to-back MoE dispatch + combine pairs"), o);
            if (phases.contains("replays")) assertTrue(o.contains("replayed 1000 times"), o);
            if (phases.contains("outputs"))
                assertTrue(o.contains("MoE across nodes, grouped GEMM: offsets") && o.contains(" into the caller's rows, weights, counts and y: offsets"), o);
            if (phases.contains("staged"))
                assertTrue(o.contains("MoE across nodes, staged ") && o.contains("200 graph replays checked") && o.contains(" staged ") && o.contains("CPU us per Java call"), o);
            System.out.println(o.lines().filter(l -> l.startsWith("rank ")).reduce("", (a, b) -> a + b + "\n"));
        }
        return out;
    }

    /** The high-throughput mode, each rank its own node: the entry rank of a node is its one rank, nothing is forwarded. */
    private static void highThroughput(int world) throws Exception {
        List<String> out = moe(world, Map.of("GIN4J_TEST_MOE_MODES", "HIGH_THROUGHPUT", "GIN4J_TEST_MOE_CASES", "short",
                "GIN4J_TEST_MOE_LARGE", world == 2 ? "1" : "0"));
        boolean cases = LoopbackGinMoeRank.phases().contains("cases");
        for (String o : out) assertTrue((!cases || o.contains("HIGH_THROUGHPUT: ") && o.contains("HT dispatch: ")) && !o.contains("HT dispatch (inside the node)"), o);
    }

    @Test @Tag("gin-moe") void twoRanksMoeHighThroughput() throws Exception { highThroughput(2); }

    @Test @Tag("gin-moe") void threeRanksMoeHighThroughput() throws Exception { highThroughput(3); }

    @Test @Tag("gin-moe") void fourRanksMoeHighThroughput() throws Exception { highThroughput(4); }

    /**
     * Four ranks as two emulated nodes of two (GIN4J_EMULATED_NODE_SIZE=2; each process is still its
     * own NCCL host, so the hop inside a node goes through GIN too and is counted): both modes on
     * every case, the high-throughput one forwarding through each node's entry rank and reducing in
     * the node; then 1,000 pairs alternating between the modes, and 1,000 replays of a captured
     * high-throughput pair (the mode whose path depends on the nodes).
     */
    @Test @Tag("gin-moe") void fourRanksAsTwoNodesMoeBothModes() throws Exception {
        List<String> out = moe(4, Map.of("GIN4J_EMULATED_NODE_SIZE", "2", "GIN4J_TEST_MOE_MODES", "LOW_LATENCY,HIGH_THROUGHPUT",
                "GIN4J_TEST_MOE_CASES", "short", "GIN4J_TEST_MOE_LARGE", "1"));
        java.util.Set<String> phases = LoopbackGinMoeRank.phases();
        for (String o : out)
            assertTrue((!phases.contains("cases") || o.contains("HIGH_THROUGHPUT: ") && o.contains("LOW_LATENCY: ") && o.contains("HT dispatch (inside the node)"))
                    && (!phases.contains("pairs") || o.contains("pairs across nodes (alternating [LOW_LATENCY, HIGH_THROUGHPUT])"))
                    && (!phases.contains("replays") || o.contains("across nodes (HIGH_THROUGHPUT) replayed 1000 times"))
                    && (!phases.contains("outputs") || o.contains("LOW_LATENCY at alignment") && o.contains("HIGH_THROUGHPUT at alignment")), o);
    }

    /** MoE dispatch and combine across nodes: 2, 3 and 4 ranks, each its own host, every row through GIN. */
    @Test @Tag("gin-moe") void twoRanksMoeAcrossNodes() throws Exception { moe(2); }

    @Test @Tag("gin-moe") void threeRanksMoeAcrossNodes() throws Exception { moe(3); }

    @Test @Tag("gin-moe") void fourRanksMoeAcrossNodes() throws Exception { moe(4); }

    /**
     * A rank that dies between two MoE exchanges across nodes, in each mode: the other's next
     * dispatch and combine fail within the time-out and its group is aborted; nothing hangs.
     */
    @Test @Tag("gin-moe") void aPeerThatDiesDuringMoeAcrossNodesIsReportedInEitherMode() throws Exception {
        TwoProcessGpuTest.Placement placement = ranksAsHosts();
        Gpus.requireKernels(Gpus.runtime(), "nccl_gin_moe");
        for (String mode : List.of("LOW_LATENCY", "HIGH_THROUGHPUT")) {
            List<String> out = TwoProcessGpuTest.runRanks(placement, "ginMoePeerDies", Map.of("GIN4J_COMM_TIMEOUT_S", "15", "GIN4J_TEST_MOE_MODES", mode), 2);
            String failure = out.get(1).lines().filter(l -> l.contains("with a dead peer failed")).findFirst().orElse("");
            System.out.println(failure);
            assertTrue(failure.contains("(" + mode + ")"), "rank 1 did not report the failed exchange in " + mode + ":\n" + out.get(1));
        }
    }

    /**
     * A rank that dies mid-run: the others' next GIN exchange fails well within the time-out,
     * naming the peer (the transport sees its process gone and NCCL reports that), and their group
     * is aborted.
     */
    @Test void aPeerThatDiesDuringGinIsReportedAndNothingHangs() throws Exception {
        List<String> out = TwoProcessGpuTest.runRanks(ranksAsHosts(), "ginPeerDies", Map.of("GIN4J_COMM_TIMEOUT_S", "15"), 2);
        String failure = out.get(1).lines().filter(l -> l.contains("with a dead peer failed")).findFirst().orElse("");
        System.out.println(failure);
        assertTrue(failure.contains("peer rank 0") && failure.contains("is gone"), "the error does not name the dead peer:\n" + out.get(1));
    }
}
