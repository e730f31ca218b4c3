"""The base install (`pip install keras-vit`, no extras) does what README.md shows by default.

`.ci/run` makes `.venv-base` with `pip install -e .` beside the test environment; these tests
run README's default export and prediction with that interpreter. Without `.venv-base` (a
developer's checkout) they are skipped: `python3 -m venv .venv-base &&
.venv-base/bin/pip install -e .` makes it.
"""

import ast
import json
import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
BASE = ROOT / ".venv-base" / "bin"
# Modules that only the extras install (serving, figures, demo, test); pillow is not one:
# the base install brings it (through tensorboard).
EXTRAS_MODULES = ("tensorflow_serving", "matplotlib", "sklearn", "scipy", "pytest", "jax")

pytestmark = pytest.mark.skipif(not (BASE / "python").exists(),
                                reason=".venv-base (pip install -e . without extras) is missing")


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
