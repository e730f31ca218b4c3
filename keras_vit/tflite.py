"""TFLite: a classifier as a `.tflite` file with one signature, from float RGB images in
[0, 255] to probabilities (the SavedModel's `predict_images`, see `keras_vit.export`), its
interpreter run, and its agreement with the Keras model. The file normalises as the model's
data config says (`(x / 255 - mean) / std`, its checkpoint's mean and std); images come at the
model's input size, resized and cropped by the caller (`keras_vit.load_image(path,
data_config=model)`)."""

import contextlib
import os

import keras
import numpy as np
import tensorflow as tf

from keras_vit import images as image_ops
from keras_vit.checks import check_choice
from keras_vit.data_config import resolve_data_config
from keras_vit.export import (
    IMAGES_INPUT,
    SERVING_SIGNATURE,
    check_float32,
    check_tensorflow_backend,
    has_quantized_layers,
    check_model,
    output_parity,
)
from keras_vit.fileio import (
    atomic_write,
    check_destination,
    naming_write_errors,
    scratch_dir,
    scratch_folder,
)
from keras_vit.preprocessing import IMAGE_CHANNELS

TFLITE_QUANTIZATIONS = (None, "dynamic-int8")
# The float32 TFLite file must reproduce the Keras probabilities to this absolute tolerance.
TFLITE_FLOAT_TOLERANCE = 1e-4



@contextlib.contextmanager
def tflite_converter(model):
    """A `tf.lite.TFLiteConverter` for `model`'s `predict_images` signature (float32 RGB
    `images` in [0, 255] to `probabilities`), to set options on and `convert()` inside the
    `with` block (it reads a temporary SavedModel that the block's end removes)."""
    height, width, _ = check_model(model)
    config = resolve_data_config(model, (height, width))  # its checkpoint's mean and std

    def predict(images):
        logits = tf.cast(model(image_ops.normalize(images, config), training=False), tf.float32)
        return {"probabilities": tf.nn.softmax(logits, axis=-1)}

    # Through a SavedModel, as Keras' own LiteRT export does: converting the tf.function
    # directly would leave the Keras variables as uninitialised TFLite resource variables.
    with scratch_dir() as saved_model:
        archive = keras.export.ExportArchive()
        archive.add_endpoint(SERVING_SIGNATURE, predict, [
            tf.TensorSpec([None, height, width, IMAGE_CHANNELS], tf.float32, name=IMAGES_INPUT)
        ])
        with naming_write_errors(scratch_folder()):
            archive.write_out(saved_model, verbose=False)
        yield tf.lite.TFLiteConverter.from_saved_model(
            saved_model, signature_keys=[SERVING_SIGNATURE]
        )


def export_tflite(model, path, quantize=None, overwrite=False):
    """Converts a classifier to a TFLite file, written atomically.

    The file has one signature (`serving_default`) from `images` `[B, H, W, 3]` float32 RGB in
    [0, 255] (B dynamic: resize the input tensor) to `probabilities` `[B, K]`, the same as the
    SavedModel's `predict_images`: normalised inside the file with the model's data config
    (`model.data_config`: its checkpoint's mean and std).

    Args:
        model: a built classifier (see `check_model`).
        path: str or path of the `.tflite` file.
        quantize: None (float32) or "dynamic-int8" (weights stored as int8, dequantised or
            used by hybrid kernels at run time; about 4x smaller). Defaults to None.
        overwrite: bool. Replace a file already at `path`. Defaults to False.

    Returns:
        str: `path`.

    Raises:
        keras_vit.fileio.DestinationExists: before anything is converted, if `path` exists
            (without `overwrite`) or is a folder.
        ValueError: for an int8-quantized model (`model.quantize("int8")`) or one that
            computes in bfloat16 or float16, which the converter cannot convert: export the
            float32 model (`keras_vit.export.at_precision(model, "float32")`), with
            `quantize="dynamic-int8"` for int8 weights.
        keras_vit.fileio.WriteError: naming `path`, if it (or the converter's scratch
            SavedModel) cannot be written; a file already at `path` is left as it was.
    """
    check_tensorflow_backend("export_tflite")
    check_choice("quantize", quantize, TFLITE_QUANTIZATIONS)
    check_destination(path, overwrite)
    check_float32(model, "the TFLite converter")
    if has_quantized_layers(model):
        raise ValueError(
            f"Model {model.name!r} is int8-quantized (model.quantize('int8')): the TFLite "
            "converter cannot convert Keras' int8 layers. Expected the float model; "
            "quantize='dynamic-int8' stores its weights as int8 in the file.")
    with naming_write_errors(path), tflite_converter(model) as converter:  # its scratch too
        if quantize == "dynamic-int8":
            # Optimize.DEFAULT without a representative dataset: dynamic-range quantisation.
            converter.optimizations = [tf.lite.Optimize.DEFAULT]
        data = converter.convert()
    check_destination(path, overwrite)  # still free (or replaceable) now
    atomic_write(path, lambda f: f.write(data))
    return os.fspath(path)


def run_tflite(path, images):
    """Runs a file from `export_tflite` on float images `[B, H, W, 3]` in [0, 255].

    Returns:
        float32 probabilities `[B, K]`.
    """
    images = np.asarray(images, np.float32)
    interpreter = tf.lite.Interpreter(model_path=os.fspath(path))
    (input_detail,) = interpreter.get_input_details()
    expected = tuple(input_detail["shape_signature"][1:])
    if images.ndim != 4 or images.shape[1:] != expected:
        raise ValueError(
            f"{path} expects images [batch, {', '.join(map(str, expected))}]. Received shape "
            f"{images.shape}"
        )
    interpreter.resize_tensor_input(input_detail["index"], images.shape)
    interpreter.allocate_tensors()
    interpreter.set_tensor(input_detail["index"], images)
    interpreter.invoke()
    (output_detail,) = interpreter.get_output_details()
    return interpreter.get_tensor(output_detail["index"])


def tflite_parity(path, model, images):
    """Compares a TFLite file with the Keras model on float images `[B, H, W, 3]` in [0, 255].

    Returns:
        dict with `max_abs_diff` (of the probabilities), `top1_agreement` (fraction of images
        with the same top class) and `num_images`.

    Raises:
        ValueError: naming the file, if its images or its classes are not the model's.
    """
    images = np.asarray(images, np.float32)
    got = run_tflite(path, images)
    logits = np.asarray(model.predict_on_batch(np.asarray(image_ops.preprocess_inputs(
        images, resolve_data_config(model)))), np.float64)
    expected = np.exp(logits - logits.max(-1, keepdims=True))
    expected /= expected.sum(-1, keepdims=True)
    return output_parity(path, model, got, expected, "probabilities", "TFLite")
