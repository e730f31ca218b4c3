"""The embedded digits demo: the shipped checkpoint's held-out accuracy (by the independent NumPy
forward pass) and the script's reproducibility."""

import hashlib
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest
import reference
from test_data import numpy_bilinear

import keras_vit
from keras_vit import weights

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
import train_digits

SHIPPED = ROOT / "checkpoints" / "vit_digits.npz"


def held_out_split():
    """The documented split and conversion, written out again from scikit-learn directly."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    rgb = np.repeat(np.round(digits.images * 255 / 16)[..., None], 3, axis=-1)  # [N, 8, 8, 3]
    _, x_test, _, y_test = train_test_split(rgb, digits.target, test_size=0.2, random_state=0,
                                            stratify=digits.target)
    size = (train_digits.DIGITS_CONFIG["image_size"],) * 2  # bilinear upsampling to 16x16
    return np.stack([numpy_bilinear(x, size) for x in x_test]) / 127.5 - 1, y_test


def reference_accuracy(params):
    images, labels = held_out_split()
    logits = reference.forward(params, images, classifier=train_digits.DIGITS_CONFIG["classifier"])[0]
    return float(np.mean(logits.argmax(-1) == labels)), logits


def test_shipped_checkpoint_reaches_97_percent_on_the_held_out_digits():
    params = weights.read_npz(SHIPPED)
    accuracy, logits = reference_accuracy(params)
    assert len(logits) == 360
    assert accuracy >= 0.97, accuracy
    # It loads into the documented configuration, which computes the same logits.
    model = keras_vit.ViT(**train_digits.DIGITS_CONFIG)
    weights.load_params(model, params)
    images, _ = held_out_split()
    np.testing.assert_allclose(model.predict(images, verbose=0), logits, atol=2e-4)


def run_demo(output):
    return subprocess.Popen(
        [sys.executable, str(ROOT / "examples" / "train_digits.py"), "--epochs", "2",
         "--output", str(output)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def test_demo_script_reproduces_its_checkpoint_and_reports_its_accuracy(tmp_path):
    runs = [run_demo(tmp_path / f"run{i}") for i in range(2)]
    outputs = []
    for run in runs:
        try:
            outputs.append(run.communicate(timeout=300)[0])
        except subprocess.TimeoutExpired:
            run.kill()
            pytest.fail("the demo did not finish in 300 s")
        assert run.returncode == 0, outputs[-1][-3000:]
    digests = [hashlib.sha256((tmp_path / f"run{i}" / "final.npz").read_bytes()).hexdigest()
               for i in range(2)]
    assert digests[0] == digests[1]  # same seeds, deterministic ops: byte-identical files
    assert f"sha256 {digests[0]}" in outputs[0]
    printed = float(re.search(r"held-out accuracy: ([0-9.]+) \((\d+)/360\)", outputs[0]).group(1))
    accuracy, _ = reference_accuracy(weights.read_npz(tmp_path / "run0" / "final.npz"))
    assert printed == pytest.approx(accuracy, abs=1e-4)
    assert "<- predicted" in outputs[0] and "Epoch 2/2" in outputs[0]
