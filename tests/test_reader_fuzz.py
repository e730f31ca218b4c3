"""Readers of names and files given arbitrary input (hypothesis): each returns a valid result
or raises the library's one-line error, never another exception type."""

import functools
import json
import os
import pathlib
import re
import shutil
import tempfile
import zipfile

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from safetensors.numpy import load_file, save_file

import keras_vit
from keras_vit import data_config as dc
from keras_vit import fileio, weights
from keras_vit.weights import config_json, hub, keras_hub, writers

TINY = dict(image_size=16, patch_size=8, hidden_size=8, num_layers=1, num_heads=2, mlp_dim=8,
            num_classes=3)

# Few examples each, no deadline: the whole file stays within seconds on a busy machine.
SETTINGS = settings(max_examples=60, deadline=None)

# --------------------------------------------------------------------------------------------
# The temporaries a command may remove: this process's on this machine, nothing else.


@functools.cache
def this_host():
    """This machine's digest, as the temporaries' names carry it."""
    with tempfile.TemporaryDirectory() as folder:
        with fileio.atomic_file(os.path.join(folder, "a")) as tmp:  # the name only
            return fileio.TEMPORARY_NAME.match(os.path.basename(tmp))["host"]


def test_is_own_temporary_recognises_this_processs_temporaries_only(tmp_path):
    with fileio.atomic_file(tmp_path / "final.npz") as tmp:
        assert fileio.is_own_temporary(os.path.basename(tmp))
    with fileio.staging_dir(tmp_path / "export") as folder:
        assert fileio.is_own_temporary(os.path.basename(folder))
    digest = fileio.TEMPORARY_NAME.match(os.path.basename(tmp))["host"]
    other_host = "0" * 8 if digest != "0" * 8 else "1" * 8
    for name in (f".keras_vit-old-{digest}-{os.getpid()}-abc",          # the user's old version
                 f".keras_vit-tmp-{other_host}-{os.getpid()}-abc-x",    # another machine's
                 f".keras_vit-tmp-{digest}-{os.getpid() + 1}-abc-x",    # another process's
                 "final.npz", ".tmp-final.npz", "keras_vit-tmp-x"):
        assert not fileio.is_own_temporary(name), name


@SETTINGS
@given(kind=st.sampled_from(["tmp", "old", "TMP", "temp"]), own_host=st.booleans(),
       pid=st.sampled_from([os.getpid(), os.getpid() + 1, 0]), rest=st.text(max_size=20),
       junk=st.text(max_size=3))
def test_is_own_temporary_is_this_process_and_machine_and_tmp_only(kind, own_host, pid, rest,
                                                                   junk):
    host = this_host() if own_host else format(int(this_host(), 16) ^ 1, "08x")
    name = f"{junk}.keras_vit-{kind}-{host}-{pid}-{rest}"
    assert fileio.is_own_temporary(name) is \
        (not junk and kind == "tmp" and own_host and pid == os.getpid())


@SETTINGS
@given(st.text(max_size=40))
def test_is_own_temporary_of_any_name_is_a_bool(name):
    assert fileio.is_own_temporary(name) in (True, False)


# --------------------------------------------------------------------------------------------
# Data-config readers and keras-hub presets, given any JSON value or any bytes.

# Any JSON value, NaN and the infinities included (Python's json reads and writes them).
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12)


def json_object(fields):
    """JSON objects whose keys are mostly the reader's own `fields`, with any values (so that
    the fuzzing reaches past "not an object" into each field's check)."""
    keys = st.sampled_from(sorted(fields)) | st.text(max_size=6)
    return st.dictionaries(keys, JSON | st.sampled_from(FIELD_VALUES), max_size=len(fields) + 1)


# Values a field takes, well-formed or nearly, to combine with the arbitrary ones.
FIELD_VALUES = [[3, 16, 16], [3, 0, 16], [16, 16], 16, "bicubic", "bilinear", "lanczos3",
                0.875, 1.0, 0, "center", "squash", [0.5, 0.5, 0.5], [0.2, 0.0, 0.2], True,
                "ViTImageConverter", "ViTImageClassifierPreprocessor", "ViTBackbone",
                "ViTImageClassifier", [16, 16, 3]]
DATA_CONFIG_FIELDS = ("input_size", "interpolation", "crop_pct", "crop_mode", "mean", "std",
                      "antialias", "test_input_size", "num_classes")
CONVERTER_FIELDS = ("image_size", "scale", "offset", "interpolation", "crop_to_aspect_ratio",
                    "pad_to_aspect_ratio", "image_converter", "class_name", "config")


def check_result_or_error(read, path):
    """`read()` returns a valid data config or raises a ValueError or OSError (subclasses
    included) on one line naming `path`; any other exception fails the test."""
    try:
        config = read()
    except (ValueError, OSError) as e:
        message = str(e)
        assert "\n" not in message.strip(), message
        assert str(path) in message, (path, message)
        return None
    assert dc.check_data_config(config) == config
    return config


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A folder with a tiny `.npz` checkpoint, for a `config.json` beside it."""
    folder = tmp_path_factory.mktemp("checkpoint")
    weights.save_npz(keras_vit.ViT(**TINY), folder / "model.npz")
    return folder


def read_every_way(folder):
    """A `config.json` in `folder` read as `resolve_data_config` reads it: the file, its folder
    and the checkpoint beside it (only where it states a data config)."""
    config_path = folder / "config.json"
    check_result_or_error(lambda: keras_vit.resolve_data_config(config_path), config_path)
    check_result_or_error(lambda: keras_vit.resolve_data_config(folder), config_path)
    check_result_or_error(lambda: keras_vit.resolve_data_config(folder / "model.npz"),
                          config_path)


@SETTINGS
@given(st.one_of(
    JSON,
    st.fixed_dictionaries({"format": st.just(config_json.KERAS_VIT_FORMAT),
                           "preprocessing": json_object(DATA_CONFIG_FIELDS) | JSON,
                           "model": JSON}),
    st.fixed_dictionaries({"pretrained_cfg": json_object(DATA_CONFIG_FIELDS) | JSON}),
    # timm's config.json as keras_vit writes it: keras_vit's whole data config beside timm's.
    st.fixed_dictionaries({"pretrained_cfg": json_object(DATA_CONFIG_FIELDS) | JSON,
                           "written_by": st.just(config_json.WRITTEN_BY),
                           "preprocessing": json_object(DATA_CONFIG_FIELDS) | JSON})))
def test_a_config_json_of_any_json_value_gives_a_data_config_or_one_line(folder, document):
    (folder / "config.json").write_text(json.dumps(document))
    read_every_way(folder)


@SETTINGS
@given(st.binary(max_size=64) | st.builds(lambda b: b'{"pretrained_cfg": ' + b, st.binary(
    max_size=32)))
def test_a_config_json_of_any_bytes_gives_a_data_config_or_one_line(folder, data):
    (folder / "config.json").write_bytes(data)
    read_every_way(folder)


@pytest.fixture(scope="module")
def tensors(tmp_path_factory):
    """The arrays of a tiny `.safetensors` file keras_vit wrote."""
    path = tmp_path_factory.mktemp("safetensors") / "model.safetensors"
    writers.save_safetensors(keras_vit.ViT(**TINY), path)
    return load_file(path)


@SETTINGS
@given(document=JSON | st.fixed_dictionaries(
    {"format": st.just(config_json.KERAS_VIT_FORMAT),
     "preprocessing": json_object(DATA_CONFIG_FIELDS) | JSON},
    optional={"model": JSON, "class_names": JSON}), as_text=st.booleans())
def test_a_safetensors_files_metadata_of_any_json_gives_a_data_config_or_one_line(
        tensors, tmp_path_factory, document, as_text):
    path = tmp_path_factory.getbasetemp() / "metadata.safetensors"
    text = json.dumps(document) if as_text else json.dumps(document)[:-1]  # or cut short
    save_file(tensors, path, metadata={hub.METADATA_KEY: text})
    check_result_or_error(lambda: keras_vit.resolve_data_config(path), path)


@pytest.fixture(scope="module")
def preset(tmp_path_factory):
    """A tiny keras-hub preset folder keras_vit wrote, without keras_vit's mark (as keras-hub
    writes it: its files are read, not checked against the digests of the mark; its JSON files
    are replaced per example)."""
    pytest.importorskip("keras_hub")
    folder = tmp_path_factory.mktemp("preset") / "preset"
    writers.save_keras_hub_preset(keras_vit.ViT(**dict(TINY, gelu_approximate=False)), folder)
    (folder / keras_hub.MARK_FILE).unlink()
    return folder


@SETTINGS
@given(name=st.sampled_from([keras_hub.PREPROCESSOR_FILE, keras_hub.IMAGE_CONVERTER_FILE]),
       document=st.one_of(
           JSON,
           st.fixed_dictionaries({"class_name": st.sampled_from(["ViTImageConverter",
                                                                 "ViTImageClassifierPreprocessor"]),
                                  "config": json_object(CONVERTER_FIELDS)}),
           st.fixed_dictionaries({
               "class_name": st.just("ViTImageClassifierPreprocessor"),
               "config": st.fixed_dictionaries({"image_converter": st.fixed_dictionaries({
                   "class_name": st.just("ViTImageConverter"),
                   "config": json_object(CONVERTER_FIELDS)})})})))
@example(name=keras_hub.PREPROCESSOR_FILE, document={  # an integer beyond int64
    "class_name": "ViTImageClassifierPreprocessor", "config": {"image_converter": {
        "class_name": "ViTImageConverter", "config": {"offset": -2**63 - 1}}}})
def test_a_presets_converter_of_any_json_gives_a_data_config_or_one_line(preset, name,
                                                                         document):
    converters = (keras_hub.PREPROCESSOR_FILE, keras_hub.IMAGE_CONVERTER_FILE)
    originals = {other: (preset / other).read_bytes() for other in converters}
    try:
        for other in converters:
            (preset / other).unlink()
        (preset / name).write_text(json.dumps(document))
        check_result_or_error(lambda: keras_vit.resolve_data_config(preset), preset)
    finally:
        for other, data in originals.items():
            (preset / other).write_bytes(data)


DELETE = object()  # a field removed


def paths_of(value, prefix=()):
    """Every path to a field of nested JSON objects."""
    if not isinstance(value, dict):
        return []
    return [p for k, v in value.items() for p in [(*prefix, k), *paths_of(v, (*prefix, k))]]


def mutate(data, original):
    """`original` (a preset file's JSON object) with up to 3 of its fields, at any depth,
    replaced by any JSON value (or a value another field takes) or removed: close enough to
    the reader's expectations to reach its later checks and keras-hub's loading."""
    document = json.loads(json.dumps(original))
    paths = paths_of(document)
    for path in data.draw(st.lists(st.sampled_from(paths), max_size=3, unique=True),
                          label="fields"):
        parent = document
        for key in path[:-1]:
            parent = parent.get(key) if isinstance(parent, dict) else None
        if not isinstance(parent, dict):
            continue  # under a field replaced already
        value = data.draw(JSON | st.sampled_from(FIELD_VALUES) | st.just(DELETE),
                          label="/".join(path))
        if value is DELETE:
            parent.pop(path[-1], None)
        else:
            parent[path[-1]] = value
    return document


def read_preset_or_one_line(preset, name, data):
    """`from_pretrained` of the preset with `name` holding `data`: a model (whose data config
    is valid) or a ValueError or OSError on one line naming the preset; the file restored."""
    path = preset / name
    original = path.read_bytes()
    path.write_bytes(data)
    try:
        def read():
            model = keras_vit.from_pretrained(preset)
            return keras_vit.resolve_data_config(model)
        check_result_or_error(read, preset)
    finally:
        path.write_bytes(original)


PRESET_FILES = (keras_hub.CONFIG_FILE, keras_hub.METADATA_FILE, keras_hub.TASK_FILE)
# keras-hub loads the weights for each example: fewer of them.
PRESET_SETTINGS = settings(max_examples=25, deadline=None)


@PRESET_SETTINGS
@given(data=st.data())
def test_a_presets_json_files_of_any_json_give_a_model_or_one_line(preset, data):
    name = data.draw(st.sampled_from(PRESET_FILES), label="file")
    original = json.loads((preset / name).read_text())
    document = data.draw(JSON, label="document") if data.draw(st.booleans()) \
        else mutate(data, original)
    read_preset_or_one_line(preset, name, json.dumps(document).encode())


@PRESET_SETTINGS
@given(name=st.sampled_from(PRESET_FILES), data=st.binary(max_size=48))
def test_a_presets_json_files_of_any_bytes_give_a_model_or_one_line(preset, name, data):
    read_preset_or_one_line(preset, name, data)


# --------------------------------------------------------------------------------------------
# The defects the fuzzing found, one example each.


@pytest.fixture
def own_preset(preset, tmp_path):
    """A copy of the tiny preset, for one test to change."""
    return pathlib.Path(shutil.copytree(preset, tmp_path / "preset"))


def test_a_converters_crop_flag_of_another_type_is_named(own_preset):
    (own_preset / keras_hub.PREPROCESSOR_FILE).unlink()
    (own_preset / keras_hub.TASK_FILE).unlink()  # no copy of the converter to agree with
    path = own_preset / keras_hub.IMAGE_CONVERTER_FILE
    path.write_text(json.dumps({"class_name": "ViTImageConverter",
                                "config": {"crop_to_aspect_ratio": [3, 16, 16]}}))
    with pytest.raises(keras_vit.CheckpointError) as raised:
        keras_vit.resolve_data_config(own_preset)
    assert str(raised.value) == (f"{path}: `crop_to_aspect_ratio` must be True or False. "
                                 "Received: crop_to_aspect_ratio=[3, 16, 16]")


def test_a_field_keras_hub_cannot_read_is_one_line_naming_the_preset(own_preset):
    path = own_preset / keras_hub.CONFIG_FILE
    document = json.loads(path.read_text())
    document["config"]["dtype"] = 5  # keras-hub reads an object's fields there
    path.write_text(json.dumps(document))
    task = own_preset / keras_hub.TASK_FILE  # and the copy its classifier is built from
    task_document = json.loads(task.read_text())
    task_document["config"]["backbone"] = document
    task.write_text(json.dumps(task_document))
    with pytest.raises(keras_vit.CheckpointError) as raised:
        keras_vit.from_pretrained(own_preset)
    assert str(raised.value).startswith(f"{own_preset}: keras-hub could not load the preset (")
    assert "\n" not in str(raised.value)


# --------------------------------------------------------------------------------------------
# Byte-level mutations of the binary formats read whole: a .keras model, a preset's weights.


def mutated(data, draw):
    """`data` with up to 4 bytes replaced, then maybe cut short (hypothesis draws)."""
    data = bytearray(data)
    for _ in range(draw(st.integers(1, 4), label="bytes replaced")):
        at = draw(st.integers(0, len(data) - 1), label="at")
        data[at] = draw(st.integers(0, 255), label="value")
    if draw(st.booleans(), label="truncated"):
        data = data[:draw(st.integers(0, len(data)), label="length")]
    return bytes(data)


def outputs(model):
    x = np.linspace(-1, 1, 2 * 16 * 16 * 3, dtype=np.float32).reshape(2, 16, 16, 3)
    return np.asarray(model.predict_on_batch(x))


def loaded_or_one_line(load, path, expected=None):
    """`load()` gives a model (with `expected` outputs, where given), or raises a ValueError
    or OSError on one line naming `path`; any other exception fails the test."""
    try:
        model = load()
    except (ValueError, OSError) as e:
        message = str(e)
        assert "\n" not in message.strip() and len(message) < 1000, message
        assert str(path) in message, (path, message)
        return None
    if expected is not None:
        np.testing.assert_array_equal(outputs(model), expected)
    return model


@pytest.fixture(scope="module")
def keras_model_file(tmp_path_factory):
    """A tiny `.keras` file `model.save` wrote, and the outputs of its model."""
    model = keras_vit.ViT(**TINY)
    path = tmp_path_factory.mktemp("keras") / "model.keras"
    model.save(path)
    return path, outputs(model)


@PRESET_SETTINGS
@given(data=st.data())
def test_a_keras_file_of_any_mutated_bytes_loads_as_saved_or_is_one_line(keras_model_file,
                                                                          tmp_path_factory,
                                                                          data):
    """Every member of a .keras archive carries a CRC-32: a changed byte is caught, never a
    model with other numbers (or an internal error from zipfile, h5py or Keras)."""
    original, expected = keras_model_file
    path = tmp_path_factory.mktemp("mutated") / "model.keras"
    changed = mutated(original.read_bytes(), data.draw)
    path.write_bytes(changed)
    model = loaded_or_one_line(lambda: keras_vit.load_model(path), path, expected)
    # Loaded only if untouched where it matters (a zip's own comment, a byte rewritten as itself).
    assert model is None or len(changed) == original.stat().st_size


@PRESET_SETTINGS
@given(data=st.data())
def test_a_keras_files_config_json_of_any_json_loads_or_is_one_line(keras_model_file,
                                                                    tmp_path_factory, data):
    """A .keras archive whose config.json another tool rewrote (CRCs valid): a model, or one
    line naming the file."""
    original, _ = keras_model_file
    path = tmp_path_factory.mktemp("rewritten") / "model.keras"
    with zipfile.ZipFile(original) as source, zipfile.ZipFile(path, "w") as target:
        for item in source.infolist():
            content = source.read(item)
            if item.filename == "config.json":
                document = data.draw(JSON, label="document") if data.draw(st.booleans()) \
                    else mutate(data, json.loads(content))
                content = json.dumps(document).encode()
            target.writestr(item.filename, content)
    loaded_or_one_line(lambda: keras_vit.load_model(path), path)


@pytest.fixture(scope="module")
def preset_with_mark(tmp_path_factory):
    """A tiny preset keras_vit wrote (with its mark), and the outputs of its model."""
    pytest.importorskip("keras_hub")
    model = keras_vit.ViT(**dict(TINY, gelu_approximate=False))
    folder = tmp_path_factory.mktemp("marked") / "preset"
    writers.save_keras_hub_preset(model, folder)
    return folder, outputs(model)


WEIGHTS_FILES = (keras_hub.BACKBONE_WEIGHTS_FILES[0], keras_hub.TASK_WEIGHTS_FILE)


@PRESET_SETTINGS
@given(name=st.sampled_from(WEIGHTS_FILES), marked=st.booleans(), data=st.data())
def test_a_presets_weights_of_any_mutated_bytes_load_or_are_one_line(preset_with_mark, name,
                                                                     marked, data):
    """HDF5 has no checksum: a preset keras_vit wrote is checked against the digests of its
    mark (loaded exactly as written, or one line); one without the mark (as keras-hub writes
    it) loads or is one line, never an internal error from h5py or keras-hub."""
    folder, expected = preset_with_mark
    mark = folder / keras_hub.MARK_FILE
    saved = {path: path.read_bytes() for path in (folder / name, mark)}
    (folder / name).write_bytes(mutated(saved[folder / name], data.draw))
    if not marked:
        mark.unlink()
    try:
        loaded_or_one_line(lambda: keras_vit.from_pretrained(folder), folder,
                           expected if marked else None)
    finally:
        for path, content in saved.items():
            path.write_bytes(content)


# --------------------------------------------------------------------------------------------
# Every reader of a file format has a fuzz test.


# Each function of the package that reads a file format -> the tests that fuzz it (in the
# modules listed in `FUZZ_MODULES`).
FUZZED_READERS = {
    "keras_vit.weights.npz.open_npz": ["test_mutated_npz_reads_as_its_bytes_or_is_named"],
    "keras_vit.weights.npz.read_npz": ["test_mutated_npz_reads_as_its_bytes_or_is_named",
                                       "test_mutated_npz_loads_into_a_model_as_its_bytes_or_is_named"],
    "keras_vit.weights.hub.read_safetensors_headers": [
        "test_mutated_safetensors_load_as_their_bytes_or_are_named"],
    "keras_vit.weights.hub.read_safetensors": [
        "test_mutated_safetensors_load_as_their_bytes_or_are_named"],
    "keras_vit.weights.hub.load_safetensors": [
        "test_mutated_safetensors_load_as_their_bytes_or_are_named"],
    "keras_vit.weights.hub.read_own_config": [
        "test_a_safetensors_files_metadata_of_any_json_gives_a_data_config_or_one_line"],
    "keras_vit.weights.hub.read_config": ["test_mutated_timm_config_json_is_read_or_named"],
    "keras_vit.weights.hub.parse_hub": ["test_hub_names_parse_or_are_refused"],
    "keras_vit.weights.architecture.read_sidecar": [
        "test_mutated_keras_vit_config_json_beside_an_npz_is_read_or_named"],
    "keras_vit.weights.config_json.read_json": [
        "test_a_config_json_of_any_bytes_gives_a_data_config_or_one_line"],
    "keras_vit.weights.config_json.parse_json": [
        "test_a_config_json_of_any_json_value_gives_a_data_config_or_one_line"],
    "keras_vit.weights.keras_hub.read_preset": [
        "test_a_presets_json_files_of_any_json_give_a_model_or_one_line",
        "test_a_presets_json_files_of_any_bytes_give_a_model_or_one_line",
        "test_a_presets_converter_of_any_json_gives_a_data_config_or_one_line",
        "test_a_presets_weights_of_any_mutated_bytes_load_or_are_one_line"],
    "keras_vit.weights.keras_file.load_model": [
        "test_a_keras_file_of_any_mutated_bytes_loads_as_saved_or_is_one_line",
        "test_a_keras_files_config_json_of_any_json_loads_or_is_one_line"],
    "keras_vit.training.callbacks.read_json_state": [
        "test_mutated_run_json_is_read_or_named", "test_mutated_best_json_is_read_or_named",
        "test_mutated_latest_json_is_read_or_named"],
    "keras_vit.export.read_metadata": ["test_mutated_saved_model_metadata_is_read_or_named"],
    "keras_vit.images.load_image": [
        "test_mutated_images_decode_or_fail_with_one_line_naming_the_file"],
}
# Functions named like readers that read no file format of their own.
NOT_FORMAT_READERS = {
    "keras_vit.weights.sources.load_pretrained": "fetch_params and load_params: readers above",
    "keras_vit.weights.loading.load_params": "arrays already read",
    "keras_vit.labels.read_class_names": "text lines, checked against the head",
}
FUZZ_MODULES = ("test_reader_fuzz", "test_fuzz_files", "test_hostile_inputs", "test_hub")
READER_NAME = re.compile(r"^def ((?:read|load|open|parse)_\w+|load_model)\(", re.M)


def test_every_reader_of_a_file_format_has_a_fuzz_test():
    import importlib

    package = pathlib.Path(keras_vit.__file__).parent
    found = set()
    for path in package.rglob("*.py"):
        module = ".".join(path.relative_to(package.parent).with_suffix("").parts)
        found |= {f"{module}.{name}" for name in READER_NAME.findall(path.read_text())}
    unlisted = sorted(found - set(FUZZED_READERS) - set(NOT_FORMAT_READERS))
    assert not unlisted, f"readers without a fuzz test: {unlisted}"
    assert not sorted(set(FUZZED_READERS) - found), "listed readers that no longer exist"
    tests = set()
    for name in FUZZ_MODULES:
        tests |= {n for n in vars(importlib.import_module(name)) if n.startswith("test_")}
    missing = {reader: [t for t in names if t not in tests]
               for reader, names in FUZZED_READERS.items()}
    assert not {k: v for k, v in missing.items() if v}, missing


@SETTINGS
@given(st.text(max_size=60) | st.from_regex(r"hf://[A-Za-z0-9._/@\-]{0,40}", fullmatch=True))
def test_hub_names_parse_or_are_refused(text):
    source = text if text.startswith(hub.HF_SCHEME) else hub.HF_SCHEME + text
    try:
        repo, revision = hub.parse_hub(source)
    except ValueError as e:
        assert "\n" not in str(e) and len(str(e)) < 500
        return
    assert source == hub.HF_SCHEME + repo + ("" if revision is None else "@" + revision) \
        or source == hub.HF_SCHEME + repo + "@"
    assert ".." not in repo.split("/") and (revision is None or ".." not in revision.split("/"))
    assert not os.path.isabs(repo) and (revision is None or not os.path.isabs(revision))
