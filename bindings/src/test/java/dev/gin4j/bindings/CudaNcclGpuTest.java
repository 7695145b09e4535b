package dev.gin4j.bindings;

import static dev.gin4j.bindings.TestSupport.assumeOrSkip;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.gin4j.bindings.cuda.cuda_h;
import dev.gin4j.bindings.nccl.nccl_h;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

/** Calls the CUDA driver and NCCL through the bindings on a GPU host. */
@Tag("gpu")
class CudaNcclGpuTest {

    private static void check(String call, int rc) {
        if (rc != cuda_h.CUDA_SUCCESS()) {
            String name = "?";
            try (Arena arena = Arena.ofConfined()) {
                MemorySegment p = arena.allocate(cuda_h.C_POINTER);
                if (cuda_h.cuGetErrorName(rc, p) == cuda_h.CUDA_SUCCESS()) {
                    name = p.get(cuda_h.C_POINTER, 0).getString(0);
                }
            }
            throw new AssertionError(call + " returned " + rc + " (" + name + "), expected CUDA_SUCCESS");
        }
    }

    @Test
    void cudaDriverThroughBindings() {
        assumeOrSkip(NativeLibrary.CUDA.isAvailable(), "no CUDA driver: " + NativeLibrary.CUDA.describe());
        System.err.println(NativeLibrary.CUDA.describe());
        try (Arena arena = Arena.ofConfined()) {
            check("cuInit(0)", cuda_h.cuInit(0));
            MemorySegment v = arena.allocate(cuda_h.C_INT);
            check("cuDriverGetVersion", cuda_h.cuDriverGetVersion(v));
            int version = v.get(cuda_h.C_INT, 0);
            assertTrue(version >= 12000, "driver API version " + version + " < 12000");
            check("cuDeviceGetCount", cuda_h.cuDeviceGetCount(v));
            int count = v.get(cuda_h.C_INT, 0);
            assertTrue(count >= 1, "device count " + count);
            MemorySegment dev = arena.allocate(cuda_h.C_INT);
            check("cuDeviceGet(0)", cuda_h.cuDeviceGet(dev, 0));
            MemorySegment name = arena.allocate(256);
            check("cuDeviceGetName", cuda_h.cuDeviceGetName(name, 256, dev.get(cuda_h.C_INT, 0)));
            String deviceName = name.getString(0);
            assertFalse(deviceName.isBlank(), "empty device name");
            MemorySegment bytes = arena.allocate(cuda_h.C_LONG);
            check("cuDeviceTotalMem_v2", cuda_h.cuDeviceTotalMem_v2(bytes, dev.get(cuda_h.C_INT, 0)));
            assertTrue(bytes.get(cuda_h.C_LONG, 0) > (1L << 30), "total memory " + bytes.get(cuda_h.C_LONG, 0));
            System.err.println("CUDA driver " + version + ", " + count + " device(s), device 0: " + deviceName
                    + ", " + (bytes.get(cuda_h.C_LONG, 0) >> 20) + " MiB");
        }
    }

    @Test
    void ncclVersionThroughBindings() {
        assumeOrSkip(NativeLibrary.CUDA.isAvailable(), "no CUDA driver: " + NativeLibrary.CUDA.describe());
        assumeOrSkip(NativeLibrary.NCCL.isAvailable(), "no NCCL: " + NativeLibrary.NCCL.describe());
        System.err.println(NativeLibrary.NCCL.describe());
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment v = arena.allocate(nccl_h.C_INT);
            int rc = nccl_h.ncclGetVersion(v);
            assertEquals(nccl_h.ncclSuccess(), rc, "ncclGetVersion returned " + rc + " ("
                    + nccl_h.ncclGetErrorString(rc).getString(0) + ")");
            int version = v.get(nccl_h.C_INT, 0);
            // NCCL_VERSION(2,28,0) = 22800 since 2.9 (major*10000 + minor*100 + patch)
            assertTrue(version >= 22800, "NCCL version code " + version + " < 22800 (2.28)");
            System.err.println("NCCL version code " + version);
        }
    }
}
