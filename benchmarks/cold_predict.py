"""A cold prediction as a whole process: `keras-vit predict` against the same job written with
timm (create the model, load the same weights file, classify one JPEG), each started fresh,
alternately, with its wall time and peak resident memory.

    python -m benchmarks.cold_predict prepare DIR          # B/16 random weights + a JPEG
    .venv-bench/bin/python -m benchmarks.cold_predict compare DIR --runs 5 [--format safetensors] \
        [--tree CHECKOUT]                                   # and an older checkout's keras-vit

The weights file is the official-layout `.npz` (timm: `load_pretrained`) or, with
`--format safetensors`, timm's `.safetensors` with its `config.json` (timm: `load_checkpoint`).
`compare` runs each job once to warm the file cache, then `--runs` counted rounds; it prints
each run and the medians, and checks that the jobs agree on the top class.
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import time

from benchmarks.contenders import common
from benchmarks.contenders.timm_vit import import_timm


def prepare(folder):
    """DIR/b16.npz (random ViT-B/16 weights, 1000 classes, official layout), the same weights
    as DIR/b16.safetensors (timm's layout, with DIR/config.json) and DIR/image.jpg."""
    import numpy as np
    from PIL import Image

    import keras_vit
    from keras_vit import weights
    from keras_vit.weights import writers

    os.makedirs(folder, exist_ok=True)
    model = keras_vit.create_model("B/16", num_classes=1000)
    rng = np.random.default_rng(0)
    model.set_weights([rng.normal(0, 0.02, w.shape).astype("float32")
                       for w in model.get_weights()])
    weights.save_npz(model, os.path.join(folder, "b16.npz"), overwrite=True)
    writers.save_safetensors(model, os.path.join(folder, "b16.safetensors"), overwrite=True)
    pixels = rng.integers(0, 256, (375, 500, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(os.path.join(folder, "image.jpg"), quality=90)
    print(f"Wrote {folder}/b16.npz, b16.safetensors, config.json and image.jpg", file=sys.stderr)


def timm_job(folder, weights):
    """The timm user's script: create, load, resize with PIL to 224 px, scale to [-1, 1],
    predict, print the top 5 as "index probability" lines."""
    timm, _ = import_timm()
    import numpy as np
    import torch
    from PIL import Image

    model = timm.create_model("vit_base_patch16_224", pretrained=False, num_classes=1000)
    path = os.path.join(folder, weights)
    if path.endswith(".npz"):
        model.load_pretrained(path)
    else:
        timm.models.load_checkpoint(model, path)
    model.eval()
    image = Image.open(os.path.join(folder, "image.jpg")).convert("RGB").resize(
        (224, 224), Image.BILINEAR)
    x = torch.from_numpy(np.asarray(image, np.float32) / 127.5 - 1).permute(2, 0, 1)[None]
    with torch.inference_mode():
        probabilities = model(x).softmax(-1)[0]
    top = torch.topk(probabilities, 5)
    for p, i in zip(top.values.tolist(), top.indices.tolist()):
        print(f"{i} {p:.4f}")


def _measured(command):
    """(wall seconds, peak RSS bytes, top classes) of `command` as a fresh process, its memory
    that process's alone (os.wait4)."""
    start = time.perf_counter()
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")) as child:
        out = child.stdout.read().decode()
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
    if child.returncode:
        raise RuntimeError(f"{' '.join(command)} exited with {child.returncode}")
    # `keras-vit predict` prints "name (index) probability"-style lines, the timm job "index
    # probability".
    top = re.findall(r"\((\d+)\)", out) or re.findall(r"^(\d+) ", out, re.M)
    return time.perf_counter() - start, usage.ru_maxrss * 1024, [int(i) for i in top[:5]]


def compare(folder, runs, weights, tree=None):
    job = ["predict", os.path.join(folder, "image.jpg"), "--model", "B/16", "--weights",
           os.path.join(folder, weights)]
    commands = {
        "keras-vit predict": [os.path.join(os.path.dirname(sys.executable), "keras-vit"), *job],
        "timm": [sys.executable, "-m", "benchmarks.cold_predict", "timm", folder, "--format",
                 weights.split(".")[-1]],
    }
    if tree:  # the same command from another checkout's package (`git worktree add DIR REV`),
        # through the entry point `keras-vit` runs
        commands[f"keras-vit predict @{tree}"] = [
            "env", "-C", tree, f"PYTHONPATH={os.path.abspath(tree)}", sys.executable, "-c",
            "import sys; from keras_vit_cli import main; sys.exit(main())", *job]
    results = {name: [] for name in commands}
    tops = {}
    for round_index, name in common.alternating(list(commands), runs + 1):
        wall, rss, tops[name] = _measured(commands[name])
        if round_index:  # the first round warms the file cache
            results[name].append((wall, rss))
            print(f"round {round_index}: {name}: {wall:.2f} s, peak RSS {rss / 1e9:.2f} GB",
                  file=sys.stderr, flush=True)
    print(common.table_head(["job", "wall time (median)", "peak RSS (median)"]))
    medians = {name: [statistics.median(column) for column in zip(*rows)]
               for name, rows in results.items()}
    for name, (wall, rss) in medians.items():
        print(common.table_row([name, f"{wall:.2f} s", f"{rss / 1e9:.2f} GB"]))
    timm_wall, timm_rss = medians.pop("timm")
    for name, (wall, rss) in medians.items():
        print(f"\n{name} / timm: wall {wall / timm_wall:.2f}x, peak RSS "
              f"{rss / timm_rss:.2f}x over {runs} alternating rounds")
    # Random weights give near-equal probabilities and the two resizes differ (TensorFlow's
    # bilinear without antialiasing, PIL's with): the top class must agree, not the order below.
    if len({classes[0] for classes in tops.values()}) != 1:
        print(f"benchmarks.cold_predict: the top classes differ: {tops}", file=sys.stderr)
        return 1
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cold_predict",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("prepare", "compare", "timm"))
    parser.add_argument("folder")
    parser.add_argument("--runs", type=int, default=5, help="counted rounds (compare)")
    parser.add_argument("--tree", help="also the keras-vit job of the checkout in this folder "
                                       "(compare)")
    parser.add_argument("--format", choices=("npz", "safetensors"), default="npz",
                        help="the weights file both load (compare, timm)")
    args = parser.parse_args(argv)
    weights = f"b16.{args.format}"
    if args.action == "compare":
        return compare(args.folder, args.runs, weights, args.tree)
    if args.action == "timm":
        timm_job(args.folder, weights)
    else:
        prepare(args.folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
