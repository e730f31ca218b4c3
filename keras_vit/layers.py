"""The Vision Transformer's building blocks as Keras 3 layers.

Every layer is written with `keras.ops` only, so it runs on every Keras backend.
Sublayers and weights carry the names of the official checkpoint format
(google-research/vision_transformer, `vit_jax/models_vit.py`), so that loading a
checkpoint is a plain key map (see `keras_vit.weights.keymap`).
"""

import math
import warnings

import keras
from keras import ops

from keras_vit.kernels import (
    block_input,
    check_kernels,
    dot_product_attention,
    gelu,
    layer_norm,
    per_token,
)
from keras_vit.checks import (
    check_bool,
    check_choice,
    check_heads,
    check_image_sides,
    check_int,
    check_positive_int,
    check_positive_number,
    check_rank,
    check_rate,
    to_pair,
)

# LayerNorm epsilon of the official Flax code (`nn.LayerNorm` default). Keras' default is 1e-3.
LAYER_NORM_EPSILON = 1e-6
# Flax `nn.gelu`, used to train the official checkpoints, is the tanh approximation.
GELU_APPROXIMATE = True
# Position embeddings are initialised normal(stddev=0.02) (`AddPositionEmbs` in vit_jax).
POSITION_EMBEDDING_STDDEV = 0.02
# MLP biases are initialised normal(stddev=1e-6) (`MlpBlock` in vit_jax).
MLP_BIAS_STDDEV = 1e-6
# Temperature of the fixed 2-D sine-cosine position embedding (big_vision `posemb_sincos_2d`).
SINCOS_TEMPERATURE = 10_000.0

_register = keras.saving.register_keras_serializable(package="keras_vit")
CLASSIFIERS = ("token", "gap")


class ConfigArgs:
    """`get_config()` = Keras' base config plus the constructor arguments named in
    `CONFIG_ARGS`, each kept on the layer under its own name: `from_config(get_config())`
    rebuilds the same layer.

    After `model.quantize(...)` the layer's `dtype` in the config is a
    `keras.dtype_policies.DTypePolicyMap` from its quantized sublayers' paths to their
    policies (Keras' own way, as keras-hub does): `build` gives each Keras sublayer its entry
    (`sublayer_policy`) and each keras_vit sublayer the map, so a reloaded layer builds them
    quantized again and their int8 weights load.
    """

    CONFIG_ARGS = ()

    def sublayer_policy(self, name):
        """The dtype policy for the sublayer `name` that `build` creates: its entry in the
        layer's `DTypePolicyMap` (a reloaded quantized layer), else the layer's own policy.

        A quantized Keras layer must hold its own quantized policy, not the map: Keras'
        EinsumDense reads `self.dtype_policy.quantization_mode` when it saves its weights.
        """
        policy = self.dtype_policy
        if isinstance(policy, keras.dtype_policies.DTypePolicyMap):
            path = f"{self.path}/{name}"
            if path in policy:
                return policy[path]
        return policy

    def get_config(self):
        config = dict(super().get_config(), **{name: getattr(self, name)
                                                for name in self.CONFIG_ARGS})
        policy_map = _quantized_policy_map(self)
        if policy_map is not None:
            config["dtype"] = keras.dtype_policies.serialize(policy_map)
        return config


def sublayers(layer):
    """Every layer nested in `layer` (its attributes, and lists of them), depth first."""
    found, seen, stack = [], {id(layer)}, [layer]
    while stack:
        for value in vars(stack.pop()).values():
            for item in (value if isinstance(value, (list, tuple)) else (value,)):
                if isinstance(item, keras.layers.Layer) and id(item) not in seen:
                    seen.add(id(item))
                    found.append(item)
                    stack.append(item)
    return found


def _quantized_policy_map(layer):
    """A `DTypePolicyMap` of `layer`'s policy with its quantized sublayers' policies by path,
    or None when none is quantized (or the layer's policy is a map already)."""
    if isinstance(layer.dtype_policy, keras.dtype_policies.DTypePolicyMap):
        return None
    quantized = [sub for sub in sublayers(layer) if sub.quantization_mode is not None]
    if not quantized:
        return None
    policy_map = keras.dtype_policies.DTypePolicyMap(default_policy=layer.dtype_policy)
    for sub in quantized:
        policy_map[sub.path] = sub.dtype_policy
    return policy_map



def _dense_general_glorot(fan_in, fan_out):
    """Glorot-uniform for a kernel whose axes split `fan_in` or `fan_out` (Flax `DenseGeneral`).

    Keras' `glorot_uniform` would treat a 3D kernel (D, heads, head_dim) as a convolution and
    get the fans wrong; the official code initialises the flattened 2D kernel.
    """
    limit = math.sqrt(6.0 / (fan_in + fan_out))
    return keras.initializers.RandomUniform(-limit, limit)


@_register
class PatchEmbedding(ConfigArgs, keras.layers.Layer):
    """Cuts an image into non-overlapping patches and projects each to `hidden_size`.

    A Conv2D with kernel = stride = patch size, VALID padding and a bias, as in the
    paper; the output is flattened to a sequence in row-major patch order.

    Args:
        patch_size: int or (height, width). Patch size in pixels.
        hidden_size: int. Width D of the Transformer.
        flatten: bool. Return the patches as a sequence `[B, N, D]` (True) or as their grid
            `[B, H / ph, W / pw, D]` (False, for models that read the grid's size at call
            time). Defaults to True.
        **kwargs: standard `keras.layers.Layer` arguments.

    Input: `[B, H, W, C]` with H and W divisible by the patch size.
    Output: `[B, (H / ph) * (W / pw), D]` (or the grid, see `flatten`).

    Examples:
    >>> layer = PatchEmbedding(patch_size=16, hidden_size=64)
    >>> layer(keras.ops.zeros((2, 32, 48, 3))).shape
    (2, 6, 64)
    """

    CONFIG_ARGS = ("patch_size", "hidden_size", "flatten")

    def __init__(self, patch_size, hidden_size, flatten=True, **kwargs):
        super().__init__(**kwargs)
        self.patch_size = to_pair("patch_size", patch_size)
        self.hidden_size = check_positive_int("hidden_size", hidden_size)
        self.flatten = check_bool("flatten", flatten)

    def _grid(self, input_shape):
        check_rank("PatchEmbedding", input_shape, ("batch", "height", "width", "channels"))
        check_image_sides(input_shape, self.patch_size, "the patch size: it holds no patch")
        grid = []
        for axis, (size, patch) in enumerate(zip(input_shape[1:3], self.patch_size)):
            if size is not None and size % patch:
                dim = ("height", "width")[axis]
                raise ValueError(
                    f"Image {dim} {size} is not divisible by the patch {dim} {patch}. "
                    f"Expected a multiple of {patch}."
                )
            grid.append(None if size is None else size // patch)
        return grid

    def build(self, input_shape):
        self.grid_size = tuple(self._grid(input_shape))  # (rows, cols) of patches
        # Checkpoint vocabulary: embedding/kernel (ph, pw, C, D) and embedding/bias (D,).
        self.kernel = self.add_weight(
            shape=(*self.patch_size, input_shape[-1], self.hidden_size),
            initializer="lecun_normal",  # Flax `nn.Conv` default.
            name="kernel",
        )
        self.bias = self.add_weight(shape=(self.hidden_size,), initializer="zeros", name="bias")

    def call(self, images):
        # images = [B, H, W, C]
        self._grid(images.shape)  # sizes known when the layer is called: checked here too
        kernel = ops.cast(self.kernel, images.dtype)
        x = ops.conv(images, kernel, strides=self.patch_size, padding="valid")
        # x = [B, gh, gw, D]; the reshape gives an empty batch that shape too (TensorFlow's
        # CPU convolution returns an empty input as it is, `[0, H, W, C]`). No reshape here
        # infers a side (-1): for an empty tensor any side fits, and TensorFlow's graph
        # optimiser, folding the reshapes, infers it from `[0, H, W, C]`.
        x = ops.reshape(x, self._grid_shape(images))
        x = x + ops.cast(self.bias, x.dtype)  # x = [B, gh, gw, D]
        if not self.flatten:
            return x
        batch, rows, cols, _ = self._grid_shape(images)
        return ops.reshape(x, (batch, rows * cols, self.hidden_size))  # x = [B, gh * gw, D]

    def _grid_shape(self, images):
        """`[B, H / ph, W / pw, D]` of `images` `[B, H, W, C]`, from its (dynamic) shape."""
        shape = ops.shape(images)
        return (shape[0], shape[1] // self.patch_size[0], shape[2] // self.patch_size[1],
                self.hidden_size)

    def compute_output_shape(self, input_shape):
        gh, gw = self._grid(input_shape)
        if not self.flatten:
            return (input_shape[0], gh, gw, self.hidden_size)
        n = None if gh is None or gw is None else gh * gw
        return (input_shape[0], n, self.hidden_size)



@_register
class ClassToken(keras.layers.Layer):
    """Prepends a learned class token (checkpoint key `cls`, shape (1, 1, D)) to the sequence.

    Zero-initialised, as in the official code.

    Input: `[B, N, D]`. Output: `[B, N + 1, D]`.
    """

    def build(self, input_shape):
        self.cls = self.add_weight(shape=(1, 1, input_shape[-1]), initializer="zeros", name="cls")

    def call(self, inputs):
        # inputs = [B, N, D]
        batch = ops.shape(inputs)[0]
        cls = ops.cast(self.cls, inputs.dtype)
        cls = ops.broadcast_to(cls, (batch, 1, ops.shape(inputs)[-1]))  # cls = [B, 1, D]
        return ops.concatenate([cls, inputs], axis=1)  # [B, N + 1, D]

    def compute_output_shape(self, input_shape):
        n = None if input_shape[1] is None else input_shape[1] + 1
        return (input_shape[0], n, input_shape[2])


@_register
class AddPositionEmbs(ConfigArgs, keras.layers.Layer):
    """Adds a learned position embedding (checkpoint key `pos_embedding`, shape (1, N, D)).

    Initialised normal(stddev=0.02), as in the official code.

    Args:
        grid_size: None, or (rows, cols): the patch grid the embedding is learned at. None
            (the default) sizes the embedding from the input's sequence length, which must then
            be known. With a grid, the layer also takes the patch grid `grid` at call time and
            resizes the patch positions to that grid's size in the graph, with the linear
            interpolation of `keras_vit.weights.resize_pos_embedding` (the official load-time
            resize): a model of any input size.
        num_prefix_tokens: int. Leading positions that belong to tokens other than patches
            (1 for the class token), kept as they are by the resize. Used with `grid_size`.
            Defaults to 0.
        **kwargs: standard `keras.layers.Layer` arguments.

    Input and output: `[B, N, D]`, N the patches (plus the prefix tokens). `grid` (with
    `grid_size` only): a tensor `[B, rows, cols, ...]` whose rows and cols are the patch grid
    of the input, such as the output of `PatchEmbedding(flatten=False)`.
    """

    CONFIG_ARGS = ("grid_size", "num_prefix_tokens")

    def __init__(self, grid_size=None, num_prefix_tokens=0, **kwargs):
        super().__init__(**kwargs)
        self.grid_size = None if grid_size is None else to_pair("grid_size", grid_size)
        self.num_prefix_tokens = check_int("num_prefix_tokens", num_prefix_tokens, 0)

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
        or scalar tensors), in float32: the patch positions resized linearly with the corners
        aligned (`scipy.ndimage.zoom(order=1)`), the prefix positions as they are."""
        pos = ops.cast(self.pos_embedding, "float32")
        old_rows, old_cols = self.grid_size
        prefix, patches = pos[:, :self.num_prefix_tokens], pos[0, self.num_prefix_tokens:]
        patches = ops.reshape(patches, (old_rows, old_cols, -1))  # [r0, c0, D]
        patches = ops.einsum("ri,cj,ijd->rcd", _linear_resize_matrix(rows, old_rows),
                             _linear_resize_matrix(cols, old_cols), patches)  # [r, c, D]
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


def _linear_resize_matrix(new, old):
    """`[new, old]` float32 weights of linear interpolation from `old` to `new` points with the
    end points aligned: output o samples input coordinate o * (old - 1) / (new - 1) (0 when
    new = 1), and the weight of input i is max(0, 1 - |coordinate - i|). `new` may be a scalar
    tensor."""
    new_f = ops.cast(new, "float32")
    step = (old - 1) / ops.maximum(new_f - 1.0, 1.0)
    coords = ops.arange(new, dtype="float32") * step  # [new]
    points = ops.arange(old, dtype="float32")  # [old]
    return ops.relu(1.0 - ops.abs(coords[:, None] - points[None, :]))


def _resize_positions(table, new):
    """A table `[old, C]` of 1-D positions resized linearly to `new` positions (an int or a
    scalar tensor), end points aligned (`_linear_resize_matrix`)."""
    old = table.shape[0]
    if isinstance(new, int) and new == old:
        return table
    return ops.matmul(_linear_resize_matrix(new, old), table)  # [new, C]


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


class _ReturnsAttention:
    """Output shapes of a layer mapping `[B, N, D]` to `[B, N, D]` and, with
    `return_attention_scores=True`, also to attention probabilities `[B, heads, N, N]`."""

    def compute_output_shape(self, input_shape, return_attention_scores=False):
        if return_attention_scores:
            n = input_shape[1]
            return input_shape, (input_shape[0], self.num_heads, n, n)
        return input_shape

    def compute_output_spec(self, inputs, training=None, return_attention_scores=False):
        shapes = self.compute_output_shape(tuple(inputs.shape), return_attention_scores)
        if not return_attention_scores:
            return keras.KerasTensor(shapes, dtype=self.compute_dtype)
        return tuple(keras.KerasTensor(shape, dtype=self.compute_dtype) for shape in shapes)


@_register
class MultiHeadDotProductAttention(ConfigArgs, _ReturnsAttention, keras.layers.Layer):
    """Multi-head self-attention with the official checkpoint's weight layout.

        softmax(q k^T / sqrt(head_dim) + bias) v per head, q, k, v = x W_{q,k,v} + b_{q,k,v}

    with `bias` the relative attention of `relative_attention_bias` when `relative_positions`
    is set, else 0. Sublayers `query`, `key`, `value` (kernel (D, heads, head_dim), bias
    (heads, head_dim)) and `out` (kernel (heads, head_dim, D), bias (D,)); with relative
    positions also the weights `rel_embedding` (2P - 1, heads, head_dim) and, with prefix
    tokens, `rel_embedding_cls` (1, heads, head_dim).

    Args:
        num_heads: int. Number of attention heads; must divide the input width D.
        attention_dropout_rate: float. Dropout on the attention probabilities. Defaults to 0.
        qkv_bias: bool. Whether query, key and value have biases (False: timm's and
            transformers' `qkv_bias=False` models). Defaults to True.
        relative_positions: int or None. P, the number of patches a table of relative
            position embeddings is learned for (paper appendix D.4; other sequence lengths
            resize it), or None for none. Defaults to None.
        num_prefix_tokens: int. Leading tokens that are not patches (the class token), which
            take `rel_embedding_cls` in every pair. Defaults to 0.
        kernels: dict or None. Implementation choices of `keras_vit.kernels` (here
            "attention"); those not named take their measured defaults. Defaults to None.
        **kwargs: standard `keras.layers.Layer` arguments.

    Input: `[B, N, D]`. Output: `[B, N, D]`, or with `return_attention_scores=True` a tuple
    `([B, N, D], [B, heads, N, N])` whose second item holds the attention probabilities
    (before dropout).
    """

    CONFIG_ARGS = ("num_heads", "attention_dropout_rate", "qkv_bias", "relative_positions",
                   "num_prefix_tokens", "kernels")

    def __init__(self, num_heads, attention_dropout_rate=0.0, qkv_bias=True,
                 relative_positions=None, num_prefix_tokens=0, kernels=None, **kwargs):
        super().__init__(**kwargs)
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.attention_dropout_rate = check_rate("attention_dropout_rate", attention_dropout_rate)
        self.qkv_bias = check_bool("qkv_bias", qkv_bias)
        self.relative_positions = check_positive_int("relative_positions", relative_positions,
                                                     allow_none=True)
        self.num_prefix_tokens = check_int("num_prefix_tokens", num_prefix_tokens, 0)
        self.kernels = check_kernels(kernels) or None

    def build(self, input_shape):
        width = check_heads(input_shape[-1], self.num_heads)
        head_dim = width // self.num_heads
        init = _dense_general_glorot(width, width)
        common = dict(kernel_initializer=init, bias_initializer="zeros")
        for name in ("query", "key", "value"):
            layer = keras.layers.EinsumDense(
                "bnd,dhk->bnhk",
                output_shape=(None, self.num_heads, head_dim),
                bias_axes="hk" if self.qkv_bias else None,
                name=name,
                dtype=self.sublayer_policy(name),
                **common,
            )
            layer.build(input_shape)
            setattr(self, name, layer)
        self.out = keras.layers.EinsumDense(
            "bnhk,hkd->bnd", output_shape=(None, width), bias_axes="d", name="out",
            dtype=self.sublayer_policy("out"), **common
        )
        self.out.build((*input_shape[:-1], self.num_heads, head_dim))
        self.dropout = keras.layers.Dropout(self.attention_dropout_rate, dtype=self.dtype_policy)
        if self.relative_positions:
            init = keras.initializers.RandomNormal(stddev=POSITION_EMBEDDING_STDDEV)
            self.rel_embedding = self.add_weight(
                shape=(2 * self.relative_positions - 1, self.num_heads, head_dim),
                initializer=init, name="rel_embedding")
            if self.num_prefix_tokens:
                self.rel_embedding_cls = self.add_weight(
                    shape=(1, self.num_heads, head_dim), initializer=init,
                    name="rel_embedding_cls")

    def call(self, inputs, training=None, return_attention_scores=False):
        # inputs = [B, N, D]; query, key, value = [B, N, h, k]
        query, key, value = (layer(inputs) for layer in (self.query, self.key, self.value))
        bias = None
        if self.relative_positions:
            bias = relative_attention_bias(  # bias = [B, h, N, N]
                query, self.rel_embedding,
                self.rel_embedding_cls if self.num_prefix_tokens else None,
                self.num_prefix_tokens)
        context, probs = dot_product_attention(  # context = [B, N, h, k], probs = [B, h, N, N]
            query, key, value, bias=bias, dropout=self.dropout, training=training,
            kernels=self.kernels, return_probabilities=True)
        outputs = self.out(context)  # outputs = [B, N, D]
        return (outputs, probs) if return_attention_scores else outputs


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


@_register
class MlpBlock(ConfigArgs, keras.layers.Layer):
    """The Transformer's MLP: Dense(mlp_dim) -> GELU -> Dropout -> Dense(D) -> Dropout.

    Sublayers `Dense_0` and `Dense_1`, as in the checkpoint.

    Args:
        mlp_dim: int. Hidden width of the MLP.
        dropout_rate: float. Dropout after each Dense. Defaults to 0.
        gelu_approximate: bool. Tanh-approximate GELU (Flax `nn.gelu`, used to train the
            official checkpoints) if True, exact GELU if False. Defaults to True.
        kernels: dict or None. Implementation choices of `keras_vit.kernels` (here "mlp" and
            "gelu"); those not named take their measured defaults. Defaults to None.
        **kwargs: standard `keras.layers.Layer` arguments.
    """

    CONFIG_ARGS = ("mlp_dim", "dropout_rate", "gelu_approximate", "kernels")

    def __init__(self, mlp_dim, dropout_rate=0.0, gelu_approximate=GELU_APPROXIMATE,
                 kernels=None, **kwargs):
        super().__init__(**kwargs)
        self.mlp_dim = check_positive_int("mlp_dim", mlp_dim)
        self.dropout_rate = check_rate("dropout_rate", dropout_rate)
        self.gelu_approximate = check_bool("gelu_approximate", gelu_approximate)
        self.kernels = check_kernels(kernels) or None

    def build(self, input_shape):
        width = input_shape[-1]
        common = dict(
            kernel_initializer="glorot_uniform",
            bias_initializer=keras.initializers.RandomNormal(stddev=MLP_BIAS_STDDEV),
        )
        self.dense_0 = keras.layers.Dense(self.mlp_dim, name="Dense_0",
                                          dtype=self.sublayer_policy("Dense_0"), **common)
        self.dense_0.build(input_shape)
        self.dense_1 = keras.layers.Dense(width, name="Dense_1",
                                          dtype=self.sublayer_policy("Dense_1"), **common)
        self.dense_1.build((*input_shape[:-1], self.mlp_dim))
        self.dropout = keras.layers.Dropout(self.dropout_rate, dtype=self.dtype_policy)

    def call(self, inputs, training=None):
        # inputs = [B, N, D]: the same function of each token (`per_token` picks the layout).
        return per_token(lambda x: self.mlp(x, training), inputs, training, self.kernels)

    def mlp(self, x, training=None):
        """The MLP of each token: `x = [..., D]` -> `[..., D]`."""
        x = self.dense_0(x)  # x = [..., mlp_dim]
        x = gelu(x, self.gelu_approximate, training, self.kernels)
        x = self.dropout(x, training=training)
        x = self.dense_1(x)  # x = [..., D]
        return self.dropout(x, training=training)

    def compute_output_shape(self, input_shape):
        return input_shape


@_register
class TransformerBlock(ConfigArgs, _ReturnsAttention, keras.layers.Layer):
    """One pre-LayerNorm encoder block (`Encoder1DBlock` in the official code).

        y = x + Dropout(MHA(LN(x)));  out = y + MLP(LN(y))

    Sublayers `LayerNorm_0`, `MultiHeadDotProductAttention_1`, `LayerNorm_2`, `MlpBlock_3`.

    Args:
        num_heads: int. Number of attention heads; must divide the input width.
        mlp_dim: int. Hidden width of the MLP.
        dropout_rate: float. Dropout after attention and in the MLP. Defaults to 0.
        attention_dropout_rate: float. Dropout on attention probabilities. Defaults to 0.
        layer_norm_epsilon: float. Defaults to 1e-6, as in the official code.
        gelu_approximate: bool. Tanh-approximate GELU if True (official), exact if False.
            Defaults to True.
        qkv_bias: bool. Whether query, key and value have biases. Defaults to True.
        relative_positions: int or None. The attention's relative position embeddings (see
            `MultiHeadDotProductAttention`). Defaults to None.
        num_prefix_tokens: int. Leading tokens that are not patches. Defaults to 0.
        kernels: dict or None. Implementation choices of `keras_vit.kernels`; those not named
            take their measured defaults. Defaults to None.
        **kwargs: standard `keras.layers.Layer` arguments.

    Input: `[B, N, D]`. Output: `[B, N, D]`, or with `return_attention_scores=True` the tuple
    `([B, N, D], [B, heads, N, N])`: the attention probabilities come from the same forward pass.

    Examples:
    >>> block = TransformerBlock(num_heads=2, mlp_dim=32)
    >>> y, probs = block(keras.ops.zeros((1, 5, 8)), return_attention_scores=True)
    >>> tuple(y.shape), tuple(probs.shape)
    ((1, 5, 8), (1, 2, 5, 5))
    """

    CONFIG_ARGS = (
        "num_heads", "mlp_dim", "dropout_rate", "attention_dropout_rate", "layer_norm_epsilon",
        "gelu_approximate", "qkv_bias", "relative_positions", "num_prefix_tokens", "kernels",
    )

    def __init__(
        self,
        num_heads,
        mlp_dim,
        dropout_rate=0.0,
        attention_dropout_rate=0.0,
        layer_norm_epsilon=LAYER_NORM_EPSILON,
        gelu_approximate=GELU_APPROXIMATE,
        qkv_bias=True,
        relative_positions=None,
        num_prefix_tokens=0,
        kernels=None,
        **kwargs,
    ):
        if "remat" in kwargs:
            _remat_moved(kwargs.pop("remat"))
        super().__init__(**kwargs)
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.mlp_dim = check_positive_int("mlp_dim", mlp_dim)
        self.dropout_rate = check_rate("dropout_rate", dropout_rate)
        self.attention_dropout_rate = check_rate("attention_dropout_rate", attention_dropout_rate)
        self.layer_norm_epsilon = check_positive_number("layer_norm_epsilon", layer_norm_epsilon)
        self.gelu_approximate = check_bool("gelu_approximate", gelu_approximate)
        self.qkv_bias = check_bool("qkv_bias", qkv_bias)
        self.relative_positions = check_positive_int("relative_positions", relative_positions,
                                                     allow_none=True)
        self.num_prefix_tokens = check_int("num_prefix_tokens", num_prefix_tokens, 0)
        self.kernels = check_kernels(kernels) or None

    def build(self, input_shape):
        check_rank("TransformerBlock", input_shape, ("batch", "length", "width"))
        check_heads(input_shape[-1], self.num_heads)
        norm = dict(epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy)
        self.norm_0 = keras.layers.LayerNormalization(name="LayerNorm_0", **norm)
        self.attention = MultiHeadDotProductAttention(
            self.num_heads,
            attention_dropout_rate=self.attention_dropout_rate,
            qkv_bias=self.qkv_bias,
            relative_positions=self.relative_positions,
            num_prefix_tokens=self.num_prefix_tokens,
            kernels=self.kernels,
            name="MultiHeadDotProductAttention_1",
            dtype=self.dtype_policy,
        )
        self.norm_2 = keras.layers.LayerNormalization(name="LayerNorm_2", **norm)
        self.mlp = MlpBlock(
            self.mlp_dim,
            dropout_rate=self.dropout_rate,
            gelu_approximate=self.gelu_approximate,
            kernels=self.kernels,
            name="MlpBlock_3",
            dtype=self.dtype_policy,
        )
        for layer in (self.norm_0, self.attention, self.norm_2, self.mlp):
            layer.build(input_shape)
        self.dropout = keras.layers.Dropout(self.dropout_rate, dtype=self.dtype_policy)

    def call(self, inputs, training=None, return_attention_scores=False):
        # inputs = [B, N, D]; the identity, which `block_input` may give a cheaper gradient
        # in training (keras_vit.kernels).
        inputs = block_input(inputs, training=training, kernels=self.kernels)
        x = layer_norm(self.norm_0, inputs, training, self.kernels)
        x, probs = self.attention(x, training=training, return_attention_scores=True)
        y = inputs + self.dropout(x, training=training)  # y = [B, N, D]
        x = layer_norm(self.norm_2, y, training, self.kernels)
        outputs = y + self.mlp(x, training=training)  # outputs = [B, N, D]
        return (outputs, probs) if return_attention_scores else outputs  # probs = [B, h, N, N]


def _remat_moved(remat):
    """0.2's `TransformerBlock(remat=...)`: accepted, for `.keras` files of 0.2."""
    warnings.warn("TransformerBlock(remat=...) is deprecated and ignored: recomputation is an "
                  "option of the encoder, keras_vit.ViT(remat=True) (keras_vit.Encoder). "
                  f"Received: remat={remat!r}", DeprecationWarning, stacklevel=3)


@_register
class TokenPooling(ConfigArgs, keras.layers.Layer):
    """Pools the encoder output to one vector per image.

    Args:
        classifier: str. "token": take the class token (position 0); "gap": mean over the
            patch tokens.
        num_prefix_tokens: int. Leading tokens that are not patches (the class token), left
            out of the "gap" mean. Defaults to 0.
        **kwargs: standard `keras.layers.Layer` arguments.

    Input: `[B, N, D]`. Output: `[B, D]`.
    """

    CONFIG_ARGS = ("classifier", "num_prefix_tokens")

    def __init__(self, classifier="token", num_prefix_tokens=0, **kwargs):
        super().__init__(**kwargs)
        check_choice("classifier", classifier, CLASSIFIERS)
        self.classifier = classifier
        self.num_prefix_tokens = check_int("num_prefix_tokens", num_prefix_tokens, 0)

    def call(self, inputs):
        # inputs = [B, N, D]
        if self.classifier == "token":
            return inputs[:, 0]  # [B, D]
        return ops.mean(inputs[:, self.num_prefix_tokens:], axis=1)  # [B, D]

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[2])
