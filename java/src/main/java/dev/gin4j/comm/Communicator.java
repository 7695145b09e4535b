package dev.gin4j.comm;

import dev.gin4j.gpu.Device;

import java.lang.foreign.MemorySegment;

/** One rank of a {@link CommGroup}: its NCCL/RCCL communicator and the device it drives. */
public final class Communicator {
    private final CommGroup group;
    private final MemorySegment handle;
    private final Device device;
    private final int rank;
    private final int localIndex;

    Communicator(CommGroup group, MemorySegment handle, Device device, int rank, int localIndex) {
        this.group = group;
        this.handle = handle;
        this.device = device;
        this.rank = rank;
        this.localIndex = localIndex;
    }

    /** {@return the group it belongs to} */
    public CommGroup group() { return group; }
    /** {@return the GPU this rank runs on} */
    public Device device() { return device; }
    /** {@return the rank in the whole communicator (all processes)} */
    public int rank() { return rank; }
    /** {@return the number of ranks in the whole job} */
    public int size() { return group.worldSize(); }
    /** {@return the index among the ranks this process drives} */
    public int localIndex() { return localIndex; }

    /** {@return the native ncclComm_t, after checking the group is open} */
    public MemorySegment handle() {
        group.ensureOpen();
        return handle;
    }

    MemorySegment handleUnchecked() { return handle; }

    @Override public String toString() { return "rank " + rank + "/" + size() + " on " + device; }
}
