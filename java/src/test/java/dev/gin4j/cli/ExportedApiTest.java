package dev.gin4j.cli;

import org.junit.jupiter.api.Test;

import java.io.IOException;
import java.lang.module.ModuleDescriptor;
import java.lang.module.ModuleFinder;
import java.lang.reflect.Constructor;
import java.lang.reflect.Executable;
import java.lang.reflect.Field;
import java.lang.reflect.Method;
import java.lang.reflect.Modifier;
import java.lang.reflect.ParameterizedType;
import java.lang.reflect.Type;
import java.lang.reflect.WildcardType;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import java.util.stream.Stream;

import static org.junit.jupiter.api.Assertions.*;

/**
 * The module exports the library's API packages only: the command line and the implementations
 * stay inside. Every public type of an exported package is listed here, so a new one is added
 * consciously; the machinery moved out of them must not come back.
 */
class ExportedApiTest {
    private static final Path CLASSES = Path.of("target/classes");
    private static final Set<String> EXPORTED = Set.of("dev.gin4j.a2a", "dev.gin4j.comm", "dev.gin4j.gpu", "dev.gin4j.moe");

    /** Every public type of the exported packages (nested ones with their enclosing type). */
    private static final Set<String> API_TYPES = Set.of(
            "dev.gin4j.gpu.CodeObject", "dev.gin4j.gpu.Device", "dev.gin4j.gpu.DeviceBuffer", "dev.gin4j.gpu.Event",
            "dev.gin4j.gpu.GpuException", "dev.gin4j.gpu.GpuRuntime", "dev.gin4j.gpu.GpuRuntime$Discovery", "dev.gin4j.gpu.Graph",
            "dev.gin4j.gpu.IpcMemory", "dev.gin4j.gpu.IpcMemory$Exported", "dev.gin4j.gpu.Kernel", "dev.gin4j.gpu.KernelArgs",
            "dev.gin4j.gpu.KernelArgs$Type", "dev.gin4j.gpu.LaunchConfig", "dev.gin4j.gpu.NativeResource", "dev.gin4j.gpu.PinnedBuffer",
            "dev.gin4j.gpu.Stream",
            "dev.gin4j.comm.Capabilities", "dev.gin4j.comm.CommException", "dev.gin4j.comm.CommGroup", "dev.gin4j.comm.CommGroup$Options",
            "dev.gin4j.comm.Communicator", "dev.gin4j.comm.ErrorCheck", "dev.gin4j.comm.Nccl", "dev.gin4j.comm.Rendezvous",
            "dev.gin4j.comm.Rendezvous$JobToken",
            "dev.gin4j.a2a.AllToAll", "dev.gin4j.a2a.AllToAllV", "dev.gin4j.comm.Backend", "dev.gin4j.comm.Bf16", "dev.gin4j.comm.DType",
            "dev.gin4j.a2a.Plan", "dev.gin4j.a2a.Protocol",
            "dev.gin4j.moe.Fp8Rows", "dev.gin4j.moe.MoeAllToAll", "dev.gin4j.moe.MoeConfig", "dev.gin4j.moe.MoeConfig$Builder",
            "dev.gin4j.moe.MoeDispatch", "dev.gin4j.moe.MoeOutputs", "dev.gin4j.moe.NetworkMode");

    /** Implementation types that live in dev.gin4j.internal.*: none may appear in an exported package again. */
    private static final Set<String> INTERNAL_TYPES = Set.of("KernelErrors", "NcclDeviceAbi", "NcclStatus", "PeerTable", "LsaPeers",
            "WindowLayout", "SymmetricWindow", "DeviceComm", "PendingErrorCheck", "Groups", "KernelLibrary", "NativeAccess", "Checks",
            "ShapedEntries", "MoeReports");

    /** Machinery methods kept off the exported classes (type -> method names): not public there again. */
    private static final Map<String, Set<String>> INTERNAL_METHODS = Map.of(
            "dev.gin4j.comm.CommGroup", Set.of("failTogether", "await", "inGroup", "checkLocalIndex", "requireOneLocalRank", "checkStreams", "hasAlltoAll"),
            "dev.gin4j.comm.Rendezvous", Set.of("exchange"),
            "dev.gin4j.comm.Nccl", Set.of("check", "error", "leavesCommunicatorBroken"),
            "dev.gin4j.gpu.Stream", Set.of("refuseCapture"),
            "dev.gin4j.gpu.DeviceBuffer", Set.of("requireDisjoint", "ownedBy"),
            "dev.gin4j.gpu.Device", Set.of("loadKernels", "driver"),
            "dev.gin4j.gpu.Kernel", Set.of("attribute"),
            "dev.gin4j.moe.MoeAllToAll", Set.of("entrySource", "dispatchKernelName", "combineKernelName"));

    @Test void onlyTheApiPackagesAreExported() {
        assertTrue(Files.isRegularFile(CLASSES.resolve("module-info.class")), "no compiled module-info in " + CLASSES.toAbsolutePath());
        ModuleDescriptor module = ModuleFinder.of(CLASSES).find("dev.gin4j").orElseThrow().descriptor();
        Set<String> exported = new TreeSet<>();
        for (ModuleDescriptor.Exports e : module.exports()) {
            assertFalse(e.isQualified(), "qualified export " + e);
            exported.add(e.source());
        }
        assertEquals(EXPORTED, exported);
        assertTrue(module.packages().contains("dev.gin4j.cli"), "the gin4j command lives in the module: " + module.packages());
        for (String p : List.of("dev.gin4j.internal.comm", "dev.gin4j.internal.gpu", "dev.gin4j.internal.moe"))
            assertTrue(module.packages().contains(p), p + " is in the module, unexported: " + module.packages());
        assertTrue(module.opens().isEmpty(), "no package is opened: " + module.opens());
    }

    @Test void everyPublicTypeOfAnExportedPackageIsListed() throws IOException {
        Set<String> found = new TreeSet<>();
        for (Class<?> c : exportedClasses()) if (isApi(c)) found.add(c.getName());
        assertEquals(new TreeSet<>(API_TYPES), found, "public types of the exported packages: add a new one to API_TYPES consciously, or keep it out of the API");
    }

    @Test void noImplementationTypeIsBackInAnExportedPackage() throws IOException {
        for (Class<?> c : exportedClasses())
            assertFalse(INTERNAL_TYPES.contains(c.getSimpleName()), c.getName() + " belongs in dev.gin4j.internal.*, not in an exported package");
    }

    @Test void noMachineryMethodIsPublicOnAnExportedClass() throws ClassNotFoundException {
        for (var e : INTERNAL_METHODS.entrySet()) {
            Class<?> c = Class.forName(e.getKey(), false, getClass().getClassLoader());
            for (Method m : c.getDeclaredMethods())
                if (e.getValue().contains(m.getName()))
                    assertFalse(Modifier.isPublic(m.getModifiers()) || Modifier.isProtected(m.getModifiers()),
                            c.getSimpleName() + "." + m.getName() + " is machinery: keep it off the exported API (dev.gin4j.internal.*)");
        }
    }

    /** A public member of the API may name only API types, JDK types and the bindings' types it hands on (none today). */
    @Test void theApiNamesNoInternalType() throws IOException {
        List<String> leaks = new ArrayList<>();
        for (Class<?> c : exportedClasses()) {
            if (!isApi(c)) continue;
            List<Type> named = new ArrayList<>();
            if (c.getGenericSuperclass() != null) named.add(c.getGenericSuperclass());
            named.addAll(List.of(c.getGenericInterfaces()));
            for (Method m : c.getDeclaredMethods()) if (visible(m.getModifiers()) && !m.isSynthetic()) addSignature(named, m, m.getGenericReturnType());
            for (Constructor<?> k : c.getDeclaredConstructors()) if (visible(k.getModifiers()) && !k.isSynthetic()) addSignature(named, k, null);
            for (Field f : c.getDeclaredFields()) if (visible(f.getModifiers()) && !f.isSynthetic()) named.add(f.getGenericType());
            for (Type t : named) for (Class<?> u : raw(t)) {
                String p = u.getPackageName();
                if (p.startsWith("dev.gin4j") && !EXPORTED.contains(p)) leaks.add(c.getName() + " names " + u.getName());
            }
        }
        assertEquals(List.of(), leaks, "the exported API names types of unexported packages");
    }

    private static void addSignature(List<Type> named, Executable e, Type returned) {
        if (returned != null) named.add(returned);
        named.addAll(List.of(e.getGenericParameterTypes()));
        named.addAll(List.of(e.getGenericExceptionTypes()));
    }

    private static List<Class<?>> raw(Type t) {
        List<Class<?>> out = new ArrayList<>();
        if (t instanceof Class<?> c) {
            while (c.isArray()) c = c.getComponentType();
            out.add(c);
        } else if (t instanceof ParameterizedType p) {
            out.addAll(raw(p.getRawType()));
            for (Type a : p.getActualTypeArguments()) out.addAll(raw(a));
        } else if (t instanceof WildcardType w) {
            for (Type b : w.getUpperBounds()) out.addAll(raw(b));
            for (Type b : w.getLowerBounds()) out.addAll(raw(b));
        } else if (t instanceof java.lang.reflect.GenericArrayType g) {
            out.addAll(raw(g.getGenericComponentType()));
        }
        return out;
    }

    private static boolean visible(int modifiers) { return Modifier.isPublic(modifiers) || Modifier.isProtected(modifiers); }

    /** Public, and (nested) inside public types only: what a user of the module can name. */
    private static boolean isApi(Class<?> c) {
        for (Class<?> k = c; k != null; k = k.getEnclosingClass()) if (!Modifier.isPublic(k.getModifiers())) return false;
        return !c.isAnonymousClass() && !c.isLocalClass() && !c.isSynthetic();
    }

    private List<Class<?>> exportedClasses() throws IOException {
        List<Class<?>> out = new ArrayList<>();
        for (String p : EXPORTED) {
            Path dir = CLASSES.resolve(p.replace('.', '/'));
            try (Stream<Path> files = Files.list(dir)) {
                for (Path f : files.filter(f -> f.toString().endsWith(".class")).sorted().toList()) {
                    String simple = f.getFileName().toString().replace(".class", "");
                    if (simple.equals("package-info") || simple.equals("module-info")) continue;
                    try {
                        out.add(Class.forName(p + "." + simple, false, getClass().getClassLoader()));
                    } catch (ClassNotFoundException e) {
                        fail("cannot load " + p + "." + simple + " from " + f);
                    }
                }
            }
        }
        return out;
    }
}
