"""The paper's training recipes: optimizers, schedules, loss, compile.

`keras_vit.training.fit` applies them; `compile_finetune` / `compile_pretrain` compile a model
the same way for your own `model.fit`.

- Fine-tuning (paper appendix B.1.1): SGD with momentum 0.9, no weight decay, gradients
  clipped at global norm 1, linear warmup (500 steps) then cosine decay to 0, batch 512
  (reached with gradient accumulation), learning rate from {0.001, 0.003, 0.01, 0.03}.
- Pre-training (paper appendix B.1): Adam with b1 0.9, b2 0.999, decoupled weight decay 0.1
  (Keras `AdamW`: `w -= lr * wd * w`, as the Flax optimizer the paper used), linear warmup
  (10k steps) then linear decay to 1e-5, batch 4096, dropout per variant (the variant
  table's `dropout_rate`).
- Self-supervised pre-training by masked patch prediction (paper appendix B.1.2, "pretrain_mpp",
  for `keras_vit.pretraining.masked_patch_model`): Adam with b1 0.9, b2 0.999 (no weight
  decay is named there), base learning rate 2e-4, linear warmup (10k steps) then cosine
  decay, batch 4096, 1M steps.

Schedules count optimizer updates: under gradient accumulation (Keras evaluates the schedule
at every micro-batch) `WarmupDecay(steps_per_update=k)` divides the counter by k, so that
update n uses the learning rate of step n exactly as without accumulation.

The recipes compile with `keras_vit.training.compilation.compile_model` (XLA or not, Keras'
fixes under tf.distribute, the training state built before the first step).
"""

import math

import keras
from keras import ops

from keras_vit import execution
from keras_vit.training.compilation import compile_model
from keras_vit.training.optimizers import AdamW
from keras_vit.checks import (check_choice, check_int, check_learning_rate, check_number,
                              check_weight_decay)

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
# The one warm-up rule for runs shorter than the paper's: at most this fraction of the updates.
MAX_WARMUP_FRACTION = 0.1
# Masked patch prediction, paper appendix B.1.2.
MPP_LEARNING_RATE = 2e-4
MPP_BATCH_SIZE = 4096
MPP_STEPS = 1_000_000
RECIPES = ("finetune", "pretrain", "pretrain_mpp")
DEFAULT_LEARNING_RATES = {"finetune": 0.003, "pretrain": 1e-3, "pretrain_mpp": MPP_LEARNING_RATE}
# vit_jax `create_learning_rate_schedule(linear_end=1e-5)`: the linear decay's final value.
LINEAR_DECAY_END = 1e-5
DECAYS = ("cosine", "linear")




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
        end_learning_rate: float or None. Final value of the linear decay, at most the peak.
            Defaults to None: vit_jax's 1e-5, or the peak where it is smaller (vit_jax's
            rate would climb from it).
        steps_per_update: int. Micro-batches per optimizer update under gradient
            accumulation: the step counter Keras passes is divided by it. Defaults to 1.

    Examples:
    >>> schedule = WarmupDecay(0.03, total_steps=10_000, warmup_steps=500)
    >>> float(schedule(500))  # doctest: +SKIP
    0.03
    """

    def __init__(self, learning_rate, total_steps, warmup_steps=0, decay="cosine",
                 end_learning_rate=None, steps_per_update=1):
        self.learning_rate = check_learning_rate("learning_rate", learning_rate)
        self.total_steps = check_int("total_steps", total_steps, 1)
        self.warmup_steps = check_int("warmup_steps", warmup_steps, 0)
        self.steps_per_update = check_int("steps_per_update", steps_per_update, 1)
        if warmup_steps >= total_steps:
            raise ValueError(
                f"warmup_steps {warmup_steps} must be smaller than total_steps {total_steps}."
            )
        self.decay = check_choice("decay", decay, DECAYS)
        self.end_learning_rate = None if end_learning_rate is None else check_number(
            "end_learning_rate", end_learning_rate, 0.0, self.learning_rate, high_inclusive=True)

    def __call__(self, step):
        step = ops.cast(ops.floor_divide(step, self.steps_per_update), "float32")
        progress = (step - self.warmup_steps) / float(self.total_steps - self.warmup_steps)
        progress = ops.clip(progress, 0.0, 1.0)
        if self.decay == "cosine":
            lr = self.learning_rate * 0.5 * (1.0 + ops.cos(math.pi * progress))
        else:
            end = self.end_learning_rate
            if end is None:
                end = min(LINEAR_DECAY_END, self.learning_rate)
            lr = end + (self.learning_rate - end) * (1.0 - progress)
        if self.warmup_steps:
            lr = lr * ops.minimum(1.0, step / self.warmup_steps)
        return lr

    CONFIG_ARGS = ("learning_rate", "total_steps", "warmup_steps", "decay", "end_learning_rate",
                   "steps_per_update")

    def get_config(self):
        return {name: getattr(self, name) for name in self.CONFIG_ARGS}


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


def default_warmup_steps(recipe, total_updates):
    """The one warm-up rule: the recipe's warm-up (500 updates fine-tuning, 10k for both
    pre-training recipes, as in the paper), capped at `MAX_WARMUP_FRACTION` (10%) of the run's updates so that short
    runs spend most of their updates after it."""
    check_choice("recipe", recipe, RECIPES)
    paper = FINETUNE_WARMUP_STEPS if recipe == "finetune" else PRETRAIN_WARMUP_STEPS
    return min(paper, int(check_int("total_updates", total_updates, 1) * MAX_WARMUP_FRACTION))


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
                       beta_1=PRETRAIN_BETA_1, beta_2=PRETRAIN_BETA_2, global_clipnorm=None,
                       decay="linear"):
    """The paper's pre-training optimizer: Adam (0.9, 0.999), decoupled weight decay 0.1,
    linear warmup then linear decay (masked patch prediction: no weight decay, cosine decay).

    Args:
        learning_rate: float. Peak learning rate. Defaults to 1e-3.
        total_steps: int. Optimizer updates.
        warmup_steps: int. Defaults to 10k (use fewer for short runs).
        weight_decay: float. Decoupled, scaled by the learning rate. Defaults to 0.1.
        accumulation_steps: int. Defaults to 1.
        beta_1, beta_2: floats. Defaults to 0.9 and 0.999.
        global_clipnorm: float or None. Defaults to None (the paper clips when fine-tuning).
        decay: str. "linear" or "cosine" after the warmup. Defaults to "linear".

    Returns:
        A `keras_vit.training.AdamW` (plain Adam with `weight_decay=0`).
    """
    weight_decay = check_weight_decay(weight_decay)
    check_int("accumulation_steps", accumulation_steps, 1)
    return AdamW(
        learning_rate=WarmupDecay(learning_rate, total_steps, warmup_steps, decay,
                                  steps_per_update=accumulation_steps),
        weight_decay=weight_decay,
        beta_1=beta_1,
        beta_2=beta_2,
        global_clipnorm=global_clipnorm,
        gradient_accumulation_steps=accumulation_steps if accumulation_steps > 1 else None,
    )


def set_precision(precision):
    """Sets Keras' global dtype policy; call before building the model.

    Args:
        precision: str. "float32", "bfloat16" (mixed, bf16 compute) or "float16" (mixed,
            fp16 compute; `compile_model` then uses dynamic loss scaling).

    Returns:
        str. The policy name set.
    """
    policy = execution.policy_name(precision)
    keras.config.set_dtype_policy(policy)
    return policy


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


def compile_masked_patches(model, learning_rate=MPP_LEARNING_RATE, total_steps=MPP_STEPS,
                           warmup_steps=PRETRAIN_WARMUP_STEPS, accumulation_steps=1,
                           jit_compile=None):
    """`compile_model` with Adam (0.9, 0.999), warmup then cosine decay: the paper's masked
    patch prediction recipe (appendix B.1.2) for a `keras_vit.pretraining.masked_patch_model`.

    Raises:
        ValueError: for a model that is not self-supervised (a classifier has labels to learn
            from: use "finetune" or "pretrain").
    """
    if not getattr(model, "self_supervised", False):
        raise ValueError(
            f"The 'pretrain_mpp' recipe trains a masked patch prediction model "
            f"(keras_vit.pretraining.masked_patch_model); received {type(model).__name__} "
            f"{model.name!r}. Expected masked_patch_model(vit), or the 'finetune' or "
            "'pretrain' recipe for a classifier.")
    optimizer = pretrain_optimizer(learning_rate, total_steps, warmup_steps, weight_decay=0.0,
                                   accumulation_steps=accumulation_steps, decay="cosine")
    return compile_model(model, optimizer, jit_compile=jit_compile)


def recipe_defaults(recipe, total_steps, learning_rate=None, warmup_steps=None):
    """(learning rate, warm-up steps): the given ones, else the recipe's learning rate and the
    one warm-up rule (`default_warmup_steps`)."""
    check_choice("recipe", recipe, RECIPES)
    learning_rate = DEFAULT_LEARNING_RATES[recipe] if learning_rate is None else learning_rate
    if warmup_steps is None:
        warmup_steps = default_warmup_steps(recipe, total_steps)
    return learning_rate, warmup_steps


def compile_recipe(model, recipe, total_steps, learning_rate=None, warmup_steps=None,
                   weight_decay=PRETRAIN_WEIGHT_DECAY, accumulation_steps=1, label_smoothing=0.0,
                   jit_compile=None):
    """`compile_finetune`, `compile_pretrain` or `compile_masked_patches` ("pretrain_mpp") by
    name, with `recipe_defaults`. `weight_decay` is for "pretrain", `label_smoothing` for the
    classification recipes."""
    # Refused by every recipe, used by one.
    check_weight_decay(weight_decay)
    check_number("label_smoothing", label_smoothing, 0.0, 1.0)
    learning_rate, warmup_steps = recipe_defaults(recipe, total_steps, learning_rate,
                                                  warmup_steps)
    common = dict(learning_rate=learning_rate, total_steps=total_steps, warmup_steps=warmup_steps,
                  accumulation_steps=accumulation_steps, jit_compile=jit_compile)
    if recipe == "pretrain_mpp":
        return compile_masked_patches(model, **common)
    if recipe == "finetune":
        return compile_finetune(model, label_smoothing=label_smoothing, **common)
    return compile_pretrain(model, weight_decay=weight_decay, label_smoothing=label_smoothing,
                            **common)
