"""`python -m keras_vit_cli`: the `keras-vit` command."""

import sys

from keras_vit_cli import main

sys.exit(main())
