package dev.gin4j.comm;

/** Element types the exchanges are sized in (the bytes are moved as they are). */
public enum DType {
    /** 8-bit integer. */
    INT8(1),
    /** fp8 e4m3: e4m3fn (max 448) on NVIDIA, e4m3fnuz (max 240) on gfx942, the format each one's fp8 units take. */
    FP8_E4M3(1),
    /** bfloat16. */
    BF16(2),
    /** IEEE half precision. */
    FP16(2),
    /** IEEE single precision. */
    FP32(4),
    /** 32-bit integer. */
    INT32(4),
    /** 64-bit integer. */
    INT64(8);

    private final int bytes;
    DType(int bytes) { this.bytes = bytes; }
    /** {@return the bytes per element} */
    public int bytes() { return bytes; }
}
