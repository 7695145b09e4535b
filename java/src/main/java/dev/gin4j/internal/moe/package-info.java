/**
 * MoE machinery internal to gin4j (not exported): the shaped token-path entries compiled at run
 * time with NVRTC, and what an instance runs, for gin4j's own reports.
 */
package dev.gin4j.internal.moe;
