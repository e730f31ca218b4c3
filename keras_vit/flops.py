"""Analytic FLOP count of the ViT forward pass (the hybrids' ResNet included), model FLOP
utilisation (MFU), and the parameter count of the Transformer (`vit_params`).

Counts the multiply-accumulates (MACs) of the matrix products and convolutions only: the
hybrid's ResNet convolutions, the patch embedding, the query/key/value/output projections, the
two attention products, the MLP, `pre_logits` and the head. Normalisation, softmax, GELU,
residual adds, pooling and the position embedding are left out (well under 1% of the total
at 224 px), as in the usual MFU accounting (PaLM, appendix B) and in the paper's Tables 1-2.
One MAC is two FLOPs; a training step (forward, backward for activations and for weights)
costs three forwards.

    >>> round(vit_forward_macs(224, 16, hidden_size=768, num_layers=12, mlp_dim=3072) / 1e9, 2)
    17.56

This module imports nothing: the command line (`keras-vit models`) loads it without Keras,
and `benchmarks/` computes its MFU with it.
"""

FLOPS_PER_MAC = 2
TRAINING_COST_IN_FORWARDS = 3  # forward + backward (activation grads) + backward (weight grads)
H100_SXM_DENSE_BF16_FLOPS = 989e12  # NVIDIA H100 SXM datasheet, dense (no sparsity)
# The `keras_vit.ViT` arguments the count depends on; the others (num_heads, dropout_rate,
# position_embedding, ...) do not change it.
COUNTED_ARGUMENTS = ("patch_size", "hidden_size", "num_layers", "mlp_dim", "num_classes",
                     "classifier", "class_token", "representation_size", "resnet")
# keras_vit.ResNet: the root's width before `width_factor`, and a bottleneck's expansion.
RESNET_ROOT_WIDTH = 64
BOTTLENECK_EXPANSION = 4


def _pair(name, value):
    pair = (value, value) if isinstance(value, int) else tuple(value)
    if len(pair) != 2 or any(isinstance(v, bool) or not isinstance(v, int) or v <= 0 for v in pair):
        raise ValueError(
            f"`{name}` must be a positive int or a pair of them. Received: {name}={value!r}"
        )
    return pair


def _conv(height, width, channels, filters, kernel, stride):
    """(MACs, output height, output width) of a SAME-padded square convolution."""
    height, width = -(-height // stride), -(-width // stride)
    return height * width * kernel * kernel * channels * filters, height, width


def resnet_forward_macs(image_size, num_layers, width_factor=1, channels=3):
    """Multiply-accumulates of one image through the hybrids' ResNet (`keras_vit.ResNet`).

    Its convolutions: the 7x7/2 root, then in each bottleneck unit a 1x1, a 3x3 (strided on
    a stage's first unit after the first stage), a 1x1 to 4x the width and, where the shape
    changes, a 1x1 projection. SAME padding: each stride-2 step rounds the size up.

    Args:
        image_size: int or (height, width). Input resolution in pixels.
        num_layers: sequence of ints. Units per stage, e.g. (3, 4, 9); empty for the root alone.
        width_factor: int. Multiplies the widths. Defaults to 1.
        channels: int. Image channels. Defaults to 3.

    Returns:
        (MACs, (height, width, channels) of the feature map it outputs).
    """
    height, width = _pair("image_size", image_size)
    root = RESNET_ROOT_WIDTH * width_factor
    total, height, width = _conv(height, width, channels, root, 7, 2)
    height, width = -(-height // 2), -(-width // 2)  # the 3x3/2 max-pool
    channels = root
    for stage, units in enumerate(num_layers):
        features = root * 2**stage
        for unit in range(units):
            stride = 2 if stage > 0 and unit == 0 else 1
            out = BOTTLENECK_EXPANSION * features
            conv1, _, _ = _conv(height, width, channels, features, 1, 1)
            conv2, out_height, out_width = _conv(height, width, features, features, 3, stride)
            conv3, _, _ = _conv(out_height, out_width, features, out, 1, 1)
            projection = 0
            if channels != out or stride != 1:
                projection, _, _ = _conv(height, width, channels, out, 1, stride)
            total += conv1 + conv2 + conv3 + projection
            height, width, channels = out_height, out_width, out
    return total, (height, width, channels)


def vit_forward_macs(
    image_size,
    patch_size,
    hidden_size,
    num_layers,
    mlp_dim,
    num_classes=1000,
    classifier="token",
    class_token=None,
    representation_size=None,
    channels=3,
    resnet=None,
):
    """Multiply-accumulates of one image through a ViT forward pass.

    Args:
        image_size: int or (height, width). Input resolution in pixels.
        patch_size: int or (height, width). Patch size in pixels (for a hybrid: in cells of
            the ResNet's feature map); must divide the (feature map's) size.
        hidden_size: int. Transformer width D.
        num_layers: int. Number of encoder blocks.
        mlp_dim: int. MLP hidden width.
        num_classes: int or None. Head width; None or 0 for no head. Defaults to 1000.
        classifier: str. "token" or "gap". Defaults to "token".
        class_token: bool or None. Whether the sequence has a class token; None means
            `classifier == "token"` (as `keras_vit.ViT`).
        representation_size: int or None. Width of the `pre_logits` layer, if any.
        channels: int. Image channels. Defaults to 3.
        resnet: None, or the hybrid's ResNet as `keras_vit.ViT` takes it: a dict with
            `num_layers` (units per stage) and optionally `width_factor`.

    Returns:
        int, the MACs per image (multiply by `FLOPS_PER_MAC` for FLOPs).
    """
    (height, width), (ph, pw) = _pair("image_size", image_size), _pair("patch_size", patch_size)
    if classifier not in ("token", "gap"):
        raise ValueError(f"`classifier` must be 'token' or 'gap'. Received: {classifier!r}")
    stem = 0
    if resnet is not None:
        stem, (height, width, channels) = resnet_forward_macs(
            (height, width), resnet["num_layers"], resnet.get("width_factor", 1), channels)
    if height % ph or width % pw:
        where = "the ResNet's feature map" if resnet is not None else "image_size"
        raise ValueError(f"{where} {(height, width)} is not divisible by patch_size {(ph, pw)}.")
    patches = (height // ph) * (width // pw)
    tokens = patches + (classifier == "token" if class_token is None else bool(class_token))
    d = hidden_size
    embedding = patches * (ph * pw * channels) * d
    projections = 4 * tokens * d * d  # query, key, value, out
    attention = 2 * tokens * tokens * d  # logits q.k and the weighted sum of v, all heads
    mlp = 2 * tokens * d * mlp_dim
    width_out = d
    head = 0
    if representation_size:
        head += d * representation_size
        width_out = representation_size
    if num_classes:
        head += width_out * num_classes
    return stem + embedding + num_layers * (projections + attention + mlp) + head


def sequence_length(image_size, patch_size, class_token=True, resnet=None):
    """Tokens of one image in `keras_vit.ViT`: its patches, plus the class token if any.
    Arguments as `vit_params`."""
    return _sequence(image_size, patch_size, class_token, 3, resnet)[0]


def _sequence(image_size, patch_size, class_token, channels, resnet):
    """(tokens, the channels of what the patches are cut from)."""
    (height, width), (ph, pw) = _pair("image_size", image_size), _pair("patch_size", patch_size)
    if resnet is not None:
        _, (height, width, channels) = resnet_forward_macs(
            (height, width), resnet["num_layers"], resnet.get("width_factor", 1), channels)
    return (height // ph) * (width // pw) + bool(class_token), channels


def vit_params(image_size, patch_size, hidden_size, num_layers, mlp_dim, num_classes=1000,
               representation_size=None, class_token=True, learned_positions=True,
               channels=3, resnet=None):
    """Parameters of `keras_vit.ViT` less its hybrid ResNet (whose patches are then cells of
    the ResNet's feature map): the patch embedding, the class token, a learned 1-D position
    embedding (one D-vector a token; other position embeddings are counted as none), the
    encoder blocks, the final norm, `pre_logits` and the head. Exact for the non-hybrid
    variants of `keras_vit.configs`; a lower bound for the hybrids and other embeddings.

    Args:
        image_size, patch_size, hidden_size, num_layers, mlp_dim, representation_size,
        channels, resnet: as `vit_forward_macs`.
        num_classes: int or None. Head width; None or 0 for no head. Defaults to 1000.
        class_token: bool. Defaults to True.
        learned_positions: bool. Whether the position embedding is the learned 1-D one.
            Defaults to True.

    Returns:
        int.
    """
    (ph, pw) = _pair("patch_size", patch_size)
    tokens, channels = _sequence(image_size, patch_size, class_token, channels, resnet)
    d = hidden_size
    embedding = ph * pw * channels * d + d
    block = 2 * 2 * d + 4 * (d * d + d) + (d * mlp_dim + mlp_dim) + (mlp_dim * d + d)
    total = embedding + bool(class_token) * d + learned_positions * tokens * d
    total += num_layers * block + 2 * d  # the blocks, the final norm
    width_out = d
    if representation_size:
        total += d * representation_size + representation_size
        width_out = representation_size
    if num_classes:
        total += width_out * num_classes + num_classes
    return total


def config_forward_macs(config, image_size=None):
    """Multiply-accumulates of one image through `keras_vit.ViT(**config)`.

    Args:
        config: dict of `keras_vit.ViT` arguments (e.g. `keras_vit.vit_config(model)`, or a
            variant's `Variant.config()`); those missing take `keras_vit.ViT`'s defaults for
            `num_classes` (1000) and `classifier` ("token"); `include_top=False` counts no head.
        image_size: int, (height, width) or None. Defaults to `config["image_size"]`, else 224.

    Returns:
        int, the MACs per image.
    """
    counted = {k: config[k] for k in COUNTED_ARGUMENTS if k in config}
    if config.get("include_top") is False:
        counted["num_classes"] = None
    size = image_size or config.get("image_size") or 224
    return vit_forward_macs(size, **counted)


def step_flops(forward_macs, training):
    """FLOPs of one image in an inference (forward) or training step."""
    forwards = TRAINING_COST_IN_FORWARDS if training else 1
    return FLOPS_PER_MAC * forward_macs * forwards


def model_flop_utilisation(images_per_s, forward_macs, training, peak_flops):
    """Achieved FLOP/s (analytic count times measured images/s) over the hardware's peak."""
    if peak_flops <= 0:
        raise ValueError(f"`peak_flops` must be positive. Received: {peak_flops!r}")
    return images_per_s * step_flops(forward_macs, training) / peak_flops
