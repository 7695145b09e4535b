package dev.gin4j.internal.comm;

import dev.gin4j.comm.Capabilities;
import dev.gin4j.comm.CommException;
import dev.gin4j.comm.CommGroup;
import dev.gin4j.comm.Communicator;
import dev.gin4j.comm.Nccl;
import dev.gin4j.gpu.NativeResource;
import dev.gin4j.gpu.PinnedBuffer;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.lang.invoke.VarHandle;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

import static dev.gin4j.bindings.nccl.nccl_h.*;

/**
 * NCCL's device communicator ({@code ncclDevCommCreate}), one per local rank: the struct kernels
 * take by value to use NCCL's device API (LSA pointers and barriers, GIN puts and signals).
 * Collective. Destroyed with {@link #close()}, before its {@link CommGroup}.
 */
public final class DeviceComm extends NativeResource {
    /**
     * What the kernels need: LSA barriers, and GIN signals/counters where the library has GIN;
     * {@code ginFullConnection} asks for a GIN connection to every rank (not railed).
     */
    public record Requirements(int lsaBarrierCount, int ginSignalCount, int ginCounterCount, boolean ginFullConnection) {
        /** Requirements without a full GIN connection. */
        public Requirements(int lsaBarrierCount, int ginSignalCount, int ginCounterCount) {
            this(lsaBarrierCount, ginSignalCount, ginCounterCount, false);
        }
    }

    private final CommGroup group;
    private final NcclDeviceAbi abi;
    private final Arena arena = Arena.ofShared();
    private final List<MemorySegment> structs = new ArrayList<>();
    /** The ranks' abort words (armAbortWords), in mapped pinned memory of {@link #arena}. */
    private final List<PinnedBuffer> abortWords = new ArrayList<>();
    /** Takes {@link #raiseAbortWords} off the group's abort. */
    private Runnable abortHook = () -> {};

    private DeviceComm(CommGroup group, NcclDeviceAbi abi) {
        this.group = group;
        this.abi = abi;
        this.created = new boolean[group.localCount()];
    }

    /** The NCCL version that GIN across nodes needs (NCCL_VERSION_CODE of 2.29.7): GIN plugins, and the device API gin4j's GIN kernels are written for. */
    public static final int GIN_MIN_VERSION = 22907;

    /**
     * Why the library of version {@code loaded} cannot run GIN across nodes, or null where its
     * version can (the kernels' headers are checked after: {@link NcclDeviceAbi#checkMatches}).
     */
    public static String ginVersionProblem(int loaded) {
        if (loaded >= GIN_MIN_VERSION) return null;
        return "GIN across nodes (peers outside the LSA team: another host, or a peer whose memory cannot be mapped) needs NCCL >= "
                + Nccl.versionString(GIN_MIN_VERSION) + " with a GIN-capable network or plugin and kernels built against its headers, but the loaded library is NCCL "
                + Nccl.versionString(loaded) + ". Inside one node Backend.GIN works with any NCCL version; across nodes load NCCL >= "
                + Nccl.versionString(GIN_MIN_VERSION) + " (GIN4J_NCCL_LIBRARY) or use Backend.HOST";
    }

    /**
     * Collective: a device communicator for every local rank of {@code group}.
     * @throws CommException at once, naming the versions, when GIN is asked for and the loaded NCCL is
     *     older than {@link #GIN_MIN_VERSION}, or when the kernels were built against another NCCL's headers
     */
    public static DeviceComm create(CommGroup group, Requirements req) {
        group.ensureOpen();
        boolean gin = req.ginSignalCount() > 0 || req.ginCounterCount() > 0;
        String tooOld = gin ? ginVersionProblem(Nccl.version()) : null;
        if (tooOld != null) throw new CommException(tooOld + " (" + Nccl.describe() + ")");
        NcclDeviceAbi abi = NcclDeviceAbi.forLoadedLibrary();
        if (gin && !abi.hasRequirement("ginSignalCount")) {
            throw new CommException("GIN requested but NCCL " + Nccl.versionString(abi.builtFor()) + " has no GIN fields in ncclDevCommRequirements (GIN needs NCCL >= 2.28.7)");
        }
        DeviceComm dc = new DeviceComm(group, abi);
        Map<String, Integer> fields = new LinkedHashMap<>();
        if (abi.hasRequirement("lsaBarrierCount")) fields.put("lsaBarrierCount", req.lsaBarrierCount());
        // the kernels use GIN context 0 (NCCL makes at least as many as it has connections)
        if (gin && abi.hasRequirement("ginContextCount")) fields.put("ginContextCount", 1);
        if (req.ginSignalCount() > 0) fields.put("ginSignalCount", req.ginSignalCount());
        if (req.ginCounterCount() > 0) fields.put("ginCounterCount", req.ginCounterCount());
        if (req.ginFullConnection()) fields.put("ginConnectionType", 1); // NCCL_GIN_CONNECTION_FULL
        try {
            MemorySegment reqs = abi.requirements(dc.arena, fields);
            for (int i = 0; i < group.localCount(); i++) dc.structs.add(dc.arena.allocate(Math.max(abi.devCommSize(), 8), Math.max(abi.devCommAlign(), 8)));
            try {
                Groups.inGroup(group, "ncclDevCommCreate", () -> {
                    for (Communicator c : group.ranks()) {
                        c.device().makeCurrent();
                        NcclStatus.check("ncclDevCommCreate", ncclDevCommCreate(c.handle(), reqs, dc.structs.get(c.localIndex())), c.handle());
                        dc.created[c.localIndex()] = true;  // this rank's is destroyed on close, even if another rank's create fails
                    }
                });
            } catch (CommException e) {
                if (group.isClosed()) throw e;  // a time-out or a peer's failure: not a matter of the backend
                String pluginProblem = gin ? Capabilities.ginPluginProblem() : null;
                // NCCL's own words ("does not support symmetric memory", say) do not tell a user what to change
                throw new CommException(e.getMessage() + "; NCCL made no device communicator for " + group.describe()
                        + ", which GPU-initiated kernels (Backend.GIN) need: NCCL makes one where it can map every rank's memory"
                        + " (ranks of one NVLink / xGMI domain) or reach the ranks through a GIN-capable network. Backend.HOST needs none"
                        + (pluginProblem != null ? ". " + pluginProblem : ""), e);
            }
            if (gin) dc.armAbortWords();
        } catch (RuntimeException e) {
            dc.close();
            throw e;
        }
        if (gin) logGin(group.describe(), req, () -> Capabilities.ginType(group.rank(0)), Capabilities::describeGinPlugin);
        return dc;
    }

    private static final System.Logger LOG = System.getLogger("dev.gin4j");

    /**
     * Logs at DEBUG (System.Logger "dev.gin4j") which GIN NCCL set up under new device communicators
     * with GIN: the type it reports (proxy: the CPU's proxy thread posts the GPU's puts; GDAKI: the GPU
     * drives the NIC) and the plugin. The type is asked of NCCL only when the line is logged; a
     * failure to ask is named in the line instead of failing the setup.
     * @param over the group, for the line
     * @param req what was asked of NCCL
     * @param ginType asks NCCL for the GIN type ({@link Capabilities#ginType})
     * @param plugin describes the GIN plugin ({@link Capabilities#describeGinPlugin})
     */
    static void logGin(String over, Requirements req, java.util.function.Supplier<String> ginType, java.util.function.Supplier<String> plugin) {
        if (!LOG.isLoggable(System.Logger.Level.DEBUG)) return;
        String type, loaded;
        try {
            type = ginType.get();
        } catch (RuntimeException e) {
            type = "unknown (ncclCommQueryProperties: " + e.getMessage() + ")";
        }
        try {
            loaded = plugin.get();
        } catch (RuntimeException e) {
            loaded = "unknown (" + e.getMessage() + ")";
        }
        LOG.log(System.Logger.Level.DEBUG, "device communicators with GIN over " + over + ": NCCL reports GIN type " + type + "; " + req.ginSignalCount()
                + " GIN signals, " + req.ginCounterCount() + " counters, " + (req.ginFullConnection() ? "a connection to every rank" : "railed connections")
                + "; GIN plugin: " + loaded);
    }

    private final boolean[] created;

    /**
     * NCCL's device waits (a GIN flush, counter and signal waits, barriers) end early once
     * {@code ncclDevComm.abortFlag} reads nonzero, but ncclDevCommCreate leaves it null in a user's
     * device communicator (NCCL 2.29.7), so nothing stops them: a flush whose GIN proxy thread has
     * exited (it does at a failed put, when a peer dies) spins forever, and ncclCommAbort, which waits
     * for the device, hangs with it. Each rank's struct gets a word of mapped pinned memory instead,
     * which the group sets before it aborts ({@link Groups#beforeAbort}). Only where GIN goes
     * through NCCL's proxy thread: GDAKI's flush takes another path once the flag is set (it ends
     * at the first peer with nothing outstanding, which a one-thread flush over every peer must
     * not). Kernels built before the probe recorded the field's offset keep NCCL's null.
     */
    private void armAbortWords() {
        String offset = abi.raw().getProperty("nccl.devComm.abortFlag.offset");
        if (offset == null) return;
        String type;
        try {
            type = Capabilities.ginType(group.rank(0));
        } catch (RuntimeException e) {
            return;  // unknown: NCCL's null, as before
        }
        if (!"proxy".equals(type)) return;
        long at = Long.parseLong(offset.trim());
        if (!"8".equals(abi.raw().getProperty("nccl.devComm.abortFlag.size", "").trim()) || at < 0 || at + 8 > abi.devCommSize()) {
            throw new CommException("the kernel manifest places ncclDevComm.abortFlag at " + at + " (size " + abi.raw().getProperty("nccl.devComm.abortFlag.size")
                    + ") in a " + abi.devCommSize() + "-byte struct; expected an 8-byte pointer inside it: rebuild the kernels (gin-kernels/build)");
        }
        for (Communicator c : group.ranks()) {
            MemorySegment struct = structs.get(c.localIndex());
            if (struct.get(ValueLayout.JAVA_LONG_UNALIGNED, at) != 0) continue;  // NCCL's own flag, which ncclCommAbort sets
            PinnedBuffer word = c.device().allocatePinned(4, arena);
            word.host().set(ValueLayout.JAVA_INT, 0, 0);
            struct.set(ValueLayout.JAVA_LONG_UNALIGNED, at, word.deviceAddress());
            abortWords.add(word);
        }
        VarHandle.fullFence();
        if (!abortWords.isEmpty()) abortHook = Groups.beforeAbort(group, this::raiseAbortWords);
    }

    /** Sets every rank's abort word; a word already freed (this object closed meanwhile) is skipped. */
    private void raiseAbortWords() {
        for (PinnedBuffer word : abortWords) {
            try {
                word.host().set(ValueLayout.JAVA_INT, 0, 1);
            } catch (IllegalStateException freed) {
                // closed on another thread: no kernel of it can be waiting
            }
        }
        VarHandle.fullFence();
    }

    /** The device-API struct layout of the loaded NCCL. */
    public NcclDeviceAbi abi() { return abi; }

    /** The ncclDevComm struct of local rank {@code i}, as bytes to pass by value to a kernel. */
    public MemorySegment struct(int localIndex) {
        ensureOpen();
        return structs.get(localIndex);
    }

    /** Destroys each rank's device communicator, unless the group was closed first (they went with its communicators). */
    @Override protected void release() {
        List<Runnable> steps = new ArrayList<>();
        for (Communicator c : group.ranks()) {
            if (!created[c.localIndex()] || group.isClosed()) continue;
            steps.add(() -> {
                c.device().makeCurrent();
                NcclStatus.check("ncclDevCommDestroy", ncclDevCommDestroy(c.handle(), structs.get(c.localIndex())), c.handle());
            });
        }
        // the words stay raisable until the destroys are done: a destroy waits for NCCL's reset kernel,
        // which can sit behind a kernel that waits on NCCL
        steps.add(abortHook);
        steps.add(arena::close);
        releaseAll(steps.toArray(Runnable[]::new));
    }

    @Override public String describe() { return "NCCL device communicator over " + group.describe(); }
}
