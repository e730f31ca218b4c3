"""`keras-vit train`: `keras_vit.training.fit` on a tfds data set or an image folder.

    keras-vit train --model B/16 --weights imagenet21k/ViT-B_16 --dataset cifar10 \\
        --image-size 384 --batch-size 64 --target-batch-size 512 --steps 10000 --lr 0.003 \\
        --output runs/cifar10

Running the same command again after an interruption resumes from the last finished epoch;
on a finished run it says so (`--overwrite` starts over). It ends with a table of what was
trained on, the best epoch and the files written (`--json`: one JSON object instead).
"""

import sys

from keras_vit_cli.arguments import (
    add_data_arguments,
    add_model_arguments,
    add_run_arguments,
    number_arg,
)
from keras_vit_cli.preflight import check_data_folder, check_model_paths, check_run_flags
from keras_vit_cli.common import (
    data_class_names,
    data_num_classes,
    fit_from_args,
    input_size,
    model_from_args,
    run_architecture,
    start_run,
)
from keras_vit_cli.summaries import add_json_argument, print_training

DEFAULT_STEPS = 10_000  # the paper's CIFAR fine-tuning (appendix B.1.1)


def configure(parser):
    add_model_arguments(parser, " to start from (the head is replaced when the classes "
                                "differ); without it, random initialisation")
    add_data_arguments(parser)
    run = add_run_arguments(
        parser, outputs="final.npz, best.npz, config.json, run.json, backup/, logs/",
        steps=DEFAULT_STEPS, learning_rate="finetune 0.003, pretrain 0.001",
        validation_split="validation")
    run.add_argument("--recipe", choices=("finetune", "pretrain"), default="finetune",
                     help="finetune: SGD 0.9, clip 1, warm-up + cosine; pretrain: AdamW, weight "
                          "decay, warm-up + linear decay (default finetune)")
    run.add_argument("--weight-decay", type=number_arg(0), default=0.1,
                     help="pretrain only (0.1)")
    run.add_argument("--label-smoothing", type=number_arg(0, 1), default=0.0,
                     help="label smoothing of the cross-entropy targets, in [0, 1) (default "
                          "0: none)")
    add_json_argument(parser)


def check(args):
    """The inputs, before TensorFlow starts: the image folder, the model and weights files,
    and the run flags (the output folder, the precision, the strategy)."""
    check_data_folder(args)
    check_model_paths(args)
    check_run_flags(args)


def run(args):  # the dispatcher has applied --backend
    from keras_vit.checks import check_trainable_classes

    num_classes = check_trainable_classes(data_num_classes(args))
    strategy = start_run(args)
    with strategy.scope():
        model, names = model_from_args(args, num_classes=num_classes,
                                       architecture=run_architecture(args))
        if args.weights:
            replace_renamed_head(model, args, names)
    summary = fit_from_args(args, model, strategy, input_size(model, args), recipe=args.recipe,
                            default_steps=DEFAULT_STEPS, weight_decay=args.weight_decay,
                            label_smoothing=args.label_smoothing)
    print_training(args, summary)
    return 0


def replace_renamed_head(model, args, names):
    """Starts the head afresh (zeros, as a new head) where the classes of the checkpoint
    `args.weights`, as many as the data's, have other names: its rows would be trained as
    other classes. A run that resumes takes its own head from its backup."""
    import keras  # the command line loads Keras only once a command runs

    from keras_vit import training

    data_names, weights = data_class_names(args), args.weights
    if not (names and data_names) or len(names) != len(data_names) \
            or tuple(names) == tuple(data_names) \
            or training.resume_epoch(training.backup_dir(args.output)):
        return  # a head of another size is new already

    differ = sum(a != b for a, b in zip(names, data_names))
    print(f"keras-vit train: the classes of --weights {weights} are named otherwise than the "
          f"data's ({differ} of {len(names)} differ, e.g. {_first_difference(names, data_names)})"
          ": the head starts afresh.", file=sys.stderr)
    head = model.get_layer("head")
    for variable in head.weights:
        variable.assign(keras.ops.zeros(variable.shape, variable.dtype))


def _first_difference(names, data_names):
    index = next(i for i, (a, b) in enumerate(zip(names, data_names)) if a != b)
    return f"label {index} {names[index]!r:.40} -> {data_names[index]!r:.40}"


COMMANDS = {"train": (configure, run, check)}
