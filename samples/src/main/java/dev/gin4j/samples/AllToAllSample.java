package dev.gin4j.samples;

import dev.gin4j.a2a.AllToAll;
import dev.gin4j.comm.Backend;
import dev.gin4j.comm.DType;
import dev.gin4j.comm.CommGroup;
import dev.gin4j.gpu.Device;
import dev.gin4j.gpu.DeviceBuffer;
import dev.gin4j.gpu.GpuRuntime;
import dev.gin4j.gpu.Stream;

import java.lang.foreign.Arena;
import java.util.ArrayList;
import java.util.List;

/**
 * One process drives every local GPU; each rank sends 1024 random floats to every rank with the
 * GPU-initiated all-to-all; every element every rank received is checked against what its source
 * sent. Run: java --enable-native-access=ALL-UNNAMED -cp ... dev.gin4j.samples.AllToAllSample
 */
public final class AllToAllSample {
    public static void main(String[] args) {
        List<Device> devices = GpuRuntime.get().devices();
        int n = devices.size(), count = 1024;
        long seed = System.nanoTime();
        java.util.Random random = new java.util.Random(seed);
        try (CommGroup group = CommGroup.initAll(devices); Arena arena = Arena.ofShared();
             AllToAll a2a = AllToAll.create(group, (long) count * DType.FP32.bytes(), Backend.GIN);
             SampleData.PerGpu<Stream> streams = new SampleData.PerGpu<>()) {
            List<DeviceBuffer> inputs = new ArrayList<>();
            float[][] sent = new float[n][count * n];  // sent[r][p * count + i]: element i from rank r to rank p
            for (int r = 0; r < n; r++) {
                for (int i = 0; i < sent[r].length; i++) sent[r][i] = random.nextFloat();
                inputs.add(SampleData.upload(devices.get(r), arena, sent[r]));
                streams.add(devices.get(r).createStream());
            }
            a2a.runElements(inputs, count, DType.FP32, streams);
            a2a.checkErrors(streams);
            for (int r = 0; r < n; r++) {
                float[] got = SampleData.readFloats(a2a.result(r), count * n, streams.get(r));  // got[s * count + i]: from rank s
                for (int s = 0; s < n; s++)
                    for (int i = 0; i < count; i++)
                        if (got[s * count + i] != sent[s][r * count + i])
                            throw new IllegalStateException("rank " + r + " got " + got[s * count + i] + " as element " + i + " from rank " + s
                                    + ", which sent " + sent[s][r * count + i] + " (seed " + seed + ")");
            }
            System.out.println("each of " + n + " rank(s) received all " + count + " floats from every rank as sent");
        }
    }
}
