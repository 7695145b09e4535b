package dev.gin4j.comm;

import java.io.ByteArrayOutputStream;
import java.io.DataOutputStream;
import java.io.EOFException;
import java.io.IOException;
import java.io.InputStream;
import java.net.BindException;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.NetworkInterface;
import java.net.ServerSocket;
import java.net.Socket;
import java.net.SocketTimeoutException;
import java.net.UnknownHostException;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

/**
 * Hands NCCL's unique id from rank 0 to every other rank over a small TCP exchange, with the
 * environment conventions of torchrun and SLURM wrappers: {@code RANK}, {@code WORLD_SIZE},
 * {@code LOCAL_RANK}, {@code MASTER_ADDR}, {@code MASTER_PORT}. Rank 0 listens on the address
 * {@code MASTER_ADDR} names (not on every interface; {@code listenAddress} overrides that); the
 * others connect, retrying until the timeout, after which the error says how far the exchange got.
 *
 * <p>Each rank says who it is: its RANK, its WORLD_SIZE and its {@link JobToken job token}. Rank 0
 * refuses a connection whose token differs (another job that uses the same port) and goes on
 * waiting for its own ranks; a wrong WORLD_SIZE, a RANK outside the world or two processes with one
 * RANK fail the whole rendezvous, every connected rank told why. Connections that are no gin4j rank
 * (a port probe, random bytes) are dropped. Every message has a bounded length and every read the
 * time-out. The token tells jobs apart by accident, not against an attacker: it travels as a
 * digest over plain TCP, and anyone who can read the launcher's environment knows it.
 *
 * @param rank this process's rank, in [0, worldSize)
 * @param worldSize the number of ranks
 * @param localRank the GPU this process drives, among those it sees
 * @param masterAddress rank 0's host name or address
 * @param masterPort the TCP port rank 0 listens on
 * @param timeout how long the exchange may take in all
 * @param jobToken what tells this job's ranks from another job's on the same port
 * @param listenAddress the local address rank 0 listens on, or null for MASTER_ADDR's
 *     ({@code 0.0.0.0}: every interface)
 */
public record Rendezvous(int rank, int worldSize, int localRank, String masterAddress, int masterPort, Duration timeout,
                         JobToken jobToken, String listenAddress) {
    private static final int MAGIC = 0x67696e34; // "gin4"
    private static final int PROTOCOL = 2;               // the hello carries the job token
    private static final int HELLO_TIMEOUT_MS = 10_000;  // a connection must say who it is within this
    private static final int MAX_ID_BYTES = 4096;        // NCCL's unique id is 128 bytes
    private static final int TOKEN_BYTES = 32;           // SHA-256
    private static final int MAX_SOURCE_BYTES = 64;      // the name of the variable a token came from
    private static final int MAX_REASON_BYTES = 2048;    // a refusal's text
    private static final int REFUSALS_KEPT = 5;          // strangers named in rank 0's time-out message

    /**
     * What tells one job's ranks from another's on the same port: a SHA-256 digest of a value every
     * rank of the job shares through its environment, and the name of where that value came from.
     *
     * @param source where the value came from ({@code GIN4J_JOB_TOKEN}, {@code TORCHELASTIC_RUN_ID},
     *     {@code SLURM_JOB_ID}, {@code given}, or {@code none})
     * @param digest the value's digest, hex
     */
    public record JobToken(String source, String digest) {
        /** No job identity: every rank without one has this token, so jobs that share a port are told apart only by WORLD_SIZE and RANK. */
        public static final JobToken NONE = derive("none", "");

        /**
         * Checks the token: a source of 1 to 64 printable ASCII characters and a digest of 64 lower-case hex digits.
         *
         * @throws IllegalArgumentException for a null or malformed source or digest
         */
        public JobToken {
            if (source == null || source.isEmpty() || source.length() > MAX_SOURCE_BYTES || !source.chars().allMatch(c -> c > 32 && c < 127))
                throw new IllegalArgumentException("a job token's source must be 1 to " + MAX_SOURCE_BYTES + " printable ASCII characters, got " + source);
            if (digest == null || !digest.matches("[0-9a-f]{" + 2 * TOKEN_BYTES + "}"))
                throw new IllegalArgumentException("a job token's digest must be " + 2 * TOKEN_BYTES + " lower-case hex digits, got " + digest);
        }

        /**
         * The token of a value chosen by the caller; every rank of the job must be given the same one.
         *
         * @param value the value, not blank
         * @return its token, with source {@code given}
         * @throws IllegalArgumentException for a null or blank value
         */
        public static JobToken of(String value) {
            if (value == null || value.isBlank()) throw new IllegalArgumentException("a job token needs a non-blank value, got '" + value + "'");
            return derive("given", value);
        }

        /**
         * The first of: {@code GIN4J_JOB_TOKEN}; torchrun's {@code TORCHELASTIC_RUN_ID} (its
         * {@code --rdzv-id}, unless it is the default {@code none}); SLURM's {@code SLURM_JOB_ID}
         * with {@code SLURM_STEP_ID}; else {@link #NONE}. A launcher that sets none of them should
         * set {@code GIN4J_JOB_TOKEN} to a value of its own for every rank of the job.
         *
         * @param env the environment to read
         * @return the token of the first variable set, or {@link #NONE}
         */
        public static JobToken fromEnvironment(Map<String, String> env) {
            String own = env.get("GIN4J_JOB_TOKEN");
            if (own != null && !own.isBlank()) return derive("GIN4J_JOB_TOKEN", own.trim());
            String torch = env.get("TORCHELASTIC_RUN_ID");
            if (torch != null && !torch.isBlank() && !torch.trim().equals("none")) return derive("TORCHELASTIC_RUN_ID", torch.trim());
            String slurm = env.get("SLURM_JOB_ID");
            if (slurm != null && !slurm.isBlank()) return derive("SLURM_JOB_ID", slurm.trim() + "." + env.getOrDefault("SLURM_STEP_ID", "").trim());
            return NONE;
        }

        private static JobToken derive(String source, String value) {
            try {
                MessageDigest sha = MessageDigest.getInstance("SHA-256");
                sha.update(("gin4j rendezvous job token\0" + source + "\0").getBytes(StandardCharsets.UTF_8));
                return new JobToken(source, HexFormat.of().formatHex(sha.digest(value.getBytes(StandardCharsets.UTF_8))));
            } catch (NoSuchAlgorithmException e) {
                throw new IllegalStateException("SHA-256 is missing from this JDK", e);  // every Java SE platform has it
            }
        }

        byte[] bytes() { return HexFormat.of().parseHex(digest); }
    }

    /**
     * Checks the settings; a blank {@code listenAddress} counts as none.
     *
     * @throws IllegalArgumentException for a world size below 1, a rank outside it, a port that is
     *     no TCP port, a negative local rank, a time-out that is not positive or a null job token
     */
    public Rendezvous {
        if (worldSize < 1) throw new IllegalArgumentException("WORLD_SIZE must be >= 1, got " + worldSize);
        if (rank < 0 || rank >= worldSize) throw new IllegalArgumentException("RANK " + rank + " is outside [0, WORLD_SIZE=" + worldSize + ")");
        if (masterPort < 1 || masterPort > 65535) throw new IllegalArgumentException("MASTER_PORT " + masterPort + " is not a TCP port");
        if (localRank < 0) throw new IllegalArgumentException("LOCAL_RANK must be >= 0 (the GPU this process drives), got " + localRank);
        if (timeout == null || timeout.isNegative() || timeout.isZero())
            throw new IllegalArgumentException("the rendezvous time-out (GIN4J_RENDEZVOUS_TIMEOUT_S) must be positive, got " + timeout);
        if (jobToken == null) throw new IllegalArgumentException("the job token must be given (JobToken.NONE for none), got null");
        if (listenAddress != null && listenAddress.isBlank()) listenAddress = null;
    }

    /**
     * Without a job token ({@link JobToken#NONE}), rank 0 listening on MASTER_ADDR's address.
     *
     * @param rank this process's rank, in [0, worldSize)
     * @param worldSize the number of ranks
     * @param localRank the GPU this process drives, among those it sees
     * @param masterAddress rank 0's host name or address
     * @param masterPort the TCP port rank 0 listens on
     * @param timeout how long the exchange may take in all
     */
    public Rendezvous(int rank, int worldSize, int localRank, String masterAddress, int masterPort, Duration timeout) {
        this(rank, worldSize, localRank, masterAddress, masterPort, timeout, JobToken.NONE, null);
    }

    /**
     * Reads RANK, WORLD_SIZE, LOCAL_RANK (default: RANK), MASTER_ADDR, MASTER_PORT,
     * GIN4J_RENDEZVOUS_TIMEOUT_S (default 120), the job token ({@link JobToken#fromEnvironment}) and
     * GIN4J_RENDEZVOUS_LISTEN (rank 0's listening address; default MASTER_ADDR's).
     *
     * @return the rendezvous the process environment describes
     * @throws IllegalArgumentException naming the variable that is missing or wrong
     */
    public static Rendezvous fromEnvironment() { return fromEnvironment(System.getenv()); }

    /**
     * As {@link #fromEnvironment()}, from {@code env}.
     * @param env the environment to read
     * @return the rendezvous {@code env} describes
     * @throws IllegalArgumentException naming the variable that is missing or wrong
     */
    public static Rendezvous fromEnvironment(Map<String, String> env) {
        int rank = intVar(env, "RANK", null);
        int world = intVar(env, "WORLD_SIZE", null);
        int local = intVar(env, "LOCAL_RANK", rank);
        String addr = env.get("MASTER_ADDR");
        if (addr == null || addr.isBlank()) throw new IllegalArgumentException("MASTER_ADDR is not set: rank 0's address is needed to exchange the NCCL unique id");
        int port = intVar(env, "MASTER_PORT", null);
        int timeout = intVar(env, "GIN4J_RENDEZVOUS_TIMEOUT_S", 120);
        return new Rendezvous(rank, world, local, addr.trim(), port, Duration.ofSeconds(timeout), JobToken.fromEnvironment(env), env.get("GIN4J_RENDEZVOUS_LISTEN"));
    }

    private static int intVar(Map<String, String> env, String name, Integer fallback) {
        String v = env.get(name);
        if (v == null || v.isBlank()) {
            if (fallback != null) return fallback;
            throw new IllegalArgumentException(name + " is not set (expected as torchrun or srun sets it)");
        }
        try {
            return Integer.parseInt(v.trim());
        } catch (NumberFormatException e) {
            throw new IllegalArgumentException(name + "='" + v + "' is not an integer");
        }
    }

    /**
     * Rank 0: sends {@code id} to every other rank and returns it. Other ranks: receive it.
     * @throws CommException on time-out, naming the address and how many ranks had connected
     */
    byte[] exchange(byte[] idOnRankZero) {
        long deadline = System.nanoTime() + timeout.toNanos();
        try {
            return rank == 0 ? serve(idOnRankZero, deadline) : fetch(deadline);
        } catch (IOException e) {
            throw new CommException("rendezvous at " + masterAddress + ":" + masterPort + " failed for rank " + rank + ": " + e, e);
        }
    }

    /**
     * Rank 0: accepts every other rank first, checking each one's RANK and WORLD_SIZE, and only then
     * sends the id to all of them, so that no rank enters ncclCommInitRank when the job cannot form
     * (a rank given the id early would wait there forever). Connections that are not a gin4j rank
     * (a port probe, another program) are dropped and the wait goes on. On a failure every rank
     * already connected is told why.
     */
    private byte[] serve(byte[] id, long deadline) throws IOException {
        if (worldSize == 1) return id;
        Map<Integer, Socket> peers = new TreeMap<>();
        List<String> refused = new ArrayList<>();
        try (ServerSocket server = new ServerSocket()) {
            server.setReuseAddress(true);
            InetAddress listen = listeningAddress();
            try {
                server.bind(new InetSocketAddress(listen, masterPort));
            } catch (BindException e) {
                throw new CommException("rendezvous: rank 0 cannot listen on " + listen.getHostAddress() + ":" + masterPort + " (" + e.getMessage()
                        + "): another job's rank 0 or another program holds that port; give this job its own MASTER_PORT");
            }
            while (true) {
                acceptRanks(server, peers, refused, deadline);
                // a rank that gave up meanwhile (its own time-out) must not be sent the id: without it the
                // others would wait in ncclCommInitRank forever. Drop it and wait for it (or a retry) again.
                peers.values().removeIf(p -> {
                    if (isConnected(p)) return false;
                    closeQuietly(p);
                    return true;
                });
                if (peers.size() == worldSize - 1) break;
            }
            List<Integer> served = new ArrayList<>();
            try {
                for (Map.Entry<Integer, Socket> e : peers.entrySet()) {
                    DataOutputStream out = new DataOutputStream(e.getValue().getOutputStream());
                    out.writeInt(MAGIC);
                    out.writeInt(id.length);
                    out.write(id);
                    out.flush();
                    served.add(e.getKey());
                }
            } catch (IOException e) {
                Map<Integer, Socket> waiting = new TreeMap<>(peers);
                waiting.keySet().removeAll(served);
                throw refuseAll(waiting, new CommException("rendezvous at port " + masterPort + ": a rank's connection failed while the id was handed out ("
                        + e + "); ranks " + served + " already have it and may wait for the others until killed"));
            }
        } finally {
            for (Socket p : peers.values()) closeQuietly(p);
        }
        return id;
    }

    /**
     * The local address rank 0 listens on: {@code listenAddress} when given, else the first address
     * MASTER_ADDR resolves to that belongs to this host.
     */
    private InetAddress listeningAddress() throws IOException {
        if (listenAddress != null) {
            try {
                return InetAddress.getByName(listenAddress);
            } catch (UnknownHostException e) {
                throw new CommException("rendezvous: GIN4J_RENDEZVOUS_LISTEN=" + listenAddress + " does not resolve on rank 0; expected a local address (0.0.0.0: every interface)");
            }
        }
        InetAddress[] all;
        try {
            all = InetAddress.getAllByName(masterAddress);
        } catch (UnknownHostException e) {
            throw new CommException("rendezvous: MASTER_ADDR=" + masterAddress + " does not resolve on rank 0; expected this host's name or address");
        }
        for (InetAddress a : all) {
            if (a.isLoopbackAddress() || a.isAnyLocalAddress() || NetworkInterface.getByInetAddress(a) != null) return a;
        }
        throw new CommException("rendezvous: MASTER_ADDR=" + masterAddress + " resolves to " + Arrays.stream(all).map(InetAddress::getHostAddress).toList()
                + " on rank 0, none of them an address of this host: start rank 0 on MASTER_ADDR's host, or set GIN4J_RENDEZVOUS_LISTEN"
                + " to the local address the other ranks reach (behind NAT, say; 0.0.0.0: every interface)");
    }

    /**
     * Accepts connections until every other rank is in {@code peers} (by rank), checking each one's
     * hello. A connection of another job or protocol is refused and noted in {@code refused}.
     */
    private void acceptRanks(ServerSocket server, Map<Integer, Socket> peers, List<String> refused, long deadline) throws IOException {
        byte[] ownToken = jobToken.bytes();
        while (peers.size() < worldSize - 1) {
            long left = (deadline - System.nanoTime()) / 1_000_000;
            if (left <= 0) throw refuseAll(peers, timedOut(server, peers.size() + 1, refused));
            server.setSoTimeout((int) Math.min(left, Integer.MAX_VALUE));
            Socket s;
            try {
                s = server.accept();
            } catch (SocketTimeoutException e) {
                throw refuseAll(peers, timedOut(server, peers.size() + 1, refused));
            }
            int peerRank, peerWorld;
            String stranger, strangerInShort;
            try {
                long helloDeadline = System.nanoTime() + Math.min(HELLO_TIMEOUT_MS, left) * 1_000_000L;
                if (ByteBuffer.wrap(readExactly(s, 4, helloDeadline)).getInt() != MAGIC) throw new IOException("not a gin4j rank");
                ByteBuffer head = ByteBuffer.wrap(readExactly(s, 16, helloDeadline));
                int protocol = head.getInt();
                peerRank = head.getInt();
                peerWorld = head.getInt();
                int tokenBytes = head.getInt();
                if (protocol != PROTOCOL) {
                    strangerInShort = "protocol " + protocol;
                    stranger = "it speaks gin4j rendezvous protocol " + protocol + ", rank 0 speaks " + PROTOCOL + ": run the same gin4j version on every rank";
                } else if (tokenBytes != TOKEN_BYTES) {
                    strangerInShort = "a " + tokenBytes + "-byte job token";
                    stranger = "it announced a " + tokenBytes + "-byte job token; expected " + TOKEN_BYTES;
                } else {
                    byte[] token = readExactly(s, TOKEN_BYTES, helloDeadline);
                    int sourceBytes = ByteBuffer.wrap(readExactly(s, 4, helloDeadline)).getInt();
                    if (sourceBytes < 1 || sourceBytes > MAX_SOURCE_BYTES) {
                        strangerInShort = "a " + sourceBytes + "-byte token source";
                        stranger = "it announced a " + sourceBytes + "-byte job token source; expected 1.." + MAX_SOURCE_BYTES;
                    } else {
                        String source = new String(readExactly(s, sourceBytes, helloDeadline), StandardCharsets.US_ASCII);
                        boolean same = MessageDigest.isEqual(token, ownToken);
                        strangerInShort = same ? null : "another job's token, from " + source;
                        stranger = same ? null : "its job token (from " + source + ") differs from rank 0's (from " + jobToken.source() + "), so it belongs to another job."
                                + " Every rank of one job needs the same GIN4J_JOB_TOKEN, or the same launcher job (TORCHELASTIC_RUN_ID, SLURM_JOB_ID);"
                                + " a second job needs its own MASTER_PORT";
                    }
                }
            } catch (IOException notOurs) {
                closeQuietly(s);
                continue;
            }
            if (stranger != null) {
                // not this job's rank: tell it why and go on waiting for ours
                String who = s.getInetAddress().getHostAddress() + " as RANK " + peerRank;
                refuse(s, "rank 0 listening on port " + masterPort + " refused the connection from " + who + ": " + stranger);
                if (refused.size() == REFUSALS_KEPT) refused.removeFirst();
                refused.add(who + " (" + strangerInShort + ")");
                continue;
            }
            // the same RANK again: a retry after its first connection failed (replace that one), or a second process
            Socket earlier = peers.get(peerRank);
            if (earlier != null && !isConnected(earlier)) {
                closeQuietly(earlier);
                peers.remove(peerRank);
            }
            String wrong = peerWorld != worldSize ? "rank " + peerRank + " has WORLD_SIZE=" + peerWorld + " but rank 0 has " + worldSize
                    : peerRank < 1 || peerRank >= worldSize ? "a process connected as RANK " + peerRank + ", outside [1, WORLD_SIZE=" + worldSize + ")"
                    : peers.containsKey(peerRank) ? "two processes connected as RANK " + peerRank + ": every rank needs its own RANK" : null;
            if (wrong != null) {
                refuse(s, wrong);
                throw refuseAll(peers, new CommException("rendezvous at port " + masterPort + ": " + wrong));
            }
            peers.put(peerRank, s);
        }
    }

    /** Exactly {@code n} bytes, or an exception once the stream ends or {@code deadline} (System.nanoTime) passes. */
    private static byte[] readExactly(Socket s, int n, long deadline) throws IOException {
        byte[] b = new byte[n];
        InputStream in = s.getInputStream();
        for (int off = 0; off < n; ) {
            long leftMs = (deadline - System.nanoTime()) / 1_000_000;
            if (leftMs <= 0) throw new SocketTimeoutException("no complete message within the time-out");
            s.setSoTimeout((int) Math.min(leftMs, Integer.MAX_VALUE));
            int got = in.read(b, off, n - off);
            if (got < 0) throw new EOFException("the connection ended inside a message");
            off += got;
        }
        return b;
    }

    /** Whether the peer still holds its connection: it sends nothing after its hello, so end of stream means it left. */
    private static boolean isConnected(Socket s) {
        try {
            s.setSoTimeout(1);
            return s.getInputStream().read() != -1;  // data it should not send: still there
        } catch (SocketTimeoutException quiet) {
            return true;
        } catch (IOException gone) {
            return false;
        }
    }

    private static void closeQuietly(Socket s) {
        try {
            s.close();
        } catch (IOException ignored) {
            // closing a socket the peer already dropped
        }
    }

    /** Tells every connected rank why the rendezvous failed (best effort), then returns {@code why} to throw. */
    private static CommException refuseAll(Map<Integer, Socket> peers, CommException why) {
        for (Socket s : peers.values()) refuse(s, why.getMessage());
        return why;
    }

    private static void refuse(Socket s, String why) {
        try (s) {
            byte[] text = why.getBytes(StandardCharsets.UTF_8);
            int n = Math.min(text.length, MAX_REASON_BYTES);
            DataOutputStream out = new DataOutputStream(s.getOutputStream());
            out.writeInt(MAGIC);
            out.writeInt(-1);
            out.writeInt(n);
            out.write(text, 0, n);
            out.flush();
        } catch (IOException ignored) {
            // the peer is gone; it will time out on its own
        }
    }

    private byte[] fetch(long deadline) throws IOException {
        IOException last = null;
        while (System.nanoTime() < deadline) {
            try (Socket s = new Socket()) {
                long left = Math.max(1, (deadline - System.nanoTime()) / 1_000_000);
                s.connect(new InetSocketAddress(masterAddress, masterPort), (int) Math.min(left, 5_000));
                byte[] source = jobToken.source().getBytes(StandardCharsets.US_ASCII);
                ByteArrayOutputStream hello = new ByteArrayOutputStream();
                DataOutputStream out = new DataOutputStream(hello);
                out.writeInt(MAGIC);
                out.writeInt(PROTOCOL);
                out.writeInt(rank);
                out.writeInt(worldSize);
                out.writeInt(TOKEN_BYTES);
                out.write(jobToken.bytes());
                out.writeInt(source.length);
                out.write(source);
                s.getOutputStream().write(hello.toByteArray());  // one write: rank 0 reads it within its hello time-out
                s.getOutputStream().flush();
                // rank 0 answers once every rank has joined: wait up to the deadline (at least a second)
                long answerBy = Math.max(deadline, System.nanoTime() + 1_000_000_000L);
                String at = masterAddress + ":" + masterPort;
                if (ByteBuffer.wrap(readExactly(s, 4, answerBy)).getInt() != MAGIC)
                    throw new CommException("rendezvous: " + at + " answered rank " + rank + ", but not as gin4j's rank 0: is MASTER_PORT right?");
                int n = ByteBuffer.wrap(readExactly(s, 4, answerBy)).getInt();
                if (n == -1) {
                    int reasonBytes = ByteBuffer.wrap(readExactly(s, 4, answerBy)).getInt();
                    if (reasonBytes < 0 || reasonBytes > MAX_REASON_BYTES)
                        throw new CommException("rendezvous: " + at + " refused rank " + rank + " with a " + reasonBytes + "-byte reason; expected at most "
                                + MAX_REASON_BYTES + ": is it gin4j's rank 0?");
                    throw new CommException("rank 0 at " + at + " refused rank " + rank + ": " + new String(readExactly(s, reasonBytes, answerBy), StandardCharsets.UTF_8));
                }
                if (n < 1 || n > MAX_ID_BYTES) throw new CommException("rendezvous: rank 0 at " + at + " announced a " + n + "-byte id; expected 1.." + MAX_ID_BYTES);
                return readExactly(s, n, answerBy);
            } catch (IOException e) {
                last = e;
                try {
                    Thread.sleep(100);
                } catch (InterruptedException ie) {
                    Thread.currentThread().interrupt();
                    throw new CommException("interrupted while waiting for rank 0 at " + masterAddress + ":" + masterPort);
                }
            }
        }
        throw new CommException("rendezvous timed out after " + timeout.toSeconds() + " s: rank " + rank + " could not get the NCCL unique id from rank 0 at "
                + masterAddress + ":" + masterPort + " (last error: " + last + "). Is rank 0 running, and are MASTER_ADDR/MASTER_PORT the same on every rank?");
    }

    private CommException timedOut(ServerSocket server, int connected, List<String> refused) {
        return new CommException("rendezvous timed out after " + timeout.toSeconds() + " s: rank 0 listening on "
                + server.getInetAddress().getHostAddress() + ":" + masterPort + " saw " + connected + " of " + worldSize + " ranks"
                + (refused.isEmpty() ? "" : "; it refused " + String.join(", ", refused))
                + ". Start every rank with the same MASTER_ADDR/MASTER_PORT/WORLD_SIZE and job token (GIN4J_JOB_TOKEN).");
    }
}
