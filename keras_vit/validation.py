"""0.2's name for `keras_vit.checks` (argument checks); deprecated, kept for one release."""

import warnings

from keras_vit.checks import *  # noqa: F401,F403

warnings.warn("keras_vit.validation is deprecated: argument checks live in keras_vit.checks.",
              DeprecationWarning, stacklevel=2)
