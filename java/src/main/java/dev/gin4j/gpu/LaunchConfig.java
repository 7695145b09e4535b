package dev.gin4j.gpu;


/**
 * Grid and block shape, dynamic shared memory, whether the launch is cooperative, and whether it is a
 * programmatic dependent launch: the kernel may start while the kernel before it on the stream still
 * drains (NVIDIA sm_90+; ~1 us less per back-to-back launch), so it must wait
 * ({@code gin_wait_prior_grids}, griddepcontrol.wait) before it touches memory an earlier kernel
 * writes. Only kernels that do may be launched so. On AMD it is an ordinary launch.
 * {@link Kernel#launch} checks the shape against the device's largest grid and block and the
 * kernel's threads per block before it calls the runtime.
 *
 * @param gridX blocks in x
 * @param gridY blocks in y
 * @param gridZ blocks in z
 * @param blockX threads per block in x
 * @param blockY threads per block in y
 * @param blockZ threads per block in z
 * @param sharedBytes dynamic shared memory per block, in bytes
 * @param cooperative whether all blocks must be resident at once (grid-wide sync allowed)
 * @param programmaticDependent whether the kernel may start while the one before it on the stream drains
 */
public record LaunchConfig(int gridX, int gridY, int gridZ, int blockX, int blockY, int blockZ,
                           int sharedBytes, boolean cooperative, boolean programmaticDependent) {
    /** Checks the shape: every dimension at least 1, shared bytes >= 0, not both cooperative and programmatic-dependent. */
    public LaunchConfig {
        if (cooperative && programmaticDependent) throw new IllegalArgumentException("a launch is either cooperative or programmatic-dependent, not both");
        if (gridX < 1 || gridY < 1 || gridZ < 1) throw new IllegalArgumentException("grid " + gridX + "x" + gridY + "x" + gridZ + " must be at least 1 in every dimension");
        if (blockX < 1 || blockY < 1 || blockZ < 1) throw new IllegalArgumentException("block " + blockX + "x" + blockY + "x" + blockZ + " must be at least 1 in every dimension");
        if (sharedBytes < 0) throw new IllegalArgumentException("dynamic shared memory " + sharedBytes + " must be >= 0");
    }

    /**
     * A one-dimensional launch of {@code grid} blocks of {@code block} threads, no dynamic shared memory.
     *
     * @param grid the number of blocks
     * @param block threads per block
     * @return the launch configuration
     */
    public static LaunchConfig of(int grid, int block) { return new LaunchConfig(grid, 1, 1, block, 1, 1, 0, false, false); }
    /**
     * The same launch with {@code bytes} of dynamic shared memory per block.
     *
     * @param bytes dynamic shared memory per block, in bytes
     * @return the new configuration
     */
    public LaunchConfig withSharedBytes(int bytes) { return new LaunchConfig(gridX, gridY, gridZ, blockX, blockY, blockZ, bytes, cooperative, programmaticDependent); }
    /** {@return the same launch as a cooperative launch (all blocks resident at once, grid-wide sync allowed)} */
    public LaunchConfig asCooperative() { return new LaunchConfig(gridX, gridY, gridZ, blockX, blockY, blockZ, sharedBytes, true, programmaticDependent); }
    /**
     * {@return the same launch as a programmatic dependent launch} See the class comment: only for kernels that
     * wait for prior grids before their first memory access.
     */
    public LaunchConfig asProgrammaticDependent() { return new LaunchConfig(gridX, gridY, gridZ, blockX, blockY, blockZ, sharedBytes, cooperative, true); }
    /** {@return the threads per block: the product of the block dimensions} */
    public long threadsPerBlock() { return (long) blockX * blockY * blockZ; }

    /** "grid 4x1x1, block 256x1x1, 0 bytes of dynamic shared memory" and the launch kind, for messages. */
    @Override public String toString() {
        return "grid " + gridX + "x" + gridY + "x" + gridZ + ", block " + blockX + "x" + blockY + "x" + blockZ + ", " + sharedBytes + " bytes of dynamic shared memory"
                + (cooperative ? ", cooperative" : "") + (programmaticDependent ? ", programmatic dependent" : "");
    }
}
