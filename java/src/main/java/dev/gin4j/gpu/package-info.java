/**
 * The GPU runtime layer, over the CUDA driver or HIP: devices, device and pinned memory with
 * stream-ordered host copies, streams, events, graphs, and loading and launching code objects.
 */
package dev.gin4j.gpu;
