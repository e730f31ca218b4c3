"""One module per contender, each run as its own process by `common.main`, which owns the
arguments, the timing and the result line that the driver (`benchmarks/run.py`) reads."""
