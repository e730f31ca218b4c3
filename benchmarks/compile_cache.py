"""Time to the first training step on JAX, without and with the persistent compilation cache
(`keras_vit.training.enable_compilation_cache`, `keras-vit train --compile-cache DIR`).

    KERAS_BACKEND=jax python -m benchmarks.compile_cache [--model B/16] [--batch 8]

Runs the same script three times in fresh processes: without a cache, then twice with one
empty folder as the cache (the first run fills it, the second reads it back). Each process
builds the model, compiles it with `keras_vit.training.compile_model` (keras_vit's AdamW, XLA)
and times its first `train_on_batch` (trace, compile or cache read, one step) and a second
one (the step alone).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

CHILD = """
import json, sys, time
start = time.perf_counter()
import numpy as np, keras, keras_vit
from keras_vit import training
model_name, batch, cache = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if cache != "none":
    training.enable_compilation_cache(cache)
imported = time.perf_counter()
model = keras_vit.create_model(model_name, dropout_rate=0.0)
training.compile_model(model, training.AdamW(1e-4), jit_compile=True)
built = time.perf_counter()
x = np.random.default_rng(0).uniform(-1, 1, (batch, 224, 224, 3)).astype("float32")
y = np.arange(batch) % 1000
model.train_on_batch(x, y)
first = time.perf_counter()
model.train_on_batch(x, y)
second = time.perf_counter()
print(json.dumps(dict(import_s=imported - start, build_compile_s=built - imported,
                      first_step_s=first - built, second_step_s=second - first,
                      to_first_step_s=first - start)))
"""


def run(model, batch, cache):
    env = dict(os.environ, KERAS_BACKEND="jax", TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run([sys.executable, "-c", CHILD, model, str(batch), cache], env=env,
                            capture_output=True, text=True, check=False)
    if result.returncode:
        raise SystemExit(result.stderr[-3000:])
    return json.loads(result.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="B/16")
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args(argv)
    print(f"JAX, {args.model}, batch {args.batch}\n")
    print("| run | import | build + compile() | first step | second step | start to first step |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as cache:
        for label, folder in (("no cache", "none"), ("cache, empty", cache),
                              ("cache, filled", cache)):
            r = run(args.model, args.batch, folder)
            print(f"| {label} | {r['import_s']:.1f} s | {r['build_compile_s']:.1f} s | "
                  f"{r['first_step_s']:.1f} s | {r['second_step_s']:.2f} s | "
                  f"{r['to_first_step_s']:.1f} s |", flush=True)


if __name__ == "__main__":
    main()
