"""Files written by keras_vit 0.2 load in this version: the `.keras` files of
`tests/fixtures/keras_0_2` (written by `tests/fixtures/make_keras_0_2_fixtures.py` at the 0.2
release) give the logits 0.2 computed, and the compiled ones train on."""

import pathlib

import keras
import numpy as np
import pytest

import keras_vit  # noqa: F401  (registers the layers for `.keras` files)

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "keras_0_2"
NAMES = ("vit", "vit_unfused", "hybrid", "scanned_dynamic", "gap_2d", "int8")


@pytest.mark.parametrize("name", NAMES)
def test_a_keras_file_written_by_0_2_loads_with_the_same_logits(name):
    model = keras.saving.load_model(FIXTURES / f"{name}.keras")
    expected = np.load(FIXTURES / f"{name}.npz")
    logits = model.predict(expected["images"], verbose=0)
    np.testing.assert_allclose(logits, expected["logits"], rtol=1e-5, atol=1e-5)
    assert np.abs(expected["logits"]).max() > 0.1  # not a zero head


@pytest.mark.parametrize("name", ["vit", "vit_unfused"])
def test_a_compiled_0_2_file_reloads_compiled_and_trains_on(name):
    model = keras.saving.load_model(FIXTURES / f"{name}.keras")
    assert model.optimizer.iterations.numpy() == 1  # the step 0.2 took, restored
    before = model.get_layer("head").get_weights()[0].copy()
    images = np.load(FIXTURES / f"{name}.npz")["images"]
    model.train_on_batch(images, np.array([0, 1]))
    assert model.optimizer.iterations.numpy() == 2
    assert np.abs(model.get_layer("head").get_weights()[0] - before).max() > 0
