"""Where a ViT's gradient spends its time on the JAX backend: XLA's operations by kind, from
`jax.profiler`, and the time of one gradient (forward + backward, no optimizer).

    KERAS_BACKEND=jax python -m benchmarks.jax_gradient_profile [--model Ti/16]
        [--num-layers 8] [--batch 8] [--no-barrier] [--top 12]

`--no-barrier` turns `keras_vit.layers.GRADIENT_BARRIER` off (the model as before the barrier
was added). XLA flags go in `XLA_FLAGS` as usual. Prints the median of 5 timed gradients, the
summed thread time of each kind of XLA operation (the name without its number: `ynn_fusion`
are the matrix products, `copy_bitcast_fusion` the copies that feed them) and the `--top`
longest single operations: a copy fusion per block whose time grows with depth is the
recomputed residual gradient that `layers.gradient_barrier` removes.
"""

import argparse
import collections
import glob
import gzip
import json
import os
import re
import statistics
import tempfile
import time


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="Ti/16")
    parser.add_argument("--num-layers", type=int, help="fewer blocks than the variant's")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--no-barrier", action="store_true")
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args(argv)
    os.environ.setdefault("KERAS_BACKEND", "jax")

    import jax
    import jax.numpy as jnp
    import keras
    import numpy as np

    import keras_vit
    from keras_vit import layers

    if keras.backend.backend() != "jax":
        raise SystemExit(f"this benchmark runs on JAX; KERAS_BACKEND is {keras.backend.backend()}")
    layers.GRADIENT_BARRIER = not args.no_barrier
    overrides = {"num_layers": args.num_layers} if args.num_layers else {}
    model = keras_vit.create_model(args.model, dropout_rate=0.0, **overrides)
    size = model.input_shape[1]
    x = jnp.asarray(np.random.default_rng(0).uniform(-1, 1, (args.batch, size, size, 3))
                    .astype("float32"))
    y = jnp.arange(args.batch) % model.output_shape[-1]
    trainable = [v.value for v in model.trainable_variables]
    others = [v.value for v in model.non_trainable_variables]

    def loss(trainable):
        logits, _ = model.stateless_call(trainable, others, x, training=True)
        return jnp.mean(jax.nn.logsumexp(logits, -1) - logits[jnp.arange(args.batch), y])

    gradient = jax.jit(jax.value_and_grad(loss))
    for _ in range(2):
        jax.block_until_ready(gradient(trainable))
    times = []
    for _ in range(5):
        begin = time.perf_counter()
        jax.block_until_ready(gradient(trainable))
        times.append(time.perf_counter() - begin)

    rounds = 3
    with tempfile.TemporaryDirectory() as folder:
        with jax.profiler.trace(folder, create_perfetto_trace=True):
            for _ in range(rounds):
                jax.block_until_ready(gradient(trainable))
        (trace,) = glob.glob(os.path.join(folder, "**", "*.trace.json.gz"), recursive=True)
        with gzip.open(trace) as f:
            events = json.load(f)
    events = events["traceEvents"] if isinstance(events, dict) else events
    per_op = collections.Counter()
    for event in events:
        name = event.get("name", "")
        if event.get("ph") == "X" and not name.startswith("$") and "::" not in name \
                and not name.startswith("end:") and "(" not in name:
            per_op[name] += event.get("dur", 0) / rounds / 1000  # ms per gradient
    per_kind = collections.Counter()
    for name, ms in per_op.items():
        per_kind[re.sub(r"[.\d]+$", "", name)] += ms

    layers_text = f", {args.num_layers} blocks" if args.num_layers else ""
    print(f"{args.model}{layers_text}, batch {args.batch}, barrier "
          f"{'off' if args.no_barrier else 'on'}, XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}")
    print(f"gradient: median {statistics.median(times):.3f} s of 5")
    print(f"XLA operations, thread time per gradient (both cores summed): "
          f"{sum(per_kind.values()):.0f} ms")
    for kind, ms in per_kind.most_common(8):
        print(f"  {ms:8.1f} ms  {kind}")
    print(f"longest single operations:")
    for name, ms in per_op.most_common(args.top):
        print(f"  {ms:8.1f} ms  {name}")


if __name__ == "__main__":
    main()
