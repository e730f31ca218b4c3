"""The model's input range, backend-neutral: no TensorFlow, so it serves JAX and PyTorch too.

- `preprocess_inputs`: RGB in [0, 255] to the model's input: `(x / 255 - mean) / std` with a
  data config's mean and std (`keras_vit.data_config`; a model's own by default), with
  `keras.ops`, on any backend. Without one, the paper's [-1, 1] (`x / 127.5 - 1`, vit_jax input
  pipeline).
- `IMAGE_CHANNELS`, `INPUT_SCALE`, `INPUT_OFFSET`: the constants of the paper's input.
- `normalization`: the per-channel (scale, offset) of a data config.

The TensorFlow image ops (decoding, resizing, cropping, the same normalisation inside `tf.data`
and exported graphs) are in `keras_vit.images`.
"""

from keras import ops

from keras_vit import data_config as data_configs

# The official models see RGB scaled to [-1, 1] (vit_jax input_pipeline: `x / 127.5 - 1`).
INPUT_SCALE = 127.5
INPUT_OFFSET = -1.0
IMAGE_CHANNELS = 3


def normalization(config):
    """(scale, offset), each a list of 3 floats, such that `x / scale + offset` is
    `(x / 255 - mean) / std` for pixels `x` in [0, 255]: scale = 255 std, offset = -mean / std.
    For the paper's mean = std = 0.5 these are exactly `INPUT_SCALE` and `INPUT_OFFSET`, so the
    input is `x / 127.5 - 1` bit for bit."""
    scale = [255.0 * s for s in config["std"]]
    offset = [-m / s for m, s in zip(config["mean"], config["std"])]
    return scale, offset


def preprocess_inputs(images, data_config=None):
    """Scales RGB images with values in [0, 255] (uint8 or float) to the model's input, float32.

    Args:
        images: array or tensor `[..., H, W, 3]`.
        data_config: None, a model or a data config (see `keras_vit.resolve_data_config`): its
            `mean` and `std` give `(x / 255 - mean) / std`. None: the paper's [-1, 1]
            (`x / 127.5 - 1`). Defaults to None.

    Returns:
        A float32 tensor of the same shape.

    Raises:
        ValueError: if the last axis is not 3 RGB channels, or for a malformed data config.

    Examples:
    >>> preprocess_inputs(np.array([[[[0, 127.5, 255]]]]))  # doctest: +SKIP
    array([[[[-1., 0., 1.]]]], dtype=float32)
    """
    images = ops.convert_to_tensor(images)
    if len(images.shape) < 3 or images.shape[-1] != IMAGE_CHANNELS:
        raise ValueError(
            f"preprocess_inputs expects RGB images [..., height, width, 3]. "
            f"Received shape {tuple(images.shape)}"
        )
    if data_config is None:
        return ops.cast(images, "float32") / INPUT_SCALE + INPUT_OFFSET
    scale, offset = normalization(data_configs.resolve_data_config(data_config))
    return ops.cast(images, "float32") / ops.convert_to_tensor(scale, "float32") \
        + ops.convert_to_tensor(offset, "float32")
