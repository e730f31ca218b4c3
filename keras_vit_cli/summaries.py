"""What the long commands (`train`, `pretrain`, `evaluate`, `fewshot`, `vtab`) print when they
finish: a short table a person reads, or with `--json` the machine form, one JSON object on the
last line of the output.

Epochs are numbered as Keras' progress numbers them ("Epoch 1/4" is the first), data is named
for what was read (a tfds split, or the part of an image folder), and sizes are the images
actually used.
"""

import json
import math

from keras_vit_cli.common import describe_split


def add_json_argument(parser):
    parser.add_argument("--json", action="store_true",
                        help="print the result as one JSON object (the last line of the "
                             "output) instead of the table")


def strict_json(value):
    """`value` with every NaN or infinity as None: strict JSON has neither."""
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def print_result(args, title, rows, machine):
    """With `--json`, `machine` as one JSON line; else `title` and the `(label, text)` rows
    (those with text) as an aligned table."""
    if args.json:
        print(json.dumps(strict_json(machine)))
        return
    rows = [(label, text) for label, text in rows if text]
    width = max(len(label) for label, _ in rows)
    print(title)
    for label, text in rows:
        print(f"  {label.ljust(width)}  {text}")


def number(value, percent=False):
    """A number as a person reads it: in percent, or to 4 significant digits; "-" for none."""
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value:.2%}" if percent else f"{value:.4g}"


def metric(name, value):
    """A named metric: accuracies in percent, the rest to 4 significant digits."""
    return f"{name} {number(value, percent='acc' in name)}"


def images(count):
    """`count` images, in words."""
    return f"{count:,} image" + ("" if count == 1 else "s")


def print_training(args, summary):
    """The summary of `keras_vit.training.fit`, with the command's `data` and `splits` (the
    train and validation splits' names)."""
    epochs, resumed = summary["epochs"], summary["resumed_at_epoch"]
    splits, examples = summary["splits"], summary["examples"]
    metrics = ", ".join(metric(k[len("validation_"):], v) for k, v in summary.items()
                        if k.startswith("validation_"))
    best = None
    if "best_epoch" in summary:
        best = (f"epoch {summary['best_epoch']} of {epochs}, "
                f"{metric(summary['monitor'], summary['best_value'])}: {summary['best_weights']}")
    rows = [
        ("trained on", f"{describe_split(args, splits['train'])}, {images(examples['train'])}"),
        ("epochs", f"{epochs} ({summary['updates']:,} updates)"
                   + (f", resumed after epoch {resumed}" if resumed else "")),
        ("validation", splits["validation"] and (
            f"{describe_split(args, splits['validation'])}, {images(examples['validation'])}"
            + (f": {metrics}" if metrics else ""))),
        ("best", best),
        ("final weights", summary["final_weights"]),
        ("encoder", summary.get("encoder_weights")),
        ("time", f"{summary['seconds']:,.1f} s"),
    ]
    print_result(args, f"Finished training in {summary['output_dir']}", rows, summary)
