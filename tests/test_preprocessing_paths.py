"""One preprocessing per checkpoint, on every path from pixels: a checkpoint normalised with
ImageNet's mean and std (bicubic, crop 0.875, as DeiT's), loaded from each kind of source,
gives the same answer through each consumer (`classify_images`, `load_image` +
`preprocess_inputs`, `keras-vit predict`, the SavedModel's `serving_default`, TFLite, ONNX).

The reference is independent of keras_vit's image code: timm's evaluation transform written
with PIL (`test_data_config.pil_eval_transform`), then `(x / 255 - mean) / std` in NumPy. The
model's head is scaled so that its outputs are peaked: the paper's preprocessing moves the
log-probabilities by far more than the tolerance (checked), so a path that lost the data config
cannot pass.
"""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_vit
import keras_vit_cli as cli
from keras_vit import data_config as dc
from keras_vit import weights
from keras_vit.weights import config_json, hub

from test_data_config import TINY, pil_eval_transform, smooth_image, write_png

DEIT = dict(input_size=[3, 16, 16], interpolation="bicubic", crop_pct=0.875, crop_mode="center",
            mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
# The log-probabilities of a path may differ from the reference's by this much (PIL resizes in
# 8 bits); the paper's preprocessing differs by more than WRONG (checked on the reference).
TOLERANCE = 0.1
WRONG = 1.0
PHOTO_SIZES = ((30, 41), (45, 28), (16, 16))


def peaked_model():
    """A tiny classifier of 5 classes with random weights and a head scaled by 8."""
    keras.utils.set_random_seed(3)
    model = keras_vit.ViT(**dict(TINY, num_classes=5))
    rng = np.random.default_rng(3)
    model.set_weights([rng.normal(0, 0.5, w.shape).astype(w.dtype)
                       for w in model.get_weights()])
    head = model.get_layer("head")
    head.kernel.assign(head.kernel * 8.0)
    return model


def log_softmax(logits):
    logits = np.asarray(logits, np.float64)
    return logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(
        -1, keepdims=True)) - logits.max(-1, keepdims=True)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The checkpoint in every source kind, its photos, and the reference log-probabilities."""
    root = tmp_path_factory.mktemp("paths")
    model = peaked_model()
    (root / "npz").mkdir()
    weights.save_npz(model, root / "npz" / "model.npz")
    (root / "npz" / "config.json").write_text(json.dumps(config_json.keras_vit_document(
        keras_vit.vit_config(model), None, DEIT)))
    loaded = keras_vit.from_pretrained(root / "npz" / "model.npz")
    hub.save_safetensors(loaded, root / "st" / "model.safetensors")
    loaded.save(root / "model.keras")
    photos = [write_png(root / f"{i}.png", smooth_image(h, w, seed=i))
              for i, (h, w) in enumerate(PHOTO_SIZES)]
    pixels = [np.asarray(tf.io.decode_png(tf.io.read_file(str(p)))) for p in photos]

    def reference(config):
        inputs = np.stack([(pil_eval_transform(p, config) / 255 - config["mean"])
                           / config["std"] for p in pixels]).astype(np.float32)
        return log_softmax(keras.ops.convert_to_numpy(model(inputs)))

    want = reference(DEIT)
    paper = reference(dc.paper_data_config(16))
    assert np.abs(want - paper).max() > WRONG  # peaked enough to expose a wrong config
    sources = {"npz": root / "npz" / "model.npz", "safetensors": root / "st" / "model.safetensors",
               "keras": root / "model.keras"}
    return dict(root=root, model=loaded, photos=photos, pixels=pixels, want=want,
                sources=sources)


def assert_answer(got, want):
    """Same top-5 order and log-probabilities within TOLERANCE."""
    got = np.asarray(got, np.float64)
    assert np.abs(got - want).max() < TOLERANCE, np.abs(got - want).max()
    np.testing.assert_array_equal(np.argsort(-got, -1), np.argsort(-want, -1))


def load(source):
    if str(source).endswith(".keras"):
        return keras.saving.load_model(source)
    return keras_vit.from_pretrained(source)


@pytest.mark.parametrize("kind", ["npz", "safetensors", "keras"])
def test_every_source_gives_the_model_the_checkpoints_data_config(world, kind):
    source = world["sources"][kind]
    model = load(source)
    assert model.data_config == dc.check_data_config(DEIT)
    if kind != "keras":
        assert keras_vit.resolve_data_config(source) == dc.check_data_config(DEIT)
    # classify_images: from paths, and from arrays of any size.
    for given in (world["photos"], world["pixels"]):
        top = keras_vit.classify_images(model, given, top=5)
        got = np.full_like(world["want"], -np.inf)
        for i, classes in enumerate(top):
            for class_id, _, probability in classes:
                got[i, int(class_id)] = np.log(probability)
        assert_answer(got, world["want"])
    # The documented two-step recipe.
    batch = np.stack([keras_vit.load_image(p, data_config=model) for p in world["photos"]])
    logits = model(keras_vit.preprocess_inputs(batch, model))
    assert_answer(log_softmax(keras.ops.convert_to_numpy(logits)), world["want"])


def test_the_command_line_predicts_as_the_checkpoint_says(world, capsys):
    for path, want in zip(world["photos"], world["want"]):
        assert cli.main(["predict", str(path), "--weights", str(world["sources"]["npz"]),
                         "--top-k", "5"]) == 0
        shown = [float(line.split("%")[0]) / 100 for line in
                 capsys.readouterr().out.splitlines() if "%" in line]
        shown, expected = np.array(shown), np.exp(np.sort(want)[::-1])
        seen = shown >= 0.01  # printed with two decimals in percent
        np.testing.assert_allclose(np.log(shown[seen]), np.log(expected[seen]), atol=TOLERANCE)
        np.testing.assert_allclose(shown, expected, atol=1e-3)


def test_the_saved_model_serves_as_the_checkpoint_says(world):
    from keras_vit import export

    path = export.export_saved_model(world["model"], world["root"] / "export", warmup=False,
                                     jit_compile=False)
    assert export.read_metadata(path)["data_config"] == dc.check_data_config(DEIT)
    serve = tf.saved_model.load(path).signatures["serving_default"]
    encoded = [p.read_bytes() for p in world["photos"]]
    got = serve(image_bytes=tf.constant(encoded))["probabilities"].numpy()
    assert_answer(np.log(got), world["want"])


def test_tflite_normalises_as_the_checkpoint_says(world):
    from keras_vit import tflite

    path = tflite.export_tflite(world["model"], world["root"] / "m.tflite")
    batch = np.stack([keras_vit.load_image(p, data_config=world["model"])
                      for p in world["photos"]])
    assert_answer(np.log(tflite.run_tflite(path, batch)), world["want"])


def test_onnx_normalises_in_its_graph_and_states_its_data_config(world):
    pytest.importorskip("tf2onnx")
    from keras_vit import onnx_export

    model = world["model"]
    batch = np.stack([keras_vit.load_image(p, data_config=model) for p in world["photos"]])
    path = keras_vit.export_onnx(model, world["root"] / "m.onnx")
    stated = onnx_export.file_metadata(path)
    assert stated["data_config"] == dc.check_data_config(DEIT)
    assert "[0, 255]" in stated["input"]
    assert_answer(log_softmax(onnx_export.run_onnx(path, batch)), world["want"])
    # On request, the graph alone: the caller normalises with the metadata's mean and std.
    raw = keras_vit.export_onnx(model, world["root"] / "raw.onnx", preprocessing=False)
    config = onnx_export.file_metadata(raw)["data_config"]
    normalised = (batch / 255 - np.array(config["mean"])) / np.array(config["std"])
    assert_answer(log_softmax(onnx_export.run_onnx(raw, normalised.astype(np.float32))),
                  world["want"])


def test_classify_images_refuses_what_it_cannot_read_in_one_line(world, tmp_path):
    model = world["model"]
    (tmp_path / "bad.png").write_bytes(b"not an image")
    for given, message in ((tmp_path / "missing.png", "missing.png"),
                           (tmp_path / "bad.png", "bad.png"),
                           ([], "got no images"), (7, "Received: int"),
                           (np.zeros((16, 16, 4), np.uint8), r"Received shape \(16, 16, 4\)"),
                           (np.zeros((16, 16, 3), bool), "of bool")):
        with pytest.raises((ValueError, FileNotFoundError), match=message) as raised:
            keras_vit.classify_images(model, given)
        assert "\n" not in str(raised.value)
