package dev.gin4j.a2a;

/** Element types the exchanges are sized in (the bytes are moved as they are). */
public enum DType {
    INT8(1),
    /** fp8 e4m3: e4m3fn (max 448) on NVIDIA, e4m3fnuz (max 240) on gfx942, the format each one's fp8 units take. */
    FP8_E4M3(1),
    BF16(2), FP16(2), FP32(4), INT32(4), INT64(8);

    private final int bytes;
    DType(int bytes) { this.bytes = bytes; }
    public int bytes() { return bytes; }
}
