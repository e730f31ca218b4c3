"""One module per contender; each runs as its own process (`python -m benchmarks.contenders.X`).

Every module defines `setup(args)`, `build_inference(args, config)` and `build_training(args,
config)`, and hands them to `common.main`, which owns the arguments, the timing and the result
line the driver (`benchmarks/run.py`) reads.
"""
