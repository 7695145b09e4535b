package dev.gin4j.gpu;

import dev.gin4j.gpu.driver.Driver.FunctionAttribute;

/**
 * A kernel of a loaded {@link CodeObject}. Launches take a {@link KernelArgs} built once and
 * reused, so a launch allocates nothing; launch checks are plain field comparisons.
 */
public final class Kernel {
    private final CodeObject codeObject;
    private final String name;
    private final long function;
    private final int maxThreadsPerBlock;
    private volatile int maxDynamicShared;

    Kernel(CodeObject codeObject, String name, long function) {
        this.codeObject = codeObject;
        this.name = name;
        this.function = function;
        this.maxThreadsPerBlock = attribute(FunctionAttribute.MAX_THREADS_PER_BLOCK);
        this.maxDynamicShared = attribute(FunctionAttribute.MAX_DYNAMIC_SHARED_SIZE_BYTES);
    }

    public String name() { return name; }
    public Device device() { return codeObject.device(); }

    public int attribute(FunctionAttribute attribute) {
        codeObject.ensureOpen();
        return device().driver().functionAttribute(device().ordinal(), function, attribute);
    }

    public int registers() { return attribute(FunctionAttribute.NUM_REGS); }
    public int maxThreadsPerBlock() { return maxThreadsPerBlock; }
    public int staticSharedBytes() { return attribute(FunctionAttribute.SHARED_SIZE_BYTES); }

    /** Raises the dynamic shared memory this kernel may use (needed above 48 KiB on NVIDIA). */
    public void setMaxDynamicSharedBytes(int bytes) {
        device().driver().setMaxDynamicSharedMemory(device().ordinal(), function, bytes);
        maxDynamicShared = bytes;
    }

    /** Resident blocks per multiprocessor for this block size and dynamic shared memory. */
    public int occupancy(int blockSize, int dynamicSharedBytes) {
        return device().driver().occupancyBlocksPerMultiprocessor(device().ordinal(), function, blockSize, dynamicSharedBytes);
    }

    /** Queues the kernel on {@code stream}. */
    public void launch(Stream stream, LaunchConfig config, KernelArgs args) {
        codeObject.ensureOpen();
        Device device = device();
        if (stream.device() != device) throw new IllegalArgumentException("kernel " + name + " is loaded on " + device + " but the stream is on " + stream.device());
        if (config.threadsPerBlock() > maxThreadsPerBlock) {
            throw new IllegalArgumentException("kernel " + name + " allows at most " + maxThreadsPerBlock + " threads per block, got " + config.threadsPerBlock());
        }
        if (config.sharedBytes() > maxDynamicShared) {
            throw new IllegalArgumentException("kernel " + name + " may use " + maxDynamicShared + " bytes of dynamic shared memory, asked for " + config.sharedBytes()
                    + " (raise it with setMaxDynamicSharedBytes)");
        }
        args.checkComplete(name);
        device.driver().ensureCurrent(device.ordinal());
        device.driver().launch(function, config.gridX(), config.gridY(), config.gridZ(), config.blockX(), config.blockY(), config.blockZ(),
                config.sharedBytes(), stream.handle(), args.params(), config.cooperative(), config.programmaticDependent());
    }

    @Override public String toString() { return "kernel " + name + " of " + codeObject.describe(); }
}
