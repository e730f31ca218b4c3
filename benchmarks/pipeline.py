"""The training input pipeline as a whole process: keras_vit's (`keras_vit.data.from_folder`,
training=True) against timm's loader (torchvision's `ImageFolder`, timm's training transform,
a `DataLoader` with a worker per core), on the same JPEGs with the same augmentation: a random
resized crop (scale 0.08-1) and a horizontal flip to 224 px, batches of 64.

    python -m benchmarks.pipeline prepare DIR                  # 512 photo-like 500x375 JPEGs
    python -m benchmarks.pipeline compare DIR --rounds 3 --timm-python .venv-timm/bin/python

Each round runs each loader in a fresh process, alternately, for `--epochs` passes over the
folder. A process prints one JSON line: its images per second after its first batch (the
pipeline's steady rate), the time from building the loader to its first batch, and its peak
memory: the larger of the kernel's high-water mark of the process itself and the peak of the
summed memory of it and all its descendants (timm's workers are processes; tf.data's threads
are the process's own), sampled every 20 ms from /proc (Linux).
"""

import argparse
import json
import os
import statistics
import sys
import threading
import time

from benchmarks.contenders import common
from benchmarks.contenders.timm_vit import import_timm

SIZE, BATCH, CLASSES, IMAGES = 224, 64, 8, 512


def prepare(folder):
    """IMAGES smooth, photo-like 500x375 JPEGs (a gradient plus noise, quality 90) in CLASSES
    class folders."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:375, 0:500] / 500.0
    for i in range(IMAGES):
        base = np.stack([np.sin(x * rng.uniform(1, 6) + rng.uniform(0, 6)),
                         np.cos(y * rng.uniform(1, 6) + rng.uniform(0, 6)),
                         np.sin((x + y) * rng.uniform(1, 6))], -1)
        pixels = (base * 90 + 128 + rng.normal(0, 12, base.shape)).clip(0, 255)
        path = os.path.join(folder, f"class{i % CLASSES}", f"{i:04d}.jpg")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        Image.fromarray(pixels.astype(np.uint8)).save(path, quality=90)
    print(f"Wrote {IMAGES} JPEGs in {CLASSES} class folders under {folder}", file=sys.stderr)


def _tree_rss():
    """The summed resident memory of this process and all its descendants."""
    total, pending = 0, [os.getpid()]
    while pending:
        pid = pending.pop()
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    pending += [int(child) for child in f.read().split()]
        except (OSError, ValueError):
            continue  # a child that ended between two reads
    return total


def _timed_batches(batches):
    """Reads `batches` while a thread samples `_tree_rss` every 20 ms, then prints the JSON line
    (the first batch's time counts from the call, so it includes building the loader)."""
    peak, done = 0, threading.Event()

    def sample():
        nonlocal peak
        while not done.wait(0.02):
            peak = max(peak, _tree_rss())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    times, last = [], time.perf_counter()
    for _ in batches:
        now = time.perf_counter()
        times.append(now - last)
        last = now
    done.set()
    sampler.join()
    peak_rss = max(peak, _tree_rss(), common.peak_rss_bytes())  # the last: the kernel's
    print(json.dumps(dict(first_batch_s=times[0],
                          images_per_s=BATCH * (len(times) - 1) / sum(times[1:]),
                          batches=len(times), peak_rss_bytes=peak_rss)))


def keras_vit_job(folder, epochs):
    import keras_vit

    def batches():
        data = keras_vit.data.from_folder(folder, image_size=SIZE, batch_size=BATCH,
                                          training=True)
        yield from data.dataset.take(epochs * (IMAGES // BATCH))  # it repeats

    _timed_batches(batches())


def timm_job(folder, epochs):
    timm, _ = import_timm()
    import torch
    from torchvision.datasets import ImageFolder

    def batches():
        transform = timm.data.create_transform(SIZE, is_training=True, color_jitter=None,
                                               auto_augment=None, interpolation="bilinear")
        loader = torch.utils.data.DataLoader(ImageFolder(folder, transform), batch_size=BATCH,
                                             shuffle=True, drop_last=True,
                                             num_workers=os.cpu_count(), persistent_workers=True)
        for _ in range(epochs):
            yield from loader

    _timed_batches(batches())


def compare(folder, rounds, epochs, timm_python):
    jobs = {"keras_vit": sys.executable, "timm": timm_python}
    results = {name: [] for name in jobs}
    for round_index, name in common.alternating(list(jobs), rounds):
        done = common.run_fresh([jobs[name], "-m", "benchmarks.pipeline", name, folder,
                                 "--epochs", str(epochs)], timeout=1800)
        if done.returncode:
            raise RuntimeError(f"{name} exited with {done.returncode}: {done.stderr[-2000:]}")
        result = json.loads(done.stdout.strip().splitlines()[-1])
        results[name].append(result)
        print(f"round {round_index + 1}: {name}: {result['images_per_s']:.0f} images/s, "
              f"first batch {result['first_batch_s']:.2f} s, peak RSS "
              f"{result['peak_rss_bytes'] / 1e9:.2f} GB", file=sys.stderr, flush=True)
    print(common.table_head([
        f"loader ({os.cpu_count()} cores, {IMAGES} JPEGs 500x375, batch {BATCH}, {SIZE} px)",
        "images/s (median)", "building to the first batch", "peak RSS"]))
    medians = {name: {key: statistics.median(row[key] for row in rows) for key in rows[0]}
               for name, rows in results.items()}
    for name, m in medians.items():
        print(common.table_row([name, f"{m['images_per_s']:.0f}", f"{m['first_batch_s']:.2f} s",
                                f"{m['peak_rss_bytes'] / 1e9:.2f} GB"]))
    ours, timm = medians["keras_vit"], medians["timm"]
    print(f"\nkeras_vit / timm: {ours['images_per_s'] / timm['images_per_s']:.2f}x the images "
          f"per second, {ours['peak_rss_bytes'] / timm['peak_rss_bytes']:.2f}x the peak RSS, "
          f"over {rounds} alternating rounds; keras_vit: "
          f"{ours['images_per_s'] / os.cpu_count():.0f} images/s per core")
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.pipeline",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("prepare", "compare", "keras_vit", "timm"))
    parser.add_argument("folder")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (compare)")
    parser.add_argument("--epochs", type=int, default=2, help="passes over the folder per run")
    parser.add_argument("--timm-python", default=os.environ.get("KERAS_VIT_TIMM_PYTHON",
                                                                sys.executable),
                        help="interpreter with torch, torchvision and timm (compare)")
    args = parser.parse_args(argv)
    if args.action != "prepare" and not os.path.isdir(args.folder):
        parser.error(f"{args.folder} is not a folder. Expected one that `prepare` wrote.")
    if args.action == "compare":
        return compare(args.folder, args.rounds, args.epochs, args.timm_python)
    if args.action == "prepare":
        prepare(args.folder)
    elif args.action == "keras_vit":
        keras_vit_job(args.folder, args.epochs)
    else:
        timm_job(args.folder, args.epochs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
