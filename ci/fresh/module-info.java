/** The fresh project's module: it reads gin4j's exported packages only. */
module fresh.moe {
    requires dev.gin4j;
}
