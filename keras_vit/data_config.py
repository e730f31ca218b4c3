"""Each checkpoint's preprocessing, as timm's "data config": how an image becomes its input.

A data config is a dict with timm's field names (`timm.data.resolve_data_config`):

- `input_size`: `[3, height, width]`;
- `interpolation`: the resize filter, one of `INTERPOLATIONS`;
- `crop_pct`: in (0, 1]; the image is resized to `input_size / crop_pct`, then cropped;
- `crop_mode`: "center" (the shorter side to `input_size / crop_pct`, keeping the aspect ratio,
  then the centre crop: timm's default) or "squash" (each side to `input_size / crop_pct`);
- `mean`, `std`: per RGB channel, of pixels in [0, 1]: the input is `(x / 255 - mean) / std`;

and, a keras_vit field that timm's files leave out, `antialias` (bool): whether a downscaling
resize averages over its footprint, as PIL's (timm's) does; True where absent.

The paper's files were evaluated with vit_jax's preprocessing: a plain bilinear resize of each
side to the model's resolution (no crop, no antialias) and `x / 127.5 - 1`, that is mean = std
= 0.5 (`paper_data_config`). It is the data config of every model and checkpoint that states
none, and it gives the input `keras_vit.preprocess_inputs` has always given, bit for bit.

`resolve_data_config(source)` returns the data config of a registry name, a model, a folder
with a `config.json`, a `config.json`, a checkpoint file or an `hf://` repository. A model built
by `keras_vit.from_pretrained` carries its checkpoint's as `model.data_config`, and
`load_image`, `predict`, `evaluate`, `inspect`, the evaluation pipelines and the exported
serving signatures apply it by default. The TensorFlow ops that apply a data config are in
`keras_vit.images`; this module needs no TensorFlow.
"""

import os

from keras_vit.preprocessing import (  # noqa: F401 - the data config's definition, importable here
    ANTIALIAS,
    ATTRIBUTE,
    CROP_MODES,
    DEFAULT_IMAGE_SIZE,
    FIELDS,
    INTERPOLATIONS,
    PAPER_INTERPOLATION,
    PAPER_MEAN,
    PAPER_STD,
    TIMM_DEFAULTS,
    as_data_config,
    check_data_config,
    config_image_size,
    is_model,
    model_data_config,
    paper_data_config,
    timm_data_config,
    timm_pretrained_cfg,
    with_image_size,
)
from keras_vit.weights import keras_hub, registry
from keras_vit.weights.layouts import config_from_params
from keras_vit.weights.npz import open_npz
from keras_vit.weights.sources import (  # noqa: F401 - what a checkpoint states, importable here
    checkpoint_data_config,
    checkpoint_model_data_config,
    file_data_config,
    json_data_config,
)

CONFIG_FILE = "config.json"


def resolve_data_config(source=None, image_size=None):
    """The data config (timm's field names) of a model or checkpoint, as timm's
    `resolve_data_config` gives it.

    Args:
        source: one of
            - None: the paper's preprocessing (at `image_size`, else 224);
            - a data config (dict): checked;
            - a model: its `data_config` (the checkpoint's, for a model from
              `keras_vit.from_pretrained`), else the paper's at its input size;
            - a registry name: its entry's `preprocessing`, else the paper's at its resolution;
            - a folder holding a `config.json`, or a `config.json`: keras_vit's `preprocessing`
              or timm's `pretrained_cfg`; a keras-hub preset folder: its image converter's
              (at 224 where it states no size);
            - a checkpoint file (`.npz`, `.safetensors`) or `hf://ORG/NAME`: what its
              metadata or the `config.json` beside it says, else the paper's.
        image_size: int or (height, width), or None. The resolution to give the config
            (crop, interpolation and normalisation kept). Defaults to the source's.

    Returns:
        dict: `input_size`, `interpolation`, `crop_pct`, `crop_mode`, `mean`, `std`,
        `antialias`.

    Raises:
        ValueError: for a malformed data config or a source that is none of these, naming it.
        FileNotFoundError: for a path with no file.

    Examples:
    >>> resolve_data_config("digits")["mean"]
    [0.5, 0.5, 0.5]
    """
    if source is None or isinstance(source, dict) or is_model(source):
        return as_data_config(source, image_size)
    if not isinstance(source, (str, os.PathLike)) or isinstance(source, bytes):
        raise ValueError(f"resolve_data_config takes a model, a data config (dict), a registry "
                         f"name, a config.json or its folder, or a checkpoint file. Received: "
                         f"{source!r:.100}")
    config = _source_data_config(source)
    return with_image_size(config, image_size) if image_size is not None else config


def attach(model, source, entry=None):
    """Gives `model`, built from or loaded with the checkpoint `source`, its data config (at
    the model's own input size) as `model.data_config`; returns the model."""
    setattr(model, ATTRIBUTE, checkpoint_model_data_config(model, source, entry))
    return model  # None: the paper's, as the checkpoint states none


def _source_data_config(source):
    """`resolve_data_config` of a registry name, a path or a URL."""
    if registry.is_registered(source):
        entry = registry.get_checkpoint(source)
        size = entry.get("resolution") or DEFAULT_IMAGE_SIZE
        return checkpoint_data_config(source, entry, size) or paper_data_config(size)
    text = os.fspath(source)
    path = os.path.expanduser(text)
    if os.path.isfile(os.path.join(path, keras_hub.METADATA_FILE)):  # a keras-hub preset
        entry = dict(name=text, preprocessing=keras_hub.preset_preprocessing(path))
        return checkpoint_data_config(source, entry, DEFAULT_IMAGE_SIZE) \
            or paper_data_config(DEFAULT_IMAGE_SIZE)
    if os.path.isdir(path):
        path = os.path.join(path, CONFIG_FILE)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{text} holds no {CONFIG_FILE}. Expected a folder with the "
                                    "config.json of a model (keras_vit's or timm's).")
    if path.endswith(".json"):
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{text}: no such file.")
        return json_data_config(path, required=True)
    if "://" not in text and not os.path.exists(path):
        registry.get_checkpoint(text)  # raises, naming close registry names
    config = file_data_config(source)
    if config is not None:
        return config
    return paper_data_config(_file_image_size(source) or DEFAULT_IMAGE_SIZE)


def _file_image_size(source):
    """The resolution a local `.npz` file's position embedding is learned at, or None."""
    path = os.path.expanduser(os.fspath(source))
    if not path.endswith(".npz") or not os.path.isfile(path):
        return None
    return config_from_params(open_npz(path).placeholders())["image_size"]
