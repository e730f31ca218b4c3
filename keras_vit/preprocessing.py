"""The model's input range, backend-neutral: no TensorFlow, so it serves JAX and PyTorch too.

- `preprocess_inputs`: RGB in [0, 255] to the model's input: `(x / 255 - mean) / std` with a
  data config's mean and std (`keras_vit.data_config`; a model's own by default), with
  `keras.ops`, on any backend. Without one, the paper's [-1, 1] (`x / 127.5 - 1`, vit_jax input
  pipeline).
- `IMAGE_CHANNELS`, `INPUT_SCALE`, `INPUT_OFFSET`: the constants of the paper's input.
- data configs (timm's field names: `input_size`, `interpolation`, `crop_pct`, `crop_mode`,
  `mean`, `std`): `check_data_config`, `paper_data_config`, timm's `pretrained_cfg` both ways,
  `normalization`, the per-channel (scale, offset) of one, and `as_data_config`, the one a
  model carries or a dict states. Reading a registry entry's or a checkpoint's is
  `keras_vit.data_config`'s (`keras_vit.resolve_data_config`).

The TensorFlow image ops (decoding, resizing, cropping, the same normalisation inside `tf.data`
and exported graphs) are in `keras_vit.images`.
"""

import math
import numbers
import os

import numpy as np

from keras import ops

from keras_vit.checks import is_real_dtype
from keras_vit.positions import model_image_size

# The official models see RGB scaled to [-1, 1] (vit_jax input_pipeline: `x / 127.5 - 1`).
INPUT_SCALE = 127.5
INPUT_OFFSET = -1.0
IMAGE_CHANNELS = 3


# --------------------------------------------------------------------------------------------
# Data configs (timm's field names; see `keras_vit.data_config`).

FIELDS = ("input_size", "interpolation", "crop_pct", "crop_mode", "mean", "std")
ANTIALIAS = "antialias"  # keras_vit's own field, optional
# The interpolations keras_vit's resize implements: timm's names ("lanczos" is PIL's three-lobe
# Lanczos, TensorFlow's "lanczos3"), and Keras' other ones (the keras-hub converter's).
INTERPOLATIONS = ("bilinear", "bicubic", "nearest", "lanczos", "area", "lanczos3", "lanczos5")
# timm's crop modes: "center", "squash" and "border" (the longer side to input_size / crop_pct,
# keeping the aspect ratio, then padded with the mean colour to input_size); and Keras' (the
# `Resizing` layer's, which keras-hub's image converters use, at crop_pct 1 only): the centred
# region of the target's aspect ratio cut out, or the image padded with zeros to it, *then*
# resized.
KERAS_CROP_MODES = ("crop_to_aspect_ratio", "pad_to_aspect_ratio")
CROP_MODES = ("center", "squash", "border", *KERAS_CROP_MODES)
# vit_jax input pipeline: `tf.image.resize` (bilinear, no antialias), then `x / 127.5 - 1`.
PAPER_MEAN = PAPER_STD = (0.5, 0.5, 0.5)
# The ranges a data config's numbers are held to: every normalised pixel stays within 1e5 in
# magnitude, and no image is resized beyond MAX_IMAGE_SIDE a side
# (one 3 x 8192 x 8192 float32 image is 0.8 GB).
MAX_MEAN = 100.0
MIN_STD, MAX_STD = 1e-3, 1e3
MAX_IMAGE_SIDE = 8192
PAPER_INTERPOLATION = "bilinear"
# timm's `PretrainedCfg` defaults, for the fields a timm `pretrained_cfg` leaves out.
TIMM_DEFAULTS = dict(input_size=(3, 224, 224), interpolation="bicubic", crop_pct=0.875,
                     crop_mode="center", mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
DEFAULT_IMAGE_SIZE = 224
# The attribute a model built from a checkpoint carries its data config in.
ATTRIBUTE = "data_config"


class _Unchangeable:
    """What `_Values` and `DataConfig` share: mutation refused, copies are the object itself."""

    __slots__ = ()

    def _refuse(self, *args, **kwargs):
        raise TypeError("A DataConfig does not change: use config.replace(field=value), or "
                        "dict(config) for a plain copy.")

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self


class _Values(_Unchangeable, list):
    """A list that does not change (a DataConfig's `input_size`, `mean` and `std`); equal to
    the plain list of its values, and written by `json` as one."""

    __slots__ = ()
    __setitem__ = __delitem__ = __iadd__ = __imul__ = _Unchangeable._refuse
    append = extend = insert = pop = remove = clear = sort = reverse = _Unchangeable._refuse

    def __reduce__(self):
        return list, (list(self),)


class DataConfig(_Unchangeable, dict):
    """A checked data config that cannot change: a `dict` with timm's field names (`FIELDS`)
    and `antialias`, so that `json.dumps`, `dict(config)` and `config["mean"]` work as on the
    dicts timm and keras-hub use; each field is also an attribute (`config.mean`).

    Build one with `DataConfig(mapping)` (checked by `check_data_config`), change one with
    `config.replace(field=value)` (checked again), and give a model one with
    `model.data_config = ...`.
    """

    __slots__ = ()

    def __new__(cls, config=(), where="data config"):
        return super().__new__(cls)

    def __init__(self, config=(), where="data config"):
        if not isinstance(config, DataConfig):
            config = _checked_fields(config, where)
            config.update({field: _Values(config[field])
                           for field in ("input_size", "mean", "std")})
        super().__init__(config)

    def __getattr__(self, field):
        try:
            return self[field]
        except KeyError:
            raise AttributeError(f"DataConfig has no field {field!r}. Expected one of "
                                 f"{', '.join((*FIELDS, ANTIALIAS))}.") from None

    __setitem__ = __delitem__ = __setattr__ = __delattr__ = __ior__ = _Unchangeable._refuse
    clear = pop = popitem = setdefault = update = _Unchangeable._refuse

    def __reduce__(self):
        return DataConfig, (dict(self),)

    def __repr__(self):
        return f"DataConfig({dict.__repr__(self)})"

    def replace(self, **fields):
        """A new DataConfig with `fields` changed (checked)."""
        return DataConfig(dict(self, **fields))

    def at_size(self, image_size):
        """This config at another resolution (crop, interpolation and normalisation kept)."""
        height, width = _pair("image_size", image_size)
        if self["input_size"][1:] == [height, width]:
            return self
        return DataConfig(dict(self, input_size=[IMAGE_CHANNELS, height, width]))

    @property
    def image_size(self):
        """(height, width)."""
        return tuple(self["input_size"][1:])

    @property
    def is_paper(self):
        """Whether this is the paper's preprocessing (at any resolution)."""
        return self == paper_data_config(self.image_size)


def paper_data_config(image_size=DEFAULT_IMAGE_SIZE):
    """The paper's preprocessing at `image_size` (int or (height, width)): a bilinear resize of
    each side, no crop, no antialias, mean = std = 0.5 ([-1, 1] scaling); a `DataConfig`."""
    height, width = _pair("image_size", image_size)
    return DataConfig(dict(
        input_size=[IMAGE_CHANNELS, height, width], interpolation=PAPER_INTERPOLATION,
        crop_pct=1.0, crop_mode="squash", mean=list(PAPER_MEAN), std=list(PAPER_STD),
        antialias=False))


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


def _rgb_numbers(where, field, value, low, high):
    if not isinstance(value, (list, tuple)) or len(value) != IMAGE_CHANNELS \
            or not all(_number(v) and low <= v <= high for v in value):
        raise ValueError(f"{where}: `{field}` must be {IMAGE_CHANNELS} numbers (R, G, B) in "
                         f"[{low:g}, {high:g}] (of pixels scaled to [0, 1]). "
                         f"Received: {field}={value!r:.100}")
    return [float(v) for v in value]


def check_data_config(config, where="data config"):
    """A data config, checked and normalised (lists, floats; `antialias` filled in): a
    `DataConfig`.

    Args:
        config: dict with `FIELDS` (and optionally `antialias`).
        where: str. What holds it (a file and field), for messages.

    Raises:
        ValueError: one line naming `where`, the field, the value and what was expected.
    """
    return config if isinstance(config, DataConfig) else DataConfig(config, where)


def _checked_fields(config, where):
    """`check_data_config`'s checks; the normalised fields as a plain dict."""
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
    if not isinstance(size, (list, tuple)) or len(size) != 3 or size[0] != IMAGE_CHANNELS \
            or not all(
            isinstance(v, numbers.Integral) and not isinstance(v, bool) and v > 0 for v in size):
        raise ValueError(f"{where}: `input_size` must be [3, height, width] (positive ints). "
                         f"Received: input_size={size!r:.100}")
    for field, choices in (("interpolation", INTERPOLATIONS), ("crop_mode", CROP_MODES)):
        if config[field] not in choices:
            raise ValueError(f"{where}: `{field}` {config[field]!r:.100} is not supported. "
                             f"Expected one of {', '.join(choices)}.")
    if max(size[1:]) > MAX_IMAGE_SIDE:
        raise ValueError(f"{where}: `input_size` {size[1]}x{size[2]} is larger than "
                         f"{MAX_IMAGE_SIDE} pixels a side. Expected [3, height, width] of a "
                         "model's input.")
    crop_pct = config["crop_pct"]
    if not _number(crop_pct) or not 0 < crop_pct <= 1:
        raise ValueError(f"{where}: `crop_pct` must be a number in (0, 1]. "
                         f"Received: crop_pct={crop_pct!r:.100}")
    if max(size[1:]) / crop_pct > MAX_IMAGE_SIDE:
        raise ValueError(f"{where}: `crop_pct` {crop_pct:g} would resize images to "
                         f"{max(size[1:]) / crop_pct:.0f} pixels a side before the "
                         f"{max(size[1:])}-pixel crop (at most {MAX_IMAGE_SIDE}). Expected a "
                         "crop_pct near 1 (timm's checkpoints use 0.875 to 1).")
    if config["crop_mode"] in KERAS_CROP_MODES and crop_pct != 1:
        raise ValueError(f"{where}: `crop_mode` {config['crop_mode']!r} (Keras' Resizing) takes "
                         f"crop_pct 1. Received: crop_pct={crop_pct!r:.100}")
    antialias = config.get(ANTIALIAS, True)
    if not isinstance(antialias, bool):
        raise ValueError(f"{where}: `{ANTIALIAS}` must be true or false. "
                         f"Received: {ANTIALIAS}={antialias!r:.100}")
    return dict(input_size=[int(v) for v in size], interpolation=config["interpolation"],
                crop_pct=float(crop_pct), crop_mode=config["crop_mode"],
                mean=_rgb_numbers(where, "mean", config["mean"], -MAX_MEAN, MAX_MEAN),
                std=_rgb_numbers(where, "std", config["std"], MIN_STD, MAX_STD),
                antialias=antialias)


def config_image_size(config):
    """(height, width) of a checked data config."""
    return tuple(config["input_size"][1:])


def with_image_size(config, size):
    """`config` at another resolution (crop, interpolation and normalisation kept)."""
    height, width = _pair("image_size", size)
    resized = dict(config, input_size=[IMAGE_CHANNELS, height, width])
    return DataConfig(resized) if isinstance(config, DataConfig) else resized


def model_data_config(model, image_size=None):
    """The data config a model carries (`model.data_config`), else the paper's at its input
    size; at `image_size` where given."""
    config = getattr(model, ATTRIBUTE, None)
    if config is None and image_size is not None:
        return paper_data_config(image_size)
    if config is None:
        config = paper_data_config(model_image_size(model))
    config = check_data_config(dict(config), f"the data_config of model {model.name!r}")
    return with_image_size(config, image_size) if image_size is not None else config


def is_model(source):
    """Whether `source` is a Keras model (what carries a data config), by its interface: a
    functional model, or one that states its data config (a masked-patch pre-training model)."""
    return hasattr(source, "get_config") and (hasattr(source, "inputs")
                                              or hasattr(source, ATTRIBUTE))


def as_data_config(source=None, image_size=None):
    """The data config that `source`, a `data_config` argument, gives: None, the paper's (at
    `image_size`, else 224); a data config (dict), checked; a model, the one it carries
    (`model_data_config`). At `image_size` where given. A registry name or a checkpoint's path
    is refused, naming `keras_vit.resolve_data_config`, which reads them.

    Raises:
        ValueError: for a malformed data config or another kind of `source`, naming it.
    """
    if is_model(source):
        return model_data_config(source, image_size)
    if source is None:
        return paper_data_config(DEFAULT_IMAGE_SIZE if image_size is None else image_size)
    if isinstance(source, dict):
        config = check_data_config(source)
        return with_image_size(config, image_size) if image_size is not None else config
    hint = ""
    if isinstance(source, (str, os.PathLike)):
        hint = (f" For a registry name or a checkpoint, pass keras_vit.resolve_data_config("
                f"{os.fspath(source)!r:.80}) or the model built from it.")
    raise ValueError(f"data_config must be None, a data config (dict) or a model. Received: "
                     f"{source!r:.100}.{hint}")


def timm_data_config(pretrained_cfg, where="pretrained_cfg"):
    """The data config of a timm `pretrained_cfg` (a dict), timm's defaults (its
    `PretrainedCfg`'s) filling the fields it leaves out.

    Raises:
        ValueError: naming `where` and the field.
    """
    if not isinstance(pretrained_cfg, dict):
        raise ValueError(f"{where} must be a JSON object. Received: {pretrained_cfg!r:.100}")
    config = dict(TIMM_DEFAULTS)
    config.update({field: pretrained_cfg[field] for field in FIELDS
                   if pretrained_cfg.get(field) is not None})
    return check_data_config(config, where)


def timm_pretrained_cfg(config):
    """The six fields of timm's `pretrained_cfg` for a checked data config (timm's own files
    have no `antialias`: its resize is PIL's, which always antialiases)."""
    return {field: config[field] for field in FIELDS}


def normalization(config):
    """(scale, offset), each a list of 3 floats, such that `x / scale + offset` is
    `(x / 255 - mean) / std` for pixels `x` in [0, 255]: scale = 255 std, offset = -mean / std.
    For the paper's mean = std = 0.5 these are exactly `INPUT_SCALE` and `INPUT_OFFSET`, so the
    input is `x / 127.5 - 1` bit for bit."""
    scale = [255.0 * s for s in config["std"]]
    offset = [-m / s for m, s in zip(config["mean"], config["std"])]
    return scale, offset


# The dtypes that hold pixels in [0, 255]: unsigned 8-bit, signed 16-bit and wider, floats.
PIXEL_DTYPES = ("uint8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64")


def _check_pixel_values(images, value_range, floating):
    """For images given as values (eager): every value finite and in `value_range`; float
    images in (0, 1] only where that range is (0, 1). A symbolic tensor is not checked."""
    try:
        values = ops.convert_to_numpy(images)
    except Exception:  # noqa: BLE001 - a symbolic tensor (tf.data, tf.function): no values
        return
    if values.size:
        check_pixel_range(values, value_range, floating, "preprocess_inputs: the images")


# The ranges of float pixels the library takes: [0, 255] and [0, 1].
VALUE_RANGES = ((0, 255), (0, 1))


def check_value_range(value_range, allow_none=False):
    """Refuses a `value_range` other than (0, 255) and (0, 1) (and None, with `allow_none`)."""
    if (value_range is None and allow_none) or (
            isinstance(value_range, (tuple, list)) and tuple(value_range) in VALUE_RANGES):
        return
    raise ValueError(f"`value_range` must be (0, 255) or (0, 1). Received: "
                     f"value_range={value_range!r:.60}")


def check_pixel_range(values, value_range, floating, what, takes_range=True):
    """Refuses pixel `values` (a non-empty array) that are not finite or not in `value_range`,
    and float images in (0, 1] declared as (0, 255) (scaled to [0, 1]): a ValueError naming
    `what` ("the images"), the values and the range expected (with `takes_range`, the
    `value_range` argument for images in [0, 1])."""
    low, high = tuple(value_range)
    least, most = float(values.min()), float(values.max())
    if not (np.isfinite(least) and np.isfinite(most)) or least < low or most > high:
        raise ValueError(f"{what} hold values from {least:.7g} to {most:.7g}, outside [{low}, "
                         f"{high}]. Expected RGB pixels in [{low}, {high}]" + (
                             " (value_range=(0, 1) for float images scaled to [0, 1])."
                             if takes_range else "."))
    if floating and (low, high) == (0, 255) and 0 < most <= 1:
        raise ValueError(f"{what} hold float values from {least:.7g} to {most:.7g}: scaled to "
                         "[0, 1], not [0, 255]. Expected " + (
                             "value_range=(0, 1) for them, or pixels in [0, 255]."
                             if takes_range else "pixels in [0, 255] (multiply them by 255)."))


def preprocessed_range(data_config=None):
    """(lowest, highest): the values `preprocess_inputs` gives pixels in [0, 255] under
    `data_config` (None, a data config or a model), over the three channels."""
    if is_model(data_config):
        data_config = getattr(data_config, ATTRIBUTE, None)
    config = paper_data_config() if data_config is None else check_data_config(data_config)
    scale, offset = normalization(config)
    ends = [end / s + o for s, o in zip(scale, offset) for end in (0.0, 255.0)]
    return min(ends), max(ends)


def check_preprocessed(values, data_config, what):
    """Refuses model inputs `values` (an array) that are not preprocessed pixels: integers, or
    values outside the range `preprocess_inputs` gives under `data_config` widened by twice its
    span on each side (a resize overshoots it, Lanczos' by more than one span at worst; raw
    pixels in [0, 255] lie far beyond); a ValueError naming `what` ("the dataset's images")
    and what is expected."""
    expected = ("Expected images preprocessed for the model: a keras_vit.data pipeline, or "
                "pixels in [0, 255] mapped with keras_vit.preprocess_inputs(images, model).")
    if not is_real_dtype(values.dtype):
        raise ValueError(f"{what} are {values.dtype}, not real pixels. {expected}")
    if np.issubdtype(values.dtype, np.integer) or values.dtype == bool:
        raise ValueError(f"{what} are {values.dtype}, not scaled. {expected}")
    if not values.size:
        return
    low, high = preprocessed_range(data_config)
    margin = 2 * (high - low)
    least, most = float(values.min()), float(values.max())
    if not (np.isfinite(least) and np.isfinite(most)) or least < low - margin \
            or most > high + margin:
        raise ValueError(f"{what} hold values from {least:.7g} to {most:.7g}; the model's "
                         f"preprocessing (model.data_config) gives [{low:.3g}, {high:.3g}]. "
                         f"{expected}")


def preprocess_inputs(images, data_config=None, value_range=(0, 255)):
    """Scales RGB images with values in [0, 255] (uint8 or float) to the model's input, float32.

    Args:
        images: array or tensor `[..., H, W, 3]`.
        data_config: None, a data config (see `keras_vit.resolve_data_config`) or a model
            (the data config it carries): its `mean` and `std` give `(x / 255 - mean) / std`.
            None, or a model that carries none: the paper's [-1, 1] (`x / 127.5 - 1`).
            Defaults to None.
        value_range: (0, 255) or (0, 1): the range of float images (integer images are
            always [0, 255]). Defaults to (0, 255).

    Returns:
        A float32 tensor of the same shape.

    Raises:
        ValueError: if the last axis is not 3 RGB channels, for a malformed data config, for
            a dtype that does not hold pixels in [0, 255] (bool, complex, int8, uint16 and
            wider unsigned integers), or, for images given as values (not a symbolic tensor),
            values outside `value_range` or float images that look scaled to [0, 1] while
            `value_range` is (0, 255).

    Examples:
    >>> preprocess_inputs(np.array([[[[0, 127.5, 255]]]]))  # doctest: +SKIP
    array([[[[-1., 0., 1.]]]], dtype=float32)
    """
    check_value_range(value_range)
    try:
        images = ops.convert_to_tensor(images)
    except (ValueError, TypeError):
        raise ValueError(f"preprocess_inputs expects RGB images [..., height, width, 3], an "
                         f"array or tensor. Received: {type(images).__name__}") from None
    if len(images.shape) < 3 or images.shape[-1] != IMAGE_CHANNELS:
        raise ValueError(
            f"preprocess_inputs expects RGB images [..., height, width, 3]. "
            f"Received shape {tuple(images.shape)}"
        )
    dtype = ops.dtype(images)
    if dtype not in PIXEL_DTYPES:
        raise ValueError(f"preprocess_inputs takes uint8 or float images (or signed integers "
                         f"of 16 bits or more) with values in [0, 255]. Received dtype {dtype}.")
    floating = "float" in dtype
    _check_pixel_values(images, tuple(value_range) if floating else (0, 255), floating)
    if floating and tuple(value_range) == (0, 1):
        images = ops.cast(images, "float32") * 255.0
    return scale_pixels(images, data_config)


def scale_pixels(images, data_config=None):
    """`preprocess_inputs`' scaling of pixels in [0, 255], without its checks of the values
    (for pixels already checked): float32 `(x / 255 - mean) / std` of `data_config` (None, a
    data config or a model, as `preprocess_inputs` takes)."""
    if is_model(data_config):  # the data config it carries, if any
        data_config = getattr(data_config, ATTRIBUTE, None)
    if data_config is None:
        return ops.cast(images, "float32") / INPUT_SCALE + INPUT_OFFSET
    scale, offset = normalization(check_data_config(data_config))
    return ops.cast(images, "float32") / ops.convert_to_tensor(scale, "float32") \
        + ops.convert_to_tensor(offset, "float32")
