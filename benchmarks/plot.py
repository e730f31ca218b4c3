"""Speed and peak memory against the number of tokens, from a `benchmarks.run --json` file.

    .venv-bench/bin/python -m benchmarks.run --points B/16@224x4,B/16@288x4,B/16@352x4 \\
        --contenders timm,keras_vit --json sweep.json
    python -m benchmarks.plot sweep.json token_sweep.png   # needs matplotlib

One line per contender and model in each panel present in the results; failed points (out of
memory, for example) are listed under the figure's title.
"""

import argparse
import json
import sys

# The panels: (summary key, y-axis label, scale).
PANELS = [
    ("train_images_per_s", "training, images/s", 1),
    ("peak_rss_train_bytes", "training peak memory, GB", 1e-9),
    ("infer_images_per_s", "inference, images/s", 1),
    ("peak_rss_infer_bytes", "inference peak memory, GB", 1e-9),
]


def series(document):
    """{(label, model): {summary key: [(tokens, value), ...]}} and the failed points."""
    lines, failed = {}, []
    for result in document["results"]:
        patch_size = document["models"][result["model"]]["patch_size"]
        tokens = (result["image_size"] // patch_size) ** 2 + 1  # the patches and the class token
        line = lines.setdefault((result["label"], result["model"]), {})
        summary = result["summary"]
        if "error" in summary:
            failed.append(f"{result['contender']} {result['model']} {result['image_size']} px")
        for key, _, scale in PANELS:
            if summary.get(key) is not None:
                line.setdefault(key, []).append((tokens, summary[key] * scale))
    return lines, failed


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.plot",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("results", help="a JSON file written by benchmarks.run --json")
    parser.add_argument("out", help="the PNG to write")
    parser.add_argument("--only", choices=("speed", "memory"),
                        help="draw only the speed or only the memory panels")
    args = parser.parse_args(argv)
    with open(args.results) as f:
        document = json.load(f)
    lines, failed = series(document)
    panels = [p for p in PANELS if any(p[0] in line for line in lines.values())
              and (args.only is None or (args.only == "memory") == p[0].startswith("peak"))]
    if not panels:
        print(f"benchmarks.plot: error: {args.results} has no speed or memory results.",
              file=sys.stderr)
        return 2
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    columns = 2 if len(panels) > 1 else 1
    rows = (len(panels) + 1) // 2
    figure, axes = plt.subplots(rows, columns, figsize=(6 * columns, 4 * rows), squeeze=False)
    for ax, (key, label, _) in zip(axes.flat, panels):
        for (name, model), line in lines.items():
            if key in line:
                xs, ys = zip(*sorted(line[key]))
                ax.plot(xs, ys, marker="o", label=f"{name}, {model}")
        ax.set_xlabel("tokens (patches + class token)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    cpu = document.get("machine", {}).get("cpu", "")
    figure.suptitle(cpu + (f"\nfailed: {', '.join(failed)}" if failed else ""), fontsize=9)
    figure.tight_layout()
    figure.savefig(args.out, dpi=100)
    print(f"Wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
