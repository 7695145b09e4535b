package dev.gin4j.kernels;

import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

import java.io.IOException;
import java.io.InputStream;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Properties;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

/**
 * Checks the code objects that gin-kernels/build puts on the class path (no GPU needed): every
 * object the manifest lists is an ELF for the right machine and architecture whose symbol table
 * holds exactly the kernels the manifest names, the runtime layer's test kernels exist for sm_90
 * and gfx942, and the NCCL ABI block is self-consistent.
 */
class CodeObjectFilesTest {
    private static final String ROOT = "dev/gin4j/kernels/";
    private static final String MANIFEST = ROOT + "manifest.properties";
    private static final Set<String> BASIC_KERNELS = Set.of(
            "gin_empty", "gin_fill_u32", "gin_scale_f32", "gin_copy_bytes", "gin_sum_struct", "gin_add_peer_u32");

    static final int EM_CUDA = 190;
    static final int EM_AMDGPU = 224;
    static final int EF_AMDGPU_MACH_AMDGCN_GFX942 = 0x4c;

    private static Properties manifest;

    @BeforeAll
    static void loadManifest() throws IOException {
        try (InputStream in = resource(MANIFEST)) {
            if (in == null) {
                skip("no " + MANIFEST + " on the class path: the kernels were not built. "
                        + "Run gin-kernels/build (ci/test does) before mvn; it writes gin-kernels/out/resources.");
                return;
            }
            manifest = new Properties();
            manifest.load(in);
        }
    }

    private static InputStream resource(String name) {
        return CodeObjectFilesTest.class.getClassLoader().getResourceAsStream(name);
    }

    private static void skip(String reason) {
        System.err.println("SKIPPED CodeObjectFilesTest: " + reason);
        Assumptions.assumeTrue(false, reason);
    }

    /** object.&lt;arch&gt;.&lt;name&gt; entries: "arch.name" -> relative path. */
    private static TreeMap<String, String> objects() {
        TreeMap<String, String> objects = new TreeMap<>();
        for (String key : manifest.stringPropertyNames()) {
            if (key.startsWith("object.") && !key.endsWith(".kernels")) {
                objects.put(key.substring("object.".length()), manifest.getProperty(key));
            }
        }
        return objects;
    }

    private static byte[] readObject(String relativePath) throws IOException {
        try (InputStream in = resource(ROOT + relativePath)) {
            assertNotNull(in, "manifest lists " + relativePath + " but " + ROOT + relativePath + " is not on the class path");
            return in.readAllBytes();
        }
    }

    private static Set<String> manifestKernels(String archAndName) {
        String list = manifest.getProperty("object." + archAndName + ".kernels");
        assertNotNull(list, "manifest has object." + archAndName + " but no object." + archAndName + ".kernels");
        Set<String> names = new TreeSet<>(Arrays.asList(list.split(",")));
        names.remove("");
        return names;
    }

    @Test
    void everyListedObjectIsAnElfForItsArchitectureNamingTheManifestKernels() throws IOException {
        TreeMap<String, String> objects = objects();
        assertFalse(objects.isEmpty(), "the manifest lists no code objects: " + manifest);
        for (var entry : objects.entrySet()) {
            String archAndName = entry.getKey();
            String arch = archAndName.substring(0, archAndName.indexOf('.'));
            assertTrue(entry.getValue().startsWith(arch + "/"),
                    "object." + archAndName + "=" + entry.getValue() + " should lie in the folder " + arch + "/");
            Elf64 elf = Elf64.parse(entry.getValue(), readObject(entry.getValue()));
            Set<String> entrySymbols;
            if (arch.startsWith("sm_")) {
                assertEquals(EM_CUDA, elf.machine, entry.getValue() + ": e_machine");
                assertEquals(Integer.parseInt(arch.substring(3)), elf.cudaSmVersion(),
                        entry.getValue() + ": SM version in e_flags 0x" + Integer.toHexString(elf.flags));
                entrySymbols = elf.cudaKernelEntries();
            } else if (arch.startsWith("gfx")) {
                assertEquals(EM_AMDGPU, elf.machine, entry.getValue() + ": e_machine");
                if (arch.equals("gfx942")) {
                    assertEquals(EF_AMDGPU_MACH_AMDGCN_GFX942, elf.flags & 0xff,
                            entry.getValue() + ": EF_AMDGPU_MACH in e_flags 0x" + Integer.toHexString(elf.flags));
                }
                entrySymbols = elf.amdKernelDescriptors();
            } else {
                fail("unknown architecture '" + arch + "' in manifest key object." + archAndName);
                return;
            }
            assertEquals(manifestKernels(archAndName), entrySymbols,
                    entry.getValue() + ": kernel entry symbols in the ELF vs the manifest");
        }
    }

    @Test
    void basicKernelsAreBuiltForSm90() throws IOException {
        assertBasicKernels("sm_90", "sm_90/basic.cubin");
    }

    @Test
    void basicKernelsAreBuiltForGfx942() throws IOException {
        if (manifest.getProperty("amd.archs") == null) {
            skip("the kernels on the class path were built without the AMD toolchain (gin-kernels/build prints why; "
                    + "on Debian as root it installs clang-19 itself)");
        }
        assertBasicKernels("gfx942", "gfx942/basic.hsaco");
    }

    private static void assertBasicKernels(String arch, String path) throws IOException {
        assertEquals(path, manifest.getProperty("object." + arch + ".basic"), "manifest entry object." + arch + ".basic");
        Set<String> listed = manifestKernels(arch + ".basic");
        assertTrue(listed.containsAll(BASIC_KERNELS), arch + " basic kernels: manifest lists " + listed + ", expected " + BASIC_KERNELS);
        Elf64 elf = Elf64.parse(path, readObject(path));
        Set<String> inElf = arch.startsWith("sm_") ? elf.cudaKernelEntries() : elf.amdKernelDescriptors();
        assertTrue(inElf.containsAll(BASIC_KERNELS), path + " holds " + inElf + ", expected " + BASIC_KERNELS);
    }

    @Test
    void ncclAbiBlockIsConsistent() {
        boolean ncclObjects = objects().keySet().stream().anyMatch(k -> k.contains(".nccl_"));
        if (manifest.getProperty("nccl.version") == null) {
            assertFalse(ncclObjects, "NCCL-dependent code objects are listed but the manifest has no nccl.version");
            skip("the kernels were built without NCCL device headers (gin-kernels/build --nccl-include DIR)");
        }
        int version = intProperty("nccl.version");
        assertTrue(version >= 22803, "nccl.version " + version + ": the device API needs NCCL >= 2.28.3");
        assertTrue(intProperty("nccl.devComm.size") > 0, "nccl.devComm.size");
        int align = intProperty("nccl.devComm.align");
        assertTrue(align > 0 && Integer.bitCount(align) == 1, "nccl.devComm.align " + align + " is not a power of two");
        // DeviceComm points it at its own abort word where GIN runs (NCCL leaves it null): an 8-byte
        // pointer inside the struct; GIN needs 2.29.7, whose headers have it
        if (version >= 22907 || manifest.getProperty("nccl.devComm.abortFlag.offset") != null) {
            assertEquals(8, intProperty("nccl.devComm.abortFlag.size"), "nccl.devComm.abortFlag.size");
            int abortAt = intProperty("nccl.devComm.abortFlag.offset");
            assertTrue(abortAt >= 0 && abortAt % 8 == 0 && abortAt + 8 <= intProperty("nccl.devComm.size"), "nccl.devComm.abortFlag.offset " + abortAt);
        }

        int size = intProperty("nccl.devCommRequirements.size");
        String hex = manifest.getProperty("nccl.devCommRequirements.init");
        assertNotNull(hex, "nccl.devCommRequirements.init");
        assertEquals(2 * size, hex.length(), "nccl.devCommRequirements.init must hold " + size + " bytes as hex");
        assertTrue(hex.matches("[0-9a-f]*"), "nccl.devCommRequirements.init is not lower-case hex");

        // Fields: inside the struct, in offset order, not overlapping.
        String[] fields = manifest.getProperty("nccl.devCommRequirements.fields", "").split(",");
        assertTrue(fields.length >= 3, "nccl.devCommRequirements.fields lists " + Arrays.toString(fields));
        int end = 0;
        for (String field : fields) {
            int offset = intProperty("nccl.devCommRequirements." + field + ".offset");
            int fieldSize = intProperty("nccl.devCommRequirements." + field + ".size");
            assertTrue(offset >= end, field + " at " + offset + " overlaps the previous field ending at " + end);
            end = offset + fieldSize;
            assertTrue(end <= size, field + " ends at " + end + ", beyond the struct size " + size);
        }
        List<String> names = Arrays.asList(fields);
        assertTrue(names.contains("lsaBarrierCount"), "every device-API release has lsaBarrierCount: " + names);
        if (version >= 22900) {
            // 2.29 added the versioned header; the initializer must carry the struct size and the version.
            assertEquals(List.of("size", "magic", "version"), names.subList(0, 3), "2.29+ header fields");
            ByteBuffer init = ByteBuffer.wrap(hexBytes(hex)).order(ByteOrder.LITTLE_ENDIAN);
            assertEquals(size, init.getLong(intProperty("nccl.devCommRequirements.size.offset")), "init.size");
            assertEquals(version, init.getInt(intProperty("nccl.devCommRequirements.version.offset")), "init.version");
        }
        String gin = manifest.getProperty("nccl.gin");
        assertTrue("true".equals(gin) || "false".equals(gin), "nccl.gin=" + gin);
        assertEquals("true".equals(gin), names.contains("ginSignalCount"), "nccl.gin vs the ginSignalCount field");
    }

    private static int intProperty(String key) {
        String value = manifest.getProperty(key);
        assertNotNull(value, "manifest property " + key + " is missing");
        try {
            return Integer.parseInt(value.trim());
        } catch (NumberFormatException e) {
            throw new AssertionError("manifest property " + key + "=" + value + " is not an integer", e);
        }
    }

    private static byte[] hexBytes(String hex) {
        byte[] bytes = new byte[hex.length() / 2];
        for (int i = 0; i < bytes.length; i++) bytes[i] = (byte) Integer.parseInt(hex.substring(2 * i, 2 * i + 2), 16);
        return bytes;
    }

    /** The parts of a little-endian ELF64 file this test needs: header, section headers, symbols. */
    static final class Elf64 {
        static final int SHT_SYMTAB = 2;
        static final int STT_OBJECT = 1;
        static final int STT_FUNC = 2;
        static final int STB_GLOBAL = 1;
        /** st_other flag nvcc sets on kernel entry points (STO_CUDA_ENTRY). */
        static final int STO_CUDA_ENTRY = 0x10;

        record Symbol(String name, int type, int bind, int other) {}

        final String name;
        final int machine;
        final int flags;
        final int abiVersion;
        final List<Symbol> symbols = new ArrayList<>();

        private Elf64(String name, int machine, int flags, int abiVersion) {
            this.name = name;
            this.machine = machine;
            this.flags = flags;
            this.abiVersion = abiVersion;
        }

        static Elf64 parse(String name, byte[] bytes) {
            ByteBuffer b = ByteBuffer.wrap(bytes).order(ByteOrder.LITTLE_ENDIAN);
            require(bytes.length >= 64, name, "is " + bytes.length + " bytes, shorter than an ELF64 header");
            require(bytes[0] == 0x7f && bytes[1] == 'E' && bytes[2] == 'L' && bytes[3] == 'F', name, "has no ELF magic");
            require(bytes[4] == 2, name, "is not ELF64 (EI_CLASS " + bytes[4] + ")");
            require(bytes[5] == 1, name, "is not little-endian (EI_DATA " + bytes[5] + ")");
            Elf64 elf = new Elf64(name, Short.toUnsignedInt(b.getShort(18)), b.getInt(48), bytes[8] & 0xff);
            long shoff = b.getLong(40);
            int shentsize = Short.toUnsignedInt(b.getShort(58));
            int shnum = Short.toUnsignedInt(b.getShort(60));
            require(shentsize == 64, name, "has section header size " + shentsize + ", expected 64");
            require(shoff > 0 && shoff + (long) shnum * shentsize <= bytes.length, name,
                    "has section headers outside the file (e_shoff " + shoff + ", e_shnum " + shnum + ")");
            for (int i = 0; i < shnum; i++) {
                int sh = (int) shoff + i * shentsize;
                if (b.getInt(sh + 4) != SHT_SYMTAB) continue;
                long offset = b.getLong(sh + 24), size = b.getLong(sh + 32), entsize = b.getLong(sh + 56);
                int link = b.getInt(sh + 40);
                require(entsize == 24, name, ".symtab entry size " + entsize + ", expected 24");
                require(offset + size <= bytes.length, name, ".symtab lies outside the file");
                require(link > 0 && link < shnum, name, ".symtab links to section " + link + " of " + shnum);
                int strSh = (int) shoff + link * shentsize;
                long strOffset = b.getLong(strSh + 24), strSize = b.getLong(strSh + 32);
                require(strOffset + strSize <= bytes.length, name, "the symbol string table lies outside the file");
                for (long s = offset; s + 24 <= offset + size; s += 24) {
                    int nameIndex = b.getInt((int) s);
                    int info = bytes[(int) s + 4] & 0xff;
                    int other = bytes[(int) s + 5] & 0xff;
                    require(Integer.toUnsignedLong(nameIndex) < strSize, name, "symbol name index outside the string table");
                    elf.symbols.add(new Symbol(cString(bytes, (int) (strOffset + nameIndex), (int) (strOffset + strSize)),
                            info & 0xf, info >> 4, other));
                }
            }
            require(!elf.symbols.isEmpty(), name, "has no .symtab symbols");
            return elf;
        }

        /** NVIDIA: the SM number; bits 8..15 of e_flags from ELF ABI version 8 (as nvcc 13 writes), bits 0..7 in older cubins. */
        int cudaSmVersion() {
            return abiVersion >= 8 ? (flags >> 8) & 0xff : flags & 0xff;
        }

        /** NVIDIA kernel entry points: global functions marked STO_CUDA_ENTRY. */
        Set<String> cudaKernelEntries() {
            Set<String> names = new TreeSet<>();
            for (Symbol s : symbols) {
                if (s.type == STT_FUNC && s.bind == STB_GLOBAL && (s.other & STO_CUDA_ENTRY) != 0 && !s.name.startsWith("_Z")) {
                    names.add(s.name);
                }
            }
            return names;
        }

        /** AMD kernels: each has a global "&lt;name&gt;.kd" kernel descriptor object. */
        Set<String> amdKernelDescriptors() {
            Set<String> names = new TreeSet<>();
            for (Symbol s : symbols) {
                if (s.type == STT_OBJECT && s.bind == STB_GLOBAL && s.name.endsWith(".kd") && !s.name.startsWith("_Z")) {
                    names.add(s.name.substring(0, s.name.length() - 3));
                }
            }
            return names;
        }

        private static String cString(byte[] bytes, int start, int limit) {
            int end = start;
            while (end < limit && bytes[end] != 0) end++;
            return new String(bytes, start, end - start, StandardCharsets.UTF_8);
        }

        private static void require(boolean condition, String name, String what) {
            if (!condition) throw new AssertionError(name + " " + what);
        }
    }
}
