package dev.gin4j.gpu;

import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;

import static org.junit.jupiter.api.Assertions.*;

/**
 * The runtime layer's checks over {@link FakeDriver}, on any machine: failed construction leaves
 * nothing registered, allocation with a bad arena frees what it allocated, host copies refuse dead
 * or read-only host memory, kernels check their shape and name their launch failures.
 */
class RuntimeGuardsTest {
    private int liveBefore;
    private long buffersBefore;

    @BeforeEach void countResources() { liveBefore = NativeResource.liveCount(); buffersBefore = DeviceBuffer.liveCount(); }

    @AfterEach void everythingClosed() {
        assertEquals(liveBefore, NativeResource.liveCount(), () -> "native objects left registered:\n" + NativeResource.liveSummary());
        assertEquals(buffersBefore, DeviceBuffer.liveCount(), "device buffers counted as live");
    }

    @Test void failedConstructionLeavesNothingRegistered() {
        FakeDriver failing = new FakeDriver() {
            @Override public long streamCreate(int dev) { throw failure("cuStreamCreate", "CUDA_ERROR_OUT_OF_MEMORY"); }
            @Override public long eventCreate(int dev, boolean timing) { throw failure("cuEventCreate", "CUDA_ERROR_OUT_OF_MEMORY"); }
            @Override public long graphInstantiate(int dev, long graph) { throw failure("cuGraphInstantiateWithFlags", "CUDA_ERROR_INVALID_VALUE"); }
            @Override public void graphDestroy(int dev, long graph) { super.graphDestroy(dev, graph); throw failure("cuGraphDestroy", "CUDA_ERROR_ILLEGAL_ADDRESS"); }
            @Override public long moduleLoad(int dev, MemorySegment image) { throw failure("cuModuleLoadData", "CUDA_ERROR_NO_BINARY_FOR_GPU"); }
        };
        Device dev = failing.runtime().device(0);
        assertThrows(GpuException.class, dev::createStream);
        assertThrows(GpuException.class, dev::createEvent);
        assertEquals(liveBefore, NativeResource.liveCount(), NativeResource::liveSummary);

        GpuException graph = assertThrows(GpuException.class, () -> new Graph(dev, 0x1234));
        assertEquals("cuGraphInstantiateWithFlags", graph.call(), "the instantiation failure is reported, not the cleanup's");
        assertEquals(1, graph.getSuppressed().length);
        assertTrue(failing.wasCalled("graphDestroy"), "the captured graph is destroyed");

        IllegalArgumentException empty = assertThrows(IllegalArgumentException.class, () -> dev.loadCodeObject("basic", new byte[0]));
        assertTrue(empty.getMessage().contains("'basic' is empty"), empty.getMessage());
        GpuException wrongArch = assertThrows(GpuException.class, () -> dev.loadCodeObject("basic", new byte[] {1, 2, 3}));
        assertTrue(wrongArch.getMessage().contains("'basic'") && wrongArch.getMessage().contains("sm_90"), wrongArch.getMessage());
        assertTrue(wrongArch.getMessage().contains("rebuild it for sm_90"), wrongArch.getMessage());
        assertEquals("CUDA_ERROR_NO_BINARY_FOR_GPU", wrongArch.errorName(), "the runtime's error name survives the wrapping");
        assertInstanceOf(GpuException.class, wrongArch.getCause());
    }

    @Test void allocationFreesWhatItAllocatedWhenTheArenaCannotTakeIt() throws Exception {
        FakeDriver driver = new FakeDriver();
        Device dev = driver.runtime().device(0);
        Arena closed = Arena.ofConfined();
        closed.close();
        IllegalStateException dead = assertThrows(IllegalStateException.class, () -> dev.allocate(64, closed));
        assertTrue(dead.getMessage().contains("arena is closed"), dead.getMessage());
        assertThrows(IllegalStateException.class, () -> dev.allocatePinned(64, closed));
        assertTrue(driver.deviceAllocations.isEmpty() && driver.hostAllocations.isEmpty(), "nothing allocated for a closed arena");

        try (Arena mine = Arena.ofConfined()) {
            // another thread: the runtime allocates, then the confined arena refuses the cleanup
            assertInstanceOf(WrongThreadException.class, failureOf(() -> dev.allocate(64, mine)));
            assertInstanceOf(WrongThreadException.class, failureOf(() -> dev.allocatePinned(64, mine)));
            assertTrue(driver.deviceAllocations.isEmpty(), "device memory freed after the failure");
            assertTrue(driver.hostAllocations.isEmpty(), "pinned memory freed after the failure");
            assertEquals(buffersBefore, DeviceBuffer.liveCount());

            DeviceBuffer ok = dev.allocate(64, mine);
            assertEquals(buffersBefore + 1, DeviceBuffer.liveCount());
            assertEquals(1, driver.deviceAllocations.size());
            assertEquals(64, ok.byteSize());
        }
        assertTrue(driver.deviceAllocations.isEmpty(), "freed with its arena");
    }

    private static Throwable failureOf(Runnable r) throws InterruptedException {
        try {
            CompletableFuture.runAsync(r).get();
            return null;
        } catch (ExecutionException e) {
            return e.getCause();
        }
    }

    @Test void hostCopiesRefuseDeadReadOnlyOrForeignHostMemory() throws Exception {
        FakeDriver driver = new FakeDriver();
        Device dev = driver.runtime().device(0);
        try (Arena arena = Arena.ofConfined(); Stream s = dev.createStream()) {
            DeviceBuffer buf = dev.allocate(64, arena);
            MemorySegment freed;
            try (Arena host = Arena.ofConfined()) {
                freed = host.allocate(64);
            }
            for (Runnable copy : new Runnable[] {() -> buf.copyFromHost(freed), () -> buf.copyToHost(freed),
                    () -> buf.copyFromHostAsync(freed, s), () -> buf.copyToHostAsync(freed, s)}) {
                IllegalStateException e = assertThrows(IllegalStateException.class, copy::run);
                assertTrue(e.getMessage().contains("no longer alive"), e.getMessage());
            }
            MemorySegment readOnly = arena.allocate(64).asReadOnly();
            IllegalArgumentException ro = assertThrows(IllegalArgumentException.class, () -> buf.copyToHost(readOnly));
            assertTrue(ro.getMessage().contains("read-only"), ro.getMessage());
            assertThrows(IllegalArgumentException.class, () -> buf.copyToHostAsync(readOnly, s));
            assertThrows(IllegalArgumentException.class, () -> buf.copyToHost(MemorySegment.ofArray(new byte[64]).asReadOnly()));
            MemorySegment confined = arena.allocate(64);
            assertInstanceOf(WrongThreadException.class, failureOf(() -> buf.copyFromHost(confined)));
            assertFalse(driver.wasCalled("copyToDevice") || driver.wasCalled("copyToHost"), "no refused copy reached the runtime");

            buf.copyFromHost(readOnly); // a read-only source is fine
            buf.copyToHost(arena.allocate(64));
            assertTrue(driver.wasCalled("copyToDevice") && driver.wasCalled("copyToHost"));
        }
    }

    @Test void readsAndFillsCheckTheirArguments() {
        FakeDriver driver = new FakeDriver();
        Device dev = driver.runtime().device(0);
        try (Arena arena = Arena.ofConfined(); Stream s = dev.createStream()) {
            DeviceBuffer buf = dev.allocate(64, arena);
            IllegalArgumentException negative = assertThrows(IllegalArgumentException.class, () -> buf.readLongs(-1));
            assertTrue(negative.getMessage().contains(">= 0"), negative.getMessage());
            assertThrows(IllegalArgumentException.class, () -> buf.readInts(-3));
            IndexOutOfBoundsException tooMany = assertThrows(IndexOutOfBoundsException.class, () -> buf.readLongs(9));
            assertTrue(tooMany.getMessage().contains("72 bytes") && tooMany.getMessage().contains("64 bytes"), tooMany.getMessage());
            assertThrows(IndexOutOfBoundsException.class, () -> buf.readInts(Integer.MAX_VALUE));
            assertEquals(8, buf.readLongs(8).length);
            assertEquals(16, buf.readInts(16).length);
            assertEquals(0, buf.readInts(0).length);

            IllegalArgumentException misaligned = assertThrows(IllegalArgumentException.class, () -> buf.slice(2, 8).fill32(7, s));
            assertTrue(misaligned.getMessage().contains("4-byte aligned"), misaligned.getMessage());
            assertFalse(driver.wasCalled("memset32"));
            buf.slice(4, 8).fill32(7, s);
            assertTrue(driver.wasCalled("memset32"));
        }
    }

    @Test void eventsMustBeRecordedBeforeTiming() {
        Device dev = new FakeDriver().runtime().device(0);
        try (Stream s = dev.createStream(); Event start = dev.createEvent(); Event end = dev.createEvent()) {
            IllegalStateException neither = assertThrows(IllegalStateException.class, () -> end.elapsedMillisSince(start));
            assertTrue(neither.getMessage().contains("start event") && neither.getMessage().contains("end event"), neither.getMessage());
            start.record(s);
            IllegalStateException noEnd = assertThrows(IllegalStateException.class, () -> end.elapsedMillisSince(start));
            assertTrue(noEnd.getMessage().contains("end event") && !noEnd.getMessage().contains("start event"), noEnd.getMessage());
            s.record(end);
            assertTrue(end.isRecorded());
            assertEquals(1f, end.elapsedMillisSince(start));
        }
    }

    @Test void kernelsCheckTheirShapeAndNameTheirFailures() {
        FakeDriver driver = new FakeDriver() {
            @Override public long moduleFunction(int dev, long module, String name) {
                if (name.equals("missing")) throw failure("cuModuleGetFunction(" + name + ")", "CUDA_ERROR_NOT_FOUND");
                return super.moduleFunction(dev, module, name);
            }

            @Override public void launch(long function, int gx, int gy, int gz, int bx, int by, int bz, int sharedBytes, long stream,
                                         MemorySegment params, boolean cooperative, boolean programmaticDependent) {
                if (cooperative) throw failure("cuLaunchCooperativeKernel", "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE");
                super.launch(function, gx, gy, gz, bx, by, bz, sharedBytes, stream, params, cooperative, programmaticDependent);
            }
        };
        Device dev = driver.runtime().device(0);
        Kernel k;
        try (Arena arena = Arena.ofConfined(); Stream s = dev.createStream(); CodeObject code = dev.loadCodeObject("basic", new byte[16])) {
            GpuException missing = assertThrows(GpuException.class, () -> code.kernel("missing"));
            String m = missing.getMessage();
            assertTrue(m.contains("'missing'") && m.contains("'basic'") && m.contains("sm_90") && m.contains("manifest"), m);
            assertEquals("CUDA_ERROR_NOT_FOUND", missing.errorName());

            k = code.kernel("gin_fill_u32");
            KernelArgs args = KernelArgs.of(arena, KernelArgs.Type.POINTER).setPointer(0, 0);
            k.launch(s, LaunchConfig.of(1000, 256), args);
            assertTrue(driver.wasCalled("launch"));

            IllegalArgumentException grid = assertThrows(IllegalArgumentException.class,
                    () -> k.launch(s, new LaunchConfig(1, 65536, 1, 32, 1, 1, 0, false, false), args));
            assertTrue(grid.getMessage().contains("grid 1x65536x1") && grid.getMessage().contains("2147483647x65535x65535"), grid.getMessage());
            assertThrows(IllegalArgumentException.class, () -> k.launch(s, new LaunchConfig(1, 1, 70000, 32, 1, 1, 0, false, false), args));
            IllegalArgumentException block = assertThrows(IllegalArgumentException.class,
                    () -> k.launch(s, new LaunchConfig(1, 1, 1, 1, 1, 128, 0, false, false), args));
            assertTrue(block.getMessage().contains("block 1x1x128") && block.getMessage().contains("1024x1024x64"), block.getMessage());
            IllegalArgumentException threads = assertThrows(IllegalArgumentException.class,
                    () -> k.launch(s, new LaunchConfig(1, 1, 1, 64, 32, 1, 0, false, false), args));
            assertTrue(threads.getMessage().contains("threads per block"), threads.getMessage());

            GpuException failed = assertThrows(GpuException.class, () -> k.launch(s, LaunchConfig.of(100_000, 256).asCooperative(), args));
            String f = failed.getMessage();
            assertTrue(f.contains("gin_fill_u32") && f.contains("grid 100000x1x1, block 256x1x1") && f.contains("cooperative"), f);
            assertEquals("CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE", failed.errorName());

            assertThrows(IllegalArgumentException.class, () -> k.setMaxDynamicSharedBytes(-1));
            assertThrows(IllegalArgumentException.class, () -> k.occupancy(0, 0));
            k.setMaxDynamicSharedBytes(100 << 10);
            k.launch(s, LaunchConfig.of(1, 32).withSharedBytes(100 << 10), args);
        }
        IllegalStateException closed = assertThrows(IllegalStateException.class, () -> k.setMaxDynamicSharedBytes(1024));
        assertTrue(closed.getMessage().contains("'basic'") && closed.getMessage().contains("closed"), closed.getMessage());
        assertThrows(IllegalStateException.class, () -> k.occupancy(256, 0));
    }

    @Test void constructionFailedUnregistersWithoutRelease() {
        class Failing extends NativeResource {
            boolean released;
            Failing(boolean fail) {
                if (fail) {
                    constructionFailed();
                    throw new IllegalStateException("construction failed");
                }
            }
            @Override protected void release() { released = true; }
            @Override public String describe() { return "failing test resource"; }
        }
        assertThrows(IllegalStateException.class, () -> new Failing(true));
        assertEquals(liveBefore, NativeResource.liveCount());
        Failing ok = new Failing(false);
        assertEquals(liveBefore + 1, NativeResource.liveCount());
        ok.close();
        assertTrue(ok.released);
    }
}
