"""Renders README's inspection figures from the shipped digits demo.

    python examples/render_figures.py

Writes 8 held-out digits as PNGs to docs/digits/ (the demo's 8x8 images, as RGB), then runs
`keras-vit inspect --weights digits --gray docs/digits/*.png --out docs/inspect`.
"""

import glob
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import train_digits  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    import tensorflow as tf

    import keras_vit_cli as cli

    images, labels = train_digits.digits_rgb()
    _, x_test, _, y_test = train_digits.split(images, labels)
    digits_dir = os.path.join(ROOT, "docs", "digits")
    os.makedirs(digits_dir, exist_ok=True)
    for old in glob.glob(os.path.join(digits_dir, "*.png")):
        os.remove(old)
    for i in range(8):
        path = os.path.join(digits_dir, f"heldout_{i}_label_{y_test[i]}.png")
        tf.io.write_file(path, tf.io.encode_png(x_test[i]))
    pngs = sorted(glob.glob(os.path.join(digits_dir, "*.png")))
    return cli.main(["inspect", "--weights", "digits", "--gray", *pngs,
                     "--out", os.path.join(ROOT, "docs", "inspect")])


if __name__ == "__main__":
    sys.exit(main())
