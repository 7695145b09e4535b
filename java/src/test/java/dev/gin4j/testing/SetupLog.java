package dev.gin4j.testing;

import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.logging.Handler;
import java.util.logging.Level;
import java.util.logging.LogRecord;
import java.util.logging.Logger;

/**
 * What the library logs to System.Logger "dev.gin4j" (java.util.logging's "dev.gin4j" here) while
 * a piece of code runs: each record as "LEVEL message", FINE being System.Logger's DEBUG.
 */
public final class SetupLog {
    private SetupLog() {}

    /** Runs {@code body} with "dev.gin4j" at {@code level} and returns the records it logged. */
    public static List<String> during(Level level, Runnable body) {
        Logger jul = Logger.getLogger("dev.gin4j");
        List<String> seen = Collections.synchronizedList(new ArrayList<>());
        Handler h = new Handler() {
            @Override public void publish(LogRecord r) { if (jul.isLoggable(r.getLevel())) seen.add(r.getLevel() + " " + r.getMessage()); }
            @Override public void flush() {}
            @Override public void close() {}
        };
        Level before = jul.getLevel();
        jul.setLevel(level);
        jul.addHandler(h);
        try {
            body.run();
        } finally {
            jul.removeHandler(h);
            jul.setLevel(before);
        }
        return List.copyOf(seen);
    }

    /** {@link #during(Level, Runnable)} at FINE (System.Logger's DEBUG), where setup decisions are logged. */
    public static List<String> debug(Runnable body) { return during(Level.FINE, body); }
}
