"""Recipes, schedules, losses, precision, callbacks, fault tolerance, the train/evaluate commands."""

import functools
import json
import math
import os
import pathlib
import signal
import subprocess
import sys
import time
import warnings

import keras
import numpy as np
import pytest
import reference
import tensorflow as tf
import tensorflow_datasets as tfds

import keras_vit
import keras_vit_cli as cli
from keras_vit import data, training, weights

ROOT = pathlib.Path(__file__).resolve().parent.parent
TINY = dict(image_size=8, patch_size=4, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=16,
            num_classes=3)


def tiny_model(**kwargs):
    keras.utils.set_random_seed(0)
    return keras_vit.ViT(**dict(TINY, **kwargs))


def batch(n=8, seed=0):
    rng = np.random.default_rng(seed)
    return rng.uniform(-1, 1, (n, 8, 8, 3)).astype("float32"), (np.arange(n) % 3).astype("int32")


def randomize_head(model, scale=2.0):
    """A non-zero head, so that every parameter gets a gradient on the first step."""
    rng = np.random.default_rng(7)
    head = model.get_layer("head")
    head.kernel.assign(rng.normal(0, scale, head.kernel.shape).astype("float32"))


def weight_arrays(model):
    return [np.array(w) for w in model.get_weights()]


# ------------------------------------------------------------------------------------------
# Schedules.


def official_schedule(step, base, total, warmup, decay, end=1e-5):
    """vit_jax `create_learning_rate_schedule`, transcribed in NumPy."""
    progress = np.clip((step - warmup) / (total - warmup), 0.0, 1.0)
    if decay == "cosine":
        lr = base * 0.5 * (1 + np.cos(np.pi * progress))
    else:
        lr = end + (base - end) * (1 - progress)
    return lr * np.minimum(1.0, step / warmup) if warmup else lr


@pytest.mark.parametrize("decay", ["cosine", "linear"])
def test_schedule_matches_the_official_formula(decay):
    schedule = training.WarmupDecay(0.03, total_steps=1000, warmup_steps=100, decay=decay)
    steps = np.array([0, 1, 50, 99, 100, 101, 400, 999, 1000, 2000], dtype=np.float64)
    got = np.array([float(schedule(int(s))) for s in steps])
    np.testing.assert_allclose(got, official_schedule(steps, 0.03, 1000, 100, decay), rtol=1e-5,
                               atol=1e-9)
    assert got[0] == 0 and abs(got[4] - 0.03) < 1e-7
    # Under accumulation the counter is in micro-batches: update n uses the lr of step n.
    accumulated = training.WarmupDecay(0.03, 1000, 100, decay, steps_per_update=4)
    for n in (0, 37, 100, 640):
        assert float(accumulated(4 * n + 3)) == pytest.approx(float(schedule(n)), rel=1e-6)
    clone = training.WarmupDecay.from_config(schedule.get_config())
    assert float(clone(321)) == float(schedule(321))


def test_a_linear_schedule_never_exceeds_its_peak():
    # From a peak below the 1e-5 end, vit_jax's formula climbs to 1e-5 (10,000x a 1e-9 peak).
    schedule = training.WarmupDecay(1e-9, total_steps=100, warmup_steps=10, decay="linear")
    rates = np.array([float(schedule(s)) for s in range(0, 120, 5)])
    assert rates.max() == pytest.approx(1e-9, rel=1e-6) and rates[-1] == pytest.approx(1e-9)
    assert official_schedule(100, 1e-9, 100, 10, "linear") == pytest.approx(1e-5)
    # An end above the peak, given, is refused: the decay would climb.
    with pytest.raises(ValueError, match=r"`end_learning_rate` must be a number in \[0, "
                                         r"0.001\]. Received: end_learning_rate=0.01"):
        training.WarmupDecay(1e-3, 100, decay="linear", end_learning_rate=1e-2)
    ramp = training.WarmupDecay(1e-3, 100, decay="linear", end_learning_rate=1e-3)
    assert float(ramp(50)) == pytest.approx(1e-3)  # an end at the peak: constant


def test_schedule_errors():
    with pytest.raises(ValueError, match="`decay` must be one of 'cosine', 'linear'. Received: decay='step'"):
        training.WarmupDecay(0.1, 100, 10, decay="step")
    with pytest.raises(ValueError, match="warmup_steps 100 must be smaller than total_steps 100"):
        training.WarmupDecay(0.1, 100, 100)
    with pytest.raises(ValueError, match="learning_rate=-1"):
        training.WarmupDecay(-1, 100)
    with pytest.raises(ValueError, match="not a multiple of batch_size 48"):
        training.accumulation_steps(512, 48)
    assert training.accumulation_steps(512, 64) == 8


# ------------------------------------------------------------------------------------------
# Optimizers against hand-written updates.


def gradients(model, x, y):
    with tf.GradientTape() as tape:
        logits = model(x, training=False)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))
    return [g.numpy() for g in tape.gradient(loss, model.trainable_variables)], float(loss)


def test_finetune_recipe_is_clipped_momentum_sgd():
    x, y = batch()
    model = tiny_model()
    randomize_head(model)
    opt = training.finetune_optimizer(learning_rate=0.1, total_steps=10, warmup_steps=0)
    assert (opt.momentum, opt.global_clipnorm, opt.weight_decay) == (0.9, 1.0, None)
    training.compile_model(model, opt, jit_compile=False)
    w = [np.array(v) for v in model.trainable_variables]
    velocity = [np.zeros_like(v) for v in w]
    for step in range(2):  # by hand: clip to global norm 1, v = 0.9 v - lr g, w += v
        for v, value in zip(model.trainable_variables, w):
            v.assign(value)
        grads, _ = gradients(model, x, y)
        norm = math.sqrt(sum(float((g**2).sum()) for g in grads))
        assert norm > 1.5  # clipping is active
        lr = official_schedule(step, 0.1, 10, 0, "cosine")
        velocity = [0.9 * m - lr * g / norm for m, g in zip(velocity, grads)]
        w = [a + m for a, m in zip(w, velocity)]
    fresh = tiny_model()
    randomize_head(fresh)
    training.compile_model(fresh, training.finetune_optimizer(0.1, 10, 0), jit_compile=False)
    fresh.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    for got, want in zip(fresh.trainable_variables, w):
        np.testing.assert_allclose(np.array(got), want, atol=2e-6)


def test_pretrain_recipe_is_adam_with_decoupled_weight_decay():
    x, y = batch()
    model = tiny_model()
    randomize_head(model, 0.5)
    w0 = [np.array(v) for v in model.trainable_variables]
    grads, _ = gradients(model, x, y)
    opt = training.pretrain_optimizer(learning_rate=0.01, total_steps=10, warmup_steps=0)
    assert (opt.beta_1, opt.beta_2, opt.weight_decay) == (0.9, 0.999, 0.1)
    training.compile_model(model, opt, jit_compile=False)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    lr = 0.01  # step 0 of the linear decay without warmup
    checked = total = 0
    for got, w, g in zip(model.trainable_variables, w0, grads):
        m_hat, v_hat = g, g**2  # bias-corrected moments after one step
        # Keras adds its epsilon (1e-7) before the bias correction of v ("epsilon hat" of
        # Kingma & Ba, section 2): at step t it acts as 1e-7 / sqrt(1 - 0.999^t).
        eps = 1e-7 / np.sqrt(1 - 0.999)
        want = w - lr * 0.1 * w - lr * m_hat / (np.sqrt(v_hat) + eps)
        # Adam normalises each gradient element: where it is rounding noise (the key bias,
        # which softmax ignores) the step direction is noise too; compare the others.
        signal = np.abs(g) > 1e-4
        checked += signal.sum()
        total += g.size
        np.testing.assert_allclose(np.array(got)[signal], want[signal], atol=1e-6)
    assert checked > 0.9 * total


def _adamw_steps(optimizer, compiled, steps=3, accumulation=False):
    """Three `optimizer.apply` calls with fixed gradients on fresh variables."""
    rng = np.random.default_rng(3)
    variables = [keras.Variable(rng.normal(0, 1, shape).astype("float32"), name=name)
                 for shape, name in [((4, 5), "kernel"), ((5,), "bias"), ((3,), "scale")]]
    grads = [[rng.normal(0, 1e-2, v.shape).astype("float32") for v in variables]
             for _ in range(steps)]
    optimizer.exclude_from_weight_decay(var_names=["bias"])
    optimizer.build(variables)

    def apply(*g):
        optimizer.apply(list(g), variables)

    apply = tf.function(apply, jit_compile=compiled == "xla") if compiled else apply
    for g in grads:
        apply(*g)
    return [np.array(v) for v in variables + list(optimizer.variables)]


@pytest.mark.parametrize("compiled", [None, "graph", "xla"])
@pytest.mark.parametrize("schedule", [False, True])
def test_adamw_is_keras_adamw(compiled, schedule):
    def make(cls):
        lr = training.WarmupDecay(0.1, 10, 2, "linear") if schedule else 0.1
        return cls(learning_rate=lr, weight_decay=0.1, gradient_accumulation_steps=2
                   if schedule else None)

    want = _adamw_steps(make(keras.optimizers.AdamW), compiled)
    got = _adamw_steps(make(training.AdamW), compiled)
    assert len(got) == len(want)
    # Keras computes 1 - beta_2 in float64 (0.001), TensorFlow's fused kernel in float32
    # (0.00099998713): 1.3e-5 relative in the second moment, 6e-6 in the step (steps here
    # are about 0.1).
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    assert not np.allclose(got[0], _adamw_steps(make(keras.optimizers.SGD), None)[0])


def test_adamw_matches_adamw_in_float64():
    got = _adamw_steps(training.AdamW(learning_rate=0.1, weight_decay=0.1), "xla")
    rng = np.random.default_rng(3)
    w = [rng.normal(0, 1, shape) for shape in [(4, 5), (5,), (3,)]]
    grads = [[rng.normal(0, 1e-2, v.shape).astype("float32") for v in w] for _ in range(3)]
    m = [np.zeros_like(v) for v in w]
    v2 = [np.zeros_like(v) for v in w]
    for t, g in enumerate(grads, start=1):
        for i in range(3):
            if i != 1:  # "bias" is excluded from weight decay
                w[i] = w[i] - 0.1 * 0.1 * w[i]
            m[i] = 0.9 * m[i] + 0.1 * g[i]
            v2[i] = 0.999 * v2[i] + 0.001 * g[i].astype(float) ** 2
            alpha = 0.1 * np.sqrt(1 - 0.999**t) / (1 - 0.9**t)
            w[i] = w[i] - alpha * m[i] / (np.sqrt(v2[i]) + 1e-7)
    for a, b in zip(got[:3], w):
        np.testing.assert_allclose(a, b, atol=2e-6)


def test_adamw_builds_fewer_operations():
    variables = [keras.Variable(np.ones((8, 8), "float32")) for _ in range(6)]
    counts = {}
    for cls in (keras.optimizers.AdamW, training.AdamW):
        optimizer = cls(learning_rate=training.WarmupDecay(1e-3, 100, 10), weight_decay=0.1)
        optimizer.build(variables)
        apply = tf.function(lambda *g, o=optimizer: o.apply(list(g), variables))
        traced = apply.get_concrete_function(*[tf.TensorSpec((8, 8), tf.float32)] * len(variables))
        op_types = [op.type for op in traced.graph.get_operations()]
        counts[cls] = len(op_types)
        if cls is training.AdamW:
            assert op_types.count("ResourceApplyAdam") == len(variables)
    assert counts[training.AdamW] < 0.5 * counts[keras.optimizers.AdamW], counts
    assert training.AdamW.from_config(training.AdamW(weight_decay=0.2).get_config()).weight_decay \
        == 0.2


def test_adamw_edge_cases_follow_keras():
    """Exclusion by a name prefix (Keras matches the tf.Variable's full name), float16
    variables (Keras' update: 1 - b2 would round in float16), sparse gradients."""
    def run(cls):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((3,)), keras.layers.Embedding(5, 4),
                                  keras.layers.Dense(2, name="head")])
        optimizer = cls(learning_rate=0.05, weight_decay=0.5)
        optimizer.exclude_from_weight_decay(var_names=["head"])
        model.compile(optimizer=optimizer, loss="mse", jit_compile=False)
        x, y = np.array([[0, 1, 4]] * 2), np.ones((2, 3, 2), "float32")
        for _ in range(3):
            model.train_on_batch(x, y)
        half = keras.Variable(np.full((3,), 0.5, "float16"))
        opt16 = cls(learning_rate=0.05, weight_decay=0.5)
        opt16.build([half])
        for _ in range(3):
            opt16.apply([np.full((3,), 0.25, "float16")], [half])
        return [np.array(w) for w in model.weights] + [np.array(half)]

    for got, want in zip(run(training.AdamW), run(keras.optimizers.AdamW)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_adamw_under_a_strategy_is_keras_adamw():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        variables = [keras.Variable(np.ones((2,), "float32"))]
        optimizer = training.AdamW(learning_rate=0.1, weight_decay=0.1)
        optimizer.build(variables)
    assert not optimizer.fuses_update()  # applied outside the scope: Keras' path
    optimizer.apply([np.full((2,), 0.5, "float32")], variables)
    np.testing.assert_allclose(np.array(variables[0]), 1 - 0.01 - 0.1 / (1 + 1e-7 / 0.5),
                               rtol=1e-5)


def test_compile_model_traces_the_training_step_once(monkeypatch):
    """Without `build_training_state`, Keras traces the first step twice (variables are
    created in the first trace): every block's `call` would run twice."""
    calls = []
    original = keras_vit.TransformerBlock.call

    @functools.wraps(original)  # Keras reads the signature of `call`
    def counting_call(self, *args, **kwargs):
        calls.append(self.name)
        return original(self, *args, **kwargs)

    x, y = batch()
    model = tiny_model()
    training.compile_pretrain(model, total_steps=10, warmup_steps=1, jit_compile=False)
    monkeypatch.setattr(keras_vit.TransformerBlock, "call", counting_call)
    assert model.optimizer.built and model.optimizer.variables
    model.train_on_batch(x, y)
    assert calls == ["encoderblock_0"]
    model.train_on_batch(x, y)
    assert calls == ["encoderblock_0"]

    vit = tiny_model()
    plain = keras.Model(vit.input, vit.output)  # Keras' functional Model, not keras_vit's
    plain.compile(optimizer=keras.optimizers.AdamW(), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"], jit_compile=False)
    del calls[:]
    plain.train_on_batch(x, y)
    assert calls == ["encoderblock_0"] * 2  # what build_training_state saves
    with pytest.raises(ValueError, match="is not compiled"):
        training.build_training_state(tiny_model())


def counting_train_steps(model):
    """Wraps `model.train_step` to count its traces (each trace calls it once)."""
    calls = []
    train_step = model.train_step

    def counted(data):
        calls.append(1)
        return train_step(data)

    model.train_step = counted
    return calls


@pytest.mark.parametrize("how", ["train_on_batch", "fit_onehot_dataset"])
def test_build_training_state_after_a_hand_compile_traces_the_first_step_once(how):
    """A builder's model is Keras' functional Model: compiled by hand it traces its first step
    twice, as Keras does; `training.build_training_state` after `compile` builds the state from
    a label spec first, and the first step traces once, with the same training."""
    x, y = batch()
    onehot = how == "fit_onehot_dataset"  # the label spec comes from the data
    labels = np.eye(3, dtype="float32")[y] if onehot else y
    loss = "categorical_crossentropy" if onehot else "sparse_categorical_crossentropy"

    def train(prebuild):
        model = tiny_model()
        model.compile(optimizer=keras.optimizers.AdamW(1e-3), loss=loss, metrics=["accuracy"],
                      jit_compile=False)
        if prebuild:
            spec = keras.KerasTensor((None, 3), "float32") if onehot else None
            training.build_training_state(model, labels=spec)
        calls = counting_train_steps(model)
        if how == "train_on_batch":
            model.train_on_batch(x, labels)
            model.train_on_batch(x, labels)
        else:
            dataset = tf.data.Dataset.from_tensor_slices((x, labels)).shuffle(8, seed=1).batch(4)
            model.fit(dataset, epochs=2, validation_data=dataset, verbose=0)
        assert model.optimizer.iterations.numpy() == (2 if how == "train_on_batch" else 4)
        return len(calls), weight_arrays(model)

    # A functional keras.Model whose class overrides nothing of Keras' training but the
    # routes chosen around each step (for a strategy's replica threads: tests/test_distribute.py).
    assert isinstance(tiny_model(), keras_vit.ViT)
    assert not [name for name in ("compile", "fit", "compute_loss", "compute_metrics")
                if name in vars(keras_vit.ViT)]
    traces, trained = train(prebuild=True)
    keras_traces, keras_trained = train(prebuild=False)
    assert (traces, keras_traces) == (1, 2)
    for a, b in zip(trained, keras_trained):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("onehot", [False, True], ids=["ids", "onehot"])
def test_the_training_state_is_built_without_a_forward_pass_as_keras_builds_it(onehot,
                                                                                 monkeypatch):
    """`build_training_state` takes the predictions' shape from the functional model's output
    instead of tracing the model, and builds the loss and metrics Keras builds: evaluation
    gives the same numbers as after Keras' own build."""
    x, y = batch()
    labels = np.eye(3, dtype="float32")[y] if onehot else y
    loss = "categorical_crossentropy" if onehot else "sparse_categorical_crossentropy"
    results = []
    for prebuild in (True, False):
        keras.utils.set_random_seed(0)
        model = tiny_model()
        randomize_head(model)
        model.compile(optimizer=keras.optimizers.AdamW(1e-3), loss=loss, metrics=["accuracy"],
                      jit_compile=False)
        if prebuild:
            calls, head = [], model.get_layer("head")
            call = head.call
            monkeypatch.setattr(head, "call", lambda *a, **k: calls.append(1) or call(*a, **k))
            spec = keras.KerasTensor((None, 3), "float32") if onehot else None
            training.build_training_state(model, labels=spec)
            monkeypatch.undo()
            assert calls == [] and model.optimizer.built
        results.append(model.evaluate(x, labels, return_dict=True, verbose=0))
    assert results[0] == results[1] and 0 < results[0]["accuracy"] < 1


def test_a_hand_compiled_model_trains_with_keras_own_update():
    """`model.compile` with a Keras optimizer behaves as Keras documents: the optimizer is left
    as it is, and the steps are bit for bit those of Keras' own functional Model over the same
    layers."""
    x, y = batch()
    results = []
    for rebuild in (False, True):
        keras.utils.set_random_seed(0)
        model = tiny_model()
        randomize_head(model)
        if rebuild:
            model = keras.Model(model.input, model.output)  # Keras' own class
            assert type(model).__name__ == "Functional"
        optimizer = keras.optimizers.AdamW(1e-2, weight_decay=0.05)
        model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy",
                      jit_compile=False)
        assert not [name for name in vars(optimizer) if name.startswith("_keras_vit")]
        for _ in range(2):
            model.train_on_batch(x, y)
        results.append(weight_arrays(model))
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)


def test_evaluate_and_predict_build_no_optimizer_state():
    x, y = batch()
    model = tiny_model()
    model.compile(optimizer="adamw", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    model.evaluate(x, y, verbose=0)
    model.predict(x, verbose=0)
    assert not model.optimizer.built
    model.train_on_batch(x, y)
    assert model.optimizer.built


def test_build_training_state_leaves_unbuilt_models_and_takes_label_specs():
    unbuilt = keras.Sequential([keras.layers.Dense(3)])
    unbuilt.compile(optimizer=training.AdamW(), loss="mse")
    training.build_training_state(unbuilt)
    assert not unbuilt.optimizer.built
    unbuilt.train_on_batch(np.ones((2, 4), "float32"), np.ones((2, 3), "float32"))

    x, y = batch()
    onehot = tiny_model()
    onehot.compile(optimizer=training.AdamW(), loss="categorical_crossentropy",
                   metrics=["accuracy"], jit_compile=False)
    training.build_training_state(onehot, labels=keras.KerasTensor((None, 3), "float32"))
    assert onehot.optimizer.built
    logs = onehot.train_on_batch(x, np.eye(3, dtype="float32")[y], return_dict=True)
    assert set(logs) >= {"loss", "accuracy"}


def test_gradient_accumulation_equals_the_large_batch():
    x, y = batch(16)

    def train(accumulation, batch_size):
        model = tiny_model()
        randomize_head(model)
        training.compile_finetune(model, learning_rate=0.05, total_steps=20, warmup_steps=1,
                                  accumulation_steps=accumulation, jit_compile=False)
        model.fit(x, y, batch_size=batch_size, epochs=2, shuffle=False, verbose=0)
        return weight_arrays(model), int(model.optimizer.iterations)

    initial = weight_arrays(tiny_model())
    big, updates_big = train(1, 8)
    accumulated, updates_acc = train(2, 4)
    assert updates_big == updates_acc == 4
    for a, b, w0 in zip(big, accumulated, initial):
        np.testing.assert_allclose(a, b, atol=1e-6)
    assert max(np.abs(a - w0).max() for a, w0 in zip(big, initial)) > 1e-3


# ------------------------------------------------------------------------------------------
# Loss and precision.


def test_label_smoothing_loss_matches_numpy():
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(5, 4)).astype("float32")
    labels = np.array([0, 3, 1, 1, 2])
    for smoothing in (0.0, 0.1):
        target = np.eye(4)[labels] * (1 - smoothing) + smoothing / 4
        log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        want = -(target * log_probs).sum(-1).mean()
        got = float(training.SparseCategoricalCrossentropy(smoothing)(labels, logits))
        assert got == pytest.approx(want, rel=1e-5)
    with pytest.raises(ValueError, match="label_smoothing=1.5"):
        training.SparseCategoricalCrossentropy(1.5)


def test_mixed_precision_flags():
    x, y = batch()
    assert training.set_precision("bfloat16") == "mixed_bfloat16"
    model = tiny_model()
    training.compile_finetune(model, total_steps=10, warmup_steps=1)
    history = model.fit(x, y, batch_size=4, epochs=1, verbose=0)
    assert model.get_layer("encoderblock_0").compute_dtype == "bfloat16"
    assert model.predict(x, verbose=0).dtype == np.float32
    assert np.isfinite(history.history["loss"][0])
    training.set_precision("float16")
    model = tiny_model()
    training.compile_finetune(model, total_steps=10, warmup_steps=1, jit_compile=False)
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    with pytest.raises(ValueError, match="`precision` must be one of 'float32', 'bfloat16', 'float16'. Received: precision='fp8'"):
        training.set_precision("fp8")


def test_the_recipes_take_the_measured_runtime_by_default():
    # The measured default (BENCHMARKS.md), stated apart from keras_vit.execution: XLA on an
    # accelerator and on a CPU without AVX-512; TensorFlow's graph runtime on a CPU with AVX-512
    # (CPUs with AMX have it too). Other machines' rows: tests/test_execution.py.
    with open("/proc/cpuinfo", encoding="utf-8") as f:
        flags = {flag for line in f if line.startswith("flags")
                 for flag in line.split(":", 1)[1].split()}
    accelerator = any(tf.config.list_logical_devices(kind) for kind in ("GPU", "TPU"))
    model = tiny_model()
    training.compile_finetune(model, total_steps=10, warmup_steps=1)
    assert model.jit_compile is (accelerator or "avx512f" not in flags), (accelerator, flags)


# ------------------------------------------------------------------------------------------
# Callbacks.


def test_terminate_on_nan_stops_training(tmp_path):
    x, y = batch()
    x[5] = np.nan
    model = tiny_model()
    randomize_head(model)
    training.compile_finetune(model, total_steps=10, warmup_steps=1)
    callbacks = training.training_callbacks(tmp_path, best=False, tensorboard=False)
    history = model.fit(x, y, batch_size=4, epochs=3, callbacks=callbacks, verbose=0)
    assert len(history.history["loss"]) == 1 and np.isnan(history.history["loss"][0])


def test_best_checkpoint_tensorboard_and_backup_cleanup(tmp_path):
    x, y = batch(12)
    vx, vy = batch(6, seed=1)
    model = tiny_model()
    training.compile_finetune(model, learning_rate=0.3, total_steps=30, warmup_steps=1)
    snapshots = []
    keep = keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: snapshots.append(weights.model_params(model)))
    callbacks = training.training_callbacks(tmp_path, monitor="val_loss")
    history = model.fit(x, y, batch_size=4, epochs=5, validation_data=(vx, vy),
                        callbacks=callbacks + [keep], verbose=0)
    best_epoch = int(np.argmin(history.history["val_loss"]))
    saved = weights.read_npz(tmp_path / "best.npz")
    assert saved.keys() == snapshots[best_epoch].keys()
    for key, value in snapshots[best_epoch].items():
        np.testing.assert_array_equal(saved[key], value)
    # The file is an official-layout checkpoint: the NumPy reference reproduces the model.
    restored = tiny_model()
    weights.load_params(restored, saved)
    want = reference.forward(saved, vx)[0]
    np.testing.assert_allclose(restored.predict(vx, verbose=0), want, atol=1e-4)
    events = list((tmp_path / "logs").rglob("events.out.tfevents.*"))
    assert {e.parent.name for e in events} == {"train", "validation"}
    # The backup is the training state of the last finished epoch (removed by training.fit
    # once a run completes); it restores the final weights.
    restored = tiny_model()
    training.compile_finetune(restored, learning_rate=0.3, total_steps=30, warmup_steps=1)
    backup = training.BackupAndRestore(tmp_path / "backup")
    backup.set_model(restored)
    backup.on_train_begin()
    assert int(restored.optimizer.iterations) == int(model.optimizer.iterations)
    for key, value in weights.model_params(restored).items():
        np.testing.assert_array_equal(value, snapshots[-1][key])


def test_checkpoint_dir_not_writable(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ValueError, match=r"Output folder '.*file/run' is not writable"):
        training.training_callbacks(blocker / "run")


def test_best_checkpoint_needs_its_metric(tmp_path):
    x, y = batch()
    model = tiny_model()
    training.compile_finetune(model, total_steps=10, warmup_steps=1)
    with pytest.raises(ValueError, match="monitors 'val_accuracy', which is not among the logs"):
        model.fit(x, y, epochs=1, verbose=0,
                  callbacks=[training.BestCheckpoint(tmp_path / "b.npz")])


# ------------------------------------------------------------------------------------------
# Fault tolerance: kill a run, restart it, reach the weights of an uninterrupted run.


def write_folder(root, count=24):
    rng = np.random.default_rng(4)
    for i in range(count):
        image = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
        path = root / f"class{i % 3}" / f"{i}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(tf.io.encode_png(image).numpy())


def start_run(folder, run_dir, pause):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "test_training_resume_run.py"), str(folder),
         str(run_dir), str(pause)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def test_numpy_scalar_settings_are_recorded_as_numbers_and_resume(tmp_path):
    """Settings given as NumPy scalars (a learning rate from a sweep's array) are recorded in
    run.json as JSON numbers; the same values resume the run, another is refused."""
    images = np.random.default_rng(0).integers(0, 256, (8, 8, 8, 3), dtype=np.uint8)
    train = data.from_arrays(images, np.arange(8) % 3, num_classes=3, image_size=8,
                             batch_size=4, training=True, class_names=["a", "b", "c"])
    options = dict(learning_rate=np.float32(0.01), warmup_steps=np.int64(1),
                   label_smoothing=np.float32(0.1), target_batch_size=np.int64(8),
                   epochs=np.int64(2), verbose=0, jit_compile=False)
    run = tmp_path / "run"
    training.fit(tiny_model(), train, output_dir=run, **options)
    record = json.loads((run / "run.json").read_text())
    settings = record["settings"]
    assert settings["learning_rate"] == float(np.float32(0.01)) and settings["warmup_steps"] == 1
    assert settings["class_names"] == ["a", "b", "c"] and settings["accumulation"] == 2
    (run / "run.json").write_text(json.dumps(dict(record, finished=False)))  # as if killed
    os.makedirs(training.backup_dir(run), exist_ok=True)
    with pytest.raises(ValueError, match=r"other settings \(learning_rate 0.0099"):
        training.fit(tiny_model(), train, output_dir=run, **dict(options, learning_rate=0.02))
    assert training.fit(tiny_model(), train, output_dir=run, **options)["epochs"] == 2


def test_killed_run_resumes_to_the_same_weights(tmp_path):
    write_folder(tmp_path / "images")
    reference_run = start_run(tmp_path / "images", tmp_path / "ref", 0)
    run = start_run(tmp_path / "images", tmp_path / "run", 1.0)
    latest = tmp_path / "run" / "backup" / "latest.json"
    deadline = time.time() + 120
    while time.time() < deadline and not (latest.exists() and json.loads(latest.read_text())["epoch"] >= 1):
        assert run.poll() is None, run.communicate()[0]
        time.sleep(0.1)
    run.send_signal(signal.SIGKILL)
    first_output = run.communicate(timeout=30)[0]
    assert run.returncode == -signal.SIGKILL and not (tmp_path / "run" / "final.npz").exists()
    resumed_at = training.resume_epoch(tmp_path / "run" / "backup")
    assert 1 <= resumed_at < 4, first_output

    rerun = start_run(tmp_path / "images", tmp_path / "run", 0)
    output = rerun.communicate(timeout=180)[0]
    assert rerun.returncode == 0, output
    assert f"start_epoch {resumed_at}" in output
    assert f"epoch_end {resumed_at - 1}" not in output  # the finished epochs are not re-run
    ref_output = reference_run.communicate(timeout=180)[0]
    assert reference_run.returncode == 0, ref_output

    resumed = weights.read_npz(tmp_path / "run" / "final.npz")
    uninterrupted = weights.read_npz(tmp_path / "ref" / "final.npz")
    for key in uninterrupted:
        np.testing.assert_allclose(resumed[key], uninterrupted[key], atol=1e-6, err_msg=key)
    assert np.abs(uninterrupted["head/kernel"]).max() > 1e-3  # trained (the head starts at 0)
    assert not (tmp_path / "run" / "backup").exists()


# ------------------------------------------------------------------------------------------
# The commands.


TINY_CONFIG = json.dumps(dict(patch_size=4, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=16))


def test_train_and_evaluate_commands(tmp_path, capsys):
    common = ["--dataset", "cifar10", "--batch-size", "4"]
    with tfds.testing.mock_data(num_examples=8):
        code = cli.main(["train", *common, "--model-config", TINY_CONFIG, "--image-size", "32",
                         "--no-xla", "--steps", "4", "--warmup-steps", "1", "--lr", "0.1",
                         "--target-batch-size", "8", "--output", str(tmp_path), "--verbose", "2"])
        assert code == 0
        train_log = capsys.readouterr().out
        # The architecture, the resolution and the class names come with the weights.
        code = cli.main(["evaluate", *common, "--weights", str(tmp_path / "final.npz"),
                         "--json"])
        assert code == 0
        result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        test_split = list(tfds.load("cifar10", split="test", as_supervised=True).as_numpy_iterator())
    # 8 examples, batch 4 x 2 accumulation: 4 updates need 4 epochs of 2 steps.
    assert "4 epochs of 2 batches of 4 x 2 accumulation = 4 updates" in train_log
    assert (tmp_path / "best.npz").exists() and (tmp_path / "logs").is_dir()
    params = weights.read_npz(tmp_path / "final.npz")
    images = np.stack([im for im, _ in test_split]) / 127.5 - 1
    labels = np.array([label for _, label in test_split])
    logits = reference.forward(params, images)[0]
    assert result["examples"] == len(labels) == 8
    assert result["accuracy"] == pytest.approx(np.mean(logits.argmax(-1) == labels))
    assert not np.allclose(params["head/kernel"], 0)


@pytest.mark.parametrize("argv, message", [
    (["--dataset", "mnist"], "Unknown dataset 'mnist'"),
    (["--dataset", "cifar10", "--strategy", "gpus"],
     "--strategy 'gpus' is not one of auto, tpu, mirrored"),
    (["--dataset", "cifar10", "--precision", "fp8"],
     "--precision 'fp8' is not one of float32, bfloat16, float16"),
    (["--folder", "/nonexistent/images"], "does not exist"),
])
def test_train_command_errors_before_training(tmp_path, capsys, argv, message):
    code = cli.main(["train", *argv, "--output", str(tmp_path / "run")])
    assert code == 2 and message in capsys.readouterr().err


def test_train_command_unwritable_output_and_wrong_head(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    code = cli.main(["train", "--dataset", "cifar10", "--output", str(tmp_path / "file" / "x")])
    assert code == 2 and "which is a file, not a folder" in capsys.readouterr().err
    config = json.dumps(dict(json.loads(TINY_CONFIG), num_classes=5))
    with tfds.testing.mock_data(num_examples=8):
        code = cli.main(["train", "--dataset", "cifar10", "--model-config", config,
                         "--image-size", "32", "--batch-size", "4", "--output",
                         str(tmp_path / "run")])
    assert code == 2
    assert "data has 10 classes (labels 0..9) but the model's head has 5" in capsys.readouterr().err


def test_a_run_resumes_from_a_record_that_predates_what_it_leaves_out(tmp_path):
    """A run's config.json written before a data config was recorded (the paper's, then) or
    before an argument existed says nothing of them: the same model resumes; another
    architecture is refused."""

    class Stop(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            raise KeyboardInterrupt("stopped")

    x = np.random.default_rng(0).integers(0, 256, (8, 16, 16, 3), dtype=np.uint8)
    train = data.from_arrays(x, np.arange(8) % 3, image_size=16, batch_size=4, training=True)
    config = dict(image_size=16, patch_size=8, hidden_size=8, num_layers=1, num_heads=2,
                  mlp_dim=8, num_classes=3)
    with pytest.raises(KeyboardInterrupt):
        training.fit(keras_vit.ViT(**config), train, output_dir=tmp_path, epochs=2, verbose=0,
                     callbacks=[Stop()])
    record = json.loads((tmp_path / "config.json").read_text())
    del record["preprocessing"], record["model"]["position_resize"]
    (tmp_path / "config.json").write_text(json.dumps(record))
    with pytest.raises(ValueError, match=r"other settings \(model.hidden_size 8 -> 16\)"):
        training.fit(keras_vit.ViT(**dict(config, hidden_size=16)), train, output_dir=tmp_path,
                     epochs=2, verbose=0)
    summary = training.fit(keras_vit.ViT(**config), train, output_dir=tmp_path, epochs=2,
                           verbose=0)
    assert summary["resumed_at_epoch"] == 1


def test_train_from_a_run_on_classes_named_otherwise_starts_its_head_afresh(tmp_path, capsys):
    """A run's head of as many classes as the data, named otherwise, would be trained as other
    classes: it starts afresh (zeros, as a new head), and the command says so; the same
    names keep it."""
    write_folder(tmp_path / "images", count=12)
    common = ["--model-config", TINY_CONFIG, "--image-size", "8", "--batch-size", "6",
              "--no-xla", "--verbose", "0"]
    assert cli.main(["train", "--folder", str(tmp_path / "images"), *common, "--steps", "2",
                     "--lr", "0.1", "--output", str(tmp_path / "first")]) == 0
    trained = weights.read_npz(tmp_path / "first" / "final.npz")["head/kernel"]
    assert np.abs(trained).max() > 1e-3
    (tmp_path / "images" / "class0").rename(tmp_path / "images" / "zebra")
    capsys.readouterr()
    assert cli.main(["train", "--folder", str(tmp_path / "images"), *common, "--steps", "1",
                     "--lr", "1e-12", "--weights", str(tmp_path / "first" / "final.npz"),
                     "--output", str(tmp_path / "second")]) == 0
    assert "named otherwise than the data's (3 of 3 differ, e.g. label 0 'class0' -> " \
        "'class1'): the head starts afresh" in capsys.readouterr().err
    assert np.abs(weights.read_npz(tmp_path / "second" / "final.npz")["head/kernel"]).max() < 1e-6
    (tmp_path / "images" / "zebra").rename(tmp_path / "images" / "class0")
    assert cli.main(["train", "--folder", str(tmp_path / "images"), *common, "--steps", "1",
                     "--lr", "1e-12", "--weights", str(tmp_path / "first" / "final.npz"),
                     "--output", str(tmp_path / "third")]) == 0
    assert "afresh" not in capsys.readouterr().err
    np.testing.assert_allclose(weights.read_npz(tmp_path / "third" / "final.npz")["head/kernel"],
                               trained, atol=1e-6)


def test_finetune_folder_example(tmp_path, capsys):
    sys.path.insert(0, str(ROOT / "examples"))
    import finetune_folder

    write_folder(tmp_path / "images", count=30)
    finetune_folder.main(["--folder", str(tmp_path / "images"), "--model-config", TINY_CONFIG,
                          "--image-size", "8", "--batch-size", "9", "--steps", "6",
                          "--output", str(tmp_path / "run")])
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["class_names"] == ["class0", "class1", "class2"]
    val = data.from_folder(tmp_path / "images", image_size=8, batch_size=3, training=False,
                           validation_split=0.1, subset="validation")
    images, labels = next(iter(val.dataset))
    logits = reference.forward(weights.read_npz(tmp_path / "run" / "final.npz"),
                               images.numpy())[0]
    assert result["validation_accuracy"] == pytest.approx(np.mean(logits.argmax(-1) == labels))
