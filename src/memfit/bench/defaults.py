"""``memfit bench CONFIG``'s defaults, apart from bench.job so that the command line's help
can name them without importing torch."""

TOP = 3  # --top: strategies run when none are named
STEPS = 10  # --steps: optimizer steps per strategy
