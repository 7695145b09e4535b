package dev.gin4j.moe;

import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.Test;

import dev.gin4j.bindings.moenet.MoeNetCombineArgs;
import dev.gin4j.bindings.moenet.MoeNetDims;
import dev.gin4j.bindings.moenet.MoeNetDispatchArgs;
import dev.gin4j.bindings.moenet.MoeNetForward;
import dev.gin4j.bindings.moenet.MoeNetResetArgs;
import dev.gin4j.bindings.moenet.MoeNetSections;
import dev.gin4j.bindings.moenet.MoeNetTopology;

import java.lang.foreign.GroupLayout;
import java.lang.foreign.MemoryLayout;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * The struct layouts MoeNetwork fills (generated from gin-kernels/abi/moe_net.h into
 * dev.gin4j.bindings.moenet) against the header as gcc lays it out: every size and every field
 * offset, nested structs included; and the ABI version the Java side was generated from.
 */
class MoeNetAbiTest {
    private static final List<GroupLayout> STRUCTS = List.of(MoeNetDims.layout(), MoeNetSections.layout(), MoeNetTopology.layout(),
            MoeNetForward.layout(), MoeNetDispatchArgs.layout(), MoeNetCombineArgs.layout(), MoeNetResetArgs.layout());

    /** "Struct.field.sub" -> byte offset (and "Struct" -> size), as Java's layouts say. */
    private static void javaSide(GroupLayout l, String prefix, long base, Map<String, Long> out) {
        for (MemoryLayout m : l.memberLayouts()) {
            if (m.name().isEmpty()) continue;  // padding
            String name = prefix + "." + m.name().get();
            long off = base + l.byteOffset(MemoryLayout.PathElement.groupElement(m.name().get()));
            out.put(name, off);
            if (m instanceof GroupLayout g) javaSide(g, name, off, out);
        }
    }

    @Test void layoutsMatchTheHeader() throws Exception {
        Path header = Path.of("..", "gin-kernels", "abi", "moe_net.h").toAbsolutePath().normalize();
        assertTrue(Files.isRegularFile(header), "no " + header);
        Map<String, Long> java = new LinkedHashMap<>();
        for (GroupLayout s : STRUCTS) {
            String n = s.name().orElseThrow();
            java.put(n, s.byteSize());
            javaSide(s, n, 0, java);
        }
        StringBuilder c = new StringBuilder("#include <stdio.h>\n#include <stddef.h>\n#include \"" + header + "\"\nint main(void) {\n");
        for (String key : List.copyOf(java.keySet())) {
            String[] p = key.split("\\.", 2);
            c.append(p.length == 1 ? "  printf(\"" + key + " %zu\\n\", sizeof(" + key + "));\n"
                    : "  printf(\"" + key + " %zu\\n\", offsetof(" + p[0] + ", " + p[1] + "));\n");
        }
        c.append("  printf(\"MOE_NET_ABI_VERSION %d\\n\", MOE_NET_ABI_VERSION);\n");
        java.put("MOE_NET_ABI_VERSION", (long) MoeNetwork.ABI_VERSION);
        c.append("  return 0;\n}\n");
        Path dir = Files.createTempDirectory("moe-net-abi");
        Files.writeString(dir.resolve("abi.c"), c);
        Process gcc;
        try {
            gcc = new ProcessBuilder("gcc", "-std=c11", "-o", dir.resolve("abi").toString(), dir.resolve("abi.c").toString()).redirectErrorStream(true).start();
        } catch (java.io.IOException e) {
            Assumptions.abort("SKIP: no gcc to lay out gin-kernels/abi/moe_net.h: " + e.getMessage());
            return;
        }
        String gccOut = new String(gcc.getInputStream().readAllBytes());
        assertEquals(0, gcc.waitFor(), gccOut);
        Process run = new ProcessBuilder(dir.resolve("abi").toString()).redirectErrorStream(true).start();
        List<String> lines = new ArrayList<>(new String(run.getInputStream().readAllBytes()).lines().toList());
        assertEquals(0, run.waitFor());
        assertEquals(java.size(), lines.size(), String.join("\n", lines));
        for (String line : lines) {
            String[] kv = line.split(" ");
            assertEquals(Long.parseLong(kv[1]), java.get(kv[0]), kv[0] + ": gcc says " + kv[1] + ", MoeNetwork's layout " + java.get(kv[0]));
        }
    }
}
