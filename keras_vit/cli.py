"""The `keras-vit` command line: `keras-vit COMMAND --help` for each command."""

import argparse
import importlib
import sys
import time

COMMANDS = {}
# Modules whose `@command` functions join the command line (imported when the parser is built).
COMMAND_MODULES = ()


def command(name, help):
    """Registers `fn(args)` as a subcommand; `fn.configure(parser)` adds its arguments."""

    def decorator(fn):
        COMMANDS[name] = (fn, help)
        return fn

    return decorator


def _add_models_args(parser):
    parser.add_argument("--time", action="store_true",
                        help="build each model and measure one 224 px image's forward time")
    parser.add_argument("--variant", action="append",
                        help="only these variants (repeatable), e.g. --variant B/16")


@command("models", "list every ViT variant with its configuration and parameter count")
def models_command(args):
    from keras_vit import configs

    variants = [configs.get_variant(v) for v in args.variant] if args.variant else list(
        configs.VARIANTS.values())
    header = f"{'variant':8} {'builder':9} {'patch':>5} {'width':>5} {'mlp':>5} {'heads':>5} " \
             f"{'layers':>6} {'params (224px, 1000 cls)':>25}"
    if args.time:
        header += f" {'forward, 1 image':>17}"
    print(header)
    for variant in variants:
        size = configs.MODEL_SIZES[variant.size]
        line = (f"{variant.name:8} {variant.builder_name:9} {variant.patch_size:>5} "
                f"{size['hidden_size']:>5} {size['mlp_dim']:>5} {size['num_heads']:>5} "
                f"{size['num_layers']:>6} {variant.params:>25,}")
        if args.time:
            line += f" {_time_forward(variant) * 1000:>14.0f} ms"
        print(line, flush=True)
    return 0


models_command.configure = _add_models_args


def _time_forward(variant):
    """Median wall time of one 224 px image through the model, after a warm-up call."""
    import keras
    import numpy as np

    from keras_vit.model import create_model

    model = create_model(variant)
    images = np.zeros((1, 224, 224, 3), np.float32)
    model.predict_on_batch(images)
    times = []
    for _ in range(3):
        start = time.perf_counter()
        model.predict_on_batch(images)
        times.append(time.perf_counter() - start)
    del model
    keras.backend.clear_session()
    return float(np.median(times))


def build_parser():
    for module in COMMAND_MODULES:
        importlib.import_module(module)
    parser = argparse.ArgumentParser(
        prog="keras-vit", description="Vision Transformer models for Keras 3."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (fn, help) in COMMANDS.items():
        p = sub.add_parser(name, help=help, description=help)
        if hasattr(fn, "configure"):
            fn.configure(p)
        p.set_defaults(func=fn)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"keras-vit {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
