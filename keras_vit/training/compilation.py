"""How a model is compiled for training: XLA or not, the compile with Keras' fixes, the training
state built before the first step, and a persistent compilation cache.

Whether a step compiles with XLA (`jit_compile=None`) is `keras_vit.execution.choose`'s
measured table: the faster runtime for the device, the CPU's features and the precision.
Where XLA does not work it is off whatever the table says: under MirroredStrategy over
several devices, Keras' XLA-compiled step reads the other replicas' variables across devices
and fails ("Trying to access resource ... located in device ... CPU:1 from device ... CPU:0");
under MultiWorkerMirroredStrategy on CPUs XLA has no collectives ("Collectives are not yet
implemented for CPU devices when compiling with XLA"); and under
`tf.config.experimental.enable_op_determinism()`, which Keras does not combine with XLA
(TPUStrategy always compiles with XLA).

A persistent compilation cache keeps compiled XLA programs on disk across processes, so that
a second run of the same training (a resume, the next experiment of a sweep) skips the
compilation of its steps. JAX has one that works (`jax_compilation_cache_dir`). TensorFlow
2.21's persistent XLA cache (`TF_XLA_FLAGS=--tf_xla_persistent_cache_directory`) writes entries
it then fails to read back (BENCHMARKS.md), so it is not offered.
"""

import keras

from keras_vit import execution, framework
from keras_vit.fileio import check_writable_dir
from keras_vit.parallel import tf_distribute
from keras_vit.training.losses import SparseCategoricalCrossentropy
from keras_vit.training.state import build_training_state


def default_jit_compile(strategy=None, policy=None):
    """Whether a training step compiles with XLA by default under `strategy` for a model of
    dtype `policy` (`keras_vit.execution.choose`, see the module docstring)."""
    return execution.choose(policy, strategy or tf_distribute.current_strategy())[0]


def jit_choice(model, jit_compile=None):
    """`(jit_compile, why)`: whether `model` trains with XLA, and why: `jit_compile` as asked,
    else (None) the measured default for the model's device, precision and strategy."""
    if jit_compile is not None:
        return jit_compile, f"asked for (jit_compile={jit_compile})"
    strategy = tf_distribute.model_strategy(model) or tf_distribute.current_strategy()
    return execution.choose(model.dtype_policy, strategy)


def compile_model(model, optimizer, label_smoothing=0.0, jit_compile=None, metrics=("accuracy",),
                  steps_per_execution=1):
    """Compiles `model` for classification with integer labels, or a self-supervised model
    (one with `self_supervised = True`, as `keras_vit.pretraining.MaskedPatchModel`, whose
    `compute_loss` is its objective) with no loss or metric of its own.

    Call it under the strategy's scope when training distributed. Under mixed float16
    Keras wraps the optimizer in a `LossScaleOptimizer` (dynamic loss scaling). It applies
    the fixes of `keras_vit.framework` for Keras under tf.distribute (gradients summed across
    replicas before they are clipped; `fit` under multi-worker MirroredStrategy), and builds
    the training state before the first step (`build_training_state`).

    Args:
        model: a `keras.Model` with float32 logits.
        optimizer: a `keras.optimizers.Optimizer` (e.g. from `finetune_optimizer`).
        label_smoothing: float in [0, 1). Defaults to 0.
        jit_compile: bool or None. XLA; None picks the measured default for the model's
            device, precision and strategy (`keras_vit.execution.choose`).
        metrics: sequence of Keras metrics. Defaults to ("accuracy",).
        steps_per_execution: int. Steps per compiled call. Defaults to 1.

    Returns:
        The model.
    """
    if jit_compile is None:
        jit_compile = jit_choice(model)[0]
    classifier = not getattr(model, "self_supervised", False)
    model.compile(
        optimizer=optimizer,
        loss=SparseCategoricalCrossentropy(label_smoothing) if classifier else None,
        metrics=list(metrics) if classifier else None,
        jit_compile=jit_compile,
        steps_per_execution=steps_per_execution,
    )
    if keras.backend.backend() == "tensorflow":  # the fixes are for Keras' TensorFlow trainer
        framework.reduce_gradients_before_clipping(model.optimizer)
        if tf_distribute.is_multiworker(model.distribute_strategy):
            framework.enable_multiworker_fit(model)
        elif model.distribute_strategy.num_replicas_in_sync > 1:
            framework.build_from_one_replica(model)
    build_training_state(model)
    return model


def enable_compilation_cache(directory):
    """Keeps every XLA program this process compiles in `directory` and reuses those that
    another process compiled there (JAX's persistent compilation cache).

    Args:
        directory: str or path. Created if missing; shared safely between runs and processes.

    Raises:
        ValueError: on a backend other than JAX, or an unwritable directory.
    """
    if keras.backend.backend() != "jax":
        raise ValueError(
            "A persistent compilation cache needs the JAX backend (KERAS_BACKEND=jax, or "
            f"`keras-vit train --backend jax`). Received backend {keras.backend.backend()!r}.")
    directory = check_writable_dir(directory, "Compilation cache folder")
    import jax  # optional (the JAX backend's), and installed since that backend is running

    jax.config.update("jax_compilation_cache_dir", directory)
    # Cache every program, however quick to compile (JAX's default skips those under 1 s).
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return directory
