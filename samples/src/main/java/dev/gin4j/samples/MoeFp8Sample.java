package dev.gin4j.samples;

import dev.gin4j.comm.Backend;
import dev.gin4j.comm.Bf16;
import dev.gin4j.comm.CommGroup;
import dev.gin4j.gpu.Device;
import dev.gin4j.gpu.DeviceBuffer;
import dev.gin4j.gpu.GpuRuntime;
import dev.gin4j.gpu.Stream;
import dev.gin4j.moe.Fp8Rows;
import dev.gin4j.moe.MoeAllToAll;
import dev.gin4j.moe.MoeConfig;
import dev.gin4j.moe.MoeDispatch;
import dev.gin4j.samples.SampleData.Inputs;
import dev.gin4j.samples.SampleData.PerGpu;
import dev.gin4j.samples.SampleData.RowOrigin;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Random;

/**
 * An fp8 dispatch (scaled fp8 rows, {@link Fp8Rows}: e4m3 codes and one f32 scale per 128
 * elements, about half the bytes of bf16), in its two forms on every GPU: x quantized first by
 * {@link Fp8Rows#quantize} and dispatched by {@link MoeConfig#fp8}, and bf16 x quantized by the
 * dispatch itself ({@link MoeConfig#fp8FromBf16}). 96 tokens per GPU, hidden 320 (two full scale
 * blocks and a short one), 8 experts (or the next multiple of the GPU count), top-2.
 *
 * <p>Checks: both forms receive the same rows byte for byte; every received row decodes to its
 * token's x within half an e4m3 step; the per-expert counts and row weights match the routing. The
 * experts (on the host here) dequantize and scale by 0.5, 1 or 2 into bf16; the combine's y is
 * checked element by element against a CPU reference.
 */
public final class MoeFp8Sample {
    public static void main(String[] args) {
        List<Device> devices = GpuRuntime.get().devices();
        int n = devices.size(), tokens = 96, hidden = 320, experts = (8 + n - 1) / n * n, topK = 2;
        long seed = System.nanoTime(), rowBytes = Fp8Rows.rowBytes(hidden);
        Random random = new Random(seed);
        try (CommGroup group = CommGroup.initAll(devices); Arena arena = Arena.ofShared();
             MoeAllToAll fromBf16 = MoeAllToAll.create(group, MoeConfig.fp8FromBf16(hidden, experts, topK, tokens, Backend.GIN));
             MoeAllToAll fp8 = MoeAllToAll.create(group, MoeConfig.fp8(hidden, experts, topK, tokens, Backend.GIN));
             PerGpu<Stream> streams = new PerGpu<>(); PerGpu<Fp8Rows> quantizers = new PerGpu<>()) {
            List<Inputs> in = new ArrayList<>();
            List<DeviceBuffer> x = new ArrayList<>(), xq = new ArrayList<>(), idx = new ArrayList<>(), w = new ArrayList<>();
            for (int r = 0; r < n; r++) {
                Device d = devices.get(r);
                streams.add(d.createStream());
                quantizers.add(new Fp8Rows(d));
                in.add(Inputs.random(random, tokens, hidden, experts, topK));
                x.add(SampleData.upload(d, arena, in.get(r).x()));
                idx.add(SampleData.upload(d, arena, in.get(r).idx()));
                w.add(SampleData.upload(d, arena, in.get(r).w()));
                xq.add(quantizers.get(r).quantize(x.get(r), tokens, hidden, arena, streams.get(r)));
            }
            for (int r = 0; r < n; r++) quantizers.get(r).checkErrors(streams.get(r));
            int[] counts = new int[n];
            Arrays.fill(counts, tokens);
            List<MoeDispatch> a = fromBf16.dispatch(x, idx, w, counts, streams), b = fp8.dispatch(xq, idx, w, counts, streams);
            fromBf16.checkErrors(streams);
            fp8.checkErrors(streams);

            int localExperts = fp8.localExperts();
            boolean fnuz = devices.getFirst().arch().startsWith("gfx");
            List<DeviceBuffer> expertOut = new ArrayList<>();
            List<float[]> tokenValues = new ArrayList<>();  // each rank's tokens as their fp8 rows decode
            for (int r = 0; r < n; r++) {
                Stream s = streams.get(r);
                String where = "rank " + r;
                List<RowOrigin> origins = SampleData.receivedRows(in, r, localExperts);
                int rows = origins.size();
                SampleData.checkCounts(where, b.get(r).counts().readInts(localExperts, s), SampleData.counts(origins, r, localExperts), seed);
                SampleData.checkCounts(where + " (fp8FromBf16)", a.get(r).counts().readInts(localExperts, s), SampleData.counts(origins, r, localExperts), seed);
                byte[] got = bytes(b.get(r).rows(), rows * rowBytes, s);
                if (!Arrays.equals(got, bytes(a.get(r).rows(), rows * rowBytes, s)))
                    throw new IllegalStateException(where + ": the dispatch that quantizes bf16 x received other rows than the one given Fp8Rows.quantize's rows (seed " + seed + ")");
                float[] weights = SampleData.readFloats(b.get(r).weights(), rows, s), values = decode(got, rows, hidden, fnuz);
                short[] out = new short[rows * hidden];
                for (int i = 0; i < rows; i++) {
                    RowOrigin o = origins.get(i);
                    Inputs src = in.get(o.source());
                    if (weights[i] != src.w()[o.token() * topK + o.k()])
                        throw new IllegalStateException(where + ": row " + i + " has weight " + weights[i] + ", expected " + src.w()[o.token() * topK + o.k()] + " (seed " + seed + ")");
                    float scale = SampleData.expertScale(o.expert());
                    for (int j = 0; j < hidden; j++) {
                        float v = values[i * hidden + j], want = src.x(o.token(), j), blockScale = scaleOf(got, i, rowBytes, hidden, j);
                        // half an e4m3 step: 2^-4 relative for normal codes, 2^-(bias+3) x the block's scale for subnormal ones
                        // (and a little for the f32 division by the scale)
                        if (!(Math.abs(v - want) <= Math.max(0x1p-4 * Math.abs(want), Math.scalb((double) blockScale, fnuz ? -11 : -10)) * 1.0001))
                            throw new IllegalStateException(where + ": row " + i + " (rank " + o.source() + " token " + o.token() + ") element " + j + " decodes to " + v
                                    + ", x is " + want + " (seed " + seed + ")");
                        out[i * hidden + j] = Bf16.fromFloat(scale * v);  // the expert: dequantize, scale
                    }
                }
                DeviceBuffer eo = devices.get(r).allocate(fp8.capacityRows() * 2L * hidden, arena);
                if (rows > 0) eo.slice(0, 2L * out.length).copyFromHost(MemorySegment.ofArray(out), s);
                expertOut.add(eo);
                tokenValues.add(decode(bytes(xq.get(r), tokens * rowBytes, s), tokens, hidden, fnuz));
            }
            List<DeviceBuffer> y = fp8.combine(b, expertOut, streams);
            fp8.checkErrors(streams);
            for (int r = 0; r < n; r++) {
                float[] dec = tokenValues.get(r);
                SampleData.checkCombine("rank " + r, in.get(r), SampleData.readShorts(y.get(r), tokens * hidden, streams.get(r)),
                        (e, t, j) -> Bf16.toFloat(Bf16.fromFloat(SampleData.expertScale(e) * dec[t * hidden + j])), seed);
            }
            System.out.println("fp8 rows (" + rowBytes + " bytes a row against " + 2 * hidden + " for bf16): the same rows from both forms, each within half an e4m3 step of x,"
                    + " y matches the CPU reference for all " + tokens + " x " + hidden + " elements on each of " + n + " GPU(s)");
        }
    }

    private static byte[] bytes(DeviceBuffer b, long n, Stream s) {
        byte[] v = new byte[(int) n];
        if (n > 0) b.slice(0, n).copyToHost(MemorySegment.ofArray(v), s);
        return v;
    }

    /** The f32 scale of element j's 128-element block in row i. */
    private static float scaleOf(byte[] rows, int i, long rowBytes, int hidden, int j) {
        return MemorySegment.ofArray(rows).get(ValueLayout.JAVA_FLOAT_UNALIGNED, i * rowBytes + hidden + 4L * (j / 128));
    }

    /** Scaled fp8 rows to floats: e4m3(code) x the scale of its block. */
    private static float[] decode(byte[] rows, int count, int hidden, boolean fnuz) {
        long rowBytes = Fp8Rows.rowBytes(hidden);
        float[] v = new float[count * hidden];
        for (int i = 0; i < count; i++)
            for (int j = 0; j < hidden; j++) v[i * hidden + j] = e4m3(rows[(int) (i * rowBytes + j)] & 0xff, fnuz) * scaleOf(rows, i, rowBytes, hidden, j);
        return v;
    }

    /** One e4m3 code's value: e4m3fn (NVIDIA, bias 7) or e4m3fnuz (gfx942, bias 8). */
    private static float e4m3(int code, boolean fnuz) {
        int bias = fnuz ? 8 : 7, e = (code >> 3) & 15, m = code & 7;
        if (fnuz ? code == 0x80 : (code & 0x7f) == 0x7f) return Float.NaN;
        float magnitude = e == 0 ? Math.scalb((float) m, -(bias + 2)) : Math.scalb(1f + m / 8f, e - bias);
        return (code & 0x80) != 0 ? -magnitude : magnitude;
    }
}
