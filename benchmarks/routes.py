"""A/B of the model's implementation choices on a whole ViT, rounds interleaved.

    python -m benchmarks.routes --model B/16 --mode infer attention=products attention=fused
    python -m benchmarks.routes --model B/16 --mode train --xla attention=products attention=fused
    KERAS_BACKEND=jax python -m benchmarks.routes --model Ti/16 --mode train \\
        block_input=plain block_input=barrier
    python -m benchmarks.routes --model B/16 --mode train --fresh remat=none remat=blocks
    python -m benchmarks.routes --model B/16 --mode train --xla --fresh optimizer=keras \\
        optimizer=keras_vit

Each variant is a set of options, several joined by commas: a choice of `keras_vit.routes`
(`attention=memory_efficient`, `remat=blocks`), a structure option of `keras_vit.ViT`
(`scan=true`), or in training the optimizer (`optimizer=keras_vit`,
`keras_vit.training.AdamW`, the default; `optimizer=keras`, `keras.optimizers.AdamW`);
"default" is the model as built by default.
Every variant gets the same weights and batch, and its outputs (inference) or first loss
(training) must agree with the first variant's to 1e-4 (2e-2 in bfloat16).

By default all variants live in one process, and each round times `--steps` calls of every
variant in turn (the order rotating from round to round). With `--fresh`, each variant runs in
a fresh process per round, which also measures the time from building the model to the end of
its first call (tracing and compiling included) and the process's peak resident memory. The
table gives the median over rounds, and each variant's ratio to the first. Inference is
`predict_on_batch`, training one step of `keras_vit.training.compile_model` (the recipes'
path); `--xla`/`--no-xla` force XLA on or off (default: the library's choice).

`--profile DIR` records the first variant's timed calls of the last round with the backend's
profiler (JAX: `jax.profiler.trace`; TensorFlow: `tf.profiler.experimental`), for
TensorBoard's profile plugin or Perfetto: the op-level time of a step. `--device gpu` runs on
the first GPU (the default hides GPUs, for CPU measurements).
"""

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time

from benchmarks.contenders import common

STRUCTURE_OPTIONS = ("scan",)
OPTIMIZERS = ("keras_vit", "keras")


def parse_variant(text):
    """"attention=fused,scan=true" -> (ViT keyword arguments, optimizer, routes); "default"
    -> ({}, "keras_vit", {})."""
    from keras_vit import routes

    overrides, choices, optimizer = {}, {}, "keras_vit"
    for item in ([] if text == "default" else text.split(",")):
        key, _, value = item.partition("=")
        if key in routes.CHOICES and value:
            choices[key] = value
        elif key in STRUCTURE_OPTIONS and value in ("true", "false"):
            overrides[key] = value == "true"
        elif key == "optimizer" and value in OPTIMIZERS:
            optimizer = value
        else:
            raise ValueError(f"Variant item {item!r}: expected CHOICE=IMPLEMENTATION with CHOICE "
                             f"in {sorted(routes.CHOICES)}, scan=true|false "
                             f"or optimizer={'|'.join(OPTIMIZERS)}.")
    return overrides, optimizer, routes.check_routes(choices)


def build(text, args):
    """A variant's model and its timed call: (call, first output, seconds from the start of the
    build to the end of the first call)."""
    import keras

    from keras_vit import training

    from keras_vit.routes import use_routes

    overrides, optimizer, chosen = parse_variant(text)
    start = time.perf_counter()
    model, images, labels = common.seeded_model_and_batch(args.model, args.batch,
                                                          args.image_size, **overrides)
    if args.mode == "infer":
        model.compile(jit_compile=args.xla)
        call = lambda: model.predict_on_batch(images)  # noqa: E731
    else:
        adamw = training.AdamW if optimizer == "keras_vit" else keras.optimizers.AdamW
        training.compile_model(model, adamw(common.LEARNING_RATE, weight_decay=common.WEIGHT_DECAY),
                               jit_compile=args.xla, metrics=())
        call = lambda: model.train_on_batch(images, labels)  # noqa: E731
    with use_routes(**chosen):  # the first call traces the step: it keeps the routes
        first = keras.ops.convert_to_numpy(call())
    return call, first, time.perf_counter() - start


@contextlib.contextmanager
def profiling(folder):
    """The backend's profiler recording into `folder` while the block runs (none without one)."""
    import keras

    if not folder:
        yield
    elif keras.backend.backend() == "jax":
        import jax  # the JAX backend's own profiler

        with jax.profiler.trace(folder):
            yield
    else:
        import tensorflow as tf

        tf.profiler.experimental.start(folder)
        try:
            yield
        finally:
            tf.profiler.experimental.stop()


def worker(args):
    """One variant in this process (`--fresh`): prints its first output and its times."""
    call, first, first_call_s = build(args.worker, args)
    step_s = common.median_seconds(call, args.steps, warmup=1)
    common.emit(dict(first=first.tolist(), first_call_s=first_call_s, step_s=step_s,
                     peak_rss_bytes=common.peak_rss_bytes()))
    return 0


def fresh_round(args, text):
    command = [sys.executable, "-m", "benchmarks.routes", "--worker", text, *args.passed]
    done = subprocess.run(command, capture_output=True, text=True,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    lines = [line for line in done.stdout.splitlines() if line.startswith(common.RESULT_PREFIX)]
    if done.returncode or not lines:
        sys.exit(f"Variant {text!r} failed:\n{done.stderr[-3000:]}")
    return json.loads(lines[-1][len(common.RESULT_PREFIX):])


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.routes",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("variants", nargs="*", help="variants, e.g. attention=products")
    parser.add_argument("--model", default="B/16")
    parser.add_argument("--mode", choices=("infer", "train"), default="infer")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    xla = parser.add_mutually_exclusive_group()
    xla.add_argument("--xla", dest="xla", action="store_true", default=None)
    xla.add_argument("--no-xla", dest="xla", action="store_false")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--fresh", action="store_true",
                        help="each variant in a fresh process per round (start-up and memory)")
    parser.add_argument("--json", help="write every round's numbers here")
    parser.add_argument("--profile", help="write a profile of the first variant's last round "
                                          "here (a folder)")
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    # What a fresh worker process is given: the options, not the variants.
    args.passed = [f"--model={args.model}", f"--mode={args.mode}", f"--batch={args.batch}",
                   f"--image-size={args.image_size}", f"--precision={args.precision}",
                   f"--steps={args.steps}", f"--device={args.device}"]
    if args.xla is not None:
        args.passed.append("--xla" if args.xla else "--no-xla")
    if args.worker is None:
        if len(args.variants) < 1:
            parser.error("name at least one variant")
        try:
            for text in args.variants:
                parse_variant(text)
        except ValueError as e:
            parser.error(str(e))
    return args


def main(argv=None):
    args = parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = "-1"  # before the backend is imported
    import keras
    import numpy as np

    if args.precision == "bf16":
        keras.config.set_dtype_policy("mixed_bfloat16")
    if args.worker is not None:
        return worker(args)
    names = list(args.variants)
    results = {text: [] for text in names}
    built = {} if args.fresh else {text: build(text, args) for text in names}
    firsts = {text: b[1] for text, b in built.items()}
    for round_index in range(args.rounds):
        shift = round_index % len(names)
        for text in names[shift:] + names[:shift]:
            if args.fresh:
                result = fresh_round(args, text)
                firsts.setdefault(text, np.asarray(result["first"]))
            else:
                last = text == names[0] and round_index == args.rounds - 1
                with profiling(args.profile if last else None):
                    step_s = common.median_seconds(built[text][0], args.steps, warmup=1)
                result = dict(step_s=step_s)
            results[text].append(result)
    tolerance = 2e-2 if args.precision == "bf16" else 1e-4
    for text in names:
        if not np.allclose(firsts[text], firsts[names[0]], rtol=tolerance, atol=tolerance):
            sys.exit(f"Variant {text!r} computes something else: its first "
                     f"{'outputs' if args.mode == 'infer' else 'loss'} differ by "
                     f"{np.abs(firsts[text] - firsts[names[0]]).max():.2g}.")
    print(table(args, names, results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(args={k: v for k, v in vars(args).items() if k != "passed"},
                           backend=keras.backend.backend(), machine=common.machine_info(),
                           results=results), f, indent=1)
    return 0


def table(args, names, results):
    import keras

    def median(text, key):
        return statistics.median(r[key] for r in results[text])

    first = median(names[0], "step_s")
    lines = [f"{args.model}, batch {args.batch}, {args.precision}, {args.mode}, "
             f"{keras.backend.backend()}, XLA {'default' if args.xla is None else args.xla}, "
             f"{args.rounds} interleaved rounds of {args.steps} calls"
             f"{', a fresh process each' if args.fresh else ''}\n"]
    header = "| variant | img/s | s per call, per round | vs first |"
    if args.fresh:
        header += " build + first call | peak RSS |"
    lines += [header, "|" + "---|" * (header.count("|") - 1)]
    for text in names:
        step = median(text, "step_s")
        rounds = ", ".join(f"{r['step_s']:.3f}" for r in results[text])
        row = f"| {text} | {args.batch / step:.2f} | {rounds} | {first / step:.3f}x |"
        if args.fresh:
            row += (f" {median(text, 'first_call_s'):.1f} s |"
                    f" {max(r['peak_rss_bytes'] for r in results[text]) / 1e9:.2f} GB |")
        lines.append(row)
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
