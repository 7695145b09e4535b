package dev.gin4j.comm;

import org.junit.jupiter.api.Test;

import java.io.DataInputStream;
import java.io.DataOutputStream;
import java.io.IOException;
import java.net.ConnectException;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Map;
import java.util.Random;
import java.util.List;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;

import static org.junit.jupiter.api.Assertions.*;

/** What rank 0's rendezvous refuses and what a rank refuses from it, with raw sockets on loopback, without a GPU. */
class RendezvousGuardsTest {
    private static final int MAGIC = 0x67696e34, PROTOCOL = 2;

    private static int freePort() throws IOException {
        try (ServerSocket s = new ServerSocket(0)) { return s.getLocalPort(); }
    }

    private static byte[] randomId() {
        byte[] id = new byte[128];
        new Random().nextBytes(id);
        return id;
    }

    private static Rendezvous rank(int rank, int world, int port, Rendezvous.JobToken token, int timeoutS) {
        return new Rendezvous(rank, world, rank, "127.0.0.1", port, Duration.ofSeconds(timeoutS), token, null);
    }

    /** A socket to rank 0 once it listens (within 10 s). */
    private static Socket connect(String host, int port) throws Exception {
        long end = System.nanoTime() + 10_000_000_000L;
        while (true) {
            try {
                Socket s = new Socket(host, port);
                s.setSoTimeout(10_000);
                return s;
            } catch (ConnectException e) {
                if (System.nanoTime() > end) throw e;
                Thread.sleep(20);
            }
        }
    }

    /** Rank 0's refusal on {@code s}: MAGIC, -1, then its text. */
    private static String refusal(Socket s) throws IOException {
        DataInputStream in = new DataInputStream(s.getInputStream());
        assertEquals(MAGIC, in.readInt());
        assertEquals(-1, in.readInt());
        int n = in.readInt();
        assertTrue(n > 0 && n <= 2048, "refusal length " + n);
        byte[] text = new byte[n];
        in.readFully(text);
        return new String(text, StandardCharsets.UTF_8);
    }

    @Test void randomBytesAndOversizedLengthsAreRefusedAndTheWaitGoesOn() throws Exception {
        int port = freePort();
        byte[] id = randomId();
        try (ExecutorService pool = Executors.newFixedThreadPool(2)) {
            Future<byte[]> r0 = pool.submit(() -> rank(0, 2, port, Rendezvous.JobToken.NONE, 30).exchange(id));
            try (Socket garbage = connect("127.0.0.1", port)) {  // random bytes: dropped without an answer
                byte[] noise = new byte[4096];
                new Random().nextBytes(noise);
                noise[0] = 0;  // never gin4j's magic
                garbage.getOutputStream().write(noise);
                try {
                    assertEquals(-1, garbage.getInputStream().read(), "a stranger is closed, not answered");
                } catch (java.net.SocketException reset) {
                    // closed with our unread bytes still queued there: the close arrives as a reset
                }
            }
            try (Socket huge = connect("127.0.0.1", port)) {  // a gin4j-looking hello announcing a 2 GiB token
                DataOutputStream out = new DataOutputStream(huge.getOutputStream());
                out.writeInt(MAGIC); out.writeInt(PROTOCOL); out.writeInt(1); out.writeInt(2); out.writeInt(Integer.MAX_VALUE);
                out.flush();
                String why = refusal(huge);
                assertTrue(why.contains("announced a 2147483647-byte job token; expected 32"), why);
            }
            try (Socket older = connect("127.0.0.1", port)) {  // another protocol version
                DataOutputStream out = new DataOutputStream(older.getOutputStream());
                out.writeInt(MAGIC); out.writeInt(1); out.writeInt(1); out.writeInt(2); out.writeInt(32);
                out.flush();
                String why = refusal(older);
                assertTrue(why.contains("protocol 1, rank 0 speaks 2") && why.contains("same gin4j version"), why);
            }
            try (Socket longSource = connect("127.0.0.1", port)) {  // right token length, oversized source name
                DataOutputStream out = new DataOutputStream(longSource.getOutputStream());
                out.writeInt(MAGIC); out.writeInt(PROTOCOL); out.writeInt(1); out.writeInt(2); out.writeInt(32);
                out.write(Rendezvous.JobToken.NONE.bytes()); out.writeInt(1 << 30);
                out.flush();
                String why = refusal(longSource);
                assertTrue(why.contains("announced a 1073741824-byte job token source; expected 1..64"), why);
            }
            Future<byte[]> r1 = pool.submit(() -> rank(1, 2, port, Rendezvous.JobToken.NONE, 30).exchange(null));
            assertArrayEquals(id, r0.get());
            assertArrayEquals(id, r1.get());
        }
    }

    @Test void aSecondJobOnTheSamePortIsRefusedAndTheFirstFormsAnyway() throws Exception {
        int port = freePort();
        byte[] id = randomId();
        Rendezvous.JobToken jobA = Rendezvous.JobToken.of("job-a"), jobB = Rendezvous.JobToken.of("job-b");
        try (ExecutorService pool = Executors.newFixedThreadPool(2)) {
            Future<byte[]> a0 = pool.submit(() -> rank(0, 2, port, jobA, 30).exchange(id));
            connect("127.0.0.1", port).close();  // job A's rank 0 listens
            CommException b0 = assertThrows(CommException.class, () -> rank(0, 2, port, jobB, 5).exchange(randomId()));
            assertTrue(b0.getMessage().contains("rank 0 cannot listen on 127.0.0.1:" + port) && b0.getMessage().contains("give this job its own MASTER_PORT"), b0.getMessage());
            CommException b1 = assertThrows(CommException.class, () -> rank(1, 2, port, jobB, 5).exchange(null));
            assertTrue(b1.getMessage().contains("refused rank 1") && b1.getMessage().contains("its job token (from given) differs from rank 0's (from given)")
                    && b1.getMessage().contains("another job") && b1.getMessage().contains("GIN4J_JOB_TOKEN"), b1.getMessage());
            Future<byte[]> a1 = pool.submit(() -> rank(1, 2, port, jobA, 30).exchange(null));
            assertArrayEquals(id, a0.get());
            assertArrayEquals(id, a1.get());
        }
    }

    @Test void rankZerosTimeOutNamesTheConnectionsItRefused() throws Exception {
        int port = freePort();
        try (ExecutorService pool = Executors.newFixedThreadPool(1)) {
            Future<byte[]> r0 = pool.submit(() -> rank(0, 2, port, Rendezvous.JobToken.of("mine"), 3).exchange(randomId()));
            CommException stray = assertThrows(CommException.class, () -> rank(1, 2, port, Rendezvous.JobToken.NONE, 2).exchange(null));
            assertTrue(stray.getMessage().contains("(from none) differs from rank 0's (from given)"), stray.getMessage());
            ExecutionException e = assertThrows(ExecutionException.class, r0::get);
            assertTrue(e.getCause().getMessage().contains("saw 1 of 2 ranks; it refused 127.0.0.1 as RANK 1 (another job's token, from none)"), e.getCause().getMessage());
        }
    }

    @Test void aRankOutsideTheWorldFailsTheRendezvousByName() throws Exception {
        int port = freePort();
        try (ExecutorService pool = Executors.newFixedThreadPool(1)) {
            Future<byte[]> r0 = pool.submit(() -> rank(0, 2, port, Rendezvous.JobToken.NONE, 30).exchange(randomId()));
            try (Socket s = connect("127.0.0.1", port)) {
                DataOutputStream out = new DataOutputStream(s.getOutputStream());
                out.writeInt(MAGIC); out.writeInt(PROTOCOL); out.writeInt(7); out.writeInt(2); out.writeInt(32);
                out.write(Rendezvous.JobToken.NONE.bytes()); out.writeInt(4); out.write("none".getBytes(StandardCharsets.US_ASCII));
                out.flush();
                assertTrue(refusal(s).contains("a process connected as RANK 7, outside [1, WORLD_SIZE=2)"));
            }
            ExecutionException e = assertThrows(ExecutionException.class, r0::get);
            assertTrue(e.getCause().getMessage().contains("RANK 7, outside [1, WORLD_SIZE=2)"), e.getCause().getMessage());
        }
    }

    @Test void aWrongWorldSizeFailsEveryRankNamingBoth() throws Exception {
        int port = freePort();
        try (ExecutorService pool = Executors.newFixedThreadPool(2)) {
            Future<byte[]> r0 = pool.submit(() -> rank(0, 2, port, Rendezvous.JobToken.NONE, 30).exchange(randomId()));
            Future<byte[]> r1 = pool.submit(() -> rank(1, 3, port, Rendezvous.JobToken.NONE, 30).exchange(null));
            for (Future<byte[]> f : List.of(r0, r1)) {
                ExecutionException e = assertThrows(ExecutionException.class, f::get);
                assertTrue(e.getCause().getMessage().contains("rank 1 has WORLD_SIZE=3 but rank 0 has 2"), e.getCause().getMessage());
            }
        }
    }

    /** A fake rank 0 that reads the hello and answers with {@code answer}. */
    private static CommException fetchFrom(ServerSocket fake, ExecutorService pool, java.util.function.Consumer<DataOutputStream> answer) throws Exception {
        Future<?> served = pool.submit(() -> {
            try (Socket s = fake.accept()) {
                s.getInputStream().readNBytes(4 + 16 + 32 + 4 + 4);
                DataOutputStream out = new DataOutputStream(s.getOutputStream());
                answer.accept(out);
                out.flush();
                s.getInputStream().read();  // until the rank hangs up
            }
            return null;
        });
        CommException e = assertThrows(CommException.class, () -> rank(1, 2, fake.getLocalPort(), Rendezvous.JobToken.NONE, 10).exchange(null));
        served.get();
        return e;
    }

    @Test void aRankRefusesOversizedAnswers() throws Exception {
        try (ExecutorService pool = Executors.newFixedThreadPool(1); ServerSocket fake = new ServerSocket(0)) {
            CommException id = fetchFrom(fake, pool, out -> { try { out.writeInt(MAGIC); out.writeInt(Integer.MAX_VALUE); } catch (IOException e) { throw new RuntimeException(e); } });
            assertTrue(id.getMessage().contains("announced a 2147483647-byte id; expected 1..4096"), id.getMessage());
            CommException reason = fetchFrom(fake, pool, out -> { try { out.writeInt(MAGIC); out.writeInt(-1); out.writeInt(1 << 30); } catch (IOException e) { throw new RuntimeException(e); } });
            assertTrue(reason.getMessage().contains("with a 1073741824-byte reason; expected at most 2048"), reason.getMessage());
        }
    }

    @Test void rankZeroListensOnMasterAddrsInterfaceOnly() throws Exception {
        int port = freePort();
        byte[] id = randomId();
        try (ExecutorService pool = Executors.newFixedThreadPool(2)) {
            // 127.0.0.2 is loopback too, but a socket bound to it takes no connection made to 127.0.0.1
            Future<byte[]> r0 = pool.submit(() -> new Rendezvous(0, 2, 0, "127.0.0.2", port, Duration.ofSeconds(30)).exchange(id));
            connect("127.0.0.2", port).close();
            assertThrows(ConnectException.class, () -> new Socket("127.0.0.1", port).close(), "rank 0 must not listen on every interface");
            Future<byte[]> r1 = pool.submit(() -> new Rendezvous(1, 2, 1, "127.0.0.2", port, Duration.ofSeconds(30)).exchange(null));
            assertArrayEquals(id, r0.get());
            assertArrayEquals(id, r1.get());
        }
        // an address of no interface here (TEST-NET-1): rank 0 says so at once instead of listening elsewhere
        CommException far = assertThrows(CommException.class, () -> new Rendezvous(0, 2, 0, "192.0.2.1", port, Duration.ofSeconds(30)).exchange(id));
        assertTrue(far.getMessage().contains("MASTER_ADDR=192.0.2.1 resolves to [192.0.2.1] on rank 0, none of them an address of this host")
                && far.getMessage().contains("GIN4J_RENDEZVOUS_LISTEN"), far.getMessage());
    }

    @Test void theJobTokenComesFromTheLauncherEnvironment() {
        Map<String, String> base = Map.of("RANK", "1", "WORLD_SIZE", "2", "MASTER_ADDR", "h", "MASTER_PORT", "29500");
        assertEquals(Rendezvous.JobToken.NONE, Rendezvous.fromEnvironment(base).jobToken());
        assertNull(Rendezvous.fromEnvironment(base).listenAddress());
        assertEquals("0.0.0.0", Rendezvous.fromEnvironment(with(base, "GIN4J_RENDEZVOUS_LISTEN", "0.0.0.0")).listenAddress());
        assertEquals("none", Rendezvous.JobToken.fromEnvironment(Map.of("TORCHELASTIC_RUN_ID", "none")).source(), "torchrun's default run id names no job");
        Rendezvous.JobToken torch = Rendezvous.JobToken.fromEnvironment(Map.of("TORCHELASTIC_RUN_ID", "f00d", "SLURM_JOB_ID", "12"));
        assertEquals("TORCHELASTIC_RUN_ID", torch.source());
        assertNotEquals(torch, Rendezvous.JobToken.fromEnvironment(Map.of("TORCHELASTIC_RUN_ID", "beef")));
        Rendezvous.JobToken slurm = Rendezvous.JobToken.fromEnvironment(Map.of("SLURM_JOB_ID", "12", "SLURM_STEP_ID", "0"));
        assertEquals("SLURM_JOB_ID", slurm.source());
        assertNotEquals(slurm, Rendezvous.JobToken.fromEnvironment(Map.of("SLURM_JOB_ID", "12", "SLURM_STEP_ID", "1")), "two steps of one allocation are two jobs");
        Rendezvous.JobToken own = Rendezvous.JobToken.fromEnvironment(Map.of("GIN4J_JOB_TOKEN", "s3cret", "TORCHELASTIC_RUN_ID", "f00d"));
        assertEquals("GIN4J_JOB_TOKEN", own.source());
        assertEquals(own, Rendezvous.fromEnvironment(with(base, "GIN4J_JOB_TOKEN", "s3cret")).jobToken());
        assertFalse(own.toString().contains("s3cret"), "only a digest is kept");
        IllegalArgumentException blank = assertThrows(IllegalArgumentException.class, () -> Rendezvous.JobToken.of(" "));
        assertTrue(blank.getMessage().contains("non-blank value"), blank.getMessage());
        IllegalArgumentException none = assertThrows(IllegalArgumentException.class, () -> new Rendezvous(0, 2, 0, "h", 1, Duration.ofSeconds(1), null, null));
        assertTrue(none.getMessage().contains("JobToken.NONE"), none.getMessage());
    }

    private static Map<String, String> with(Map<String, String> m, String k, String v) {
        Map<String, String> copy = new java.util.HashMap<>(m);
        copy.put(k, v);
        return copy;
    }
}
