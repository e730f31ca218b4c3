"""Is `keras_vit.training.AdamW` (the fused update) worth its private-API cost? A/B against
`keras.optimizers.AdamW` on the digits demo and on ViT-B/16, each run in a fresh process,
the two optimizers interleaved.

    python -m benchmarks.adamw [--rounds 2] [--no-b16]

- digits: `examples/train_digits.py` end to end (100 epochs of the demo's pre-training recipe
  through `keras_vit.training.fit`): wall time and held-out accuracy;
- B/16: `python -m benchmarks.first_step xla [--keras-adamw]`: time to the first training
  step (batch 8, XLA) and the steady step.
"""

import argparse
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPTIMIZERS = ("keras_vit", "keras")


def digits_worker(optimizer):
    """Runs the demo with `optimizer`'s AdamW in this process."""
    import keras

    from keras_vit.training import recipes

    if optimizer == "keras":
        recipes.AdamW = keras.optimizers.AdamW  # what pretrain_optimizer builds
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import train_digits

    train_digits.main(["--verbose", "0", "--output", os.path.join("runs", f"adamw_{optimizer}")])


def run(cmd):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT,
                          check=True).stdout


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--no-b16", action="store_true")
    parser.add_argument("--worker", choices=OPTIMIZERS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return digits_worker(args.worker)
    for round_index in range(args.rounds):
        for optimizer in OPTIMIZERS:
            out = run([sys.executable, "-m", "benchmarks.adamw", "--worker", optimizer])
            accuracy = re.search(r"held-out accuracy: ([0-9.]+ \(\d+/\d+\)) in (\d+) s", out)
            print(f"round {round_index + 1} digits {optimizer:9} {accuracy[2]} s, held-out "
                  f"{accuracy[1]}", flush=True)
            if not args.no_b16:
                flag = ["--keras-adamw"] if optimizer == "keras" else []
                line = run([sys.executable, "-m", "benchmarks.first_step", "xla", *flag])
                step = re.search(r"compile \+ first step ([0-9.]+) s, steady step ([0-9.]+) s",
                                 line)
                print(f"round {round_index + 1} B/16   {optimizer:9} first step {step[1]} s, "
                      f"steady step {step[2]} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
