package dev.gin4j.samples;

import dev.gin4j.a2a.AllToAll;
import dev.gin4j.a2a.Backend;
import dev.gin4j.a2a.DType;
import dev.gin4j.comm.CommGroup;
import dev.gin4j.gpu.Device;
import dev.gin4j.gpu.DeviceBuffer;
import dev.gin4j.gpu.GpuRuntime;
import dev.gin4j.gpu.Stream;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.ArrayList;
import java.util.List;

/**
 * One process drives every local GPU; each rank sends 1024 floats to every rank with the
 * GPU-initiated all-to-all, then prints what rank 0 received from each source.
 * Run: java --enable-native-access=ALL-UNNAMED -cp ... dev.gin4j.samples.AllToAllSample
 */
public final class AllToAllSample {
    public static void main(String[] args) {
        List<Device> devices = GpuRuntime.get().devices();
        int n = devices.size(), count = 1024;
        try (CommGroup group = CommGroup.initAll(devices); Arena arena = Arena.ofShared();
             AllToAll a2a = AllToAll.create(group, (long) count * DType.FP32.bytes(), Backend.GIN)) {
            List<DeviceBuffer> inputs = new ArrayList<>();
            List<Stream> streams = new ArrayList<>();
            for (int r = 0; r < n; r++) {
                // rank r sends the value 100*r + p to rank p
                MemorySegment host = arena.allocate(4L * count * n);
                for (int p = 0; p < n; p++) for (int i = 0; i < count; i++) host.setAtIndex(ValueLayout.JAVA_FLOAT, (long) p * count + i, 100f * r + p);
                DeviceBuffer in = devices.get(r).allocate(host.byteSize(), arena);
                in.copyFromHost(host);
                inputs.add(in);
                streams.add(devices.get(r).createStream());
            }
            a2a.runElements(inputs, count, DType.FP32, streams);
            a2a.checkErrors(streams);
            MemorySegment got = arena.allocate(4L * count * n);
            a2a.result(0).copyToHost(got);
            for (int s = 0; s < n; s++) {
                float v = got.getAtIndex(ValueLayout.JAVA_FLOAT, (long) s * count);
                System.out.println("rank 0 got " + v + " from rank " + s + " (expected " + 100f * s + ")");
                if (v != 100f * s) throw new IllegalStateException("wrong value from rank " + s);
            }
            streams.forEach(Stream::close);
        }
    }
}
