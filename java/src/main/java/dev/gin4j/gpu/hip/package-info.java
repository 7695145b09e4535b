/** The {@link dev.gin4j.gpu.driver.Driver} over HIP ({@code libamdhip64}); internal to gin4j (not exported). */
package dev.gin4j.gpu.hip;
