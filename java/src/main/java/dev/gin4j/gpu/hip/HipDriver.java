package dev.gin4j.gpu.hip;

import dev.gin4j.bindings.NativeLibrary;
import dev.gin4j.gpu.GpuException;
import dev.gin4j.gpu.driver.Driver;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;

import dev.gin4j.bindings.hip.hipDeviceProp_tR0600;
import dev.gin4j.bindings.hip.hipIpcMemHandle_st;

import static dev.gin4j.bindings.hip.hip_runtime_api_h.*;

/**
 * {@link Driver} over the HIP runtime ({@code libamdhip64}) through the generated bindings.
 * HIP keeps a current device per thread; {@link #makeCurrent} is {@code hipSetDevice}.
 */
public final class HipDriver implements Driver {
    private final int version;
    private final int count;

    private HipDriver() {
        try (Arena a = Arena.ofConfined()) {
            // counting first: without an AMD GPU it answers hipErrorNoDevice, the clearest report
            MemorySegment out = a.allocate(ValueLayout.JAVA_INT);
            check("hipGetDeviceCount", hipGetDeviceCount(out));
            count = out.get(ValueLayout.JAVA_INT, 0);
            check("hipInit", hipInit(0));
            check("hipDriverGetVersion", hipDriverGetVersion(out));
            version = out.get(ValueLayout.JAVA_INT, 0);
        }
    }

    /** Loads HIP and counts devices; a machine without an AMD GPU gives hipErrorNoDevice as a GpuException. */
    public static HipDriver open() {
        if (!NativeLibrary.HIP.isAvailable()) {
            throw new GpuException(NativeLibrary.HIP.describe());  // "HIP runtime: not loaded; tried ..."
        }
        return new HipDriver();
    }

    static void check(String call, int rc) {
        if (rc != 0) throw error(call, rc);
    }

    static GpuException error(String call, int rc) {
        String name = "hipError_t " + rc, message = "(no message)";
        try {
            MemorySegment n = hipGetErrorName(rc);
            if (!n.equals(MemorySegment.NULL)) name = n.reinterpret(4096).getString(0);
            MemorySegment m = hipGetErrorString(rc);
            if (!m.equals(MemorySegment.NULL)) message = m.reinterpret(4096).getString(0);
        } catch (RuntimeException | LinkageError ignored) {
            // keep the numeric code
        }
        return new GpuException(call, rc, name, message);
    }

    private int attribute(int dev, int attr) {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment out = a.allocate(ValueLayout.JAVA_INT);
            check("hipDeviceGetAttribute", hipDeviceGetAttribute(out, attr, dev));
            return out.get(ValueLayout.JAVA_INT, 0);
        }
    }

    private static MemorySegment ptr(long address) { return MemorySegment.ofAddress(address); }

    @Override public String name() { return "HIP"; }
    @Override public String libraryDescription() { return NativeLibrary.HIP.describe(); }
    @Override public int version() { return version; }
    @Override public String versionString() { return (version / 10_000_000) + "." + (version / 100_000) % 100 + "." + version % 100_000; }
    @Override public int deviceCount() { return count; }

    @Override public String deviceName(int dev) {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment buf = a.allocate(256);
            check("hipDeviceGetName", hipDeviceGetName(buf, 256, dev));
            return buf.getString(0);
        }
    }

    @Override public String arch(int dev) {
        if (NativeLibrary.HIP.find("hipGetDevicePropertiesR0600").isEmpty()) {
            // HIP before 6.0 exports no R0600 properties call; its compute capability gives gfx<major><minor>x only
            return "gfx" + attribute(dev, hipDeviceAttributeComputeCapabilityMajor()) + attribute(dev, hipDeviceAttributeComputeCapabilityMinor()) + "x";
        }
        try (Arena a = Arena.ofConfined()) {
            MemorySegment props = a.allocate(hipDeviceProp_tR0600.layout());
            check("hipGetDevicePropertiesR0600", hipGetDevicePropertiesR0600(props, dev));
            String full = hipDeviceProp_tR0600.gcnArchName(props).getString(0); // e.g. "gfx942:sramecc+:xnack-"
            int colon = full.indexOf(':');
            return colon < 0 ? full : full.substring(0, colon);
        }
    }

    @Override public long totalMemory(int dev) {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment out = a.allocate(ValueLayout.JAVA_LONG);
            check("hipDeviceTotalMem", hipDeviceTotalMem(out, dev));
            return out.get(ValueLayout.JAVA_LONG, 0);
        }
    }

    @Override public int multiprocessors(int dev) { return attribute(dev, hipDeviceAttributeMultiprocessorCount()); }
    @Override public int warpSize(int dev) { return attribute(dev, hipDeviceAttributeWarpSize()); }
    @Override public int maxSharedBytesPerBlock(int dev) { return attribute(dev, hipDeviceAttributeSharedMemPerBlockOptin()); }

    @Override public int[] maxGridDims(int dev) {
        return new int[] {attribute(dev, hipDeviceAttributeMaxGridDimX()), attribute(dev, hipDeviceAttributeMaxGridDimY()), attribute(dev, hipDeviceAttributeMaxGridDimZ())};
    }

    @Override public int[] maxBlockDims(int dev) {
        return new int[] {attribute(dev, hipDeviceAttributeMaxBlockDimX()), attribute(dev, hipDeviceAttributeMaxBlockDimY()), attribute(dev, hipDeviceAttributeMaxBlockDimZ())};
    }

    @Override public String pciBusId(int dev) {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment buf = a.allocate(64);
            check("hipDeviceGetPCIBusId", hipDeviceGetPCIBusId(buf, 64, dev));
            return buf.getString(0);
        }
    }

    @Override public boolean canAccessPeer(int dev, int peer) {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment out = a.allocate(ValueLayout.JAVA_INT);
            check("hipDeviceCanAccessPeer", hipDeviceCanAccessPeer(out, dev, peer));
            return out.get(ValueLayout.JAVA_INT, 0) != 0;
        }
    }

    @Override public String linkKind(int dev, int peer) {
        if (dev == peer) return "self";
        try (Arena a = Arena.ofConfined()) {
            MemorySegment type = a.allocate(ValueLayout.JAVA_INT), hops = a.allocate(ValueLayout.JAVA_INT);
            check("hipExtGetLinkTypeAndHopCount", hipExtGetLinkTypeAndHopCount(dev, peer, type, hops));
            // HSA link types: 0 HyperTransport, 1 QPI, 2 PCIe, 3 InfiniBand, 4 XGMI
            String kind = switch (type.get(ValueLayout.JAVA_INT, 0)) {
                case 2 -> "PCIe"; case 4 -> "XGMI"; case 3 -> "InfiniBand"; case 1 -> "QPI"; case 0 -> "HyperTransport";
                default -> "link type " + type.get(ValueLayout.JAVA_INT, 0);
            };
            return kind + " (" + hops.get(ValueLayout.JAVA_INT, 0) + " hop(s))";
        }
    }

    @Override public long[] memoryInfo(int dev) {
        makeCurrent(dev);
        try (Arena a = Arena.ofConfined()) {
            MemorySegment free = a.allocate(ValueLayout.JAVA_LONG), total = a.allocate(ValueLayout.JAVA_LONG);
            check("hipMemGetInfo", hipMemGetInfo(free, total));
            return new long[] {free.get(ValueLayout.JAVA_LONG, 0), total.get(ValueLayout.JAVA_LONG, 0)};
        }
    }

    @Override public void makeCurrent(int dev) { check("hipSetDevice", hipSetDevice(dev)); }

    /** One int slot per thread for hipGetDevice, so the launch path allocates nothing. */
    private static final ThreadLocal<MemorySegment> CURRENT_OUT = ThreadLocal.withInitial(() -> Arena.ofAuto().allocate(ValueLayout.JAVA_INT));

    @Override public void ensureCurrent(int dev) {
        MemorySegment out = CURRENT_OUT.get();
        check("hipGetDevice", hipGetDevice(out));
        if (out.get(ValueLayout.JAVA_INT, 0) != dev) makeCurrent(dev);
    }

    @Override public void enablePeerAccess(int dev, int peer) {
        makeCurrent(dev);
        int rc = hipDeviceEnablePeerAccess(peer, 0);
        if (rc != hipErrorPeerAccessAlreadyEnabled()) check("hipDeviceEnablePeerAccess", rc);
    }

    @Override public void synchronize(int dev) { makeCurrent(dev); check("hipDeviceSynchronize", hipDeviceSynchronize()); }

    @Override public byte[] ipcHandle(int dev, long p) {
        makeCurrent(dev);
        try (Arena a = Arena.ofConfined()) {
            MemorySegment h = a.allocate(hipIpcMemHandle_st.layout());
            check("hipIpcGetMemHandle", hipIpcGetMemHandle(h, ptr(p)));
            return h.toArray(ValueLayout.JAVA_BYTE);
        }
    }

    @Override public long ipcOpen(int dev, byte[] handle) {
        makeCurrent(dev);
        try (Arena a = Arena.ofConfined()) {
            MemorySegment h = a.allocate(hipIpcMemHandle_st.layout());
            MemorySegment.copy(handle, 0, h, ValueLayout.JAVA_BYTE, 0, Math.min(handle.length, (int) h.byteSize()));
            return allocWith("hipIpcOpenMemHandle", out -> hipIpcOpenMemHandle(out, h, hipIpcMemLazyEnablePeerAccess()));
        }
    }

    @Override public void ipcClose(int dev, long p) { makeCurrent(dev); check("hipIpcCloseMemHandle", hipIpcCloseMemHandle(ptr(p))); }

    private long allocWith(String call, java.util.function.ToIntFunction<MemorySegment> alloc) {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment out = a.allocate(ValueLayout.ADDRESS);
            check(call, alloc.applyAsInt(out));
            return out.get(ValueLayout.ADDRESS, 0).address();
        }
    }

    @Override public long malloc(int dev, long bytes) { makeCurrent(dev); return allocWith("hipMalloc(" + bytes + " bytes)", out -> hipMalloc(out, bytes)); }
    @Override public void free(int dev, long ptr) { makeCurrent(dev); check("hipFree", hipFree(ptr(ptr))); }

    @Override public long hostAlloc(int dev, long bytes) {
        makeCurrent(dev);
        return allocWith("hipHostMalloc(" + bytes + " bytes)", out -> hipHostMalloc(out, bytes, hipHostMallocPortable() | hipHostMallocMapped()));
    }

    @Override public void hostFree(int dev, long ptr) { makeCurrent(dev); check("hipHostFree", hipHostFree(ptr(ptr))); }

    @Override public long hostDevicePointer(int dev, long hostPtr) {
        makeCurrent(dev);
        return allocWith("hipHostGetDevicePointer", out -> hipHostGetDevicePointer(out, ptr(hostPtr), 0));
    }

    @Override public void copyOnDevice(int dev, long dst, long src, long bytes, long stream, boolean async) {
        makeCurrent(dev);
        if (async) check("hipMemcpyAsync", hipMemcpyAsync(ptr(dst), ptr(src), bytes, hipMemcpyDeviceToDevice(), ptr(stream)));
        else check("hipMemcpy", hipMemcpy(ptr(dst), ptr(src), bytes, hipMemcpyDeviceToDevice()));
    }

    @Override public void copyToDevice(int dev, long dst, MemorySegment src, long bytes, long stream, boolean async) {
        makeCurrent(dev);
        if (async) check("hipMemcpyAsync", hipMemcpyAsync(ptr(dst), src, bytes, hipMemcpyHostToDevice(), ptr(stream)));
        else {
            check("hipMemcpy", hipMemcpy(ptr(dst), src, bytes, hipMemcpyHostToDevice()));
            check("hipStreamSynchronize", hipStreamSynchronize(ptr(0)));  // as on CUDA: complete when it returns
        }
    }

    @Override public void copyToHost(int dev, MemorySegment dst, long src, long bytes, long stream, boolean async) {
        makeCurrent(dev);
        if (async) check("hipMemcpyAsync", hipMemcpyAsync(dst, ptr(src), bytes, hipMemcpyDeviceToHost(), ptr(stream)));
        else check("hipMemcpy", hipMemcpy(dst, ptr(src), bytes, hipMemcpyDeviceToHost()));
    }

    @Override public void copyPeer(long dst, int dstDev, long src, int srcDev, long bytes, long stream, boolean async) {
        makeCurrent(srcDev);
        if (async) check("hipMemcpyPeerAsync", hipMemcpyPeerAsync(ptr(dst), dstDev, ptr(src), srcDev, bytes, ptr(stream)));
        else check("hipMemcpyPeer", hipMemcpyPeer(ptr(dst), dstDev, ptr(src), srcDev, bytes));
    }

    @Override public void memset8(int dev, long p, byte value, long count, long stream, boolean async) {
        makeCurrent(dev);
        if (async) check("hipMemsetAsync", hipMemsetAsync(ptr(p), value, count, ptr(stream)));
        else check("hipMemset", hipMemset(ptr(p), value, count));
    }

    @Override public void memset32(int dev, long p, int value, long count, long stream, boolean async) {
        makeCurrent(dev);
        check("hipMemsetD32Async", hipMemsetD32Async(ptr(p), value, count, ptr(stream)));
        if (!async) streamSynchronize(dev, stream);
    }

    @Override public long streamCreate(int dev) { makeCurrent(dev); return allocWith("hipStreamCreateWithFlags", out -> hipStreamCreateWithFlags(out, hipStreamNonBlocking())); }
    @Override public void streamDestroy(int dev, long stream) { makeCurrent(dev); check("hipStreamDestroy", hipStreamDestroy(ptr(stream))); }
    @Override public void streamSynchronize(int dev, long stream) { makeCurrent(dev); check("hipStreamSynchronize", hipStreamSynchronize(ptr(stream))); }

    @Override public boolean streamQuery(int dev, long stream) {
        makeCurrent(dev);
        int rc = hipStreamQuery(ptr(stream));
        if (rc == hipErrorNotReady()) return false;
        check("hipStreamQuery", rc);
        return true;
    }

    @Override public void streamWaitEvent(int dev, long stream, long event) { makeCurrent(dev); check("hipStreamWaitEvent", hipStreamWaitEvent(ptr(stream), ptr(event), 0)); }

    @Override public long eventCreate(int dev, boolean timing) {
        makeCurrent(dev);
        return allocWith("hipEventCreateWithFlags", out -> hipEventCreateWithFlags(out, timing ? hipEventDefault() : hipEventDisableTiming()));
    }

    @Override public void eventDestroy(int dev, long event) { makeCurrent(dev); check("hipEventDestroy", hipEventDestroy(ptr(event))); }
    @Override public void eventRecord(int dev, long event, long stream) { makeCurrent(dev); check("hipEventRecord", hipEventRecord(ptr(event), ptr(stream))); }
    @Override public void eventSynchronize(int dev, long event) { makeCurrent(dev); check("hipEventSynchronize", hipEventSynchronize(ptr(event))); }

    @Override public boolean eventQuery(int dev, long event) {
        makeCurrent(dev);
        int rc = hipEventQuery(ptr(event));
        if (rc == hipErrorNotReady()) return false;
        check("hipEventQuery", rc);
        return true;
    }

    @Override public float eventElapsedMillis(int dev, long start, long end) {
        makeCurrent(dev);
        try (Arena a = Arena.ofConfined()) {
            MemorySegment out = a.allocate(ValueLayout.JAVA_FLOAT);
            check("hipEventElapsedTime", hipEventElapsedTime(out, ptr(start), ptr(end)));
            return out.get(ValueLayout.JAVA_FLOAT, 0);
        }
    }

    @Override public long moduleLoad(int dev, MemorySegment image) { makeCurrent(dev); return allocWith("hipModuleLoadData", out -> hipModuleLoadData(out, image)); }
    @Override public void moduleUnload(int dev, long module) { makeCurrent(dev); check("hipModuleUnload", hipModuleUnload(ptr(module))); }

    @Override public long moduleFunction(int dev, long module, String name) {
        makeCurrent(dev);
        try (Arena a = Arena.ofConfined()) {
            MemorySegment out = a.allocate(ValueLayout.ADDRESS);
            check("hipModuleGetFunction(" + name + ")", hipModuleGetFunction(out, ptr(module), a.allocateFrom(name)));
            return out.get(ValueLayout.ADDRESS, 0).address();
        }
    }

    private static int hipAttribute(FunctionAttribute attribute) {
        return switch (attribute) {
            case MAX_THREADS_PER_BLOCK -> HIP_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK();
            case SHARED_SIZE_BYTES -> HIP_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES();
            case NUM_REGS -> HIP_FUNC_ATTRIBUTE_NUM_REGS();
            case LOCAL_SIZE_BYTES -> HIP_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES();
            case MAX_DYNAMIC_SHARED_SIZE_BYTES -> HIP_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES();
        };
    }

    @Override public long[] kernelParamSizes(int dev, long function) { return null; }  // HIP has no parameter query

    @Override public int functionAttribute(int dev, long function, FunctionAttribute attribute) {
        makeCurrent(dev);
        try (Arena a = Arena.ofConfined()) {
            MemorySegment out = a.allocate(ValueLayout.JAVA_INT);
            check("hipFuncGetAttribute", hipFuncGetAttribute(out, hipAttribute(attribute), ptr(function)));
            return out.get(ValueLayout.JAVA_INT, 0);
        }
    }

    @Override public void setMaxDynamicSharedMemory(int dev, long function, int bytes) {
        // HIP kernels may use up to the device limit without opting in.
        int max = attribute(dev, hipDeviceAttributeMaxSharedMemoryPerBlock());
        if (bytes > max) throw new GpuException("dynamic shared memory of " + bytes + " bytes exceeds the device limit of " + max);
    }

    @Override public int occupancyBlocksPerMultiprocessor(int dev, long function, int blockSize, int dynamicSharedBytes) {
        makeCurrent(dev);
        try (Arena a = Arena.ofConfined()) {
            MemorySegment out = a.allocate(ValueLayout.JAVA_INT);
            check("hipModuleOccupancyMaxActiveBlocksPerMultiprocessor",
                    hipModuleOccupancyMaxActiveBlocksPerMultiprocessor(out, ptr(function), blockSize, dynamicSharedBytes));
            return out.get(ValueLayout.JAVA_INT, 0);
        }
    }

    @Override public void launch(long function, int gx, int gy, int gz, int bx, int by, int bz, int sharedBytes,
                                 long stream, MemorySegment params, boolean cooperative, boolean programmaticDependent) {
        // HIP has no programmatic dependent launch: an ordinary launch, stream-ordered (the kernels' wait is a no-op there)
        int rc = cooperative
                ? hipModuleLaunchCooperativeKernel(ptr(function), gx, gy, gz, bx, by, bz, sharedBytes, ptr(stream), params)
                : hipModuleLaunchKernel(ptr(function), gx, gy, gz, bx, by, bz, sharedBytes, ptr(stream), params, MemorySegment.NULL);
        if (rc != 0) throw error(cooperative ? "hipModuleLaunchCooperativeKernel" : "hipModuleLaunchKernel", rc);
    }

    @Override public void beginCapture(int dev, long stream) { makeCurrent(dev); check("hipStreamBeginCapture", hipStreamBeginCapture(ptr(stream), hipStreamCaptureModeThreadLocal())); }

    @Override public long endCapture(int dev, long stream) { makeCurrent(dev); return allocWith("hipStreamEndCapture", out -> hipStreamEndCapture(ptr(stream), out)); }

    @Override public boolean isCapturing(int dev, long stream) {
        makeCurrent(dev);
        try (Arena a = Arena.ofConfined()) {
            MemorySegment status = a.allocate(ValueLayout.JAVA_INT);
            check("hipStreamIsCapturing", hipStreamIsCapturing(ptr(stream), status));
            return status.get(ValueLayout.JAVA_INT, 0) != hipStreamCaptureStatusNone();
        }
    }
    @Override public long graphInstantiate(int dev, long graph) { makeCurrent(dev); return allocWith("hipGraphInstantiateWithFlags", out -> hipGraphInstantiateWithFlags(out, ptr(graph), 0L)); }
    @Override public void graphLaunch(int dev, long exec, long stream) { ensureCurrent(dev); check("hipGraphLaunch", hipGraphLaunch(ptr(exec), ptr(stream))); }
    @Override public void graphExecDestroy(int dev, long exec) { makeCurrent(dev); check("hipGraphExecDestroy", hipGraphExecDestroy(ptr(exec))); }
    @Override public void graphDestroy(int dev, long graph) { makeCurrent(dev); check("hipGraphDestroy", hipGraphDestroy(ptr(graph))); }
}
