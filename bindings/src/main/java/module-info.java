/** Generated FFM bindings (jextract shape) to the CUDA driver, the HIP runtime, NCCL/RCCL and NVRTC. */
module dev.gin4j.bindings {
    exports dev.gin4j.bindings;
    exports dev.gin4j.bindings.cuda;
    exports dev.gin4j.bindings.hip;
    exports dev.gin4j.bindings.nccl;
    exports dev.gin4j.bindings.nvrtc;
}
