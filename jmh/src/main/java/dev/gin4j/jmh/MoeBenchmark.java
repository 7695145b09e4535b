package dev.gin4j.jmh;

import dev.gin4j.comm.Backend;
import dev.gin4j.comm.DType;
import dev.gin4j.comm.CommGroup;
import dev.gin4j.gpu.Device;
import dev.gin4j.gpu.DeviceBuffer;
import dev.gin4j.gpu.GpuRuntime;
import dev.gin4j.gpu.Stream;
import dev.gin4j.moe.MoeAllToAll;
import dev.gin4j.moe.MoeConfig;
import dev.gin4j.moe.MoeDispatch;
import dev.gin4j.moe.Fp8Rows;
import org.openjdk.jmh.annotations.*;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.List;
import java.util.SplittableRandom;
import java.util.concurrent.TimeUnit;

/**
 * Whole-call time of one MoE dispatch + combine, and of all five exchanges of a training step, as
 * a Java caller sees it (launches on every local GPU, then wait for all), GIN and HOST in the same
 * run, uniform random top-k routing, identity experts (expertOut = the received rows; zeros for
 * fp8 dispatch, whose rows are not bf16). For
 * per-call device times, pipelined times and GB/s use {@code gin4j bench moe}. fp8 dispatch:
 * {@code -p dtype=FP8_E4M3} (x quantized once on the GPU with {@link Fp8Rows}); add
 * {@code -p quantize=true} to hand the dispatch bf16 x and have it quantize every call
 * ({@link MoeConfig#fp8FromBf16}).
 */
@State(Scope.Benchmark)
@Fork(value = 1, jvmArgsAppend = "--enable-native-access=ALL-UNNAMED")
@Warmup(iterations = 2, time = 1)
@Measurement(iterations = 3, time = 1)
@BenchmarkMode(Mode.AverageTime)
@OutputTimeUnit(TimeUnit.MICROSECONDS)
public class MoeBenchmark {
    /** hidden:experts:topK of DeepSeek-V3, Qwen3-30B-A3B and Mixtral. */
    @Param({"7168:256:8", "2048:128:8", "4096:8:2"})
    public String shape;

    @Param({"128", "4096"})
    public int tokens;

    @Param({"GIN", "HOST"})
    public Backend backend;

    /** Rows of the dispatch: BF16, or FP8_E4M3 (scaled fp8 rows); the combine is bf16 either way. */
    @Param({"BF16"})
    public DType dtype;

    /** With FP8_E4M3: x stays bf16 and every dispatch quantizes it. */
    @Param({"false"})
    public boolean quantize;

    /** GIN kernels on 2 x channels SMs; 0 = half the SMs (the whole GPU), {@link MoeConfig#withChannels}. */
    @Param({"0"})
    public int channels;

    private CommGroup group;
    private MoeAllToAll moe;
    private Arena arena;
    private int[] tokenCounts;
    private final List<Stream> streams = new ArrayList<>();
    private final List<DeviceBuffer> xs = new ArrayList<>(), ids = new ArrayList<>(), ws = new ArrayList<>(), outs = new ArrayList<>();

    @Setup public void setUp() {
        String[] p = shape.split(":");
        int hidden = Integer.parseInt(p[0]), experts = Integer.parseInt(p[1]), topK = Integer.parseInt(p[2]);
        List<Device> devs = GpuRuntime.get().devices();
        group = CommGroup.initAll(devs);
        arena = Arena.ofShared();
        moe = MoeAllToAll.create(group, new MoeConfig(hidden, experts, topK, tokens, dtype, backend, quantize ? DType.BF16 : dtype, channels));
        SplittableRandom random = new SplittableRandom(7);
        for (Device d : devs) {
            streams.add(d.createStream());
            short[] x = new short[tokens * hidden];
            for (int j = 0; j < x.length; j++) x[j] = (short) (0x3f00 | random.nextInt(0x80));
            int[] idx = new int[tokens * topK];
            float[] w = new float[tokens * topK];
            int[] pool = java.util.stream.IntStream.range(0, experts).toArray();
            for (int t = 0; t < tokens; t++) {
                for (int s = 0; s < topK; s++) {  // topK distinct experts, uniformly
                    int j = s + random.nextInt(experts - s), tmp = pool[s];
                    pool[s] = pool[j]; pool[j] = tmp;
                    idx[t * topK + s] = pool[s];
                    w[t * topK + s] = random.nextFloat();
                }
            }
            DeviceBuffer xb = upload(d, MemorySegment.ofArray(x));
            if (moe.config().input() == DType.FP8_E4M3) {
                try (Fp8Rows q = new Fp8Rows(d)) {
                    xb = q.quantize(xb, tokens, hidden, arena, streams.getLast());
                    q.checkErrors(streams.getLast());
                }
            }
            xs.add(xb);
            ids.add(upload(d, MemorySegment.ofArray(idx)));
            ws.add(upload(d, MemorySegment.ofArray(w)));
        }
        tokenCounts = new int[devs.size()];
        java.util.Arrays.fill(tokenCounts, tokens);
        List<MoeDispatch> first = moe.dispatch(xs, ids, ws, tokenCounts, streams);
        for (int i = 0; i < devs.size(); i++) {
            DeviceBuffer out = first.get(i).rows();
            if (dtype != DType.BF16) {
                out = devs.get(i).allocate(moe.capacityRows() * moe.config().combineRowBytes(), arena);
                out.fill((byte) 0, streams.get(i));
            }
            outs.add(out);
        }
        streams.forEach(Stream::synchronize);
    }

    private DeviceBuffer upload(Device d, MemorySegment host) {
        DeviceBuffer b = d.allocate(Math.max(16, host.byteSize()), arena);
        b.slice(0, host.byteSize()).copyFromHost(host);
        return b;
    }

    @TearDown public void tearDown() {
        streams.forEach(Stream::synchronize);
        moe.checkErrors(streams);
        moe.close();
        streams.forEach(Stream::close);
        arena.close();
        group.close();
    }

    @Benchmark public void dispatchCombine() {
        List<MoeDispatch> h = moe.dispatch(xs, ids, ws, tokenCounts, streams);
        moe.combine(h, outs, streams);
        for (Stream s : streams) s.synchronize();
    }

    /**
     * Every exchange of one MoE layer in a training step (README, "Training"): forward dispatch and
     * combine, then backward: dispatch of dy (x stands in for it), combineUnweighted of the rows'
     * gradients (dx) and returnRowValues of one f32 per row (the router weights' gradient; the
     * received weights stand in for the dot products).
     */
    @Benchmark public void trainingStepExchanges() {
        moe.combine(moe.dispatch(xs, ids, ws, tokenCounts, streams), outs, streams);
        List<MoeDispatch> back = moe.dispatch(xs, ids, ws, tokenCounts, streams);
        moe.combineUnweighted(back, outs, streams);
        List<DeviceBuffer> dots = new ArrayList<>(back.size());
        for (MoeDispatch d : back) dots.add(d.weights());
        moe.returnRowValues(back, dots, streams);
        for (Stream s : streams) s.synchronize();
    }
}
