package dev.gin4j.internal.comm;

import dev.gin4j.comm.CommGroup;
import dev.gin4j.gpu.Stream;

import java.util.List;
import java.util.Objects;
import java.util.function.Supplier;

/**
 * The library's own calls on a {@link CommGroup} (failing together, bounded waits, group calls,
 * argument checks), kept off the exported class: {@code CommGroup} hands an implementation to
 * {@link #install} when it is initialised, which happens before any instance exists, so every
 * method here finds it.
 */
public final class Groups {
    /** What {@code CommGroup} implements with its package-private methods. */
    public interface Machinery {
        /** See {@link Groups#failTogether(CommGroup, String, Supplier)}. */
        <T> T failTogether(CommGroup g, String step, Supplier<T> localWork);
        /** See {@link Groups#failTogether(CommGroup, String, RuntimeException)}. */
        void failTogether(CommGroup g, String step, RuntimeException localFailure);
        /** See {@link Groups#await(CommGroup, Stream, String)}. */
        void await(CommGroup g, Stream stream, String what);
        /** See {@link Groups#inGroup}. */
        void inGroup(CommGroup g, String what, Runnable body);
        /** See {@link Groups#checkLocalIndex}. */
        void checkLocalIndex(CommGroup g, int localIndex);
        /** See {@link Groups#requireOneLocalRank}. */
        void requireOneLocalRank(CommGroup g, String call);
        /** See {@link Groups#checkStreams}. */
        void checkStreams(CommGroup g, List<Stream> streams);
        /** See {@link Groups#beforeAbort}. */
        Runnable beforeAbort(CommGroup g, Runnable signal);
    }

    private static volatile Machinery machinery;

    private Groups() {}

    /** Called once, by {@code CommGroup}'s static initialiser. */
    public static void install(Machinery m) {
        if (machinery != null) throw new IllegalStateException("CommGroup's machinery is installed already");
        machinery = Objects.requireNonNull(m);
    }

    private static Machinery m(CommGroup g) {
        Objects.requireNonNull(g, "the communicator group");
        return machinery;  // set: g's class was initialised before g was made
    }

    /**
     * Collective: every rank says whether its part of {@code step} (work that can fail on some ranks
     * only, such as allocating memory or loading kernels) succeeded, so that the ranks fail
     * together instead of the healthy ones waiting forever in the next collective. Runs
     * {@code localWork}, then returns its result when every rank succeeded; otherwise throws what it
     * threw on the ranks that failed and, on the others, an exception naming them. A rank that
     * cannot take part in the agreement aborts the group.
     */
    public static <T> T failTogether(CommGroup g, String step, Supplier<T> localWork) { return m(g).failTogether(g, step, localWork); }

    /** {@link #failTogether(CommGroup, String, Supplier)} of work with no result. */
    public static void failTogether(CommGroup g, String step, Runnable localWork) {
        m(g).failTogether(g, step, () -> {
            localWork.run();
            return null;
        });
    }

    /** The agreement itself: {@code localFailure} is this rank's failure of {@code step}, or null. */
    public static void failTogether(CommGroup g, String step, RuntimeException localFailure) { m(g).failTogether(g, step, localFailure); }

    /**
     * Waits until {@code stream}'s work is done, but not forever: at an asynchronous NCCL error, or
     * once the group's host-wait time-out has passed, it aborts the group and throws, naming
     * {@code what} waited.
     */
    public static void await(CommGroup g, Stream stream, String what) { m(g).await(g, stream, what); }

    /** {@link #await(CommGroup, Stream, String)} of every stream in the list. */
    public static void await(CommGroup g, List<Stream> streams, String what) {
        for (Stream s : streams) await(g, s, what);
    }

    /** Runs {@code body} inside ncclGroupStart/ncclGroupEnd and returns once NCCL has done the group's host part. */
    public static void inGroup(CommGroup g, String what, Runnable body) { m(g).inGroup(g, what, body); }

    /** Refuses an index that is not one of this process's ranks, naming how many it drives. */
    public static void checkLocalIndex(CommGroup g, int localIndex) { m(g).checkLocalIndex(g, localIndex); }

    /** Refuses a single-rank call ({@code call}) where this process drives several local ranks. */
    public static void requireOneLocalRank(CommGroup g, String call) { m(g).requireOneLocalRank(g, call); }

    /** One stream per local rank, in local order, each on its rank's device. */
    public static void checkStreams(CommGroup g, List<Stream> streams) { m(g).checkStreams(g, streams); }

    /**
     * Registers {@code signal}, run (on whichever thread aborts) just before the group's
     * communicators are aborted: it tells kernels still running to stop waiting on NCCL, since
     * ncclCommAbort waits for the device. It must not block or throw. Returns what takes it off again.
     */
    public static Runnable beforeAbort(CommGroup g, Runnable signal) { return m(g).beforeAbort(g, signal); }
}
