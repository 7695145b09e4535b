package dev.gin4j.comm;

import dev.gin4j.internal.comm.NcclDeviceAbi;
import dev.gin4j.internal.comm.WindowLayout;
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
    @Test void groupOptionsComeFromTheEnvironmentAndBadValuesAreNamed() {
        CommGroup.Options defaults = CommGroup.Options.fromEnvironment(Map.of());
        assertEquals(Duration.ofSeconds(300), defaults.hostWaitTimeout());
        assertFalse(defaults.nonblocking());
        CommGroup.Options set = CommGroup.Options.fromEnvironment(Map.of("GIN4J_COMM_TIMEOUT_S", " 42 ", "GIN4J_COMM_NONBLOCKING", "1"));
        assertEquals(Duration.ofSeconds(42), set.hostWaitTimeout());
        assertTrue(set.nonblocking());
        assertFalse(CommGroup.Options.fromEnvironment(Map.of("GIN4J_COMM_NONBLOCKING", "0")).nonblocking());
        for (String bad : new String[] {"0", "-5", "ten"}) {
            IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> CommGroup.Options.fromEnvironment(Map.of("GIN4J_COMM_TIMEOUT_S", bad)));
            assertTrue(e.getMessage().contains("GIN4J_COMM_TIMEOUT_S") && e.getMessage().contains(bad), e.getMessage());
        }
        for (String bad : new String[] {"yes", "2", "true"}) {
            IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> CommGroup.Options.fromEnvironment(Map.of("GIN4J_COMM_NONBLOCKING", bad)));
            assertTrue(e.getMessage().contains("GIN4J_COMM_NONBLOCKING must be 1") && e.getMessage().contains(bad), e.getMessage());
        }
        // NCCL obeys NCCL_COMM_BLOCKING over the configuration: followed when gin4j's own variable is unset, refused when they disagree
        assertTrue(CommGroup.Options.fromEnvironment(Map.of("NCCL_COMM_BLOCKING", "0")).nonblocking());
        assertFalse(CommGroup.Options.fromEnvironment(Map.of("NCCL_COMM_BLOCKING", "1")).nonblocking());
        CommGroup.Options.fromEnvironment(Map.of("NCCL_COMM_BLOCKING", "0")).checkAgainst(Map.of("NCCL_COMM_BLOCKING", "0"));
        set.checkAgainst(Map.of());
        IllegalArgumentException overturned = assertThrows(IllegalArgumentException.class, () -> set.checkAgainst(Map.of("NCCL_COMM_BLOCKING", "1")));
        assertTrue(overturned.getMessage().contains("NCCL_COMM_BLOCKING=1") && overturned.getMessage().contains("nonblocking mode"), overturned.getMessage());
        assertThrows(IllegalArgumentException.class, () -> defaults.checkAgainst(Map.of("NCCL_COMM_BLOCKING", "0")));
        assertThrows(IllegalArgumentException.class, () -> defaults.checkAgainst(Map.of("NCCL_COMM_BLOCKING", "yes")));
        assertThrows(IllegalArgumentException.class, () -> CommGroup.Options.nonblocking(Duration.ZERO));
        assertThrows(NullPointerException.class, () -> CommGroup.Options.blocking(null));
        assertTrue(CommGroup.Options.nonblocking(Duration.ofSeconds(5)).nonblocking());
        IllegalArgumentException apart = assertThrows(IllegalArgumentException.class,
                () -> CommGroup.Options.fromEnvironment(Map.of("GIN4J_COMM_NONBLOCKING", "0", "NCCL_COMM_BLOCKING", "0")));
        assertTrue(apart.getMessage().contains("NCCL_COMM_BLOCKING=0") && apart.getMessage().contains("blocking mode"), apart.getMessage());
    }

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
        assertThrows(IllegalArgumentException.class, () -> WindowLayout.builder().region("a", 8, Long.MIN_VALUE));  // one bit set, but negative
        IllegalArgumentException big = assertThrows(IllegalArgumentException.class, () -> WindowLayout.builder().region("a", Long.MAX_VALUE - 5000, 8).region("b", 8, 4096));
        assertTrue(big.getMessage().contains("'b'") && big.getMessage().contains("64-bit"), big.getMessage());
        // equal sizes, other regions: the fingerprint tells them apart (ranks compare it); the same layout gives the same one
        WindowLayout x = WindowLayout.builder().region("data", 4096, 128).region("flags", 64, 128).build();
        WindowLayout y = WindowLayout.builder().region("flags", 64, 128).region("data", 4096, 128).build();
        WindowLayout x2 = WindowLayout.builder().region("data", 4096, 128).region("flags", 64, 128).build();
        assertEquals(x.size(), y.size());
        assertNotEquals(x.fingerprint(), y.fingerprint());
        assertEquals(x.fingerprint(), x2.fingerprint());
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

    @Test void rendezvousIgnoresStrangersAndFormsOnlyWhenEveryRankIsRight() throws Exception {
        int port = freePort();
        byte[] id = new byte[128];
        new Random().nextBytes(id);
        try (ExecutorService pool = Executors.newFixedThreadPool(3)) {
            Future<byte[]> r0 = pool.submit(() -> new Rendezvous(0, 2, 0, "127.0.0.1", port, Duration.ofSeconds(20)).exchange(id));
            // a port probe that connects and leaves, and a program that says something else: neither ends the wait
            connectWhenListening(port, s -> {});
            connectWhenListening(port, s -> s.getOutputStream().write("GET / HTTP/1.0\r\n\r\n".getBytes()));
            Future<byte[]> r1 = pool.submit(() -> new Rendezvous(1, 2, 1, "127.0.0.1", port, Duration.ofSeconds(20)).exchange(null));
            assertArrayEquals(id, r0.get());
            assertArrayEquals(id, r1.get());
        }
    }

    @Test void aRankThatGaveUpIsNotSentTheIdAndMayComeBack() throws Exception {
        int port = freePort();
        byte[] id = new byte[128];
        new Random().nextBytes(id);
        try (ExecutorService pool = Executors.newFixedThreadPool(3)) {
            Future<byte[]> r0 = pool.submit(() -> new Rendezvous(0, 3, 0, "127.0.0.1", port, Duration.ofSeconds(30)).exchange(id));
            // rank 1 joins early with a short time-out and gives up while rank 2 is not there yet
            CommException gaveUp = assertThrows(CommException.class, () -> new Rendezvous(1, 3, 1, "127.0.0.1", port, Duration.ofSeconds(1)).exchange(null));
            assertTrue(gaveUp.getMessage().contains("timed out"), gaveUp.getMessage());
            // restarted, it joins again (its old connection is gone, so this is no duplicate), and rank 2 arrives
            Future<byte[]> r1 = pool.submit(() -> new Rendezvous(1, 3, 1, "127.0.0.1", port, Duration.ofSeconds(20)).exchange(null));
            Future<byte[]> r2 = pool.submit(() -> new Rendezvous(2, 3, 2, "127.0.0.1", port, Duration.ofSeconds(20)).exchange(null));
            assertArrayEquals(id, r0.get());
            assertArrayEquals(id, r1.get());
            assertArrayEquals(id, r2.get());
        }
    }

    @Test void rendezvousRefusesEveryRankWhenTwoShareARank() throws Exception {
        int port = freePort();
        try (ExecutorService pool = Executors.newFixedThreadPool(3)) {
            Future<byte[]> r0 = pool.submit(() -> new Rendezvous(0, 3, 0, "127.0.0.1", port, Duration.ofSeconds(20)).exchange(new byte[128]));
            Future<byte[]> a = pool.submit(() -> new Rendezvous(1, 3, 1, "127.0.0.1", port, Duration.ofSeconds(20)).exchange(null));
            Future<byte[]> b = pool.submit(() -> new Rendezvous(1, 3, 2, "127.0.0.1", port, Duration.ofSeconds(20)).exchange(null));
            for (Future<byte[]> f : java.util.List.of(r0, a, b)) {
                java.util.concurrent.ExecutionException e = assertThrows(java.util.concurrent.ExecutionException.class, f::get);
                assertInstanceOf(CommException.class, e.getCause());
                assertTrue(e.getCause().getMessage().contains("two processes connected as RANK 1"), e.getCause().getMessage());
            }
        }
    }

    @Test void rendezvousPassesAWorldSizeMismatchToTheRank() throws Exception {
        int port = freePort();
        try (ExecutorService pool = Executors.newFixedThreadPool(2)) {
            Future<byte[]> r0 = pool.submit(() -> new Rendezvous(0, 2, 0, "127.0.0.1", port, Duration.ofSeconds(20)).exchange(new byte[128]));
            Future<byte[]> r1 = pool.submit(() -> new Rendezvous(1, 3, 1, "127.0.0.1", port, Duration.ofSeconds(20)).exchange(null));
            for (Future<byte[]> f : java.util.List.of(r0, r1)) {
                java.util.concurrent.ExecutionException e = assertThrows(java.util.concurrent.ExecutionException.class, f::get);
                assertTrue(e.getCause().getMessage().contains("WORLD_SIZE=3 but rank 0 has 2"), e.getCause().getMessage());
            }
        }
    }

    @Test void rendezvousSaysWhenTheMasterPortIsAnotherService() throws Exception {
        // closed in reverse order: the server first, which ends the greeting loop, then the pool, which waits for it
        try (ExecutorService pool = Executors.newFixedThreadPool(1); ServerSocket other = new ServerSocket(0)) {
            pool.submit(() -> {  // greets every connection as an SSH server would (not only the first: any stray one must not starve ours)
                while (true) {
                    try (java.net.Socket s = other.accept()) {
                        s.setSoTimeout(1000);
                        s.getOutputStream().write("SSH-2.0-OpenSSH_9.2\r\n".getBytes());
                        s.getInputStream().read(new byte[64]);
                    } catch (java.net.SocketTimeoutException stray) {
                        // a connection that said nothing: next one
                    } catch (IOException closed) {
                        return null;  // the test closed the server
                    }
                }
            });
            CommException e = assertThrows(CommException.class, () -> new Rendezvous(1, 2, 1, "127.0.0.1", other.getLocalPort(), Duration.ofSeconds(20)).exchange(null));
            assertTrue(e.getMessage().contains("not as gin4j's rank 0"), e.getMessage());
        }
    }

    interface SocketUse { void accept(java.net.Socket s) throws IOException; }

    /** Connects to the port once something listens there (within 10 s), uses the socket, closes it. */
    private static void connectWhenListening(int port, SocketUse use) throws Exception {
        long end = System.nanoTime() + 10_000_000_000L;
        while (true) {
            try (java.net.Socket s = new java.net.Socket("127.0.0.1", port)) {
                use.accept(s);
                return;
            } catch (java.net.ConnectException e) {
                if (System.nanoTime() > end) throw e;
                Thread.sleep(20);
            }
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
        e = assertThrows(IllegalArgumentException.class, () -> Rendezvous.fromEnvironment(Map.of("RANK", "1", "WORLD_SIZE", "2", "LOCAL_RANK", "-1", "MASTER_ADDR", "h", "MASTER_PORT", "29500")));
        assertTrue(e.getMessage().contains("LOCAL_RANK"), e.getMessage());
        e = assertThrows(IllegalArgumentException.class, () -> Rendezvous.fromEnvironment(Map.of("RANK", "1", "WORLD_SIZE", "2", "MASTER_ADDR", "h", "MASTER_PORT", "29500", "GIN4J_RENDEZVOUS_TIMEOUT_S", "0")));
        assertTrue(e.getMessage().contains("GIN4J_RENDEZVOUS_TIMEOUT_S"), e.getMessage());
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
