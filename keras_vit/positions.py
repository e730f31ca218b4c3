"""Where each patch is: the position embeddings of the paper's appendix D.4 (Table 8) and
big_vision's fixed sine-cosine embedding as Keras layers, the resizes that move a learned table
to another grid (the official linear one, and timm's bicubic one), and the relative
attention's bias; and a built model's patch grid, position resize and image size, read off
its layers (`patch_grid`, `position_resize`, `model_image_size`).
"""

import math

import keras
from keras import ops

from keras_vit.checks import check_choice, check_int, to_pair
from keras_vit.layer_config import ConfigArgs

# Position embeddings are initialised normal(stddev=0.02) (`AddPositionEmbs` in vit_jax).
POSITION_EMBEDDING_STDDEV = 0.02
# Temperature of the fixed 2-D sine-cosine position embedding (big_vision `posemb_sincos_2d`).
SINCOS_TEMPERATURE = 10_000.0
# How a learned position embedding moves to another patch grid, at load time and in the graph:
# "linear", the official code's (`scipy.ndimage.zoom(order=1)`, corners aligned), or
# "bicubic", timm's (`resample_abs_pos_embed`: torch's bicubic interpolation, antialiased,
# pixel centres aligned), for timm's checkpoints.
POSITION_RESIZES = ("linear", "bicubic")
# The cubic convolution kernel's parameter of torch's antialiased bicubic resize (PIL's).
CUBIC_A = -0.5

_register = keras.saving.register_keras_serializable(package="keras_vit")


@_register
class AddPositionEmbs(ConfigArgs, keras.layers.Layer):
    """Adds a learned position embedding (checkpoint key `pos_embedding`, shape (1, N, D)).

    Initialised normal(stddev=0.02), as in the official code.

    Args:
        grid_size: None, or (rows, cols): the patch grid the embedding is learned at. None
            (the default) sizes the embedding from the input's sequence length, which must then
            be known. With a grid, the layer also takes the patch grid `grid` at call time and
            resizes the patch positions to that grid's size in the graph, as `resize` says:
            a model of any input size.
        num_prefix_tokens: int. Leading positions that belong to tokens other than patches
            (1 for the class token), kept as they are by the resize. Used with `grid_size`.
            Defaults to 0.
        resize: "linear" or "bicubic". The interpolation of that resize, the same as
            `keras_vit.weights.resize_pos_embedding(..., method=resize)` at load time:
            "linear", the official code's, or "bicubic", timm's (see `POSITION_RESIZES`).
            Defaults to "linear".
        **kwargs: standard `keras.layers.Layer` arguments.

    Input and output: `[B, N, D]`, N the patches (plus the prefix tokens). `grid` (with
    `grid_size` only): a tensor `[B, rows, cols, ...]` whose rows and cols are the patch grid
    of the input, such as the output of `PatchEmbedding(flatten=False)`.
    """

    CONFIG_ARGS = ("grid_size", "num_prefix_tokens", "resize")

    def __init__(self, grid_size=None, num_prefix_tokens=0, resize="linear", **kwargs):
        super().__init__(**kwargs)
        self.grid_size = None if grid_size is None else to_pair("grid_size", grid_size)
        self.num_prefix_tokens = check_int("num_prefix_tokens", num_prefix_tokens, 0)
        self.resize = check_choice("resize", resize, POSITION_RESIZES)

    def build(self, inputs_shape, grid_shape=None):
        if self.grid_size is not None:
            length = self.grid_size[0] * self.grid_size[1] + self.num_prefix_tokens
        elif inputs_shape[1] is None:
            raise ValueError(
                "AddPositionEmbs needs a known sequence length, or a `grid_size` to resize "
                "from; build the model with a fixed image size or with dynamic_image_size=True. "
                f"Received shape {tuple(inputs_shape)}"
            )
        else:
            length = inputs_shape[1]
        self.pos_embedding = self.add_weight(
            shape=(1, length, inputs_shape[2]),
            initializer=keras.initializers.RandomNormal(stddev=POSITION_EMBEDDING_STDDEV),
            name="pos_embedding",
        )

    def call(self, inputs, grid=None):
        # inputs = [B, N, D], pos_embedding = [1, N0, D]
        pos = self.pos_embedding
        if grid is not None:
            pos = self.embedding(ops.shape(grid)[1], ops.shape(grid)[2])
        return inputs + ops.cast(pos, inputs.dtype)

    def resized(self, rows, cols):
        """The embedding `[1, prefix + rows * cols, D]` for a patch grid of rows x cols (ints
        or scalar tensors), in float32: the patch positions resized as `resize` says
        (`resize_matrix`), the prefix positions as they are."""
        pos = ops.cast(self.pos_embedding, "float32")
        old_rows, old_cols = self.grid_size
        prefix, patches = pos[:, :self.num_prefix_tokens], pos[0, self.num_prefix_tokens:]
        patches = ops.reshape(patches, (old_rows, old_cols, -1))  # [r0, c0, D]
        patches = ops.einsum("ri,cj,ijd->rcd", resize_matrix(self.resize, rows, old_rows),
                             resize_matrix(self.resize, cols, old_cols), patches)  # [r, c, D]
        patches = ops.reshape(patches, (1, -1, ops.shape(pos)[-1]))
        return ops.concatenate([prefix, patches], axis=1)

    def embedding(self, rows, cols):
        """The embedding `[1, prefix + rows * cols, D]` added for a rows x cols patch grid: the
        learned one at its own grid (or, without `grid_size`, whatever its length), else
        `resized`."""
        static = isinstance(rows, int) and isinstance(cols, int)
        if self.grid_size is None or (static and (rows, cols) == self.grid_size):
            return self.pos_embedding
        return self.resized(rows, cols)

    def compute_output_shape(self, inputs_shape, grid_shape=None):
        return inputs_shape


def linear_resize_matrix(new, old, xp=ops):
    """`[new, old]` weights of linear interpolation from `old` to `new` points with the end
    points aligned (scipy's `zoom` of order 1): output o samples input coordinate
    o * (old - 1) / (new - 1) (0 when new = 1), and the weight of input i is
    max(0, 1 - |coordinate - i|).

    The one rule of every resize of positions: in the graph with `xp=keras.ops` (float32; `new`
    may be a scalar tensor), at load time with `xp=numpy` (float64,
    `keras_vit.weights.layouts`).
    """
    dtype = "float32" if xp is ops else "float64"
    step = (old - 1) / xp.maximum(xp.cast(new, dtype) - 1.0, 1.0) if xp is ops else \
        (old - 1) / max(new - 1, 1)
    coords = xp.arange(new, dtype=dtype) * step  # [new]
    points = xp.arange(old, dtype=dtype)  # [old]
    return xp.maximum(1.0 - xp.abs(coords[:, None] - points[None, :]), 0.0)


def bicubic_resize_matrix(new, old, xp=ops):
    """`[new, old]` weights of timm's resize of positions (`resample_abs_pos_embed`: torch's
    `interpolate(mode="bicubic", antialias=True, align_corners=False)`, PIL's filter): output
    o is centred at input coordinate (o + 0.5) * old / new; input i weighs the cubic kernel
    (a = -0.5) at (i + 0.5 - centre) / max(old / new, 1) (a wider kernel when shrinking), and
    each row is normalised to sum to 1.

    With `xp=keras.ops` in the graph (float32; `new` may be a scalar tensor), with `xp=numpy`
    at load time (float64), as `linear_resize_matrix`.
    """
    dtype = "float32" if xp is ops else "float64"
    new_f = xp.cast(new, dtype) if xp is ops else float(new)
    scale = old / new_f
    stretch = xp.maximum(scale, 1.0)
    centres = (xp.arange(new, dtype=dtype) + 0.5) * scale  # [new]
    points = xp.arange(old, dtype=dtype) + 0.5  # [old]
    t = xp.abs(points[None, :] - centres[:, None]) / stretch  # [new, old]
    near = ((CUBIC_A + 2.0) * t - (CUBIC_A + 3.0)) * t * t + 1.0
    far = (((t - 5.0) * t + 8.0) * t - 4.0) * CUBIC_A
    weights = xp.where(t < 1.0, near, xp.where(t < 2.0, far, 0.0))
    return weights / xp.sum(weights, axis=1, keepdims=True)


def resize_matrix(method, new, old, xp=ops):
    """`[new, old]` weights of the resize `method` of `POSITION_RESIZES`."""
    if method == "bicubic":
        return bicubic_resize_matrix(new, old, xp)
    return linear_resize_matrix(new, old, xp)


def _resize_positions(table, new):
    """A table `[old, C]` of 1-D positions resized linearly to `new` positions (an int or a
    scalar tensor), end points aligned (`linear_resize_matrix`)."""
    old = table.shape[0]
    if isinstance(new, int) and new == old:
        return table
    return ops.matmul(linear_resize_matrix(new, old), table)  # [new, C]


def _grid_concat(first, second, rows, cols, first_is_row):
    """`[1, rows * cols, C1 + C2]`, row-major: patch (r, c) gets the concatenation of a row
    table's entry r and a column table's entry c (`first`: the row table if `first_is_row`,
    else the column table)."""
    row, col = (first, second) if first_is_row else (second, first)
    row = ops.repeat(row[:, None, :], cols, axis=1)  # [rows, cols, C_row]
    col = ops.repeat(col[None, :, :], rows, axis=0)  # [rows, cols, C_col]
    grid = ops.concatenate([row, col] if first_is_row else [col, row], axis=-1)
    return ops.reshape(grid, (1, -1, ops.shape(grid)[-1]))


class _GridPositionEmbs(ConfigArgs, keras.layers.Layer):
    """Position information computed for the patch grid of each input (the 2-D variants).

    Args:
        grid_size: (rows, cols). The patch grid of the model's `image_size`, used when no
            `grid` is passed at call time.
        num_prefix_tokens: int. Leading tokens that are not patches (1 for the class token).
            Defaults to 0.
        **kwargs: standard `keras.layers.Layer` arguments.

    Input and output: `[B, prefix + rows * cols, D]`. `grid` (optional): a tensor
    `[B, rows, cols, ...]` whose rows and cols are the patch grid of the input, such as the
    output of `PatchEmbedding(flatten=False)`; without it the grid is `grid_size`.
    """

    CONFIG_ARGS = ("grid_size", "num_prefix_tokens")

    def __init__(self, grid_size, num_prefix_tokens=0, **kwargs):
        super().__init__(**kwargs)
        self.grid_size = to_pair("grid_size", grid_size)
        self.num_prefix_tokens = check_int("num_prefix_tokens", num_prefix_tokens, 0)

    def _check_width(self, width, multiple, minimum, variant):
        if width % multiple or width < minimum:
            raise ValueError(
                f"position_embedding={variant!r} needs a width (hidden_size) that is a "
                f"multiple of {multiple}, at least {minimum}. Received width {width}.")
        return width

    def patch_grid(self, grid=None):
        """(rows, cols) of the patch grid: of `grid` `[B, rows, cols, ...]`, else `grid_size`."""
        if grid is None:
            return self.grid_size
        return ops.shape(grid)[1], ops.shape(grid)[2]

    def call(self, inputs, grid=None):
        # inputs = [B, prefix + rows * cols, D]
        pos = self.embedding(*self.patch_grid(grid))  # pos = [1, prefix + rows * cols, D]
        return inputs + ops.cast(pos, inputs.dtype)

    def embedding(self, rows, cols):
        """The embedding `[1, prefix + rows * cols, D]` (float32) added for a rows x cols
        patch grid (ints or scalar tensors): the prefix positions, then the patches'."""
        patches = self.patch_embedding(rows, cols)  # [1, rows * cols, D]
        if not self.num_prefix_tokens:
            return patches
        return ops.concatenate([self.prefix_embedding(), patches], axis=1)

    def compute_output_shape(self, inputs_shape, grid_shape=None):
        return inputs_shape


@_register
class AddPositionEmbs2D(_GridPositionEmbs):
    """Adds a learned 2-D position embedding (paper appendix D.4, "2-dimensional embedding").

    Two learned tables of D/2 each, one for the patch rows (checkpoint key
    `pos_embedding_row`, shape (1, rows, D/2)) and one for the columns (`pos_embedding_col`,
    (1, cols, D/2)): the patch at (r, c) gets `concat(row[r], col[c])`. Each prefix token (the
    class token) gets its own learned D-vector (`pos_embedding_cls`, (1, prefix, D)).
    Initialised normal(stddev=0.02), as the 1-D embedding. For another grid (`grid` at call
    time), each table is resized linearly with its end points aligned, as the 1-D embedding.

    Args: as `_GridPositionEmbs` (`grid_size`, `num_prefix_tokens`); the width D must be even.
    """

    def build(self, inputs_shape, grid_shape=None):
        width = self._check_width(inputs_shape[-1], 2, 2, "learned_2d")
        init = keras.initializers.RandomNormal(stddev=POSITION_EMBEDDING_STDDEV)
        rows, cols = self.grid_size
        self.pos_embedding_row = self.add_weight(shape=(1, rows, width // 2), initializer=init,
                                                 name="pos_embedding_row")
        self.pos_embedding_col = self.add_weight(shape=(1, cols, width // 2), initializer=init,
                                                 name="pos_embedding_col")
        if self.num_prefix_tokens:
            self.pos_embedding_cls = self.add_weight(
                shape=(1, self.num_prefix_tokens, width), initializer=init,
                name="pos_embedding_cls")

    def patch_embedding(self, rows, cols):
        row = _resize_positions(ops.cast(self.pos_embedding_row[0], "float32"), rows)  # [r, D/2]
        col = _resize_positions(ops.cast(self.pos_embedding_col[0], "float32"), cols)  # [c, D/2]
        return _grid_concat(row, col, rows, cols, first_is_row=True)  # [1, r * c, D]

    def prefix_embedding(self):
        return ops.cast(self.pos_embedding_cls, "float32")  # [1, prefix, D]


@_register
class AddSinCosPositionEmbs2D(_GridPositionEmbs):
    """Adds the fixed 2-D sine-cosine position embedding of big_vision (`posemb_sincos_2d`,
    after MoCo v3): no weights, computed for each input's patch grid.

    With q = D/4 frequencies omega_k = 1 / 10000^(k / (q - 1)), k = 0 .. q-1, the patch at
    row r and column c gets

        [sin(c * omega), cos(c * omega), sin(r * omega), cos(r * omega)]   (D values)

    and each prefix token (the class token) gets zeros, as in big_vision, which adds the
    embedding before it prepends the class token. The width D must be a multiple of 4, at
    least 8.

    Args: as `_GridPositionEmbs` (`grid_size`, `num_prefix_tokens`).
    """

    def build(self, inputs_shape, grid_shape=None):
        self.width = self._check_width(inputs_shape[-1], 4, 8, "sincos_2d")

    def patch_embedding(self, rows, cols):
        quarter = self.width // 4
        exponent = ops.arange(quarter, dtype="float32") / (quarter - 1)
        omega = 1.0 / ops.power(SINCOS_TEMPERATURE, exponent)  # [D/4]
        x = ops.arange(cols, dtype="float32")[:, None] * omega[None, :]  # [c, D/4]
        y = ops.arange(rows, dtype="float32")[:, None] * omega[None, :]  # [r, D/4]
        x = ops.concatenate([ops.sin(x), ops.cos(x)], axis=-1)  # [c, D/2]
        y = ops.concatenate([ops.sin(y), ops.cos(y)], axis=-1)  # [r, D/2]
        return _grid_concat(x, y, rows, cols, first_is_row=False)  # [1, r * c, D]

    def prefix_embedding(self):
        return ops.zeros((1, self.num_prefix_tokens, self.width), "float32")


@_register
class NoPositionEmbs(_GridPositionEmbs):
    """Adds no position information (paper appendix D.4, "no positional information"): the
    model sees its patches as a bag. Keeps `grid_size` and `num_prefix_tokens`, the
    geometry a model of any input size is described by.

    Args: as `_GridPositionEmbs` (`grid_size`, `num_prefix_tokens`).
    """

    def call(self, inputs, grid=None):
        return inputs  # [B, N, D]

    def embedding(self, rows, cols):
        raise ValueError(
            "The model adds no position information (position_embedding='none'), so it has no "
            "position embedding to read. Expected a model built with position_embedding "
            "'learned', 'learned_2d' or 'sincos_2d'.")


def relative_attention_bias(query, table, prefix_table=None, num_prefix=0):
    """The paper's 1-D relative attention (appendix D.4) as a bias of the attention logits.

    Each query also attends to learned embeddings of the relative offsets between patches,
    used as keys (Shaw et al., 2018): for patches q and k, numbered in row-major order,
    `bias[b, h, q, k] = query[b, q, h] . table[P - 1 + q - k, h] / sqrt(head_dim)`, where the
    table holds the offsets -(P - 1) .. P - 1; every pair with a prefix token (the class
    token) takes `prefix_table[0]` instead. A sequence of another number of patches p gets the
    table resized linearly to 2p - 1 offsets, end points aligned.

    Args:
        query: `[B, N, h, k]`, N = `num_prefix` + the patches.
        table: `[2P - 1, h, k]`.
        prefix_table: `[1, h, k]`, or None when `num_prefix` is 0.
        num_prefix: int.

    Returns:
        `[B, h, N, N]`, float32.
    """
    batch, length, heads, head_dim = (ops.shape(query)[i] for i in range(4))
    patches = length - num_prefix
    offsets = 2 * patches - 1
    table = ops.cast(table, "float32")
    rows = _resize_positions(ops.reshape(table, (table.shape[0], -1)), offsets)
    table = ops.reshape(rows, (offsets, table.shape[1], table.shape[2]))  # [2p - 1, h, k]
    width = offsets
    if num_prefix:
        # The prefix pairs' embedding as the table's last entry: one product for both (the
        # TFLite converter shapes a separate "bqhk,hk->bhq" wrongly when N is not static).
        table = ops.concatenate([table, ops.cast(prefix_table, "float32")], axis=0)
        width = offsets + 1  # table = [2p, h, k]
    q = ops.cast(query, "float32") / math.sqrt(query.shape[-1])
    logits = ops.einsum("bqhk,ohk->bhqo", q, table)  # logits = [B, h, N, width]
    q_index = ops.arange(length)[:, None]
    k_index = ops.arange(length)[None, :]
    both_patches = (q_index >= num_prefix) & (k_index >= num_prefix)
    column = ops.where(both_patches, q_index - k_index + patches - 1, width - 1)  # [N, N]
    flat = ops.reshape(logits, (batch, heads, length * width))
    return ops.take(flat, q_index * width + column, axis=-1)  # [B, h, N, N]


# ---------------------------------------------------------------------------------------------
# A built model's grid, read off its layers by name (any version's).


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


def position_resize(model):
    """How the model's learned position embedding moves to another patch grid, at load time
    and in the graph: its `posembed_input` layer's `resize` ("linear", the official code's, or
    "bicubic", timm's: `keras_vit.positions.POSITION_RESIZES`); "linear" for other models."""
    names = {layer.name for layer in model.layers}
    layer = model.get_layer("posembed_input") if "posembed_input" in names else None
    return getattr(layer, "resize", "linear")


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
