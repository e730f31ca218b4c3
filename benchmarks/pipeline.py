"""The training input pipeline as a whole process: keras_vit's (`keras_vit.data.from_folder`,
training=True) against timm's loader (torchvision's `ImageFolder`, timm's training transform,
a `DataLoader` with a worker per core), on the same JPEGs with the same augmentation: a random
resized crop (scale 0.08-1) and a horizontal flip to 224 px, batches of 64.

    python -m benchmarks.pipeline prepare DIR                  # 512 photo-like 500x375 JPEGs
    python -m benchmarks.pipeline compare DIR --rounds 3 --timm-python .venv-timm/bin/python

Each round runs each loader in a fresh process, alternately, for `--epochs` passes over the
folder; a process prints its images per second after its first batch (the pipeline's steady
rate; start-up is the time from building the loader to its first batch, printed beside it)
and its peak resident memory:
the larger of the kernel's high-water mark of the process itself and the peak of the summed
memory of it and all its descendants (timm's workers are processes; tf.data's threads are the
process's own), sampled every 20 ms from /proc (Linux).
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
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


class _TreeMemory:
    """The peak, over the run, of the summed resident memory of this process and all its
    descendants, sampled every 20 ms by a thread (and at the end)."""

    def __init__(self):
        self.peak = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    @staticmethod
    def _tree_rss():
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

    def _sample(self):
        while not self._done.wait(0.02):
            self.peak = max(self.peak, self._tree_rss())

    def stop(self):
        self.peak = max(self.peak, self._tree_rss())
        self._done.set()
        self._thread.join()
        own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # the kernel's
        return max(self.peak, own)


def _report(batch_times, images_per_batch, memory):
    """One JSON line: the seconds from building the loader to its first batch, the steady
    images per second after it, and the peak memory of the process tree."""
    steady = sum(batch_times[1:])
    print(json.dumps(dict(first_batch_s=batch_times[0],
                          images_per_s=images_per_batch * (len(batch_times) - 1) / steady,
                          batches=len(batch_times), peak_rss_bytes=memory.stop())))


def keras_vit_job(folder, epochs):
    memory = _TreeMemory()
    import keras_vit

    times, last = [], time.perf_counter()  # the first batch's time includes the build
    data = keras_vit.data.from_folder(folder, image_size=SIZE, batch_size=BATCH, training=True)
    for _images, _labels in data.dataset.take(epochs * (IMAGES // BATCH)):  # it repeats
        now = time.perf_counter()
        times.append(now - last)
        last = now
    _report(times, BATCH, memory)


def timm_job(folder, epochs):
    memory = _TreeMemory()
    sys.path.insert(0, os.path.dirname(HERE))
    from benchmarks.contenders.timm_vit import import_timm

    timm, _ = import_timm()
    import torch
    from torchvision.datasets import ImageFolder

    times, last = [], time.perf_counter()  # the first batch's time includes the build
    transform = timm.data.create_transform(SIZE, is_training=True, color_jitter=None,
                                           auto_augment=None, interpolation="bilinear")
    loader = torch.utils.data.DataLoader(ImageFolder(folder, transform), batch_size=BATCH,
                                         shuffle=True, drop_last=True,
                                         num_workers=os.cpu_count(),
                                         persistent_workers=True)
    for _ in range(epochs):
        for _images, _labels in loader:
            now = time.perf_counter()
            times.append(now - last)
            last = now
    _report(times, BATCH, memory)


def compare(folder, rounds, epochs, timm_python):
    jobs = {"keras_vit": [sys.executable, "-m", "benchmarks.pipeline", "keras_vit", folder],
            "timm": [timm_python, "-m", "benchmarks.pipeline", "timm", folder]}
    results = {name: [] for name in jobs}
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=os.path.dirname(HERE))
    for round_index in range(rounds):
        for name, command in jobs.items():
            done = subprocess.run(command + ["--epochs", str(epochs)], capture_output=True,
                                  text=True, env=env, cwd=os.path.dirname(HERE), timeout=1800)
            if done.returncode:
                raise RuntimeError(f"{name} exited with {done.returncode}: {done.stderr[-2000:]}")
            result = json.loads(done.stdout.strip().splitlines()[-1])
            results[name].append(result)
            print(f"round {round_index + 1}: {name}: {result['images_per_s']:.0f} images/s, "
                  f"first batch {result['first_batch_s']:.2f} s, peak RSS "
                  f"{result['peak_rss_bytes'] / 1e9:.2f} GB", file=sys.stderr, flush=True)
    print(f"| loader ({os.cpu_count()} cores, {IMAGES} JPEGs 500x375, batch {BATCH}, {SIZE} px) "
          "| images/s (median) | building to the first batch | peak RSS |\n|---|---|---|---|")
    medians = {}
    for name, rows in results.items():
        medians[name] = {key: statistics.median(row[key] for row in rows)
                         for key in ("images_per_s", "first_batch_s", "peak_rss_bytes")}
        m = medians[name]
        print(f"| {name} | {m['images_per_s']:.0f} | {m['first_batch_s']:.2f} s | "
              f"{m['peak_rss_bytes'] / 1e9:.2f} GB |")
    ratio = medians["keras_vit"]["images_per_s"] / medians["timm"]["images_per_s"]
    memory = medians["keras_vit"]["peak_rss_bytes"] / medians["timm"]["peak_rss_bytes"]
    per_core = medians["keras_vit"]["images_per_s"] / os.cpu_count()
    print(f"\nkeras_vit / timm: {ratio:.2f}x the images per second, {memory:.2f}x the peak RSS, "
          f"over {rounds} alternating rounds; keras_vit: {per_core:.0f} images/s per core")
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
    if args.action == "prepare":
        prepare(args.folder)
    elif args.action == "keras_vit":
        keras_vit_job(args.folder, args.epochs)
    elif args.action == "timm":
        timm_job(args.folder, args.epochs)
    else:
        return compare(args.folder, args.rounds, args.epochs, args.timm_python)
    return 0


if __name__ == "__main__":
    sys.exit(main())
