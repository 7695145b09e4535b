package dev.gin4j.bindings;

import static dev.gin4j.bindings.TestSupport.assumeHeaders;
import static dev.gin4j.bindings.TestSupport.assumeOrSkip;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.gin4j.bindings.TestSupport.ArgFile;
import java.lang.foreign.GroupLayout;
import java.lang.foreign.MemoryLayout;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.PaddingLayout;
import java.lang.reflect.Method;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.io.TempDir;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

/**
 * Compares the generated layouts and constants with what gcc computes from the same headers:
 * a C program prints sizeof/offsetof of every bound struct field and every bound constant.
 */
class LayoutTest {

    @TempDir
    Path work;

    @ParameterizedTest(name = "{0}")
    @ValueSource(strings = {"cuda", "hip", "nccl", "moe", "moe_net", "a2a", "basic"})
    void generatedLayoutsAndConstantsMatchGcc(String library) throws Exception {
        ArgFile args = ArgFile.read(library);
        assumeHeaders(args);
        assumeOrSkip(TestSupport.onPath("gcc"), "gcc not on PATH: the layout test compiles a C program (apt-get install gcc)");

        Map<String, String> expected = new LinkedHashMap<>();   // key -> value the Java side has
        StringBuilder c = new StringBuilder("#include <stdio.h>\n#include <stddef.h>\n");
        for (String header : args.headers) {
            c.append("#include \"").append(header).append("\"\n");
        }
        c.append("int main(void) {\n");

        int structs = 0;
        List<String[]> types = new ArrayList<>();                // {java class, C type}
        for (String s : args.include.get("struct")) {
            types.add(new String[] {s, "struct " + s});
        }
        for (String u : args.include.get("union")) {
            types.add(new String[] {u, "union " + u});
        }
        for (String t : args.include.get("typedef")) {
            if (classOrNull(args.targetPackage + "." + t) != null) {
                types.add(new String[] {t, t});
            }
        }
        for (String[] type : types) {
            Class<?> cls = Class.forName(args.targetPackage + "." + type[0]);
            String cType = type[1];
            GroupLayout layout = (GroupLayout) cls.getMethod("layout").invoke(null);
            long sizeof = (long) cls.getMethod("sizeof").invoke(null);
            assertEquals(layout.byteSize(), sizeof, type[0] + ".sizeof() vs layout()");
            expected.put("size " + type[0], Long.toString(sizeof));
            c.append("  printf(\"size %s %zu\\n\", \"").append(type[0]).append("\", sizeof(").append(cType).append("));\n");
            for (MemoryLayout member : layout.memberLayouts()) {
                if (member instanceof PaddingLayout || member.name().isEmpty()) {
                    continue;
                }
                String field = member.name().get();
                long offset = (long) fieldMethod(cls, field, "$offset").invoke(null);
                expected.put("field " + type[0] + "." + field, offset + " " + member.byteSize());
                c.append("  printf(\"field %s.%s %zu %zu\\n\", \"").append(type[0]).append("\", \"").append(field)
                        .append("\", offsetof(").append(cType).append(", ").append(field).append("), sizeof(((")
                        .append(cType).append("*)0)->").append(field).append("));\n");
            }
            structs++;
        }

        Class<?> header = Class.forName(args.targetPackage + "." + args.headerClass);
        Map<String, Class<?>> constantTypes = new HashMap<>();
        for (String name : args.include.get("constant")) {
            Method m = header.getMethod(name);
            Object value = m.invoke(null);
            constantTypes.put(name, m.getReturnType());
            String javaValue;
            if (value instanceof MemorySegment seg) {
                javaValue = Long.toString(seg.address());
                c.append("  printf(\"const %s %lld\\n\", \"").append(name).append("\", (long long)(").append(name).append("));\n");
            } else if (value instanceof Float || value instanceof Double) {
                javaValue = Double.toString(((Number) value).doubleValue());
                c.append("  printf(\"const %s %.17g\\n\", \"").append(name).append("\", (double)(").append(name).append("));\n");
            } else if (value instanceof Boolean b) {
                javaValue = b ? "1" : "0";
                c.append("  printf(\"const %s %lld\\n\", \"").append(name).append("\", (long long)(").append(name).append("));\n");
            } else {
                javaValue = Long.toString(((Number) value).longValue());
                c.append("  printf(\"const %s %lld\\n\", \"").append(name).append("\", (long long)(").append(name).append("));\n");
            }
            expected.put("const " + name, javaValue);
        }
        c.append("  return 0;\n}\n");

        Path source = work.resolve(library + "_layout.c");
        Files.writeString(source, c);
        List<String> gcc = new ArrayList<>(List.of("gcc", "-std=gnu11", "-w", "-o", work.resolve(library + "_layout").toString()));
        for (String dir : args.includeDirs) {
            gcc.add("-I" + dir);
        }
        for (String define : args.defines) {
            gcc.add("-D" + define);
        }
        gcc.add(source.toString());
        TestSupport.Result compiled = TestSupport.run(work, Map.of(), 120, gcc);
        assertEquals(0, compiled.exitCode(), "gcc failed on " + source + ":\n" + compiled.output());
        TestSupport.Result ran = TestSupport.run(work, Map.of(), 60, List.of(work.resolve(library + "_layout").toString()));
        assertEquals(0, ran.exitCode(), "layout program failed:\n" + ran.output());

        Map<String, String> actual = new LinkedHashMap<>();
        for (String line : ran.output().split("\n")) {
            if (line.isBlank()) {
                continue;
            }
            String[] parts = line.split(" ", 3);
            actual.put(parts[0] + " " + parts[1], parts[2]);
        }
        List<String> mismatches = new ArrayList<>();
        for (Map.Entry<String, String> e : expected.entrySet()) {
            String cValue = actual.get(e.getKey());
            String javaValue = e.getValue();
            boolean same = javaValue.equals(cValue);
            if (!same && cValue != null && e.getKey().startsWith("const ")
                    && constantTypes.get(e.getKey().substring(6)) == int.class) {
                // C may print an unsigned int constant (0xcafebeef) where Java holds the same 32 bits
                same = (int) Long.parseLong(cValue) == (int) Long.parseLong(javaValue);
            }
            if (!same) {
                mismatches.add(e.getKey() + ": generated " + javaValue + ", gcc " + cValue);
            }
        }
        assertTrue(mismatches.isEmpty(), library + ": " + mismatches.size() + " mismatches:\n  " + String.join("\n  ", mismatches));
        assertEquals(expected.size(), actual.size(), "gcc printed a different number of entries");
        assertTrue(structs > 0 && !args.include.get("constant").isEmpty(), "nothing was compared for " + library);
        System.err.println(library + ": " + structs + " structs, " + args.include.get("constant").size()
                + " constants, " + (expected.size() - structs - args.include.get("constant").size()) + " fields match gcc");
    }

    private static Class<?> classOrNull(String name) {
        try {
            return Class.forName(name);
        } catch (ClassNotFoundException e) {
            return null;
        }
    }

    private static Method fieldMethod(Class<?> cls, String field, String suffix) throws NoSuchMethodException {
        try {
            return cls.getMethod(field + suffix);
        } catch (NoSuchMethodException e) {
            return cls.getMethod(field + "_" + suffix);   // Java keywords get a '_'
        }
    }
}
