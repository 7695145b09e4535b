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
    private final int[] maxGrid, maxBlock; // the device's limits, read once
    private final long[] paramSizes;       // the compiled parameters' byte sizes; null where the runtime cannot tell
    private volatile KernelArgs checkedArgs; // the argument list last found to match them (a list's types never change)
    private volatile int maxDynamicShared;

    Kernel(CodeObject codeObject, String name, long function) {
        this.codeObject = codeObject;
        this.name = name;
        this.function = function;
        this.maxThreadsPerBlock = attribute(FunctionAttribute.MAX_THREADS_PER_BLOCK);
        this.maxDynamicShared = attribute(FunctionAttribute.MAX_DYNAMIC_SHARED_SIZE_BYTES);
        this.maxGrid = codeObject.device().maxGrid();
        this.maxBlock = codeObject.device().maxBlock();
        this.paramSizes = device().driver().kernelParamSizes(device().ordinal(), function);
    }

    /**
     * Refuses an argument list that does not match the compiled kernel's parameters (count and byte
     * sizes): the runtime would read past the list, or hand the kernel shifted values.
     */
    private void checkArgs(KernelArgs args) {
        if (paramSizes != null) {
            boolean same = args.count() == paramSizes.length;
            for (int i = 0; same && i < paramSizes.length; i++) same = args.type(i).size() == paramSizes[i];
            if (!same) {
                StringBuilder given = new StringBuilder();
                for (int i = 0; i < args.count(); i++) given.append(i == 0 ? "" : ", ").append(args.type(i).size());
                throw new IllegalArgumentException("kernel " + name + " takes " + paramSizes.length + " parameters of " + java.util.Arrays.toString(paramSizes)
                        + " bytes, the argument list has " + args.count() + " of [" + given + "] bytes");
            }
        }
        checkedArgs = args;
    }

    /** {@return the kernel's entry point name} */
    public String name() { return name; }
    /** {@return the device its code object is loaded on} */
    public Device device() { return codeObject.device(); }

    /** One of the runtime's attributes of the compiled kernel. */
    int attribute(FunctionAttribute attribute) {
        codeObject.ensureOpen();
        return device().driver().functionAttribute(device().ordinal(), function, attribute);
    }

    /** {@return the registers per thread} */
    public int registers() { return attribute(FunctionAttribute.NUM_REGS); }
    /** {@return the most threads per block this kernel can be launched with} */
    public int maxThreadsPerBlock() { return maxThreadsPerBlock; }
    /** {@return the static shared memory per block, in bytes} */
    public int staticSharedBytes() { return attribute(FunctionAttribute.SHARED_SIZE_BYTES); }

    /**
     * Raises the dynamic shared memory this kernel may use (needed above 48 KiB on NVIDIA).
     *
     * @param bytes the dynamic shared memory launches may then ask for, in bytes
     * @throws GpuException if the runtime refuses it (with the static shared memory it must fit {@link Device#maxSharedBytesPerBlock()})
     */
    public void setMaxDynamicSharedBytes(int bytes) {
        codeObject.ensureOpen();
        if (bytes < 0) throw new IllegalArgumentException("kernel " + name + ": dynamic shared memory must be >= 0 bytes, got " + bytes);
        try {
            device().driver().setMaxDynamicSharedMemory(device().ordinal(), function, bytes);
        } catch (GpuException e) {
            throw new GpuException("kernel " + name + " of " + codeObject.describe() + ": cannot allow " + bytes
                    + " bytes of dynamic shared memory (with its static shared memory it must fit Device.maxSharedBytesPerBlock())", e);
        }
        maxDynamicShared = bytes;
    }

    /**
     * Resident blocks per multiprocessor for this block size and dynamic shared memory.
     *
     * @param blockSize threads per block, at least 1
     * @param dynamicSharedBytes dynamic shared memory per block, in bytes
     * @return the number of blocks that fit on one multiprocessor at once
     */
    public int occupancy(int blockSize, int dynamicSharedBytes) {
        codeObject.ensureOpen();
        if (blockSize < 1) throw new IllegalArgumentException("kernel " + name + ": occupancy needs a block size >= 1, got " + blockSize);
        if (dynamicSharedBytes < 0) throw new IllegalArgumentException("kernel " + name + ": dynamic shared memory must be >= 0 bytes, got " + dynamicSharedBytes);
        return device().driver().occupancyBlocksPerMultiprocessor(device().ordinal(), function, blockSize, dynamicSharedBytes);
    }

    /**
     * Queues the kernel on {@code stream}.
     * @param stream the stream to queue on, of the kernel's device
     * @param config the grid, block and shared memory of the launch
     * @param args the kernel's arguments, every one set, matching its parameters
     * @throws IllegalArgumentException when the shape exceeds the device's or the kernel's limits
     * @throws GpuException when the runtime refuses the launch; its message names this kernel and the launch configuration
     */
    public void launch(Stream stream, LaunchConfig config, KernelArgs args) {
        codeObject.ensureOpen();
        Device device = device();
        if (stream.device() != device) throw new IllegalArgumentException("kernel " + name + " is loaded on " + device + " but the stream is on " + stream.device());
        if (config.threadsPerBlock() > maxThreadsPerBlock) {
            throw new IllegalArgumentException("kernel " + name + " allows at most " + maxThreadsPerBlock + " threads per block, got " + config.threadsPerBlock());
        }
        checkShape(name, config, maxGrid, maxBlock);
        if (config.sharedBytes() > maxDynamicShared) {
            throw new IllegalArgumentException("kernel " + name + " may use " + maxDynamicShared + " bytes of dynamic shared memory, asked for " + config.sharedBytes()
                    + " (raise it with setMaxDynamicSharedBytes)");
        }
        args.checkComplete(name);
        if (args != checkedArgs) checkArgs(args);  // once per argument list: a reference compare after that
        long streamHandle = stream.handle();
        stream.noteLaunch(codeObject, args);
        try {
            device.driver().ensureCurrent(device.ordinal());
            device.driver().launch(function, config.gridX(), config.gridY(), config.gridZ(), config.blockX(), config.blockY(), config.blockZ(),
                    config.sharedBytes(), streamHandle, args.params(), config.cooperative(), config.programmaticDependent());
        } catch (GpuException e) {
            throw new GpuException("kernel " + name + " of " + codeObject.describe() + " could not be launched with " + config, e);
        }
    }

    /** Refuses a grid or block larger than the device's ({x, y, z} limits). Integer compares only when it fits. */
    static void checkShape(String kernel, LaunchConfig c, int[] maxGrid, int[] maxBlock) {
        if (c.gridX() > maxGrid[0] || c.gridY() > maxGrid[1] || c.gridZ() > maxGrid[2]) {
            throw new IllegalArgumentException("kernel " + kernel + ": grid " + c.gridX() + "x" + c.gridY() + "x" + c.gridZ()
                    + " exceeds the device's largest grid " + maxGrid[0] + "x" + maxGrid[1] + "x" + maxGrid[2]);
        }
        if (c.blockX() > maxBlock[0] || c.blockY() > maxBlock[1] || c.blockZ() > maxBlock[2]) {
            throw new IllegalArgumentException("kernel " + kernel + ": block " + c.blockX() + "x" + c.blockY() + "x" + c.blockZ()
                    + " exceeds the device's largest block " + maxBlock[0] + "x" + maxBlock[1] + "x" + maxBlock[2]);
        }
    }

    @Override public String toString() { return "kernel " + name + " of " + codeObject.describe(); }
}
