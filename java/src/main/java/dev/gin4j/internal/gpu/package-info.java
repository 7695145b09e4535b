/**
 * Runtime machinery internal to gin4j (not exported): the kernel library shipped in the jar (or
 * {@code GIN4J_KERNELS_DIR}), the native-access check, and argument checks the exchanges share.
 */
package dev.gin4j.internal.gpu;
