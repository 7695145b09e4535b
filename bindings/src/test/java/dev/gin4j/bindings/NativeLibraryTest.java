package dev.gin4j.bindings;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.gin4j.bindings.cuda.cuda_h;
import java.util.List;
import org.junit.jupiter.api.Test;

/** Library lookup and its error messages, independent of GPUs. */
class NativeLibraryTest {

    @Test
    void loadsFromExplicitCandidatesAndDescribesTheRealFile() {
        NativeLibrary libc = NativeLibrary.ofCandidates("C library", List.of("libgin4j-does-not-exist.so.7", "libc.so.6"), "printf");
        assertTrue(libc.isAvailable(), libc.describe());
        assertTrue(libc.find("printf").isPresent());
        String d = libc.describe();
        assertTrue(d.contains("libc.so.6") && d.contains("version 6"), d);
        assertFalse(d.contains("not loaded"), d);
    }

    @Test
    void missingSymbolNamesSymbolFileAndVersion() {
        NativeLibrary libc = NativeLibrary.ofCandidates("C library", List.of("libc.so.6"), "printf");
        assertTrue(libc.find("gin4jNoSuchSymbol").isEmpty());
        UnsatisfiedLinkError e = libc.missing("gin4jNoSuchSymbol");
        String m = e.getMessage();
        assertTrue(m.contains("gin4jNoSuchSymbol"), m);
        assertTrue(m.contains("libc.so.6"), m);       // the real file and what was asked
        assertTrue(m.contains("version 6"), m);
    }

    @Test
    void missingLibraryFromSystemPropertyListsWhatWasTried() {
        String property = "gin4j.test.cuda.library";
        String file = "/nonexistent/gin4j/libcuda.so.1";
        System.setProperty(property, file);
        try {
            NativeLibrary cuda = NativeLibrary.configured("CUDA driver", "GIN4J_TEST_CUDA_LIBRARY", property,
                    List.of("libcuda.so.1"), "cuInit");
            assertFalse(cuda.isAvailable());
            assertTrue(cuda.find("cuInit").isEmpty());
            String m = cuda.missing("cuInit").getMessage();
            assertTrue(m.contains("cuInit"), m);
            assertTrue(m.contains(file) && m.contains("no such file"), m);
            assertTrue(m.contains("system property " + property), m);
            // an explicit choice is not silently replaced by the soname
            assertFalse(m.contains("libcuda.so.1:"), m);
            assertTrue(cuda.describe().contains("not loaded"), cuda.describe());
        } finally {
            System.clearProperty(property);
        }
    }

    @Test
    void unknownSonamesAreAllListed() {
        NativeLibrary lib = NativeLibrary.ofCandidates("test", List.of("libgin4j-a.so.1", "libgin4j-b.so.2"), null);
        String m = lib.missing("f").getMessage();
        assertTrue(m.contains("libgin4j-a.so.1") && m.contains("libgin4j-b.so.2"), m);
    }

    @Test
    void versionComesFromTheFileName() {
        assertEquals("580.65.06", NativeLibrary.versionOf("/usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06", "libcuda.so.1"));
        assertEquals("2", NativeLibrary.versionOf(null, "libnccl.so.2"));
        assertEquals("unknown", NativeLibrary.versionOf("/opt/x/libfoo.so", "libfoo.so"));
    }

    @Test
    void headerClassLoadsWithoutTheLibraryAndCallsFailWithUnsatisfiedLinkError() {
        // constants never need the library
        assertEquals(0, cuda_h.CUDA_SUCCESS());
        assertEquals(100, cuda_h.CUDA_ERROR_NO_DEVICE());
        TestSupport.assumeOrSkip(!NativeLibrary.CUDA.isAvailable(),
                "libcuda is installed here: the missing-library path is covered by the tests above");
        // twice: the holder class must not be left broken (no ExceptionInInitializerError / NoClassDefFoundError)
        for (int i = 0; i < 2; i++) {
            UnsatisfiedLinkError e = assertThrows(UnsatisfiedLinkError.class, () -> cuda_h.cuInit(0));
            assertTrue(e.getMessage().contains("cuInit") && e.getMessage().contains("libcuda.so.1"), e.getMessage());
        }
        assertThrows(UnsatisfiedLinkError.class, cuda_h::cuDriverGetVersion$handle);
        assertThrows(UnsatisfiedLinkError.class, cuda_h::cuDriverGetVersion$address);
        // descriptors need no library
        assertEquals(1, cuda_h.cuDriverGetVersion$descriptor().argumentLayouts().size());
    }
}
