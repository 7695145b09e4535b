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
import java.util.concurrent.TimeUnit;

import static org.junit.jupiter.api.Assertions.*;

/** One process per GPU over loopback, started the way torchrun would (RANK, WORLD_SIZE, ...). */
@Tag("gpu")
class TwoProcessGpuTest {

    static List<String> runRanks(int world, String mainClass, String scenario) throws Exception {
        return runRanks(world, mainClass, scenario, Map.of());
    }

    /** Starts {@code world} ranks of {@code mainClass scenario}, {@code env} added to each one's environment, and checks that each printed "RANK r OK". */
    static List<String> runRanks(int world, String mainClass, String scenario, Map<String, String> env) throws Exception {
        int port;
        try (ServerSocket s = new ServerSocket(0)) { port = s.getLocalPort(); }
        String java = ProcessHandle.current().info().command().orElse("java");
        List<Process> procs = new ArrayList<>();
        List<Path> logs = new ArrayList<>();
        long seed = System.nanoTime();
        for (int r = 0; r < world; r++) {
            Path log = Files.createTempFile("gin4j-rank" + r, ".log");
            logs.add(log);
            ProcessBuilder pb = new ProcessBuilder(java, "--enable-native-access=ALL-UNNAMED", "-cp", classPath(), mainClass, scenario);
            pb.environment().putAll(Map.of("RANK", "" + r, "WORLD_SIZE", "" + world, "LOCAL_RANK", "" + r, "MASTER_ADDR", "127.0.0.1",
                    "MASTER_PORT", "" + port, "GIN4J_TEST_SEED", "" + seed, "NCCL_NVLS_ENABLE", "0", "GIN4J_RENDEZVOUS_TIMEOUT_S", "60",
                    "GIN4J_COMM_TIMEOUT_S", "60"));  // a rank left waiting gives up well before the 180 s below
            pb.environment().putAll(env);
            pb.redirectErrorStream(true).redirectOutput(log.toFile());
            procs.add(pb.start());
        }
        List<String> outputs = new ArrayList<>();
        for (int r = 0; r < world; r++) {
            boolean done = procs.get(r).waitFor(180, TimeUnit.SECONDS);
            if (!done) procs.forEach(Process::destroyForcibly);
            String out = Files.readString(logs.get(r));
            outputs.add(out);
            assertTrue(done, "rank " + r + " did not finish in 180 s:\n" + out);
            assertEquals(0, procs.get(r).exitValue(), "rank " + r + " failed:\n" + out);
            assertTrue(out.contains("RANK " + r + " OK"), out);
            Files.deleteIfExists(logs.get(r));
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

    static void requireTwoGpus() throws IOException {
        GpuRuntime rt = Gpus.runtimeWithDevices(2);
        Gpus.skipUnless(Nccl.isAvailable(), "no NCCL/RCCL: " + Nccl.describe());
        Gpus.requireKernels(rt, "nccl_peers");
    }

    @Test void windowsPeerStoresAndHostAllToAllAcrossProcesses() throws Exception {
        requireTwoGpus();
        runRanks(2, RankMain.class.getName(), "exchange");
    }

    @Test void ginAndHostAllToAllAcrossProcesses() throws Exception {
        requireTwoGpus();
        runRanks(2, RankMain.class.getName(), "alltoall");
    }

    /** The same across processes whose communicators are nonblocking (every NCCL host call polled). */
    @Test void ginAndHostAllToAllAcrossNonblockingProcesses() throws Exception {
        requireTwoGpus();
        runRanks(2, RankMain.class.getName(), "alltoall", Map.of("GIN4J_COMM_NONBLOCKING", "1"));
    }

    @Test void aStepThatFailsOnOneRankStopsEveryRankAndTheGroupStillWorks() throws Exception {
        requireTwoGpus();
        List<String> out = runRanks(2, RankMain.class.getName(), "oneRankFails");
        for (String o : out) assertTrue(o.contains("window refused together"), o);
    }

    @Test void mismatchedWindowsAndMoeConfigsAreRefusedOnEveryRank() throws Exception {
        requireTwoGpus();
        List<String> out = runRanks(2, RankMain.class.getName(), "mismatch");
        for (String o : out) assertTrue(o.contains("refused as expected") && o.contains("MoE GIN refused") && o.contains("MoE HOST refused"), o);
    }
}
