"""A/B of the attention projection on ViT-B/16 inference (batch 8, no XLA), one process.

    python -m benchmarks.attention_ab [B/16]

"einsum" is the first implementation (three einsum projections, einsum attention), kept here
as the "before"; "fused" is the current `MultiHeadDotProductAttention.call` (one [D, 3D]
matmul). Rounds alternate; outputs must agree to 1e-4.
"""

import sys
import time

import keras  # noqa: F401
import numpy as np
from keras import ops
import keras_vit
from keras_vit.layers import MultiHeadDotProductAttention as MHA

fused_call = MHA.call  # the library's current implementation


def base_call(self, inputs, training=None, return_attention_scores=False):
    """The first implementation: three EinsumDense projections and einsum attention."""
    scale = 1.0 / self.head_dim**0.5
    query = self.query(inputs) * ops.cast(scale, inputs.dtype)  # [B, N, h, k]
    key, value = self.key(inputs), self.value(inputs)
    logits = ops.einsum("bqhk,bshk->bhqs", query, key)
    probs = ops.cast(ops.softmax(ops.cast(logits, "float32"), axis=-1), inputs.dtype)
    context = ops.einsum("bhqs,bshk->bqhk", self.dropout(probs, training=training), value)
    outputs = self.out(context)
    return (outputs, probs) if return_attention_scores else outputs

variant = sys.argv[1] if len(sys.argv) > 1 else "B/16"
batch = 8
model = keras_vit.create_model(variant)
x = np.random.default_rng(0).uniform(-1, 1, (batch, 224, 224, 3)).astype("float32")
def timeit(fn, n=4):
    fn(x)
    ts = []
    for _ in range(n):
        t = time.perf_counter(); fn(x); ts.append(time.perf_counter() - t)
    return np.median(ts)
results = {"einsum": [], "fused": []}
ref = None
for r in range(3):
    for name, call in (("einsum", base_call), ("fused", fused_call)):
        MHA.call = call
        model.predict_function = None
        fn = lambda x: model.predict_on_batch(x)
        out = fn(x)
        if ref is None: ref = out
        else: assert np.abs(out - ref).max() < 1e-4, np.abs(out-ref).max()
        results[name].append(batch / timeit(fn))
for k, v in results.items(): print(k, [round(a, 2) for a in v], "img/s")
