package dev.gin4j.a2a;

import dev.gin4j.gpu.Device;
import dev.gin4j.gpu.DeviceBuffer;
import dev.gin4j.internal.gpu.Checks;

import java.util.List;

/**
 * The checks of a caller-owned output ({@link AllToAll} and {@link AllToAllV}, {@code run} with an
 * output), made at the call before anything is queued. Static and given plain values, so that
 * they run without a GPU (CallerOutputsTest). No alignment is asked for: the GIN kernels write the
 * receive slots at any alignment (docs/kernels.md, window layout), the output is filled by a
 * device-to-device copy (GIN) or by NCCL (HOST), both of any alignment.
 */
final class CallerOutputs {
    private CallerOutputs() {}

    /**
     * The list of outputs of a list-form call: given, one per local rank.
     * @throws IllegalArgumentException naming what was given and what was expected
     */
    static void requireOnePerLocalRank(List<DeviceBuffer> outputs, int localCount) {
        if (outputs == null)
            throw new IllegalArgumentException("outputs must be given, one buffer per local rank (" + localCount + "), got null; run without outputs writes into the instance's receive area");
        if (outputs.size() != localCount)
            throw new IllegalArgumentException("one output per local rank expected (" + localCount + "), got " + outputs.size());
    }

    /**
     * One rank's output: given, alive, on the rank's device, at least {@code need} bytes
     * ({@code layout} says why), disjoint from every buffer the call reads ({@code reads}, named by
     * {@code readNames}) and from the instance's own memory ({@code owned}, named {@code ownedName}).
     *
     * @param rank the rank, for the messages
     * @param device the rank's device
     * @throws IllegalArgumentException naming what was wrong and what was expected
     * @throws IllegalStateException when the output was freed (its arena is closed)
     */
    static void check(Object rank, Device device, DeviceBuffer output, long need, String layout,
                      DeviceBuffer[] reads, String[] readNames, DeviceBuffer[] owned, String ownedName) {
        if (output == null)
            throw new IllegalArgumentException(rank + ": output must be given (" + layout + " = " + need + " bytes at least, on " + device
                    + "), got null; run without an output writes into the instance's receive area");
        if (output.device() != device)
            throw new IllegalArgumentException(rank + ": output is on " + output.device() + ", expected the rank's device, " + device);
        output.address();  // a freed output is refused here, naming it
        if (output.byteSize() < need)
            throw new IllegalArgumentException(rank + ": output has " + output.byteSize() + " bytes; " + layout + " needs " + need);
        for (int j = 0; j < reads.length; j++) Checks.requireDisjoint(rank, readNames[j], reads[j], output, "the output");
        for (DeviceBuffer b : owned)
            if (output.overlaps(b))
                throw new IllegalArgumentException(rank + ": output overlaps " + ownedName + ", which the call writes itself; give the output memory of its own"
                        + " (run without an output leaves the result in the instance's receive area)");
    }

    /**
     * The outputs of one list-form call do not share a byte: each local rank writes its own. (A
     * group has one rank per device, so outputs that passed {@link #check} are apart already; the
     * rule is checked by itself all the same.)
     * @param ranks the local ranks, in the outputs' order, for the message
     * @throws IllegalArgumentException naming the two ranks whose outputs overlap
     */
    static void requireDisjoint(List<DeviceBuffer> outputs, List<?> ranks) {
        for (int i = 0; i < outputs.size(); i++)
            for (int j = i + 1; j < outputs.size(); j++)
                if (outputs.get(i).overlaps(outputs.get(j)))
                    throw new IllegalArgumentException("the outputs of " + ranks.get(i) + " and " + ranks.get(j) + " overlap; each local rank needs an output of its own");
    }
}
