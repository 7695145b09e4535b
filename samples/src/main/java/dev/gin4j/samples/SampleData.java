package dev.gin4j.samples;

import dev.gin4j.comm.Bf16;
import dev.gin4j.gpu.Device;
import dev.gin4j.gpu.DeviceBuffer;
import dev.gin4j.gpu.NativeResource;
import dev.gin4j.gpu.Stream;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.List;
import java.util.Random;

/**
 * What the MoE samples share: one rank's random inputs, uploads and downloads, where each received
 * row comes from, and the check of the combine's y against a CPU reference.
 */
final class SampleData {
    private SampleData() {}

    /**
     * One rank's inputs: x {@code [T][H]} bf16 (normal random values), topkIdx {@code [T][K]} with
     * K distinct experts per token, topkWeights {@code [T][K]} in {1/16, ..., 1}.
     */
    record Inputs(int tokens, int hidden, int topK, short[] x, int[] idx, float[] w) {
        static Inputs random(Random random, int tokens, int hidden, int experts, int topK) {
            short[] x = new short[tokens * hidden];
            for (int i = 0; i < x.length; i++) x[i] = Bf16.fromFloat((float) random.nextGaussian());
            int[] idx = new int[tokens * topK];
            float[] w = new float[tokens * topK];
            int[] pool = new int[experts];
            for (int t = 0; t < tokens; t++) {
                for (int e = 0; e < experts; e++) pool[e] = e;
                for (int k = 0; k < topK; k++) {  // a partial shuffle: K distinct experts
                    int j = k + random.nextInt(experts - k), e = pool[j];
                    pool[j] = pool[k];
                    pool[k] = e;
                    idx[t * topK + k] = e;
                    w[t * topK + k] = (1 + random.nextInt(16)) / 16f;
                }
            }
            return new Inputs(tokens, hidden, topK, x, idx, w);
        }

        float x(int token, int h) { return Bf16.toFloat(x[token * hidden + h]); }
    }

    /** Expert e's stand-in in the samples: multiplying by 0.5, 1 or 2 (exact in bf16), so a row given to the wrong expert shows in y. */
    static float expertScale(int expert) { return new float[] {0.5f, 1f, 2f}[expert % 3]; }

    /** One received row's origin: token {@code token} of rank {@code source}, its slot {@code k}, for global expert {@code expert}. */
    record RowOrigin(int source, int token, int k, int expert) {}

    /**
     * The rows a dispatch gives {@code rank} (docs/kernels.md): expert-major over its local experts,
     * within an expert by source rank, within a source by token. Needs every rank's inputs.
     */
    static List<RowOrigin> receivedRows(List<Inputs> all, int rank, int localExperts) {
        List<RowOrigin> rows = new ArrayList<>();
        for (int e = rank * localExperts; e < (rank + 1) * localExperts; e++) {
            for (int s = 0; s < all.size(); s++) {
                Inputs in = all.get(s);
                for (int t = 0; t < in.tokens(); t++)
                    for (int k = 0; k < in.topK(); k++) if (in.idx()[t * in.topK() + k] == e) rows.add(new RowOrigin(s, t, k, e));
            }
        }
        return rows;
    }

    /** The per-expert counts of {@code rows}. */
    static int[] counts(List<RowOrigin> rows, int rank, int localExperts) {
        int[] c = new int[localExperts];
        for (RowOrigin r : rows) c[r.expert() - rank * localExperts]++;
        return c;
    }

    /** What expert {@code expert} gives for element h of token t (after its rounding to bf16). */
    interface ExpertOutput { float value(int expert, int token, int h); }

    /**
     * Checks every element of y {@code [T][H]} against {@code sum_k w_k * out(e_k, t, h)} (computed
     * in double): within 2^-7 of the sum of the terms' magnitudes, the combine's bf16 roundings (one
     * of y, one of a remote rank's partial sum, docs/kernels.md). Throws, naming the first element
     * that is off, its rank and the seed.
     */
    static void checkCombine(String where, Inputs in, short[] y, ExpertOutput out, long seed) {
        int k = in.topK(), h = in.hidden();
        for (int t = 0; t < in.tokens(); t++) {
            for (int j = 0; j < h; j++) {
                double want = 0, size = 0;
                for (int q = 0; q < k; q++) {
                    double term = (double) in.w()[t * k + q] * out.value(in.idx()[t * k + q], t, j);
                    want += term;
                    size += Math.abs(term);
                }
                float got = Bf16.toFloat(y[t * h + j]);
                if (!(Math.abs(got - want) <= 0x1p-7 * size))
                    throw new IllegalStateException(where + ": y[" + t + "][" + j + "] = " + got + ", expected " + want + " (within " + 0x1p-7 * size
                            + "; experts " + java.util.Arrays.toString(java.util.Arrays.copyOfRange(in.idx(), t * k, t * k + k)) + ", seed " + seed + ")");
            }
        }
    }

    static DeviceBuffer upload(Device d, Arena a, short[] v) { return upload(d, a, MemorySegment.ofArray(v)); }
    static DeviceBuffer upload(Device d, Arena a, int[] v) { return upload(d, a, MemorySegment.ofArray(v)); }
    static DeviceBuffer upload(Device d, Arena a, float[] v) { return upload(d, a, MemorySegment.ofArray(v)); }

    /** A new device buffer holding {@code host} (at least 16 bytes). */
    static DeviceBuffer upload(Device d, Arena a, MemorySegment host) {
        DeviceBuffer b = d.allocate(Math.max(16, host.byteSize()), a);
        if (host.byteSize() > 0) b.slice(0, host.byteSize()).copyFromHost(host);
        return b;
    }

    /** The first {@code n} bf16 values of {@code b}, read in order after the work queued on {@code stream}. */
    static short[] readShorts(DeviceBuffer b, int n, Stream stream) {
        short[] v = new short[n];
        if (n > 0) b.slice(0, 2L * n).copyToHost(MemorySegment.ofArray(v), stream);
        return v;
    }

    /** The first {@code n} f32 values of {@code b}, read in order after the work queued on {@code stream}. */
    static float[] readFloats(DeviceBuffer b, int n, Stream stream) {
        float[] v = new float[n];
        if (n > 0) b.slice(0, 4L * n).copyToHost(MemorySegment.ofArray(v), stream);
        return v;
    }

    /** Native objects made one per GPU, closed together (the last made first) by try-with-resources; a list, to pass where gin4j takes one per GPU. */
    @SuppressWarnings("serial")  // never serialized
    static final class PerGpu<T extends NativeResource> extends ArrayList<T> implements AutoCloseable {
        @Override public void close() {
            RuntimeException first = null;
            for (int i = size() - 1; i >= 0; i--) {
                try {
                    get(i).close();
                } catch (RuntimeException e) {
                    if (first == null) first = e; else first.addSuppressed(e);
                }
            }
            if (first != null) throw first;
        }
    }

    /** Throws when the device's per-expert counts differ from the reference's. */
    static void checkCounts(String where, int[] got, int[] want, long seed) {
        if (!java.util.Arrays.equals(got, want))
            throw new IllegalStateException(where + ": rows per local expert " + java.util.Arrays.toString(got) + ", expected " + java.util.Arrays.toString(want) + " (seed " + seed + ")");
    }
}
