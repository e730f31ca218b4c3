"""Few-shot linear evaluation (big_vision `fewshot_lsr`: a closed-form regularised least-squares
fit onto {-1, 1}^K targets on k images per class) and a linear probe on frozen features."""

import keras
import numpy as np

from keras_vit.checks import (check_learning_rate, check_positive_int, check_positive_number,
                              check_seed, check_trainable_classes, check_weight_decay)

# big_vision fewshot_lsr: the appended bias feature is large so that it is almost unregularised.
BIAS_FEATURE = 100.0
# Shots and L2 regularisation values reported by default (the paper reports 1, 5, 10, 25).
DEFAULT_SHOTS = (1, 5, 10, 25)
DEFAULT_L2_REGS = tuple(2.0**i for i in range(-6, 11, 2))
# The one L2 value big_vision's few-shot configuration uses (configs/common_fewshot.py).
BIG_VISION_L2_REG = 2.0**10


def _whiten(train, test):
    mean = train.mean(axis=0, keepdims=True)
    std = train.std(axis=0, keepdims=True) + 1e-5

    def prepare(x):
        x = (x - mean) / std
        return np.concatenate([x, np.full((len(x), 1), BIAS_FEATURE)], axis=1)

    return prepare(train), prepare(test)


def checked_features(train_features, train_labels, test_features, test_labels):
    """The four arrays, once each split has feature rows [N, D] of one width and one class id
    (a non-negative integer) per row; else a ValueError naming the split and what differs."""
    out = []
    for which, features, labels in (("train", train_features, train_labels),
                                     ("test", test_features, test_labels)):
        features, labels = np.asarray(features), np.asarray(labels)
        if features.ndim != 2 or not features.size:
            raise ValueError(f"The {which} features have shape {features.shape}: expected rows "
                             "of features [examples, width], as extract_features gives them.")
        if labels.shape != features.shape[:1]:
            raise ValueError(f"The {which} labels have shape {labels.shape} for {len(features)} "
                             f"rows of features: expected one class id per row, shape "
                             f"({len(features)},).")
        if not np.issubdtype(labels.dtype, np.integer) or labels.min() < 0:
            raise ValueError(f"The {which} labels must be class ids (integers >= 0). Received "
                             f"dtype {labels.dtype}, least {labels.min()}.")
        out += [features, labels]
    if out[0].shape[1] != out[2].shape[1]:
        raise ValueError(f"The train features are {out[0].shape[1]} wide, the test features "
                         f"{out[2].shape[1]}: expected features of one model.")
    return out


def lsr_weights(features, labels, num_classes, l2_reg):
    """Ridge regression of {-1, 1} one-hot targets on the features (closed form).

    Solves `min_w |X w - Y|^2 + l2_reg |w|^2` through whichever of `X^T X` (D x D) or `X X^T`
    (N x N) is smaller, as big_vision's fewshot_lsr does.

    Args:
        features: [N, D] (already whitened, with the bias feature).
        labels: [N] ints in [0, num_classes).
        num_classes: int.
        l2_reg: float > 0.

    Returns:
        w: [D, num_classes].
    """
    l2_reg = check_positive_number("l2_reg", l2_reg)
    x = np.asarray(features, np.float64)
    y = 2.0 * np.eye(num_classes)[np.asarray(labels)] - 1.0
    n, d = x.shape
    if n >= d:
        return np.linalg.solve(x.T @ x + l2_reg * np.eye(d), x.T @ y)
    return x.T @ np.linalg.solve(x @ x.T + l2_reg * np.eye(n), y)


def sample_shots(labels, shots, seed=0):
    """Indices of `shots` examples of every class, as big_vision's `fewshot_lsr` draws them:
    each class's examples in a random order (one generator seeded `seed`, the classes in
    ascending order), the first `shots` taken; so a seed's 5 shots include its 1 shot.

    Raises:
        ValueError: if a class has fewer than `shots` examples.
    """
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    classes, counts = np.unique(labels, return_counts=True)
    if counts.min() < shots:
        smallest = classes[np.argmin(counts)]
        raise ValueError(
            f"{shots}-shot needs {shots} examples of every class, but class {smallest} has only "
            f"{counts.min()}. Expected shots <= {counts.min()}."
        )
    picks = [rng.permutation(np.flatnonzero(labels == c))[:shots] for c in classes]
    return np.concatenate(picks)


def fewshot_accuracy(train_features, train_labels, test_features, test_labels, shots, l2_reg,
                     num_classes=None, seed=0):
    """Accuracy of the closed-form linear classifier fit on `shots` examples per class."""
    return _fewshot_accuracy(*checked_features(train_features, train_labels, test_features,
                                               test_labels), shots, l2_reg, num_classes, seed)


def _fewshot_accuracy(train_features, train_labels, test_features, test_labels, shots, l2_reg,
                      num_classes=None, seed=0):
    """`fewshot_accuracy` of checked arrays."""
    num_classes = num_classes or int(max(train_labels.max(), test_labels.max())) + 1
    index = sample_shots(train_labels, shots, seed)
    train, test = _whiten(np.asarray(train_features[index], np.float64),
                          np.asarray(test_features, np.float64))
    w = lsr_weights(train, train_labels[index], num_classes, l2_reg)
    return float(np.mean(np.argmax(test @ w, axis=1) == np.asarray(test_labels)))


def fewshot_table(train_features, train_labels, test_features, test_labels,
                  shots=DEFAULT_SHOTS, l2_regs=DEFAULT_L2_REGS, seed=0):
    """Few-shot accuracy for every (shots, l2_reg), and the best l2_reg for each shots.

    The best is chosen on the test examples it is measured on: an upper bound, for choosing an
    L2 value, not a score to compare. big_vision scores at one value, `BIG_VISION_L2_REG`
    (among the defaults).

    Returns:
        dict with `accuracy` {shots: {l2_reg: accuracy}}, `best` {shots: (l2_reg, accuracy)},
        and the sizes used: `num_classes`, `train_examples` (the images the shots are drawn
        from) and `test_examples` (the images every accuracy is measured on).
    """
    l2_regs = [check_positive_number("l2_regs", reg) for reg in l2_regs]
    train_features, train_labels, test_features, test_labels = checked_features(
        train_features, train_labels, test_features, test_labels)
    num_classes = check_trainable_classes(
        int(max(np.max(train_labels), np.max(test_labels))) + 1)  # one class: 100%, trivially
    accuracy = {
        k: {reg: _fewshot_accuracy(train_features, train_labels, test_features, test_labels, k,
                                   reg, num_classes, seed) for reg in l2_regs}
        for k in shots
    }
    best = {k: max(row.items(), key=lambda item: item[1]) for k, row in accuracy.items()}
    return {"accuracy": accuracy, "best": best, "num_classes": num_classes,
            "train_examples": len(train_labels), "test_examples": len(test_labels)}


def format_fewshot_table(table):
    """The few-shot table as Markdown: one row per l2_reg (big_vision's marked), one column
    per shots, and the best on the test split."""
    shots = list(table["accuracy"])
    regs = list(next(iter(table["accuracy"].values())))
    lines = ["| l2 reg | " + " | ".join(f"{k}-shot" for k in shots) + " |",
             "|---" * (len(shots) + 1) + "|"]
    for reg in regs:
        cells = [f"{table['accuracy'][k][reg]:.2%}" for k in shots]
        name = f"{reg:g}" + (" (big_vision's)" if reg == BIG_VISION_L2_REG else "")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    best = [f"{table['best'][k][1]:.2%} (l2 {table['best'][k][0]:g})" for k in shots]
    lines.append("| best on the test split | " + " | ".join(best) + " |")
    return "\n".join(lines)


def linear_probe(train_features, train_labels, test_features, test_labels, epochs=100,
                 learning_rate=0.01, weight_decay=1e-4, batch_size=256, seed=0):
    """Logistic regression on frozen (whitened) features, trained with `model.fit`.

    Returns:
        dict with `accuracy` and `loss` on the test features, and the fitted `model`.
    """
    learning_rate = check_learning_rate("learning_rate", learning_rate)
    weight_decay = check_weight_decay(weight_decay)
    seed = check_seed("seed", seed)
    epochs = check_positive_int("epochs", epochs)
    batch_size = check_positive_int("batch_size", batch_size)
    train_features, train_labels, test_features, test_labels = checked_features(
        train_features, train_labels, test_features, test_labels)
    num_classes = int(max(np.max(train_labels), np.max(test_labels))) + 1
    mean = train_features.mean(axis=0, keepdims=True)
    std = train_features.std(axis=0, keepdims=True) + 1e-5
    keras.utils.set_random_seed(seed)
    probe = keras.Sequential([
        keras.Input((train_features.shape[1],)),
        keras.layers.Dense(num_classes, kernel_initializer="zeros", name="probe"),
    ])
    probe.compile(
        optimizer=keras.optimizers.AdamW(learning_rate, weight_decay=weight_decay),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    probe.fit((train_features - mean) / std, train_labels, epochs=epochs, batch_size=batch_size,
              verbose=0, shuffle=True)
    loss, accuracy = probe.evaluate((test_features - mean) / std, test_labels, verbose=0)
    return {"accuracy": float(accuracy), "loss": float(loss), "model": probe}
