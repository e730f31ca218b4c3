"""Time to the first ViT-B/16 training step (batch 8, AdamW) and where it goes.

    python -m benchmarks.first_step [xla|noxla] [--keras-adamw] [--no-prebuild]
        [--plain-compile] [--no-grappler] [--profile] [--model B/16]
    python -m benchmarks.first_step --count-ops

Prints import, build, compile-plus-first-step times and the steady step of a variant
(`--model`, default ViT-B/16). By default the model
is compiled as `keras_vit.training.compile_model` does it: `keras_vit.training.AdamW` and
`training.build_training_state` (optimizer state built before the first step). The flags
undo each: `--keras-adamw` uses `keras.optimizers.AdamW` with Keras' own update
(`compile(fuse_optimizer=False)`), `--no-prebuild` wraps the model in Keras' functional
`keras.Model` (what keras_vit 0.2 returned), which leaves the optimizer to be built inside the
first traced step (so TensorFlow traces it twice). `--plain-compile` is what a user who skips
the recipes writes: keras_vit's model and `model.compile(optimizer=keras.optimizers.AdamW(...))`
with nothing else (`keras_vit.ViTModel` then fuses the update and builds the state itself).
`--profile` prints the top of a cProfile of the first `train_on_batch`: the Python graph
construction (`func_graph_from_py_func`) against the execution (`TFE_Py_Execute`, which
includes XLA's compilation). `--count-ops` prints instead how many TensorFlow operations one
`optimizer.apply` on ViT-B/16's variables creates, for Keras' AdamW and keras_vit's.
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
    from keras_vit import training

    if "--no-grappler" in argv:
        tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})
    if "--count-ops" in argv:
        return count_ops(keras, tf, keras_vit, training)
    xla = "noxla" not in argv
    plain = "--plain-compile" in argv
    adamw = keras.optimizers.AdamW if "--keras-adamw" in argv or plain else training.AdamW
    t_import = time.perf_counter()
    name = argv[argv.index("--model") + 1] if "--model" in argv[:-1] else "B/16"
    model = keras_vit.create_model(name, dropout_rate=0.0)
    if "--no-prebuild" in argv:
        model = keras.Model(model.input, model.output, name=model.name)
    t_build = time.perf_counter()
    options = {"fuse_optimizer": False} if "--keras-adamw" in argv and not plain and \
        isinstance(model, keras_vit.ViTModel) else {}
    model.compile(optimizer=adamw(1e-4),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=xla, **options)
    if "--no-prebuild" not in argv and not plain:
        training.build_training_state(model)
    x = np.random.default_rng(0).uniform(-1, 1, (8, 224, 224, 3)).astype("float32")
    y = np.arange(8)
    if "--profile" in argv:
        import cProfile
        import pstats

        profile = cProfile.Profile()
        profile.runcall(model.train_on_batch, x, y)
        stats = pstats.Stats(profile).sort_stats("cumulative")
        stats.print_stats("func_graph_from_py_func|TFE_Py_Execute|apply_gradients|"
                          "backprop.py.*gradient")
    else:
        model.train_on_batch(x, y)
    t_first = time.perf_counter()
    steps = []
    for _ in range(2):
        start = time.perf_counter()
        model.train_on_batch(x, y)
        steps.append(time.perf_counter() - start)
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    fused = getattr(getattr(model.optimizer, "inner_optimizer", model.optimizer),
                    "_keras_vit_fused", False)
    setup = ("plain compile" if plain else
             f"{'no ' if '--no-prebuild' in argv else ''}prebuild")
    print(f"{name}, {'XLA' if xla else 'no XLA'}, {type(model).__name__}, "
          f"{adamw.__module__}.{adamw.__name__}{' (fused)' if fused else ''}, {setup}: import {t_import - t0:.1f} s, "
          f"build {t_build - t_import:.1f} s, compile + first step {t_first - t_build:.1f} s, "
          f"steady step {min(steps):.2f} s ({8 / min(steps):.2f} img/s), peak RSS {peak:.2f} GB")


def count_ops(keras, tf, keras_vit, training):
    variables = keras_vit.create_model("B/16").trainable_variables
    specs = [tf.TensorSpec(v.shape, v.dtype) for v in variables]
    for schedule in (False, True):
        for adamw in (keras.optimizers.AdamW, training.AdamW):
            rate = training.WarmupDecay(1e-3, 1000, 100) if schedule else 1e-3
            optimizer = adamw(rate, weight_decay=0.1)
            optimizer.build(variables)
            traced = tf.function(
                lambda *grads, optimizer=optimizer: optimizer.apply(list(grads), variables)
            ).get_concrete_function(*specs)
            print(f"{adamw.__module__}.{adamw.__name__}, "
                  f"{'WarmupDecay' if schedule else 'constant'} learning rate: "
                  f"{len(traced.graph.get_operations()):,} operations for "
                  f"{len(variables)} variables")


if __name__ == "__main__":
    main()
