package dev.gin4j.comm;

import dev.gin4j.internal.comm.Groups;
import dev.gin4j.gpu.Device;
import dev.gin4j.gpu.DeviceBuffer;
import dev.gin4j.gpu.GpuRuntime;
import dev.gin4j.gpu.NativeResource;
import dev.gin4j.gpu.Stream;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.ArrayList;
import java.util.List;

import dev.gin4j.bindings.nccl.ncclConfig_t;
import dev.gin4j.bindings.nccl.ncclUniqueId;

import static dev.gin4j.bindings.nccl.nccl_h.*;

/**
 * The ranks of one NCCL/RCCL communicator that this process drives: all of them when one process
 * drives several local GPUs ({@link #initAll}), or one when each process drives one GPU
 * ({@link #fromEnvironment}). Collective calls on several local ranks are issued inside one
 * NCCL group, so a single thread can drive them all. Host-initiated collectives here are the
 * baseline the GPU-initiated kernels are measured against.
 * <p>Every collective comes in two forms: one buffer and one stream per local rank, in local
 * order (lists, for one process driving several GPUs), and one buffer and one stream (for one
 * process per GPU, a group with one local rank). The second form refuses a group with several
 * local ranks with an {@link IllegalStateException} that names the call.
 */
public final class CommGroup extends NativeResource {
    /** The local ranks' communicators, in local order; filled while the group is made, then never changed. */
    private final List<Communicator> ranks = new ArrayList<>();
    /** Ranks in the whole job. */
    private final int worldSize;
    /** Whether the communicators are in NCCL's nonblocking mode. */
    private final boolean nonblocking;
    /** Set by {@link #abort()}: the close aborts the communicators instead of destroying them. */
    private volatile boolean aborted;
    /** {@link #hostWaitTimeout()} in nanoseconds ({@link Long#MAX_VALUE}: no limit). */
    private volatile long hostWaitNanos;
    /** NCCL state polls against release(): no poll of a freed communicator. */
    private final Object pollLock = new Object();
    /** Run before the communicators are aborted (Groups.beforeAbort): the device communicators' abort words. */
    private final List<Runnable> abortSignals = new java.util.concurrent.CopyOnWriteArrayList<>();
    /** What a single-rank collective's refusal tells a process that drives several local ranks to do instead. */
    private static final String LIST_FORM = "pass one buffer and one stream per local rank in one call (the List form), which NCCL groups";

    static {  // the library's other packages reach the machinery below through Groups, not through the exported class
        Groups.install(new Groups.Machinery() {
            @Override public <T> T failTogether(CommGroup g, String step, java.util.function.Supplier<T> localWork) { return g.failTogether(step, localWork); }
            @Override public void failTogether(CommGroup g, String step, RuntimeException localFailure) { g.failTogether(step, localFailure); }
            @Override public void await(CommGroup g, Stream stream, String what) { g.await(stream, what); }
            @Override public void inGroup(CommGroup g, String what, Runnable body) { g.inGroup(what, body); }
            @Override public void checkLocalIndex(CommGroup g, int localIndex) { g.checkLocalIndex(localIndex); }
            @Override public void requireOneLocalRank(CommGroup g, String call) { g.requireOneLocalRank(call); }
            @Override public void checkStreams(CommGroup g, List<Stream> streams) { g.checkStreams(streams); }
            @Override public Runnable beforeAbort(CommGroup g, Runnable signal) {
                g.abortSignals.add(signal);
                return () -> g.abortSignals.remove(signal);
            }
        });
    }
    /** ncclCommGetAsyncError's result, used under pollLock. */
    private final MemorySegment asyncState = Arena.ofAuto().allocate(ValueLayout.JAVA_INT);

    /**
     * How a group is set up, read before it exists (so bad settings leave nothing behind).
     * {@code hostWaitTimeout}: how long a host wait for the group's work may take
     * ({@link CommGroup#hostWaitTimeout()}). {@code nonblocking}: NCCL's nonblocking mode
     * ({@code ncclConfig_t.blocking = 0}), in which NCCL's collective host calls (the communicator's
     * creation, window registration, device communicators, the HOST exchanges' enqueue, the close's
     * finalize) return at once and are polled, so the same time-out bounds them too: a rank that
     * never makes the matching call ends them with an error instead of a hang. Its price: NCCL
     * starts a thread for every group call, which the HOST exchanges pay on each call (README,
     * "Using it"). GPU-initiated calls make no NCCL host call.
     * @param hostWaitTimeout how long a host wait for the group's work may take before the group is aborted
     * @param nonblocking whether the communicators are made in NCCL's nonblocking mode
     */
    public record Options(java.time.Duration hostWaitTimeout, boolean nonblocking) {
        /**
         * Checks the time-out: positive.
         * @param hostWaitTimeout how long a host wait for the group's work may take
         * @param nonblocking whether the communicators are made in NCCL's nonblocking mode
         * @throws IllegalArgumentException when the time-out is zero or negative
         * @throws NullPointerException when the time-out is null
         */
        public Options {
            requirePositive(hostWaitTimeout);
        }

        /**
         * NCCL's default, blocking mode: its own host calls wait inside NCCL without a time-out.
         * @param hostWaitTimeout how long gin4j's own host waits ({@link CommGroup#hostWaitTimeout()}) may take
         * @return the options
         * @throws IllegalArgumentException when the time-out is zero or negative
         * @throws NullPointerException when the time-out is null
         */
        public static Options blocking(java.time.Duration hostWaitTimeout) { return new Options(hostWaitTimeout, false); }

        /**
         * NCCL's nonblocking mode: its collective host calls are polled and end at {@code hostWaitTimeout} too.
         * @param hostWaitTimeout how long a host wait, gin4j's or a polled NCCL call, may take
         * @return the options
         * @throws IllegalArgumentException when the time-out is zero or negative
         * @throws NullPointerException when the time-out is null
         */
        public static Options nonblocking(java.time.Duration hostWaitTimeout) { return new Options(hostWaitTimeout, true); }

        /**
         * GIN4J_COMM_TIMEOUT_S (seconds, default 300: PyTorch's NCCL default is 600, far beyond any
         * legitimate wait for peers) and GIN4J_COMM_NONBLOCKING (1 or 0; unset: as NCCL_COMM_BLOCKING
         * says, which NCCL obeys over the configuration, else 0).
         * @param env the environment to read ({@link System#getenv()}, or a map in tests)
         * @return the options the environment asks for
         * @throws IllegalArgumentException naming a bad value, or GIN4J_COMM_NONBLOCKING and NCCL_COMM_BLOCKING set apart
         */
        public static Options fromEnvironment(java.util.Map<String, String> env) {
            String mode = env.get("GIN4J_COMM_NONBLOCKING");
            boolean nonblocking = mode != null && !mode.isBlank() ? flag(mode) : "0".equals(trimmed(env.get("NCCL_COMM_BLOCKING")));
            Options o = new Options(java.time.Duration.ofSeconds(timeoutSeconds(env.get("GIN4J_COMM_TIMEOUT_S"))), nonblocking);
            o.checkAgainst(env);
            return o;
        }

        /**
         * Refuses a mode that NCCL_COMM_BLOCKING would overturn: NCCL obeys it over the configuration,
         * so gin4j would either not bound what it promised to or meet ncclInProgress it did not expect.
         * @param env the environment NCCL will read
         * @throws IllegalArgumentException when NCCL_COMM_BLOCKING is set to the other mode, or to neither 0 nor 1
         */
        void checkAgainst(java.util.Map<String, String> env) {
            String nccl = trimmed(env.get("NCCL_COMM_BLOCKING"));
            if (nccl == null || nccl.isEmpty()) return;
            if (nccl.equals(nonblocking ? "1" : "0") || !(nccl.equals("0") || nccl.equals("1")))
                throw new IllegalArgumentException("NCCL_COMM_BLOCKING=" + nccl + " in the environment overrides this group's " + (nonblocking ? "nonblocking" : "blocking")
                        + " mode (GIN4J_COMM_NONBLOCKING, CommGroup.Options): unset it, or ask for the same mode in both");
        }

        /**
         * The value without surrounding blanks.
         * @param v a setting, or null where unset
         * @return {@code v} trimmed, or null
         */
        private static String trimmed(String v) { return v == null ? null : v.trim(); }

        /**
         * GIN4J_COMM_TIMEOUT_S as seconds.
         * @param v its value, or null where unset
         * @return the seconds, 300 where unset or blank
         * @throws IllegalArgumentException for anything but a positive integer
         */
        private static int timeoutSeconds(String v) {
            if (v == null || v.isBlank()) return 300;
            try {
                int s = Integer.parseInt(v.trim());
                if (s > 0) return s;
            } catch (NumberFormatException e) {
                // refused below
            }
            throw new IllegalArgumentException("GIN4J_COMM_TIMEOUT_S must be a positive number of seconds, got '" + v + "'");
        }

        /**
         * GIN4J_COMM_NONBLOCKING as a mode.
         * @param v its value, not null
         * @return whether it asks for the nonblocking mode
         * @throws IllegalArgumentException for anything but 0 or 1
         */
        private static boolean flag(String v) {
            if (v.trim().equals("0")) return false;
            if (v.trim().equals("1")) return true;
            throw new IllegalArgumentException("GIN4J_COMM_NONBLOCKING must be 1 (NCCL's nonblocking mode) or 0, got '" + v + "'");
        }
    }

    /**
     * An empty group, before its communicators are made; logs at DEBUG how they will be made.
     * @param worldSize ranks in the whole job
     * @param options the mode and the host-wait time-out
     */
    private CommGroup(int worldSize, Options options) {
        this.worldSize = worldSize;
        this.nonblocking = options.nonblocking();
        hostWaitTimeout(options.hostWaitTimeout());
        System.getLogger("dev.gin4j").log(System.Logger.Level.DEBUG, () -> "communicators for " + worldSize + " ranks over " + Capabilities.describeLibrary()
                + ", " + (nonblocking ? "nonblocking" : "blocking") + ", host waits end after " + options.hostWaitTimeout());
    }

    /**
     * One process, one rank per device, ranks numbered in list order; options from the environment ({@link Options#fromEnvironment}).
     * @param devices the GPUs, one rank each, each listed once
     * @return the group, driving every rank
     * @throws IllegalArgumentException for an empty list, a device listed twice, or a bad communicator setting in the environment
     * @throws CommException when NCCL cannot make the communicators (the ones it made are aborted)
     */
    public static CommGroup initAll(List<Device> devices) { return initAll(devices, Options.fromEnvironment(System.getenv())); }

    /**
     * One process, one rank per device, ranks numbered in list order ({@code ncclCommInitAll}, or one
     * group of nonblocking inits).
     * @param devices the GPUs, one rank each, each listed once
     * @param options the mode and the host-wait time-out
     * @return the group, driving every rank
     * @throws IllegalArgumentException for an empty list or a device listed twice, or when NCCL_COMM_BLOCKING in the
     *     environment would overturn {@code options}' mode
     * @throws CommException when NCCL cannot make the communicators, or (nonblocking) does not make them within the
     *     host-wait time-out; the ones it made are aborted
     */
    public static CommGroup initAll(List<Device> devices, Options options) {
        if (devices.isEmpty()) throw new IllegalArgumentException("initAll needs at least one device");
        for (int i = 0; i < devices.size(); i++)
            for (int j = 0; j < i; j++)
                if (devices.get(i) == devices.get(j)) throw new IllegalArgumentException(devices.get(i) + " is listed twice: one rank per device");
        options.checkAgainst(System.getenv());
        CommGroup g = new CommGroup(devices.size(), options);
        int n = devices.size();
        String call = "ncclCommInitAll(" + n + " devices)";
        try (Arena a = Arena.ofConfined()) {
            MemorySegment comms = a.allocate(ValueLayout.ADDRESS, n);  // zeroed: NULL where no communicator was made
            int groupEnd = 0;
            try {
                if (!g.nonblocking) {
                    MemorySegment list = a.allocate(ValueLayout.JAVA_INT, n);
                    for (int i = 0; i < n; i++) list.setAtIndex(ValueLayout.JAVA_INT, i, devices.get(i).ordinal());
                    devices.getFirst().makeCurrent();
                    groupEnd = ncclCommInitAll(comms, n, list);  // checked below, as the nonblocking result
                } else {
                    MemorySegment id = a.allocate(ncclUniqueId.layout()), config = g.config(a);
                    Nccl.check("ncclGetUniqueId", ncclGetUniqueId(id), MemorySegment.NULL);
                    Nccl.check("ncclGroupStart", ncclGroupStart(), MemorySegment.NULL);
                    int rc = 0;
                    try {
                        for (int i = 0; i < n && (rc == 0 || rc == ncclInProgress()); i++) {
                            devices.get(i).makeCurrent();
                            rc = ncclCommInitRankConfig(comms.asSlice(8L * i, 8), n, id, i, config);
                        }
                    } finally {
                        groupEnd = ncclGroupEnd();  // also after a failure: an open group would swallow the abort below
                    }
                    if (rc != ncclInProgress()) Nccl.check(call, rc, MemorySegment.NULL);
                }
            } finally {
                for (int i = 0; i < n; i++) {
                    MemorySegment comm = comms.getAtIndex(ValueLayout.ADDRESS, i);
                    if (comm.address() != 0) g.ranks.add(new Communicator(g, comm, devices.get(i), i, g.ranks.size()));
                }
            }
            if (groupEnd != ncclInProgress()) Nccl.check(call, groupEnd, MemorySegment.NULL);  // NCCL's own error first
            if (g.ranks.size() != n) throw new CommException(call + " made " + g.ranks.size() + " of " + n + " communicators");
            g.complete(call, groupEnd);  // nonblocking: polled until every communicator is made, or the time-out
        } catch (RuntimeException e) {
            throw g.abortedBecause(e);  // a communicator whose creation failed or is still running must be aborted, not destroyed
        }
        return g;
    }

    /**
     * One rank per process, from RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT; the device is
     * LOCAL_RANK; options from the environment too ({@link Options#fromEnvironment}).
     * @return the group, driving this process's one rank
     * @throws IllegalArgumentException naming a rendezvous or communicator variable that is missing or wrong, or a
     *     LOCAL_RANK past the GPUs this process sees
     * @throws dev.gin4j.gpu.GpuException when no GPU runtime is found
     * @throws CommException when the rendezvous or NCCL fails (a communicator it made is aborted)
     */
    public static CommGroup fromEnvironment() { return fromEnvironment(Options.fromEnvironment(System.getenv())); }

    /**
     * One rank per process, from RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT; the device is LOCAL_RANK.
     * @param options the mode and the host-wait time-out
     * @return the group, driving this process's one rank
     * @throws IllegalArgumentException naming a rendezvous variable that is missing or wrong, a LOCAL_RANK past the
     *     GPUs this process sees, or NCCL_COMM_BLOCKING overturning {@code options}' mode
     * @throws dev.gin4j.gpu.GpuException when no GPU runtime is found
     * @throws CommException when the rendezvous or NCCL fails (a communicator it made is aborted)
     */
    public static CommGroup fromEnvironment(Options options) {
        Rendezvous r = Rendezvous.fromEnvironment();
        List<Device> visible = GpuRuntime.get().devices();
        if (r.localRank() >= visible.size())
            throw new IllegalArgumentException("LOCAL_RANK " + r.localRank() + " names the GPU this process drives, but it sees " + visible.size()
                    + " GPU(s) (CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES limit them)");
        return initRank(visible.get(r.localRank()), r, options);
    }

    /**
     * One rank per process: rank 0 makes the unique id, the rendezvous hands it to the others; options from the environment.
     * @param device the GPU this process's rank runs on
     * @param rendezvous this rank, the world size and where rank 0 hands out the unique id
     * @return the group, driving this process's one rank
     * @throws IllegalArgumentException for a bad communicator setting in the environment
     * @throws CommException when the rendezvous or NCCL fails (a communicator it made is aborted)
     */
    public static CommGroup initRank(Device device, Rendezvous rendezvous) { return initRank(device, rendezvous, Options.fromEnvironment(System.getenv())); }

    /**
     * One rank per process: rank 0 makes the unique id, the rendezvous hands it to the others.
     * @param device the GPU this process's rank runs on
     * @param rendezvous this rank, the world size and where rank 0 hands out the unique id
     * @param options the mode and the host-wait time-out
     * @return the group, driving this process's one rank
     * @throws IllegalArgumentException when NCCL_COMM_BLOCKING in the environment would overturn {@code options}' mode
     * @throws CommException when the rendezvous or NCCL fails, or (nonblocking) the peers do not join within the
     *     host-wait time-out; a communicator it made is aborted
     */
    public static CommGroup initRank(Device device, Rendezvous rendezvous, Options options) {
        options.checkAgainst(System.getenv());
        CommGroup g = new CommGroup(rendezvous.worldSize(), options);
        String call = "ncclCommInitRank(rank " + rendezvous.rank() + " of " + rendezvous.worldSize() + ")";
        try (Arena a = Arena.ofConfined()) {
            MemorySegment id = a.allocate(ncclUniqueId.layout());
            if (rendezvous.rank() == 0) Nccl.check("ncclGetUniqueId", ncclGetUniqueId(id), MemorySegment.NULL);
            byte[] bytes = rendezvous.exchange(id.toArray(ValueLayout.JAVA_BYTE));
            if (bytes.length != id.byteSize()) throw new CommException("unique id from rank 0 has " + bytes.length + " bytes, expected " + id.byteSize());
            MemorySegment.copy(bytes, 0, id, ValueLayout.JAVA_BYTE, 0, bytes.length);
            MemorySegment comm = a.allocate(ValueLayout.ADDRESS);
            device.makeCurrent();
            int rc = g.nonblocking ? ncclCommInitRankConfig(comm, rendezvous.worldSize(), id, rendezvous.rank(), g.config(a))
                                   : ncclCommInitRank(comm, rendezvous.worldSize(), id, rendezvous.rank());
            if (comm.get(ValueLayout.ADDRESS, 0).address() != 0) g.ranks.add(new Communicator(g, comm.get(ValueLayout.ADDRESS, 0), device, rendezvous.rank(), 0));
            if (rc != ncclInProgress()) Nccl.check(call, rc, MemorySegment.NULL);
            if (g.ranks.isEmpty()) throw new CommException(call + " returned no communicator");
            g.complete(call, rc);  // nonblocking: until every peer has joined, or the time-out
        } catch (RuntimeException e) {
            throw g.abortedBecause(e);  // a communicator whose creation failed or is still running must be aborted, not destroyed
        }
        return g;
    }

    /**
     * A nonblocking ncclConfig_t: as NCCL_CONFIG_INITIALIZER makes it (every other attribute NCCL's default), blocking = 0.
     * @param a where the struct lives
     * @return the struct
     */
    private MemorySegment config(Arena a) {
        MemorySegment c = ncclConfig_t.allocate(a);
        ncclConfig_t.size(c, ncclConfig_t.sizeof());
        ncclConfig_t.magic(c, NCCL_API_MAGIC());
        ncclConfig_t.version(c, NCCL_VERSION_CODE());
        for (String f : new String[] {"blocking", "cgaClusterSize", "minCTAs", "maxCTAs", "splitShare", "trafficClass", "collnetEnable", "CTAPolicy",
                "shrinkShare", "nvlsCTAs", "nChannelsPerNetPeer", "nvlinkCentricSched", "graphUsageMode", "numRmaCtx"}) {
            long offset = ncclConfig_t.layout().byteOffset(java.lang.foreign.MemoryLayout.PathElement.groupElement(f));
            c.set(ValueLayout.JAVA_INT, offset, NCCL_CONFIG_UNDEF_INT());
        }  // the two pointers (netName, commName) stay NULL, NCCL_CONFIG_UNDEF_PTR
        ncclConfig_t.blocking(c, 0);
        return c;
    }

    /**
     * Ranks in the whole job.
     * @return the world size
     */
    public int worldSize() { return worldSize; }
    /**
     * Whether the communicators are in NCCL's nonblocking mode ({@link Options#nonblocking}).
     * @return true for the nonblocking mode
     */
    public boolean isNonblocking() { return nonblocking; }
    /**
     * The ranks this process drives, in local order.
     * @return a copy of the list, one communicator per local rank
     */
    public List<Communicator> ranks() { return List.copyOf(ranks); }
    /**
     * The communicator of local rank {@code localIndex}.
     * @param localIndex the index among the ranks this process drives, from 0
     * @return that rank's communicator
     * @throws IndexOutOfBoundsException for an index this process does not drive
     */
    public Communicator rank(int localIndex) {
        checkLocalIndex(localIndex);
        return ranks.get(localIndex);
    }

    /**
     * Refuses an index that is not one of this process's ranks, naming how many it drives.
     * @param localIndex the index to check
     * @throws IndexOutOfBoundsException for an index outside [0, {@link #localCount()})
     */
    void checkLocalIndex(int localIndex) {
        if (localIndex < 0 || localIndex >= ranks.size())
            throw new IndexOutOfBoundsException("local rank index " + localIndex + " is outside [0, " + ranks.size() + "): this process drives " + ranks.size() + " rank(s)");
    }

    /**
     * Refuses a single-rank call ({@code call}, the form for one process per GPU) where this
     * process drives several local ranks.
     * @param call the call as its user wrote it, for the message
     * @throws IllegalStateException naming the call and how many ranks this process drives
     */
    void requireOneLocalRank(String call) { requireOneLocalRank(call, "pass one per local rank (the List form) or a local rank index"); }

    /**
     * {@link #requireOneLocalRank(String)}, with what to do instead.
     * @param call the call as its user wrote it, for the message
     * @param instead what the message tells a process with several local ranks to do
     * @throws IllegalStateException naming the call and how many ranks this process drives
     */
    private void requireOneLocalRank(String call, String instead) {
        if (ranks.size() != 1)
            throw new IllegalStateException(call + " is for one process per GPU (one local rank), but this process drives " + ranks.size()
                    + " local ranks of " + worldSize + ": " + instead);
    }

    /**
     * One stream per local rank, in local order, each on its rank's device.
     * @param streams the streams to check
     * @throws IllegalArgumentException for a list of another length, or a stream on another rank's device
     */
    void checkStreams(List<Stream> streams) {
        checkPerRank(streams, "streams");
        for (int i = 0; i < streams.size(); i++)
            if (streams.get(i).device() != ranks.get(i).device())
                throw new IllegalArgumentException("stream " + i + " is on " + streams.get(i).device() + ", local rank " + i + " (" + ranks.get(i) + ") on " + ranks.get(i).device());
    }
    /**
     * Ranks this process drives (one per GPU it uses).
     * @return the number of local ranks
     */
    public int localCount() { return ranks.size(); }
    /**
     * Whether this process drives every rank.
     * @return true when the local ranks are the whole job
     */
    public boolean isSingleProcess() { return ranks.size() == worldSize; }

    /**
     * Runs {@code body} inside ncclGroupStart/ncclGroupEnd (needed when one thread drives several
     * ranks) and returns once NCCL has done the group's host part: for a nonblocking group that is
     * polled, within the host-wait time-out (then the group is aborted). {@code what} names the calls
     * in errors.
     * @param what the calls, for messages
     * @param body queues the calls of every local rank
     * @throws CommException when NCCL refuses the group or does not finish its host part (the group is aborted
     *     where a peer, the network or NCCL failed); whatever {@code body} threw, with NCCL's error attached
     */
    void inGroup(String what, Runnable body) {
        Nccl.check("ncclGroupStart", ncclGroupStart(), MemorySegment.NULL);
        RuntimeException failure = null;
        try {
            body.run();
        } catch (RuntimeException e) {
            failure = e;
        }
        int rc = ncclGroupEnd();
        if (failure != null) {
            if (rc == ncclInProgress()) {
                try {
                    complete(what, rc);  // what was queued before the failure must finish before the group is used again
                } catch (RuntimeException e) {
                    failure.addSuppressed(e);
                }
            } else if (rc != 0) {
                failure.addSuppressed(Nccl.error("ncclGroupEnd", rc, MemorySegment.NULL));
            }
            boolean broken = rc != ncclInProgress() && Nccl.leavesCommunicatorBroken(rc)
                    || failure instanceof CommException ce && Nccl.leavesCommunicatorBroken(ce.code());
            throw broken ? abortedBecause(failure) : failure;
        }
        complete(what, rc);
    }

    /**
     * Finishes an NCCL call that returned {@code rc}. {@code ncclInProgress} (a nonblocking group: NCCL
     * goes on on its own thread) is polled on every local communicator until none is in progress; an
     * error then, or no end within the host-wait time-out (a rank that never made the matching
     * call), aborts the group and throws. Any other non-zero {@code rc} throws, and aborts the group
     * too where it says that a peer, the network or NCCL failed ({@link Nccl#leavesCommunicatorBroken}).
     * @param call the NCCL call, for messages
     * @param rc what it returned
     * @throws CommException for an error, or no end within the host-wait time-out
     */
    void complete(String call, int rc) {
        if (rc != ncclInProgress()) {
            if (rc == 0) return;
            CommException e = Nccl.error(call, rc, ranks.isEmpty() ? MemorySegment.NULL : ranks.getFirst().handleUnchecked());
            // a peer or the network failed, or NCCL itself: the communicators cannot be used again (a
            // refused argument or usage leaves them as they were)
            if (!Nccl.leavesCommunicatorBroken(rc)) throw e;
            throw abortedBecause(new CommException(e.getMessage() + "; " + describe() + " was aborted", e));
        }
        String failure = pollToEnd(() -> {
            if (isClosed()) throw new CommException(call + ": " + describe() + " was closed or aborted before NCCL was done");
            return null;
        }, "did every rank make the same call?");
        if (failure != null) throw abortedBecause(new CommException(call + ": " + failure + "; " + describe() + " was aborted"));
    }

    /**
     * Polls every local communicator until none is in progress, under pollLock (release() takes it
     * too: a communicator is never polled after it was freed): null once all are done, else why
     * not: what {@code stop} says (checked each round; it may throw instead), an NCCL error, or the
     * host-wait time-out ({@code hint} says what may have caused it).
     * @param stop asked each round: why to stop polling, or null to go on
     * @param hint what a time-out may mean, for its message
     * @return null once every local communicator is done, else why not
     */
    private String pollToEnd(java.util.function.Supplier<String> stop, String hint) {
        long start = System.nanoTime();
        for (int polls = 0; ; polls++) {
            String failure;
            synchronized (pollLock) {
                String stopped = stop.get();
                if (stopped != null) return stopped;
                failure = pollStates(true);
            }
            if (failure == null) return null;
            if (!failure.isEmpty()) return "NCCL reported " + failure;
            if (System.nanoTime() - start > hostWaitNanos) return "NCCL was " + notDoneInTime() + ": " + hint;
            pause(polls);
        }
    }

    /**
     * "not done after T s (the knobs that set T)", for time-out messages.
     * @return the phrase
     */
    private String notDoneInTime() {
        return "not done after " + hostWaitNanos / 1e9 + " s (GIN4J_COMM_TIMEOUT_S, CommGroup.Options, CommGroup.hostWaitTimeout)";
    }

    /**
     * Between polls: spin for the first ~2,000 (host work of microseconds to milliseconds, as a synchronize would), then park 20 µs.
     * @param polls how many polls were made so far
     */
    private static void pause(int polls) {
        if (polls < 2000) Thread.onSpinWait();
        else java.util.concurrent.locks.LockSupport.parkNanos(20_000);
    }

    /**
     * Every local communicator's ncclCommGetAsyncError, under pollLock and not freed yet: null when
     * all are done, an error description, or "" while one is in progress and {@code waitForProgress}.
     * @param waitForProgress whether a communicator still in progress counts as not done
     * @return null, an error description, or ""
     * @throws CommException when NCCL cannot be asked
     */
    private String pollStates(boolean waitForProgress) {
        boolean busy = false;
        for (Communicator c : ranks) {
            MemorySegment h = c.handleUnchecked();
            Nccl.check("ncclCommGetAsyncError", ncclCommGetAsyncError(h, asyncState), h);
            int rc = asyncState.get(ValueLayout.JAVA_INT, 0);
            if (rc == ncclInProgress()) busy = true;
            else if (rc != 0) return Nccl.error("an operation of " + c, rc, h).getMessage();
        }
        return busy && waitForProgress ? "" : null;
    }

    /**
     * Refuses a list that does not hold one element per local rank.
     * @param <T> what the list holds
     * @param list the list to check
     * @param what what it holds, for the message
     * @throws IllegalArgumentException for a list of another length
     */
    private <T> void checkPerRank(List<T> list, String what) {
        if (list.size() != ranks.size()) throw new IllegalArgumentException(what + ": one per local rank expected (" + ranks.size() + "), got " + list.size());
    }

    /**
     * Refuses a buffer that is not on its rank's device.
     * @param c the rank
     * @param b its buffer
     * @param what which buffer, for the message
     * @throws IllegalArgumentException for a buffer on another device
     */
    private void checkOn(Communicator c, DeviceBuffer b, String what) {
        if (b.device() != c.device()) throw new IllegalArgumentException(what + " for " + c + " is on " + b.device());
    }

    /**
     * Every local rank's buffers and stream, before any NCCL call is queued: a refusal inside the
     * group would leave the ranks queued before it waiting for the one that never joined.
     * @param send one send buffer per local rank
     * @param recv one receive buffer per local rank
     * @param streams one stream per local rank
     * @param sendBytes the least size of every send buffer
     * @param recvBytes the least size of every receive buffer
     * @param what the collective, for messages
     * @throws IllegalArgumentException for lists of another length, a buffer or stream on another device, or a buffer too small
     * @throws IllegalStateException for a closed stream or a freed buffer
     */
    private void checkEveryRank(List<DeviceBuffer> send, List<DeviceBuffer> recv, List<Stream> streams, long sendBytes, long recvBytes, String what) {
        checkPerRank(send, "send buffers"); checkPerRank(recv, "receive buffers"); checkStreams(streams);
        for (int i = 0; i < ranks.size(); i++) {
            Communicator c = ranks.get(i);
            checkOn(c, send.get(i), "send buffer"); checkOn(c, recv.get(i), "receive buffer");
            // a closed stream or a freed buffer throws here, not inside the group after other ranks' calls were queued
            streams.get(i).handle(); send.get(i).address(); recv.get(i).address();
            streams.get(i).noteUse(this); streams.get(i).noteUse(send.get(i)); streams.get(i).noteUse(recv.get(i));  // for a graph captured from it
            if (send.get(i).byteSize() < sendBytes || recv.get(i).byteSize() < recvBytes)
                throw new IllegalArgumentException(what + " needs send >= " + sendBytes + " and receive >= " + recvBytes + " bytes; " + c + " has send "
                        + send.get(i).byteSize() + " and receive " + recv.get(i).byteSize());
        }
    }

    /**
     * {@code perRank * ranks}, checked.
     * @param perRank a size per rank
     * @param ranks how many
     * @param what the size, for messages
     * @return the product
     * @throws IllegalArgumentException for a negative size, or a product that does not fit a long
     */
    private long total(long perRank, long ranks, String what) {
        if (perRank < 0) throw new IllegalArgumentException(what + " must be >= 0, got " + perRank);
        try {
            return Math.multiplyExact(perRank, ranks);
        } catch (ArithmeticException e) {
            throw new IllegalArgumentException(what + " = " + perRank + " over " + ranks + " ranks does not fit a 64-bit size");
        }
    }

    /**
     * Host-initiated uniform all-to-all of {@code bytesPerPeer} bytes per peer: {@code ncclAlltoAll}
     * where the library has it, else grouped ncclSend/ncclRecv. Rank r's send buffer holds the block
     * for rank p at {@code p * bytesPerPeer}; afterwards its receive buffer holds the block from
     * rank s at {@code s * bytesPerPeer}. Queued on the streams: it returns before the data moved.
     * @param send one send buffer per local rank, in local order, each on its rank's device and
     *     holding at least {@code worldSize * bytesPerPeer} bytes
     * @param recv one receive buffer per local rank, as large
     * @param bytesPerPeer bytes each rank sends to each rank, {@code >= 0}
     * @param streams one stream per local rank, each on its rank's device
     * @throws IllegalArgumentException for lists of another length, a buffer or stream on another rank's
     *     device, a buffer too small, or a negative or too large size
     * @throws IllegalStateException for a closed group, stream or buffer
     * @throws CommException when NCCL refuses the calls (the group is aborted where a peer, the network or NCCL failed)
     */
    public void allToAll(List<DeviceBuffer> send, List<DeviceBuffer> recv, long bytesPerPeer, List<Stream> streams) {
        long need = total(bytesPerPeer, worldSize, "bytes per peer");
        checkEveryRank(send, recv, streams, need, need, "all-to-all of " + bytesPerPeer + " bytes per peer over " + worldSize + " ranks");
        boolean native_ = hasAlltoAll();
        inGroup(native_ ? "a HOST all-to-all (ncclAlltoAll)" : "a HOST all-to-all (ncclSend/ncclRecv)", () -> {  // constants: no text built per call
            for (int i = 0; i < ranks.size(); i++) {
                Communicator c = ranks.get(i);
                long s = send.get(i).address(), r = recv.get(i).address(), st = streams.get(i).handle();
                if (native_) {
                    Nccl.check("ncclAlltoAll", ncclAlltoAll(MemorySegment.ofAddress(s), MemorySegment.ofAddress(r), bytesPerPeer, ncclUint8(), c.handle(), MemorySegment.ofAddress(st)), c.handle());
                } else {
                    for (int p = 0; p < worldSize; p++) {
                        sendRecv(c, s + p * bytesPerPeer, bytesPerPeer, r + p * bytesPerPeer, bytesPerPeer, p, st);
                    }
                }
            }
        });
    }

    /**
     * One process per GPU (a group with one local rank): {@link #allToAll(List, List, long, List)}
     * of its buffers on its stream.
     * @param send this rank's send buffer, holding at least {@code worldSize * bytesPerPeer} bytes
     * @param recv this rank's receive buffer, as large
     * @param bytesPerPeer bytes each rank sends to each rank, {@code >= 0}
     * @param stream this rank's stream, on its device
     * @throws IllegalStateException when this process drives several local ranks (use the List form),
     *     or for a closed group, stream or buffer
     * @throws NullPointerException for a null buffer or stream
     * @throws IllegalArgumentException for a buffer or stream on another device, a buffer too small, or a bad size
     * @throws CommException when NCCL refuses the call (the group is aborted where a peer, the network or NCCL failed)
     */
    public void allToAll(DeviceBuffer send, DeviceBuffer recv, long bytesPerPeer, Stream stream) {
        requireOneLocalRank("allToAll(send, recv, bytesPerPeer, stream)", LIST_FORM);
        allToAll(one(send, "the send buffer"), one(recv, "the receive buffer"), bytesPerPeer, one(stream, "the stream"));
    }

    /**
     * The one-element list of a single-rank call's argument.
     * @param <T> the argument's type
     * @param x the argument
     * @param what which argument, for the message
     * @return a list of {@code x}
     * @throws NullPointerException naming the argument when it is null
     */
    private static <T> List<T> one(T x, String what) {
        return List.of(java.util.Objects.requireNonNull(x, () -> what + " must not be null"));
    }

    /** Whether the loaded library exports ncclAlltoAll; null until asked. */
    private static Boolean alltoAllPresent;

    /**
     * Whether the loaded library exports ncclAlltoAll (NCCL 2.28+).
     * @return true where it does
     */
    static boolean hasAlltoAll() {
        Boolean b = alltoAllPresent;
        if (b == null) alltoAllPresent = b = dev.gin4j.bindings.NativeLibrary.NCCL.find("ncclAlltoAll").isPresent();
        return b;
    }

    /**
     * Queues one rank's ncclSend and ncclRecv with one peer (a zero count queues nothing), inside the caller's group.
     * @param c the rank
     * @param send the address of the bytes to send
     * @param sendBytes how many
     * @param recv the address to receive into
     * @param recvBytes how many
     * @param peer the other rank
     * @param stream the stream's handle
     * @throws CommException when NCCL refuses a call
     */
    private static void sendRecv(Communicator c, long send, long sendBytes, long recv, long recvBytes, int peer, long stream) {
        MemorySegment st = MemorySegment.ofAddress(stream);
        if (sendBytes > 0) Nccl.check("ncclSend(to " + peer + ")", ncclSend(MemorySegment.ofAddress(send), sendBytes, ncclUint8(), peer, c.handle(), st), c.handle());
        if (recvBytes > 0) Nccl.check("ncclRecv(from " + peer + ")", ncclRecv(MemorySegment.ofAddress(recv), recvBytes, ncclUint8(), peer, c.handle(), st), c.handle());
    }

    /**
     * Host-initiated all-to-all-v by grouped ncclSend/ncclRecv with host-side byte counts and
     * offsets (what PyTorch's all_to_all_single does). Arrays are indexed [localRank][peer]: local
     * rank i sends {@code sendCounts[i][p]} bytes from {@code sendOffsets[i][p]} of its send buffer
     * to rank p, and receives {@code recvCounts[i][p]} bytes from rank p at {@code recvOffsets[i][p]};
     * every count must match the count its peer sends or receives. Queued on the streams.
     * @param send one send buffer per local rank, in local order, each on its rank's device
     * @param sendCounts bytes to each peer, one row of {@code worldSize} per local rank
     * @param sendOffsets where in the send buffer each peer's bytes start, as the counts
     * @param recv one receive buffer per local rank
     * @param recvCounts bytes from each peer, one row of {@code worldSize} per local rank
     * @param recvOffsets where in the receive buffer each peer's bytes go, as the counts
     * @param streams one stream per local rank, each on its rank's device
     * @throws IllegalArgumentException for lists or arrays of another length, a buffer or stream on another rank's
     *     device, or a negative count or offset or a range past its buffer's end
     * @throws IllegalStateException for a closed group, stream or buffer
     * @throws CommException when NCCL refuses the calls (the group is aborted where a peer, the network or NCCL failed)
     */
    public void allToAllV(List<DeviceBuffer> send, long[][] sendCounts, long[][] sendOffsets,
                          List<DeviceBuffer> recv, long[][] recvCounts, long[][] recvOffsets, List<Stream> streams) {
        checkEveryRank(send, recv, streams, 0, 0, "all-to-all-v");
        checkRows(sendCounts, "send counts"); checkRows(sendOffsets, "send offsets");
        checkRows(recvCounts, "receive counts"); checkRows(recvOffsets, "receive offsets");
        for (int i = 0; i < ranks.size(); i++) {
            Communicator c = ranks.get(i);
            checkCounts(c, sendCounts[i], sendOffsets[i], send.get(i).byteSize(), "send");
            checkCounts(c, recvCounts[i], recvOffsets[i], recv.get(i).byteSize(), "receive");
        }
        inGroup("a HOST all-to-all-v (ncclSend/ncclRecv)", () -> {
            for (int i = 0; i < ranks.size(); i++) {
                Communicator c = ranks.get(i);
                long s = send.get(i).address(), r = recv.get(i).address(), st = streams.get(i).handle();
                for (int p = 0; p < worldSize; p++) {
                    sendRecv(c, s + sendOffsets[i][p], sendCounts[i][p], r + recvOffsets[i][p], recvCounts[i][p], p, st);
                }
            }
        });
    }

    /**
     * One process per GPU (a group with one local rank): {@link #allToAllV(List, long[][], long[][], List, long[][], long[][], List)}
     * of its buffers, counts and offsets (indexed by peer) on its stream.
     * @param send this rank's send buffer
     * @param sendCounts bytes to each peer, {@code worldSize} of them
     * @param sendOffsets where in the send buffer each peer's bytes start
     * @param recv this rank's receive buffer
     * @param recvCounts bytes from each peer, {@code worldSize} of them
     * @param recvOffsets where in the receive buffer each peer's bytes go
     * @param stream this rank's stream, on its device
     * @throws IllegalStateException when this process drives several local ranks (use the List form),
     *     or for a closed group, stream or buffer
     * @throws NullPointerException for a null buffer, array or stream
     * @throws IllegalArgumentException for arrays of another length, a buffer or stream on another device,
     *     or a negative count or offset or a range past its buffer's end
     * @throws CommException when NCCL refuses the calls (the group is aborted where a peer, the network or NCCL failed)
     */
    public void allToAllV(DeviceBuffer send, long[] sendCounts, long[] sendOffsets,
                          DeviceBuffer recv, long[] recvCounts, long[] recvOffsets, Stream stream) {
        requireOneLocalRank("allToAllV(send, sendCounts, sendOffsets, recv, recvCounts, recvOffsets, stream)", LIST_FORM);
        allToAllV(one(send, "the send buffer"), row(sendCounts, "the send counts"), row(sendOffsets, "the send offsets"),
                one(recv, "the receive buffer"), row(recvCounts, "the receive counts"), row(recvOffsets, "the receive offsets"), one(stream, "the stream"));
    }

    /**
     * The one-row table of a single-rank call's counts or offsets.
     * @param values the row
     * @param what which array, for the message
     * @return a table of that one row
     * @throws NullPointerException naming the array when it is null
     */
    private static long[][] row(long[] values, String what) {
        return new long[][] {java.util.Objects.requireNonNull(values, () -> what + " must not be null")};
    }

    /**
     * Refuses a table of counts or offsets without one row per local rank.
     * @param table the table, [localRank][peer]
     * @param what which table, for the message
     * @throws IllegalArgumentException for a table of another length or a missing row
     */
    private void checkRows(long[][] table, String what) {
        if (table == null || table.length != ranks.size())
            throw new IllegalArgumentException(what + ": one row per local rank expected (" + ranks.size() + "), got " + (table == null ? "null" : table.length));
        for (int i = 0; i < table.length; i++)
            if (table[i] == null) throw new IllegalArgumentException(what + ": the row of local rank " + i + " is null");
    }

    /**
     * Refuses counts and offsets that do not fit one rank's buffer.
     * @param c the rank
     * @param counts bytes per peer
     * @param offsets where each peer's bytes lie
     * @param size the buffer's size
     * @param what "send" or "receive", for messages
     * @throws IllegalArgumentException for arrays of another length than the world size, a negative entry or a range past the end
     */
    private void checkCounts(Communicator c, long[] counts, long[] offsets, long size, String what) {
        if (counts.length != worldSize || offsets.length != worldSize)
            throw new IllegalArgumentException(what + " counts/offsets for " + c + " need " + worldSize + " entries, got " + counts.length + "/" + offsets.length);
        for (int p = 0; p < worldSize; p++) {
            if (counts[p] < 0 || offsets[p] < 0) throw new IllegalArgumentException(what + " count/offset for peer " + p + " on " + c + " is negative: " + counts[p] + "/" + offsets[p]);
            if (counts[p] > size || offsets[p] > size - counts[p])  // not offset + count: that may overflow
                throw new IllegalArgumentException(what + " range for peer " + p + " on " + c + " is " + counts[p] + " bytes at offset " + offsets[p] + " but the buffer has " + size + " bytes");
        }
    }

    /**
     * Host-initiated all-gather of {@code bytes} per rank from send into recv: afterwards every
     * receive buffer holds rank r's bytes at {@code r * bytes}. Queued on the streams.
     * @param send one send buffer per local rank, in local order, each on its rank's device, at least {@code bytes} large
     * @param recv one receive buffer per local rank, at least {@code worldSize * bytes} large
     * @param bytes bytes each rank gives, {@code >= 0}
     * @param streams one stream per local rank, each on its rank's device
     * @throws IllegalArgumentException for lists of another length, a buffer or stream on another rank's
     *     device, a buffer too small, or a negative or too large size
     * @throws IllegalStateException for a closed group, stream or buffer
     * @throws CommException when NCCL refuses the calls (the group is aborted where a peer, the network or NCCL failed)
     */
    public void allGather(List<DeviceBuffer> send, List<DeviceBuffer> recv, long bytes, List<Stream> streams) {
        checkEveryRank(send, recv, streams, bytes, total(bytes, worldSize, "all-gather bytes"), "all-gather of " + bytes + " bytes per rank");
        inGroup("ncclAllGather", () -> {
            for (int i = 0; i < ranks.size(); i++) {
                Communicator c = ranks.get(i);
                Nccl.check("ncclAllGather", ncclAllGather(MemorySegment.ofAddress(send.get(i).address()), MemorySegment.ofAddress(recv.get(i).address()),
                        bytes, ncclUint8(), c.handle(), MemorySegment.ofAddress(streams.get(i).handle())), c.handle());
            }
        });
    }

    /**
     * One process per GPU (a group with one local rank): {@link #allGather(List, List, long, List)}
     * of its buffers on its stream.
     * @param send this rank's send buffer, at least {@code bytes} large
     * @param recv this rank's receive buffer, at least {@code worldSize * bytes} large
     * @param bytes bytes each rank gives, {@code >= 0}
     * @param stream this rank's stream, on its device
     * @throws IllegalStateException when this process drives several local ranks (use the List form),
     *     or for a closed group, stream or buffer
     * @throws NullPointerException for a null buffer or stream
     * @throws IllegalArgumentException for a buffer or stream on another device, a buffer too small, or a bad size
     * @throws CommException when NCCL refuses the call (the group is aborted where a peer, the network or NCCL failed)
     */
    public void allGather(DeviceBuffer send, DeviceBuffer recv, long bytes, Stream stream) {
        requireOneLocalRank("allGather(send, recv, bytes, stream)", LIST_FORM);
        allGather(one(send, "the send buffer"), one(recv, "the receive buffer"), bytes, one(stream, "the stream"));
    }

    /**
     * Host-initiated sum all-reduce of {@code count} floats, in place allowed: afterwards every
     * receive buffer holds the element-wise sum of every rank's send buffer. Queued on the streams.
     * @param send one send buffer per local rank, in local order, each on its rank's device, at least {@code 4 * count} bytes
     * @param recv one receive buffer per local rank, as large (the send buffer itself for in place)
     * @param count floats per rank, {@code >= 0}
     * @param streams one stream per local rank, each on its rank's device
     * @throws IllegalArgumentException for lists of another length, a buffer or stream on another rank's
     *     device, a buffer too small, or a negative or too large count
     * @throws IllegalStateException for a closed group, stream or buffer
     * @throws CommException when NCCL refuses the calls (the group is aborted where a peer, the network or NCCL failed)
     */
    public void allReduceSumFloat(List<DeviceBuffer> send, List<DeviceBuffer> recv, long count, List<Stream> streams) {
        long bytes = total(count, 4, "float count");
        checkEveryRank(send, recv, streams, bytes, bytes, "all-reduce of " + count + " floats");
        inGroup("ncclAllReduce", () -> {
            for (int i = 0; i < ranks.size(); i++) {
                Communicator c = ranks.get(i);
                Nccl.check("ncclAllReduce", ncclAllReduce(MemorySegment.ofAddress(send.get(i).address()), MemorySegment.ofAddress(recv.get(i).address()),
                        count, ncclFloat32(), ncclSum(), c.handle(), MemorySegment.ofAddress(streams.get(i).handle())), c.handle());
            }
        });
    }

    /**
     * One process per GPU (a group with one local rank): {@link #allReduceSumFloat(List, List, long, List)}
     * of its buffers on its stream.
     * @param send this rank's send buffer, at least {@code 4 * count} bytes
     * @param recv this rank's receive buffer, as large ({@code send} itself for in place)
     * @param count floats per rank, {@code >= 0}
     * @param stream this rank's stream, on its device
     * @throws IllegalStateException when this process drives several local ranks (use the List form),
     *     or for a closed group, stream or buffer
     * @throws NullPointerException for a null buffer or stream
     * @throws IllegalArgumentException for a buffer or stream on another device, a buffer too small, or a bad count
     * @throws CommException when NCCL refuses the call (the group is aborted where a peer, the network or NCCL failed)
     */
    public void allReduceSumFloat(DeviceBuffer send, DeviceBuffer recv, long count, Stream stream) {
        requireOneLocalRank("allReduceSumFloat(send, recv, count, stream)", LIST_FORM);
        allReduceSumFloat(one(send, "the send buffer"), one(recv, "the receive buffer"), count, one(stream, "the stream"));
    }

    /**
     * Gathers one long from every local rank across all ranks (a small all-gather plus a
     * synchronous read): result[localIndex][rank]. Used to check that collective setup
     * parameters agree before registering windows.
     * @param valuePerLocalRank one value per local rank, in local order
     * @return every rank's value, once per local rank: result[localIndex][rank]
     * @throws IllegalArgumentException for an array of another length than {@link #localCount()}
     * @throws CommException when the all-gather fails, or does not end within the host-wait time-out (the group is then aborted)
     */
    public long[][] allGatherLongs(long[] valuePerLocalRank) {
        long[][] one = new long[valuePerLocalRank.length][];
        for (int i = 0; i < one.length; i++) one[i] = new long[] {valuePerLocalRank[i]};
        return allGatherLongs(one);
    }

    /**
     * One process per GPU (a group with one local rank): {@link #allGatherLongs(long[])} of its value.
     * @param value this rank's value
     * @return every rank's value, by rank
     * @throws IllegalStateException when this process drives several local ranks (use the array form)
     * @throws CommException when the all-gather fails, or does not end within the host-wait time-out (the group is then aborted)
     */
    public long[] allGatherLongs(long value) {
        requireOneLocalRank("allGatherLongs(value)", "pass one value per local rank (allGatherLongs(long[]))");
        return allGatherLongs(new long[] {value})[0];
    }

    /**
     * Gathers n longs from every local rank across all ranks in one all-gather:
     * result[localIndex][rank * n + j] is value j of that rank. Every rank gives the same n.
     * @param valuesPerLocalRank one array of n values per local rank, in local order
     * @return every rank's values, once per local rank: result[localIndex][rank * n + j]
     * @throws IllegalArgumentException for another number of arrays than {@link #localCount()}, or arrays empty or of different lengths
     * @throws CommException when the all-gather fails, or does not end within the host-wait time-out (the group is then aborted)
     */
    public long[][] allGatherLongs(long[][] valuesPerLocalRank) {
        if (valuesPerLocalRank.length != ranks.size())
            throw new IllegalArgumentException("one array of values per local rank expected: got " + valuesPerLocalRank.length + " for " + ranks.size() + " local rank(s)");
        int n = valuesPerLocalRank[0].length;
        for (long[] v : valuesPerLocalRank)
            if (v.length != n || n == 0) throw new IllegalArgumentException("every local rank must give the same number (> 0) of longs: got " + v.length + " and " + n);
        long bytes = 8L * n;
        try (Arena a = Arena.ofConfined()) {
            List<DeviceBuffer> send = new ArrayList<>(), recv = new ArrayList<>();
            List<Stream> streams = new ArrayList<>();
            try {
                for (int i = 0; i < ranks.size(); i++) {
                    Device d = ranks.get(i).device();
                    DeviceBuffer s = d.allocate(bytes, a), r = d.allocate(bytes * worldSize, a);
                    streams.add(d.createStream());
                    s.copyFromHost(MemorySegment.ofArray(valuesPerLocalRank[i]), streams.get(i));
                    send.add(s); recv.add(r);
                }
                allGather(send, recv, bytes, streams);
                long[][] out = new long[ranks.size()][];
                for (int i = 0; i < ranks.size(); i++) {
                    await(streams.get(i), "an all-gather of setup values (every rank must make the same collective calls)");
                    out[i] = recv.get(i).readLongs(n * worldSize, streams.get(i));
                }
                return out;
            } finally {
                streams.forEach(Stream::close);
            }
        }
    }

    /**
     * How long a host wait for this group's work may take ({@link #await}: HOST exchanges that read
     * counts, setup agreements, checkErrors; in a nonblocking group also NCCL's polled host calls and
     * the close's finalize) before the group is aborted and the wait throws.
     * @param timeout the longest wait, positive; one too long for nanoseconds means no limit
     * @return this group
     * @throws IllegalArgumentException when the time-out is zero or negative
     * @throws NullPointerException when the time-out is null
     */
    public CommGroup hostWaitTimeout(java.time.Duration timeout) {
        requirePositive(timeout);
        try {
            hostWaitNanos = timeout.toNanos();
        } catch (ArithmeticException e) {
            hostWaitNanos = Long.MAX_VALUE;  // ~292 years: no limit
        }
        return this;
    }

    /**
     * How long a host wait for the streams (checkErrors, HOST exchanges) may take before the group is aborted.
     * @return the time-out
     */
    public java.time.Duration hostWaitTimeout() { return java.time.Duration.ofNanos(hostWaitNanos); }

    /**
     * Refuses a time-out that is null, zero or negative.
     * @param timeout the time-out
     * @throws NullPointerException when it is null
     * @throws IllegalArgumentException when it is not positive
     */
    private static void requirePositive(java.time.Duration timeout) {
        java.util.Objects.requireNonNull(timeout, "the host-wait time-out");
        if (timeout.isNegative() || timeout.isZero()) throw new IllegalArgumentException("the host-wait time-out must be positive, got " + timeout);
    }

    /**
     * Waits until {@code stream}'s work is done, as {@link Stream#synchronize}, but not forever: at
     * an asynchronous NCCL error, or once {@link #hostWaitTimeout} has passed (a peer that never
     * joins a collective), it aborts the group (NCCL then drops the pending work) and throws,
     * naming {@code what} waited. A CUDA error while waiting aborts the group too. The instances
     * built on the group refuse calls from then on. Throws as well when the group is closed or
     * aborted (by another thread, say) by the time the work is done: NCCL may have dropped it.
     * @param stream the stream to wait for
     * @param what what waits, for messages
     * @throws IllegalStateException for a closed stream, or one that captures a graph (nothing is aborted then)
     * @throws CommException for an NCCL error, the time-out, or a group closed meanwhile
     */
    void await(Stream stream, String what) {
        stream.handle();  // a closed stream, or one that captures, is the caller's mistake: refused without aborting anything
        if (stream.isCapturing()) throw new IllegalStateException(what + " cannot wait for " + stream.describe() + ": it is capturing a graph");
        long start = System.nanoTime();
        String failure = null;
        try {
            for (int polls = 0; !stream.isIdle(); pause(polls++)) {
                if (polls < 2000) continue;  // the first few milliseconds: the stream only, as a synchronize would
                String asyncError = asyncError();
                if (asyncError != null) {
                    failure = "NCCL reported " + asyncError;
                    break;
                }
                if (System.nanoTime() - start > hostWaitNanos) {
                    failure = "it was " + notDoneInTime() + ": did a rank not join the collective?";
                    break;
                }
            }
        } catch (RuntimeException e) {  // the stream query or the NCCL query failed (a sticky CUDA error, say)
            e.addSuppressed(new CommException(what + " failed while it waited, so " + describe() + " was aborted"));
            throw abortedBecause(e);
        }
        if (failure != null) throw abortedBecause(new CommException(what + " on " + stream.device() + ": " + failure + "; " + describe() + " was aborted"));
        if (isClosed()) throw new CommException(what + " on " + stream.device() + ": " + describe() + " was closed or aborted before the work was done; NCCL may have dropped it");
    }

    /**
     * Aborts the group because of {@code e}; a failure of the abort itself is attached to it.
     * @param <E> the exception's type
     * @param e why
     * @return {@code e}, to throw
     */
    private <E extends RuntimeException> E abortedBecause(E e) {
        try {
            abort();
        } catch (RuntimeException q) {
            e.addSuppressed(q);
        }
        return e;
    }

    /**
     * {@link #await(Stream, String)} of every stream in the list.
     * @param streams the streams, waited for in order
     * @param what what waits, for messages
     * @throws IllegalStateException for a closed or capturing stream
     * @throws CommException for an NCCL error, the time-out, or a group closed meanwhile
     */
    void await(List<Stream> streams, String what) {
        for (Stream s : streams) await(s, what);
    }

    /**
     * A local communicator's asynchronous error (ncclCommGetAsyncError), or null; null once the group is closed.
     * @return the error's description, or null
     * @throws CommException when NCCL cannot be asked
     */
    private String asyncError() {
        synchronized (pollLock) {  // release() takes it too: a communicator is never polled after it was freed
            return isClosed() ? null : pollStates(false);
        }
    }

    /**
     * Collective: every rank says whether its part of {@code step} (work that can fail on some ranks
     * only, such as allocating memory or loading kernels) succeeded, so that the ranks fail
     * together instead of the healthy ones waiting forever in the next collective (or in the
     * failing rank's collective clean-up). Runs {@code localWork}, then returns its result when every
     * rank succeeded; otherwise throws what it threw on the ranks that failed and, on the others, an
     * exception naming them.
     * A rank that cannot take part in the agreement itself (its GPU in an error state, say) aborts
     * the group, so that its clean-up enters no collective; the others' all-gather then ends at
     * their host-wait time-out ({@link #await}).
     * @param <T> what the work returns
     * @param step the work, for messages
     * @param localWork this rank's part
     * @return what {@code localWork} returned
     * @throws RuntimeException what {@code localWork} threw, or a CommException naming the ranks that failed
     */
    <T> T failTogether(String step, java.util.function.Supplier<T> localWork) {
        T result = null;
        RuntimeException failed = null;
        try {
            result = localWork.get();
        } catch (RuntimeException e) {
            failed = e;
        }
        failTogether(step, failed);
        return result;
    }

    /**
     * {@link #failTogether(String, java.util.function.Supplier)} of work with no result.
     * @param step the work, for messages
     * @param localWork this rank's part
     * @throws RuntimeException what {@code localWork} threw, or a CommException naming the ranks that failed
     */
    void failTogether(String step, Runnable localWork) {
        failTogether(step, () -> {
            localWork.run();
            return null;
        });
    }

    /**
     * The agreement itself: {@code localFailure} is this rank's failure of {@code step}, or null.
     * The overloads above run the step and pass what it threw.
     * @param step the work, for messages
     * @param localFailure this rank's failure, or null
     * @throws RuntimeException {@code localFailure}, or a CommException naming the ranks that failed
     */
    void failTogether(String step, RuntimeException localFailure) {
        long[] mine = new long[ranks.size()];
        java.util.Arrays.fill(mine, localFailure == null ? 0 : 1);
        long[] all;
        try {
            all = allGatherLongs(mine)[0];
        } catch (RuntimeException e) {
            RuntimeException thrown = localFailure != null ? localFailure : e;
            if (localFailure != null) localFailure.addSuppressed(e);
            thrown.addSuppressed(new CommException("rank " + ranks.get(0).rank() + " could not tell the others how " + step + " went, so " + describe() + " was aborted"));
            throw abortedBecause(thrown);
        }
        if (localFailure != null) throw localFailure;
        List<Integer> failed = new ArrayList<>();
        for (int r = 0; r < all.length; r++) if (all[r] != 0) failed.add(r);
        if (!failed.isEmpty())
            throw new CommException(step + " failed on rank(s) " + failed + " (each reports its own error), so rank " + ranks.get(0).rank() + " stops too");
    }

    /**
     * Runs the abort signals (Groups.beforeAbort) ahead of an ncclCommAbort, which waits for the
     * device: kernels still waiting on NCCL (a flush whose proxy thread is gone, say) stop first.
     */
    private void signalAbort() { abortSignals.forEach(Runnable::run); }

    /**
     * Aborts every local communicator (pending work is dropped) and closes the group: from another
     * thread, this ends a wait in a collective or a stream synchronize that will never return, and
     * returns once the communicators are gone. A close already under way is left to end them: a
     * nonblocking group's close, still finalizing, aborts them instead; a blocking one destroys
     * them; this returns at once then. Calls that start after it are refused; the instances built
     * on the group still need closing (that frees their memory).
     * @throws CommException when NCCL fails to abort a communicator (every one is still tried)
     */
    public void abort() {
        aborted = true;  // read by release() (run at most once) and each round of a nonblocking close's finalize
        signalAbort();  // also for a close under way, whose destroy may wait for a kernel that waits on NCCL
        if (isClosed()) return;  // a close under way: waiting for its lock could mean waiting for a destroy that never ends
        synchronized (pollLock) {  // a poll on another thread sees the group closed only once NCCL's own threads are done with it
            close();
        }
    }

    /**
     * Destroys (or, after {@link #abort}, aborts) every local communicator, each even if one before it
     * fails. A nonblocking group is finalized first (NCCL flushes its work on its own thread), within
     * the host-wait time-out; if that fails, does not end, or {@link #abort} is called meanwhile, its
     * communicators are aborted instead, and the close throws why once everything is freed.
     * @throws CommException when the finalize or a destroy or abort fails (every communicator is still freed)
     */
    @Override protected void release() {
        synchronized (pollLock) {  // waits for at most one poll round of an await or a complete on another thread; abort() holds it already
            RuntimeException finalizeFailure = aborted || !nonblocking ? null : finalizeAll();
            // a blocking communicator NCCL reports an error on (a peer that died, say) is aborted too:
            // ncclCommDestroy would wait for its work, which may never end
            boolean abort = aborted || finalizeFailure != null || (!nonblocking && reportsError());
            String call = abort ? "ncclCommAbort" : "ncclCommDestroy";
            if (abort) signalAbort();
            try {
                releaseAll(ranks.stream().<Runnable>map(c -> () -> {
                    c.device().makeCurrent();
                    int rc = abort ? ncclCommAbort(c.handleUnchecked()) : ncclCommDestroy(c.handleUnchecked());
                    if (rc == 0) return;
                    CommException failed = Nccl.error(call + " (" + c + ")", rc, MemorySegment.NULL);
                    // a destroy that fails (an error that came after reportsError) frees nothing: abort
                    // it, which also stops the NCCL kernels that would otherwise run on
                    if (!abort) {
                        signalAbort();
                        int arc = ncclCommAbort(c.handleUnchecked());
                        if (arc != 0) failed.addSuppressed(Nccl.error("ncclCommAbort (" + c + ")", arc, MemorySegment.NULL));
                    }
                    throw failed;
                }).toArray(Runnable[]::new));
            } catch (RuntimeException e) {
                if (finalizeFailure != null) e.addSuppressed(finalizeFailure);
                throw e;
            }
            if (finalizeFailure != null) throw finalizeFailure;
        }
    }

    /**
     * Whether NCCL reports an asynchronous error on some local communicator (or cannot be asked).
     * @return true for an error, or no answer
     */
    private boolean reportsError() {
        try {
            return pollStates(false) != null;
        } catch (RuntimeException e) {
            return true;
        }
    }

    /**
     * ncclCommFinalize of every local communicator, polled until done.
     * @return the failure (the communicators are then to be aborted), or null
     */
    private RuntimeException finalizeAll() {
        try {
            for (Communicator c : ranks) {
                c.device().makeCurrent();
                int rc = ncclCommFinalize(c.handleUnchecked());
                if (rc != 0 && rc != ncclInProgress()) return Nccl.error("ncclCommFinalize (" + c + ")", rc, c.handleUnchecked());
            }
            String failure = pollToEnd(() -> aborted ? "aborted (CommGroup.abort) while NCCL finalized it" : null,
                    "work that never ends (a peer that never joined?)");
            return failure == null ? null : new CommException("closing " + describe() + " (ncclCommFinalize): " + failure + "; its communicators were aborted");
        } catch (RuntimeException e) {
            return e;
        }
    }

    /**
     * What this group is, for messages.
     * @return "communicator group of L local rank(s) of N"
     */
    @Override public String describe() { return "communicator group of " + ranks.size() + " local rank(s) of " + worldSize; }
}
