package dev.gin4j.internal.comm;

import dev.gin4j.comm.CommException;
import dev.gin4j.comm.CommGroup;
import dev.gin4j.gpu.Device;
import dev.gin4j.gpu.DeviceBuffer;
import dev.gin4j.gpu.IpcMemory;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.Map;

/**
 * Where each rank's copy of a gin4j-mapped window lies in this process, found without NCCL's device
 * API (so with any NCCL version): one process driving every GPU enables peer access and uses the
 * plain addresses; with one process per GPU each rank exports its window as a CUDA / HIP IPC handle,
 * the ranks all-gather the handles over the group, and each maps those of the peers on its host.
 *
 * <p>A peer is load/store reachable (in the LSA team) when it is on the same host and its window
 * could be mapped, both ways: the ranks agree on that, so that every rank takes the same path.
 * "Same host" is this machine (host name and boot id) and, where set, the same {@code GIN4J_HOSTID},
 * else the same {@code NCCL_HOSTID}: processes that pose as hosts of their own for NCCL (tests on
 * one machine) are then separate hosts for gin4j too, unless GIN4J_HOSTID joins them.
 *
 * @param bases per local rank, the address of every rank's window in this process (0: not reachable)
 * @param allReachable whether every rank reaches every other one (the same answer on every rank)
 * @param unreachable why some peer is not reachable, for messages; empty when all are
 */
record LsaPeers(long[][] bases, boolean allReachable, String unreachable) {
    /** Tags the frame each rank contributes, so that ranks of another gin4j version are told apart. */
    static final long FRAME_MAGIC = 0x6c73_6131_0000_0001L;  // "lsa1", frame version 1
    /** Longs per rank: magic, host key, pid, the handle. */
    static final int FRAME_LONGS = 3 + IpcMemory.HANDLE_BYTES / 8;

    /** One rank's frame as the all-gather carried it. */
    record Frame(long hostKey, long pid, byte[] handle) {}

    /** One process, every rank in it: peer access between every pair of devices. */
    static LsaPeers singleProcess(CommGroup g, java.util.List<DeviceBuffer> windows) {
        long[] addresses = new long[g.worldSize()];
        for (int i = 0; i < g.localCount(); i++) addresses[g.rank(i).rank()] = windows.get(i).address();
        long[][] bases = new long[g.localCount()][];
        for (int i = 0; i < g.localCount(); i++) {
            Device dev = g.rank(i).device();
            for (int j = 0; j < g.localCount(); j++) {
                Device peer = g.rank(j).device();
                if (i == j) continue;
                if (!dev.canAccessPeer(peer))
                    throw new CommException(dev + " has no load/store access to " + peer + ": the GPU-initiated path needs NVLink/xGMI or PCIe peer access; Backend.HOST needs none");
                dev.enablePeerAccess(peer);
            }
            bases[i] = addresses.clone();
        }
        return new LsaPeers(bases, true, "");
    }

    /**
     * One rank per process: all-gathers every rank's frame, maps the windows of the peers on this
     * host into {@code imports}, then agrees with the others which peers reach each other. Collective.
     */
    static LsaPeers exchange(CommGroup g, DeviceBuffer window, byte[] handle, Arena imports) {
        if (g.localCount() != 1) throw new IllegalStateException("IPC mapping is for one rank per process; this process drives " + g.localCount());
        int me = g.rank(0).rank(), n = g.worldSize();
        Device dev = g.rank(0).device();
        long hostKey = hostKey(System.getenv(), machineIdentity());
        long[] all = g.allGatherLongs(new long[][] {encode(hostKey, ProcessHandle.current().pid(), handle)})[0];
        long[] bases = new long[n];
        String[] why = new String[n];
        // local work that can fail (another gin4j version's frame): every rank fails together, none waits below
        Groups.failTogether(g, "mapping the peers' windows (CUDA / HIP IPC)", () -> {
            bases[me] = window.address();
            for (int p = 0; p < n; p++) {
                if (p == me) continue;
                Frame f = decode(all, p);
                if (f.hostKey() != hostKey) {
                    why[p] = "rank " + p + " is on another host";
                    continue;
                }
                try {
                    bases[p] = IpcMemory.open(dev, f.handle(), window.byteSize(), imports).address();
                } catch (RuntimeException e) {
                    why[p] = "rank " + p + "'s window could not be mapped (pid " + f.pid() + "): " + e.getMessage();
                }
            }
        });
        long[] masks = g.allGatherLongs(new long[][] {reachMask(bases)})[0];
        boolean all1 = true;
        for (int r = 0; r < n; r++) {
            for (int p = 0; p < n; p++) {
                boolean rp = reaches(masks, n, r, p) && reaches(masks, n, p, r);
                all1 &= rp;
                if (r == me && p != me && !rp && bases[p] != 0) {
                    bases[p] = 0;  // mapped here, but rank p cannot map this rank's window: not an LSA pair
                    why[p] = "rank " + p + " could not map this rank's window";
                }
            }
        }
        StringBuilder reasons = new StringBuilder();
        for (String w : why) if (w != null) reasons.append(reasons.isEmpty() ? "" : "; ").append(w);
        if (!all1 && reasons.isEmpty()) reasons.append("some ranks do not reach each other (other hosts, or windows that could not be mapped)");
        return new LsaPeers(new long[][] {bases}, all1, reasons.toString());
    }

    /**
     * The emulated host ({@code GIN4J_HOSTID}, else {@code NCCL_HOSTID}, else none) on {@code machine},
     * as one long: ranks with equal keys are on one host.
     */
    static long hostKey(Map<String, String> env, String machine) {
        String own = env.get("GIN4J_HOSTID"), nccl = env.get("NCCL_HOSTID");
        String emulated = own != null && !own.isBlank() ? own.trim() : nccl != null && !nccl.isBlank() ? nccl.trim() : "";
        try {
            MessageDigest sha = MessageDigest.getInstance("SHA-256");
            byte[] d = sha.digest(("gin4j host\0" + machine + "\0" + emulated).getBytes(StandardCharsets.UTF_8));
            return MemorySegment.ofArray(d).get(ValueLayout.JAVA_LONG_UNALIGNED, 0);
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException("SHA-256 is missing from this JDK", e);  // every Java SE platform has it
        }
    }

    /** This machine: its host name and boot id (what tells two machines, or two boots of one, apart). */
    static String machineIdentity() {
        return read("/proc/sys/kernel/hostname") + "/" + read("/proc/sys/kernel/random/boot_id");
    }

    private static String read(String file) {
        try {
            return Files.readString(Path.of(file)).trim();
        } catch (java.io.IOException | RuntimeException e) {
            return "?";
        }
    }

    /** A rank's frame: magic, host key, pid, the handle's bytes as longs. */
    static long[] encode(long hostKey, long pid, byte[] handle) {
        if (handle.length != IpcMemory.HANDLE_BYTES)
            throw new IllegalArgumentException("an IPC handle has " + IpcMemory.HANDLE_BYTES + " bytes, got " + handle.length);
        long[] f = new long[FRAME_LONGS];
        f[0] = FRAME_MAGIC;
        f[1] = hostKey;
        f[2] = pid;
        MemorySegment.copy(MemorySegment.ofArray(handle), ValueLayout.JAVA_LONG_UNALIGNED, 0, f, 3, IpcMemory.HANDLE_BYTES / 8);
        return f;
    }

    /**
     * Rank {@code rank}'s frame out of the all-gathered frames of every rank.
     * @throws CommException when the frames do not fit or the rank's frame has another format
     */
    static Frame decode(long[] all, int rank) {
        if (all.length % FRAME_LONGS != 0 || (long) (rank + 1) * FRAME_LONGS > all.length)
            throw new CommException("window mapping: " + all.length + " longs gathered, not whole frames of " + FRAME_LONGS + " for rank " + rank);
        int o = rank * FRAME_LONGS;
        if (all[o] != FRAME_MAGIC)
            throw new CommException("window mapping: rank " + rank + " sent a frame of format " + Long.toHexString(all[o]) + ", expected "
                    + Long.toHexString(FRAME_MAGIC) + ": every rank must run the same gin4j version");
        byte[] handle = new byte[IpcMemory.HANDLE_BYTES];
        MemorySegment.copy(all, o + 3, MemorySegment.ofArray(handle), ValueLayout.JAVA_LONG_UNALIGNED, 0, IpcMemory.HANDLE_BYTES / 8);
        return new Frame(all[o + 1], all[o + 2], handle);
    }

    /** Bit p of word p / 64: whether {@code bases[p]} is mapped. */
    static long[] reachMask(long[] bases) {
        long[] m = new long[(bases.length + 63) / 64];
        for (int p = 0; p < bases.length; p++) if (bases[p] != 0) m[p / 64] |= 1L << (p % 64);
        return m;
    }

    /** Whether rank {@code r}'s mask (in the all-gathered masks of {@code n} ranks) says it maps rank {@code p}. */
    static boolean reaches(long[] masks, int n, int r, int p) {
        int words = (n + 63) / 64;
        if (masks.length != (long) words * n) throw new CommException("window mapping: " + masks.length + " mask words gathered, expected " + (long) words * n);
        return (masks[r * words + p / 64] >>> (p % 64) & 1) != 0;
    }
}
