package dev.gin4j.comm;

import org.junit.jupiter.api.Test;

import java.io.IOException;
import java.net.ServerSocket;
import java.time.Duration;
import java.util.Map;
import java.util.Properties;
import java.util.Random;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;

import static org.junit.jupiter.api.Assertions.*;

/** Setup logic that needs no GPU: layouts, rendezvous, version checks. */
class CommSetupTest {
    @Test void windowRegionsAreAlignedAndDisjoint() {
        WindowLayout l = WindowLayout.builder().region("signals", 100, 128).region("payload", 4097, 4096).region("counts", 8, 8).build();
        assertEquals(0, l.region("signals").offset());
        assertEquals(4096, l.region("payload").offset());
        assertEquals(4096 + 4097 + 7, l.region("counts").offset(), "8-byte aligned right after the payload");
        assertEquals(0, l.region("counts").offset() % 8);
        assertTrue(l.region("counts").offset() >= 4096 + 4097);
        assertEquals(0, l.size() % 4096);
        assertTrue(l.size() >= l.region("counts").offset() + 8);
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> l.region("nope"));
        assertTrue(e.getMessage().contains("nope"));
        assertThrows(IllegalArgumentException.class, () -> WindowLayout.builder().region("a", 8, 3));
        assertThrows(IllegalArgumentException.class, () -> WindowLayout.builder().region("a", 8, 8).region("a", 8, 8));
    }

    private static int freePort() throws IOException {
        try (ServerSocket s = new ServerSocket(0)) { return s.getLocalPort(); }
    }

    @Test void rendezvousHandsTheIdToEveryRank() throws Exception {
        int port = freePort();
        byte[] id = new byte[128];
        new Random().nextBytes(id);
        int world = 3;
        // one thread per rank: the common pool may have a single worker on a 2-core machine
        try (ExecutorService pool = Executors.newFixedThreadPool(world)) {
            Future<byte[]> r0 = pool.submit(() -> new Rendezvous(0, world, 0, "127.0.0.1", port, Duration.ofSeconds(20)).exchange(id));
            Future<byte[]> r1 = pool.submit(() -> new Rendezvous(1, world, 1, "127.0.0.1", port, Duration.ofSeconds(20)).exchange(null));
            Future<byte[]> r2 = pool.submit(() -> new Rendezvous(2, world, 2, "127.0.0.1", port, Duration.ofSeconds(20)).exchange(null));
            assertArrayEquals(id, r0.get());
            assertArrayEquals(id, r1.get());
            assertArrayEquals(id, r2.get());
        }
    }

    @Test void rendezvousTimesOutWithAClearMessage() throws Exception {
        int port = freePort();
        long t0 = System.nanoTime();
        CommException e = assertThrows(CommException.class, () -> new Rendezvous(1, 2, 1, "127.0.0.1", port, Duration.ofSeconds(1)).exchange(null));
        assertTrue(System.nanoTime() - t0 < 10_000_000_000L, "must give up near its timeout");
        assertTrue(e.getMessage().contains("timed out") && e.getMessage().contains("127.0.0.1:" + port), e.getMessage());
        CommException e0 = assertThrows(CommException.class, () -> new Rendezvous(0, 2, 0, "127.0.0.1", port, Duration.ofSeconds(1)).exchange(new byte[128]));
        assertTrue(e0.getMessage().contains("1 of 2 ranks"), e0.getMessage());
    }

    @Test void rendezvousEnvironmentIsValidated() {
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> Rendezvous.fromEnvironment(Map.of("RANK", "0")));
        assertTrue(e.getMessage().contains("WORLD_SIZE"), e.getMessage());
        e = assertThrows(IllegalArgumentException.class, () -> Rendezvous.fromEnvironment(Map.of("RANK", "3", "WORLD_SIZE", "2", "MASTER_ADDR", "h", "MASTER_PORT", "1")));
        assertTrue(e.getMessage().contains("RANK 3"), e.getMessage());
        Rendezvous r = Rendezvous.fromEnvironment(Map.of("RANK", "1", "WORLD_SIZE", "2", "MASTER_ADDR", "h", "MASTER_PORT", "29500"));
        assertEquals(1, r.localRank());
    }

    @Test void deviceApiVersionMismatchSaysHowToRebuild() {
        Properties m = new Properties();
        m.setProperty("nccl.version", "22907");
        m.setProperty("nccl.include", "/x/include");
        m.setProperty("nccl.devComm.size", "512");
        m.setProperty("nccl.devCommRequirements.size", "64");
        m.setProperty("nccl.devCommRequirements.init", "40000000efbeadde");
        m.setProperty("nccl.devCommRequirements.lsaBarrierCount.offset", "16");
        m.setProperty("nccl.devCommRequirements.lsaBarrierCount.size", "4");
        NcclDeviceAbi abi = NcclDeviceAbi.fromManifest(m, "test");
        CommException e = assertThrows(CommException.class, () -> abi.checkMatches(22803));
        assertTrue(e.getMessage().contains("2.29.7") && e.getMessage().contains("2.28.3") && e.getMessage().contains("gin-kernels/build --nccl-include"), e.getMessage());
        abi.checkMatches(22907);
        try (var arena = java.lang.foreign.Arena.ofConfined()) {
            var s = abi.requirements(arena, Map.of("lsaBarrierCount", 7));
            assertEquals(64, s.byteSize());
            assertEquals(0x40, s.get(java.lang.foreign.ValueLayout.JAVA_BYTE, 0));
            assertEquals(7, s.get(java.lang.foreign.ValueLayout.JAVA_INT, 16));
            CommException gin = assertThrows(CommException.class, () -> abi.requirements(arena, Map.of("ginSignalCount", 1)));
            assertTrue(gin.getMessage().contains("ginSignalCount"), gin.getMessage());
        }
        Properties none = new Properties();
        CommException e2 = assertThrows(CommException.class, () -> NcclDeviceAbi.fromManifest(none, "nowhere"));
        assertTrue(e2.getMessage().contains("--nccl-include"), e2.getMessage());
    }
}
