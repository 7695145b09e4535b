package dev.gin4j.internal.gpu;

/** Fails early, with the exact JVM flag to add, when gin4j was not granted native access. */
public final class NativeAccess {
    /** The JVM option that grants native access where gin4j runs on the module path. */
    public static final String FLAG_MODULE = "--enable-native-access=dev.gin4j,dev.gin4j.bindings";
    /** The JVM option that grants native access where gin4j runs on the class path. */
    public static final String FLAG_CLASSPATH = "--enable-native-access=ALL-UNNAMED";

    private NativeAccess() {}

    /**
     * Checks that the JVM grants gin4j native access.
     * @throws IllegalCallerException naming the flag to add when native access is not enabled
     */
    public static void require() {
        Module m = NativeAccess.class.getModule();
        if (!m.isNativeAccessEnabled()) {
            String flag = m.isNamed() ? FLAG_MODULE : FLAG_CLASSPATH;
            throw new IllegalCallerException("gin4j calls the GPU runtime through the FFM API and needs native access: "
                    + "start the JVM with " + flag + " (module " + (m.isNamed() ? m.getName() : "unnamed") + " has none)");
        }
    }
}
