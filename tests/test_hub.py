"""Weights in timm's and transformers' layouts, from local safetensors files and `hf://`.

The fixtures (tests/fixtures/hub/) were written by timm and transformers themselves, with the
logits they compute (tests/fixtures/make_hub_fixtures.py); keras_vit must reproduce those
logits from the files alone, without torch. `hf://` is fetched by huggingface_hub from a local
endpoint that answers as the Hub does."""

import fcntl
import hashlib
import http.server
import json
import logging
import os
import pathlib
import pty
import shutil
import socket
import struct
import subprocess
import sys
import termios
import threading

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


@pytest.mark.parametrize("path, value", [
    (("model_args", "global_pool"), "avg"),          # timm would average the patches
    (("model_args", "act_layer"), "gelu"),           # exact GELU for the file's tanh one
    (("pretrained_cfg", "mean"), [0.1, 0.1, 0.1]),   # timm would normalise otherwise
    (("preprocessing", "crop_pct"), 0.875),
])
def test_a_config_json_that_contradicts_the_file_it_describes_is_refused(tmp_path, path, value):
    """A `config.json` beside a `.safetensors` file keras_vit wrote is what timm reads: one
    stating another model or preprocessing than the file's own metadata is refused, naming
    the field: timm would build that other model from the folder."""
    keras_vit.weights.writers.save_safetensors(keras_vit.from_pretrained("digits"),
                                               tmp_path / "a.safetensors")
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["weights_file"] == "a.safetensors"
    keras_vit.from_pretrained(tmp_path / "a.safetensors")  # as written: it reads back
    config = json.loads(json.dumps(written))
    config[path[0]][path[1]] = value
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(keras_vit.CheckpointError, match=rf"{'.'.join(path)} .* contradicts"):
        keras_vit.from_pretrained(tmp_path / "a.safetensors")
    # Files of earlier versions name no file (0.3.0 wrote crop_mode "center" for the paper's
    # "squash"): their config.json is not held to the metadata.
    del written["weights_file"]
    written["pretrained_cfg"]["crop_mode"] = "center"
    (tmp_path / "config.json").write_text(json.dumps(written))
    keras_vit.from_pretrained(tmp_path / "a.safetensors")


@pytest.mark.parametrize("named", ["x\0y.safetensors", "../a.safetensors", "sub/a.safetensors",
                                   "", ".", 7, None])
def test_a_config_json_naming_no_plain_file_of_the_folder_is_read_as_before(tmp_path, named):
    """`weights_file` is only a file name of the folder: anything else (a NUL, a path, not a
    string) leaves the config.json read for the file beside it; a config.json that is no JSON
    object is left to the readers, as it was (the .safetensors reader names it, the .npz's
    takes it for another tool's)."""
    model = keras_vit.from_pretrained("digits")
    (tmp_path / "sub").mkdir()
    keras_vit.weights.writers.save_safetensors(model, tmp_path / "b.safetensors")
    shutil.copy(tmp_path / "b.safetensors", tmp_path / "sub" / "a.safetensors")
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(dict(config, weights_file=named)))
    assert keras_vit.weights.hub.beside(tmp_path / "c.npz") == str(tmp_path / "config.json")
    keras_vit.from_pretrained(tmp_path / "b.safetensors")
    (tmp_path / "config.json").write_text("[1, 2]")
    keras_vit.weights.save_npz(model, tmp_path / "c.npz")
    assert keras_vit.from_pretrained(tmp_path / "c.npz").data_config == model.data_config
    with pytest.raises(keras_vit.CheckpointError, match=r"config.json holds list"):
        keras_vit.from_pretrained(tmp_path / "b.safetensors")


def test_a_second_safetensors_file_is_not_written_beside_another_ones_config(tmp_path, capsys):
    """timm reads one model a folder: `convert` of a second `.safetensors` file into a folder
    whose `config.json` describes another file there is refused, even with --overwrite (the
    first file would no longer read back); a copy of the file beside it is read without that
    config.json, which is another file's."""
    model = keras_vit.from_pretrained("digits")
    keras_vit.weights.writers.save_safetensors(model, tmp_path / "a.safetensors")
    written = (tmp_path / "config.json").read_text()
    assert cli.main(["convert", "digits", str(tmp_path / "b.safetensors"), "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert "config.json describes a.safetensors there" in err and len(err.splitlines()) == 1
    assert sorted(os.listdir(tmp_path)) == ["a.safetensors", "config.json"]
    assert (tmp_path / "config.json").read_text() == written
    shutil.copy(tmp_path / "a.safetensors", tmp_path / "c.safetensors")
    config = json.loads(written)
    config["model_args"]["global_pool"] = "avg"  # a.safetensors' only: not read for the copy
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert keras_vit.vit_config(keras_vit.from_pretrained(tmp_path / "c.safetensors"))[
        "classifier"] == "token"
    with pytest.raises(keras_vit.CheckpointError, match="global_pool"):
        keras_vit.from_pretrained(tmp_path / "a.safetensors")
    # An .npz beside it takes nothing of the config.json another file's metadata matches.
    mean = dict(keras_vit.preprocessing.paper_data_config(16), mean=[0.1] * 3, std=[0.2] * 3)
    other = keras_vit.ViT(image_size=16, patch_size=4, hidden_size=8, num_layers=1, num_heads=2,
                          mlp_dim=8, num_classes=10, data_config=mean)
    keras_vit.weights.writers.save_safetensors(other, tmp_path / "a.safetensors", overwrite=True)
    keras_vit.weights.save_npz(model, tmp_path / "b.npz")
    assert keras_vit.from_pretrained(tmp_path / "b.npz").data_config["mean"] == [0.5] * 3
    assert keras_vit.from_pretrained(tmp_path / "a.safetensors").data_config["mean"] == [0.1] * 3
    (tmp_path / "a.safetensors").unlink()  # the folder is the copy's now
    keras_vit.weights.writers.save_safetensors(model, tmp_path / "c.safetensors", overwrite=True)
    assert json.loads((tmp_path / "config.json").read_text())["weights_file"] == "c.safetensors"


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


class HubFiles(http.server.BaseHTTPRequestHandler):
    """The Hugging Face Hub's file endpoint as huggingface_hub reads it (`HF_ENDPOINT`): HEAD and
    GET of /ORG/NAME/resolve/REVISION/FILE, with the commit and the ETag in the headers, and 404
    with the Hub's error code for a file it does not have."""

    files = {}  # "ORG/NAME/FILE" -> bytes
    commit = "0123456789abcdef0123456789abcdef01234567"

    def _answer(self):
        parts = self.path.split("?")[0].strip("/").split("/")  # ORG NAME resolve REVISION FILE
        resolved = len(parts) > 4 and parts[2] == "resolve"
        body = self.files.get("/".join(parts[:2] + parts[4:])) if resolved else None
        self.send_response(404 if body is None else 200)
        if body is None:
            self.send_header("X-Error-Code", "EntryNotFound")
        else:
            self.send_header("X-Repo-Commit", self.commit)
            self.send_header("ETag", '"' + hashlib.sha256(body).hexdigest() + '"')
        self.send_header("Content-Length", str(len(body or b"")))
        self.end_headers()
        return body

    def do_HEAD(self):  # noqa: N802 - http.server's name
        self._answer()

    def do_GET(self):  # noqa: N802
        body = self._answer()
        if body is not None:
            self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def hub_endpoint():
    """The URL of a local endpoint serving `HubFiles.files`."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), HubFiles)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    HubFiles.files = {}


def on_a_terminal(argv, env):
    """Runs `keras-vit ARGV` with standard error a terminal (a pty): (exit status, stdout,
    what the terminal received)."""
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # rows, cols
    process = subprocess.Popen([sys.executable, "-m", "keras_vit_cli", *argv], env=env,
                               stdout=subprocess.PIPE, stderr=terminal)
    os.close(terminal)
    received = []

    def read():
        while True:
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # the last writer has closed it
                return
            if not chunk:
                return
            received.append(chunk)

    reader = threading.Thread(target=read)
    reader.start()
    out = process.communicate(timeout=300)[0].decode()
    reader.join(timeout=30)
    os.close(controller)
    return process.returncode, out, b"".join(received).decode(errors="replace")


def test_hf_sources_download_through_huggingface_hub_and_load_offline_after(tmp_path,
                                                                            hub_endpoint):
    """`hf://` fetches through huggingface_hub from the Hub's endpoint (here a local one
    serving the files transformers wrote) into its cache; on a terminal its bar shows, under
    `--quiet` nothing does; offline (`HF_HUB_OFFLINE=1`) that cache serves, and a repository
    not in it is one line naming what to do."""
    for name in ("config.json", "model.safetensors"):
        HubFiles.files[f"google/vit-tiny-test/{name}"] = (
            FIXTURES / "transformers_vit" / name).read_bytes()
    images, _ = expected("transformers_vit")
    png = tmp_path / "x.png"
    from PIL import Image

    Image.fromarray(((images[0] + 1) * 127.5).round().astype(np.uint8)).save(png)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_ENDPOINT=hub_endpoint, TF_CPP_MIN_LOG_LEVEL="3")
    argv = ["predict", str(png), "--weights", "hf://google/vit-tiny-test", "--top-k", "5"]
    for quiet in (False, True):
        home = tmp_path / f"hf_quiet_{quiet}"
        status, out, terminal = on_a_terminal(argv + ["-q"] * quiet,
                                              dict(env, HF_HOME=str(home)))
        assert status == 0 and "class_" in out, terminal[-2000:]  # the config's id2label
        assert os.listdir(home / "hub" / "models--google--vit-tiny-test" / "snapshots") == [
            HubFiles.commit]
        if quiet:
            assert terminal == "", terminal
        else:  # huggingface_hub's bar of the weights file, and the command's stage lines
            assert "model.safetensors" in terminal and "100%" in terminal, terminal
    HubFiles.files = {}  # offline from here: the cache huggingface_hub wrote serves
    env.update(HF_HOME=str(tmp_path / "hf_quiet_False"), HF_HUB_OFFLINE="1")
    cached = subprocess.run([sys.executable, "-m", "keras_vit_cli", *argv], capture_output=True,
                            text=True, env=env, timeout=300)
    assert cached.returncode == 0 and "class_" in cached.stdout, cached.stderr[-2000:]
    missing = subprocess.run([sys.executable, "-m", "keras_vit_cli", "predict", str(png),
                              "--weights", "hf://google/not-cached"], capture_output=True,
                             text=True, env=env, timeout=300)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert "Could not fetch hf://google/not-cached" in missing.stderr
    assert "HF_HUB_OFFLINE" in missing.stderr


def test_an_unreachable_hub_is_read_from_the_cache_at_once(tmp_path, monkeypatch, hub_endpoint):
    """Offline, huggingface_hub retries each file with back-offs before it reads its cache;
    where the Hub's endpoint does not answer, keras_vit reads the cache at once, and a
    repository not in it is one line naming the endpoint and what to do."""
    from keras_vit.weights import DownloadError, hub

    def endpoint(url):  # where huggingface_hub goes (HF_ENDPOINT, read at its import)
        monkeypatch.setattr(hub.hub_constants, "ENDPOINT", url)
        monkeypatch.setattr(hub.hub_constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                            url + "/{repo_id}/resolve/{revision}/{filename}")

    for name in ("config.json", "model.safetensors"):
        HubFiles.files[f"google/vit-tiny-test/{name}"] = (
            FIXTURES / "transformers_vit" / name).read_bytes()
    monkeypatch.setattr(hub.hub_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hub.hub_constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    endpoint(hub_endpoint)
    online = hub.hub_files("hf://google/vit-tiny-test")
    with socket.socket() as s:  # a port nothing listens on once it is closed
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    endpoint(f"http://127.0.0.1:{closed}")
    said = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())
    logging.getLogger("huggingface_hub").addHandler(handler)
    try:
        assert hub.hub_files("hf://google/vit-tiny-test") == online  # the cache serves
        with pytest.raises(DownloadError) as raised:
            hub.hub_files("hf://google/not-cached")
    finally:
        logging.getLogger("huggingface_hub").removeHandler(handler)
    message = str(raised.value)
    assert (f"Could not fetch hf://google/not-cached (http://127.0.0.1:{closed} does not "
            "answer, and huggingface_hub's cache does not hold it). Offline, download") in message
    assert "\n" not in message
    assert not [line for line in said if "Retrying" in line], said  # no back-offs


def test_hf_download_bars_follow_progress_as_the_librarys_own(monkeypatch):
    """huggingface_hub's bars of an `hf://` download are off with `progress=False`, and with
    `progress=True` where standard error does not redraw them (a file, a pipe); on otherwise;
    as they were afterwards."""
    from huggingface_hub.utils import are_progress_bars_disabled

    from keras_vit.weights import hub

    disabled = []

    def download(repo, name, revision=None, local_files_only=False):  # the Hub's files, as
        disabled.append(are_progress_bars_disabled())  # huggingface_hub gives them
        return str(FIXTURES / "transformers_vit" / name)

    monkeypatch.setattr(hub.huggingface_hub, "hf_hub_download", download)
    monkeypatch.setattr(hub, "_unreachable", lambda: None)  # the Hub answers
    monkeypatch.setattr(hub.hub_constants, "HF_HUB_DISABLE_PROGRESS_BARS", None)  # no user's
    for progress, terminal, off in ((False, True, True), (True, False, True),
                                    (True, True, False)):
        monkeypatch.setattr(hub, "redrawn_in_place", lambda stream, on=terminal: on)
        disabled.clear()
        keras_vit.from_pretrained("hf://google/vit-tiny-test", progress=progress)
        assert disabled and set(disabled) == {off}, (progress, terminal, disabled)
        assert not are_progress_bars_disabled()


def test_hf_source_names_are_checked():
    with pytest.raises(ValueError, match="is not a Hugging Face model"):
        keras_vit.from_pretrained("hf://not a repo")


def test_fixture_files_are_what_the_libraries_wrote():
    for name in HEADED + HEADLESS:
        info = json.loads((FIXTURES / name / "fixture.json").read_text())
        config = json.loads((FIXTURES / name / "config.json").read_text())
        assert info["library"] in ("timm", "transformers")
        assert ("architecture" in config) == (info["library"] == "timm")
