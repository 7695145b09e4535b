package dev.gin4j.moe;

import dev.gin4j.comm.Backend;
import dev.gin4j.comm.DType;

/**
 * Shape of an expert-parallel exchange: hidden size, number of experts (split evenly over the
 * ranks), top-k, the most tokens a rank sends in one call, the element type of the dispatched rows,
 * the backend, and the element type of the {@code x} that {@code dispatch} takes.
 * {@link DType#BF16} rows: {@code 2 * hidden} bytes. {@link DType#FP8_E4M3}: scaled fp8 rows
 * ({@link Fp8Rows}: hidden e4m3 codes, then one f32 scale per 128 elements),
 * {@code hidden % 16 == 0}; {@code x} is either such rows ({@link #fp8}) or bf16 rows that the
 * dispatch quantizes itself ({@link #fp8FromBf16}). Expert outputs and the combine's result are
 * bf16 either way.
 * <p>{@code channels}: how much of the GPU the GIN kernels take. A dispatch or combine runs 2 x
 * channels blocks of 512 threads, one per SM. 0 (the default) = half the SMs of the smallest GPU,
 * at most 128 (on an H200 every SM): fastest alone. Fewer leave SMs to compute kernels that run beside
 * the exchange on other streams, at the exchange's cost ({@link #withChannels}; the README has the
 * measured trade). Every rank must use the same configuration, this included.
 * <p>{@code expertAlignment} (DeepEP's {@code expert_alignment}; 1, the default, packs the rows):
 * each local expert's block of received rows starts at a multiple of it, for a grouped GEMM whose
 * tiles must not straddle two experts. The rows between one expert's last row and the next
 * expert's start are padding: no call writes or reads them (they keep whatever the buffer held),
 * the combine never reads their expert outputs. {@link MoeDispatch#offsets()} gives the starts.
 * The receive capacity grows by {@code localExperts x (expertAlignment - 1)} rows. 1 to
 * {@value #MAX_EXPERT_ALIGNMENT}; it only places the rows a rank receives, so ranks may differ in
 * it, inside a node and across nodes.
 *
 * @param hidden          elements per token row
 * @param experts         experts in all, split evenly over the ranks
 * @param topK            experts each token is routed to
 * @param maxTokens       the most tokens one rank dispatches in one call
 * @param dtype           the dispatched rows' type: BF16 or FP8_E4M3 (scaled fp8 rows)
 * @param backend         GIN or HOST
 * @param input           the type of the dispatch's x: dtype, or BF16 for an fp8 dispatch that quantizes
 * @param channels        0 (half the SMs of the smallest GPU) or 1 to 128
 * @param expertAlignment each local expert's first received row is a multiple of it (1 to {@value #MAX_EXPERT_ALIGNMENT})
 */
public record MoeConfig(int hidden, int experts, int topK, int maxTokens, DType dtype, Backend backend, DType input, int channels, int expertAlignment) {
    /** The largest {@code expertAlignment} the kernels take (MOE_MAX_ALIGNMENT). */
    public static final int MAX_EXPERT_ALIGNMENT = 1024;

    /**
     * Checks every field against the kernels' limits, naming the one that is wrong and its valid range.
     * @throws IllegalArgumentException naming the field that is out of range, or null, and its valid range
     */
    public MoeConfig {
        if (hidden < 1) throw new IllegalArgumentException("hidden must be >= 1, got " + hidden);
        if (experts < 1 || experts > 2048) throw new IllegalArgumentException("experts must be in [1, 2048], got " + experts);
        if (topK < 1 || topK > 32 || topK > experts) throw new IllegalArgumentException("topK must be in [1, min(32, experts)], got " + topK);
        if (maxTokens < 1) throw new IllegalArgumentException("maxTokens must be >= 1, got " + maxTokens);
        if (backend == null) throw new IllegalArgumentException("backend must be Backend.GIN or Backend.HOST, got null");
        if (dtype == null || input == null) throw new IllegalArgumentException("dtype and input must be given (BF16 or FP8_E4M3), got " + dtype + " / " + input);
        if (dtype != DType.BF16 && dtype != DType.FP8_E4M3)
            throw new IllegalArgumentException("MoE rows are BF16 or FP8_E4M3 (scaled fp8 rows), got " + dtype);
        if (dtype == DType.FP8_E4M3 && !Fp8Rows.hiddenOk(hidden))
            throw new IllegalArgumentException("FP8_E4M3 rows need hidden to be a positive multiple of 16, got " + hidden);
        if (input != dtype && input != DType.BF16)
            throw new IllegalArgumentException("dispatch input must be the row type (" + dtype + ") or BF16 (quantized by the dispatch), got " + input);
        if (channels < 0 || channels > 128)
            throw new IllegalArgumentException("channels must be 0 (half the SMs, the whole GPU) or in [1, 128] (2 x channels SMs), got " + channels);
        if (expertAlignment < 1 || expertAlignment > MAX_EXPERT_ALIGNMENT)
            throw new IllegalArgumentException("expertAlignment must be in [1, " + MAX_EXPERT_ALIGNMENT + "] rows (1: packed), got " + expertAlignment);
    }

    /**
     * Packed expert blocks (expertAlignment 1).
     * @param hidden    elements per token row
     * @param experts   experts in all, split evenly over the ranks
     * @param topK      experts each token is routed to
     * @param maxTokens the most tokens one rank dispatches in one call
     * @param dtype     the dispatched rows' type: BF16 or FP8_E4M3 (scaled fp8 rows)
     * @param backend   GIN or HOST
     * @param input     the type of the dispatch's x: dtype, or BF16 for an fp8 dispatch that quantizes
     * @param channels  0 (half the SMs of the smallest GPU) or 1 to 128
     * @throws IllegalArgumentException naming the value that is out of range and its valid range
     */
    public MoeConfig(int hidden, int experts, int topK, int maxTokens, DType dtype, Backend backend, DType input, int channels) {
        this(hidden, experts, topK, maxTokens, dtype, backend, input, channels, 1);
    }

    /**
     * The channel count chosen from the GPUs (0).
     * @param hidden    elements per token row
     * @param experts   experts in all, split evenly over the ranks
     * @param topK      experts each token is routed to
     * @param maxTokens the most tokens one rank dispatches in one call
     * @param dtype     the dispatched rows' type: BF16 or FP8_E4M3 (scaled fp8 rows)
     * @param backend   GIN or HOST
     * @param input     the type of the dispatch's x: dtype, or BF16 for an fp8 dispatch that quantizes
     * @throws IllegalArgumentException naming the value that is out of range and its valid range
     */
    public MoeConfig(int hidden, int experts, int topK, int maxTokens, DType dtype, Backend backend, DType input) {
        this(hidden, experts, topK, maxTokens, dtype, backend, input, 0, 1);
    }

    /**
     * The dispatch takes x of the row type itself.
     * @param hidden    elements per token row
     * @param experts   experts in all, split evenly over the ranks
     * @param topK      experts each token is routed to
     * @param maxTokens the most tokens one rank dispatches in one call
     * @param dtype     the dispatched rows' type: BF16 or FP8_E4M3 (scaled fp8 rows)
     * @param backend   GIN or HOST
     * @throws IllegalArgumentException naming the value that is out of range and its valid range
     */
    public MoeConfig(int hidden, int experts, int topK, int maxTokens, DType dtype, Backend backend) {
        this(hidden, experts, topK, maxTokens, dtype, backend, dtype, 0, 1);
    }

    /**
     * The same with the GIN kernels on 2 x {@code channels} SMs (1 to 128; 0 = half the SMs of the smallest GPU).
     * @param channels 0, or 1 to 128
     * @return the configuration with that channel count
     * @throws IllegalArgumentException for a count outside [0, 128]
     */
    public MoeConfig withChannels(int channels) {
        return new MoeConfig(hidden, experts, topK, maxTokens, dtype, backend, input, channels, expertAlignment);
    }

    /**
     * The same with each local expert's received rows starting at a multiple of {@code rows}
     * (1 to {@value #MAX_EXPERT_ALIGNMENT}; 1: packed), as the class comment describes.
     * @param rows the alignment in rows
     * @return the configuration with that alignment
     */
    public MoeConfig withExpertAlignment(int rows) {
        return new MoeConfig(hidden, experts, topK, maxTokens, dtype, backend, input, channels, rows);
    }

    /**
     * Bf16 rows in and out. The four sizes are positional: {@code bf16(4096, 256, 8, 7168, GIN)}
     * (hidden and maxTokens swapped) is a valid shape too and cannot be refused here; {@link #builder()}
     * names each value instead.
     * @param hidden    elements per token row
     * @param experts   experts in all, split evenly over the ranks
     * @param topK      experts each token is routed to
     * @param maxTokens the most tokens one rank dispatches in one call
     * @param backend   GIN or HOST
     * @return the configuration
     * @throws IllegalArgumentException naming the value that is out of range and its valid range
     */
    public static MoeConfig bf16(int hidden, int experts, int topK, int maxTokens, Backend backend) {
        return new MoeConfig(hidden, experts, topK, maxTokens, DType.BF16, backend);
    }

    /**
     * Dispatch of scaled fp8 rows that x already holds ({@link Fp8Rows}); expert outputs and the combine stay bf16.
     * @param hidden    elements per token row, a positive multiple of 16
     * @param experts   experts in all, split evenly over the ranks
     * @param topK      experts each token is routed to
     * @param maxTokens the most tokens one rank dispatches in one call
     * @param backend   GIN or HOST
     * @return the configuration
     * @throws IllegalArgumentException naming the value that is out of range and its valid range
     */
    public static MoeConfig fp8(int hidden, int experts, int topK, int maxTokens, Backend backend) {
        return new MoeConfig(hidden, experts, topK, maxTokens, DType.FP8_E4M3, backend);
    }

    /**
     * Dispatch of scaled fp8 rows made from bf16 x by the dispatch itself, as {@link Fp8Rows#quantize}
     * would make them: x is [T][hidden] bf16, the received rows are fp8 rows; expert outputs and the
     * combine stay bf16.
     * @param hidden    elements per token row, a positive multiple of 16
     * @param experts   experts in all, split evenly over the ranks
     * @param topK      experts each token is routed to
     * @param maxTokens the most tokens one rank dispatches in one call
     * @param backend   GIN or HOST
     * @return the configuration
     * @throws IllegalArgumentException naming the value that is out of range and its valid range
     */
    public static MoeConfig fp8FromBf16(int hidden, int experts, int topK, int maxTokens, Backend backend) {
        return new MoeConfig(hidden, experts, topK, maxTokens, DType.FP8_E4M3, backend, DType.BF16);
    }

    /**
     * A builder that names every value, so that two sizes cannot be swapped unnoticed:
     * {@code MoeConfig.builder().hidden(7168).experts(256).topK(8).maxTokensPerRank(4096).backend(Backend.GIN).bf16().build()}.
     * hidden, experts, topK, maxTokensPerRank and backend must be set; the rows are bf16 and the
     * channels chosen from the GPUs unless set.
     * @return a new builder with no value set
     */
    public static Builder builder() { return new Builder(); }

    /**
     * Collects a configuration value by value; {@link #build()} checks it as the constructor does and
     * names any required value that was not set. Each setter replaces an earlier call's value.
     */
    public static final class Builder {
        private Integer hidden, experts, topK, maxTokens;
        private Backend backend;
        private DType dtype = DType.BF16, input = DType.BF16;
        private int channels, expertAlignment = 1;

        private Builder() {}

        /**
         * Elements per token row (the model's hidden size).
         * @param hidden elements per token row
         * @return this builder
         */
        public Builder hidden(int hidden) { this.hidden = hidden; return this; }

        /**
         * Experts in all, split evenly over the ranks.
         * @param experts experts in all
         * @return this builder
         */
        public Builder experts(int experts) { this.experts = experts; return this; }

        /**
         * Experts each token is routed to.
         * @param topK experts per token
         * @return this builder
         */
        public Builder topK(int topK) { this.topK = topK; return this; }

        /**
         * The most tokens one rank sends in one dispatch (the record's {@code maxTokens}).
         * @param maxTokens the most tokens per rank and dispatch
         * @return this builder
         */
        public Builder maxTokensPerRank(int maxTokens) { this.maxTokens = maxTokens; return this; }

        /**
         * {@link Backend#GIN} or {@link Backend#HOST}.
         * @param backend who moves the rows
         * @return this builder
         */
        public Builder backend(Backend backend) { this.backend = backend; return this; }

        /**
         * Bf16 x and bf16 dispatched rows (the default).
         * @return this builder
         */
        public Builder bf16() { dtype = DType.BF16; input = DType.BF16; return this; }

        /**
         * Scaled fp8 rows that x already holds ({@link Fp8Rows}), as {@link MoeConfig#fp8}.
         * @return this builder
         */
        public Builder fp8() { dtype = DType.FP8_E4M3; input = DType.FP8_E4M3; return this; }

        /**
         * Bf16 x quantized into scaled fp8 rows by the dispatch, as {@link MoeConfig#fp8FromBf16}.
         * @return this builder
         */
        public Builder fp8FromBf16() { dtype = DType.FP8_E4M3; input = DType.BF16; return this; }

        /**
         * The GIN kernels on 2 x {@code channels} SMs (1 to 128), or 0 (the default) to choose from the GPUs, as {@link MoeConfig#withChannels}.
         * @param channels 0, or 1 to 128
         * @return this builder
         */
        public Builder channels(int channels) { this.channels = channels; return this; }

        /**
         * Each local expert's received rows start at a multiple of {@code rows} (1, the default: packed), as {@link MoeConfig#withExpertAlignment}.
         * @param rows the alignment in rows, 1 to {@value MoeConfig#MAX_EXPERT_ALIGNMENT}
         * @return this builder
         */
        public Builder expertAlignment(int rows) { this.expertAlignment = rows; return this; }

        /**
         * The configuration.
         * @return the configuration, checked as the constructor checks it
         * @throws IllegalArgumentException naming the required values not set, or the value out of range
         */
        public MoeConfig build() {
            java.util.List<String> missing = new java.util.ArrayList<>();
            if (hidden == null) missing.add("hidden(int)");
            if (experts == null) missing.add("experts(int)");
            if (topK == null) missing.add("topK(int)");
            if (maxTokens == null) missing.add("maxTokensPerRank(int)");
            if (backend == null) missing.add("backend(Backend)");
            if (!missing.isEmpty()) throw new IllegalArgumentException("MoeConfig.builder(): set " + String.join(", ", missing) + " before build()");
            return new MoeConfig(hidden, experts, topK, maxTokens, dtype, backend, input, channels, expertAlignment);
        }
    }

    /** {@return true if the dispatch quantizes bf16 x into fp8 rows} */
    public boolean quantizes() { return dtype == DType.FP8_E4M3 && input == DType.BF16; }

    /** {@return the bytes of one row of the dispatch's input x} */
    public long inputRowBytes() { return input == DType.FP8_E4M3 ? Fp8Rows.rowBytes(hidden) : 2L * hidden; }

    /** {@return the bytes of one dispatched row (the received rows)} */
    public long dispatchRowBytes() { return dtype == DType.FP8_E4M3 ? Fp8Rows.rowBytes(hidden) : 2L * hidden; }

    /** {@return the bytes of one bf16 row of the expert outputs and of the combine's result} */
    public long combineRowBytes() { return 2L * hidden; }
}
