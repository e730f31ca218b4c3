import sys

from keras_vit_cli import main

sys.exit(main())
