/**
 * Mixture-of-experts token exchange: {@link dev.gin4j.moe.MoeAllToAll}'s dispatch of tokens to the
 * ranks of their experts and combine of the experts' outputs back, as bf16 or scaled fp8 rows
 * ({@link dev.gin4j.moe.Fp8Rows}).
 */
package dev.gin4j.moe;
