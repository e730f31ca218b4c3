"""Models of any input size (`dynamic_image_size=True`): the in-graph position-embedding resize
against the official load-time resize, XLA, mixed precision, files, inspection and export."""

import io
import json
import os
import re

import keras
import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

import keras_vit
from keras_vit import export, inspection, weights
from keras_vit.weights import writers
from keras_vit.positions import AddPositionEmbs

TINY = dict(patch_size=8, hidden_size=32, num_layers=2, num_heads=4, mlp_dim=48, num_classes=5)


def random_weights(model, seed=0):
    rng = np.random.default_rng(seed)
    for variable in model.weights:
        variable.assign(rng.normal(size=variable.shape).astype("float32") * 0.1)
    return model


def dynamic_model(**kwargs):
    return random_weights(keras_vit.ViT(**dict(TINY, image_size=32, dynamic_image_size=True,
                                               **kwargs)))


def fixed_copy(dyn, size, **kwargs):
    """A fixed-size model at `size` with `dyn`'s weights, its position embedding resized at
    load time (`keras_vit.weights.resize_pos_embedding`)."""
    config = dict(keras_vit.vit_config(dyn), image_size=size, dynamic_image_size=False,
                  **kwargs)
    fixed = keras_vit.ViT(**config)
    params = weights.model_params(dyn)
    weights.load_params(fixed, params)  # resizes pos_embedding to the new grid
    return fixed


def images(size, batch=2, seed=1):
    return np.random.default_rng(seed).uniform(-1, 1, (batch, *size, 3)).astype("float32")


@pytest.mark.parametrize("resize", ["linear", "bicubic"])
@pytest.mark.parametrize("old,new", [(4, 7), (7, 4), (4, 4), (5, 1), (1, 3)])
def test_in_graph_resize_equals_the_load_time_resize(old, new, resize):
    layer = AddPositionEmbs(grid_size=(old, old), num_prefix_tokens=1, resize=resize)
    layer.build((None, None, 6))
    pos = np.random.default_rng(0).normal(size=(1, old * old + 1, 6)).astype("float32")
    layer.pos_embedding.assign(pos)
    got = keras.ops.convert_to_numpy(layer.resized(new, 5))
    want = weights.resize_pos_embedding(pos, (new, 5), has_class_token=True, method=resize)
    np.testing.assert_allclose(got, want, atol=1e-6, rtol=1e-6)  # float32 against float64
    assert got.shape == (1, new * 5 + 1, 6)


@pytest.mark.parametrize("method, grid, named", [
    ("bilinear", (5, 5), "`method` must be one of 'linear', 'bicubic'. Received: "
                         "method='bilinear'"),  # timm's spelling of another resize
    ("BICUBIC", (5, 5), "Received: method='BICUBIC'"),
    ("linear", (0, 5), "`grid` must be a positive int or a (height, width) pair"),
])
def test_the_load_time_resize_refuses_what_it_does_not_compute(method, grid, named):
    pos = np.zeros((1, 17, 6), np.float32)
    with pytest.raises(ValueError, match=re.escape(named)):
        weights.resize_pos_embedding(pos, grid, has_class_token=True, method=method)


@pytest.mark.parametrize("classifier, resize", [("token", "linear"), ("gap", "linear"),
                                                ("token", "bicubic")])
def test_any_size_equals_a_fixed_model_resized_at_load_time(classifier, resize):
    dyn = dynamic_model(classifier=classifier, position_resize=resize)
    assert dyn.inputs[0].shape[1:] == (None, None, 3)
    for size in [(32, 32), (48, 64), (16, 8), (8, 8)]:
        x = images(size)
        want = fixed_copy(dyn, size)(x)
        np.testing.assert_allclose(dyn(x), want, atol=1e-5)


def test_hybrid_of_any_size():
    dyn = dynamic_model(patch_size=1, resnet={"num_layers": (1,)})  # stride 4: 8x8 grid
    for size in [(32, 32), (24, 40)]:
        x = images(size)
        np.testing.assert_allclose(dyn(x), fixed_copy(dyn, size)(x), atol=1e-5)


def test_xla_compiles_once_per_size_and_agrees():
    dyn = dynamic_model()
    eager = {size: dyn(images(size)) for size in [(32, 32), (40, 24)]}
    dyn.compile(jit_compile=True)
    for size, want in eager.items():
        np.testing.assert_allclose(dyn.predict(images(size), verbose=0), want, atol=1e-5)


def test_mixed_precision_any_size():
    dyn = dynamic_model()
    x = images((48, 24))
    want = dyn(x)
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        mixed = keras_vit.ViT(**dict(keras_vit.vit_config(dyn)))
        mixed.set_weights(dyn.get_weights())
        got = mixed(x)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert got.dtype == "float32"
    np.testing.assert_allclose(got, want, atol=0.02)


def test_image_sides_must_be_multiples_of_the_patch():
    dyn = dynamic_model()
    with pytest.raises(ValueError, match="Image width 20 is not divisible by the patch width 8"):
        dyn(images((16, 20)))


def test_config_keras_file_and_checkpoint_round_trip(tmp_path):
    dyn = dynamic_model()
    config = keras_vit.vit_config(dyn)
    assert config["dynamic_image_size"] is True and config["image_size"] == [32, 32]
    assert keras_vit.positions.model_image_size(dyn) == (32, 32)
    x = images((40, 16))
    want = dyn(x)
    dyn.save(tmp_path / "m.keras")
    np.testing.assert_allclose(keras.saving.load_model(tmp_path / "m.keras")(x), want, atol=1e-6)
    # The checkpoint holds the embedding at the size it was learned at; loading it into a model
    # of any size or into a fixed-size one works as for any checkpoint.
    weights.save_npz(dyn, tmp_path / "c.npz")
    assert weights.read_npz(tmp_path / "c.npz")["Transformer/posembed_input/pos_embedding"].shape \
        == (1, 17, 32)
    again = keras_vit.from_pretrained(tmp_path / "c.npz", dynamic_image_size=True)
    np.testing.assert_allclose(again(x), want, atol=1e-6)
    fixed = keras_vit.from_pretrained(tmp_path / "c.npz", image_size=(40, 16))
    np.testing.assert_allclose(fixed(x), want, atol=1e-5)


def test_a_model_of_any_size_learns_its_base_embedding_at_load_time(tmp_path):
    """A 32x32 checkpoint loaded into a model of any size whose base is 48x48: resized once at
    load time to the base grid, then in the graph from there."""
    dyn = dynamic_model()
    weights.save_npz(dyn, tmp_path / "c.npz")
    bigger = keras_vit.from_pretrained(tmp_path / "c.npz", image_size=48, dynamic_image_size=True)
    assert bigger.get_layer("posembed_input").pos_embedding.shape == (1, 37, 32)
    x = images((48, 48))
    np.testing.assert_allclose(bigger(x), dyn(x), atol=1e-5)


def test_inspection_runs_at_the_base_size():
    dyn = dynamic_model()
    geo = inspection.geometry(dyn)
    assert geo.image_size == (32, 32) and geo.grid == (4, 4) and geo.num_prefix == 1
    probs = inspection.attention_weights(dyn, images((32, 32)))
    assert probs.shape == (2, 2, 4, 17, 17)
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-5)


def test_native_size_rounds_to_the_grid_and_caps_the_patches():
    def size(h, w, cap=64):
        return tuple(int(v) for v in export.native_size(h, w, (8, 8), cap))

    assert size(45, 70) == (48, 72)  # 6 x 9 patches
    assert size(3, 3) == (8, 8)  # at least one patch
    assert size(20, 12) == (24, 16)  # halves round up
    assert size(200, 100) == (88, 40)  # 25 x 13 = 325 patches, scaled to 11 x 5 <= 64
    assert size(64, 64) == (64, 64)  # exactly the cap


def png(array):
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, "PNG")
    return buffer.getvalue()


def test_export_adds_a_native_size_signature(tmp_path):
    dyn = dynamic_model()
    path = keras_vit.export_saved_model(dyn, tmp_path / "export", warmup=False, max_patches=40)
    metadata = json.loads((tmp_path / "export" / "1" / "assets.extra" / "keras_vit.json")
                          .read_text())
    assert metadata["image_size"] == [32, 32] and metadata["max_patches"] == 40
    loaded = tf.saved_model.load(os.fspath(path))
    assert {"serving_default", "predict_images", "serving_native_size"} <= set(loaded.signatures)
    rng = np.random.default_rng(2)
    small = rng.integers(0, 256, (45, 70, 3), dtype=np.uint8)  # 6 x 9 patches > 40: 5 x 7
    tall = rng.integers(0, 256, (20, 9, 3), dtype=np.uint8)  # -> 24 x 8
    got = loaded.signatures["serving_native_size"](
        image_bytes=tf.constant([png(small), png(tall)]))["probabilities"].numpy()
    for row, (image, size) in zip(got, [(small, (40, 56)), (tall, (24, 8))]):
        scaled = tf.image.resize(image.astype("float32"), size)[None] / 127.5 - 1.0
        np.testing.assert_allclose(row, tf.nn.softmax(dyn(scaled))[0], atol=1e-5)
    # The fixed-size signatures work at the base size.
    fixed = loaded.signatures["predict_images"](images=tf.zeros((1, 32, 32, 3)))
    assert fixed["probabilities"].shape == (1, 5)


def test_cli_export_dynamic_image_size_lists_every_signature(tmp_path, capsys):
    import keras_vit_cli as cli

    config = json.dumps(dict(TINY, image_size=32))
    assert cli.main(["export", str(tmp_path / "out"), "--model-config", config,
                     "--dynamic-image-size", "--max-patches", "20", "--no-warmup"]) == 0
    out = capsys.readouterr().out
    assert "signatures serving_default, predict_images, serving_native_size" in out
    metadata = export.read_metadata(tmp_path / "out" / "1")
    assert metadata["max_patches"] == 20 and metadata["signatures"][-1] == "serving_native_size"
    loaded = tf.saved_model.load(os.fspath(tmp_path / "out" / "1"))
    assert set(metadata["signatures"]) <= set(loaded.signatures)
    # A fixed-size export names its two signatures; --max-patches needs --dynamic-image-size.
    assert cli.main(["export", str(tmp_path / "fixed"), "--model-config", config,
                     "--no-warmup"]) == 0
    assert "signatures serving_default, predict_images)" in capsys.readouterr().out
    assert cli.main(["export", str(tmp_path / "bad"), "--model-config", config,
                     "--max-patches", "20", "--no-warmup"]) == 2
    assert "dynamic_image_size=True" in capsys.readouterr().err
    assert cli.main(["export", str(tmp_path / "m.tflite"), "--model-config", config,
                     "--format", "tflite", "--dynamic-image-size"]) == 2
    assert "--dynamic-image-size does not apply to --format tflite" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


def test_max_patches_is_for_models_of_any_size(tmp_path):
    fixed = keras_vit.ViT(image_size=32, **TINY)
    with pytest.raises(ValueError, match="dynamic_image_size=True"):
        keras_vit.export_saved_model(fixed, tmp_path / "e", warmup=False, max_patches=10)
    assert not (tmp_path / "e").exists()


@pytest.mark.parametrize("file_size, size", [
    ((16, 64), 32),  # a 2x8 grid read at 4x4: as many positions, another grid
    ((32, 48), 64),  # a 4x6 grid at 8x8 (it was refused as not square)
])
def test_a_non_square_checkpoint_is_resized_from_the_grid_its_file_says(tmp_path, file_size,
                                                                        size):
    """A file that records its image size is resized from its own grid, as the same file
    read into a model of any size resizes it: both give one answer."""
    source = keras_vit.ViT(image_size=file_size, patch_size=8, hidden_size=16, num_layers=1,
                           num_heads=2, mlp_dim=32, num_classes=5)
    rng = np.random.default_rng(1)
    source.set_weights([rng.normal(0, 0.3, w.shape).astype(w.dtype)
                        for w in source.get_weights()])
    path = tmp_path / "model.safetensors"
    writers.save_safetensors(source, path)
    fixed = keras_vit.from_pretrained(path, image_size=size)
    dynamic = keras_vit.from_pretrained(path, dynamic_image_size=True)
    table = fixed.get_layer("posembed_input").pos_embedding
    want = dynamic.get_layer("posembed_input").embedding(size // 8, size // 8)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(table),
                               keras.ops.convert_to_numpy(want), atol=1e-6)
    x = images((size, size))
    np.testing.assert_allclose(fixed(x), dynamic(x), atol=1e-5)
    built = keras_vit.ViT(image_size=size, patch_size=8, hidden_size=16, num_layers=1,
                          num_heads=2, mlp_dim=32, num_classes=5)
    weights.load_pretrained(built, path, progress=False)  # into a model the user built
    np.testing.assert_allclose(built(x), dynamic(x), atol=1e-5)


def test_a_registry_entry_without_a_resolution_reads_its_grid_off_the_file(tmp_path,
                                                                           monkeypatch):
    # As the registry's ViT-B_8 entry: no resolution, the file's position embedding says it.
    monkeypatch.setattr(weights.registry, "_REGISTERED", {})
    source = keras_vit.create_model("Ti/16", image_size=64, num_classes=10)
    weights.save_npz(source, tmp_path / "ti64.npz")
    keras_vit.register_checkpoint("mine/ti64", (tmp_path / "ti64.npz").as_uri(),
                                  variant="Ti/16", num_classes=10)
    model = keras_vit.from_pretrained("mine/ti64", image_size=64, progress=False)
    x = images((64, 64))
    np.testing.assert_allclose(model(x), source(x), atol=1e-5)
