"""`keras-vit evaluate` and `keras-vit fewshot`: the paper's two metrics (section 4.1), and
ReaL accuracy (`--dataset imagenet2012_real`, Table 2).

Each ends with a table naming the images it used and how many (`--json`: one JSON object
instead). `evaluate` reports top-5 accuracy for a model of more than 5 classes only (where it
means something): otherwise the table has no top-5 row and the JSON `top5` is null."""

from keras_vit_cli.arguments import (
    FOLDER_SPLITS,
    add_class_names_argument,
    add_data_arguments,
    add_model_arguments,
    list_arg,
    number_arg,
)
from keras_vit_cli.preflight import (
    check_class_names_file,
    check_data_folder,
    check_model_paths,
    check_output_folder,
    check_strategy,
)
from keras_vit_cli.common import (
    class_names_from_args,
    data_num_classes,
    data_source,
    data_split,
    describe_split,
    input_size,
    load_data,
    model_from_args,
    model_stage,
    undecodable_files_named,
)
from keras_vit_cli.progress import Progress, add_progress_arguments, bars_on_stderr
from keras_vit_cli.summaries import add_json_argument, images, number, print_result


def _add_common(parser, test_split_help):
    add_model_arguments(parser)
    add_data_arguments(parser)
    parser.add_argument("--split", default="test", help=test_split_help)
    parser.add_argument("--verbose", type=int, default=1, choices=(0, 1),
                        help="progress bars on a terminal: 0 or 1 (default 1)")
    add_progress_arguments(parser)
    add_json_argument(parser)


def configure_evaluate(parser):
    _add_common(parser, "tfds split (test); for --folder: every image by default, or train "
                        "or validation (the held-out 10%%)")
    add_class_names_argument(parser)
    parser.add_argument("--out", default=None,
                        help="write per_class_accuracy.csv and confusion_matrix.png here")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace those reports if --out already holds them")
    parser.add_argument("--allow-fresh-head", action="store_true",
                        help="evaluate a model whose head is untrained (all zeros, e.g. no "
                             "--weights), which scores chance; refused otherwise")


def check_evaluate(args):
    """The inputs, before TensorFlow starts: the image folder and its split, the model and
    weights files, the class-names file, the --out folder and the strategy."""
    check_data_folder(args)
    data_split(args, args.split)
    check_model_paths(args)
    check_class_names_file(args)
    if args.out is not None:
        check_output_folder("--out", args.out, "the reports")
    check_strategy(args)


def check_fewshot(args):
    """The inputs, before TensorFlow starts: the image folder and its two splits, the shots,
    the model and weights files, the --cache folder and the strategy."""
    check_data_folder(args)
    _int_list("--shots", args.shots)
    _test_split(args)
    check_model_paths(args)
    if args.cache is not None:
        check_output_folder("--cache", args.cache, "the features")
    check_strategy(args)


def run_evaluate(args):
    from keras_vit import evaluation
    from keras_vit.parallel import tf_distribute

    if args.out:
        check_output_folder("--out", args.out, "the reports")
        evaluation.check_report_files(args.out, args.overwrite)  # before the model is built
    num_classes = data_num_classes(args)
    strategy = tf_distribute.get_strategy(args.strategy)
    tf_distribute.global_batch_size(args.batch_size, strategy)
    progress = Progress.of(args)
    progress.stage(model_stage(args))
    with strategy.scope():
        model, names = model_from_args(args, num_classes=num_classes, need_head=True)
    data = load_data(args, args.split, False, strategy, input_size(model, args), model)
    if args.folder and not args.class_names:  # subfolders against the checkpoint's names
        evaluation.check_class_names(names, data.class_names)
    names = class_names_from_args(args, num_classes, data.class_names or names)
    split = data_split(args, args.split)
    progress.stage(f"evaluating on {describe_split(args, split)}"
                   + (f", then writing the reports into {args.out}" if args.out else ""))
    with undecodable_files_named(args), bars_on_stderr():
        report = evaluation.evaluate(model, data, class_names=names, out_dir=args.out,
                                     progress=args.verbose > 0 and progress.bars,
                                     allow_fresh_head=args.allow_fresh_head,
                                     overwrite=args.overwrite)
    summary = {"data": data_source(args), "split": split, "examples": report["num_examples"],
               "classes": num_classes, "loss": report["loss"], "accuracy": report["top1"],
               "top5": report["top5"], "files": report["files"]}
    rows = [("top-1 accuracy", number(report["top1"], percent=True))]
    if report["top5"] is not None:  # None for 5 classes or fewer, where it is always 100%
        rows.append(("top-5 accuracy", number(report["top5"], percent=True)))
    rows.append(("loss", number(report["loss"])))
    if "real" in report:  # label sets (ImageNet-ReaL): scored on the images with a set
        real = report["real"]
        summary["real"] = {"accuracy": real["accuracy"],
                           "original_accuracy": real["original_accuracy"],
                           "examples": real["num_examples"], "left_out": real["num_left_out"]}
        rows.append(("ReaL accuracy", f"{number(real['accuracy'], percent=True)} on "
                                      f"{images(real['num_examples'])} ({real['num_left_out']:,} "
                                      "without a label set left out); original labels "
                                      f"{number(real['original_accuracy'], percent=True)}"))
    rows.append(("files", ", ".join(report["files"])))
    print_result(args, f"Evaluated on {describe_split(args, split)}: "
                       f"{images(report['num_examples'])}, {num_classes} classes", rows, summary)
    return 0


def _int_list(flag, text):
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise ValueError(f"{flag} must be positive integers separated by commas. Received: {text}")
    return values


def configure_fewshot(parser):
    _add_common(parser, "tfds split the accuracy is measured on (test); for --folder: "
                        "validation (the held-out 10%%, the default there) or train")
    parser.add_argument("--train-split", default="train",
                        help="split the k images per class are drawn from (train)")
    parser.add_argument("--shots", default="1,5,10,25", help="images per class (1,5,10,25)")
    parser.add_argument("--l2", type=list_arg(number_arg(0, low_inclusive=False)), default=None,
                        help="L2 regularisation values, comma-separated, each > 0")
    parser.add_argument("--cache", default=None,
                        help="cache the features in this folder (keyed by model, weights and "
                             "data)")


def run_fewshot(args):
    from keras_vit import evaluation
    from keras_vit.parallel import tf_distribute

    shots = _int_list("--shots", args.shots)
    l2_regs = args.l2 or evaluation.DEFAULT_L2_REGS
    data_num_classes(args)
    split = _test_split(args)
    strategy = tf_distribute.get_strategy(args.strategy)
    progress = Progress.of(args)
    progress.stage(model_stage(args))
    with strategy.scope():
        model, _ = model_from_args(args, include_top=False)
    size = input_size(model, args)
    features = {}
    for role, role_split in (("train", args.train_split), ("test", split)):
        data = load_data(args, role_split, False, strategy, size, model)
        what = describe_split(args, data_split(args, role_split))
        progress.stage(f"extracting the features of {what}"
                       + (f" (cached in {args.cache})" if args.cache else ""))
        with undecodable_files_named(args), bars_on_stderr():
            features[role] = evaluation.extract_features(
                model, data, cache=args.cache, cache_key=dict(
                    role=role, split=role_split, dataset=args.dataset, folder=args.folder,
                    weights=args.weights), progress=args.verbose > 0 and progress.bars,
                strategy=strategy)
    progress.stage(f"fitting the few-shot classifiers (k = {', '.join(map(str, shots))})")
    table = evaluation.fewshot_table(*features["train"], *features["test"], shots=shots,
                                     l2_regs=l2_regs, seed=args.seed)
    _print_fewshot(args, table, data_split(args, args.train_split), data_split(args, split),
                   evaluation.format_fewshot_table(table))
    return 0


def _test_split(args):
    """The split few-shot accuracy is measured on, refused where it overlaps the shots'."""
    split = args.split
    if args.folder and split == "test":  # a folder's test images: its held-out 10%
        split = "validation"
    if args.folder and split not in FOLDER_SPLITS:
        raise ValueError(f"--split {split!r} is not a split of the image folder {args.folder}. "
                         "Expected validation (its held-out 10%; also test) or train.")
    if split == args.train_split or (args.folder and "all" in (split, args.train_split)):
        raise ValueError(f"--split {split} overlaps --train-split {args.train_split}: the "
                         "few-shot examples would be tested on themselves. Expected two "
                         "disjoint splits (for a folder: train and validation).")
    return split


def _print_fewshot(args, table, train_split, test_split, markdown):
    """The sizes used and the few-shot table (`markdown`), or with --json the machine form."""
    shots = list(table["accuracy"])
    summary = {
        "data": data_source(args), "train_split": train_split,
        "train_examples": table["train_examples"], "test_split": test_split,
        "test_examples": table["test_examples"], "classes": table["num_classes"],
        "accuracy": [dict(shots=k, l2=reg, accuracy=accuracy)
                     for k, row in table["accuracy"].items() for reg, accuracy in row.items()],
        "best": [dict(shots=k, l2=reg, accuracy=accuracy)
                 for k, (reg, accuracy) in table["best"].items()]}
    rows = [("shots from", f"{describe_split(args, train_split)}: "
                           f"{images(table['train_examples'])} (k = {', '.join(map(str, shots))} "
                           f"per class, seed {args.seed})"),
            ("tested on", f"{describe_split(args, test_split)}: "
                          f"{images(table['test_examples'])}")]
    print_result(args, f"Few-shot linear accuracy of frozen features, {table['num_classes']} "
                       "classes", rows, summary)
    if not args.json:
        print(markdown)


COMMANDS = {"evaluate": (configure_evaluate, run_evaluate, check_evaluate),
            "fewshot": (configure_fewshot, run_fewshot, check_fewshot)}
