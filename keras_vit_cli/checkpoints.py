"""`keras-vit checkpoints [VARIANT]`: the checkpoint registry's names, without TensorFlow.

    keras-vit checkpoints            # every name keras_vit knows
    keras-vit checkpoints B/16       # those of one variant (any spelling: B/16, ViT_B16)
    keras-vit predict cat.jpg --weights NAME

Each row: the variant, the resolution it was trained at, its classes, its download size, the
data sets it was pre-trained (and fine-tuned) on, and last its name (what `--weights` and
`keras_vit.from_pretrained` take). `--json` prints the registry entries themselves.
"""

import json

from keras_vit_cli.catalog import library_module, registry_entries

COLUMNS = ("variant", "resolution", "classes", "download", "data", "name")


def configure(parser):
    parser.add_argument("variant", nargs="?", metavar="VARIANT",
                        help="only the checkpoints of this variant, e.g. B/16 or ViT_B16")
    parser.add_argument("--json", action="store_true",
                        help="print the registry entries as one JSON list instead of the table")


def _size(entry):
    mib = entry.get("size_mib")
    text = "-" if mib is None else f"{mib:,.0f} MiB" if mib >= 10 else f"{mib:.2g} MiB"
    return f"{text} (shipped)" if entry.get("file") else text


def _data_name(text):
    """A data set's name from the registry's description, e.g. "scikit-learn digits (...)"."""
    return text.split(" (")[0]


def _row(entry):
    data = _data_name(entry.get("pretraining") or "-")
    if entry.get("finetuning"):
        data += f" -> {_data_name(entry['finetuning'])}"
    return (entry.get("variant") or "custom", str(entry.get("resolution") or "-"),
            str(entry.get("num_classes") or "-"), _size(entry), data, entry["name"])


def table(entries):
    """The entries as aligned text columns, a header first."""
    rows = [COLUMNS] + [_row(entry) for entry in entries]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS) - 1)]
    return "\n".join("  ".join([cell.ljust(width) for cell, width in zip(row, widths)]
                               + [row[-1]]) for row in rows)


def run(args):
    entries = registry_entries()
    if args.variant:
        wanted = library_module("configs").get_variant(args.variant).name
        entries = [entry for entry in entries if entry.get("variant") == wanted]
    if args.json:
        print(json.dumps(entries))
        return 0
    print(table(entries))
    print(f"{len(entries)} checkpoint(s). Load one by name: --weights NAME (any command) or "
          "keras_vit.from_pretrained(NAME).")
    return 0


COMMANDS = {"checkpoints": (configure, run)}
