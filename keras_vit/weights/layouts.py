"""Checkpoint layouts: rewriting the ones found in the wild to the official one, resizing the
position embedding, and reading the architecture off a file's array shapes.

The canonical layout is the one of google-research/vision_transformer (`vit_jax`):

    embedding/{kernel,bias}, cls, Transformer/posembed_input/pos_embedding,
    Transformer/encoderblock_{i}/{LayerNorm_0,MultiHeadDotProductAttention_1,LayerNorm_2,
    MlpBlock_3}/..., Transformer/encoder_norm/{scale,bias}, pre_logits/..., head/...

and, for the hybrids, `conv_root/kernel`, `gn_root/...`, `block{s}/unit{u}/...` before them.
"""

import re

import numpy as np

from keras_vit.checks import check_choice, to_pair
from keras_vit.positions import POSITION_RESIZES, resize_matrix
from keras_vit.weights.errors import CheckpointError

POSEMB_KEY = "Transformer/posembed_input/pos_embedding"
# The learned 2-D embedding (`position_embedding="learned_2d"`): row and column tables
# (1, rows or cols, D/2), resized one by one; the class token's own `pos_embedding_cls`.
POSEMB_2D_KEYS = ("Transformer/posembed_input/pos_embedding_row",
                  "Transformer/posembed_input/pos_embedding_col")
# What a file without position-embedding arrays is read as: the resolution is not in it, and
# a fixed embedding ("sincos_2d", big_vision's plain ViTs) is more common than none. A
# `config.json` beside the file (`keras_vit.training.fit`), or overrides, say otherwise.
FIXED_POSEMB_DEFAULTS = dict(image_size=224, position_embedding="sincos_2d")
# Relative position embeddings (`position_embedding="relative"`): each block's table of the
# offsets between its P patches, (2P - 1, heads, head_dim), resized along its first axis.
RELATIVE_SUFFIX = "MultiHeadDotProductAttention_1/rel_embedding"
BLOCK_KEY = re.compile(r"Transformer/encoderblock_(\d+)/")
UNIT_KEY = re.compile(r"^block(\d+)/unit(\d+)/")
RGB = 3  # the input channels of a plain ViT's patch embedding


_BIG_VISION_BLOCK = {
    "MultiHeadDotProductAttention_0": "MultiHeadDotProductAttention_1",
    "LayerNorm_1": "LayerNorm_2",
    "MlpBlock_0": "MlpBlock_3",
}


def canonicalize(params):
    """Rewrites known checkpoint layouts to the canonical `vit_jax` one.

    Handled: the `opt/target/` prefix (Flax optimizer state files); big_vision files (`params/`
    prefix, top-level `pos_embedding` of the patches only, blocks numbered
    `MultiHeadDotProductAttention_0` / `LayerNorm_1` / `MlpBlock_0`); scanned files
    (`Transformer/encoderblock/...` with a leading layer axis).

    Returns:
        (params, big_vision): the canonical dict, and whether the file was in the big_vision
        layout (whose position embedding does not cover the class token).
    """
    out = {}
    big_vision = False
    for key, value in params.items():
        for prefix in ("opt/target/", "params/"):
            if key.startswith(prefix):
                key = key[len(prefix) :]
                big_vision = big_vision or prefix == "params/"
        if key == "pos_embedding":
            key, big_vision = POSEMB_KEY, True
        parts = key.split("/")
        if len(parts) > 2 and parts[0] == "Transformer" and parts[1].startswith("encoderblock"):
            if parts[2] in _BIG_VISION_BLOCK:
                parts[2] = _BIG_VISION_BLOCK[parts[2]]
                big_vision = True
            if parts[1] == "encoderblock":  # scanned: one array with a leading layer axis
                for i, layer_value in enumerate(np.asarray(value)):
                    out["/".join(["Transformer", f"encoderblock_{i}", *parts[2:]])] = layer_value
                continue
        out["/".join(parts)] = value
    return out, big_vision


def resize_pos_embedding(posemb, grid, has_class_token, method="linear", source_grid=None):
    """Resizes a position embedding to a new patch grid as the official code does, or as
    timm does.

    The patch part is a 2D grid, `source_grid` or else square, resized along each axis; the
    class-token position is kept as is.

    Args:
        posemb: array (1, N[+1], D).
        grid: (rows, cols) of the target patch grid.
        has_class_token: bool. Whether position 0 belongs to the class token.
        method: str. "linear", the official code's (`scipy.ndimage.zoom(order=1)` semantics: the
            corner positions map onto each other), or "bicubic", timm's
            (`resample_abs_pos_embed`: torch's antialiased bicubic interpolation), as
            `keras_vit.positions.resize_matrix`. Defaults to "linear".
        source_grid: (rows, cols) or None. The grid of `posemb`'s patch positions, where known
            (a checkpoint's configuration). Defaults to None: a square grid.

    Returns:
        Array (1, rows*cols[+1], D).
    """
    check_choice("method", method, POSITION_RESIZES)
    grid = to_pair("grid", grid)
    token, patches = (posemb[:, :1], posemb[0, 1:]) if has_class_token else (None, posemb[0])
    if source_grid is None:
        side = int(round(np.sqrt(len(patches))))
        if side * side != len(patches):
            raise CheckpointError(f"Cannot resize a position embedding of {len(patches)} patch "
                                  "positions: expected a square grid.")
        source_grid = (side, side)
    old = to_pair("source_grid", source_grid)
    if old[0] * old[1] != len(patches):
        raise CheckpointError(f"Cannot resize a position embedding of {len(patches)} patch "
                              f"positions from a {old[0]}x{old[1]} grid.")
    patches = patches.reshape(*old, -1).astype(np.float64)
    for axis, new in enumerate(grid):
        patches = _resize(patches, new, axis, method)
    patches = patches.reshape(1, grid[0] * grid[1], -1).astype(posemb.dtype)
    return patches if token is None else np.concatenate([token, patches], axis=1)


def resize_pos_table(table, length, axis=1):
    """Resizes a table of positions along `axis` to `length` positions, with the
    interpolation of `resize_pos_embedding`: a row or column table of a learned 2-D position
    embedding (1, n, D/2) along axis 1, a table of relative offsets (2P - 1, heads, head_dim)
    along axis 0.

    Returns:
        The array with `length` positions along `axis`.
    """
    return _resize(np.asarray(table, np.float64), length, axis, "linear").astype(table.dtype)


def _resize(x, new, axis, method):
    """`x` resized along `axis` to `new` points, in float64 (`resize_matrix`)."""
    if new == x.shape[axis]:
        return x
    weights = resize_matrix(method, new, x.shape[axis], xp=np)  # [new, old]
    return np.moveaxis(np.tensordot(weights, np.moveaxis(x, axis, 0), axes=1), 0, axis)


def describe(params):
    """A short description of the architecture a params dict belongs to, for error messages."""
    kernel = params.get("embedding/kernel")
    blocks = {k.split("/")[1] for k in params if BLOCK_KEY.match(k)}
    if kernel is None or np.ndim(kernel) != 4:
        return f"{len(blocks)} encoder blocks"
    return (
        f"patch {kernel.shape[0]}x{kernel.shape[1]}, width {kernel.shape[-1]}, {len(blocks)} blocks"
    )


def _resnet(params):
    """The hybrid ResNet's `ViT(resnet=...)` argument read off the file, or None."""
    if "conv_root/kernel" not in params:
        return None
    units = {}
    for key in params:
        match = UNIT_KEY.match(key)
        if match:
            stage, unit = int(match[1]), int(match[2])
            units[stage] = max(units.get(stage, 0), unit)
    width = int(params["conv_root/kernel"].shape[-1])
    resnet = {"num_layers": tuple(units[s] for s in sorted(units))}
    if width != 64:
        resnet["width_factor"] = width // 64
    return resnet


def config_from_params(params, image_size=None):
    """Reads the `keras_vit.ViT` arguments off a checkpoint's array shapes.

    Everything is in the shapes: patch size and width (embedding kernel), depth (number of
    blocks), heads (query kernel), MLP width, class token, representation size, number of
    classes, the hybrid's ResNet stages (`block{s}/unit{u}` keys), query/key/value biases, a
    norm on the pooled features (`fc_norm`) and the resolution (the position embedding,
    assumed a square grid unless `image_size` is given). The position embedding's variant is
    in the keys: `pos_embedding` is "learned", `pos_embedding_row` and `pos_embedding_col`
    are "learned_2d", the blocks' `rel_embedding` "relative"; a file with none of them is read
    as "sincos_2d" at 224 pixels unless
    `image_size` is given (`FIXED_POSEMB_DEFAULTS`: "none" has no arrays either, and neither
    records a resolution; pass `position_embedding="none"` to `from_pretrained` for it). What
    the shapes cannot tell (the GELU form, dropout, an average of the patches beside a class
    token without `fc_norm`) keeps `keras_vit.ViT`'s defaults.

    Raises:
        CheckpointError: if the arrays are not a ViT checkpoint, or the grid is not square
            and no `image_size` is given.
    """
    params, big_vision = canonicalize(params)
    try:
        kernel = params["embedding/kernel"]
        query = params["Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/kernel"]
        mlp = params["Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel"]
    except KeyError as e:
        raise CheckpointError(f"Not a ViT checkpoint: no {e.args[0]!r} array.") from None
    if np.ndim(kernel) != 4 or np.ndim(query) != 3:
        raise CheckpointError(
            f"Not a ViT checkpoint: embedding/kernel {np.shape(kernel)}, query kernel "
            f"{np.shape(query)}. Expected 4 and 3 axes.")
    has_cls = "cls" in params
    resnet = _resnet(params)
    if resnet is None and kernel.shape[2] != RGB:
        raise CheckpointError(
            f"Not a ViT checkpoint: embedding/kernel has shape {kernel.shape}. Expected (patch "
            f"height, patch width, {RGB} RGB channels, width).")
    if query.shape[0] != kernel.shape[-1] or np.ndim(mlp) != 2 or mlp.shape[0] != query.shape[0]:
        raise CheckpointError(
            f"Not a ViT checkpoint: embedding/kernel {kernel.shape}, query kernel {query.shape} "
            f"and MLP kernel {np.shape(mlp)} do not share a width. Expected (..., width), "
            "(width, heads, head size) and (width, MLP width).")
    stride = 1
    if resnet is not None:
        stride = 4 * 2 ** max(len(resnet["num_layers"]) - 1, 0)
    image_size, position_embedding = _resolution(
        params, image_size, (kernel.shape[0] * stride, kernel.shape[1] * stride),
        has_cls and not big_vision)
    blocks = {BLOCK_KEY.match(k)[1] for k in params if BLOCK_KEY.match(k)}
    head = params.get("head/kernel")
    representation = params.get("pre_logits/kernel")
    config = dict(
        image_size=image_size,
        patch_size=(int(kernel.shape[0]), int(kernel.shape[1])),
        hidden_size=int(kernel.shape[-1]),
        num_layers=len(blocks),
        num_heads=int(query.shape[1]),
        mlp_dim=int(mlp.shape[1]),
        num_classes=None if head is None else int(head.shape[-1]),
        include_top=head is not None,
        classifier="token" if has_cls else "gap",
        representation_size=None if representation is None else int(representation.shape[-1]),
    )
    if "Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/bias" not in params:
        config["qkv_bias"] = False
    if "fc_norm/scale" in params:  # the norm is on the average of the patch tokens
        config.update(classifier="gap", fc_norm=True, class_token=has_cls)
    if position_embedding != "learned":
        config["position_embedding"] = position_embedding
    if resnet is not None:
        config["resnet"] = resnet
    return config


def _resolution(params, image_size, cell, posemb_has_cls):
    """(image_size, position_embedding) read off the position-embedding arrays: a learned
    1-D embedding (a square grid unless `image_size` is given), learned row and column tables,
    or none (`FIXED_POSEMB_DEFAULTS`). `cell`: (height, width) in input pixels of one patch."""
    relative = next((k for k in sorted(params) if k.endswith(RELATIVE_SUFFIX)), None)
    posemb, row, col, rel = (params.get(k) for k in (POSEMB_KEY, *POSEMB_2D_KEYS, relative))
    for key, value in zip((POSEMB_KEY, *POSEMB_2D_KEYS, relative), (posemb, row, col, rel)):
        if value is not None and np.ndim(value) != 3:
            raise CheckpointError(f"Not a ViT checkpoint: {key} has shape {np.shape(value)}. "
                                  "Expected 3 axes.")
    if rel is not None:
        patches = (rel.shape[0] + 1) // 2
        grid = int(round(np.sqrt(patches)))
        if image_size is None and (grid * grid != patches or rel.shape[0] % 2 == 0):
            raise CheckpointError(
                f"{relative} holds {rel.shape[0]} offsets, not those of a square grid of "
                "patches (2 * rows * cols - 1); pass the image size explicitly.")
        return image_size or int(grid * cell[0]), "relative"
    if posemb is not None:
        patches = posemb.shape[1] - posemb_has_cls
        grid = int(round(np.sqrt(patches)))
        if image_size is None and grid * grid != patches:
            raise CheckpointError(
                f"The position embedding covers {patches} patches, not a square grid; pass the "
                "image size explicitly.")
        return image_size or int(grid * cell[0]), "learned"
    if row is not None and col is not None:
        height, width = int(row.shape[1] * cell[0]), int(col.shape[1] * cell[1])
        return image_size or (height if height == width else (height, width)), "learned_2d"
    return image_size or FIXED_POSEMB_DEFAULTS["image_size"], \
        FIXED_POSEMB_DEFAULTS["position_embedding"]
