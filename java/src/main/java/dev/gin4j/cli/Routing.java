package dev.gin4j.cli;

import java.util.Arrays;
import java.util.Locale;
import java.util.SplittableRandom;

/**
 * How {@code gin4j bench moe} routes its tokens: {@code uniform} (every expert equally likely), or
 * {@code zipf[:S]}, the skew of a real router: expert e is picked in proportion to
 * {@code 1 / (1 + place(e))^S} (S = 1 unless given), its place fixed by a shuffle seeded with the
 * number of experts, so every rank and process has the same hot experts, spread over the ranks.
 * Each token takes {@code k} distinct experts.
 *
 * @param zipfS the Zipf exponent, 0 for uniform routing
 */
record Routing(double zipfS) {
    static final Routing UNIFORM = new Routing(0);

    Routing {
        if (!(zipfS >= 0 && zipfS <= 4)) throw new IllegalArgumentException("Zipf exponent " + zipfS + ": expected a number in (0, 4]");
    }

    /** {@code uniform}, {@code zipf} or {@code zipf:S}. */
    static Routing parse(String s) {
        if (s.equals("uniform")) return UNIFORM;
        if (s.equals("zipf")) return new Routing(1.0);
        if (s.startsWith("zipf:")) {
            double v;
            try {
                v = Double.parseDouble(s.substring(5));
            } catch (NumberFormatException e) {
                throw new IllegalArgumentException("--routing " + s + ": expected zipf:S with a number S in (0, 4]");
            }
            if (!(v > 0 && v <= 4)) throw new IllegalArgumentException("--routing " + s + ": the Zipf exponent must be in (0, 4]");
            return new Routing(v);
        }
        throw new IllegalArgumentException("--routing " + s + ": expected uniform, zipf or zipf:S");
    }

    @Override public String toString() { return zipfS == 0 ? "uniform" : String.format(Locale.ROOT, "zipf:%.2f", zipfS); }

    /** Per expert, how likely it is picked (unnormalized); null for uniform routing. */
    double[] popularity(int experts) {
        if (zipfS == 0) return null;
        int[] place = new int[experts];
        for (int e = 0; e < experts; e++) place[e] = e;
        SplittableRandom fixed = new SplittableRandom(0x5eed0000L + experts);  // not the inputs' seed: every rank alike
        for (int i = experts - 1; i > 0; i--) { int j = fixed.nextInt(i + 1); int t = place[i]; place[i] = place[j]; place[j] = t; }
        double[] w = new double[experts];
        for (int e = 0; e < experts; e++) w[e] = 1.0 / Math.pow(1.0 + place[e], zipfS);
        return w;
    }

    /**
     * Writes min(k, experts) distinct experts into {@code out[off..off+k)}: uniform draws, or weighted
     * draws without replacement (the k largest keys log(u) / w, Efraimidis and Spirakis).
     *
     * @param popularity {@link #popularity(int)}'s array (null: uniform)
     * @param pool scratch of at least {@code experts} ints
     */
    static void pick(SplittableRandom random, double[] popularity, int experts, int k, int[] out, int off, int[] pool) {
        int n = Math.min(k, experts);
        if (popularity == null) {
            for (int e = 0; e < experts; e++) pool[e] = e;
            for (int s = 0; s < n; s++) { int j = s + random.nextInt(experts - s); int t = pool[s]; pool[s] = pool[j]; pool[j] = t; out[off + s] = pool[s]; }
            return;
        }
        double[] bestKey = new double[n];
        Arrays.fill(bestKey, Double.NEGATIVE_INFINITY);
        for (int e = 0; e < experts; e++) {
            double key = Math.log(1.0 - random.nextDouble()) / popularity[e];  // u in (0, 1]
            if (key <= bestKey[n - 1]) continue;
            int s = n - 1;  // insertion into the sorted top n
            while (s > 0 && bestKey[s - 1] < key) { bestKey[s] = bestKey[s - 1]; out[off + s] = out[off + s - 1]; s--; }
            bestKey[s] = key;
            out[off + s] = e;
        }
    }
}
