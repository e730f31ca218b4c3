"""The Keras side shared by the keras_vit and keras-hub contenders (TensorFlow or JAX backend).

Inference is `model.predict_on_batch`, training `model.train_on_batch`: the calls a Keras user
makes, each returning NumPy (so each step has finished when it returns, on a GPU too). `--xla`
is `model.compile(jit_compile=True)`, `--no-xla` `jit_compile=False`, neither Keras' "auto"
(no XLA on a CPU). Lower precision is the global dtype policy ("mixed_bfloat16"), set before
the model is built.
"""

import importlib
import os

from benchmarks.contenders import common

PRECISIONS = ("fp32", "bf16")  # int8: keras_vit only


def setup(args, library):
    """Imports the backend, Keras and `library` for `args.device` and `args.precision`; returns
    their versions."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ["KERAS_BACKEND"] = args.backend
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = "-1"  # before the backend is imported
    import keras

    if args.precision == "bf16":
        keras.config.set_dtype_policy("mixed_bfloat16")
    versions = {library: importlib.import_module(library).__version__, "keras": keras.__version__}
    if args.backend == "jax":
        import jax

        if args.device == "gpu" and not jax.devices("gpu"):
            raise RuntimeError("--device gpu, but JAX sees no GPU.")
        return dict(versions, jax=jax.__version__, backend="jax",
                    device=str(jax.devices()[0].device_kind))
    import tensorflow as tf

    if args.device == "gpu" and not tf.config.list_physical_devices("GPU"):
        raise RuntimeError(
            "--device gpu, but TensorFlow sees no GPU (a CUDA build is needed: "
            "`pip install tensorflow[and-cuda]`)."
        )
    threads = tf.config.threading.get_intra_op_parallelism_threads() or os.cpu_count()
    return dict(versions, tensorflow=tf.__version__, intra_op_threads=threads)


def require_xla(model, args):
    """Refuses a silent fall-back from XLA: Keras turns `jit_compile=True` off, with only a
    warning, when a layer does not support XLA, and a measurement labelled XLA would be without
    it."""
    if args.xla and not model.jit_compile:
        raise RuntimeError(
            f"--xla: Keras turned jit_compile off for {model.name} (a layer has "
            "supports_jit=False), so this would not measure XLA."
        )


def compile_model(model, args, **kwargs):
    """`model.compile(**kwargs)` with the `jit_compile` that `args` asks for: on JAX always XLA;
    else `--xla`/`--no-xla`, or Keras' "auto"."""
    jit_compile = True if args.backend == "jax" else "auto" if args.xla is None else args.xla
    model.compile(jit_compile=jit_compile, **kwargs)
    require_xla(model, args)


def inference_step(model, args):
    """A synchronous forward pass of one batch through `model`, compiled as `args` asks."""
    import keras

    compile_model(model, args)
    images = keras.ops.convert_to_tensor(common.random_batch(args)[0])
    return lambda: model.predict_on_batch(images)


def training_step(model, args):
    """A synchronous training step of the compiled `model` on one batch of random images and
    labels."""
    import keras

    images, labels = (keras.ops.convert_to_tensor(a) for a in common.random_batch(args))
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
