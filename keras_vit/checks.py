"""Argument checks: one function per rule, one message per rule (`keras_vit.checks`).

Every message names the argument and the value received and says what was expected, in the
caller's terms (`batch_size 30 is not divisible across 4 replicas. Expected a multiple of 4`).
"""

import math
import numbers
import os

import numpy as np


# The largest float32: a rate beyond it is infinite where the model computes.
FLOAT32_MAX = float(np.finfo(np.float32).max)
# The largest seed: Keras' and NumPy's seeds are 32-bit.
SEED_MAX = 2**32 - 1


def _is_int(value):
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def is_real_dtype(dtype):
    """Whether arrays of `dtype` hold real numbers: bool, integers or floats (bfloat16 too);
    not complex numbers, strings or objects."""
    dtype = np.dtype(dtype)
    return dtype.kind in "biuf" or dtype.name == "bfloat16"


def check_int(name, value, minimum=None, allow_none=False):
    """Returns `value` as an int (NumPy integers too) if it is an integer >= `minimum`.

    Raises:
        ValueError: for a bool, a non-integer, or a value below `minimum`.
    """
    if value is None and allow_none:
        return None
    if not _is_int(value) or (minimum is not None and value < minimum):
        rule = {None: "an integer", 0: "a non-negative integer", 1: "a positive integer"}.get(
            minimum, f"an integer >= {minimum}")
        raise ValueError(f"`{name}` must be {rule}. Received: {name}={value!r}")
    return int(value)


def check_positive_int(name, value, allow_none=False):
    """Returns `value` as an int if it is a positive integer (or None, if `allow_none`)."""
    return check_int(name, value, 1, allow_none=allow_none)


def in_range(value, low=None, high=None, low_inclusive=True, high_inclusive=False):
    """Whether `value` is a finite real number (not a bool) in the range `check_number` takes."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))
    try:
        ok = ok and math.isfinite(float(value))
    except OverflowError:  # an integer beyond a float's range: refused as an infinity is
        ok = False
    if ok and low is not None:
        ok = value >= low if low_inclusive else value > low
    if ok and high is not None:
        ok = value <= high if high_inclusive else value < high
    return ok


def range_text(low=None, high=None, low_inclusive=True, high_inclusive=False):
    """The range `check_number` takes, as a person reads it: `[0, 1)`, `(0, inf)`."""
    left = "(-inf" if low is None else ("[" if low_inclusive else "(") + f"{low:g}"
    right = "inf)" if high is None else f"{high:g}" + ("]" if high_inclusive else ")")
    return f"{left}, {right}"


def check_number(name, value, low=None, high=None, low_inclusive=True, high_inclusive=False):
    """Returns `value` as a float if it is a real number in the given range.

    `low`/`high` of None leave that side open. NaN and infinities are refused.

    Raises:
        ValueError: naming the range.
    """
    bounds = (low, high, low_inclusive, high_inclusive)
    if not in_range(value, *bounds):
        raise ValueError(f"`{name}` must be a number in {range_text(*bounds)}. Received: "
                         f"{name}={value!r:.60}")
    return float(value)


def check_rate(name, value):
    """A dropout-like rate: a number in [0, 1)."""
    return check_number(name, value, 0.0, 1.0)


def check_learning_rate(name, value):
    """A learning rate: a number > 0 within float32's range (the optimizer computes in float32;
    beyond, it is infinite)."""
    return check_number(name, value, 0.0, FLOAT32_MAX, low_inclusive=False, high_inclusive=True)


def check_weight_decay(value):
    """`weight_decay`: a number >= 0 within float32's range."""
    return check_number("weight_decay", value, 0.0, FLOAT32_MAX, high_inclusive=True)


def check_seed(name, value):
    """A seed of Keras' and NumPy's random state: an integer in [0, SEED_MAX]."""
    value = check_int(name, value, 0)
    if value > SEED_MAX:
        raise ValueError(f"`{name}` must be an integer in [0, {SEED_MAX}]. Received: "
                         f"{name}={value}")
    return value


def check_positive_number(name, value):
    """A number > 0 (learning rates, epsilons)."""
    return check_number(name, value, 0.0, None, low_inclusive=False)


def check_bool(name, value):
    """Returns `value` if it is a bool (NumPy bools too); strings such as "no" are refused."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"`{name}` must be True or False. Received: {name}={value!r}")
    return bool(value)


def check_choice(name, value, choices):
    """Returns `value` if it is one of `choices`."""
    if value not in choices:
        raise ValueError(f"`{name}` must be one of {', '.join(map(repr, choices))}. "
                         f"Received: {name}={value!r}")
    return value


def to_pair(name, value):
    """Returns `value` as a `(height, width)` tuple of positive ints.

    Args:
        name: str. The argument's name, for error messages.
        value: int or pair of ints.
    """
    pair = (value, value) if _is_int(value) else value
    try:
        pair = tuple(pair)
    except TypeError:
        pair = None
    if pair is None or len(pair) != 2 or not all(_is_int(v) and v > 0 for v in pair):
        raise ValueError(
            f"`{name}` must be a positive int or a (height, width) pair of them. "
            f"Received: {name}={value!r}"
        )
    return tuple(int(v) for v in pair)


def check_rank(what, shape, axes):
    """Raises unless `shape` has one entry per name in `axes` (e.g. ("batch", "length"))."""
    if len(shape) != len(axes):
        raise ValueError(f"{what} expects {'a sequence' if len(axes) == 3 else 'images'} "
                         f"[{', '.join(axes)}]. Received shape {tuple(shape)}")
    return shape


def check_image_sides(shape, minimum, reason):
    """Raises unless each known side (height, width) of images `[B, H, W, C]` is at least
    `minimum` (height, width) pixels; `reason` says why (for the message)."""
    for dim, size, least in zip(("height", "width"), shape[1:3], minimum):
        if size is not None and size < least:
            raise ValueError(f"Image {dim} {size} is below {least} pixel{'s' * (least > 1)} "
                             f"({reason}). Expected images of at least {minimum[0]}x"
                             f"{minimum[1]} pixels.")
    return shape


def check_divisible(name, value, divisor_name, divisor):
    """Raises unless `value` is a multiple of `divisor`, suggesting the nearest one below."""
    if value % divisor:
        example = max(1, value // divisor) * divisor
        raise ValueError(f"{name} {value} is not divisible by {divisor_name} {divisor}. "
                         f"Expected a multiple of {divisor} (e.g. {example}).")
    return value


def check_heads(hidden_size, num_heads):
    """The attention rule: `hidden_size` splits evenly into `num_heads` heads."""
    return check_divisible("hidden_size", hidden_size, "num_heads", num_heads)


def check_replica_batch(batch_size, num_replicas):
    """A global batch size that splits evenly across the replicas of a strategy."""
    batch_size = check_positive_int("batch_size", batch_size)
    if batch_size % num_replicas:
        example = max(1, batch_size // num_replicas) * num_replicas
        raise ValueError(
            f"batch_size {batch_size} is not divisible across {num_replicas} replicas. "
            f"Expected a multiple of {num_replicas} (e.g. {example})."
        )
    return batch_size


def check_labels(labels, num_classes, what="Labels"):
    """The one label rule: every label is an integer in `[0, num_classes)`.

    Args:
        labels: array-like of class ids (any shape, possibly empty).
        num_classes: int. The number of classes.
        what: str. What the values are, for the message (e.g. "Predictions").
            Defaults to "Labels".

    Returns:
        The labels as an int64 NumPy array.

    Raises:
        ValueError: for non-integer labels or labels outside `[0, num_classes)`, naming them.
    """
    num_classes = check_positive_int("num_classes", num_classes)
    labels = np.asarray(labels)
    if labels.size and not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"{what} must be integers. Received dtype {labels.dtype}.")
    bad = labels[(labels < 0) | (labels >= num_classes)]
    if bad.size:
        raise ValueError(
            f"{what} out of range: {sorted(set(bad.tolist()))[:10]} ({bad.size} of "
            f"{labels.size} values). Expected integers in [0, {num_classes})."
        )
    return labels.astype(np.int64)


def check_trainable_classes(num_classes):
    """Training data for a classifier: at least two classes."""
    if num_classes < 2:
        raise ValueError(f"The training data has {num_classes} class; a classifier needs at "
                         "least 2. Expected one label (or image subfolder) per class.")
    return num_classes


def check_index(name, index, count, unit):
    """Returns `index` (negative counts from the end) as a non-negative index below `count`."""
    if not _is_int(index) or not -count <= index < count:
        raise ValueError(
            f"{name} {index!r} is out of range: the model has {count} {unit}. Expected an "
            f"integer from 0 to {count - 1} (or from -{count}, counting from the end)."
        )
    return int(index) % count


def physical_memory():
    """This machine's physical memory in bytes, or None where the OS does not say."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # no sysconf (Windows) or no such name
        return None


def _gigabytes(nbytes):
    return f"{nbytes / 1e9:,.0f} GB" if nbytes >= 1e10 else f"{nbytes / 1e9:.1f} GB"


def check_fits_in_memory(what, nbytes, purpose, expected):
    """Raises ValueError if `what` (e.g. "ViT(hidden_size=...)") cannot fit: the `nbytes` it
    needs for `purpose` (e.g. "for its weights") exceed this machine's physical memory.
    `expected` says what would fit."""
    memory = physical_memory()
    if memory and nbytes > memory:
        raise ValueError(f"{what} needs about {_gigabytes(nbytes)} {purpose}; this machine has "
                         f"{_gigabytes(memory)} of memory. Expected {expected}.")
