package dev.gin4j.cli;

import org.junit.jupiter.api.Test;

import java.lang.module.ModuleDescriptor;
import java.lang.module.ModuleFinder;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Set;
import java.util.TreeSet;

import static org.junit.jupiter.api.Assertions.*;

/** The module exports the library's API packages only: the command line and the implementations stay inside. */
class ExportedApiTest {

    @Test void onlyTheApiPackagesAreExported() {
        Path classes = Path.of("target/classes");
        assertTrue(Files.isRegularFile(classes.resolve("module-info.class")), "no compiled module-info in " + classes.toAbsolutePath());
        ModuleDescriptor module = ModuleFinder.of(classes).find("dev.gin4j").orElseThrow().descriptor();
        Set<String> exported = new TreeSet<>();
        for (ModuleDescriptor.Exports e : module.exports()) {
            assertFalse(e.isQualified(), "qualified export " + e);
            exported.add(e.source());
        }
        assertEquals(Set.of("dev.gin4j.a2a", "dev.gin4j.comm", "dev.gin4j.gpu", "dev.gin4j.moe"), exported);
        assertTrue(module.packages().contains("dev.gin4j.cli"), "the gin4j command lives in the module: " + module.packages());
    }
}
