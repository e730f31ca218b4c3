"""The generic ViT builder: `keras_vit.ViT(...)`, a functional `keras.Model`.

Layer names follow the official checkpoint (`embedding`, `cls`, `posembed_input`,
`encoderblock_{i}`, `encoder_norm`, `pre_logits`, `head`), so every intermediate is reachable
with `model.get_layer(name)`:

- `model.get_layer("encoder_norm").output`: the full token sequence `[B, N(+1), D]`;
- `model.get_layer("encoderblock_3").output[1]`: block 3's attention probabilities.

With `scan=True` or `remat=True` the blocks are sublayers of one `keras_vit.Encoder` layer named
`Transformer` (`encoder_blocks` finds them in either layout, `per_block` gives the per-block
model).
"""

import warnings

import keras

from keras_vit.encoder import Encoder
from keras_vit.kernels import check_kernels
from keras_vit.layers import (
    CLASSIFIERS,
    GELU_APPROXIMATE,
    LAYER_NORM_EPSILON,
    AddPositionEmbs,
    AddPositionEmbs2D,
    AddSinCosPositionEmbs2D,
    ClassToken,
    NoPositionEmbs,
    PatchEmbedding,
    TokenPooling,
    TransformerBlock,
    sublayers,
)
from keras_vit.resnet import ResNet
from keras_vit.checks import (check_bool, check_choice, check_fits_in_memory, check_heads,
                              check_positive_int, to_pair)
from keras_vit.flops import sequence_length, vit_params

IMAGE_CHANNELS = 3
# The name of the `Encoder` layer of a `scan=True` or `remat=True` model: its variables' paths
# are then the checkpoint keys (`Transformer/encoderblock_{i}/...`).
ENCODER = "Transformer"
# `position_embedding` -> the layer `posembed_input` that adds it (paper appendix D.4, Table 8;
# "sincos_2d" from big_vision). "relative" adds nothing there: each block's attention learns
# the relative embeddings (`MultiHeadDotProductAttention(relative_positions=...)`).
POSITION_EMBEDDINGS = {
    "learned": AddPositionEmbs,
    "learned_2d": AddPositionEmbs2D,
    "sincos_2d": AddSinCosPositionEmbs2D,
    "none": NoPositionEmbs,
    "relative": NoPositionEmbs,
}
RELATIVE = "relative"


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
    resnet=None,
    layer_norm_epsilon=LAYER_NORM_EPSILON,
    dynamic_image_size=False,
    qkv_bias=True,
    class_token=None,
    fc_norm=False,
    remat=False,
    position_embedding="learned",
    scan=False,
    kernels=None,
    name=None,
    backbone=None,
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
        resnet: None, or a dict of `keras_vit.ResNet` arguments (e.g.
            `{"num_layers": (3, 4, 9)}`) for a hybrid: the patches are then cut from the
            ResNet's feature map (paper section 3.1), and `patch_size` counts feature-map
            cells. Defaults to None (patches of pixels).
        layer_norm_epsilon: float. Epsilon of every LayerNorm. Defaults to 1e-6, as the
            official Flax code (transformers' ViT checkpoints use 1e-12).
        dynamic_image_size: bool. If True, the model takes images of any size whose sides are
            multiples of the patch size (for a hybrid: whose ResNet feature map's are), and
            resizes the position embedding, learned at `image_size`, to each input's patch
            grid in the graph, with the interpolation of the official load-time resize (as
            timm's `dynamic_img_size`). One compiled function per input size under XLA.
            Defaults to False (inputs of `image_size` only).
        qkv_bias: bool. Whether the attention's query, key and value have biases. Defaults to
            True (False: timm's and transformers' `qkv_bias=False` models).
        class_token: bool or None. Whether the sequence has a class token. None (the
            default) means `classifier == "token"`; True with `classifier="gap"` keeps a class
            token beside the average of the patch tokens (timm's `global_pool="avg"` with a
            class token, as MAE's fine-tuned models).
        fc_norm: bool. If True, the final LayerNorm (`fc_norm`) normalises the pooled
            features instead of the token sequence (timm's `fc_norm`, for "gap" models).
            Defaults to False.
        remat: bool. In training, recompute each encoder block in the backward pass instead
            of keeping its activations (`keras.remat`): less memory for more compute, for
            batches that do not fit otherwise. The blocks then live in one `keras_vit.Encoder`
            layer named `Transformer`, as with `scan`. Defaults to False.
        position_embedding: str. How the patches are told where they are (paper appendix
            D.4, Table 8): "learned" (one learned vector per position, `AddPositionEmbs`),
            "learned_2d" (learned row and column embeddings of D/2 each, concatenated:
            `AddPositionEmbs2D`), "sincos_2d" (big_vision's fixed 2-D sine-cosine embedding,
            no weights: `AddSinCosPositionEmbs2D`), "relative" (D.4's relative embeddings:
            nothing is added to the tokens; each block's attention learns an embedding per
            relative offset between two patches, per head, and adds the query's product with
            it to their logit, as Shaw et al., 2018) or "none" (no position information:
            `NoPositionEmbs`). Defaults to "learned".
        scan: bool. If True, the blocks live in one `keras_vit.Encoder` layer named
            `Transformer`, which runs one traced block over their stacked weights on JAX
            (big_vision's scanned layout: one block to trace and compile instead of
            `num_layers`). The blocks keep their names and weights, so loading, saving,
            conversion and export are unchanged; the attention probabilities are not in the
            graph (`keras_vit.per_block(model)` has them; the inspection tools use it).
            Defaults to False (one `TransformerBlock` layer per block).
        kernels: dict or None. Implementation choices of `keras_vit.kernels` for every block
            (e.g. `{"attention": "products"}`); those not named take their measured defaults.
            Defaults to None.
        name: str or None. Model name. Defaults to "vit".
        backbone: 0.2's name for `resnet`; deprecated.

    Returns:
        A `keras.Model` from images `[B, H, W, 3]` scaled to [-1, 1] (see
        `keras_vit.preprocess_inputs`) to float32 logits `[B, num_classes]` (zero-initialised
        head, as for fine-tuning), or to the representation `[B, D]` if not `include_top`.

    Examples:
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
    dynamic_image_size = check_bool("dynamic_image_size", dynamic_image_size)
    qkv_bias = check_bool("qkv_bias", qkv_bias)
    fc_norm = check_bool("fc_norm", fc_norm)
    remat = check_bool("remat", remat)
    scan = check_bool("scan", scan)
    kernels = check_kernels(kernels) or None
    class_token = check_bool("class_token", classifier == "token" if class_token is None
                             else class_token)
    if include_top:
        num_classes = check_positive_int("num_classes", num_classes)
    check_choice("classifier", classifier, CLASSIFIERS)
    check_choice("position_embedding", position_embedding, tuple(POSITION_EMBEDDINGS))
    if backbone is not None:
        warnings.warn("ViT(backbone=...) is deprecated: the hybrid's ResNet is "
                      "ViT(resnet=...).", DeprecationWarning, stacklevel=2)
        if resnet is not None:
            raise ValueError("Give the hybrid's ResNet once: `resnet` (or 0.2's `backbone`), "
                             "not both.")
        resnet = backbone
    stem = _resnet(resnet)
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
    _check_memory(dict(image_size=image_size, patch_size=patch_size, hidden_size=hidden_size,
                       num_layers=num_layers, mlp_dim=mlp_dim,
                       num_classes=num_classes if include_top else None,
                       representation_size=representation_size, class_token=class_token,
                       learned_positions=position_embedding == "learned", resnet=resnet))
    if classifier == "token" and not class_token:
        raise ValueError('classifier="token" reads the class token, but class_token=False. '
                         'Expected class_token=True (or None), or classifier="gap".')
    if fc_norm and classifier == "token":
        raise ValueError('fc_norm=True normalises the average of the patch tokens. Expected '
                         'classifier="gap" with it.')

    input_size = (None, None) if dynamic_image_size else (height, width)
    images = keras.Input((*input_size, IMAGE_CHANNELS), name="image")
    x = images
    if stem:
        x = stem(x)  # x = [B, H / stride, W / stride, C]
    if dynamic_image_size:
        grid = PatchEmbedding((patch_h, patch_w), hidden_size, flatten=False,
                              name="embedding")(x)  # grid = [B, gh, gw, D]
        x = keras.layers.Reshape((-1, hidden_size), name="patches")(grid)  # x = [B, N, D]
    else:
        x = PatchEmbedding((patch_h, patch_w), hidden_size, name="embedding")(x)  # [B, N, D]
    num_prefix = int(class_token)
    if class_token:
        x = ClassToken(name="cls")(x)  # x = [B, N + 1, D]
    base_grid = (height // (patch_h * stride), width // (patch_w * stride))
    if position_embedding == "learned" and not dynamic_image_size:
        posembed = AddPositionEmbs(name="posembed_input")  # sized from the sequence
    else:
        posembed = POSITION_EMBEDDINGS[position_embedding](
            base_grid, num_prefix_tokens=num_prefix, name="posembed_input")
    x = posembed(x, grid=grid) if dynamic_image_size else posembed(x)  # x = [B, N(+1), D]
    x = keras.layers.Dropout(dropout_rate, name="dropout")(x)
    block_args = dict(dropout_rate=dropout_rate, attention_dropout_rate=attention_dropout_rate,
                      gelu_approximate=gelu_approximate, layer_norm_epsilon=layer_norm_epsilon,
                      qkv_bias=qkv_bias, kernels=kernels)
    if position_embedding == RELATIVE:
        block_args.update(relative_positions=base_grid[0] * base_grid[1],
                          num_prefix_tokens=num_prefix)
    one_layer = scan or remat
    if one_layer:
        x = Encoder(num_layers, num_heads, mlp_dim, scan=scan, remat=remat, name=ENCODER,
                    **block_args)(x)  # x = [B, N(+1), D]
    for i in range(0 if one_layer else num_layers):
        # Each block also returns its attention probabilities [B, heads, N+1, N+1]: they stay
        # in the graph, reachable as `model.get_layer(f"encoderblock_{i}").output[1]`.
        x, _ = TransformerBlock(num_heads, mlp_dim, name=f"encoderblock_{i}", **block_args)(
            x, return_attention_scores=True)
    if not fc_norm:
        x = keras.layers.LayerNormalization(epsilon=layer_norm_epsilon, name="encoder_norm")(x)
    x = TokenPooling(classifier, num_prefix_tokens=num_prefix, name="pool")(x)  # x = [B, D]
    if fc_norm:
        x = keras.layers.LayerNormalization(epsilon=layer_norm_epsilon, name="fc_norm")(x)
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


@keras.saving.register_keras_serializable(package="keras_vit")
class ViTModel(keras.Model):
    """The model class of keras_vit 0.2, kept so that its `.keras` files load; deprecated.

    The builders return Keras' own functional `keras.Model`. This class only drops 0.2's
    `fuse_optimizer` from a saved compile config: a reloaded model compiles as Keras documents.
    """

    def compile_from_config(self, config):
        super().compile_from_config({k: v for k, v in config.items() if k != "fuse_optimizer"})


# Bytes a float32 weight or activation takes.
FLOAT32_BYTES = 4


def _check_memory(args):
    """Refuses an architecture whose float32 weights and one image's activations (the tokens
    and an MLP's hidden layer: a lower bound) cannot fit in this machine's memory, before any
    weight is allocated."""
    params = vit_params(**args)
    tokens = sequence_length(args["image_size"], args["patch_size"], args["class_token"],
                             args["resnet"])
    activations = tokens * (2 * args["hidden_size"] + args["mlp_dim"])  # [N, D] twice, [N, M]
    shown = ", ".join(f"{k}={v!r}" for k, v in args.items()
                      if k in ("image_size", "patch_size", "hidden_size", "num_layers", "mlp_dim"))
    check_fits_in_memory(
        f"ViT({shown})", FLOAT32_BYTES * (params + activations),
        f"for its {params:,} weights and one image's activations (float32)",
        "a smaller image_size, hidden_size, num_layers or mlp_dim")


def _resnet(resnet):
    """The hybrid's `ResNet` for the `resnet` argument, or None."""
    if resnet is None:
        return None
    if not isinstance(resnet, dict):
        raise ValueError(
            "`resnet` must be None or a dict of keras_vit.ResNet arguments, e.g. "
            f"{{'num_layers': (3, 4, 9)}}. Received: resnet={resnet!r}"
        )
    allowed = ("num_layers", "width_factor", "std_conv_epsilon")
    unknown = sorted(set(resnet) - set(allowed))
    if unknown:
        raise ValueError(
            f"Unknown `resnet` keys {unknown} in {resnet!r}. Expected some of {allowed}."
        )
    return ResNet(name="resnet", **resnet)


def vit_config(model):
    """The `keras_vit.ViT` arguments that rebuild `model`, read off its layers.

    Args:
        model: a model built by `keras_vit.ViT` (or a named builder), or loaded from its
            `.keras` file.

    Returns:
        dict of `keras_vit.ViT` keyword arguments (JSON-serialisable).
    """
    names = {layer.name for layer in model.layers}
    blocks = encoder_blocks(model) if "embedding" in names and "pool" in names else []
    if not blocks:
        raise ValueError(f"Model {model.name!r} was not built by keras_vit.ViT: it has no "
                         "'embedding', 'encoderblock_0' and 'pool' layers.")
    embedding, block = model.get_layer("embedding"), blocks[0]
    encoder = encoder_layer(model)
    config = dict(
        image_size=list(model_image_size(model)),
        patch_size=list(embedding.patch_size),
        hidden_size=embedding.hidden_size,
        num_layers=len(blocks),
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
        resnet=None,
        layer_norm_epsilon=block.layer_norm_epsilon,
        dynamic_image_size=model.inputs[0].shape[1] is None,
        qkv_bias=block.qkv_bias,
        class_token="cls" in names,
        fc_norm="fc_norm" in names,
        remat=bool(encoder and encoder.remat),
        position_embedding=_position_embedding(model.get_layer("posembed_input"), block),
        scan=bool(encoder and encoder.scan),
        kernels=block.kernels,
        name=model.name,
    )
    if "resnet" in names:
        stem = model.get_layer("resnet")
        config["resnet"] = dict(num_layers=list(stem.num_layers),
                                  width_factor=stem.width_factor,
                                  std_conv_epsilon=stem.std_conv_epsilon)
    return config


def encoder_layer(model):
    """The model's `Encoder` layer `Transformer` (`scan=True` or `remat=True`), or None."""
    names = {layer.name for layer in model.layers}
    if ENCODER in names and isinstance(model.get_layer(ENCODER), Encoder):
        return model.get_layer(ENCODER)
    return None


def encoder_blocks(model):
    """The model's `TransformerBlock`s in order: the layers `encoderblock_{i}`, or the
    sublayers of its `Encoder` layer `Transformer` (`scan=True`, `remat=True`). Empty for a
    model without them."""
    encoder = encoder_layer(model)
    if encoder is not None:
        return list(encoder.blocks)
    names = {layer.name for layer in model.layers}
    blocks = []
    while f"encoderblock_{len(blocks)}" in names:
        blocks.append(model.get_layer(f"encoderblock_{len(blocks)}"))
    return blocks


def per_block(model):
    """The per-block model of a model whose blocks live in an `Encoder` layer (`scan=True` or
    `remat=True`), with a copy of its weights.

    Its layers `encoderblock_{i}` return their attention probabilities in the graph (for
    `keras_vit.inspection`); its outputs equal the model's. A per-block model is returned as
    it is.

    Args:
        model: a model built by `keras_vit.ViT` (or a named builder).

    Returns:
        A `keras.Model`.
    """
    if encoder_layer(model) is None:
        return model
    return rebuilt(model, scan=False, remat=False)


def rebuilt(model, dtype_policy=None, **overrides):
    """`model` built again by `keras_vit.ViT` from its configuration with `overrides`, under
    `dtype_policy` (default: the model's own), with a copy of its weights (quantized where the
    model is).

    Args:
        model: a model built by `keras_vit.ViT` (or a named builder).
        dtype_policy: str, `keras.DTypePolicy` or None. E.g. "mixed_bfloat16".
        **overrides: `keras_vit.ViT` arguments that keep the weights' shapes (e.g. `scan`,
            `remat`, `kernels`).

    Returns:
        A `keras.Model`.
    """
    config = dict(vit_config(model), **overrides)
    policy = keras.config.dtype_policy()
    keras.config.set_dtype_policy(dtype_policy or model.get_layer("embedding").dtype_policy)
    try:
        twin = ViT(**config)
    finally:
        keras.config.set_dtype_policy(policy)
    blocks = dict(zip((f"encoderblock_{i}" for i in range(config["num_layers"])),
                      encoder_blocks(model)))
    names = {layer.name for layer in model.layers}
    for layer in twin.layers:
        if layer.name in names:
            source = model.get_layer(layer.name)
        elif layer.name in blocks:
            source = blocks[layer.name]
        elif layer.name == ENCODER:  # the twin's Encoder holds the model's top-level blocks
            for block in layer.blocks:
                _quantize_like(block, blocks[block.name])
                block.set_weights(blocks[block.name].get_weights())
            continue
        _quantize_like(layer, source)
        layer.set_weights(source.get_weights())
    return twin


def unscanned(model):
    """0.2's name for `per_block`; deprecated."""
    warnings.warn("keras_vit.unscanned is deprecated: use keras_vit.per_block.",
                  DeprecationWarning, stacklevel=2)
    return per_block(model)


def _quantize_like(target, source):
    """Quantizes `target` and its sublayers where `source`, the same layer in the other
    layout, is quantized (`model.quantize`), so that `source`'s weights fit."""
    pairs = [(target, source), *zip(sublayers(target), sublayers(source))]
    for twin, layer in pairs:
        if layer.quantization_mode is None or twin.quantization_mode is not None:
            continue
        if (type(twin), twin.name) != (type(layer), layer.name):
            raise ValueError(f"Layer {twin.name!r} does not match the quantized layer "
                             f"{layer.name!r}: expected the same sublayers in both layouts.")
        # A built Keras layer given a quantized policy quantizes its own weights.
        twin.dtype_policy = layer.dtype_policy


def _position_embedding(layer, block):
    """The `position_embedding` argument that builds `layer` (`posembed_input`) and `block`."""
    if block.relative_positions:
        return RELATIVE
    for variant, cls in POSITION_EMBEDDINGS.items():
        if type(layer) is cls:
            return variant
    raise ValueError(f"Layer {layer.name!r} ({type(layer).__name__}) is none of the position "
                     f"embeddings keras_vit.ViT builds ({', '.join(POSITION_EMBEDDINGS)}).")


def patch_grid(model):
    """The `(rows, cols)` patch grid of a keras_vit model: the one its position embedding is
    learned for (for a model built with `dynamic_image_size=True`, the base grid), else its
    patch embedding's; None for a model of any input size with no position-embedding grid.
    The one place that reads it (weights loading, image size, export and inspection ask here).
    """
    names = {layer.name for layer in model.layers}
    if "posembed_input" in names and model.get_layer("posembed_input").grid_size is not None:
        return tuple(model.get_layer("posembed_input").grid_size)
    grid = model.get_layer("embedding").grid_size
    return None if grid is None or None in tuple(grid) else tuple(grid)


def model_image_size(model):
    """The `(height, width)` a keras_vit model is built for: its input size, or for a model
    built with `dynamic_image_size=True` the size its position embedding is learned at."""
    size = tuple(model.inputs[0].shape[1:3])
    if None not in size:
        return size
    names = {layer.name for layer in model.layers}
    grid = patch_grid(model)
    if grid is None:
        raise ValueError(f"Model {model.name!r} has no fixed input size and no position "
                         "embedding grid ('posembed_input' with a grid_size) to read one from.")
    patch = model.get_layer("embedding").patch_size
    stride = model.get_layer("resnet").stride if "resnet" in names else 1
    return (grid[0] * patch[0] * stride, grid[1] * patch[1] * stride)
