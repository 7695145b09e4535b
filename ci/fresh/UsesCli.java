package fresh.moe;

/** Must not compile on the module path: dev.gin4j.cli is not exported by the module dev.gin4j. */
final class UsesCli {
    static void run() { dev.gin4j.cli.Main.main(new String[0]); }
}
