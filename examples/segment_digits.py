"""A dense-prediction head on a ViT's intermediate features: label every patch of mosaics of
handwritten digits with the digit it belongs to, or background.

    python examples/segment_digits.py   # about a minute on 2 CPU cores

The shipped digits model (`keras_vit.from_pretrained("digits")`, trained by `train_digits.py`
to classify one 16x16 digit) becomes a backbone for segmentation, as ViTDet or DPT use a
pre-trained ViT:

1. mosaics of 2x2 digits (each resized bilinearly to 16x16: 32x32 images, an 8x8 grid of
   4x4-pixel patches) from the training digits and, apart, from the 360 held-out digits
   (`train_digits.split`); each patch's label is its digit where it has ink (mean grey above
   1/4) and background (10) elsewhere;
2. the backbone takes 32x32 images (`dynamic_image_size=True`: the position embedding learned
   on a 4x4 grid is resized to 8x8) and gives the last two blocks' outputs as feature maps
   `[B, 8, 8, 64]` (`model.intermediates_model(indices=2, norm=True, intermediates_only=True)`,
   timm's `forward_intermediates` arguments), frozen;
3. a head of two 1x1 convolutions on the concatenated maps is trained with `fit` (Adam,
   cross-entropy per patch), and the same head on the same architecture with random weights,
   for comparison;
4. it prints the per-patch accuracy on the held-out mosaics of both, as a Markdown table, and
   the same numbers as one JSON line.
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import train_digits  # noqa: E402  (the demo's data, split and model)

BACKGROUND = 10
DIGIT_SIDE = 16  # pixels of one digit in a mosaic (the digits model's input)
PATCH = 4
INK = 255 / 4  # a patch whose mean grey is above this shows its digit


def mosaics(images, labels, count, seed):
    """`count` 2x2 mosaics of random digits: (images uint8 [count, 32, 32, 3], per-patch
    labels [count, 8, 8])."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(images), (count, 2, 2))
    digits = tf.image.resize(images.astype(np.float32), (DIGIT_SIDE, DIGIT_SIDE)).numpy()
    tiles = digits[picks]  # [count, 2, 2, 16, 16, 3]
    canvas = tiles.transpose(0, 1, 3, 2, 4, 5).reshape(count, 2 * DIGIT_SIDE, 2 * DIGIT_SIDE, 3)
    grid = 2 * DIGIT_SIDE // PATCH
    ink = canvas[..., 0].reshape(count, grid, PATCH, grid, PATCH).mean(axis=(2, 4)) > INK
    owner = labels[picks].repeat(grid // 2, axis=1).repeat(grid // 2, axis=2)  # [count, 8, 8]
    return np.round(canvas).astype(np.uint8), np.where(ink, owner, BACKGROUND)


def segmenter(backbone_model, seed):
    """The frozen feature maps of the last two blocks of `backbone_model`, concatenated, and a
    trainable head of two 1x1 convolutions: per-patch logits `[B, 8, 8, 11]`."""
    import keras

    backbone = backbone_model.intermediates_model(indices=2, norm=True,
                                                  intermediates_only=True)
    backbone.trainable = False
    features = keras.layers.Concatenate()(backbone.outputs)
    init = keras.initializers.GlorotUniform(seed=seed)
    hidden = keras.layers.Conv2D(64, 1, activation="gelu", kernel_initializer=init)(features)
    logits = keras.layers.Conv2D(BACKGROUND + 1, 1, kernel_initializer=init)(hidden)
    model = keras.Model(backbone.inputs, logits)
    model.compile(optimizer=keras.optimizers.Adam(3e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train-mosaics", type=int, default=4000)
    parser.add_argument("--test-mosaics", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    import keras

    import keras_vit

    images, labels = train_digits.digits_rgb()
    train_images, test_images, train_labels, test_labels = train_digits.split(images, labels)
    x_train, y_train = mosaics(train_images, train_labels, args.train_mosaics, args.seed)
    x_test, y_test = mosaics(test_images, test_labels, args.test_mosaics, args.seed + 1)
    pretrained = keras_vit.from_pretrained("digits", dynamic_image_size=True, progress=False)
    keras.utils.set_random_seed(args.seed)
    scratch = keras_vit.ViT(**dict(train_digits.DIGITS_CONFIG, dynamic_image_size=True))
    results = {}
    for name, backbone in (("pre-trained digits ViT", pretrained), ("random weights", scratch)):
        keras.utils.set_random_seed(args.seed)
        model = segmenter(backbone, args.seed)
        model.fit(keras_vit.preprocess_inputs(x_train, backbone), y_train, epochs=args.epochs,
                  batch_size=args.batch_size, verbose=0)
        _, accuracy = model.evaluate(keras_vit.preprocess_inputs(x_test, backbone), y_test,
                                     verbose=0)
        results[name] = round(float(accuracy), 4)
    background = float((y_test == BACKGROUND).mean())
    print("| backbone (frozen) | held-out patch accuracy |\n|---|---|")
    for name, accuracy in results.items():
        print(f"| {name} | {accuracy:.4f} |")
    print(f"| (every patch background) | {background:.4f} |")
    print(json.dumps(dict(results, background=round(background, 4))))
    return results


if __name__ == "__main__":
    main()
