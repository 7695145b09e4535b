package dev.gin4j.internal.comm;

import dev.gin4j.comm.CommException;
import dev.gin4j.comm.Nccl;
import dev.gin4j.internal.gpu.KernelLibrary;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.HexFormat;
import java.util.Properties;

/**
 * The NCCL device-API layout the shipped device-API kernels were compiled against, as the
 * kernel build's probe recorded it in the kernel manifest ({@code nccl.*} keys). NCCL's device
 * structs change between releases (2.28.3 has no size/magic/version header and no GIN fields in
 * {@code ncclDevCommRequirements}; 2.29 added them), so gin4j fills them from this record rather
 * than from the generated 2.29 bindings, and refuses to run against a different NCCL. Only GIN across
 * nodes (and {@link PeerTable#fromDeviceApi}) uses these kernels: the LSA path inside a node needs no
 * device-API struct ({@link SymmetricWindow#allocate}).
 */
public record NcclDeviceAbi(int builtFor, String include, long devCommSize, long devCommAlign,
                            long requirementsSize, byte[] requirementsInit, Properties raw, boolean gin) {

    /** The ABI recorded with the kernels, checked against the loaded library's version. */
    public static NcclDeviceAbi forLoadedLibrary() {
        NcclDeviceAbi abi = fromManifest(KernelLibrary.get().manifest(), KernelLibrary.get().source());
        abi.checkMatches(Nccl.version());
        return abi;
    }

    public static NcclDeviceAbi fromManifest(Properties m, String source) {
        String v = m.getProperty("nccl.version");
        if (v == null) {
            throw new CommException("the kernels in " + source + " were built without NCCL device headers, so the NCCL device API cannot be used; "
                    + "rebuild them with gin-kernels/build --nccl-include <folder holding nccl.h and nccl_device.h of the NCCL you load>");
        }
        String init = m.getProperty("nccl.devCommRequirements.init", "");
        return new NcclDeviceAbi(Integer.parseInt(v.trim()), m.getProperty("nccl.include", "?"),
                Long.parseLong(m.getProperty("nccl.devComm.size", "0").trim()), Long.parseLong(m.getProperty("nccl.devComm.align", "8").trim()),
                Long.parseLong(m.getProperty("nccl.devCommRequirements.size", "0").trim()),
                init.isBlank() ? new byte[0] : HexFormat.of().parseHex(init.trim()), m, Boolean.parseBoolean(m.getProperty("nccl.gin", "false").trim()));
    }

    /** @throws CommException naming both versions and how to rebuild, when they differ */
    public void checkMatches(int loaded) {
        if (loaded != builtFor) {
            throw new CommException("NCCL device-API version mismatch: the device-API kernels (GIN across nodes; the LSA path inside a node needs none) were built against NCCL " + Nccl.versionString(builtFor)
                    + " headers (" + include + ") but the loaded library is NCCL " + Nccl.versionString(loaded) + " (" + Nccl.describe() + "). "
                    + "The device API has no ABI stability across releases: rebuild the kernels against the loaded library's headers with "
                    + "`gin-kernels/build --nccl-include <its include folder>` and set GIN4J_KERNELS_DIR to the build's resources folder, or use Backend.HOST.");
        }
    }

    /** Whether {@code ncclDevCommRequirements} of that version has a field of this name. */
    public boolean hasRequirement(String field) { return raw.containsKey("nccl.devCommRequirements." + field + ".offset"); }

    /** A requirements struct as that version's initializer sets it, with the given int fields set. */
    public MemorySegment requirements(Arena arena, java.util.Map<String, Integer> fields) {
        if (requirementsSize <= 0) throw new CommException("kernel manifest lacks nccl.devCommRequirements.size");
        MemorySegment s = arena.allocate(requirementsSize, 16);
        if (requirementsInit.length > 0) MemorySegment.copy(requirementsInit, 0, s, ValueLayout.JAVA_BYTE, 0, Math.min(requirementsInit.length, (int) requirementsSize));
        for (var e : fields.entrySet()) {
            String key = "nccl.devCommRequirements." + e.getKey();
            String off = raw.getProperty(key + ".offset"), size = raw.getProperty(key + ".size", "4");
            if (off == null) throw new CommException("NCCL " + Nccl.versionString(builtFor) + " has no ncclDevCommRequirements." + e.getKey());
            long o = Long.parseLong(off.trim());
            switch (Integer.parseInt(size.trim())) {
                case 1 -> s.set(ValueLayout.JAVA_BYTE, o, (byte) (int) e.getValue());
                case 4 -> s.set(ValueLayout.JAVA_INT_UNALIGNED, o, e.getValue());
                case 8 -> s.set(ValueLayout.JAVA_LONG_UNALIGNED, o, e.getValue());
                default -> throw new CommException("unexpected size " + size + " of ncclDevCommRequirements." + e.getKey());
            }
        }
        return s;
    }
}
