"""Analytic FLOP count of the ViT forward pass, and model FLOP utilisation (MFU).

Counts the multiply-accumulates (MACs) of the matrix products only: patch embedding, the
query/key/value/output projections, the two attention products, the MLP, `pre_logits` and the
head. LayerNorm, softmax, GELU, residual adds and the position embedding are left out (well
under 1% of the total at 224 px), as in the usual MFU accounting (PaLM, appendix B). One
MAC is two FLOPs; a training step (forward, backward for activations and for weights) costs
three forwards.

    >>> round(vit_forward_macs(224, 16, hidden_size=768, num_layers=12, mlp_dim=3072) / 1e9, 2)
    17.57

This module imports nothing heavy, so the driver and every contender can use it.
"""

FLOPS_PER_MAC = 2
TRAINING_COST_IN_FORWARDS = 3  # forward + backward (activation grads) + backward (weight grads)
H100_SXM_DENSE_BF16_FLOPS = 989e12  # NVIDIA H100 SXM datasheet, dense (no sparsity)


def _pair(name, value):
    pair = (value, value) if isinstance(value, int) else tuple(value)
    if len(pair) != 2 or any(isinstance(v, bool) or not isinstance(v, int) or v <= 0 for v in pair):
        raise ValueError(
            f"`{name}` must be a positive int or a pair of them. Received: {name}={value!r}"
        )
    return pair


def vit_forward_macs(
    image_size,
    patch_size,
    hidden_size,
    num_layers,
    mlp_dim,
    num_classes=1000,
    classifier="token",
    representation_size=None,
    channels=3,
):
    """Multiply-accumulates of one image through a ViT forward pass.

    Args:
        image_size: int or (height, width). Input resolution in pixels.
        patch_size: int or (height, width). Patch size in pixels; must divide `image_size`.
        hidden_size: int. Transformer width D.
        num_layers: int. Number of encoder blocks.
        mlp_dim: int. MLP hidden width.
        num_classes: int or None. Head width; None or 0 for no head. Defaults to 1000.
        classifier: str. "token" adds a class token to the sequence; "gap" does not.
            Defaults to "token".
        representation_size: int or None. Width of the `pre_logits` layer, if any.
        channels: int. Image channels. Defaults to 3.

    Returns:
        int, the MACs per image (multiply by `FLOPS_PER_MAC` for FLOPs).
    """
    (height, width), (ph, pw) = _pair("image_size", image_size), _pair("patch_size", patch_size)
    if height % ph or width % pw:
        raise ValueError(f"image_size {(height, width)} is not divisible by patch_size {(ph, pw)}.")
    if classifier not in ("token", "gap"):
        raise ValueError(f"`classifier` must be 'token' or 'gap'. Received: {classifier!r}")
    patches = (height // ph) * (width // pw)
    tokens = patches + (classifier == "token")
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
    return embedding + num_layers * (projections + attention + mlp) + head


def step_flops(forward_macs, training):
    """FLOPs of one image in an inference (forward) or training step."""
    forwards = TRAINING_COST_IN_FORWARDS if training else 1
    return FLOPS_PER_MAC * forward_macs * forwards


def model_flop_utilisation(images_per_s, forward_macs, training, peak_flops):
    """Achieved FLOP/s (analytic count times measured images/s) over the hardware's peak."""
    if peak_flops <= 0:
        raise ValueError(f"`peak_flops` must be positive. Received: {peak_flops!r}")
    return images_per_s * step_flops(forward_macs, training) / peak_flops
