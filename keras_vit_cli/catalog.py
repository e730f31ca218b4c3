"""keras_vit's tables for the commands that list them without starting TensorFlow.

`import keras_vit` imports Keras (and with it TensorFlow), so that every layer is registered
for `.keras` files. `keras-vit models` and `keras-vit checkpoints` only read tables: the
variant table (`keras_vit/configs.py`), the FLOP count (`keras_vit/flops.py`) and the registry
queries (`keras_vit/weights/entries.py`), modules that import nothing, are loaded from their
files here, and the checkpoint registry is the data package `keras_vit_checkpoints`.
"""

import importlib.resources
import importlib.util
import json
import os
import sys


def library_module(name):
    """keras_vit's module `name`, one that imports nothing of keras_vit's or Keras (`configs`,
    `flops`, `fileio`, `weights.entries`), without running `keras_vit/__init__.py`; the module
    itself where keras_vit is imported already."""
    if "keras_vit" in sys.modules:
        return importlib.import_module(f"keras_vit.{name}")
    key = f"keras_vit_cli._library_{name.replace('.', '_')}"
    if key not in sys.modules:
        package = importlib.util.find_spec("keras_vit")  # finds it without importing it
        path = os.path.join(package.submodule_search_locations[0], *name.split(".")) + ".py"
        spec = importlib.util.spec_from_file_location(key, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[key] = module
    return sys.modules[key]


def registry_entries():
    """The built-in checkpoint registry's entries (`checkpoints/registry.json`), in its order."""
    text = importlib.resources.files("keras_vit_checkpoints").joinpath("registry.json").read_text()
    return json.loads(text)["checkpoints"]
