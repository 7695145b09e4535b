/**
 * The machinery behind the exchanges, internal to gin4j (not exported): symmetric windows and the
 * peers' addresses in them, NCCL device communicators and the device-API ABI they are built for,
 * the kernels' error words, and the group calls the exchanges make ({@link dev.gin4j.internal.comm.Groups}).
 */
package dev.gin4j.internal.comm;
