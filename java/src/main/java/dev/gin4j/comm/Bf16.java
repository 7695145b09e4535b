package dev.gin4j.comm;

/**
 * bf16 values as Java {@code short} bits (the upper half of an f32), for filling and reading
 * {@link DType#BF16} buffers on the host: Java has f16 conversions but none for bf16.
 */
public final class Bf16 {
    private Bf16() {}

    /**
     * f32 to bf16, rounded to nearest even, as the kernels round; a NaN stays a (quiet) NaN.
     *
     * @param f the f32 value
     * @return its bf16 bits
     */
    public static short fromFloat(float f) {
        int bits = Float.floatToRawIntBits(f);
        if (Float.isNaN(f)) return (short) ((bits >>> 16) | 0x0040);
        return (short) ((bits + 0x7fff + ((bits >>> 16) & 1)) >>> 16);
    }

    /**
     * bf16 bits to f32 (exact).
     *
     * @param bits the bf16 bits (the upper half of an f32)
     * @return the f32 value
     */
    public static float toFloat(short bits) { return Float.intBitsToFloat((bits & 0xffff) << 16); }
}
