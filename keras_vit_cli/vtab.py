"""`keras-vit vtab`: VTAB-1k (the paper's Table 2 column), with the paper's protocol.

    keras-vit vtab --model B/16 --weights imagenet21k/ViT-B_16 --output runs/vtab \\
        --batch-size 64 --target-batch-size 512
    keras-vit vtab --model B/16 --weights imagenet21k/ViT-B_16 --tasks natural,kitti_distance \\
        --sweep --output runs/vtab-sweep

Each task: a fresh copy of the model with a new head, fine-tuned on the task's 1,000 examples
(SGD momentum 0.9, batch 512, 2,500 steps, learning rate 0.01, 384x384), scored on its test
split. Writes results.csv (a row per task), summary.md and summary.json (the
natural/specialized/structured/mean table) under --output. Running the same command again
skips the finished tasks and resumes the interrupted one; more --tasks are added to the table.
"""

import os

from keras_vit_cli.arguments import (
    add_model_arguments,
    add_xla_arguments,
    list_arg,
    number_arg,
    positive_int_arg,
    seed_arg,
)
from keras_vit_cli.preflight import (
    check_model_paths,
    check_output_folder,
    check_precision,
    check_strategy,
)
from keras_vit_cli.common import model_from_args, require_architecture
from keras_vit_cli.summaries import add_json_argument, print_result


# The paper's protocol (keras_vit.vtab holds the same numbers; it imports TensorFlow, which
# `keras-vit vtab --help` does not load).
STEPS, LEARNING_RATE, BATCH_SIZE, IMAGE_SIZE = 2500, 0.01, 512, 384
SWEEP_LEARNING_RATES, SWEEP_STEPS = (0.001, 0.01), (500, 2500)


def configure(parser):
    add_model_arguments(parser, " (pre-trained; each task gets a fresh head)")
    parser.set_defaults(image_size=(IMAGE_SIZE, IMAGE_SIZE))
    group = parser.add_argument_group("VTAB-1k")
    group.add_argument("--tasks", default="all",
                       help="comma-separated tasks and groups: natural, specialized, "
                            "structured, all, or task names (caltech101, cifar100, dtd, "
                            "oxford_flowers102, oxford_iiit_pet, sun397, svhn, patch_camelyon, "
                            "eurosat, resisc45, diabetic_retinopathy, clevr_count, "
                            "clevr_distance, dmlab, dsprites_location, dsprites_orientation, "
                            "smallnorb_azimuth, smallnorb_elevation, kitti_distance); "
                            "default all")
    group.add_argument("--output", required=True,
                       help="suite folder: results.csv, summary.md, summary.json, vtab.json, "
                            "sweep.csv, runs/")
    group.add_argument("--steps", type=positive_int_arg, default=STEPS,
                       help=f"updates per task ({STEPS}, the paper's)")
    group.add_argument("--lr", type=number_arg(0, low_inclusive=False), default=LEARNING_RATE,
                       help=f"learning rate ({LEARNING_RATE}, the paper's)")
    group.add_argument("--batch-size", type=positive_int_arg, default=BATCH_SIZE,
                       help=f"global batch size ({BATCH_SIZE}, the paper's)")
    group.add_argument("--target-batch-size", type=positive_int_arg, default=None,
                       help="reach this batch by gradient accumulation (e.g. --batch-size 64 "
                            "--target-batch-size 512)")
    group.add_argument("--sweep", action="store_true",
                       help="choose the learning rate and steps on the 200 validation "
                            "examples first (the paper's sweep), then train on all 1,000")
    group.add_argument("--sweep-lr", type=list_arg(number_arg(0, low_inclusive=False)),
                       metavar="LR,LR", help="with --sweep: its learning rates (0.001,0.01)")
    group.add_argument("--sweep-steps", type=list_arg(positive_int_arg), metavar="N,N",
                       help="with --sweep: its run lengths (500,2500)")
    group.add_argument("--select", choices=("suite", "task"),
                       help="with --sweep: suite, one setting for every task, as the paper; "
                            "task, each task's best (default suite)")
    group.add_argument("--data-dir", help="tensorflow-datasets data directory")
    group.add_argument("--manual-dir",
                       help="hand-downloaded files (diabetic_retinopathy, resisc45)")
    group.add_argument("--seed", type=seed_arg, default=0,
                       help="seed of the data order and augmentation (0)")
    group.add_argument("--no-augment", action="store_true",
                       help="no random flips (by default: natural and specialized tasks)")
    group.add_argument("--keep-weights", action="store_true",
                       help="keep each task's fine-tuned weights under runs/")
    group.add_argument("--strategy", default="auto",
                       help="auto, tpu, mirrored, multiworker or cpu (default auto)")
    group.add_argument("--precision", default="float32", help="float32, bfloat16 or float16")
    add_xla_arguments(group)
    group.add_argument("--backend", choices=("tensorflow", "jax"), default=None,
                       help="Keras backend (default: KERAS_BACKEND, else tensorflow)")
    group.add_argument("--overwrite", action="store_true",
                       help="start over in an --output folder that holds a VTAB run")
    group.add_argument("--verbose", type=int, default=1, choices=(0, 1, 2),
                       help="0: the table only; 1: a line and a bar of its updates per task "
                            "(default); 2: a line per task and Keras' progress per epoch")
    add_json_argument(parser)


def check(args):
    """The inputs, before TensorFlow starts: an architecture is named, the model and weights
    files exist, and the flags that need no TensorFlow (the output folder, the batch sizes,
    the precision, the strategy)."""
    require_architecture(args)
    given = [flag for flag, value in (("--sweep-lr", args.sweep_lr),
                                      ("--sweep-steps", args.sweep_steps),
                                      ("--select", args.select)) if value is not None]
    if given and not args.sweep:
        raise ValueError(f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} "
                         "to a sweep: add --sweep, or leave "
                         f"{'it' if len(given) == 1 else 'them'} out.")
    for flag, values in (("--sweep-lr", args.sweep_lr), ("--sweep-steps", args.sweep_steps)):
        if values and len(set(values)) != len(values):
            raise ValueError(f"{flag} names a value twice ({','.join(map(str, values))}). "
                             "Expected each once.")
    check_model_paths(args)
    check_output_folder("--output", args.output, "the suite")
    _check_batch_sizes(args)
    check_precision(args)
    check_strategy(args)


def _check_batch_sizes(args):
    if args.target_batch_size and args.target_batch_size % args.batch_size:
        raise ValueError(f"--target-batch-size {args.target_batch_size} is not a multiple of "
                         f"--batch-size {args.batch_size}.")


def run(args):  # the dispatcher has applied --backend
    from keras_vit import training, vtab
    from keras_vit.parallel import tf_distribute

    require_architecture(args)
    check_output_folder("--output", args.output, "the suite")
    tasks = vtab.get_tasks(args.tasks)  # bad flags fail before the folder is made
    _check_batch_sizes(args)
    training.set_precision(args.precision)
    strategy = tf_distribute.get_strategy(args.strategy)
    tf_distribute.global_batch_size(args.batch_size, strategy)
    # The architecture and weights are checked once, before any task starts.
    with strategy.scope():
        model_from_args(args, num_classes=tasks[0].num_classes)

    def model_fn(num_classes):
        model, _ = model_from_args(args, num_classes=num_classes)
        return model

    description = dict(model=args.model, model_config=args.model_config,
                       weights=os.path.abspath(os.path.expanduser(args.weights))
                       if args.weights and os.path.exists(os.path.expanduser(args.weights))
                       else args.weights, precision=args.precision)
    sweep = [(lr, n) for lr in args.sweep_lr or SWEEP_LEARNING_RATES
             for n in args.sweep_steps or SWEEP_STEPS] if args.sweep else None
    summary = vtab.run(
        model_fn, args.output, tasks=[t.name for t in tasks], learning_rate=args.lr,
        steps=args.steps, batch_size=args.batch_size, target_batch_size=args.target_batch_size,
        image_size=tuple(args.image_size), sweep=sweep, select=args.select or "suite",
        data_dir=args.data_dir, manual_dir=args.manual_dir, seed=args.seed,
        augment=not args.no_augment, keep_weights=args.keep_weights, overwrite=args.overwrite,
        jit_compile=args.xla, strategy=strategy, description=description,
        verbose=args.verbose)
    _print_summary(args, summary, vtab)
    return 0


def _print_summary(args, summary, vtab):
    """The suite's table (the setting, the files, then `vtab.summary_markdown`), or with
    --json the summary `keras_vit.vtab.run` returned."""
    settings = sorted({(c["learning_rate"], c["steps"]) for c in summary["chosen"].values()}) \
        if "chosen" in summary else [(args.lr, args.steps)]
    rows = [("tasks", f"{summary['mean']['tasks']} of {summary['mean']['of']}"),
            ("setting", "; ".join(f"learning rate {lr:g}, {n:,} steps" for lr, n in settings)
             + (" (chosen by the sweep)" if "chosen" in summary else "")),
            ("files", ", ".join(os.path.join(args.output, name) for name in (
                vtab.RESULTS_FILE, vtab.SUMMARY_MD, vtab.SUMMARY_JSON)))]
    print_result(args, f"VTAB-1k in {summary['output_dir']}", rows, summary)
    if not args.json:
        print(vtab.summary_markdown(summary), end="")


COMMANDS = {"vtab": (configure, run, check)}
