"""A/B of the attention implementation on ViT-B/16 inference (batch 8, no XLA), one process.

    python -m benchmarks.attention_ab [B/16]

"current" is `MultiHeadDotProductAttention.call` (three EinsumDense projections, then, at
inference, `keras.ops.dot_product_attention`); "v0.1" is 0.1's call (the three kernels concatenated into
one [D, 3D] matmul, then softmax(q k^T) v as separate ops), written out here so that the
decision can be re-measured. Rounds alternate; outputs must agree to 1e-4.
"""

import math
import sys
import time

import numpy as np
from keras import ops

import keras_vit
from keras_vit.layers import MultiHeadDotProductAttention as MHA

current_call = MHA.call


def v01_call(self, inputs, training=None, return_attention_scores=False):
    """0.1's attention: one [D, 3D] matmul, then the attention products one by one."""
    batch, length = ops.shape(inputs)[0], ops.shape(inputs)[1]
    width, h, k = inputs.shape[-1], self.num_heads, self.head_dim
    layers = (self.query, self.key, self.value)
    kernel = ops.concatenate([ops.reshape(p.kernel, (width, h * k)) for p in layers], 1)
    bias = ops.concatenate([ops.reshape(p.bias, (h * k,)) for p in layers], 0)
    qkv = ops.matmul(inputs, ops.cast(kernel, inputs.dtype)) + ops.cast(bias, inputs.dtype)
    qkv = ops.reshape(qkv, (batch, length, 3, h, k))  # [B, N, 3, h, k]
    q, key, v = ops.unstack(ops.transpose(qkv, (2, 0, 3, 1, 4)), 3)  # [B, h, N, k] each
    q = q * ops.cast(1.0 / math.sqrt(k), q.dtype)
    logits = ops.matmul(q, ops.transpose(key, (0, 1, 3, 2)))  # [B, h, N, N]
    probs = ops.cast(ops.softmax(ops.cast(logits, "float32"), axis=-1), inputs.dtype)
    context = ops.matmul(self.dropout(probs, training=training), v)  # [B, h, N, k]
    outputs = self.out(ops.transpose(context, (0, 2, 1, 3)))
    return (outputs, probs) if return_attention_scores else outputs


def products_call(self, inputs, training=None, return_attention_scores=False):
    """Three projections, then the attention products one by one (no fused op)."""
    query, key, value = (layer(inputs) for layer in (self.query, self.key, self.value))
    probs = self.probabilities(query, key)  # [B, h, N, N]
    context = ops.einsum("bhqs,bshk->bqhk", self.dropout(probs, training=training), value)
    outputs = self.out(context)
    return (outputs, probs) if return_attention_scores else outputs


CALLS = {"current": current_call, "products": products_call, "v0.1": v01_call}


def main(variant="B/16", batch=8, rounds=3):
    model = keras_vit.create_model(variant)
    x = np.random.default_rng(0).uniform(-1, 1, (batch, 224, 224, 3)).astype("float32")
    results, reference = {name: [] for name in CALLS}, None
    for _ in range(rounds):
        for name, call in CALLS.items():
            MHA.call = call
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
    MHA.call = current_call
    for name, values in results.items():
        print(name, [round(v, 2) for v in values], "img/s")


if __name__ == "__main__":
    main(*sys.argv[1:2])
