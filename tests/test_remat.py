"""Rematerialisation (the route `remat="blocks"`, and `remat=True`, the encoder's saved option
that chooses it): the same outputs and gradients as without it, dropout included (the
recomputation must draw the forward pass's masks), eagerly and under XLA."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_vit
from keras_vit import Encoder, TransformerBlock, routes


def seed_variables(layer):
    return [v for v in layer.variables if "seed_generator_state" in v.path]


def twin_blocks(dropout, attention_dropout):
    plain = Encoder(2, 4, 64, dropout_rate=dropout, attention_dropout_rate=attention_dropout)
    remat = Encoder(2, 4, 64, dropout_rate=dropout, attention_dropout_rate=attention_dropout,
                    remat=True)
    plain.build((2, 5, 32))
    remat.build((2, 5, 32))
    remat.set_weights(plain.get_weights())
    for a, b in zip(seed_variables(plain), seed_variables(remat)):
        b.assign(a)  # the same dropout masks
    return plain, remat


def outputs_and_gradients(layer, x, jit):
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x, training=True)
            loss = tf.reduce_sum(y * y)
        grads = tape.gradient(loss, [x] + layer.trainable_variables)
        return y, grads

    if jit is not None:
        step = tf.function(step, jit_compile=jit)
    y, grads = step(tf.constant(x))
    return [y.numpy()] + [g.numpy() for g in grads]


@pytest.mark.parametrize("jit", [None, False, True], ids=["eager", "graph", "xla"])
@pytest.mark.parametrize("dropout", [(0.0, 0.0), (0.2, 0.3)])
def test_remat_block_matches_the_plain_block(dropout, jit):
    plain, remat = twin_blocks(*dropout)
    x = np.random.default_rng(0).normal(size=(2, 5, 32)).astype("float32")
    want = outputs_and_gradients(plain, x, jit)
    got = outputs_and_gradients(remat, x, jit)
    assert np.abs(want[1]).max() > 1  # the gradient is not trivially zero
    for a, b in zip(want, got):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)
    # Both advanced their seeds alike: the next step draws new masks, still the same ones.
    for a, b in zip(seed_variables(plain), seed_variables(remat)):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


@pytest.mark.parametrize("jit", [None, False, True], ids=["eager", "graph", "xla"])
def test_the_remat_route_gives_a_block_its_values_gradients_and_dropout_masks(jit):
    blocks = [TransformerBlock(4, 64, dropout_rate=0.2, attention_dropout_rate=0.3)
              for _ in range(2)]
    for block in blocks:
        block.build((2, 5, 32))
    blocks[1].set_weights(blocks[0].get_weights())
    for a, b in zip(seed_variables(blocks[0]), seed_variables(blocks[1])):
        b.assign(a)
    x = np.random.default_rng(0).normal(size=(2, 5, 32)).astype("float32")
    want = outputs_and_gradients(blocks[0], x, jit)
    with routes.use_routes(remat="blocks"):
        got = outputs_and_gradients(blocks[1], x, jit)
    for a, b in zip(want, got):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)
    for a, b in zip(seed_variables(blocks[0]), seed_variables(blocks[1])):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def softmaxes_in_a_training_step(model, x):
    """Softmax operations in a traced training step, with the attention's products (whose
    backward pass recomputes nothing) on every CPU."""
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x, training=True))
        return tape.gradient(loss, model.trainable_variables)

    with routes.use_routes(attention="products"):
        graph = tf.function(step).get_concrete_function(tf.constant(x)).graph
    return sum(op.type == "Softmax" for op in graph.get_operations())


def test_the_remat_route_recomputes_every_block_and_is_not_saved(tmp_path):
    model = keras_vit.ViT(image_size=16, patch_size=4, hidden_size=32, num_layers=2,
                          num_heads=4, mlp_dim=64, num_classes=5)
    x = np.zeros((2, 16, 16, 3), "float32")
    assert softmaxes_in_a_training_step(model, x) == 2  # each block's, once
    with routes.use_routes(remat="blocks"):
        assert softmaxes_in_a_training_step(model, x) == 4  # and again in the backward pass
    model.save(tmp_path / "m.keras")
    again = keras.saving.load_model(tmp_path / "m.keras")
    assert "remat" not in keras_vit.vit_config(again)
    assert softmaxes_in_a_training_step(again, x) == 2


def test_remat_model_trains_like_the_plain_model_and_round_trips(tmp_path):
    config = dict(image_size=16, patch_size=4, hidden_size=32, num_layers=2, num_heads=4,
                  mlp_dim=64, num_classes=5)
    plain = keras_vit.ViT(**config)
    remat = keras_vit.ViT(remat=True, **config)
    assert keras_vit.vit_config(remat)["remat"] is True
    remat.set_weights(plain.get_weights())
    rng = np.random.default_rng(1)
    x, y = rng.uniform(-1, 1, (4, 16, 16, 3)).astype("float32"), np.arange(4)
    routed = keras_vit.ViT(**config)  # the plain model, trained under the remat route
    routed.set_weights(plain.get_weights())
    losses = []
    for model in (plain, remat, routed):
        model.compile(optimizer=keras.optimizers.Adam(1e-3), jit_compile=False,  # XLA: above
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        with routes.use_routes(remat="blocks" if model is routed else "none"):
            losses.append([float(model.train_on_batch(x, y)) for _ in range(3)])
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5)
    np.testing.assert_allclose(losses[2], losses[0], rtol=1e-5)
    remat.save(tmp_path / "m.keras")
    again = keras.saving.load_model(tmp_path / "m.keras")
    assert again.get_layer("Transformer").remat is True
    np.testing.assert_allclose(again(x), remat(x), atol=1e-6)
