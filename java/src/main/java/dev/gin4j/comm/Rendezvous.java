package dev.gin4j.comm;

import java.io.DataInputStream;
import java.io.DataOutputStream;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.net.SocketTimeoutException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

/**
 * Hands NCCL's unique id from rank 0 to every other rank over a small TCP exchange, with the
 * environment conventions of torchrun and SLURM wrappers: {@code RANK}, {@code WORLD_SIZE},
 * {@code LOCAL_RANK}, {@code MASTER_ADDR}, {@code MASTER_PORT}. Rank 0 listens; the others
 * connect, retrying until the timeout, after which the error says how far the exchange got.
 */
public record Rendezvous(int rank, int worldSize, int localRank, String masterAddress, int masterPort, Duration timeout) {
    private static final int MAGIC = 0x67696e34; // "gin4"
    private static final int HELLO_TIMEOUT_MS = 10_000;  // a connection must say who it is within this
    private static final int MAX_ID_BYTES = 4096;        // NCCL's unique id is 128 bytes

    public Rendezvous {
        if (worldSize < 1) throw new IllegalArgumentException("WORLD_SIZE must be >= 1, got " + worldSize);
        if (rank < 0 || rank >= worldSize) throw new IllegalArgumentException("RANK " + rank + " is outside [0, WORLD_SIZE=" + worldSize + ")");
        if (masterPort < 1 || masterPort > 65535) throw new IllegalArgumentException("MASTER_PORT " + masterPort + " is not a TCP port");
        if (localRank < 0) throw new IllegalArgumentException("LOCAL_RANK must be >= 0 (the GPU this process drives), got " + localRank);
        if (timeout == null || timeout.isNegative() || timeout.isZero())
            throw new IllegalArgumentException("the rendezvous time-out (GIN4J_RENDEZVOUS_TIMEOUT_S) must be positive, got " + timeout);
    }

    /** Reads RANK, WORLD_SIZE, LOCAL_RANK (default: RANK), MASTER_ADDR, MASTER_PORT and GIN4J_RENDEZVOUS_TIMEOUT_S (default 120). */
    public static Rendezvous fromEnvironment() { return fromEnvironment(System.getenv()); }

    public static Rendezvous fromEnvironment(Map<String, String> env) {
        int rank = intVar(env, "RANK", null);
        int world = intVar(env, "WORLD_SIZE", null);
        int local = intVar(env, "LOCAL_RANK", rank);
        String addr = env.get("MASTER_ADDR");
        if (addr == null || addr.isBlank()) throw new IllegalArgumentException("MASTER_ADDR is not set: rank 0's address is needed to exchange the NCCL unique id");
        int port = intVar(env, "MASTER_PORT", null);
        int timeout = intVar(env, "GIN4J_RENDEZVOUS_TIMEOUT_S", 120);
        return new Rendezvous(rank, world, local, addr, port, Duration.ofSeconds(timeout));
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
    public byte[] exchange(byte[] idOnRankZero) {
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
        try (ServerSocket server = new ServerSocket()) {
            server.setReuseAddress(true);
            server.bind(new InetSocketAddress(masterPort));
            while (true) {
                acceptRanks(server, peers, deadline);
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

    /** Accepts connections until every other rank is in {@code peers} (by rank), checking each one's hello. */
    private void acceptRanks(ServerSocket server, Map<Integer, Socket> peers, long deadline) throws IOException {
        while (peers.size() < worldSize - 1) {
            long left = (deadline - System.nanoTime()) / 1_000_000;
            if (left <= 0) throw refuseAll(peers, timedOut(peers.size() + 1));
            server.setSoTimeout((int) Math.min(left, Integer.MAX_VALUE));
            Socket s;
            try {
                s = server.accept();
            } catch (SocketTimeoutException e) {
                throw refuseAll(peers, timedOut(peers.size() + 1));
            }
            int peerRank, peerWorld;
            try {
                s.setSoTimeout((int) Math.max(1, Math.min(HELLO_TIMEOUT_MS, left)));
                DataInputStream in = new DataInputStream(s.getInputStream());
                if (in.readInt() != MAGIC) throw new IOException("not a gin4j rank");
                peerRank = in.readInt();
                peerWorld = in.readInt();
            } catch (IOException notOurs) {
                s.close();
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
            DataOutputStream out = new DataOutputStream(s.getOutputStream());
            out.writeInt(MAGIC);
            out.writeInt(-1);
            out.writeUTF(why.length() > 1000 ? why.substring(0, 1000) : why);
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
                // rank 0 answers once every rank has joined: wait up to the deadline
                s.setSoTimeout((int) Math.min(Math.max(left, 1000), Integer.MAX_VALUE));
                DataOutputStream out = new DataOutputStream(s.getOutputStream());
                out.writeInt(MAGIC);
                out.writeInt(rank);
                out.writeInt(worldSize);
                out.flush();
                DataInputStream in = new DataInputStream(s.getInputStream());
                if (in.readInt() != MAGIC)
                    throw new CommException("rendezvous: " + masterAddress + ":" + masterPort + " answered rank " + rank + ", but not as gin4j's rank 0: is MASTER_PORT right?");
                int n = in.readInt();
                if (n == -1) throw new CommException("rank 0 at " + masterAddress + ":" + masterPort + " refused rank " + rank + ": " + in.readUTF());
                if (n < 1 || n > MAX_ID_BYTES) throw new CommException("rendezvous: rank 0 at " + masterAddress + ":" + masterPort + " announced a " + n + "-byte id; expected 1.." + MAX_ID_BYTES);
                byte[] id = new byte[n];
                in.readFully(id);
                return id;
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

    private CommException timedOut(int connected) {
        return new CommException("rendezvous timed out after " + timeout.toSeconds() + " s: rank 0 listening on port " + masterPort + " saw "
                + connected + " of " + worldSize + " ranks. Start every rank with the same MASTER_ADDR/MASTER_PORT/WORLD_SIZE.");
    }
}
