"""Where the first training step's time goes: building the model, compiling it with the
optimizer state, tracing the step, the first call, against a steady step; then the same step
traced again as a new function and its first call (the start-up a graph has in a process that
already ran one); and how many operations the traced step holds.

    python -m benchmarks.first_step [--variant B/16] [--image-size 224] [--batch 8] [--bf16] \\
        [--no-grappler] [--route attention=memory_efficient]

The model and its compilation are the keras_vit contender's; the step is Keras' `train_step` in
one `tf.function`, traced (`get_concrete_function`) before its first call.
"""

import argparse
import sys
import time

from benchmarks.contenders import common, keras_common, keras_vit_model


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.first_step",
                                     description=__doc__.split("\n\n")[0])
    common.add_training_probe_options(parser, xla=False)
    parser.add_argument("--no-grappler", action="store_true",
                        help="turn TensorFlow's graph optimiser off")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    keras_common.configure(precision=args.precision)
    import tensorflow as tf

    from keras_vit import routes

    times = {"import": time.perf_counter() - started}
    if args.no_grappler:
        tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})

    def timed(name, call):
        start = time.perf_counter()
        result = call()
        times[name] = time.perf_counter() - start
        return result

    model = timed("build the model",
                  lambda: keras_vit_model.build_model(args.variant, args.image_size))
    timed("compile, optimizer state", lambda: keras_vit_model.compile_training(model))
    images, labels = (tf.constant(a) for a in common.random_batch(args.batch, args.image_size))
    step = tf.function(lambda x, y: model.train_step((x, y)))
    with routes.use_routes(**dict(args.route)):  # the routes are chosen when the step traces
        traced = timed("trace the step", lambda: step.get_concrete_function(images, labels))
    timed("first call", lambda: step(images, labels))
    times["steady step (best of 2)"] = min(common.step_seconds(lambda: step(images, labels), 2))
    # The same step traced again as a new function: its first call's start-up is the graph's
    # own, the process's (memory, thread pools) having been paid by the first.
    again = tf.function(lambda x, y: model.train_step((x, y)))
    with routes.use_routes(**dict(args.route)):
        timed("trace the step again (a new function)",
              lambda: again.get_concrete_function(images, labels))
    timed("its first call", lambda: again(images, labels))
    times["build to the end of the first step"] = sum(
        times[k] for k in ("build the model", "compile, optimizer state", "trace the step",
                           "first call"))
    print(f"{args.variant}, {args.image_size} px, batch {args.batch}, {args.precision}"
          + (", no grappler" if args.no_grappler else "")
          + "".join(f", {name}={value}" for name, value in args.route)
          + f"; the traced step holds {len(traced.graph.get_operations())} operations")
    print(common.table_head(["stage", "seconds"]))
    for name, seconds in times.items():
        print(common.table_row([name, f"{seconds:.2f}"]))


if __name__ == "__main__":
    sys.exit(main())
