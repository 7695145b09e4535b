package fresh.moe;

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
 * A program of a fresh Maven project that depends on gin4j (ci/fresh-project builds it on the
 * module path and on the class path): one MoE dispatch and combine with identity experts, y checked
 * element by element against y = sum_k w_k x. One process driving every GPU, or, where RANK is set
 * (torchrun's way), one process per GPU. Argument: gin or host.
 * Exit status: 0 when y is right; 3 when MoeAllToAll.create refuses (the message is printed); 1 else.
 */
public final class FreshMoe {
    public static void main(String[] args) {
        Backend backend = Backend.valueOf(args.length > 0 ? args[0].toUpperCase(java.util.Locale.ROOT) : "GIN");
        boolean perProcess = System.getenv("RANK") != null;
        int tokens = 64, hidden = 256, topK = 2;
        long seed = System.nanoTime();
        try (CommGroup group = perProcess ? CommGroup.fromEnvironment() : CommGroup.initAll(GpuRuntime.get().devices());
             Arena arena = Arena.ofShared()) {
            int local = group.localCount(), experts = 4 * group.worldSize();
            MoeConfig config = MoeConfig.builder().hidden(hidden).experts(experts).topK(topK).maxTokensPerRank(tokens).backend(backend).build();
            MoeAllToAll created;
            try {
                created = MoeAllToAll.create(group, config);
            } catch (RuntimeException e) {
                System.out.println("fresh: refused at create: " + e);
                System.exit(3);
                return;
            }
            List<Stream> streams = new ArrayList<>();
            try (MoeAllToAll moe = created) {
                Random random = new Random(seed);
                List<DeviceBuffer> x = new ArrayList<>(), idx = new ArrayList<>(), w = new ArrayList<>();
                short[][] xs = new short[local][];
                int[][] ids = new int[local][];
                float[][] ws = new float[local][];
                for (int r = 0; r < local; r++) {
                    Device d = group.rank(r).device();
                    streams.add(d.createStream());
                    xs[r] = new short[tokens * hidden];
                    for (int i = 0; i < xs[r].length; i++) xs[r][i] = Bf16.fromFloat((float) random.nextGaussian());
                    ids[r] = new int[tokens * topK];
                    ws[r] = new float[tokens * topK];
                    for (int t = 0; t < tokens; t++) {
                        int e0 = random.nextInt(experts);
                        ids[r][t * topK] = e0;
                        ids[r][t * topK + 1] = (e0 + 1 + random.nextInt(experts - 1)) % experts;
                        ws[r][t * topK] = (1 + random.nextInt(16)) / 16f;
                        ws[r][t * topK + 1] = (1 + random.nextInt(16)) / 16f;
                    }
                    x.add(upload(d, arena, MemorySegment.ofArray(xs[r])));
                    idx.add(upload(d, arena, MemorySegment.ofArray(ids[r])));
                    w.add(upload(d, arena, MemorySegment.ofArray(ws[r])));
                }
                int[] counts = new int[local];
                java.util.Arrays.fill(counts, tokens);
                List<MoeDispatch> handles = moe.dispatch(x, idx, w, counts, streams);
                List<DeviceBuffer> y = moe.combine(handles, handles.stream().map(MoeDispatch::rows).toList(), streams);  // identity experts
                moe.checkErrors(streams);
                for (int r = 0; r < local; r++) {
                    short[] got = new short[tokens * hidden];
                    y.get(r).slice(0, 2L * got.length).copyToHost(MemorySegment.ofArray(got), streams.get(r));
                    for (int i = 0; i < got.length; i++) {
                        int t = i / hidden;
                        double v = Bf16.toFloat(xs[r][i]), want = (ws[r][t * topK] + ws[r][t * topK + 1]) * v;
                        // the combine rounds to bf16 once, a remote partial once more: 2^-7
                        if (!(Math.abs(Bf16.toFloat(got[i]) - want) <= 0x1p-7 * Math.abs(want)))
                            throw new IllegalStateException("rank " + group.rank(r).rank() + ": y[" + t + "][" + i % hidden + "] = " + Bf16.toFloat(got[i])
                                    + ", expected " + want + " (seed " + seed + ")");
                    }
                    System.out.println("fresh: rank " + group.rank(r).rank() + " of " + group.worldSize() + " (" + backend + ", "
                            + (FreshMoe.class.getModule().isNamed() ? "module path" : "class path") + "): y right for all " + tokens + " x " + hidden + " elements");
                }
            } finally {
                streams.forEach(Stream::close);
            }
        }
    }

    private static DeviceBuffer upload(Device d, Arena a, MemorySegment host) {
        DeviceBuffer b = d.allocate(host.byteSize(), a);
        b.copyFromHost(host);
        return b;
    }
}
