"""Private Keras/TensorFlow members: all present (a release that changes one fails here, loudly),
and each use falls back to the public API when one is missing."""

import warnings

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit import framework, training


def test_every_private_member_keras_vit_uses_exists():
    assert framework.missing_private_members() == []


def delete_everywhere(monkeypatch, cls, name):
    """Removes attribute `name` from every class of `cls`'s MRO that defines it."""
    for owner in cls.__mro__:
        if name in vars(owner):
            monkeypatch.delattr(owner, name)
    assert not hasattr(cls, name)


def tiny_model():
    return keras_vit.ViT(image_size=16, patch_size=8, hidden_size=8, num_layers=1, num_heads=2,
                         mlp_dim=8, num_classes=3)


def test_build_training_state_falls_back_to_building_the_optimizer(monkeypatch):
    model = tiny_model()
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    delete_everywhere(monkeypatch, type(model), "_symbolic_build")
    with pytest.warns(RuntimeWarning, match="falling back to the public API"):
        training.build_training_state(model)
    assert model.optimizer.built


def test_fused_adamw_falls_back_to_keras_update_with_the_same_result(monkeypatch):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 16, 16, 3)).astype("float32")
    y = np.arange(8) % 3
    results = []
    for fused in (True, False):
        keras.utils.set_random_seed(1)
        model = tiny_model()
        if not fused:  # as where a Keras release lacks the private members
            monkeypatch.setattr(framework, "_takes_fused_update", lambda optimizer: False)
        optimizer = training.AdamW(1e-2, weight_decay=0.1)
        training.compile_model(model, optimizer, jit_compile=False)
        model.fit(x, y, batch_size=4, epochs=2, verbose=0, shuffle=False)
        results.append(keras.ops.convert_to_numpy(model.get_layer("head").kernel))
    np.testing.assert_allclose(results[0], results[1], rtol=1e-4, atol=1e-6)
    assert np.abs(results[0]).max() > 1e-3


def test_reduce_gradients_fallback_keeps_keras_behaviour(monkeypatch):
    optimizer = keras.optimizers.SGD(0.1)
    delete_everywhere(monkeypatch, type(optimizer), "_all_reduce_sum_gradients")
    with pytest.warns(RuntimeWarning):
        assert framework.reduce_gradients_before_clipping(optimizer) is optimizer
    assert not getattr(optimizer, "_keras_vit_reduce_first", False)



FALLBACK = ("keras_vit: this Keras/TensorFlow release lacks a private member that "
            "keras_vit.from_pretrained uses; falling back to the public API.")


class Counting(keras.initializers.Initializer):
    """Ones, counting its calls."""

    calls = 0

    def __call__(self, shape, dtype=None):
        Counting.calls += 1
        return keras.ops.ones(shape, dtype=dtype)


def counted_dense():
    Counting.calls = 0
    layer = keras.layers.Dense(3, kernel_initializer=Counting(), bias_initializer=Counting())
    layer.build((None, 2))
    return layer


@pytest.mark.parametrize("deferred", [True, False], ids=["deferred", "fallback"])
def test_first_values_run_no_initializer_for_the_variables_a_checkpoint_gives(
        monkeypatch, deferred):
    if not deferred:  # a Keras without deferred initialisation
        delete_everywhere(monkeypatch, keras.Variable, "_deferred_initialize")
    kernel = np.arange(6, dtype="float32").reshape(2, 3)
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        with framework.FirstValues() as first:
            with first.creating():
                layer = counted_dense()
            first.assign(layer.kernel, kernel)
    assert [str(w.message) for w in warned if w.category is RuntimeWarning] == (
        [] if deferred else [FALLBACK])
    # The kernel holds the checkpoint's value, its initializer not run (where Keras defers);
    # the bias ran its own; Keras waits for neither.
    assert Counting.calls == (1 if deferred else 2)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(layer.kernel), kernel)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(layer.bias), np.ones(3))
    with keras.StatelessScope():  # initialises whatever Keras still waits for, on leaving
        pass
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(layer(np.ones((1, 2)))),
                                  [[4.0, 6.0, 8.0]])


def test_first_values_leave_nothing_waiting_where_loading_fails():
    with pytest.raises(ValueError, match="refused"):
        with framework.FirstValues() as first:
            with first.creating():
                counted_dense()
            raise ValueError("refused")
    with keras.StatelessScope():  # would initialise (or fail on) the dropped layer's variables
        pass
    assert Counting.calls == 0


def test_a_model_loaded_inside_a_stateless_scope_has_the_files_weights(tmp_path):
    # Variables the file does not give (dropout's seeds) cannot be initialised inside the
    # caller's scope: they wait for it to end, which initialises them.
    config = dict(image_size=16, patch_size=8, hidden_size=8, num_layers=1, num_heads=2,
                  mlp_dim=8, num_classes=3)
    source = keras_vit.ViT(**config)
    keras_vit.weights.save_npz(source, tmp_path / "tiny.npz")
    with keras.StatelessScope():
        model = keras_vit.from_pretrained(tmp_path / "tiny.npz", progress=False,
                                          dropout_rate=0.1)
    for got, want in zip(model.get_weights(), source.get_weights()):
        np.testing.assert_array_equal(got, want)
    model(np.zeros((1, 16, 16, 3), np.float32), training=True)  # its seeds have values
    with keras.StatelessScope():  # nothing of it still waits
        pass
