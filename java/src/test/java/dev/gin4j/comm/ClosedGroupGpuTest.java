package dev.gin4j.comm;

import dev.gin4j.bindings.basic.GinHoldSmsArgs;
import dev.gin4j.internal.comm.KernelErrors;
import dev.gin4j.internal.gpu.KernelLibrary;
import dev.gin4j.a2a.AllToAll;
import dev.gin4j.a2a.AllToAllV;
import dev.gin4j.gpu.CodeObject;
import dev.gin4j.gpu.Device;
import dev.gin4j.gpu.DeviceBuffer;
import dev.gin4j.gpu.GpuRuntime;
import dev.gin4j.gpu.KernelArgs;
import dev.gin4j.gpu.LaunchConfig;
import dev.gin4j.gpu.NativeResource;
import dev.gin4j.gpu.Stream;
import dev.gin4j.moe.MoeAllToAll;
import dev.gin4j.moe.MoeConfig;
import dev.gin4j.testing.Gpus;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

import java.lang.foreign.Arena;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;

import static org.junit.jupiter.api.Assertions.*;

/**
 * A group closed (or aborted) under the instances built on it: their GIN kernels would store
 * through peer mappings that went with its communicators, so every call is refused by name, and
 * closing them afterwards frees their memory without an error. Also the time-outs that end waits
 * for peers that never come. Runs on one GPU.
 */
@Tag("gpu")
class ClosedGroupGpuTest {
    @Test void instancesOfAClosedGroupRefuseCallsAndStillClose() {
        GpuRuntime rt = Gpus.runtimeWithDevices(1);
        Gpus.skipUnless(Nccl.isAvailable(), "no NCCL/RCCL: " + Nccl.describe());
        Gpus.requireKernels(rt, "a2a");
        Gpus.requireKernels(rt, "moe_gin");
        Gpus.requireKernels(rt, "moe_host");
        int live = NativeResource.liveCount();
        List<Device> devs = rt.devices();
        int n = devs.size();
        for (boolean abort : new boolean[] {false, true}) {
            try (Arena arena = Arena.ofShared()) {
                List<Stream> streams = new ArrayList<>();
                List<DeviceBuffer> in = new ArrayList<>(), counts = new ArrayList<>(), ids = new ArrayList<>(), ws = new ArrayList<>();
                for (Device d : devs) {
                    streams.add(d.createStream());
                    in.add(d.allocate(4096, arena));
                    counts.add(d.allocate(8L * n, arena));
                    ids.add(d.allocate(4 * 8 * 2, arena));
                    ws.add(d.allocate(4 * 8 * 2, arena));
                }
                try (CommGroup g = CommGroup.initAll(devs); AllToAll a = AllToAll.create(g, 64, Backend.GIN); AllToAllV v = AllToAllV.create(g, 64, Backend.GIN);
                     MoeAllToAll moe = MoeAllToAll.create(g, MoeConfig.bf16(64, 8 * n, 2, 8, Backend.GIN))) {
                    if (abort) g.abort(); else g.close();
                    String closed = g.describe() + " is closed";
                    assertTrue(assertThrows(IllegalStateException.class, () -> a.run(in, 16, streams)).getMessage().contains(closed));
                    assertTrue(assertThrows(IllegalStateException.class, () -> v.run(in, counts, counts, streams)).getMessage().contains(closed));
                    int[] tokens = new int[n];
                    assertTrue(assertThrows(IllegalStateException.class, () -> moe.dispatch(in, ids, ws, tokens, streams)).getMessage().contains(closed));
                    // no collective deregistration on a closed group: these must not throw (and again when the try ends)
                    moe.close();
                    v.close();
                    a.close();
                } finally {
                    streams.forEach(Stream::close);
                }
            }
        }
        assertEquals(live, NativeResource.liveCount(), () -> "left open:\n" + NativeResource.liveSummary());
    }

    /**
     * A kernel that reports a timed-out wait for a peer (bit 0, as a GIN kernel whose peer died
     * would set it; written here by hand) makes checkErrors abort the group, so that nothing
     * afterwards (a window's collective deregistration) waits for that peer; other bits leave it open.
     */
    @Test void aKernelWaitThatTimedOutAbortsTheGroup() {
        GpuRuntime rt = Gpus.runtimeWithDevices(1);
        Gpus.skipUnless(Nccl.isAvailable(), "no NCCL/RCCL: " + Nccl.describe());
        Gpus.requireKernels(rt, "a2a");
        Device d = rt.device(0);
        int live = NativeResource.liveCount();
        try (Arena arena = Arena.ofShared(); Stream s = d.createStream(); CommGroup g = CommGroup.initAll(List.of(d));
             AllToAll a = AllToAll.create(g, 64, Backend.GIN)) {
            KernelErrors err = new KernelErrors(d, arena, s);
            err.buffer().fill32(0x2, s);  // a clamped count: reported, the group stays usable
            CommException clamped = assertThrows(CommException.class, () -> KernelErrors.checkAll("a test call", List.of(err), List.of(s), g));
            assertTrue(clamped.getMessage().contains("clamped") && !clamped.getMessage().contains("aborted"), clamped.getMessage());
            assertFalse(g.isClosed());
            KernelErrors.checkAll("a test call", List.of(err), List.of(s), g);  // the word was cleared
            err.buffer().fill32(0x1 | 0x2, s);
            CommException timedOut = assertThrows(CommException.class, () -> KernelErrors.checkAll("a test call", List.of(err), List.of(s), g));
            assertTrue(timedOut.getMessage().contains("timed out") && timedOut.getMessage().contains(g.describe() + " was aborted"), timedOut.getMessage());
            assertTrue(g.isClosed());
            a.close();  // no collective deregistration after the abort: it returns
        }
        assertEquals(live, NativeResource.liveCount(), () -> "left open:\n" + NativeResource.liveSummary());
    }

    /**
     * A host wait for the group's work gives up after its time-out instead of waiting for ever (a
     * HOST exchange whose peer never joins): the group is aborted, the error names what waited, and
     * the instances built on the group refuse calls. Here a kernel holds the stream for 2 s.
     */
    @Test void hostWaitsGiveUpAfterTheTimeOutAndAbortTheGroup() {
        GpuRuntime rt = Gpus.runtimeWithDevices(1);
        Gpus.skipUnless(Nccl.isAvailable(), "no NCCL/RCCL: " + Nccl.describe());
        Gpus.requireKernels(rt, "basic");
        Gpus.requireKernels(rt, "a2a");
        Device dev = rt.device(0);
        try (Arena arena = Arena.ofConfined(); Stream s = dev.createStream(); CodeObject basic = KernelLibrary.load(dev, "basic")) {
            List<Stream> streams = new ArrayList<>();
            for (int i = 0; i < rt.devices().size(); i++) streams.add(i == 0 ? s : rt.device(i).createStream());
            try (CommGroup g = CommGroup.initAll(rt.devices()); AllToAll a = AllToAll.create(g, 64, Backend.HOST)) {
                assertEquals(CommGroup.Options.fromEnvironment(System.getenv()).hostWaitTimeout(), g.hostWaitTimeout());
                assertThrows(IllegalArgumentException.class, () -> g.hostWaitTimeout(Duration.ZERO));
                g.await(streams, "an idle wait");  // nothing queued: returns at once
                Stream gone = dev.createStream();
                gone.close();
                assertThrows(IllegalStateException.class, () -> g.await(gone, "a wait on a closed stream"));
                assertFalse(g.isClosed(), "the caller's mistake does not abort the group");
                g.hostWaitTimeout(Duration.ofMillis(500));
                DeviceBuffer marks = dev.allocate(8, arena);
                KernelArgs hold = KernelArgs.ofStruct(arena, GinHoldSmsArgs.layout()).setPointerField(GinHoldSmsArgs.marks$offset(), marks);
                GinHoldSmsArgs.ns(hold.struct(), 2_000_000_000L);
                basic.kernel("gin_hold_sms").launch(s, LaunchConfig.of(1, 32), hold);
                long t0 = System.nanoTime();
                CommException e = assertThrows(CommException.class, () -> a.checkErrors(streams));
                double waited = (System.nanoTime() - t0) / 1e9;
                // the wait gives up at 0.5 s; the abort then frees NCCL's memory, which waits for the
                // hold to end (a stuck NCCL kernel would be released by the abort instead)
                assertTrue(waited >= 0.5 && waited < 10, "gave up after " + waited + " s");
                assertTrue(e.getMessage().contains("a HOST all-to-all") && e.getMessage().contains("not done after 0.5 s") && e.getMessage().contains("was aborted"), e.getMessage());
                System.out.println("[host wait time-out] after " + waited + " s: " + e.getMessage());
                assertTrue(g.isClosed(), "the group was aborted");
                assertThrows(IllegalStateException.class, () -> a.run(List.of(marks), 0, streams));
                s.synchronize();  // the hold ends by itself
                // the stream is idle now, but the group was aborted under the exchange: not reported as done
                CommException after = assertThrows(CommException.class, () -> a.checkErrors(streams));
                assertTrue(after.getMessage().contains("closed or aborted before the work was done"), after.getMessage());
            } finally {
                for (int i = 1; i < streams.size(); i++) streams.get(i).close();
            }
        }
    }

    /**
     * A nonblocking group's creation ends at its time-out when a peer never calls
     * ncclCommInitRank (here rank 1 of 2 takes part in the rendezvous only, as a process that died
     * right after it would): the communicator is aborted and nothing is left open. A blocking
     * group would wait there for ever (NCCL's bootstrap has no time-out).
     */
    @Test @org.junit.jupiter.api.Timeout(value = 120, threadMode = org.junit.jupiter.api.Timeout.ThreadMode.SEPARATE_THREAD)  // a blocking init would hang: fail instead
    void aNonblockingInitGivesUpWhenAPeerNeverJoins() throws Exception {
        GpuRuntime rt = Gpus.runtimeWithDevices(1);
        Gpus.skipUnless(Nccl.isAvailable(), "no NCCL/RCCL: " + Nccl.describe());
        Gpus.skipUnless(System.getenv("NCCL_COMM_BLOCKING") == null, "NCCL_COMM_BLOCKING is set: NCCL would obey it over the nonblocking configuration");
        int live = NativeResource.liveCount();
        int port;
        try (java.net.ServerSocket free = new java.net.ServerSocket(0)) {
            port = free.getLocalPort();
        }
        java.util.concurrent.ExecutorService pool = java.util.concurrent.Executors.newSingleThreadExecutor();
        try {
            java.util.concurrent.Future<byte[]> peer = pool.submit(() -> new Rendezvous(1, 2, 1, "127.0.0.1", port, Duration.ofSeconds(60)).exchange(null));
            Rendezvous rank0 = new Rendezvous(0, 2, 0, "127.0.0.1", port, Duration.ofSeconds(60));
            long t0 = System.nanoTime();
            CommException e = assertThrows(CommException.class, () -> CommGroup.initRank(rt.device(0), rank0, CommGroup.Options.nonblocking(Duration.ofSeconds(2))));
            double waited = (System.nanoTime() - t0) / 1e9;
            System.out.println("[nonblocking init time-out] after " + waited + " s: " + e.getMessage());
            assertTrue(waited >= 2 && waited < 60, "gave up after " + waited + " s");
            assertTrue(e.getMessage().contains("ncclCommInitRank(rank 0 of 2)") && e.getMessage().contains("not done after 2.0 s")
                    && e.getMessage().contains("was aborted"), e.getMessage());
            assertEquals(128, peer.get(60, java.util.concurrent.TimeUnit.SECONDS).length, "the peer got the unique id and never used it");
        } finally {
            pool.shutdownNow();
        }
        assertEquals(live, NativeResource.liveCount(), () -> "left open:\n" + NativeResource.liveSummary());
    }

    /** With every rank in step, failTogether returns; a rank's own failure comes back as itself. */
    @Test void failTogetherPassesOrRethrowsThisRanksFailure() {
        GpuRuntime rt = Gpus.runtimeWithDevices(1);
        Gpus.skipUnless(Nccl.isAvailable(), "no NCCL/RCCL: " + Nccl.describe());
        try (CommGroup g = CommGroup.initAll(rt.devices())) {
            g.failTogether("a step that worked", (RuntimeException) null);
            IllegalStateException mine = new IllegalStateException("out of memory on this rank");
            assertSame(mine, assertThrows(IllegalStateException.class, () -> g.failTogether("a step", mine)));
            g.failTogether("the group still works", (RuntimeException) null);
            assertEquals(7, g.failTogether("a step with a result", () -> 7), "the step's result comes back");
        }
    }
}
