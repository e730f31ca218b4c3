"""Load time of a ViT-B/16-sized checkpoint into a built model, next to numpy's plain read.

    python -m benchmarks.load_checkpoint [--rounds 5] [--json out.json]

Writes a random checkpoint with the real ImageNet-1k fine-tune shapes (224 px, 1000 classes,
330 MiB), builds ViT-B/16 once, then alternates rounds of (a) `np.load` reading every array and
(b) `keras_vit.load_pretrained(model, path)`, and reports the medians. The file is read from the
page cache in both cases (a warm-up read comes first), so the comparison is of the work each
does on top of the bytes.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np


def write_b16_checkpoint(path, seed=0):
    import keras_vit
    from keras_vit import weights

    model = keras_vit.ViT_B16()
    rng = np.random.default_rng(seed)
    params = {
        k: rng.standard_normal(v.shape).astype(np.float32) * 0.02
        for k, v in weights.checkpoint_variables(model).items()
    }
    np.savez(path, **params)
    return model


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args(argv)

    import keras_vit

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "ViT-B_16-random.npz")
        model = write_b16_checkpoint(path)
        size_mib = os.path.getsize(path) / 2**20

        def raw_read():
            with np.load(path, allow_pickle=False) as npz:
                return {k: npz[k] for k in npz.files}

        raw_read()  # warm the page cache
        raw, load = [], []
        for _ in range(args.rounds):
            start = time.perf_counter()
            raw_read()
            raw.append(time.perf_counter() - start)
            start = time.perf_counter()
            keras_vit.load_pretrained(model, path, progress=False)
            load.append(time.perf_counter() - start)
    result = dict(
        file_mib=round(size_mib, 1),
        rounds=args.rounds,
        numpy_read_s=round(statistics.median(raw), 3),
        load_pretrained_s=round(statistics.median(load), 3),
    )
    result["ratio"] = round(result["load_pretrained_s"] / result["numpy_read_s"], 2)
    print("| checkpoint | numpy read (median) | load_pretrained (median) | ratio |")
    print("|---|---|---|---|")
    print(
        f"| ViT-B/16, {result['file_mib']} MiB | {result['numpy_read_s']:.3f} s | "
        f"{result['load_pretrained_s']:.3f} s | {result['ratio']:.2f}x |"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
