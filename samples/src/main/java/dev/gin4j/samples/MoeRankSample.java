package dev.gin4j.samples;

import dev.gin4j.comm.Backend;
import dev.gin4j.comm.Bf16;
import dev.gin4j.comm.CommGroup;
import dev.gin4j.gpu.Device;
import dev.gin4j.gpu.DeviceBuffer;
import dev.gin4j.gpu.Stream;
import dev.gin4j.moe.MoeAllToAll;
import dev.gin4j.moe.MoeConfig;
import dev.gin4j.moe.MoeDispatch;
import dev.gin4j.samples.SampleData.Inputs;

import java.lang.foreign.Arena;
import java.util.Random;

/**
 * One process per GPU, started the way torchrun starts them: RANK, WORLD_SIZE, LOCAL_RANK,
 * MASTER_ADDR and MASTER_PORT in each process's environment ({@code bin/launch-java} in the GPU
 * bundle sets them on one host). Each rank dispatches 128 random tokens (hidden 512, 4 experts per
 * rank, top-2), runs its experts on the rows it received (expert e multiplies by 0.5, 1 or 2, on the
 * host here; yours run on the GPU), combines, and checks its own y element by element against
 * {@code sum_k w_k * scale(e_k) * x}: a row routed to the wrong rank or expert shows.
 *
 * <p>Argument: {@code gin} (the default) or {@code host}. GIN needs every rank on its own GPU of one
 * node; ranks that share a GPU, each posing as its own host, run {@code host}.
 */
public final class MoeRankSample {
    public static void main(String[] args) {
        Backend backend = args.length == 0 ? Backend.GIN : switch (args[0]) {
            case "gin" -> Backend.GIN;
            case "host" -> Backend.HOST;
            default -> throw new IllegalArgumentException("backend '" + args[0] + "': expected gin or host");
        };
        int tokens = 128, hidden = 512, topK = 2;
        long seed = System.nanoTime();
        try (CommGroup group = CommGroup.fromEnvironment(); Arena arena = Arena.ofShared()) {
            int rank = group.rank(0).rank(), world = group.worldSize(), experts = 4 * world;
            Device gpu = group.rank(0).device();  // this process's one GPU: LOCAL_RANK
            MoeConfig config = MoeConfig.builder().hidden(hidden).experts(experts).topK(topK).maxTokensPerRank(tokens).backend(backend).build();
            try (MoeAllToAll moe = MoeAllToAll.create(group, config); Stream stream = gpu.createStream()) {
                Inputs in = Inputs.random(new Random(seed), tokens, hidden, experts, topK);
                DeviceBuffer x = SampleData.upload(gpu, arena, in.x()), idx = SampleData.upload(gpu, arena, in.idx()), w = SampleData.upload(gpu, arena, in.w());
                MoeDispatch d = moe.dispatch(x, idx, w, tokens, stream);
                moe.checkErrors(stream);  // waits for the dispatch: the host reads its rows next

                // the experts, on the host: rows come expert-major, counts[e] rows for local expert e
                int localExperts = moe.localExperts();
                int[] counts = d.counts().readInts(localExperts, stream);
                int rows = java.util.Arrays.stream(counts).sum();
                short[] received = SampleData.readShorts(d.rows(), rows * hidden, stream), out = new short[received.length];
                for (int e = 0, row = 0; e < localExperts; e++) {
                    float scale = SampleData.expertScale(rank * localExperts + e);
                    for (int c = 0; c < counts[e]; c++, row++)
                        for (int j = 0; j < hidden; j++) out[row * hidden + j] = Bf16.fromFloat(scale * Bf16.toFloat(received[row * hidden + j]));
                }
                DeviceBuffer expertOut = gpu.allocate(moe.capacityRows() * 2L * hidden, arena);
                if (rows > 0) expertOut.slice(0, 2L * out.length).copyFromHost(java.lang.foreign.MemorySegment.ofArray(out), stream);

                DeviceBuffer y = moe.combine(d, expertOut, stream);
                moe.checkErrors(stream);
                SampleData.checkCombine("rank " + rank, in, SampleData.readShorts(y, tokens * hidden, stream),
                        (e, t, j) -> SampleData.expertScale(e) * in.x(t, j), seed);
                System.out.println("rank " + rank + " of " + world + " (" + backend + ", GPU " + gpu.ordinal() + "): received " + rows
                        + " rows, y matches the CPU reference for all " + tokens + " x " + hidden + " elements");
            }
        }
    }
}
