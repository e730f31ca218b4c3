"""No silently wrong answer: every weight of a model comes from its file or the load fails
naming what is missing; a registry name loads only the architecture its entry names; numeric
settings are range-checked; non-finite weights and outputs are refused before anything is
written or reported; array entry points refuse dtypes and ranges they do not hold. Each case
was a defect found by hostile testing (docs/guides/errors.md, "No silently wrong answer")."""

import json
import os
import shutil
import warnings
import zipfile

import keras
import numpy as np
import pytest

import keras_vit
import keras_vit_cli as cli
from keras_vit import data_config as dc
from keras_vit.weights import CheckpointError, registry, save_npz

TINY = dict(image_size=16, patch_size=8, hidden_size=8, num_layers=1, num_heads=2, mlp_dim=8,
            num_classes=5, gelu_approximate=False)


def randomized(model, seed=0):
    rng = np.random.default_rng(seed)
    model.set_weights([rng.normal(0, 0.5, w.shape).astype(w.dtype) for w in model.get_weights()])
    return model


@pytest.fixture(scope="module")
def tiny():
    return randomized(keras_vit.ViT(**TINY))


def pixels(seed=1, n=2):
    return np.random.default_rng(seed).integers(0, 256, (n, 16, 16, 3)).astype(np.float32)


def one_line_error(capsys, argv):
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    return lines[0]


# ---------------------------------------------------------------------------------------------
# The config.json beside a checkpoint: what it leaves out comes from the arrays.


@pytest.mark.parametrize("left_out", ["num_classes", "image_size", "hidden_size"])
def test_a_config_json_that_leaves_out_a_size_takes_it_from_the_arrays(tiny, tmp_path,
                                                                        left_out):
    save_npz(tiny, tmp_path / "m.npz")
    model_config = {k: v for k, v in TINY.items() if k != left_out}
    (tmp_path / "config.json").write_text(json.dumps({"format": "keras_vit",
                                                      "model": model_config}))
    loaded = keras_vit.from_pretrained(tmp_path / "m.npz")
    assert loaded.output_shape == (None, TINY["num_classes"])  # the trained head, not ImageNet's
    assert tuple(loaded.input_shape[1:3]) == (16, 16)  # its resolution, not 224 px
    x = keras_vit.preprocess_inputs(pixels())
    np.testing.assert_allclose(loaded.predict(x, verbose=0), tiny.predict(x, verbose=0),
                               atol=1e-6)


def test_a_config_json_with_a_flag_of_another_type_is_named(tiny, tmp_path, capsys):
    save_npz(tiny, tmp_path / "m.npz")
    (tmp_path / "config.json").write_text(json.dumps(
        {"format": "keras_vit", "model": dict(TINY, include_top={})}))
    from PIL import Image
    Image.fromarray(pixels()[0].astype(np.uint8)).save(tmp_path / "x.png")
    line = one_line_error(capsys, ["predict", str(tmp_path / "x.png"),
                                   "--weights", str(tmp_path / "m.npz")])
    assert "config.json" in line and "model.include_top" in line and "True or False" in line


# ---------------------------------------------------------------------------------------------
# keras-hub presets: every weight from the preset.


@pytest.fixture(scope="module")
def hub_preset(tmp_path_factory):
    """A classifier preset keras-hub itself wrote."""
    hub = pytest.importorskip("keras_hub")
    backbone = hub.models.ViTBackbone(image_shape=(16, 16, 3), patch_size=8, num_layers=1,
                                      num_heads=2, hidden_dim=8, mlp_dim=12)
    classifier = hub.models.ViTImageClassifier(backbone=backbone, num_classes=3)
    folder = tmp_path_factory.mktemp("hub") / "preset"
    classifier.save_to_preset(str(folder))
    return folder


@pytest.mark.parametrize("removed", ["task.weights.h5", "model.weights.h5"])
def test_a_preset_without_a_weights_file_is_refused_naming_it(hub_preset, tmp_path, removed):
    folder = tmp_path / "preset"
    shutil.copytree(hub_preset, folder)
    keras_vit.from_pretrained(folder)  # whole, it loads
    (folder / removed).unlink()
    with pytest.raises(CheckpointError, match=f"has no {removed}".replace(".", r"\.")) as error:
        keras_vit.from_pretrained(folder)  # keras-hub would give the head random weights
    assert "model.weights.json" not in str(error.value)  # a file the preset never had


@pytest.fixture(scope="module")
def own_preset(tmp_path_factory, tiny):
    pytest.importorskip("keras_hub")
    folder = tmp_path_factory.mktemp("own") / "preset"
    keras_vit.save_keras_hub_preset(tiny, folder)
    return folder


def test_a_preset_keras_vit_wrote_loads_only_as_the_bytes_it_wrote(own_preset, tiny, tmp_path):
    folder = tmp_path / "preset"
    shutil.copytree(own_preset, folder)
    x = keras_vit.preprocess_inputs(pixels())
    np.testing.assert_allclose(keras_vit.from_pretrained(folder).predict(x, verbose=0),
                               tiny.predict(x, verbose=0), atol=1e-5)
    weights = folder / "task.weights.h5"
    data = bytearray(weights.read_bytes())
    data[-100] ^= 0x01  # one bit: HDF5 itself would load another number
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"task\.weights\.h5 is not the file keras_vit wrote"):
        keras_vit.from_pretrained(folder)


def test_overwrite_never_replaces_a_preset_holding_the_users_files(own_preset, tiny, tmp_path):
    folder = tmp_path / "preset"
    shutil.copytree(own_preset, folder)
    (folder / "notes.txt").write_text("mine")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    with pytest.raises(ValueError, match=r"notes\.txt"):
        keras_vit.save_keras_hub_preset(tiny, folder, overwrite=True)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    (folder / "notes.txt").unlink()
    keras_vit.save_keras_hub_preset(tiny, folder, overwrite=True)  # its own files alone: yes


# ---------------------------------------------------------------------------------------------
# A registry name loads only the architecture its entry names.


def test_a_registry_name_whose_cached_file_is_another_model_is_refused(tmp_path, monkeypatch):
    from huggingface_hub import constants as hub_constants

    from test_checkpoint_registry import hub_cache

    name = "vit_base_patch16_224.dino"  # B/16, no head
    other = tmp_path / "other"
    other.mkdir()
    fixture = os.path.join(os.path.dirname(__file__), "fixtures", "hub", "timm_vit")
    for file in ("config.json", "model.safetensors"):  # width 32, 2 layers, 5 classes
        shutil.copy(os.path.join(fixture, file), other / file)
    cache = tmp_path / "hf-cache"
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    hub_cache(cache, {f"timm/{name}": other})
    with pytest.raises(CheckpointError, match=rf"not the checkpoint '{name}' names: it has "
                                              r"hidden_size 32, the registry's entry 768"):
        keras_vit.from_pretrained(name)
    entry = registry.get_checkpoint(name)
    facts = dict(hidden_size=32, num_layers=2, num_heads=2, mlp_dim=64, patch_size=8)
    monkeypatch.setitem(registry._REGISTERED, name, dict(
        entry, variant=None, config=facts, resolution=32, num_classes=0))
    with pytest.raises(CheckpointError, match="has num_classes 5, the registry's entry 0"):
        keras_vit.from_pretrained(name)  # the sizes agree; the head does not


# ---------------------------------------------------------------------------------------------
# Numeric settings in range before anything is allocated.


@pytest.mark.parametrize("change,field", [
    (dict(std=[1e-300] * 3), "std"), (dict(mean=[1e300] * 3), "mean"),
    (dict(std=[1e6] * 3), "std"), (dict(crop_pct=1e-3), "crop_pct"),
    (dict(crop_pct=1e-9), "crop_pct"), (dict(input_size=[3, 200000, 200000]), "input_size"),
])
def test_extreme_data_config_numbers_are_refused_naming_the_field(change, field):
    with pytest.raises(ValueError, match=f"`{field}`") as error:
        dc.check_data_config(dict(dc.paper_data_config(16), **change))
    assert len(str(error.value)) < 400


def test_a_data_config_at_the_edges_of_its_ranges_gives_finite_inputs():
    config = dict(dc.paper_data_config(16), mean=[100.0, -100.0, 0.0], std=[1e-3, 1e-3, 1e3])
    x = keras.ops.convert_to_numpy(keras_vit.preprocess_inputs(pixels(), config))
    assert np.isfinite(x).all() and np.abs(x).max() <= 1.1e5


def test_a_preset_converter_of_extreme_scale_is_refused(own_preset, tmp_path):
    folder = tmp_path / "preset"
    shutil.copytree(own_preset, folder)
    os.remove(folder / "keras_vit.json")  # as another tool would write it
    path = folder / "preprocessor.json"  # keras-hub reads the converter from here
    preprocessor = json.loads(path.read_text())
    preprocessor["config"]["image_converter"]["config"]["scale"] = [1e300, 1e300, 1e300]
    path.write_text(json.dumps(preprocessor))
    task = json.loads((folder / "task.json").read_text())  # and its classifier from here
    task["config"]["preprocessor"] = preprocessor
    (folder / "task.json").write_text(json.dumps(task))
    with pytest.raises(CheckpointError, match=r"preprocessor\.json: `scale` .* beyond 1e5"):
        keras_vit.from_pretrained(folder)


# ---------------------------------------------------------------------------------------------
# Non-finite weights and outputs: refused before anything is written or reported.


@pytest.fixture
def broken(tiny):
    model = keras_vit.ViT(**TINY)
    weights = tiny.get_weights()
    weights[0] = np.full_like(weights[0], np.nan)
    model.set_weights(weights)
    return model


@pytest.mark.parametrize("action", ["save_npz", "save_safetensors", "save_keras_hub_preset",
                                    "export_saved_model", "export_tflite", "export_onnx",
                                    "classify_images", "evaluate"])
def test_nan_weights_are_refused_by_every_writer_and_answer(broken, tmp_path, action):
    from keras_vit.weights import writers

    out = tmp_path / "out"
    calls = {
        "save_npz": lambda: save_npz(broken, f"{out}.npz"),
        "save_safetensors": lambda: writers.save_safetensors(broken, f"{out}.safetensors"),
        "save_keras_hub_preset": lambda: keras_vit.save_keras_hub_preset(broken, out),
        "export_saved_model": lambda: keras_vit.export_saved_model(broken, out),
        "export_tflite": lambda: keras_vit.export_tflite(broken, f"{out}.tflite"),
        "export_onnx": lambda: keras_vit.export_onnx(broken, f"{out}.onnx"),
        "classify_images": lambda: keras_vit.classify_images(broken, pixels()[0]),
        "evaluate": lambda: keras_vit.evaluate(
            broken, keras_vit.data.from_arrays(pixels(n=4).astype(np.uint8), np.arange(4),
                                               num_classes=5, image_size=16, batch_size=2,
                                               training=False), progress=False),
    }
    if action == "save_keras_hub_preset":
        pytest.importorskip("keras_hub")
    if action == "export_onnx":
        pytest.importorskip("onnx")
    with pytest.raises(ValueError, match=r"NaN or infinity in .*embedding.*kernel \(1536 values\)"):
        calls[action]()
    assert os.listdir(tmp_path) == []  # nothing written, not even a temporary


def test_outputs_that_overflow_with_finite_weights_are_refused_naming_the_cause(tiny):
    model = keras_vit.ViT(**TINY)
    weights = [w * 1e30 if w.ndim > 1 else w for w in tiny.get_weights()]
    model.set_weights(weights)
    with pytest.raises(ValueError, match="weights are finite \\(its activations overflowed\\)"):
        keras_vit.classify_images(model, pixels()[0])


# ---------------------------------------------------------------------------------------------
# preprocess_inputs: the dtypes and ranges it holds, and no other.


@pytest.mark.parametrize("dtype", ["bool", "complex64", "int8", "uint16", "uint32"])
def test_preprocess_inputs_refuses_dtypes_that_do_not_hold_pixels(dtype):
    with pytest.raises(ValueError, match=f"Received dtype {dtype}"):
        keras_vit.preprocess_inputs(np.zeros((1, 4, 4, 3), dtype))


def test_preprocess_inputs_refuses_values_outside_their_range():
    with pytest.raises(ValueError, match="from -3 to 255, outside \\[0, 255\\]"):
        keras_vit.preprocess_inputs(np.full((1, 4, 4, 3), 255.0) - np.eye(4)[None, :, :, None] * 258)
    with pytest.raises(ValueError, match="scaled to \\[0, 1\\]"):
        keras_vit.preprocess_inputs(pixels() / 255.0)
    with pytest.raises(ValueError, match="outside"):
        keras_vit.preprocess_inputs(np.full((1, 4, 4, 3), np.nan))
    in_01 = keras_vit.preprocess_inputs(pixels() / 255.0, value_range=(0, 1))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(in_01),
                               pixels() / 127.5 - 1.0, atol=1e-6)
    for dtype in ("uint8", "int32", "float16", "float32"):  # what it takes
        keras_vit.preprocess_inputs(pixels().astype(dtype))


# ---------------------------------------------------------------------------------------------
# The .keras reader.


@pytest.fixture(scope="module")
def keras_file(tiny, tmp_path_factory):
    path = tmp_path_factory.mktemp("keras") / "m.keras"
    tiny.save(path)
    return path


@pytest.mark.parametrize("damage,named", [
    ("flip", "is not a readable .keras model|is damaged"),
    ("truncate", "not a whole zip archive"),
    ("not_zip", "not a whole zip archive"),
    ("no_weights", "without model.weights.h5"),
])
def test_a_damaged_keras_file_is_one_line_naming_it(keras_file, tmp_path, capsys, damage,
                                                     named):
    path = tmp_path / "m.keras"
    data = keras_file.read_bytes()
    if damage == "flip":
        with zipfile.ZipFile(keras_file) as archive:
            info = archive.getinfo("model.weights.h5")
        at = info.header_offset + 30 + len(info.filename) + 40  # inside the member's data
        data = data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1:]
    elif damage == "truncate":
        data = data[:len(data) // 2]
    elif damage == "not_zip":
        data = b"{}" * 100
    else:
        with zipfile.ZipFile(keras_file) as src, zipfile.ZipFile(path, "w") as dst:
            for item in src.infolist():
                if item.filename != "model.weights.h5":
                    dst.writestr(item, src.read(item))
        data = path.read_bytes()
    path.write_bytes(data)
    with pytest.raises(CheckpointError, match=named) as error:
        keras_vit.load_model(path)
    assert str(path) in str(error.value)
    from PIL import Image
    Image.fromarray(pixels()[0].astype(np.uint8)).save(tmp_path / "x.png")
    line = one_line_error(capsys, ["predict", str(tmp_path / "x.png"), "--model", str(path)])
    assert str(path) in line


def test_from_pretrained_names_load_model_for_a_keras_file(keras_file, tiny):
    with pytest.raises(CheckpointError, match=r"whole Keras model .*keras_vit\.load_model"):
        keras_vit.from_pretrained(keras_file)
    x = keras_vit.preprocess_inputs(pixels())
    np.testing.assert_allclose(keras_vit.load_model(keras_file).predict(x, verbose=0),
                               tiny.predict(x, verbose=0), atol=1e-6)


# ---------------------------------------------------------------------------------------------
# best.json: values an epoch could never beat are refused.


@pytest.mark.parametrize("change,field", [(dict(value=1e308), "value"), (dict(epoch=0), "epoch"),
                                          (dict(value=-0.5), "value")])
def test_a_best_record_out_of_range_is_refused_naming_the_field(tmp_path, change, field):
    import hashlib

    from keras_vit.training import best_record
    from keras_vit.training.callbacks import StateFileError

    data = b"the weights"
    (tmp_path / "best.npz").write_bytes(data)
    record = dict(monitor="val_accuracy", value=0.5, epoch=2,
                  sha256=hashlib.sha256(data).hexdigest(), previous=None)
    (tmp_path / "best.json").write_text(json.dumps(record))
    assert best_record(tmp_path / "best.npz")["value"] == 0.5
    (tmp_path / "best.json").write_text(json.dumps(dict(record, **change)))
    with pytest.raises(StateFileError, match=f"field '{field}'"):
        best_record(tmp_path / "best.npz")


# ---------------------------------------------------------------------------------------------
# The served decoder's pixel limit: no int64 overflow.


@pytest.mark.parametrize("side", [8001, 3037000500, 4294967295])
def test_a_header_declaring_more_pixels_than_the_limit_is_refused_however_large(side):
    import io

    import tensorflow as tf
    from PIL import Image

    from keras_vit import images

    buffer = io.BytesIO()
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(buffer, "PNG")
    data = bytearray(buffer.getvalue())
    data[16:24] = side.to_bytes(4, "big") * 2  # IHDR width, height: side x side pixels
    wrapped = (side * side + 2**63) % 2**64 - 2**63  # the product in int64
    assert wrapped < images.DEFAULT_MAX_PIXELS or side == 8001
    with pytest.raises(tf.errors.InvalidArgumentError, match=rf"(?s)declares\W+{side}\b.*above the limit"):
        images.decode_image(tf.constant(bytes(data)), images.DEFAULT_MAX_PIXELS)


# ---------------------------------------------------------------------------------------------
# A full temporary folder is named as such, not blamed on the destination.


@pytest.mark.parametrize("writer", ["export_tflite", "export_saved_model"])
def test_a_full_tmpdir_is_named_not_the_destination(tiny, tmp_path, monkeypatch, writer):
    import errno
    import tempfile

    from keras_vit import fileio

    def full(*args, **kwargs):
        if kwargs.get("dir") is None:  # the system's temporary folder, not beside the output
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*args, **kwargs)

    real = tempfile.mkdtemp
    monkeypatch.setattr(tempfile, "mkdtemp", full)
    out = tmp_path / "out"
    with pytest.raises(fileio.WriteError, match=r"the temporary folder, TMPDIR\): No space left"):
        if writer == "export_tflite":
            keras_vit.export_tflite(tiny, f"{out}.tflite")
        else:
            keras_vit.export_saved_model(tiny, out, warmup=False)
    assert os.listdir(tmp_path) == []


def test_a_preset_file_that_is_a_fifo_is_named_as_such(hub_preset, tmp_path):
    folder = tmp_path / "preset"
    shutil.copytree(hub_preset, folder)
    (folder / "config.json").unlink()
    os.mkfifo(folder / "config.json")
    with pytest.raises(CheckpointError, match=r"config\.json is not a regular file"):
        keras_vit.from_pretrained(folder)


def test_load_model_and_preprocess_inputs_name_arguments_of_another_type(tmp_path):
    for bad in (None, 3, b"x.keras"):
        with pytest.raises(ValueError, match="load_model takes the path of a .keras file"):
            keras_vit.load_model(bad)
    with pytest.raises(FileNotFoundError, match="no such file"):
        keras_vit.load_model(tmp_path / "missing.keras")
    (tmp_path / "empty.keras").write_bytes(b"")
    with pytest.raises(CheckpointError, match="not a whole zip archive"):
        keras_vit.load_model(tmp_path / "empty.keras")
    for bad in (None, "0-255", (0, 2)):
        with pytest.raises(ValueError, match=r"`value_range` must be \(0, 255\) or \(0, 1\)"):
            keras_vit.preprocess_inputs(pixels(), value_range=bad)


def test_an_npz_that_would_rebuild_another_model_says_so(tmp_path, capsys):
    """`save_npz` and `convert` wrote the arrays of a model whose GELU, layer-norm epsilon,
    classifier or data config the arrays cannot state, and `from_pretrained` gave back another
    model without a word."""
    other = dict(TINY, layer_norm_epsilon=0.5, classifier="gap", class_token=True)
    model = randomized(keras_vit.ViT(**other))
    with pytest.warns(UserWarning, match=r"from_pretrained would rebuild .*gelu_approximate "
                                         r"True \(the model: False\)") as caught:
        save_npz(model, tmp_path / "m.npz")
    said = next(str(w.message) for w in caught if "would rebuild" in str(w.message))
    assert "layer_norm_epsilon 1e-06 (the model: 0.5)" in said and "classifier 'token'" in said
    # The arrays are all there: loaded into a model built as this one, the same answers.
    back = keras_vit.ViT(**other)
    keras_vit.load_pretrained(back, tmp_path / "m.npz")
    np.testing.assert_allclose(back.predict(pixels() / 127.5 - 1, verbose=0),
                               model.predict(pixels() / 127.5 - 1, verbose=0), atol=1e-6)
    # A model the arrays describe is written without a word; the command line says it in one.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        save_npz(randomized(keras_vit.ViT(**dict(TINY, gelu_approximate=True))),
                 tmp_path / "plain.npz")
    assert not [w for w in caught if "would rebuild" in str(w.message)]
    model.save(tmp_path / "m.keras")
    assert cli.main(["convert", str(tmp_path / "m.keras"), str(tmp_path / "c.npz")]) == 0
    warned = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(warned) == 1 and "would rebuild" in warned[0], warned


def test_an_npz_of_a_model_with_its_own_data_config_says_to_set_it_again(tmp_path):
    """`load_pretrained` gives a model the data config its file states, and an .npz states
    none: the paper's. The warning's advice says to set the model's own again."""
    imagenet = dict(input_size=[3, 16, 16], interpolation="bicubic", crop_pct=0.9,
                    crop_mode="center", mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    model = randomized(keras_vit.ViT(**TINY, data_config=imagenet))
    with pytest.warns(UserWarning, match=r"or set its data_config again after "
                                         r"keras_vit.load_pretrained\(model, path\)"):
        save_npz(model, tmp_path / "m.npz")
    back = keras_vit.ViT(**TINY, data_config=imagenet)
    keras_vit.load_pretrained(back, tmp_path / "m.npz")
    assert back.data_config.is_paper  # as the warning says


def test_a_safetensors_file_timm_builds_otherwise_says_so(tmp_path):
    """timm's LayerNorm epsilon is 1e-6 and its resize of a position embedding bicubic: a
    model of another is written with a warning naming it (keras_vit reads it back exactly);
    class names that do not fit the head are refused before anything is written."""
    from keras_vit.weights import writers

    with warnings.catch_warnings(record=True) as caught:  # timm's own epsilon, or 1e-12's
        warnings.simplefilter("always")
        for epsilon in (1e-6, 1e-12):
            writers.save_safetensors(randomized(keras_vit.ViT(**dict(
                TINY, layer_norm_epsilon=epsilon))), tmp_path / str(epsilon) / "m.safetensors")
    assert not [w for w in caught if "timm builds" in str(w.message)]
    model = randomized(keras_vit.ViT(**dict(TINY, layer_norm_epsilon=1e-3,
                                            dynamic_image_size=True)))
    path = tmp_path / "a" / "model.safetensors"
    with pytest.warns(UserWarning, match=r"timm builds .* with LayerNorm epsilon 1e-06 \(this "
                                         r"model's: 0.001\); a position embedding resized "
                                         r"bicubically at other input sizes \(this model's: "
                                         r"linear\)"):
        writers.save_safetensors(model, path)
    x = pixels() / 127.5 - 1
    np.testing.assert_allclose(keras_vit.from_pretrained(path).predict(x, verbose=0),
                               model.predict(x, verbose=0), atol=1e-6)
    with pytest.raises(ValueError, match="class_names has 1 names but the model has 5 classes"):
        writers.save_safetensors(randomized(keras_vit.ViT(**TINY)),
                                 tmp_path / "b" / "model.safetensors", class_names=["one"])
    assert not (tmp_path / "b").exists()
    # A model without a head has no classes to name: timm's config.json gets none.
    headless = keras_vit.ViT(**dict(TINY, include_top=False, num_classes=None))
    writers.save_safetensors(headless, tmp_path / "c" / "model.safetensors", ["a", "b"])
    assert "label_names" not in json.loads((tmp_path / "c" / "config.json").read_text())


def test_convert_says_which_class_names_the_output_cannot_hold(tmp_path, capsys):
    """Converting a .safetensors file with class names to .keras or .npz, which cannot hold
    them, says so; the shipped digits' names are the defaults ("0".."9"), which nothing
    loses."""
    from keras_vit.weights import writers

    path = tmp_path / "named" / "model.safetensors"
    writers.save_safetensors(randomized(keras_vit.ViT(**TINY)), path, list("abcde"))
    for out in ("m.keras", "m.npz", "m2.safetensors"):
        assert cli.main(["convert", str(path), str(tmp_path / out)]) == 0
        said = capsys.readouterr().out
        assert ("the source's 5 (a, b, c, ...) are left out" in said) == \
            (not out.endswith(".safetensors")), out
    assert cli.main(["convert", "digits", str(tmp_path / "d.keras")]) == 0
    assert "class names" not in capsys.readouterr().out


def test_an_npz_beside_the_config_json_keras_vit_wrote_keeps_its_data_config(tmp_path, capsys):
    """timm's config.json that `convert` writes beside a .safetensors file left `antialias`
    out, and an .npz in the same folder then read as antialiased (another answer)."""
    digits = keras_vit.from_pretrained("digits")
    assert digits.data_config["antialias"] is False
    for name in ("a.safetensors", "a.npz"):
        assert cli.main(["convert", "digits", str(tmp_path / name)]) == 0
    assert "warning" not in capsys.readouterr().err  # the npz gives the model back
    for name in ("a.safetensors", "a.npz"):
        back = keras_vit.from_pretrained(tmp_path / name)
        assert dict(back.data_config) == dict(digits.data_config), name
    # timm's own fields are timm's: its pretrained_cfg holds no field timm does not know.
    written = json.loads((tmp_path / "config.json").read_text())
    assert "antialias" not in written["pretrained_cfg"]
    assert written["preprocessing"]["antialias"] is False



def test_predict_with_a_fresh_head_says_every_class_is_equally_likely(tmp_path, capsys):
    """`predict --model-config ...` without weights printed chance for every class, silently
    (`evaluate` refuses such a head)."""
    from PIL import Image

    path = tmp_path / "x.png"
    Image.fromarray(pixels(n=1)[0].astype(np.uint8)).save(path)
    config = json.dumps({k: v for k, v in TINY.items() if k != "num_classes"} | {"num_classes": 3})
    assert cli.main(["predict", "--model-config", config, str(path)]) == 0
    captured = capsys.readouterr()
    assert "33.33%" in captured.out
    warned = [line for line in captured.err.splitlines() if "warning" in line]
    assert len(warned) == 1 and "head is all zeros" in warned[0], captured.err
    assert cli.main(["predict", "--weights", "digits", str(path)]) == 0
    assert "head is all zeros" not in capsys.readouterr().err


def test_an_npz_of_a_model_without_head_or_of_another_builder_is_written_without_a_word(
        tmp_path):
    from keras_vit import pretraining

    headless = dict(TINY, gelu_approximate=True, include_top=False, num_classes=None)
    encoder = randomized(keras_vit.ViT(**headless))
    masked = pretraining.masked_patch_model(keras_vit.ViT(**headless))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        save_npz(encoder, tmp_path / "encoder.npz")
        save_npz(masked, tmp_path / "masked.npz")
    assert not [w for w in caught if "would rebuild" in str(w.message)]
    assert (tmp_path / "masked.npz").exists()


def test_an_int8_model_with_a_fresh_head_is_still_refused_by_evaluate():
    model = keras_vit.ViT(**TINY)
    model.quantize("int8")
    images, labels = pixels(n=4), np.arange(4) % 5
    with pytest.raises(ValueError, match="has a fresh head"):
        keras_vit.evaluate(model, (images, labels), progress=False)
