/**
 * Communicators over NCCL or RCCL: groups of ranks (one process driving every GPU, or one
 * process per GPU through a rendezvous), the host-initiated collectives, what the loaded library
 * can do ({@link dev.gin4j.comm.Capabilities}), and checks of the kernels' error words that do not
 * wait ({@link dev.gin4j.comm.ErrorCheck}); and the types the exchanges share: the
 * {@link dev.gin4j.comm.Backend} (GIN or HOST), the element {@link dev.gin4j.comm.DType} and
 * {@link dev.gin4j.comm.Bf16} conversions.
 */
package dev.gin4j.comm;
