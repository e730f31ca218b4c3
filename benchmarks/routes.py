"""A/B of the model's implementation choices on a whole ViT, rounds interleaved.

    python -m benchmarks.routes --model B/16 --mode infer attention=products attention=fused
    python -m benchmarks.routes --model B/16 --mode train --xla --fresh remat=none remat=blocks

A variant is a choice of `keras_vit.routes` (`attention=memory_efficient`, `scan=blocks`), or in
training `optimizer=keras_vit|keras`, several joined by commas; "default" is the model as
built. Every variant gets the same weights and batch, and its outputs (inference) or first loss
(training) must agree with the first variant's. benchmarks/README.md says what each option adds.
"""

import argparse
import contextlib
import json
import statistics
import sys
import time

from benchmarks.contenders import common, keras_common, keras_vit_model

OPTIMIZERS = ("keras_vit", "keras")


def parse_variant(text):
    """"attention=fused,optimizer=keras" -> (optimizer, routes); "default" -> ("keras_vit", {})."""
    from keras_vit import routes

    choices, optimizer = {}, "keras_vit"
    for item in ([] if text == "default" else text.split(",")):
        key, _, value = item.partition("=")
        if key in routes.CHOICES and value:
            choices[key] = value
        elif key == "optimizer" and value in OPTIMIZERS:
            optimizer = value
        else:
            raise ValueError(f"Variant item {item!r}: expected CHOICE=IMPLEMENTATION with CHOICE "
                             f"in {sorted(routes.CHOICES)} or optimizer={'|'.join(OPTIMIZERS)}.")
    return optimizer, routes.check_routes(choices)


def build(text, args):
    """A variant's timed call, its first output, and the seconds from the start of its build to
    the end of the first call."""
    import keras

    import keras_vit
    from keras_vit.routes import use_routes

    optimizer, chosen = parse_variant(text)
    start = time.perf_counter()
    keras.utils.set_random_seed(0)
    model = keras_vit.create_model(args.model, image_size=args.image_size)
    images, labels = common.random_batch(args.batch, args.image_size)
    if args.mode == "infer":
        model.compile(jit_compile=args.xla)
        call = lambda: model.predict_on_batch(images)  # noqa: E731
    else:
        adamw = keras.optimizers.AdamW if optimizer == "keras" else None
        keras_vit_model.compile_training(model, args.xla, adamw)
        call = lambda: model.train_on_batch(images, labels)  # noqa: E731
    with use_routes(**chosen):  # the first call traces the step: it keeps the routes
        first = keras.ops.convert_to_numpy(call())
    return call, first, time.perf_counter() - start


def profiling(folder):
    """The backend's profiler recording into `folder` while the block runs (none without one)."""
    import keras

    if not folder:
        return contextlib.nullcontext()
    if keras.backend.backend() == "jax":
        import jax

        return jax.profiler.trace(folder)
    import tensorflow as tf

    return tf.profiler.experimental.Profile(folder)


def median_step(call, args):
    return statistics.median(common.step_seconds(call, args.steps, warmup=1))


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.routes",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("variants", nargs="*", help="variants, e.g. attention=products")
    common.add_model_options(parser)
    parser.add_argument("--mode", choices=("infer", "train"), default="infer")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--rounds", type=common.at_least(1), default=3)
    parser.add_argument("--steps", type=common.at_least(1), default=4)
    parser.add_argument("--fresh", action="store_true",
                        help="each variant in a fresh process per round (start-up and memory)")
    parser.add_argument("--json", help="write every round's numbers here")
    parser.add_argument("--profile", help="write a profile of the first variant's last round "
                                          "here (a folder)")
    parser.add_argument("--device", choices=common.DEVICES, default="cpu")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # one variant, for `--fresh`
    args = parser.parse_args(argv)
    if args.worker is None:
        if not args.variants:
            parser.error("name at least one variant")
        try:
            for text in args.variants:
                parse_variant(text)
        except ValueError as e:
            parser.error(str(e))
    return args


def fresh_round(argv, text):
    """One round of variant `text` in a fresh process given `argv`: its result dict."""
    done = common.run_fresh([sys.executable, "-m", "benchmarks.routes", *argv, "--worker", text],
                            cwd=None)
    result = common.read_result(done.stdout)
    if done.returncode or result is None:
        sys.exit(f"Variant {text!r} failed:\n{done.stderr[-3000:]}")
    return result


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    keras = keras_common.configure(device=args.device, precision=args.precision)
    import numpy as np

    if args.worker is not None:
        call, first, first_call_s = build(args.worker, args)
        common.emit(dict(first=first.tolist(), first_call_s=first_call_s,
                         step_s=median_step(call, args), peak_rss_bytes=common.peak_rss_bytes()))
        return 0
    names = args.variants
    results = {text: [] for text in names}
    built = {} if args.fresh else {text: build(text, args) for text in names}
    firsts = {text: b[1] for text, b in built.items()}
    for round_index, text in common.alternating(names, args.rounds):
        if args.fresh:
            result = fresh_round(argv, text)
            firsts.setdefault(text, np.asarray(result["first"]))
        else:
            last = text == names[0] and round_index == args.rounds - 1
            with profiling(args.profile if last else None):
                result = dict(step_s=median_step(built[text][0], args))
        results[text].append(result)
    tolerance = 2e-2 if args.precision == "bf16" else 1e-4
    for text in names:
        if not np.allclose(firsts[text], firsts[names[0]], rtol=tolerance, atol=tolerance):
            sys.exit(f"Variant {text!r} computes something else: its first "
                     f"{'outputs' if args.mode == 'infer' else 'loss'} differ by "
                     f"{np.abs(firsts[text] - firsts[names[0]]).max():.2g}.")
    print(table(args, results, keras.backend.backend()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(args=vars(args), backend=keras.backend.backend(),
                           machine=common.machine_info(), results=results), f, indent=1)
    return 0


def table(args, results, backend):
    """The variants' speed, each against the first's; with `--fresh`, start-up and memory."""
    first = statistics.median(r["step_s"] for r in next(iter(results.values())))
    header = ["variant", "img/s", "s per call, per round", "vs first"]
    header += ["build + first call", "peak RSS"] if args.fresh else []
    lines = [f"{args.model}, batch {args.batch}, {args.precision}, {args.mode}, {backend}, "
             f"XLA {'default' if args.xla is None else args.xla}, {args.rounds} interleaved "
             f"rounds of {args.steps} calls{', a fresh process each' if args.fresh else ''}\n",
             common.table_head(header)]
    for text, rounds in results.items():
        step = statistics.median(r["step_s"] for r in rounds)
        cells = [text, f"{args.batch / step:.2f}", ", ".join(f"{r['step_s']:.3f}" for r in rounds),
                 f"{first / step:.3f}x"]
        if args.fresh:
            cells += [f"{statistics.median(r['first_call_s'] for r in rounds):.1f} s",
                      f"{max(r['peak_rss_bytes'] for r in rounds) / 1e9:.2f} GB"]
        lines.append(common.table_row(cells))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
