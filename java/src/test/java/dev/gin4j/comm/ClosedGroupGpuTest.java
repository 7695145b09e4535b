package dev.gin4j.comm;

import dev.gin4j.a2a.AllToAll;
import dev.gin4j.a2a.AllToAllV;
import dev.gin4j.a2a.Backend;
import dev.gin4j.gpu.Device;
import dev.gin4j.gpu.DeviceBuffer;
import dev.gin4j.gpu.GpuRuntime;
import dev.gin4j.gpu.NativeResource;
import dev.gin4j.gpu.Stream;
import dev.gin4j.moe.MoeAllToAll;
import dev.gin4j.moe.MoeConfig;
import dev.gin4j.testing.Gpus;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

import java.lang.foreign.Arena;
import java.util.ArrayList;
import java.util.List;

import static org.junit.jupiter.api.Assertions.*;

/**
 * A group closed (or aborted) under the instances built on it: their GIN kernels would store
 * through peer mappings that went with its communicators, so every call is refused by name, and
 * closing them afterwards frees their memory without an error. Runs on one GPU.
 */
@Tag("gpu")
class ClosedGroupGpuTest {
    @Test void instancesOfAClosedGroupRefuseCallsAndStillClose() {
        GpuRuntime rt = Gpus.runtimeWithDevices(1);
        Gpus.skipUnless(Nccl.isAvailable(), "no NCCL/RCCL: " + Nccl.describe());
        Gpus.requireKernels(rt, "a2a");
        Gpus.requireKernels(rt, "moe");
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
                try (CommGroup g = CommGroup.initAll(devs)) {
                    AllToAll a = AllToAll.create(g, 64, Backend.GIN);
                    AllToAllV v = AllToAllV.create(g, 64, Backend.GIN);
                    MoeAllToAll moe = MoeAllToAll.create(g, MoeConfig.bf16(64, 8 * n, 2, 8, Backend.GIN));
                    if (abort) g.abort(); else g.close();
                    String closed = g.describe() + " is closed";
                    assertTrue(assertThrows(IllegalStateException.class, () -> a.run(in, 16, streams)).getMessage().contains(closed));
                    assertTrue(assertThrows(IllegalStateException.class, () -> v.run(in, counts, counts, streams)).getMessage().contains(closed));
                    int[] tokens = new int[n];
                    assertTrue(assertThrows(IllegalStateException.class, () -> moe.dispatch(in, ids, ws, tokens, streams)).getMessage().contains(closed));
                    moe.close();  // no collective deregistration on a closed group: these must not throw
                    v.close();
                    a.close();
                } finally {
                    streams.forEach(Stream::close);
                }
            }
        }
        assertEquals(live, NativeResource.liveCount(), () -> "left open:\n" + NativeResource.liveSummary());
    }

    /** With every rank in step, failTogether returns; a rank's own failure comes back as itself. */
    @Test void failTogetherPassesOrRethrowsThisRanksFailure() {
        GpuRuntime rt = Gpus.runtimeWithDevices(1);
        Gpus.skipUnless(Nccl.isAvailable(), "no NCCL/RCCL: " + Nccl.describe());
        try (CommGroup g = CommGroup.initAll(rt.devices())) {
            g.failTogether("a step that worked", null);
            IllegalStateException mine = new IllegalStateException("out of memory on this rank");
            assertSame(mine, assertThrows(IllegalStateException.class, () -> g.failTogether("a step", mine)));
            g.failTogether("the group still works", null);
        }
    }
}
