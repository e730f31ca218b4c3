"""A/B of the attention projection on ViT-B/16 inference (batch 8, no XLA), one process.

    python -m benchmarks.attention_ab [B/16]

"current" is `MultiHeadDotProductAttention.call` (three EinsumDense projections); "fused_qkv"
is the branch 0.1 had and 0.2 dropped (the three kernels concatenated into one [D, 3D] matmul
per call), written out here so that the decision can be re-measured. Rounds alternate;
outputs must agree to 1e-4.
"""

import math
import sys
import time

import numpy as np
from keras import ops

import keras_vit
from keras_vit.layers import MultiHeadDotProductAttention as MHA

current_project = MHA._project


def fused_qkv_project(self, inputs):
    """0.1's projection: one [D, 3D] matmul, then split into query, key and value."""
    batch, length = ops.shape(inputs)[0], ops.shape(inputs)[1]
    width, h, k = inputs.shape[-1], self.num_heads, self.head_dim
    layers = (self.query, self.key, self.value)
    kernel = ops.concatenate([ops.reshape(p.kernel, (width, h * k)) for p in layers], 1)
    bias = ops.concatenate([ops.reshape(p.bias, (h * k,)) for p in layers], 0)
    qkv = ops.matmul(inputs, ops.cast(kernel, inputs.dtype)) + ops.cast(bias, inputs.dtype)
    qkv = ops.reshape(qkv, (batch, length, 3, h, k))  # [B, N, 3, h, k]
    q, key, v = ops.unstack(ops.transpose(qkv, (2, 0, 3, 1, 4)), 3)  # [B, h, N, k] each
    return q * ops.cast(1.0 / math.sqrt(k), q.dtype), key, v


def main(variant="B/16", batch=8, rounds=3):
    model = keras_vit.create_model(variant)
    x = np.random.default_rng(0).uniform(-1, 1, (batch, 224, 224, 3)).astype("float32")
    results, reference = {"current": [], "fused_qkv": []}, None
    for _ in range(rounds):
        for name, project in (("current", current_project), ("fused_qkv", fused_qkv_project)):
            MHA._project = project
            model.predict_function = None
            out = model.predict_on_batch(x)
            reference = out if reference is None else reference
            assert np.abs(out - reference).max() < 1e-4, np.abs(out - reference).max()
            times = []
            for _ in range(4):
                start = time.perf_counter()
                model.predict_on_batch(x)
                times.append(time.perf_counter() - start)
            results[name].append(batch / float(np.median(times)))
    MHA._project = current_project
    for name, values in results.items():
        print(name, [round(v, 2) for v in values], "img/s")


if __name__ == "__main__":
    main(*sys.argv[1:2])
