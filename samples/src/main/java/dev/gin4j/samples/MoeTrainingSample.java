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
import java.lang.foreign.ValueLayout;
import java.util.ArrayList;
import java.util.List;
import java.util.Random;

/**
 * One MoE layer's forward and backward passes: 128 tokens per GPU, hidden 256, 8 experts (or the
 * next multiple of the GPU count), top-2.
 * Expert e is the linear map out = a[e] * x (a stand-in for the expert MLPs, computed on the host
 * here; yours run on the GPU), the loss is 0.5 * sum(y^2), so dy = y. The backward uses the
 * library's three exchanges: a dispatch of dy (each expert row receives dy of its token), a
 * combine without weights of the rows' input gradients (dx), and returnRowValues of each row's
 * dot product of dy and the expert output (the router weights' gradient). Checks dx and dL/dw
 * against a CPU reference of the same layer and exits non-zero if they differ.
 */
public final class MoeTrainingSample {
    static final int TOKENS = 128, HIDDEN = 256, TOP_K = 2;

    public static void main(String[] args) {
        List<Device> devices = GpuRuntime.get().devices();
        int n = devices.size(), experts = (8 + n - 1) / n * n;  // split evenly over the GPUs
        long seed = System.nanoTime();
        Random random = new Random(seed);
        float[] a = new float[experts];
        for (int e = 0; e < experts; e++) a[e] = 1f + e / 8f;
        float[][] x = new float[n][], w = new float[n][];
        int[][] idx = new int[n][];
        try (CommGroup group = CommGroup.initAll(devices); Arena arena = Arena.ofShared();
             MoeAllToAll moe = MoeAllToAll.create(group, MoeConfig.bf16(HIDDEN, experts, TOP_K, TOKENS, Backend.GIN));
             SampleData.PerGpu<Stream> streams = new SampleData.PerGpu<>()) {
            List<DeviceBuffer> xs = new ArrayList<>(), ids = new ArrayList<>(), ws = new ArrayList<>();
            for (int r = 0; r < n; r++) {
                x[r] = new float[TOKENS * HIDDEN];
                for (int i = 0; i < x[r].length; i++) x[r][i] = (random.nextInt(33) - 16) / 16f;  // exact in bf16
                idx[r] = new int[TOKENS * TOP_K];
                w[r] = new float[TOKENS * TOP_K];
                for (int t = 0; t < TOKENS; t++) {
                    int e0 = random.nextInt(experts), e1 = (e0 + 1 + random.nextInt(experts - 1)) % experts;
                    idx[r][t * TOP_K] = e0;
                    idx[r][t * TOP_K + 1] = e1;
                    w[r][t * TOP_K] = random.nextInt(16) / 16f;
                    w[r][t * TOP_K + 1] = random.nextInt(16) / 16f;
                }
                Device d = devices.get(r);
                xs.add(upload(d, arena, MemorySegment.ofArray(bf16(x[r]))));
                ids.add(upload(d, arena, MemorySegment.ofArray(idx[r])));
                ws.add(upload(d, arena, MemorySegment.ofArray(w[r])));
                streams.add(d.createStream());
            }
            int[] tokens = new int[n];
            java.util.Arrays.fill(tokens, TOKENS);
            int L = moe.localExperts();

            // forward: dispatch, experts, combine
            List<MoeDispatch> fwd = moe.dispatch(xs, ids, ws, tokens, streams);
            moe.checkErrors(streams);  // waits for the streams: the host reads the rows next
            List<float[]> xRows = new ArrayList<>(), outRows = new ArrayList<>();
            List<int[]> rowExpert = new ArrayList<>();
            List<DeviceBuffer> outs = new ArrayList<>();
            for (int r = 0; r < n; r++) {
                int[] expertOf = rowExperts(fwd.get(r), r * L, L);
                float[] in = download(fwd.get(r).rows(), expertOf.length * HIDDEN), out = new float[in.length];
                for (int i = 0; i < in.length; i++) out[i] = a[expertOf[i / HIDDEN]] * in[i];
                xRows.add(in);  // the expert backward needs its inputs: the next dispatch reuses the buffers
                outRows.add(out);
                rowExpert.add(expertOf);
                outs.add(upload(devices.get(r), arena, MemorySegment.ofArray(bf16(out, moe.capacityRows() * HIDDEN))));
            }
            List<DeviceBuffer> y = moe.combine(fwd, outs, streams);
            moe.checkErrors(streams);
            List<float[]> dy = new ArrayList<>();
            List<DeviceBuffer> dys = new ArrayList<>();
            for (int r = 0; r < n; r++) {
                float[] yr = download(y.get(r), TOKENS * HIDDEN);  // dy = y for the loss 0.5 * sum(y^2)
                dy.add(yr);
                dys.add(upload(devices.get(r), arena, MemorySegment.ofArray(bf16(yr))));
            }

            // backward: dy to the expert rows (same routing, same layout), the experts' backward
            List<MoeDispatch> bwd = moe.dispatch(dys, ids, ws, tokens, streams);
            moe.checkErrors(streams);
            List<DeviceBuffer> dxRows = new ArrayList<>(), dots = new ArrayList<>();
            for (int r = 0; r < n; r++) {
                int[] expertOf = rowExperts(bwd.get(r), r * L, L);
                int rows = expertOf.length;
                float[] dyRow = download(bwd.get(r).rows(), rows * HIDDEN), rowW = downloadFloats(bwd.get(r).weights(), rows);
                float[] dxRow = new float[rows * HIDDEN], dot = new float[(int) moe.capacityRows()];
                for (int i = 0; i < rows; i++) {
                    for (int h = 0; h < HIDDEN; h++) {
                        int j = i * HIDDEN + h;
                        dxRow[j] = a[expertOf[i]] * rowW[i] * dyRow[j];  // d out = w * dy, d x = a * d out
                        dot[i] += dyRow[j] * outRows.get(r)[j];           // <dy, out>: dL/dw of this (token, k)
                    }
                }
                dxRows.add(upload(devices.get(r), arena, MemorySegment.ofArray(bf16(dxRow, moe.capacityRows() * HIDDEN))));
                dots.add(upload(devices.get(r), arena, MemorySegment.ofArray(dot)));
            }
            List<DeviceBuffer> dx = moe.combineUnweighted(bwd, dxRows, streams);
            List<DeviceBuffer> dw = moe.returnRowValues(bwd, dots, streams);
            moe.checkErrors(streams);

            // CPU reference: y[t] = s x[t] with s = sum_k w_k a[e_k]; dx[t] = s^2 x[t]; dL/dw_k = s a[e_k] |x[t]|^2
            double worstDx = 0, worstDw = 0;
            for (int r = 0; r < n; r++) {
                float[] gx = download(dx.get(r), TOKENS * HIDDEN), gw = downloadFloats(dw.get(r), TOKENS * TOP_K);
                for (int t = 0; t < TOKENS; t++) {
                    double s = 0, norm = 0;
                    for (int k = 0; k < TOP_K; k++) s += w[r][t * TOP_K + k] * a[idx[r][t * TOP_K + k]];
                    for (int h = 0; h < HIDDEN; h++) {
                        double xv = x[r][t * HIDDEN + h];
                        norm += xv * xv;
                        worstDx = Math.max(worstDx, Math.abs(gx[t * HIDDEN + h] - s * s * xv) / (s * s * Math.abs(xv) + 1e-3));
                    }
                    for (int k = 0; k < TOP_K; k++) {
                        double want = s * a[idx[r][t * TOP_K + k]] * norm;
                        worstDw = Math.max(worstDw, Math.abs(gw[t * TOP_K + k] - want) / (Math.abs(want) + 1e-3));
                    }
                }
            }
            System.out.printf("%d GPU(s): dx worst relative error %.2e, dL/dw %.2e (bf16 rows: ~1e-2 expected)%n", n, worstDx, worstDw);
            if (!(worstDx < 0.03 && worstDw < 0.03)) throw new IllegalStateException("the backward pass differs from the CPU reference (seed " + seed + ")");
        }
    }

    /** The global expert of each received row: the counts give each local expert's run of rows. */
    private static int[] rowExperts(MoeDispatch h, int firstExpert, int localExperts) {
        int[] counts = new int[localExperts];
        MemorySegment.copy(MemorySegment.ofArray(h.counts().slice(0, 4L * localExperts).toByteArray()), ValueLayout.JAVA_INT_UNALIGNED, 0, counts, 0, localExperts);
        int[] expertOf = new int[java.util.Arrays.stream(counts).sum()];
        for (int e = 0, i = 0; e < localExperts; e++) for (int c = 0; c < counts[e]; c++) expertOf[i++] = firstExpert + e;
        return expertOf;
    }

    private static short[] bf16(float[] v) { return bf16(v, v.length); }

    /** v as bf16 (round to nearest even), zero-padded to {@code length} elements. */
    private static short[] bf16(float[] v, long length) {
        short[] o = new short[(int) length];
        for (int i = 0; i < v.length; i++) o[i] = Bf16.fromFloat(v[i]);
        return o;
    }

    private static float[] download(DeviceBuffer b, int elements) {
        byte[] raw = b.slice(0, 2L * elements).toByteArray();
        float[] o = new float[elements];
        for (int i = 0; i < elements; i++) o[i] = Bf16.toFloat((short) ((raw[2 * i + 1] & 0xff) << 8 | (raw[2 * i] & 0xff)));
        return o;
    }

    private static float[] downloadFloats(DeviceBuffer b, int count) {
        float[] o = new float[count];
        MemorySegment.copy(MemorySegment.ofArray(b.slice(0, 4L * count).toByteArray()), ValueLayout.JAVA_FLOAT_UNALIGNED, 0, o, 0, count);
        return o;
    }

    private static DeviceBuffer upload(Device d, Arena a, MemorySegment host) {
        DeviceBuffer b = d.allocate(Math.max(16, host.byteSize()), a);
        if (host.byteSize() > 0) b.slice(0, host.byteSize()).copyFromHost(host);
        return b;
    }
}
