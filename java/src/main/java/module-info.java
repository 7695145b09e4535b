/**
 * gin4j: GPU-initiated all-to-all and MoE token exchange for Java, over the CUDA driver + NCCL
 * or HIP + RCCL, through the FFM API. Needs native access: start the JVM with
 * {@code --enable-native-access=dev.gin4j,dev.gin4j.bindings}.
 */
module dev.gin4j {
    requires dev.gin4j.bindings;
    requires java.management;  // the benchmarks' thread CPU time
    exports dev.gin4j.gpu;
    exports dev.gin4j.comm;
    exports dev.gin4j.a2a;
    exports dev.gin4j.moe;
    // dev.gin4j.cli (the gin4j command) is not exported: java -m dev.gin4j/dev.gin4j.cli.Main runs it
}
