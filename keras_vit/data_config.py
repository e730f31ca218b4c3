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

import math
import numbers
import os

FIELDS = ("input_size", "interpolation", "crop_pct", "crop_mode", "mean", "std")
ANTIALIAS = "antialias"  # keras_vit's own field, optional
# timm's interpolation names that keras_vit's resize implements (tf.image.resize: "lanczos" is
# PIL's three-lobe Lanczos, TensorFlow's "lanczos3").
INTERPOLATIONS = ("bilinear", "bicubic", "nearest", "lanczos")
CROP_MODES = ("center", "squash")
RGB = 3
# vit_jax input pipeline: `tf.image.resize` (bilinear, no antialias), then `x / 127.5 - 1`.
PAPER_MEAN = PAPER_STD = (0.5, 0.5, 0.5)
PAPER_INTERPOLATION = "bilinear"
# timm's `PretrainedCfg` defaults, for the fields a timm `pretrained_cfg` leaves out.
TIMM_DEFAULTS = dict(interpolation="bicubic", crop_pct=0.875, crop_mode="center",
                     mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
DEFAULT_IMAGE_SIZE = 224
CONFIG_FILE = "config.json"
# The attribute a model built from a checkpoint carries its data config in.
ATTRIBUTE = "data_config"


def paper_data_config(image_size=DEFAULT_IMAGE_SIZE):
    """The paper's preprocessing at `image_size` (int or (height, width)): a bilinear resize of
    each side, no crop, no antialias, mean = std = 0.5 ([-1, 1] scaling)."""
    height, width = _pair("image_size", image_size)
    return dict(input_size=[RGB, height, width], interpolation=PAPER_INTERPOLATION,
                crop_pct=1.0, crop_mode="squash", mean=list(PAPER_MEAN), std=list(PAPER_STD),
                antialias=False)


def _pair(field, value):
    values = (value, value) if isinstance(value, numbers.Integral) else value
    if not isinstance(values, (list, tuple)) or len(values) != 2 or not all(
            isinstance(v, numbers.Integral) and not isinstance(v, bool) and v > 0
            for v in values):
        raise ValueError(f"`{field}` must be a positive int or (height, width). "
                         f"Received: {field}={value!r:.100}")
    return int(values[0]), int(values[1])


def _number(value):
    return isinstance(value, numbers.Real) and not isinstance(value, bool) \
        and math.isfinite(value)


def _rgb_numbers(where, field, value, positive=False):
    if not isinstance(value, (list, tuple)) or len(value) != RGB \
            or not all(_number(v) and (v > 0 or not positive) for v in value):
        what = "positive numbers" if positive else "numbers"
        raise ValueError(f"{where}: `{field}` must be {RGB} {what} (R, G, B). "
                         f"Received: {field}={value!r:.100}")
    return [float(v) for v in value]


def check_data_config(config, where="data config"):
    """A data config, checked and normalised (lists, floats; `antialias` filled in).

    Args:
        config: dict with `FIELDS` (and optionally `antialias`).
        where: str. What holds it (a file and field), for messages.

    Raises:
        ValueError: one line naming `where`, the field, the value and what was expected.
    """
    if not isinstance(config, dict):
        raise ValueError(f"{where} must be a JSON object with {', '.join(FIELDS)}. "
                         f"Received: {config!r:.100}")
    unknown = sorted(set(config) - set(FIELDS) - {ANTIALIAS})
    missing = [field for field in FIELDS if field not in config]
    if unknown or missing:
        problem = f"has unknown fields {unknown}" if unknown else f"lacks {missing}"
        raise ValueError(f"{where} {problem}. Expected the fields {', '.join(FIELDS)} "
                         f"(and optionally {ANTIALIAS}).")
    size = config["input_size"]
    if not isinstance(size, (list, tuple)) or len(size) != RGB or size[0] != RGB or not all(
            isinstance(v, numbers.Integral) and not isinstance(v, bool) and v > 0 for v in size):
        raise ValueError(f"{where}: `input_size` must be [3, height, width] (positive ints). "
                         f"Received: input_size={size!r:.100}")
    for field, choices in (("interpolation", INTERPOLATIONS), ("crop_mode", CROP_MODES)):
        if config[field] not in choices:
            raise ValueError(f"{where}: `{field}` {config[field]!r:.100} is not supported. "
                             f"Expected one of {', '.join(choices)}.")
    crop_pct = config["crop_pct"]
    if not _number(crop_pct) or not 0 < crop_pct <= 1:
        raise ValueError(f"{where}: `crop_pct` must be a number in (0, 1]. "
                         f"Received: crop_pct={crop_pct!r:.100}")
    antialias = config.get(ANTIALIAS, True)
    if not isinstance(antialias, bool):
        raise ValueError(f"{where}: `{ANTIALIAS}` must be true or false. "
                         f"Received: {ANTIALIAS}={antialias!r:.100}")
    return dict(input_size=[int(v) for v in size], interpolation=config["interpolation"],
                crop_pct=float(crop_pct), crop_mode=config["crop_mode"],
                mean=_rgb_numbers(where, "mean", config["mean"]),
                std=_rgb_numbers(where, "std", config["std"], positive=True),
                antialias=antialias)


def image_size(config):
    """(height, width) of a checked data config."""
    return tuple(config["input_size"][1:])


def with_image_size(config, size):
    """`config` at another resolution (crop, interpolation and normalisation kept)."""
    height, width = _pair("image_size", size)
    return dict(config, input_size=[RGB, height, width])


def timm_data_config(pretrained_cfg, where="pretrained_cfg"):
    """The data config of a timm `pretrained_cfg` (a dict), timm's defaults filling the fields
    it leaves out; `input_size` is required.

    Raises:
        ValueError: naming `where` and the field.
    """
    if not isinstance(pretrained_cfg, dict) or "input_size" not in pretrained_cfg:
        raise ValueError(f"{where} must be a JSON object with `input_size` [3, height, width]. "
                         f"Received: {pretrained_cfg!r:.100}")
    config = dict(TIMM_DEFAULTS)
    config.update({field: pretrained_cfg[field] for field in FIELDS
                   if pretrained_cfg.get(field) is not None})
    return check_data_config(config, where)


def timm_pretrained_cfg(config):
    """The six fields of timm's `pretrained_cfg` for a checked data config (timm's own files
    have no `antialias`: its resize is PIL's, which always antialiases)."""
    return {field: config[field] for field in FIELDS}


def _is_model(source):
    return hasattr(source, "inputs") and hasattr(source, "get_config")


def model_data_config(model, image_size=None):
    """The data config a model carries (`model.data_config`), else the paper's at its input
    size; at `image_size` where given."""
    config = getattr(model, ATTRIBUTE, None)
    if config is None and image_size is not None:
        return paper_data_config(image_size)
    if config is None:
        from keras_vit.model_parts import model_image_size

        config = paper_data_config(model_image_size(model))
    config = check_data_config(dict(config), f"the data_config of model {model.name!r}")
    return with_image_size(config, image_size) if image_size is not None else config


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
              or timm's `pretrained_cfg`;
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
    if _is_model(source):
        return model_data_config(source, image_size)
    if source is None:
        config = paper_data_config(image_size or DEFAULT_IMAGE_SIZE)
    elif isinstance(source, dict):
        config = check_data_config(source)
    elif isinstance(source, (str, os.PathLike)) and not isinstance(source, bytes):
        config = _source_data_config(source)
    else:
        raise ValueError(f"resolve_data_config takes a model, a data config (dict), a registry "
                         f"name, a config.json or its folder, or a checkpoint file. Received: "
                         f"{source!r:.100}")
    return with_image_size(config, image_size) if image_size is not None else config


def checkpoint_data_config(source, entry=None):
    """The data config a checkpoint states: its registry entry's `preprocessing` (`entry`:
    the entry `keras_vit.weights.fetch_params` returned, where there is one), else what its
    file's metadata or `config.json` says; None where nothing says (the paper's applies).

    Raises:
        keras_vit.CheckpointError: naming the file or entry and the field, for a malformed one.
    """
    from keras_vit.weights import registry
    from keras_vit.weights.errors import CheckpointError

    if entry and entry.get("preprocessing") is not None:
        try:
            return check_data_config(entry["preprocessing"],
                                     f"checkpoint {entry.get('name')!r}'s preprocessing")
        except ValueError as e:
            raise CheckpointError(str(e)) from None
    if registry.is_registered(source):
        return None
    return _file_data_config(source)


def attach(model, source, entry=None):
    """Gives `model`, built from the checkpoint `source`, its data config (at the model's own
    input size) as `model.data_config`; returns the model."""
    config = checkpoint_data_config(source, entry)
    setattr(model, ATTRIBUTE, None)  # the paper's where the checkpoint states none
    if config is not None:
        from keras_vit.model_parts import model_image_size

        setattr(model, ATTRIBUTE, with_image_size(config, model_image_size(model)))
    return model


def _source_data_config(source):
    from keras_vit.weights import registry

    if registry.is_registered(source):
        entry = registry.get_checkpoint(source)
        config = checkpoint_data_config(source, entry)
        return config or paper_data_config(entry.get("resolution") or DEFAULT_IMAGE_SIZE)
    text = os.fspath(source)
    path = os.path.expanduser(text)
    if os.path.isdir(path):
        path = os.path.join(path, CONFIG_FILE)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{text} holds no {CONFIG_FILE}. Expected a folder with the "
                                    "config.json of a model (keras_vit's or timm's).")
    if path.endswith(".json"):
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{text}: no such file.")
        return _json_data_config(path, required=True)
    if not text.startswith("hf://") and "://" not in text and not os.path.exists(path):
        registry.get_checkpoint(text)  # raises, naming close registry names
    config = _file_data_config(source)
    if config is not None:
        return config
    return paper_data_config(_file_image_size(source) or DEFAULT_IMAGE_SIZE)


def _json_data_config(path, required=False):
    """The data config in a `config.json`: keras_vit's `preprocessing` or timm's
    `pretrained_cfg`; None for a keras_vit one without (or another tool's, unless
    `required`)."""
    from keras_vit.weights.config_json import KERAS_VIT_FORMAT, read_json
    from keras_vit.weights.errors import CheckpointError

    document = read_json(path, "a model's config.json")
    try:
        if isinstance(document, dict) and document.get("format") == KERAS_VIT_FORMAT:
            stated = document.get("preprocessing")
            return None if stated is None else check_data_config(
                stated, f"{path}: `preprocessing`")
        if isinstance(document, dict) and "pretrained_cfg" in document:
            return timm_data_config(document["pretrained_cfg"], f"{path}: `pretrained_cfg`")
    except ValueError as e:
        raise CheckpointError(str(e)) from None
    if required:
        raise CheckpointError(f"{path} states no preprocessing. Expected keras_vit's config.json "
                              "(`preprocessing`) or timm's (`pretrained_cfg`).")
    return None


def _file_data_config(source):
    """The data config a checkpoint file states (a `.safetensors` file's keras_vit metadata,
    else the `config.json` beside the file or in the `hf://` repository), or None."""
    text = os.fspath(source)
    if text.startswith("hf://"):
        path = _cached_hub_config(text)
        return _json_data_config(path) if path else None
    if "://" in text:
        return None
    path = os.path.expanduser(text)
    if path.endswith(".safetensors") and os.path.isfile(path):
        from keras_vit.weights import hub

        own = hub.read_own_config(path)
        if own and own.get("preprocessing") is not None:
            return own["preprocessing"]
    beside = os.path.join(os.path.dirname(path), CONFIG_FILE)
    return _json_data_config(beside) if os.path.isfile(beside) else None


def _cached_hub_config(source):
    """The `config.json` of `hf://ORG/NAME[@REVISION]` in the Hugging Face cache (where
    `from_pretrained` put it), or None."""
    import huggingface_hub

    from keras_vit.weights import hub

    repo, revision = hub.parse_hub(source)
    path = huggingface_hub.try_to_load_from_cache(repo, CONFIG_FILE, revision=revision)
    return path if isinstance(path, str) else None


def _file_image_size(source):
    """The resolution a local `.npz` file's position embedding is learned at, or None."""
    path = os.path.expanduser(os.fspath(source))
    if not path.endswith(".npz") or not os.path.isfile(path):
        return None
    from keras_vit.weights.layouts import config_from_params
    from keras_vit.weights.npz import open_npz

    return _pair("image_size", config_from_params(open_npz(path).placeholders())["image_size"])
