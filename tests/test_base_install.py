"""The package as users install it: the wheel, with no extras, not editable, run from outside
the checkout.

`.ci/run` builds the wheel into `dist/` and installs it into a fresh `.venv-base` before the
suite; these tests run README's default export and prediction, the shipped checkpoint and the
command line with that interpreter, and read the wheel itself. Without `dist/` or `.venv-base`
(a developer's checkout) they are skipped, and fail instead where `KERAS_VIT_CI=1` (set by
`.ci/run`). To make them by hand: `python3 -m venv --clear .venv-base && .venv-base/bin/pip
wheel --no-deps -w dist . && .venv-base/bin/pip install dist/keras_vit-*.whl` (again after
changing the package: the installed wheel does not follow the checkout).
"""

import ast
import hashlib
import json
import os
import pathlib
import re
import subprocess
import zipfile

import numpy as np
import pytest
import reference
from test_data import numpy_bilinear

from keras_vit import weights

ROOT = pathlib.Path(__file__).resolve().parent.parent
BASE = ROOT / ".venv-base" / "bin"
DIST = ROOT / "dist"
# Modules that only the extras install (serving, figures, demo, test); pillow is not one:
# the base install brings it (through tensorboard).
EXTRAS_MODULES = ("tensorflow_serving", "matplotlib", "sklearn", "scipy", "pytest", "jax",
                  "keras_hub", "onnx", "onnxruntime", "tf2onnx")
# The installed packages and the checkout folders they are built from.
PACKAGES = {"keras_vit": "keras_vit", "keras_vit_cli": "keras_vit_cli",
            "keras_vit_checkpoints": "checkpoints"}
REQUIRED = os.environ.get("KERAS_VIT_CI") == "1"


def require(condition, reason):
    """Skips the test, or fails it under CI (`KERAS_VIT_CI=1`, where `.ci/run` made what it
    needs), when `condition` is false."""
    if not condition:
        (pytest.fail if REQUIRED else pytest.skip)(reason)


@pytest.fixture(autouse=True)
def base_install():
    require((BASE / "python").exists(),
            ".venv-base (the wheel installed without extras, as .ci/run makes it) is missing")


def run(args, cwd):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("PYTHONPATH", None)
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_the_base_environment_has_no_extras(tmp_path):
    probe = ("import importlib.util, json; print(json.dumps("
             f"[m for m in {EXTRAS_MODULES!r} if importlib.util.find_spec(m)]))")
    result = run([str(BASE / "python"), "-c", probe], tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []


def test_readme_default_export_and_predict_on_the_base_install(tmp_path):
    script = """
import keras, numpy as np, keras_vit
model = keras_vit.ViT(image_size=32, patch_size=8, hidden_size=32, num_layers=1, num_heads=2,
                      mlp_dim=32, num_classes=3)
model.save("vit.keras")
keras_vit.export_saved_model(model, "api_export")
np.save("image.npy", np.zeros((32, 32, 3), np.uint8))
import tensorflow as tf
tf.io.write_file("image.png", tf.io.encode_png(np.full((40, 30, 3), 128, np.uint8)))
"""
    result = run([str(BASE / "python"), "-c", script], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    (tmp_path / "classes.txt").write_text("cat\ndog\nbird\n")
    # README: keras-vit export exports/vit --model vit.keras --class-names classes.txt
    result = run([str(BASE / "keras-vit"), "export", "exports/vit", "--model", "vit.keras",
                  "--class-names", "classes.txt"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    for export in (tmp_path / "api_export" / "1", tmp_path / "exports" / "vit" / "1"):
        assert (export / "saved_model.pb").is_file()
        metadata = json.loads((export / "assets.extra" / "keras_vit.json").read_text())
        assert metadata["warmup"] is False  # no tensorflow-serving-api: no warm-up records
    # The export answers, read back by the base install's TensorFlow.
    check = """
import numpy as np, tensorflow as tf
serve = tf.saved_model.load("exports/vit/1").signatures["predict_images"]
out = serve(images=tf.constant(np.load("image.npy")[None], tf.float32))
print(out["top_k_labels"].numpy()[0].tolist())
"""
    result = run([str(BASE / "python"), "-c", check], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(ast.literal_eval(result.stdout.strip().splitlines()[-1])) == [
        b"bird", b"cat", b"dog"]
    # README: keras-vit predict cat.jpg --model ... (a .keras model, its class names)
    result = run([str(BASE / "keras-vit"), "predict", "image.png", "--model", "vit.keras",
                  "--class-names", "classes.txt", "--top-k", "2"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("image.png") and result.stdout.count("%") == 2


def the_wheel():
    wheels = sorted(DIST.glob("keras_vit-*.whl"))
    require(len(wheels) == 1, f"dist/ holds {len(wheels)} keras_vit wheels; .ci/run builds one")
    return wheels[0]


def test_the_base_install_is_the_wheel_outside_the_checkout(tmp_path):
    probe = ("import importlib.metadata as m, importlib.util, json\n"
             "d = m.distribution('keras-vit')\n"
             "print(json.dumps(dict(files=[importlib.util.find_spec(p).origin for p in "
             f"{sorted(PACKAGES)!r}], origin=json.loads(d.read_text('direct_url.json')),"
             " urls=d.metadata.get_all('Project-URL'), license=d.metadata.get_all('License-File'),"
             " installed=[str(f) for f in d.files])))")
    result = run([str(BASE / "python"), "-c", probe], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout)
    require(not found["origin"].get("dir_info", {}).get("editable"),
            ".venv-base is an editable install of the checkout; .ci/run installs the wheel")
    assert found["origin"]["url"].endswith(".whl")
    site_packages = next((BASE.parent / "lib").glob("python3*/site-packages"))
    for package, path in zip(sorted(PACKAGES), found["files"]):
        assert pathlib.Path(path) == site_packages / package / "__init__.py"
    assert {url.split(",")[0] for url in found["urls"]} == {"Source", "Documentation",
                                                            "Changelog"}
    assert found["license"] == ["LICENSE"]
    assert any(re.search(r"\.dist-info/(licenses/)?LICENSE$", f) for f in found["installed"])


def test_the_wheel_holds_every_module_the_data_and_the_license():
    with zipfile.ZipFile(the_wheel()) as wheel:
        names = set(wheel.namelist())
        for package, folder in PACKAGES.items():
            for path in (ROOT / folder).rglob("*"):
                if path.is_dir() or "__pycache__" in path.parts:
                    continue
                name = f"{package}/{path.relative_to(ROOT / folder).as_posix()}"
                assert name in names, f"{name} is not in the wheel (stale? .ci/run rebuilds it)"
                if package == "keras_vit_checkpoints":  # the data, byte for byte
                    assert hashlib.sha256(wheel.read(name)).digest() == \
                        hashlib.sha256(path.read_bytes()).digest(), name
        assert not [n for n in names if n.split("/")[0] in ("tests", "benchmarks", "examples")]
        (license_name,) = [n for n in names if re.search(r"\.dist-info/(licenses/)?LICENSE$", n)]
        assert wheel.read(license_name) == (ROOT / "LICENSE").read_bytes()
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        text = wheel.read(metadata).decode()
    assert "Apache License" in (ROOT / "LICENSE").read_text()
    assert "License-File: LICENSE" in text
    assert re.search(r"^Project-URL: Source, https://", text, re.M)


def test_the_shipped_checkpoint_predicts_from_python_and_the_command_line(tmp_path):
    """`keras_vit.from_pretrained("digits")` and `keras-vit predict --weights digits` with the
    installed wheel, against the float64 NumPy forward pass of the checkout's file."""
    from sklearn.datasets import load_digits
    from PIL import Image

    digits = load_digits()
    grey = np.round(digits.images[:6] * 255 / 16).astype(np.uint8)  # [6, 8, 8]
    paths = []
    for i, image in enumerate(grey):
        paths.append(f"digit{i}.png")
        Image.fromarray(np.repeat(image[..., None], 3, axis=-1)).save(tmp_path / paths[-1])
    inputs = np.stack([numpy_bilinear(np.repeat(g[..., None], 3, -1), (16, 16)) for g in grey])
    np.save(tmp_path / "inputs.npy", inputs / 127.5 - 1)
    params = weights.read_npz(ROOT / "checkpoints" / "vit_digits.npz")
    expected = reference.forward(params, inputs / 127.5 - 1)[0]

    script = ("import json, numpy as np, keras_vit\n"
              "model = keras_vit.from_pretrained('digits')\n"
              "print(json.dumps(model.predict(np.load('inputs.npy'), verbose=0).tolist()))")
    result = run([str(BASE / "python"), "-c", script], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    logits = np.array(json.loads(result.stdout.strip().splitlines()[-1]))
    np.testing.assert_allclose(logits, expected, atol=1e-4)

    result = run([str(BASE / "keras-vit"), "predict", *paths, "--weights", "digits",
                  "--top-k", "1"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    printed = re.findall(r"^  +([\d.]+)%  (\S+) \((\d+)\)$", result.stdout, re.M)
    probabilities = np.exp(expected - expected.max(-1, keepdims=True))
    probabilities /= probabilities.sum(-1, keepdims=True)
    assert [int(c) for _, _, c in printed] == expected.argmax(-1).tolist()
    np.testing.assert_allclose([float(p) for p, _, _ in printed],
                               100 * probabilities.max(-1), atol=0.01)
    assert [name for _, name, _ in printed] == [str(c) for c in expected.argmax(-1)]

    result = run([str(BASE / "keras-vit"), "checkpoints"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    # variant (none: its own architecture), resolution, classes, top-1 (none), size, data, name
    assert re.search(r"^ *- +16 +10 +- +0\.55 MiB \(shipped\) .* digits$", result.stdout, re.M)
