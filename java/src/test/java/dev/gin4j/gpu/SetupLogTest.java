package dev.gin4j.gpu;

import dev.gin4j.internal.gpu.KernelLibrary;
import org.junit.jupiter.api.Test;

import java.util.ArrayList;
import java.util.List;
import java.util.logging.Handler;
import java.util.logging.Level;
import java.util.logging.LogRecord;
import java.util.logging.Logger;

import static org.junit.jupiter.api.Assertions.assertTrue;

/** Setup decisions go to System.Logger "dev.gin4j" at DEBUG (java.util.logging's FINE: hidden unless asked for). */
class SetupLogTest {

    @Test void whereTheKernelsComeFromIsLogged() {
        Logger jul = Logger.getLogger("dev.gin4j");
        List<String> seen = new ArrayList<>();
        Handler h = new Handler() {
            @Override public void publish(LogRecord r) { seen.add(r.getLevel() + " " + r.getMessage()); }
            @Override public void flush() {}
            @Override public void close() {}
        };
        Level before = jul.getLevel();
        jul.setLevel(Level.FINE);
        jul.addHandler(h);
        try {
            KernelLibrary.locate(null);  // what KernelLibrary.get() does once per process
        } finally {
            jul.removeHandler(h);
            jul.setLevel(before);
        }
        assertTrue(seen.stream().anyMatch(m -> m.startsWith("FINE kernels: ")), "no FINE 'kernels:' record in " + seen);
    }
}
