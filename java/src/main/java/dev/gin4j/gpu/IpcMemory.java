package dev.gin4j.gpu;

import java.lang.foreign.Arena;

/**
 * Device memory shared between processes of one host through the runtime's IPC handles
 * ({@code cuIpcGetMemHandle} / {@code cuIpcOpenMemHandle}, {@code hipIpcGetMemHandle} /
 * {@code hipIpcOpenMemHandle}): one process allocates and exports, the others map it and load and
 * store it as their own, on the same GPU or on a peer GPU (peer access is enabled on first use).
 * The handle is plain bytes; how it travels between the processes is the caller's matter.
 */
public final class IpcMemory {
    /** The size of a handle in bytes (CUDA's and HIP's are both 64). */
    public static final int HANDLE_BYTES = 64;

    private IpcMemory() {}

    /**
     * An allocation that other processes can map, and its handle.
     *
     * @param buffer the memory, freed when the arena it was allocated in closes
     * @param handle the IPC handle of the whole allocation ({@link #HANDLE_BYTES} bytes)
     */
    public record Exported(DeviceBuffer buffer, byte[] handle) {
        /** Keeps a copy of the handle. */
        public Exported {
            handle = handle.clone();
        }

        /** {@return a copy of the handle} */
        @Override public byte[] handle() { return handle.clone(); }
    }

    /**
     * Allocates {@code bytes} (> 0) on {@code device}, as {@link Device#allocate} does, and exports
     * the allocation. Importers must unmap it ({@link #open}'s arena closed) before it is freed here.
     *
     * @param device the device to allocate on
     * @param bytes the size in bytes, positive
     * @param arena the arena whose closing frees the memory
     * @return the buffer and its IPC handle
     * @throws IllegalArgumentException for a size that is not positive
     */
    public static Exported allocate(Device device, long bytes, Arena arena) {
        if (bytes <= 0) throw new IllegalArgumentException("memory shared with other processes needs a positive size, got " + bytes + " bytes");
        DeviceBuffer b = DeviceBuffer.allocate(device, bytes, arena);
        return new Exported(b, device.driver().ipcHandle(device.ordinal(), b.address()));
    }

    /**
     * Maps the allocation of another process that {@code handle} names (made by {@link #allocate}
     * there, {@code bytes} long at least) into this process for kernels on {@code device}; unmapped
     * when {@code arena} closes. A handle from this same process cannot be opened (the runtimes
     * refuse it).
     *
     * @param device the device whose kernels use the mapping
     * @param handle the exporting process's handle ({@link Exported#handle()})
     * @param bytes the size to map, at most the exported allocation's
     * @param arena the arena whose closing unmaps the memory
     * @return the mapped memory
     * @throws IllegalArgumentException for a handle that is not {@link #HANDLE_BYTES} bytes or a size that is not positive
     * @throws GpuException when the runtime cannot map it (another host's handle, freed memory, GPUs without peer access)
     */
    public static DeviceBuffer open(Device device, byte[] handle, long bytes, Arena arena) {
        if (handle == null || handle.length != HANDLE_BYTES)
            throw new IllegalArgumentException("an IPC handle has " + HANDLE_BYTES + " bytes, got " + (handle == null ? "null" : handle.length + " bytes"));
        if (bytes <= 0) throw new IllegalArgumentException("a mapping needs a positive size, got " + bytes + " bytes");
        if (!arena.scope().isAlive()) throw new IllegalStateException("cannot map another process's memory on " + device + ": the arena is closed");
        long ptr = device.driver().ipcOpen(device.ordinal(), handle);
        return DeviceBuffer.wrap(device, DeviceBuffer.ownedBy(arena, ptr, bytes, () -> device.driver().ipcClose(device.ordinal(), ptr)));
    }
}
