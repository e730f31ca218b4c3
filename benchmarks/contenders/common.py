"""What the contender processes and the probes share: options, batches, timing, result lines,
fresh processes, alternating rounds, tables.

A contender process (`python -m benchmarks.contenders.X --mode MODE ...`) measures one mode of one
round and prints one line `BENCHMARK-RESULT {json}`. Nothing heavy is imported here.
"""

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import time

from keras_vit_cli.catalog import library_module

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULT_PREFIX = "BENCHMARK-RESULT "
DEVICES = ("cpu", "gpu")
PRECISIONS = ("fp32", "bf16", "int8")
MODES = ("check", "infer", "train", "agreement")
NUM_CLASSES = 1000  # ImageNet's, as every contender's head
# The training recipe every contender runs: AdamW on a cross-entropy loss over random labels.
LEARNING_RATE = 1e-4
WEIGHT_DECAY = 0.05


def variant_config(name):
    """The sizes of a plain (non-hybrid) paper variant, e.g. "B/16": a dict of name, patch_size,
    hidden_size, num_layers, num_heads, mlp_dim.

    Raises:
        ValueError: for an unknown name or a hybrid (ResNet + ViT) variant.
    """
    configs = library_module("configs")  # the variant table, without importing Keras
    variant = configs.get_variant(name)
    if variant.resnet is not None:
        plain = [name for name, v in configs.VARIANTS.items() if v.resnet is None]
        raise ValueError(f"Hybrid variant {variant.name!r} has no counterpart in the peers. "
                         f"Expected a plain ViT, one of {', '.join(plain)}.")
    return dict(name=variant.name, patch_size=variant.patch_size,
                **configs.MODEL_SIZES[variant.size])


def at_least(minimum):
    """An argparse type: an integer >= `minimum`."""

    def parse(text):
        if int(text) < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, received {text!r}")
        return int(text)

    return parse


def route_item(text):
    """An argparse type: CHOICE=IMPLEMENTATION of `keras_vit.routes`, as a pair."""
    name, _, implementation = text.partition("=")
    if not implementation:
        raise argparse.ArgumentTypeError(f"expected CHOICE=IMPLEMENTATION, got {text!r}")
    return name, implementation


def add_model_options(parser, flag="--model", xla=True):
    """The variant (option `flag`), --image-size, --batch and, with `xla`, --xla and --no-xla
    into `xla`: True, False, or None for the library's choice."""
    parser.add_argument(flag, default="B/16", help="paper variant, e.g. Ti/16, B/16, L/16")
    parser.add_argument("--image-size", type=at_least(1), default=224)
    parser.add_argument("--batch", type=at_least(1), default=8)
    if xla:
        group = parser.add_mutually_exclusive_group()
        group.add_argument("--xla", dest="xla", action="store_true", default=None,
                           help="compile with XLA (Keras; default: the library's choice)")
        group.add_argument("--no-xla", dest="xla", action="store_false",
                           help="compile without XLA")


def add_training_probe_options(parser, xla):
    """The options of the keras_vit training probes (`benchmarks.memory`, `.first_step`)."""
    add_model_options(parser, "--variant", xla)
    parser.add_argument("--bf16", dest="precision", action="store_const", const="bf16",
                        default="fp32", help="train in mixed_bfloat16")
    parser.add_argument("--route", type=route_item, action="append", default=[],
                        help="CHOICE=IMPLEMENTATION of keras_vit.routes (repeatable)")


def parse_args(argv=None, precisions=PRECISIONS):
    """A contender process's arguments; `precisions`: the ones its contender measures."""
    parser = argparse.ArgumentParser(description="One benchmark measurement of one contender.")
    parser.add_argument("--mode", choices=MODES, required=True)
    add_model_options(parser)
    parser.add_argument("--device", choices=DEVICES, default="cpu")
    parser.add_argument("--precision", choices=precisions, default="fp32")
    parser.add_argument("--backend", choices=("tensorflow", "jax"), default="tensorflow")
    parser.add_argument("--compile", action="store_true", help="timm: torch.compile the model")
    parser.add_argument("--savedmodel", action="store_true", help="keras_vit: its SavedModel")
    parser.add_argument("--steps", type=at_least(1), default=3, help="timed steps")
    parser.add_argument("--warmup", type=at_least(0), default=1,
                        help="untimed steps after the first")
    parser.add_argument("--agreement-images", type=at_least(1), default=128)
    parser.add_argument("--checkpoint", help="mode agreement: a trained model (official .npz)")
    parser.add_argument("--seed", type=at_least(0), default=0)
    parser.add_argument("--spawned-at", type=float, help="time.time() when the driver started us")
    return parser.parse_args(argv)


def random_batch(count, size, seed=0, channels_first=False):
    """`count` float32 images of `size` (pixels, or (height, width)) uniform in [-1, 1], and
    int64 labels in [0, NUM_CLASSES), seeded."""
    import numpy as np

    rng = np.random.default_rng(seed)
    height, width = (size, size) if isinstance(size, int) else size
    images = rng.uniform(-1.0, 1.0, (count, height, width, 3)).astype(np.float32)
    if channels_first:
        images = np.ascontiguousarray(images.transpose(0, 3, 1, 2))
    return images, rng.integers(0, NUM_CLASSES, (count,)).astype(np.int64)


def batch_for(args, channels_first=False):
    """`random_batch` of a contender process: its batch, image size and seed."""
    return random_batch(args.batch, args.image_size, args.seed, channels_first)


def top1_agreement(reference_logits, logits):
    """Fraction of rows whose argmax agrees, and how many distinct classes the reference picks."""
    import numpy as np

    reference, other = np.argmax(reference_logits, -1), np.argmax(logits, -1)
    return dict(top1_agreement=float(np.mean(reference == other)),
                distinct_top1=int(len(np.unique(reference))), images=int(len(reference)))


def peak_rss_bytes():
    """Peak resident set size of this process (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def step_seconds(fn, calls, warmup=0):
    """The time of each of `calls` calls of `fn` (synchronous), after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(calls):
        tic = time.perf_counter()
        fn()
        times.append(time.perf_counter() - tic)
    return times


def time_steps(build, args):
    """Builds with `build()` (which returns a synchronous step function), then times steps: a
    dict of build_s, first_step_s (from the start of `build` to the end of the first step),
    step_s (each timed step) and images_per_s (batch over the median step time)."""
    start = time.perf_counter()
    step = build()
    built = time.perf_counter()
    step()
    first = time.perf_counter()
    times = step_seconds(step, args.steps, args.warmup)
    return dict(build_s=built - start, first_step_s=first - start, step_s=times,
                images_per_s=args.batch / statistics.median(times))


def machine_info(device="cpu"):
    """CPU model, cores, memory, relevant instruction sets; the GPU's name on a GPU run."""
    info = dict(platform=platform.platform(), python=platform.python_version(), cpus=os.cpu_count())
    try:
        with open("/proc/cpuinfo") as f:  # reversed: the first CPU's values win
            pairs = [line.split(":", 1) for line in reversed(f.read().splitlines()) if ":" in line]
        fields = {key.strip(): value.strip() for key, value in pairs}
        info["cpu"] = fields.get("model name")
        flags = fields.get("flags", "").split()
        info["cpu_flags"] = sorted(f for f in flags if f.startswith(("avx", "amx", "fma")))
        with open("/proc/meminfo") as f:
            info["memory_gib"] = round(int(f.readline().split()[1]) / 2**20, 1)
    except OSError:
        pass
    if device == "gpu":
        query = ["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                 "--format=csv,noheader"]
        try:
            info["gpu"] = subprocess.run(query, capture_output=True, text=True,
                                         timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError) as e:
            info["gpu"] = f"unknown ({e})"
    return info


def emit(result):
    """Prints `result` as the process's result line."""
    print(RESULT_PREFIX + json.dumps(result), flush=True)


def read_result(stdout):
    """The dict of the last result line in a process's `stdout`, or None."""
    lines = [line for line in stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    return json.loads(lines[-1][len(RESULT_PREFIX):]) if lines else None


def run_fresh(command, timeout=None, cwd=REPO_ROOT):
    """Runs `command` as a fresh process from `cwd` (default: the repository root), TensorFlow's
    logs quiet; returns the `subprocess.CompletedProcess`, its output as text."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def alternating(names, rounds):
    """(round index, name) for every name in each of `rounds` rounds, the names' order rotated
    from round to round, so that a slow spell of the machine hits all alike."""
    for round_index in range(rounds):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            yield round_index, name


def table_row(cells):
    """A row of a Markdown table."""
    return "| " + " | ".join(cells) + " |"


def table_head(header):
    """The header row and the rule of a Markdown table with the column names `header`."""
    return table_row(header) + "\n|" + "---|" * len(header)


def main(contender, argv=None):
    """Runs one mode of `contender` (a module with setup, build_inference, build_training, and
    optionally PRECISIONS, agreement and device_peak_bytes) and prints its result line."""
    args = parse_args(argv, getattr(contender, "PRECISIONS", PRECISIONS))
    result = dict(mode=args.mode, versions=contender.setup(args))
    if args.spawned_at is not None:
        # Interpreter start and the framework's imports, before any model is built.
        result["import_s"] = time.time() - args.spawned_at
    if args.mode != "check":
        config = variant_config(args.model)
        if args.mode == "agreement":
            result.update(contender.agreement(args, config))
        else:
            build = contender.build_training if args.mode == "train" else contender.build_inference
            result.update(time_steps(lambda: build(args, config), args))
        result["peak_rss_bytes"] = peak_rss_bytes()
        peak = getattr(contender, "device_peak_bytes", None)
        result["device_peak_bytes"] = peak(args) if peak else None
    emit(result)
    return 0
