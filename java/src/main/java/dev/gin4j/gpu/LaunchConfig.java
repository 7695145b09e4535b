package dev.gin4j.gpu;

/** Grid and block shape, dynamic shared memory and whether the launch is cooperative. */
public record LaunchConfig(int gridX, int gridY, int gridZ, int blockX, int blockY, int blockZ,
                           int sharedBytes, boolean cooperative) {
    public LaunchConfig {
        if (gridX < 1 || gridY < 1 || gridZ < 1) throw new IllegalArgumentException("grid " + gridX + "x" + gridY + "x" + gridZ + " must be at least 1 in every dimension");
        if (blockX < 1 || blockY < 1 || blockZ < 1) throw new IllegalArgumentException("block " + blockX + "x" + blockY + "x" + blockZ + " must be at least 1 in every dimension");
        if (sharedBytes < 0) throw new IllegalArgumentException("dynamic shared memory " + sharedBytes + " must be >= 0");
    }

    public static LaunchConfig of(int grid, int block) { return new LaunchConfig(grid, 1, 1, block, 1, 1, 0, false); }
    public LaunchConfig withSharedBytes(int bytes) { return new LaunchConfig(gridX, gridY, gridZ, blockX, blockY, blockZ, bytes, cooperative); }
    public LaunchConfig asCooperative() { return new LaunchConfig(gridX, gridY, gridZ, blockX, blockY, blockZ, sharedBytes, true); }
    public long threadsPerBlock() { return (long) blockX * blockY * blockZ; }
}
