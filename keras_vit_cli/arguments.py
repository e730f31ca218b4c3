"""The flags every command shares, and their types: the model flags (`--model`, `--model-config`,
`--weights`, `--image-size`), the data and run flags, XLA and the backend. Parsing only:
nothing here imports Keras or TensorFlow."""

import argparse
import json
import os
import re
import sys

from keras_vit_cli.catalog import (
    library_module,
)


DEFAULT_WEIGHTS = "default"


def add_xla_arguments(parser):
    """`--xla` / `--no-xla`: force the runtime; neither takes the measured default
    (`keras_vit.execution.choose`), which the run records with its reason."""
    xla = parser.add_mutually_exclusive_group()
    xla.add_argument("--xla", dest="xla", action="store_const", const=True, default=None,
                     help="compile with XLA (default: the measured choice for this device and "
                          "precision)")
    xla.add_argument("--no-xla", dest="xla", action="store_const", const=False,
                     help="run in TensorFlow's graph runtime")


def select_backend(backend):
    """Sets the Keras backend for this process (before Keras is imported)."""
    if backend is None:
        return
    loaded = sys.modules.get("keras")
    if loaded is not None and loaded.backend.backend() != backend:
        raise ValueError(f"--backend {backend}: Keras is already running on "
                         f"{loaded.backend.backend()} in this process.")
    os.environ["KERAS_BACKEND"] = backend


def image_size_arg(text):
    """`N` or `HEIGHTxWIDTH` as a (height, width) tuple."""
    match = re.fullmatch(r"(\d+)(?:[xX](\d+))?", text.strip())
    if not match or not int(match[1]) or (match[2] and not int(match[2])):
        raise argparse.ArgumentTypeError(
            f"expected N or HEIGHTxWIDTH (e.g. 224 or 384x512). Received: {text!r}")
    return (int(match[1]), int(match[2] or match[1]))


# The largest integer a flag takes: TensorFlow and NumPy count in int64.
INT64_MAX = 2**63 - 1


def int_arg(low=None, high=INT64_MAX):
    """An argparse type: an integer in [low, high] (None: no lower bound)."""
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or (low is not None and value < low) or value > high:
            rule = {None: "an integer", 0: "a non-negative integer", 1: "a positive integer"}.get(
                low, f"an integer >= {low}")
            limit = f" up to {high}" if value is not None and value > high else ""
            raise argparse.ArgumentTypeError(f"expected {rule}{limit}. Received: {text!r}")
        return value

    return parse


positive_int_arg = int_arg(1)


seed_arg = int_arg(0, library_module("checks").SEED_MAX)


def number_arg(low=None, high=None, low_inclusive=True, high_inclusive=False):
    """An argparse type: a finite number in a range (`keras_vit.checks.check_number`'s)."""
    checks = library_module("checks")
    bounds = (low, high, low_inclusive, high_inclusive)

    def parse(text):
        try:
            value = float(text)
        except ValueError:
            value = None
        if not checks.in_range(value, *bounds):
            raise argparse.ArgumentTypeError(f"expected a finite number in "
                                             f"{checks.range_text(*bounds)}. Received: {text!r}")
        return value

    return parse


def list_arg(item):
    """An argparse type: comma-separated values of the argparse type `item`, as a list."""
    def parse(text):
        parts = text.split(",")
        if not all(part.strip() for part in parts):
            raise argparse.ArgumentTypeError(f"expected values separated by commas. Received: "
                                             f"{text!r}")
        return [item(part) for part in parts]

    return parse


def json_object_arg(text):
    """A JSON object (keyword arguments)."""
    try:
        value = json.loads(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON ({e}). Received: {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object {{...}}. Received: {text!r}")
    return value


def add_model_arguments(parser, weights_help=""):
    group = parser.add_argument_group("model")
    group.add_argument("--model", help="a variant (B/16, ViT_B16, R50+B/16) or a .keras file; "
                       "left out, the architecture is read from --weights")
    group.add_argument("--model-config", type=json_object_arg, metavar="JSON",
                       help="keras_vit.ViT arguments instead of a variant, e.g. "
                            '\'{"patch_size": 4, "hidden_size": 64, "num_layers": 4, '
                            '"num_heads": 4, "mlp_dim": 128}\'')
    group.add_argument("--weights", "--pretrained", dest="weights", metavar="SOURCE",
                       help="a registry name (keras-vit checkpoints), an .npz or .safetensors "
                            "path, a keras-hub preset (folder, keras-hub's name such as "
                            "vit_base_patch16_224_imagenet, or kaggle:// handle), a URL, "
                            "hf://ORG/NAME, or "
                            f"'{DEFAULT_WEIGHTS}' for the "
                            "variant's default checkpoint"
                            + weights_help)
    group.add_argument("--image-size", type=image_size_arg, metavar="N|HxW",
                       help="input resolution (default: the checkpoint's, else 224)")


def add_class_names_argument(parser):
    parser.add_argument("--class-names", metavar="FILE",
                        help="a UTF-8 text file with one class name a line, in label order "
                             "(default: the checkpoint's, the ImageNet names for 1000 or "
                             "21843 classes, else the class indices)")


def add_data_arguments(parser, folder_help="image folder with one subfolder per class"):
    """The data flags of train, pretrain, evaluate and fewshot (`folder_help`: what `--folder`
    holds for the command)."""
    group = parser.add_argument_group("data")
    source = group.add_mutually_exclusive_group(required=True)
    source.add_argument("--dataset", help="tensorflow-datasets name: cifar10, cifar100, "
                        "oxford_iiit_pet, oxford_flowers102, imagenet2012, imagenet2012_real")
    source.add_argument("--folder", help=folder_help)
    group.add_argument("--data-dir", help="tensorflow-datasets data directory")
    group.add_argument("--manual-dir", help="hand-downloaded files (imagenet2012, imagenet2012_real)")
    group.add_argument("--batch-size", type=positive_int_arg, default=64,
                       help="global batch size (64)")
    group.add_argument("--strategy", default="auto",
                       help="auto, tpu, mirrored, multiworker or cpu (default auto)")
    group.add_argument("--cpu-replicas", type=positive_int_arg, metavar="N",
                       help="with --strategy mirrored on a machine without GPUs: split the CPU "
                            "into N devices, one replica each")
    group.add_argument("--seed", type=seed_arg, default=0, help="data order and initialisation seed")
    group.add_argument("--skip-corrupt", action="store_true",
                       help="image folders: leave out files that cannot be decoded (counted "
                            "and reported) instead of stopping at the first")


# Image folders: this fraction of the images (seeded) is the validation split of `train`.
FOLDER_VALIDATION_FRACTION = 0.1


# An image folder's splits: the training part, the held-out fraction, every image.
FOLDER_SPLITS = ("train", "validation", "all")


def add_run_arguments(parser, *, outputs, steps, learning_rate, validation_split,
                      warmup_steps="500 finetune, 10000 pretrain"):
    """The flags of a training run that `train` and `pretrain` share (the `run` group, which
    is returned for the command's own flags). The other arguments fill in the help texts."""
    run = parser.add_argument_group("run")
    run.add_argument("--output", required=True, help=f"run folder: {outputs}")
    length = run.add_mutually_exclusive_group()
    length.add_argument("--steps", type=positive_int_arg,
                        help=f"optimizer updates, rounded up to whole epochs (default {steps})")
    length.add_argument("--epochs", type=positive_int_arg, help="whole passes over the data")
    run.add_argument("--lr", type=number_arg(0, low_inclusive=False), default=None,
                     help=f"peak learning rate ({learning_rate})")
    run.add_argument("--warmup-steps", type=int_arg(0), default=None,
                     help=f"linear warm-up updates (default: {warmup_steps}, at most 10%% "
                          "of the updates)")
    run.add_argument("--target-batch-size", type=positive_int_arg, default=None,
                     help="reach this batch by gradient accumulation, e.g. 512")
    run.add_argument("--precision", default="float32", help="float32, bfloat16 or float16")
    add_xla_arguments(run)
    run.add_argument("--backend", choices=("tensorflow", "jax"), default=None,
                     help="Keras backend (default: KERAS_BACKEND, else tensorflow); the data "
                          "pipelines are tf.data either way")
    run.add_argument("--scan", action="store_true",
                     help="on the JAX backend, run one traced block over the blocks' stacked "
                          "weights (the route scan=blocks, not saved with the model): one "
                          "block compiled instead of all")
    run.add_argument("--remat", action="store_true",
                     help="recompute each encoder block in the backward pass (the route "
                          "remat=blocks, not saved with the model): less training memory, "
                          "slower steps")
    run.add_argument("--compile-cache", metavar="DIR", default=None,
                     help="keep compiled XLA programs in DIR for the next run (JAX backend)")
    run.add_argument("--validation-split", default=validation_split,
                     help=f"tfds split to validate on ({validation_split}; 'none' to skip); "
                          "with --folder, 'validation' holds out a seeded 10%% of the images")
    run.add_argument("--overwrite", action="store_true",
                     help="start over in an --output folder that holds a run")
    run.add_argument("--verbose", type=int, default=1, choices=(0, 1, 2),
                     help="Keras' progress output: 0, 1 or 2")
    return run
