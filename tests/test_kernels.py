"""The seam (`keras_vit.kernels`): every implementation of every choice computes the same
model, forward and backward, eagerly, in TensorFlow's graph runtime and under XLA; the
defaults are the measured table; the `kernels` option is checked and saved with the model.
(The JAX side, the gradient barrier among it, is in tests/test_jax.py.)"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_vit
from keras_vit import kernels, weights
from reference import forward, official_params

CONFIG = dict(image_size=(16, 24), patch_size=8, hidden_size=16, num_layers=2, num_heads=2,
              mlp_dim=32, num_classes=5)
# Every implementation of every choice (one choice at a time, the others at their defaults),
# and every choice at its first and at its last implementation together.
COMBINATIONS = [{name: route} for name, routes in kernels.CHOICES.items() for route in routes] \
    + [{name: routes[0] for name, routes in kernels.CHOICES.items()},
       {name: routes[-1] for name, routes in kernels.CHOICES.items()}]


def images(count=3, seed=1):
    return np.random.default_rng(seed).uniform(-1, 1, (count, 16, 24, 3)).astype("float32")


def loaded_model(choice, params):
    model = keras_vit.ViT(**CONFIG, kernels=choice)
    weights.load_params(model, params)
    return model


@pytest.fixture(scope="module")
def params():
    return official_params(np.random.default_rng(0), hidden=16, mlp=32, heads=2, layers=2,
                           patch=(8, 8), grid=(2, 3), num_classes=5)


@pytest.mark.parametrize("choice", COMBINATIONS,
                         ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_every_implementation_gives_the_reference_logits(choice, params):
    model = loaded_model(choice, params)
    expected, _, attentions = forward(params, images())
    assert np.abs(expected).max() > 0.1
    for training in (False, True):  # no dropout: the same function in both modes
        logits = keras.ops.convert_to_numpy(model(images(), training=training))
        np.testing.assert_allclose(logits, expected, atol=1e-5, rtol=1e-5)
    probe = keras.Model(model.input, [model.get_layer(f"encoderblock_{i}").output[1]
                                      for i in range(2)])
    for probs, want in zip(probe(images()), attentions):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(probs), want, atol=1e-5)


@pytest.mark.parametrize("mode", ["eager", "graph", "xla"])
def test_every_implementation_gives_the_same_gradients(mode, params):
    x, y = images(), np.arange(3)

    def gradients(choice):
        model = loaded_model(choice, params)

        def step(x):
            with tf.GradientTape() as tape:
                logits = model(x, training=True)
                loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))
            return tape.gradient(loss, model.trainable_variables)

        if mode != "eager":
            step = tf.function(step, jit_compile=mode == "xla")
        return [g.numpy() for g in step(tf.constant(x))]

    want = gradients(COMBINATIONS[0])
    assert max(np.abs(g).max() for g in want) > 1e-3
    for choice in COMBINATIONS[1:]:
        for got, expected in zip(gradients(choice), want):
            np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-6)


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
            y = kernels.layer_norm(norm, x, True, {"layer_norm": route})
            z = kernels.gelu(y, approximate, True, {"gelu": route})
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


def test_attention_dropout_applies_to_the_probabilities_whatever_the_route():
    """With attention dropout on, training takes the products (dropout needs the
    probabilities); the fused route would drop nothing."""
    layer = keras_vit.MultiHeadDotProductAttention(2, attention_dropout_rate=0.5,
                                                   kernels={"attention": "fused"})
    x = np.random.default_rng(0).normal(size=(2, 7, 8)).astype("float32")
    inferred = keras.ops.convert_to_numpy(layer(x))
    trained = keras.ops.convert_to_numpy(layer(x, training=True))
    assert np.abs(trained - inferred).max() > 1e-3


def test_the_defaults_are_the_measured_table(monkeypatch):
    # On this machine's CPU (TensorFlow): the products, the MLP's rows at inference only, no
    # barrier (the residual stream's barrier is for XLA on CPUs under JAX), the LayerNorms
    # recomputed in training, the GELU in float32 training only.
    assert [kernels.default_kernel("attention", training) for training in (False, True)] == \
        ["products", "products"]
    assert [kernels.default_kernel("mlp", training) for training in (False, True)] == \
        ["rows", "tokens"]
    assert kernels.default_kernel("block_input", training=True) == "plain"
    assert [kernels.default_kernel("layer_norm", training, "bfloat16")
            for training in (False, True)] == ["autodiff", "recompute"]
    assert [kernels.default_kernel("gelu", True, dtype) for dtype in ("float32", "bfloat16")] \
        == ["recompute", "autodiff"]
    assert kernels.implementation(None, "gelu", True, tf.float32) == "recompute"
    # On a GPU: the fused attention at inference.
    monkeypatch.setattr(keras.distribution, "list_devices", lambda: ["gpu:0"])
    assert [kernels.default_kernel("attention", training) for training in (False, True)] == \
        ["fused", "products"]
    assert kernels.implementation({"attention": "fused"}, "attention", True) == "fused"
    assert kernels.implementation({"attention": "auto"}, "attention", False) == "fused"


def test_the_rows_route_feeds_each_matmul_to_its_bias_add():
    """With the MLP on rows, each inference MatMul of the traced graph feeds its bias add
    (the pattern TensorFlow's graph runtime fuses with the GELU); on the token sequence, a
    Reshape of tensordot follows it. Both compute the same, for a dynamic batch too."""
    block = keras_vit.MlpBlock(48)
    x = np.random.default_rng(0).normal(size=(2, 5, 32)).astype("float32")
    block(x)
    spec = tf.TensorSpec((None, None, 32), tf.float32)

    def matmul_consumers(route):
        block.kernels = {"mlp": route}
        traced = tf.function(lambda t: block(t)).get_concrete_function(spec)
        matmuls = [op for op in traced.graph.get_operations() if op.type == "MatMul"]
        assert len(matmuls) == 2
        return {c.type for op in matmuls for c in op.outputs[0].consumers()}, traced(x)

    rows, by_rows = matmul_consumers("rows")
    tokens, by_tokens = matmul_consumers("tokens")
    assert "Reshape" not in rows and "Reshape" in tokens
    np.testing.assert_allclose(by_rows, by_tokens, atol=1e-5)


@pytest.mark.parametrize("value, message", [
    ("fused", "must be None or a dict"),
    ({"attn": "fused"}, "Unknown kernel choice 'attn' in `kernels`. Expected some of "
                          "'attention', 'block_input'"),
    ({"attention": "flash"}, "must be one of 'auto', 'products', 'fused'. Received: 'flash'"),
])
def test_bad_kernel_choices_name_the_problem(value, message):
    with pytest.raises(ValueError, match=message):
        keras_vit.ViT(**CONFIG, kernels=value)


def test_the_choice_is_saved_with_the_model(tmp_path, params):
    model = loaded_model({"attention": "products"}, params)
    assert keras_vit.vit_config(model)["kernels"] == {"attention": "products"}
    assert keras_vit.vit_config(loaded_model(None, params))["kernels"] is None
    model.save(tmp_path / "m.keras")
    again = keras.saving.load_model(tmp_path / "m.keras")
    assert again.get_layer("encoderblock_1").attention.kernels == {"attention": "products"}
    np.testing.assert_allclose(again.predict(images(), verbose=0),
                               model.predict(images(), verbose=0), atol=1e-6)
