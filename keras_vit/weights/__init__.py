"""Pretrained weights: the official `.npz` format and its key map, the registry, downloads.

- `keymap`: model variables to checkpoint keys, by renaming rules on Keras' variable paths;
- `npz`: reading (validated, never unpickling) and writing `.npz` files;
- `layouts`: other layouts rewritten to the official one, position-embedding resizing, the
  architecture read off a file;
- `loading`: all-or-nothing loading into a model;
- `architecture`: the architecture a checkpoint describes (its registry entry, the
  `config.json` beside it, or its array shapes);
- `registry`, `download`, `sources`: names, the cache, and where weights come from.
"""

from keras_vit.lazy import lazy_attributes as _lazy_attributes
from keras_vit.weights.download import cache_dir
from keras_vit.weights.errors import CheckpointError, DownloadError
from keras_vit.weights.keymap import checkpoint_key, checkpoint_variables, model_params
from keras_vit.weights.layouts import config_from_params, resize_pos_embedding, resize_pos_table
from keras_vit.weights.loading import load_params
from keras_vit.weights.npz import read_npz
from keras_vit.weights.registry import (
    default_checkpoint,
    get_checkpoint,
    list_checkpoints,
    register_checkpoint,
)
from keras_vit.weights.sources import fetch_params, load_pretrained

__all__ = [
    "CheckpointError",
    "DownloadError",
    "cache_dir",
    "checkpoint_key",
    "checkpoint_variables",
    "config_from_params",
    "default_checkpoint",
    "fetch_params",
    "get_checkpoint",
    "list_checkpoints",
    "load_params",
    "load_pretrained",
    "model_params",
    "read_npz",
    "register_checkpoint",
    "resize_pos_embedding",
    "resize_pos_table",
    "save_npz",
]

# The writer of `.npz` files from models checks what `from_pretrained` rebuilds, so it loads
# with the model code, on first use: `keras_vit.weights.save_npz`.
__getattr__, __dir__ = _lazy_attributes(globals(), {"save_npz": "keras_vit.weights.writers"}, ())
