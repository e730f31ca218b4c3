"""Input scaling of the official models: RGB in [0, 255] to [-1, 1] (`x / 127.5 - 1`)."""

from keras import ops

# The official models see RGB scaled to [-1, 1] (vit_jax input_pipeline: `x / 127.5 - 1`).
INPUT_SCALE = 127.5
INPUT_OFFSET = -1.0


def preprocess_inputs(images):
    """Scales RGB images with values in [0, 255] (uint8 or float) to float32 in [-1, 1].

    Args:
        images: array or tensor `[..., H, W, 3]`.

    Returns:
        A float32 tensor of the same shape.

    Raises:
        ValueError: if the last axis is not 3 RGB channels.

    Example:
    >>> preprocess_inputs(np.array([[[[0, 127.5, 255]]]]))  # doctest: +SKIP
    array([[[[-1., 0., 1.]]]], dtype=float32)
    """
    images = ops.convert_to_tensor(images)
    if len(images.shape) < 3 or images.shape[-1] != 3:
        raise ValueError(
            f"preprocess_inputs expects RGB images [..., height, width, 3]. "
            f"Received shape {tuple(images.shape)}"
        )
    return ops.cast(images, "float32") / INPUT_SCALE + INPUT_OFFSET
