/**
 * Communicators over NCCL or RCCL: groups of ranks (one process driving every GPU, or one
 * process per GPU through a rendezvous), symmetric windows, device communicators, and the
 * kernels' error reporting ({@link dev.gin4j.comm.ErrorCheck} for checks that do not wait).
 */
package dev.gin4j.comm;
