"""The Keras side shared by the keras_vit and keras-hub contenders (TensorFlow or JAX backend).

Inference is `model.predict_on_batch`, training `model.train_on_batch`: the calls a Keras user
makes, each returning NumPy (so each step has finished when it returns, on a GPU too). `--xla`
is `model.compile(jit_compile=True)`, `--no-xla` `jit_compile=False`, neither Keras' "auto"
(no XLA on a CPU). Lower precision is the global dtype policy ("mixed_bfloat16"), set before
the model is built.
"""

import os

from benchmarks.contenders import common


def setup(args):
    """Imports the backend and Keras for `args.device` and `args.precision`; returns versions."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ["KERAS_BACKEND"] = args.backend
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = "-1"  # before the backend is imported
    if args.backend == "jax":
        return _setup_jax(args)
    import keras
    import tensorflow as tf

    if args.device == "gpu" and not tf.config.list_physical_devices("GPU"):
        raise RuntimeError(
            "--device gpu, but TensorFlow sees no GPU (a CUDA build is needed: "
            "`pip install tensorflow[and-cuda]`)."
        )
    if args.precision == "bf16":
        keras.config.set_dtype_policy("mixed_bfloat16")
    return dict(
        tensorflow=tf.__version__,
        keras=keras.__version__,
        intra_op_threads=tf.config.threading.get_intra_op_parallelism_threads() or os.cpu_count(),
    )


def _setup_jax(args):
    import jax
    import keras

    if args.device == "gpu" and not jax.devices("gpu"):
        raise RuntimeError("--device gpu, but JAX sees no GPU.")
    if args.precision == "bf16":
        keras.config.set_dtype_policy("mixed_bfloat16")
    return dict(jax=jax.__version__, keras=keras.__version__, backend="jax",
                device=str(jax.devices()[0].device_kind))


def jit_compile(args):
    """The `jit_compile` that `args` asks for: on JAX always XLA; else `--xla`/`--no-xla`, or
    Keras' "auto"."""
    if args.backend == "jax":
        return True
    return "auto" if args.xla is None else args.xla


def compile_model(model, args, **kwargs):
    """`model.compile(jit_compile=..., **kwargs)`, refusing a silent fall-back from XLA.

    (Keras turns `jit_compile=True` off, with only a warning, when a layer does not support
    XLA: a measurement labelled XLA would then be without it.)
    """
    model.compile(jit_compile=jit_compile(args), **kwargs)
    if args.xla and not model.jit_compile:
        raise RuntimeError(
            f"--xla: Keras turned jit_compile off for {model.name} (a layer has "
            "supports_jit=False), so this would not measure XLA."
        )


def compile_for_training(model, args, adamw=None):
    """AdamW on cross-entropy from logits, no metrics (keras-hub's default adds accuracy).

    `adamw`: the AdamW class; defaults to `keras.optimizers.AdamW`.
    """
    import keras

    adamw = adamw or keras.optimizers.AdamW
    compile_model(
        model,
        args,
        optimizer=adamw(learning_rate=common.LEARNING_RATE, weight_decay=common.WEIGHT_DECAY),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=None,
    )


def inference_step(model, args):
    """A synchronous forward pass of one batch through `model`, compiled as `args` asks."""
    import keras

    compile_model(model, args)
    images = keras.ops.convert_to_tensor(common.random_batch(args)[0])
    return lambda: model.predict_on_batch(images)


def training_step(model, args, adamw=None, after_compile=None):
    """A synchronous AdamW training step on one batch of random images and labels.

    `adamw` as in `compile_for_training`; `after_compile(model)`, if given, runs after
    `compile` (inside the time to the first step).
    """
    import keras

    compile_for_training(model, args, adamw)
    if after_compile is not None:
        after_compile(model)
    images, labels = common.random_batch(args)
    images, labels = keras.ops.convert_to_tensor(images), keras.ops.convert_to_tensor(labels)
    return lambda: model.train_on_batch(images, labels)


def device_peak_bytes(args):
    """Peak GPU memory the backend allocated, or None on a CPU."""
    if args.device != "gpu":
        return None
    if args.backend == "jax":
        import jax

        return int(jax.devices()[0].memory_stats().get("peak_bytes_in_use", 0))
    import tensorflow as tf

    return int(tf.config.experimental.get_memory_info("GPU:0")["peak"])
