"""`keras-vit train`: `keras_vit.training.fit` on a tfds data set or an image folder.

    keras-vit train --model B/16 --weights imagenet21k/ViT-B_16 --dataset cifar10 \\
        --image-size 384 --batch-size 64 --target-batch-size 512 --steps 10000 --lr 0.003 \\
        --output runs/cifar10

Running the same command again after an interruption resumes from the last finished epoch;
on a finished run it says so (`--overwrite` starts over).
"""

from keras_vit.cli.common import (
    add_data_arguments,
    add_model_arguments,
    data_num_classes,
    load_data,
    model_from_args,
    positive_int_arg,
    undecodable_files_named,
)


def configure(parser):
    add_model_arguments(parser, " to start from (the head is replaced when the classes "
                                "differ); without it, random initialisation")
    add_data_arguments(parser)
    run = parser.add_argument_group("run")
    run.add_argument("--output", required=True,
                     help="run folder: final.npz, best.npz, config.json, run.json, backup/, logs/")
    run.add_argument("--recipe", choices=("finetune", "pretrain"), default="finetune",
                     help="finetune: SGD 0.9, clip 1, warm-up + cosine; pretrain: AdamW, weight "
                          "decay, warm-up + linear decay (default finetune)")
    length = run.add_mutually_exclusive_group()
    length.add_argument("--steps", type=positive_int_arg,
                        help="optimizer updates, rounded up to whole epochs (default 10000)")
    length.add_argument("--epochs", type=positive_int_arg, help="whole passes over the data")
    run.add_argument("--lr", type=float, default=None,
                     help="peak learning rate (finetune 0.003, pretrain 0.001)")
    run.add_argument("--warmup-steps", type=int, default=None,
                     help="linear warm-up updates (default: 500 finetune, 10000 pretrain, at "
                          "most 10%% of the updates)")
    run.add_argument("--weight-decay", type=float, default=0.1, help="pretrain only (0.1)")
    run.add_argument("--target-batch-size", type=positive_int_arg, default=None,
                     help="reach this batch by gradient accumulation, e.g. 512")
    run.add_argument("--label-smoothing", type=float, default=0.0)
    run.add_argument("--precision", default="float32", help="float32, bfloat16 or float16")
    run.add_argument("--no-xla", action="store_true", help="do not compile with XLA")
    run.add_argument("--backend", choices=("tensorflow", "jax"), default=None,
                     help="Keras backend (default: KERAS_BACKEND, else tensorflow); the data "
                          "pipelines are tf.data either way")
    run.add_argument("--validation-split", default="validation",
                     help="tfds split to validate on (validation; 'none' to skip); with "
                          "--folder, 'validation' holds out a seeded 10%% of the images")
    run.add_argument("--overwrite", action="store_true",
                     help="start over in an --output folder that holds a run")
    run.add_argument("--verbose", type=int, default=1, choices=(0, 1, 2),
                     help="Keras' progress output: 0, 1 or 2")


def run(args):  # the dispatcher has applied --backend
    import keras

    from keras_vit import distribute, training
    from keras_vit.fileio import check_writable_dir
    from keras_vit.validation import check_trainable_classes

    num_classes = check_trainable_classes(data_num_classes(args))
    if args.folder and args.validation_split not in ("validation", "none"):
        raise ValueError(f"--validation-split {args.validation_split!r} with --folder: expected "
                         "'validation' (a held-out 10%) or 'none'.")
    check_writable_dir(args.output)
    training.set_precision(args.precision)
    keras.utils.set_random_seed(args.seed)
    strategy = distribute.get_strategy(args.strategy)
    distribute.global_batch_size(args.batch_size, strategy)
    with strategy.scope():
        model, _ = model_from_args(args, num_classes=num_classes)
    size = tuple(model.inputs[0].shape[1:3])
    validate = args.validation_split != "none"
    train = load_data(args, "train" if validate or not args.folder else "all", True, strategy,
                      size)
    validation = load_data(args, args.validation_split, False, strategy, size) \
        if validate else None
    with undecodable_files_named(args):
        training.fit(  # prints its summary
            model, train, validation, output_dir=args.output, recipe=args.recipe,
            steps=args.steps or (None if args.epochs else 10_000), epochs=args.epochs,
            learning_rate=args.lr, warmup_steps=args.warmup_steps,
            weight_decay=args.weight_decay, target_batch_size=args.target_batch_size,
            label_smoothing=args.label_smoothing, jit_compile=False if args.no_xla else None,
            verbose=args.verbose, overwrite=args.overwrite)
    return 0


COMMANDS = {"train": (configure, run)}
