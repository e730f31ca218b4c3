"""A cold prediction as a whole process: `keras-vit predict` against the same job written with
timm (create the model, load the same official-layout `.npz`, classify one JPEG), each started
fresh, alternately, with its wall time and peak resident memory.

    python -m benchmarks.cold_predict prepare DIR          # B/16 random weights + a JPEG
    .venv-bench/bin/python -m benchmarks.cold_predict compare DIR --runs 5

`prepare` writes DIR/b16.npz (random ViT-B/16 weights, 1000 classes, in the official layout)
and DIR/image.jpg (500x375 pixels). `compare` runs, in turn, `keras-vit predict DIR/image.jpg
--model B/16 --weights DIR/b16.npz` and `python -m benchmarks.cold_predict timm DIR` (timm's
`vit_base_patch16_224`, `load_pretrained` of the same file, PIL resize to 224 and [-1, 1]
scaling) after one warm-up run each (file cache), and prints each run and the medians. Both
print the top-5 classes; `compare` checks that their top classes agree.
"""

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def prepare(folder):
    import numpy as np
    from PIL import Image

    import keras_vit
    from keras_vit.weights import npz

    os.makedirs(folder, exist_ok=True)
    model = keras_vit.create_model("B/16", num_classes=1000)
    rng = np.random.default_rng(0)
    model.set_weights([rng.normal(0, 0.02, w.shape).astype("float32")
                       for w in model.get_weights()])
    npz.save_npz(model, os.path.join(folder, "b16.npz"), overwrite=True)
    pixels = rng.integers(0, 256, (375, 500, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(os.path.join(folder, "image.jpg"), quality=90)
    print(f"Wrote {folder}/b16.npz and {folder}/image.jpg", file=sys.stderr)


def timm_job(folder):
    """The timm user's script: create, load, preprocess, predict, print the top 5."""
    sys.path.insert(0, os.path.dirname(HERE))
    from benchmarks.contenders.timm_vit import import_timm

    timm, _ = import_timm()
    import numpy as np
    import torch
    from PIL import Image

    model = timm.create_model("vit_base_patch16_224", pretrained=False, num_classes=1000)
    model.load_pretrained(os.path.join(folder, "b16.npz"))
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
    """(wall seconds, peak RSS bytes, stdout) of `command` as a fresh child process, its
    memory from the kernel's accounting of that child alone (os.wait4)."""
    read, write = os.pipe()
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # the child: stdout to the pipe, stderr discarded, then the command
        os.dup2(write, 1)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
        try:
            os.execvp(command[0], command)
        finally:
            os._exit(127)
    os.close(write)
    chunks = []
    with os.fdopen(read, "rb") as pipe:
        for chunk in iter(lambda: pipe.read(65536), b""):
            chunks.append(chunk)
    _, status, usage = os.wait4(pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status):
        raise RuntimeError(f"{' '.join(command)} exited with {os.waitstatus_to_exitcode(status)}")
    return wall, usage.ru_maxrss * 1024, b"".join(chunks).decode()


def _top_classes(output):
    """The class indices printed, in order: `keras-vit predict` prints "rank. name (index)
    probability"-style lines, the timm job "index probability"."""
    import re

    found = re.findall(r"\((\d+)\)", output) or re.findall(r"^(\d+) ", output, re.M)
    return [int(i) for i in found[:5]]


def compare(folder, runs, keras_vit_command, python):
    contenders = {
        "keras-vit predict": [*keras_vit_command, "predict", os.path.join(folder, "image.jpg"),
                              "--model", "B/16", "--weights", os.path.join(folder, "b16.npz")],
        "timm": [python, "-m", "benchmarks.cold_predict", "timm", folder],
    }
    results = {name: [] for name in contenders}
    tops = {}
    for round_index in range(runs + 1):  # the first round warms the file cache, not counted
        for name, command in contenders.items():
            wall, rss, out = _measured(command)
            tops[name] = _top_classes(out)
            if round_index:
                results[name].append((wall, rss))
                print(f"round {round_index}: {name}: {wall:.2f} s, peak RSS {rss / 1e9:.2f} GB",
                      file=sys.stderr, flush=True)
    print("| job | wall time (median) | peak RSS (median) |\n|---|---|---|")
    medians = {}
    for name, rows in results.items():
        medians[name] = (statistics.median(w for w, _ in rows),
                         statistics.median(r for _, r in rows))
        wall, rss = medians[name]
        print(f"| {name} | {wall:.2f} s | {rss / 1e9:.2f} GB |")
    (kv_wall, kv_rss), (timm_wall, timm_rss) = medians.values()
    print(f"\nkeras-vit / timm: wall {kv_wall / timm_wall:.2f}x, peak RSS "
          f"{kv_rss / timm_rss:.2f}x over {runs} alternating rounds")
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
    parser.add_argument("--keras-vit", default=os.path.join(os.path.dirname(sys.executable),
                                                             "keras-vit"),
                        help="the keras-vit command (default: beside this interpreter)")
    args = parser.parse_args(argv)
    if args.action == "prepare":
        prepare(args.folder)
        return 0
    if args.action == "timm":
        timm_job(args.folder)
        return 0
    return compare(args.folder, args.runs, [args.keras_vit], sys.executable)


if __name__ == "__main__":
    sys.exit(main())
