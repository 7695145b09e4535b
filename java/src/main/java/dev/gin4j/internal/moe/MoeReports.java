package dev.gin4j.internal.moe;

import dev.gin4j.moe.MoeAllToAll;

import java.util.Objects;

/**
 * What an {@link MoeAllToAll} runs, for gin4j's benchmarks, {@code info} and tests, kept off the
 * exported class: {@code MoeAllToAll} hands an implementation to {@link #install} when it is
 * initialised, before any instance exists.
 */
public final class MoeReports {
    /** What {@code MoeAllToAll} implements with its package-private methods. */
    public interface Reports {
        /** See {@link MoeReports#entrySource}. */
        ShapedEntries.Source entrySource(MoeAllToAll moe);
        /** See {@link MoeReports#dispatchKernelName}. */
        String dispatchKernelName(MoeAllToAll moe);
    }

    private static volatile Reports reports;

    private MoeReports() {}

    /** Called once, by {@code MoeAllToAll}'s static initialiser. */
    public static void install(Reports r) {
        if (reports != null) throw new IllegalStateException("MoeAllToAll's reports are installed already");
        reports = Objects.requireNonNull(r);
    }

    /** Where the instance's GIN token-path entries come from (precompiled, compiled at run time, generic). */
    public static ShapedEntries.Source entrySource(MoeAllToAll moe) { return reports.entrySource(Objects.requireNonNull(moe)); }

    /** The dispatch kernel the instance launches, or for HOST "host kernels + NCCL". */
    public static String dispatchKernelName(MoeAllToAll moe) { return reports.dispatchKernelName(Objects.requireNonNull(moe)); }
}
