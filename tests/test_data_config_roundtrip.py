"""A model's data config travels with it: through `.keras` files (`ViT.get_config` /
`from_config`) and into a model that `keras_vit.load_pretrained` loads a checkpoint into."""

import json

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit import data_config as dc
from keras_vit import weights
from keras_vit.weights import config_json, writers

from test_data_config import IMAGENET, TINY, tiny_model  # the same tiny models and config


def save_and_load(model, path):
    model.save(path)
    return keras.saving.load_model(path)


# --------------------------------------------------------------------------------------------
# .keras files.


def test_a_keras_file_keeps_the_data_config(tmp_path):
    model = tiny_model()
    model.data_config = dc.check_data_config(IMAGENET)
    restored = save_and_load(model, tmp_path / "m.keras")
    assert restored.data_config == dc.check_data_config(IMAGENET)
    assert keras_vit.resolve_data_config(restored) == keras_vit.resolve_data_config(model)
    # The field is plain JSON in the file's config.
    config = model.get_config()
    assert json.loads(json.dumps(config))["data_config"] == dc.check_data_config(IMAGENET)
    images = np.random.default_rng(1).uniform(-1, 1, (2, 16, 16, 3)).astype(np.float32)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(model(images)),
                                  keras.ops.convert_to_numpy(restored(images)))


def test_every_model_carries_a_data_config_the_papers_by_default(tmp_path):
    """Built from scratch, a model carries the paper's preprocessing at its own size, in its
    config and through a `.keras` file; the config cannot be changed in place."""
    model = tiny_model()
    assert model.data_config == dc.paper_data_config(16)
    assert isinstance(model.data_config, keras_vit.DataConfig)
    assert model.get_config()["data_config"] == dc.paper_data_config(16)
    restored = save_and_load(model, tmp_path / "m.keras")
    assert restored.data_config == dc.paper_data_config(16)
    for change in (lambda c: c.__setitem__("crop_pct", 0.5), lambda c: c["mean"].append(0.1),
                   lambda c: c.update(crop_pct=0.5), lambda c: c["std"].__setitem__(0, 1.0)):
        with pytest.raises(TypeError, match="does not change"):
            change(model.data_config)
    assert model.data_config == dc.paper_data_config(16)
    # Given a new one, the model holds it checked and at its own input size.
    model.data_config = dict(IMAGENET, input_size=[3, 224, 224])
    assert model.data_config == dc.check_data_config(IMAGENET)
    with pytest.raises(ValueError, match="`crop_pct` must be a number"):
        model.data_config = dict(IMAGENET, crop_pct=2)
    assert model.data_config == dc.check_data_config(IMAGENET)
    model.data_config = None
    assert model.data_config == dc.paper_data_config(16)


def test_the_constructor_takes_a_data_config():
    model = keras_vit.ViT(**TINY, data_config=IMAGENET)
    assert model.data_config == dc.check_data_config(IMAGENET)
    assert keras_vit.ViT.from_config(model.get_config()).data_config == model.data_config


def test_a_config_without_the_field_builds_a_model_with_the_papers():
    """A `.keras` file written before the field existed holds the constructor's arguments
    only: its model was the paper's."""
    model = tiny_model()
    model.data_config = dc.check_data_config(IMAGENET)
    old = {k: v for k, v in model.get_config().items() if k != "data_config"}
    clone = keras_vit.ViT.from_config(old)
    assert clone.data_config == dc.paper_data_config(16)
    again = keras_vit.ViT.from_config(model.get_config())
    assert again.data_config == model.data_config
    assert again.get_config() == model.get_config()


def test_a_malformed_data_config_in_a_config_is_refused_in_one_line():
    config = dict(tiny_model().get_config(), data_config=dict(IMAGENET, crop_pct=2))
    with pytest.raises(ValueError, match=r"data_config.*`crop_pct` must be a number") as raised:
        keras_vit.ViT.from_config(config)
    assert "\n" not in str(raised.value)


def test_a_pretrained_model_saved_as_keras_keeps_its_checkpoints_data_config(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    source = tiny_model()
    weights.save_npz(source, folder / "model.npz")
    (folder / "config.json").write_text(json.dumps(config_json.keras_vit_document(
        keras_vit.vit_config(source), None, IMAGENET)))
    model = keras_vit.from_pretrained(folder / "model.npz")
    restored = save_and_load(model, tmp_path / "m.keras")
    assert restored.data_config == model.data_config == dc.check_data_config(IMAGENET)


# --------------------------------------------------------------------------------------------
# load_pretrained(model, source).


def checkpoint_with_config(folder, preprocessing, model=None):
    """A tiny `.npz` and the keras_vit config.json beside it stating `preprocessing`."""
    model = model or tiny_model()
    folder.mkdir(parents=True, exist_ok=True)
    weights.save_npz(model, folder / "model.npz")
    (folder / "config.json").write_text(json.dumps(config_json.keras_vit_document(
        keras_vit.vit_config(model), None, preprocessing)))
    return folder / "model.npz"


def test_load_pretrained_gives_the_model_the_checkpoints_data_config(tmp_path):
    npz = checkpoint_with_config(tmp_path / "mine", IMAGENET)
    model = keras_vit.ViT(**TINY)
    keras_vit.load_pretrained(model, npz)
    assert model.data_config == dc.check_data_config(IMAGENET)
    assert model.data_config == keras_vit.from_pretrained(npz).data_config
    # At the model's own resolution, as from_pretrained's.
    bigger = keras_vit.ViT(**dict(TINY, image_size=32))
    keras_vit.load_pretrained(bigger, npz)
    assert bigger.data_config == dc.check_data_config(dict(IMAGENET, input_size=[3, 32, 32]))
    assert bigger.data_config == keras_vit.from_pretrained(npz, image_size=32).data_config


def test_load_pretrained_reads_the_data_config_a_safetensors_file_records(tmp_path):
    model = keras_vit.from_pretrained(checkpoint_with_config(tmp_path / "npz", IMAGENET))
    writers.save_safetensors(model, tmp_path / "st" / "model.safetensors")
    (tmp_path / "st" / "config.json").unlink()  # the file's own metadata says it
    fresh = keras_vit.ViT(**TINY)
    keras_vit.load_pretrained(fresh, tmp_path / "st" / "model.safetensors")
    assert fresh.data_config == dc.check_data_config(IMAGENET)


def test_load_pretrained_takes_a_registry_entrys_preprocessing():
    stated = dc.check_data_config(keras_vit.weights.get_checkpoint("digits")["preprocessing"])
    model = keras_vit.ViT(**keras_vit.vit_config(keras_vit.from_pretrained("digits",
                                                                           progress=False)))
    model.data_config = dc.check_data_config(IMAGENET)
    keras_vit.load_pretrained(model, "digits", progress=False)
    assert model.data_config == stated


def test_a_checkpoint_that_states_none_leaves_the_papers(tmp_path):
    """As from_pretrained: the paper's preprocessing applies to a file that states none, so a
    data config from an earlier checkpoint does not stay behind."""
    bare = tmp_path / "bare.npz"
    weights.save_npz(tiny_model(), bare)
    model = keras_vit.from_pretrained(checkpoint_with_config(tmp_path / "mine", IMAGENET))
    keras_vit.load_pretrained(model, bare)
    assert model.data_config == dc.paper_data_config(16)
    assert keras_vit.resolve_data_config(model) == dc.paper_data_config(16)
    assert keras_vit.from_pretrained(bare).data_config == dc.paper_data_config(16)


def test_a_bad_data_config_leaves_the_model_unchanged(tmp_path):
    npz = checkpoint_with_config(tmp_path / "bad", IMAGENET, model=tiny_model(seed=1))
    document = json.loads((tmp_path / "bad" / "config.json").read_text())
    document["preprocessing"]["crop_pct"] = 2
    (tmp_path / "bad" / "config.json").write_text(json.dumps(document))
    model = tiny_model()
    model.data_config = dc.check_data_config(IMAGENET)
    before = [w.copy() for w in model.get_weights()]
    with pytest.raises(keras_vit.CheckpointError, match="crop_pct") as raised:
        keras_vit.load_pretrained(model, npz)
    assert "\n" not in str(raised.value) and "config.json" in str(raised.value)
    for old, new in zip(before, model.get_weights()):
        np.testing.assert_array_equal(old, new)
    assert model.data_config == dc.check_data_config(IMAGENET)
