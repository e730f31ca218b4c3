"""The seam (`keras_vit.routes`): every implementation of every choice computes the model,
forward and backward, eagerly, in TensorFlow's graph runtime and under XLA, as the float64
NumPy reference does; the defaults are the measured table; routes are chosen per block or per
process, checked, and never saved. (The JAX side, the gradient barrier among it, is in
tests/test_jax.py.)"""

import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_vit
from keras_vit import implementations, routes, weights
from keras_vit.weights.keymap import checkpoint_variables
from reference import forward, official_params

REPO = pathlib.Path(__file__).resolve().parent.parent

CONFIG = dict(image_size=(16, 24), patch_size=8, hidden_size=16, num_layers=2, num_heads=2,
              mlp_dim=32, num_classes=5)
# Every implementation of every choice (one choice at a time, the others at their defaults),
# and every choice at its first and at its last implementation together.
FIRST_AND_LAST = [{name: routes[0] for name, routes in routes.CHOICES.items()},
                  {name: routes[-1] for name, routes in routes.CHOICES.items()}]
COMBINATIONS = [{name: route} for name, routes in routes.CHOICES.items()
                for route in routes] + FIRST_AND_LAST
# The fewest of them in which every implementation runs: all first, all last, and each one
# in between alone (for XLA, where each combination is a compilation of its own).
COVERING = FIRST_AND_LAST + [{name: route} for name, routes in routes.CHOICES.items()
                             for route in routes[1:-1]]


def images(count=3, seed=1):
    return np.random.default_rng(seed).uniform(-1, 1, (count, 16, 24, 3)).astype("float32")


def loaded_model(params):
    model = keras_vit.ViT(**CONFIG)
    weights.load_params(model, params)
    return model


@pytest.fixture(scope="module")
def params():
    return official_params(np.random.default_rng(0), hidden=16, mlp=32, heads=2, layers=2,
                           patch=(8, 8), grid=(2, 3), num_classes=5)


@pytest.mark.parametrize("choice", COMBINATIONS,
                         ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_every_implementation_gives_the_reference_logits(choice, params):
    model = loaded_model(params)
    expected, _, attentions = forward(params, images())
    assert np.abs(expected).max() > 0.1
    with routes.use_routes(**choice):
        for training in (False, True):  # no dropout: the same function in both modes
            logits = keras.ops.convert_to_numpy(model(images(), training=training))
            np.testing.assert_allclose(logits, expected, atol=1e-5, rtol=1e-5)
        _, probabilities = model.attention_model()(images())
    for probs, want in zip(probabilities, attentions):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(probs), want, atol=1e-5)


# Weights whose gradient the float64 reference gives by central differences: one entry of each
# kind (checkpoint key, index).
PROBES = [("embedding/kernel", (3, 5, 1, 7)), ("cls", (0, 0, 2)),
          ("Transformer/posembed_input/pos_embedding", (0, 4, 9)),
          ("Transformer/encoderblock_0/LayerNorm_0/scale", (6,)),
          ("Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/kernel", (2, 1, 3)),
          ("Transformer/encoderblock_0/MultiHeadDotProductAttention_1/key/kernel", (9, 0, 5)),
          ("Transformer/encoderblock_1/MultiHeadDotProductAttention_1/value/bias", (1, 4)),
          ("Transformer/encoderblock_1/MultiHeadDotProductAttention_1/out/kernel", (0, 6, 11)),
          ("Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel", (4, 20)),
          ("Transformer/encoderblock_0/MlpBlock_3/Dense_1/kernel", (17, 3)),
          ("Transformer/encoderblock_1/MlpBlock_3/Dense_1/bias", (13,)),
          ("Transformer/encoderblock_1/LayerNorm_2/bias", (2,)),
          ("Transformer/encoder_norm/scale", (10,)), ("head/kernel", (5, 2))]


def reference_loss(params, x, y):
    """The mean cross-entropy of the float64 reference's logits."""
    logits, _, _ = forward(params, x)
    logits = logits - logits.max(axis=-1, keepdims=True)
    log_probs = logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))
    return -log_probs[np.arange(len(y)), y].mean()


@pytest.fixture(scope="module")
def reference_gradients(params):
    """d loss / d weight at each of `PROBES`, by central differences in float64."""
    x, y = images(), np.arange(3)
    p64 = {k: np.asarray(v, np.float64) for k, v in params.items()}
    gradients = []
    for key, index in PROBES:
        step = 1e-6
        plus, minus = dict(p64), dict(p64)
        plus[key], minus[key] = p64[key].copy(), p64[key].copy()
        plus[key][index] += step
        minus[key][index] -= step
        gradients.append((reference_loss(plus, x, y) - reference_loss(minus, x, y)) / (2 * step))
    return np.array(gradients)


@pytest.mark.parametrize("mode", ["eager", "graph", "xla"])
def test_every_implementation_gives_the_reference_gradients(mode, params, reference_gradients):
    x, y = images(), np.arange(3)
    model = loaded_model(params)
    variables = checkpoint_variables(model)

    def gradients(choice):
        def step(x):
            with tf.GradientTape() as tape:
                logits = model(x, training=True)
                loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))
            return tape.gradient(loss, [variables[key] for key, _ in PROBES])

        with routes.use_routes(**choice):  # traced inside: the function keeps the routes
            if mode != "eager":
                step = tf.function(step, jit_compile=mode == "xla")
            grads = step(tf.constant(x))
        return np.array([g.numpy()[index] for g, (_, index) in zip(grads, PROBES)])

    assert np.abs(reference_gradients).min() > 1e-5  # every probe reaches the loss
    for choice in COVERING if mode == "xla" else COMBINATIONS:
        np.testing.assert_allclose(gradients(choice), reference_gradients, rtol=2e-3,
                                   atol=2e-5, err_msg=str(choice))


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_the_recomputed_gelu_and_layer_norm_give_autodiff_values_and_gradients(policy):
    """Forward bit for bit, gradients within rounding, in float32 and bfloat16, for both GELU
    forms."""
    rng = np.random.default_rng(0)
    norm = keras.layers.LayerNormalization(epsilon=1e-6, dtype=policy)
    norm.build((2, 5, 8))
    norm.set_weights([rng.normal(size=8), rng.normal(size=8)])
    dtype = keras.DTypePolicy(policy).compute_dtype
    x = tf.constant(rng.normal(size=(2, 5, 8)) * 3, dtype)
    w = tf.constant(rng.normal(size=(2, 5, 8)), tf.float32)

    def run(route, approximate):
        with tf.GradientTape() as tape:
            tape.watch(x)
            with routes.use_routes(layer_norm=route, gelu=route):
                y = routes.layer_norm(norm, x, True)
                z = routes.gelu(y, approximate, True)
            loss = tf.reduce_sum(tf.cast(z, tf.float32) * w)
        grads = tape.gradient(loss, [x, *norm.trainable_variables])
        return [tf.cast(t, tf.float32).numpy() for t in [y, z, *grads]]

    for approximate in (True, False):
        want, got = run("autodiff", approximate), run("recompute", approximate)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
        tolerance = 1e-5 if policy == "float32" else 0.05
        for g, ref in zip(got[2:], want[2:]):
            np.testing.assert_allclose(g, ref, rtol=tolerance, atol=tolerance * np.abs(ref).max())
        assert np.abs(want[2]).max() > 0.1


def test_attention_dropout_applies_to_the_probabilities_whatever_the_route(monkeypatch):
    """With attention dropout on, training takes the products (dropout needs the
    probabilities); the fused route would drop nothing. The fall-back is said once."""
    monkeypatch.setattr(routes, "_FELL_BACK", set())
    layer = keras_vit.MultiHeadDotProductAttention(2, attention_dropout_rate=0.5)
    x = np.random.default_rng(0).normal(size=(2, 7, 8)).astype("float32")
    with routes.use_routes(attention="fused"):
        inferred = keras.ops.convert_to_numpy(layer(x))
        with pytest.warns(UserWarning, match="'fused' attention route cannot take dropout"):
            trained = keras.ops.convert_to_numpy(layer(x, training=True))
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # once: not again
            layer(x, training=True)
    assert np.abs(trained - inferred).max() > 1e-3


def test_the_memory_efficient_route_says_why_it_cannot_apply(monkeypatch):
    monkeypatch.setattr(routes, "_FELL_BACK", set())
    model = keras_vit.ViT(image_size=16, patch_size=8, hidden_size=8, num_layers=1,
                          num_heads=2, mlp_dim=8, num_classes=3, position_embedding="relative")
    x = np.zeros((1, 16, 16, 3), np.float32)
    with routes.use_routes(attention="memory_efficient"):
        with pytest.warns(UserWarning, match=r"cannot take a bias on the logits \(relative"):
            model(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the default route applies: nothing to say
        keras_vit.ViT(image_size=16, patch_size=8, hidden_size=8, num_layers=1, num_heads=2,
                      mlp_dim=8, num_classes=3, position_embedding="relative")(x)


@pytest.mark.parametrize("vendor", ["AuthenticAMD", "GenuineIntel"])
def test_a_default_route_that_cannot_apply_gives_way_silently(vendor, monkeypatch):
    """In training on an AMD CPU the attention's default is "recompute", which takes no
    attention dropout and no bias: there the products run, with nothing to say (the user
    chose nothing), and the answer is theirs."""
    monkeypatch.setattr(routes, "_FELL_BACK", set())
    monkeypatch.setattr(keras.distribution, "list_devices", lambda: ["cpu:0"])
    monkeypatch.setattr(routes, "cpu_vendor", lambda: vendor)
    x = np.random.default_rng(1).normal(size=(2, 5, 8)).astype("float32")
    for options in (dict(attention_dropout_rate=0.5), dict(relative_positions=4)):
        layer = keras_vit.MultiHeadDotProductAttention(2, **options)
        layer(x)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = layer(x, training=True)
        with routes.use_routes(attention="products"):
            want = layer(x, training=True)
        if "relative_positions" in options:  # no dropout: the same function
            np.testing.assert_array_equal(keras.ops.convert_to_numpy(got),
                                          keras.ops.convert_to_numpy(want))


def test_the_memory_efficient_route_needs_the_sequence_length_when_traced(monkeypatch):
    """Traced for any number of tokens, the memory-efficient route cannot cut the sequence
    into blocks: the products run, with the same answer, and the warning says why."""
    monkeypatch.setattr(routes, "_FELL_BACK", set())
    layer = keras_vit.MultiHeadDotProductAttention(2)
    x = np.random.default_rng(1).normal(size=(2, 7, 8)).astype("float32")
    want = keras.ops.convert_to_numpy(layer(x))
    traced = tf.function(layer, input_signature=[tf.TensorSpec((None, None, 8), tf.float32)])
    with routes.use_routes(attention="memory_efficient"):
        with pytest.warns(UserWarning, match="cannot take a sequence length unknown when "
                                             "traced: the products"):
            got = traced(x).numpy()
    np.testing.assert_allclose(got, want, atol=1e-6)


def test_an_unknown_choice_has_no_default():
    with pytest.raises(ValueError, match="Unknown route choice 'attn'. Expected one of "
                                         "attention, block_input"):
        routes.default_route("attn", training=False)


# Attention on its own: 13 queries, cut into blocks of 4 (4 blocks, the last padded with 3
# rows), 5 (3 blocks, 2 padded) and 13 (one), against the float64 NumPy reference.
SHAPE = (2, 13, 3, 4)  # [B, N, h, k]


def attention_inputs():
    rng = np.random.default_rng(3)
    return [rng.normal(size=SHAPE) * 1.5 for _ in range(4)]  # query, key, value, weights


def reference_attention(q, k, v):
    """softmax(q k^T / sqrt(k)) v per head, in float64."""
    logits = np.einsum("bqhk,bshk->bhqs", q, k) / np.sqrt(q.shape[-1])
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    return np.einsum("bhqs,bshk->bqhk", probs, v)


@pytest.fixture(scope="module")
def reference_attention_gradients():
    """The output and d sum(output * weights) / d (query, key, value), every entry by central
    differences in float64."""
    q, k, v, w = attention_inputs()
    grads = []
    for index in range(3):
        inputs = [q, k, v]
        grad = np.zeros(SHAPE)
        for position in np.ndindex(SHAPE):
            values = []
            for step in (1e-6, -1e-6):
                moved = [x.copy() for x in inputs]
                moved[index][position] += step
                values.append((reference_attention(*moved) * w).sum())
            grad[position] = (values[0] - values[1]) / 2e-6
        grads.append(grad)
    return [reference_attention(q, k, v), *grads]


# The recomputing attentions on their own, by name: the memory-efficient one in blocks of 4, 5
# and 13 queries, and the products with their probabilities recomputed.
RECOMPUTING = {f"memory_efficient, block {block}":
               (lambda q, k, v, block=block:
                implementations.memory_efficient_attention(q, k, v, block=block))
               for block in (4, 5, 13)}
RECOMPUTING["recompute"] = implementations.recomputed_attention


@pytest.mark.parametrize("mode", ["eager", "graph", "xla"])
def test_the_recomputing_attentions_give_the_reference_values_and_gradients(
        mode, reference_attention_gradients):
    q, k, v, w = (tf.constant(x, tf.float32) for x in attention_inputs())

    def run(attention):
        def step(q, k, v):
            with tf.GradientTape() as tape:
                tape.watch([q, k, v])
                out = attention(q, k, v)
                loss = tf.reduce_sum(out * w)
            return [out, *tape.gradient(loss, [q, k, v])]

        if mode != "eager":
            step = tf.function(step, jit_compile=mode == "xla")
        return [t.numpy() for t in step(q, k, v)]

    assert np.abs(reference_attention_gradients[1]).max() > 0.1
    for name, attention in RECOMPUTING.items():
        for got, want in zip(run(attention), reference_attention_gradients):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16])
def test_the_recomputed_attention_is_the_products_bit_for_bit(dtype):
    """The context and the gradients of the queries, keys and values, eagerly and traced for
    any number of tokens (the route needs no sequence length), in float32 and bfloat16: the
    backward pass recomputes what autodiff of the products keeps."""
    q, k, v, w = (tf.constant(x, dtype) for x in attention_inputs())
    spec = tf.TensorSpec((None, None, 3, 4), dtype)

    def run(route, traced):
        def step(q, k, v):
            with tf.GradientTape() as tape:
                tape.watch([q, k, v])
                with routes.use_routes(attention=route):
                    out = routes.dot_product_attention(q, k, v, training=True)
                loss = tf.reduce_sum(tf.cast(out * w, tf.float32))
            return [out, *tape.gradient(loss, [q, k, v])]

        if traced:
            step = tf.function(step, input_signature=[spec] * 3)
        return [tf.cast(t, tf.float32).numpy() for t in step(q, k, v)]

    for traced in (False, True):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the route applies: no fallback to say
            got = run("recompute", traced)
        want = run("products", traced)
        assert np.abs(want[1]).max() > 0.01
        for g, ref in zip(got, want):
            np.testing.assert_array_equal(g, ref)


def test_the_memory_efficient_attention_in_bfloat16_gives_the_products_values():
    """bfloat16 inputs: both routes multiply in bfloat16 and take the softmax in float32."""
    q, k, v, w = (tf.constant(x, tf.bfloat16) for x in attention_inputs())

    def run(fn):
        with tf.GradientTape() as tape:
            tape.watch([q, k, v])
            out = fn(q, k, v)
            loss = tf.reduce_sum(tf.cast(out * w, tf.float32))
        return [tf.cast(t, tf.float32).numpy() for t in [out, *tape.gradient(loss, [q, k, v])]]

    want = run(routes.dot_product_attention)
    got = run(lambda q, k, v: implementations.memory_efficient_attention(q, k, v, block=4))
    assert got[0].dtype == np.float32 and want[0].shape == got[0].shape
    for g, ref in zip(got, want):
        np.testing.assert_allclose(g, ref, rtol=0.05, atol=0.05 * np.abs(ref).max())


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_the_narrow_softmax_keeps_only_the_16_bit_probabilities(dtype):
    """Mixed precision: the softmax runs in float32. Through autodiff the backward pass reads
    its float32 result; with the route `softmax="narrow"` it reads only the 16-bit result
    (softmax's gradient computed from it in float32), so the float32 probabilities feed only
    their cast, and the gradients are autodiff's within 16-bit precision (float64
    reference)."""
    q, k, v, w = (tf.constant(x, dtype) for x in attention_inputs())

    def traced(softmax):
        def step(q, k, v):
            with tf.GradientTape() as tape:
                tape.watch([q, k, v])
                with routes.use_routes(attention="products", softmax=softmax):
                    out = routes.dot_product_attention(q, k, v, training=True)
                loss = tf.reduce_sum(tf.cast(out * w, tf.float32))
            return tape.gradient(loss, [q, k, v])

        function = tf.function(step).get_concrete_function(q, k, v)
        softmax_ops = [op for op in function.graph.get_operations() if op.type == "Softmax"]
        assert len(softmax_ops) == 1 and softmax_ops[0].outputs[0].dtype == tf.float32
        return function, sorted(op.type for op in softmax_ops[0].outputs[0].consumers())

    autodiff, read_by = traced("autodiff")
    assert len(read_by) > 1 and "Cast" in read_by  # the backward pass reads them too
    narrow, read_by = traced("narrow")
    assert read_by == ["Cast"]
    q64, k64, v64, w64 = (tf.cast(x, tf.float64) for x in (q, k, v, w))
    with tf.GradientTape() as tape:
        tape.watch([q64, k64, v64])
        loss = tf.reduce_sum(routes.dot_product_attention(q64, k64, v64) * w64)
    want = [g.numpy() for g in tape.gradient(loss, [q64, k64, v64])]
    for function in (autodiff, narrow):
        for g, ref in zip(function(q, k, v), want):
            np.testing.assert_allclose(tf.cast(g, tf.float32).numpy(), ref,
                                       atol=0.05 * np.abs(ref).max())


@pytest.mark.parametrize("dtype, tolerance", [("bfloat16", 1e-2), ("float16", 1e-3)])
def test_the_narrow_softmax_gradient_is_softmaxs_within_16_bit_precision(dtype, tolerance):
    """`softmax_as`: the 16-bit probabilities, and the logits' gradient within one 16-bit
    step of float64's (relative to the largest), its backward pass reading the kept
    probabilities only once the upstream gradient exists (not during the forward pass)."""
    rng = np.random.default_rng(4)
    logits = rng.normal(0, 3, (2, 3, 5, 7))
    upstream = rng.normal(0, 1, logits.shape)
    probs64 = np.exp(logits - logits.max(-1, keepdims=True))
    probs64 /= probs64.sum(-1, keepdims=True)
    want = probs64 * (upstream - (upstream * probs64).sum(-1, keepdims=True))

    def step(x, g):
        with tf.GradientTape() as tape:
            tape.watch(x)
            probs = implementations.softmax_as(x, dtype)
            loss = tf.reduce_sum(tf.cast(probs, tf.float32) * g)
        return probs, tape.gradient(loss, x)

    traced = tf.function(step).get_concrete_function(tf.constant(logits, tf.float32),
                                                     tf.constant(upstream, tf.float32))
    probs, grad = traced(tf.constant(logits, tf.float32), tf.constant(upstream, tf.float32))
    assert probs.dtype == dtype and grad.dtype == tf.float32
    np.testing.assert_allclose(tf.cast(probs, tf.float32).numpy(), probs64, atol=tolerance)
    np.testing.assert_allclose(grad.numpy(), want, atol=tolerance * np.abs(want).max())
    widened = [op for op in traced.graph.get_operations() if op.type == "Cast"
               and op.inputs[0].dtype == dtype and op.outputs[0].dtype == tf.float32
               and op.inputs[0].op.type == "Identity"]
    assert widened and all(op.inputs[0].op.control_inputs for op in widened)


def test_the_memory_efficient_attention_holds_no_square_tensor_and_one_block_at_a_time():
    """The traced training step of the route has no `[B, h, N, N]` tensor, forward or
    backward; its loops run one block at a time (a TensorFlow while loop otherwise runs up to
    10 iterations at once, each with its block's logits alive). The products route has one.
    (Traced only: three blocks of the route's size.)"""
    length = 2 * implementations.ATTENTION_BLOCK + 44
    q, k, v, w = (tf.zeros((2, length, 3, 4)) for _ in range(4))

    def graph(route):
        def step(q, k, v):
            with tf.GradientTape() as tape:
                tape.watch([q, k, v])
                with routes.use_routes(attention=route):
                    out = routes.dot_product_attention(q, k, v, training=True)
                loss = tf.reduce_sum(out * w)
            return tape.gradient(loss, [q, k, v])

        return tf.function(step).get_concrete_function(q, k, v).graph

    def square(g):
        return [op.name for op in g.get_operations() for t in op.outputs
                if t.shape.rank and t.shape.rank >= 2 and t.shape[-2:] == (length, length)]

    assert square(graph("products"))
    efficient = graph("memory_efficient")
    assert not square(efficient)
    loops = [op for op in efficient.get_operations() if op.type in ("While", "StatelessWhile")]
    assert len(loops) == 2  # forward and backward
    assert all(op.get_attr("parallel_iterations") == 1 for op in loops)
    bodies = [efficient._functions[op.get_attr("body").name].graph for op in loops]
    assert not any(square(body) for body in bodies)


def graph_ancestors(tensors):
    """The names of the operations `tensors` depend on, by data or by control, theirs
    included."""
    seen, todo = set(), [t.op for t in tensors]
    while todo:
        op = todo.pop()
        if op.name not in seen:
            seen.add(op.name)
            todo.extend([t.op for t in op.inputs] + list(op.control_inputs))
    return seen


@pytest.mark.parametrize("route", ["memory_efficient", "recompute"])
def test_the_recomputing_attentions_compute_nothing_of_their_backward_pass_early(route):
    """In TensorFlow's graph runtime an operation runs as soon as its inputs exist: every
    operation of the route's backward pass that makes a `[B, h, ., k or N]` tensor waits for
    the upstream gradient, so none runs during the forward pass and holds its result until
    the backward pass (a transposed copy of the queries, keys or values, zeros, a block's
    probabilities). The memory-efficient forward pass keeps the log-sum-exp, `[B, h, N, 1]`,
    on purpose."""
    q, k, v, w = (tf.zeros((2, 130, 3, 4)) for _ in range(4))

    def step(q, k, v, w):
        with tf.GradientTape() as tape:
            tape.watch([q, k, v])
            with routes.use_routes(attention=route):
                out = tf.identity(routes.dot_product_attention(q, k, v, training=True),
                                  name="forward_output")
        return tape.gradient(out, [q, k, v], output_gradients=w)  # the upstream gradient

    graph = tf.function(step).get_concrete_function(q, k, v, w).graph
    forward = graph_ancestors([graph.get_operation_by_name("forward_output").outputs[0]])
    upstream = next(op.name for op in graph.get_operations()
                    if op.type == "Placeholder" and op.name.startswith("w"))
    early = [op.name for op in graph.get_operations()
             if op.name in graph_ancestors(graph.outputs) - forward
             and any(t.shape.rank == 4 and t.shape[-1] > 1 and t.dtype.is_floating
                     for t in op.outputs)
             and upstream not in graph_ancestors(op.outputs)]
    assert not early


@pytest.mark.parametrize("remat", ["none", "blocks"])
@pytest.mark.parametrize("policy, attention", [("float32", "memory_efficient"),
                                               ("mixed_bfloat16", "recompute")])
def test_a_training_step_computes_nothing_of_its_backward_pass_during_the_forward_pass(
        remat, policy, attention):
    """Every route's custom backward pass (recomputed GELU derivatives and layer norms, the
    memory-efficient attention, each block recomputed) waits for the upstream gradient, as
    TensorFlow's own gradients do: in its graph runtime an operation runs as soon as its
    inputs exist, and one that reads only forward tensors would run during the forward pass
    and hold its result until the backward pass, defeating the recomputation. Every other
    choice at its last route: all the custom gradients at once, inside recomputed blocks or
    not (a recomputed block waits as a whole, which would hide the others); in float32 with
    the memory-efficient attention, in bfloat16 with the recomputed one (and GELU's compiled
    pass)."""
    chosen = dict(COMBINATIONS[-1], remat=remat, attention=attention)
    keras.config.set_dtype_policy(policy)  # the suite's fixture sets float32 back
    model = keras_vit.ViT(**CONFIG)
    x, seed = tf.constant(images()), tf.zeros((3, CONFIG["num_classes"]))

    def step(x, seed):
        with tf.GradientTape() as tape, routes.use_routes(**chosen):
            logits = tf.identity(model(x, training=True), name="forward_output")
        return tape.gradient(logits, model.trainable_variables, output_gradients=seed)

    graph = tf.function(step).get_concrete_function(x, seed).graph
    forward = graph_ancestors([graph.get_operation_by_name("forward_output").outputs[0]])
    placeholders = [op.name for op in graph.get_operations() if op.type == "Placeholder"]
    upstream = next(name for name in placeholders if name.startswith("seed"))
    images_in = next(name for name in placeholders if name.startswith("x"))
    # Operations of the backward pass that compute from the images (not from the weights
    # alone) without waiting for the upstream gradient; an identity computes nothing.
    early = [op.name for op in graph.get_operations()
             if op.name in graph_ancestors(graph.outputs) - forward
             and op.type not in ("Identity", "IdentityN")
             and any(t.shape.rank and t.shape.rank >= 2 and t.shape[-1] > 1
                     and t.dtype.is_floating for t in op.outputs)
             and images_in in graph_ancestors(op.outputs)
             and upstream not in graph_ancestors(op.outputs)]
    assert not early


ON_JAX = textwrap.dedent("""
    import json, sys
    import jax, keras, numpy as np
    from keras_vit import implementations

    assert keras.backend.backend() == "jax"
    q, k, v, w = (np.asarray(x, np.float32) for x in json.loads(sys.argv[1]))
    attentions = {f"block {block}": (lambda q, k, v, block=block:
                  implementations.memory_efficient_attention(q, k, v, block=block))
                  for block in (4, 5, 13)}
    attentions["recompute"] = implementations.recomputed_attention
    results = {}
    for name, attention in attentions.items():
        def loss(q, k, v):
            return (attention(q, k, v) * w).sum()

        for mode, fn in (("eager", jax.grad(loss, (0, 1, 2))),
                         ("jit", jax.jit(jax.grad(loss, (0, 1, 2))))):
            out = attention(q, k, v)
            results[f"{name}-{mode}"] = [np.asarray(t).tolist() for t in (out, *fn(q, k, v))]
    # The default of each route on JAX, per CPU vendor, device, mode and dtype.
    from keras_vit import routes
    defaults = {}
    for vendor in ("AuthenticAMD", "GenuineIntel"):
        routes.cpu_vendor = lambda vendor=vendor: vendor
        for device in ("cpu", "gpu"):
            keras.distribution.list_devices = lambda device=device: [f"{device}:0"]
            for choice in routes.CHOICES:
                for training in (False, True):
                    for dtype in ("float32", "bfloat16"):
                        key = " ".join([vendor, device, choice, str(training), dtype])
                        defaults[key] = routes.route(choice, training, dtype)
    print(json.dumps(dict(attention=results, defaults=defaults)))
""")


@pytest.fixture(scope="module")
def on_jax_answers():
    """What the JAX process of `ON_JAX` printed: the attentions' values and gradients, and
    the routes' defaults."""
    env = dict(os.environ, KERAS_BACKEND="jax", TF_CPP_MIN_LOG_LEVEL="3")
    inputs = json.dumps([x.tolist() for x in attention_inputs()])
    done = subprocess.run([sys.executable, "-c", ON_JAX, inputs], capture_output=True, text=True,
                          env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_the_recomputing_attentions_give_the_reference_on_jax(
        on_jax_answers, reference_attention_gradients):
    results = on_jax_answers["attention"]
    assert len(results) == 8
    for name, values in results.items():
        for got, want in zip(values, reference_attention_gradients):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=name)


# The performance guide's routes table: what users read the defaults in.
GUIDE = REPO / "docs" / "guides" / "performance.md"


def documented_routes():
    """{choice: (its routes, its default)} from the performance guide's routes table, where a
    default reads "`A` CONDITION[, else `B`]": A where every part of the condition holds,
    else B (else the choice's other route)."""
    rows = re.findall(r"^\| `(\w+)` \| ((?:`\w+`(?:, )?)+) \| ([^|]+) \|", GUIDE.read_text(),
                      re.MULTILINE)
    return {name: (tuple(re.findall(r"`(\w+)`", listed)), default.strip())
            for name, listed, default in rows}


def documented_default(listed, default, training, dtype, device, vendor, backend=None):
    """The route a default "`A` CONDITION, `B` CONDITION[, else `C`]" names: the first whose
    every part of the condition holds, else C (else the choice's route the default does not
    name). `backend`: Keras' (default: this process's)."""
    backend = backend or keras.backend.backend()
    holds = {"at inference": not training, "training": training, "float32": dtype == "float32",
             "on a GPU": device == "gpu", "on a CPU": device == "cpu",
             "on an AMD CPU": device == "cpu" and vendor == "AuthenticAMD",
             "on JAX": backend == "jax", "on TensorFlow": backend == "tensorflow"}
    clauses = re.findall(r"`(\w+)`([^`]*)", default)
    for route, condition in clauses:
        condition = re.sub(r"\belse\b", "", condition).strip(" ,")
        unread = re.sub("|".join(sorted(holds, key=len, reverse=True)) + r"|\bin\b", "",
                        condition).strip(" ,")
        assert not unread, f"a condition this test cannot read: {unread!r} in {default!r}"
        if all(value for phrase, value in holds.items() if phrase in condition):
            return route
    named = [route for route, _ in clauses]
    return next(route for route in listed if route not in named)


@pytest.mark.parametrize("vendor", ["AuthenticAMD", "GenuineIntel"])
@pytest.mark.parametrize("device", ["cpu", "gpu"])
def test_the_defaults_are_those_the_performance_guide_states(device, vendor, monkeypatch):
    """The guide's routes table names every choice with its routes, and each default is the
    route that runs in each mode, precision, device and CPU."""
    monkeypatch.setattr(keras.distribution, "list_devices", lambda: [f"{device}:0"])
    monkeypatch.setattr(routes, "cpu_vendor", lambda: vendor)
    documented = documented_routes()
    assert {name: listed for name, (listed, _) in documented.items()} == routes.CHOICES
    for name, (listed, default) in documented.items():
        for training in (False, True):
            for dtype in ("float32", "bfloat16"):
                want = documented_default(listed, default, training, dtype, device, vendor)
                assert routes.route(name, training, dtype) == want, (name, training, dtype)


def test_the_defaults_on_jax_are_those_the_performance_guide_states(on_jax_answers):
    documented = documented_routes()
    for key, got in on_jax_answers["defaults"].items():
        vendor, device, name, training, dtype = key.split()
        listed, default = documented[name]
        want = documented_default(listed, default, training == "True", dtype, device, vendor,
                                  backend="jax")
        assert got == want, key
    assert len(on_jax_answers["defaults"]) == 2 * 2 * len(documented) * 2 * 2


def test_a_route_is_chosen_per_block_or_per_process_and_auto_gives_the_default(monkeypatch):
    monkeypatch.setattr(keras.distribution, "list_devices", lambda: ["gpu:0"])
    monkeypatch.setattr(routes, "_PROCESS", {})
    assert routes.route("attention", False) == "fused"
    with routes.use_routes(attention="products"):
        assert routes.route("attention", False) == "products"
        with routes.use_routes(attention="auto"):  # the default again
            assert routes.route("attention", False) == "fused"
    assert routes.set_routes(attention="products") == {"attention": "products"}
    assert routes.route("attention", False) == "products"
    with routes.use_routes(attention="fused"):  # a block over the process
        assert routes.route("attention", False) == "fused"
    assert routes.set_routes(attention="auto") == {}
    assert routes.route("attention", False) == "fused"


def test_the_rows_route_feeds_each_matmul_to_its_bias_add():
    """With the MLP on rows, each inference MatMul of the traced graph feeds its bias add
    (the pattern TensorFlow's graph runtime fuses with the GELU); on the token sequence, a
    Reshape of tensordot follows it. Both compute the same, for a dynamic batch too."""
    block = keras_vit.MlpBlock(48)
    x = np.random.default_rng(0).normal(size=(2, 5, 32)).astype("float32")
    block(x)
    spec = tf.TensorSpec((None, None, 32), tf.float32)

    def matmul_consumers(route):
        with routes.use_routes(mlp=route):
            traced = tf.function(lambda t: block(t)).get_concrete_function(spec)
        matmuls = [op for op in traced.graph.get_operations() if op.type == "MatMul"]
        assert len(matmuls) == 2
        return {c.type for op in matmuls for c in op.outputs[0].consumers()}, traced(x)

    rows, by_rows = matmul_consumers("rows")
    tokens, by_tokens = matmul_consumers("tokens")
    assert "Reshape" not in rows and "Reshape" in tokens
    np.testing.assert_allclose(by_rows, by_tokens, atol=1e-5)


@pytest.mark.parametrize("value, message", [
    (dict(attn="fused"), "Unknown route choice 'attn'. Expected some of 'attention', "
                         "'block_input'"),
    (dict(attention="flash"), "Route 'attention' must be one of 'auto', 'products', 'fused', "
                              "'recompute', 'memory_efficient'. Received: 'flash'"),
    (dict(softmax=16), "Route 'softmax' must be one of 'auto', 'autodiff', 'narrow'. "
                       "Received: 16"),
])
def test_bad_route_choices_name_the_problem(value, message):
    with pytest.raises(ValueError, match=message):
        with routes.use_routes(**value):
            pass
    with pytest.raises(ValueError, match=message):
        routes.set_routes(**value)
    assert routes.chosen_routes() == {}


def test_a_route_is_no_argument_of_the_model():
    with pytest.raises(TypeError, match="kernels"):
        keras_vit.ViT(**CONFIG, kernels={"attention": "fused"})


def kept_for_the_backward_pass(model, x, y):
    """The shapes of the forward pass's tensors that the backward pass of a traced training
    step reads (what the graph runtime keeps between the passes)."""
    def step(x):
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))
            loss = tf.identity(loss, name="the_loss")
        return tape.gradient(loss, model.trainable_variables)

    graph = tf.function(step).get_concrete_function(tf.constant(x)).graph
    loss = graph.get_operation_by_name("the_loss")
    forward, stack = set(), [loss]
    while stack:  # the loss and everything it is computed from
        op = stack.pop()
        if op not in forward:
            forward.add(op)
            stack.extend(t.op for t in op.inputs)
    return [tuple(t.shape) for op in graph.get_operations() if op not in forward
            for t in op.inputs if t.op in forward and t.op.type not in ("ReadVariableOp", "Const")]


@pytest.mark.parametrize("between", ["nothing", "dropout", "lora"])
def test_the_recomputed_gelu_keeps_no_hidden_activation_of_the_mlp(between):
    """With GELU recomputed (the float32 training default), the backward pass reads each
    MLP's input to GELU only: GELU's output, the second Dense's input, is computed again;
    not where something stands between them (dropout) or the Dense is not a plain one (LoRA),
    which then take GELU's own recomputation and the Dense's autodiff."""
    model = keras_vit.ViT(image_size=16, patch_size=8, hidden_size=8, num_layers=2, num_heads=2,
                          mlp_dim=24, num_classes=3, dropout_rate=0.1 * (between == "dropout"))
    if between == "lora":
        for block in range(2):
            model.get_layer(f"encoderblock_{block}").mlp.dense_1.enable_lora(2)
    x, y = images(2)[:, :16, :16], np.arange(2)

    def hidden(route):
        with routes.use_routes(gelu=route):
            return [s for s in kept_for_the_backward_pass(model, x, y) if s[-1:] == (24,)]

    if between == "nothing":
        assert len(hidden("recompute")) == 2  # one per block: the first Dense's output
    else:
        assert 2 < len(hidden("recompute"))
    assert len(hidden("recompute")) < len(hidden("autodiff"))


def test_the_recomputed_attention_keeps_no_probabilities_for_the_backward_pass():
    """With attention's route "recompute", the backward pass of a training step reads no
    `[B, h, N, N]` tensor of the forward pass; with the products it reads each block's."""
    model = keras_vit.ViT(image_size=16, patch_size=4, hidden_size=8, num_layers=2,
                          num_heads=2, mlp_dim=24, num_classes=3)
    x, y = images(2)[:, :16, :16], np.arange(2)
    tokens = 17

    def square(route):
        with routes.use_routes(attention=route):
            return [s for s in kept_for_the_backward_pass(model, x, y)
                    if s[-2:] == (tokens, tokens)]

    assert len(square("products")) >= 2  # one per block at least
    assert not square("recompute")


@pytest.mark.parametrize("approximate", [True, False])
def test_gelu_and_its_derivative_from_one_pass_give_keras_gelu_bit_for_bit(approximate):
    """What the recomputing backward passes read: the forward pass's float32 GELU values
    (`tf.nn.gelu`'s) bit for bit, and the derivative within float32 rounding of float64
    autodiff's through TensorFlow's own GELU."""
    x = tf.constant(np.random.default_rng(0).normal(size=10000).astype("float32") * 4)
    value, derivative = implementations.gelu_and_derivative(x, approximate)
    np.testing.assert_array_equal(value.numpy(),
                                  keras.activations.gelu(x, approximate=approximate).numpy())
    x64 = tf.cast(x, "float64")
    with tf.GradientTape() as tape:
        tape.watch(x64)
        y64 = tf.nn.gelu(x64, approximate=approximate)
    reference = tape.gradient(y64, x64).numpy()
    np.testing.assert_allclose(derivative.numpy(), reference, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_recomputed_gelu_and_dense_give_autodiff_values_and_gradients(dtype):
    """Forward bit for bit, gradients within the dtype's rounding (the route's dtypes: in
    float64, TensorFlow's GELU rounds its constants to float32, so the MLP takes autodiff)."""
    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(size=(2, 5, 6)) * 3, dtype)
    kernel = tf.constant(rng.normal(size=(6, 4)), dtype)
    bias = tf.constant(rng.normal(size=4), dtype)
    w = tf.constant(rng.normal(size=(2, 5, 4)), dtype)

    def run(fused, approximate):
        with tf.GradientTape() as tape:
            tape.watch([x, kernel, bias])
            if fused:
                y = implementations.recomputed_gelu_dense(x, kernel, bias, approximate)
            else:
                y = keras.activations.gelu(x, approximate=approximate) @ kernel + bias
            loss = tf.reduce_sum(y * w)
        grads = tape.gradient(loss, [x, kernel, bias])
        return [tf.cast(t, tf.float64).numpy() for t in [y, *grads]]

    for approximate in (True, False):
        want, got = run(False, approximate), run(True, approximate)
        np.testing.assert_array_equal(got[0], want[0])
        tolerance = {"float32": 1e-5, "bfloat16": 0.05}[dtype]
        for g, ref in zip(got[1:], want[1:]):
            np.testing.assert_allclose(g, ref, rtol=tolerance, atol=tolerance * np.abs(ref).max())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_recomputed_gelu_runs_as_one_compiled_pass_for_16_bit_inputs(dtype):
    """For a 16-bit input, GELU's recomputation and gradient (in float32, with their casts) run
    as one XLA computation inside the graph runtime's step, which gives the eager values bit
    for bit; a float32 input keeps the graph runtime's own operations, those of the forward
    pass (which the graph runtime may fuse differently from eager ones)."""
    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(size=(2, 5, 6)) * 3, dtype)
    kernel = tf.constant(rng.normal(size=(6, 4)), dtype)
    bias = tf.constant(rng.normal(size=4), dtype)

    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = implementations.recomputed_gelu_dense(x, kernel, bias, True)
            z = implementations.recomputed_gelu(x, False)
            loss = tf.reduce_sum(tf.cast(y, tf.float32)) + tf.reduce_sum(tf.cast(z, tf.float32))
        return tape.gradient(loss, x)

    traced = tf.function(step)
    graph = traced.get_concrete_function(x).graph
    compiled = [op for op in graph.get_operations() if op.type.endswith("PartitionedCall")
                and op.node_def.attr["_XlaMustCompile"].b]
    assert len(compiled) == (2 if dtype == "bfloat16" else 0)
    got, want = (tf.cast(t, tf.float32).numpy() for t in (traced(x), step(x)))
    assert np.abs(want).max() > 0.1
    if dtype == "bfloat16":
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
