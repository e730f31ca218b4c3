"""`keras-vit train` and `keras-vit evaluate`: the recipes, pipelines and strategies as commands.

    keras-vit train --model B/16 --pretrained imagenet21k/ViT-B_16 --dataset cifar10 \\
        --image-size 384 --batch-size 64 --target-batch-size 512 --steps 10000 --lr 0.003 \\
        --output runs/cifar10
    keras-vit evaluate --model B/16 --weights runs/cifar10/final.npz --dataset cifar10 \\
        --image-size 384

Running the same `train` command again after an interruption resumes from the last epoch
backed up in `OUTPUT/backup`. Run as `python -m keras_vit.train_cli train ...` as well.
"""

import json
import math
import os
import sys

from keras_vit.cli import command


def _add_model_args(parser):
    parser.add_argument("--model", default="B/16",
                        help="paper variant, e.g. B/16, S/16, Ti/16 (default B/16)")
    parser.add_argument("--model-config", type=json.loads, default=None, metavar="JSON",
                        help="a full keras_vit.ViT configuration instead of --model, e.g. "
                             '\'{"patch_size": 2, "hidden_size": 64, "num_layers": 4, '
                             '"num_heads": 4, "mlp_dim": 128}\'')
    parser.add_argument("--image-size", type=int, default=224, help="model resolution (224)")


def _add_data_args(parser):
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--dataset", help="tensorflow-datasets name: cifar10, cifar100, "
                        "oxford_iiit_pet, oxford_flowers102, imagenet2012")
    source.add_argument("--folder", help="image folder with one subfolder per class")
    parser.add_argument("--data-dir", help="tensorflow-datasets data directory")
    parser.add_argument("--manual-dir", help="hand-downloaded files (imagenet2012)")
    parser.add_argument("--batch-size", type=int, default=64, help="global batch size (64)")
    parser.add_argument("--strategy", default="auto",
                        help="auto, tpu, mirrored, multiworker or cpu (default auto)")
    parser.add_argument("--seed", type=int, default=0, help="data order and initialisation seed")


def _add_train_args(parser):
    _add_model_args(parser)
    _add_data_args(parser)
    parser.add_argument("--output", required=True,
                        help="run directory: backup/, best.npz, final.npz, logs/")
    parser.add_argument("--pretrained", help="checkpoint to start from: registry name, .npz "
                        "path or URL (the head is replaced when the classes differ)")
    parser.add_argument("--recipe", choices=("finetune", "pretrain"), default="finetune",
                        help="finetune: SGD 0.9, clip 1, warmup + cosine; pretrain: AdamW, "
                        "weight decay, warmup + linear decay (default finetune)")
    parser.add_argument("--steps", type=int, default=10_000,
                        help="optimizer updates, rounded up to whole epochs (10000)")
    parser.add_argument("--lr", type=float, default=None,
                        help="peak learning rate (finetune 0.003, pretrain 0.001)")
    parser.add_argument("--warmup-steps", type=int, default=None,
                        help="linear warmup updates (finetune 500, pretrain 10000)")
    parser.add_argument("--weight-decay", type=float, default=0.1, help="pretrain only (0.1)")
    parser.add_argument("--target-batch-size", type=int, default=None,
                        help="reach this batch by gradient accumulation, e.g. 512")
    parser.add_argument("--label-smoothing", type=float, default=0.0)
    parser.add_argument("--precision", default="float32", help="float32, bfloat16 or float16")
    parser.add_argument("--no-xla", action="store_true", help="do not compile with XLA")
    parser.add_argument("--validation-split", default="validation",
                        help="tfds split to validate on (validation; 'none' to skip); with "
                             "--folder, 'validation' holds out a seeded 10%% of the images")
    parser.add_argument("--verbose", type=int, default=1, help="Keras verbosity: 0, 1 or 2")


def _add_evaluate_args(parser):
    _add_model_args(parser)
    _add_data_args(parser)
    parser.add_argument("--weights", required=True,
                        help="checkpoint to evaluate: .npz path, registry name or URL")
    parser.add_argument("--split", default="test",
                        help="tfds split (test); for --folder: all (default), train or "
                             "validation (the held-out 10%% of `train`)")


# Image folders: this fraction of the images (seeded) is the validation split of `train`.
FOLDER_VALIDATION_FRACTION = 0.1


def _load_data(args, split, training, strategy, start_epoch=0):
    """`split`: a tfds split; for folders "train" / "validation" (held-out 10%) or "all"."""
    from keras_vit import data

    common = dict(image_size=args.image_size, batch_size=args.batch_size, training=training,
                  seed=args.seed, start_epoch=start_epoch, strategy=strategy)
    if args.folder:
        if split != "all":
            common.update(validation_split=FOLDER_VALIDATION_FRACTION,
                          subset="validation" if split == "validation" else "training")
        return data.from_folder(args.folder, **common)
    return data.from_tfds(args.dataset, split, data_dir=args.data_dir,
                          manual_dir=args.manual_dir, **common)


def _build_model(args, num_classes, include_top=True):
    import keras_vit

    if args.model_config is not None:
        config = dict(args.model_config)
        config.setdefault("image_size", args.image_size)
        config.setdefault("num_classes", num_classes)
        config["include_top"] = include_top
        model = keras_vit.ViT(**config)
    else:
        model = keras_vit.create_model(args.model, image_size=args.image_size,
                                       num_classes=num_classes, include_top=include_top)
    if not include_top:
        return model
    head = model.output_shape[-1]
    if head != num_classes:
        raise ValueError(
            f"The data has {num_classes} classes (labels 0..{num_classes - 1}) but the model's "
            f"head has {head} outputs. Expected num_classes={num_classes}."
        )
    return model


def _load_weights(model, source):
    from keras_vit.pretrained import load_pretrained

    report = load_pretrained(model, source)
    if report["fresh"]:
        print(f"Loaded {source}; fresh (zero-initialised) layers: {', '.join(report['fresh'])}")


def _check_early(args):
    """The errors that need no data or model: raised before anything heavy starts."""
    from keras_vit import data, distribute, training

    if args.strategy not in distribute.STRATEGIES:
        raise ValueError(f"Unknown strategy {args.strategy!r}. Expected one of "
                         f"{', '.join(distribute.STRATEGIES)}.")
    if args.dataset:
        data.get_dataset_spec(args.dataset)
    else:
        data.list_image_folder(args.folder)
        if getattr(args, "validation_split", "none") not in ("validation", "none"):
            raise ValueError(f"--validation-split {args.validation_split!r} with --folder: "
                             "expected 'validation' (a held-out 10%) or 'none'.")
    if getattr(args, "precision", "float32") not in training.PRECISIONS:
        raise ValueError(f"Unknown precision {args.precision!r}. Expected one of "
                         f"{', '.join(training.PRECISIONS)}.")
    if getattr(args, "output", None):
        training.check_writable_dir(args.output)


@command("train", "train or fine-tune a ViT with the paper's recipe (resumes after a crash)")
def train_command(args):
    _check_early(args)
    import keras

    from keras_vit import checkpoint, distribute, training

    keras.utils.set_random_seed(args.seed)
    strategy = distribute.get_strategy(args.strategy)
    distribute.global_batch_size(args.batch_size, strategy)
    accumulation = 1
    if args.target_batch_size:
        accumulation = training.accumulation_steps(args.target_batch_size, args.batch_size)
    training.set_precision(args.precision)
    start_epoch = training.resume_epoch(training.backup_dir(args.output))
    validate = args.validation_split != "none"
    train_split = "train" if validate or not args.folder else "all"
    train = _load_data(args, train_split, True, strategy, start_epoch)
    validation = _load_data(args, args.validation_split, False, strategy) if validate else None

    steps_per_epoch = train.steps_per_epoch
    epochs = math.ceil(args.steps * accumulation / steps_per_epoch)
    total_updates = epochs * steps_per_epoch // accumulation
    finetune = args.recipe == "finetune"
    lr = args.lr or (0.003 if finetune else 1e-3)
    warmup = args.warmup_steps if args.warmup_steps is not None else (
        training.FINETUNE_WARMUP_STEPS if finetune else training.PRETRAIN_WARMUP_STEPS)
    warmup = min(warmup, total_updates - 1)
    with strategy.scope():
        model = _build_model(args, train.num_classes)
        if args.pretrained:
            _load_weights(model, args.pretrained)
        common = dict(learning_rate=lr, total_steps=total_updates, warmup_steps=warmup,
                      accumulation_steps=accumulation, label_smoothing=args.label_smoothing,
                      jit_compile=False if args.no_xla else None)
        if finetune:
            training.compile_finetune(model, **common)
        else:
            training.compile_pretrain(model, weight_decay=args.weight_decay, **common)
    print(f"Training {model.name} ({model.count_params():,} parameters) on "
          f"{train.num_examples} images, {train.num_classes} classes: {epochs} epochs of "
          f"{steps_per_epoch} steps, batch {args.batch_size} x {accumulation} accumulation = "
          f"{total_updates} updates; {strategy.num_replicas_in_sync} replica(s), "
          f"XLA {model.jit_compile}, precision {args.precision}"
          + (f"; resuming at epoch {start_epoch}" if start_epoch else ""), flush=True)
    callbacks = training.training_callbacks(
        args.output, monitor="val_accuracy" if validation else "loss",
        best=True)
    model.fit(train.dataset, steps_per_epoch=steps_per_epoch, epochs=epochs,
              validation_data=validation.dataset if validation else None,
              callbacks=callbacks, verbose=args.verbose)
    if distribute.is_chief():
        checkpoint.save_npz(model, os.path.join(args.output, "final.npz"))
    summary = {"final_weights": os.path.join(args.output, "final.npz")}
    if validation:
        loss, accuracy = model.evaluate(validation.dataset, verbose=0)
        summary.update(validation_loss=loss, validation_accuracy=accuracy)
    print(json.dumps(summary))
    return 0


train_command.configure = _add_train_args


@command("evaluate", "top-1/top-5 accuracy, loss, per-class accuracy and confusion matrix")
def evaluate_command(args):
    _check_early(args)
    import keras

    from keras_vit import distribute, evaluation, training

    strategy = distribute.get_strategy(args.strategy)
    distribute.global_batch_size(args.batch_size, strategy)
    split = _evaluation_split(args, args.split)
    data = _load_data(args, split, False, strategy)
    with strategy.scope():
        model = _build_model(args, data.num_classes)
        _load_weights(model, args.weights)
    result = {"split": split, "examples": data.num_examples}
    if strategy.num_replicas_in_sync == 1:
        report = evaluation.evaluate(model, data.dataset, class_names=data.class_names or None,
                                     out_dir=args.out, progress=False)
        result.update(loss=report["loss"], accuracy=report["top1"], top5=report["top5"],
                      files=report["files"])
    else:  # per-image predictions are gathered on one replica only; Keras reduces the rest
        with strategy.scope():
            training.compile_model(model, keras.optimizers.SGD(),
                                   jit_compile=False if args.no_xla else None)
        loss, accuracy = model.evaluate(data.dataset, verbose=0)
        result.update(loss=loss, accuracy=accuracy,
                      note="top-5 and the per-class reports need a single-replica strategy")
    print(json.dumps(result))
    return 0


def _evaluation_split(args, split):
    if args.folder and split not in ("train", "validation", "all"):
        return "all"
    return split


def _add_evaluate_all(parser):
    _add_evaluate_args(parser)
    parser.add_argument("--no-xla", action="store_true", help="do not compile with XLA")
    parser.add_argument("--out", default=None,
                        help="write per_class_accuracy.csv and confusion_matrix.png here")


@command("fewshot", "few-shot linear accuracy of frozen features (the paper's second metric)")
def fewshot_command(args):
    _check_early(args)
    from keras_vit import distribute, evaluation

    shots = _int_list("--shots", args.shots)
    l2_regs = [float(v) for v in args.l2.split(",")] if args.l2 else evaluation.DEFAULT_L2_REGS
    strategy = distribute.get_strategy(args.strategy)
    features = {}
    for role, split in (("train", args.train_split), ("test", args.split)):
        data = _load_data(args, _evaluation_split(args, split), False, strategy)
        if role == "train":
            with strategy.scope():
                model = _build_model(args, data.num_classes, include_top=False)
                _load_weights(model, args.weights)
        cache = os.path.join(args.cache, role) if args.cache else None
        features[role] = evaluation.extract_features(model, data.dataset, cache=cache,
                                                     progress=args.verbose > 0, strategy=strategy)
    table = evaluation.fewshot_table(*features["train"], *features["test"], shots=shots,
                                     l2_regs=l2_regs, seed=args.seed)
    print(evaluation.format_fewshot_table(table))
    return 0


def _int_list(flag, text):
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise ValueError(f"{flag} must be positive integers separated by commas. Received: {text}")
    return values


def _add_fewshot_args(parser):
    _add_evaluate_args(parser)
    parser.add_argument("--train-split", default="train",
                        help="split the k images per class are drawn from (train)")
    parser.add_argument("--shots", default="1,5,10,25", help="images per class (1,5,10,25)")
    parser.add_argument("--l2", default=None, help="L2 regularisation values, comma-separated")
    parser.add_argument("--cache", default=None, help="cache the features here as .npy")
    parser.add_argument("--verbose", type=int, default=1, help="progress bars: 0 or 1")


fewshot_command.configure = _add_fewshot_args

evaluate_command.configure = _add_evaluate_all


if __name__ == "__main__":
    from keras_vit import cli

    sys.exit(cli.main())
