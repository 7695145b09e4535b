package dev.gin4j.samples;

import dev.gin4j.a2a.Backend;
import dev.gin4j.comm.CommGroup;
import dev.gin4j.gpu.Device;
import dev.gin4j.gpu.DeviceBuffer;
import dev.gin4j.gpu.GpuRuntime;
import dev.gin4j.gpu.Stream;
import dev.gin4j.moe.MoeAllToAll;
import dev.gin4j.moe.MoeConfig;
import dev.gin4j.moe.MoeDispatch;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.List;
import java.util.Random;

/**
 * An MoE layer's exchange: 256 tokens per GPU, hidden 1024, 16 experts, top-2. Dispatch sends each
 * token to the GPUs of its experts; "experts" here return their input unchanged, so combine gives
 * back x * (w0 + w1) per token.
 */
public final class MoeSample {
    public static void main(String[] args) {
        List<Device> devices = GpuRuntime.get().devices();
        int n = devices.size(), tokens = 256, hidden = 1024, experts = 16, topK = 2;
        Random random = new Random(1);
        try (CommGroup group = CommGroup.initAll(devices); Arena arena = Arena.ofShared();
             MoeAllToAll moe = MoeAllToAll.create(group, MoeConfig.bf16(hidden, experts, topK, tokens, Backend.GIN))) {
            List<DeviceBuffer> x = new ArrayList<>(), idx = new ArrayList<>(), w = new ArrayList<>();
            List<Stream> streams = new ArrayList<>();
            for (Device d : devices) {
                short[] rows = new short[tokens * hidden];
                java.util.Arrays.fill(rows, (short) 0x3f80); // bf16 1.0
                int[] ids = new int[tokens * topK];
                float[] ws = new float[tokens * topK];
                for (int t = 0; t < tokens; t++) {
                    ids[t * topK] = random.nextInt(experts);
                    ids[t * topK + 1] = (ids[t * topK] + 1 + random.nextInt(experts - 1)) % experts;
                    ws[t * topK] = 0.25f;
                    ws[t * topK + 1] = 0.5f;
                }
                x.add(upload(d, arena, MemorySegment.ofArray(rows)));
                idx.add(upload(d, arena, MemorySegment.ofArray(ids)));
                w.add(upload(d, arena, MemorySegment.ofArray(ws)));
                streams.add(d.createStream());
            }
            int[] counts = new int[n];
            java.util.Arrays.fill(counts, tokens);
            List<MoeDispatch> handles = moe.dispatch(x, idx, w, counts, streams);
            List<DeviceBuffer> expertOut = handles.stream().map(MoeDispatch::rows).toList(); // identity experts
            List<DeviceBuffer> y = moe.combine(handles, expertOut, streams);
            moe.checkErrors(streams);
            byte[] first = y.getFirst().slice(0, 2).toByteArray();
            int bits = ((first[1] & 0xff) << 8 | (first[0] & 0xff)) << 16;
            float y00 = Float.intBitsToFloat(bits);
            System.out.println("y[0][0] on rank 0 = " + y00 + " (expected 0.75)");
            if (y00 != 0.75f) throw new IllegalStateException("combine returned " + y00 + ", expected 0.75");
            streams.forEach(Stream::close);
        }
    }

    private static DeviceBuffer upload(Device d, Arena a, MemorySegment host) {
        DeviceBuffer b = d.allocate(host.byteSize(), a);
        b.copyFromHost(host);
        return b;
    }
}
