"""Property-based fuzzing of the files keras_vit reads, made by keras_vit's own writers: an `.npz`
and a `.safetensors` (with its `config.json`) of a tiny model, the `config.json`, `run.json`,
`best.json` and `latest.json` of a real one-epoch `training.fit` run, and a SavedModel's
`assets.extra/keras_vit.json`. Hypothesis mutates their bytes (flip, truncate, insert, splice)
or their JSON values (any value replaced by another: huge or negative numbers, NaN, strings,
containers, nesting 50000 deep). Every outcome must be a success with the content the bytes
hold, or one of the package's named errors (a ValueError or OSError) whose message names the
file; the file is never changed."""

import hashlib
import json
import math
import os
import pathlib
import shutil
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.numpy import load_file

import keras_vit
from keras_vit import export, training, weights
from keras_vit.training import callbacks, loop
from keras_vit.weights import torch_layouts, writers

from test_errors import TINY, fit_tiny

FUZZ = settings(max_examples=40, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])
# Each example of these builds a model (from_pretrained): fewer, to keep the file fast.
FUZZ_BUILDS = settings(FUZZ, max_examples=15)
DEEP = "[" * 50000 + "]" * 50000
NAMED_ERRORS = (ValueError, OSError)  # CheckpointError, StateFileError, ... are ValueErrors


# ---------------------------------------------------------------------------------------------
# Mutations.


@st.composite
def byte_mutation(draw, size):
    """A function of the file's bytes: one flip, truncation, insertion or splice."""
    kind = draw(st.sampled_from(["flip", "truncate", "insert", "splice"]))
    at = draw(st.integers(0, size - 1))
    if kind == "flip":
        mask = draw(st.integers(1, 255))
        return lambda data: data[:at] + bytes([data[at] ^ mask]) + data[at + 1:]
    if kind == "truncate":
        return lambda data: data[:at]
    if kind == "insert":
        extra = draw(st.binary(min_size=1, max_size=16))
        return lambda data: data[:at] + extra + data[at:]
    source, length = draw(st.integers(0, size - 1)), draw(st.integers(1, 64))
    return lambda data: data[:at] + data[source:source + length] + data[at + length:]


def json_values():
    leaves = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70),
                       st.sampled_from([10**30, -1, 0, 2**63]),
                       st.floats(allow_nan=True, allow_infinity=True),
                       st.text(max_size=8), st.just(DEEP))
    return st.recursive(leaves, lambda children: st.one_of(
        st.lists(children, max_size=3), st.dictionaries(st.text(max_size=6), children,
                                                        max_size=3)), max_leaves=6)


def paths(value, prefix=()):
    """Every place in a JSON tree: the root and each key / index below it."""
    yield prefix
    if isinstance(value, dict):
        for key, child in value.items():
            yield from paths(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield from paths(child, (*prefix, index))


def replaced(document, path, value):
    if not path:
        return value
    copy = json.loads(json.dumps(document))
    node = copy
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = value
    return copy


def dumps(document):
    """JSON text, with DEEP strings written as the nested brackets they spell."""
    return json.dumps(document).replace(json.dumps(DEEP), DEEP)


@st.composite
def json_mutation(draw, document):
    """The JSON text of `document` with one value replaced (the whole document, rarely), or
    with its text mutated."""
    kind = draw(st.sampled_from(["value", "value", "value", "document", "text"]))
    if kind != "text":
        places = list(paths(document))[1:] if kind == "value" else [()]
        place = places[draw(st.integers(0, len(places) - 1))]
        return dumps(replaced(document, place, draw(json_values()))).encode()
    text = json.dumps(document).encode()
    return draw(byte_mutation(len(text)))(text)


# ---------------------------------------------------------------------------------------------
# The property.


def digest(path):
    return hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()


def outcome(call, path):
    """`call()`'s result, or None where it raised a named error naming `path` (whose bytes it
    must not have changed)."""
    before = digest(path)
    try:
        return call()
    except NAMED_ERRORS as e:
        message = str(e)
        assert os.path.basename(os.fspath(path)) in message, f"{type(e).__name__}: {message}"
        return None
    finally:
        assert digest(path) == before


def independent_npz(path):
    """NumPy's own reading of the archive's members (no pickles), to compare a success with
    (`np.load` itself refuses a zip with bytes before its first member, which zip readers
    accept)."""
    with open(path, "rb") as f, np.lib.npyio.NpzFile(f, allow_pickle=False) as archive:
        return {k: archive[k] for k in archive.files}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The real files, written once by keras_vit's own writers."""
    root = tmp_path_factory.mktemp("fuzz")
    model = keras_vit.ViT(**TINY)
    weights.save_npz(model, root / "model.npz")
    (root / "st").mkdir()
    writers.save_safetensors(model, root / "st" / "model.safetensors", class_names=["a", "b", "c"])
    fit_tiny(None, root / "run", epochs=1)
    run = root / "run"
    shutil.copy(run / "final.npz", run / "best.npz")
    (run / "best.json").write_text(json.dumps(
        {"monitor": "val_accuracy", "value": 0.5, "epoch": 0, "sha256": digest(run / "best.npz"),
         "previous": None}))
    backup = run / "backup"
    (backup / "epoch-000001").mkdir(parents=True)
    (backup / "latest.json").write_text(json.dumps({"epoch": 1, "dir": "epoch-000001"}))
    export.export_saved_model(model, root / "export", warmup=False)
    return root


def fresh(tmp_path):
    """A new folder for one example (the examples of a test share its `tmp_path`)."""
    return pathlib.Path(tempfile.mkdtemp(dir=tmp_path))


def copy_to(folder, source):
    target = folder / source.name
    shutil.copy(source, target)
    return target


# ---------------------------------------------------------------------------------------------
# Checkpoints.


@FUZZ
@given(data=st.data())
def test_mutated_npz_reads_as_its_bytes_or_is_named(files, tmp_path, data):
    path = fresh(tmp_path) / "model.npz"
    original = (files / "model.npz").read_bytes()
    path.write_bytes(data.draw(byte_mutation(len(original)))(original))
    params = outcome(lambda: weights.read_npz(path), path)
    if params is not None:
        expected = independent_npz(path)
        assert sorted(params) == sorted(expected)
        for key, value in expected.items():
            np.testing.assert_array_equal(params[key], value)


@pytest.fixture(scope="module")
def model():
    return keras_vit.ViT(**TINY)


@FUZZ
@given(data=st.data())
def test_mutated_npz_loads_into_a_model_as_its_bytes_or_is_named(files, model, tmp_path, data):
    path = fresh(tmp_path) / "model.npz"
    original = (files / "model.npz").read_bytes()
    path.write_bytes(data.draw(byte_mutation(len(original)))(original))
    before = weights.model_params(model)
    if outcome(lambda: keras_vit.load_pretrained(model, str(path)), path) is None:
        after = weights.model_params(model)
        assert all(np.array_equal(after[k], before[k]) for k in before)  # all or nothing
        return
    loaded, expected = weights.model_params(model), independent_npz(path)
    for key, value in loaded.items():
        np.testing.assert_array_equal(value, expected[key])


@FUZZ_BUILDS
@given(data=st.data())
def test_mutated_safetensors_load_as_their_bytes_or_are_named(files, tmp_path, data):
    folder = fresh(tmp_path)
    path = copy_to(folder, files / "st" / "model.safetensors")
    config = copy_to(folder, files / "st" / "config.json")
    original = path.read_bytes()
    path.write_bytes(data.draw(byte_mutation(len(original)))(original))
    config_before = digest(config)
    model = outcome(lambda: keras_vit.from_pretrained(str(path)), path)
    assert digest(config) == config_before
    if model is not None:
        official = torch_layouts.to_official(load_file(path), "timm",
                                             keras_vit.vit_config(model)["num_heads"])
        for key, value in weights.model_params(model).items():
            np.testing.assert_array_equal(value, np.asarray(official[key], np.float32))


@FUZZ_BUILDS
@given(data=st.data())
def test_mutated_timm_config_json_is_read_or_named(files, tmp_path, data):
    folder = fresh(tmp_path)
    path = copy_to(folder, files / "st" / "model.safetensors")
    config = copy_to(folder, files / "st" / "config.json")
    config.write_bytes(data.draw(json_mutation(json.loads(config.read_text()))))
    before = digest(path)
    model = _from_pretrained_or_named(path, config)
    assert digest(path) == before
    if model is not None:
        assert keras_vit.vit_config(model)["hidden_size"] == TINY["hidden_size"]


@FUZZ_BUILDS
@given(data=st.data())
def test_mutated_keras_vit_config_json_beside_an_npz_is_read_or_named(files, tmp_path, data):
    folder = fresh(tmp_path)
    path = copy_to(folder, files / "run" / "final.npz")
    config = copy_to(folder, files / "run" / "config.json")
    config.write_bytes(data.draw(json_mutation(json.loads(config.read_text()))))
    before = digest(path)
    model = _from_pretrained_or_named(path, config)
    assert digest(path) == before
    if model is not None:
        expected = independent_npz(path)
        for key, value in weights.model_params(model).items():
            if key in expected:
                np.testing.assert_array_equal(value, expected[key])


def _from_pretrained_or_named(path, config):
    """from_pretrained's model, or None where it raised a named error naming the config or
    the weights it contradicts."""
    before = digest(config)
    try:
        return keras_vit.from_pretrained(str(path))
    except NAMED_ERRORS as e:
        message = str(e)
        assert config.name in message or path.name in message, message
        return None
    finally:
        assert digest(config) == before


# ---------------------------------------------------------------------------------------------
# The state of a run.


def mutated_run(files, tmp_path, data, name):
    """A copy of the run whose file `name` is mutated; returns (run folder, that file)."""
    run = fresh(tmp_path) / "run"
    shutil.copytree(files / "run", run)
    path = run / name
    path.write_bytes(data.draw(json_mutation(json.loads(path.read_text()))))
    return run, path


@FUZZ
@given(data=st.data())
def test_mutated_run_json_is_read_or_named(files, tmp_path, data):
    run, path = mutated_run(files, tmp_path, data, "run.json")
    record = outcome(lambda: loop._read_run(str(path)), path)
    if record is not None:
        assert isinstance(record["finished"], bool)
        epochs = record["settings"]["epochs"]
        assert isinstance(epochs, int) and epochs >= 1


@FUZZ
@given(data=st.data())
def test_mutated_best_json_is_read_or_named(files, tmp_path, data):
    run, path = mutated_run(files, tmp_path, data, "best.json")
    record = outcome(lambda: callbacks.best_record(run / "best.npz"), path)
    if record is not None:
        assert record["sha256"] == digest(run / "best.npz")
        assert isinstance(record["epoch"], int) and record["epoch"] >= 0
        assert math.isfinite(record["value"]) and isinstance(record["monitor"], str)


@FUZZ
@given(data=st.data())
def test_mutated_latest_json_is_read_or_named(files, tmp_path, data):
    run, path = mutated_run(files, tmp_path, data, "backup/latest.json")
    epoch = outcome(lambda: training.resume_epoch(run / "backup", epochs=1), path)
    if epoch is not None:
        assert epoch in (0, 1)


# ---------------------------------------------------------------------------------------------
# A SavedModel's metadata.


@FUZZ
@given(data=st.data())
def test_mutated_saved_model_metadata_is_read_or_named(files, tmp_path, data):
    version = fresh(tmp_path) / "1"
    shutil.copytree(files / "export" / "1", version)
    path = version / export.METADATA_FILE
    original = json.loads(path.read_text())
    path.write_bytes(data.draw(json_mutation(original)))
    metadata = outcome(lambda: export.read_metadata(version), path)
    if metadata is not None:
        assert metadata == json.loads(path.read_bytes())
