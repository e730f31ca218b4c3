"""The tiny models the format tests write and export: one of every kind of model, each with
random weights (so that outputs differ between kinds and seeds).

tests/test_roundtrip.py writes every format for every kind in `KINDS`; tests/test_onnx.py
exports the same kinds and a few more to ONNX."""

import keras
import numpy as np

import keras_vit

# The architecture every kind starts from (tests/test_errors.py's TINY, with a head of 3).
TINY = dict(image_size=16, patch_size=8, hidden_size=8, num_layers=1, num_heads=2, mlp_dim=8,
            num_classes=3, name="tiny")
# Every kind of model a writer must hold or refuse: plain, hybrid, each position embedding,
# any input size, scanned, int8-quantized.
KINDS = {
    "plain": {},
    "hybrid": dict(patch_size=1, resnet={"num_layers": (1,)}),  # a 4x4 grid of feature cells
    "learned_2d": dict(position_embedding="learned_2d"),
    "sincos_2d": dict(position_embedding="sincos_2d"),
    "no_position": dict(position_embedding="none"),
    "relative": dict(position_embedding="relative"),
    "dynamic": dict(dynamic_image_size=True),
    "scanned": dict(scan=True),
    "int8": {},  # quantized once built (`model.quantize("int8")`)
}


def build(base, kinds, kind, seed=0, std=0.5, quantize=True, **changes):
    """`keras_vit.ViT(**base, **kinds[kind], **changes)` with weights drawn from N(0, std²)
    (the same for every call with one `seed`); an "int8" kind quantized where `quantize`."""
    keras.utils.set_random_seed(seed)
    model = keras_vit.ViT(**dict(base, **kinds[kind], **changes))
    rng = np.random.default_rng(seed)
    model.set_weights([rng.normal(0, std, w.shape).astype(w.dtype) for w in model.get_weights()])
    if kind == "int8" and quantize:
        model.quantize("int8")
    return model
