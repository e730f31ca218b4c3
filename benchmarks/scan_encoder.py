"""The scanned encoder (`keras_vit.ViT(scan=True)`) against the per-block model: time to the
first training step, the steady step and peak memory, on TensorFlow and on JAX.

    python -m benchmarks.scan_encoder [--model B/16] [--batch 8] [--rounds 2]
        [--modes tensorflow:blocks,tensorflow:while,jax:blocks,jax:scan,jax:blocks-nobarrier]

Each mode runs in a fresh process (one process at a time), rounds interleaved: it builds the
model, compiles it with `keras_vit.training.compile_model` (keras_vit's AdamW, XLA), times the
first `train_on_batch` (trace, compile, one step) and the median of three more, and reads the
peak RSS. Modes are `BACKEND:ENCODER`:

- `blocks`: the per-block model (the default `keras_vit.ViT`);
- `scan`: `scan=True` (on JAX, `keras.ops.scan` over the stacked weights; on TensorFlow the
  layer applies its blocks one after the other, so it measures as `blocks`);
- `while` (TensorFlow only): the same layer scanned by a TensorFlow while loop over
  TensorArrays of the stacked weights, the route `ScannedEncoder` does not take on TensorFlow
  (`keras.ops.scan` there is not differentiable under XLA: its TensorLists have no size bound);
- `blocks-nobarrier`, `scan-nobarrier` (JAX): `blocks` or `scan` with
  `keras_vit.layers.GRADIENT_BARRIER` off, as before the barrier was added (each block's
  backward then recomputes the residual gradient of the blocks above it, see
  `keras_vit.layers.gradient_barrier`).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = """
import json, resource, sys, time
start = time.perf_counter()
import numpy as np, keras, keras_vit
from keras_vit import training
from keras_vit.layers import ScannedEncoder

model_name, batch, encoder = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if encoder.endswith("-nobarrier"):
    import keras_vit.layers
    keras_vit.layers.GRADIENT_BARRIER = False
    encoder = encoder[:-len("-nobarrier")]

if encoder == "while":
    import tensorflow as tf

    class WhileLoopEncoder(ScannedEncoder):
        def call(self, inputs, training=None):
            template = self.blocks[0]
            stacked = [tf.stack([block.weights[j].value for block in self.blocks])
                       for j in range(len(template.weights))]
            arrays = [tf.TensorArray(w.dtype, size=self.num_layers, element_shape=w.shape[1:])
                      .unstack(w) for w in stacked]

            def body(i, x):
                mapping = [(v, a.read(i)) for v, a in zip(template.weights, arrays)]
                with keras.StatelessScope(state_mapping=mapping):
                    return i + 1, template(x, training=training)

            return tf.while_loop(lambda i, x: i < self.num_layers, body, (0, inputs),
                                 maximum_iterations=self.num_layers)[1]

    import keras_vit.model as model_module
    model_module.ScannedEncoder = WhileLoopEncoder

imported = time.perf_counter()
model = keras_vit.create_model(model_name, dropout_rate=0.0, scan=encoder != "blocks")
training.compile_model(model, training.AdamW(1e-4), jit_compile=True)
built = time.perf_counter()
x = np.random.default_rng(0).uniform(-1, 1, (batch, 224, 224, 3)).astype("float32")
y = np.arange(batch) % 1000
model.train_on_batch(x, y)
first = time.perf_counter()
steps = []
for _ in range(3):
    begin = time.perf_counter()
    model.train_on_batch(x, y)
    steps.append(time.perf_counter() - begin)
print(json.dumps(dict(to_first_step_s=first - start, first_step_s=first - built,
                      import_s=imported - start, step_s=sorted(steps)[1],
                      peak_rss_gb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20)))
"""

MODES = ("tensorflow:blocks", "tensorflow:while", "jax:blocks", "jax:scan")
ENCODERS = ("blocks", "scan", "while", "blocks-nobarrier", "scan-nobarrier")


def parse_modes(text):
    modes = [m.strip() for m in text.split(",") if m.strip()]
    for mode in modes:
        backend, _, encoder = mode.partition(":")
        if backend not in ("tensorflow", "jax") or encoder not in ENCODERS \
                or (encoder == "while" and backend != "tensorflow") \
                or (encoder.endswith("-nobarrier") and backend != "jax"):
            raise argparse.ArgumentTypeError(
                f"mode {mode!r}: expected BACKEND:ENCODER with BACKEND tensorflow or jax and "
                f"ENCODER one of {', '.join(ENCODERS)} (while on tensorflow only, -nobarrier on "
                "jax only)")
    return modes


def run(mode, model, batch):
    backend, _, encoder = mode.partition(":")
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run([sys.executable, "-c", CHILD, model, str(batch), encoder], env=env,
                            capture_output=True, text=True, check=False)
    if result.returncode:
        raise SystemExit(f"{mode} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="B/16")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--modes", type=parse_modes, default=list(MODES))
    parser.add_argument("--json", help="write every round's numbers here")
    args = parser.parse_args(argv)
    results = {mode: [] for mode in args.modes}
    for round_index in range(args.rounds):
        for mode in args.modes:
            results[mode].append(run(mode, args.model, args.batch))
            print(f"round {round_index + 1} {mode}: {json.dumps(results[mode][-1])}", flush=True)
    print(f"\n{args.model}, batch {args.batch}, medians of {args.rounds} interleaved rounds\n")
    print("| backend | encoder | start to first step | compile + first step | step | "
          "peak RSS |")
    print("|---|---|---|---|---|---|")
    for mode, rounds in results.items():
        backend, _, encoder = mode.partition(":")
        med = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
        peak = max(r["peak_rss_gb"] for r in rounds)
        print(f"| {backend} | {encoder} | {med['to_first_step_s']:.1f} s | "
              f"{med['first_step_s']:.1f} s | {med['step_s']:.2f} s | {peak:.2f} GB |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(model=args.model, batch=args.batch, rounds=results), f, indent=1)


if __name__ == "__main__":
    main()
