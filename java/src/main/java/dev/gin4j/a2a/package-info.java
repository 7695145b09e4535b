/**
 * All-to-all exchanges: the uniform {@link dev.gin4j.a2a.AllToAll} and the variable-size
 * {@link dev.gin4j.a2a.AllToAllV}, GPU-initiated (GIN backend) or through NCCL's host calls
 * (HOST), and the element types they are sized in.
 */
package dev.gin4j.a2a;
