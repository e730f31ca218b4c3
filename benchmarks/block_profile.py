"""Forward and forward+backward time of one ViT-B/16 encoder block and its parts (LayerNorm,
attention, MLP), batch 8 x 197 tokens: where keras_vit's training step loses to timm's.

    python -m benchmarks.block_profile keras_vit          # XLA-compiled, as training runs
    python -m benchmarks.block_profile keras_vit --no-xla # TensorFlow's graph runtime
    .venv-bench/bin/python -m benchmarks.block_profile timm   # eager PyTorch

Each part gets a random input and a random output weighting (loss = sum(out * w)); the backward
includes the gradients of the input and of every weight. Best of 5 after one untimed call.
keras_vit's forward column runs its layers' inference path (`training=False`), the forward +
backward column their training path (`training=True`), as `predict` and `fit` do.
"""

import inspect
import sys
import time

import numpy as np

BATCH, TOKENS, WIDTH, HEADS, MLP = 8, 197, 768, 12, 3072


def _best(fn, reps=5):
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def keras_vit_parts(xla=True):
    import keras
    import tensorflow as tf

    from keras_vit import layers

    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(size=(BATCH, TOKENS, WIDTH)).astype("float32"))
    weight = tf.constant(rng.normal(size=(BATCH, TOKENS, WIDTH)).astype("float32"))
    parts = {
        "LayerNorm": keras.layers.LayerNormalization(epsilon=1e-6),
        "attention": layers.MultiHeadDotProductAttention(num_heads=HEADS),
        "MLP": layers.MlpBlock(mlp_dim=MLP),
        "block": layers.TransformerBlock(num_heads=HEADS, mlp_dim=MLP),
    }
    for name, layer in parts.items():
        def output(inputs, training, layer=layer):
            # The forward column runs the inference path, forward + backward the training path
            # (they differ: the attention's hand-written backward, the MLP's layout).
            takes_flag = "training" in inspect.signature(layer.call).parameters
            flag = {"training": training} if takes_flag else {}
            out = layer(inputs, **flag)
            return out[0] if isinstance(out, (tuple, list)) else out  # the block returns probs too

        output(x, False)  # builds the layer

        @tf.function(jit_compile=xla)
        def forward(inputs, output=output):
            return tf.reduce_sum(output(inputs, False) * weight)

        @tf.function(jit_compile=xla)
        def forward_backward(inputs, output=output, layer=layer):
            with tf.GradientTape() as tape:
                tape.watch(inputs)
                loss = tf.reduce_sum(output(inputs, True) * weight)
            grads = tape.gradient(loss, [inputs] + layer.trainable_variables)
            return tf.add_n([tf.reduce_sum(g) for g in grads])

        yield name, _best(lambda: forward(x).numpy()), _best(lambda: forward_backward(x).numpy())


def timm_parts():
    import torch

    from benchmarks.contenders import timm_vit

    timm_vit.import_timm()
    from timm.models.vision_transformer import Attention, Block, Mlp

    torch.manual_seed(0)
    x = torch.randn(BATCH, TOKENS, WIDTH, requires_grad=True)
    weight = torch.randn(BATCH, TOKENS, WIDTH)
    parts = {
        "LayerNorm": torch.nn.LayerNorm(WIDTH, eps=1e-6),
        "attention": Attention(WIDTH, num_heads=HEADS, qkv_bias=True),
        "MLP": Mlp(WIDTH, MLP),
        "block": Block(WIDTH, HEADS, qkv_bias=True),
    }
    for name, module in parts.items():
        def forward(module=module):
            with torch.no_grad():
                return (module(x) * weight).sum()

        def forward_backward(module=module):
            module.zero_grad(set_to_none=True)
            x.grad = None
            (module(x) * weight).sum().backward()

        yield name, _best(forward), _best(forward_backward)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    flags = set(argv[1:])
    if not argv or argv[0] not in ("keras_vit", "timm") or \
            flags - ({"--no-xla"} if argv[0] == "keras_vit" else set()):
        raise SystemExit("usage: python -m benchmarks.block_profile keras_vit [--no-xla] | timm")
    xla = "--no-xla" not in argv
    runtime = "" if argv[0] == "timm" else (", XLA" if xla else ", graph runtime")
    print(f"{argv[0]}{runtime}: ViT-B/16 block parts, batch {BATCH} x {TOKENS} tokens\n")
    print("| part | forward | forward + backward |\n|---|---|---|")
    parts = keras_vit_parts(xla) if argv[0] == "keras_vit" else timm_parts()
    for name, forward, both in parts:
        # (No backward / forward ratio: keras_vit's two columns run different code paths.)
        print(f"| {name} | {forward * 1e3:.1f} ms | {both * 1e3:.1f} ms |", flush=True)


if __name__ == "__main__":
    main()
