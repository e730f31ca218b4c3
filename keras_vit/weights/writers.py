"""The files keras_vit writes from a model for other libraries to load: an `.npz` in the
official layout (`save_npz`), a `.safetensors` file in timm's layout with the `config.json` timm
writes beside it (`save_safetensors`), and a keras-hub preset folder (`save_keras_hub_preset`).
`keras_vit.from_pretrained` rebuilds the same model from the last two, which hold the model's
keras_vit configuration; an `.npz` holds the arrays only, and `save_npz` warns where they, with
the keras_vit `config.json` beside it, would rebuild another model. Their readers are
`keras_vit.weights.npz`, `keras_vit.weights.hub` and `keras_vit.weights.keras_hub`.
"""

import json
import os
import warnings

import numpy as np
from safetensors.numpy import save_file

from keras_vit.checks import to_pair
from keras_vit.fileio import (
    DestinationExists,
    atomic_file,
    atomic_write_text,
    check_destination,
    check_room,
    staging_dir,
)
from keras_vit.labels import check_class_names
from keras_vit.model import ViT
from keras_vit.model_parts import VIT_DEFAULTS, vit_config
from keras_vit.positions import model_image_size
from keras_vit.preprocessing import IMAGE_CHANNELS, paper_data_config, with_image_size
from keras_vit.resnet import resnet_args
from keras_vit.weights import config_json, npz
from keras_vit.weights.architecture import checkpoint_config
from keras_vit.weights.errors import CheckpointError
from keras_vit.weights.hub import CONFIG_FILE, METADATA_KEY, described_file, read_config
from keras_vit.weights.keras_hub import (
    CROP_MODES,
    H5_BYTES_PER_PARAMETER,
    H5_OVERHEAD,
    KERAS_VIT_PREPROCESSING,
    MARK_FILE,
    QKV_BIASES,
    approximation_notice,
    converter_arguments,
    is_ours,
    official_key,
    preset_mark,
    refusal,
    sha256,
    written_files,
)
from keras_vit.weights.keras_hub_handles import import_keras_hub
from keras_vit.weights.keymap import check_finite_weights, model_params
from keras_vit.weights.sources import checkpoint_data_config
from keras_vit.weights.torch_layouts import to_timm

# The `keras_vit.ViT` arguments an `.npz` need not give back: they change no answer of the
# loaded model (its name; dropout, inactive at inference; remat and scan, the same values; a
# fixed input size refuses other sizes in one line instead of answering otherwise).
NPZ_UNCHECKED = ("name", "dropout_rate", "attention_dropout_rate", "remat", "scan",
                 "dynamic_image_size")


def _read_back(model, params, path):
    """How the model `keras_vit.from_pretrained(path)` would rebuild, once `params` are written
    there as an `.npz`, differs from `model`: {field: "field X (the model: Y)", ...} (its data
    config's field: "data_config"), empty if not at all. The rebuilt architecture is the
    arrays' with the keras_vit `config.json` beside `path`
    (`keras_vit.weights.architecture.checkpoint_config`), `keras_vit.ViT`'s defaults
    filling the rest; its data config is the one stated beside `path`, else the paper's.
    A model `keras_vit.ViT` did not build (a pre-training model, a functional model of an
    earlier version) is no model `from_pretrained` rebuilds: nothing to compare."""
    if not isinstance(model, ViT):
        return {}
    size = model_image_size(model)
    try:
        rebuilt = checkpoint_config(params, None, path)[0]
        stated = checkpoint_data_config(path, None, size)
    except (CheckpointError, ValueError) as e:
        return {"model": f"nothing ({str(e).rstrip('.')})"}
    rebuilt.setdefault("class_token", rebuilt.get("classifier", "token") == "token")
    differences = {}
    config = vit_config(model)
    for field, value in config.items():
        if field in NPZ_UNCHECKED or (field == "num_classes" and not config["include_top"]):
            continue
        got = rebuilt.get(field, VIT_DEFAULTS.get(field))
        if field in ("image_size", "patch_size"):
            value, got = to_pair(field, value), to_pair(field, got)
        elif field == "resnet" and value is not None and got is not None:
            value, got = resnet_args(**value), resnet_args(**got)
        if got != value:
            differences[field] = f"{field} {got!r} (the model: {value!r})"
    data_config = with_image_size(stated, size) if stated is not None else paper_data_config(size)
    if dict(data_config) != dict(model.data_config):
        differences["data_config"] = (f"the data config {dict(data_config)} (the model: "
                                      f"{dict(model.data_config)})")
    return differences


def save_npz(model_or_params, path, overwrite=False):
    """Writes a model (or a dict of arrays) as an `.npz` in the official layout, atomically.

    The layout holds the arrays only. `keras_vit.load_pretrained(model, path)` loads them into
    a model built as this one; `keras_vit.from_pretrained(path)` rebuilds the model from the
    arrays and the keras_vit `config.json` beside `path` (the one `keras_vit.training.fit`
    writes). Where that would rebuild another model (a GELU, a layer-norm epsilon, a classifier
    or a data config the arrays cannot state), a warning names what it would rebuild: a
    `.safetensors` file (`save_safetensors`) or a `.keras` file keeps the whole model.
    A file already at `path` is replaced only with `overwrite=True`.

    An int8-quantized model (`model.quantize("int8")`) is written as its dequantized float
    weights: the file loads into the float model, which `quantize("int8")` turns back into
    the same quantized model.

    Raises:
        keras_vit.fileio.DestinationExists: if `path` exists (without `overwrite`) or is a
            folder; nothing is written.
        keras_vit.fileio.WriteError: naming `path`, if it cannot be written (a full disk).
    """
    if isinstance(model_or_params, dict):
        return npz.write_npz(model_or_params, path, overwrite)
    check_destination(path, overwrite)  # before the read-back check: an existing file first
    params = model_params(model_or_params)
    # The file's own folder, as the writer names it: no `~` expanded, no registry name read.
    differences = _read_back(model_or_params, params, os.path.abspath(os.fspath(path)))
    written = npz.write_npz(params, path, overwrite)
    if differences:
        # A model loaded with load_pretrained takes the file's data config: the paper's.
        remedy = ("set its data_config again after keras_vit.load_pretrained(model, path)"
                  if "data_config" in differences else
                  "load it into a model built as this one (keras_vit.load_pretrained(model, "
                  "path))")
        warnings.warn(
            f"{path} holds the arrays only: keras_vit.from_pretrained would rebuild "
            f"{'; '.join(list(differences.values())[:3])}. Write a .safetensors or .keras "
            f"file, which keeps the whole model, or {remedy}.", stacklevel=2)
    return written


def save_safetensors(model, path, class_names=None, overwrite=False):
    """Writes a `keras_vit.ViT` model as a `.safetensors` file in timm's layout, atomically,
    with its keras_vit configuration (and `class_names`) in the file's metadata, and beside it
    the `config.json` timm writes for such a file (`config_json.timm_config`), so that
    `keras_vit.from_pretrained(path)` rebuilds the same model and timm loads it, with its
    head and data config: `timm.create_model("local-dir:" + folder, pretrained=True)` where
    it is named `model.safetensors`, and under any name `timm.create_model(architecture,
    pretrained=True, pretrained_cfg_overlay=dict(pretrained_cfg, file=path), **model_args)`
    (`architecture`, `pretrained_cfg`, `model_args`: the config.json's). Where timm would
    build it otherwise (`config_json.timm_differences`), a warning names how.

    A file already at `path`, or a `config.json` beside it, is replaced only with
    `overwrite=True`, and a `config.json` that keras_vit did not write for such a file, or
    wrote for another file still in the folder, never (timm reads one model a folder).

    Raises:
        CheckpointError: before anything is written, for a model timm's layout cannot hold
            (a hybrid, a position embedding other than the learned 1-D table, `pre_logits`).
        ValueError: for a model `keras_vit.ViT` did not build, or a `config.json` beside `path`
            that keras_vit did not write for such a file or wrote for another file there (it
            would be replaced).
        keras_vit.fileio.DestinationExists: if `path` or the `config.json` beside it exists
            (without `overwrite`); nothing is written.
        keras_vit.fileio.WriteError: naming the file, if it cannot be written (a full disk).
    """
    config = vit_config(model)
    # Names of classes only a head has: a model without one has none to write.
    class_names = check_class_names(class_names, config["num_classes"]) \
        if class_names is not None and config["include_top"] else None
    check_finite_weights(model, f"Writing {path}")
    params = to_timm(model_params(model))
    preprocessing = getattr(model, "data_config", None)  # None: the paper's
    timm = config_json.timm_config(config, class_names, preprocessing)
    config_path = os.path.join(os.path.dirname(os.path.abspath(os.fspath(path))), CONFIG_FILE)
    check_destination(path, overwrite)
    existing = read_config(config_path) if os.path.exists(config_path) else None
    if existing is not None and existing.get("written_by") != config_json.WRITTEN_BY:
        raise ValueError(f"{config_path} exists and was not written by keras_vit for a "
                         f".safetensors file: writing {path} would replace it. Expected a "
                         "folder without another model's config.json.")
    name = os.path.basename(os.fspath(path))
    other = described_file(existing, os.path.dirname(config_path))
    if other not in (None, name):
        raise ValueError(f"{config_path} describes {other} there, and timm reads one model a "
                         f"folder: writing {name} beside it would make it another model's. "
                         f"Nothing was written; expected a folder of its own for {name}.")
    if existing is not None and not overwrite:
        raise DestinationExists(
            f"{config_path} already exists (it describes another .safetensors file there). "
            "Nothing was written; pass overwrite=True (--overwrite) to replace it, or choose "
            "another folder.")
    timm["weights_file"] = name  # keras_vit's field: the file this config.json describes
    document = config_json.keras_vit_document(config, class_names, preprocessing)
    with atomic_file(path) as tmp:
        save_file(params, tmp, metadata={"format": "pt", METADATA_KEY: json.dumps(document)})
    atomic_write_text(config_path, json.dumps(timm, indent=2))
    differences = config_json.timm_differences(config)
    if differences:
        warnings.warn(f"timm builds {path} with {'; '.join(differences)}: its logits differ a "
                      "little from this model's (keras_vit reads the file back exactly).",
                      stacklevel=2)
    return os.fspath(path)


def check_preset_destination(path, overwrite):
    """Refuses to write a preset at `path` over anything but nothing, an empty folder, or (with
    `overwrite`) a preset keras_vit wrote: `DestinationExists` for a file there or an earlier
    preset without `overwrite`, ValueError for a folder holding anything else (never
    replaced), `WriteError` for a link, `FolderInUse` inside a running job's folder."""
    check_destination(path, True, kind="folder")
    folder = os.fspath(path)
    if not os.path.isdir(folder) or not os.listdir(folder):
        return
    if not is_ours(folder):
        raise ValueError(f"{path} is a folder holding files keras_vit did not write; it is "
                         "never replaced. Nothing was written; expected a new or empty folder.")
    others = sorted(set(os.listdir(folder)) - set(written_files(preset_mark(folder))) - {MARK_FILE})
    if others:
        listed = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5
                                          else "")
        raise ValueError(f"{path} holds a preset keras_vit wrote and files it did not write "
                         f"({listed}); it is never replaced. Nothing was written; expected "
                         "the preset alone, a new or an empty folder.")
    if not overwrite:
        raise DestinationExists(f"{path} already holds a preset. Nothing was written; pass "
                                "overwrite=True (--overwrite) to replace it, or choose another "
                                "folder.")


def _keras_hub_models(hub, config, converter):
    """(the keras-hub model whose weights are the network's, the preprocessor): a
    `ViTImageClassifier` holding its preprocessor, or a `ViTBackbone` and the preprocessor
    beside it for a model without a head."""
    backbone = hub.models.ViTBackbone(
        image_shape=(*config["image_size"], IMAGE_CHANNELS), patch_size=tuple(config["patch_size"]),
        num_layers=config["num_layers"], num_heads=config["num_heads"],
        hidden_dim=config["hidden_size"], mlp_dim=config["mlp_dim"],
        dropout_rate=config["dropout_rate"], attention_dropout=config["attention_dropout_rate"],
        layer_norm_epsilon=config["layer_norm_epsilon"], use_class_token=config["class_token"],
        dtype="float32")
    preprocessor = hub.models.ViTImageClassifierPreprocessor(
        image_converter=hub.layers.ViTImageConverter(**converter))
    if not config["include_top"]:
        return backbone, preprocessor
    return hub.models.ViTImageClassifier(
        backbone=backbone, num_classes=config["num_classes"], preprocessor=preprocessor,
        pooling=config["classifier"], intermediate_dim=config["representation_size"],
        head_dtype="float32"), None


def _assign(hub_model, params):
    """Sets every keras-hub variable from the official-layout `params` (zeros for the query,
    key and value biases of a model without them)."""
    used = set()
    for variable in hub_model.weights:
        key = official_key(variable.path)
        if key in params:
            value = params[key]
            used.add(key)
        elif key.endswith(QKV_BIASES):
            value = np.zeros(variable.shape, np.float32)
        else:
            raise RuntimeError(f"keras-hub's variable {variable.path} has no counterpart ({key}) "
                               "in keras_vit's model.")
        variable.assign(np.reshape(np.asarray(value, np.float32), variable.shape))
    left = sorted(set(params) - used)
    if left:
        raise RuntimeError(f"keras-hub's ViT has no variable for {left}.")


def save_keras_hub_preset(model, path, preprocessing=None, overwrite=False, approximate=False):
    """Writes a `keras_vit.ViT` as a keras-hub preset folder, so that
    `keras_hub.models.ImageClassifier.from_preset(path)` loads it with its preprocessor
    (and `keras_vit.from_pretrained(path)` reads it back): keras-hub's `predict` on RGB images
    in [0, 255] then gives the model's logits.

    The preset is keras-hub's own (`ViTImageClassifier.save_to_preset`, or the backbone and
    preprocessor for a model without a head), written in a staging folder and renamed into
    place, with `keras_vit.json`, keras_vit's mark, beside keras-hub's files. A model without
    query/key/value biases (`qkv_bias=False`) gets zero biases there. keras-hub's models take
    one input size: a `dynamic_image_size` model is written at its `image_size`. keras-hub
    stores no class names.

    Args:
        model: a `keras_vit.ViT`.
        path: str or path. The preset folder: new, empty, or (with `overwrite`) a preset
            keras_vit wrote; a folder holding anything else is never replaced.
        preprocessing: dict or None. A data config, with timm's field names (`interpolation`,
            `crop_pct` (1.0 only), `crop_mode` ("squash", "crop_to_aspect_ratio",
            "pad_to_aspect_ratio"), `mean`, `std`, `antialias`). Defaults to None: the data
            config the model carries (`model.data_config`: its checkpoint's).
        overwrite: bool. Replace a preset keras_vit wrote at `path`. Defaults to False.
        approximate: bool. Write a checkpoint evaluated with timm's centre crop (crop_mode
            "center" or "border", any crop_pct) with the closest converter keras-hub has (crop
            to the model's aspect ratio, then resize), warning what differs, instead of
            refusing it. Defaults to False.

    Returns:
        str: `path`.

    Raises:
        keras_vit.CheckpointError: naming the reason, before anything is written, for a model
            keras-hub's ViT cannot hold (a hybrid, another position embedding, the tanh GELU,
            `fc_norm`, "gap" beside a class token, `pre_logits` without a head).
        ValueError: for preprocessing keras-hub's converter cannot do, or a folder at `path`
            that keras_vit did not write.
        keras_vit.fileio.DestinationExists: for a preset already at `path` (without
            `overwrite`) or a file there.
        ImportError: naming `pip install keras-hub`, if keras-hub is not installed.

    Examples:
    >>> model = keras_vit.ViT(image_size=32, patch_size=8, hidden_size=32, num_layers=2,
    ...                       num_heads=4, mlp_dim=64, num_classes=10, gelu_approximate=False)
    >>> save_keras_hub_preset(model, "/tmp/vit_preset")  # doctest: +SKIP
    '/tmp/vit_preset'
    """
    config = vit_config(model)
    reason = refusal(config)
    if reason:
        raise CheckpointError(f"keras-hub's ViT cannot hold this model: {reason}. Nothing was "
                              "written.")
    if preprocessing is None:  # the data config the model carries (from its checkpoint)
        preprocessing = getattr(model, "data_config", None)
    converter = converter_arguments(preprocessing, config["image_size"], approximate)
    stated = dict(KERAS_VIT_PREPROCESSING, **(preprocessing or {}))
    if approximate and (stated["crop_mode"], stated["crop_pct"]) != (
            CROP_MODES[converter["crop_to_aspect_ratio"], converter["pad_to_aspect_ratio"]], 1.0):
        warnings.warn(approximation_notice(stated, converter), stacklevel=2)
    check_preset_destination(path, overwrite)
    check_finite_weights(model, f"Writing {path}")
    # HDF5 does not survive a disk that fills up (h5py ends the process): room first.
    check_room(os.path.join(os.fspath(path), "model.weights.h5"),
               H5_BYTES_PER_PARAMETER * model.count_params() + H5_OVERHEAD)
    hub = import_keras_hub()
    hub_model, preprocessor = _keras_hub_models(hub, config, converter)
    _assign(hub_model, model_params(model))
    mark = dict(written_by=config_json.WRITTEN_BY, format="keras-hub preset", model=config,
                preprocessing=preprocessing or KERAS_VIT_PREPROCESSING)
    with staging_dir(path) as staging:
        hub_model.save_to_preset(staging)
        if preprocessor is not None:
            preprocessor.save_to_preset(staging)
        mark["files"] = {name: sha256(os.path.join(staging, name))
                         for name in sorted(os.listdir(staging))}
        atomic_write_text(os.path.join(staging, MARK_FILE), json.dumps(mark, indent=2))
        check_preset_destination(path, overwrite)  # still free (or ours) now
    return os.fspath(path)
