package dev.gin4j.gpu;

import dev.gin4j.gpu.driver.Driver;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.List;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicLong;

/**
 * A {@link Driver} without a GPU, for CPU tests of the checks above the driver: it hands out fake
 * handles and device addresses, records allocations and frees, and moves no data. Tests override
 * single methods (anonymous subclasses) to make a call fail.
 */
class FakeDriver implements Driver {
    final Set<Long> deviceAllocations = ConcurrentHashMap.newKeySet();
    final Set<Long> hostAllocations = ConcurrentHashMap.newKeySet();
    final List<String> calls = new ArrayList<>();
    private final AtomicLong next = new AtomicLong(0x7000_0000_0000L);

    /** A runtime of one device over this driver. */
    GpuRuntime runtime() { return new GpuRuntime(this); }

    static GpuException failure(String call, String errorName) { return new GpuException(call, 999, errorName, "fake failure"); }

    private long handle() { return next.addAndGet(0x1_0000); }
    private synchronized void called(String call) { calls.add(call); }
    synchronized boolean wasCalled(String call) { return calls.contains(call); }

    @Override public String name() { return "fake driver"; }
    @Override public String libraryDescription() { return "no library (CPU test)"; }
    @Override public int version() { return 0; }
    @Override public String versionString() { return "0.0"; }
    @Override public int deviceCount() { return 1; }
    @Override public String deviceName(int dev) { return "Fake GPU"; }
    @Override public String arch(int dev) { return "sm_90"; }
    @Override public long totalMemory(int dev) { return 1L << 34; }
    @Override public int multiprocessors(int dev) { return 132; }
    @Override public int warpSize(int dev) { return 32; }
    @Override public int maxSharedBytesPerBlock(int dev) { return 227 << 10; }
    @Override public int[] maxGridDims(int dev) { return new int[] {Integer.MAX_VALUE, 65535, 65535}; }
    @Override public int[] maxBlockDims(int dev) { return new int[] {1024, 1024, 64}; }
    @Override public String pciBusId(int dev) { return "0000:00:00.0"; }
    @Override public boolean canAccessPeer(int dev, int peer) { return false; }
    @Override public String linkKind(int dev, int peer) { return "none"; }
    @Override public long[] memoryInfo(int dev) { return new long[] {1L << 34, 1L << 34}; }
    @Override public void makeCurrent(int dev) {}
    @Override public void ensureCurrent(int dev) {}
    @Override public void enablePeerAccess(int dev, int peer) {}
    @Override public void synchronize(int dev) {}

    @Override public long malloc(int dev, long bytes) {
        long p = handle();
        deviceAllocations.add(p);
        return p;
    }

    @Override public void free(int dev, long ptr) {
        if (!deviceAllocations.remove(ptr)) throw new AssertionError("free of 0x" + Long.toHexString(ptr) + ", which is not allocated");
    }

    @Override public long hostAlloc(int dev, long bytes) {
        long p = Arena.global().allocate(bytes, 64).address(); // real memory: the host view is read and written
        hostAllocations.add(p);
        return p;
    }

    @Override public void hostFree(int dev, long ptr) {
        if (!hostAllocations.remove(ptr)) throw new AssertionError("hostFree of 0x" + Long.toHexString(ptr) + ", which is not allocated");
    }

    @Override public long hostDevicePointer(int dev, long hostPtr) { return hostPtr; }
    @Override public void copy(int dev, long dst, long src, long bytes, CopyKind kind, long stream, boolean async) { called("copy"); }
    @Override public void copyToDevice(int dev, long dst, MemorySegment src, long bytes, long stream, boolean async) { called("copyToDevice"); }
    @Override public void copyToHost(int dev, MemorySegment dst, long src, long bytes, long stream, boolean async) { called("copyToHost"); }
    @Override public void copyPeer(long dst, int dstDev, long src, int srcDev, long bytes, long stream, boolean async) { called("copyPeer"); }
    @Override public void memset8(int dev, long ptr, byte value, long count, long stream, boolean async) { called("memset8"); }
    @Override public void memset32(int dev, long ptr, int value, long count, long stream, boolean async) { called("memset32"); }
    @Override public long streamCreate(int dev) { return handle(); }
    @Override public void streamDestroy(int dev, long stream) {}
    @Override public void streamSynchronize(int dev, long stream) {}
    @Override public boolean streamQuery(int dev, long stream) { return true; }
    @Override public void streamWaitEvent(int dev, long stream, long event) {}
    @Override public long eventCreate(int dev, boolean timing) { return handle(); }
    @Override public void eventDestroy(int dev, long event) {}
    @Override public void eventRecord(int dev, long event, long stream) {}
    @Override public void eventSynchronize(int dev, long event) {}
    @Override public boolean eventQuery(int dev, long event) { return true; }
    @Override public float eventElapsedMillis(int dev, long start, long end) { return 1f; }
    @Override public long moduleLoad(int dev, MemorySegment image) { return handle(); }
    @Override public void moduleUnload(int dev, long module) {}
    @Override public long moduleFunction(int dev, long module, String name) { return handle(); }

    @Override public int functionAttribute(int dev, long function, FunctionAttribute attribute) {
        return switch (attribute) {
            case MAX_THREADS_PER_BLOCK -> 1024;
            case MAX_DYNAMIC_SHARED_SIZE_BYTES -> 48 << 10;
            default -> 0;
        };
    }

    @Override public void setMaxDynamicSharedMemory(int dev, long function, int bytes) { called("setMaxDynamicSharedMemory"); }
    @Override public int occupancyBlocksPerMultiprocessor(int dev, long function, int blockSize, int dynamicSharedBytes) { return 1; }

    @Override public void launch(long function, int gx, int gy, int gz, int bx, int by, int bz, int sharedBytes,
                                 long stream, MemorySegment params, boolean cooperative, boolean programmaticDependent) { called("launch"); }

    @Override public void beginCapture(int dev, long stream) {}
    @Override public long endCapture(int dev, long stream) { return handle(); }
    @Override public long graphInstantiate(int dev, long graph) { return handle(); }
    @Override public void graphLaunch(int dev, long exec, long stream) {}
    @Override public void graphExecDestroy(int dev, long exec) {}
    @Override public void graphDestroy(int dev, long graph) { called("graphDestroy"); }
}
