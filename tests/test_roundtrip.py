"""Every format keras_vit writes reads back with the same outputs, for every kind of model.

One table: the writers (`.npz`, `.safetensors`, `.keras`, `.weights.h5`, a TF Serving
SavedModel, TFLite) by the kinds of model (plain, hybrid, each position embedding, any input
size, scanned, int8-quantized). Each pair either reads back to the model's outputs, or the
writer refuses the model before writing anything and says why."""

import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_vit
from keras_vit import export, images, tflite, weights
from keras_vit.weights import writers

import tiny_models
from tiny_models import KINDS, TINY

BASE = dict(TINY, hidden_size=16, num_layers=2, mlp_dim=32)
# What a writer cannot hold, and the reason it gives before writing: timm's layout holds no
# ResNet and one learned 1-D position table; TFLite converts no Keras int8 layer.
REFUSALS = {
    ("safetensors", "hybrid"): (keras_vit.CheckpointError, "a hybrid's ResNet"),
    ("safetensors", "learned_2d"): (keras_vit.CheckpointError,
                                    "learned 2-D position embedding"),
    ("safetensors", "sincos_2d"): (keras_vit.CheckpointError, "no learned position embedding"),
    ("safetensors", "no_position"): (keras_vit.CheckpointError,
                                     "no learned position embedding"),
    ("safetensors", "relative"): (keras_vit.CheckpointError, "relative position embeddings"),
    ("tflite", "int8"): (ValueError, "the TFLite converter cannot convert Keras' int8 layers"),
}
IMAGES = np.random.default_rng(1).uniform(0, 255, (3, 16, 16, 3)).astype(np.float32)
OTHER_SIZE = np.random.default_rng(2).uniform(0, 255, (2, 24, 32, 3)).astype(np.float32)


def build(kind, quantize=True, seed=0):
    """The kind's model with random weights (the same for every call with one `seed`); the
    models the files are read into take another seed, so that only the file can give them
    the written model's outputs."""
    return tiny_models.build(BASE, KINDS, kind, seed, std=0.3, quantize=quantize)


def logits(model, batch=IMAGES):
    return keras.ops.convert_to_numpy(model(images.preprocess_inputs(batch)))


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def requantized(model, kind):
    """An int8 model's float weights read back become the int8 model again once quantized."""
    if kind == "int8":
        model.quantize("int8")
    return model


# Each writer: (model, kind, folder) -> a function of images [B, H, W, 3] in [0, 255] giving the
# read-back model's outputs, and whether they are probabilities (else logits).
def via_npz(model, kind, folder):
    path = weights.save_npz(model, folder / "m.npz")
    back = build(kind, quantize=False, seed=1)
    keras_vit.load_pretrained(back, path)
    back = requantized(back, kind)
    return lambda batch: logits(back, batch), False


def via_safetensors(model, kind, folder):
    path = writers.save_safetensors(model, folder / "model.safetensors", ["a", "b", "c"])
    back, info = keras_vit.builders.build_from_checkpoint(path)
    assert info["class_names"] == ["a", "b", "c"]
    timm = json.loads((folder / "config.json").read_text())
    assert (timm["architecture"], timm["model_args"]["embed_dim"], timm["label_names"]) == (
        "vit_base_patch16_224", BASE["hidden_size"], ["a", "b", "c"])
    back = requantized(back, kind)
    return lambda batch: logits(back, batch), False


def via_keras(model, kind, folder):
    model.save(folder / "m.keras")
    back = keras.saving.load_model(folder / "m.keras")
    return lambda batch: logits(back, batch), False


def via_weights_h5(model, kind, folder):
    model.save_weights(folder / "m.weights.h5")
    back = build(kind, seed=1)
    back.load_weights(folder / "m.weights.h5")
    return lambda batch: logits(back, batch), False


def via_saved_model(model, kind, folder):
    path = export.export_saved_model(model, folder / "serving", warmup=False)
    signature = tf.saved_model.load(path).signatures["predict_images"]
    return lambda batch: signature(images=tf.constant(batch))["probabilities"].numpy(), True


def via_tflite(model, kind, folder):
    path = tflite.export_tflite(model, folder / "m.tflite")
    return lambda batch: tflite.run_tflite(path, batch), True


WRITERS = {"npz": via_npz, "safetensors": via_safetensors, "keras": via_keras,
           "weights_h5": via_weights_h5, "saved_model": via_saved_model, "tflite": via_tflite}
# The writers that keep a model of any input size as it is (the exports serve its own size).
KEEP_ANY_SIZE = ("npz", "safetensors", "keras", "weights_h5")


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("writer", list(WRITERS))
def test_every_format_reads_back_every_kind_of_model(tmp_path, writer, kind):
    model = build(kind)
    want = logits(model)
    if (writer, kind) in REFUSALS:
        error, reason = REFUSALS[writer, kind]
        with pytest.raises(error, match=reason):
            WRITERS[writer](model, kind, tmp_path)
        assert os.listdir(tmp_path) == []  # refused before anything was written
        return
    outputs, probabilities = WRITERS[writer](model, kind, tmp_path)
    np.testing.assert_allclose(outputs(IMAGES), softmax(want) if probabilities else want,
                               atol=1e-5)
    if kind == "dynamic" and writer in KEEP_ANY_SIZE:
        np.testing.assert_allclose(outputs(OTHER_SIZE), logits(model, OTHER_SIZE), atol=1e-5)


def test_an_int8_model_written_as_floats_is_its_dequantized_weights():
    model = build("int8")
    params = weights.model_params(model)
    float_params = weights.model_params(build("int8", quantize=False))
    assert not any(key.endswith("kernel_scale") for key in params)
    key = "Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/kernel"
    assert params[key].dtype == np.float32 and params[key].shape == float_params[key].shape
    # Within half a quantization step (max |w| / 127 per output unit) of the float weights.
    step = np.abs(float_params[key]).max(axis=0) / 127
    assert (np.abs(params[key] - float_params[key]) <= step / 2 + 1e-7).all()


def test_convert_writes_safetensors_that_rebuild_the_model_custom_widths_included(
        tmp_path, capsys):
    """The file and its config.json hold everything a rebuild needs: from the file alone (its
    keras_vit metadata), and from timm's config.json alone (what timm and the Hub read)."""
    from safetensors.numpy import load_file, save_file

    import keras_vit_cli as cli

    source = keras_vit.ViT(image_size=16, patch_size=4, hidden_size=64, num_layers=2,
                           num_heads=4, mlp_dim=96, num_classes=5)  # no paper variant's width
    rng = np.random.default_rng(3)
    source.set_weights([rng.normal(0, 0.3, w.shape).astype(w.dtype)
                        for w in source.get_weights()])
    weights.save_npz(source, tmp_path / "source.npz")
    out = tmp_path / "converted" / "model.safetensors"
    assert cli.main(["convert", str(tmp_path / "source.npz"), str(out)]) == 0
    want = logits(source)
    np.testing.assert_allclose(logits(keras_vit.from_pretrained(out)), want, atol=1e-5)
    save_file(load_file(out), str(out))  # the same arrays without keras_vit's metadata
    rebuilt = keras_vit.from_pretrained(out)
    assert keras_vit.vit_config(rebuilt)["num_heads"] == 4
    np.testing.assert_allclose(logits(rebuilt), want, atol=1e-5)
    capsys.readouterr()
