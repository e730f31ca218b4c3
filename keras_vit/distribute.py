"""0.2's name for `keras_vit.parallel.tf_distribute`; deprecated, kept for one release."""

import warnings

from keras_vit.parallel.tf_distribute import *  # noqa: F401,F403

warnings.warn("keras_vit.distribute is deprecated: use keras_vit.parallel.tf_distribute.", DeprecationWarning,
              stacklevel=2)
