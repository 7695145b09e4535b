package dev.gin4j.samples;

import dev.gin4j.comm.Backend;
import dev.gin4j.comm.CommGroup;
import dev.gin4j.gpu.Device;
import dev.gin4j.gpu.DeviceBuffer;
import dev.gin4j.gpu.GpuRuntime;
import dev.gin4j.gpu.Graph;
import dev.gin4j.gpu.Stream;
import dev.gin4j.moe.MoeAllToAll;
import dev.gin4j.moe.MoeConfig;
import dev.gin4j.moe.MoeDispatch;
import dev.gin4j.samples.SampleData.Inputs;
import dev.gin4j.samples.SampleData.PerGpu;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.List;
import java.util.Random;

/**
 * An MoE layer's exchange captured once into a graph per GPU (dispatch, the expert, combine) and
 * replayed with new inputs: 64 tokens per GPU, hidden 256, 8 experts (or the next multiple of the
 * GPU count), top-2. The graph holds the addresses of x, topkIdx and topkWeights, so each replay's
 * inputs are copied into those buffers first; the expert here is a device copy of the received
 * rows (an identity expert; your own kernels launched on the stream are captured the same way).
 * Before each of the 5 replays y is poisoned; after it the counts and every element of y are
 * checked against a CPU reference, on every GPU.
 */
public final class MoeGraphSample {
    static final int REPLAYS = 5;

    public static void main(String[] args) {
        List<Device> devices = GpuRuntime.get().devices();
        int n = devices.size(), tokens = 64, hidden = 256, experts = (8 + n - 1) / n * n, topK = 2;
        long seed = System.nanoTime();
        Random random = new Random(seed);
        try (CommGroup group = CommGroup.initAll(devices); Arena arena = Arena.ofShared();
             MoeAllToAll moe = MoeAllToAll.create(group, MoeConfig.bf16(hidden, experts, topK, tokens, Backend.GIN));
             PerGpu<Stream> streams = new PerGpu<>(); PerGpu<Graph> graphs = new PerGpu<>()) {
            List<DeviceBuffer> x = new ArrayList<>(), idx = new ArrayList<>(), w = new ArrayList<>(), y = new ArrayList<>();
            List<MoeDispatch> handles = new ArrayList<>();
            // one GPU after the other: CUDA instantiates no graph while another stream of this thread captures
            for (int r = 0; r < n; r++) {
                Device d = devices.get(r);
                Stream s = d.createStream();
                streams.add(s);
                x.add(d.allocate(2L * tokens * hidden, arena));
                idx.add(d.allocate(4L * tokens * topK, arena));
                w.add(d.allocate(4L * tokens * topK, arena));
                DeviceBuffer expertOut = d.allocate(moe.capacityRows() * 2L * hidden, arena);  // before the capture: no allocation inside it
                s.beginCapture();
                MoeDispatch h = moe.dispatch(r, x.get(r), idx.get(r), w.get(r), tokens, s);
                expertOut.copyFrom(h.rows().slice(0, expertOut.byteSize()), s);  // the expert
                y.add(moe.combine(h, expertOut, s));
                graphs.add(s.endCapture());
                handles.add(h);  // each replay rewrites the same counts, rows and y
            }
            for (int replay = 1; replay <= REPLAYS; replay++) {
                List<Inputs> in = new ArrayList<>();
                for (int r = 0; r < n; r++) {
                    Stream s = streams.get(r);
                    in.add(Inputs.random(random, tokens, hidden, experts, topK));
                    x.get(r).copyFromHost(MemorySegment.ofArray(in.get(r).x()), s);
                    idx.get(r).copyFromHost(MemorySegment.ofArray(in.get(r).idx()), s);
                    w.get(r).copyFromHost(MemorySegment.ofArray(in.get(r).w()), s);
                    y.get(r).fill((byte) 0xff, s);  // poison: bf16 0xffff is a NaN
                }
                for (int r = 0; r < n; r++) graphs.get(r).launch(streams.get(r));
                moe.checkErrors(streams);
                int localExperts = moe.localExperts();
                for (int r = 0; r < n; r++) {
                    String where = "replay " + replay + ", rank " + r;
                    SampleData.checkCounts(where, handles.get(r).counts().readInts(localExperts, streams.get(r)),
                            SampleData.counts(SampleData.receivedRows(in, r, localExperts), r, localExperts), seed);
                    Inputs mine = in.get(r);
                    SampleData.checkCombine(where, mine, SampleData.readShorts(y.get(r), tokens * hidden, streams.get(r)), (e, t, j) -> mine.x(t, j), seed);
                }
            }
            System.out.println(REPLAYS + " replays of one captured dispatch, expert and combine per GPU: counts and y match the CPU reference for all "
                    + tokens + " x " + hidden + " elements on each of " + n + " GPU(s) in every replay");
        }
    }
}
