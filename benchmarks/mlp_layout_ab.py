"""A/B of the MLP block's layout on a whole ViT model, one process, rounds
interleaved: the products on `[B * N, D]` rows against Dense on the `[B, N, D]` tensor (0.2's
call). `MlpBlock.call` takes the rows at inference and the 3-D tensor in training.

    python -m benchmarks.mlp_layout_ab [--variant B/16] [--rounds 3] [--steps 4] [--matmul]
        [--modes infer,infer-xla,train,train-xla]    (default: infer,infer-xla,train-xla)
    KERAS_BACKEND=jax python -m benchmarks.mlp_layout_ab --modes infer-xla

Modes: `infer` is `predict_on_batch` without XLA (what `model.predict` runs on a CPU by default,
and the graph a SavedModel serves), `infer-xla` with `jit_compile=True`; `train` and `train-xla`
one step of `training.compile_model` (keras_vit's AdamW) without and with XLA (on JAX, which
always compiles, use the `-xla` modes). Batch 8, 224 px, float32. Each switch
recompiles (not timed); outputs and first-step losses must agree to 1e-4. With `--matmul` it
also times the MLP's first product alone, batch 8 x 197 tokens: XLA's dot against TensorFlow's
graph runtime (oneDNN) on the 2-D rows and through tensordot on the 3-D tensor, and names the
route XLA took for its dot (`XLA_FLAGS=--xla_cpu_use_onednn=true` and the XNNPACK / YNNPACK
flags ask for other routes); the probe always runs on TensorFlow.
"""

MODES = ("infer", "infer-xla", "train", "train-xla")

import argparse
import re
import statistics

import numpy as np


def calls():
    """The two layouts: `MlpBlock._products` (Dense, GELU, Dropout, Dense, Dropout) on the 3-D
    tensor, as 0.2's call, or on the `[B * N, D]` rows. `MlpBlock.call` uses "2-D rows" at
    inference and "3-D" in training."""
    import keras

    def tokens_3d(self, inputs, training=None):
        return self._products(inputs, training)  # [B, N, mlp_dim] inside

    def rows_2d(self, inputs, training=None):
        shape = keras.ops.shape(inputs)
        return keras.ops.reshape(self._products(keras.ops.reshape(inputs, (-1, shape[-1])),
                                                training), shape)  # via [B * N, mlp_dim]

    return {"3-D": tokens_3d, "2-D rows": rows_2d}


def matmul_probe(rounds):
    """The MLP's first product ([1576, 768] x [768, 3072]) three ways, best of 7 per round."""
    import tensorflow as tf

    from benchmarks.contenders import common

    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(size=(8, 197, 768)).astype("float32"))
    w = tf.constant((rng.normal(size=(768, 3072)) * 0.03).astype("float32"))
    ways = {
        "XLA dot (3-D einsum)": tf.function(lambda: tf.einsum("btd,df->btf", x, w),
                                            jit_compile=True),
        "graph, tensordot on 3-D": tf.function(lambda: tf.tensordot(x, w, axes=[[-1], [0]])),
        "graph, MatMul on 2-D rows": tf.function(
            lambda: tf.reshape(tf.matmul(tf.reshape(x, (-1, 768)), w), (8, 197, 3072))),
    }
    hlo = ways["XLA dot (3-D einsum)"].experimental_get_compiler_ir()(stage="optimized_hlo")
    routes = sorted(set(re.findall(r'custom_call_target="([^"]+)"|"kind":"(__[a-z]+_fusion)"',
                                   hlo)))
    print("XLA's dot in the optimised HLO (XLA_FLAGS picks the route):",
          ", ".join(a or b for a, b in routes) or "a plain dot (XLA's own CPU kernel)")
    results = {name: [] for name in ways}
    for _ in range(rounds):
        for name, fn in ways.items():
            fn(), fn()
            results[name].append(min(common.median_seconds(fn, 1) for _ in range(7)) * 1e3)
    print("\n| MLP product, 1576 x 768 x 3072 | best of 7, per round | median |\n|---|---|---|")
    for name, values in results.items():
        print(f"| {name} | {', '.join(f'{v:.1f}' for v in values)} ms | "
              f"{statistics.median(values):.1f} ms |")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", default="B/16")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--modes", default="infer,infer-xla,train-xla")
    parser.add_argument("--matmul", action="store_true")
    args = parser.parse_args(argv)
    modes = args.modes.split(",")
    if not modes or set(modes) - set(MODES):
        parser.error(f"--modes {args.modes!r}: expected a comma-separated list of {MODES}")
    import keras

    from benchmarks.contenders import common
    from keras_vit import training
    from keras_vit.layers import MlpBlock

    model, initial, x, y = common.seeded_model_and_batch(args.variant)
    variants, current = calls(), MlpBlock.call
    results = {(m, v): [] for m in modes for v in variants}
    check = {}
    for _ in range(args.rounds):
        for mode in modes:
            for name, call in variants.items():
                MlpBlock.call = call
                model.set_weights(initial)
                if mode.startswith("train"):
                    training.compile_model(model, training.AdamW(learning_rate=1e-4),
                                           jit_compile=mode == "train-xla")
                    check.setdefault((mode, name), float(model.train_on_batch(x, y)[0]))
                    step = lambda: model.train_on_batch(x, y)  # noqa: E731
                else:
                    model.compile(jit_compile=mode == "infer-xla")
                    check.setdefault((mode, name), model.predict_on_batch(x))
                    step = lambda: model.predict_on_batch(x)  # noqa: E731
                results[(mode, name)].append(common.median_seconds(step, args.steps, warmup=1))
    MlpBlock.call = current
    print(f"ViT-{args.variant}, batch 8, {keras.backend.backend()}, {args.rounds} interleaved "
          f"rounds of {args.steps} calls (median per round)\n")
    print("| mode | MLP layout | img/s (median) | per round (s per call) | vs 3-D |")
    print("|---|---|---|---|---|")
    for mode in modes:
        base = statistics.median(results[(mode, "3-D")])
        for name in variants:
            values = results[(mode, name)]
            step = statistics.median(values)
            print(f"| {mode} | {name} | {8 / step:.2f} | {', '.join(f'{v:.2f}' for v in values)}"
                  f" | {base / step:.3f}x |", flush=True)
        a, b = (check[(mode, name)] for name in variants)
        assert np.abs(np.asarray(a) - np.asarray(b)).max() < 1e-4, (mode, a, b)
    if args.matmul:
        matmul_probe(args.rounds)


if __name__ == "__main__":
    main()
