"""Training throughput, time to the first step and peak memory of `model.fit` steps.

    python -m benchmarks.fit_speed                     # ViT-B/16, batch 8, CPU, XLA off and on
    python -m benchmarks.fit_speed --precision bfloat16 --configs xla   # e.g. on a GPU

Each configuration runs in a fresh process: build the model, compile the fine-tuning recipe,
then `fit` on synthetic 224 px images for `--steps` timed steps after one first step. Reported:
time to the first step (tracing and, with XLA, compilation, plus the step itself), images/s
over the timed steps, and peak memory (the process's peak resident set on CPU; TensorFlow's
peak allocation on a GPU).
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def run_one(args):
    import keras
    import numpy as np
    import tensorflow as tf

    import keras_vit
    from keras_vit import training

    training.set_precision(args.precision)
    gpus = tf.config.list_physical_devices("GPU")
    model = keras_vit.create_model(args.variant, image_size=args.image_size, num_classes=10)
    training.compile_finetune(model, total_steps=1000, warmup_steps=10,
                              jit_compile=args.xla == "on")
    rng = np.random.default_rng(0)
    images = rng.uniform(-1, 1, (args.batch_size, args.image_size, args.image_size, 3))
    dataset = tf.data.Dataset.from_tensors(
        (images.astype("float32"), np.arange(args.batch_size) % 10)).repeat()
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    start = time.perf_counter()
    model.fit(dataset, steps_per_epoch=1, epochs=1, verbose=0)
    first = time.perf_counter() - start
    start = time.perf_counter()
    model.fit(dataset, steps_per_epoch=args.steps, epochs=1, verbose=0)
    elapsed = time.perf_counter() - start
    result = dict(
        variant=args.variant, batch_size=args.batch_size, image_size=args.image_size,
        xla=args.xla == "on", precision=args.precision,
        device=tf.config.experimental.get_device_details(gpus[0]).get("device_name", "GPU")
        if gpus else f"CPU ({os.cpu_count()} cores visible)",
        first_step_s=round(first, 1), images_per_s=round(args.steps * args.batch_size / elapsed, 2),
        step_s=round(elapsed / args.steps, 2),
        peak_rss_mib=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        rss_before_fit_mib=round(rss_before),
        load_average=os.getloadavg()[0],
    )
    if gpus:
        result["gpu_peak_mib"] = round(tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2**20)
    del keras
    print(json.dumps(result), flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", default="B/16")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--steps", type=int, default=5, help="timed steps after the first")
    parser.add_argument("--precision", default="float32")
    parser.add_argument("--configs", default="no-xla,xla",
                        help="comma-separated: no-xla, xla (each in its own process)")
    parser.add_argument("--xla", choices=("on", "off"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.xla:
        return run_one(args)
    for config in args.configs.split(","):
        flag = {"no-xla": "off", "xla": "on"}[config]
        cmd = [sys.executable, os.path.abspath(__file__), "--xla", flag, "--variant", args.variant,
               "--batch-size", str(args.batch_size), "--image-size", str(args.image_size),
               "--steps", str(args.steps), "--precision", args.precision]
        subprocess.run(cmd, check=True)


if __name__ == "__main__":
    main()
