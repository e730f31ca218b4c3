"""The attention core's forward + backward under TensorFlow + XLA on the CPU, in the ways issue 17
proposes, against the formulation keras_vit trains with: is the gap to timm's fused kernel in
how the backward is written?

    python -m benchmarks.attention_backward [--rounds 5]
    .venv-bench/bin/python -m benchmarks.attention_backward --torch   # timm's kernel, same shapes

The core is `softmax(q k^T / sqrt(k)) v` for ViT-B/16's shapes (batch 8, 197 tokens, 12 heads of
64), with the gradients of q, k and v of `sum(out * w)`. Variants:

- `einsum`: keras_vit's training path (`[B, N, h, k]` operands, einsum products, autodiff);
- `heads_first`: q, k, v transposed once to `[B, h, N, k]` so each head's matrices are
  contiguous, then plain batched matmuls (autodiff);
- `custom_grad`: `heads_first` with a hand-written backward that uses the softmax-gradient
  identity `rowsum(dP * P) = rowsum(dO * O)` (FlashAttention's): one `[B, h, N, k]` reduction
  instead of one over `[B, h, N, N]`, and no stored `dP * P`;
- `dot_product_attention`: `keras.ops.dot_product_attention` (autodiff through the backend's
  implementation).

`--torch` times PyTorch's `scaled_dot_product_attention` (what timm's `Attention` calls) on the
same shapes, eager, for comparison.

Every variant's gradients are first checked against `einsum`'s (max abs difference printed);
times are the median of `--rounds` interleaved rounds, each the best of 5 calls.
"""

import argparse
import math
import statistics

import numpy as np

from benchmarks.block_profile import _best

BATCH, TOKENS, HEADS, HEAD_DIM = 8, 197, 12, 64


def variants():
    import keras
    import tensorflow as tf

    scale = 1.0 / math.sqrt(HEAD_DIM)

    def einsum(q, k, v):
        logits = tf.einsum("bqhk,bshk->bhqs", q * scale, k)
        probs = tf.nn.softmax(logits, axis=-1)
        return tf.einsum("bhqs,bshk->bqhk", probs, v)

    def heads_first(q, k, v):
        q, k, v = (tf.transpose(t, [0, 2, 1, 3]) for t in (q, k, v))  # [B, h, N, k]
        probs = tf.nn.softmax(tf.matmul(q * scale, k, transpose_b=True), axis=-1)
        return tf.transpose(tf.matmul(probs, v), [0, 2, 1, 3])  # [B, N, h, k]

    @tf.custom_gradient
    def _core(q, k, v):  # [B, h, N, k] each
        probs = tf.nn.softmax(tf.matmul(q * scale, k, transpose_b=True), axis=-1)
        out = tf.matmul(probs, v)

        def grad(d_out):
            d_v = tf.matmul(probs, d_out, transpose_a=True)
            d_probs = tf.matmul(d_out, v, transpose_b=True)
            # softmax backward: P * (dP - rowsum(dP * P)), with rowsum(dP * P) = rowsum(dO * O).
            delta = tf.reduce_sum(d_out * out, axis=-1, keepdims=True)  # [B, h, N, 1]
            d_logits = probs * (d_probs - delta) * scale
            d_q = tf.matmul(d_logits, k)
            d_k = tf.matmul(d_logits, q, transpose_a=True)
            return d_q, d_k, d_v

        return out, grad

    def custom_grad(q, k, v):
        q, k, v = (tf.transpose(t, [0, 2, 1, 3]) for t in (q, k, v))
        return tf.transpose(_core(q, k, v), [0, 2, 1, 3])

    def dot_product_attention(q, k, v):
        return keras.ops.dot_product_attention(q, k, v, scale=scale)

    return dict(einsum=einsum, heads_first=heads_first, custom_grad=custom_grad,
                dot_product_attention=dot_product_attention)


def torch_core(rounds):
    import torch

    torch.manual_seed(0)
    shape = (BATCH, HEADS, TOKENS, HEAD_DIM)  # timm's layout
    q, k, v = (torch.randn(shape, requires_grad=True) for _ in range(3))
    w = torch.randn(shape)

    def forward():
        with torch.no_grad():
            return (torch.nn.functional.scaled_dot_product_attention(q, k, v) * w).sum()

    def forward_backward():
        for t in (q, k, v):
            t.grad = None
        (torch.nn.functional.scaled_dot_product_attention(q, k, v) * w).sum().backward()

    f = statistics.median(_best(forward) for _ in range(rounds))
    fb = statistics.median(_best(forward_backward) for _ in range(rounds))
    print(f"| torch {torch.__version__} scaled_dot_product_attention | {f * 1e3:.1f} ms | "
          f"{fb * 1e3:.1f} ms |")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--torch", action="store_true")
    args = parser.parse_args(argv)
    if args.torch:
        return torch_core(args.rounds)
    import tensorflow as tf

    rng = np.random.default_rng(0)
    shape = (BATCH, TOKENS, HEADS, HEAD_DIM)
    q, k, v, w = (tf.constant(rng.normal(size=shape).astype("float32")) for _ in range(4))
    compiled = {}
    for name, core in variants().items():
        @tf.function(jit_compile=True)
        def forward(q, k, v, core=core):
            return tf.reduce_sum(core(q, k, v) * w)

        @tf.function(jit_compile=True)
        def forward_backward(q, k, v, core=core):
            with tf.GradientTape() as tape:
                tape.watch([q, k, v])
                loss = tf.reduce_sum(core(q, k, v) * w)
            return tape.gradient(loss, [q, k, v])

        compiled[name] = (forward, forward_backward)
    reference = [g.numpy() for g in compiled["einsum"][1](q, k, v)]
    print(f"attention core, batch {BATCH} x {TOKENS} tokens x {HEADS} heads of {HEAD_DIM}, "
          "TensorFlow + XLA\n")
    errors = {}
    for name, (_, forward_backward) in compiled.items():
        grads = [g.numpy() for g in forward_backward(q, k, v)]
        errors[name] = max(float(np.abs(a - b).max()) for a, b in zip(grads, reference))
    times = {name: ([], []) for name in compiled}
    for _ in range(args.rounds):  # interleaved
        for name, (forward, forward_backward) in compiled.items():
            times[name][0].append(_best(lambda: forward(q, k, v).numpy()))
            times[name][1].append(_best(lambda: [g.numpy() for g in forward_backward(q, k, v)]))
    base = statistics.median(times["einsum"][1])
    print("| variant | forward | forward + backward | vs einsum | max abs grad difference |")
    print("|---|---|---|---|---|")
    for name, (forward, both) in times.items():
        f, fb = statistics.median(forward), statistics.median(both)
        print(f"| {name} | {f * 1e3:.1f} ms | {fb * 1e3:.1f} ms | {base / fb:.2f}x | "
              f"{errors[name]:.1e} |", flush=True)


if __name__ == "__main__":
    main()
