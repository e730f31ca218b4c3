"""Images in and out of the model with TensorFlow: decoding, resizing and scaling.

- `decode_image` / `load_image`: the one decoder behind `keras-vit predict`, image folders,
  tensorflow-datasets pipelines and the SavedModel's `serving_default`: JPEG (libjpeg's exact
  integer DCT, `INTEGER_ACCURATE`, as PIL and OpenCV decode), PNG, GIF (first frame), BMP
  and WebP, always as 3-channel RGB. The image's size is read from its header and checked
  against a pixel limit *before* the pixels are decoded, so a small file declaring a huge
  image is refused without allocating it. Files the decoders would misread or print to stderr
  about (a truncated JPEG, an animated WebP, BMPs TensorFlow reads wrongly) are refused by
  name, also before decoding (`keras_vit.image_headers`), and a GIF whose first frame does not
  cover its screen once decoded.
- `resize_crop`, `normalize` and `eval_transform`: a data config's evaluation preprocessing
  (`keras_vit.data_config`), as timm's `create_transform` builds it: resize (with the
  interpolation; "center": the shorter side to `input_size / crop_pct`, keeping the aspect
  ratio; "squash": each side; "border": the longer side, then padding with the mean colour),
  centre crop to `input_size`, then `(x / 255 - mean) / std`; and as keras-hub's image
  converters do (`crop_mode` "crop_to_aspect_ratio" or "pad_to_aspect_ratio": Keras' own
  resize, the crop or zero padding first).
- `resize` and `eval_preprocess`: the paper's (plain bilinear resize to the model resolution,
  no crop, then scaling to [-1, 1]): `eval_transform` of the paper's data config, bit for bit.

`preprocess_inputs`, the same normalisation with `keras.ops` on any backend, is defined in
`keras_vit.preprocessing` (which does not import TensorFlow) and importable from here too.
"""

import ast
import contextlib
import functools
import math
import os
import re
import stat
import tempfile
import warnings

import keras
import tensorflow as tf

from keras_vit.checks import check_positive_int, to_pair
from keras_vit.image_headers import (  # noqa: F401 - jpeg_is_complete is importable from here
    DECLARED_SIZE,
    FORMATS,
    REFUSALS,
    header,
    image_format,
    jpeg_is_complete,
)
from keras_vit.labels import LABEL_SETS, decode_predictions
from keras_vit.weights.keymap import check_finite_outputs
from keras_vit.preprocessing import (  # noqa: F401 - preprocess_inputs is importable from here
    IMAGE_CHANNELS,
    INPUT_OFFSET,
    INPUT_SCALE,
    KERAS_CROP_MODES,
    as_data_config,
    check_pixel_range,
    config_image_size,
    is_model,
    normalization,
    preprocess_inputs,
    scale_pixels,
)

# vit_jax evaluation: `tf.image.resize`, bilinear, half-pixel centres, no antialias.
RESIZE_METHOD = "bilinear"
# libjpeg's exact integer DCT (JDCT_ISLOW), the default of PIL and OpenCV, so that the model
# sees the pixels a client sees; TensorFlow's own default is the coarser INTEGER_FAST.
JPEG_DCT_METHOD = "INTEGER_ACCURATE"
# Images above this many pixels are refused before decoding (a 20000 x 20000 PNG of a few
# hundred KB would otherwise take 1.2 GB as uint8 and twice that in float32). 64 megapixels
# is above any camera image in common use; the limit is an argument everywhere.
DEFAULT_MAX_PIXELS = 64_000_000
# The largest image file read: far above any encoded image of DEFAULT_MAX_PIXELS (an
# uncompressed 64-megapixel BMP is 192 MB), far below a device or /proc file of any size.
MAX_FILE_BYTES = 1 << 30
MISSING = "does not exist"  # `not_regular_file`'s reason for a missing path


# --------------------------------------------------------------------------------------------
# TensorFlow ops, usable eagerly, in tf.data and in exported graphs.


def scale(image):
    """`preprocess_inputs` as a TensorFlow op: [0, 255] to float32 [-1, 1]."""
    return tf.cast(image, tf.float32) / INPUT_SCALE + INPUT_OFFSET


def to_rgb(image):
    """`[H, W, 1]` grey or `[H, W, 3]` to `[H, W, 3]`."""
    if image.shape[-1] == 1:
        return tf.image.grayscale_to_rgb(image)
    return image


def resize(image, size):
    """Bilinear resize (no crop, no antialias) of `[H, W, C]` to `size` = (height, width)."""
    return tf.image.resize(image, size, method=RESIZE_METHOD)


def eval_preprocess(image, size):
    """The official evaluation preprocessing: RGB, resize to `size`, scale to [-1, 1]."""
    return scale(resize(to_rgb(image), size))


# Data config interpolations -> tf.image.resize's methods (timm's "lanczos" is PIL's, a=3).
RESIZE_METHODS = {"bilinear": "bilinear", "bicubic": "bicubic", "nearest": "nearest",
                  "lanczos": "lanczos3", "area": "area", "lanczos3": "lanczos3",
                  "lanczos5": "lanczos5"}


def _resized_size(height, width, config):
    """(height, width) int32 scalars that `resize_crop` resizes an image of height x width
    (int32 scalars) to, as timm's eval transform computes them."""
    target = config_image_size(config)
    # timm: scale_size = floor(input_size / crop_pct).
    scaled = [math.floor(side / config["crop_pct"]) for side in target]
    if config["crop_mode"] == "squash":
        return tf.constant(scaled[0]), tf.constant(scaled[1])
    h, w = tf.cast(height, tf.float64), tf.cast(width, tf.float64)
    if scaled[0] == scaled[1] and config["crop_mode"] == "center":
        # torchvision Resize(int): the shorter side to the size, the longer to
        # int(size * long / short).
        short, long = tf.minimum(h, w), tf.maximum(h, w)
        new_long = tf.floor(scaled[0] * long / short)
        new_h = tf.where(h <= w, tf.constant(float(scaled[0]), tf.float64), new_long)
        new_w = tf.where(h <= w, new_long, tf.constant(float(scaled[0]), tf.float64))
    else:
        # timm ResizeKeepRatio: both sides divided by the smaller ratio ("border": the larger),
        # rounded half to even.
        ratio = (tf.maximum if config["crop_mode"] == "border" else tf.minimum)(
            h / scaled[0], w / scaled[1])
        new_h, new_w = tf.round(h / ratio), tf.round(w / ratio)
    return tf.cast(new_h, tf.int32), tf.cast(new_w, tf.int32)


def resize_crop(image, config):
    """A data config's resize and centre crop of `[H, W, 3]` (float32 in [0, 255]) to its
    `input_size`, as timm's eval transform (`transforms_imagenet_eval`) does with PIL; the
    result is clipped to [0, 255], as PIL's 8-bit images are. Keras' crop modes resize as
    keras-hub's image converters do, with `keras.ops.image.resize` (not clipped)."""
    height, width = config_image_size(config)
    if config["crop_mode"] in KERAS_CROP_MODES:  # keras-hub's converters: Keras' own resize
        image = keras.ops.image.resize(
            tf.cast(image, tf.float32), (height, width), interpolation=config["interpolation"],
            antialias=config["antialias"], **{config["crop_mode"]: True})
        return tf.ensure_shape(image, [height, width, None])  # not clipped, as keras-hub's
    shape = tf.shape(image)
    new_h, new_w = _resized_size(shape[0], shape[1], config)
    # A thin image resizes to almost nothing ("border") or to a strip of gigabytes before its
    # crop ("center"): refused, as an image that declares more than DEFAULT_MAX_PIXELS is.
    pixels = tf.cast(new_h, tf.int64) * tf.cast(new_w, tf.int64)
    check = tf.debugging.Assert(
        (new_h >= 1) & (new_w >= 1) & (pixels <= DEFAULT_MAX_PIXELS),
        [tf.strings.format(
            "An image of {}x{} pixels resizes to {}x{} before its crop (the "
            f"{config['crop_mode']} resize of the data config). Expected 1 to "
            f"{DEFAULT_MAX_PIXELS:,} pixels there: an image of a less extreme aspect ratio.",
            (shape[0], shape[1], new_h, new_w))])
    with tf.control_dependencies([check]):
        image = tf.identity(image)
    # new_size = [new_h, new_w]; an image already at that size is kept as it is.
    same = tf.logical_and(tf.equal(new_h, shape[0]), tf.equal(new_w, shape[1]))
    if config["interpolation"] == "nearest":  # PIL's, which picks other pixels than TF's
        resize = lambda: _pil_nearest(tf.cast(image, tf.float32), new_h, new_w)  # noqa: E731
    else:
        resize = lambda: tf.image.resize(  # noqa: E731
            image, tf.stack([new_h, new_w]), method=RESIZE_METHODS[config["interpolation"]],
            antialias=config["antialias"])
    image = tf.cond(same, lambda: tf.cast(image, tf.float32), resize)
    if config["crop_mode"] == "border":
        # timm CenterCropOrPad: pad the short sides with the mean colour, round(255 * mean),
        # (size - side) // 2 before and the rest after.
        fill = tf.constant([round(255 * m) for m in config["mean"]], tf.float32)
        pad_h, pad_w = tf.maximum(height - new_h, 0), tf.maximum(width - new_w, 0)
        image = tf.pad(image - fill, [[pad_h // 2, pad_h - pad_h // 2],
                                      [pad_w // 2, pad_w - pad_w // 2], [0, 0]]) + fill
        new_h, new_w = new_h + pad_h, new_w + pad_w
    # torchvision CenterCrop: offsets int(round((size - crop) / 2)), half to even.
    top = tf.cast(tf.round(tf.cast(new_h - height, tf.float64) / 2), tf.int32)
    left = tf.cast(tf.round(tf.cast(new_w - width, tf.float64) / 2), tf.int32)
    image = image[top:top + height, left:left + width]  # [height, width, 3]
    return tf.ensure_shape(tf.clip_by_value(image, 0.0, 255.0), [height, width, None])


def _pil_nearest_rows(size, new):
    """The source rows (or columns) of PIL's nearest-neighbour resize of `size` to `new`:
    PIL steps a double from half a scale by the scale and truncates it
    (`ImagingScaleAffine`); the steps' rounding is replayed by a running sum, so that the
    rows whose position falls on a border are PIL's."""
    scale = tf.cast(size, tf.float64) / tf.cast(new, tf.float64)
    with tf.device("/CPU:0"):  # a running sum in float64, added in order
        positions = tf.math.cumsum(tf.concat([[scale * 0.5], tf.fill([new - 1], scale)], 0))
    return tf.minimum(tf.cast(positions, tf.int32), size - 1)


def _pil_nearest(image, new_h, new_w):
    """`[H, W, C]` resized to `new_h` x `new_w` as PIL's `Image.resize(NEAREST)` does."""
    shape = tf.shape(image)
    rows = tf.gather(image, _pil_nearest_rows(shape[0], new_h), axis=0)
    return tf.gather(rows, _pil_nearest_rows(shape[1], new_w), axis=1)


def normalize(images, config):
    """`(x / 255 - mean) / std` of float images in [0, 255] with a data config's mean and
    std, as a TensorFlow op (`scale` for the paper's, bit for bit)."""
    scale_, offset = normalization(config)
    return tf.cast(images, tf.float32) / tf.constant(scale_, tf.float32) \
        + tf.constant(offset, tf.float32)


def eval_transform(image, config):
    """A data config's evaluation preprocessing of one image `[H, W, 1 or 3]` in [0, 255]:
    RGB, `resize_crop`, `normalize`."""
    return normalize(resize_crop(to_rgb(image), config), config)


def check_encoded(data, max_pixels=DEFAULT_MAX_PIXELS, name="image"):
    """Eager form of `decode_image`'s checks: raises ValueError naming `name` for an
    unsupported format, a truncated JPEG, an animated WebP, an OS/2 BMP or an image above
    `max_pixels`."""
    data = tf.constant(data) if isinstance(data, bytes) else data
    head = header(data)
    fmt = int(image_format(data, head))
    if fmt < 0:
        start = bytes(tf.strings.substr(head, 0, 8).numpy()).rstrip(b"\0")
        raise ValueError(f"{name} is not an image in a supported format ({len(data.numpy())} "
                         f"bytes starting with {start!r}). Expected one of "
                         f"{', '.join(FORMATS)}.")
    for refused, message in REFUSALS[fmt]:
        if bool(refused(data, head)):
            raise ValueError(f"{name} {message}.")
    if max_pixels is not None:
        try:
            height, width = (int(v) for v in DECLARED_SIZE[fmt](data, head))
        except tf.errors.OpError as e:  # a header too short or broken to read the size from
            raise ValueError(f"{name} is not a readable {FORMATS[fmt]} image "
                             f"({first_line(e.message)}).") from None
        if height * width > max_pixels:
            raise ValueError(f"{name} is a {FORMATS[fmt]} image of {height} x {width} pixels, "
                             f"above the limit of {max_pixels:,} pixels (max_pixels).")


def decode_image(data, max_pixels=DEFAULT_MAX_PIXELS, name="image", window=None):
    """Decodes one encoded image (scalar string tensor) to uint8 RGB `[H, W, 3]`.

    The format must be one of `FORMATS`, the file none of those its decoder cannot read right
    (a truncated JPEG, an animated WebP, an OS/2 BMP) and the size its header declares at most
    `max_pixels` (None: no limit); all are checked before decoding, so that the decoders never
    see such files. Only the checks of the file's own format run. A failed check raises
    `tf.errors.InvalidArgumentError` with a readable message (no raw bytes).

    `window` (None, or a function from the image's shape `[H, W, 3]` to the `(begin, size)`
    of a box, as `tf.slice` takes them) decodes that box only: a JPEG only the blocks under it
    (`tf.image.decode_and_crop_jpeg`, as big_vision's inception crop decodes), where the
    box's outermost pixels can differ from a slice of the whole image (their chroma is
    upsampled without the neighbours outside the box), and damage to the file's data outside
    the box goes unseen; another format whole, then sliced.
    """
    head = header(data)
    fmt = image_format(data, head)

    def unknown():
        check = tf.debugging.Assert(
            False,
            [f"{name} is not an image in a supported format. Expected one of "
             f"{', '.join(FORMATS)}; received", tf.strings.length(data), "bytes starting with",
             tf.io.decode_raw(tf.strings.substr(data, 0, 8), tf.uint8)],
            summarize=8,
        )
        with tf.control_dependencies([check]):
            return tf.zeros([0, 0, IMAGE_CHANNELS], tf.uint8)

    branches = [functools.partial(_checked_decode, data, head, i, max_pixels, name, window)
                for i in range(len(FORMATS))]
    image = tf.switch_case(fmt, branches, default=unknown)
    return tf.ensure_shape(image, [None, None, IMAGE_CHANNELS])


def _checked_decode(data, head, fmt, max_pixels, name, window):
    """`decode_image` of a file in format `FORMATS[fmt]` (a Python int): its checks, then its
    decoder."""
    checks = [tf.debugging.Assert(tf.logical_not(refused(data, head)), [f"{name} {message}"])
              for refused, message in REFUSALS[fmt]]
    jpeg_window = FORMATS[fmt] == "JPEG" and window is not None
    if max_pixels is not None or jpeg_window:
        with tf.control_dependencies(checks):
            height, width = DECLARED_SIZE[fmt](data, head)
    if max_pixels is not None:
        pixels = tf.cast(height, tf.float64) * tf.cast(width, tf.float64)  # no int64 overflow
        checks.append(tf.debugging.Assert(
            pixels <= float(max_pixels),
            [f"{name} declares", height, "x", width, f"pixels, above the limit of {max_pixels} "
             "pixels (max_pixels)"],
        ))
    with tf.control_dependencies(checks):
        if jpeg_window:  # only the blocks under the box
            begin, size = window(tf.cast(tf.stack([height, width, IMAGE_CHANNELS]), tf.int32))
            box = tf.concat([begin[:2], size[:2]], 0)  # [y, x, height, width]
            return tf.image.decode_and_crop_jpeg(data, box, channels=IMAGE_CHANNELS,
                                                 dct_method=JPEG_DCT_METHOD)
        if FORMATS[fmt] == "JPEG":
            return tf.io.decode_jpeg(data, channels=IMAGE_CHANNELS, dct_method=JPEG_DCT_METHOD)
        if FORMATS[fmt] == "WebP":
            # Its decoder converts no channels (RGB, or RGBA with alpha): alpha is dropped, as
            # Pillow's convert("RGB") and the PNG decoder drop it.
            image = tf.io.decode_image(data, channels=0, expand_animations=False)
            return cut_window(image[..., :IMAGE_CHANNELS], window)
        image = tf.io.decode_image(data, channels=IMAGE_CHANNELS, expand_animations=False)
        if FORMATS[fmt] == "GIF":
            image = _whole_first_frame(image, data, head, name)
        return cut_window(image, window)


def _whole_first_frame(image, data, head, name):
    """A decoded GIF once its first frame covers the GIF's screen: TensorFlow's decoder gives
    a smaller first frame (placed at an offset) at its own size, where Pillow composes it onto
    the screen (a larger one, both read at its size)."""
    height, width = DECLARED_SIZE[FORMATS.index("GIF")](data, head)
    covers = tf.reduce_all(tf.cast(tf.shape(image)[:2], tf.int64) >= tf.stack([height, width]))
    check = tf.debugging.Assert(covers, [
        f"{name} is a GIF image whose first frame does not cover its screen (a smaller frame "
        "at an offset), which cannot be decoded right. Expected a GIF whose first frame fills "
        "the image (or the image as PNG)"])
    with tf.control_dependencies([check]):
        return tf.identity(image)


def cut_window(image, window):
    """`image` `[H, W, C]`, or the box that `window` (as `decode_image` takes it) gives for its
    shape."""
    if window is None:
        return image
    begin, size = window(tf.shape(image))
    return tf.slice(image, begin, size)


def load_image(path, size=None, max_pixels=DEFAULT_MAX_PIXELS, data_config=None):
    """Reads an image file as RGB and resizes it: with `data_config`, as its evaluation
    transform does (interpolation, crop); else with a bilinear resize of each side to `size`,
    no crop (the paper's).

    Args:
        path: str. A JPEG, PNG, GIF, BMP or WebP file.
        size: int or (height, width), or None. The size to resize to (with `data_config`: its
            `input_size` by default).
        max_pixels: int or None. Refuse images whose header declares more pixels.
        data_config: None, a model or a data config (a dict; a registry entry's or a
            checkpoint's: `keras_vit.resolve_data_config`): pass the model to apply its own
            preprocessing. Defaults to None.

    Returns:
        float32 array `[H, W, 3]` with values in [0, 255]; apply `preprocess_inputs` (with the
        same `data_config`).

    Raises:
        FileNotFoundError: for a missing file.
        ValueError: naming the file, if it is not a regular file (a FIFO, a device), not a
            supported image or too large; for neither `size` nor `data_config`.
    """
    if data_config is None and size is None:
        raise ValueError("load_image needs a `size` or a `data_config` (e.g. the model).")
    size = None if size is None else to_pair("size", size)
    max_pixels = check_positive_int("max_pixels", max_pixels, allow_none=True)
    config = as_data_config(data_config, size)  # None: the paper's at `size`
    path = os.path.expanduser(os.fspath(path))
    reason = not_regular_file(path)
    if reason:
        raise (FileNotFoundError if reason == MISSING else ValueError)(
            f"Image file {path} {reason}.")
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:  # a file that stat calls regular but that cannot be read (/proc)
        raise ValueError(f"Image file {path} cannot be read ({e.strerror or e}).") from None
    if len(data) > MAX_FILE_BYTES:
        raise ValueError(f"Image file {path} is larger than {MAX_FILE_BYTES:,} bytes. Expected "
                         "an encoded image (JPEG, PNG, GIF, BMP or WebP).")
    data = tf.constant(data)
    try:
        with _decoder_messages() as messages:
            check_encoded(data, max_pixels, name=path)
            image = decode_image(data, None, name=path)
    except tf.errors.OpError as e:
        line = first_line(e.message)  # a refusal of decode_image's names the file already
        raise ValueError(line if line.startswith(f"{path} ") else f"Cannot read {path}: {line}") \
            from None
    if messages:  # libjpeg's warnings: the image decoded, damaged
        warnings.warn(f"{path}: {'; '.join(dict.fromkeys(messages))} (decoded anyway)",
                      stacklevel=2)
    try:
        return resize_crop(tf.cast(image, tf.float32), config).numpy()
    except tf.errors.InvalidArgumentError as e:
        raise ValueError(f"Cannot resize {path}: {first_line(e.message)}") from None


@contextlib.contextmanager
def _decoder_messages():
    """Collects what the image decoders' C libraries print on file descriptor 2 during the
    block (libjpeg's "Corrupt JPEG data: ..."), as a list of lines, instead of letting them
    reach the terminal outside any error or warning."""
    messages = []
    try:
        saved = os.dup(2)
    except OSError:  # no standard error to redirect
        yield messages
        return
    try:
        with tempfile.TemporaryFile() as captured:
            os.dup2(captured.fileno(), 2)
            try:
                yield messages
            finally:
                os.dup2(saved, 2)
                captured.seek(0)
                text = captured.read(1 << 16).decode("utf-8", "replace")
                messages += [line.strip() for line in text.splitlines() if line.strip()]
    finally:
        os.close(saved)


# The most images `classify_images` gives a model's first prediction by Keras' own call.
EAGER_IMAGES = 4


def classify_images(model, images, top=5, class_names=None, max_pixels=DEFAULT_MAX_PIXELS,
                    batch_size=32, data_config=None):
    """From pixels to classes in one call, with the preprocessing the model's weights expect
    (`model.data_config`: its checkpoint's resize, crop, mean and std), as keras-hub's
    `ImageClassifier.predict` takes raw images.

    Args:
        model: a classifier (`keras_vit.from_pretrained(...)`, any `keras_vit.ViT`).
        images: a path or a list of paths (JPEG, PNG, GIF, BMP, WebP), or RGB images in
            [0, 255] of any size: one `[H, W, 3]` array, a batch `[B, H, W, 3]` or a list of
            arrays (each resized and cropped as the data config says).
        top: int. Classes per image. Defaults to 5.
        class_names: list of str or None. See `keras_vit.decode_predictions`: ImageNet's names
            for 1000 and 21843 classes, else the class indices. Defaults to None.
        max_pixels: int or None. Image files declaring more pixels are refused.
        batch_size: int. Images per forward pass. Defaults to 32.
        data_config: None or a data config: another preprocessing (e.g. the model's own at
            another size, for a model of any input size). Defaults to None: the model's.

    Returns:
        For each image, a list of `(class_id, name, probability)`, most likely first.

    Raises:
        FileNotFoundError, ValueError: naming the file or the array that cannot be read.

    Examples:
    >>> model = keras_vit.from_pretrained("digits")  # doctest: +SKIP
    >>> keras_vit.classify_images(model, "seven.png", top=1)  # doctest: +SKIP
    [[('7', '7', 0.98)]]
    """
    if not is_model(model):
        raise ValueError(f"classify_images takes the model first, then the images: "
                         f"classify_images(model, images). Received a {type(model).__name__} "
                         "as the model.")
    config = as_data_config(model if data_config is None else data_config)
    max_pixels = check_positive_int("max_pixels", max_pixels, allow_none=True)
    top, batch_size = check_positive_int("top", top), check_positive_int("batch_size", batch_size)
    if isinstance(images, (str, os.PathLike)) or (hasattr(images, "ndim") and images.ndim == 3):
        images = [images]
    if not isinstance(images, (list, tuple)) and not hasattr(images, "ndim"):
        raise ValueError(f"classify_images takes a path, an image [height, width, 3], a batch "
                         f"or a list of them. Received: {type(images).__name__}")
    logits = []
    # A model's first prediction of a few images: Keras' own call, as `Model.predict`'s
    # documentation advises for inputs that fit in one batch, skips making and tracing the
    # prediction function, which costs more there than it saves (BENCHMARKS.md).
    few = len(images) <= EAGER_IMAGES and getattr(model, "predict_function", None) is None
    for start in range(0, len(images), batch_size):
        batch = [_pixels(image, config, max_pixels) for image in images[start:start + batch_size]]
        # The values were checked by `_pixels` (a dark image, resized to floats in [0, 1], is
        # no image scaled to [0, 1]).
        inputs = scale_pixels(tf.stack(batch), config)
        logits.append(keras.ops.convert_to_numpy(model(inputs, training=False)) if few
                      else model.predict_on_batch(inputs))
    if not logits:
        raise ValueError("classify_images got no images. Expected a path, an image or a list.")
    check_finite_outputs(model, tf.concat(logits, 0).numpy(), "classify_images")
    num_classes = logits[0].shape[-1]
    if class_names is None and num_classes not in LABEL_SETS:  # the class indices
        class_names = [str(i) for i in range(num_classes)]
    return decode_predictions(tf.concat(logits, 0).numpy(), top=top,
                              class_names=class_names)


def _pixels(image, config, max_pixels):
    """`[height, width, 3]` float32 in [0, 255] of a path or an RGB array, resized and cropped
    as the data config says."""
    if isinstance(image, (str, os.PathLike)):
        return load_image(image, max_pixels=max_pixels, data_config=config)
    array = tf.convert_to_tensor(image)
    if array.shape.rank != 3 or array.shape[-1] != IMAGE_CHANNELS or not (
            array.dtype == tf.uint8 or array.dtype.is_floating):
        raise ValueError(f"classify_images takes RGB images [height, width, 3], uint8 or float "
                         f"in [0, 255]. Received shape {tuple(array.shape)} of "
                         f"{array.dtype.name}")
    if not array.shape.num_elements():
        raise ValueError(f"classify_images got an empty image (shape {tuple(array.shape)}). "
                         "Expected RGB images [height, width, 3] of at least one pixel.")
    # Before the resize, which clips to [0, 255]: a range error shows in the pixels given.
    check_pixel_range(array.numpy(), (0, 255), array.dtype.is_floating,
                      "classify_images' images", takes_range=False)
    try:
        return resize_crop(tf.cast(array, tf.float32), config)
    except tf.errors.InvalidArgumentError as e:
        raise ValueError(f"Cannot resize the image of shape {tuple(array.shape)}: "
                         f"{first_line(e.message)}") from None


def not_regular_file(path):
    """Why `path` cannot be read as an image file (a FIFO, a socket, a device: reading one
    could wait forever), or None for a regular file (or a link to one)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return MISSING
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    if stat.S_ISREG(mode):
        return None
    kind = ("a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "a folder" if stat.S_ISDIR(mode) else "something else")
    return f"is {kind}, not a regular file"


def first_line(message):
    """The readable part of a TensorFlow op error: its first line, without the node name or
    the op's name (` [Op:DecodeImage] name: `), and for a failed `tf.debugging.Assert` its
    message."""
    lines = [line for line in message.strip().splitlines() if line.strip()]
    first = lines[0] if lines else message
    if first.startswith("{{"):
        first = first.split("} ", 1)[-1]
    if "Summarized data:" in first:
        first = " ".join([first.split("Summarized data:", 1)[1]] + lines[1:3])
    first = first.split(" [Op:")[0].split("[Op:")[0].strip() or first.strip()
    if re.fullmatch(r"""b(['"]).*\1""", first):  # one string of an Assert, printed as bytes
        try:
            first = ast.literal_eval(first).decode(errors="replace")
        except (SyntaxError, ValueError):  # several items, not one literal
            pass
    return first
