/** Generated FFM bindings (jextract shape) to the CUDA driver, the HIP runtime and NCCL/RCCL. */
module dev.gin4j.bindings {
    exports dev.gin4j.bindings;
    exports dev.gin4j.bindings.cuda;
    exports dev.gin4j.bindings.hip;
    exports dev.gin4j.bindings.nccl;
}
