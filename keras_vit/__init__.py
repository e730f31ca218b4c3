"""keras_vit: the Vision Transformer (Dosovitskiy et al., 2020) for Keras 3.

`import keras_vit` imports Keras and the modules that define the model (layers, encoder,
hybrid ResNet, builders, and `compat` for the files of earlier versions), so every layer is
registered for `.keras` files from then on. The
rest of the package (data, training, export, evaluation, inspection, ...) loads on first use
(PEP 562), so that building a model on the JAX backend does not import TensorFlow. The command
line is the separate package `keras_vit_cli`, which answers `--help` without importing Keras.
"""

__version__ = "0.4.0"

from keras_vit.lazy import lazy_attributes as _lazy_attributes
from keras_vit import configs, layers, model, model_parts, positions, routes
from keras_vit.builders import (
    ViT_B8,
    ViT_B16,
    ViT_B32,
    ViT_H14,
    ViT_L16,
    ViT_L32,
    ViT_R26_B32,
    ViT_R26_S32,
    ViT_R50_B16,
    ViT_R50_L32,
    ViT_R_Ti16,
    ViT_S16,
    ViT_S32,
    ViT_Ti16,
    create_model,
    from_pretrained,
)
from keras_vit.configs import MODEL_SIZES, VARIANTS, get_variant
from keras_vit.encoder import Encoder
from keras_vit.introspection import attention_model, per_block
from keras_vit.model_parts import vit_config
from keras_vit.layers import (
    ClassToken,
    MlpBlock,
    MultiHeadDotProductAttention,
    PatchEmbedding,
    TokenPooling,
    TransformerBlock,
)
from keras_vit.model import ViT
from keras_vit.positions import (
    AddPositionEmbs,
    AddPositionEmbs2D,
    AddSinCosPositionEmbs2D,
    NoPositionEmbs,
)
from keras_vit.resnet import BottleneckUnit, ResNet, StdConv2D
from keras_vit.weights import (
    CheckpointError,
    DownloadError,
    default_checkpoint,
    list_checkpoints,
    load_pretrained,
    register_checkpoint,
)
from keras_vit.weights.writers import save_keras_hub_preset

# Public names of the modules that load on first use -> that module.
_LAZY = {
    **dict.fromkeys(("evaluate", "extract_features", "fewshot_table", "linear_probe"),
                    "keras_vit.evaluation"),
    "export_saved_model": "keras_vit.export",
    "load_model": "keras_vit.weights.keras_file",
    "export_tflite": "keras_vit.tflite",
    "export_onnx": "keras_vit.onnx_export",
    **dict.fromkeys((
        "attention_map", "attention_rollout", "inspect_model", "mean_attention_distance",
        "patch_embedding_components", "position_embedding_similarity"),
        "keras_vit.inspection"),
    **dict.fromkeys(("class_names", "decode_predictions"), "keras_vit.labels"),
    **dict.fromkeys(("preprocess_inputs", "DataConfig"), "keras_vit.preprocessing"),
    "resolve_data_config": "keras_vit.data_config",
    **dict.fromkeys(("load_image", "classify_images"), "keras_vit.images"),
    "get_strategy": "keras_vit.parallel.tf_distribute",
    **dict.fromkeys(("get_distribution", "layout_map"), "keras_vit.parallel.keras_distribution"),
}
_LAZY_MODULES = ("data", "data_config", "evaluation", "export", "fileio", "flops", "framework",
                 "images", "inspection", "labels", "parallel", "plots", "preprocessing",
                 "pretraining", "tflite", "training", "vtab")
__all__ = sorted({name for name in globals() if not name.startswith("_")} | set(_LAZY))


__getattr__, __dir__ = _lazy_attributes(globals(), _LAZY, _LAZY_MODULES)
