"""Where the peak training memory goes: resident memory after each stage of a ViT AdamW training
run, and the peak within each stage.

    python -m benchmarks.memory keras_vit [--variant B/16] [--image-size 224] [--batch 8] \\
        [--xla|--no-xla] [--bf16] [--remat] [--route attention=memory_efficient] [--tensors]
    .venv-bench/bin/python -m benchmarks.memory timm [--variant B/16] [--bf16]

Each model and step is the side-by-side runner's contender's. `--tensors` uses TensorFlow's BFC
allocator (`TF_CPU_ALLOCATOR_USE_BFC=true`): compare its RSS only with other `--tensors` runs.
Linux only: reads VmRSS / VmHWM from /proc/self/status and resets the peak through clear_refs.
"""

import argparse
import functools
import os
import sys

from benchmarks.contenders import common, keras_common, keras_vit_model, timm_vit


def _stage(name, tensors=None):
    """Prints a table row: resident memory now and its peak since the last stage, and with
    `tensors` (a function returning live and peak tensor bytes) those; then resets the peaks."""
    with open("/proc/self/status") as status:
        fields = dict(line.split(":", 1) for line in status)
    cells = [name] + [f"{int(fields[key].split()[0]) / 2**20:.2f} GB" for key in ("VmRSS", "VmHWM")]
    if tensors is not None:
        cells += [f"{size / 2**30:.2f} GB" for size in tensors()]
    print(common.table_row(cells), flush=True)
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # resets VmHWM to the current RSS


def _train(step, steps, stage, first_name):
    """Runs `steps` steps, each followed by a stage; prints each step's seconds."""
    times = []
    for index in range(steps):
        times += common.step_seconds(step, 1)
        stage(first_name if index == 0 else f"step {index + 1}")
    print("\nstep seconds: " + ", ".join(f"{t:.2f}" for t in times))


def keras_vit_stages(args):
    if args.tensors:
        os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "true"  # before TensorFlow starts
    keras_common.configure(precision=args.precision)
    import tensorflow as tf

    from keras_vit import routes

    def tensors():
        info = tf.config.experimental.get_memory_info("CPU:0")
        tf.config.experimental.reset_memory_stats("CPU:0")
        return info["current"], info["peak"]

    stage = functools.partial(_stage, tensors=tensors if args.tensors else None)
    stage("import tensorflow, keras")
    model = keras_vit_model.build_model(args.variant, args.image_size, remat=args.remat)
    stage("model built (parameters)")
    keras_vit_model.compile_training(model, args.xla)
    stage(f"compiled (XLA {model.jit_compile}), optimizer state built")
    images, labels = common.random_batch(args.batch, args.image_size)
    with routes.use_routes(**dict(args.route)):  # the first step traces: it keeps the routes
        _train(lambda: model.train_on_batch(images, labels), args.steps, stage,
               "step 1 (trace, compile, run)")


def timm_stages(args):
    timm_vit.import_timm()
    _stage("import torch, timm")
    options = common.parse_args(["--mode=train", f"--image-size={args.image_size}",
                                 f"--batch={args.batch}", f"--precision={args.precision}"])
    step = timm_vit.build_training(options, common.variant_config(args.variant))
    _stage("model built (parameters)")
    _train(step, args.steps, _stage, "step 1")


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.memory",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("library", choices=("keras_vit", "timm"))
    common.add_training_probe_options(parser, xla=True)
    parser.add_argument("--steps", type=common.at_least(1), default=4)
    parser.add_argument("--remat", action="store_true", help="build the model with remat=True")
    parser.add_argument("--tensors", action="store_true",
                        help="also the live tensors' bytes (TensorFlow's BFC allocator)")
    args = parser.parse_args(argv)
    if args.library == "timm" and (args.remat or args.route or args.tensors
                                   or args.xla is not None):
        parser.error("--remat, --route, --tensors, --xla and --no-xla are keras_vit's options")
    return args


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    print(f"{' '.join(argv)}: ViT-{args.variant}, {args.image_size} px, batch {args.batch}, "
          "AdamW\n")
    header = ["stage", "RSS after", "peak during"]
    print(common.table_head(header + (["tensors after", "tensors peak"] if args.tensors else [])))
    _stage("interpreter start", (lambda: (0, 0)) if args.tensors else None)
    (keras_vit_stages if args.library == "keras_vit" else timm_stages)(args)


if __name__ == "__main__":
    main()
