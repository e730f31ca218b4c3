"""What every command does with its flags once they are checked: the one way to get a model
from the model flags, its class names, the data pipelines of the data flags, and a training
run (the flags themselves: `keras_vit_cli.arguments`; the checks before TensorFlow starts:
`keras_vit_cli.preflight`). Nothing here imports TensorFlow at module level.

The model flags mean the same in every command:

- `--model`: a variant (`B/16`, `ViT_B16`, `R50+B/16`) or a `.keras` file;
- `--model-config JSON`: `keras_vit.ViT` arguments, instead of a variant;
- `--weights` (alias `--pretrained`): a registry name, an `.npz` path or URL, or `default`
  for the variant's default checkpoint; without `--model`, the architecture is read from it
  (its registry entry, the `config.json` training writes beside it, or its array shapes);
- `--image-size N|HxW`: the input resolution (default: the checkpoint's, else 224).
"""

import contextlib
import os

from keras_vit_cli.preflight import CLASS_NAMES_EXPECTED, check_model_flag_conflicts, check_run_flags
from keras_vit_cli.arguments import DEFAULT_WEIGHTS, FOLDER_SPLITS, FOLDER_VALIDATION_FRACTION
from keras_vit_cli.progress import Progress, bars_on_stderr


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
    from keras_vit.positions import model_image_size

    dynamic = model.inputs[0].shape[1] is None
    return tuple(args.image_size) if dynamic and args.image_size else model_image_size(model)


def require_architecture(args, weights=None):
    """Refuses flags that name no architecture (no --model, --model-config or weights)."""
    if not (args.model or args.model_config is not None or weights or args.weights):
        raise ValueError("Give --model (a variant or a .keras file), --model-config, or "
                         "--weights to read the architecture from.")


def model_from_args(args, *, num_classes=None, include_top=True, default_weights=False,
                    need_head=False, architecture=None, classes_flag=None):
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
        classes_flag: str or None. The flag `num_classes` comes from, for messages (None: the
            command's data).

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
            with bars_on_stderr():
                keras_vit.load_pretrained(model, weights, progress=Progress.of(args).stages)
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
        if classes_flag:
            raise ValueError(f"{classes_flag} {num_classes} contradicts the model's head of "
                             f"{declared} classes (--model-config). Expected one number of "
                             "classes.")
        raise ValueError(f"The data has {num_classes} classes (labels 0..{num_classes - 1}) but "
                         f"the model's head has {declared}. Expected num_classes={num_classes}.")
    if not weights:
        return keras_vit.ViT(**dict(base, **overrides)), None
    with bars_on_stderr():
        model, info = builders.build_from_checkpoint(weights, Progress.of(args).stages,
                                                     **dict(base, **overrides))
    if need_head and "head" in info["report"]["fresh"]:
        has = f"a head of {info['num_classes']} classes" if info["num_classes"] else "no head"
        raise ValueError(f"--weights {weights} has {has}, but the data has {num_classes} "
                         "classes. Expected weights trained on these classes (or `keras-vit "
                         "fewshot`, which uses the features only).")
    return model, info["class_names"]


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
    chosen = {name: "blocks" for name in ("scan", "remat") if getattr(args, name)}
    if chosen:
        from keras_vit import routes

        routes.set_routes(**chosen)  # blocks scanned (JAX), recomputed in training
    if getattr(args, "cpu_replicas", None):
        tf_distribute.split_cpu(args.cpu_replicas)  # before anything starts TensorFlow's runtime
    keras.utils.set_random_seed(args.seed)
    strategy = tf_distribute.get_strategy(args.strategy)
    tf_distribute.global_batch_size(args.batch_size, strategy)
    return strategy


def run_architecture(args):
    """The `keras_vit.ViT` arguments the run flags add to the model flags'. `--scan` and
    `--remat` are the routes `scan="blocks"` and `remat="blocks"` (`start_run`), saved nowhere,
    except for a run that was started with `scan=True` or `remat=True` in its model (keras_vit
    0.4's flags): it resumes in that layout, which its backup holds."""
    from keras_vit.training import loop

    flags = [name for name in ("scan", "remat") if getattr(args, name)]
    recorded = loop.recorded_layout(args.output) if flags and not args.overwrite else {}
    return {name: True for name in flags if recorded.get(name)} or None


def fit_from_args(args, model, strategy, image_size, *, recipe, default_steps, **kwargs):
    """`keras_vit.training.fit` on the data flags' pipelines with the run flags; `kwargs` go
    to `fit` as they are. Returns its summary."""
    from keras_vit import training

    validate = args.validation_split != "none"
    splits = dict(train="train" if validate or not args.folder else "all",
                  validation=args.validation_split if validate else None)
    # Trained and validated with the model's own preprocessing (its checkpoint's mean and std;
    # a pre-training model's, its ViT's).
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
        listed = "; ".join(f"{path}: {reason.rstrip('.')}" for path, reason in bad[:10])
        raise ValueError(f"{len(bad)} file(s) in {args.folder} cannot be decoded: {listed}. "
                         "Pass --skip-corrupt to leave them out.") from None


def data_num_classes(args):
    """The number of classes of the data flags' data set, read without loading it (so that
    bad data flags fail before anything heavy starts)."""
    from keras_vit import data

    if args.dataset:
        return data.get_dataset_spec(args.dataset).num_classes
    return len(data_class_names(args)) or 1


def data_class_names(args):
    """The class names of the data flags' image folder (its class folders'), else ()."""
    from keras_vit import data

    if args.dataset:
        return ()
    _, _, class_names = data.list_image_folder(args.folder,
                                               getattr(args, "folder_labels", "inferred"))
    return tuple(class_names or ())
