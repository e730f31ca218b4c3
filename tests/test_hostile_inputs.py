"""Hostile images, data folders and model arguments (issue "Reliability IV"): each is refused
with one line naming the file, folder or argument, or handled as documented, and no input file
is changed. The image readers are also fuzzed: real files mutated by hypothesis decode to an
RGB image or fail with one ValueError naming the file."""

import hashlib
import io
import os
import pathlib
import struct

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

import keras_vit
import keras_vit_cli as cli
from keras_vit import data, images

TINY = dict(image_size=16, patch_size=8, hidden_size=8, num_layers=1, num_heads=2, mlp_dim=8,
            num_classes=3)


def encoded(fmt, size=(12, 10), seed=0, **save):
    """The bytes of a random RGB image of `size` (height, width) written by Pillow."""
    pixels = np.random.default_rng(seed).integers(0, 256, (*size, 3), np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, fmt, **save)
    return buffer.getvalue()


def write(path, content):
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return path


def class_folder(root, classes=("cat", "dog"), per_class=2):
    for name in classes:
        for i in range(per_class):
            write(root / name / f"{i}.png", encoded("PNG", seed=i))
    return root


def digest(root):
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(pathlib.Path(root).rglob("*")) if p.is_file()}


def os2_bmp(height, width):
    """An OS/2 BMP (12-byte BITMAPCOREHEADER, 16-bit sides), 24 bits a pixel, all grey."""
    row = bytes([128] * (3 * width))
    row += b"\0" * (-len(row) % 4)
    offset = 14 + 12
    header = struct.pack("<IHHHH", 12, width, height, 1, 24)
    return (b"BM" + struct.pack("<IHHI", offset + len(row) * height, 0, 0, offset) + header
            + row * height)


# --------------------------------------------------------------------------------------------
# Item 5: an empty batch.


def test_an_empty_batch_gives_no_rows_of_logits():
    model = keras_vit.ViT(**TINY)
    assert tuple(model(np.zeros((0, 16, 16, 3), np.float32)).shape) == (0, 3)
    x = np.random.default_rng(0).uniform(-1, 1, (2, 16, 16, 3)).astype(np.float32)
    assert model(x).shape == (2, 3)


def test_an_empty_batch_of_a_model_of_any_size():
    model = keras_vit.ViT(**TINY, dynamic_image_size=True)
    assert tuple(model(np.zeros((0, 24, 16, 3), np.float32)).shape) == (0, 3)


def test_the_exported_signatures_take_an_empty_batch(tmp_path):
    from keras_vit import export

    model = keras_vit.ViT(**TINY)
    path = export.export_saved_model(model, tmp_path / "vit", warmup=False)
    loaded = tf.saved_model.load(path)
    out = loaded.signatures["predict_images"](images=tf.zeros((0, 16, 16, 3), tf.float32))
    assert tuple(out["probabilities"].shape) == (0, 3)
    out = loaded.signatures["serving_default"](image_bytes=tf.constant([], tf.string))
    assert tuple(out["probabilities"].shape) == (0, 3)
    one = loaded.signatures["serving_default"](image_bytes=tf.constant([encoded("PNG")]))
    assert tuple(one["probabilities"].shape) == (1, 3)
