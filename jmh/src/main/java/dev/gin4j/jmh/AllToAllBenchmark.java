package dev.gin4j.jmh;

import dev.gin4j.a2a.AllToAll;
import dev.gin4j.comm.Backend;
import dev.gin4j.comm.CommGroup;
import dev.gin4j.gpu.Device;
import dev.gin4j.gpu.DeviceBuffer;
import dev.gin4j.gpu.GpuRuntime;
import dev.gin4j.gpu.Stream;
import org.openjdk.jmh.annotations.*;

import java.lang.foreign.Arena;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;

/**
 * Whole-call time of one all-to-all as a Java caller sees it (launch on every local GPU + wait for
 * all), GIN and HOST in the same run. {@code size} is the bytes each rank sends. For the
 * device-event sweep with algBw/busBw, use {@code gin4j bench a2a}.
 */
@State(Scope.Benchmark)
@Fork(value = 1, jvmArgsAppend = "--enable-native-access=ALL-UNNAMED")
@Warmup(iterations = 2, time = 1)
@Measurement(iterations = 3, time = 1)
@BenchmarkMode(Mode.AverageTime)
@OutputTimeUnit(TimeUnit.MICROSECONDS)
public class AllToAllBenchmark {
    @Param({"4096", "65536", "1048576", "16777216", "268435456"})
    public long size;

    @Param({"GIN", "HOST"})
    public Backend backend;

    private CommGroup group;
    private AllToAll a2a;
    private Arena arena;
    private final List<Stream> streams = new ArrayList<>();
    private final List<DeviceBuffer> inputs = new ArrayList<>();

    @Setup public void setUp() {
        List<Device> devs = GpuRuntime.get().devices();
        group = CommGroup.initAll(devs);
        arena = Arena.ofShared();
        a2a = AllToAll.create(group, Math.max(1, size / devs.size()), backend);
        for (Device d : devs) {
            Stream s = d.createStream();
            streams.add(s);
            DeviceBuffer in = d.allocate(size, arena);
            in.fill((byte) 0x5a, s);
            inputs.add(in);
        }
    }

    @TearDown public void tearDown() {
        streams.forEach(Stream::synchronize);
        a2a.close();
        streams.forEach(Stream::close);
        arena.close();
        group.close();
    }

    @Benchmark public void allToAll() {
        a2a.run(inputs, size / group.worldSize(), streams);
        for (Stream s : streams) s.synchronize();
    }
}
