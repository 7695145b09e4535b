/**
 * The primitive runtime operations gin4j needs, as one interface with a CUDA and a HIP
 * implementation; internal to gin4j (not exported).
 */
package dev.gin4j.gpu.driver;
