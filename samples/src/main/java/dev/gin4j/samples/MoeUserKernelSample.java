package dev.gin4j.samples;

import dev.gin4j.comm.Backend;
import dev.gin4j.comm.CommGroup;
import dev.gin4j.gpu.CodeObject;
import dev.gin4j.gpu.Device;
import dev.gin4j.gpu.DeviceBuffer;
import dev.gin4j.gpu.GpuRuntime;
import dev.gin4j.gpu.Kernel;
import dev.gin4j.gpu.KernelArgs;
import dev.gin4j.gpu.LaunchConfig;
import dev.gin4j.gpu.Stream;
import dev.gin4j.moe.MoeAllToAll;
import dev.gin4j.moe.MoeConfig;
import dev.gin4j.moe.MoeDispatch;
import dev.gin4j.samples.SampleData.Inputs;
import dev.gin4j.samples.SampleData.PerGpu;

import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.lang.foreign.Arena;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Random;

import static dev.gin4j.gpu.KernelArgs.Type.I32;
import static dev.gin4j.gpu.KernelArgs.Type.POINTER;

/**
 * Your own kernel as the expert between dispatch and combine: {@code expert_scale_bf16}
 * (samples/kernels/expert_scale.cu) multiplies each received row by its local expert's scale (0.5,
 * 1 or 2), finding the row's expert from the dispatch's per-expert counts on the device, so nothing
 * waits for the host between the two exchanges. Its cubin is built by samples/kernels/build (run by
 * the samples' Maven build where nvcc exists) into the samples jar, or read from the folder
 * {@code GIN4J_SAMPLE_KERNELS} names ({@code <arch>/expert_scale.cubin}), and loaded with
 * {@link Device#loadCodeObject}. 128 tokens per GPU, hidden 512, 8 experts (or the next multiple of
 * the GPU count), top-2; y is checked element by element against a CPU reference on every GPU.
 * Exits with status 2 and says so when no cubin for the GPU's architecture is found.
 */
public final class MoeUserKernelSample {
    static final String OBJECT = "expert_scale";

    public static void main(String[] args) {
        List<Device> devices = GpuRuntime.get().devices();
        byte[][] images = new byte[devices.size()][];
        for (int r = 0; r < devices.size(); r++) {
            images[r] = cubin(devices.get(r).arch());
            if (images[r] == null) {
                System.err.println("MoeUserKernelSample: no code object " + devices.get(r).arch() + "/" + OBJECT + ".cubin for " + devices.get(r)
                        + ", neither in the folder GIN4J_SAMPLE_KERNELS names (" + System.getenv("GIN4J_SAMPLE_KERNELS") + ") nor in the samples jar"
                        + " (built there by samples/kernels/build when the samples are built where nvcc exists). Build it: samples/kernels/build DIR "
                        + devices.get(r).arch() + ", then run with GIN4J_SAMPLE_KERNELS=DIR");
                System.exit(2);
            }
        }
        int n = devices.size(), tokens = 128, hidden = 512, experts = (8 + n - 1) / n * n, topK = 2;
        long seed = System.nanoTime();
        Random random = new Random(seed);
        try (CommGroup group = CommGroup.initAll(devices); Arena arena = Arena.ofShared();
             MoeAllToAll moe = MoeAllToAll.create(group, MoeConfig.bf16(hidden, experts, topK, tokens, Backend.GIN));
             PerGpu<Stream> streams = new PerGpu<>(); PerGpu<CodeObject> code = new PerGpu<>()) {
            int localExperts = moe.localExperts();
            List<Inputs> in = new ArrayList<>();
            List<DeviceBuffer> x = new ArrayList<>(), idx = new ArrayList<>(), w = new ArrayList<>(), expertOut = new ArrayList<>(), scales = new ArrayList<>();
            List<Kernel> kernels = new ArrayList<>();
            List<KernelArgs> kernelArgs = new ArrayList<>();
            for (int r = 0; r < n; r++) {
                Device d = devices.get(r);
                streams.add(d.createStream());
                code.add(d.loadCodeObject(OBJECT, images[r]));
                kernels.add(code.get(r).kernel("expert_scale_bf16"));
                // rows, out, counts, scales, localExperts, hidden: the kernel's parameters in order
                kernelArgs.add(KernelArgs.of(arena, POINTER, POINTER, POINTER, POINTER, I32, I32));
                in.add(Inputs.random(random, tokens, hidden, experts, topK));
                x.add(SampleData.upload(d, arena, in.get(r).x()));
                idx.add(SampleData.upload(d, arena, in.get(r).idx()));
                w.add(SampleData.upload(d, arena, in.get(r).w()));
                expertOut.add(d.allocate(moe.capacityRows() * 2L * hidden, arena));
                float[] s = new float[localExperts];
                for (int e = 0; e < localExperts; e++) s[e] = SampleData.expertScale(r * localExperts + e);
                scales.add(SampleData.upload(d, arena, s));
            }
            int[] counts = new int[n];
            Arrays.fill(counts, tokens);
            List<MoeDispatch> handles = moe.dispatch(x, idx, w, counts, streams);
            for (int r = 0; r < n; r++) {
                MoeDispatch h = handles.get(r);
                kernelArgs.get(r).setPointer(0, h.rows()).setPointer(1, expertOut.get(r)).setPointer(2, h.counts()).setPointer(3, scales.get(r))
                        .setInt(4, localExperts).setInt(5, hidden);
                // a block per row, striding over them: the received row count is known on the device only
                int grid = (int) Math.min(moe.capacityRows(), 4L * devices.get(r).multiprocessors());
                kernels.get(r).launch(streams.get(r), LaunchConfig.of(grid, 128), kernelArgs.get(r));
            }
            List<DeviceBuffer> y = moe.combine(handles, expertOut, streams);
            moe.checkErrors(streams);
            for (int r = 0; r < n; r++) {
                Inputs mine = in.get(r);
                SampleData.checkCombine("rank " + r, mine, SampleData.readShorts(y.get(r), tokens * hidden, streams.get(r)),
                        (e, t, j) -> SampleData.expertScale(e) * mine.x(t, j), seed);
            }
            System.out.println("expert_scale_bf16 (" + code.getFirst().device().arch() + " cubin) between dispatch and combine: y matches the CPU reference for all "
                    + tokens + " x " + hidden + " elements on each of " + n + " GPU(s)");
        }
    }

    /** The cubin for {@code arch}: from GIN4J_SAMPLE_KERNELS where set, else from the samples jar; null when there is none. */
    static byte[] cubin(String arch) {
        String rel = arch + "/" + OBJECT + ".cubin";
        String dir = System.getenv("GIN4J_SAMPLE_KERNELS");
        try {
            if (dir != null && !dir.isEmpty()) {
                Path p = Path.of(dir, rel);
                return Files.isRegularFile(p) ? Files.readAllBytes(p) : null;
            }
            try (InputStream s = MoeUserKernelSample.class.getResourceAsStream("/dev/gin4j/samples/kernels/" + rel)) {
                return s == null ? null : s.readAllBytes();
            }
        } catch (IOException e) {
            throw new UncheckedIOException("cannot read " + rel, e);
        }
    }
}
