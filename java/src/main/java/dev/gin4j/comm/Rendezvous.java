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

/**
 * Hands NCCL's unique id from rank 0 to every other rank over a small TCP exchange, with the
 * environment conventions of torchrun and SLURM wrappers: {@code RANK}, {@code WORLD_SIZE},
 * {@code LOCAL_RANK}, {@code MASTER_ADDR}, {@code MASTER_PORT}. Rank 0 listens; the others
 * connect, retrying until the timeout, after which the error says how far the exchange got.
 */
public record Rendezvous(int rank, int worldSize, int localRank, String masterAddress, int masterPort, Duration timeout) {
    private static final int MAGIC = 0x67696e34; // "gin4"

    public Rendezvous {
        if (worldSize < 1) throw new IllegalArgumentException("WORLD_SIZE must be >= 1, got " + worldSize);
        if (rank < 0 || rank >= worldSize) throw new IllegalArgumentException("RANK " + rank + " is outside [0, WORLD_SIZE=" + worldSize + ")");
        if (masterPort < 1 || masterPort > 65535) throw new IllegalArgumentException("MASTER_PORT " + masterPort + " is not a TCP port");
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

    private byte[] serve(byte[] id, long deadline) throws IOException {
        List<Integer> seen = new ArrayList<>();
        try (ServerSocket server = new ServerSocket()) {
            server.setReuseAddress(true);
            server.bind(new InetSocketAddress(masterPort));
            while (seen.size() < worldSize - 1) {
                long left = (deadline - System.nanoTime()) / 1_000_000;
                if (left <= 0) throw timedOut(seen.size() + 1);
                server.setSoTimeout((int) Math.min(left, Integer.MAX_VALUE));
                try (Socket s = server.accept()) {
                    s.setSoTimeout(10_000);
                    DataInputStream in = new DataInputStream(s.getInputStream());
                    if (in.readInt() != MAGIC) continue; // not one of ours
                    int peerRank = in.readInt(), peerWorld = in.readInt();
                    DataOutputStream out = new DataOutputStream(s.getOutputStream());
                    if (peerWorld != worldSize) {
                        out.writeInt(-1);
                        throw new CommException("rank " + peerRank + " has WORLD_SIZE=" + peerWorld + " but rank 0 has " + worldSize);
                    }
                    out.writeInt(id.length);
                    out.write(id);
                    out.flush();
                    seen.add(peerRank);
                } catch (SocketTimeoutException e) {
                    throw timedOut(seen.size() + 1);
                }
            }
        }
        return id;
    }

    private byte[] fetch(long deadline) throws IOException {
        IOException last = null;
        while (System.nanoTime() < deadline) {
            try (Socket s = new Socket()) {
                long left = Math.max(1, (deadline - System.nanoTime()) / 1_000_000);
                s.connect(new InetSocketAddress(masterAddress, masterPort), (int) Math.min(left, 5_000));
                s.setSoTimeout((int) Math.min(Math.max(left, 1000), Integer.MAX_VALUE));
                DataOutputStream out = new DataOutputStream(s.getOutputStream());
                out.writeInt(MAGIC);
                out.writeInt(rank);
                out.writeInt(worldSize);
                out.flush();
                DataInputStream in = new DataInputStream(s.getInputStream());
                int n = in.readInt();
                if (n < 0) throw new CommException("rank 0 refused rank " + rank + ": WORLD_SIZE mismatch");
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
