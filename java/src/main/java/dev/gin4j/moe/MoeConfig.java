package dev.gin4j.moe;

import dev.gin4j.a2a.Backend;
import dev.gin4j.a2a.DType;

/**
 * Shape of an expert-parallel exchange: hidden size, number of experts (split evenly over the
 * ranks), top-k, the most tokens a rank sends in one call, the element type (bf16) and the backend.
 */
public record MoeConfig(int hidden, int experts, int topK, int maxTokens, DType dtype, Backend backend) {
    public MoeConfig {
        if (hidden < 1) throw new IllegalArgumentException("hidden must be >= 1, got " + hidden);
        if (experts < 1 || experts > 2048) throw new IllegalArgumentException("experts must be in [1, 2048], got " + experts);
        if (topK < 1 || topK > 32 || topK > experts) throw new IllegalArgumentException("topK must be in [1, min(32, experts)], got " + topK);
        if (maxTokens < 1) throw new IllegalArgumentException("maxTokens must be >= 1, got " + maxTokens);
        if (dtype != DType.BF16) throw new IllegalArgumentException("only BF16 rows are supported so far, got " + dtype);
    }

    public static MoeConfig bf16(int hidden, int experts, int topK, int maxTokens, Backend backend) {
        return new MoeConfig(hidden, experts, topK, maxTokens, DType.BF16, backend);
    }

    public long rowBytes() { return 2L * hidden; }
}
