"""Contender: keras_vit (this package), built with `keras_vit.create_model(variant)`.

    python -m benchmarks.contenders.keras_vit_model --mode infer --model B/16 [--xla|--no-xla]
        [--precision fp32|bf16|int8] [--backend jax] [--savedmodel]

Random weights, dropout 0 (the same work as the peers; L/16's official config has 0.1), and a
random head instead of the zero head meant for fine-tuning (whose all-zero logits would make
class 0 every image's top-1). int8 is Keras' `model.quantize("int8")` of the fp32 model, for
inference and mode `agreement` only. Inference is `predict_on_batch` after `model.compile`
(Keras' "auto" runtime unless `--xla`/`--no-xla`); training takes the recipes' path,
`keras_vit.training.compile_model` with `keras_vit.training.AdamW` (the library's runtime).
"""

import sys
import tempfile

from benchmarks.contenders import common, keras_common
from benchmarks.contenders.keras_common import device_peak_bytes  # noqa: F401


def setup(args):
    return keras_common.setup(args, "keras_vit")


def build_model(args, config, quantize=True):
    """The variant with a random head; quantized to int8 where `args` asks and `quantize`."""
    import keras

    import keras_vit

    model = keras_vit.create_model(config["name"], image_size=args.image_size,
                                   num_classes=common.NUM_CLASSES, dropout_rate=0.0)
    head = model.get_layer("head")
    # Lecun-normal scale: logits of order one (the zero head's are all zero).
    stddev = config["hidden_size"] ** -0.5
    head.kernel.assign(keras.random.normal(head.kernel.shape, stddev=stddev, seed=args.seed))
    if quantize and args.precision == "int8":
        model.quantize("int8")
    return model


def build_inference(args, config):
    if not args.savedmodel:
        return keras_common.inference_step(build_model(args, config), args)
    import tensorflow as tf

    from keras_vit import export

    # What TF Serving runs: the export's predict_images signature (bf16: the model built under
    # mixed_bfloat16, as export_saved_model(precision="bfloat16") serves a float32 one).
    model = build_model(args, config)
    path = export.export_saved_model(model, tempfile.mkdtemp(), warmup=False,
                                     jit_compile=args.xla)
    signature = tf.saved_model.load(path).signatures[export.IMAGES_SIGNATURE]
    images = tf.constant((common.random_batch(args)[0] + 1) * 127.5)  # [0, 255]
    return lambda: signature(images=images)["probabilities"].numpy()


def build_training(args, config):
    if args.precision == "int8":
        raise ValueError("--precision int8 is for inference only (Keras int8 quantization).")
    from keras_vit import training

    model = build_model(args, config)
    optimizer = training.AdamW(common.LEARNING_RATE, weight_decay=common.WEIGHT_DECAY)
    # The recipes' path: `jit_compile=None` takes the library's measured default.
    jit_compile = True if args.backend == "jax" else args.xla
    training.compile_model(model, optimizer, jit_compile=jit_compile, metrics=())
    keras_common.require_xla(model, args)
    return keras_common.training_step(model, args)


def agreement(args, config):
    """Top-1 agreement of the int8-quantized model with the fp32 model it came from.

    On `args.agreement_images` random images (uniform in [-1, 1], a seed apart from the timed
    batch), through the random-weight variant, or with `--checkpoint` a trained model (an
    official-layout .npz) at its own resolution. Reported:

    - `top1_agreement`, and `distinct_top1`, the number of classes the fp32 model picks;
    - `centred`: the same after subtracting from both models' logits the fp32 logits' mean over
      the images. A random ViT gives nearly the same logits to every random image, so its plain
      top-1 hardly depends on the image and its agreement is trivially high; centred, only the
      image-dependent part decides (as it would be a shift of the head bias, applied to fp32
      and int8 alike);
    - `relative_logit_error`: RMS of (int8 - fp32) over the RMS of the image-dependent part of
      the fp32 logits.
    """
    import numpy as np

    import keras_vit

    if args.precision != "int8":
        raise ValueError(f"mode agreement compares int8 with fp32. Received: {args.precision}")
    if args.checkpoint:
        model = keras_vit.from_pretrained(args.checkpoint)
    else:
        model = build_model(args, config, quantize=False)
    keras_common.compile_model(model, args)
    size = tuple(model.input.shape[1:3])
    images = common.random_batch(args, args.agreement_images, size, seed_offset=1)[0]
    reference = model.predict(images, batch_size=args.batch, verbose=0)
    model.quantize("int8")
    keras_common.compile_model(model, args)
    quantized = model.predict(images, batch_size=args.batch, verbose=0)
    centre = reference.mean(axis=0)
    signal = np.sqrt(np.mean((reference - centre) ** 2))
    return dict(
        common.top1_agreement(reference, quantized),
        centred=common.top1_agreement(reference - centre, quantized - centre),
        relative_logit_error=float(np.sqrt(np.mean((quantized - reference) ** 2)) / signal),
        source=args.checkpoint or f"random {config['name']}",
    )


if __name__ == "__main__":
    sys.exit(common.main(sys.modules[__name__]))
