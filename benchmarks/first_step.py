"""Where the first training step's time goes: model construction, compilation with the
optimizer state, tracing the step into a graph, the first call (TensorFlow's graph
optimisation, the executor's set-up, oneDNN's kernels for these shapes, and the step itself),
and two more calls for the steady step.

    python -m benchmarks.first_step [--variant B/16] [--image-size 224] [--batch 8] [--bf16] \\
        [--no-grappler] [--route attention=memory_efficient]

The model trains on the recipes' path (`keras_vit.training.compile_model` with
`keras_vit.training.AdamW`, the library's runtime); the step is Keras' `train_step` in one
`tf.function`, traced on its own (`get_concrete_function`) before its first call.
`--no-grappler` turns TensorFlow's graph optimiser off (`disable_meta_optimizer`), to measure
what the optimisation costs at the first call and gains in the steady steps; `--route
CHOICE=IMPLEMENTATION` (repeatable) chooses a route of `keras_vit.routes` for the step. The first call
less a steady step is the start-up the graph runtime adds to tracing.
"""

import argparse
import sys
import time

from benchmarks.memory import route_item


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.first_step",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", default="B/16")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--bf16", action="store_true", help="train in mixed_bfloat16")
    parser.add_argument("--no-grappler", action="store_true",
                        help="turn TensorFlow's graph optimiser off")
    parser.add_argument("--route", type=route_item, action="append", default=[],
                        help="CHOICE=IMPLEMENTATION of keras_vit.routes (repeatable)")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    started = time.perf_counter()
    import keras
    import numpy as np
    import tensorflow as tf

    import keras_vit
    from keras_vit import routes, training

    imported = time.perf_counter()
    if args.no_grappler:
        tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})
    if args.bf16:
        keras.mixed_precision.set_global_policy("mixed_bfloat16")
    times = {"import": imported - started}
    model = keras_vit.create_model(args.variant, image_size=args.image_size, num_classes=1000,
                                   dropout_rate=0.0)
    times["build the model"] = time.perf_counter() - imported
    mark = time.perf_counter()
    training.compile_model(model, training.AdamW(1e-4, weight_decay=0.05), metrics=())
    times["compile, optimizer state"] = time.perf_counter() - mark
    rng = np.random.default_rng(0)
    images = tf.constant(rng.uniform(-1, 1, (args.batch, args.image_size, args.image_size, 3)),
                         tf.float32)
    labels = tf.constant(rng.integers(0, 1000, args.batch))
    step = tf.function(lambda x, y: model.train_step((x, y)))
    mark = time.perf_counter()
    with routes.use_routes(**dict(args.route)):  # the routes are chosen when the step traces
        step.get_concrete_function(images, labels)
    times["trace the step"] = time.perf_counter() - mark
    mark = time.perf_counter()
    step(images, labels)
    times["first call"] = time.perf_counter() - mark
    steady = []
    for _ in range(2):
        mark = time.perf_counter()
        step(images, labels)
        steady.append(time.perf_counter() - mark)
    times["steady step (best of 2)"] = min(steady)
    times["build to the end of the first step"] = sum(
        times[k] for k in ("build the model", "compile, optimizer state", "trace the step",
                           "first call"))
    print(f"{args.variant}, {args.image_size} px, batch {args.batch}, "
          f"{'bf16' if args.bf16 else 'fp32'}{', no grappler' if args.no_grappler else ''}"
          + "".join(f", {name}={value}" for name, value in args.route))
    print("| stage | seconds |\n|---|---|")
    for name, seconds in times.items():
        print(f"| {name} | {seconds:.2f} |")


if __name__ == "__main__":
    main()
