"""The `keras-vit` command line: `keras-vit COMMAND --help` for each command."""

import argparse
import importlib
import sys
import time

COMMANDS = {}
# Modules whose `@command` functions join the command line (imported when the parser is built).
COMMAND_MODULES = ("keras_vit.train_cli", "keras_vit.export", "keras_vit.inspect")


def command(name, help):
    """Registers `fn(args)` as a subcommand; `fn.configure(parser)` adds its arguments."""

    def decorator(fn):
        COMMANDS[name] = (fn, help)
        return fn

    return decorator


def _add_models_args(parser):
    parser.add_argument(
        "--time",
        action="store_true",
        help="build each model and measure one 224 px image's forward time",
    )
    parser.add_argument(
        "--variant", action="append", help="only these variants (repeatable), e.g. --variant B/16"
    )


@command("models", "list every ViT variant with its configuration and parameter count")
def models_command(args):
    from keras_vit import configs

    variants = (
        [configs.get_variant(v) for v in args.variant]
        if args.variant
        else list(configs.VARIANTS.values())
    )
    header = (
        f"{'variant':9} {'builder':12} {'ResNet':12} {'patch':>5} {'width':>5} {'mlp':>5} "
        f"{'heads':>5} {'layers':>6} {'params (224px, 1000 cls)':>25}"
    )
    if args.time:
        header += f" {'forward, 1 image':>17}"
    print(header)
    for variant in variants:
        size = configs.MODEL_SIZES[variant.size]
        resnet = "-" if variant.backbone is None else str(variant.backbone or "root-only")
        line = (
            f"{variant.name:9} {variant.builder_name:12} {resnet.replace(' ', ''):12} "
            f"{variant.patch_size:>5} {size['hidden_size']:>5} {size['mlp_dim']:>5} "
            f"{size['num_heads']:>5} {size['num_layers']:>6} {variant.params:>25,}"
        )
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


def _add_weights_args(parser, image_size=True):
    parser.add_argument(
        "--model",
        default=None,
        help="variant, e.g. ViT_B16 or B/16 (default: read off the checkpoint)",
    )
    parser.add_argument(
        "--pretrained",
        default=None,
        help="registry name, .npz path or URL (default with --model: the "
        "variant's default checkpoint)",
    )
    if image_size:
        parser.add_argument(
            "--image-size",
            type=int,
            default=None,
            help="input resolution (default: the checkpoint's)",
        )


def _model_from_args(args, source=None, **overrides):
    """Builds the model a command asks for: --model/--pretrained, or everything from the file."""
    from keras_vit import pretrained
    from keras_vit.model import create_model

    source = source or args.pretrained
    if getattr(args, "image_size", None):
        overrides["image_size"] = args.image_size
    if args.model:
        return create_model(args.model, pretrained=source or True, **overrides)
    if not source:
        raise ValueError("Give --model, --pretrained, or both.")
    return pretrained.from_pretrained(source, **overrides)


def _registry_class_names(source):
    """The class names a registry entry records (e.g. the digits demo's), or None."""
    from keras_vit import pretrained

    try:
        return pretrained.get_checkpoint(source).get("class_names")
    except (ValueError, TypeError):
        return None


@command("predict", "classify images with a pretrained model and print the top-5 classes")
def predict_command(args):
    import numpy as np

    from keras_vit.images import load_image
    from keras_vit.labels import decode_predictions
    from keras_vit.preprocessing import preprocess_inputs

    model = _model_from_args(args)
    size = tuple(model.input.shape[1:3])
    images = np.stack([load_image(path, size) for path in args.images])
    logits = model.predict(preprocess_inputs(images), verbose=0)
    names = _registry_class_names(args.pretrained) if args.pretrained else None
    top_classes = decode_predictions(logits, top=min(args.top, logits.shape[1]), class_names=names)
    for path, top in zip(args.images, top_classes):
        print(path)
        for class_id, name, probability in top:
            print(f"  {probability:7.2%}  {name} ({class_id})")
    return 0


predict_command.configure = lambda p: (
    p.add_argument("images", nargs="+", metavar="IMAGE"),
    _add_weights_args(p),
    p.add_argument("--top", type=int, default=5),
)


@command("convert", "turn any checkpoint into a .keras model or .weights.h5 file")
def convert_command(args):
    if not args.out.endswith((".keras", ".weights.h5")):
        raise ValueError(f"OUT must end in .keras or .weights.h5. Received: {args.out}")
    import os
    import tempfile

    model = _model_from_args(args, source=args.source)
    directory = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(directory, exist_ok=True)
    # Keras picks the format from the suffix, so the temporary file keeps it.
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=os.path.basename(args.out))
    os.close(fd)
    try:
        if args.out.endswith(".keras"):
            model.save(tmp)
        else:
            model.save_weights(tmp, overwrite=True)
        os.replace(tmp, args.out)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    print(
        f"Wrote {args.out} ({model.name}, {model.count_params():,} parameters, "
        f"input {tuple(model.input.shape[1:])})"
    )
    return 0


convert_command.configure = lambda p: (
    p.add_argument("source", help="registry name, .npz path or URL"),
    p.add_argument("out", help="output file: .keras or .weights.h5"),
    _add_weights_args(p),
)


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
    except (ValueError, OSError, ImportError) as e:
        print(f"keras-vit {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
