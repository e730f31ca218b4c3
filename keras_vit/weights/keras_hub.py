"""keras-hub's ViT presets: a preset folder read into a `keras_vit.ViT`, and what a preset
keras_vit writes holds (`keras_vit.weights.writers.save_keras_hub_preset` writes one that
`keras_hub.models.ImageClassifier.from_preset` loads with its preprocessor).

A preset is the folder keras-hub's `save_to_preset` writes: `config.json` (the `ViTBackbone`),
`model.weights.h5`, `metadata.json`, and for a classifier `task.json` (the
`ViTImageClassifier`: classes, pooling, `intermediate_dim`), `task.weights.h5` and
`preprocessor.json` (its `ViTImageConverter`: image size, `scale`, `offset`, resizing). The
architecture is read from those JSON files and checked before keras-hub is imported; keras-hub
itself then loads the weights, and its variables are renamed to the official checkpoint keys
(`KERAS_HUB_RULES`), so loading is keras_vit's usual all-or-nothing loading.

Both networks compute the same function: the same patch embedding, pre-norm blocks, exact
GELU, LayerNorm epsilon from the file, and a `pre_logits` Dense + tanh. What one side cannot
hold is refused, naming it: keras-hub's ViT has no hybrid stem, no position embedding but the
learned 1-D table, no tanh-approximate GELU, no `fc_norm`, and its "gap" pooling averages the
class token in; keras_vit's ViT always has the biases keras-hub makes optional.

The preprocessing travels as a data config with timm's field names (`input_size`,
`interpolation`, `crop_pct`, `crop_mode`, `mean`, `std`; mean and std of pixels in [0, 1]):
keras-hub's converter computes `x * scale + offset` on pixels in [0, 255], which is
`(x / 255 - mean) / std` with `std = 1 / (255 * scale)` and `mean = -offset * std`.

A preset is also read by keras-hub's name or handle (`keras_vit.weights.keras_hub_handles`).

keras-hub is an optional dependency (`pip install keras-hub`), imported only when a preset is
read or written.
"""

import hashlib
import os
import re

import keras
import numpy as np

from keras_vit.checks import check_bool, check_choice, check_positive_int, in_range, to_pair
from keras_vit.preprocessing import (IMAGE_CHANNELS, INPUT_OFFSET, INPUT_SCALE, MAX_MEAN,
                                     MAX_STD, MIN_STD)
from keras_vit.weights import config_json
from keras_vit.weights.errors import CheckpointError
from keras_vit.weights.keras_hub_handles import BACKBONE_CLASS, import_keras_hub
from keras_vit.weights.layouts import POSEMB_KEY

# The files of a preset folder (keras-hub's `preset_utils` names).
CONFIG_FILE = "config.json"
METADATA_FILE = "metadata.json"
TASK_FILE = "task.json"
PREPROCESSOR_FILE = "preprocessor.json"
IMAGE_CONVERTER_FILE = "image_converter.json"
# What an HDF5 weights file takes: 4 bytes a float32 parameter, and at most this much more.
H5_BYTES_PER_PARAMETER = 4
H5_OVERHEAD = 1 << 20
# keras-hub's weights: the backbone's (or the index of its shards) and the task's (the head).
BACKBONE_WEIGHTS_FILES = ("model.weights.h5", "model.weights.json")
TASK_WEIGHTS_FILE = "task.weights.h5"
# keras_vit's mark on the presets it writes (what it may replace with `overwrite=True`): the
# files it wrote there and their SHA-256.
MARK_FILE = "keras_vit.json"
# The files keras-hub writes for a ViT classifier with its preprocessor.
KERAS_HUB_FILES = ("config.json", "metadata.json", "model.weights.h5", "task.json",
                   "task.weights.h5", "preprocessor.json", "image_converter.json")
TASK_CLASS = "ViTImageClassifier"
# What keras-hub's `from_preset` raises for a preset's files it cannot use (a field of another
# type than it expects: `AttributeError` for a number where it reads an object's fields).
KERAS_HUB_LOAD_ERRORS = (ValueError, TypeError, LookupError, AttributeError, OSError,
                         RuntimeError)  # h5py's for a damaged file
# keras-hub's ViT defaults (`ViTBackbone`, `ViTImageClassifier`).
KERAS_HUB_LAYER_NORM_EPSILON = 1e-6
# keras-hub's pooling -> keras_vit's classifier; both need (keras-hub) or forbid (keras_vit's
# "gap") the class token as listed.
POOLINGS = {"token": ("token", True), "gap": ("gap", False)}
# Keras' `Resizing` interpolations, which keras-hub's converter takes (timm's bilinear, bicubic
# and nearest among them).
INTERPOLATIONS = ("bilinear", "nearest", "bicubic", "area", "lanczos3", "lanczos5")
# keras-hub's converter flags (crop_to_aspect_ratio, pad_to_aspect_ratio) as a data config's
# crop_mode: Keras' own modes, which crop (or pad with zeros) to the target's aspect ratio and
# then resize, exactly as the converter does; "squash" resizes without keeping the ratio.
CROP_MODES = {(True, False): "crop_to_aspect_ratio", (False, False): "squash",
              (False, True): "pad_to_aspect_ratio"}
# timm's crop modes -> the converter's closest, written only when asked (`approximate=True`):
# timm resizes, then crops (or pads with the mean); the converter crops (or pads with zeros),
# then resizes.
CLOSEST_CROP_MODES = {"center": "crop_to_aspect_ratio", "border": "pad_to_aspect_ratio"}
PIXEL_MAX = 255.0
SIGNIFICANT_DIGITS = 10  # of mean and std read from a converter's scale and offset
# keras_vit's own input, as a data config: bilinear resize to the model's size, no crop, then
# `x / 127.5 - 1` (`keras_vit.preprocessing`), i.e. mean = std = 0.5.
_STD = INPUT_SCALE / PIXEL_MAX
KERAS_VIT_PREPROCESSING = dict(interpolation="bilinear", crop_pct=1.0, crop_mode="squash",
                               mean=[-INPUT_OFFSET * _STD] * IMAGE_CHANNELS,
                               std=[_STD] * IMAGE_CHANNELS, antialias=False)

# (pattern, replacement) on keras-hub's ViT variable paths, in order: the official checkpoint
# key (`keras_vit.weights.keymap`). keras-hub numbers its blocks from 1.
KERAS_HUB_RULES = (
    (r"^vit_patching_and_embedding/class_token$", "cls"),
    (r"^vit_patching_and_embedding/patch_embedding/", "embedding/"),
    (r"^vit_patching_and_embedding/position_embedding/embeddings$", POSEMB_KEY),
    (r"^vit_encoder/transformer_block_(\d+)/",
     lambda m: f"Transformer/encoderblock_{int(m[1]) - 1}/"),
    (r"/ln_1/", "/LayerNorm_0/"),
    (r"/mha/attention_output/", "/MultiHeadDotProductAttention_1/out/"),
    (r"/mha/", "/MultiHeadDotProductAttention_1/"),
    (r"/ln_2/", "/LayerNorm_2/"),
    (r"/mlp/dense_1/", "/MlpBlock_3/Dense_0/"),
    (r"/mlp/dense_2/", "/MlpBlock_3/Dense_1/"),
    (r"^vit_encoder/ln/", "Transformer/encoder_norm/"),
    (r"^predictions/", "head/"),
    (r"/gamma$", "/scale"),
    (r"/beta$", "/bias"),
)
_COMPILED = tuple((re.compile(pattern), repl) for pattern, repl in KERAS_HUB_RULES)
# The biases keras_vit leaves out with `qkv_bias=False`: zeros in keras-hub's attention.
QKV_BIASES = tuple(f"MultiHeadDotProductAttention_1/{name}/bias"
                   for name in ("query", "key", "value"))


def official_key(path):
    """The official checkpoint key of a keras-hub ViT variable path, by `KERAS_HUB_RULES`."""
    for pattern, repl in _COMPILED:
        path = pattern.sub(repl, path)
    return path


# ---------------------------------------------------------------------------------------------
# Reading.


def is_folder(source):
    """Whether `source` is a path to an existing folder (the only folders keras_vit reads as
    weights are keras-hub presets)."""
    return isinstance(source, (str, os.PathLike)) and not isinstance(source, bytes) \
        and os.path.isdir(os.path.expanduser(os.fspath(source)))


def _file(folder, name):
    return os.path.join(os.path.expanduser(os.fspath(folder)), name)


def _object_config(folder, name, class_name):
    """The `config` of the Keras object serialised in `folder/name`, checked to be a
    keras-hub `class_name`."""
    path = _file(folder, name)
    document = config_json.read_json(path, f"keras-hub's {name} of a {class_name}")
    if not isinstance(document, dict) or not isinstance(document.get("config"), dict):
        raise CheckpointError(f"{path} is not a serialised keras-hub object. Expected a JSON "
                              f"object with `class_name` and `config` (a {class_name}).")
    found = document.get("class_name")
    if found != class_name:
        raise CheckpointError(f"{path} describes a keras-hub {found!r}; keras_vit reads ViT "
                              f"presets. Expected class_name {class_name!r}.")
    return document["config"]


def _first_difference(ours, theirs, where=""):
    """The dotted path of the first field where two JSON values differ (None where they are
    the same), with the two values."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        for key in sorted(ours.keys() | theirs.keys()):
            name = key if key.isidentifier() else repr(key)  # a key as JSON may hold it
            found = _first_difference(ours.get(key), theirs.get(key), f"{where}{name}.")
            if found:
                return found
        return None
    return None if ours == theirs else (where.rstrip("."), ours, theirs)


def _short(value, limit=60):
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _check_same_copy(folder, name, config, *fields):
    """Refuses a preset whose `task.json` embeds the object at `fields` ("backbone";
    "preprocessor"; "preprocessor", "image_converter") otherwise than file `name` holds it
    (`config`): keras-hub's classifier is built from the first, the object alone from the
    second."""
    if not os.path.isfile(_file(folder, TASK_FILE)):
        return
    copy = {"config": _object_config(folder, TASK_FILE, TASK_CLASS)}
    for field in fields:  # a serialised object's config holds the next one
        copy = copy["config"].get(field) if isinstance(copy.get("config"), dict) else None
        if not isinstance(copy, dict):
            return  # the classifier has none: keras-hub builds it from `name` too
    found = _first_difference(config, copy.get("config"))
    if found:
        key, mine, task = found
        what = "'s ".join(fields)
        raise CheckpointError(
            f"{_file(folder, TASK_FILE)} and {name} disagree on the {what}'s "
            f"{(key or 'config')[:80]}: {_short(task)} in {TASK_FILE}, {_short(mine)} in {name}. "
            f"keras-hub builds its classifier from {TASK_FILE}'s copy and the {fields[-1]} "
            f"alone from {name}; expected the same in both, as keras-hub's save_to_preset "
            "writes them.")


def _checked(path, check, field, value, *args):
    """`check(field, value, *args)` (a `keras_vit.checks` rule), its error naming the file."""
    try:
        return check(field, value, *args)
    except ValueError as e:
        raise CheckpointError(f"{path}: {e}") from None


def _backbone_arguments(folder):
    """The `keras_vit.ViT` arguments of a preset's `config.json` (a `ViTBackbone`), and whether
    it has a class token."""
    path = _file(folder, CONFIG_FILE)
    config = _object_config(folder, CONFIG_FILE, BACKBONE_CLASS)
    _check_same_copy(folder, CONFIG_FILE, config, "backbone")
    shape = config.get("image_shape")
    if not isinstance(shape, list) or len(shape) != 3 or shape[-1] != IMAGE_CHANNELS:
        raise CheckpointError(f"{path}: `image_shape` must be [height, width, 3] (RGB, "
                              f"channels last). Received: image_shape={shape!r:.100}")
    for flag in ("use_mha_bias", "use_mlp_bias", "use_patch_bias"):
        if _checked(path, check_bool, flag, config.get(flag, True)) is not True:
            raise CheckpointError(f"{path}: {flag}=false; keras_vit's ViT always has these "
                                  f"biases. Expected a preset with {flag}=true.")
    class_token = _checked(path, check_bool, "use_class_token", config.get("use_class_token",
                                                                           True))
    arguments = dict(
        image_size=list(_checked(path, to_pair, "image_shape", shape[:2])),
        patch_size=list(_checked(path, to_pair, "patch_size", config.get("patch_size"))),
        hidden_size=config.get("hidden_dim"), num_layers=config.get("num_layers"),
        num_heads=config.get("num_heads"), mlp_dim=config.get("mlp_dim"),
        dropout_rate=config.get("dropout_rate", 0.0),
        attention_dropout_rate=config.get("attention_dropout", 0.0),
        layer_norm_epsilon=config.get("layer_norm_epsilon", KERAS_HUB_LAYER_NORM_EPSILON),
        gelu_approximate=False)  # keras-hub's MLP: Dense(activation="gelu"), the exact form
    return arguments, class_token


def _head_arguments(folder, class_token):
    """The `keras_vit.ViT` arguments of a preset's `task.json` (a `ViTImageClassifier`), or of
    its backbone alone (no head) where there is none."""
    if not os.path.isfile(_file(folder, TASK_FILE)):
        return dict(include_top=False, classifier="token" if class_token else "gap")
    path = _file(folder, TASK_FILE)
    config = _object_config(folder, TASK_FILE, TASK_CLASS)
    pooling = _checked(path, check_choice, "pooling", config.get("pooling", "token"),
                       tuple(POOLINGS))
    classifier, needs_token = POOLINGS[pooling]
    if needs_token != class_token:
        raise CheckpointError(
            f"{path}: pooling {pooling!r} with use_class_token={str(class_token).lower()} in "
            f"{CONFIG_FILE}: keras-hub's 'gap' averages the class token with the patch tokens "
            "and its 'token' reads the first token, which keras_vit's ViT does not express. "
            "Expected 'token' with a class token or 'gap' without one.")
    return dict(include_top=True, classifier=classifier,
                num_classes=_checked(path, check_positive_int, "num_classes",
                                     config.get("num_classes")),
                representation_size=_checked(path, check_positive_int, "intermediate_dim",
                                             config.get("intermediate_dim"), True))


def _number_per_channel(path, field, value, default):
    """A converter's `scale` or `offset` (None, a number or one per channel) as 3 floats."""
    value = default if value is None else value
    values = value if isinstance(value, list) else [value] * IMAGE_CHANNELS
    if len(values) != IMAGE_CHANNELS or not all(in_range(v) for v in values):  # finite reals
        raise CheckpointError(f"{path}: `{field}` must be a number or {IMAGE_CHANNELS} numbers "
                              f"(one per RGB channel). Received: {field}={value!r:.100}")
    return [float(v) for v in values]


def _rounded(values):
    return [float(f"{v:.{SIGNIFICANT_DIGITS}g}") for v in values]


def preset_preprocessing(path):
    """The data config of a keras-hub preset's image converter, with timm's field names:
    `input_size` [3, height, width], `interpolation`, `crop_pct` (1.0), `crop_mode`
    ("center", "squash" or "border", see `CROP_MODES`), `mean` and `std` (of pixels in [0, 1]:
    the model sees `(x / 255 - mean) / std`, which is the converter's `x * scale + offset`).
    None for a preset without a converter (a backbone saved alone). Reads JSON only: keras-hub
    need not be installed.

    Raises:
        CheckpointError: naming the file and the field, for a converter keras_vit cannot read.
    """
    for name in (PREPROCESSOR_FILE, IMAGE_CONVERTER_FILE):
        if os.path.isfile(_file(path, name)):
            break
    else:
        return None
    where = _file(path, name)
    config = _object_config(path, name, "ViTImageClassifierPreprocessor"
                            if name == PREPROCESSOR_FILE else "ViTImageConverter")
    # keras-hub's classifier reads the preprocessor (and its converter) task.json embeds.
    _check_same_copy(path, name, config, "preprocessor",
                     *(() if name == PREPROCESSOR_FILE else ("image_converter",)))
    if name == PREPROCESSOR_FILE:
        converter = config.get("image_converter")
        if not isinstance(converter, dict) or converter.get("class_name") != "ViTImageConverter" \
                or not isinstance(converter.get("config"), dict):
            raise CheckpointError(f"{where}: `image_converter` is not a ViTImageConverter. "
                                  "Expected the converter keras-hub's ViT preprocessor saves.")
        config = converter["config"]
    scale = _number_per_channel(where, "scale", config.get("scale"), 1.0)
    offset = _number_per_channel(where, "offset", config.get("offset"), 0.0)
    if 0.0 in scale:
        raise CheckpointError(f"{where}: `scale` is 0 (every image the same). Expected a "
                              "non-zero scale per channel.")
    std = [1.0 / (PIXEL_MAX * s) for s in scale]
    mean = [-o * s for o, s in zip(offset, std)]
    if not all(MIN_STD <= s <= MAX_STD for s in std) \
            or not all(-MAX_MEAN <= m <= MAX_MEAN for m in mean):
        raise CheckpointError(
            f"{where}: `scale` {scale!r:.60} and `offset` {offset!r:.60} map pixels in [0, 255] "
            f"to values beyond 1e5 (a std of {min(std):.3g} to {max(std):.3g}, a mean of "
            f"{min(mean):.3g} to {max(mean):.3g} of pixels in [0, 1]). Expected std in "
            f"[{MIN_STD:g}, {MAX_STD:g}] and mean in [-{MAX_MEAN:g}, {MAX_MEAN:g}].")
    crop = tuple(_checked(where, check_bool, field, config.get(field, default))
                 for field, default in (("crop_to_aspect_ratio", True),
                                        ("pad_to_aspect_ratio", False)))
    if crop not in CROP_MODES:
        raise CheckpointError(f"{where}: crop_to_aspect_ratio and pad_to_aspect_ratio are "
                              f"{crop}. Expected at most one of them true.")
    size = config.get("image_size")
    return dict(input_size=None if size is None else
                [IMAGE_CHANNELS, *_checked(where, to_pair, "image_size", size)],
                interpolation=_checked(where, check_choice, "interpolation",
                                       config.get("interpolation", "bilinear"), INTERPOLATIONS),
                crop_pct=1.0, crop_mode=CROP_MODES[crop],
                mean=_rounded(mean), std=_rounded(std),
                antialias=_checked(where, check_bool, "antialias",
                                   config.get("antialias", False)))


def _check_is_preset(path):
    folder = os.path.expanduser(os.fspath(path))
    for name in (CONFIG_FILE, METADATA_FILE):
        file = os.path.join(folder, name)
        if os.path.exists(file) and not os.path.isfile(file):  # a FIFO, a device, a folder
            raise CheckpointError(f"{file} is not a regular file. Expected the {name} "
                                  "keras-hub's save_to_preset writes.")
    missing = [name for name in (CONFIG_FILE, METADATA_FILE)
               if not os.path.isfile(os.path.join(folder, name))]
    if missing:
        raise CheckpointError(f"{path} is a folder without {' and '.join(missing)}: not a "
                              "keras-hub preset. Expected an .npz or .safetensors file, a "
                              "folder holding model.safetensors, or a folder keras-hub's "
                              "save_to_preset wrote.")


def _check_weights_files(path, folder, include_top):
    """Every weight comes from the preset: keras-hub would build the missing ones at random
    (a classifier's head without `task.weights.h5`) or name a file the preset never had."""
    if not any(os.path.isfile(os.path.join(folder, name)) for name in BACKBONE_WEIGHTS_FILES):
        raise CheckpointError(f"{path}: the preset has no {BACKBONE_WEIGHTS_FILES[0]} (the "
                              "backbone's weights). Expected the folder keras-hub's "
                              "save_to_preset wrote, whole.")
    if include_top and not os.path.isfile(os.path.join(folder, TASK_WEIGHTS_FILE)):
        raise CheckpointError(
            f"{path}: {TASK_FILE} describes a classifier but the preset has no "
            f"{TASK_WEIGHTS_FILE} (its head's weights); keras-hub would give that head random "
            "weights. Expected the folder keras-hub's save_to_preset wrote, whole.")


def read_preset(path):
    """The arrays of a keras-hub ViT preset folder in the official layout, and an entry
    describing it as `keras_vit.weights.sources.fetch_params` returns one: `config` (the
    `keras_vit.ViT` arguments: exact GELU, the preset's LayerNorm epsilon, its head or none),
    `num_classes`, `representation_size` and `preprocessing` (`preset_preprocessing`).

    The architecture is read and checked from the JSON files first; keras-hub then loads the
    weights (`ViTImageClassifier.from_preset`, or `ViTBackbone.from_preset` for a backbone
    saved alone). The model gives the head's logits, before the `activation` a keras-hub
    classifier may apply; the classifier's `dropout` (training only) has no counterpart.

    Raises:
        CheckpointError: naming the file and the field, for a folder that is not a ViT preset
            or one keras_vit's ViT cannot express.
        ImportError: naming `pip install keras-hub`, if keras-hub is not installed.
    """
    _check_is_preset(path)
    folder = os.path.expanduser(os.fspath(path))
    _check_digests(path, folder)
    config, class_token = _backbone_arguments(folder)
    config.update(_head_arguments(folder, class_token))
    preprocessing = preset_preprocessing(folder)
    _check_weights_files(path, folder, config["include_top"])
    hub = import_keras_hub()
    loader = hub.models.ViTImageClassifier if config["include_top"] else hub.models.ViTBackbone
    try:
        model = loader.from_preset(folder)
    except KERAS_HUB_LOAD_ERRORS as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"{path}: keras-hub could not load the preset ({first}).") from None
    params = {}
    for variable in model.weights:
        value = np.asarray(keras.ops.convert_to_numpy(variable), np.float32)
        key = official_key(variable.path)
        params[key] = value[np.newaxis] if key == POSEMB_KEY else value
    entry = dict(name=str(path), url=None, variant=None, config=config, class_names=None,
                 num_classes=config.get("num_classes"),
                 representation_size=config.get("representation_size"), sha256=None,
                 preprocessing=preprocessing)
    return params, entry


# ---------------------------------------------------------------------------------------------
# Writing.


def refusal(config):
    """Why keras-hub's ViT cannot hold a `keras_vit.ViT` configuration, or None."""
    if config.get("resnet") is not None:
        return ("it is a hybrid (a ResNet stem before the patches); keras-hub's ViTBackbone "
                "cuts its patches from the pixels")
    if config["position_embedding"] != "learned":
        return (f"position_embedding={config['position_embedding']!r}; keras-hub's ViTBackbone "
                "has one learned 1-D table ('learned')")
    if config["gelu_approximate"]:
        return ("it uses the tanh-approximate GELU (gelu_approximate=True, as the paper's "
                "checkpoints); keras-hub's ViT uses the exact GELU. Rebuild it with "
                "gelu_approximate=False to write it anyway (its outputs then change slightly)")
    if config["fc_norm"]:
        return ("fc_norm=True (the final LayerNorm on the pooled features); keras-hub's ViT "
                "normalises the token sequence")
    if config["classifier"] == "gap" and config["class_token"]:
        return ("it averages the patch tokens beside a class token (classifier='gap', "
                "class_token=True); keras-hub's 'gap' averages the class token in too")
    if not config["include_top"] and config["representation_size"]:
        return ("it has a representation layer (pre_logits) but no head; keras-hub keeps "
                "pre_logits in its classifier only")
    return None


def _per_channel_or_one(values):
    values = [float(v) for v in values]
    return values[0] if len(set(values)) == 1 else values


def converter_arguments(preprocessing, image_size, approximate=False):
    """`keras_hub.layers.ViTImageConverter` arguments for a data config (timm's field names;
    None: keras_vit's own, `KERAS_VIT_PREPROCESSING`), at the model's `image_size` (its
    `input_size` is not read).

    Args:
        approximate: bool. For timm's crop modes ("center", "border") and a crop_pct below 1,
            which the converter cannot do: write the closest it has (`CLOSEST_CROP_MODES`, no
            crop_pct; antialias as the data config says) instead of refusing.

    Raises:
        ValueError: naming the field, for what keras-hub's converter cannot do (without
            `approximate`: timm's crop modes, a crop_pct other than 1; an interpolation Keras'
            `Resizing` lacks).
    """
    config = dict(KERAS_VIT_PREPROCESSING, **(preprocessing or {}))
    crop_mode, crop_pct = config["crop_mode"], config["crop_pct"]
    if crop_mode in CLOSEST_CROP_MODES or crop_pct != 1.0:
        if not approximate:
            raise ValueError(
                f"preprocessing crop_mode={crop_mode!r}, crop_pct={crop_pct!r} (timm's): "
                "keras-hub's image converter crops to the model's aspect ratio, then resizes, "
                "with no crop_pct. Expected crop_pct 1.0 with crop_mode 'squash', "
                "'crop_to_aspect_ratio' or 'pad_to_aspect_ratio', or approximate=True "
                "(--approximate-preprocessing) to write the closest converter.")
        crop_mode = CLOSEST_CROP_MODES.get(crop_mode, crop_mode)
    check_choice("preprocessing interpolation", config["interpolation"], INTERPOLATIONS)
    crop_mode = check_choice("preprocessing crop_mode", crop_mode, tuple(CROP_MODES.values()))
    crop, pad = next(flags for flags, mode in CROP_MODES.items() if mode == crop_mode)
    mean, std = (np.broadcast_to(np.asarray(config[k], float), (IMAGE_CHANNELS,))
                 for k in ("mean", "std"))
    if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(std)) and np.all(std > 0)):
        raise ValueError(f"preprocessing mean={list(mean)} std={list(std)}: expected finite "
                         "numbers, std above 0.")
    return dict(image_size=tuple(image_size), scale=_per_channel_or_one(1 / (PIXEL_MAX * std)),
                offset=_per_channel_or_one(-mean / std), crop_to_aspect_ratio=crop,
                pad_to_aspect_ratio=pad, interpolation=config["interpolation"],
                antialias=bool(config.get("antialias", True)))


def approximation_notice(stated, converter):
    """One line: how the converter `converter_arguments(..., approximate=True)` gave differs
    from the data config `stated`."""
    mode = CROP_MODES[converter["crop_to_aspect_ratio"], converter["pad_to_aspect_ratio"]]
    return (f"keras-hub's converter cannot do crop_mode {stated['crop_mode']!r} at crop_pct "
            f"{stated['crop_pct']}: the preset crops as {mode!r} at crop_pct 1.0 (the centred "
            "region of the model's aspect ratio, then the resize), so keras-hub sees more of "
            "each image than the checkpoint was evaluated on.")


def is_ours(folder):
    """Whether `folder` holds the mark of a preset keras_vit wrote."""
    return preset_mark(folder) is not None


def preset_mark(folder):
    """The mark of a preset keras_vit wrote in `folder` (a dict), or None."""
    mark = os.path.join(folder, MARK_FILE)
    if not os.path.isfile(mark) or os.path.islink(mark):
        return None
    try:
        document = config_json.read_json(mark, "keras_vit's mark on a preset")
    except CheckpointError:
        return None
    ours = isinstance(document, dict) and document.get("written_by") == config_json.WRITTEN_BY
    return document if ours else None


def written_files(mark):
    """The names of the files keras_vit wrote into a preset, by its mark: the `files` it
    lists (with their SHA-256), else (marks of earlier versions) the files keras-hub writes
    for a ViT."""
    files = mark.get("files")
    if isinstance(files, dict) and all(isinstance(k, str) and isinstance(v, str)
                                       for k, v in files.items()):
        return dict(files)
    return dict.fromkeys(KERAS_HUB_FILES)


def sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _check_digests(path, folder):
    """The files of a preset keras_vit wrote are the bytes it wrote (its mark holds their
    SHA-256): HDF5 has no checksum, so a damaged weights file would load as other numbers."""
    mark = preset_mark(folder)
    if mark is None:
        return
    for name, digest in written_files(mark).items():
        if digest is None:
            continue
        file = os.path.join(folder, name)
        if not os.path.isfile(file):
            raise CheckpointError(f"{path}: the preset keras_vit wrote has lost its {name}. "
                                  "Expected the folder as keras_vit wrote it, whole.")
        if sha256(file) != digest:
            raise CheckpointError(f"{path}: {name} is not the file keras_vit wrote there (its "
                                  f"SHA-256 differs from the one in {MARK_FILE}): damaged or "
                                  "changed. Expected the folder as keras_vit wrote it.")
