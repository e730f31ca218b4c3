"""Argument checks shared by the modules: errors name the argument, the value and the rule."""

import numpy as np


def check_int(name, value, minimum):
    """Returns `value` as an int if it is an integer >= `minimum`, else raises ValueError."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"`{name}` must be an integer >= {minimum}. Received: {name}={value!r}")
    return int(value)


def check_positive_int(name, value, allow_none=False):
    """Raises ValueError unless `value` is a positive int (or None, if `allow_none`)."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"`{name}` must be a positive integer. Received: {name}={value!r}")
