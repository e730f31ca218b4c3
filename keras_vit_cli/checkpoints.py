"""`keras-vit checkpoints [PATTERN]`: the checkpoint registry, for choosing one, without TensorFlow.

    keras-vit checkpoints                      # every checkpoint keras_vit knows by name
    keras-vit checkpoints 'vit_base_patch16*'  # names, variants or tags a pattern matches
    keras-vit checkpoints B/16                 # one variant (any spelling: B/16, ViT_B16)
    keras-vit checkpoints dino                 # a tag: official, augreg, timm, dino, mae, ...
    keras-vit checkpoints digits               # one checkpoint, every field
    keras-vit predict cat.jpg --weights NAME

Each row: a `*` where the checkpoint is its variant's default (what `--weights default` and
`pretrained=True` load at 224 px with a 1000-class head), the variant, the resolution it was
trained at, its classes, its ImageNet-1k top-1 (%), its download size, the data sets it was
pre-trained (and fine-tuned) on, and last its name (what `--weights` and
`keras_vit.from_pretrained` take). A name given whole shows that entry's every field; `--json`
prints the entries themselves, each with `"default": true|false`.
"""

import difflib
import json

from keras_vit_cli.catalog import library_module, registry_entries

COLUMNS = ("", "variant", "resolution", "classes", "top-1", "download", "data", "name")
DEFAULT_MARK = "*"


def configure(parser):
    parser.add_argument("pattern", nargs="?", metavar="PATTERN",
                        help="only the checkpoints whose name, variant or a tag matches this "
                             "shell-style pattern (quote it: 'vit_base*', '*in21k*'), or a "
                             "variant in any spelling (B/16, ViT_B16); a whole name shows that "
                             "checkpoint's every field")
    parser.add_argument("--json", action="store_true",
                        help="print the registry entries as one JSON list instead of the table")


def _size(entry):
    mib = entry.get("size_mib")
    text = "-" if mib is None else f"{mib:,.0f} MiB" if mib >= 10 else f"{mib:.2g} MiB"
    return f"{text} (shipped)" if entry.get("file") else text


def _data_name(text):
    """A data set's name from the registry's description, e.g. "scikit-learn digits (...)"."""
    return text.split(" (")[0]


def _resolution(value):
    return "x".join(map(str, value)) if isinstance(value, list) else str(value or "-")


def _row(entry):
    data = _data_name(entry.get("pretraining") or "-")
    if entry.get("finetuning"):
        data += f" -> {_data_name(entry['finetuning'])}"
    top1 = entry.get("imagenet_top1")
    return (DEFAULT_MARK if entry.get("default") else "", entry.get("variant") or "-",
            _resolution(entry.get("resolution")), str(entry.get("num_classes") or "-"),
            "-" if top1 is None else f"{top1:.1f}", _size(entry), data, entry["name"])


def table(entries):
    """The entries as aligned text columns, a header first."""
    rows = [COLUMNS] + [_row(entry) for entry in entries]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS) - 1)]
    return "\n".join("  ".join([cell.ljust(width) for cell, width in zip(row, widths)]
                               + [row[-1]]) for row in rows)


def whole(entry):
    """Every field of one entry, one a line: strings as they are, the rest as JSON."""
    width = max(map(len, entry)) + 2
    return "\n".join(f"{key:<{width}}{value if isinstance(value, str) else json.dumps(value)}"
                     for key, value in entry.items())


def select(entries, pattern):
    """The entries `pattern` matches (see `keras_vit.list_checkpoints`).

    Raises:
        ValueError: naming the pattern and close names, if it matches none.
    """
    try:
        variant = library_module("configs").get_variant(pattern).name
    except ValueError:
        variant = None
    chosen = library_module("weights.entries").matching(entries, pattern, variant)
    if not chosen:
        words = {w for e in entries for w in (e["name"], e["name"].split(".")[0],
                                              *(e.get("tags") or ()))}
        close = difflib.get_close_matches(pattern, sorted(words), n=3, cutoff=0.6)
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        raise ValueError(f"No checkpoint's name, variant or tag matches {pattern!r}.{hint} "
                         "Expected a name, a variant (B/16), a tag (timm, augreg, dino, ...) "
                         "or a shell-style pattern ('vit_base*'); `keras-vit checkpoints` "
                         "lists them all.")
    return chosen


def footer(entries):
    """What the default mark means, said only where a row carries it: the checkpoint
    `pretrained=True` loads for each variant (its ImageNet-1k fine-tune nearest to 224 px, or
    its ImageNet-21k weights where it has no fine-tune, naming those variants)."""
    marked = [e for e in entries if e.get("default")]
    if not marked:
        return ""
    upstream = sorted({e["variant"] for e in marked if not e.get("finetuning")})
    text = (f" {DEFAULT_MARK} marks each variant's default (pretrained=True, --weights "
            "default): its ImageNet-1k fine-tune nearest to 224 px")
    if upstream:
        text += f", or its ImageNet-21k weights where it has none ({', '.join(upstream)})"
    return text + "."


def run(args):
    entries = library_module("weights.entries").with_defaults(registry_entries())
    named = [e for e in entries if e["name"] == args.pattern]
    if args.pattern is not None and not named:
        entries = select(entries, args.pattern)
    if args.json:
        print(json.dumps(named or entries))
    elif named:
        print(whole(named[0]))
    else:
        print(table(entries))
        print(f"{len(entries)} checkpoint(s).{footer(entries)} Load one by name: --weights "
              "NAME (any command) or keras_vit.from_pretrained(NAME).")
    return 0


COMMANDS = {"checkpoints": (configure, run)}
