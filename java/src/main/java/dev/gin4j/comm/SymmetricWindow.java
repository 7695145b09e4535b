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
        long[] mine = new long[group.localCount()];
        java.util.Arrays.fill(mine, size);
        long[][] all = group.allGatherLongs(mine);
        for (int r = 0; r < group.worldSize(); r++) {
            if (all[0][r] != size) {
                throw new CommException("symmetric window size mismatch: rank " + group.rank(0).rank() + " asks for " + size + " bytes but rank " + r + " asks for "
                        + all[0][r] + " bytes; every rank must allocate the same window");
            }
        }
        SymmetricWindow w = new SymmetricWindow(group, layout);
        try {
            try (Arena tmp = Arena.ofConfined()) {
                for (Communicator c : group.ranks()) {
                    c.device().makeCurrent();
                    MemorySegment out = tmp.allocate(ValueLayout.ADDRESS);
                    Nccl.check("ncclMemAlloc(" + size + " bytes)", ncclMemAlloc(out, size), c.handle());
                    long ptr = out.get(ValueLayout.ADDRESS, 0).address();
                    w.buffers.add(DeviceBuffer.wrap(c.device(), MemorySegment.ofAddress(ptr).reinterpret(size, w.arena, null)));
                }
                MemorySegment wins = tmp.allocate(ValueLayout.ADDRESS, group.localCount());
                group.inGroup(() -> {
                    for (Communicator c : group.ranks()) {
                        c.device().makeCurrent();
                        Nccl.check("ncclCommWindowRegister", ncclCommWindowRegister(c.handle(), MemorySegment.ofAddress(w.buffers.get(c.localIndex()).address()),
                                size, wins.asSlice(8L * c.localIndex(), 8), NCCL_WIN_COLL_SYMMETRIC()), c.handle());
                    }
                });
                for (int i = 0; i < group.localCount(); i++) w.handles.add(wins.getAtIndex(ValueLayout.ADDRESS, i));
            }
        } catch (RuntimeException e) {
            w.close();
            throw e;
        }
        return w;
    }

    public CommGroup group() { return group; }
    public WindowLayout layout() { return layout; }
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

    @Override protected void release() {
        RuntimeException first = null;
        if (!handles.isEmpty()) {
            try {
                group.inGroup(() -> {
                    for (Communicator c : group.ranks()) {
                        c.device().makeCurrent();
                        Nccl.check("ncclCommWindowDeregister", ncclCommWindowDeregister(c.handle(), handles.get(c.localIndex())), c.handle());
                    }
                });
            } catch (RuntimeException e) {
                first = e;
            }
        }
        List<Communicator> ranks = group.ranks();
        for (int i = 0; i < buffers.size(); i++) {
            ranks.get(i).device().makeCurrent();
            int rc = ncclMemFree(MemorySegment.ofAddress(buffers.get(i).segment().address()));
            if (rc != 0 && first == null) first = Nccl.error("ncclMemFree", rc, MemorySegment.NULL);
        }
        arena.close();
        if (first != null) throw first;
    }

    @Override public String describe() { return "symmetric window of " + layout.size() + " bytes over " + group.describe(); }
}
