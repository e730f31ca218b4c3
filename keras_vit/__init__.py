"""keras_vit: the Vision Transformer (Dosovitskiy et al., 2020) for Keras 3."""

import os

# Fewer TensorFlow C++ INFO/WARNING lines around the command line's output (the few that absl
# prints before its logging starts cannot be silenced); errors still show. A value the user
# set is kept.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from keras_vit.checkpoint import CheckpointError
from keras_vit.configs import MODEL_SIZES, VARIANTS, get_variant
from keras_vit.evaluation import evaluate, extract_features, fewshot_table, linear_probe
from keras_vit.export import export_saved_model, export_tflite
from keras_vit.inspect import (
    attention_map,
    attention_rollout,
    inspect_model,
    mean_attention_distance,
    patch_embedding_components,
    position_embedding_similarity,
)
from keras_vit.labels import class_names, decode_predictions
from keras_vit.layers import (
    AddPositionEmbs,
    ClassToken,
    MlpBlock,
    MultiHeadDotProductAttention,
    PatchEmbedding,
    TokenPooling,
    TransformerBlock,
)
from keras_vit.model import (
    ViT,
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
)
from keras_vit.preprocessing import preprocess_inputs
from keras_vit.pretrained import (
    default_checkpoint,
    from_pretrained,
    list_checkpoints,
    load_pretrained,
    register_checkpoint,
)
from keras_vit.resnet import BottleneckUnit, ResNetStem, StdConv2D

__version__ = "0.1.0"


def get_strategy(name="auto", tpu=None):
    """A tf.distribute strategy by name: see `keras_vit.distribute.get_strategy`."""
    from keras_vit.distribute import get_strategy as _get_strategy  # imports TensorFlow lazily

    return _get_strategy(name, tpu)
