package dev.gin4j.internal.comm;

import dev.gin4j.comm.Capabilities;
import dev.gin4j.comm.CommException;
import dev.gin4j.testing.SetupLog;
import org.junit.jupiter.api.Test;

import java.util.List;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.logging.Level;

import static org.junit.jupiter.api.Assertions.*;

/**
 * The DEBUG line DeviceComm.create logs once NCCL made device communicators with GIN: the GIN type
 * NCCL reports and the plugin. NCCL's answer is stood in for here (asking it needs a GPU and
 * NCCL >= 2.29.7); what the line makes of it, and that NCCL is asked only when the line is
 * logged, needs neither.
 */
class GinTypeLogTest {
    private static final String OVER = "communicator group of 1 local rank(s) of 4";

    @Test void theLineSaysTheGinTypeTheConnectionAndThePlugin() {
        List<String> log = SetupLog.debug(() -> DeviceComm.logGin(OVER, new DeviceComm.Requirements(0, 256, 0, true), () -> "proxy", Capabilities::describeGinPlugin));
        assertEquals(1, log.size(), log.toString());
        String line = log.get(0);
        assertTrue(line.startsWith("FINE device communicators with GIN over " + OVER + ": NCCL reports GIN type proxy;"), line);
        assertTrue(line.contains("256 GIN signals, 0 counters, a connection to every rank"), line);
        assertTrue(line.endsWith("GIN plugin: " + Capabilities.describeGinPlugin()), line);

        String railed = SetupLog.debug(() -> DeviceComm.logGin(OVER, new DeviceComm.Requirements(1, 2, 3), () -> "GDAKI", () -> "none")).get(0);
        assertTrue(railed.contains("GIN type GDAKI; 2 GIN signals, 3 counters, railed connections; GIN plugin: none"), railed);
    }

    @Test void aFailedQueryIsNamedInTheLineAndDoesNotFailTheSetup() {
        List<String> log = SetupLog.debug(() -> DeviceComm.logGin(OVER, new DeviceComm.Requirements(0, 1, 0), () -> {
            throw new CommException("ncclCommQueryProperties failed: ncclInvalidUsage");
        }, () -> "NCCL_GIN_PLUGIN unset"));
        assertEquals(1, log.size(), log.toString());
        assertTrue(log.get(0).contains("GIN type unknown (ncclCommQueryProperties: ncclCommQueryProperties failed: ncclInvalidUsage)"), log.get(0));
    }

    @Test void ncclIsNotAskedWhileDebugIsOff() {
        AtomicInteger asked = new AtomicInteger();
        List<String> log = SetupLog.during(Level.INFO, () -> DeviceComm.logGin(OVER, new DeviceComm.Requirements(0, 1, 0),
                () -> { asked.incrementAndGet(); return "proxy"; }, () -> { asked.incrementAndGet(); return "none"; }));
        assertEquals(List.of(), log);
        assertEquals(0, asked.get(), "the GIN type query (an NCCL call) ran though nothing was logged");
    }
}
