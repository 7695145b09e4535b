package dev.gin4j.comm;

import dev.gin4j.gpu.GpuRuntime;
import dev.gin4j.internal.gpu.KernelLibrary;
import dev.gin4j.testing.Gpus;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

import java.util.List;
import java.util.Map;

import static org.junit.jupiter.api.Assertions.*;

/**
 * The LSA path with one process per GPU, whatever NCCL is loaded: every rank on GPU 0, separate
 * hosts for NCCL (sockets on loopback) but one host for gin4j (GIN4J_HOSTID), so gin4j maps the
 * ranks' windows with CUDA / HIP IPC and the GIN backends run with no NCCL device API
 * ({@link TwoProcessGpuTest.Placement#ONE_GPU_ONE_HOST}). Run with GIN4J_NCCL_LIBRARY naming
 * another libnccl to check another NCCL version against the same code objects (ci/gpu-test's
 * {@code versions} phase does that for every NCCL the GPU host has).
 */
@Tag("gpu")
class LsaIpcGpuTest {

    private static TwoProcessGpuTest.Placement oneGpuOneHost() {
        GpuRuntime rt = Gpus.runtimeWithDevices(1);
        Gpus.skipUnless(Nccl.isAvailable(), "no NCCL/RCCL: " + Nccl.describe());
        Gpus.requireKernels(rt, "a2a");
        System.err.println("LsaIpcGpuTest: " + Capabilities.describeLibrary() + "; kernels from " + KernelLibrary.get().source()
                + KernelLibrary.get().property("nccl.version").map(v -> " (device-API objects built against NCCL " + v + ")").orElse(""));
        return TwoProcessGpuTest.Placement.ONE_GPU_ONE_HOST;
    }

    /** Each rank stores into the next one's window through the IPC-mapped peer table. */
    @Test void peerStoresThroughIpcMappedWindows() throws Exception {
        for (String o : TwoProcessGpuTest.runRanks(oneGpuOneHost(), "exchange"))
            assertTrue(o.contains("every peer mapped (CUDA/HIP IPC"), o);
    }

    /** Uniform all-to-all (by size and through the copy engines) and all-to-all-v, GIN over LSA next to HOST. */
    @Test void allToAllAndAllToAllVOverLsa() throws Exception {
        TwoProcessGpuTest.runRanks(oneGpuOneHost(), "alltoall");
    }

    /** The same with three ranks, nonblocking communicators (every NCCL host call polled). */
    @Test void allToAllOverLsaWithThreeNonblockingRanks() throws Exception {
        TwoProcessGpuTest.runRanks(oneGpuOneHost(), "alltoall", Map.of("GIN4J_COMM_NONBLOCKING", "1"), 3);
    }

    /** MoE dispatch and combine, GIN over LSA and HOST, against the CPU reference; both layouts identical. */
    @Test void moeDispatchAndCombineOverLsa() throws Exception {
        List<String> out = TwoProcessGpuTest.runRanks(oneGpuOneHost(), "moe");
        for (String o : out) assertTrue(o.contains("MoE GIN: ") && o.contains("MoE HOST: "), o);
    }

    /** A window one rank has no memory for fails on every rank together, and the group still works. */
    @Test void aWindowThatFailsOnOneRankStopsEveryRank() throws Exception {
        for (String o : TwoProcessGpuTest.runRanks(oneGpuOneHost(), "oneRankFails"))
            assertTrue(o.contains("window refused together"), o);
    }
}
