package dev.gin4j.moe;

import dev.gin4j.comm.Backend;
import dev.gin4j.comm.DType;
import org.junit.jupiter.api.Test;

import static org.junit.jupiter.api.Assertions.*;

/** MoeConfig's checks and row sizes, without a GPU. */
class MoeConfigTest {
    private static void refused(String expected, org.junit.jupiter.api.function.Executable e) {
        IllegalArgumentException x = assertThrows(IllegalArgumentException.class, e);
        assertTrue(x.getMessage().contains(expected), x.getMessage());
    }

    @Test void badShapesAreRefusedWithWhatWasExpected() {
        refused("hidden must be >= 1", () -> MoeConfig.bf16(0, 8, 2, 16, Backend.GIN));
        refused("topK must be in [1, min(32, experts)]", () -> MoeConfig.bf16(128, 8, 9, 16, Backend.GIN));
        refused("maxTokens must be >= 1", () -> MoeConfig.bf16(128, 8, 2, 0, Backend.GIN));
        refused("backend must be Backend.GIN or Backend.HOST", () -> MoeConfig.bf16(128, 8, 2, 16, null));
        refused("dtype and input must be given", () -> new MoeConfig(128, 8, 2, 16, null, Backend.GIN));
        refused("positive multiple of 16", () -> MoeConfig.fp8(120, 8, 2, 16, Backend.HOST));
        refused("MoE rows are BF16 or FP8_E4M3", () -> new MoeConfig(128, 8, 2, 16, DType.FP32, Backend.GIN));
        refused("dispatch input must be the row type", () -> new MoeConfig(128, 8, 2, 16, DType.BF16, Backend.GIN, DType.FP8_E4M3));
    }

    @Test void ranksWithAnotherConfigurationAreNamed() {
        MoeConfig a = MoeConfig.bf16(7168, 256, 8, 4096, Backend.GIN), b = MoeConfig.fp8(7168, 256, 8, 4096, Backend.GIN),
                c = MoeConfig.bf16(7168, 256, 8, 128, Backend.GIN);
        long[] shapes = {MoeAllToAll.packShape(a), MoeAllToAll.packShape(a), MoeAllToAll.packShape(a)};
        long[] types = {MoeAllToAll.packTypes(a), MoeAllToAll.packTypes(a), MoeAllToAll.packTypes(a)};
        assertNull(MoeAllToAll.setupMismatch(shapes, types));
        types[2] = MoeAllToAll.packTypes(b);
        String m = MoeAllToAll.setupMismatch(shapes, types);
        assertTrue(m != null && m.contains("rank 2 has (hidden 7168, maxTokens 4096, experts 256, topK 8, rows FP8_E4M3, backend GIN, input FP8_E4M3, channels auto)")
                && m.contains("rank 0 has (hidden 7168, maxTokens 4096, experts 256, topK 8, rows BF16, backend GIN, input BF16, channels auto)"), m);
        types[2] = MoeAllToAll.packTypes(a);
        shapes[1] = MoeAllToAll.packShape(c);
        m = MoeAllToAll.setupMismatch(shapes, types);
        assertTrue(m != null && m.contains("rank 1 has (hidden 7168, maxTokens 128,"), m);
        shapes[1] = MoeAllToAll.packShape(a);
        types[1] = MoeAllToAll.packTypes(a.withChannels(128));
        m = MoeAllToAll.setupMismatch(shapes, types);
        assertTrue(m != null && m.contains("rank 1 has (") && m.contains("topK 8, rows BF16, backend GIN, input BF16, channels 128)"), m);
    }

    @Test void expertAlignmentIsOneByDefaultAndOneTo1024() {
        MoeConfig a = MoeConfig.bf16(7168, 256, 8, 128, Backend.GIN);
        assertEquals(1, a.expertAlignment());
        assertEquals(1, MoeConfig.builder().hidden(64).experts(8).topK(2).maxTokensPerRank(16).backend(Backend.HOST).build().expertAlignment());
        assertEquals(128, MoeConfig.builder().hidden(64).experts(8).topK(2).maxTokensPerRank(16).backend(Backend.HOST).expertAlignment(128).build().expertAlignment());
        MoeConfig aligned = a.withExpertAlignment(3);
        assertEquals(3, aligned.expertAlignment());
        assertEquals(3, aligned.withChannels(12).expertAlignment(), "withChannels keeps the alignment");
        assertEquals(12, aligned.withChannels(12).withExpertAlignment(64).channels(), "withExpertAlignment keeps the channels");
        assertEquals(MoeConfig.MAX_EXPERT_ALIGNMENT, a.withExpertAlignment(1024).expertAlignment());
        for (int bad : new int[] {0, -1, 1025, Integer.MIN_VALUE}) {
            refused("expertAlignment must be in [1, 1024] rows (1: packed), got " + bad, () -> a.withExpertAlignment(bad));
            refused("expertAlignment must be in [1, 1024]", () -> MoeConfig.builder().hidden(64).experts(8).topK(2).maxTokensPerRank(16).backend(Backend.GIN).expertAlignment(bad).build());
        }
        // it places only what a rank receives: ranks may differ, create does not compare it
        assertEquals(MoeAllToAll.packTypes(a), MoeAllToAll.packTypes(aligned));
        assertEquals(MoeAllToAll.packShape(a), MoeAllToAll.packShape(aligned));
    }

    @Test void channelsAreZeroForAutoOrOneTo128() {
        MoeConfig a = MoeConfig.bf16(7168, 256, 8, 128, Backend.GIN);
        assertEquals(0, a.channels());
        assertEquals(12, a.withChannels(12).channels());
        assertEquals(a, a.withChannels(12).withChannels(0));
        refused("channels must be 0 (half the SMs, the whole GPU) or in [1, 128]", () -> a.withChannels(129));
        refused("channels must be 0", () -> a.withChannels(-1));
    }

    @Test void channelsFollowTheSmallestGpu() {
        assertEquals(66, MoeAllToAll.channelsFor(new long[] {132, 132}));
        assertEquals(57, MoeAllToAll.channelsFor(new long[] {132, 114, 132}), "an H100 PCIe (114 SMs) beside H200s");
        assertEquals(128, MoeAllToAll.channelsFor(new long[] {300}));
        assertEquals(1, MoeAllToAll.channelsFor(new long[] {1}));
    }

    @Test void theBuilderNamesEveryValueAndMatchesTheFactories() {
        MoeConfig built = MoeConfig.builder().hidden(7168).experts(256).topK(8).maxTokensPerRank(4096).backend(Backend.GIN).bf16().build();
        assertEquals(MoeConfig.bf16(7168, 256, 8, 4096, Backend.GIN), built);
        assertEquals(7168, built.hidden());
        assertEquals(4096, built.maxTokens());
        assertEquals(built, MoeConfig.builder().maxTokensPerRank(4096).topK(8).backend(Backend.GIN).experts(256).hidden(7168).build(), "any order; bf16 by default");
        assertEquals(MoeConfig.fp8(7168, 256, 8, 128, Backend.HOST),
                MoeConfig.builder().hidden(7168).experts(256).topK(8).maxTokensPerRank(128).backend(Backend.HOST).fp8().build());
        assertEquals(MoeConfig.fp8FromBf16(7168, 256, 8, 128, Backend.GIN).withChannels(12),
                MoeConfig.builder().hidden(7168).experts(256).topK(8).maxTokensPerRank(128).backend(Backend.GIN).fp8FromBf16().channels(12).build());
        assertEquals(DType.BF16, MoeConfig.builder().hidden(64).experts(8).topK(2).maxTokensPerRank(16).backend(Backend.GIN).fp8().bf16().build().dtype(), "the last row type set wins");
        refused("set hidden(int), maxTokensPerRank(int), backend(Backend) before build()", () -> MoeConfig.builder().experts(256).topK(8).build());
        refused("set experts(int), topK(int)", () -> MoeConfig.builder().hidden(7168).maxTokensPerRank(4096).backend(Backend.GIN).build());
        refused("topK must be in [1, min(32, experts)], got 9", () -> MoeConfig.builder().hidden(128).experts(8).topK(9).maxTokensPerRank(16).backend(Backend.GIN).build());
        refused("positive multiple of 16, got 120", () -> MoeConfig.builder().hidden(120).experts(8).topK(2).maxTokensPerRank(16).backend(Backend.GIN).fp8().build());
        refused("channels must be 0", () -> MoeConfig.builder().hidden(128).experts(8).topK(2).maxTokensPerRank(16).backend(Backend.GIN).channels(129).build());
    }

    @Test void rowSizes() {
        MoeConfig q = MoeConfig.fp8FromBf16(7168, 256, 8, 128, Backend.GIN);
        assertTrue(q.quantizes());
        assertEquals(2L * 7168, q.inputRowBytes());
        assertEquals(7168 + 16L * 14, q.dispatchRowBytes(), "56 f32 scales in 14 groups of 16 bytes");
        assertEquals(2L * 7168, q.combineRowBytes());
        MoeConfig b = MoeConfig.bf16(7168, 256, 8, 128, Backend.HOST);
        assertFalse(b.quantizes());
        assertEquals(2L * 7168, b.dispatchRowBytes());
    }
}
