"""ViT-B/16's matrix products (batch 8, 224 px) alone in TensorFlow's graph runtime or torch,
float32 and bfloat16, in GFLOP/s (the best of 3 runs of 20 calls).

    python -m benchmarks.matmul tensorflow
    .venv-timm/bin/python -m benchmarks.matmul torch
"""

import sys
import time

SHAPES = {"mlp": ((1576, 768), (768, 3072)), "attention": ((96, 197, 64), (96, 64, 197))}


def gflops(product, a, b, finish):
    flops = 2 * a.shape[-2] * a.shape[-1] * b.shape[-1] * (a.shape[0] if len(a.shape) == 3 else 1)
    finish(product(a, b))  # the first call: tracing, kernel selection
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(20):
            result = product(a, b)
        finish(result)
        best = min(best, (time.perf_counter() - start) / 20)
    return flops / best / 1e9


def main(argv=None):
    library = (sys.argv[1:] if argv is None else argv)[0]
    if library == "tensorflow":
        import tensorflow as tf

        product, finish = tf.function(tf.matmul), lambda r: r.numpy()
        dtypes = dict(float32=tf.float32, bfloat16=tf.bfloat16)
        operand = lambda shape, dtype: tf.cast(tf.random.normal(shape), dtype)  # noqa: E731
    else:
        import torch

        product, finish = torch.matmul, lambda r: r.sum().item()
        dtypes = dict(float32=torch.float32, bfloat16=torch.bfloat16)
        operand = lambda shape, dtype: torch.randn(*shape).to(dtype)  # noqa: E731
    for dtype_name, dtype in dtypes.items():
        for name, shapes in SHAPES.items():
            a, b = (operand(shape, dtype) for shape in shapes)
            print(f"{library} {dtype_name} {name}: {gflops(product, a, b, finish):.0f} GFLOP/s")


if __name__ == "__main__":
    main()
