package dev.gin4j.gpu.cuda;

import dev.gin4j.bindings.NativeLibrary;
import dev.gin4j.gpu.GpuException;
import dev.gin4j.gpu.driver.Driver;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;

import dev.gin4j.bindings.cuda.CUipcMemHandle_st;
import dev.gin4j.bindings.cuda.CUlaunchAttributeValue_union;
import dev.gin4j.bindings.cuda.CUlaunchAttribute_st;
import dev.gin4j.bindings.cuda.CUlaunchConfig_st;

import static dev.gin4j.bindings.cuda.cuda_h.*;

/**
 * {@link Driver} over the CUDA driver API ({@code libcuda.so.1}) through the generated bindings.
 * Symbol rule: the names {@code cuda.h} declares with the legacy default stream, e.g.
 * {@code cuMemAlloc_v2}, {@code cuLaunchKernel}. Each device is used through its primary context.
 */
public final class CudaDriver implements Driver {
    private final int version;
    private final int count;
    private final MemorySegment[] contexts;

    private CudaDriver() {
        check("cuInit", cuInit(0));
        try (Arena a = Arena.ofConfined()) {
            MemorySegment out = a.allocate(ValueLayout.JAVA_INT);
            check("cuDriverGetVersion", cuDriverGetVersion(out));
            version = out.get(ValueLayout.JAVA_INT, 0);
            check("cuDeviceGetCount", cuDeviceGetCount(out));
            count = out.get(ValueLayout.JAVA_INT, 0);
        }
        contexts = new MemorySegment[count];
    }

    /** Loads the CUDA driver and calls cuInit; throws if the library or a device is missing. */
    public static CudaDriver open() {
        if (!NativeLibrary.CUDA.isAvailable()) {
            throw new GpuException(NativeLibrary.CUDA.describe());  // "CUDA driver: not loaded; tried ..."
        }
        return new CudaDriver();
    }

    static void check(String call, int rc) {
        if (rc != 0) throw error(call, rc);
    }

    static GpuException error(String call, int rc) {
        String name = "CUresult " + rc, message = "(no message)";
        try (Arena a = Arena.ofConfined()) {
            MemorySegment p = a.allocate(ValueLayout.ADDRESS);
            if (cuGetErrorName(rc, p) == 0) name = cString(p.get(ValueLayout.ADDRESS, 0));
            if (cuGetErrorString(rc, p) == 0) message = cString(p.get(ValueLayout.ADDRESS, 0));
        } catch (RuntimeException | LinkageError ignored) {
            // keep the numeric code: the error itself matters more than its name
        }
        return new GpuException(call, rc, name, message);
    }

    private static String cString(MemorySegment p) {
        return p.equals(MemorySegment.NULL) ? "(null)" : p.reinterpret(4096).getString(0);
    }

    /** A driver call that writes one value through its first pointer argument. */
    private interface OutCall { int invoke(MemorySegment out); }

    private static int outInt(String call, OutCall c) {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment out = a.allocate(ValueLayout.JAVA_INT);
            check(call, c.invoke(out));
            return out.get(ValueLayout.JAVA_INT, 0);
        }
    }

    private static long outLong(String call, OutCall c) {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment out = a.allocate(ValueLayout.JAVA_LONG);
            check(call, c.invoke(out));
            return out.get(ValueLayout.JAVA_LONG, 0);
        }
    }

    private static long outAddress(String call, OutCall c) {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment out = a.allocate(ValueLayout.ADDRESS);
            check(call, c.invoke(out));
            return out.get(ValueLayout.ADDRESS, 0).address();
        }
    }

    private int attribute(int dev, int attr) {
        return outInt("cuDeviceGetAttribute", out -> cuDeviceGetAttribute(out, attr, dev));
    }

    @Override public String name() { return "CUDA driver"; }
    @Override public String libraryDescription() { return NativeLibrary.CUDA.describe(); }
    @Override public int version() { return version; }
    @Override public String versionString() { return (version / 1000) + "." + (version % 1000) / 10; }
    @Override public int deviceCount() { return count; }

    @Override public String deviceName(int dev) {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment buf = a.allocate(256);
            check("cuDeviceGetName", cuDeviceGetName(buf, 256, dev));
            return buf.getString(0);
        }
    }

    @Override public String arch(int dev) {
        return "sm_" + attribute(dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR())
                + attribute(dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR());
    }

    @Override public long totalMemory(int dev) {
        return outLong("cuDeviceTotalMem_v2", out -> cuDeviceTotalMem_v2(out, dev));
    }

    @Override public int multiprocessors(int dev) { return attribute(dev, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT()); }
    @Override public int warpSize(int dev) { return attribute(dev, CU_DEVICE_ATTRIBUTE_WARP_SIZE()); }
    @Override public int maxSharedBytesPerBlock(int dev) { return attribute(dev, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN()); }

    @Override public int[] maxGridDims(int dev) {
        return new int[] {attribute(dev, CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X()), attribute(dev, CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y()), attribute(dev, CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z())};
    }

    @Override public int[] maxBlockDims(int dev) {
        return new int[] {attribute(dev, CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X()), attribute(dev, CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y()), attribute(dev, CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z())};
    }

    @Override public String pciBusId(int dev) {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment buf = a.allocate(64);
            check("cuDeviceGetPCIBusId", cuDeviceGetPCIBusId(buf, 64, dev));
            return buf.getString(0);
        }
    }

    @Override public boolean canAccessPeer(int dev, int peer) {
        return outInt("cuDeviceCanAccessPeer", out -> cuDeviceCanAccessPeer(out, dev, peer)) != 0;
    }

    private int p2pAttribute(int attr, int dev, int peer) {
        return outInt("cuDeviceGetP2PAttribute", out -> cuDeviceGetP2PAttribute(out, attr, dev, peer));
    }

    @Override public String linkKind(int dev, int peer) {
        if (dev == peer) return "self";
        if (!canAccessPeer(dev, peer)) return "none (no peer access)";
        // The driver does not name the link; native atomics across the link are an NVLink property
        // (PCIe peer access has no native atomics on these systems). NVML would say more.
        boolean atomics = p2pAttribute(CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED(), dev, peer) != 0;
        int rank = p2pAttribute(CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK(), dev, peer);
        return (atomics ? "NVLink" : "PCIe") + " (peer access, performance rank " + rank + ")";
    }

    @Override public long[] memoryInfo(int dev) {
        makeCurrent(dev);
        try (Arena a = Arena.ofConfined()) {
            MemorySegment free = a.allocate(ValueLayout.JAVA_LONG), total = a.allocate(ValueLayout.JAVA_LONG);
            check("cuMemGetInfo_v2", cuMemGetInfo_v2(free, total));
            return new long[] {free.get(ValueLayout.JAVA_LONG, 0), total.get(ValueLayout.JAVA_LONG, 0)};
        }
    }

    private MemorySegment context(int dev) {
        MemorySegment ctx = contexts[dev];
        if (ctx == null) {
            synchronized (contexts) {
                ctx = contexts[dev];
                if (ctx == null) {
                    try (Arena a = Arena.ofConfined()) {
                        MemorySegment out = a.allocate(ValueLayout.ADDRESS);
                        check("cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain(out, dev));
                        ctx = out.get(ValueLayout.ADDRESS, 0);
                    }
                    contexts[dev] = ctx;
                }
            }
        }
        return ctx;
    }

    @Override public void makeCurrent(int dev) { check("cuCtxSetCurrent", cuCtxSetCurrent(context(dev))); }

    /** One CUcontext slot per thread for cuCtxGetCurrent, so the launch path allocates nothing. */
    private static final ThreadLocal<MemorySegment> CURRENT_OUT = ThreadLocal.withInitial(() -> Arena.ofAuto().allocate(ValueLayout.ADDRESS));

    @Override public void ensureCurrent(int dev) {
        MemorySegment out = CURRENT_OUT.get();
        check("cuCtxGetCurrent", cuCtxGetCurrent(out));
        if (out.get(ValueLayout.JAVA_LONG, 0) != context(dev).address()) makeCurrent(dev);
    }

    @Override public void enablePeerAccess(int dev, int peer) {
        makeCurrent(dev);
        int rc = cuCtxEnablePeerAccess(context(peer), 0);
        if (rc != CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED()) check("cuCtxEnablePeerAccess", rc);
    }

    @Override public void synchronize(int dev) { makeCurrent(dev); check("cuCtxSynchronize", cuCtxSynchronize()); }

    @Override public byte[] ipcHandle(int dev, long ptr) {
        makeCurrent(dev);
        try (Arena a = Arena.ofConfined()) {
            MemorySegment h = a.allocate(CUipcMemHandle_st.layout());
            check("cuIpcGetMemHandle", cuIpcGetMemHandle(h, ptr));
            return h.toArray(ValueLayout.JAVA_BYTE);
        }
    }

    @Override public long ipcOpen(int dev, byte[] handle) {
        makeCurrent(dev);
        try (Arena a = Arena.ofConfined()) {
            MemorySegment h = a.allocate(CUipcMemHandle_st.layout());
            MemorySegment.copy(handle, 0, h, ValueLayout.JAVA_BYTE, 0, Math.min(handle.length, (int) h.byteSize()));
            return outLong("cuIpcOpenMemHandle_v2", out -> cuIpcOpenMemHandle_v2(out, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS()));
        }
    }

    @Override public void ipcClose(int dev, long ptr) { makeCurrent(dev); check("cuIpcCloseMemHandle", cuIpcCloseMemHandle(ptr)); }

    @Override public long malloc(int dev, long bytes) {
        makeCurrent(dev);
        return outLong("cuMemAlloc_v2(" + bytes + " bytes)", out -> cuMemAlloc_v2(out, bytes));
    }

    @Override public void free(int dev, long ptr) { makeCurrent(dev); check("cuMemFree_v2", cuMemFree_v2(ptr)); }

    @Override public long hostAlloc(int dev, long bytes) {
        makeCurrent(dev);
        return outAddress("cuMemHostAlloc(" + bytes + " bytes)", out -> cuMemHostAlloc(out, bytes, CU_MEMHOSTALLOC_PORTABLE() | CU_MEMHOSTALLOC_DEVICEMAP()));
    }

    @Override public void hostFree(int dev, long ptr) { makeCurrent(dev); check("cuMemFreeHost", cuMemFreeHost(MemorySegment.ofAddress(ptr))); }

    @Override public long hostDevicePointer(int dev, long hostPtr) {
        makeCurrent(dev);
        return outLong("cuMemHostGetDevicePointer_v2", out -> cuMemHostGetDevicePointer_v2(out, MemorySegment.ofAddress(hostPtr), 0));
    }

    @Override public void copyOnDevice(int dev, long dst, long src, long bytes, long stream, boolean async) {
        makeCurrent(dev);
        if (async) check("cuMemcpyDtoDAsync_v2", cuMemcpyDtoDAsync_v2(dst, src, bytes, MemorySegment.ofAddress(stream)));
        else check("cuMemcpyDtoD_v2", cuMemcpyDtoD_v2(dst, src, bytes));
    }

    @Override public void copyToDevice(int dev, long dst, MemorySegment src, long bytes, long stream, boolean async) {
        makeCurrent(dev);
        if (async) check("cuMemcpyHtoDAsync_v2", cuMemcpyHtoDAsync_v2(dst, src, bytes, MemorySegment.ofAddress(stream)));
        else {
            check("cuMemcpyHtoD_v2", cuMemcpyHtoD_v2(dst, src, bytes));
            // from pageable memory it may return before the DMA has landed, and gin4j's streams do not
            // wait for the default stream: wait here, so that a synchronous copy is complete when it returns
            check("cuStreamSynchronize", cuStreamSynchronize(MemorySegment.NULL));
        }
    }

    @Override public void copyToHost(int dev, MemorySegment dst, long src, long bytes, long stream, boolean async) {
        makeCurrent(dev);
        if (async) check("cuMemcpyDtoHAsync_v2", cuMemcpyDtoHAsync_v2(dst, src, bytes, MemorySegment.ofAddress(stream)));
        else check("cuMemcpyDtoH_v2", cuMemcpyDtoH_v2(dst, src, bytes));
    }

    @Override public void copyPeer(long dst, int dstDev, long src, int srcDev, long bytes, long stream, boolean async) {
        makeCurrent(srcDev);
        if (async) {
            check("cuMemcpyPeerAsync", cuMemcpyPeerAsync(dst, context(dstDev), src, context(srcDev), bytes, MemorySegment.ofAddress(stream)));
        } else {
            check("cuMemcpyPeer", cuMemcpyPeer(dst, context(dstDev), src, context(srcDev), bytes));
        }
    }

    @Override public void memset8(int dev, long ptr, byte value, long count, long stream, boolean async) {
        makeCurrent(dev);
        if (async) check("cuMemsetD8Async", cuMemsetD8Async(ptr, value, count, MemorySegment.ofAddress(stream)));
        else check("cuMemsetD8_v2", cuMemsetD8_v2(ptr, value, count));
    }

    @Override public void memset32(int dev, long ptr, int value, long count, long stream, boolean async) {
        makeCurrent(dev);
        if (async) check("cuMemsetD32Async", cuMemsetD32Async(ptr, value, count, MemorySegment.ofAddress(stream)));
        else check("cuMemsetD32_v2", cuMemsetD32_v2(ptr, value, count));
    }

    @Override public long streamCreate(int dev) {
        makeCurrent(dev);
        return outAddress("cuStreamCreate", out -> cuStreamCreate(out, CU_STREAM_NON_BLOCKING()));
    }

    @Override public void streamDestroy(int dev, long stream) { makeCurrent(dev); check("cuStreamDestroy_v2", cuStreamDestroy_v2(MemorySegment.ofAddress(stream))); }
    @Override public void streamSynchronize(int dev, long stream) { makeCurrent(dev); check("cuStreamSynchronize", cuStreamSynchronize(MemorySegment.ofAddress(stream))); }

    @Override public boolean streamQuery(int dev, long stream) {
        makeCurrent(dev);
        int rc = cuStreamQuery(MemorySegment.ofAddress(stream));
        if (rc == CUDA_ERROR_NOT_READY()) return false;
        check("cuStreamQuery", rc);
        return true;
    }

    @Override public void streamWaitEvent(int dev, long stream, long event) {
        makeCurrent(dev);
        check("cuStreamWaitEvent", cuStreamWaitEvent(MemorySegment.ofAddress(stream), MemorySegment.ofAddress(event), 0));
    }

    @Override public long eventCreate(int dev, boolean timing) {
        makeCurrent(dev);
        return outAddress("cuEventCreate", out -> cuEventCreate(out, timing ? CU_EVENT_DEFAULT() : CU_EVENT_DISABLE_TIMING()));
    }

    @Override public void eventDestroy(int dev, long event) { makeCurrent(dev); check("cuEventDestroy_v2", cuEventDestroy_v2(MemorySegment.ofAddress(event))); }
    @Override public void eventRecord(int dev, long event, long stream) { makeCurrent(dev); check("cuEventRecord", cuEventRecord(MemorySegment.ofAddress(event), MemorySegment.ofAddress(stream))); }
    @Override public void eventSynchronize(int dev, long event) { makeCurrent(dev); check("cuEventSynchronize", cuEventSynchronize(MemorySegment.ofAddress(event))); }

    @Override public boolean eventQuery(int dev, long event) {
        makeCurrent(dev);
        int rc = cuEventQuery(MemorySegment.ofAddress(event));
        if (rc == CUDA_ERROR_NOT_READY()) return false;
        check("cuEventQuery", rc);
        return true;
    }

    @Override public float eventElapsedMillis(int dev, long start, long end) {
        makeCurrent(dev);
        try (Arena a = Arena.ofConfined()) {
            MemorySegment out = a.allocate(ValueLayout.JAVA_FLOAT);
            check("cuEventElapsedTime_v2", cuEventElapsedTime_v2(out, MemorySegment.ofAddress(start), MemorySegment.ofAddress(end)));
            return out.get(ValueLayout.JAVA_FLOAT, 0);
        }
    }

    @Override public long moduleLoad(int dev, MemorySegment image) {
        makeCurrent(dev);
        return outAddress("cuModuleLoadData", out -> cuModuleLoadData(out, image));
    }

    @Override public void moduleUnload(int dev, long module) { makeCurrent(dev); check("cuModuleUnload", cuModuleUnload(MemorySegment.ofAddress(module))); }

    @Override public long moduleFunction(int dev, long module, String name) {
        makeCurrent(dev);
        try (Arena a = Arena.ofConfined()) {
            MemorySegment out = a.allocate(ValueLayout.ADDRESS);
            check("cuModuleGetFunction(" + name + ")", cuModuleGetFunction(out, MemorySegment.ofAddress(module), a.allocateFrom(name)));
            return out.get(ValueLayout.ADDRESS, 0).address();
        }
    }

    private static int cuAttribute(FunctionAttribute attribute) {
        return switch (attribute) {
            case MAX_THREADS_PER_BLOCK -> CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK();
            case SHARED_SIZE_BYTES -> CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES();
            case NUM_REGS -> CU_FUNC_ATTRIBUTE_NUM_REGS();
            case LOCAL_SIZE_BYTES -> CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES();
            case MAX_DYNAMIC_SHARED_SIZE_BYTES -> CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES();
        };
    }

    @Override public int functionAttribute(int dev, long function, FunctionAttribute attribute) {
        makeCurrent(dev);
        return outInt("cuFuncGetAttribute", out -> cuFuncGetAttribute(out, cuAttribute(attribute), MemorySegment.ofAddress(function)));
    }

    @Override public void setMaxDynamicSharedMemory(int dev, long function, int bytes) {
        makeCurrent(dev);
        check("cuFuncSetAttribute", cuFuncSetAttribute(MemorySegment.ofAddress(function), CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES(), bytes));
    }

    private static final int MAX_KERNEL_PARAMS = 4096;  // a kernel's parameters fit in 32 KiB: far fewer

    @Override public long[] kernelParamSizes(int dev, long function) {
        if (NativeLibrary.CUDA.find("cuFuncGetParamInfo").isEmpty()) return null;  // CUDA 12.4+
        makeCurrent(dev);
        try (Arena a = Arena.ofConfined()) {
            MemorySegment offset = a.allocate(ValueLayout.JAVA_LONG), size = a.allocate(ValueLayout.JAVA_LONG);
            java.util.stream.LongStream.Builder sizes = java.util.stream.LongStream.builder();
            for (int i = 0; i < MAX_KERNEL_PARAMS; i++) {  // the index one past the last parameter is refused as an invalid value
                int rc = cuFuncGetParamInfo(MemorySegment.ofAddress(function), i, offset, size);
                if (rc == CUDA_ERROR_INVALID_VALUE()) return sizes.build().toArray();
                if (rc != CUDA_SUCCESS()) return null;  // the check is optional: an answer it cannot use skips it
                sizes.add(size.get(ValueLayout.JAVA_LONG, 0));
            }
            return null;
        }
    }

    @Override public int occupancyBlocksPerMultiprocessor(int dev, long function, int blockSize, int dynamicSharedBytes) {
        makeCurrent(dev);
        return outInt("cuOccupancyMaxActiveBlocksPerMultiprocessor",
                out -> cuOccupancyMaxActiveBlocksPerMultiprocessor(out, MemorySegment.ofAddress(function), blockSize, dynamicSharedBytes));
    }

    /**
     * Per thread: a CUlaunchConfig followed by its one attribute (programmatic stream serialization),
     * written once; a launch fills in only the grid, block, shared memory and stream.
     */
    private static final ThreadLocal<MemorySegment> LAUNCH_EX = ThreadLocal.withInitial(() -> {
        MemorySegment config = Arena.ofAuto().allocate(CUlaunchConfig_st.sizeof() + CUlaunchAttribute_st.sizeof(), 16);
        MemorySegment attr = config.asSlice(CUlaunchConfig_st.sizeof(), CUlaunchAttribute_st.sizeof());
        CUlaunchAttribute_st.id(attr, CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION());
        CUlaunchAttributeValue_union.programmaticStreamSerializationAllowed(CUlaunchAttribute_st.value(attr), 1);
        CUlaunchConfig_st.attrs(config, attr);
        CUlaunchConfig_st.numAttrs(config, 1);
        return config;
    });

    @Override public void launch(long function, int gx, int gy, int gz, int bx, int by, int bz, int sharedBytes,
                                 long stream, MemorySegment params, boolean cooperative, boolean programmaticDependent) {
        if (programmaticDependent) {
            MemorySegment config = LAUNCH_EX.get();
            CUlaunchConfig_st.gridDimX(config, gx);
            CUlaunchConfig_st.gridDimY(config, gy);
            CUlaunchConfig_st.gridDimZ(config, gz);
            CUlaunchConfig_st.blockDimX(config, bx);
            CUlaunchConfig_st.blockDimY(config, by);
            CUlaunchConfig_st.blockDimZ(config, bz);
            CUlaunchConfig_st.sharedMemBytes(config, sharedBytes);
            CUlaunchConfig_st.hStream(config, MemorySegment.ofAddress(stream));
            int rc = cuLaunchKernelEx(config, MemorySegment.ofAddress(function), params, MemorySegment.NULL);
            if (rc != 0) throw error("cuLaunchKernelEx (programmatic stream serialization)", rc);
            return;
        }
        int rc = cooperative
                ? cuLaunchCooperativeKernel(MemorySegment.ofAddress(function), gx, gy, gz, bx, by, bz, sharedBytes, MemorySegment.ofAddress(stream), params)
                : cuLaunchKernel(MemorySegment.ofAddress(function), gx, gy, gz, bx, by, bz, sharedBytes, MemorySegment.ofAddress(stream), params, MemorySegment.NULL);
        if (rc != 0) throw error(cooperative ? "cuLaunchCooperativeKernel" : "cuLaunchKernel", rc);
    }

    @Override public void beginCapture(int dev, long stream) {
        makeCurrent(dev);
        check("cuStreamBeginCapture_v2", cuStreamBeginCapture_v2(MemorySegment.ofAddress(stream), CU_STREAM_CAPTURE_MODE_THREAD_LOCAL()));
    }

    @Override public long endCapture(int dev, long stream) {
        makeCurrent(dev);
        return outAddress("cuStreamEndCapture", out -> cuStreamEndCapture(MemorySegment.ofAddress(stream), out));
    }

    @Override public boolean isCapturing(int dev, long stream) {
        makeCurrent(dev);
        return outInt("cuStreamIsCapturing", out -> cuStreamIsCapturing(MemorySegment.ofAddress(stream), out)) != CU_STREAM_CAPTURE_STATUS_NONE();
    }

    @Override public long graphInstantiate(int dev, long graph) {
        makeCurrent(dev);
        return outAddress("cuGraphInstantiateWithFlags", out -> cuGraphInstantiateWithFlags(out, MemorySegment.ofAddress(graph), 0L));
    }

    @Override public void graphLaunch(int dev, long exec, long stream) {
        ensureCurrent(dev);
        check("cuGraphLaunch", cuGraphLaunch(MemorySegment.ofAddress(exec), MemorySegment.ofAddress(stream)));
    }

    @Override public void graphExecDestroy(int dev, long exec) { makeCurrent(dev); check("cuGraphExecDestroy", cuGraphExecDestroy(MemorySegment.ofAddress(exec))); }
    @Override public void graphDestroy(int dev, long graph) { makeCurrent(dev); check("cuGraphDestroy", cuGraphDestroy(MemorySegment.ofAddress(graph))); }
}
