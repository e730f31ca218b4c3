"""The embedded demo: train a small ViT from scratch on scikit-learn's handwritten digits.

    python examples/train_digits.py          # about 2 minutes on 2 CPU cores; >= 97% held out

Real data that ships inside scikit-learn (an optional dependency: `pip install -e ".[demo]"`):
1,797 grey 8x8 images of the digits 0-9 with values 0..16 (the UCI "Optical Recognition of
Handwritten Digits" test set). The script

1. turns each into an RGB image in [0, 255] (`round(v * 255 / 16)`, the grey value copied to
   the three channels); the input pipeline (`keras_vit.data.from_arrays`) resizes it
   bilinearly to the model's 16x16 input and scales it to [-1, 1] as for every ViT, so that
   4x4 patches make a 4x4 grid of 16 tokens (16x16 inputs reached 97-98% on a validation
   split where native 8x8 inputs with 2x2 patches reached 94%);
2. holds out 20% (360 images, stratified by class: scikit-learn's
   `train_test_split(test_size=0.2, random_state=0, stratify=labels)`), never seen in training;
3. trains `DIGITS_CONFIG` from scratch with `keras_vit.training.fit` and the paper's
   pre-training recipe (AdamW, decoupled weight decay 0.1, linear warm-up for 5 epochs then
   linear decay; batch 128, 100 epochs) and light augmentation (crops of 60-100% of the
   image, no flip), showing progress; the run folder (`--output`, default `runs/digits`)
   gets `final.npz` (official checkpoint layout) and `config.json` (the configuration and
   class names); the demo always starts its run over;
4. evaluates on the held-out images, classifies a few of them and prints the held-out
   accuracy, and says how its checkpoint relates to the shipped `checkpoints/vit_digits.npz`
   (the same settings trained on the maintainers' machine): the same file, or other weights
   from other rounding, with the shipped model's accuracy on the same held-out digits.
   `cp runs/digits/final.npz checkpoints/vit_digits.npz` re-ships the demo.

Everything is seeded and TensorFlow runs with deterministic ops: the same command on the same
machine and TensorFlow build writes a byte-identical checkpoint (other CPUs may round
differently). The hyper-parameters were chosen on a validation split carved out of the
training images (`--validate`), not on the held-out images.
"""

import argparse
import hashlib
import json
import os
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # quieter TensorFlow start-up

# The demo model: `keras_vit.ViT(**DIGITS_CONFIG)`.
DIGITS_CONFIG = dict(
    image_size=16,
    patch_size=4,
    hidden_size=64,
    num_layers=4,
    num_heads=4,
    mlp_dim=128,
    num_classes=10,
    classifier="token",
    dropout_rate=0.1,
)
LABELS = [str(d) for d in range(10)]
SHIPPED_NAME = os.path.join("checkpoints", "vit_digits.npz")
SHIPPED = os.path.join(ROOT, SHIPPED_NAME)
HELD_OUT_FRACTION = 0.2
SPLIT_SEED = 0
GREY_MAX = 16  # load_digits values are 0..16
# Light augmentation: crops covering 60-100% of the 8x8 image, resized to the model input; no
# flip (a mirrored digit is another shape).
AUGMENT = dict(area_range=(0.6, 1.0), flip=False)


def digits_rgb():
    """(images uint8 [1797, 8, 8, 3] in [0, 255], labels [1797]) from scikit-learn."""
    import numpy as np

    try:
        from sklearn.datasets import load_digits
    except ImportError as e:
        raise SystemExit(
            "The digits demo needs scikit-learn: pip install -e \".[demo]\"") from e
    digits = load_digits()
    grey = np.round(digits.images * (255 / GREY_MAX)).astype(np.uint8)  # [N, 8, 8]
    return np.repeat(grey[..., None], 3, axis=-1), digits.target.astype(np.int64)


def split(images, labels, seed=SPLIT_SEED):
    """The held-out split: 20% of each class, scikit-learn's stratified split."""
    from sklearn.model_selection import train_test_split

    return train_test_split(images, labels, test_size=HELD_OUT_FRACTION, random_state=seed,
                            stratify=labels)


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def ascii_digit(image):
    shades = " .:-=+*#%@"
    grey = image[..., 0].astype(int) * (len(shades) - 1) // 255
    return ["".join(shades[v] * 2 for v in row) for row in grey]


def compare_with_shipped(digest, changed, test, labels):
    """A line on how this run's checkpoint (SHA-256 `digest`) relates to the shipped one, which
    the default settings trained on another machine. `changed`: the flags set to other values
    than the defaults; `test`, `labels`: the held-out pipeline and its labels, to score the
    shipped model on."""
    import numpy as np

    import keras_vit

    if not os.path.exists(SHIPPED):
        return f"no shipped {SHIPPED_NAME} to compare with"
    if sha256(SHIPPED) == digest:
        return f"identical to the shipped {SHIPPED_NAME}"
    if changed:
        return (f"differs from the shipped {SHIPPED_NAME}, which the default settings train "
                f"(changed here: {', '.join(changed)})")
    shipped = keras_vit.ViT(**DIGITS_CONFIG, name="vit_digits")
    keras_vit.load_pretrained(shipped, SHIPPED, progress=False)
    logits = shipped.predict(test.dataset, verbose=0)
    accuracy = float(np.mean(np.argmax(logits, -1) == labels))
    return (f"other weights than the shipped {SHIPPED_NAME}, the same settings trained on "
            "another machine (its CPU and TensorFlow build round differently, and 100 epochs "
            f"carry the difference); the shipped model scores {accuracy:.4f} on the same "
            "held-out digits")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--weight-decay", type=float, default=0.1)
    parser.add_argument("--warmup-epochs", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--config", type=json.loads, default={},
                        help="overrides of DIGITS_CONFIG (JSON)")
    parser.add_argument("--augment", type=json.loads, default=AUGMENT,
                        help="keras_vit.data augmentation: true, false or a JSON dict")
    parser.add_argument("--label-smoothing", type=float, default=0.0)
    parser.add_argument("--validate", action="store_true",
                        help="tune: hold out 20%% of the training images and report on them, "
                             "never touching the held-out test split")
    parser.add_argument("--output", default=os.path.join("runs", "digits"),
                        help="the run folder (default runs/digits): final.npz, config.json")
    parser.add_argument("--verbose", type=int, default=2)
    args = parser.parse_args(argv)

    import keras
    import numpy as np
    import tensorflow as tf

    import keras_vit
    from keras_vit import data, training

    start = time.perf_counter()
    keras.utils.set_random_seed(args.seed)
    tf.config.experimental.enable_op_determinism()
    images, labels = digits_rgb()
    x_train, x_test, y_train, y_test = split(images, labels)
    if args.validate:
        x_train, x_test, y_train, y_test = split(x_train, y_train)
    config = dict(DIGITS_CONFIG, **args.config)

    train = data.from_arrays(x_train, y_train, num_classes=10, image_size=config["image_size"],
                             batch_size=args.batch_size, training=True, seed=args.seed,
                             augment=args.augment, class_names=LABELS)
    test = data.from_arrays(x_test, y_test, num_classes=10, image_size=config["image_size"],
                            batch_size=256, training=False)
    model = keras_vit.ViT(**config, name="vit_digits")
    print(f"{test.num_examples} digits held out", flush=True)
    summary = training.fit(
        model, train, output_dir=args.output, epochs=args.epochs, recipe="pretrain",
        learning_rate=args.lr,
        warmup_steps=min(args.warmup_epochs * train.steps_per_epoch,  # capped by the one rule
                         training.default_warmup_steps("pretrain",
                                                       args.epochs * train.steps_per_epoch)),
        weight_decay=args.weight_decay, label_smoothing=args.label_smoothing,
        verbose=args.verbose, overwrite=True, backup_every=10)  # epochs of about a second

    logits = model.predict(test.dataset, verbose=0)
    accuracy = float(np.mean(np.argmax(logits, -1) == y_test))
    elapsed = time.perf_counter() - start

    probabilities = keras.ops.convert_to_numpy(keras.ops.softmax(logits[:4]))
    rows = [ascii_digit(image) for image in x_test[:4]]
    for line in range(8):
        print("   ".join(r[line] for r in rows))
    print("   ".join(f"{LABELS[p.argmax()]} ({p.max():.0%})".ljust(16) for p in probabilities)
          + "  <- predicted")
    print("   ".join(f"{LABELS[t]}".ljust(16) for t in y_test[:4]) + "  <- true")
    split_name = "validation" if args.validate else "held-out"
    print(f"{split_name} accuracy: {accuracy:.4f} ({round(accuracy * len(y_test))}/"
          f"{len(y_test)}) in {elapsed:.0f} s")
    final = summary["final_weights"]
    digest = sha256(final)
    defaults = vars(parser.parse_args([]))
    changed = [f"--{name.replace('_', '-')}" for name, value in vars(args).items()
               if name not in ("output", "verbose") and value != defaults[name]]
    print(f"saved {final} (sha256 {digest}); "
          f"{compare_with_shipped(digest, changed, test, y_test)}")
    return accuracy


if __name__ == "__main__":
    main()
