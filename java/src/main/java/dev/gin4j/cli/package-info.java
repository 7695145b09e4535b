/** The {@code gin4j} command line: {@code info}, benchmarks and sweeps of the exchanges. */
package dev.gin4j.cli;
