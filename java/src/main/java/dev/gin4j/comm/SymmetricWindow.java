package dev.gin4j.comm;

import dev.gin4j.gpu.DeviceBuffer;
import dev.gin4j.gpu.NativeResource;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.ArrayList;
import java.util.List;

import static dev.gin4j.bindings.nccl.nccl_h.*;

/**
 * A window of device memory with the same size and layout on every rank, allocated with
 * {@code ncclMemAlloc} and registered with {@code ncclCommWindowRegister} (symmetric flag), so
 * that peers can store into it. One object covers the ranks this process drives. The requested
 * size is compared across all ranks first: a mismatch is an error naming both ranks, not a hang.
 */
public final class SymmetricWindow extends NativeResource {
    private final CommGroup group;
    private final WindowLayout layout;
    private final Arena arena = Arena.ofShared();
    private final List<DeviceBuffer> buffers = new ArrayList<>();
    private final List<MemorySegment> handles = new ArrayList<>();

    private SymmetricWindow(CommGroup group, WindowLayout layout) {
        this.group = group;
        this.layout = layout;
    }

    /** Collective: every rank of the communicator must call it with the same layout. */
    public static SymmetricWindow allocate(CommGroup group, WindowLayout layout) {
        group.ensureOpen();
        for (String symbol : new String[] {"ncclMemAlloc", "ncclCommWindowRegister"}) {
            if (dev.gin4j.bindings.NativeLibrary.NCCL.find(symbol).isEmpty()) {
                throw new CommException("symmetric windows need " + symbol + " (NCCL >= 2.27, or an RCCL that has it), which the loaded library lacks: "
                        + Nccl.describe() + ". The host-initiated backend (Backend.HOST) works without them.");
            }
        }
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
        SymmetricWindow w = new SymmetricWindow(group, layout);
        try {
            try (Arena tmp = Arena.ofConfined()) {
                // the registration below is collective: a rank whose memory failed must not leave the others waiting in it
                group.failTogether("allocating a symmetric window of " + size + " bytes", () -> {
                    for (Communicator c : group.ranks()) {
                        c.device().makeCurrent();
                        MemorySegment out = tmp.allocate(ValueLayout.ADDRESS);
                        Nccl.check("ncclMemAlloc(" + size + " bytes)", ncclMemAlloc(out, size), c.handle());
                        long ptr = out.get(ValueLayout.ADDRESS, 0).address();
                        w.buffers.add(DeviceBuffer.wrap(c.device(), MemorySegment.ofAddress(ptr).reinterpret(size, w.arena, null)));
                    }
                });
                MemorySegment wins = tmp.allocate(ValueLayout.ADDRESS, group.localCount());  // zeroed: NULL where nothing was registered
                try {
                    group.inGroup("ncclCommWindowRegister", () -> {
                        for (Communicator c : group.ranks()) {
                            c.device().makeCurrent();
                            Nccl.check("ncclCommWindowRegister", ncclCommWindowRegister(c.handle(), MemorySegment.ofAddress(w.buffers.get(c.localIndex()).address()),
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

    /** The registered window handle (ncclWindow_t) of local rank {@code localIndex}. */
    public MemorySegment handle(int localIndex) {
        ensureOpen();
        return handles.get(localIndex);
    }

    /**
     * Deregisters what was registered, then frees every rank's memory, each step even if one before
     * it failed. After the group was closed (or aborted) the registrations went with its
     * communicators: only the memory is freed then.
     */
    @Override protected void release() {
        List<Runnable> steps = new ArrayList<>();
        if (!group.isClosed() && handles.stream().anyMatch(h -> h.address() != 0)) {
            steps.add(() -> group.inGroup("ncclCommWindowDeregister", () -> {
                for (Communicator c : group.ranks()) {
                    MemorySegment h = handles.get(c.localIndex());
                    if (h.address() == 0) continue;
                    c.device().makeCurrent();
                    Nccl.check("ncclCommWindowDeregister", ncclCommWindowDeregister(c.handle(), h), c.handle());
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
                if (rc != 0) throw Nccl.error("ncclMemFree (" + c + ")", rc, MemorySegment.NULL);
            });
        }
        steps.add(arena::close);
        releaseAll(steps.toArray(Runnable[]::new));
    }

    @Override public String describe() { return "symmetric window of " + layout.size() + " bytes over " + group.describe(); }
}
