package dev.gin4j.internal.comm;

import dev.gin4j.comm.CommException;
import dev.gin4j.comm.CommGroup;
import dev.gin4j.comm.Communicator;
import dev.gin4j.comm.Nccl;
import dev.gin4j.gpu.DeviceBuffer;
import dev.gin4j.gpu.GpuException;
import dev.gin4j.gpu.IpcMemory;
import dev.gin4j.gpu.NativeResource;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.ArrayList;
import java.util.List;

import static dev.gin4j.bindings.nccl.nccl_h.*;

/**
 * A window of device memory with the same size and layout on every rank, into which peers store.
 * One object covers the ranks this process drives. The requested size is compared across all ranks
 * first: a mismatch is an error naming both ranks, not a hang. Two kinds:
 * <ul>
 * <li>{@link #allocate}: gin4j's own mapping, with any NCCL version. Plain device memory
 *     ({@code cuMemAlloc} / {@code hipMalloc}); one process driving every GPU enables peer access
 *     between them, and with one process per GPU the ranks exchange IPC handles over the group and
 *     map the windows of their host's peers. {@link PeerTable#resolve} then needs no NCCL device API.</li>
 * <li>{@link #allocateRegistered}: {@code ncclMemAlloc} + {@code ncclCommWindowRegister}
 *     (symmetric flag), for NCCL's device API (GIN puts and signals, {@code ncclGetLsaPointer}).</li>
 * </ul>
 */
public final class SymmetricWindow extends NativeResource {
    private final CommGroup group;
    private final WindowLayout layout;
    private final boolean registered;
    private final Arena arena = Arena.ofShared();
    private final Arena imports = Arena.ofShared();  // peers' windows mapped here (IPC): unmapped before any rank frees its own
    private final List<DeviceBuffer> buffers = new ArrayList<>();
    private final List<MemorySegment> handles = new ArrayList<>();
    private LsaPeers peers;  // gin4j-mapped windows only
    private boolean exchanged;  // one process per GPU: the ranks began to map each other's windows

    private SymmetricWindow(CommGroup group, WindowLayout layout, boolean registered) {
        this.group = group;
        this.layout = layout;
        this.registered = registered;
    }

    /**
     * Collective: every rank of the communicator must call it with the same layout. gin4j maps the
     * peers' windows itself (no NCCL window, no device API, any NCCL version); which peers it
     * reaches, {@link PeerTable#resolve} tells.
     */
    public static SymmetricWindow allocate(CommGroup group, WindowLayout layout) {
        group.ensureOpen();
        agreeOnLayout(group, layout);
        long size = layout.size();
        SymmetricWindow w = new SymmetricWindow(group, layout, false);
        try {
            boolean one = group.isSingleProcess();
            // the mapping below is collective: a rank whose memory failed must not leave the others waiting in it
            byte[] handle = Groups.failTogether(group, "allocating a symmetric window of " + size + " bytes", () -> {
                Communicator at = group.rank(0);
                try {
                    if (!one) {
                        IpcMemory.Exported e = IpcMemory.allocate(at.device(), size, w.arena);
                        w.buffers.add(e.buffer());
                        return e.handle();
                    }
                    for (Communicator c : group.ranks()) {
                        at = c;
                        w.buffers.add(c.device().allocate(size, w.arena));
                    }
                    return null;
                } catch (GpuException e) {
                    throw new CommException("a symmetric window of " + size + " bytes for " + at + ": " + e.getMessage(), e);
                }
            });
            w.exchanged = !one;
            w.peers = one ? LsaPeers.singleProcess(group, w.buffers) : LsaPeers.exchange(group, w.buffers.getFirst(), handle, w.imports);
        } catch (RuntimeException e) {
            w.close();
            throw e;
        }
        return w;
    }

    /** Refuses a layout that differs from another rank's (size or regions), on every rank. Collective. */
    private static void agreeOnLayout(CommGroup group, WindowLayout layout) {
        long size = layout.size();
        long[][] mine = new long[group.localCount()][];
        java.util.Arrays.fill(mine, new long[] {size, layout.fingerprint()});
        long[] all = group.allGatherLongs(mine)[0];
        for (int r = 0; r < group.worldSize(); r++) {
            if (all[2 * r] != size) {
                throw new CommException("symmetric window size mismatch: rank " + group.rank(0).rank() + " asks for " + size + " bytes but rank " + r + " asks for "
                        + all[2 * r] + " bytes; every rank must allocate the same window");
            }
            if (all[2 * r + 1] != layout.fingerprint())
                throw new CommException("symmetric window layout mismatch: rank " + r + " asks for " + size + " bytes as rank " + group.rank(0).rank()
                        + " does, but with other regions than " + layout.regions().keySet() + "; every rank must allocate the same layout");
        }
    }

    /**
     * Collective: a window registered with NCCL ({@code ncclMemAlloc} + {@code ncclCommWindowRegister}),
     * for kernels that use NCCL's device API on it (GIN across nodes). Every rank must call it with
     * the same layout.
     */
    public static SymmetricWindow allocateRegistered(CommGroup group, WindowLayout layout) {
        group.ensureOpen();
        for (String symbol : new String[] {"ncclMemAlloc", "ncclCommWindowRegister"}) {
            if (dev.gin4j.bindings.NativeLibrary.NCCL.find(symbol).isEmpty()) {
                throw new CommException("symmetric windows need " + symbol + " (NCCL >= 2.27, or an RCCL that has it), which the loaded library lacks: "
                        + Nccl.describe() + ". The host-initiated backend (Backend.HOST) works without them.");
            }
        }
        long size = layout.size();
        agreeOnLayout(group, layout);
        SymmetricWindow w = new SymmetricWindow(group, layout, true);
        try {
            try (Arena tmp = Arena.ofConfined()) {
                // the registration below is collective: a rank whose memory failed must not leave the others waiting in it
                Groups.failTogether(group, "allocating a symmetric window of " + size + " bytes", () -> {
                    for (Communicator c : group.ranks()) {
                        c.device().makeCurrent();
                        MemorySegment out = tmp.allocate(ValueLayout.ADDRESS);
                        NcclStatus.check("ncclMemAlloc(" + size + " bytes)", ncclMemAlloc(out, size), c.handle());
                        long ptr = out.get(ValueLayout.ADDRESS, 0).address();
                        w.buffers.add(DeviceBuffer.wrap(c.device(), MemorySegment.ofAddress(ptr).reinterpret(size, w.arena, null)));
                    }
                });
                MemorySegment wins = tmp.allocate(ValueLayout.ADDRESS, group.localCount());  // zeroed: NULL where nothing was registered
                try {
                    Groups.inGroup(group, "ncclCommWindowRegister", () -> {
                        for (Communicator c : group.ranks()) {
                            c.device().makeCurrent();
                            NcclStatus.check("ncclCommWindowRegister", ncclCommWindowRegister(c.handle(), MemorySegment.ofAddress(w.buffers.get(c.localIndex()).address()),
                                    size, wins.asSlice(8L * c.localIndex(), 8), NCCL_WIN_COLL_SYMMETRIC()), c.handle());
                        }
                    });
                } finally {
                    // also after a failure: the ranks that did register must be deregistered before their memory is freed
                    for (int i = 0; i < group.localCount(); i++) w.handles.add(wins.getAtIndex(ValueLayout.ADDRESS, i));
                }
            }
        } catch (RuntimeException e) {
            w.close();
            throw e;
        }
        return w;
    }

    /** The group the window is registered with. */
    public CommGroup group() { return group; }
    /** The layout of the window's regions. */
    public WindowLayout layout() { return layout; }
    /** The window's size in bytes. */
    public long size() { return layout.size(); }

    /** The whole window on local rank {@code localIndex}. */
    public DeviceBuffer buffer(int localIndex) {
        ensureOpen();
        return buffers.get(localIndex);
    }

    /** A named region of the window on local rank {@code localIndex}. */
    public DeviceBuffer region(int localIndex, String name) {
        WindowLayout.Region r = layout.region(name);
        return buffer(localIndex).slice(r.offset(), r.size());
    }

    /** Whether NCCL registered the window ({@link #allocateRegistered}), rather than gin4j mapping it ({@link #allocate}). */
    public boolean isRegistered() { return registered; }

    /**
     * The registered window handle (ncclWindow_t) of local rank {@code localIndex}.
     * @throws IllegalStateException for a window gin4j maps itself, which NCCL has no handle of
     */
    public MemorySegment handle(int localIndex) {
        ensureOpen();
        if (!registered) throw new IllegalStateException("this window was mapped by gin4j (SymmetricWindow.allocate), not registered with NCCL: it has no ncclWindow_t; use allocateRegistered");
        return handles.get(localIndex);
    }

    /** gin4j's mapping of the peers' windows (allocate only). */
    LsaPeers peers() {
        ensureOpen();
        if (registered) throw new IllegalStateException("a window registered with NCCL is mapped by NCCL: its peers come from the device API");
        return peers;
    }

    /**
     * Registered: deregisters what was registered, then frees every rank's memory, each step even if
     * one before it failed; after the group was closed (or aborted) the registrations went with its
     * communicators, and only the memory is freed. Mapped by gin4j: unmaps the peers' windows, waits
     * (while the group is open) until every rank has unmapped this one's, then frees it.
     */
    @Override protected void release() {
        if (!registered) {
            boolean waitForPeers = exchanged && !group.isClosed();
            releaseAll(imports::close, () -> {
                if (waitForPeers) group.allGatherLongs(new long[] {0});  // no rank frees its window while another still maps it
            }, arena::close);
            return;
        }
        List<Runnable> steps = new ArrayList<>();
        if (!group.isClosed() && handles.stream().anyMatch(h -> h.address() != 0)) {
            steps.add(() -> Groups.inGroup(group, "ncclCommWindowDeregister", () -> {
                for (Communicator c : group.ranks()) {
                    MemorySegment h = handles.get(c.localIndex());
                    if (h.address() == 0) continue;
                    c.device().makeCurrent();
                    NcclStatus.check("ncclCommWindowDeregister", ncclCommWindowDeregister(c.handle(), h), c.handle());
                }
            }));
        }
        List<Communicator> ranks = group.ranks();
        for (int i = 0; i < buffers.size(); i++) {
            Communicator c = ranks.get(i);
            long address = buffers.get(i).segment().address();
            steps.add(() -> {
                c.device().makeCurrent();
                int rc = ncclMemFree(MemorySegment.ofAddress(address));
                if (rc != 0) throw NcclStatus.error("ncclMemFree (" + c + ")", rc, MemorySegment.NULL);
            });
        }
        steps.add(arena::close);
        steps.add(imports::close);
        releaseAll(steps.toArray(Runnable[]::new));
    }

    @Override public String describe() {
        return (registered ? "NCCL-registered" : "gin4j-mapped") + " symmetric window of " + layout.size() + " bytes over " + group.describe();
    }
}
