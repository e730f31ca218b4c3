"""ONNX: a classifier as an `.onnx` file for ONNX Runtime (and TensorRT, OpenVINO), written by
Keras' own export (`model.export(path, format="onnx")`, which converts the model's traced
TensorFlow function with tf2onnx).

The graph takes `images`, `[batch, H, W, 3]` float32 RGB in [0, 255] at the model's size, as
the SavedModel's `predict_images` and the TFLite file do, and normalises them inside with the
model's data config (`(x / 255 - mean) / std`, its checkpoint's mean and std), then runs the
Keras model's function; output `logits`, `[batch, K]` float32. With `preprocessing=False` the
graph is the Keras model's function alone, taking images already normalised
(`keras_vit.preprocess_inputs(images, model)`). Either way the file's `metadata_props` say which
(`keras_vit.input`) and hold the data config (`keras_vit.data_config`, JSON with timm's field
names: the resize and crop a deployer applies before the graph). The batch dimension is dynamic
(named `batch`); a model built with `dynamic_image_size=True` keeps its height and width
dynamic too (`height`, `width`), multiples of its patch where the patch convolution reads the
pixels (a hybrid's ResNet stem takes any size): ONNX Runtime refuses others, naming the node
`PARTIAL_PATCH_NODE`. Softmax, top-k and class names are the caller's (the
SavedModel export, `keras_vit.export`, has them in its graph).

The file is checked before it is put in place: ONNX's checker, then ONNX Runtime loads it and
reproduces the Keras logits on random images within `ONNX_TOLERANCE`.

Needs the `onnx` extra (tf2onnx, onnx, onnxruntime): `pip install 'keras-vit[onnx]'`. This
module imports onnx and onnxruntime, so it imports only where they are installed.
"""

import contextlib
import gc
import importlib.util
import json
import logging
import math
import os
import re
import threading
import warnings

import keras
import numpy as np
import onnx
import onnxruntime
import tensorflow as tf
from onnx import helper, numpy_helper

from keras_vit.data_config import resolve_data_config
from keras_vit.export import (check_float32, check_model, check_tensorflow_backend, native_grid,
                              output_parity)
from keras_vit.fileio import atomic_file, check_destination
from keras_vit.preprocessing import IMAGE_CHANNELS, normalization, preprocess_inputs

INPUT_NAME = "images"
OUTPUT_NAME = "logits"
# The names of the graph's symbolic dimensions: the input's batch, height and width.
DIMENSION_NAMES = ("batch", "height", "width")
# ONNX Runtime must reproduce the Keras logits to this tolerance: absolute, or relative to the
# largest logit where that is above 1 (float32 rounding grows with the values).
ONNX_TOLERANCE = 1e-4
# Random images the export compares ONNX Runtime and Keras on before the file is put in place.
CHECK_IMAGES = 4
# An ONNX file is one protobuf message, which holds at most 2 GiB; Keras' export writes no
# external data files.
MAX_FILE_BYTES = 2**31
# The converter Keras' ONNX export imports on the TensorFlow backend (the `onnx` extra, with
# onnx and onnxruntime, which this module imports).
CONVERTER = "tf2onnx"
INSTALL = "pip install 'keras-vit[onnx]'"
# The file's metadata_props: what its input is, and the model's data config (JSON).
INPUT_KEY = "keras_vit.input"
DATA_CONFIG_KEY = "keras_vit.data_config"
PIXELS = "RGB in [0, 255], normalised in the graph with keras_vit.data_config's mean and std"
NORMALISED = "RGB normalised with keras_vit.data_config's mean and std: (x / 255 - mean) / std"
# The name of the node that refuses an image of a model of any input size whose sides are not
# multiples of the patch, before the patch's rows and columns (ONNX Runtime's error names it).
PARTIAL_PATCH_NODE = f"{INPUT_NAME}/height_and_width_must_be_multiples_of_"
# Seconds between the garbage collections during a conversion (see `_collecting_garbage`).
COLLECT_EVERY = 1.0


def check_converter():
    """Raises ImportError, naming the package and the command that installs it, if tf2onnx
    (which Keras' ONNX export imports on the TensorFlow backend) is not installed."""
    if importlib.util.find_spec(CONVERTER) is None:
        missing = ModuleNotFoundError(f"No module named {CONVERTER!r}", name=CONVERTER)
        raise ImportError(f"Keras' ONNX export needs {CONVERTER}, which is not installed: "
                          f"{INSTALL}.") from missing


def check_size(model):
    """Raises ValueError if `model`'s weights do not fit in one ONNX file (2 GiB)."""
    size = sum(math.prod(v.shape) * np.dtype(v.dtype).itemsize for v in model.weights)
    if size >= MAX_FILE_BYTES:
        raise ValueError(
            f"Model {model.name!r} has {size / 2**30:.2f} GiB of weights; an ONNX file is one "
            "protobuf message of at most 2 GiB, and Keras' ONNX export writes no external "
            "data. Expected a model with less than 2 GiB of weights (ViT-L/16 and smaller).")


def export_onnx(model, path, overwrite=False, preprocessing=True):
    """Exports a classifier as an ONNX file, with Keras' own ONNX export, written atomically.

    The graph maps `images` `[batch, H, W, 3]` float32 RGB in [0, 255] to `logits`
    `[batch, K]` float32: the model's normalisation (its data config's mean and std), then the
    Keras model's function. The batch size is dynamic; so are H and W for a model built with
    `dynamic_image_size=True`. The file's `metadata_props` hold the data config
    (`DATA_CONFIG_KEY`) and what the input is (`INPUT_KEY`). Before the file is put in place,
    ONNX Runtime loads it and must reproduce the Keras logits of the model's own
    preprocessing on `CHECK_IMAGES` random images within `ONNX_TOLERANCE` (relative to the
    largest logit where that is above 1).

    Args:
        model: a built float32 classifier (see `keras_vit.export.check_model`): any keras_vit
            model with its head (plain, hybrid, any position embedding or pooling, scanned,
            int8-quantized, of any input size).
        path: str or path of the `.onnx` file.
        overwrite: bool. Replace a file already at `path`. Defaults to False.
        preprocessing: bool. True: the graph takes pixels in [0, 255] and normalises them.
            False: the graph takes images normalised already
            (`keras_vit.preprocess_inputs(images, model)`). Defaults to True.

    Returns:
        str: `path`.

    Raises:
        TypeError: if `model` is not a `keras.Model`.
        ImportError: if tf2onnx is not installed (`pip install 'keras-vit[onnx]'`).
        keras_vit.fileio.DestinationExists: before anything is converted, if `path` exists
            (without `overwrite`) or is a folder.
        ValueError: before anything is written, for a model that is not a classifier, that
            computes in another precision than float32 (a mixed-precision policy), or whose
            weights exceed the 2 GiB an ONNX file holds; or if the converter leaves operations
            ONNX does not define, or ONNX Runtime does not reproduce the Keras logits.
        keras_vit.fileio.WriteError: naming `path`, if it cannot be written; a file already
            at `path` is left as it was.

    Examples:
    >>> keras_vit.export_onnx(model, "vit.onnx")  # doctest: +SKIP
    'vit.onnx'
    """
    check_tensorflow_backend("export_onnx")
    check_converter()
    check_model(model)
    check_float32(model, "Keras' ONNX export")
    check_size(model)
    check_destination(path, overwrite)
    if not isinstance(preprocessing, bool):
        raise ValueError(f"`preprocessing` must be True or False. Received: "
                         f"preprocessing={preprocessing!r:.100}")
    config = resolve_data_config(model)
    spec = tf.TensorSpec([None, *model.inputs[0].shape[1:]], tf.float32, name=INPUT_NAME)
    with atomic_file(path) as scratch:
        with _quiet_converter(), _collecting_garbage():
            model.export(scratch, format="onnx", verbose=False, input_signature=[spec])
        _finish(scratch, config, preprocessing, _pixel_patches(model))
        _check_against_keras(scratch, model, path)
        check_destination(path, overwrite)  # still free (or replaceable) now
    return os.fspath(path)


def _pixel_patches(model):
    """The patch (rows, cols) of a model of any input size whose patch convolution reads the
    pixels, or None: a fixed size, or a hybrid, whose ResNet stem pads any size."""
    grid = native_grid(model)
    if grid is None or "resnet" in {layer.name for layer in model.layers}:
        return None
    return grid[0]


@contextlib.contextmanager
def _quiet_converter():
    """Keeps tf2onnx's log (an error line for each TensorFlow op it leaves unconverted: they
    are found and named in one message afterwards) and Keras' NumPy-2 patch's FutureWarning
    out of the output."""
    logger = logging.getLogger("tf2onnx")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"In the future `np\.object`",
                                    category=FutureWarning)
            yield
    finally:
        logger.setLevel(level)


@contextlib.contextmanager
def _collecting_garbage(every=COLLECT_EVERY):
    """Runs CPython's full garbage collection every `every` seconds while the block runs.

    tf2onnx copies its whole graph, weights included, before each of its optimisation passes
    (`copy.deepcopy` in `tf2onnx.optimizer.optimize_graph`) and drops the copy as a reference
    cycle, which only the cyclic collector frees; with Keras and TensorFlow loaded, CPython
    runs a full collection only once a quarter as many objects as it already holds have
    survived, so the copies pile up and the conversion holds the weights many times over.
    """
    stop = threading.Event()

    def collect():
        while not stop.wait(every):
            gc.collect()

    thread = threading.Thread(target=collect, name="keras_vit-onnx-gc", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _finish(path, config, preprocessing, patch=None):
    """Names the graph's output and symbolic dimensions (tf2onnx calls them `Identity:0` and
    `unk__N`), writes TensorFlow's Erfc as ONNX operators, puts the data config's
    normalisation in front of the graph (`preprocessing`), for a model of any input size whose
    patch convolution reads the pixels (`patch`: `_pixel_patches`) the refusal of sizes that
    are not whole patches, and the config in its metadata, and checks the result with ONNX's
    checker; rewrites the file at `path`.

    Raises:
        ValueError: if operations remain that ONNX does not define.
    """
    proto = onnx.load(path)
    graph = proto.graph
    (image,), (logits,) = graph.input, graph.output
    _rename_tensor(graph, logits.name, OUTPUT_NAME)
    for value, names in ((image, DIMENSION_NAMES), (logits, DIMENSION_NAMES[:1])):
        for dim, name in zip(value.type.tensor_type.shape.dim, names):
            if not dim.HasField("dim_value"):
                dim.dim_param = name
    _replace_erfc(graph)
    if preprocessing:
        _normalise_input(graph, config)
    if patch is not None:
        _refuse_partial_patches(graph, patch)
    for key, value in ((INPUT_KEY, PIXELS if preprocessing else NORMALISED),
                       (DATA_CONFIG_KEY, json.dumps(config))):
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value
    unknown = sorted({node.op_type for node in graph.node
                      if not onnx.defs.has(node.op_type, node.domain)})
    if unknown:
        raise ValueError(
            f"Keras' ONNX export (tf2onnx) cannot convert the TensorFlow operations "
            f"{', '.join(unknown)} of this model: ONNX has no such operators. Nothing was "
            "written.")
    onnx.checker.check_model(proto)
    onnx.save(proto, path)


def _normalise_input(graph, config):
    """Makes the graph's input pixels in [0, 255]: `x / scale + offset` with the data config's
    per-channel `keras_vit.preprocessing.normalization` (the arithmetic of
    `keras_vit.preprocess_inputs`) feeds what the input fed."""
    (image,) = graph.input
    normalised = f"{INPUT_NAME}/normalised"
    _rename_tensor(graph, image.name, normalised, inputs_only=True)
    scale, offset = (np.asarray(v, np.float32) for v in normalization(config))
    graph.initializer.extend([numpy_helper.from_array(scale, f"{INPUT_NAME}/scale"),
                              numpy_helper.from_array(offset, f"{INPUT_NAME}/offset")])
    scaled = f"{INPUT_NAME}/scaled"
    graph.node.insert(0, helper.make_node("Add", [scaled, f"{INPUT_NAME}/offset"],
                                          [normalised], name=f"{INPUT_NAME}/add_offset"))
    graph.node.insert(0, helper.make_node("Div", [image.name, f"{INPUT_NAME}/scale"],
                                          [scaled], name=f"{INPUT_NAME}/divide_by_scale"))


def _refuse_partial_patches(graph, patch):
    """For a graph of any input size: the input reshaped into whole patches `[B, H / rows,
    rows, W / cols, cols, 3]` (integer divisions) and back, which ONNX Runtime refuses, naming
    the node (`PARTIAL_PATCH_NODE` and the patch) and both shapes, for a height or width that
    is not a multiple of the patch: the strided convolution would drop the rows and columns
    left over, where the Keras model refuses such images. ONNX has no assertion operator."""
    (image,) = graph.input
    checked = f"{INPUT_NAME}/whole_patches"
    _rename_tensor(graph, image.name, checked, inputs_only=True)
    prefix = f"{INPUT_NAME}/patches"
    constants = {"rows": [patch[0]], "cols": [patch[1]], "channels": [IMAGE_CHANNELS],
                 "batch_at": [0], "height_at": [1], "width_at": [2]}
    graph.initializer.extend(numpy_helper.from_array(np.asarray(v, np.int64), f"{prefix}/{k}")
                             for k, v in constants.items())

    def name(text):
        return f"{prefix}/{text}"

    nodes = [
        helper.make_node("Shape", [image.name], [name("shape")], name=name("shape")),
        *(helper.make_node("Gather", [name("shape"), name(f"{axis}_at")], [name(axis)],
                           name=name(axis)) for axis in ("batch", "height", "width")),
        helper.make_node("Div", [name("height"), name("rows")], [name("patch_rows")],
                         name=name("patch_rows")),
        helper.make_node("Div", [name("width"), name("cols")], [name("patch_cols")],
                         name=name("patch_cols")),
        helper.make_node("Concat", [name("batch"), name("patch_rows"), name("rows"),
                                    name("patch_cols"), name("cols"), name("channels")],
                         [name("target")], axis=0, name=name("target")),
        helper.make_node("Reshape", [image.name, name("target")], [name("whole")],
                         name=f"{PARTIAL_PATCH_NODE}{patch[0]}x{patch[1]}"),
        helper.make_node("Reshape", [name("whole"), name("shape")], [checked],
                         name=name("back")),
    ]
    for node in reversed(nodes):
        graph.node.insert(0, node)


def file_metadata(path):
    """The `metadata_props` of an ONNX file from `export_onnx`: `{"input": ..., "data_config":
    dict}` (an older file without them: the paper's normalisation, preprocessed input)."""
    props = {entry.key: entry.value for entry in onnx.load(os.fspath(path),
                                                            load_external_data=False).metadata_props}
    config = json.loads(props[DATA_CONFIG_KEY]) if DATA_CONFIG_KEY in props else None
    return dict(input=props.get(INPUT_KEY, NORMALISED), data_config=config)


def _rename_tensor(graph, old, new, inputs_only=False):
    """Renames the tensor `old` to `new` wherever the graph names it (`inputs_only`: where
    nodes read it)."""
    for node in graph.node:
        for names in (node.input,) if inputs_only else (node.input, node.output):
            for i, name in enumerate(names):
                if name == old:
                    names[i] = new
    if inputs_only:
        return
    for value in (*graph.output, *graph.value_info):
        if value.name == old:
            value.name = new


def _replace_erfc(graph):
    """tf2onnx leaves TensorFlow's Erfc (of the exact GELU, `0.5 x erfc(-x / sqrt(2))`) in the
    graph, and ONNX has no Erfc: each becomes `1 - Erf(x)`, in float32."""
    nodes = []
    for node in graph.node:
        if node.op_type != "Erfc" or node.domain:
            nodes.append(node)
            continue
        one, erf = f"{node.name}/one", f"{node.name}/erf"
        graph.initializer.append(numpy_helper.from_array(np.ones((), np.float32), one))
        nodes.append(helper.make_node("Erf", list(node.input), [erf], name=erf))
        nodes.append(helper.make_node("Sub", [one, erf], list(node.output), name=node.name))
    del graph.node[:]
    graph.node.extend(nodes)


def _check_against_keras(file, model, path):
    """Raises ValueError naming `path` if ONNX Runtime, on the written `file`, does not give the
    Keras logits on random images at the model's resolution."""
    height, width, _ = check_model(model)  # of a model of any size: the size it was built for
    images = np.random.default_rng(0).uniform(
        0, 255, (CHECK_IMAGES, height, width, IMAGE_CHANNELS)).astype(np.float32)
    if file_metadata(file)["input"] == NORMALISED:
        images = np.asarray(preprocess_inputs(images, model))
    parity = onnx_parity(file, model, images)
    bound = ONNX_TOLERANCE * max(1.0, parity["max_abs_logit"])
    if not parity["max_abs_diff"] <= bound:
        raise ValueError(
            f"The ONNX graph of model {model.name!r} differs from Keras by "
            f"{parity['max_abs_diff']:.3g} in the logits (more than {bound:.3g}) on "
            f"{CHECK_IMAGES} random images, in ONNX Runtime: Keras' ONNX export (tf2onnx) "
            f"does not convert this model faithfully. Nothing was written to {path}.")


def run_onnx(path, images):
    """Runs a file from `export_onnx` with ONNX Runtime on the CPU.

    Args:
        path: str or path of the `.onnx` file.
        images: float `[B, H, W, 3]`: RGB in [0, 255] (a file with the preprocessing, the
            default), or normalised (`keras_vit.preprocess_inputs`, a file without).

    Returns:
        float32 logits `[B, K]`.

    Raises:
        ValueError: naming the file, if the images are not of the shape it takes.
    """
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3  # errors only: no notes on the graph's optimisation
    session = onnxruntime.InferenceSession(os.fspath(path), options,
                                           providers=["CPUExecutionProvider"])
    images = np.asarray(images, np.float32)
    (image,) = session.get_inputs()
    expected = [d if isinstance(d, int) else None for d in image.shape]
    if images.ndim != len(expected) or any(
            d is not None and d != n for d, n in zip(expected[1:], images.shape[1:])):
        shown = ", ".join("any" if d is None else str(d) for d in expected[1:])
        raise ValueError(f"{path} takes images [batch, {shown}]. Received shape "
                         f"{images.shape}")
    try:
        return session.run(None, {image.name: images})[0]
    except Exception as e:  # noqa: BLE001 - onnxruntime's errors share no public base class
        refused = re.search(re.escape(PARTIAL_PATCH_NODE) + r"(\d+)x(\d+)", str(e))
        if refused is None:
            raise
        raise ValueError(f"{path} takes images whose height and width are multiples of "
                         f"{refused[1]}x{refused[2]} pixels (its patches). Received shape "
                         f"{images.shape}") from None


def onnx_parity(path, model, images):
    """Compares an ONNX file of `model` with the Keras model on images `[B, H, W, 3]`, as the
    file takes them (`file_metadata`): RGB in [0, 255], which the Keras model sees normalised
    with its own data config, or images normalised already.

    Returns:
        dict with `max_abs_diff` (of the logits), `max_abs_logit` (the Keras model's largest
        logit magnitude), `top1_agreement` (fraction of images with the same top class) and
        `num_images`.

    Raises:
        ValueError: naming the file, if its images or its classes are not the model's.
    """
    images = np.asarray(images, np.float32)
    got = run_onnx(path, images)
    if file_metadata(path)["input"] == PIXELS:  # normalised as the model's config says
        images = keras.ops.convert_to_numpy(preprocess_inputs(images, model))
    expected = keras.ops.convert_to_numpy(model(images, training=False)).astype(np.float32)
    parity = output_parity(path, model, got, expected, "logits", "ONNX")
    parity["max_abs_logit"] = float(np.abs(expected).max())  # the scale of ONNX_TOLERANCE
    return parity
