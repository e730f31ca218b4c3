"""ONNX export (`keras_vit.export_onnx`, `keras-vit export --format onnx`), proven through ONNX
Runtime: every kind of model the SavedModel export takes gives the Keras logits back, at any
batch size, or is refused before anything is written, with one line naming why; the command
line's errors are one line with exit status 2; the onnxruntime benchmark contender is
registered."""

import gc
import importlib.util
import os
import pathlib
import re
import sys
import threading
import weakref

import keras
import numpy as np
import onnx
import onnxruntime
import pytest

import keras_vit
import keras_vit_cli as cli
from keras_vit import export, fileio, onnx_export, weights
from keras_vit_cli import export as cli_export

import tiny_models
from tiny_models import TINY

ROOT = pathlib.Path(__file__).resolve().parent.parent
# Every kind of model: test_roundtrip.py's, the poolings and heads, the exact GELU.
KINDS = {
    **tiny_models.KINDS,
    "gap": dict(classifier="gap"),
    "gap_class_token_fc_norm": dict(classifier="gap", class_token=True, fc_norm=True),
    "pre_logits": dict(representation_size=8),
    "exact_gelu": dict(gelu_approximate=False),  # TensorFlow's Erfc, which ONNX lacks
}
# Preprocessed images, [-1, 1]: batches of 3 and of 1 (the batch is dynamic), and another size;
# the files take them as pixels in [0, 255] (`pixels`), which the paper's data config of the
# tiny models maps back to these, up to float32 rounding.
IMAGES = np.random.default_rng(1).uniform(-1, 1, (3, 16, 16, 3)).astype(np.float32)
OTHER_SIZE = np.random.default_rng(2).uniform(-1, 1, (2, 24, 32, 3)).astype(np.float32)


def pixels(images):
    return ((images + 1) * 127.5).astype(np.float32)

find_spec = importlib.util.find_spec  # the real one, for the tests that hide packages


def build(kind="plain", seed=0, **changes):
    """The kind's tiny model with random weights (non-trivial logits)."""
    return tiny_models.build(TINY, KINDS, kind, seed, **changes)


def logits(model, images):
    return keras.ops.convert_to_numpy(model(images, training=False))


def session(path):
    return onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def shape(value):
    return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_kind_of_model_gives_its_logits_back_through_onnx_runtime(tmp_path, kind):
    model = build(kind)
    path = keras_vit.export_onnx(model, tmp_path / "vit.onnx")
    assert path == str(tmp_path / "vit.onnx") and os.listdir(tmp_path) == ["vit.onnx"]
    runtime = session(path)
    for batch in (IMAGES, IMAGES[:1]):
        (got,) = runtime.run(["logits"], {"images": pixels(batch)})
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, logits(model, batch), atol=1e-5)
    graph = onnx.load(path).graph
    size = ["height", "width"] if kind == "dynamic" else [16, 16]
    assert [(v.name, shape(v)) for v in graph.input] == [("images", ["batch", *size, 3])]
    assert [(v.name, shape(v)) for v in graph.output] == [("logits", ["batch", 3])]
    assert "Erfc" not in {node.op_type for node in graph.node}
    if kind == "dynamic":  # any size of whole patches, as the Keras model
        (got,) = runtime.run(["logits"], {"images": pixels(OTHER_SIZE)})
        np.testing.assert_allclose(got, logits(model, OTHER_SIZE), atol=1e-5)
        # A side of partial patches: the strided convolution would drop the rest.
        partial = np.zeros((1, OTHER_SIZE.shape[1] + 3, OTHER_SIZE.shape[2], 3), np.float32)
        with pytest.raises(Exception, match="height_and_width_must_be_multiples_of_8x8.*"
                                            "cannot be reshaped"):
            runtime.run(["logits"], {"images": partial})
        with pytest.raises(ValueError, match=r"takes images whose height and width are "
                                             r"multiples of 8x8 pixels \(its patches\)"):
            onnx_export.run_onnx(path, partial)


def test_a_hybrid_of_any_input_size_takes_any_size_as_the_keras_model_does(tmp_path):
    """Its ResNet stem pads any size, so the file refuses none (no partial-patch node)."""
    model = build("hybrid", dynamic_image_size=True)
    path = keras_vit.export_onnx(model, tmp_path / "hybrid.onnx")
    assert not any(node.name.startswith(onnx_export.PARTIAL_PATCH_NODE)
                   for node in onnx.load(path).graph.node)
    for height, width in ((16, 16), (18, 18), (17, 30)):
        images = np.random.default_rng(height).uniform(-1, 1, (2, height, width, 3))
        images = images.astype(np.float32)
        np.testing.assert_allclose(onnx_export.run_onnx(path, pixels(images)),
                                   logits(model, images), atol=1e-5)


def test_a_keras_classifier_that_is_not_a_keras_vit_model_exports_too(tmp_path):
    inputs = keras.Input((16, 16, 3))
    features = keras.layers.GlobalAveragePooling2D()(keras.layers.Conv2D(4, 3)(inputs))
    model = keras.Model(inputs, keras.layers.Dense(5)(features))
    model.set_weights([np.random.default_rng(3).normal(0, 1, w.shape).astype(w.dtype)
                       for w in model.get_weights()])
    path = keras_vit.export_onnx(model, tmp_path / "cnn.onnx")
    parity = onnx_export.onnx_parity(path, model, pixels(IMAGES))
    assert parity["max_abs_diff"] < 1e-5 and parity["top1_agreement"] == 1.0
    with pytest.raises(ValueError, match=r"cnn.onnx takes images \[batch, 16, 16, 3\]. "
                                         r"Received shape \(2, 24, 32, 3\)"):
        onnx_export.run_onnx(path, pixels(OTHER_SIZE))


def test_onnx_parity_reports_the_shared_comparison_and_names_a_file_of_other_classes(tmp_path):
    """`onnx_parity` and `tflite.tflite_parity` compare through one helper,
    `export.output_parity`: the same numbers, computed here independently, and the same
    one-line refusal of a file whose classes are not the model's."""
    model = build()
    path = keras_vit.export_onnx(model, tmp_path / "vit.onnx")
    got = onnx_export.run_onnx(path, pixels(IMAGES))
    want = logits(model, keras_vit.preprocess_inputs(pixels(IMAGES), model))
    parity = onnx_export.onnx_parity(path, model, pixels(IMAGES))
    assert parity == {"max_abs_diff": float(np.abs(got - want).max()),
                      "max_abs_logit": float(np.abs(want).max()),
                      "top1_agreement": float(np.mean(got.argmax(-1) == want.argmax(-1))),
                      "num_images": 3}
    assert set(parity) - {"max_abs_logit"} == set(export.output_parity(
        path, model, got, want, "logits", "ONNX"))
    ten = build(num_classes=10)
    with pytest.raises(ValueError) as raised:
        onnx_export.onnx_parity(path, ten, pixels(IMAGES))
    assert str(raised.value) == (f"{path} gives 3 logits per image, but model 'tiny' has 10 "
                                 "classes. Expected the ONNX file exported from this model.")
    with pytest.raises(ValueError) as raised:
        export.output_parity("m.tflite", ten, np.zeros((2, 3)), np.zeros((2, 10)),
                             "probabilities", "TFLite")
    assert str(raised.value) == ("m.tflite gives 3 probabilities per image, but model 'tiny' "
                                 "has 10 classes. Expected the TFLite file exported from this "
                                 "model.")
    two = export.output_parity("m.tflite", ten, np.array([[0.2, 0.8], [0.6, 0.4]]),
                               np.array([[0.25, 0.75], [0.3, 0.7]]), "probabilities", "TFLite")
    assert two == {"max_abs_diff": pytest.approx(0.3), "top1_agreement": 0.5, "num_images": 2}


def test_garbage_cycles_are_freed_while_the_converter_runs():
    """tf2onnx drops a copy of its graph, weights included, as a reference cycle in each
    optimisation pass: the export frees them as it goes, not when CPython next runs a full
    collection."""

    class Graph:  # a graph copy: its nodes point back at it
        pass

    freed = threading.Event()
    gc.disable()  # only the export's collector runs
    try:
        with onnx_export._collecting_garbage(every=0.01):
            copy = Graph()
            copy.nodes = [copy]
            weakref.finalize(copy, freed.set)
            del copy
            assert freed.wait(timeout=60)
    finally:
        gc.enable()
    assert "keras_vit-onnx-gc" not in {thread.name for thread in threading.enumerate()}


# ------------------------------------------------------------------------------------------
# Refusals: one line naming why, and nothing written.


def test_models_it_cannot_export_are_refused_before_anything_is_written(tmp_path, monkeypatch):
    target = tmp_path / "vit.onnx"
    keras.config.set_dtype_policy("mixed_bfloat16")
    half = build()
    keras.config.set_dtype_policy("float32")
    with pytest.raises(ValueError, match=r"Model 'tiny' computes in bfloat16 \(layer .*, dtype "
                                         r"policy 'mixed_bfloat16'\): Keras' ONNX export takes "
                                         r"float32 models only.*at_precision"):
        keras_vit.export_onnx(half, target)
    headless = keras_vit.ViT(**dict(TINY, include_top=False))
    with pytest.raises(ValueError, match="ends with its 'pool' layer.*include_top=False"):
        keras_vit.export_onnx(headless, target)
    with pytest.raises(TypeError, match="Expected a keras.Model.*str"):
        keras_vit.export_onnx("vit.keras", target)
    with pytest.raises(ValueError, match="is not built"):
        keras_vit.export_onnx(keras.Sequential([keras.layers.Dense(3)]), target)
    model = build()
    with monkeypatch.context() as patch:  # as ViT-H/14 (2.4 GiB of float32 weights) is
        patch.setattr(onnx_export, "MAX_FILE_BYTES", 1000)
        with pytest.raises(ValueError, match=r"Model 'tiny' has 0.00 GiB of weights; an ONNX "
                                             r"file .* at most 2 GiB"):
            keras_vit.export_onnx(model, target)
    with monkeypatch.context() as patch:
        patch.setattr(keras.backend, "backend", lambda: "jax")
        with pytest.raises(ValueError, match="export_onnx needs the TensorFlow backend"):
            keras_vit.export_onnx(model, target)
    with monkeypatch.context() as patch:  # tf2onnx not installed
        patch.setattr(importlib.util, "find_spec",
                      lambda name, *a: None if name == "tf2onnx" else find_spec(name, *a))
        with pytest.raises(ImportError, match=r"needs tf2onnx, which is not installed: pip "
                                              r"install 'keras-vit\[onnx\]'") as error:
            keras_vit.export_onnx(model, target)
        assert isinstance(error.value.__cause__, ModuleNotFoundError)  # the CLI's exit 2
    assert os.listdir(tmp_path) == []


def test_a_graph_that_differs_from_keras_or_holds_tensorflow_ops_is_not_written(tmp_path,
                                                                                 monkeypatch):
    model = build()
    target = tmp_path / "vit.onnx"
    target.write_bytes(b"the previous export")
    with monkeypatch.context() as patch:
        patch.setattr(onnx_export, "ONNX_TOLERANCE", -1.0)  # no graph is close enough
        with pytest.raises(ValueError, match=r"differs from Keras by .* in the logits .* "
                                             r"Nothing was written to .*vit.onnx"):
            keras_vit.export_onnx(model, target, overwrite=True)
    with monkeypatch.context() as patch:  # an op tf2onnx leaves as TensorFlow's
        patch.setattr(onnx_export, "_replace_erfc", lambda graph: None)
        with pytest.raises(ValueError, match=r"cannot convert the TensorFlow operations Erfc "
                                             r"of this model: ONNX has no such operators"):
            keras_vit.export_onnx(build("exact_gelu"), target, overwrite=True)
    assert os.listdir(tmp_path) == ["vit.onnx"]  # no temporary left
    assert target.read_bytes() == b"the previous export"


def test_an_existing_file_is_replaced_only_with_overwrite_and_never_through_a_link(tmp_path):
    model = build()
    target = tmp_path / "vit.onnx"
    target.write_bytes(b"mine")
    with pytest.raises(fileio.DestinationExists, match="vit.onnx already exists.*overwrite=True"):
        keras_vit.export_onnx(model, target)
    assert target.read_bytes() == b"mine"
    (tmp_path / "folder.onnx").mkdir()
    with pytest.raises(fileio.DestinationExists, match="folder.onnx is a folder"):
        keras_vit.export_onnx(model, tmp_path / "folder.onnx", overwrite=True)
    (tmp_path / "link.onnx").symlink_to(target)
    with pytest.raises(fileio.WriteError, match="link.onnx is a symbolic link"):
        keras_vit.export_onnx(model, tmp_path / "link.onnx", overwrite=True)
    assert target.read_bytes() == b"mine"
    keras_vit.export_onnx(model, target, overwrite=True)
    onnx.checker.check_model(onnx.load(target))
    assert sorted(os.listdir(tmp_path)) == ["folder.onnx", "link.onnx", "vit.onnx"]


# ------------------------------------------------------------------------------------------
# The command line.


def test_cli_exports_onnx_that_gives_the_keras_logits(tmp_path, capsys):
    model = build()
    checkpoint = weights.save_npz(model, tmp_path / "tiny.npz")
    out = tmp_path / "out" / "vit.onnx"
    assert cli.main(["export", str(out), "--format", "onnx", "--weights", str(checkpoint),
                     "--parity-images", "2"]) == 0
    printed = capsys.readouterr().out
    assert f"ONNX written to {out}: {out.stat().st_size:,} bytes; input images [batch, 16, 16, "
    "3] float32 RGB in [0, 255] (normalised in the graph), output logits [batch, 3]" in printed
    assert "preprocessing (in its metadata, keras_vit.data_config): resize bilinear, crop_pct " \
        "1.0 (squash) to 16x16, mean [0.5, 0.5, 0.5], std [0.5, 0.5, 0.5]" in printed
    parity = re.search(r"parity with Keras on 2 random images in ONNX Runtime: max \|logit "
                       r"difference\| (\S+), top-1 agreement 100.0%", printed)
    assert parity and float(parity[1]) < 1e-5, printed
    (got,) = session(out).run(["logits"], {"images": pixels(IMAGES)})
    np.testing.assert_allclose(got, logits(model, IMAGES), atol=1e-5)
    # An existing file: refused before the model is loaded; replaced with --overwrite.
    argv = ["export", str(out), "--format", "onnx", "--weights", str(checkpoint)]
    assert cli.main(argv) == 2
    assert "vit.onnx already exists. Nothing was written" in capsys.readouterr().err
    assert cli.main(argv + ["--overwrite"]) == 0


@pytest.mark.parametrize("extra, message", [
    (["--top-k", "3", "--quantize", "dynamic-int8"],
     "--top-k, --quantize does not apply to --format onnx."),
    (["--no-warmup", "--class-names", "x.txt"],
     "--class-names, --no-warmup does not apply to --format onnx."),
    (["--model", "B/16", "--weights", "{missing}"], "nothing.npz"),
])
def test_cli_errors_are_one_line_with_status_2(tmp_path, capsys, extra, message):
    extra = [a.format(missing=tmp_path / "nothing.npz") for a in extra]
    out = tmp_path / "vit.onnx"
    assert cli.main(["export", str(out), "--format", "onnx", *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("keras-vit export: error: ") and message in err
    assert "Traceback" not in err and not os.listdir(tmp_path)


def test_cli_names_the_missing_packages_before_tensorflow_starts(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(cli_export.importlib.util, "find_spec",
                        lambda name, *a: None if name in ("tf2onnx", "onnx") else
                        find_spec(name, *a))
    (tmp_path / "folder").mkdir()
    assert cli.main(["export", str(tmp_path / "vit.onnx"), "--format", "onnx", "--model",
                     "B/16"]) == 2
    assert capsys.readouterr().err == (
        "keras-vit export: error: --format onnx needs tf2onnx, onnx, which are not installed: "
        "pip install 'keras-vit[onnx]'.\n")
    monkeypatch.undo()
    assert cli.main(["export", str(tmp_path / "folder"), "--format", "onnx", "--model",
                     "B/16"]) == 2
    assert "OUTPUT " + str(tmp_path / "folder") + " is a folder; expected a file path for the " \
           "ONNX file." in capsys.readouterr().err


# ------------------------------------------------------------------------------------------
# The benchmark contender and the packaging.


def test_the_onnxruntime_contender_is_registered_for_inference_only():
    sys.path.insert(0, str(ROOT))  # benchmarks/ is not installed: as `python -m benchmarks.run`
    from benchmarks import run
    from benchmarks.contenders import onnxruntime_vit

    contender = run.parse_contender("onnxruntime", "fp32")
    assert contender.modes == ("infer",)
    assert contender.label() == "keras_vit ONNX in ONNX Runtime, default runtime, fp32"
    assert run.FAMILIES["onnxruntime"][0] == onnxruntime_vit.__name__
    assert onnxruntime_vit.PRECISIONS == ("fp32",)
    with pytest.raises(ValueError, match="inference only"):
        onnxruntime_vit.build_training(None, None)


def test_the_onnx_extra_installs_what_the_export_imports():
    import configparser

    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    extras = config["options.extras_require"]
    onnx_extra = [line.split(">")[0] for line in extras["onnx"].split("\n") if line.strip()]
    assert onnx_extra == list(cli_export.ONNX_PACKAGES)
    assert set(extras["onnx"].split()) <= set(extras["test"].split())
