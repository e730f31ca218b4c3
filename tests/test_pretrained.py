"""Pretrained weights: layouts, resizing, heads, the registry and cache, and every bad input."""

import hashlib
import os
import re
import threading

import keras
import numpy as np
import pytest
import reference
import scipy.ndimage
from safetensors.numpy import load_file, save_file

import keras_vit
import keras_vit_cli as cli
from keras_vit import weights
from keras_vit.weights import writers

TINY = dict(hidden_size=32, num_layers=2, num_heads=4, mlp_dim=48)


def params_for(
    rng,
    image_size=32,
    patch_size=8,
    num_classes=10,
    classifier="token",
    representation=None,
    **overrides,
):
    cfg = dict(TINY, **overrides)
    h, w = (image_size, image_size) if isinstance(image_size, int) else image_size
    return reference.official_params(
        rng,
        hidden=cfg["hidden_size"],
        mlp=cfg["mlp_dim"],
        heads=cfg["num_heads"],
        layers=cfg["num_layers"],
        patch=patch_size,
        grid=(h // patch_size, w // patch_size),
        num_classes=num_classes,
        classifier=classifier,
        representation=representation,
    )


def build(image_size=32, num_classes=10, **kwargs):
    return keras_vit.ViT(
        image_size=image_size, patch_size=8, num_classes=num_classes, **dict(TINY, **kwargs)
    )


def weights_of(model):
    return [keras.ops.convert_to_numpy(w).copy() for w in model.weights]


def logits(model, images):
    return keras.ops.convert_to_numpy(model(images))


@pytest.fixture
def images():
    return np.random.default_rng(99).uniform(-1, 1, (2, 32, 32, 3)).astype(np.float32)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    home = tmp_path / "cache"
    monkeypatch.setenv("KERAS_VIT_HOME", str(home))
    monkeypatch.setattr(weights.registry, "_REGISTERED", {})
    return home


# ------------------------------------------------------------------------------------------
# Layouts, compared with the independent NumPy forward.


def big_vision_layout(params):
    """The same network as big_vision stores it: no position embedding on the class token."""
    out = {}
    for key, value in params.items():
        key = key.replace("MultiHeadDotProductAttention_1", "MultiHeadDotProductAttention_0")
        key = key.replace("LayerNorm_2", "LayerNorm_1").replace("MlpBlock_3", "MlpBlock_0")
        if key == weights.layouts.POSEMB_KEY:
            key, value = "pos_embedding", value[:, 1:]
        out["params/" + key] = value
    return out


def scanned_layout(params):
    out, blocks = {}, {}
    for key, value in params.items():
        parts = key.split("/")
        if key.startswith("Transformer/encoderblock_"):
            blocks.setdefault("/".join(["Transformer", "encoderblock", *parts[2:]]), []).append(
                value
            )
        else:
            out[key] = value
    out.update({k: np.stack(v) for k, v in blocks.items()})
    return out


@pytest.mark.parametrize("layout", ["official", "opt_target", "big_vision", "scanned"])
def test_each_layout_loads_to_the_reference_logits(tmp_path, images, layout):
    rng = np.random.default_rng(0)
    params = params_for(rng)
    if layout == "big_vision":
        params[weights.layouts.POSEMB_KEY][:, 0] = 0  # big_vision's class token has no position
        stored = big_vision_layout(params)
    elif layout == "opt_target":
        stored = {"opt/target/" + k: v for k, v in params.items()}
    elif layout == "scanned":
        stored = scanned_layout(params)
    else:
        stored = params
    path = tmp_path / "ckpt.npz"
    np.savez(path, **stored)
    model = build()
    report = keras_vit.load_pretrained(model, str(path))
    assert report["skipped"] == [] and report["fresh"] == []
    expected, _, _ = reference.forward(params, images)
    np.testing.assert_allclose(logits(model, images), expected, atol=1e-5)


def test_save_npz_writes_the_official_layout_back(tmp_path, images):
    rng = np.random.default_rng(1)
    params = params_for(rng, representation=16)
    model = build(representation_size=16)
    weights.load_params(model, params)
    weights.save_npz(model, tmp_path / "out.npz")
    written = dict(np.load(tmp_path / "out.npz"))
    umask = os.umask(0)
    os.umask(umask)
    assert os.stat(tmp_path / "out.npz").st_mode & 0o777 == 0o666 & ~umask
    assert sorted(written) == sorted(params)
    for key in params:
        np.testing.assert_array_equal(written[key], params[key])


def test_config_is_read_off_the_file():
    rng = np.random.default_rng(2)
    params = params_for(rng, image_size=(32, 32), num_classes=7, representation=16, num_heads=2)
    assert weights.config_from_params(params) == dict(
        image_size=32,
        patch_size=(8, 8),
        hidden_size=32,
        num_layers=2,
        num_heads=2,
        mlp_dim=48,
        num_classes=7,
        include_top=True,
        classifier="token",
        representation_size=16,
    )


# ------------------------------------------------------------------------------------------
# Position embeddings at another resolution.


def official_interpolation(posemb, rows, cols):
    """vit_jax checkpoint.py: resize the square patch grid with scipy.ndimage.zoom(order=1)."""
    token, grid = posemb[:, :1], posemb[0, 1:]
    old = int(np.sqrt(len(grid)))
    grid = grid.reshape(old, old, -1)
    grid = scipy.ndimage.zoom(grid, (rows / old, cols / old, 1), order=1)
    return np.concatenate([token, grid.reshape(1, rows * cols, -1)], axis=1)


@pytest.mark.parametrize("grid", [(24, 24), (16, 24), (8, 12)])
def test_position_embedding_resize_matches_scipy_zoom(grid):
    rng = np.random.default_rng(3)
    params = params_for(rng, image_size=128, patch_size=8, num_layers=1)  # 16x16 grid
    model = keras_vit.ViT(
        image_size=(grid[0] * 8, grid[1] * 8),
        patch_size=8,
        num_classes=10,
        **dict(TINY, num_layers=1),
    )
    weights.load_params(model, params)
    got = keras.ops.convert_to_numpy(model.get_layer("posembed_input").pos_embedding)
    expected = official_interpolation(params[weights.layouts.POSEMB_KEY], *grid)
    assert got.shape == expected.shape == (1, grid[0] * grid[1] + 1, 32)
    np.testing.assert_allclose(got, expected, atol=1e-6)
    np.testing.assert_array_equal(got[:, 0], params[weights.layouts.POSEMB_KEY][:, 0])


def test_gap_model_resizes_the_whole_grid():
    rng = np.random.default_rng(4)
    params = params_for(rng, image_size=32, classifier="gap", num_layers=1)  # 4x4, no cls
    model = keras_vit.ViT(
        image_size=48, patch_size=8, classifier="gap", num_classes=10, **dict(TINY, num_layers=1)
    )
    weights.load_params(model, params)
    got = keras.ops.convert_to_numpy(model.get_layer("posembed_input").pos_embedding)
    grid = params[weights.layouts.POSEMB_KEY][0].reshape(4, 4, -1)
    expected = scipy.ndimage.zoom(grid, (1.5, 1.5, 1), order=1).reshape(1, 36, -1)
    np.testing.assert_allclose(got, expected, atol=1e-6)


# ------------------------------------------------------------------------------------------
# Heads.


def test_same_number_of_classes_loads_the_head(images):
    rng = np.random.default_rng(5)
    params = params_for(rng, num_classes=10)
    model = build(num_classes=10)
    weights.load_params(model, params)
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(model.get_layer("head").kernel), params["head/kernel"]
    )


def test_other_number_of_classes_gets_a_fresh_zero_head(images):
    rng = np.random.default_rng(6)
    params = params_for(rng, num_classes=21)
    model = build(num_classes=10)
    model.get_layer("head").kernel.assign(np.ones((32, 10)))  # a used head is reset
    report = weights.load_params(model, params)
    assert report == {"skipped": ["head/bias", "head/kernel"], "fresh": ["head"]}
    assert not np.any(keras.ops.convert_to_numpy(model.get_layer("head").kernel))
    # ... and the backbone is loaded: features equal the reference representation.
    features = keras.Model(model.input, model.get_layer("pool").output)
    _, tokens, _ = reference.forward(params, images)
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(features(images)), tokens[:, 0], atol=1e-5
    )


def test_no_head_and_pre_logits_rules(images):
    rng = np.random.default_rng(7)
    params = params_for(rng, num_classes=10, representation=16)
    # include_top=False without a representation: both head and pre_logits are skipped.
    model = build(include_top=False)
    report = weights.load_params(model, params)
    assert sorted(report["skipped"]) == [
        "head/bias",
        "head/kernel",
        "pre_logits/bias",
        "pre_logits/kernel",
    ]
    # A representation layer of the same size loads pre_logits.
    model = build(include_top=False, representation_size=16)
    weights.load_params(model, params)
    expected, _, _ = reference.forward(params, images, include_top=False)
    np.testing.assert_allclose(logits(model, images), expected, atol=1e-5)
    # A head without its pre_logits would see other features: it stays fresh.
    model = build(num_classes=10)
    report = weights.load_params(model, params)
    assert report["fresh"] == ["head"]
    # Another representation size: pre_logits and head stay fresh.
    model = build(num_classes=10, representation_size=8)
    report = weights.load_params(model, params)
    assert report["fresh"] == ["pre_logits", "head"]


# ------------------------------------------------------------------------------------------
# Bad files: one clear error, the model untouched.


def _error_case(name, rng):
    params = params_for(rng)
    if name == "missing key":
        del params["Transformer/encoderblock_1/LayerNorm_2/scale"]
        return params, r"missing keys \(1\): Transformer/encoderblock_1/LayerNorm_2/scale"
    if name == "extra key":
        params["Transformer/encoderblock_2/LayerNorm_0/scale"] = np.ones(32, np.float32)
        return params, r"unexpected keys \(1\): Transformer/encoderblock_2/LayerNorm_0/scale"
    if name == "wrong shape":
        params["Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel"] = np.ones(
            (32, 50), np.float32
        )
        return params, (
            r"shape mismatch: Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel: "
            r"file \(32, 50\), model \(32, 48\)"
        )
    if name == "wrong variant":
        other = params_for(rng, hidden_size=64, num_layers=3, mlp_dim=96)
        return other, (
            r"checkpoint \S*bad.npz \(patch 8x8, width 64, 3 blocks\) does not fit model 'vit' "
            r"\(patch 8x8, width 32, 2 blocks\)(.|\n)*unexpected keys \(16\)(.|\n)*"
            r"shape mismatch: embedding/kernel: file \(8, 8, 3, 64\), model \(8, 8, 3, 32\)"
        )
    raise AssertionError(name)


@pytest.mark.parametrize("case", ["missing key", "extra key", "wrong shape", "wrong variant"])
def test_mismatched_checkpoints_raise_and_leave_the_model_untouched(tmp_path, case):
    rng = np.random.default_rng(8)
    params, message = _error_case(case, rng)
    np.savez(tmp_path / "bad.npz", **params)
    model = build()
    before = weights_of(model)
    with pytest.raises(keras_vit.CheckpointError, match=message):
        keras_vit.load_pretrained(model, str(tmp_path / "bad.npz"))
    for a, b in zip(before, weights_of(model)):
        np.testing.assert_array_equal(a, b)


def test_pickled_objects_are_refused(tmp_path):
    params = params_for(np.random.default_rng(9))
    params["evil"] = np.array([{"a": 1}], dtype=object)
    np.savez(tmp_path / "pickled.npz", **params)
    with pytest.raises(keras_vit.CheckpointError, match="pickled Python objects"):
        keras_vit.load_pretrained(build(), str(tmp_path / "pickled.npz"))


def test_a_non_npz_file_is_refused(tmp_path):
    (tmp_path / "weights.npz").write_text("<html>404 Not Found</html>")
    with pytest.raises(keras_vit.CheckpointError, match="not an .npz checkpoint"):
        keras_vit.load_pretrained(build(), str(tmp_path / "weights.npz"))


def test_unknown_registry_name_and_missing_path():
    with pytest.raises(
        ValueError, match=r"Unknown checkpoint 'imagenet21k/ViT-B_17'. Did you mean"
    ):
        keras_vit.load_pretrained(build(), "imagenet21k/ViT-B_17")
    with pytest.raises(FileNotFoundError, match="No checkpoint file at /nonexistent/x.npz"):
        keras_vit.load_pretrained(build(), "/nonexistent/x.npz")
    with pytest.raises(ValueError, match=r"pretrained=3 is not understood"):
        keras_vit.load_pretrained(build(), 3)


def test_builder_refuses_a_checkpoint_of_another_variant():
    with pytest.raises(ValueError, match=r"is a ViT-L/16 checkpoint; ViT_B16 builds ViT-B/16"):
        keras_vit.ViT_B16(pretrained="imagenet21k+imagenet2012/ViT-L_16")


# ------------------------------------------------------------------------------------------
# The registry path end to end, over file:// URLs.


def write_checkpoint(path, rng, **kwargs):
    params = params_for(rng, **kwargs)
    np.savez(path, **params)
    return params


def test_registry_download_cache_reuse_and_corruption(tmp_path, cache, images, monkeypatch):
    rng = np.random.default_rng(10)
    source = tmp_path / "served" / "tiny.npz"
    source.parent.mkdir()
    params = write_checkpoint(source, rng)
    keras_vit.register_checkpoint("test/tiny", source.as_uri(), "B/16")
    expected, _, _ = reference.forward(params, images)

    calls = []
    real_download = weights.download.download
    monkeypatch.setattr(
        weights.download, "download", lambda *a, **k: calls.append(a) or real_download(*a, **k)
    )
    model = build()
    keras_vit.load_pretrained(model, "test/tiny", progress=False)
    cached = cache / "test" / "tiny.npz"
    assert cached.read_bytes() == source.read_bytes() and len(calls) == 1
    np.testing.assert_allclose(logits(model, images), expected, atol=1e-5)

    keras_vit.load_pretrained(build(), "test/tiny", progress=False)
    assert len(calls) == 1  # reused, not fetched again

    for damage in ("truncate", "flip"):
        data = bytearray(source.read_bytes())
        if damage == "truncate":
            data = data[: len(data) // 2]
        else:
            data[len(data) // 2] ^= 0xFF  # inside an array: the member's CRC fails
        cached.write_bytes(bytes(data))
        model = build()
        keras_vit.load_pretrained(model, "test/tiny", progress=False)
        assert cached.read_bytes() == source.read_bytes()
        np.testing.assert_allclose(logits(model, images), expected, atol=1e-5)
    assert len(calls) == 3
    assert not [p for p in cached.parent.iterdir() if p.name.endswith(".part")]


def test_a_registered_checkpoint_that_does_not_fit_is_refused_without_fetching_it_again(
        tmp_path, cache, capsys):
    source = tmp_path / "tiny.npz"
    write_checkpoint(source, np.random.default_rng(12))
    keras_vit.register_checkpoint("test/unfit", source.as_uri(), "B/16",
                                  sha256=hashlib.sha256(source.read_bytes()).hexdigest())
    keras_vit.load_pretrained(build(), "test/unfit", progress=False)  # fetched, cached
    cached = cache / "test" / "unfit.npz"
    before = os.stat(cached)
    with pytest.raises(weights.CheckpointError, match="does not fit"):
        keras_vit.load_pretrained(build(mlp_dim=64), "test/unfit", progress=False)
    after = os.stat(cached)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert "damaged" not in capsys.readouterr().err  # a sound file, kept


def resident_bytes(field):
    """This process's VmRSS (resident now) or VmHWM (its peak) from /proc/self/status."""
    with open("/proc/self/status") as f:
        return int(re.search(rf"{field}:\s+(\d+) kB", f.read())[1]) * 1024


# The two file formats a model loads from its file one array at a time: the official layout's
# .npz, and timm's .safetensors (its arrays rewritten to the official layout as they are read).
SAVERS = {"npz": weights.save_npz, "safetensors": writers.save_safetensors}


def with_nonfinite_values(path, target):
    """A copy of the checkpoint `path` at `target` with NaN and infinity in its last block's
    last kernel."""
    if path.endswith(".npz"):
        params = weights.read_npz(path)
        params["Transformer/encoderblock_11/MlpBlock_3/Dense_1/kernel"][0, :2] = np.nan, np.inf
        np.savez(target, **params)
    else:
        params = load_file(path)
        params["blocks.11.mlp.fc2.weight"][:2, 0] = np.nan, np.inf
        save_file(params, target)
    return target


def twelve_blocks(tmp_path, form, hidden_size, num_heads):
    """(config, model, its checkpoint in `form`) of a 12-block ViT of `hidden_size`."""
    config = dict(image_size=32, patch_size=8, hidden_size=hidden_size, num_layers=12,
                  num_heads=num_heads, mlp_dim=4 * hidden_size, num_classes=10)
    source = keras_vit.ViT(**config)
    return config, source, SAVERS[form](source, tmp_path / f"twelve.{form}")


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"),
                    reason="needs Linux's /proc/self/clear_refs to reset the peak memory")
@pytest.mark.parametrize("form", SAVERS)
def test_a_checkpoint_loads_one_array_at_a_time_all_or_nothing(tmp_path, form):
    # An 85 MB file of 12 blocks: loading it holds its arrays one at a time beside the model,
    # as timm's `load_pretrained` reads an .npz, not all of them; the weights are the file's.
    config, source, path = twelve_blocks(tmp_path, form, hidden_size=384, num_heads=6)
    model = keras_vit.ViT(**config)
    before = resident_bytes("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak (VmHWM) starts again from the resident size
    keras_vit.load_pretrained(model, path, progress=False)
    assert resident_bytes("VmHWM") - before < os.path.getsize(path) / 4
    for got, want in zip(weights_of(model), weights_of(source)):
        np.testing.assert_array_equal(got, want)
    # A non-finite value in the last block is found before any variable changes.
    nan = with_nonfinite_values(path, tmp_path / f"nan.{form}")
    before = weights_of(fresh := keras_vit.ViT(**config))
    with pytest.raises(weights.CheckpointError, match="2 non-finite values"):
        keras_vit.load_pretrained(fresh, nan, progress=False)
    for got, want in zip(weights_of(fresh), before):
        np.testing.assert_array_equal(got, want)


def bytes_read():
    """The bytes this process has read through read(2) and pread(2) so far (rchar of
    /proc/self/io)."""
    with open("/proc/self/io") as f:
        return int(re.search(r"rchar:\s+(\d+)", f.read())[1])


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="needs Linux's /proc/self/io")
@pytest.mark.parametrize("form", SAVERS)
def test_a_new_model_reads_its_file_once_and_refuses_non_finite_values(tmp_path, form):
    # The model from_pretrained makes is no one's until it returns: its file is read once, as
    # it is loaded (its zip CRCs, its values checked then), not verified in a pass before.
    _, source, path = twelve_blocks(tmp_path, form, hidden_size=256, num_heads=4)
    size = os.path.getsize(path)
    before = bytes_read()
    model = keras_vit.from_pretrained(path, progress=False)
    assert size <= bytes_read() - before < 1.5 * size
    for got, want in zip(weights_of(model), weights_of(source)):
        np.testing.assert_array_equal(got, want)
    # Values are refused as they are read: every bad array listed, and no model returned.
    os.rename(path, tmp_path / f"original.{form}")  # the folder's config.json is the copy's
    nan = with_nonfinite_values(str(tmp_path / f"original.{form}"), tmp_path / f"nan.{form}")
    with pytest.raises(weights.CheckpointError, match=r"does not fit(.|\n)*2 non-finite values"):
        keras_vit.from_pretrained(nan, progress=False)


def test_a_damaged_download_without_a_digest_is_fetched_again_for_a_new_model(
        tmp_path, cache, capsys):
    # Only reading finds the damage of a file no digest covers: its arrays are verified in
    # the cache's read, so that a damaged copy is fetched again, not refused for good.
    served = tmp_path / "served.npz"
    source = build()
    weights.save_npz(source, served)
    keras_vit.from_pretrained(served.as_uri(), progress=False)  # fetched, cached
    cached = weights.download.url_cache_path(served.as_uri())
    data = bytearray(open(cached, "rb").read())
    at = data.index(b"\x93NUMPY") + 200  # inside the first member's data
    data[at] ^= 0xFF
    with open(cached, "r+b") as f:
        f.write(data)  # in place: the cache is newer than its source
    model = keras_vit.from_pretrained(served.as_uri(), progress=False)
    assert "is damaged" in capsys.readouterr().err
    for got, want in zip(weights_of(model), weights_of(source)):
        np.testing.assert_array_equal(got, want)


def test_a_position_embedding_that_cannot_be_resized_leaves_the_model_untouched(tmp_path):
    # Six patch positions make no square grid: the resize fails before any variable changes.
    params = weights.model_params(build())
    key = "Transformer/posembed_input/pos_embedding"
    params[key] = params[key][:, :7]
    np.savez(tmp_path / "six.npz", **params)
    model = build()
    before = weights_of(model)
    with pytest.raises(weights.CheckpointError, match="6 patch positions"):
        keras_vit.load_pretrained(model, tmp_path / "six.npz", progress=False)
    for got, want in zip(weights_of(model), before):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("form", SAVERS)
@pytest.mark.parametrize("change", ["cut short", "rewritten", "replaced"])
def test_a_file_changed_in_place_after_its_verification_says_the_model_is_part_loaded(
        tmp_path, form, change):
    source = build()
    path = SAVERS[form](source, tmp_path / f"cut.{form}")
    os.utime(path, (0, 0))  # written long before it is read, as a download in a cache is
    params, _ = weights.fetch_params(path, progress=False, check=lambda *args: None)
    other = build()
    other.set_weights([w + 1 for w in other.get_weights()])
    if change == "cut short":
        os.truncate(path, os.path.getsize(path) // 2)  # in place, under the verified file
    elif change == "rewritten":  # in place: the same size, other weights
        (tmp_path / "other").mkdir()
        data = open(SAVERS[form](other, tmp_path / "other" / f"cut.{form}"), "rb").read()
        assert len(data) == os.path.getsize(path)
        with open(path, "r+b") as f:
            f.write(data)
    else:  # another file renamed over the path: the verified one is still read, as it was
        SAVERS[form](other, path, overwrite=True)
        model = build()
        weights.load_params(model, params)
        for got, want in zip(weights_of(model), weights_of(source)):
            np.testing.assert_array_equal(got, want)
        return
    model = build()
    with pytest.raises(weights.CheckpointError, match=r"The model is part-loaded \(\d+ of ") \
            as raised:
        weights.load_params(model, params)
    assert str(raised.value).count(str(path)) == 1  # said once, not wrapped again


def test_sha256_is_checked_on_download_and_on_cache_hits(tmp_path, cache):
    rng = np.random.default_rng(11)
    source = tmp_path / "tiny.npz"
    write_checkpoint(source, rng)
    good = hashlib.sha256(source.read_bytes()).hexdigest()
    keras_vit.register_checkpoint("test/wrong-hash", source.as_uri(), "B/16", sha256="0" * 64)
    with pytest.raises(weights.DownloadError, match="has SHA-256 .* expected 0000"):
        keras_vit.load_pretrained(build(), "test/wrong-hash", progress=False)
    assert not (cache / "test" / "wrong-hash.npz").exists()  # nothing half-good kept

    keras_vit.register_checkpoint("test/hashed", source.as_uri(), "B/16", sha256=good)
    keras_vit.load_pretrained(build(), "test/hashed", progress=False)
    cached = cache / "test" / "hashed.npz"
    # A valid npz that is not the registered file is replaced by the registered one.
    other = tmp_path / "other.npz"
    write_checkpoint(other, np.random.default_rng(12))
    cached.write_bytes(other.read_bytes())
    keras_vit.load_pretrained(build(), "test/hashed", progress=False)
    assert hashlib.sha256(cached.read_bytes()).hexdigest() == good


def test_concurrent_fetches_download_once(tmp_path, cache, monkeypatch):
    rng = np.random.default_rng(13)
    source = tmp_path / "tiny.npz"
    write_checkpoint(source, rng)
    keras_vit.register_checkpoint("test/shared", source.as_uri(), "B/16")
    calls = []
    real_download = weights.download.download
    monkeypatch.setattr(
        weights.download, "download", lambda *a, **k: calls.append(a) or real_download(*a, **k)
    )
    results, errors = [], []

    def fetch():
        try:
            results.append(weights.fetch_params("test/shared", progress=False)[0])
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=fetch) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == 4 and len(calls) == 1


def test_url_sources_are_cached_by_url(tmp_path, cache, images):
    rng = np.random.default_rng(14)
    source = tmp_path / "ViT-X.npz"
    params = write_checkpoint(source, rng)
    model = build()
    keras_vit.load_pretrained(model, source.as_uri(), progress=False)
    assert len(list((cache / "urls").glob("*-ViT-X.npz"))) == 1
    expected, _, _ = reference.forward(params, images)
    np.testing.assert_allclose(logits(model, images), expected, atol=1e-5)


def test_offline_error_names_the_url_and_where_to_put_the_file(cache):
    url = "http://127.0.0.1:9/vit_models/imagenet21k/ViT-B_99.npz"  # nothing listens on port 9
    keras_vit.register_checkpoint("test/offline", url, "B/16")
    expected_path = os.path.join(str(cache), "test", "offline.npz")
    with pytest.raises(weights.DownloadError) as info:
        keras_vit.load_pretrained(build(), "test/offline", progress=False)
    assert url in str(info.value) and f"put it at {expected_path}" in str(info.value)


def test_pretrained_true_loads_the_default_checkpoint_from_the_cache(cache, images):
    """A Ti/16 file placed where the offline error says is what `pretrained=True` loads."""
    name = keras_vit.default_checkpoint("Ti/16", 224, 1000, True)
    assert name.startswith("augreg/Ti_16-i21k") and name.endswith("res_224")
    rng = np.random.default_rng(15)
    params = reference.official_params(
        rng, hidden=192, mlp=768, heads=3, layers=12, patch=16, grid=(14, 14), num_classes=1000
    )
    path = weights.download.cache_path(name)
    os.makedirs(os.path.dirname(path))
    np.savez(path, **params)
    model = keras_vit.ViT_Ti16(pretrained=True)
    x = np.random.default_rng(16).uniform(-1, 1, (1, 224, 224, 3)).astype(np.float32)
    expected, _, _ = reference.forward(params, x)
    np.testing.assert_allclose(logits(model, x), expected, atol=1e-4)


def test_default_checkpoint_choices():
    b16 = "augreg/B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0"
    assert (
        keras_vit.default_checkpoint("B/16", 384)
        == b16 + "--imagenet2012-steps_20k-lr_0.03-res_384"
    )
    assert keras_vit.default_checkpoint("B/16", 224).endswith("res_224")
    assert keras_vit.default_checkpoint("B/16", 224, num_classes=10) == b16
    assert keras_vit.default_checkpoint("B/16", 224, include_top=False) == b16
    assert keras_vit.default_checkpoint("H/14") == "imagenet21k/ViT-H_14"  # no 1k fine-tune
    assert keras_vit.default_checkpoint("L/32") == "imagenet21k+imagenet2012/ViT-L_32"


def test_registry_covers_the_official_folders():
    names = {c["name"] for c in keras_vit.list_checkpoints()}
    for v in ("B_16", "B_32", "B_8", "L_16", "L_32", "H_14"):
        assert f"imagenet21k/ViT-{v}" in names
    for v in ("B_16", "B_16-224", "B_32", "B_8", "L_16", "L_16-224", "L_32"):
        assert f"imagenet21k+imagenet2012/ViT-{v}" in names
    for variant in ("Ti/16", "S/16", "S/32", "B/16", "B/32", "L/16"):
        entries = keras_vit.list_checkpoints(variant)
        augreg = [e for e in entries if e["name"].startswith("augreg/")]
        assert sorted((e["finetuning"] or "", e["resolution"]) for e in augreg) == [
            ("", 224),
            ("imagenet2012", 224),
            ("imagenet2012", 384),
        ], variant
    for entry in keras_vit.list_checkpoints():
        if entry.get("file") or entry["url"].startswith("hf://timm/"):  # shipped, or timm's
            continue
        assert entry["url"].startswith("https://storage.googleapis.com/vit_models/")
        assert entry["url"].endswith(entry["name"].split("/", 1)[1] + ".npz")


# ------------------------------------------------------------------------------------------
# Class names and the commands.


def test_decode_predictions_uses_the_shipped_imagenet_names():
    assert len(keras_vit.class_names()) == 1000 and keras_vit.class_names()[0] == "tench"
    assert len(keras_vit.class_names("imagenet21k")) == 21843
    scores = np.zeros((2, 1000))
    scores[0, 207], scores[1, 1] = 5.0, 3.0
    top = keras_vit.decode_predictions(scores, top=3)
    assert top[0][0][:2] == ("n02099601", "golden retriever")
    assert top[1][0][:2] == ("n01443537", "goldfish")
    np.testing.assert_allclose(top[0][0][2], np.exp(5) / (np.exp(5) + 999))
    with pytest.raises(ValueError, match="No built-in class names for 7 classes"):
        keras_vit.decode_predictions(np.zeros((1, 7)))
    # -inf masks classes out: scored on the others (ImageNet-A's 200 of the 1,000).
    masked = np.full((1, 3), -np.inf)
    masked[0, [0, 2]] = [1.0, 0.0]
    top = keras_vit.decode_predictions(masked, top=5, class_names=["a", "b", "c"])[0]  # all 3
    assert [name for _, name, _ in top] == ["a", "c", "b"]
    np.testing.assert_allclose([p for _, _, p in top], [np.e / (np.e + 1), 1 / (np.e + 1), 0])


def test_convert_command_writes_a_keras_model_with_the_same_logits(tmp_path, images):
    rng = np.random.default_rng(17)
    params = write_checkpoint(tmp_path / "tiny.npz", rng, num_classes=5)
    out = tmp_path / "out" / "tiny.keras"
    assert cli.main(["convert", str(tmp_path / "tiny.npz"), str(out)]) == 0
    model = keras.saving.load_model(out)
    expected, _, _ = reference.forward(params, images)
    np.testing.assert_allclose(logits(model, images), expected, atol=1e-5)
    out_h5 = tmp_path / "tiny.weights.h5"
    assert cli.main(["convert", str(tmp_path / "tiny.npz"), str(out_h5)]) == 0
    again = build(num_classes=5)
    again.load_weights(out_h5)
    np.testing.assert_allclose(logits(again, images), expected, atol=1e-5)
    assert cli.main(["convert", str(tmp_path / "tiny.npz"), str(tmp_path / "x.h5")]) == 2


def test_predict_command_prints_the_top_classes(tmp_path, capsys):
    import tensorflow as tf

    rng = np.random.default_rng(18)
    params = write_checkpoint(tmp_path / "tiny.npz", rng, num_classes=1000)
    image = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
    png = tmp_path / "cat.png"
    png.write_bytes(tf.io.encode_png(image).numpy())
    assert cli.main(["predict", str(png), "--pretrained", str(tmp_path / "tiny.npz")]) == 0
    printed = capsys.readouterr().out.splitlines()
    expected, _, _ = reference.forward(params, image[None].astype(np.float32) / 127.5 - 1)
    best = int(np.argmax(expected[0]))
    assert printed[0] == str(png) and len(printed) == 6
    assert keras_vit.class_names()[best] in printed[1]
    (tmp_path / "broken.png").write_bytes(b"not an image")
    assert (
        cli.main(
            ["predict", str(tmp_path / "broken.png"), "--pretrained", str(tmp_path / "tiny.npz")]
        )
        == 2
    )
    assert "broken.png is not an image in a supported format" in capsys.readouterr().err


def test_the_shipped_demo_checkpoint_loads_offline_and_is_hash_checked(monkeypatch, tmp_path):
    entry = weights.get_checkpoint("digits")
    model = keras_vit.from_pretrained("digits")
    assert model.count_params() == 138_954 and tuple(model.input.shape[1:]) == (16, 16, 3)
    params = weights.fetch_params("digits")[0]
    for key, variable in weights.checkpoint_variables(model).items():
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(variable), params[key])
    same = keras_vit.ViT(**entry["config"])
    keras_vit.load_pretrained(same, "digits")
    x = np.random.default_rng(19).uniform(-1, 1, (2, 16, 16, 3)).astype(np.float32)
    np.testing.assert_array_equal(logits(model, x), logits(same, x))
    # A shipped file that does not match its registered hash is refused.
    monkeypatch.setitem(weights.registry._REGISTERED, "digits", dict(entry, sha256="1" * 64))
    with pytest.raises(keras_vit.CheckpointError, match="does not have its registered SHA-256"):
        keras_vit.from_pretrained("digits")


def test_files_get_the_umask_permissions_without_touching_the_umask(tmp_path):
    previous = os.umask(0o027)
    try:
        assert keras_vit.fileio.current_umask() == 0o027
        assert os.umask(0o027) == 0o027  # unchanged by reading it
        keras_vit.fileio.atomic_write(tmp_path / "f.bin", lambda f: f.write(b"x"))
        assert os.stat(tmp_path / "f.bin").st_mode & 0o777 == 0o640
    finally:
        os.umask(previous)
