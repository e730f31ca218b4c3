"""Contender: keras_vit (this package), built with `keras_vit.create_model(variant)`.

Random weights, dropout 0 (the peers' work; L/16's official config has 0.1) and a random head
(the zero head meant for fine-tuning would make class 0 every image's top-1). int8 is Keras'
`model.quantize("int8")`, for inference and mode `agreement` only. Training takes the recipes'
path, `keras_vit.training.compile_model` with `keras_vit.training.AdamW`.
"""

import sys
import tempfile

from benchmarks.contenders import common, keras_common

device_peak_bytes = keras_common.device_peak_bytes


def setup(args):
    return keras_common.setup(args, "keras_vit")


def build_model(variant, image_size, seed=0, **overrides):
    """`variant` with dropout 0 and a random head; `overrides` go to `create_model`."""
    import keras

    import keras_vit

    model = keras_vit.create_model(variant, image_size=image_size, num_classes=common.NUM_CLASSES,
                                   dropout_rate=0.0, **overrides)
    head = model.get_layer("head")
    # Lecun-normal scale: logits of order one (the zero head's are all zero).
    stddev = head.kernel.shape[0] ** -0.5
    head.kernel.assign(keras.random.normal(head.kernel.shape, stddev=stddev, seed=seed))
    return model


def compile_training(model, jit_compile=None, optimizer=None):
    """Compiles `model` on the recipes' path: `training.compile_model` with AdamW (`optimizer`,
    a class; default `keras_vit.training.AdamW`) and no metrics; `jit_compile=None` takes the
    library's runtime."""
    from keras_vit import training

    adamw = (optimizer or training.AdamW)(common.LEARNING_RATE, weight_decay=common.WEIGHT_DECAY)
    training.compile_model(model, adamw, jit_compile=jit_compile, metrics=())


def build_inference(args, config):
    model = build_model(config["name"], args.image_size, args.seed)
    if args.precision == "int8":
        model.quantize("int8")
    if not args.savedmodel:
        return keras_common.inference_step(model, args)
    import tensorflow as tf

    from keras_vit import export

    # What TF Serving runs: the export's predict_images signature (bf16: the model built under
    # mixed_bfloat16, as export_saved_model(precision="bfloat16") serves a float32 one).
    path = export.export_saved_model(model, tempfile.mkdtemp(), warmup=False,
                                     jit_compile=args.xla)
    signature = tf.saved_model.load(path).signatures[export.IMAGES_SIGNATURE]
    images = tf.constant((common.batch_for(args)[0] + 1) * 127.5)  # [0, 255]
    return lambda: signature(images=images)["probabilities"].numpy()


def build_training(args, config):
    if args.precision == "int8":
        raise ValueError("--precision int8 is for inference only (Keras int8 quantization).")
    model = build_model(config["name"], args.image_size, args.seed)
    compile_training(model, True if args.backend == "jax" else args.xla)
    keras_common.require_xla(model, args)
    return keras_common.training_step(model, args)


def agreement(args, config):
    """Top-1 agreement of the int8-quantized model with the fp32 model it came from, on
    `args.agreement_images` random images (a seed apart from the timed batch), through the
    random variant or a trained `--checkpoint` at its own resolution.

    `centred` repeats it after subtracting the fp32 logits' mean over the images from both: a
    random ViT gives nearly the same logits to every image, which makes its plain agreement
    trivially high. `relative_logit_error`: RMS of (int8 - fp32) over the RMS of the
    image-dependent part of the fp32 logits.
    """
    import numpy as np

    import keras_vit

    if args.precision != "int8":
        raise ValueError(f"mode agreement compares int8 with fp32. Received: {args.precision}")
    if args.checkpoint:
        model = keras_vit.from_pretrained(args.checkpoint)
    else:
        model = build_model(config["name"], args.image_size, args.seed)
    keras_common.compile_model(model, args)
    size = tuple(model.input.shape[1:3])
    images = common.random_batch(args.agreement_images, size, args.seed + 1)[0]
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
