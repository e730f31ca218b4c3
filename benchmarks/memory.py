"""Where the peak training memory goes: resident memory after each stage of a ViT AdamW training
run, and the peak within each stage.

    python -m benchmarks.memory keras_vit [--variant B/16] [--image-size 224] [--batch 8] \\
        [--xla|--no-xla] [--bf16] [--remat] [--route attention=memory_efficient] [--tensors]
    .venv-bench/bin/python -m benchmarks.memory timm [--variant B/16] [--image-size 224] \\
        [--batch 8] [--bf16]   # peers' venv (setup_peers.sh)

keras_vit trains on the recipes' path (`keras_vit.training.compile_model` with
`keras_vit.training.AdamW`; `--xla`/`--no-xla` force the runtime, default: the library's
choice); `--remat` builds the model with `remat=True` (the saved layout whose blocks are
recomputed in the backward pass; `--route remat=blocks` recomputes them on the plain model);
`--route CHOICE=IMPLEMENTATION` (repeatable) chooses a route of
`keras_vit.routes` for the steps, the others keep their defaults; `--bf16` trains in
`mixed_bfloat16` (timm: `torch.autocast`). timm's model is its `VisionTransformer` with the
variant's sizes, as `benchmarks.contenders.timm_vit` builds it (PyTorch's fused attention).
Each step's wall time is printed after the table.

`--tensors` (keras_vit only) runs TensorFlow with its BFC allocator on the CPU
(`TF_CPU_ALLOCATOR_USE_BFC=true`), whose statistics `tf.config.experimental.get_memory_info`
reads: two more columns, the bytes of live tensors after each stage and their peak within it.
What RSS holds beyond that peak is the import, the graph runtime's own buffers and the
allocator's free pages. RSS then measures the BFC allocator, not TensorFlow's default one
(the C library's malloc), so compare it only with runs that have `--tensors` too.

Linux only: reads VmRSS / VmHWM from /proc/self/status and resets the peak between stages by
writing 5 to /proc/self/clear_refs, so each stage's peak is its own.
"""

import argparse
import os
import sys
import time

CLASSES = 1000


def _stage(name, tensors=None):
    """A table row: resident memory now and its peak since the last stage (and, from `tensors`,
    a function returning (live, peak) tensor bytes, theirs); then resets the peaks."""
    with open("/proc/self/status") as status:
        fields = dict(line.split(":", 1) for line in status)
    rss, peak = (int(fields[key].split()[0]) / 2**20 for key in ("VmRSS", "VmHWM"))  # kB -> GB
    row = f"| {name} | {rss:.2f} GB | {peak:.2f} GB |"
    if tensors is not None:
        live, live_peak = (b / 2**30 for b in tensors())
        row += f" {live:.2f} GB | {live_peak:.2f} GB |"
    print(row, flush=True)
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # resets VmHWM to the current RSS


def keras_vit_stages(args):
    if args.tensors:
        os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "true"  # before TensorFlow starts
    import numpy as np
    import keras
    import tensorflow as tf

    tensors = None
    if args.tensors:
        def tensors():
            info = tf.config.experimental.get_memory_info("CPU:0")
            tf.config.experimental.reset_memory_stats("CPU:0")
            return info["current"], info["peak"]

    stage = lambda name: _stage(name, tensors)  # noqa: E731
    stage("import tensorflow, keras")
    import keras_vit
    from keras_vit import routes, training

    if args.bf16:
        keras.config.set_dtype_policy("mixed_bfloat16")
    model = keras_vit.create_model(args.variant, image_size=args.image_size, dropout_rate=0.0,
                                   remat=args.remat)
    stage("model built (parameters)")
    training.compile_model(model, training.AdamW(1e-4), jit_compile=args.xla, metrics=())
    stage(f"compiled (XLA {model.jit_compile}), optimizer state built")
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (args.batch, args.image_size, args.image_size, 3)).astype("float32")
    y = np.arange(args.batch) % CLASSES
    times = []
    with routes.use_routes(**dict(args.route)):  # the first step traces: it keeps the routes
        for step in range(args.steps):
            start = time.perf_counter()
            model.train_on_batch(x, y)
            times.append(time.perf_counter() - start)
            stage("step 1 (trace, compile, run)" if step == 0 else f"step {step + 1}")
    print("\nstep seconds: " + ", ".join(f"{t:.2f}" for t in times))


def timm_stages(args):
    import torch

    from benchmarks.contenders import common, timm_vit

    timm_vit.import_timm()  # first: it makes torchvision importable
    from timm.models.vision_transformer import VisionTransformer

    _stage("import torch, timm")
    config = common.variant_config(args.variant)
    model = VisionTransformer(
        img_size=args.image_size, patch_size=config["patch_size"],
        embed_dim=config["hidden_size"], depth=config["num_layers"],
        num_heads=config["num_heads"], mlp_ratio=config["mlp_dim"] / config["hidden_size"],
        num_classes=CLASSES)
    _stage("model built (parameters)")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.rand(args.batch, 3, args.image_size, args.image_size)
    y = torch.arange(args.batch) % CLASSES
    times = []
    for step in range(args.steps):
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", torch.bfloat16, enabled=args.bf16):
            loss = torch.nn.functional.cross_entropy(model(x).float(), y)
        loss.backward()
        optimizer.step()  # creates the AdamW state on the first step
        times.append(time.perf_counter() - start)
        _stage(f"step {step + 1}")
    print("\nstep seconds: " + ", ".join(f"{t:.2f}" for t in times))


def route_item(text):
    name, _, implementation = text.partition("=")
    if not implementation:
        raise argparse.ArgumentTypeError(f"expected CHOICE=IMPLEMENTATION, got {text!r}")
    return name, implementation


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.memory",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("library", choices=("keras_vit", "timm"))
    parser.add_argument("--variant", default="B/16")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--remat", action="store_true")
    xla = parser.add_mutually_exclusive_group()
    xla.add_argument("--xla", dest="xla", action="store_true", default=None)
    xla.add_argument("--no-xla", dest="xla", action="store_false")
    parser.add_argument("--route", type=route_item, action="append", default=[],
                        help="CHOICE=IMPLEMENTATION of keras_vit.routes (repeatable)")
    parser.add_argument("--tensors", action="store_true",
                        help="also the live tensors' bytes (TensorFlow's BFC allocator)")
    args = parser.parse_args(argv)
    if args.library == "timm" and (args.remat or args.route or args.tensors
                                   or args.xla is not None):
        parser.error("--remat, --route, --tensors, --xla and --no-xla are keras_vit's options")
    return args


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    print(f"{' '.join(sys.argv[1:] if argv is None else argv)}: ViT-{args.variant}, "
          f"{args.image_size} px, batch {args.batch}, AdamW\n")
    header = "| stage | RSS after | peak during |" + (
        " tensors after | tensors peak |" if args.tensors else "")
    print(header + "\n|" + "---|" * (header.count("|") - 1))
    _stage("interpreter start", (lambda: (0, 0)) if args.tensors else None)
    (keras_vit_stages if args.library == "keras_vit" else timm_stages)(args)


if __name__ == "__main__":
    main()
