"""The architecture a checkpoint describes: its registry entry (a paper variant, or a `config`),
else the `config.json` that `keras_vit.training.fit` writes beside a local checkpoint (the
"sidecar", checked against the arrays), else the array shapes.
"""

import os

from keras_vit import configs
from keras_vit.weights import config_json
from keras_vit.weights.layouts import config_from_params
from keras_vit.weights.registry import is_registered, is_url

# Written by keras_vit.training.fit beside its checkpoints.
SIDECAR_CONFIG = config_json.CONFIG_FILE


def sidecar_path(source):
    """The `config.json` beside a local checkpoint path, or None for other sources."""
    if not isinstance(source, (str, os.PathLike)) or is_url(source) or is_registered(source):
        return None
    return os.path.join(os.path.dirname(os.path.expanduser(os.fspath(source))), SIDECAR_CONFIG)


def read_sidecar(source):
    """The `config.json` that `keras_vit.training.fit` writes beside a local checkpoint:
    `{"model": ViT arguments or None, "class_names": [...] or None}`, checked
    (`keras_vit.weights.config_json.check_keras_vit`); None if absent or another tool's.

    Raises:
        CheckpointError: naming the file and the field, if it is unreadable or malformed.
    """
    path = sidecar_path(source)
    if path is None or not os.path.isfile(path):
        return None
    sidecar = config_json.read_json(path, f"the config.json keras_vit.training.fit writes "
                                          f"beside {source}")
    if not isinstance(sidecar, dict) or sidecar.get("format") != config_json.KERAS_VIT_FORMAT:
        return None  # another tool's config.json
    return config_json.check_keras_vit(sidecar, path)


def stated_image_size(entry, source, sidecar=None):
    """The image size a checkpoint says it was made at, or None where only its arrays say
    anything: its registry entry's resolution or `config` (timm's and transformers' files give
    one), else the `config.json` that `keras_vit.training.fit` writes beside a local file
    (`sidecar`: that file, read already; None: read here).

    Raises:
        CheckpointError: naming the file and the field, for a malformed `config.json`.
    """
    if entry and entry.get("variant"):
        return entry["resolution"]
    if entry and entry.get("config"):
        return entry["config"].get("image_size")
    model = ((read_sidecar(source) if sidecar is None else sidecar) or {}).get("model")
    return model.get("image_size") if model else None


def checkpoint_config(params, entry, source, image_size=None):
    """The `keras_vit.ViT` arguments and class names of a checkpoint, what gave them (for
    messages) and the image size the checkpoint says it was made at (None where only the
    arrays say anything): its registry entry (a variant, or a `config`), else the
    `config.json` beside a local file (checked against the arrays), else the array shapes
    (`keras_vit.weights.config_from_params`, with `image_size` for a non-square patch grid)."""
    if entry and entry.get("variant"):
        spec = configs.get_variant(entry["variant"])
        config = dict(spec.config(), image_size=entry["resolution"] or 224,
                      num_classes=entry["num_classes"], name=spec.builder_name.lower())
        return config, entry.get("class_names"), None, stated_image_size(entry, source)
    if entry and entry.get("config"):
        return dict(entry["config"], name=model_name(source)), entry.get("class_names"), \
            str(source), stated_image_size(entry, source)
    sidecar = read_sidecar(source) or {}
    if sidecar.get("model"):
        path = sidecar_path(source)
        config_json.check_agreement(config_json.declared_keras_vit(sidecar["model"], path),
                                    params, source)
        # What the config.json leaves out and the arrays fix (classes, resolution, sizes)
        # comes from the arrays, never from `ViT`'s defaults (a 1,000-class head, 224 px).
        arrays = config_from_params(params, sidecar["model"].get("image_size", image_size))
        arrays.pop("name", None)
        config = dict(arrays, **sidecar["model"])
        names = config_json.check_class_names(sidecar.get("class_names"), config, path)
        return config, names, path, stated_image_size(entry, source, sidecar)
    config = dict(config_from_params(params, image_size), name=model_name(source))
    names = config_json.check_class_names(sidecar.get("class_names"), config, sidecar_path(source))
    return config, names, f"the array shapes of {source}", None


def model_name(source):
    """The model name of a checkpoint file without one: "vit_" and its file name's stem, or
    its folder's name for a `model.safetensors` (the file a folder stands for)."""
    path = os.fspath(source)
    stem = os.path.basename(path).removesuffix(".npz")
    if stem == config_json.WEIGHTS_FILE:
        stem = os.path.basename(os.path.dirname(os.path.abspath(os.path.expanduser(path))))
    return "vit_" + "".join(c if c.isalnum() else "_" for c in stem).strip("_").lower()
