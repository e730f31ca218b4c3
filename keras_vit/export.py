"""Export for deployment: a SavedModel for TF Serving, and a TFLite file.

TensorFlow-specific (SavedModel, tf.image, TFLite), so it lives apart from the model code.

`export_saved_model(model, "exports/vit")` writes `exports/vit/1/`, the numeric version folder
TF Serving watches for, with two signatures:

- `serving_default`: input `image_bytes`, a batch of encoded JPEG, PNG, GIF, BMP or WebP images
  (strings; `{"b64": ...}` over REST). Each image's format and declared size are checked
  (`max_pixels`) before it is decoded (`keras_vit.images.decode_image`, the decoder of
  `keras-vit predict`), resized and cropped to the model resolution and normalised inside the
  graph, on the CPU and outside any XLA cluster, as the model's data config says (its
  checkpoint's interpolation, crop, mean and std: `keras_vit.resolve_data_config`; the paper's
  bilinear resize and [-1, 1] for a model that states none).
- `predict_images`: input `images`, `[B, H, W, 3]` float32 (or uint8, see `image_dtype`) RGB in
  [0, 255] at the model resolution, normalised as the data config says.
- `features`, when asked (`features={...}`, the arguments of `keras_vit.ViT.forward_intermediates`):
  input `images` as `predict_images`; outputs the feature maps of the chosen blocks,
  `block_{i}` (float32, `[B, H/p, W/p, D]` by default), and `block_{i}_prefix` (the class token
  `[B, 1, D]`) with `return_prefix_tokens`. For dense-prediction heads served apart.
- `serving_native_size`, for a model built with `dynamic_image_size=True` only: input
  `image_bytes` as `serving_default`, but each image is classified at its own size rounded to
  the patch grid (scaled down, keeping its aspect ratio, to at most `max_patches` patches)
  instead of being resized to the model resolution.

Both return the same float32 (and int32, string) outputs, whatever the model's dtype policy:

- `probabilities` `[B, K]`: softmax of the logits;
- `top_k_scores` `[B, k]`, `top_k_indices` `[B, k]` (int32), `top_k_labels` `[B, k]` (the class
  names, stored in the export as the asset `assets/labels.txt`, one name a line).

The batch size is dynamic. `assets.extra/keras_vit.json` records what the export was made with
(resolution, classes, `max_pixels`, the signatures, and the data config where the model states
one). With tensorflow-serving-api installed, `assets.extra/tf_serving_warmup_requests` holds
PredictionLog records that TF Serving replays when it loads the model, so that the first real
request does not pay for graph initialisation.
"""

import json
import os
import re

import keras
import numpy as np
import tensorflow as tf

from keras_vit import data_config as data_configs
from keras_vit import images as image_ops
from keras_vit import labels as label_sets
from keras_vit import execution, serving_warmup
from keras_vit.fileio import (
    atomic_write,
    check_not_in_use,
    naming_write_errors,
    refuse_link,
    scratch_dir,
    scratch_folder,
    staging_dir,
)
from keras_vit.checks import check_choice, check_int
from keras_vit.introspection import rebuilt
from keras_vit.model_parts import vit_config
from keras_vit.layer_config import sublayers
from keras_vit.layers import TokenPooling
from keras_vit.intermediates import options as intermediates_options
from keras_vit.model import ViT
from keras_vit.positions import model_image_size, patch_grid
from keras_vit.preprocessing import IMAGE_CHANNELS
from keras_vit.weights.keymap import check_finite_weights

SERVING_SIGNATURE = "serving_default"
IMAGES_SIGNATURE = "predict_images"
NATIVE_SIZE_SIGNATURE = "serving_native_size"
FEATURES_SIGNATURE = "features"
# The `forward_intermediates` arguments `export_saved_model(..., features=...)` takes.
FEATURE_ARGUMENTS = ("indices", "norm", "output_fmt", "return_prefix_tokens")
# `serving_native_size` scales images down to at most this many times the model's patches.
MAX_PATCHES_FACTOR = 4
BYTES_INPUT = "image_bytes"
IMAGES_INPUT = "images"
LABELS_ASSET = "labels.txt"
DEFAULT_TOP_K = 5
IMAGE_DTYPES = ("float32", "uint8")
# Written beside the signatures: what the export was made with (labels, limits).
METADATA_FILE = os.path.join("assets.extra", "keras_vit.json")
# What a version folder of an export holds: the SavedModel and the files beside it (paths
# relative to the folder, as regular expressions).
EXPORT_FILES = re.compile(
    r"saved_model\.pb|fingerprint\.pb|variables/variables\.(index|data-\d+-of-\d+)|"
    r"assets/labels\.txt|assets\.extra/(keras_vit\.json|tf_serving_warmup_requests)")
# The precisions the exported signatures may compute in (their policies:
# `keras_vit.execution.PRECISIONS`).
PRECISIONS = ("float32", "bfloat16")


# --------------------------------------------------------------------------------------------
# Checks.


def check_model(model):
    """Returns `(height, width, num_classes)` of a built image classifier, or raises ValueError.

    The model must map float images `[B, H, W, 3]` (scaled to [-1, 1], as `keras_vit` models
    expect) to logits `[B, K]`, with H and W known.
    """
    if not isinstance(model, keras.Model):
        raise TypeError(
            f"Expected a keras.Model (e.g. keras_vit.ViT_B16()). Received: {type(model).__name__}"
        )
    if not model.built or not getattr(model, "inputs", None):
        raise ValueError(
            f"Model {model.name!r} is not built: it has no input shape to export. Build it with "
            "an image size (keras_vit builders always do) or call it once on a batch "
            "[B, height, width, 3]."
        )
    check_finite_weights(model, f"Exporting {model.name!r}")
    if len(model.inputs) != 1 or len(model.outputs) != 1:
        raise ValueError(
            f"Expected a model with one image input and one logits output. Received "
            f"{len(model.inputs)} inputs and {len(model.outputs)} outputs."
        )
    input_shape = tuple(model.inputs[0].shape)
    if len(input_shape) != 4 or input_shape[-1] != IMAGE_CHANNELS:
        raise ValueError(
            f"Expected a model input [batch, height, width, 3]. Received input shape "
            f"{input_shape}"
        )
    if None in input_shape[1:3] and not native_grid(model):
        raise ValueError(
            f"Expected a model input [batch, height, width, 3] with a known height and width, "
            "or a keras_vit model built with dynamic_image_size=True. Received input shape "
            f"{input_shape}"
        )
    height, width = model_image_size(model)
    output_shape = tuple(model.outputs[0].shape)
    if len(output_shape) != 2 or output_shape[-1] is None:
        raise ValueError(
            f"Expected a model output of logits [batch, num_classes] (include_top=True). "
            f"Received output shape {output_shape}"
        )
    last = model.layers[-1]
    if isinstance(last, TokenPooling) or last.name == "pre_logits":
        raise ValueError(
            f"Model {model.name!r} ends with its {last.name!r} layer: it returns the "
            f"representation {output_shape} (include_top=False), not class logits. Expected a "
            "model with a classification head."
        )
    return height, width, output_shape[1]


def native_grid(model):
    """For a keras_vit model of any input size: (pixels per patch as (rows, cols), the base
    number of patches); else None."""
    names = {layer.name for layer in model.layers}
    if model.inputs[0].shape[1] is not None or "embedding" not in names:
        return None  # a fixed size, or not a keras_vit model
    grid = patch_grid(model)
    if grid is None:
        return None
    height, width = model_image_size(model)
    return (height // grid[0], width // grid[1]), grid[0] * grid[1]


def check_float32(model, exporter):
    """Raises ValueError if a layer of `model` computes in another dtype than float32 (a mixed
    or half-precision policy), which `exporter` (e.g. "the TFLite converter") cannot convert.
    int8-quantized layers compute in float32."""
    nested = (sub for top in model.layers for sub in sublayers(top))
    for layer in (model, *model.layers, *nested):
        if layer.compute_dtype != "float32":
            raise ValueError(
                f"Model {model.name!r} computes in {layer.compute_dtype} (layer "
                f"{layer.name!r}, dtype policy {layer.dtype_policy.name!r}): {exporter} takes "
                "float32 models only. Expected a float32 model: build it under the float32 "
                "policy, or export keras_vit.export.at_precision(model, 'float32') (the same "
                "weights in float32).")


def check_tensorflow_backend(what):
    if keras.backend.backend() != "tensorflow":
        raise ValueError(
            f"{what} needs the TensorFlow backend (KERAS_BACKEND=tensorflow). Received backend "
            f"{keras.backend.backend()!r}."
        )


def at_precision(model, precision):
    """`model` computing in `precision`: the model itself where it does already (or for
    None), else its twin built by `keras_vit.ViT` under that precision's Keras policy with
    the same weights ("bfloat16": `mixed_bfloat16`, float32 weights and logits, bfloat16
    computation).

    Raises:
        ValueError: for a model `keras_vit.ViT` did not build, or an int8-quantized one.
    """
    if precision is None:
        return model
    policy = execution.policy_name(precision, PRECISIONS)
    try:
        vit_config(model)
    except ValueError as e:
        raise ValueError(f"precision={precision!r} builds the model again in that precision, "
                         f"which needs a keras_vit model: {e}") from None
    if _policy_name(model) == policy:
        return model
    if has_quantized_layers(model):
        raise ValueError("precision= changes a float model's precision; this model is "
                         "int8-quantized. Expected a float model (quantize after).")
    return rebuilt(model, policy)


def has_quantized_layers(model):
    """Whether `model` has quantized layers (`model.quantize("int8")`)."""
    return any(sub.quantization_mode for layer in model.layers
               for sub in (layer, *sublayers(layer)))


def _policy_name(model):
    """The dtype policy a model computes in: a keras_vit model's layers' (a functional model
    keeps the policy of the moment it was built), else the model's."""
    names = {layer.name for layer in model.layers}
    layer = model.get_layer("embedding") if "embedding" in names else model
    return layer.dtype_policy.name


# --------------------------------------------------------------------------------------------
# The serving graph.


def _forward(model, jit_compile, data_config):
    """images `[B, H, W, 3]` in [0, 255] -> logits `[B, K]`, float32 whatever the policy."""

    def forward(images):
        inputs = image_ops.normalize(images, data_config)
        return tf.cast(model(inputs, training=False), tf.float32)

    return tf.function(forward, jit_compile=True) if jit_compile else forward


def _classify(model, images, labels, top_k, jit_compile, data_config):
    """The outputs of the signatures from float images `[B, H, W, 3]` in [0, 255]."""
    return _outputs(_forward(model, jit_compile, data_config)(images), labels, top_k)


def _outputs(logits, labels, top_k):
    """The signatures' outputs from logits `[B, K]`."""
    probabilities = tf.nn.softmax(logits, axis=-1)  # [B, K]
    scores, indices = tf.math.top_k(probabilities, k=top_k)  # [B, k] each
    return {
        "probabilities": probabilities,
        "top_k_scores": scores,
        "top_k_indices": indices,
        "top_k_labels": labels.lookup(tf.cast(indices, tf.int64)),  # [B, k] strings
    }


def _checked_pixels(images, floating):
    """`images` `[B, H, W, 3]` as float32; float ones (`floating`) once every value is finite
    and in [0, 255] and no image lies all in (0, 1] (scaled to [0, 1]), as `preprocess_inputs`
    checks them; else the request fails with an InvalidArgumentError saying so, the batch as a
    whole, as `serving_default` fails for an undecodable file."""
    images = tf.cast(images, tf.float32)
    if not floating:
        return images
    empty = tf.equal(tf.size(images), 0)
    brightest = tf.reduce_max(images, axis=[1, 2, 3])  # [B]: each image's own
    least, most = tf.reduce_min(images), tf.reduce_max(brightest)
    valid = tf.reduce_all(tf.math.is_finite(images)) & (least >= 0.0) & (most <= 255.0)
    scaled = (brightest > 0.0) & (brightest <= 1.0)
    # The first such image (an index past the batch where none is: an empty batch too).
    first = tf.argmax(tf.concat([tf.cast(scaled, tf.int32), [1]], axis=0))
    checks = [
        tf.debugging.Assert(
            empty | valid, [f"{IMAGES_INPUT} must be RGB pixels in [0, 255]. Received values "
                            "from", least, "to", most]),
        tf.debugging.Assert(
            ~tf.reduce_any(scaled),
            [f"{IMAGES_INPUT}: image", first, "holds values up to",
             tf.gather(tf.concat([brightest, [0.0]], axis=0), first),
             ": scaled to [0, 1], not [0, 255]. Expected pixels in [0, 255] (multiply them by "
             "255)."]),
    ]
    with tf.control_dependencies(checks):
        return tf.identity(images)


def _decode_images(image_bytes, data_config, max_pixels):
    """Decodes a batch of encoded images `[B]` to float32 RGB `[B, H, W, 3]` in [0, 255].

    `keras_vit.images.decode_image` for each (JPEG, PNG, GIF, BMP or WebP, at most
    `max_pixels`, checked from the header before decoding), then the data config's resize and
    crop (`keras_vit.images.resize_crop`); on the CPU. A bad image fails the request with an
    InvalidArgumentError that says why; the server stays up.
    """
    size = data_configs.config_image_size(data_config)

    def decode(data):
        image = image_ops.decode_image(data, max_pixels, name=BYTES_INPUT)
        return image_ops.resize_crop(tf.cast(image, tf.float32), data_config)  # [H, W, 3]

    with tf.device("/CPU:0"):
        return tf.map_fn(
            decode,
            image_bytes,
            fn_output_signature=tf.TensorSpec((*size, IMAGE_CHANNELS), tf.float32),
        )


def native_size(height, width, patch_pixels, max_patches):
    """The size an image of height x width is classified at by `serving_native_size`: each
    side rounded to the nearest multiple of the patch (halves up; at least one patch), then,
    above `max_patches` patches, scaled down keeping the aspect ratio. Scalar tensors or
    ints."""
    rows = tf.maximum(tf.floor(tf.cast(height, tf.float64) / patch_pixels[0] + 0.5), 1.0)
    cols = tf.maximum(tf.floor(tf.cast(width, tf.float64) / patch_pixels[1] + 0.5), 1.0)
    shrink = tf.minimum(tf.constant(1.0, tf.float64),
                        tf.sqrt(tf.constant(max_patches, tf.float64) / (rows * cols)))
    rows = tf.maximum(tf.floor(rows * shrink), 1.0)
    cols = tf.maximum(tf.floor(cols * shrink), 1.0)
    return (tf.cast(rows, tf.int32) * patch_pixels[0], tf.cast(cols, tf.int32) * patch_pixels[1])


def _classify_native(model, image_bytes, labels, top_k, max_pixels, max_patches, data_config):
    """`serving_native_size`: each image decoded and classified at its own size (on the CPU:
    one forward pass per image, as the sizes differ), normalised as `data_config` says."""
    patch_pixels, _ = native_grid(model)
    forward = _forward(model, jit_compile=False, data_config=data_config)
    num_classes = model.outputs[0].shape[-1]

    def classify(data):
        image = image_ops.decode_image(data, max_pixels, name=BYTES_INPUT)  # [h, w, 3]
        shape = tf.shape(image)
        size = native_size(shape[0], shape[1], patch_pixels, max_patches)
        return forward(image_ops.resize(image, size)[None])[0]  # [K]

    logits = tf.map_fn(classify, image_bytes,
                       fn_output_signature=tf.TensorSpec((num_classes,), tf.float32))
    return _outputs(logits, labels, top_k)


def _labels_table(labels_path, num_classes):
    initializer = tf.lookup.TextFileInitializer(
        labels_path,
        key_dtype=tf.int64,
        key_index=tf.lookup.TextFileIndex.LINE_NUMBER,
        value_dtype=tf.string,
        value_index=tf.lookup.TextFileIndex.WHOLE_LINE,
        vocab_size=num_classes,
    )
    return tf.lookup.StaticHashTable(initializer, default_value="")


def _features(model, features):
    """`(backbone, options)` for `export_saved_model(..., features=...)`: the model of the
    feature maps `features` asks for (a keras_vit model's `intermediates_model`) and its
    checked arguments; `(None, None)` for None."""
    if features is None:
        return None, None
    if not isinstance(features, dict):
        raise ValueError("`features` must be None or a dict of forward_intermediates "
                         f"arguments (some of {', '.join(FEATURE_ARGUMENTS)}). Received: "
                         f"features={features!r}")
    unknown = sorted(set(features) - set(FEATURE_ARGUMENTS))
    if unknown:
        raise ValueError(f"`features` has unknown keys {unknown}. Expected some of "
                         f"{', '.join(FEATURE_ARGUMENTS)}.")
    try:
        vit = model if isinstance(model, ViT) else rebuilt(model)
    except ValueError as e:
        raise ValueError(f"`features` exports the blocks of a keras_vit model: {e}") from None
    options = intermediates_options(vit.vit_arguments()["num_layers"], **features,
                                    intermediates_only=True)
    return vit.intermediates_model(**dict(features, intermediates_only=True)), options


def _feature_outputs(backbone, options, inputs):
    """The `features` signature's outputs: `block_{i}` (and `block_{i}_prefix`), float32."""
    maps = backbone(inputs, training=False)
    if len(options["indices"]) == 1:  # a functional model's one output comes unwrapped
        maps = [maps]
    outputs = {}
    for index, out in zip(options["indices"], maps):
        if options["return_prefix_tokens"]:
            out, outputs[f"block_{index}_prefix"] = out[0], tf.cast(out[1], tf.float32)
        outputs[f"block_{index}"] = tf.cast(out, tf.float32)
    return outputs


def _write_saved_model(model, path, labels_path, top_k, image_dtype, jit_compile, max_pixels,
                       max_patches, data_config, stage, features=(None, None)):
    """Traces the signatures (`stage` is told before) and writes them to `path`."""
    stage(f"tracing the signatures ({'XLA' if jit_compile else 'graph runtime'})")
    height, width, num_classes = check_model(model)
    labels = _labels_table(labels_path, num_classes)
    archive = keras.export.ExportArchive()
    # The endpoints capture the model's variables by themselves. `archive.track(model)` would
    # store every weight a second time (keras-team/keras#23553: twice the size on disk and in
    # TF Serving's memory); the table is tracked here since a function captures no resource.
    archive.track(labels)

    def serve_bytes(image_bytes):
        images = _decode_images(image_bytes, data_config, max_pixels)
        return _classify(model, images, labels, top_k, jit_compile, data_config)

    floating = tf.as_dtype(image_dtype).is_floating

    def serve_images(images):
        # A signature does not hold its callers to its shape: another one (rank 3, another
        # size, an empty image) is refused here, before it reaches the model's kernels.
        images = tf.ensure_shape(images, [None, height, width, IMAGE_CHANNELS])
        return _classify(model, _checked_pixels(images, floating), labels, top_k, jit_compile,
                         data_config)

    archive.add_endpoint(
        SERVING_SIGNATURE, serve_bytes, [tf.TensorSpec([None], tf.string, name=BYTES_INPUT)]
    )
    archive.add_endpoint(
        IMAGES_SIGNATURE,
        serve_images,
        [tf.TensorSpec([None, height, width, IMAGE_CHANNELS], image_dtype, name=IMAGES_INPUT)],
    )
    backbone, options = features
    if backbone is not None:

        def feature_maps(pixels):
            return _feature_outputs(backbone, options, image_ops.normalize(pixels, data_config))

        if jit_compile:
            feature_maps = tf.function(feature_maps, jit_compile=True)

        def serve_features(images):
            images = tf.ensure_shape(images, [None, height, width, IMAGE_CHANNELS])
            return feature_maps(_checked_pixels(images, floating))

        archive.add_endpoint(
            FEATURES_SIGNATURE, serve_features,
            [tf.TensorSpec([None, height, width, IMAGE_CHANNELS], image_dtype,
                           name=IMAGES_INPUT)])
    if max_patches:

        def serve_native(image_bytes):
            return _classify_native(model, image_bytes, labels, top_k, max_pixels, max_patches,
                                    data_config)

        archive.add_endpoint(NATIVE_SIZE_SIGNATURE, serve_native,
                             [tf.TensorSpec([None], tf.string, name=BYTES_INPUT)])
    stage("writing the SavedModel")
    archive.write_out(path, verbose=False)


# --------------------------------------------------------------------------------------------
# Publishing a version folder.


def _version_dir(export_dir, version, overwrite):
    """The final `export_dir/<version>` path: nothing or an empty folder, or (with `overwrite`)
    an export keras_vit wrote and nothing else; any other folder is refused, never replaced."""
    path = os.path.join(os.fspath(export_dir), str(version))
    for where in (os.fspath(export_dir), path):
        refuse_link(where)
        if os.path.exists(where) and not os.path.isdir(where):
            raise ValueError(f"{where} is a file. Expected a folder (or nothing) there.")
    check_not_in_use(export_dir)
    held = sorted(os.listdir(path)) if os.path.isdir(path) else []
    if not held:
        return path
    if not os.path.isfile(os.path.join(path, METADATA_FILE)):
        raise ValueError(
            f"The version folder {path} holds files keras_vit did not write; it is never "
            "replaced. Nothing was written; expected a new or empty version folder, or "
            "choose another version."
        )
    others = [name for name in _files_under(path) if not EXPORT_FILES.fullmatch(name)]
    if others:
        listed = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5
                                          else "")
        raise ValueError(
            f"The version folder {path} holds an export keras_vit wrote and files it did not "
            f"write ({listed}); it is never replaced. Nothing was written; expected the "
            "export alone, or choose another version."
        )
    if not overwrite:
        raise ValueError(
            f"The version folder {path} already holds an export. Pass overwrite=True "
            "(--overwrite) to replace it, or choose another version."
        )
    return path


def _files_under(folder):
    """The paths of the files and links under `folder`, relative to it (with "/")."""
    found = []
    for root, folders, files in os.walk(folder):
        relative = os.path.relpath(root, folder)
        for name in files + [f for f in folders if os.path.islink(os.path.join(root, f))]:
            found.append(name if relative == "." else f"{relative}/{name}".replace(os.sep, "/"))
    return sorted(found)


def export_saved_model(
    model,
    export_dir,
    version=1,
    class_names=None,
    top_k=DEFAULT_TOP_K,
    image_dtype="float32",
    overwrite=False,
    warmup="auto",
    jit_compile=None,
    max_pixels=image_ops.DEFAULT_MAX_PIXELS,
    max_patches="auto",
    precision=None,
    data_config=None,
    progress=None,
    features=None,
):
    """Exports a classifier as a SavedModel that TF Serving serves as is.

    Writes `export_dir/<version>/` (see the module docstring for the signatures). The export is
    built in a hidden folder beside it and renamed into place once complete, so a failure never
    leaves a partial export under the version's name.

    Args:
        model: keras.Model. A built model from images `[B, H, W, 3]` in [-1, 1] to logits
            `[B, K]`, such as any `keras_vit` classifier (mixed precision included).
        export_dir: str or path. The model's base folder, the one TF Serving's `--model_base_path`
            points to.
        version: int >= 0. The version folder's name. Defaults to 1.
        class_names: list of str or None. K names, or None for the shipped ImageNet names
            (1000 or 21843 classes) or "0" ... "K-1". Returned by `top_k_labels`. Defaults to None.
        top_k: int. How many classes `top_k_*` return (at most K). Defaults to 5.
        image_dtype: "float32" or "uint8". The dtype of `predict_images`' input (uint8 is four
            times smaller on the wire). Defaults to "float32".
        overwrite: bool. Replace the export keras_vit wrote in the version folder. A version
            folder holding anything else (files of another tool, or yours beside the export)
            is never replaced. Defaults to False.
        warmup: "auto", True or False. Write `assets.extra/tf_serving_warmup_requests` (TF
            Serving's PredictionLog records, which need tensorflow-serving-api: `pip install
            keras-vit[serving]`); "auto" writes them when that package is installed. Defaults
            to "auto".
        jit_compile: bool or None. Compile the model's forward pass with XLA (the image
            decoding stays outside the compiled function, on the CPU); None takes the measured
            default for this machine's device and the served precision
            (`keras_vit.execution.choose`), recorded in `assets.extra/keras_vit.json`.
            Defaults to None.
        max_pixels: int or None. `serving_default` refuses images whose header declares more
            pixels, before decoding them (recorded in `assets.extra/keras_vit.json`). Defaults
            to `keras_vit.images.DEFAULT_MAX_PIXELS`.
        max_patches: "auto" or int. For a model built with `dynamic_image_size=True`: the
            most patches `serving_native_size` classifies an image with (larger images are
            scaled down); "auto" is 4 times the model's own. Refused for other models.
            Defaults to "auto".
        precision: None, "float32" or "bfloat16". What the signatures compute in: None keeps
            the model's own policy; "bfloat16" serves the model's twin under `mixed_bfloat16`
            (float32 weights, bfloat16 products, float32 LayerNorm statistics, softmax and
            logits); the outputs are float32 either way. A keras_vit model only. Defaults to
            None.
        data_config: None, or a data config (anything `keras_vit.resolve_data_config` takes):
            the resize, crop and normalisation inside the signatures, at the model's
            resolution (recorded in `assets.extra/keras_vit.json` where it is stated, by this
            argument or by the model: absent there, the paper's). None: the model's own (its
            checkpoint's, for a model from `keras_vit.from_pretrained`). Defaults to None.
        progress: callable or None. Called with a few words as each stage starts (tracing
            the signatures, writing the version folder), for a progress display such as the
            command line's. Defaults to None.
        features: None, or a dict of `keras_vit.ViT.forward_intermediates` arguments
            (`indices`, `norm`, `output_fmt`, `return_prefix_tokens`): adds the signature
            `features`, the chosen blocks' feature maps of `predict_images`' input (a keras_vit
            model only). Recorded in `assets.extra/keras_vit.json`. Defaults to None.

    Returns:
        str: the version folder.

    Raises:
        ValueError: for an unbuilt or non-classifier model, class names that do not fit it, a
            bad argument, or a non-empty version folder without `overwrite`.
        TypeError: if `model` is not a `keras.Model`.
        ImportError: with `warmup=True` and tensorflow-serving-api not installed.
        keras_vit.fileio.WriteError: naming the version folder, if it cannot be written (a
            full disk); nothing is left of the new export.

    Examples:
    >>> model = keras_vit.ViT_B16(num_classes=3)  # doctest: +SKIP
    >>> export_saved_model(model, "/tmp/vit", class_names=["cat", "dog", "bird"])  # doctest: +SKIP
    '/tmp/vit/1'
    """
    check_tensorflow_backend("export_saved_model")
    height, width, num_classes = check_model(model)
    data_config = data_configs.resolve_data_config(
        model if data_config is None else data_config, (height, width))
    model = at_precision(model, precision)
    if jit_compile is None:
        jit_compile, why = execution.choose(_policy_name(model))
    else:
        why = f"asked for (jit_compile={jit_compile})"
    class_names = label_sets.check_class_names(class_names, num_classes)
    version = check_int("version", version, 0)
    top_k = min(check_int("top_k", top_k, 1), num_classes)
    check_choice("image_dtype", image_dtype, IMAGE_DTYPES)
    if not (warmup == "auto" or warmup is True or warmup is False):
        raise ValueError(f"`warmup` must be 'auto', True or False. Received: warmup={warmup!r}")
    max_pixels = check_int("max_pixels", max_pixels, 1, allow_none=True)
    native = native_grid(model)
    if max_patches == "auto":
        max_patches = MAX_PATCHES_FACTOR * native[1] if native else None
    elif not native:
        raise ValueError("`max_patches` applies to models of any input size "
                         "(dynamic_image_size=True) only. Received: max_patches="
                         f"{max_patches!r} for a model of input {tuple(model.inputs[0].shape)}.")
    else:
        max_patches = check_int("max_patches", max_patches, 1)
    features = _features(model, features)
    path = _version_dir(export_dir, version, overwrite)
    if warmup == "auto":
        warmup = serving_warmup.protos_available()
    signatures = [(SERVING_SIGNATURE, BYTES_INPUT, None), (IMAGES_SIGNATURE, IMAGES_INPUT,
                                                            image_dtype)]
    if features[0] is not None:
        signatures.append((FEATURES_SIGNATURE, IMAGES_INPUT, image_dtype))
    records = serving_warmup.requests(model.name, height, width, signatures) if warmup else []
    metadata = dict(image_size=[height, width], num_classes=num_classes, top_k=top_k,
                    image_dtype=image_dtype, max_pixels=max_pixels, max_patches=max_patches,
                    warmup=bool(records), dtype_policy=_policy_name(model),
                    xla=bool(jit_compile), runtime=why,
                    formats=list(image_ops.FORMATS),
                    signatures=[SERVING_SIGNATURE, IMAGES_SIGNATURE]
                    + ([NATIVE_SIZE_SIGNATURE] if max_patches else [])
                    + ([FEATURES_SIGNATURE] if features[0] is not None else []),
                    data_config=data_config,
                    **({"features": features[1]} if features[0] is not None else {}))

    stage = progress or (lambda text: None)
    with staging_dir(path) as staging, scratch_dir() as scratch:
        labels_path = os.path.join(scratch, LABELS_ASSET)
        with naming_write_errors(scratch_folder()), open(labels_path, "w", encoding="utf-8") as f:
            f.write("".join(name + "\n" for name in class_names))
        _write_saved_model(model, staging, labels_path, top_k, image_dtype, jit_compile,
                           max_pixels, max_patches, data_config, stage, features)
        if records:
            serving_warmup.write(os.path.join(staging, serving_warmup.WARMUP_FILE), records)
        atomic_write(os.path.join(staging, METADATA_FILE),
                     lambda f: f.write(json.dumps(metadata, indent=1).encode()))
        _version_dir(export_dir, version, overwrite)  # still free (or overwritable) now
    return path


def read_metadata(path):
    """What a SavedModel of `export_saved_model` was made with: its `assets.extra/keras_vit.json`
    (resolution, classes, dtype policy, XLA and why, the signatures) as a dict.

    Args:
        path: str or path. The version folder `export_saved_model` returned.

    Raises:
        ValueError: if the folder holds no such file, or the file is not a JSON object.
    """
    file = os.path.join(os.fspath(path), METADATA_FILE)
    try:
        with open(file, encoding="utf-8") as f:
            metadata = json.load(f)
    except FileNotFoundError:
        raise ValueError(f"{file} does not exist. Expected the version folder of a keras_vit "
                         "SavedModel export.") from None
    except (OSError, ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        reason = "nested too deeply" if isinstance(e, RecursionError) else e
        raise ValueError(f"{file} is not readable JSON ({reason}).") from None
    if not isinstance(metadata, dict):
        raise ValueError(f"{file} is not a JSON object.")
    return metadata


def output_parity(path, model, got, expected, outputs, file_format):
    """How the outputs an exported file gave agree with the Keras model's on the same images:
    the comparison of `keras_vit.tflite.tflite_parity` and `keras_vit.onnx_export.onnx_parity`.

    Args:
        path: str or path. The exported file, for the message.
        model: the Keras model it was exported from, for the message.
        got: `[B, K]`, the file's outputs.
        expected: `[B, K']`, the Keras model's outputs of the same kind.
        outputs: str. What the outputs are ("logits", "probabilities"), for the message.
        file_format: str. The file's format ("ONNX", "TFLite"), for the message.

    Returns:
        dict with `max_abs_diff`, `top1_agreement` (fraction of images with the same top class)
        and `num_images`.

    Raises:
        ValueError: naming the file, if its classes are not the model's (K != K').
    """
    if got.shape != expected.shape:
        raise ValueError(f"{path} gives {got.shape[-1]} {outputs} per image, but model "
                         f"{model.name!r} has {expected.shape[-1]} classes. Expected the "
                         f"{file_format} file exported from this model.")
    return {
        "max_abs_diff": float(np.abs(got - expected).max()),
        "top1_agreement": float(np.mean(got.argmax(-1) == expected.argmax(-1))),
        "num_images": len(got),
    }
