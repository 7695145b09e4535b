package dev.gin4j.a2a;

/** Element types the exchanges are sized in (the bytes are moved as they are). */
public enum DType {
    INT8(1), BF16(2), FP16(2), FP32(4), INT32(4), INT64(8);

    private final int bytes;
    DType(int bytes) { this.bytes = bytes; }
    public int bytes() { return bytes; }
}
