package dev.gin4j.comm;

import dev.gin4j.gpu.GpuRuntime;
import dev.gin4j.testing.Gpus;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

import java.io.IOException;
import java.net.ServerSocket;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;

import static org.junit.jupiter.api.Assertions.*;

/**
 * One process per rank, started the way torchrun would (RANK, WORLD_SIZE, ...): one GPU each where
 * the machine has two, or else both on its one GPU, each posing as its own host ({@link Placement}).
 */
@Tag("gpu")
class TwoProcessGpuTest {

    /** Where the ranks run. */
    enum Placement {
        /** A GPU per rank (LOCAL_RANK = rank), the way a node runs them. */
        GPU_EACH,
        /**
         * Every rank on GPU 0, each with its own NCCL_HOSTID: NCCL takes them for separate hosts
         * (it refuses two ranks of one host on one GPU) and links them by sockets on loopback. The
         * host-initiated paths and every cross-process agreement then run on a one-GPU machine; the
         * GPU-initiated ones must be refused (RankMain.ONE_GPU_AS_HOSTS): gin4j, too, takes ranks
         * with different NCCL_HOSTIDs for different hosts.
         */
        ONE_GPU_AS_HOSTS,
        /**
         * Every rank on GPU 0, separate hosts for NCCL (NCCL_HOSTID per rank, sockets on loopback, as
         * above) but one host for gin4j (one GIN4J_HOSTID): gin4j maps the ranks' windows with CUDA /
         * HIP IPC on the one GPU, so the GPU-initiated paths run over LSA, with no NCCL device API.
         */
        ONE_GPU_ONE_HOST;

        Map<String, String> env(int rank) {
            return switch (this) {
                case GPU_EACH -> Map.of("LOCAL_RANK", "" + rank, "GIN4J_TEST_PLACEMENT", "gpu-each");
                case ONE_GPU_AS_HOSTS -> Map.of("LOCAL_RANK", "0", "GIN4J_TEST_PLACEMENT", "one-gpu-as-hosts", "NCCL_HOSTID", "gin4j-test-host-" + rank,
                        "NCCL_SOCKET_IFNAME", "lo", "NCCL_IB_DISABLE", "1");
                case ONE_GPU_ONE_HOST -> Map.of("LOCAL_RANK", "0", "GIN4J_TEST_PLACEMENT", "one-gpu-one-host", "NCCL_HOSTID", "gin4j-test-host-" + rank,
                        "GIN4J_HOSTID", "gin4j-test-one-host", "NCCL_SOCKET_IFNAME", "lo", "NCCL_IB_DISABLE", "1");
            };
        }
    }

    private static final Set<Placement> SAID = ConcurrentHashMap.newKeySet();

    /** Two ranks: on two GPUs where there are two, else both on the one GPU (skipped without a GPU, NCCL or the kernels). */
    static Placement twoRanks() throws IOException {
        GpuRuntime rt = Gpus.runtimeWithDevices(1);
        Gpus.skipUnless(Nccl.isAvailable(), "no NCCL/RCCL: " + Nccl.describe());
        Gpus.requireKernels(rt, "a2a");
        Placement p = rt.devices().size() >= 2 ? Placement.GPU_EACH : Placement.ONE_GPU_AS_HOSTS;
        if (p == Placement.ONE_GPU_AS_HOSTS && SAID.add(p))
            System.err.println("TwoProcessGpuTest: one GPU, so both ranks run on it, each posing as its own host (NCCL over loopback sockets;"
                    + " the GPU-initiated paths are checked to be refused, the host-initiated ones to work)");
        return p;
    }

    static List<String> runRanks(Placement placement, String scenario) throws Exception {
        return runRanks(placement, scenario, Map.of());
    }

    /** Starts two ranks of {@link RankMain} {@code scenario} placed as given, {@code env} added to each one's environment, and checks that each printed "RANK r OK". */
    static List<String> runRanks(Placement placement, String scenario, Map<String, String> env) throws Exception {
        return runRanks(placement, scenario, env, 2);
    }

    /** The same with {@code world} ranks. */
    static List<String> runRanks(Placement placement, String scenario, Map<String, String> env, int world) throws Exception {
        int port;
        try (ServerSocket s = new ServerSocket(0)) { port = s.getLocalPort(); }
        String java = ProcessHandle.current().info().command().orElse("java");
        List<Process> procs = new ArrayList<>();
        List<Path> logs = new ArrayList<>();
        long seed = System.nanoTime();
        // GIN4J_TEST_LOG_DIR keeps each rank's log there as it is written (a run cut short still shows how far it got)
        String logDir = System.getenv("GIN4J_TEST_LOG_DIR");
        int limitS = Integer.parseInt(System.getenv().getOrDefault("GIN4J_TEST_RANK_LIMIT_S", "180"));
        try {
            for (int r = 0; r < world; r++) {
                Path log = logDir == null ? Files.createTempFile("gin4j-rank" + r, ".log")
                        : Files.createDirectories(Path.of(logDir)).resolve(scenario + "-" + world + "ranks-rank" + r + "-" + seed + ".log");
                logs.add(log);
                ProcessBuilder pb = new ProcessBuilder(java, "--enable-native-access=ALL-UNNAMED", "-cp", classPath(), RankMain.class.getName(), scenario);
                pb.environment().remove("NCCL_COMM_BLOCKING");  // the test's own GIN4J_COMM_NONBLOCKING decides
                pb.environment().remove("GIN4J_HOSTID");  // the placement decides which ranks gin4j takes for one host
                pb.environment().putAll(Map.of("RANK", "" + r, "WORLD_SIZE", "" + world, "MASTER_ADDR", "127.0.0.1",
                        "MASTER_PORT", "" + port, "GIN4J_TEST_SEED", "" + seed, "NCCL_NVLS_ENABLE", "0", "GIN4J_RENDEZVOUS_TIMEOUT_S", "60",
                        "GIN4J_COMM_TIMEOUT_S", "60"));  // a rank left waiting gives up well before the limit below (180 s by default)
                pb.environment().putAll(placement.env(r));
                pb.environment().putAll(env);
                pb.redirectErrorStream(true).redirectOutput(log.toFile());
                procs.add(pb.start());
            }
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(limitS);
            for (Process p : procs) p.waitFor(Math.max(0, deadline - System.nanoTime()), TimeUnit.NANOSECONDS);
        } finally {
            // no rank outlives the test: one left behind could hold the GPU, or wait in NCCL, under every later test
            for (Process p : procs) {
                if (p.isAlive()) {
                    p.destroyForcibly();
                    p.waitFor(10, TimeUnit.SECONDS);
                }
            }
        }
        List<String> outputs = new ArrayList<>();
        for (int r = 0; r < world; r++) outputs.add(Files.readString(logs.get(r)));
        if (logDir == null) for (Path log : logs) Files.deleteIfExists(log);
        for (int r = 0; r < world; r++) {
            Process p = procs.get(r);
            String out = outputs.get(r);
            assertEquals(0, p.exitValue(), "rank " + r + " failed or did not finish in " + limitS + " s (killed; GIN4J_TEST_RANK_LIMIT_S sets the limit):\n" + out);
            assertTrue(out.contains("RANK " + r + " OK"), out);
        }
        return outputs;
    }

    /** Where the test, library and bindings classes came from (the JUnit console loads them outside java.class.path). */
    static String classPath() throws Exception {
        java.util.LinkedHashSet<String> parts = new java.util.LinkedHashSet<>();
        for (Class<?> c : List.of(RankMain.class, CommGroup.class, dev.gin4j.bindings.NativeLibrary.class)) {
            parts.add(Path.of(c.getProtectionDomain().getCodeSource().getLocation().toURI()).toString());
        }
        parts.add(System.getProperty("java.class.path"));
        return String.join(java.io.File.pathSeparator, parts);
    }

    @Test void windowsPeerStoresAndHostAllToAllAcrossProcesses() throws Exception {
        runRanks(twoRanks(), "exchange");
    }

    @Test void ginAndHostAllToAllAcrossProcesses() throws Exception {
        runRanks(twoRanks(), "alltoall");
    }

    /** The same across processes whose communicators are nonblocking (every NCCL host call polled). */
    @Test void ginAndHostAllToAllAcrossNonblockingProcesses() throws Exception {
        runRanks(twoRanks(), "alltoall", Map.of("GIN4J_COMM_NONBLOCKING", "1"));
    }

    /** Blocking and nonblocking groups (the agreements and the HOST exchange are NCCL calls that the latter polls). */
    private static final List<Map<String, String>> BOTH_MODES = List.of(Map.of("GIN4J_COMM_NONBLOCKING", "0"), Map.of("GIN4J_COMM_NONBLOCKING", "1"));

    @Test void aStepThatFailsOnOneRankStopsEveryRankAndTheGroupStillWorks() throws Exception {
        Placement p = twoRanks();
        for (Map<String, String> mode : BOTH_MODES)
            for (String o : runRanks(p, "oneRankFails", mode)) assertTrue(o.contains("window refused together"), mode + ": " + o);
    }

    /** MoE dispatch and combine across processes against the CPU reference: HOST, and GIN where each rank has a GPU. */
    @Test void moeExchangeAcrossProcesses() throws Exception {
        Placement p = twoRanks();
        for (Map<String, String> mode : BOTH_MODES) {
            for (String o : runRanks(p, "moe", mode)) {
                assertTrue(o.contains("MoE HOST: "), mode + ": " + o);
                assertEquals(p == Placement.GPU_EACH, o.contains("MoE GIN: "), mode + ": " + o);
            }
        }
    }

    /** Expert offsets, host counts and per-rank expert alignment across processes: HOST, and GIN where each rank has a GPU. */
    @Test void moeGroupedGemmLayoutAcrossProcesses() throws Exception {
        Placement p = twoRanks();
        for (String o : runRanks(p, "moeGroupedGemm")) {
            assertTrue(o.contains("MoE grouped GEMM HOST: alignment "), o);
            assertEquals(p == Placement.GPU_EACH, o.contains("MoE grouped GEMM GIN: alignment "), o);
        }
    }

    /**
     * Rank 0 halts, closing nothing, after a HOST all-to-all with rank 1: rank 1's next one fails
     * within the host-wait time-out, blocking or not, and its group is aborted. Over sockets (one
     * GPU) NCCL reports the closed connection at once, which RankMain checks; over NVLink nothing
     * reports the death, and the wait ends at the time-out.
     */
    @Test void aPeerThatDiesIsReportedAndNothingHangs() throws Exception {
        Placement p = twoRanks();
        for (String nonblocking : List.of("0", "1")) {
            List<String> out = runRanks(p, "peerDies", Map.of("GIN4J_COMM_TIMEOUT_S", "15", "GIN4J_COMM_NONBLOCKING", nonblocking));
            assertTrue(out.get(1).contains("with a dead peer failed"), out.get(1));
        }
    }

    /**
     * Rank 0 halts before the ranks ever exchanged point to point: NCCL then sets the connection up
     * inside rank 1's ncclGroupEnd, which waits for the dead peer. A nonblocking group bounds that
     * wait by its time-out; a blocking one waits there for ever (measured on one GPU), so only the
     * nonblocking mode is tested.
     */
    @Test void aPeerThatDiesBeforeConnectingIsReportedWithinTheTimeoutWhenNonblocking() throws Exception {
        List<String> out = runRanks(twoRanks(), "peerDiesBeforeConnecting", Map.of("GIN4J_COMM_TIMEOUT_S", "15", "GIN4J_COMM_NONBLOCKING", "1"));
        assertTrue(out.get(1).contains("with a dead peer failed"), out.get(1));
    }

    /**
     * Rank 0 halts; rank 1 queues an all-to-all it never waits for and closes its group: the close
     * ends (a blocking group is aborted once NCCL reports the dead peer, where ncclCommDestroy
     * would wait for the exchange; a nonblocking one's finalize ends at the report, or over NVLink,
     * where nothing reports the death, at the time-out). A blocking group over NVLink has no report
     * to act on, so only the nonblocking one is tested there.
     */
    @Test void aGroupWhosePeerDiedStillCloses() throws Exception {
        Placement p = twoRanks();
        for (String nonblocking : p == Placement.ONE_GPU_AS_HOSTS ? List.of("0", "1") : List.of("1")) {
            List<String> out = runRanks(p, "peerDiesThenClose", Map.of("GIN4J_COMM_TIMEOUT_S", "15", "GIN4J_COMM_NONBLOCKING", nonblocking));
            assertTrue(out.get(1).contains("the group closed in") || out.get(1).contains("the close threw after"), out.get(1));
        }
    }

    @Test void mismatchedWindowsAndMoeConfigsAreRefusedOnEveryRank() throws Exception {
        Placement p = twoRanks();
        for (Map<String, String> mode : BOTH_MODES)
            for (String o : runRanks(p, "mismatch", mode))
                assertTrue(o.contains("refused as expected") && o.contains("MoE GIN refused") && o.contains("MoE HOST refused"), mode + ": " + o);
    }
}
