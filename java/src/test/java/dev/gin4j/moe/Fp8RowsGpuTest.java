package dev.gin4j.moe;

import dev.gin4j.gpu.Device;
import dev.gin4j.gpu.DeviceBuffer;
import dev.gin4j.gpu.GpuRuntime;
import dev.gin4j.gpu.Stream;
import dev.gin4j.testing.Gpus;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.SplittableRandom;

import static org.junit.jupiter.api.Assertions.*;

/** {@link Fp8Rows#quantize} on one GPU: row layout, scales, and every code within half a step of its value. */
@Tag("gpu")
class Fp8RowsGpuTest {
    /** Decodes scaled fp8 rows to [tokens][hidden] floats (e4m3fn, or e4m3fnuz on gfx942). */
    static float[] decode(byte[] rows, int tokens, int hidden, boolean fnuz) {
        long rb = Fp8Rows.rowBytes(hidden);
        MemorySegment m = MemorySegment.ofArray(rows);
        float[] out = new float[tokens * hidden];
        for (int t = 0; t < tokens; t++) {
            for (int h = 0; h < hidden; h++) {
                float scale = m.get(ValueLayout.JAVA_FLOAT_UNALIGNED, t * rb + hidden + 4L * (h / 128));
                out[t * hidden + h] = e4m3(rows[(int) (t * rb + h)] & 0xff, fnuz) * scale;
            }
        }
        return out;
    }

    static float e4m3(int c, boolean fnuz) {
        int bias = fnuz ? 8 : 7, e = (c >> 3) & 15, m = c & 7;
        if (fnuz && c == 0x80) return Float.NaN;
        if (!fnuz && (c & 0x7f) == 0x7f) return Float.NaN;
        float mag = e == 0 ? Math.scalb((float) m, -(bias + 2)) : Math.scalb(1f + m / 8f, e - bias);
        return (c & 0x80) != 0 ? -mag : mag;
    }

    @Test void quantizeRoundTrips() {
        GpuRuntime rt = Gpus.runtimeWithDevices(1);
        Gpus.requireKernels(rt, "moe_host");
        Device dev = rt.devices().getFirst();
        boolean fnuz = dev.arch().startsWith("gfx");
        float max = Fp8Rows.maxValue(dev);
        SplittableRandom random = new SplittableRandom();
        try (Arena a = Arena.ofShared(); Stream s = dev.createStream(); Fp8Rows q = new Fp8Rows(dev)) {
            for (int[] shape : new int[][] {{272, 37}, {7168, 16}, {16, 1}}) {
                int hidden = shape[0], tokens = shape[1], scales = Fp8Rows.scales(hidden);
                long rb = Fp8Rows.rowBytes(hidden);
                short[] x = new short[tokens * hidden];
                for (int t = 0; t < tokens; t++) {
                    for (int b = 0; b < scales; b++) {
                        int exp = random.nextInt(-30, 30);
                        boolean zero = (t + b) % 5 == 0;
                        for (int h = b * 128; h < Math.min(hidden, b * 128 + 128); h++) {
                            float v = zero ? 0f : Math.scalb((float) random.nextDouble(-1, 1), exp - random.nextInt(12));
                            x[t * hidden + h] = MoeGpuTest.bf16(v);
                        }
                    }
                }
                DeviceBuffer dx = dev.allocate(2L * x.length, a);
                dx.copyFromHost(MemorySegment.ofArray(x));
                DeviceBuffer out = dev.allocate(tokens * rb + 64, a);
                out.fill((byte) 0x5a, s);
                q.quantize(dx, tokens, hidden, out, s);
                q.checkErrors(s);
                byte[] rows = out.toByteArray();
                for (int i = (int) (tokens * rb); i < rows.length; i++) assertEquals((byte) 0x5a, rows[i], "byte " + i + " past the rows was written");
                MemorySegment m = MemorySegment.ofArray(rows);
                float[] got = decode(rows, tokens, hidden, fnuz);
                for (int t = 0; t < tokens; t++) {
                    for (int b = 0; b < scales; b++) {
                        float amax = 0;
                        for (int h = b * 128; h < Math.min(hidden, b * 128 + 128); h++) amax = Math.max(amax, Math.abs(MoeGpuTest.f32(x[t * hidden + h])));
                        float scale = m.get(ValueLayout.JAVA_FLOAT_UNALIGNED, t * rb + hidden + 4L * b);
                        assertEquals(amax == 0 ? 1f : amax / max, scale, "scale of token " + t + " block " + b + " (H=" + hidden + ")");
                        for (int h = b * 128; h < Math.min(hidden, b * 128 + 128); h++) {
                            float want = MoeGpuTest.f32(x[t * hidden + h]);
                            // half a step of e4m3: 2^-4 relative for normals, 2^-(bias+3) absolute (x scale) for subnormals
                            double bound = Math.max(Math.abs(want) / 16, Math.scalb(1.0, fnuz ? -11 : -10) * scale) * 1.0001;
                            if (!(Math.abs(got[t * hidden + h] - want) <= bound))
                                fail("H=" + hidden + " token " + t + " element " + h + ": " + want + " decodes to " + got[t * hidden + h] + " (scale " + scale + ")");
                        }
                    }
                    for (int p = scales; p < (scales + 3) / 4 * 4; p++)
                        assertEquals(0f, m.get(ValueLayout.JAVA_FLOAT_UNALIGNED, t * rb + hidden + 4L * p), "padding scale " + p + " of token " + t);
                }
            }
            DeviceBuffer small = dev.allocate(1024, a);
            IllegalArgumentException odd = assertThrows(IllegalArgumentException.class, () -> q.quantize(small, 1, 200, small, s));
            assertTrue(odd.getMessage().contains("multiple of 16"), odd.getMessage());
            DeviceBuffer x = dev.allocate(2 * 8 * 128, a);
            IllegalArgumentException shortOut = assertThrows(IllegalArgumentException.class, () -> q.quantize(x, 8, 128, small, s));
            assertTrue(shortOut.getMessage().contains("out has"), shortOut.getMessage());
        }
    }
}
