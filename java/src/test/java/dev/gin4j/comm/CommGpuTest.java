package dev.gin4j.comm;

import dev.gin4j.internal.comm.DeviceComm;
import dev.gin4j.internal.comm.PeerTable;
import dev.gin4j.internal.comm.SymmetricWindow;
import dev.gin4j.internal.comm.WindowLayout;
import dev.gin4j.internal.gpu.KernelLibrary;
import dev.gin4j.gpu.CodeObject;
import dev.gin4j.gpu.Device;
import dev.gin4j.gpu.DeviceBuffer;
import dev.gin4j.gpu.GpuRuntime;
import dev.gin4j.gpu.KernelArgs;
import dev.gin4j.gpu.LaunchConfig;
import dev.gin4j.gpu.NativeResource;
import dev.gin4j.gpu.Stream;
import dev.gin4j.testing.Gpus;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Random;

import static org.junit.jupiter.api.Assertions.*;

/** Communicators and symmetric windows with one process driving every local GPU. */
@Tag("gpu")
class CommGpuTest {
    private final Random random = new Random();

    static GpuRuntime twoGpusAndNccl() {
        GpuRuntime rt = Gpus.runtimeWithDevices(2);
        Gpus.skipUnless(Nccl.isAvailable(), "no NCCL/RCCL: " + Nccl.describe());
        return rt;
    }

    @Test void peerStoresLandInTheWindow() {
        GpuRuntime rt = twoGpusAndNccl();
        Gpus.requireKernels(rt, "basic");
        int live = NativeResource.liveCount();
        List<Device> devs = rt.devices();
        try (CommGroup g = CommGroup.initAll(devs); Arena arena = Arena.ofShared()) {
            WindowLayout layout = WindowLayout.builder().region("payload", 1 << 20, 4096).build();
            // gin4j's own mapping (peer access), then a window NCCL registered
            for (boolean registered : new boolean[] {false, true})
            try (SymmetricWindow w = registered ? SymmetricWindow.allocateRegistered(g, layout) : SymmetricWindow.allocate(g, layout)) {
                assertEquals(registered, w.isRegistered());
                PeerTable peers = registered ? PeerTable.direct(w, arena) : PeerTable.resolve(w, arena);
                assertTrue(peers.allReachable());
                int n = (1 << 20) / 4;
                // rank i writes (src + 1) into rank (i+1)'s payload through the peer table
                List<byte[]> sent = new ArrayList<>();
                for (int i = 0; i < g.localCount(); i++) {
                    Device d = g.rank(i).device();
                    try (Stream s = d.createStream()) { w.region(i, "payload").fill((byte) 0xee, s); s.synchronize(); }
                }
                for (int i = 0; i < g.localCount(); i++) {
                    Device d = g.rank(i).device();
                    byte[] data = new byte[4 * n];
                    random.nextBytes(data);
                    sent.add(data);
                    int peer = (i + 1) % g.worldSize();
                    long peerPayload = peers.bases(i)[peer] + layout.region("payload").offset();
                    try (Stream s = d.createStream(); CodeObject basic = KernelLibrary.load(d, "basic")) {
                        DeviceBuffer src = d.allocate(data.length, arena);
                        src.copyFromHost(MemorySegment.ofArray(data));
                        KernelArgs args = KernelArgs.of(arena, KernelArgs.Type.POINTER, KernelArgs.Type.POINTER, KernelArgs.Type.I64);
                        args.setPointer(0, src).setPointer(1, peerPayload).setLong(2, n);
                        basic.kernel("gin_add_peer_u32").launch(s, LaunchConfig.of(64, 256), args);
                        s.synchronize();
                    }
                }
                for (int i = 0; i < g.localCount(); i++) {
                    int from = (i - 1 + g.worldSize()) % g.worldSize();
                    var got = MemorySegment.ofArray(w.region(i, "payload").toByteArray());
                    var exp = MemorySegment.ofArray(sent.get(from));
                    for (int k = 0; k < n; k++) {
                        assertEquals(exp.getAtIndex(java.lang.foreign.ValueLayout.JAVA_INT_UNALIGNED, k) + 1,
                                got.getAtIndex(java.lang.foreign.ValueLayout.JAVA_INT_UNALIGNED, k), "rank " + i + " word " + k);
                    }
                }
                // the device API's table (NCCL's own mapping of the same memory) must reach the same bytes:
                // rank i reads its peer's payload through it and compares with what the peer holds
                if (!registered) {
                    assertThrows(IllegalArgumentException.class, () -> PeerTable.fromDeviceApi(w, arena));
                    assertThrows(IllegalStateException.class, () -> w.handle(0));
                    continue;
                }
                PeerTable viaNccl = PeerTable.fromDeviceApi(w, arena);
                assertTrue(viaNccl.allReachable());
                for (int i = 0; i < g.localCount(); i++) {
                    Device d = g.rank(i).device();
                    int peer = (i + 1) % g.worldSize();
                    DeviceBuffer copy = d.allocate(4L * n, arena);
                    try (Stream s = d.createStream(); CodeObject basic = KernelLibrary.load(d, "basic")) {
                        KernelArgs args = KernelArgs.of(arena, KernelArgs.Type.POINTER, KernelArgs.Type.POINTER, KernelArgs.Type.I64);
                        args.setPointer(0, viaNccl.bases(i)[peer] + layout.region("payload").offset()).setPointer(1, copy).setLong(2, 4L * n);
                        basic.kernel("gin_copy_bytes").launch(s, LaunchConfig.of(64, 256), args);
                        s.synchronize();
                    }
                    assertArrayEquals(w.region(peer, "payload").toByteArray(), copy.toByteArray(), "read through NCCL's LSA pointer from rank " + i + " to " + peer);
                }
            }
            SymmetricWindow closed = SymmetricWindow.allocate(g, layout);
            closed.close();
            assertThrows(IllegalStateException.class, () -> closed.buffer(0));
        }
        assertEquals(live, NativeResource.liveCount(), () -> "left open:\n" + NativeResource.liveSummary());
    }

    /** One GPU is enough: the all-gather then runs over a world of one (every local GPU where there are more). */
    @Test void allGatherLongsGivesEveryRanksValuesInRankOrder() {
        GpuRuntime rt = Gpus.runtimeWithDevices(1);
        Gpus.skipUnless(Nccl.isAvailable(), "no NCCL/RCCL: " + Nccl.describe());
        try (CommGroup g = CommGroup.initAll(rt.devices())) {
            int local = g.localCount(), n = 3;
            long[][] mine = new long[local][n];
            for (long[] v : mine) for (int j = 0; j < n; j++) v[j] = random.nextLong();
            long[][] got = g.allGatherLongs(mine);
            assertEquals(local, got.length);
            for (int i = 0; i < local; i++) {
                assertEquals(n * g.worldSize(), got[i].length);
                for (int r = 0; r < g.worldSize(); r++) // one process holds every rank: rank r is local index r
                    for (int j = 0; j < n; j++) assertEquals(mine[r][j], got[i][r * n + j], "local " + i + " rank " + r + " value " + j);
            }
            long[] single = random.longs(local).toArray();
            long[][] one = g.allGatherLongs(single);
            for (int i = 0; i < local; i++) assertArrayEquals(single, one[i], "one long per rank, local " + i);
            IllegalArgumentException uneven = assertThrows(IllegalArgumentException.class, () -> g.allGatherLongs(new long[local][0]));
            assertTrue(uneven.getMessage().contains("same number"), uneven.getMessage());
            assertThrows(IllegalArgumentException.class, () -> g.allGatherLongs(new long[local + 1][1]));
            // a receive buffer too small on the last rank: refused before anything is queued for the others
            try (Arena a = Arena.ofConfined()) {
                List<DeviceBuffer> send = new ArrayList<>(), recv = new ArrayList<>();
                List<Stream> streams = new ArrayList<>();
                try {
                    for (int i = 0; i < local; i++) {
                        Device d = g.rank(i).device();
                        send.add(d.allocate(64, a));
                        recv.add(d.allocate(i == local - 1 ? 64 : 64L * g.worldSize(), a));
                        streams.add(d.createStream());
                    }
                    if (g.worldSize() > 1) {
                        IllegalArgumentException small = assertThrows(IllegalArgumentException.class, () -> g.allGather(send, recv, 64, streams));
                        assertTrue(small.getMessage().contains("all-gather"), small.getMessage());
                    }
                    IllegalArgumentException negative = assertThrows(IllegalArgumentException.class, () -> g.allGather(send, recv, -1, streams));
                    assertTrue(negative.getMessage().contains(">= 0"), negative.getMessage());
                    g.allGatherLongs(new long[local][1]);  // the group still works
                } finally {
                    streams.forEach(Stream::close);
                }
            }
        }
    }

    /** The one-buffer forms on a group of one local rank (world size 1: each rank's result is its own input); several local ranks are refused. */
    @Test void singleRankCollectivesOnOneLocalRank() {
        GpuRuntime rt = Gpus.runtime();
        Gpus.skipUnless(Nccl.isAvailable(), "no NCCL/RCCL: " + Nccl.describe());
        Device d = rt.device(0);
        int live = NativeResource.liveCount();
        try (CommGroup g = CommGroup.initAll(List.of(d)); Arena arena = Arena.ofShared(); Stream s = d.createStream()) {
            assertArrayEquals(new long[] {42}, g.allGatherLongs(42L));
            byte[] data = new byte[4096];
            random.nextBytes(data);
            DeviceBuffer send = d.allocate(data.length, arena), recv = d.allocate(data.length, arena);
            send.copyFromHost(MemorySegment.ofArray(data));
            recv.fill((byte) 0x5c, s);
            g.allToAll(send, recv, data.length, s);
            g.await(s, "a single-rank all-to-all");
            assertArrayEquals(data, recv.toByteArray(), "allToAll");
            recv.fill((byte) 0x5c, s);
            g.allGather(send, recv, data.length, s);
            g.await(s, "a single-rank all-gather");
            assertArrayEquals(data, recv.toByteArray(), "allGather");
            recv.fill((byte) 0x5c, s);
            g.allToAllV(send, new long[] {1000}, new long[] {96}, recv, new long[] {1000}, new long[] {8}, s);
            g.await(s, "a single-rank all-to-all-v");
            byte[] got = recv.toByteArray();
            assertArrayEquals(Arrays.copyOfRange(data, 96, 1096), Arrays.copyOfRange(got, 8, 1008), "allToAllV");
            assertEquals((byte) 0x5c, got[7], "allToAllV wrote before its offset");
            float[] values = new float[data.length / 4], sums = new float[values.length];
            for (int i = 0; i < values.length; i++) values[i] = random.nextFloat();
            send.copyFromHost(MemorySegment.ofArray(values));
            g.allReduceSumFloat(send, recv, values.length, s);
            g.await(s, "a single-rank all-reduce");
            recv.copyToHost(MemorySegment.ofArray(sums));
            assertArrayEquals(values, sums, "allReduceSumFloat over one rank");
            NullPointerException none = assertThrows(NullPointerException.class, () -> g.allGather(send, null, data.length, s));
            assertEquals("the receive buffer must not be null", none.getMessage());
        }
        if (rt.devices().size() >= 2) {
            try (CommGroup two = CommGroup.initAll(rt.devices().subList(0, 2))) {
                IllegalStateException e = assertThrows(IllegalStateException.class, () -> two.allGatherLongs(1L));
                assertTrue(e.getMessage().startsWith("allGatherLongs(value) is for one process per GPU") && e.getMessage().contains("drives 2 local ranks"), e.getMessage());
            }
        }
        assertEquals(live, NativeResource.liveCount(), () -> "left open:\n" + NativeResource.liveSummary());
    }

    @Test void ginRequestedWhereAbsentIsAnError() {
        GpuRuntime rt = twoGpusAndNccl();
        Gpus.skipUnless(Capabilities.rdmaDevices().isEmpty(), "this host has RDMA devices; GIN may be present");
        try (CommGroup g = CommGroup.initAll(rt.devices())) {
            CommException e = assertThrows(CommException.class, () -> DeviceComm.create(g, new DeviceComm.Requirements(1, 4, 0)).close());
            assertFalse(e.getMessage().isBlank());
            System.err.println("GIN refused as expected: " + e.getMessage());
        }
    }

    @Test void hostBaselineAllToAllAndAllToAllVMatchTheOracle() {
        GpuRuntime rt = twoGpusAndNccl();
        List<Device> devs = rt.devices();
        int n = devs.size();
        try (CommGroup g = CommGroup.initAll(devs); Arena arena = Arena.ofShared()) {
            List<Stream> streams = new ArrayList<>();
            try {
                for (Device d : devs) streams.add(d.createStream());
                for (long perPeer : new long[] {1, 4096, 123_457}) {
                    List<DeviceBuffer> send = new ArrayList<>(), recv = new ArrayList<>();
                    byte[][] data = new byte[n][];
                    for (int i = 0; i < n; i++) {
                        data[i] = new byte[(int) (perPeer * n)];
                        random.nextBytes(data[i]);
                        DeviceBuffer s = devs.get(i).allocate(perPeer * n, arena), r = devs.get(i).allocate(perPeer * n, arena);
                        s.copyFromHost(MemorySegment.ofArray(data[i]));
                        r.fill((byte) 0x5c, streams.get(i));
                        send.add(s); recv.add(r);
                    }
                    g.allToAll(send, recv, perPeer, streams);
                    for (int i = 0; i < n; i++) {
                        streams.get(i).synchronize();
                        byte[] got = recv.get(i).toByteArray();
                        for (int src = 0; src < n; src++) {
                            assertArrayEquals(Arrays.copyOfRange(data[src], (int) (i * perPeer), (int) ((i + 1) * perPeer)),
                                    Arrays.copyOfRange(got, (int) (src * perPeer), (int) ((src + 1) * perPeer)), "a2a " + perPeer + " rank " + i + " from " + src);
                        }
                    }
                }
                // all-to-all-v: random counts including zeros, one case where one peer takes everything
                for (int round = 0; round < 3; round++) {
                    long[][] cnt = new long[n][n];
                    for (int i = 0; i < n; i++) for (int p = 0; p < n; p++) cnt[i][p] = round == 2 ? (p == 0 ? 50_001 : 0) : (random.nextInt(4) == 0 ? 0 : random.nextInt(70_000));
                    long[][] so = new long[n][n], ro = new long[n][n], rc = new long[n][n];
                    List<DeviceBuffer> send = new ArrayList<>(), recv = new ArrayList<>();
                    byte[][] data = new byte[n][];
                    for (int i = 0; i < n; i++) {
                        long off = 0;
                        for (int p = 0; p < n; p++) { so[i][p] = off; off += cnt[i][p]; }
                        data[i] = new byte[(int) off];
                        random.nextBytes(data[i]);
                        long roff = 0;
                        for (int p = 0; p < n; p++) { ro[i][p] = roff; rc[i][p] = cnt[p][i]; roff += cnt[p][i]; }
                        DeviceBuffer s = devs.get(i).allocate(off, arena), r = devs.get(i).allocate(roff, arena);
                        s.copyFromHost(MemorySegment.ofArray(data[i]));
                        r.fill((byte) 0x3d, streams.get(i));
                        send.add(s); recv.add(r);
                    }
                    g.allToAllV(send, cnt, so, recv, rc, ro, streams);
                    for (int i = 0; i < n; i++) {
                        streams.get(i).synchronize();
                        byte[] got = recv.get(i).toByteArray();
                        for (int src = 0; src < n; src++) {
                            assertArrayEquals(Arrays.copyOfRange(data[src], (int) so[src][i], (int) (so[src][i] + cnt[src][i])),
                                    Arrays.copyOfRange(got, (int) ro[i][src], (int) (ro[i][src] + rc[i][src])), "a2av round " + round + " rank " + i + " from " + src);
                        }
                    }
                }
                long[][] bad = new long[n][n];
                bad[0][0] = -1;
                IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                        () -> g.allToAllV(List.of(), bad, bad, List.of(), bad, bad, streams));
                assertFalse(e.getMessage().isBlank());
            } finally {
                streams.forEach(Stream::close);
            }
        }
    }
}
