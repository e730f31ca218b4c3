"""Time to the first ViT-B/16 training step (batch 8, AdamW) and where it goes.

    python -m benchmarks.first_step [xla|noxla] [--no-grappler] [--profile]

Prints import, build, compile-plus-first-step times and the steady step; with --profile, the
top of a cProfile of the first `train_on_batch` (graph construction in Python vs execution).
"""

import sys
import time


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    t0 = time.perf_counter()
    import numpy as np
    import tensorflow as tf
    import keras

    import keras_vit

    if "--no-grappler" in argv:
        tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})
    xla = "noxla" not in argv
    t_import = time.perf_counter()
    model = keras_vit.create_model("B/16", dropout_rate=0.0)
    t_build = time.perf_counter()
    model.compile(optimizer=keras.optimizers.AdamW(1e-4),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=xla)
    x = np.random.default_rng(0).uniform(-1, 1, (8, 224, 224, 3)).astype("float32")
    y = np.arange(8)
    if "--profile" in argv:
        import cProfile
        import pstats

        profile = cProfile.Profile()
        profile.runcall(model.train_on_batch, x, y)
        pstats.Stats(profile).sort_stats("tottime").print_stats(8)
    else:
        model.train_on_batch(x, y)
    t_first = time.perf_counter()
    steps = []
    for _ in range(2):
        start = time.perf_counter()
        model.train_on_batch(x, y)
        steps.append(time.perf_counter() - start)
    print(f"{'XLA' if xla else 'no XLA'}: import {t_import - t0:.1f} s, build {t_build - t_import:.1f} s, "
          f"compile + first step {t_first - t_build:.1f} s, steady step {min(steps):.2f} s "
          f"({8 / min(steps):.2f} img/s)")


if __name__ == "__main__":
    main()
