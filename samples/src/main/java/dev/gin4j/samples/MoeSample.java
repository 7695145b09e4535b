package dev.gin4j.samples;

import dev.gin4j.comm.Backend;
import dev.gin4j.comm.Bf16;
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
 * An MoE layer's exchange: 256 tokens per GPU, hidden 1024, 16 experts (rounded up to a multiple of
 * the GPU count), top-2. Dispatch sends each token to the GPUs of its experts; "experts" here return their input unchanged, so combine gives
 * back y = x * (w0 + w1) = 0.75 x per token, which the sample checks for every element on every GPU
 * (fresh random x each run: 0.25 x + 0.5 x is exact in the combine's fp32, then one rounding to bf16).
 */
public final class MoeSample {
    public static void main(String[] args) {
        List<Device> devices = GpuRuntime.get().devices();
        int n = devices.size(), tokens = 256, hidden = 1024, experts = (16 + n - 1) / n * n, topK = 2;  // experts split evenly over the GPUs
        long seed = System.nanoTime();
        Random random = new Random(seed);
        try (CommGroup group = CommGroup.initAll(devices); Arena arena = Arena.ofShared();
             MoeAllToAll moe = MoeAllToAll.create(group, MoeConfig.bf16(hidden, experts, topK, tokens, Backend.GIN));
             SampleData.PerGpu<Stream> streams = new SampleData.PerGpu<>()) {
            List<DeviceBuffer> x = new ArrayList<>(), idx = new ArrayList<>(), w = new ArrayList<>();
            short[][] rows = new short[n][tokens * hidden];
            for (int r = 0; r < n; r++) {
                Device d = devices.get(r);
                for (int i = 0; i < rows[r].length; i++) rows[r][i] = (short) (0x3f00 | random.nextInt(0x100)); // bf16 in [0.5, 2)
                int[] ids = new int[tokens * topK];
                float[] ws = new float[tokens * topK];
                for (int t = 0; t < tokens; t++) {
                    ids[t * topK] = random.nextInt(experts);
                    ids[t * topK + 1] = (ids[t * topK] + 1 + random.nextInt(experts - 1)) % experts;
                    ws[t * topK] = 0.25f;
                    ws[t * topK + 1] = 0.5f;
                }
                x.add(upload(d, arena, MemorySegment.ofArray(rows[r])));
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
            for (int r = 0; r < n; r++) {
                short[] got = new short[tokens * hidden];
                y.get(r).slice(0, 2L * tokens * hidden).copyToHost(MemorySegment.ofArray(got));
                for (int i = 0; i < got.length; i++) {
                    short want = Bf16.fromFloat(0.75f * Bf16.toFloat(rows[r][i]));
                    if (got[i] != want)
                        throw new IllegalStateException("rank " + r + " y[" + i / hidden + "][" + i % hidden + "] = bf16 0x" + Integer.toHexString(got[i] & 0xffff)
                                + ", expected 0x" + Integer.toHexString(want & 0xffff) + " (seed " + seed + ")");
                }
            }
            System.out.println("y = 0.75 x for all " + tokens + " x " + hidden + " elements on each of " + n + " GPU(s)");
        }
    }

    private static DeviceBuffer upload(Device d, Arena a, MemorySegment host) {
        DeviceBuffer b = d.allocate(host.byteSize(), a);
        b.copyFromHost(host);
        return b;
    }
}
