"""0.2's name for `keras_vit.parallel.keras_distribution`; deprecated, kept for one release."""

import warnings

from keras_vit.parallel.keras_distribution import *  # noqa: F401,F403

warnings.warn("keras_vit.sharding is deprecated: use keras_vit.parallel.keras_distribution.",
              DeprecationWarning, stacklevel=2)
