"""`keras-vit models`: the variant table with each variant's parameters and forward GFLOPs per
224 px image (`keras_vit.flops`, the count the benchmarks use); no TensorFlow unless `--time`
is given."""

import time

from keras_vit_cli.catalog import library_module


def configure(parser):
    parser.add_argument("--variant", action="append",
                        help="only these variants (repeatable), e.g. --variant B/16")
    parser.add_argument("--time", action="store_true",
                        help="build each model and measure one 224 px image's forward time")


def _time_forward(variant):
    """Median wall time of one 224 px image through the model, after a warm-up call."""
    import keras  # only for --time
    import numpy as np

    from keras_vit.builders import create_model

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


def forward_gflops(variant):
    """GFLOPs of one image through `variant`'s forward pass at 224 px with 1000 classes."""
    flops = library_module("flops")
    return flops.step_flops(flops.config_forward_macs(variant.config()), training=False) / 1e9


def run(args):
    configs = library_module("configs")
    named = [configs.get_variant(v) for v in args.variant or ()]  # each once, as first named
    variants = list({v.name: v for v in named}.values()) or list(configs.VARIANTS.values())
    header = (f"{'variant':9} {'builder':12} {'ResNet':12} {'patch':>5} {'width':>5} {'mlp':>5} "
              f"{'heads':>5} {'layers':>6} {'params':>12} {'GFLOPs':>7}")
    if args.time:
        header += f" {'forward, 1 image':>17}"
    print(header)
    for variant in variants:
        size = configs.MODEL_SIZES[variant.size]
        resnet = "-" if variant.resnet is None else str(variant.resnet or "root-only")
        line = (f"{variant.name:9} {variant.builder_name:12} {resnet.replace(' ', ''):12} "
                f"{variant.patch_size:>5} {size['hidden_size']:>5} {size['mlp_dim']:>5} "
                f"{size['num_heads']:>5} {size['num_layers']:>6} {variant.params:>12,} "
                f"{forward_gflops(variant):>7.1f}")
        if args.time:
            line += f" {_time_forward(variant) * 1000:>14.0f} ms"
        print(line, flush=True)
    print("params and GFLOPs at 224x224 px with a 1000-class head; GFLOPs: one image's forward "
          "pass (2 per multiply-add, keras_vit.flops)")
    return 0


COMMANDS = {"models": (configure, run)}
