package dev.gin4j.cli;

import java.io.PrintStream;
import java.util.Arrays;

/** The {@code gin4j} command. */
public final class Main {
    private Main() {}

    public static void main(String[] args) {
        System.exit(run(args, System.out, System.err));
    }

    static int run(String[] args, PrintStream out, PrintStream err) {
        String cmd = args.length == 0 ? "help" : args[0];
        String[] rest = Arrays.copyOfRange(args, Math.min(1, args.length), args.length);
        try {
            return switch (cmd) {
                case "info" -> Info.run(out, infoOptions(rest));
                case "--version", "version" -> { out.println("gin4j " + Info.version()); yield 0; }
                case "bench" -> Bench.run(rest, out, err);
                case "help", "-h", "--help" -> { help(out); yield 0; }
                default -> { err.println("gin4j: unknown command '" + cmd + "'"); help(err); yield 2; }
            };
        } catch (IllegalArgumentException e) {
            err.println("gin4j " + cmd + ": " + e.getMessage());
            return 2;
        } catch (java.io.IOException | RuntimeException e) {
            err.println("gin4j " + cmd + ": " + e.getMessage());
            return 1;
        }
    }

    /** Whether {@code info}'s options ask for JSON; anything else is refused by name. */
    private static boolean infoOptions(String[] rest) {
        boolean json = false;
        for (String a : rest) {
            if (a.equals("--json")) json = true;
            else throw new IllegalArgumentException("unknown option '" + a + "', expected --json (or nothing)");
        }
        return json;
    }

    static void help(PrintStream out) {
        out.println("""
                usage: gin4j <command> [options]
                  info [--json]        GPU runtime, devices, links, collective library, device API/GIN, shipped kernels
                  --version            gin4j's version
                  bench a2a [opts]     all-to-all sweep, GIN and HOST side by side (JSON + PNG)
                  bench moe [opts]     MoE dispatch/combine, GIN and HOST side by side
                  help                 this text
                Run `gin4j bench a2a --help` for the benchmark options.""");
    }
}
