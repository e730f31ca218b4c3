"""The model's input range, backend-neutral: no TensorFlow, so it serves JAX and PyTorch too.

- `preprocess_inputs`: RGB in [0, 255] to the model's input range [-1, 1] (`x / 127.5 - 1`,
  vit_jax input pipeline), with `keras.ops`, on any backend.
- `IMAGE_CHANNELS`, `INPUT_SCALE`, `INPUT_OFFSET`: the constants of that input.

The TensorFlow image ops (decoding, resizing, the same scaling inside `tf.data` and exported
graphs) are in `keras_vit.images`.
"""

from keras import ops

# The official models see RGB scaled to [-1, 1] (vit_jax input_pipeline: `x / 127.5 - 1`).
INPUT_SCALE = 127.5
INPUT_OFFSET = -1.0
IMAGE_CHANNELS = 3


def preprocess_inputs(images):
    """Scales RGB images with values in [0, 255] (uint8 or float) to float32 in [-1, 1].

    Args:
        images: array or tensor `[..., H, W, 3]`.

    Returns:
        A float32 tensor of the same shape.

    Raises:
        ValueError: if the last axis is not 3 RGB channels.

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
    return ops.cast(images, "float32") / INPUT_SCALE + INPUT_OFFSET
