"""Class names shipped with the package, and `decode_predictions`.

ImageNet-1k (`imagenet2012`, 1000 classes in the standard synset order) and ImageNet-21k
(`imagenet21k`, 21,843 classes in the order of Google's released ImageNet-21k heads), as
(WordNet id, lemmas) pairs, extracted from timm 1.0.31's `timm/data/_info` tables
(Apache-2.0). No download at run time.
"""

import functools
import importlib.resources
import os

import numpy as np

from keras_vit.checks import check_int

LABEL_SETS = {1000: "imagenet2012", 21843: "imagenet21k"}


@functools.lru_cache(maxsize=None)
def _read(label_set):
    if label_set not in LABEL_SETS.values():
        raise ValueError(
            f"Unknown label set {label_set!r}. Expected one of {sorted(LABEL_SETS.values())}."
        )
    text = (
        importlib.resources.files("keras_vit_checkpoints")
        .joinpath(f"{label_set}_labels.txt")
        .read_text()
    )
    return tuple(tuple(line.split("\t", 1)) for line in text.splitlines() if line)


def class_names(label_set="imagenet2012"):
    """The readable class names (first lemma) of "imagenet2012" or "imagenet21k", by index."""
    return [lemmas.split(", ")[0] for _, lemmas in _read(label_set)]


def default_class_names(num_classes):
    """The names of `num_classes` classes when none are given: the shipped ImageNet-1k or
    ImageNet-21k names for 1000 or 21843 classes, else "0", "1", ..., str(num_classes - 1)."""
    if num_classes in LABEL_SETS:
        return class_names(LABEL_SETS[num_classes])
    return [str(i) for i in range(num_classes)]


def check_class_names(class_names, num_classes, owner="the model"):
    """Returns the class names as a list of `num_classes` strings, or raises ValueError.

    `None` gives `default_class_names(num_classes)`. Names are stored one a line (an export's
    labels, a run's `config.json`), so they may not contain line breaks.
    """
    if class_names is None:
        return default_class_names(num_classes)
    if isinstance(class_names, str) or not all(isinstance(n, str) for n in list(class_names)):
        raise ValueError(f"class_names must be a list of str. Received: {class_names!r:.200}")
    class_names = list(class_names)
    if len(class_names) != num_classes:
        raise ValueError(
            f"class_names has {len(class_names)} names but {owner} has {num_classes} "
            f"classes. Expected {num_classes} names."
        )
    for i, name in enumerate(class_names):
        if not name.strip():
            raise ValueError(f"class_names[{i}] is {name!r}, an empty name. Expected a name for "
                             "every class (or class_names=None for the defaults).")
        if "\n" in name or "\r" in name:
            raise ValueError(
                f"class_names[{i}] = {name!r} contains a line break; the names are stored one "
                "a line. Expected names without line breaks."
            )
    return class_names


def read_class_names(path, num_classes=None):
    """Reads a class-names file: UTF-8 text, one name per line, in label order.

    Raises:
        FileNotFoundError: for a missing file.
        ValueError: naming the file and the line, for text that is not UTF-8, a blank line
            (trailing blank lines are allowed), or a count other than `num_classes`.
    """
    path = os.path.expanduser(os.fspath(path))
    try:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8-sig")
    except FileNotFoundError:
        raise FileNotFoundError(f"Class-names file {path} does not exist.") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"Class-names file {path} is not UTF-8 text (byte {e.start}). "
                         "Expected one class name per line, UTF-8.") from None
    names = [line.strip() for line in text.rstrip().splitlines()]
    blank = [i + 1 for i, name in enumerate(names) if not name]
    if not names or blank:
        where = f"line {blank[0]} is blank" if blank else "it is empty"
        raise ValueError(f"Class-names file {path}: {where}. Expected one class name per line.")
    if num_classes is not None and len(names) != num_classes:
        raise ValueError(f"Class-names file {path} has {len(names)} names but the model has "
                         f"{num_classes} classes. Expected {num_classes} lines.")
    return names


def decode_predictions(logits, top=5, class_names=None):
    """Turns logits into the `top` most likely classes of each image.

    Args:
        logits: array `[B, K]`. Softmax is applied to get probabilities.
        top: int. How many classes per image (at most K). Defaults to 5.
        class_names: list of str or None. Names of the K classes; by default the ImageNet-1k
            names for K=1000 and the ImageNet-21k names for K=21843.

    Returns:
        For each image, a list of `(class_id, name, probability)`, most likely first;
        `class_id` is the WordNet id for the ImageNet label sets, else the class index.

    Examples:
    >>> (wnid, name, probability), = decode_predictions(np.eye(1000)[[1]] * 10, top=1)[0]
    >>> wnid, name
    ('n01443537', 'goldfish')
    """
    logits = np.asarray(logits, dtype=np.float64)
    if logits.ndim != 2:
        raise ValueError(
            f"decode_predictions expects logits [batch, classes]. Received shape {logits.shape}"
        )
    # -inf masks a class out (scoring on a subset of the classes); NaN, +inf, or every class
    # masked leave no probabilities.
    bad = np.isnan(logits).any(axis=1) | np.isposinf(logits).any(axis=1) | np.isneginf(
        logits).all(axis=1)
    if bad.any():
        raise ValueError(f"decode_predictions: the logits of {int(bad.sum())} of {len(logits)} "
                         f"images give no probabilities (NaN, +inf, or every one -inf; the "
                         f"first: image {int(np.argmax(bad))}). Expected finite logits, or "
                         "-inf for classes masked out.")
    k = logits.shape[1]
    if class_names is not None:  # a list of k names: not a string, split into letters
        ids, names = [str(i) for i in range(k)], check_class_names(class_names, k,
                                                                    owner="the logits")
    elif k in LABEL_SETS:
        table = _read(LABEL_SETS[k])
        ids, names = [wnid for wnid, _ in table], [lemmas.split(", ")[0] for _, lemmas in table]
    else:
        raise ValueError(
            f"No built-in class names for {k} classes (known: "
            f"{sorted(LABEL_SETS)}); pass class_names."
        )
    top = min(check_int("top", top, 1), k)  # as Keras' decode_predictions: at most every class
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    order = np.argsort(-probs, axis=1, kind="stable")[:, :top]
    return [[(ids[i], names[i], float(p[i])) for i in row] for row, p in zip(order, probs)]
