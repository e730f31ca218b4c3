"""Where the peak training memory goes: resident memory after each stage of a ViT-B/16
AdamW training run (batch 8, 224 px), and the peak within each stage.

    python -m benchmarks.memory keras_vit [--xla|--no-xla] [--bf16] [--remat]
    .venv-bench/bin/python -m benchmarks.memory timm [--bf16]   # peers' venv (setup_peers.sh)

keras_vit trains on the recipes' path (`keras_vit.training.compile_model` with
`keras_vit.training.AdamW`; `--xla`/`--no-xla` force the runtime, default: the library's
choice); `--remat` builds the model with `remat=True` (each encoder block recomputed in the
backward pass); `--bf16` trains in `mixed_bfloat16` (timm: `torch.autocast`). Each step's wall
time is printed after the table.

Linux only: reads VmRSS / VmHWM from /proc/self/status and resets the peak between stages by
writing 5 to /proc/self/clear_refs, so each stage's peak is its own.
"""

import sys
import time

BATCH, SIZE, CLASSES = 8, 224, 1000


def _stage(name):
    """A table row: resident memory now and its peak since the last stage; then resets the peak."""
    with open("/proc/self/status") as status:
        fields = dict(line.split(":", 1) for line in status)
    rss, peak = (int(fields[key].split()[0]) / 2**20 for key in ("VmRSS", "VmHWM"))  # kB -> GB
    print(f"| {name} | {rss:.2f} GB | {peak:.2f} GB |", flush=True)
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # resets VmHWM to the current RSS


def keras_vit_stages(argv):
    import numpy as np
    import keras
    import tensorflow as tf  # noqa: F401

    _stage("import tensorflow, keras")
    import keras_vit
    from keras_vit import training

    if "--bf16" in argv:
        keras.config.set_dtype_policy("mixed_bfloat16")
    model = keras_vit.create_model("B/16", dropout_rate=0.0, remat="--remat" in argv)
    _stage("model built (parameters)")
    jit_compile = True if "--xla" in argv else False if "--no-xla" in argv else None
    training.compile_model(model, training.AdamW(1e-4), jit_compile=jit_compile, metrics=())
    _stage(f"compiled (XLA {model.jit_compile}), optimizer state built")
    x = np.random.default_rng(0).uniform(-1, 1, (BATCH, SIZE, SIZE, 3)).astype("float32")
    y = np.arange(BATCH) % CLASSES
    times = []
    for step in range(4):
        start = time.perf_counter()
        model.train_on_batch(x, y)
        times.append(time.perf_counter() - start)
        _stage("step 1 (trace, compile, run)" if step == 0 else f"step {step + 1}")
    print("\nstep seconds: " + ", ".join(f"{t:.2f}" for t in times))


def timm_stages(argv):
    import torch

    from benchmarks.contenders import timm_vit

    timm = timm_vit.import_timm()[0]
    _stage("import torch, timm")
    model = timm.create_model("vit_base_patch16_224", num_classes=CLASSES)
    _stage("model built (parameters)")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.rand(BATCH, 3, SIZE, SIZE)
    y = torch.arange(BATCH) % CLASSES
    for step in range(4):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", torch.bfloat16, enabled="--bf16" in argv):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()  # creates the AdamW state on the first step
        _stage(f"step {step + 1}")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in ("keras_vit", "timm"):
        raise SystemExit("usage: python -m benchmarks.memory keras_vit|timm [--xla|--no-xla] "
                         "[--bf16] [--remat]")
    print(f"{argv[0]} {' '.join(argv[1:])}: ViT-B/16, batch {BATCH}, AdamW\n")
    print("| stage | RSS after | peak during |\n|---|---|---|")
    _stage("interpreter start")
    (keras_vit_stages if argv[0] == "keras_vit" else timm_stages)(argv[1:])


if __name__ == "__main__":
    main()
