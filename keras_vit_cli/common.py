"""What every command shares: the model flags, the one way to get a model from them, the data
flags, and their parsing. Nothing here imports TensorFlow at module level.

The model flags mean the same in every command:

- `--model`: a variant (`B/16`, `ViT_B16`, `R50+B/16`) or a `.keras` file;
- `--model-config JSON`: `keras_vit.ViT` arguments, instead of a variant;
- `--weights` (alias `--pretrained`): a registry name, an `.npz` path or URL, or `default`
  for the variant's default checkpoint; without `--model`, the architecture is read from it
  (its registry entry, the `config.json` training writes beside it, or its array shapes);
- `--image-size N|HxW`: the input resolution (default: the checkpoint's, else 224).
"""

import argparse
import contextlib
import json
import os
import re
import sys

from keras_vit_cli.catalog import (
    library_arguments,
    library_module,
    library_names,
    registry_entries,
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
# The largest seed: NumPy's and Keras' seeds are 32-bit.
SEED_MAX = 2**32 - 1


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
seed_arg = int_arg(0, SEED_MAX)


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


def check_images_exist(paths):
    """Raises FileNotFoundError for the first of `paths` that does not exist (ValueError for a
    folder or another file that is not a regular one, PermissionError for one this process
    cannot read): all are looked at before any is read or a model is loaded."""
    for path in paths:
        if os.path.isdir(os.path.expanduser(path)):
            raise ValueError(f"{path} is a folder. Expected image files (e.g. "
                             f"{os.path.join(path, '*.jpg')}).")
        if not os.path.exists(os.path.expanduser(path)):
            raise FileNotFoundError(f"Image file {path} does not exist.")
        if not os.path.isfile(os.path.expanduser(path)):  # reading a FIFO could wait forever
            raise ValueError(f"Image file {path} is not a regular file (a FIFO, socket or "
                             "device). Expected an image file.")
        check_readable(path, f"Image file {path}")


def check_readable(path, what):
    """Raises PermissionError if this process may not read the existing file `path` (`what`:
    the file, for the message)."""
    if not os.access(os.path.expanduser(path), os.R_OK):
        raise PermissionError(f"{what} cannot be read (permission denied). Expected a file "
                              "this user may read.")


# The suffixes of a --weights value that names a local file (`keras_vit.weights.sources`).
LOCAL_WEIGHTS_SUFFIXES = (".npz", ".safetensors")


def _local_weights_path(source):
    """The file a `--weights` value names, if it names one by its form, as
    `keras_vit.weights.sources.fetch_params` reads it: not 'default', not a registry name, not a
    URL or hf://; an `.npz` or `.safetensors` path, or one starting with `.`, `~` or `/`.
    None otherwise (a name the library checks, naming close registry names)."""
    if not source or source == DEFAULT_WEIGHTS or "://" in source:
        return None
    if not (source.endswith(LOCAL_WEIGHTS_SUFFIXES) or source.startswith((".", "~", os.sep))):
        return None
    if source in {entry["name"] for entry in registry_entries()}:
        return None
    return os.path.expanduser(source)


def check_model_paths(args):
    """Refuses a `--model` .keras file or a local `--weights` file that does not exist, with
    the message loading it gives (checked before TensorFlow starts, after the model flags'
    conflicts)."""
    check_model_flag_conflicts(args)
    model = getattr(args, "model", None)
    if model and model.endswith(".keras"):
        if not os.path.isfile(os.path.expanduser(model)):
            raise FileNotFoundError(f"--model {model}: no such file.")
        check_readable(model, f"--model {model}")
    path = _local_weights_path(getattr(args, "weights", None))
    if path is not None:
        # A folder is read as a keras-hub preset (the library names what it lacks otherwise).
        if not (os.path.isfile(path) or os.path.isdir(path)):
            raise FileNotFoundError(f"No checkpoint file at {path}.")
        check_readable(path, f"The checkpoint {'folder' if os.path.isdir(path) else 'file'} "
                             f"{path}")


def check_class_names_file(args):
    """Refuses a `--class-names` file that does not exist or is a folder, with the message
    reading it gives (checked before TensorFlow starts)."""
    name = getattr(args, "class_names", None)
    if not name:
        return
    path = os.path.expanduser(name)
    if os.path.isdir(path):
        raise ValueError(f"--class-names {name} is a folder. {CLASS_NAMES_EXPECTED}")
    if not os.path.exists(path):
        raise FileNotFoundError(f"Class-names file {path} does not exist.")
    if not os.path.isfile(path):  # reading a FIFO could wait forever
        raise ValueError(f"--class-names {name} is not a regular file (a FIFO, socket or "
                         f"device). {CLASS_NAMES_EXPECTED}")
    check_readable(path, f"Class-names file {path}")


def check_data_folder(args):
    """Refuses a `--folder` that does not exist or is not a folder, with the message reading it
    gives (checked before TensorFlow starts)."""
    folder = getattr(args, "folder", None)
    if folder is not None and not os.path.isdir(folder):
        raise FileNotFoundError(f"Image folder {folder!r} does not exist or is not a directory.")
    if folder is not None and not os.access(folder, os.R_OK | os.X_OK):
        raise PermissionError(f"Image folder {folder!r} cannot be read (permission denied). "
                              "Expected a folder this user may list and read.")


def check_choice(flag, value, choices):
    """Refuses a flag's value that is not one of `choices` (`library_names`: the library's own
    list, read without TensorFlow)."""
    if value not in choices:
        raise ValueError(f"{flag} {value!r} is not one of {', '.join(choices)}.")


def check_strategy(args):
    """`--strategy`, before TensorFlow starts (`keras_vit.parallel.tf_distribute`'s names)."""
    if getattr(args, "cpu_replicas", None) and args.strategy != "mirrored":
        raise ValueError(f"--cpu-replicas {args.cpu_replicas} splits the CPU for --strategy "
                         f"mirrored; --strategy is {args.strategy!r}. Expected --strategy "
                         "mirrored with it.")
    check_choice("--strategy", args.strategy,
                 library_names("parallel/tf_distribute.py", "STRATEGIES"))


def check_precision(args):
    """`--precision`, before TensorFlow starts (`keras_vit.execution.PRECISIONS`)."""
    check_choice("--precision", args.precision, library_names("execution.py", "PRECISIONS"))


def check_new_file(flag, path, overwrite, what):
    """Refuses an output file path that is a folder, a symbolic link, inside a folder a running
    keras_vit job holds, or (without `overwrite`) an existing file: `keras_vit.fileio`'s rules,
    checked before TensorFlow starts."""
    check_output_file(flag, path, what)
    library_module("fileio").check_destination(os.path.expanduser(path), overwrite)


def check_output_file(flag, path, what):
    """Refuses an output file path that is an existing folder (`what`: the file, for the
    message)."""
    if os.path.isdir(os.path.expanduser(path)):
        raise ValueError(f"{flag} {path} is a folder; expected a file path for {what}.")


def check_output_folder(flag, path, what):
    """Refuses an output folder path that is an existing file (`what`: the folder's contents,
    for the message)."""
    path_ = os.path.expanduser(path)
    if os.path.exists(path_) and not os.path.isdir(path_):
        raise ValueError(f"{flag} {path} is a file; expected a folder (or a new name) for "
                         f"{what}.")


def add_class_names_argument(parser):
    parser.add_argument("--class-names", metavar="FILE",
                        help="a UTF-8 text file with one class name a line, in label order "
                             "(default: the checkpoint's, the ImageNet names for 1000 or "
                             "21843 classes, else the class indices)")


def check_model_flag_conflicts(args):
    """The model flags that contradict each other or name nothing (an unknown variant, unknown
    `--model-config` keys), without a file read or TensorFlow: checked before it starts, and
    before the input files."""
    config = getattr(args, "model_config", None)
    if config is not None:
        known = library_arguments("model.py", "ViT")
        unknown = sorted(set(config) - set(known))
        if unknown:
            raise ValueError(f"--model-config: unknown keys {unknown}. Expected keras_vit.ViT "
                             f"arguments: {', '.join(sorted(known))}.")
    model = getattr(args, "model", None)
    if getattr(args, "model_config", None) is not None and model:
        raise ValueError("--model and --model-config both describe the architecture. "
                         "Expected one of them.")
    if model and not model.endswith(".keras"):
        library_module("configs").get_variant(model)  # an unknown variant names the known
    if model and model.endswith(".keras") and getattr(args, "weights", None) == DEFAULT_WEIGHTS:
        raise ValueError(f"--weights {DEFAULT_WEIGHTS} needs a variant --model; a .keras file "
                         "holds its own weights.")


def _load_keras_file(path, image_size, num_classes):
    from keras_vit.weights.keras_file import load_model

    if not os.path.isfile(os.path.expanduser(path)):
        raise FileNotFoundError(f"--model {path}: no such file.")
    model = load_model(path)
    shape = tuple(model.inputs[0].shape) if len(model.inputs) == 1 else None
    if shape is None or len(shape) != 4 or shape[-1] != 3 \
            or len(model.outputs) != 1 or len(model.outputs[0].shape) != 2:
        raise ValueError(
            f"--model {path} takes {[tuple(i.shape) for i in model.inputs]} and gives "
            f"{[tuple(o.shape) for o in model.outputs]}. Expected an image classifier: one "
            "input of RGB images [batch, height, width, 3] and one output [batch, classes].")
    size = tuple(model.inputs[0].shape[1:3])
    if image_size and None not in size and tuple(image_size) != size:
        raise ValueError(f"--model {path} takes {size[0]}x{size[1]} images; --image-size "
                         f"{image_size[0]}x{image_size[1]} cannot change a saved model. Expected "
                         "no --image-size, or a variant --model with --weights.")
    classes = model.outputs[0].shape[-1]
    if num_classes is not None and classes != num_classes:
        raise ValueError(f"--model {path} has {classes} outputs but the data has {num_classes} "
                         "classes.")
    return model


def model_stage(args, default_weights=False):
    """The progress line of getting the model the model flags name: what is built or loaded,
    and from which weights (`default_weights`: a variant without --weights gets its default
    checkpoint, as `model_from_args(default_weights=True)`)."""
    model = getattr(args, "model", None)
    if (model or "").endswith(".keras"):
        return f"loading {model}" + (f" with the weights {args.weights}" if args.weights else "")
    what = model or ("the model of --model-config" if args.model_config is not None
                     else "the model")
    weights = args.weights or ("its default checkpoint" if model and default_weights else None)
    return f"building {what}" + (f" with the weights {weights}" if weights else
                                 " with initial weights")


def input_size(model, args):
    """The image size a command feeds `model`: its own, or `--image-size` for a model of any
    size (`dynamic_image_size`)."""
    from keras_vit.model_parts import model_image_size

    dynamic = model.inputs[0].shape[1] is None
    return tuple(args.image_size) if dynamic and args.image_size else model_image_size(model)


def require_architecture(args, weights=None):
    """Refuses flags that name no architecture (no --model, --model-config or weights)."""
    if not (args.model or args.model_config is not None or weights or args.weights):
        raise ValueError("Give --model (a variant or a .keras file), --model-config, or "
                         "--weights to read the architecture from.")


def model_from_args(args, *, num_classes=None, include_top=True, default_weights=False,
                    need_head=False, architecture=None):
    """The model a command asks for, and the class names that come with it.

    Args:
        args: parsed arguments with the model flags (`add_model_arguments`).
        num_classes: int or None. The head size the command needs (from its data); None
            keeps the checkpoint's head (or 1000 for a variant without weights).
        include_top: bool. False for the representation only.
        default_weights: bool. Whether a variant without `--weights` loads its default
            checkpoint (as `predict` does) rather than random weights.
        need_head: bool. Refuse weights whose head does not fit `num_classes` (instead of
            starting from a fresh zero head).
        architecture: dict or None. More `keras_vit.ViT` arguments (e.g. `classifier`) for a
            variant or `--model-config`.

    Returns:
        (model, class names or None).
    """
    import keras_vit
    from keras_vit import builders, configs

    check_model_flag_conflicts(args)
    weights = args.weights
    if weights == DEFAULT_WEIGHTS or (weights is None and default_weights and args.model
                                      and not args.model.endswith(".keras")):
        if not args.model or args.model.endswith(".keras"):
            raise ValueError(f"--weights {DEFAULT_WEIGHTS} needs a variant --model, e.g. B/16.")
        size = args.image_size or (224, 224)
        weights = keras_vit.default_checkpoint(args.model, max(size), num_classes or 1000,
                                               include_top)
    overrides = {"include_top": include_top}
    if args.image_size:
        overrides["image_size"] = args.image_size
    if num_classes is not None:
        overrides["num_classes"] = num_classes

    if args.model and args.model.endswith(".keras"):
        if architecture:
            raise ValueError(f"--model {args.model} is a saved model: its architecture cannot "
                             f"change ({', '.join(architecture)}).")
        model = _load_keras_file(args.model, args.image_size, num_classes if include_top else None)
        if weights:
            keras_vit.load_pretrained(model, weights)
        return model, None
    if args.model_config is not None:
        base = dict(args.model_config)
    elif args.model:
        spec = configs.get_variant(args.model)
        base = dict(spec.config(), name=spec.builder_name.lower())
    else:
        require_architecture(args, weights)
        base = {}
    base.update(architecture or {})
    declared = base.get("num_classes")
    if num_classes is not None and declared is not None and declared != num_classes:
        raise ValueError(f"The data has {num_classes} classes (labels 0..{num_classes - 1}) but "
                         f"the model's head has {declared}. Expected num_classes={num_classes}.")
    if not weights:
        return keras_vit.ViT(**dict(base, **overrides)), None
    model, info = builders.build_from_checkpoint(weights, **dict(base, **overrides))
    if need_head and "head" in info["report"]["fresh"]:
        has = f"a head of {info['num_classes']} classes" if info["num_classes"] else "no head"
        raise ValueError(f"--weights {weights} has {has}, but the data has {num_classes} "
                         "classes. Expected weights trained on these classes (or `keras-vit "
                         "fewshot`, which uses the features only).")
    return model, info["class_names"]


CLASS_NAMES_EXPECTED = "Expected a UTF-8 text file with one class name a line."


def class_names_from_args(args, num_classes, checkpoint_names=None):
    """The class names: `--class-names FILE`, else the checkpoint's, else the defaults."""
    from keras_vit import labels

    if getattr(args, "class_names", None):
        if os.path.isdir(os.path.expanduser(args.class_names)):
            raise ValueError(f"--class-names {args.class_names} is a folder. "
                             f"{CLASS_NAMES_EXPECTED}")
        return labels.read_class_names(args.class_names, num_classes)
    if checkpoint_names and len(checkpoint_names) == num_classes:
        return list(checkpoint_names)
    return labels.default_class_names(num_classes)


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
                     help="build the encoder as one scanned layer (keras_vit.ViT scan=True: "
                          "one block traced and compiled, on the JAX backend)")
    run.add_argument("--remat", action="store_true",
                     help="recompute each encoder block in the backward pass (keras_vit.ViT "
                          "remat=True): less training memory, slower steps")
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


def check_run_flags(args):
    """The run flags of `train` and `pretrain` that need no TensorFlow: checked before it
    starts, and again by `start_run`."""
    if args.folder and args.validation_split not in ("validation", "none"):
        raise ValueError(f"--validation-split {args.validation_split!r} with --folder: expected "
                         "'validation' (a held-out 10%) or 'none'.")
    check_output_folder("--output", args.output, "the run")
    check_precision(args)
    check_strategy(args)


def start_run(args):
    """What a training command sets up before it builds its model, failing early on bad
    flags: the output folder, the precision policy, the seed, the strategy.

    Returns:
        The `tf.distribute` strategy to build the model under.
    """
    import keras

    from keras_vit import training
    from keras_vit.parallel import tf_distribute
    from keras_vit.fileio import check_writable_dir

    check_run_flags(args)
    from keras_vit.parallel import keras_distribution

    keras_distribution.start_from_environment()  # JAX: a cluster, every device; first
    training.check_output_dir(args.output, args.overwrite)  # before the folder is created
    check_writable_dir(args.output)
    if args.compile_cache:
        training.enable_compilation_cache(args.compile_cache)
    training.set_precision(args.precision)
    if getattr(args, "cpu_replicas", None):
        tf_distribute.split_cpu(args.cpu_replicas)  # before anything starts TensorFlow's runtime
    keras.utils.set_random_seed(args.seed)
    strategy = tf_distribute.get_strategy(args.strategy)
    tf_distribute.global_batch_size(args.batch_size, strategy)
    return strategy


def run_architecture(args):
    """The `keras_vit.ViT` arguments the run flags add to the model flags' (`--scan`,
    `--remat`)."""
    architecture = {name: True for name in ("scan", "remat") if getattr(args, name)}
    return architecture or None


def fit_from_args(args, model, strategy, image_size, *, recipe, default_steps, **kwargs):
    """`keras_vit.training.fit` on the data flags' pipelines with the run flags; `kwargs` go
    to `fit` as they are. Returns its summary."""
    from keras_vit import training

    validate = args.validation_split != "none"
    splits = dict(train="train" if validate or not args.folder else "all",
                  validation=args.validation_split if validate else None)
    # Trained and validated with the model's own preprocessing (its checkpoint's mean and std);
    # a pre-training wrapper, which has none, with the paper's.
    config = getattr(model, "data_config", None)
    train = load_data(args, splits["train"], True, strategy, image_size, config)
    validation = load_data(args, splits["validation"], False, strategy, image_size, config) \
        if validate else None
    with undecodable_files_named(args):
        summary = training.fit(
            model, train, validation, output_dir=args.output, recipe=recipe,
            steps=args.steps or (None if args.epochs else default_steps), epochs=args.epochs,
            learning_rate=args.lr, warmup_steps=args.warmup_steps,
            target_batch_size=args.target_batch_size,
            jit_compile=args.xla, verbose=args.verbose,
            overwrite=args.overwrite, **kwargs)
    return dict(summary, data=data_source(args),
                splits={role: split and data_split(args, split) for role, split in splits.items()})


def load_data(args, split, training, strategy, image_size, data_config=None):
    """An input pipeline from the data flags. `split`: a tfds split; for folders "train" /
    "validation" (the seeded held-out 10%) or "all". `data_config`: the pipeline's
    preprocessing (the model, for its checkpoint's own; see `keras_vit.data`)."""
    from keras_vit import data

    common = dict(image_size=image_size, batch_size=args.batch_size, training=training,
                  seed=args.seed, strategy=strategy, data_config=data_config)
    if args.folder:
        split = data_split(args, split)
        if split != "all":
            common.update(validation_split=FOLDER_VALIDATION_FRACTION,
                          subset="validation" if split == "validation" else "training")
        return data.from_folder(args.folder, skip_corrupt=args.skip_corrupt,
                                labels=getattr(args, "folder_labels", "inferred"), **common)
    return data.from_tfds(args.dataset, split, data_dir=args.data_dir,
                          manual_dir=args.manual_dir, **common)


def data_split(args, split):
    """The split `load_data(args, split, ...)` reads: the tfds split, or for a folder "train",
    "validation" (the held-out fraction) or "all" (every image: also "test", the default)."""
    if not args.folder or split in FOLDER_SPLITS:
        return split
    if split != "test":
        raise ValueError(f"Split {split!r} is not a split of the image folder {args.folder}. "
                         f"Expected one of {', '.join(FOLDER_SPLITS)} or test (every image).")
    return "all"


def data_source(args):
    """The data flags' source: the tfds name or the folder."""
    return args.dataset or args.folder


def describe_split(args, split):
    """A split of the data flags' source (`data_split`'s name) as a person reads it."""
    if not args.folder:
        return f"{args.dataset} '{split}' split"
    held_out = f"{FOLDER_VALIDATION_FRACTION:.0%}"
    return {"all": f"every image of {args.folder}",
            "train": f"{args.folder} less its held-out {held_out}",
            "validation": f"the held-out {held_out} of {args.folder}"}[split]


@contextlib.contextmanager
def undecodable_files_named(args):
    """Turns a decoding error in an image-folder pipeline into one that names the files that
    cannot be decoded (found by one decoding pass over the folder), and how to skip them."""
    try:
        yield
    except Exception as error:  # noqa: BLE001 - only TensorFlow's decoding errors are mapped
        if not args.folder or type(error).__name__ != "InvalidArgumentError":
            raise
        from keras_vit import data

        paths = data.list_image_folder(args.folder, getattr(args, "folder_labels", "inferred"))[0]
        bad = data.find_corrupt_images(paths)
        if not bad:
            raise
        listed = "; ".join(f"{path}: {reason}" for path, reason in bad[:10])
        raise ValueError(f"{len(bad)} file(s) in {args.folder} cannot be decoded: {listed}. "
                         "Pass --skip-corrupt to leave them out.") from None


def data_num_classes(args):
    """The number of classes of the data flags' data set, read without loading it (so that
    bad data flags fail before anything heavy starts)."""
    from keras_vit import data

    if args.dataset:
        return data.get_dataset_spec(args.dataset).num_classes
    paths, _, class_names = data.list_image_folder(args.folder,
                                                   getattr(args, "folder_labels", "inferred"))
    return len(class_names) if class_names else 1
