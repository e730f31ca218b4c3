"""The Keras side of the keras_vit and keras-hub contenders and of the probes.

A step is `predict_on_batch` or `train_on_batch`, which return NumPy, so that each step has
finished when it returns. `--xla` is `jit_compile=True`, `--no-xla` False, neither Keras' "auto";
bf16 is the global "mixed_bfloat16" policy, set before the model is built.
"""

import importlib
import os

from benchmarks.contenders import common

PRECISIONS = ("fp32", "bf16")  # int8: keras_vit only


def configure(backend=None, device=None, precision="fp32"):
    """Imports Keras on `backend` (default: Keras' choice), with the GPUs hidden for `device`
    "cpu", under the mixed_bfloat16 policy for `precision` "bf16"; returns the keras module."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if backend:
        os.environ["KERAS_BACKEND"] = backend
    if device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = "-1"  # before the backend is imported
    import keras

    if precision == "bf16":
        keras.config.set_dtype_policy("mixed_bfloat16")
    return keras


def setup(args, library):
    """Keras as `args` asks, and `library` imported; returns their versions."""
    keras = configure(args.backend, args.device, args.precision)
    versions = {library: importlib.import_module(library).__version__, "keras": keras.__version__}
    if args.backend == "jax":
        import jax

        if args.device == "gpu" and not jax.devices("gpu"):
            raise RuntimeError("--device gpu, but JAX sees no GPU.")
        return dict(versions, jax=jax.__version__, backend="jax",
                    device=str(jax.devices()[0].device_kind))
    import tensorflow as tf

    if args.device == "gpu" and not tf.config.list_physical_devices("GPU"):
        raise RuntimeError("--device gpu, but TensorFlow sees no GPU (a CUDA build is needed: "
                           "`pip install tensorflow[and-cuda]`).")
    threads = tf.config.threading.get_intra_op_parallelism_threads() or os.cpu_count()
    return dict(versions, tensorflow=tf.__version__, intra_op_threads=threads)


def require_xla(model, args):
    """Refuses Keras' silent fall-back from XLA (it turns `jit_compile=True` off, with a warning,
    when a layer does not support XLA): a measurement labelled XLA would be without it."""
    if args.xla and not model.jit_compile:
        raise RuntimeError(f"--xla: Keras turned jit_compile off for {model.name} (a layer has "
                           "supports_jit=False), so this would not measure XLA.")


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
    images = keras.ops.convert_to_tensor(common.batch_for(args)[0])
    return lambda: model.predict_on_batch(images)


def training_step(model, args):
    """A synchronous training step of the compiled `model` on one random batch."""
    import keras

    images, labels = (keras.ops.convert_to_tensor(a) for a in common.batch_for(args))
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
