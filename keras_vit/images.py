"""Reading image files for the command line and examples (TensorFlow I/O)."""

import numpy as np


def load_image(path, image_size):
    """Reads a JPEG/PNG/GIF/BMP file as RGB and resizes it (bilinear, no crop) to `image_size`.

    Returns:
        float32 array `[H, W, 3]` with values in [0, 255]; apply `keras_vit.preprocess_inputs`.

    Raises:
        ValueError: if the file cannot be decoded as an image.
    """
    import tensorflow as tf

    size = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
    data = tf.io.read_file(str(path))
    try:
        image = tf.io.decode_image(data, channels=3, expand_animations=False)
    except (tf.errors.InvalidArgumentError, tf.errors.UnknownError) as e:
        raise ValueError(
            f"Cannot decode {path} as an image (expected JPEG, PNG, GIF or BMP): {e.message}"
        ) from None
    image = tf.image.resize(tf.cast(image, tf.float32), size, method="bilinear")
    return np.clip(image.numpy(), 0, 255)
