"""Hostile files the package reads: sizes declared far beyond what a model needs, JSON nested too
deeply, malformed shapes and zip members, state files that contradict the run. Each is refused
with one named error (`CheckpointError`, `StateFileError`, a `ValueError` of the library) whose
message names the file and what was expected, from the headers alone where a size is at stake,
with the file unchanged."""

import hashlib
import io
import json
import pathlib
import shutil
import struct
import zipfile

import ml_dtypes
import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

import keras_vit
from keras_vit import tflite, training, weights
from keras_vit.weights import CheckpointError, hub, writers

from test_errors import TINY, fit_tiny

DEEP_JSON = "[" * 50000 + "]" * 50000
POSEMB = "Transformer/posembed_input/pos_embedding"


@pytest.fixture
def model():
    return keras_vit.ViT(**TINY)


def digest(path):
    return hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()


class InflationMeter:
    """Counts the bytes read out of zip members (inflated), whatever reads them."""

    def __init__(self, monkeypatch):
        self.bytes = 0
        for name in ("read", "readinto", "read1"):
            original = getattr(zipfile.ZipExtFile, name)
            monkeypatch.setattr(zipfile.ZipExtFile, name, self._counting(original))

    def _counting(self, original):
        def counted(f, *args):
            result = original(f, *args)
            self.bytes += result if isinstance(result, int) else len(result)
            return result
        return counted


def npz_with(path, params, **members):
    """`params` as an .npz, plus `members` (name -> (zip info kwargs, bytes)) written raw."""
    np.savez(path, **params)
    with zipfile.ZipFile(path, "a", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


def npy_bytes(array):
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


# ---------------------------------------------------------------------------------------------
# 6: sizes are checked against the model from the headers, before anything is inflated.


def test_a_huge_deflated_member_is_refused_before_it_is_inflated(model, tmp_path, monkeypatch):
    params = weights.model_params(model)
    big = np.zeros((1, 8193, 1024), np.float32)  # 32 MiB of zeros, deflated to ~32 KiB
    path = npz_with(tmp_path / "big.npz", {k: v for k, v in params.items() if k != POSEMB},
                    **{POSEMB + ".npy": npy_bytes(big)})
    assert path.stat().st_size < 1 << 20
    before = digest(path)
    meter = InflationMeter(monkeypatch)
    with pytest.raises(CheckpointError, match=r"shape mismatch: .*pos_embedding: file "
                                              r"\(1, 8193, 1024\), model \(1, 5, 8\)") as info:
        keras_vit.load_pretrained(model, str(path))
    assert str(path) in str(info.value)
    assert meter.bytes < 1 << 16  # the headers only
    assert digest(path) == before


def test_a_huge_misnamed_member_is_refused_before_a_model_is_read(model, tmp_path, monkeypatch):
    params = weights.model_params(model)
    path = npz_with(tmp_path / "extra.npz", params,
                    **{"Transformer/encoder_norm/scales.npy": npy_bytes(
                        np.zeros((8192, 1024), np.float32))})
    meter = InflationMeter(monkeypatch)
    with pytest.raises(CheckpointError, match=r"unexpected keys \(1\): Transformer/encoder_norm/"
                                              "scales"):
        keras_vit.from_pretrained(str(path))
    assert meter.bytes < 1 << 16


def test_a_member_declaring_more_than_deflate_can_hold_is_refused(model, tmp_path):
    path = npz_with(tmp_path / "liar.npz", weights.model_params(model))
    data = bytearray(path.read_bytes())
    # The last member's central-directory entry: its uncompressed size field (offset 24).
    entry = data.rindex(b"PK\x01\x02")
    struct.pack_into("<I", data, entry + 24, 0xFFFFFFF0)
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="more than its .* bytes can hold") as info:
        weights.read_npz(path)
    assert str(path) in str(info.value)


def save_tiny_safetensors(model, folder):
    path = folder / "model.safetensors"
    writers.save_safetensors(model, path)
    return path


def rewrite_safetensors(path, change):
    """Rewrites a .safetensors file's tensors: `change(dict of arrays)`, metadata kept."""
    with open(path, "rb") as f:
        length = struct.unpack("<Q", f.read(8))[0]
        metadata = json.loads(f.read(length)).get("__metadata__")
    params = dict(load_file(path))
    change(params)
    save_file(params, path, metadata=metadata)


def forbid_tensor_reads(monkeypatch):
    """Makes reading a tensor of a .safetensors file (not its header) fail the test."""
    class HeadersOnly:
        def __init__(self, *args, **kwargs):
            self._opened = safe_open(*args, **kwargs)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return self._opened.__exit__(*exc)

        def __getattr__(self, name):
            if name.startswith("get_tensor"):
                pytest.fail("the tensors were read before the header was checked")
            return getattr(self._opened, name)

    monkeypatch.setattr(hub, "safe_open", HeadersOnly)


def test_a_misnamed_safetensors_tensor_is_found_from_the_header(model, tmp_path, monkeypatch):
    path = save_tiny_safetensors(model, tmp_path)

    def misname(params):
        params["head.weights"] = params.pop("head.weight")

    rewrite_safetensors(path, misname)

    forbid_tensor_reads(monkeypatch)
    with pytest.raises(CheckpointError, match=r"head\.weights") as info:
        keras_vit.load_pretrained(model, str(path))
    assert str(path) in str(info.value)
    with pytest.raises(CheckpointError, match=r"head\.weights"):
        keras_vit.from_pretrained(str(path))


def test_a_safetensors_file_of_another_model_is_refused_before_it_is_read(model, tmp_path,
                                                                          monkeypatch):
    wide = keras_vit.ViT(**dict(TINY, hidden_size=16))
    path = save_tiny_safetensors(wide, tmp_path)
    forbid_tensor_reads(monkeypatch)
    with pytest.raises(CheckpointError, match="shape mismatch"):
        keras_vit.load_pretrained(model, str(path))


# ---------------------------------------------------------------------------------------------
# 9: JSON nested too deeply, in every JSON file the package reads.


def test_deeply_nested_config_json_beside_a_checkpoint_is_named(model, tmp_path):
    weights.save_npz(model, tmp_path / "w.npz")
    (tmp_path / "config.json").write_text(DEEP_JSON)
    with pytest.raises(CheckpointError, match="config.json .*JSON nested too deeply"):
        keras_vit.from_pretrained(str(tmp_path / "w.npz"))


def test_deeply_nested_config_json_beside_safetensors_is_named(model, tmp_path):
    path = save_tiny_safetensors(model, tmp_path)
    (tmp_path / "config.json").write_text(DEEP_JSON)
    with pytest.raises(CheckpointError, match="config.json .*JSON nested too deeply"):
        keras_vit.from_pretrained(str(path))


def test_deeply_nested_safetensors_metadata_is_named(model, tmp_path):
    path = tmp_path / "deep.safetensors"
    save_file({k: np.ascontiguousarray(v) for k, v in weights.model_params(model).items()},
              path, metadata={hub.METADATA_KEY: DEEP_JSON})
    with pytest.raises(CheckpointError, match=f"metadata of {path}.*JSON nested too deeply"):
        keras_vit.from_pretrained(str(path))


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A real finished 2-epoch run of the tiny model, to copy."""
    output = tmp_path_factory.mktemp("finished") / "run"
    fit_tiny(None, output, epochs=2)
    return output


def unfinished_copy(finished_run, tmp_path):
    """A copy of the finished run, made unfinished again (as if killed before its end)."""
    output = tmp_path / "run"
    shutil.copytree(finished_run, output)
    run = json.loads((output / "run.json").read_text())
    (output / "run.json").write_text(json.dumps(dict(run, finished=False)))
    return output


@pytest.mark.parametrize("name", ["run.json", "best.json", "latest.json"])
def test_deeply_nested_run_state_is_named(finished_run, tmp_path, name):
    output = unfinished_copy(finished_run, tmp_path)
    paths = {"run.json": output / "run.json", "best.json": output / "best.json",
             "latest.json": output / "backup" / "latest.json"}
    paths[name].parent.mkdir(exist_ok=True)
    (output / "best.npz").write_bytes((output / "final.npz").read_bytes())
    paths[name].write_text(DEEP_JSON)
    with pytest.raises(training.StateFileError, match=f"{name} .*JSON nested too deeply"):
        fit_tiny(None, output, epochs=2)
    assert paths[name].read_text() == DEEP_JSON


# ---------------------------------------------------------------------------------------------
# 10: malformed shapes, zip members and run records.


def test_a_flattened_safetensors_tensor_is_named(model, tmp_path):
    path = save_tiny_safetensors(model, tmp_path)

    def flatten(params):
        params["blocks.0.attn.qkv.weight"] = params["blocks.0.attn.qkv.weight"].reshape(-1)

    rewrite_safetensors(path, flatten)
    with pytest.raises(CheckpointError, match=r"'blocks\.0\.attn\.qkv\.weight' has shape "
                                              r"\(192,\)\. Expected 2 axes, \(24, 8\)") as info:
        keras_vit.from_pretrained(str(path))
    assert str(path) in str(info.value)


def flag_first_member(path, offset_in_header, value, fmt):
    """Sets a field of the first member's local header and of its central-directory entry."""
    data = bytearray(path.read_bytes())
    local, central = 0, data.index(b"PK\x01\x02")
    local_offsets = {"flags": 6, "method": 8}
    central_offsets = {"flags": 8, "method": 10}
    struct.pack_into(fmt, data, local + local_offsets[offset_in_header], value)
    struct.pack_into(fmt, data, central + central_offsets[offset_in_header], value)
    path.write_bytes(bytes(data))


def test_an_encrypted_npz_member_is_named(model, tmp_path):
    path = tmp_path / "enc.npz"
    weights.save_npz(model, path)
    flag_first_member(path, "flags", 0x1, "<H")
    with pytest.raises(CheckpointError, match="is encrypted") as info:
        keras_vit.load_pretrained(model, str(path))
    assert str(path) in str(info.value)


def test_an_unknown_zip_compression_method_is_named(model, tmp_path):
    path = tmp_path / "method.npz"
    weights.save_npz(model, path)
    flag_first_member(path, "method", 99, "<H")
    with pytest.raises(CheckpointError, match="compression method 99"):
        keras_vit.load_pretrained(model, str(path))


def test_a_run_record_without_its_settings_is_named(tmp_path):
    output = tmp_path / "run"
    output.mkdir()
    (output / "run.json").write_text('{"settings": {}, "finished": true}')
    with pytest.raises(training.StateFileError, match=r"run.json \(settings\): field 'epochs' "
                                                       "is missing, expected"):
        fit_tiny(None, output, epochs=1)
    assert (output / "run.json").read_text() == '{"settings": {}, "finished": true}'


def test_an_npy_header_with_an_unclosed_bracket_is_named(model, tmp_path):
    """NumPy retokenizes a header that is not a literal (as for Python 2 files): a TokenError."""
    header = b"{'descr': '<f4', 'fortran_order': False, 'shape': (8, 8, 3, 8(, }"
    header = header.ljust(len(header) + 63 - (len(header) + 10) % 64) + b"\n"
    member = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + bytes(4)
    path = npz_with(tmp_path / "header.npz", weights.model_params(model), **{"bad.npy": member})
    with pytest.raises(CheckpointError, match="member 'bad' is not a NumPy array") as info:
        keras_vit.load_pretrained(model, str(path))
    assert str(path) in str(info.value)


# ---------------------------------------------------------------------------------------------
# 13: messages that named the wrong thing.


def test_a_bfloat16_tensor_with_a_doubled_axis_is_named(model, tmp_path):
    path = save_tiny_safetensors(model, tmp_path)

    def double(params):
        params.update({k: v.astype(ml_dtypes.bfloat16) for k, v in params.items()})
        weight = params["blocks.0.mlp.fc1.weight"]
        params["blocks.0.mlp.fc1.weight"] = np.concatenate([weight, weight], axis=-1)

    rewrite_safetensors(path, double)
    with pytest.raises(CheckpointError, match=r"'blocks\.0\.mlp\.fc1\.weight' has shape "
                                              r"\(8, 16\)\. Expected 2 axes, \(8, 8\)"):
        keras_vit.from_pretrained(str(path))


def test_a_float8_safetensors_file_is_named_in_one_line(model, tmp_path):
    # Its header is read; safetensors' NumPy API has no float8 arrays to give.
    path = save_tiny_safetensors(model, tmp_path)
    rewrite_safetensors(path, lambda params: params.update(
        {k: v.astype(ml_dtypes.float8_e4m3fn) for k, v in params.items()}))
    before = weights.model_params(model)
    with pytest.raises(CheckpointError, match="holds arrays NumPy cannot represent"):
        keras_vit.load_pretrained(model, str(path))
    assert all(np.array_equal(v, before[k]) for k, v in weights.model_params(model).items())


def test_float64_values_beyond_the_models_float32_are_named(model, tmp_path):
    # They would be infinite in the model's float32 variables.
    path = save_tiny_safetensors(model, tmp_path)

    def widen(params):
        params.update({k: v.astype(np.float64) for k, v in params.items()})
        params["blocks.0.mlp.fc1.weight"][0, :3] = 1e300

    rewrite_safetensors(path, widen)
    with pytest.raises(CheckpointError, match=r"blocks\.0\.mlp\.fc1\.weight|MlpBlock_3/Dense_0"
                                              r"/kernel: 3 values beyond the range of the "
                                              r"model's float32"):
        keras_vit.load_pretrained(model, str(path))


def test_a_zip_directory_entry_that_runs_over_the_next_is_named(model, tmp_path):
    # One damaged length (a comment's, 0 -> 256) makes the next-to-last entry swallow the last,
    # which Python's zipfile then drops without a word: the head's bias would go missing.
    path = tmp_path / "swallowed.npz"
    weights.save_npz(model, path)
    data = bytearray(path.read_bytes())
    entry, entries = struct.unpack("<I", data[-6:-2])[0], []  # the directory's offset
    while data[entry:entry + 4] == b"PK\x01\x02":
        entries.append(entry)
        names, extra, comment = struct.unpack("<HHH", data[entry + 28:entry + 34])
        entry += 46 + names + extra + comment
    data[entries[-2] + 33] ^= 1  # the high byte of its comment's length
    path.write_bytes(bytes(data))
    before = weights.model_params(model)
    with pytest.raises(CheckpointError, match="runs over the entries after it"):
        keras_vit.load_pretrained(model, str(path))
    assert all(np.array_equal(v, before[k]) for k, v in weights.model_params(model).items())


def test_an_npz_with_a_permuted_kernel_is_named(model, tmp_path):
    params = weights.model_params(model)
    params["embedding/kernel"] = np.ascontiguousarray(params["embedding/kernel"].transpose(
        2, 0, 1, 3))
    path = tmp_path / "permuted.npz"
    np.savez(path, **params)
    with pytest.raises(CheckpointError, match=r"embedding/kernel has shape \(3, 8, 8, 8\)\. "
                                              "Expected .*3 RGB channels"):
        keras_vit.from_pretrained(str(path))


def test_a_backup_pointer_past_the_run_is_refused(finished_run, tmp_path):
    output = unfinished_copy(finished_run, tmp_path)
    folder = output / "backup" / "epoch-000007"
    folder.mkdir(parents=True)
    (folder / "state.npz").write_bytes(b"")
    pointer = output / "backup" / "latest.json"
    pointer.write_text(json.dumps({"epoch": 7, "dir": folder.name}))
    final = digest(output / "final.npz")
    with pytest.raises(training.StateFileError, match=r"latest.json records epoch 7 of a run of "
                                                       "2 epochs"):
        fit_tiny(None, output, epochs=2)
    assert json.loads(pointer.read_text())["epoch"] == 7
    assert digest(output / "final.npz") == final
    assert not json.loads((output / "run.json").read_text())["finished"]
    with pytest.raises(training.StateFileError, match="records epoch 7 of a run of 2 epochs"):
        training.resume_epoch(output / "backup", epochs=2)


def test_a_backup_pointer_with_a_huge_epoch_is_refused(tmp_path):
    pointer = tmp_path / "latest.json"
    pointer.write_text(json.dumps({"epoch": 10**30, "dir": f"epoch-{10**30:06d}"}))
    with pytest.raises(training.StateFileError, match=r"latest.json is unreadable \(epoch 1000"):
        training.resume_epoch(tmp_path)


def test_tflite_parity_against_a_model_of_other_classes_is_named(tmp_path):
    path = tflite.export_tflite(keras_vit.ViT(**TINY), tmp_path / "m.tflite")
    ten = keras_vit.ViT(**dict(TINY, num_classes=10))
    with pytest.raises(ValueError, match=r"m.tflite gives 3 probabilities per image, but model "
                                         ".* has 10 classes"):
        tflite.tflite_parity(path, ten, np.zeros((2, 16, 16, 3), np.float32))


# ---------------------------------------------------------------------------------------------
# 21: ambiguous members and class names that do not fit.


def test_an_npz_with_two_members_of_one_name_is_refused(model, tmp_path):
    params = weights.model_params(model)
    path = tmp_path / "twice.npz"
    np.savez(path, **params)
    with pytest.warns(UserWarning, match="Duplicate name"), \
            zipfile.ZipFile(path, "a") as archive:
        archive.writestr(POSEMB + ".npy", npy_bytes(np.ones((1, 5, 8), np.float32)))
    with pytest.raises(CheckpointError, match=f"two members named '{POSEMB}'") as info:
        keras_vit.load_pretrained(model, str(path))
    assert str(path) in str(info.value)


def test_class_names_that_do_not_fit_the_head_are_refused(tmp_path):
    ten = keras_vit.ViT(**dict(TINY, num_classes=10))
    weights.save_npz(ten, tmp_path / "w.npz")
    (tmp_path / "config.json").write_text(json.dumps(
        {"format": "keras_vit", "model": None, "class_names": ["a", "b", "c"]}))
    with pytest.raises(CheckpointError, match="config.json gives 3 class names for a head of 10 "
                                              "classes"):
        keras_vit.from_pretrained(str(tmp_path / "w.npz"))


def test_timm_label_names_that_do_not_fit_the_head_are_refused(tmp_path):
    ten = keras_vit.ViT(**dict(TINY, num_classes=10))
    (tmp_path / "timm").mkdir()
    path = save_tiny_safetensors(ten, tmp_path / "timm")
    config = json.loads((path.parent / "config.json").read_text())
    (path.parent / "config.json").write_text(json.dumps(dict(config, label_names=["a", "b"])))
    save_file(load_file(path), path)  # without keras_vit's metadata
    with pytest.raises(CheckpointError, match="config.json gives 2 class names for a head of 10"):
        keras_vit.from_pretrained(str(path))


@pytest.mark.parametrize("shape, crop_mode, expected", [
    ((1, 4000), "center", "An image of 1x4000 pixels resizes to 248x992000 before its crop "
                          "(the center resize of the data config). Expected 1 to 64,000,000 "
                          "pixels"),
    ((1, 500), "border", "resizes to 0x248 before its crop (the border resize of the data "
                         "config)"),
], ids=["a_strip_of_gigabytes", "nothing"])
def test_an_image_of_an_extreme_aspect_ratio_is_named_before_it_is_resized(tmp_path, shape,
                                                                           crop_mode, expected):
    from PIL import Image

    path = tmp_path / "thin.png"
    Image.fromarray(np.zeros((*shape, 3), np.uint8)).save(path)  # a few hundred bytes
    config = dict(keras_vit.resolve_data_config("vit_base_patch16_224.augreg_in21k"),  # 0.9 crop
                  crop_mode=crop_mode)
    with pytest.raises(ValueError) as raised:
        keras_vit.load_image(path, data_config=config)
    assert str(raised.value) == f"Cannot resize {path}: " + str(raised.value).split(": ", 1)[1]
    assert expected in str(raised.value) and "\n" not in str(raised.value)
