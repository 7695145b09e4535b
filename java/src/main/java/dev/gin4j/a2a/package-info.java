/**
 * All-to-all exchanges: the uniform {@link dev.gin4j.a2a.AllToAll} and the variable-size
 * {@link dev.gin4j.a2a.AllToAllV}, GPU-initiated (GIN backend) or through NCCL's host calls
 * (HOST); their backend and element types are in {@link dev.gin4j.comm}.
 */
package dev.gin4j.a2a;
