package dev.gin4j.moe;

import dev.gin4j.internal.gpu.KernelLibrary;
import dev.gin4j.bindings.moe.MoeFp8QuantizeArgs;
import dev.gin4j.comm.ErrorCheck;
import dev.gin4j.internal.comm.KernelErrors;
import dev.gin4j.gpu.CodeObject;
import dev.gin4j.gpu.Device;
import dev.gin4j.gpu.DeviceBuffer;
import dev.gin4j.gpu.Kernel;
import dev.gin4j.gpu.KernelArgs;
import dev.gin4j.gpu.LaunchConfig;
import dev.gin4j.gpu.NativeResource;
import dev.gin4j.gpu.Stream;

import java.lang.foreign.Arena;


/**
 * Scaled fp8 rows, the rows an fp8 {@link MoeAllToAll} dispatches: per token, {@code hidden} e4m3
 * codes (e4m3fn on NVIDIA, e4m3fnuz on gfx942), then one f32 scale per 128 elements (the last
 * block may be shorter), padded with zeros to a multiple of 16 bytes; element h stands for
 * {@code e4m3(code[h]) * scale[h / 128]}. Packed in one row, a token moves as one contiguous copy.
 * A grouped GEMM reads the codes with a leading dimension of {@link #rowBytes} and the scales at
 * byte offset {@code hidden} of each row. {@link #quantize} makes such rows from bf16 rows on the
 * device (gin-kernels/src/moe_host.cu, {@code moe_fp8_quantize}).
 */
public final class Fp8Rows extends NativeResource {
    private final Device device;
    private final Arena arena = Arena.ofShared();
    private final CodeObject code;
    private final Kernel kernel;
    private final KernelArgs args;
    private final KernelErrors errors;

    /**
     * Loads the kernel on {@code device}.
     * @param device the GPU whose rows it quantizes; close the quantizer to unload the kernel
     */
    public Fp8Rows(Device device) {
        this.device = device;
        try (Stream s = device.createStream()) {
            this.code = KernelLibrary.load(device, "moe_host");
            this.kernel = code.kernel("moe_fp8_quantize");
            this.args = KernelArgs.ofStruct(arena, MoeFp8QuantizeArgs.layout());
            this.errors = new KernelErrors(device, arena, s);
            s.synchronize();
        } catch (RuntimeException e) {
            close();
            throw e;
        }
    }

    /**
     * True if fp8 rows can hold {@code hidden} elements: a positive multiple of 16 (16-byte code chunks).
     * @param hidden elements per row
     * @return whether {@code hidden} is at least 16 and a multiple of 16
     */
    public static boolean hiddenOk(int hidden) { return hidden >= 16 && hidden % 16 == 0; }

    /**
     * f32 scales per row: one per 128 elements.
     * @param hidden elements per row
     * @return {@code ceil(hidden / 128)}
     */
    public static int scales(int hidden) { return (hidden + 127) / 128; }

    /**
     * Bytes of one row: hidden codes, then the scales padded to a multiple of 4 (16 bytes).
     * @param hidden elements per row (not checked here: see {@link #hiddenOk})
     * @return the row's size and stride in bytes, a multiple of 16 where {@link #hiddenOk} holds
     */
    public static long rowBytes(int hidden) { return hidden + 16L * ((scales(hidden) + 3) / 4); }

    /**
     * The largest code magnitude of this device's format: 448 (e4m3fn, NVIDIA) or 240 (e4m3fnuz: AMD, whose kernels are built for gfx942).
     * @param device the GPU whose fp8 format counts
     * @return 448 or 240
     */
    public static float maxValue(Device device) { return device.arch().startsWith("gfx") ? 240f : 448f; }

    /**
     * Queues {@code out[t] = quantize(x[t])} for {@code tokens} bf16 rows of {@code hidden} elements:
     * per 128-element block, scale = amax / {@link #maxValue} (1 for an all-zero block), codes
     * rounded to nearest even and saturated. x must be 16-byte aligned, out 8-byte aligned.
     * @param x bf16 {@code [tokens][hidden]} on this quantizer's device, 16-byte aligned
     * @param tokens rows to quantize, at least 0
     * @param hidden elements per row, a positive multiple of 16 ({@link #hiddenOk})
     * @param out at least {@code tokens x rowBytes(hidden)} bytes on this device, 8-byte aligned
     * @param stream the stream it is queued on, on this device
     * @throws IllegalArgumentException for a hidden that fp8 rows cannot hold, a negative token count, or a
     *         buffer too small, misaligned or on another device (or a stream on another device)
     */
    public void quantize(DeviceBuffer x, int tokens, int hidden, DeviceBuffer out, Stream stream) {
        ensureOpen();
        if (!hiddenOk(hidden)) throw new IllegalArgumentException("hidden must be a positive multiple of 16 for fp8 rows, got " + hidden);
        if (tokens < 0) throw new IllegalArgumentException("tokens must be >= 0, got " + tokens);
        long needX = 2L * tokens * hidden, needOut = tokens * rowBytes(hidden);
        if (x.byteSize() < needX) throw new IllegalArgumentException("x has " + x.byteSize() + " bytes; [" + tokens + "][" + hidden + "] bf16 needs " + needX);
        if (out.byteSize() < needOut) throw new IllegalArgumentException("out has " + out.byteSize() + " bytes; " + tokens + " fp8 rows of " + rowBytes(hidden) + " bytes need " + needOut);
        if (x.device() != device) throw new IllegalArgumentException("x is on " + x.device() + ", this quantizer on " + device);
        if (out.device() != device) throw new IllegalArgumentException("out is on " + out.device() + ", this quantizer on " + device);
        if (stream.device() != device) throw new IllegalArgumentException("the stream is on " + stream.device() + ", this quantizer on " + device);
        if (x.address() % 16 != 0) throw new IllegalArgumentException("x must be 16-byte aligned, its address is 0x" + Long.toHexString(x.address()));
        if (out.address() % 8 != 0) throw new IllegalArgumentException("out must be 8-byte aligned, its address is 0x" + Long.toHexString(out.address()));
        setQuantizeArgs(args, x, tokens, hidden, out, errors.buffer());
        stream.noteUse(this);
        kernel.launch(stream, launchConfig(device, tokens, hidden), args);
    }

    /** The fields of moe_fp8_quantize's MoeFp8QuantizeArgs (also launched by {@link MoeAllToAll}). */
    static void setQuantizeArgs(KernelArgs args, DeviceBuffer x, int tokens, int hidden, DeviceBuffer out, DeviceBuffer errorFlags) {
        args.setPointerField(MoeFp8QuantizeArgs.x$offset(), x).setPointerField(MoeFp8QuantizeArgs.out$offset(), out)
                .setPointerField(MoeFp8QuantizeArgs.errorFlags$offset(), errorFlags);
        MoeFp8QuantizeArgs.numTokens(args.struct(), tokens);
        MoeFp8QuantizeArgs.hidden(args.struct(), hidden);
    }

    /** Grid of {@code moe_fp8_quantize} for {@code tokens} rows (also launched by {@link MoeAllToAll}). */
    static LaunchConfig launchConfig(Device device, int tokens, int hidden) {
        long blocks = (long) tokens * scales(hidden);  // 128-element blocks; a warp takes 4 at a time (NVIDIA)
        int grid = (int) Math.max(1, Math.min(8L * device.multiprocessors(), (blocks + 31) / 32));  // 8 warps per 256-thread block
        return LaunchConfig.of(grid, 256);
    }

    /**
     * The same into new rows allocated in {@code arena} (at least 16 bytes), returned as queued.
     * @param x bf16 {@code [tokens][hidden]} on this quantizer's device, 16-byte aligned
     * @param tokens rows to quantize, at least 0
     * @param hidden elements per row, a positive multiple of 16 ({@link #hiddenOk})
     * @param arena owns the new rows: they are freed when it closes
     * @param stream the stream it is queued on, on this device
     * @return the new rows, {@code tokens x rowBytes(hidden)} bytes (at least 16), written once the stream gets there
     * @throws IllegalArgumentException as {@link #quantize(DeviceBuffer, int, int, DeviceBuffer, Stream)}
     */
    public DeviceBuffer quantize(DeviceBuffer x, int tokens, int hidden, Arena arena, Stream stream) {
        ensureOpen();
        if (!hiddenOk(hidden)) throw new IllegalArgumentException("hidden must be a positive multiple of 16 for fp8 rows, got " + hidden);
        DeviceBuffer out = device.allocate(Math.max(16, tokens * rowBytes(hidden)), arena);
        quantize(x, tokens, hidden, out, stream);
        return out;
    }

    /**
     * Synchronizes {@code stream} and throws if the kernel refused its arguments.
     * @param stream the stream the quantizations were queued on
     * @throws dev.gin4j.comm.CommException naming what the kernel reported (the report is cleared, so the next check starts clean)
     */
    public void checkErrors(Stream stream) {
        ensureOpen();
        errors.check("fp8 quantize", stream);
    }

    /**
     * The check of {@link #checkErrors(Stream)}, reported later without waiting now (see
     * {@link ErrorCheck}): queued on {@code stream} after the quantizations already there.
     * @param stream the stream the quantizations were queued on
     * @return the check, to poll or await
     * @throws IllegalStateException when the stream captures a graph
     * @throws IllegalArgumentException when the stream is on another device
     */
    public ErrorCheck errorsAfter(Stream stream) {
        ensureOpen();
        return KernelErrors.later("fp8 quantize", this, java.util.List.of(errors), java.util.List.of(stream), null, null);
    }

    @Override protected void release() { releaseAll(() -> { if (code != null) code.close(); }, arena::close); }

    @Override public String describe() { return "fp8 row quantizer on " + device; }
}
