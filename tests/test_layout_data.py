"""The layout of data, images and evaluation: one module per job, one rule per check.

- the label rule is one function (`keras_vit.checks.check_labels`): the input pipelines and the
  evaluation refuse the same bad labels with the same message;
- `preprocess_inputs` (`keras_vit.preprocessing`) does not import TensorFlow, so that it runs on
  JAX without it; `keras_vit.images` keeps the TensorFlow image ops;
- the evaluation computes, `keras_vit.plots` draws (matplotlib);
- `keras_vit.data` is a package of one module per job (pipelines, image folders, the
  tensorflow-datasets registry), each public name importable from the package as before.
"""

import ast
import importlib
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import keras_vit
from keras_vit import checks, data, evaluation

ROOT = pathlib.Path(__file__).resolve().parent.parent
TINY = dict(hidden_size=8, num_layers=1, num_heads=2, mlp_dim=8)


def _message(action):
    with pytest.raises(ValueError) as info:
        action()
    return str(info.value)


def test_pipelines_and_evaluation_refuse_bad_labels_with_the_one_message():
    images = np.zeros((4, 16, 16, 3), np.uint8)
    labels = np.array([0, 1, 9, -1])
    expected = ("Labels out of range: [-1, 9] (2 of 4 values). Expected integers in [0, 3).")
    assert _message(lambda: checks.check_labels(labels, 3)) == expected
    assert _message(lambda: data.from_arrays(images, labels, num_classes=3, image_size=16,
                                             batch_size=2, training=False)) == expected
    model = keras_vit.ViT(image_size=16, patch_size=8, num_classes=3, **TINY)
    assert _message(lambda: keras_vit.evaluate(model, (images, labels), progress=False,
                                               allow_fresh_head=True)) == expected
    # The ReaL metric's predictions and label sets go through the same rule.
    assert _message(lambda: evaluation.real_accuracy(
        labels, np.ones((4, 3), bool), [0, 1, 2, 0])) == expected.replace("Labels",
                                                                          "Predictions")
    assert _message(lambda: evaluation.multi_hot([[0], [1.5]], 3)) == (
        "Class ids of label set 1 must be integers. Received dtype float64.")


def test_the_label_rule_returns_int64_class_ids():
    ids = checks.check_labels(np.array([2, 0], np.uint8), 3)
    assert ids.dtype == np.int64 and ids.tolist() == [2, 0]
    assert checks.check_labels([], 3).dtype == np.int64  # an empty label set


def _run_on_jax(code):
    """Runs `code` in a fresh Python on the JAX backend; returns its last line of output."""
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=ROOT, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip().splitlines()[-1]


def test_preprocess_inputs_runs_on_jax_without_tensorflow():
    out = _run_on_jax(
        "import sys, numpy as np, keras_vit\n"
        "from keras_vit.preprocessing import IMAGE_CHANNELS, preprocess_inputs\n"
        "x = np.array([[[[0, 127.5, 255]]]], np.float32)\n"
        "y = keras_vit.preprocess_inputs(x), preprocess_inputs(x)\n"
        "print([np.asarray(v).tolist() for v in y], IMAGE_CHANNELS, 'tensorflow' in sys.modules)")
    assert out == "[[[[[-1.0, 0.0, 1.0]]]], [[[[-1.0, 0.0, 1.0]]]]] 3 False"


def test_preprocess_inputs_is_one_function_wherever_it_is_imported_from():
    from keras_vit import images, preprocessing

    assert keras_vit.preprocess_inputs is images.preprocess_inputs is \
        preprocessing.preprocess_inputs
    # The TensorFlow op scales as the backend-neutral function does.
    pixels = np.array([[[0, 51, 255]]], np.uint8)
    np.testing.assert_allclose(images.scale(pixels), preprocessing.preprocess_inputs(pixels))


def test_the_confusion_matrix_figure_is_drawn_by_the_plots_module_only(tmp_path):
    pytest.importorskip("matplotlib")
    from PIL import Image

    from keras_vit import plots

    from keras_vit.evaluation import accuracy

    assert accuracy.plot_confusion_matrix is plots.plot_confusion_matrix
    for module in pathlib.Path(evaluation.__file__).parent.glob("*.py"):
        assert "matplotlib" not in module.read_text(), module.name
    path = plots.plot_confusion_matrix(np.array([[3, 1], [0, 2]]), ["a", "b"], tmp_path / "c.png")
    with Image.open(path) as image:
        # figsize 3 + 0.35 * 2 inches at 100 dpi.
        assert (image.format, image.size) == ("PNG", (370, 370))


# Every public name of keras_vit.data, by the module of the package that defines it.
DATA_NAMES = {
    "pipelines": ("AUTOTUNE", "INCEPTION_AREA_RANGE", "INCEPTION_ASPECT_RATIO_RANGE",
                  "RANDOM_ACCESS_LIMIT", "STREAM_SHUFFLE_BUFFER", "InputData",
                  "from_arrays", "from_tf_dataset", "preprocess_train", "to_0_255"),
    "folders": ("IMAGE_EXTENSIONS", "check_class_name", "find_corrupt_images", "from_folder",
                "list_image_folder"),
    "tfds": ("CONNECTIVITY_PROBE", "CONNECTIVITY_TIMEOUT", "DATASETS", "DatasetSpec",
             "from_tfds", "get_dataset_spec", "tfds_builder"),
}
# The public names of keras_vit.data that a module outside the package defines.
FROM_OUTSIDE = {"VALUE_RANGES": "keras_vit.preprocessing"}


def _public_definitions(path):
    """The public names a module defines at its top level (not those it imports)."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return {name for name in names if not name.startswith("_")}


@pytest.mark.parametrize("module", sorted(DATA_NAMES))
def test_the_data_package_exports_each_public_name_of_its_modules(module):
    home = importlib.import_module(f"keras_vit.data.{module}")
    assert _public_definitions(pathlib.Path(home.__file__)) == set(DATA_NAMES[module])
    for name in DATA_NAMES[module]:
        assert getattr(data, name) is getattr(home, name), name
    assert sorted(data.__all__) == sorted([*FROM_OUTSIDE, *(n for names in DATA_NAMES.values()
                                                            for n in names)])
    for name, home in FROM_OUTSIDE.items():
        assert getattr(data, name) is getattr(importlib.import_module(home), name), name


MAX_MODULE_LINES = 700


@pytest.mark.parametrize("path", ["data/__init__.py", "data/pipelines.py", "data/folders.py",
                                  "data/tfds.py", "images.py", "preprocessing.py",
                                  "evaluation/__init__.py", "evaluation/features.py",
                                  "evaluation/fewshot.py", "evaluation/accuracy.py", "plots.py",
                                  "checks.py"])
def test_data_image_and_evaluation_modules_are_short(path):
    lines = len((ROOT / "keras_vit" / path).read_text().splitlines())
    assert lines <= MAX_MODULE_LINES, f"keras_vit/{path} has {lines} lines"


def test_only_the_tfds_module_reaches_for_tensorflow_datasets_and_the_network():
    for module in ("pipelines", "folders"):
        source = (ROOT / "keras_vit" / "data" / f"{module}.py").read_text()
        assert "tensorflow_datasets" not in source and "socket" not in source, module
