"""The generic ViT builder: `keras_vit.ViT(...)`, a functional `keras.Model`.

Layer names follow the official checkpoint (`embedding`, `cls`, `posembed_input`,
`encoderblock_{i}`, `encoder_norm`, `pre_logits`, `head`), so every intermediate is reachable
with `model.get_layer(name)`:

- `model.get_layer("encoder_norm").output`: the full token sequence `[B, N(+1), D]`;
- `model.get_layer("encoderblock_3").output[1]`: block 3's attention probabilities.
"""

import keras

from keras_vit.layers import (
    CLASSIFIERS,
    GELU_APPROXIMATE,
    LAYER_NORM_EPSILON,
    AddPositionEmbs,
    ClassToken,
    PatchEmbedding,
    TokenPooling,
    TransformerBlock,
)
from keras_vit.resnet import ResNetStem
from keras_vit.validation import check_bool, check_choice, check_heads, check_positive_int, to_pair

IMAGE_CHANNELS = 3


def ViT(
    image_size=224,
    patch_size=16,
    hidden_size=768,
    num_layers=12,
    num_heads=12,
    mlp_dim=3072,
    num_classes=1000,
    classifier="token",
    representation_size=None,
    dropout_rate=0.0,
    attention_dropout_rate=0.0,
    include_top=True,
    gelu_approximate=GELU_APPROXIMATE,
    backbone=None,
    layer_norm_epsilon=LAYER_NORM_EPSILON,
    name=None,
):
    """Builds a Vision Transformer as a functional `keras.Model`.

    Args:
        image_size: int or (height, width). Input resolution; both sides must be divisible by
            the patch size. Defaults to 224.
        patch_size: int or (height, width). Patch size in pixels. Defaults to 16.
        hidden_size: int. Transformer width D. Defaults to 768.
        num_layers: int. Number of encoder blocks. Defaults to 12.
        num_heads: int. Attention heads; must divide `hidden_size`. Defaults to 12.
        mlp_dim: int. MLP hidden width. Defaults to 3072.
        num_classes: int. Size of the classification head. Defaults to 1000.
        classifier: str. "token" (class token) or "gap" (mean of the patch tokens, no class
            token). Defaults to "token".
        representation_size: int or None. If set, a `pre_logits` Dense + tanh of this width
            before the head. Defaults to None.
        dropout_rate: float. Dropout after the position embeddings, attention and MLP.
            Defaults to 0.
        attention_dropout_rate: float. Dropout on the attention probabilities. Defaults to 0.
        include_top: bool. If False, the model returns the pooled representation (after
            `pre_logits` if present) instead of logits. Defaults to True.
        gelu_approximate: bool. Tanh-approximate GELU (Flax `nn.gelu`, used to train the
            official checkpoints) if True; exact GELU if False. Defaults to True.
        backbone: None, or a dict of `keras_vit.ResNetStem` arguments (e.g.
            `{"num_layers": (3, 4, 9)}`) for a hybrid: the patches are then cut from the
            ResNet's feature map (paper section 3.1), and `patch_size` counts feature-map
            cells. Defaults to None (patches of pixels).
        layer_norm_epsilon: float. Epsilon of every LayerNorm. Defaults to 1e-6, as the
            official Flax code (transformers' ViT checkpoints use 1e-12).
        name: str or None. Model name. Defaults to "vit".

    Returns:
        A `keras.Model` from images `[B, H, W, 3]` scaled to [-1, 1] (see
        `keras_vit.preprocess_inputs`) to float32 logits `[B, num_classes]` (zero-initialised
        head, as for fine-tuning), or to the representation `[B, D]` if not `include_top`.

    Example:
    >>> model = ViT(image_size=32, patch_size=8, hidden_size=32, num_layers=2, num_heads=4,
    ...             mlp_dim=64, num_classes=10)
    >>> model(keras.ops.zeros((1, 32, 32, 3))).shape
    (1, 10)
    """
    height, width = to_pair("image_size", image_size)
    patch_h, patch_w = to_pair("patch_size", patch_size)
    hidden_size = check_positive_int("hidden_size", hidden_size)
    num_layers = check_positive_int("num_layers", num_layers)
    num_heads = check_positive_int("num_heads", num_heads)
    mlp_dim = check_positive_int("mlp_dim", mlp_dim)
    representation_size = check_positive_int("representation_size", representation_size,
                                             allow_none=True)
    include_top = check_bool("include_top", include_top)
    if include_top:
        num_classes = check_positive_int("num_classes", num_classes)
    check_choice("classifier", classifier, CLASSIFIERS)
    stem = _backbone(backbone)
    stride = stem.stride if stem else 1
    for size, patch, dim in ((height, patch_h, "height"), (width, patch_w, "width")):
        if size % (patch * stride):
            what = (
                f"patch_size {patch}"
                if stride == 1
                else (f"{patch * stride} (the ResNet's stride {stride} times patch_size {patch})")
            )
            raise ValueError(
                f"image_size {dim} {size} is not divisible by {what}. "
                f"Expected a multiple of {patch * stride} (e.g. "
                f"{size // (patch * stride) * patch * stride or patch * stride})."
            )
    check_heads(hidden_size, num_heads)

    images = keras.Input((height, width, IMAGE_CHANNELS), name="image")
    x = images
    if stem:
        x = stem(x)  # x = [B, H / stride, W / stride, C]
    x = PatchEmbedding((patch_h, patch_w), hidden_size, name="embedding")(x)  # x = [B, N, D]
    if classifier == "token":
        x = ClassToken(name="cls")(x)  # x = [B, N + 1, D]
    x = AddPositionEmbs(name="posembed_input")(x)
    x = keras.layers.Dropout(dropout_rate, name="dropout")(x)
    for i in range(num_layers):
        # Each block also returns its attention probabilities [B, heads, N+1, N+1]: they stay
        # in the graph, reachable as `model.get_layer(f"encoderblock_{i}").output[1]`.
        x, _ = TransformerBlock(
            num_heads,
            mlp_dim,
            dropout_rate=dropout_rate,
            attention_dropout_rate=attention_dropout_rate,
            gelu_approximate=gelu_approximate,
            layer_norm_epsilon=layer_norm_epsilon,
            name=f"encoderblock_{i}",
        )(x, return_attention_scores=True)
    x = keras.layers.LayerNormalization(epsilon=layer_norm_epsilon, name="encoder_norm")(x)
    x = TokenPooling(classifier, name="pool")(x)  # x = [B, D]
    if representation_size:
        x = keras.layers.Dense(
            representation_size,
            activation="tanh",
            kernel_initializer="lecun_normal",  # Flax `nn.Dense` default.
            name="pre_logits",
        )(x)
    if include_top:
        # Zero-initialised head, as the paper does for fine-tuning; float32 logits under
        # mixed precision.
        x = keras.layers.Dense(
            num_classes,
            kernel_initializer="zeros",
            bias_initializer="zeros",
            dtype="float32",
            name="head",
        )(x)
    return keras.Model(images, x, name=name or "vit")


def _backbone(backbone):
    """The hybrid's `ResNetStem` for the `backbone` argument, or None."""
    if backbone is None:
        return None
    if not isinstance(backbone, dict):
        raise ValueError(
            "`backbone` must be None or a dict of ResNetStem arguments, e.g. "
            f"{{'num_layers': (3, 4, 9)}}. Received: backbone={backbone!r}"
        )
    allowed = ("num_layers", "width_factor", "std_conv_epsilon")
    unknown = sorted(set(backbone) - set(allowed))
    if unknown:
        raise ValueError(
            f"Unknown `backbone` keys {unknown} in {backbone!r}. Expected some of {allowed}."
        )
    return ResNetStem(name="resnet", **backbone)


def vit_config(model):
    """The `keras_vit.ViT` arguments that rebuild `model`, read off its layers.

    Args:
        model: a model built by `keras_vit.ViT` (or a named builder), or loaded from its
            `.keras` file.

    Returns:
        dict of `keras_vit.ViT` keyword arguments (JSON-serialisable).
    """
    names = {layer.name for layer in model.layers}
    if "embedding" not in names or "encoderblock_0" not in names or "pool" not in names:
        raise ValueError(f"Model {model.name!r} was not built by keras_vit.ViT: it has no "
                         "'embedding', 'encoderblock_0' and 'pool' layers.")
    embedding, block = model.get_layer("embedding"), model.get_layer("encoderblock_0")
    config = dict(
        image_size=list(model.inputs[0].shape[1:3]),
        patch_size=list(embedding.patch_size),
        hidden_size=embedding.hidden_size,
        num_layers=sum(name.startswith("encoderblock_") for name in names),
        num_heads=block.num_heads,
        mlp_dim=block.mlp_dim,
        num_classes=model.get_layer("head").units if "head" in names else None,
        classifier=model.get_layer("pool").classifier,
        representation_size=model.get_layer("pre_logits").units if "pre_logits" in names
        else None,
        dropout_rate=model.get_layer("dropout").rate,
        attention_dropout_rate=block.attention_dropout_rate,
        include_top="head" in names,
        gelu_approximate=block.gelu_approximate,
        backbone=None,
        layer_norm_epsilon=block.layer_norm_epsilon,
        name=model.name,
    )
    if "resnet" in names:
        stem = model.get_layer("resnet")
        config["backbone"] = dict(num_layers=list(stem.num_layers),
                                  width_factor=stem.width_factor,
                                  std_conv_epsilon=stem.std_conv_epsilon)
    return config
