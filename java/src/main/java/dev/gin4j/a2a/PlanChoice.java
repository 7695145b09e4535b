package dev.gin4j.a2a;

import java.util.List;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;

/**
 * The launch plan a GIN call of one instance takes before the residency fit ({@link GinState#plan}):
 * {@link Plan#choose}'s, or DIRECT where that plan cannot run here (its staging is too small, the
 * hybrid kernel runs, or the copy engines would need sizes the host does not know). Pure: the
 * choice and its line are tested without a GPU.
 * <p>Each distinct choice is logged once per instance, at DEBUG through System.Logger "dev.gin4j",
 * by the first call that takes it: a setup decision, not a line per call. With DEBUG off a call
 * costs one level check.
 */
final class PlanChoice {
    /** Why a plan runs DIRECT instead: the LL staging is too small for the call. */
    private static final String LL_STAGING = "the LL staging is smaller";
    /** Why a plan runs DIRECT instead: the LL128 staging is too small for the call. */
    private static final String LL128_STAGING = "the LL128 staging is smaller";
    /** Where setup decisions go. */
    private static final System.Logger LOG = System.getLogger("dev.gin4j");

    /** What the instance runs over, for the line. */
    private final String over;
    /** Ranks in the job. */
    private final int nranks;
    /** Whether {@link Protocol#AUTO} may pick LL128 and the copy engines. */
    private final boolean nvidia;
    /** Whether some peer is outside the LSA team. */
    private final boolean hybrid;
    /** Bytes per peer the LL staging holds. */
    private final long llCapacity;
    /** Bytes per peer the LL128 staging holds. */
    private final long ll128Capacity;
    /** What was logged already: (requested protocol, uniform, plan) and (plan, fitted plan) pairs. */
    private final Set<List<Object>> logged = ConcurrentHashMap.newKeySet();

    /**
     * The choice of one instance.
     * @param over what the instance runs over, for the line ({@code CommGroup.describe()})
     * @param nranks ranks in the job
     * @param nvidia whether {@link Protocol#AUTO} may pick LL128 and the copy engines
     * @param hybrid whether some peer is outside the LSA team (the hybrid kernel runs DIRECT only)
     * @param llCapacity bytes per peer the LL staging holds
     * @param ll128Capacity bytes per peer the LL128 staging holds
     */
    PlanChoice(String over, int nranks, boolean nvidia, boolean hybrid, long llCapacity, long ll128Capacity) {
        this.over = over;
        this.nranks = nranks;
        this.nvidia = nvidia;
        this.hybrid = hybrid;
        this.llCapacity = llCapacity;
        this.ll128Capacity = ll128Capacity;
    }

    /**
     * The plan for {@code bytesPerPeer} under {@code requested}, before the residency fit; logged
     * the first time this instance takes it for that request.
     * @param bytesPerPeer the call's bytes per peer (all-to-all-v: its capacity per peer)
     * @param requested the protocol the instance is set to ({@link Protocol#AUTO}, or a forced one)
     * @param uniform false for all-to-all-v (no copy engines: its counts live on the device)
     * @return the plan, before the residency fit
     */
    Plan choose(long bytesPerPeer, Protocol requested, boolean uniform) {
        Plan chosen = Plan.choose(bytesPerPeer, nranks, requested, nvidia);
        String direct = directBecause(chosen.protocol(), bytesPerPeer, uniform);
        Plan plan = direct == null ? chosen : Plan.choose(bytesPerPeer, nranks, Protocol.DIRECT);
        if (LOG.isLoggable(System.Logger.Level.DEBUG) && logged.add(List.of(requested, uniform, plan)))
            LOG.log(System.Logger.Level.DEBUG, line(bytesPerPeer, requested, uniform, chosen, direct, plan));
        return plan;
    }

    /**
     * The plan the residency fit made of {@code plan} on {@code device} ({@code resident} blocks fit
     * at once); a shrunk one is logged once per instance and pair.
     * @param plan the plan before the fit
     * @param fitted the plan after it
     * @param device the GPU, for the line
     * @param resident how many blocks of the plan's kernel the GPU holds at once
     * @return {@code fitted}
     */
    Plan fitted(Plan plan, Plan fitted, Object device, int resident) {
        if (!fitted.equals(plan) && LOG.isLoggable(System.Logger.Level.DEBUG) && logged.add(List.of(plan, fitted)))
            LOG.log(System.Logger.Level.DEBUG, "GIN all-to-all over " + over + ": " + describe(plan) + " shrunk to " + fitted.chunksPerPeer()
                    + " chunks per peer, since " + device + " holds " + resident + " resident blocks of " + plan.threads()
                    + " threads and every block of the grid (" + nranks + " ranks x chunks) must be resident at once");
        return fitted;
    }

    /**
     * Why {@code protocol} cannot run for this call (then it runs DIRECT), or null where it can; constants: no text built per call.
     * @param protocol the protocol {@link Plan#choose} picked
     * @param bytesPerPeer the call's bytes per peer
     * @param uniform false for all-to-all-v
     * @return the reason, or null
     */
    private String directBecause(Protocol protocol, long bytesPerPeer, boolean uniform) {
        if (protocol == Protocol.LL && bytesPerPeer > llCapacity) return LL_STAGING;
        if (protocol == Protocol.LL128 && bytesPerPeer > ll128Capacity) return LL128_STAGING;
        if (hybrid && protocol != Protocol.DIRECT) return "some peer is outside the LSA team: the hybrid kernel (ncclGin puts) runs DIRECT only";
        if (protocol == Protocol.COPY_ENGINE && !uniform) return "all-to-all-v cannot use the copy engines: the host does not know its counts, which live on the device";
        return null;
    }

    /**
     * The DEBUG line of one choice.
     * @param bytesPerPeer the call's bytes per peer
     * @param requested the protocol the instance is set to
     * @param uniform false for all-to-all-v
     * @param chosen {@link Plan#choose}'s plan
     * @param direct why that plan cannot run, or null
     * @param plan the plan taken
     * @return the line
     */
    private String line(long bytesPerPeer, Protocol requested, boolean uniform, Plan chosen, String direct, Plan plan) {
        String why = requested != Protocol.AUTO ? requested + " as forced (AllToAll.protocol)"
                : "AUTO by size" + (nvidia ? " (NVIDIA: LL128 and the copy engines allowed)" : " (not NVIDIA: LL or DIRECT only)");
        if (direct != null) {
            String capacity = direct.equals(LL_STAGING) ? " (" + llCapacity + " bytes per peer)"
                    : direct.equals(LL128_STAGING) ? " (" + ll128Capacity + " bytes per peer)" : "";
            why += " picked " + chosen.protocol() + ", but " + direct + capacity;
        }
        return "GIN " + (uniform ? "all-to-all" : "all-to-all-v") + " over " + over + ": " + bytesPerPeer + " bytes per peer take "
                + describe(plan) + "; " + why + " (logged once per plan)";
    }

    /**
     * A plan in words.
     * @param p the plan
     * @return "PROTOCOL, C chunks per peer x T threads"
     */
    private static String describe(Plan p) {
        return p.protocol() + ", " + p.chunksPerPeer() + (p.protocol() == Protocol.COPY_ENGINE ? " self-copy blocks" : " chunks per peer") + " x " + p.threads() + " threads";
    }
}
