/** The {@link dev.gin4j.gpu.driver.Driver} over the CUDA driver API ({@code libcuda}); internal to gin4j (not exported). */
package dev.gin4j.gpu.cuda;
