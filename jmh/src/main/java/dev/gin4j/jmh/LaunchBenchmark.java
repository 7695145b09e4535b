package dev.gin4j.jmh;

import dev.gin4j.internal.gpu.KernelLibrary;
import dev.gin4j.gpu.CodeObject;
import dev.gin4j.gpu.Device;
import dev.gin4j.gpu.GpuRuntime;
import dev.gin4j.gpu.Kernel;
import dev.gin4j.gpu.KernelArgs;
import dev.gin4j.gpu.LaunchConfig;
import dev.gin4j.gpu.Stream;
import org.openjdk.jmh.annotations.*;

import java.lang.foreign.Arena;
import java.util.concurrent.TimeUnit;

/**
 * Cost of launching an empty kernel from Java through cuLaunchKernel/hipModuleLaunchKernel, to
 * set beside the same two figures from C (gin-kernels/bench/launch_bench.cu, run by gpu-bench):
 * async launches back to back (ns per launch, one sync per 1000), and launch + stream sync (us).
 */
@State(Scope.Thread)
@Fork(value = 1, jvmArgsAppend = "--enable-native-access=ALL-UNNAMED")
@Warmup(iterations = 3, time = 1)
@Measurement(iterations = 5, time = 1)
public class LaunchBenchmark {
    private Arena arena;
    private Stream stream;
    private CodeObject code;
    private Kernel empty;
    private KernelArgs noArgs;
    private final LaunchConfig one = LaunchConfig.of(1, 1);

    @Setup public void setUp() {
        Device d = GpuRuntime.get().device(0);
        arena = Arena.ofShared();
        stream = d.createStream();
        code = KernelLibrary.load(d, "basic");
        empty = code.kernel("gin_empty");
        noArgs = KernelArgs.none(arena);
    }

    @TearDown public void tearDown() {
        stream.synchronize();
        code.close();
        stream.close();
        arena.close();
    }

    @Benchmark @OperationsPerInvocation(1000) @BenchmarkMode(Mode.AverageTime) @OutputTimeUnit(TimeUnit.NANOSECONDS)
    public void asyncLaunch() {
        for (int i = 0; i < 1000; i++) empty.launch(stream, one, noArgs);
        stream.synchronize();
    }

    @Benchmark @BenchmarkMode(Mode.SampleTime) @OutputTimeUnit(TimeUnit.MICROSECONDS)
    public void launchAndSynchronize() {
        empty.launch(stream, one, noArgs);
        stream.synchronize();
    }
}
