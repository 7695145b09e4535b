/** Generated FFM bindings (jextract shape) to the CUDA driver, the HIP runtime, NCCL/RCCL and NVRTC, and the layouts of our kernels' ABI (MoE, all-to-all, basic). */
module dev.gin4j.bindings {
    exports dev.gin4j.bindings;
    exports dev.gin4j.bindings.cuda;
    exports dev.gin4j.bindings.hip;
    exports dev.gin4j.bindings.nccl;
    exports dev.gin4j.bindings.nvrtc;
    exports dev.gin4j.bindings.moe;
    exports dev.gin4j.bindings.a2a;
    exports dev.gin4j.bindings.basic;
    exports dev.gin4j.bindings.moenet;
}
