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


TINY = dict(image_size=16, patch_size=8, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=32,
            num_classes=3)


def test_the_names_of_0_2_work_for_one_release_with_a_deprecation_warning():
    import importlib
    import sys

    for old, new, name in (("validation", "checks", "check_int"),
                           ("distribute", "parallel.tf_distribute", "get_strategy"),
                           ("sharding", "parallel.keras_distribution", "get_distribution")):
        sys.modules.pop(f"keras_vit.{old}", None)
        with pytest.warns(DeprecationWarning, match=f"keras_vit.{old} is deprecated"):
            module = importlib.import_module(f"keras_vit.{old}")
        assert getattr(module, name) is getattr(importlib.import_module(f"keras_vit.{new}"),
                                                name)
    for name, new in (("ViTModel", None), ("ResNetStem", keras_vit.ResNet),
                      ("ScannedEncoder", keras_vit.Encoder)):
        with pytest.warns(DeprecationWarning, match=f"{name} is deprecated"):
            cls = getattr(keras_vit, name)
        assert issubclass(cls, new or keras.Model)
    with pytest.warns(DeprecationWarning, match="Variant.backbone is deprecated"):
        assert keras_vit.get_variant("R50+B/16").backbone == (3, 4, 9)
    with pytest.warns(DeprecationWarning, match="recomputation is an option of the encoder"):
        block = keras_vit.TransformerBlock(2, 8, remat=True)
    assert "remat" not in block.get_config()


def test_vit_backbone_is_resnet_under_its_old_name():
    with pytest.warns(DeprecationWarning, match=r"ViT\(backbone=...\) is deprecated"):
        old = keras_vit.ViT(**dict(TINY, patch_size=1), backbone={"num_layers": (1,)})
    new = keras_vit.ViT(**dict(TINY, patch_size=1), resnet={"num_layers": (1,)})
    assert keras_vit.vit_config(old)["resnet"] == keras_vit.vit_config(new)["resnet"] == dict(
        num_layers=[1], width_factor=1, std_conv_epsilon=1e-5)
    with pytest.raises(ValueError, match="not both"):
        keras_vit.ViT(**TINY, resnet={"num_layers": (1,)}, backbone={"num_layers": (1,)})
