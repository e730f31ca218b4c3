"""The paper's training recipes for `model.fit`: optimizers, schedules, compile, callbacks.

```python
model = keras_vit.ViT_B16(num_classes=10, image_size=384, pretrained=...)
keras_vit.training.compile_finetune(model, learning_rate=0.003, total_steps=10_000,
                                    accumulation_steps=8)     # batch 64 x 8 = 512
model.fit(train.dataset, steps_per_epoch=train.steps_per_epoch, epochs=...,
          callbacks=keras_vit.training.training_callbacks("runs/cifar10"))
```

- Fine-tuning (paper appendix B.1.1): SGD with momentum 0.9, no weight decay, gradients
  clipped at global norm 1, linear warmup (500 steps) then cosine decay to 0, batch 512
  (reached with gradient accumulation), learning rate from {0.001, 0.003, 0.01, 0.03}.
- Pre-training (paper appendix B.1): Adam with b1 0.9, b2 0.999, decoupled weight decay 0.1
  (Keras `AdamW`: `w -= lr * wd * w`, as the Flax optimizer the paper used), linear warmup
  (10k steps) then linear decay to 1e-5, batch 4096, dropout per variant (the variant
  table's `dropout_rate`).

Schedules count optimizer updates: under gradient accumulation (Keras evaluates the schedule
at every micro-batch) `WarmupDecay(steps_per_update=k)` divides the counter by k, so that
update n uses the learning rate of step n exactly as without accumulation.

XLA (`jit_compile=True`) is on by default where it works in Keras 3.15 / TensorFlow 2.21: on
one device (CPU or GPU, default strategy or OneDeviceStrategy). Under MirroredStrategy over
several devices, Keras' XLA-compiled step reads the other replicas' variables across devices
and fails ("Trying to access resource ... located in device ... CPU:1 from device ... CPU:0");
under MultiWorkerMirroredStrategy on CPUs XLA has no collectives ("Collectives are not yet
implemented for CPU devices when compiling with XLA"). The default is therefore False with
more than one replica (TPUStrategy always compiles with XLA), and under
`tf.config.experimental.enable_op_determinism()`, which Keras does not combine with XLA.
"""

import json
import math
import os
import shutil

import keras
import numpy as np
from keras import ops

from keras_vit import checkpoint
from keras_vit._checks import check_int

_register = keras.saving.register_keras_serializable(package="keras_vit")

# Fine-tuning, paper appendix B.1.1 and vit_jax configs/common.py.
FINETUNE_MOMENTUM = 0.9
FINETUNE_GLOBAL_CLIPNORM = 1.0
FINETUNE_WARMUP_STEPS = 500
FINETUNE_BATCH_SIZE = 512
FINETUNE_LEARNING_RATES = (0.001, 0.003, 0.01, 0.03)
# Pre-training, paper appendix B.1.
PRETRAIN_BETA_1 = 0.9
PRETRAIN_BETA_2 = 0.999
PRETRAIN_WEIGHT_DECAY = 0.1
PRETRAIN_WARMUP_STEPS = 10_000
PRETRAIN_BATCH_SIZE = 4096
# vit_jax `create_learning_rate_schedule(linear_end=1e-5)`: the linear decay's final value.
LINEAR_DECAY_END = 1e-5
DECAYS = ("cosine", "linear")
PRECISIONS = {"float32": "float32", "bfloat16": "mixed_bfloat16", "float16": "mixed_float16"}




def _check_positive_number(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"`{name}` must be a positive number. Received: {name}={value!r}")


@_register
class WarmupDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup, then cosine or linear decay: vit_jax `create_learning_rate_schedule`.

    At optimizer step s (counted from 0), with p = clip((s - warmup) / (total - warmup), 0, 1):
    cosine: lr * (1 + cos(pi p)) / 2; linear: end + (lr - end) (1 - p); both multiplied by
    min(1, s / warmup) when warmup > 0 (so step 0 has learning rate 0, as in vit_jax).

    Args:
        learning_rate: float. Peak (base) learning rate.
        total_steps: int. Optimizer steps of the whole run.
        warmup_steps: int. Linear warmup steps. Defaults to 0.
        decay: str. "cosine" or "linear". Defaults to "cosine".
        end_learning_rate: float. Final value of the linear decay. Defaults to 1e-5.
        steps_per_update: int. Micro-batches per optimizer update under gradient
            accumulation: the step counter Keras passes is divided by it. Defaults to 1.

    Example:
    >>> schedule = WarmupDecay(0.03, total_steps=10_000, warmup_steps=500)
    >>> float(schedule(500))  # doctest: +SKIP
    0.03
    """

    def __init__(self, learning_rate, total_steps, warmup_steps=0, decay="cosine",
                 end_learning_rate=LINEAR_DECAY_END, steps_per_update=1):
        _check_positive_number("learning_rate", learning_rate)
        check_int("total_steps", total_steps, 1)
        check_int("warmup_steps", warmup_steps, 0)
        check_int("steps_per_update", steps_per_update, 1)
        if warmup_steps >= total_steps:
            raise ValueError(
                f"warmup_steps {warmup_steps} must be smaller than total_steps {total_steps}."
            )
        if decay not in DECAYS:
            raise ValueError(f"Unknown decay {decay!r}. Expected one of {', '.join(DECAYS)}.")
        self.learning_rate = learning_rate
        self.total_steps = total_steps
        self.warmup_steps = warmup_steps
        self.decay = decay
        self.end_learning_rate = end_learning_rate
        self.steps_per_update = steps_per_update

    def __call__(self, step):
        step = ops.cast(ops.floor_divide(step, self.steps_per_update), "float32")
        progress = (step - self.warmup_steps) / float(self.total_steps - self.warmup_steps)
        progress = ops.clip(progress, 0.0, 1.0)
        if self.decay == "cosine":
            lr = self.learning_rate * 0.5 * (1.0 + ops.cos(math.pi * progress))
        else:
            end = self.end_learning_rate
            lr = end + (self.learning_rate - end) * (1.0 - progress)
        if self.warmup_steps:
            lr = lr * ops.minimum(1.0, step / self.warmup_steps)
        return lr

    def get_config(self):
        return dict(
            learning_rate=self.learning_rate,
            total_steps=self.total_steps,
            warmup_steps=self.warmup_steps,
            decay=self.decay,
            end_learning_rate=self.end_learning_rate,
            steps_per_update=self.steps_per_update,
        )


def accumulation_steps(target_batch_size, batch_size):
    """Micro-batches per update so that `batch_size` reaches `target_batch_size` (e.g. 512).

    Raises:
        ValueError: if `target_batch_size` is not a multiple of `batch_size`.
    """
    check_int("batch_size", batch_size, 1)
    check_int("target_batch_size", target_batch_size, 1)
    if target_batch_size % batch_size:
        raise ValueError(
            f"target_batch_size {target_batch_size} is not a multiple of batch_size "
            f"{batch_size}. Expected a batch size dividing {target_batch_size}."
        )
    return target_batch_size // batch_size


def finetune_optimizer(learning_rate=0.003, total_steps=10_000, warmup_steps=FINETUNE_WARMUP_STEPS,
                       accumulation_steps=1, momentum=FINETUNE_MOMENTUM,
                       global_clipnorm=FINETUNE_GLOBAL_CLIPNORM):
    """The paper's fine-tuning optimizer: SGD momentum 0.9, clip 1.0, warmup + cosine.

    Args:
        learning_rate: float. Peak learning rate; the paper sweeps
            `FINETUNE_LEARNING_RATES`. Defaults to 0.003.
        total_steps: int. Optimizer updates (10k for CIFAR, 20k for ImageNet in the paper).
        warmup_steps: int. Defaults to 500.
        accumulation_steps: int. Micro-batches averaged per update (Keras'
            `gradient_accumulation_steps`); the clipping applies to the averaged gradient.
            Defaults to 1.
        momentum: float. Defaults to 0.9.
        global_clipnorm: float or None. Defaults to 1.0.

    Returns:
        A `keras.optimizers.SGD` without weight decay.
    """
    check_int("accumulation_steps", accumulation_steps, 1)
    return keras.optimizers.SGD(
        learning_rate=WarmupDecay(learning_rate, total_steps, warmup_steps, "cosine",
                                  steps_per_update=accumulation_steps),
        momentum=momentum,
        global_clipnorm=global_clipnorm,
        gradient_accumulation_steps=accumulation_steps if accumulation_steps > 1 else None,
    )


def pretrain_optimizer(learning_rate=1e-3, total_steps=100_000, warmup_steps=PRETRAIN_WARMUP_STEPS,
                       weight_decay=PRETRAIN_WEIGHT_DECAY, accumulation_steps=1,
                       beta_1=PRETRAIN_BETA_1, beta_2=PRETRAIN_BETA_2, global_clipnorm=None):
    """The paper's pre-training optimizer: Adam (0.9, 0.999), decoupled weight decay 0.1,
    linear warmup then linear decay.

    Args:
        learning_rate: float. Peak learning rate. Defaults to 1e-3.
        total_steps: int. Optimizer updates.
        warmup_steps: int. Defaults to 10k (use fewer for short runs).
        weight_decay: float. Decoupled, scaled by the learning rate. Defaults to 0.1.
        accumulation_steps: int. Defaults to 1.
        beta_1, beta_2: floats. Defaults to 0.9 and 0.999.
        global_clipnorm: float or None. Defaults to None (the paper clips when fine-tuning).

    Returns:
        An `AdamW` (`keras.optimizers.AdamW` in fewer graph operations).
    """
    check_int("accumulation_steps", accumulation_steps, 1)
    return AdamW(
        learning_rate=WarmupDecay(learning_rate, total_steps, warmup_steps, "linear",
                                  steps_per_update=accumulation_steps),
        weight_decay=weight_decay,
        beta_1=beta_1,
        beta_2=beta_2,
        global_clipnorm=global_clipnorm,
        gradient_accumulation_steps=accumulation_steps if accumulation_steps > 1 else None,
    )


@_register
class AdamW(keras.optimizers.AdamW):
    """`keras.optimizers.AdamW`, the same update built from fewer graph operations.

    Keras' AdamW recomputes the bias-corrected step size, the learning rate (a schedule is
    evaluated again for every variable) and the weight-decay factor per variable, and routes
    each variable through `tf.distribute`'s update machinery: about 45 TensorFlow operations
    per variable, 9,408 for ViT-B/16, which Python must create at every trace and XLA must
    compile. On TensorFlow outside any distribution strategy, this class computes those
    scalars once per step and updates each float32/float64 variable with one fused
    `ResourceApplyAdam` kernel (the same formula as Keras: `m += (g - m)(1 - b1)`,
    `v += (g^2 - v)(1 - b2)`, `w -= alpha m / (sqrt(v) + eps)` with
    `alpha = lr sqrt(1 - b2^t) / (1 - b1^t)`), after the decoupled decay `w -= lr wd w`:
    1,628 operations for ViT-B/16 (constant learning rate), and with `build_training_state`
    the first ViT-B/16 step on the project's CPU machine takes 14.7 s instead of 22.4 s
    (BENCHMARKS.md). The kernel computes `1 - b2` in float32 (0.00099998713, Keras 0.001):
    steps differ from Keras' in the sixth significant digit. Elsewhere (under a strategy,
    including OneDeviceStrategy; other backends; `amsgrad`) it is Keras' own AdamW, and
    sparse gradients and float16/bfloat16 variables get Keras' per-variable update. Arguments
    and `get_config` are those of `keras.optimizers.AdamW`.

    ```python
    optimizer = keras_vit.training.AdamW(learning_rate=1e-3, weight_decay=0.1)
    ```
    """

    def _fused(self):
        if keras.backend.backend() != "tensorflow" or self.amsgrad:
            return False
        import tensorflow as tf

        # Variables created under a strategy (even when applied outside it) are distributed:
        # Keras' path updates every copy, the fused kernel would update one.
        default = tf.distribute.get_strategy()
        return not tf.distribute.has_strategy() and getattr(
            self, "_distribution_strategy", default) is default

    def _apply_weight_decay(self, variables):
        if not self._fused():
            super()._apply_weight_decay(variables)
        # else: applied per variable in `_backend_update_step`, before its Adam step

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        if not self._fused():
            return super()._backend_update_step(grads, trainable_variables, learning_rate)
        import tensorflow as tf

        scalars = {}
        for grad, variable in zip(grads, trainable_variables):
            dtype = variable.dtype
            if dtype not in scalars:
                lr = ops.cast(learning_rate, dtype)
                step = ops.cast(self.iterations + 1, dtype)
                beta_1, beta_2 = ops.cast(self.beta_1, dtype), ops.cast(self.beta_2, dtype)
                alpha = lr * ops.sqrt(1 - ops.power(beta_2, step)) / (1 - ops.power(beta_1, step))
                decay = lr * ops.cast(self.weight_decay or 0.0, dtype)
                scalars[dtype] = (alpha, decay, beta_1, beta_2, ops.cast(self.epsilon, dtype),
                                  ops.zeros((), dtype))
            alpha, decay, beta_1, beta_2, epsilon, zero = scalars[dtype]
            # Keras' TensorFlow path matches exclusions against the tf.Variable's full name.
            if self.weight_decay and self._use_weight_decay(getattr(variable, "value", variable)):
                self.assign_sub(variable, variable * decay)  # decoupled: w -= lr wd w
            distributed = isinstance(getattr(variable, "value", variable),
                                     tf.distribute.DistributedValues)
            if isinstance(grad, tf.IndexedSlices) or dtype not in ("float32", "float64") \
                    or distributed:
                # Keras' own update: sparse rows; in 16-bit dtypes 1 - b2 would round off;
                # a distributed variable has one copy per replica.
                self.update_step(grad, variable, learning_rate)
                continue
            index = self._get_variable_index(variable)
            # With beta powers 0 the kernel's own bias correction is 1: its step is `alpha`.
            tf.raw_ops.ResourceApplyAdam(
                var=_handle(variable),
                m=_handle(self._momentums[index]),
                v=_handle(self._velocities[index]),
                beta1_power=zero,
                beta2_power=zero,
                lr=alpha,
                beta1=beta_1,
                beta2=beta_2,
                epsilon=epsilon,
                grad=ops.cast(grad, dtype),
            )


def _handle(variable):
    """The resource handle of a Keras (or TensorFlow) variable."""
    return getattr(variable, "value", variable).handle


@_register
class SparseCategoricalCrossentropy(keras.losses.Loss):
    """Cross-entropy from logits and integer labels, with optional label smoothing.

    Keras' own sparse cross-entropy has no label smoothing; this one smooths the one-hot
    target to `(1 - s) * onehot + s / num_classes`, as `CategoricalCrossentropy` does.

    Args:
        label_smoothing: float in [0, 1). Defaults to 0.
    """

    def __init__(self, label_smoothing=0.0, name="sparse_categorical_crossentropy", **kwargs):
        if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, (int, float)) \
                or not 0 <= label_smoothing < 1:
            raise ValueError(
                f"`label_smoothing` must be a number in [0, 1). Received: "
                f"label_smoothing={label_smoothing!r}"
            )
        super().__init__(name=name, **kwargs)
        self.label_smoothing = label_smoothing

    def call(self, y_true, y_pred):
        # y_true = [B] integer labels, y_pred = [B, K] logits
        y_true = ops.reshape(ops.cast(y_true, "int32"), (-1,))
        if not self.label_smoothing:
            return keras.losses.sparse_categorical_crossentropy(y_true, y_pred, from_logits=True)
        onehot = ops.one_hot(y_true, ops.shape(y_pred)[-1], dtype=y_pred.dtype)  # [B, K]
        return keras.losses.categorical_crossentropy(
            onehot, y_pred, from_logits=True, label_smoothing=self.label_smoothing
        )

    def get_config(self):
        return dict(super().get_config(), label_smoothing=self.label_smoothing)


def set_precision(precision):
    """Sets Keras' global dtype policy; call before building the model.

    Args:
        precision: str. "float32", "bfloat16" (mixed, bf16 compute) or "float16" (mixed,
            fp16 compute; `compile_model` then uses dynamic loss scaling).

    Returns:
        str. The policy name set.
    """
    if precision not in PRECISIONS:
        raise ValueError(
            f"Unknown precision {precision!r}. Expected one of {', '.join(PRECISIONS)}."
        )
    keras.config.set_dtype_policy(PRECISIONS[precision])
    return PRECISIONS[precision]


def default_jit_compile(strategy=None):
    """Whether XLA works for `fit` under `strategy` here (see the module docstring)."""
    import tensorflow as tf
    from tensorflow.python.framework.config import is_op_determinism_enabled

    if is_op_determinism_enabled():
        return False  # Keras turns XLA off under op determinism (not every op supports it)
    strategy = strategy or tf.distribute.get_strategy()
    return strategy.num_replicas_in_sync == 1 or isinstance(strategy, tf.distribute.TPUStrategy)


def compile_model(model, optimizer, label_smoothing=0.0, jit_compile=None, metrics=("accuracy",),
                  steps_per_execution=1):
    """Compiles `model` for classification with integer labels.

    Call it under the strategy's scope when training distributed. Under mixed float16
    Keras wraps the optimizer in a `LossScaleOptimizer` (dynamic loss scaling). It applies
    the fixes of `keras_vit.distribute` for Keras 3.15 under tf.distribute: gradients are
    summed across replicas before they are clipped (`reduce_gradients_before_clipping`), and
    `fit` works under multi-worker MirroredStrategy (`enable_multiworker_fit`).

    Args:
        model: a `keras.Model` with float32 logits.
        optimizer: a `keras.optimizers.Optimizer` (e.g. from `finetune_optimizer`).
        label_smoothing: float in [0, 1). Defaults to 0.
        jit_compile: bool or None. XLA; None picks `default_jit_compile` of the model's
            strategy.
        metrics: sequence of Keras metrics. Defaults to ("accuracy",).
        steps_per_execution: int. Steps per compiled call. Defaults to 1.

    Returns:
        The model.
    """
    from keras_vit import distribute

    if jit_compile is None:
        jit_compile = default_jit_compile(model.distribute_strategy)
    model.compile(
        optimizer=optimizer,
        loss=SparseCategoricalCrossentropy(label_smoothing),
        metrics=list(metrics),
        jit_compile=jit_compile,
        steps_per_execution=steps_per_execution,
    )
    distribute.reduce_gradients_before_clipping(model.optimizer)
    distribute.enable_multiworker_fit(model)
    build_training_state(model)
    return model


def build_training_state(model, labels=None):
    """Creates the optimizer's, loss's and metrics' variables of a compiled `model` now.

    Without a distribution strategy Keras 3.15 creates them inside the first traced training
    step, and TensorFlow traces a `tf.function` that created variables a second time: for
    ViT-B/16 on the project's CPU machine that second trace cost 9 s of the first step
    (31.6 s -> 22.4 s, `python -m benchmarks.first_step`). `compile_model` calls this; call it
    after your own `model.compile` to get the same. Under a strategy it builds in the
    strategy's scope, as Keras would. A model whose layers are not all built (a Sequential
    without an `Input`, say) is left for Keras to build at the first step.

    Args:
        model: a compiled `keras.Model`.
        labels: `keras.KerasTensor` (or anything with `shape` and `dtype`) describing a batch
            of labels, for building the loss and metrics. Defaults to integer class ids of
            shape `[B]` (what `compile_model`'s loss takes); pass
            `keras.KerasTensor((None, K), "float32")` for one-hot labels.

    Returns:
        The model.
    """
    if getattr(model, "optimizer", None) is None:
        raise ValueError(f"Model {model.name!r} is not compiled: call `model.compile` first.")
    if not all(layer.built for layer in model._flatten_layers()):
        return model  # its variables do not all exist yet: Keras builds at the first step
    with model.distribute_strategy.scope():
        inputs = getattr(model, "inputs", None)
        if inputs and len(inputs) == 1 and hasattr(model, "_symbolic_build"):
            # Keras' own build of the model, compiled loss, metrics and optimizer state from
            # symbolic tensors.
            if labels is None:
                labels = keras.KerasTensor((inputs[0].shape[0],), "int32")
            model._symbolic_build(data_batch=(inputs[0], labels, None))
        elif not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)
    return model


def compile_finetune(model, learning_rate=0.003, total_steps=10_000,
                     warmup_steps=FINETUNE_WARMUP_STEPS, accumulation_steps=1, label_smoothing=0.0,
                     jit_compile=None):
    """`compile_model` with `finetune_optimizer`: the paper's fine-tuning recipe in one call."""
    optimizer = finetune_optimizer(learning_rate, total_steps, warmup_steps, accumulation_steps)
    return compile_model(model, optimizer, label_smoothing, jit_compile)


def compile_pretrain(model, learning_rate=1e-3, total_steps=100_000,
                     warmup_steps=PRETRAIN_WARMUP_STEPS, weight_decay=PRETRAIN_WEIGHT_DECAY,
                     accumulation_steps=1, label_smoothing=0.0, jit_compile=None):
    """`compile_model` with `pretrain_optimizer`: the paper's pre-training recipe in one call.

    Build the model with the variant's dropout (`keras_vit.create_model` does).
    """
    optimizer = pretrain_optimizer(learning_rate, total_steps, warmup_steps, weight_decay,
                                   accumulation_steps)
    return compile_model(model, optimizer, label_smoothing, jit_compile)


# --------------------------------------------------------------------------------------------
# Callbacks.


def check_writable_dir(path):
    """Creates `path` if needed and checks a file can be written there.

    Raises:
        ValueError: naming the directory, if it cannot be created or written.
    """
    path = os.fspath(path)
    try:
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, ".keras_vit_write_test")
        with open(probe, "w") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as e:
        raise ValueError(
            f"Checkpoint directory {path!r} is not writable ({e.strerror or e}). Expected a "
            "directory this process can create files in."
        ) from e
    return path


_LATEST = "latest.json"


def resume_epoch(backup_dir):
    """The epoch a run backed up in `backup_dir` resumes at: 0 if there is no backup.

    Build the training pipeline with `start_epoch=resume_epoch(backup_dir)` so that a
    resumed run sees the batches the uninterrupted run would have seen.
    """
    pointer = os.path.join(os.fspath(backup_dir), _LATEST)
    if not os.path.exists(pointer):
        return 0
    with open(pointer) as f:
        return int(json.load(f)["epoch"])


def _random_state(model):
    """The variables `save_weights` leaves out: the dropout layers' seed-generator states."""
    saved = {id(v) for v in model.weights}
    return [v for v in model.variables if id(v) not in saved]


class BackupAndRestore(keras.callbacks.BackupAndRestore):
    """Keras' `BackupAndRestore` with crash-safe writes, at epoch ends.

    Each backup (weights with optimizer state, the dropout layers' random-number state, which
    Keras' `save_weights` leaves out, and the epoch reached) is written to a fresh
    subfolder, then `latest.json` is replaced atomically to point at it: a process killed at
    any instant leaves the previous complete backup in use, never a half-written file or
    weights of one epoch with the counter of another (Keras' own callback writes
    `latest.weights.h5` and `training_metadata.json` one after the other, in place).

    Keras 3 resumes at epoch boundaries: a restarted `fit` starts at the beginning of the
    first epoch without a backup, from the weights saved at the end of the previous one.
    Backups are therefore taken at epoch ends only. The folder is removed when `fit`
    completes.

    Args:
        backup_dir: str. A folder used for nothing else.
    """

    def __init__(self, backup_dir):
        super().__init__(os.fspath(backup_dir), save_freq="epoch", delete_checkpoint=True)

    def on_train_begin(self, logs=None):
        self._load_model()

    def _load_model(self):
        pointer = os.path.join(self.backup_dir, _LATEST)
        if not os.path.exists(pointer):
            return
        with open(pointer) as f:
            state = json.load(f)
        if self.model.optimizer is not None and not self.model.optimizer.built:
            self.model.optimizer.build(self.model.trainable_variables)
        folder = os.path.join(self.backup_dir, state["dir"])
        self.model.load_weights(os.path.join(folder, "model.weights.h5"))
        with np.load(os.path.join(folder, "random_state.npz")) as saved:
            for i, variable in enumerate(_random_state(self.model)):
                variable.assign(saved[f"arr_{i}"])
        self.model._initial_epoch = state["epoch"]

    def _save_model(self):
        name = f"epoch-{self._current_epoch:06d}"
        final = os.path.join(self.backup_dir, name)
        staging = os.path.join(self.backup_dir, ".staging-" + name)
        for stale in (staging, final):
            shutil.rmtree(stale, ignore_errors=True)
        os.makedirs(staging)
        self.model.save_weights(os.path.join(staging, "model.weights.h5"))
        np.savez(os.path.join(staging, "random_state.npz"),
                 *[keras.ops.convert_to_numpy(v) for v in _random_state(self.model)])
        os.replace(staging, final)
        state = json.dumps({"epoch": self._current_epoch, "dir": name}).encode()
        checkpoint.atomic_write(os.path.join(self.backup_dir, _LATEST), lambda f: f.write(state))
        for entry in os.listdir(self.backup_dir):
            if entry.startswith("epoch-") and entry != name:
                shutil.rmtree(os.path.join(self.backup_dir, entry), ignore_errors=True)


class BestCheckpoint(keras.callbacks.Callback):
    """Writes the model as an official-layout `.npz` whenever `monitor` improves.

    The file loads with `keras_vit.checkpoint.load_params(model, read_npz(path))` (and with
    `keras_vit.load_pretrained`). Written atomically, by the chief worker only.

    Args:
        path: str. The `.npz` file to write.
        monitor: str. A log name, e.g. "val_accuracy" or "val_loss". Defaults to
            "val_accuracy".
        mode: "max", "min" or "auto" (max for names containing "acc", min otherwise).
    """

    def __init__(self, path, monitor="val_accuracy", mode="auto"):
        super().__init__()
        if mode not in ("auto", "max", "min"):
            raise ValueError(f"Unknown mode {mode!r}. Expected 'auto', 'max' or 'min'.")
        self.path = os.fspath(path)
        self.monitor = monitor
        self.sign = 1.0 if mode == "max" or (mode == "auto" and "acc" in monitor) else -1.0
        self.best = None
        self.best_epoch = None

    def on_epoch_end(self, epoch, logs=None):
        from keras_vit import distribute

        value = (logs or {}).get(self.monitor)
        if value is None:
            raise ValueError(
                f"BestCheckpoint monitors {self.monitor!r}, which is not among the logs "
                f"{sorted(logs or {})}. Expected validation data for 'val_*' names."
            )
        value = float(value)
        if self.best is None or self.sign * value > self.sign * self.best:
            self.best, self.best_epoch = value, epoch
            if distribute.is_chief():
                checkpoint.save_npz(self.model, self.path)


def _tensorboard_installed():
    import importlib.util

    return importlib.util.find_spec("tensorboard") is not None


def training_callbacks(checkpoint_dir, monitor="val_accuracy", backup=True, best=True,
                       tensorboard=None, terminate_on_nan=True):
    """The callbacks of a fault-tolerant run, writing under `checkpoint_dir`.

    - `backup/`: `BackupAndRestore` (resume after a crash by running the same command);
    - `best.npz`: `BestCheckpoint` on `monitor` (needs validation data);
    - `logs/`: TensorBoard event files (`tensorboard --logdir checkpoint_dir/logs`); with
      `tensorboard=None` (the default) only if the `tensorboard` package is installed;
    - `TerminateOnNaN`: stops at the first NaN loss.

    Under multi-worker training (TF_CONFIG) each worker backs up to `backup/worker-<i>` and
    the workers other than the chief log to `logs/worker-<i>`.

    Raises:
        ValueError: if `checkpoint_dir` is not writable, or `tensorboard=True` without the
            `tensorboard` package (before any training starts).
    """
    from keras_vit import distribute

    checkpoint_dir = check_writable_dir(checkpoint_dir)
    if tensorboard is None:
        tensorboard = _tensorboard_installed()
    elif tensorboard and not _tensorboard_installed():
        raise ValueError("tensorboard=True needs the tensorboard package: pip install tensorboard")
    callbacks = []
    if terminate_on_nan:
        callbacks.append(keras.callbacks.TerminateOnNaN())
    if backup:
        callbacks.append(BackupAndRestore(backup_dir(checkpoint_dir)))
    if best:
        callbacks.append(BestCheckpoint(os.path.join(checkpoint_dir, "best.npz"), monitor))
    if tensorboard:
        logs = os.path.join(checkpoint_dir, "logs")
        if not distribute.is_chief():
            logs = os.path.join(logs, "{}-{}".format(*distribute.worker_index()))
        callbacks.append(keras.callbacks.TensorBoard(logs))
    return callbacks


def backup_dir(checkpoint_dir):
    """The backup folder `training_callbacks` uses for this process: `backup/`, or
    `backup/<task type>-<index>` when TF_CONFIG names several workers."""
    from keras_vit import distribute

    path = os.path.join(os.fspath(checkpoint_dir), "backup")
    if distribute._tf_config_workers() > 1:
        path = os.path.join(path, "{}-{}".format(*distribute.worker_index()))
    return path
