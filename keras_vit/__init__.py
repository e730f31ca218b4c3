"""keras_vit: the Vision Transformer (Dosovitskiy et al., 2020) for Keras 3.

Public names load on first use (PEP 562), so that `import keras_vit` costs no TensorFlow start-up
and the `keras-vit` command line answers `--help` at once. The layers register themselves for
`.keras` files as soon as Keras is imported, whichever is imported first
(`_register_layers_with_keras`), so `keras.saving.load_model` finds them after a plain
`import keras_vit`.
"""

import importlib
import importlib.abc
import importlib.util
import sys

__version__ = "0.2.0"

# Public name -> the module that defines it.
_EXPORTS = {
    **dict.fromkeys(("ViT", "ViTModel", "vit_config", "unscanned"), "keras_vit.model"),
    **dict.fromkeys((
        "create_model", "from_pretrained", "ViT_Ti16", "ViT_S16", "ViT_S32", "ViT_B8",
        "ViT_B16", "ViT_B32", "ViT_L16", "ViT_L32", "ViT_H14", "ViT_R50_B16", "ViT_R50_L32",
        "ViT_R26_B32", "ViT_R26_S32", "ViT_R_Ti16"), "keras_vit.builders"),
    **dict.fromkeys((
        "AddPositionEmbs", "AddPositionEmbs2D", "AddSinCosPositionEmbs2D", "ClassToken",
        "MlpBlock", "MultiHeadDotProductAttention", "NoPositionEmbs", "PatchEmbedding",
        "ScannedEncoder", "TokenPooling", "TransformerBlock"), "keras_vit.layers"),
    **dict.fromkeys(("BottleneckUnit", "ResNetStem", "StdConv2D"), "keras_vit.resnet"),
    **dict.fromkeys(("MODEL_SIZES", "VARIANTS", "get_variant"), "keras_vit.configs"),
    **dict.fromkeys((
        "CheckpointError", "DownloadError", "default_checkpoint", "list_checkpoints",
        "load_pretrained", "register_checkpoint"), "keras_vit.weights"),
    **dict.fromkeys(("evaluate", "extract_features", "fewshot_table", "linear_probe"),
                    "keras_vit.evaluation"),
    **dict.fromkeys(("export_saved_model", "export_tflite"), "keras_vit.export"),
    **dict.fromkeys((
        "attention_map", "attention_rollout", "inspect_model", "mean_attention_distance",
        "patch_embedding_components", "position_embedding_similarity"),
        "keras_vit.inspection"),
    **dict.fromkeys(("class_names", "decode_predictions"), "keras_vit.labels"),
    **dict.fromkeys(("preprocess_inputs", "load_image"), "keras_vit.images"),
    "get_strategy": "keras_vit.distribute",
    **dict.fromkeys(("get_distribution", "layout_map"), "keras_vit.sharding"),
}
_SUBMODULES = (
    "builders", "configs", "data", "distribute", "evaluation", "export", "fileio", "framework",
    "images", "inspection", "labels", "layers", "model", "pretraining", "resnet", "sharding",
    "training", "validation", "vtab", "weights",
)
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS) | set(_SUBMODULES))


# Modules whose classes `.keras` files name (`keras_vit>PatchEmbedding`, `keras_vit>ViTModel`,
# ...). They import only Keras, `keras_vit.validation` and each other, so importing them right
# after Keras is always safe.
_LAYER_MODULES = ("keras_vit.layers", "keras_vit.resnet", "keras_vit.model")


# The layer modules whose import has finished (each says so on its last line).
_LOADED_LAYER_MODULES = set()


def _import_layer_modules():
    # While one of them is being imported (`import keras_vit.layers` in a fresh process: its
    # `import keras` lands here), importing the others now would import it half-made
    # (`keras_vit.resnet` takes its base class from it): it imports them on its last line.
    if any(name in sys.modules and name not in _LOADED_LAYER_MODULES for name in _LAYER_MODULES):
        return
    for name in _LAYER_MODULES:
        if name not in sys.modules:
            importlib.import_module(name)


def _layer_module_loaded(name):
    """Called on the last line of each layer module: it is complete, and the others can follow."""
    _LOADED_LAYER_MODULES.add(name)
    _import_layer_modules()


class _AfterKerasImport(importlib.abc.MetaPathFinder):
    """Imports the layer modules right after Keras' own import completes (whoever imports
    Keras: the user, TensorFlow's `tf.keras`, or keras_vit itself)."""

    searching = False

    def find_spec(self, fullname, path, target=None):
        if fullname != "keras" or self.searching:
            return None
        self.searching = True  # the search below passes through this finder again
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self.searching = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_keras = spec.loader.exec_module

        def exec_module(module):
            exec_keras(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            _import_layer_modules()

        spec.loader.exec_module = exec_module
        return spec


def _register_layers_with_keras():
    """Registers the layers for `.keras` files now if Keras is loaded, else once it is."""
    if "keras" in sys.modules:
        _import_layer_modules()
    elif not any(isinstance(finder, _AfterKerasImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterKerasImport())


_register_layers_with_keras()
