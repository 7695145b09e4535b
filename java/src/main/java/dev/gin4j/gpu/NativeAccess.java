package dev.gin4j.gpu;

/** Fails early, with the exact JVM flag to add, when gin4j was not granted native access. */
public final class NativeAccess {
    public static final String FLAG_MODULE = "--enable-native-access=dev.gin4j,dev.gin4j.bindings";
    public static final String FLAG_CLASSPATH = "--enable-native-access=ALL-UNNAMED";

    private NativeAccess() {}

    /** @throws IllegalCallerException naming the flag to add when native access is not enabled */
    public static void require() {
        Module m = NativeAccess.class.getModule();
        if (!m.isNativeAccessEnabled()) {
            String flag = m.isNamed() ? FLAG_MODULE : FLAG_CLASSPATH;
            throw new IllegalCallerException("gin4j calls the GPU runtime through the FFM API and needs native access: "
                    + "start the JVM with " + flag + " (module " + (m.isNamed() ? m.getName() : "unnamed") + " has none)");
        }
    }
}
