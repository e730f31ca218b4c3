"""Speed and memory of keras_vit against timm and keras-hub, each contender in its own process.

    bash benchmarks/setup_peers.sh                              # once: .venv-bench with the peers
    .venv-bench/bin/python -m benchmarks.run --json cpu.json   # Ti, B, L /16; batch 8; 5 rounds
    .venv-bench/bin/python -m benchmarks.run --points B/16@224x8,B/16@384x4,L/16@224x4 \\
        --contenders timm,timm-bf16,keras_vit,keras_vit-bf16     # the operating points

benchmarks/README.md says what each mode and contender measures.
"""

import argparse
import dataclasses
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
import types

from benchmarks.contenders import common
from keras_vit_cli.catalog import library_module

# Loaded without Keras: the driver stays light beside the measured processes.
flops = library_module("flops")
atomic_write_text = library_module("fileio").atomic_write_text
FAMILIES = {  # name -> (worker module, label in the table)
    "timm": ("benchmarks.contenders.timm_vit", "timm"),
    "keras_hub": ("benchmarks.contenders.keras_hub_vit", "keras-hub ViT"),
    "keras_vit": ("benchmarks.contenders.keras_vit_model", "keras_vit"),
    "onnxruntime": ("benchmarks.contenders.onnxruntime_vit", "keras_vit ONNX in ONNX Runtime"),
}
TRAINING_MODES = ("infer", "train")
# The contender tags that switch a flag on: tag (a `Contender` field) -> the families taking it.
FLAG_TAGS = {"jax": ("keras_hub", "keras_vit"), "compile": ("timm",), "savedmodel": ("keras_vit",)}
DEFAULTS = {  # device -> contenders, batch sizes, precision
    "cpu": dict(contenders="timm,keras_hub,keras_hub-xla,keras_vit,keras_vit-xla,keras_vit-bf16,"
                "keras_vit-xla-bf16,keras_vit-int8,keras_vit-xla-int8", batch="8",
                precision="fp32"),
    "gpu": dict(contenders="timm,keras_hub,keras_hub-xla,keras_vit,keras_vit-xla", batch="64,256",
                precision="bf16"),
}
# The options that take one integer: name -> (default, minimum, help).
INTEGER_OPTIONS = {
    "rounds": ("5", 1, "interleaved rounds per model and batch"),
    "infer-steps": ("5", 1, "timed forward passes per round"),
    "train-steps": ("3", 1, "timed training steps per round"),
    "warmup": ("1", 0, "untimed steps after the first, per round"),
    "image-size": ("224", 1, "input resolution in pixels"),
    "agreement-images": ("128", 0, "random images for the int8 top-1 agreement; 0 skips it"),
    "timeout": ("3600", 1, "seconds allowed to one process"),
    "seed": ("0", 0, "seed of the weights and the random batches"),
}
AGREEMENT_KEYS = ("top1_agreement", "distinct_top1", "images", "centred", "relative_logit_error",
                  "source")


@dataclasses.dataclass(frozen=True)
class Contender:
    """One framework in one configuration, e.g. "keras_vit-xla-bf16"."""

    family: str
    xla: object  # True, False, or None: the library's default runtime
    precision: str
    jax: bool = False
    compile: bool = False
    tree: str = None
    savedmodel: bool = False

    @property
    def name(self):
        tags = ["jax"] if self.jax else []
        tags += {True: ["xla"], False: ["noxla"], None: []}[self.xla]
        tags += [tag for tag in ("compile", "savedmodel") if getattr(self, tag)]
        name = "-".join([self.family, *tags, self.precision])
        return f"{name}@{self.tree}" if self.tree else name

    @property
    def modes(self):
        inference_only = self.precision == "int8" or self.savedmodel
        return ("infer",) if inference_only or self.family == "onnxruntime" else TRAINING_MODES

    def label(self, versions=None):
        """The table's name for it, with the framework versions its process reported."""
        v = versions or {}
        if self.family == "timm":
            name = f"timm {v['timm']} (torch {v['torch']})" if "timm" in v else "timm"
            return f"{name}{', torch.compile' if self.compile else ''}, {self.precision}"
        name = f"keras-hub {v['keras_hub']} ViT" if "keras_hub" in v else FAMILIES[self.family][1]
        if self.family == "keras_vit" and "keras_vit" in v:
            name += f" {v['keras_vit']}"
        name += " SavedModel" if self.savedmodel else ""
        runtime = {True: "XLA", False: "no XLA", None: "default runtime"}[self.xla]
        runtime = "JAX (XLA)" if self.jax else runtime
        return f"{name}, {runtime}, {self.precision}" + (f" [{self.tree}]" if self.tree else "")


def _require(condition, message):
    if not condition:
        raise ValueError(message)


def parse_contender(text, default_precision):
    """Parses "keras_vit-xla-bf16", "timm", "keras-hub-xla"... into a `Contender`.

    Raises:
        ValueError: naming the received text and what is expected.
    """
    spec, _, tree = text.strip().partition("@")
    spec = spec.lower().replace("keras-hub", "keras_hub").replace("keras-vit", "keras_vit")
    family, *tags = spec.split("-")
    expected = (f"Expected FAMILY[-jax][-xla|-noxla][-compile][-savedmodel][-PRECISION][@DIR] "
                f"with FAMILY in {sorted(FAMILIES)} and PRECISION in {list(common.PRECISIONS)} "
                "(benchmarks/README.md), e.g. keras_vit-xla-bf16.")
    _require(family in FAMILIES, f"Unknown contender {text!r}. {expected}")
    _require(not tree or os.path.isdir(os.path.join(tree, "benchmarks", "contenders")),
             f"Contender {text!r}: {tree!r} is not a checkout of this repository (no "
             "benchmarks/contenders in it).")
    fields = dict(xla=None, precision=None)
    for tag in tags:
        if tag in ("xla", "noxla") and fields["xla"] is None:
            fields["xla"] = tag == "xla"
        elif family in FLAG_TAGS.get(tag, ()) and tag not in fields:
            fields[tag] = True
        elif tag in common.PRECISIONS and fields["precision"] is None:
            fields["precision"] = tag
        else:
            raise ValueError(f"Unknown or repeated tag {tag!r} in contender {text!r}. {expected}")
    fields["precision"] = fields["precision"] or default_precision
    _require(family != "timm" or fields["xla"] is None, f"Contender {text!r}: timm runs on "
             "PyTorch and has no XLA variant. Expected 'timm' with an optional precision.")
    _require(fields["precision"] != "int8" or family == "keras_vit", f"Contender {text!r}: int8 "
             "is measured for keras_vit only (Keras quantize). Expected keras_vit-int8 or "
             "keras_vit-xla-int8.")
    return Contender(family, tree=tree or None, **fields)


def build_parser():
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.run", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    parser.add_argument("--models", default="Ti/16,B/16,L/16", help="comma-separated variants")
    parser.add_argument("--contenders", help="comma-separated names (benchmarks/README.md). "
                        f"Default: {DEFAULTS['cpu']['contenders']} (gpu: "
                        f"{DEFAULTS['gpu']['contenders']})")
    parser.add_argument("--device", choices=common.DEVICES, default="cpu")
    parser.add_argument("--batch", help="comma-separated batch sizes (default: 8; gpu: 64,256)")
    parser.add_argument("--precision", choices=("fp32", "bf16"), help="of the contenders named "
                        "without one (default: fp32; gpu: bf16)")
    parser.add_argument("--modes", default="infer,train", help="infer, train or both")
    parser.add_argument("--points", help="comma-separated MODEL@SIZExBATCH, e.g. B/16@384x4 "
                        "(instead of --models, --batch and --image-size)")
    for name, (default, _, help) in INTEGER_OPTIONS.items():
        parser.add_argument("--" + name, default=default, help=help)
    parser.add_argument("--int8-checkpoint", help="also the int8 agreement of this trained "
                        "model (.npz, official layout)")
    parser.add_argument("--peak-flops", type=float, help="peak FLOP/s for the model FLOP "
                        f"utilisation (gpu default: {flops.H100_SXM_DENSE_BF16_FLOPS:.0f}, H100 "
                        "SXM dense bf16)")
    parser.add_argument("--json", help="write every result here as JSON")
    parser.add_argument("--python", default=sys.executable,
                        help="interpreter for the contender processes (default: this one)")
    parser.add_argument("--check", action="store_true", help="only import each contender's "
                        "framework in its process, print versions, and exit")
    return parser


def _point(text):
    """(model, image size, batch) of an operating point written MODEL@SIZExBATCH."""
    model, _, rest = text.strip().partition("@")
    size, _, batch = rest.partition("x")
    _require(model and size.isdigit() and batch.isdigit() and int(size) and int(batch),
             f"--points: {text.strip()!r} is not MODEL@SIZExBATCH with positive integers, "
             "e.g. B/16@384x4.")
    return model, int(size), int(batch)


def _integers(name, text, minimum=1, several=False):
    """The integer (`several`: the comma-separated integers) >= `minimum` in option `--name`."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    what = "a comma-separated list of integers" if several else "an integer"
    _require(values and min(values) >= minimum and (several or len(values) == 1),
             f"--{name} must be {what} >= {minimum}. Received: {text!r}")
    return values if several else values[0]


def make_plan(args):
    """Checks every option and returns the run's plan: a namespace of the checked options.

    Raises:
        ValueError: naming the option, what was received and what is expected.
    """
    defaults = DEFAULTS[args.device]
    names = (args.contenders or defaults["contenders"]).split(",")
    contenders = [parse_contender(name, args.precision or defaults["precision"])
                  for name in names if name.strip()]
    _require(contenders, f"--contenders names no contender. Received: {args.contenders!r}")
    twice = sorted({c.name for c in contenders if contenders.count(c) > 1})
    _require(not twice, f"--contenders names {twice} twice.")
    number = {name.replace("-", "_"): _integers(name, getattr(args, name.replace("-", "_")),
                                                minimum)
              for name, (_, minimum, _) in INTEGER_OPTIONS.items()}
    batches = _integers("batch", args.batch or defaults["batch"], several=True)
    if args.points:
        wanted = [_point(text) for text in args.points.split(",") if text.strip()]
    else:
        wanted = [(model.strip(), number["image_size"], batch)
                  for model in args.models.split(",") if model.strip() for batch in batches]
    configs, points = {}, []
    for model, size, batch in wanted:
        config = common.variant_config(model)
        where = f"--points {model}@{size}x{batch}" if args.points else f"--image-size {size}"
        _require(size % config["patch_size"] == 0, f"{where} is not divisible by "
                 f"{config['name']}'s patch size {config['patch_size']}.")
        configs[config["name"]] = config
        if (config["name"], size, batch) not in points:
            points.append((config["name"], size, batch))
    _require(points, f"--models or --points names no model. Received: "
             f"{args.points or args.models!r}")
    modes = {m.strip() for m in args.modes.split(",") if m.strip()}
    _require(modes and modes <= set(TRAINING_MODES),
             f"--modes must be infer, train or infer,train. Received: {args.modes!r}")
    peak = args.peak_flops
    if peak is None and args.device == "gpu":
        peak = flops.H100_SXM_DENSE_BF16_FLOPS
    _require(peak is None or peak > 0, f"--peak-flops must be positive. Received: {peak}")
    if args.int8_checkpoint:
        _require(os.path.isfile(args.int8_checkpoint),
                 f"--int8-checkpoint {args.int8_checkpoint!r} is not a file.")
        _require(any(c.precision == "int8" for c in contenders), "--int8-checkpoint needs an "
                 "int8 contender (keras_vit-int8) in --contenders. Received: "
                 f"{','.join(c.name for c in contenders)}")
        _require(number["agreement_images"], "--int8-checkpoint compares on --agreement-images "
                 "images; expected at least 1. Received: 0")
    return types.SimpleNamespace(
        models=list(configs),
        configs=configs,
        points=points,  # (model, image size, batch), in the order measured
        contenders=contenders,
        device=args.device,
        batches=sorted({batch for _, _, batch in points}),
        steps=dict(infer=number.pop("infer_steps"), train=number.pop("train_steps")),
        modes=tuple(m for m in TRAINING_MODES if m in modes),
        int8_checkpoint=args.int8_checkpoint,
        peak_flops=peak,
        python=args.python,
        **number,  # rounds, warmup, image_size, agreement_images, timeout, seed
    )


def run_process(plan, contender, mode, model="B/16", batch=1, image_size=None, extra=(),
                where=None, round_index=0):
    """Runs one contender process and returns its result dict (with `error` if it failed),
    marked with its round and mode; with `where` (its place in the run) it is told on stderr."""
    command = [
        plan.python, "-m", FAMILIES[contender.family][0], "--mode", mode, "--model", model,
        "--image-size", str(image_size or plan.image_size), "--batch", str(batch),
        "--device", plan.device, "--precision", contender.precision,
        "--steps", str(plan.steps.get(mode, 1)), "--warmup", str(plan.warmup),
        "--seed", str(plan.seed),
        *({True: ["--xla"], False: ["--no-xla"], None: []}[contender.xla]),
        *(["--backend", "jax"] if contender.jax else []),
        *(["--compile"] if contender.compile else []),
        *(["--savedmodel"] if contender.savedmodel else []),
        *(["--agreement-images", str(plan.agreement_images)] if mode == "agreement" else []),
        *extra,
    ]  # fmt: skip
    start = time.time()
    command += ["--spawned-at", repr(start)]
    try:
        done = common.run_fresh(command, plan.timeout, cwd=contender.tree or common.REPO_ROOT)
        result = common.read_result(done.stdout)
        if done.returncode or result is None:
            log = (done.stderr + done.stdout).strip().splitlines()
            result = dict(error=f"exit code {done.returncode}: " + "\n".join(log[-12:]))
    except subprocess.TimeoutExpired:
        result = dict(error=f"timed out after {plan.timeout} s")
    except OSError as e:
        result = dict(error=f"could not start {plan.python!r}: {e}")
    result.update(wall_s=time.time() - start, round=round_index + 1, mode=mode)
    if where:
        told = [f"{result['images_per_s']:.2f} img/s"] if "images_per_s" in result else []
        if "first_step_s" in result and mode == "train":
            told.append(f"first step {result['first_step_s']:.1f} s")
        if "peak_rss_bytes" in result and mode != "agreement":
            told.append(f"peak RSS {result['peak_rss_bytes'] / 1e9:.2f} GB")
        if "top1_agreement" in result:
            told.append(f"top-1 agreement {result['top1_agreement']:.1%}")
        if "error" in result:
            told = ["FAILED: " + result["error"].splitlines()[-1][:200]]
        print(f"{where} {contender.name} {mode}: {', '.join(told)} ({result['wall_s']:.0f} s)",
              file=sys.stderr, flush=True)
    return result


def run_all(plan):
    """Every measurement of `plan`, rounds interleaved. Returns the list of entries."""
    entries = []
    for model, size, batch in plan.points:
        group = {c: dict(model=model, image_size=size, batch=batch, contender=c, rounds=[])
                 for c in plan.contenders}
        failed = set()  # (contender, mode) that failed once: not retried in later rounds
        for round_index, contender in common.alternating(plan.contenders, plan.rounds):
            where = f"[{model} {size} px batch {batch} round {round_index + 1}/{plan.rounds}]"
            modes = [m for m in contender.modes if m in plan.modes]
            if round_index == 0 and contender.precision == "int8" and plan.agreement_images:
                modes.append("agreement")
            for mode in [m for m in modes if (contender, m) not in failed]:
                result = run_process(plan, contender, mode, model, batch, size, where=where,
                                     round_index=round_index)
                group[contender]["rounds"].append(result)
                if "error" in result:
                    failed.add((contender, mode))
        entries.extend(group.values())
    if plan.int8_checkpoint:  # the int8 agreement on a trained model, once
        checkpoint, batch = plan.int8_checkpoint, plan.batches[0]
        for contender in [c for c in plan.contenders if c.precision == "int8"]:
            result = run_process(plan, contender, "agreement", batch=batch, where=f"[{checkpoint}]",
                                 extra=("--checkpoint", os.path.abspath(checkpoint)))
            entries.append(dict(model=checkpoint, image_size=plan.image_size, batch=batch,
                                contender=contender, rounds=[result]))
    return entries


def summarize(entry, plan):
    """Medians over the rounds of one entry (peak memory: the maximum), and MFU where asked."""
    ok = {}
    for result in entry["rounds"]:
        if "error" not in result:
            ok.setdefault(result["mode"], []).append(result)
    errors = [r["error"] for r in entry["rounds"] if "error" in r]
    summary = dict(error=errors[0]) if errors else {}

    def put(name, mode, key, over=statistics.median):
        values = [r.get(key) for r in ok.get(mode, [])]
        if values and None not in values:
            summary[name] = over(values)

    for mode in TRAINING_MODES:
        put(f"{mode}_images_per_s", mode, "images_per_s")
        put(f"peak_rss_{mode}_bytes", mode, "peak_rss_bytes", max)
    put("first_step_s", "train", "first_step_s")
    put("import_s", "train", "import_s")
    if all(r.get("device_peak_bytes") for r in ok.get("train", [])):
        put("device_peak_train_bytes", "train", "device_peak_bytes", max)
    if "agreement" in ok:
        summary["agreement"] = {k: ok["agreement"][0][k] for k in AGREEMENT_KEYS}
    config = plan.configs.get(entry["model"])
    for mode, training in (("infer", False), ("train", True)):
        rate = summary.get(f"{mode}_images_per_s")
        if config is None or rate is None:
            continue
        macs = flops.config_forward_macs(config, entry["image_size"])
        summary[f"{mode}_tflops"] = rate * flops.step_flops(macs, training) / 1e12
        if plan.peak_flops:
            summary[f"{mode}_mfu"] = flops.model_flop_utilisation(rate, macs, training,
                                                                  plan.peak_flops)
    versions = next((r["versions"] for r in entry["rounds"] if "versions" in r), {})
    return summary, versions


def _by_point(entries):
    """{(model, image size, batch): {contender: entry}}, in the entries' order."""
    points = {}
    for entry in entries:
        point = (entry["model"], entry["image_size"], entry["batch"])
        points.setdefault(point, {})[entry["contender"]] = entry
    return points


def _baseline(contender, by_contender):
    """The summary `contender` is compared with at its point: timm's at the same precision
    where it ran, else timm fp32's (int8 and CPU bf16 compare with what a timm user runs)."""
    timms = {c.precision: e for c, e in by_contender.items() if c.family == "timm"}
    base = timms.get(contender.precision) or timms.get("fp32")
    return base["summary"] if base and base is not by_contender.get(contender) else {}


def _gigabytes(value):
    return f"{value / 1e9:.2f} GB"


# The table's columns after the contender: (header, summary key, format, ratio to timm or not).
COLUMNS = [
    ("inference img/s (median)", "infer_images_per_s", "{:.2f}".format, True),
    ("one AdamW training step img/s", "train_images_per_s", "{:.2f}".format, True),
    ("time to first training step", "first_step_s", "{:.1f} s".format, True),
    ("peak RSS training", "peak_rss_train_bytes", _gigabytes, True),
    ("peak RSS inference", "peak_rss_infer_bytes", _gigabytes, True),
]
GPU_COLUMNS = [
    ("peak GPU memory training", "device_peak_train_bytes", _gigabytes, True),
    ("inference MFU", "infer_mfu", "{:.1%}".format, False),
    ("training MFU", "train_mfu", "{:.1%}".format, False),
]


def markdown_table(entries, plan):
    """One Markdown table per model and batch size, with ratios to timm."""
    columns = COLUMNS + (GPU_COLUMNS if plan.device == "gpu" else [])
    out = []
    for (model, size, batch), by_contender in _by_point(entries).items():
        if model in plan.configs:
            out.append(f"### {model}, {size} px, batch {batch}, {plan.device}\n")
        else:
            out.append(f"### {model} (--int8-checkpoint)\n")
        if any(c.family == "timm" for c in by_contender):
            out.append("In parentheses: the ratio to timm at the same precision, or to timm fp32 "
                       "where timm did not run at that precision.\n")
        out.append(common.table_head(["contender", *(c[0] for c in columns), "notes"]))
        for contender, entry in by_contender.items():
            summary, base = entry["summary"], _baseline(contender, by_contender)
            cells = [contender.label(entry["versions"])]
            for _, key, fmt, ratio in columns:
                value, reference = summary.get(key), base.get(key) if ratio else None
                cells.append("–" if value is None else fmt(value) + (
                    f" ({value / reference:.2f}x)" if reference else ""))
            out.append(common.table_row(cells + [_notes(summary)]))
        out.append("")
    return "\n".join(out)


# The operating-point table's measures: (header, summary key); each a ratio to timm.
POINT_MEASURES = [
    ("inference", "infer_images_per_s"),
    ("training", "train_images_per_s"),
    ("training peak memory", "peak_rss_train_bytes"),
    ("first training step", "first_step_s"),
    ("inference peak memory", "peak_rss_infer_bytes"),
]


def points_table(entries):
    """One row per operating point, one column per measure: each keras_vit contender's ratio to
    timm at its precision, and for memory both GB."""
    keras_vits = list(dict.fromkeys(e["contender"] for e in entries
                                    if e["contender"].family == "keras_vit"))
    names = " / ".join(c.name for c in keras_vits)
    out = ["### keras_vit / timm at each operating point\n",
           "Speed: keras_vit's images per second over timm's (above 1: faster); memory and "
           "first step: keras_vit's over timm's (below 1: less), keras_vit's and timm's GB in "
           "parentheses.\n",
           common.table_head(["point"] + [f"{name}: {names}" for name, _ in POINT_MEASURES])]
    for (model, size, batch), by_contender in _by_point(entries).items():
        cells = [f"{model}, {size} px, batch {batch}"]
        for _, key in POINT_MEASURES:
            parts = []
            for contender in keras_vits:
                mine = by_contender.get(contender, {}).get("summary", {}).get(key)
                theirs = _baseline(contender, by_contender).get(key)
                if mine is None or not theirs:
                    parts.append("–")
                elif key.startswith("peak_rss"):
                    parts.append(f"{mine / theirs:.2f}x ({mine / 1e9:.2f} vs {theirs / 1e9:.2f})")
                else:
                    parts.append(f"{mine / theirs:.2f}x")
            cells.append(" / ".join(parts))
        out.append(common.table_row(cells))
    return "\n".join(out) + "\n"


def _notes(summary):
    notes = []
    agreement = summary.get("agreement")
    if agreement:
        centred = agreement["centred"]
        notes.append(
            f"top-1 agreement with fp32 on {agreement['images']} random images: "
            f"{agreement['top1_agreement']:.1%} (distinct top-1 classes: "
            f"{agreement['distinct_top1']}), centred logits {centred['top1_agreement']:.1%} "
            f"(distinct: {centred['distinct_top1']}); logit error "
            f"{agreement['relative_logit_error']:.2f} of the image-dependent spread"
        )
    if "error" in summary:
        notes.append("FAILED: " + summary["error"].splitlines()[-1].replace("|", "/")[:160])
    return "; ".join(notes)


def check(plan):
    """Imports each family's framework in its own process; returns the exit code."""
    first_of_family = {}
    for contender in plan.contenders:
        first_of_family.setdefault(contender.family, contender)
    results = {family: run_process(plan, c, "check") for family, c in first_of_family.items()}
    for family, result in results.items():
        if "error" in result:
            print(f"{family}: FAILED\n{result['error']}")
        else:
            print(f"{family}: ok, {result['versions']} (imports {result['import_s']:.1f} s)")
    return int(any("error" in result for result in results.values()))


def _macs(plan, model, sizes):
    """{"forward_macs": ...} of `model` where it runs at one image size of `sizes`, else {}."""
    if model not in plan.configs or len(set(sizes)) != 1:
        return {}
    return {"forward_macs": flops.config_forward_macs(plan.configs[model], sizes[0])}


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        plan = make_plan(args)
    except ValueError as e:
        print(f"benchmarks.run: error: {e}", file=sys.stderr)
        return 2
    if args.check:
        return check(plan)
    started = datetime.datetime.now(datetime.UTC)
    entries = run_all(plan)
    for entry in entries:
        entry["summary"], entry["versions"] = summarize(entry, plan)
    table = markdown_table(entries, plan)
    if len(plan.points) > 1:
        table += "\n" + points_table(entries)
    print(table)
    if args.json:
        document = dict(
            command=["python", "-m", "benchmarks.run", *(sys.argv[1:] if argv is None else argv)],
            started=started.isoformat(timespec="seconds"),
            wall_s=(datetime.datetime.now(datetime.UTC) - started).total_seconds(),
            machine=common.machine_info(plan.device),
            plan=dict(vars(plan), contenders=[c.name for c in plan.contenders]),
            models={m: dict(c, **_macs(plan, m, [s for n, s, _ in plan.points if n == m]))
                    for m, c in plan.configs.items()},
            results=[dict(e, contender=e["contender"].name,
                          label=e["contender"].label(e["versions"]),
                          **_macs(plan, e["model"], [e["image_size"]])) for e in entries],
            table=table,
        )
        atomic_write_text(args.json, json.dumps(document, indent=1))
        print(f"Wrote {args.json}", file=sys.stderr)
    return 1 if any("error" in e["summary"] for e in entries) else 0


if __name__ == "__main__":
    sys.exit(main())
