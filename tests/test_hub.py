"""Weights in timm's and transformers' layouts, from local safetensors files and `hf://`.

The fixtures (tests/fixtures/hub/) were written by timm and transformers themselves, with the
logits they compute (tests/fixtures/make_hub_fixtures.py); keras_vit must reproduce those
logits from the files alone, without torch. `hf://` is served from a Hugging Face cache laid
out as huggingface_hub lays it out, offline."""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import keras
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import keras_vit
import keras_vit_cli as cli
from keras_vit import weights
from keras_vit.weights import torch_layouts

FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures" / "hub"
HEADED = ["timm_vit", "timm_vit_gap", "timm_vit_fc_norm", "timm_vit_avg_cls",
          "timm_vit_avg_cls_fc_norm", "timm_vit_no_qkv_bias", "transformers_vit",
          "transformers_vit_tanh_gelu", "transformers_vit_no_qkv_bias"]
# The keras_vit.ViT options each fixture needs, read from its file and config.json.
OPTIONS = {
    "timm_vit": dict(classifier="token", class_token=True, fc_norm=False, qkv_bias=True),
    "timm_vit_gap": dict(classifier="gap", class_token=False, fc_norm=False),
    "timm_vit_fc_norm": dict(classifier="gap", class_token=False, fc_norm=True),
    "timm_vit_avg_cls": dict(classifier="gap", class_token=True, fc_norm=False),
    "timm_vit_avg_cls_fc_norm": dict(classifier="gap", class_token=True, fc_norm=True),
    "timm_vit_no_qkv_bias": dict(classifier="token", qkv_bias=False),
    "transformers_vit_no_qkv_bias": dict(classifier="token", qkv_bias=False),
}
HEADLESS = ["timm_vit_no_head", "transformers_vit_pooler"]


def expected(name):
    with np.load(FIXTURES / name / "expected.npz") as data:
        return data["images"], data["outputs"]


@pytest.mark.parametrize("name", HEADED + HEADLESS)
def test_keras_vit_reproduces_the_library_outputs_from_the_file_alone(name):
    images, outputs = expected(name)
    model = keras_vit.from_pretrained(FIXTURES / name / "model.safetensors",
                                      include_top=name in HEADED)
    np.testing.assert_allclose(model.predict(images, verbose=0), outputs, atol=1e-5)


def test_the_gelu_and_epsilon_of_each_library_are_read_from_the_config():
    timm = keras_vit.vit_config(keras_vit.from_pretrained(FIXTURES / "timm_vit" /
                                                          "model.safetensors"))
    hf = keras_vit.vit_config(keras_vit.from_pretrained(FIXTURES / "transformers_vit" /
                                                        "model.safetensors"))
    tanh = keras_vit.vit_config(keras_vit.from_pretrained(
        FIXTURES / "transformers_vit_tanh_gelu" / "model.safetensors"))
    assert (timm["gelu_approximate"], timm["layer_norm_epsilon"]) == (False, 1e-6)
    assert (hf["gelu_approximate"], hf["layer_norm_epsilon"]) == (False, 1e-12)
    assert tanh["gelu_approximate"] is True
    assert timm["classifier"] == "token" and keras_vit.vit_config(keras_vit.from_pretrained(
        FIXTURES / "timm_vit_gap" / "model.safetensors"))["classifier"] == "gap"


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_the_architecture_options_are_read_and_round_trip(tmp_path, name):
    model = keras_vit.from_pretrained(FIXTURES / name / "model.safetensors")
    config = keras_vit.vit_config(model)
    assert {k: config[k] for k in OPTIONS[name]} == OPTIONS[name]
    rebuilt = keras_vit.ViT(**config)  # get_config of every layer, and vit_config
    assert [v.path for v in rebuilt.weights] == [v.path for v in model.weights]
    model.save(tmp_path / "m.keras")
    images, outputs = expected(name)
    again = keras.saving.load_model(tmp_path / "m.keras")
    np.testing.assert_allclose(again.predict(images, verbose=0), outputs, atol=1e-5)
    if name.startswith("timm"):  # written back in timm's layout, exactly what timm saved
        written = torch_layouts.to_timm(weights.model_params(model))
        timm = load_file(FIXTURES / name / "model.safetensors")
        assert sorted(written) == sorted(timm)
        for key, value in timm.items():
            np.testing.assert_array_equal(written[key], value, err_msg=key)


def test_option_conflicts_are_refused():
    with pytest.raises(ValueError, match="class_token=False"):
        keras_vit.ViT(classifier="token", class_token=False)
    with pytest.raises(ValueError, match='classifier="gap"'):
        keras_vit.ViT(classifier="token", fc_norm=True)


def test_the_layout_is_detected_and_every_array_is_used():
    timm = load_file(FIXTURES / "timm_vit" / "model.safetensors")
    hf = load_file(FIXTURES / "transformers_vit" / "model.safetensors")
    assert torch_layouts.detect_layout(timm) == "timm"
    assert torch_layouts.detect_layout(hf) == "transformers"
    # Strict all-or-nothing loading: every official array has a model variable and back.
    for name, params in (("timm_vit", timm), ("transformers_vit", hf)):
        model = keras_vit.from_pretrained(FIXTURES / name / "model.safetensors")
        official = torch_layouts.to_official(params, num_heads=2)
        assert set(official) == set(weights.checkpoint_variables(model))


def test_writing_timm_layout_gives_timm_own_keys_and_shapes_and_round_trips():
    model = keras_vit.from_pretrained(FIXTURES / "timm_vit" / "model.safetensors")
    written = torch_layouts.to_timm(weights.model_params(model))
    timm = load_file(FIXTURES / "timm_vit" / "model.safetensors")
    assert {k: v.shape for k, v in written.items()} == {k: v.shape for k, v in timm.items()}
    for key, value in timm.items():  # what timm saved, bit for bit
        np.testing.assert_array_equal(written[key], value, err_msg=key)
    back = torch_layouts.from_timm(written, num_heads=2)
    for key, value in weights.model_params(model).items():
        np.testing.assert_array_equal(back[key], value, err_msg=key)


def test_convert_command_writes_timm_safetensors(tmp_path, capsys):
    out = tmp_path / "model.safetensors"
    assert cli.main(["convert", str(FIXTURES / "transformers_vit" / "model.safetensors"),
                     str(out)]) == 0
    images, outputs = expected("transformers_vit")
    assert torch_layouts.detect_layout(load_file(out)) == "timm"
    model = keras_vit.from_pretrained(out, gelu_approximate=False, layer_norm_epsilon=1e-12,
                                      num_heads=2)
    np.testing.assert_allclose(model.predict(images, verbose=0), outputs, atol=1e-5)


@pytest.mark.parametrize("key, feature", [
    ("dist_token", "a distillation token"),
    ("blocks.0.ls1.gamma", "layer scale"),
])
def test_a_feature_keras_vit_does_not_express_is_named(tmp_path, key, feature):
    params = dict(load_file(FIXTURES / "timm_vit" / "model.safetensors"))
    params[key] = np.zeros(32, np.float32)
    save_file(params, str(tmp_path / "model.safetensors"))
    shutil.copy(FIXTURES / "timm_vit" / "config.json", tmp_path / "config.json")
    with pytest.raises(keras_vit.CheckpointError, match=feature):
        keras_vit.from_pretrained(tmp_path / "model.safetensors")


def test_a_corrupt_safetensors_file_is_refused(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}")
    with pytest.raises(keras_vit.CheckpointError, match="not a readable .safetensors file"):
        keras_vit.from_pretrained(tmp_path / "model.safetensors")


def hub_cache(root, repo, fixture, commit="0123456789abcdef0123456789abcdef01234567"):
    """A Hugging Face cache holding `fixture` as `repo`, laid out as huggingface_hub does."""
    folder = root / "hub" / ("models--" + repo.replace("/", "--"))
    snapshot = folder / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(commit)
    for name in ("config.json", "model.safetensors"):
        shutil.copy(FIXTURES / fixture / name, snapshot / name)
    return root


def run_offline(hf_home, *argv):
    env = dict(os.environ, HF_HOME=str(hf_home), HF_HUB_OFFLINE="1", TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run([sys.executable, "-m", "keras_vit_cli", *argv], capture_output=True,
                          text=True, env=env, timeout=300)


def test_hf_sources_load_through_huggingface_hub_offline(tmp_path):
    home = hub_cache(tmp_path / "hf", "google/vit-tiny-test", "transformers_vit")
    images, outputs = expected("transformers_vit")
    png = tmp_path / "x.png"
    from PIL import Image

    Image.fromarray(((images[0] + 1) * 127.5).round().astype(np.uint8)).save(png)
    result = run_offline(home, "predict", str(png), "--weights", "hf://google/vit-tiny-test",
                         "--top-k", "5")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "class_" in result.stdout  # the names of the config's id2label
    missing = run_offline(home, "predict", str(png), "--weights", "hf://google/not-cached")
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert "Could not fetch hf://google/not-cached" in missing.stderr
    assert "HF_HUB_OFFLINE" in missing.stderr


def test_hf_source_names_are_checked():
    with pytest.raises(ValueError, match="is not a Hugging Face model"):
        keras_vit.from_pretrained("hf://not a repo")


def test_fixture_files_are_what_the_libraries_wrote():
    for name in HEADED + HEADLESS:
        info = json.loads((FIXTURES / name / "fixture.json").read_text())
        config = json.loads((FIXTURES / name / "config.json").read_text())
        assert info["library"] in ("timm", "transformers")
        assert ("architecture" in config) == (info["library"] == "timm")
