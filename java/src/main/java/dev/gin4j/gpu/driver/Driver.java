package dev.gin4j.gpu.driver;

import java.lang.foreign.MemorySegment;

/**
 * The primitive operations gin4j needs from a GPU runtime, implemented once over the CUDA driver
 * API and once over HIP. Everything above it ({@code dev.gin4j.gpu}) is written against this
 * interface only. Handles (streams, events, modules, functions, graphs) and device addresses are
 * plain {@code long}s here; the public layer wraps them in owning, closeable objects.
 * Every method checks the runtime's status and throws {@link dev.gin4j.gpu.GpuException}.
 * Not part of the public API.
 */
public interface Driver {
    /** "CUDA driver" or "HIP". */
    String name();
    /** Which library file was loaded, and its version. */
    String libraryDescription();
    /** The runtime's version code (CUDA: 13000 for 13.0; HIP: its driver version). */
    int version();
    String versionString();
    int deviceCount();

    String deviceName(int dev);
    /** Architecture as the compilers spell it: {@code sm_90}, {@code gfx942}. */
    String arch(int dev);
    long totalMemory(int dev);
    int multiprocessors(int dev);
    /** Threads per warp (NVIDIA) or wavefront (AMD: 64 on CDNA such as gfx942). */
    int warpSize(int dev);
    /** The most shared memory one block may ask for (opt-in above the default 48 KiB on NVIDIA). */
    int maxSharedBytesPerBlock(int dev);
    /** The largest grid, {x, y, z} blocks. */
    int[] maxGridDims(int dev);
    /** The largest block, {x, y, z} threads (their product is further bounded by the kernel's max threads per block). */
    int[] maxBlockDims(int dev);
    String pciBusId(int dev);
    boolean canAccessPeer(int dev, int peer);
    /** How two devices are linked, as far as the runtime tells ("NVLink", "XGMI", "PCIe", ...). */
    String linkKind(int dev, int peer);
    /** Free and total bytes on the device. */
    long[] memoryInfo(int dev);

    /** Makes the device current for the calling thread (CUDA: its primary context). */
    void makeCurrent(int dev);
    /**
     * {@link #makeCurrent} for the launch path: asks which device is current first and switches
     * only when it differs (asking costs the thread less than switching).
     */
    void ensureCurrent(int dev);
    void enablePeerAccess(int dev, int peer);
    /** The IPC handle (64 bytes) of the allocation {@link #malloc} returned as {@code ptr}: another process of the host maps it with {@link #ipcOpen}. */
    byte[] ipcHandle(int dev, long ptr);
    /** Maps another process's allocation into this process for {@code dev} (peer access enabled lazily where it is on another GPU); returns its address here. */
    long ipcOpen(int dev, byte[] handle);
    /** Unmaps what {@link #ipcOpen} mapped. */
    void ipcClose(int dev, long ptr);
    void synchronize(int dev);

    long malloc(int dev, long bytes);
    void free(int dev, long ptr);
    /** Page-locked host memory mapped for the device; returns the host address. */
    long hostAlloc(int dev, long bytes);
    void hostFree(int dev, long ptr);
    long hostDevicePointer(int dev, long hostPtr);

    /** Device to device on one GPU; stream == 0 and async == false: a synchronous copy. Host memory goes through {@link #copyToDevice} / {@link #copyToHost}. */
    void copyOnDevice(int dev, long dst, long src, long bytes, long stream, boolean async);
    /**
     * Host to device. The host side is a native segment, passed to the runtime as a segment, so that
     * the FFM linker checks it is alive (and accessible from this thread) and keeps it alive for the
     * call. An asynchronous copy still reads it after the call returns.
     */
    void copyToDevice(int dev, long dst, MemorySegment src, long bytes, long stream, boolean async);
    /** Device to host, the host side passed as a segment as in {@link #copyToDevice}. */
    void copyToHost(int dev, MemorySegment dst, long src, long bytes, long stream, boolean async);
    void copyPeer(long dst, int dstDev, long src, int srcDev, long bytes, long stream, boolean async);
    void memset8(int dev, long ptr, byte value, long count, long stream, boolean async);
    void memset32(int dev, long ptr, int value, long count, long stream, boolean async);

    long streamCreate(int dev);
    void streamDestroy(int dev, long stream);
    void streamSynchronize(int dev, long stream);
    /** true when all work on the stream has completed. */
    boolean streamQuery(int dev, long stream);
    void streamWaitEvent(int dev, long stream, long event);

    long eventCreate(int dev, boolean timing);
    void eventDestroy(int dev, long event);
    void eventRecord(int dev, long event, long stream);
    void eventSynchronize(int dev, long event);
    boolean eventQuery(int dev, long event);
    float eventElapsedMillis(int dev, long start, long end);

    long moduleLoad(int dev, MemorySegment image);
    void moduleUnload(int dev, long module);
    long moduleFunction(int dev, long module, String name);

    enum FunctionAttribute { MAX_THREADS_PER_BLOCK, SHARED_SIZE_BYTES, NUM_REGS, LOCAL_SIZE_BYTES, MAX_DYNAMIC_SHARED_SIZE_BYTES }
    int functionAttribute(int dev, long function, FunctionAttribute attribute);
    void setMaxDynamicSharedMemory(int dev, long function, int bytes);
    /** The byte size of each of the kernel's parameters, in order, or null where the runtime cannot tell (HIP; CUDA drivers before 12.4). */
    long[] kernelParamSizes(int dev, long function);
    int occupancyBlocksPerMultiprocessor(int dev, long function, int blockSize, int dynamicSharedBytes);

    /**
     * The hot path: no allocation, no context switch (the caller made the device current).
     * programmaticDependent: see {@link dev.gin4j.gpu.LaunchConfig} (a plain launch where the
     * platform has no such launch).
     */
    void launch(long function, int gx, int gy, int gz, int bx, int by, int bz, int sharedBytes,
                long stream, MemorySegment params, boolean cooperative, boolean programmaticDependent);

    void beginCapture(int dev, long stream);
    long endCapture(int dev, long stream);
    /** true while {@code stream} captures (as origin, or joined through an event). */
    boolean isCapturing(int dev, long stream);
    long graphInstantiate(int dev, long graph);
    void graphLaunch(int dev, long exec, long stream);
    void graphExecDestroy(int dev, long exec);
    void graphDestroy(int dev, long graph);
}
