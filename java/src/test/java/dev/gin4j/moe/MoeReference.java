package dev.gin4j.moe;

import dev.gin4j.comm.Bf16;

import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.SplittableRandom;
import java.util.stream.IntStream;

/**
 * The CPU reference of the MoE exchange tests (MoeGpuTest in one process, RankMain across
 * processes): inputs whose rows name their source, the expert-major layout a dispatch must
 * produce, fake experts, and the combine they must give.
 */
public final class MoeReference {
    private MoeReference() {}

    public enum Routing { UNIFORM, ONE_EXPERT, NOTHING_TO_LAST_RANK, ALL_MASKED, SOME_MASKED }

    /**
     * One rank's inputs: the dispatched rows as bytes (bf16, or scaled fp8 rows), the values they
     * stand for ([T][H], what the fake experts and the combine reference use), the routing, and x,
     * what the dispatch is handed (the rows themselves, or the bf16 rows an fp8 dispatch quantizes).
     * bf16 rows carry their source rank and token index in the first elements.
     */
    public record Input(int tokens, byte[] rows, float[] values, int[] idx, float[] w, byte[] x) {
        public Input(int tokens, byte[] rows, float[] values, int[] idx, float[] w) { this(tokens, rows, values, idx, w, rows); }
    }

    /** Rank {@code rank}'s bf16 inputs of {@code tokens} tokens, {@code experts} split evenly over {@code ranks} ranks. */
    public static Input input(SplittableRandom random, int rank, int ranks, int tokens, int hidden, int experts, int k, Routing routing) {
        short[] x = new short[tokens * hidden];
        for (int t = 0; t < tokens; t++) {
            for (int h = 0; h < hidden; h++) x[t * hidden + h] = Bf16.fromFloat((float) (random.nextInt(64) - 32) / 8);
            x[t * hidden] = Bf16.fromFloat(rank);
            if (hidden > 1) x[t * hidden + 1] = Bf16.fromFloat(t % 256);
            if (hidden > 2) x[t * hidden + 2] = Bf16.fromFloat(t / 256);
        }
        int[] idx = new int[tokens * k];
        float[] w = new float[tokens * k];
        int perRank = experts / ranks;
        for (int t = 0; t < tokens; t++) {
            int[] pool = IntStream.range(0, routing == Routing.NOTHING_TO_LAST_RANK ? experts - perRank : experts).toArray();
            for (int i = pool.length - 1; i > 0; i--) { int j = random.nextInt(i + 1); int tmp = pool[i]; pool[i] = pool[j]; pool[j] = tmp; }
            for (int s = 0; s < k; s++) {
                int e = switch (routing) {
                    case ONE_EXPERT -> s == 0 ? 3 % experts : -1;
                    case ALL_MASKED -> -1;
                    case SOME_MASKED -> random.nextInt(3) == 0 ? -1 : pool[s];
                    default -> s < pool.length ? pool[s] : -1;  // one rank: no expert outside the last rank
                };
                idx[t * k + s] = e;
                w[t * k + s] = e < 0 ? 0f : random.nextFloat();
            }
        }
        byte[] rows = new byte[2 * x.length];
        MemorySegment.copy(x, 0, MemorySegment.ofArray(rows), ValueLayout.JAVA_SHORT_UNALIGNED, 0, x.length);
        float[] values = new float[x.length];
        for (int i = 0; i < x.length; i++) values[i] = Bf16.toFloat(x[i]);
        return new Input(tokens, rows, values, idx, w);
    }

    /** Expected expert-major layout on rank d: rows, weights, per-expert counts, and each row's (source, token, expert, k). */
    public record Layout(List<byte[]> rows, List<Float> weights, int[] counts, List<int[]> origin) {}

    /** What rank {@code d} must receive from the ranks whose inputs are {@code in} (one per rank). */
    public static Layout expected(Input[] in, int d, int rowBytes, int experts, int k) {
        int L = experts / in.length;
        List<byte[]> rows = new ArrayList<>();
        List<Float> weights = new ArrayList<>();
        List<int[]> origin = new ArrayList<>();
        int[] counts = new int[L];
        for (int e = 0; e < L; e++) {
            int ge = d * L + e;
            for (int s = 0; s < in.length; s++) {
                for (int t = 0; t < in[s].tokens; t++) {
                    for (int q = 0; q < k; q++) {
                        if (in[s].idx[t * k + q] == ge) {
                            rows.add(Arrays.copyOfRange(in[s].rows, t * rowBytes, (t + 1) * rowBytes));
                            weights.add(in[s].w[t * k + q]);
                            origin.add(new int[] {s, t, ge, q});
                            counts[e]++;
                        }
                    }
                }
            }
        }
        return new Layout(rows, weights, counts, origin);
    }

    /** Where each local expert's block starts at {@code alignment} (moe_expert_offsets): {@code [L + 1]}, the last entry the end of the last block. */
    public static int[] alignedStarts(int[] counts, int alignment) {
        int[] o = new int[counts.length + 1];
        for (int e = 0; e < counts.length; e++) o[e + 1] = o[e] + (counts[e] + alignment - 1) / alignment * alignment;
        return o;
    }

    /** The fake experts' bf16 output [capacityRows][hidden] for the rows of {@code layout}: out = value x (1 + expert id). */
    public static short[] expertOut(Input[] in, Layout layout, int hidden, long capacityRows) {
        short[] out = new short[Math.toIntExact(capacityRows * hidden)];
        for (int r = 0; r < layout.rows().size(); r++) {
            int[] o = layout.origin().get(r);
            for (int h = 0; h < hidden; h++) out[r * hidden + h] = Bf16.fromFloat(in[o[0]].values[o[1] * hidden + h] * (1 + o[2]));
        }
        return out;
    }

    /**
     * Checks y [T][H] bf16 of the rank with inputs {@code in} against the combine of the fake
     * experts' outputs (weighted by the router's weights, or not), within bf16 tolerance; returns
     * the first element that is off, described, or null.
     */
    public static String combineMismatch(Input in, MemorySegment y, int hidden, int k, boolean weighted) {
        for (int t = 0; t < in.tokens; t++) {
            for (int h = 0; h < hidden; h++) {
                double ref = 0, mag = 0;
                for (int q = 0; q < k; q++) {
                    int e = in.idx[t * k + q];
                    if (e < 0) continue;
                    double w = weighted ? in.w[t * k + q] : 1.0;
                    double term = w * Bf16.toFloat(Bf16.fromFloat(in.values[t * hidden + h] * (1 + e)));
                    ref += term;
                    mag += Math.abs(term);
                }
                float v = Bf16.toFloat(y.getAtIndex(ValueLayout.JAVA_SHORT_UNALIGNED, (long) t * hidden + h));
                if (!(Math.abs(v - ref) <= 0.016 * mag + 1e-6)) return "token " + t + " element " + h + ": expected " + ref + " got " + v;
            }
        }
        return null;
    }
}
