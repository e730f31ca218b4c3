"""Files written by keras_vit 0.2 and 0.3 load in this version: the `.keras` files of
`tests/fixtures/keras_0_2` and `tests/fixtures/keras_0_3` (written by the scripts beside them
with the code of those versions) give the logits those versions computed, the compiled ones
train on, and their `keras_vit.ViT` arguments are read back (those versions did not save
them); the execution routes 0.3 saved are dropped."""

import json
import pathlib
import zipfile

import keras
import numpy as np
import pytest

import keras_vit  # noqa: F401  (registers the layers for `.keras` files)
from keras_vit.layer_config import sublayers

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "keras_0_2"
NAMES = ("vit", "vit_unfused", "hybrid", "scanned_dynamic", "gap_2d", "int8")
FIXTURES_0_3 = pathlib.Path(__file__).parent / "fixtures" / "keras_0_3"
NAMES_0_3 = ("vit_routes", "hybrid_relative_remat", "int8_scan")


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


TINY = dict(image_size=16, patch_size=8, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=32,
            num_classes=3)


@pytest.mark.parametrize("name", NAMES_0_3)
def test_a_keras_file_of_0_3_loads_with_the_same_logits_and_without_its_routes(name):
    model = keras.saving.load_model(FIXTURES_0_3 / f"{name}.keras")
    expected = np.load(FIXTURES_0_3 / f"{name}.npz")
    np.testing.assert_allclose(model.predict(expected["images"], verbose=0), expected["logits"],
                               rtol=1e-5, atol=1e-5)
    assert np.abs(expected["logits"]).max() > 0.1
    every = [sub for layer in model.layers for sub in (layer, *sublayers(layer))]
    assert len(every) > len(model.layers) and not any(hasattr(sub, "kernels") for sub in every)
    config = keras_vit.vit_config(model)  # read off the layers: 0.3 did not save it
    assert "kernels" not in config
    # The arguments read back rebuild the same model: a keras_vit.ViT with the same logits.
    twin = keras_vit.per_block(model) if config.get("scan") or config.get("remat") else \
        keras_vit.introspection.rebuilt(model)
    assert isinstance(twin, keras_vit.ViT)
    np.testing.assert_allclose(twin.predict(expected["images"], verbose=0), expected["logits"],
                               rtol=1e-5, atol=1e-5)


def test_the_arguments_read_off_a_0_3_file_are_those_it_was_built_with():
    model = keras.saving.load_model(FIXTURES_0_3 / "hybrid_relative_remat.keras")
    config = keras_vit.vit_config(model)
    assert config == keras_vit.vit_config(keras_vit.ViT(
        **dict(TINY, patch_size=1, num_layers=2), resnet={"num_layers": (1,)},
        position_embedding="relative",
        remat=True, name=model.name))
    assert config["resnet"] == dict(num_layers=[1], width_factor=1, std_conv_epsilon=1e-5)
    assert (config["position_embedding"], config["remat"], config["patch_size"]) == (
        "relative", True, [1, 1])


def test_a_compiled_0_3_file_reloads_compiled_and_trains_on():
    model = keras.saving.load_model(FIXTURES_0_3 / "vit_routes.keras")
    assert model.optimizer.iterations.numpy() == 1
    images = np.load(FIXTURES_0_3 / "vit_routes.npz")["images"]
    before = model.get_layer("head").get_weights()[0].copy()
    model.train_on_batch(images, np.array([0, 1]))
    assert np.abs(model.get_layer("head").get_weights()[0] - before).max() > 0


def test_a_model_saves_its_arguments_and_no_execution_route(tmp_path):
    model = keras_vit.ViT(**TINY, scan=True, name="tiny")
    with keras_vit.routes.use_routes(attention="fused", mlp="rows"):
        model(np.zeros((1, 16, 16, 3), "float32"))
    model.save(tmp_path / "tiny.keras")
    with zipfile.ZipFile(tmp_path / "tiny.keras") as archive:
        saved = json.loads(archive.read("config.json"))
    assert saved["class_name"] == "ViT" and saved["registered_name"] == "keras_vit>ViT"
    arguments = {k: v for k, v in saved["config"].items()
                 if k not in ("trainable", "dtype", "data_config")}
    assert arguments == keras_vit.vit_config(model)
    assert saved["config"]["data_config"] == model.data_config  # its preprocessing too
    assert "kernels" not in json.dumps(saved) and "routes" not in json.dumps(saved)
    again = keras.saving.load_model(tmp_path / "tiny.keras")
    assert isinstance(again, keras_vit.ViT) and keras_vit.vit_config(again) == arguments


def test_a_config_json_of_0_3_with_routes_is_read_without_them():
    from keras_vit.weights import config_json

    document = {"format": "keras_vit", "class_names": None,
                "model": dict(TINY, kernels={"attention": "fused"})}
    checked = config_json.check_keras_vit(document, "run/config.json")
    assert checked["model"] == TINY
    with pytest.raises(keras_vit.CheckpointError, match="not keras_vit.ViT arguments: "
                                                        r"\['routes'\]"):
        config_json.check_keras_vit(dict(document, model=dict(TINY, routes={})), "config.json")


def test_the_names_0_2_kept_for_one_release_are_gone():
    import importlib

    for module in ("validation", "distribute", "sharding"):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(f"keras_vit.{module}")
    for name in ("ViTModel", "ResNetStem", "ScannedEncoder", "unscanned"):
        assert not hasattr(keras_vit, name)
    assert not hasattr(keras_vit.get_variant("R50+B/16"), "backbone")
    with pytest.raises(TypeError, match="resnet"):
        keras_vit.ViT(**TINY, backbone={"num_layers": (1,)})
    with pytest.raises(ValueError, match="trainable"):  # Keras' own argument, checked too
        keras_vit.ViT(**TINY, trainable="no")
    with pytest.raises(ValueError, match="remat"):  # Keras' own refusal of an argument
        keras_vit.TransformerBlock(2, 8, remat=True)
