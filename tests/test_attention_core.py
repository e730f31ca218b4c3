"""The training path's attention core (`layers.attention_core`, a hand-written backward) against
autodiff through the plain formulation: outputs and gradients, float32 and bfloat16, eager,
graph and XLA, on TensorFlow here and on JAX in a subprocess; and the layer's training output
and weight gradients against its dropout path (the einsum products) at rate 0."""

import math
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_vit import layers

SHAPE = (2, 3, 7, 4)  # [B, h, N, k]


def plain(q, k, v, scale):
    probs = tf.nn.softmax(tf.cast(tf.matmul(q * scale, k, transpose_b=True), tf.float32), -1)
    return tf.matmul(tf.cast(probs, v.dtype), v)


def operands(dtype="float32", seed=0):
    rng = np.random.default_rng(seed)
    return [tf.constant(rng.normal(size=SHAPE) * 2, dtype) for _ in range(4)]  # q, k, v, w


def value_and_grads(fn, q, k, v, w):
    with tf.GradientTape() as tape:
        tape.watch([q, k, v])
        out = fn(q, k, v, 0.5)
        loss = tf.reduce_sum(tf.cast(out, tf.float32) * tf.cast(w, tf.float32))
    return [out] + tape.gradient(loss, [q, k, v])


@pytest.mark.parametrize("mode", ["eager", "graph", "xla"])
def test_core_matches_autodiff(mode):
    def run(fn):
        call = lambda *a: value_and_grads(fn, *a)  # noqa: E731
        if mode != "eager":
            call = tf.function(call, jit_compile=mode == "xla")
        return [t.numpy() for t in call(*operands())]

    for got, want, name in zip(run(layers.attention_core), run(plain), ("out", "dq", "dk", "dv")):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=name)
    assert np.abs(run(plain)[1]).max() > 0.1  # the gradients are not trivially zero


def test_core_in_bfloat16_matches_float32_autodiff():
    q, k, v, w = operands("float32")
    want = [t.numpy() for t in value_and_grads(plain, q, k, v, w)]
    low = [tf.cast(t, tf.bfloat16) for t in (q, k, v)]
    got = [tf.cast(t, tf.float32).numpy() for t in value_and_grads(layers.attention_core, *low, w)]
    for g, ref, name in zip(got, want, ("out", "dq", "dk", "dv")):
        np.testing.assert_allclose(g, ref, rtol=0.05, atol=0.05 * np.abs(ref).max(),
                                   err_msg=name)


def test_layer_training_path_matches_its_dropout_path_at_rate_zero():
    """The layer trains through `attention_core` when it has no attention dropout; its outputs
    and every weight's gradient equal those of the einsum products (the dropout path)."""
    layer = layers.MultiHeadDotProductAttention(num_heads=3)
    rng = np.random.default_rng(1)
    x, w = (tf.constant(rng.normal(size=(2, 5, 12)), tf.float32) for _ in range(2))
    layer(x)

    def grads(use_core):
        # A rate the layer sees as "dropout" (the einsum path) while its Dropout, built at
        # rate 0, drops nothing.
        layer.attention_dropout_rate = 0.0 if use_core else 1e-30
        with tf.GradientTape() as tape:
            tape.watch(x)
            out, probs = layer(x, training=True, return_attention_scores=True)
            loss = tf.reduce_sum(out * w)
        return [out, probs] + tape.gradient(loss, [x] + layer.trainable_variables)

    try:
        for got, want in zip(grads(True), grads(False)):
            np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
    finally:
        layer.attention_dropout_rate = 0.0


JAX_CHECK = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np
    import keras
    from keras_vit import layers

    assert keras.backend.backend() == "jax"
    rng = np.random.default_rng(0)
    q, k, v, w = (jnp.asarray(rng.normal(size=(2, 3, 7, 4)) * 2, jnp.float32) for _ in range(4))

    def plain(q, k, v):
        return jax.nn.softmax(q * 0.5 @ jnp.swapaxes(k, -1, -2), axis=-1) @ v

    def loss(fn):
        return lambda q, k, v: jnp.sum(fn(q, k, v) * w)

    core = lambda q, k, v: layers.attention_core(q, k, v, 0.5)
    got = jax.jit(jax.value_and_grad(loss(core), argnums=(0, 1, 2)))(q, k, v)
    want = jax.value_and_grad(loss(plain), argnums=(0, 1, 2))(q, k, v)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
    for a, b in zip(got[1], want[1]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    print("ok")
""")


def test_core_on_jax():
    env = dict(os.environ, KERAS_BACKEND="jax", TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run([sys.executable, "-c", JAX_CHECK], capture_output=True, text=True,
                            env=env, timeout=300)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]
