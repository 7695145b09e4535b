package dev.gin4j.bindings;

import static org.junit.jupiter.api.Assumptions.assumeTrue;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/** Shared helpers: where the repo and the header cache are, argfile reading, running commands. */
final class TestSupport {

    private TestSupport() {
    }

    /** JUnit skip that is also visible in the build log. */
    static void assumeOrSkip(boolean condition, String reason) {
        if (!condition) {
            System.err.println("SKIPPED: " + reason);
        }
        assumeTrue(condition, reason);
    }

    /**
     * The bindings/ folder: system property gin4j.bindings.dir, else found from the working
     * directory (Maven runs tests in bindings/). Skips the test when the sources are not there,
     * e.g. when the test-jar runs on a GPU host without the repository.
     */
    static Path bindingsDir() {
        String configured = System.getProperty("gin4j.bindings.dir");
        if (configured != null && Files.isRegularFile(Path.of(configured, "cuda.args"))) {
            return Path.of(configured).toAbsolutePath();
        }
        Path p = Path.of("").toAbsolutePath();
        for (Path q = p; q != null; q = q.getParent()) {
            if (Files.isRegularFile(q.resolve("cuda.args")) && Files.isDirectory(q.resolve("generator"))) {
                return q;
            }
            if (Files.isRegularFile(q.resolve("bindings/cuda.args"))) {
                return q.resolve("bindings");
            }
        }
        assumeOrSkip(false, "bindings/ sources (argfiles) not found above " + p
                + ": this check needs the repository (or -Dgin4j.bindings.dir=<repo>/bindings)");
        throw new AssertionError("unreachable");
    }

    static Path cudaHome() {
        String home = System.getenv("CUDA_HOME");
        return Path.of(home == null || home.isBlank() ? "/usr/local/cuda" : home);
    }

    /** GIN4J_HEADERS, else the default cache folder of bindings/fetch-headers. */
    static Path headerCache() {
        String env = System.getenv("GIN4J_HEADERS");
        return env == null || env.isBlank() ? bindingsDir().getParent().resolve(".cache/headers") : Path.of(env);
    }

    /** Values for the argfile placeholders, as bindings/generate sets them. */
    static Map<String, String> placeholders() {
        return Map.of(
                "GIN4J_HEADERS", headerCache().toString(),
                "CUDA_HOME", cudaHome().toString(),
                "GIN4J_BINDINGS", bindingsDir().toString());
    }

    /** Skips (visibly) when the headers an argfile needs are not on this machine. */
    static void assumeHeaders(ArgFile args) {
        for (String header : args.headers) {
            assumeOrSkip(Files.isRegularFile(Path.of(header)),
                    "header " + header + " not found: run bindings/fetch-headers (sets up "
                            + headerCache() + "; or export GIN4J_HEADERS / CUDA_HOME)");
        }
        for (String dir : args.includeDirs) {
            assumeOrSkip(Files.isDirectory(Path.of(dir)),
                    "include folder " + dir + " not found: run bindings/fetch-headers (or export GIN4J_HEADERS / CUDA_HOME)");
        }
    }

    static boolean onPath(String command) {
        for (String dir : System.getenv().getOrDefault("PATH", "").split(":")) {
            if (!dir.isEmpty() && Files.isExecutable(Path.of(dir, command))) {
                return true;
            }
        }
        return false;
    }

    record Result(int exitCode, String output) {
    }

    static Result run(Path workDir, Map<String, String> env, long timeoutSeconds, List<String> command)
            throws IOException, InterruptedException {
        ProcessBuilder pb = new ProcessBuilder(command).directory(workDir.toFile()).redirectErrorStream(true);
        pb.environment().putAll(env);
        Process p = pb.start();
        byte[] out = p.getInputStream().readAllBytes();
        if (!p.waitFor(timeoutSeconds, TimeUnit.SECONDS)) {
            p.destroyForcibly();
            throw new IllegalStateException("timed out after " + timeoutSeconds + " s: " + command);
        }
        return new Result(p.exitValue(), new String(out));
    }

    /** The parts of a jextract @argfile the tests need, placeholders expanded. */
    static final class ArgFile {
        final String name;
        final List<String> headers = new ArrayList<>();
        final List<String> includeDirs = new ArrayList<>();
        final List<String> defines = new ArrayList<>();
        final Map<String, List<String>> include = new LinkedHashMap<>();
        String targetPackage;
        String headerClass;

        private ArgFile(String name) {
            this.name = name;
            for (String kind : List.of("function", "struct", "union", "typedef", "constant")) {
                include.put(kind, new ArrayList<>());
            }
        }

        static ArgFile read(String library) throws IOException {
            ArgFile a = new ArgFile(library);
            Map<String, String> vars = placeholders();
            List<String> tokens = new ArrayList<>();
            for (String line : Files.readAllLines(bindingsDir().resolve(library + ".args"))) {
                String t = line.strip();
                if (t.isEmpty() || t.startsWith("#")) {
                    continue;
                }
                for (String tok : t.split("\\s+")) {
                    tokens.add(expand(tok, vars));
                }
            }
            for (int i = 0; i < tokens.size(); i++) {
                String tok = tokens.get(i);
                switch (tok) {
                    case "-I" -> a.includeDirs.add(tokens.get(++i));
                    case "-D" -> a.defines.add(tokens.get(++i));
                    case "--target-package", "-t" -> a.targetPackage = tokens.get(++i);
                    case "--header-class-name" -> a.headerClass = tokens.get(++i);
                    case "-l", "--library" -> i++;
                    default -> {
                        if (tok.startsWith("--include-")) {
                            a.include.get(tok.substring("--include-".length())).add(tokens.get(++i));
                        } else if (tok.startsWith("-")) {
                            throw new IllegalStateException("unexpected option " + tok + " in " + library + ".args");
                        } else {
                            a.headers.add(tok);
                        }
                    }
                }
            }
            return a;
        }

        private static String expand(String token, Map<String, String> vars) {
            Matcher m = Pattern.compile("\\$\\{([A-Za-z_][A-Za-z0-9_]*)}").matcher(token);
            StringBuilder sb = new StringBuilder();
            while (m.find()) {
                String v = vars.get(m.group(1));
                if (v == null) {
                    throw new IllegalStateException("unknown placeholder " + m.group());
                }
                m.appendReplacement(sb, Matcher.quoteReplacement(v));
            }
            m.appendTail(sb);
            return sb.toString();
        }
    }
}
