"""keras-hub presets by keras-hub's name of one of its ViT presets
(`vit_base_patch16_224_imagenet`) or by handle (`kaggle://keras/vit/keras/<variant>/<version>`,
or `hf://<org>/<name>` for a Hugging Face repository of a keras-hub preset): keras-hub's own
resolver (`keras_hub`'s `get_file`) fetches the preset's files into keras-hub's cache
(kagglehub's, or Hugging Face's), or finds them there offline; the folder they are in is then
read as any preset folder (`keras_vit.weights.keras_hub.read_preset`)."""

import json
import os
import re

from keras_vit.weights.errors import CheckpointError, DownloadError

# keras-hub's handles of Kaggle Models presets: kaggle://OWNER/MODEL/keras/VARIANT[/VERSION].
KAGGLE_SCHEME = "kaggle://"
# keras-hub's names of its ViT presets (`ViTBackbone.presets`), as they look.
PRESET_NAME = re.compile(r"vit_[a-z0-9_]+")
# The files fetched from a preset named by handle (keras-hub's `preset_utils` names): those every
# ViT preset has, then those a classifier with its preprocessor has (absent from a backbone's).
HANDLE_FILES_REQUIRED = ("config.json", "metadata.json", "model.weights.h5")
HANDLE_FILES_OPTIONAL = ("task.json", "task.weights.h5", "preprocessor.json",
                         "image_converter.json")
# The class of a keras-hub ViT preset's `config.json`.
BACKBONE_CLASS = "ViTBackbone"
INSTALL = "pip install keras-hub"


def import_keras_hub():
    """The `keras_hub` package, or ImportError naming the command that installs it."""
    try:
        # Optional dependency: only reading or writing a preset needs it.
        import keras_hub

        return keras_hub
    except ImportError as e:
        raise ImportError(f"keras-hub presets need the keras-hub package: {INSTALL}") from e


def is_preset_name(source):
    """Whether `source` is keras-hub's name of one of its ViT presets (keras-hub installed),
    or a `kaggle://` handle: a preset keras-hub's own resolver fetches (`fetch_preset`)."""
    if not isinstance(source, str):
        return False
    if source.startswith(KAGGLE_SCHEME):
        return True
    if not PRESET_NAME.fullmatch(source) or os.path.exists(source):
        return False
    try:
        hub = import_keras_hub()
    except ImportError:
        return False
    return source in {**hub.models.ViTBackbone.presets, **hub.models.ViTImageClassifier.presets}


def is_hub_preset(config_path):
    """Whether the `config.json` at `config_path` is a keras-hub `ViTBackbone`'s: the Hugging
    Face repository it came from holds a keras-hub preset. False for None (no file)."""
    if config_path is None:
        return False
    try:
        with open(config_path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and config.get("class_name") == BACKBONE_CLASS and \
        str(config.get("module", "")).startswith("keras_hub")


def fetch_preset(source):
    """The local folder of the preset `source` names (a keras-hub preset name, a `kaggle://`
    handle, or a `hf://` repository of a keras-hub preset), resolved by keras-hub's own
    `get_file`: downloaded into keras-hub's cache, or found there offline.

    Raises:
        CheckpointError: if the preset lacks a file every ViT preset has.
        DownloadError: naming the file, where keras-hub could not fetch it (offline and not
            in its cache, no access).
        ValueError: for a handle keras-hub cannot parse (`kaggle://keras/vit`).
        ImportError: naming `pip install keras-hub`, if keras-hub is not installed.
    """
    import_keras_hub()
    from keras_hub.src.utils.preset_utils import get_file  # keras-hub's resolver and cache

    folder = None
    for name in HANDLE_FILES_REQUIRED + HANDLE_FILES_OPTIONAL:
        try:
            path = get_file(source, name)
        except FileNotFoundError as e:
            # keras-hub turns "not in the cache, offline" into FileNotFoundError too.
            offline = type(e.__cause__).__name__ == "LocalEntryNotFoundError"
            if name in HANDLE_FILES_OPTIONAL and not offline:
                continue
            if offline:
                raise DownloadError(_handle_advice(source, name, e)) from None
            raise CheckpointError(f"{source}: the keras-hub preset has no {name}.") from None
        except ValueError as e:  # keras-hub's word for a handle it cannot parse, and others
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            if first.startswith(("Unexpected", "Unknown preset")):
                raise ValueError(f"{source} is not a preset handle keras-hub takes ({first[:400]})"
                                 ) from None
            raise DownloadError(_handle_advice(source, name, e)) from None
        except (OSError, KeyError) as e:  # network, access: keras-hub's and kagglehub's
            raise DownloadError(_handle_advice(source, name, e)) from None
        here = os.path.dirname(path)
        if folder is not None and here != folder:
            raise CheckpointError(f"{source}: keras-hub's cache holds its files in two folders "
                                  f"({folder}, {here}).")
        folder = here
    return folder


def _handle_advice(source, name, error):
    first = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return (f"keras-hub could not fetch {name} of preset {source} ({type(error).__name__}: "
            f"{first[:300]}). Offline, load the preset once where there is internet "
            "(keras_hub.models.ImageClassifier.from_preset) and copy keras-hub's cache here "
            "(KAGGLEHUB_CACHE, or the Hugging Face cache with HF_HUB_OFFLINE=1), or pass the "
            "preset's folder.")
