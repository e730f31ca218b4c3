"""The Vision Transformer's building blocks as Keras 3 layers.

Every layer is written with `keras.ops` only, so it runs on every Keras backend.
Sublayers and weights carry the names of the official checkpoint format
(google-research/vision_transformer, `vit_jax/models_vit.py`), so that loading a
checkpoint is a plain key map (see `keras_vit.weights.keymap`). The position embeddings are
in `keras_vit.positions`; how each piece runs (its route) is decided in `keras_vit.routes`.
"""

import math

import keras
from keras import ops

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
from keras_vit.layer_config import ConfigArgs
from keras_vit.positions import POSITION_EMBEDDING_STDDEV, relative_attention_bias
from keras_vit.routes import (block_input, dot_product_attention, encoder_block, gelu_dense,
                              layer_norm, per_token)

# LayerNorm epsilon of the official Flax code (`nn.LayerNorm` default). Keras' default is 1e-3.
LAYER_NORM_EPSILON = 1e-6
# Flax `nn.gelu`, used to train the official checkpoints, is the tanh approximation.
GELU_APPROXIMATE = True
# MLP biases are initialised normal(stddev=1e-6) (`MlpBlock` in vit_jax).
MLP_BIAS_STDDEV = 1e-6

_register = keras.saving.register_keras_serializable(package="keras_vit")
CLASSIFIERS = ("token", "gap")


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
        channels = self.kernel.shape[2]
        if images.shape[-1] is not None and images.shape[-1] != channels:
            # Keras lets a side of 1 through the model's input check (as broadcastable).
            raise ValueError(f"PatchEmbedding takes images of {channels} channels. Received "
                             f"{images.shape[-1]} (images of shape {tuple(images.shape)}).")
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
class ClassToken(ConfigArgs, keras.layers.Layer):
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


def attention_args(num_heads, attention_dropout_rate=0.0, qkv_bias=True,
                   relative_positions=None, num_prefix_tokens=0):
    """The attention's arguments, checked: the one rule for `MultiHeadDotProductAttention`
    and the blocks that pass them on."""
    return dict(
        num_heads=check_positive_int("num_heads", num_heads),
        attention_dropout_rate=check_rate("attention_dropout_rate", attention_dropout_rate),
        qkv_bias=check_bool("qkv_bias", qkv_bias),
        relative_positions=check_positive_int("relative_positions", relative_positions,
                                              allow_none=True),
        num_prefix_tokens=check_int("num_prefix_tokens", num_prefix_tokens, 0),
    )


def block_args(num_heads, mlp_dim, dropout_rate=0.0, attention_dropout_rate=0.0,
               layer_norm_epsilon=LAYER_NORM_EPSILON, gelu_approximate=GELU_APPROXIMATE,
               qkv_bias=True, relative_positions=None, num_prefix_tokens=0):
    """`TransformerBlock`'s arguments, checked: the attention's (`attention_args`) and the
    MLP's, by arithmetic (no layer is built)."""
    return dict(
        attention_args(num_heads, attention_dropout_rate, qkv_bias, relative_positions,
                       num_prefix_tokens),
        mlp_dim=check_positive_int("mlp_dim", mlp_dim),
        dropout_rate=check_rate("dropout_rate", dropout_rate),
        layer_norm_epsilon=check_positive_number("layer_norm_epsilon", layer_norm_epsilon),
        gelu_approximate=check_bool("gelu_approximate", gelu_approximate),
    )


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
        **kwargs: standard `keras.layers.Layer` arguments.

    Input: `[B, N, D]`. Output: `[B, N, D]`, or with `return_attention_scores=True` a tuple
    `([B, N, D], [B, heads, N, N])` whose second item holds the attention probabilities
    (before dropout).
    """

    CONFIG_ARGS = ("num_heads", "attention_dropout_rate", "qkv_bias", "relative_positions",
                   "num_prefix_tokens")

    def __init__(self, num_heads, attention_dropout_rate=0.0, qkv_bias=True,
                 relative_positions=None, num_prefix_tokens=0, **kwargs):
        super().__init__(**kwargs)
        for name, value in attention_args(num_heads, attention_dropout_rate, qkv_bias,
                                          relative_positions, num_prefix_tokens).items():
            setattr(self, name, value)

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
        if not return_attention_scores:
            context = dot_product_attention(  # context = [B, N, h, k]
                query, key, value, bias=bias, dropout=self.dropout, training=training)
            return self.out(context)  # [B, N, D]
        context, probs = dot_product_attention(  # probs = [B, h, N, N]
            query, key, value, bias=bias, dropout=self.dropout, training=training,
            return_probabilities=True)
        return self.out(context), probs


@_register
class MlpBlock(ConfigArgs, keras.layers.Layer):
    """The Transformer's MLP: Dense(mlp_dim) -> GELU -> Dropout -> Dense(D) -> Dropout.

    Sublayers `Dense_0` and `Dense_1`, as in the checkpoint.

    Args:
        mlp_dim: int. Hidden width of the MLP.
        dropout_rate: float. Dropout after each Dense. Defaults to 0.
        gelu_approximate: bool. Tanh-approximate GELU (Flax `nn.gelu`, used to train the
            official checkpoints) if True, exact GELU if False. Defaults to True.
        **kwargs: standard `keras.layers.Layer` arguments.
    """

    CONFIG_ARGS = ("mlp_dim", "dropout_rate", "gelu_approximate")

    def __init__(self, mlp_dim, dropout_rate=0.0, gelu_approximate=GELU_APPROXIMATE, **kwargs):
        super().__init__(**kwargs)
        self.mlp_dim = check_positive_int("mlp_dim", mlp_dim)
        self.dropout_rate = check_rate("dropout_rate", dropout_rate)
        self.gelu_approximate = check_bool("gelu_approximate", gelu_approximate)

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
        return per_token(lambda x: self.mlp(x, training), inputs, training)

    def mlp(self, x, training=None):
        """The MLP of each token: `x = [..., D]` -> `[..., D]`."""
        x = self.dense_0(x)  # x = [..., mlp_dim]
        x = gelu_dense(self.dense_1, self.dropout, x, self.gelu_approximate, training)  # [..., D]
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
        "gelu_approximate", "qkv_bias", "relative_positions", "num_prefix_tokens",
    )
    # 0.3 saved the routes (`kernels`), 0.2 the recomputation flag (now `Encoder(remat=)`).
    LEGACY_KEYS = ("kernels", "remat")

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
        **kwargs,
    ):
        super().__init__(**kwargs)
        for name, value in block_args(num_heads, mlp_dim, dropout_rate, attention_dropout_rate,
                                      layer_norm_epsilon, gelu_approximate, qkv_bias,
                                      relative_positions, num_prefix_tokens).items():
            setattr(self, name, value)

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
            name="MultiHeadDotProductAttention_1",
            dtype=self.dtype_policy,
        )
        self.norm_2 = keras.layers.LayerNormalization(name="LayerNorm_2", **norm)
        self.mlp = MlpBlock(
            self.mlp_dim,
            dropout_rate=self.dropout_rate,
            gelu_approximate=self.gelu_approximate,
            name="MlpBlock_3",
            dtype=self.dtype_policy,
        )
        for layer in (self.norm_0, self.attention, self.norm_2, self.mlp):
            layer.build(input_shape)
        self.dropout = keras.layers.Dropout(self.dropout_rate, dtype=self.dtype_policy)

    def call(self, inputs, training=None, return_attention_scores=False):
        if return_attention_scores:
            return self._forward(inputs, training, return_attention_scores=True)
        # In training, recomputed in the backward pass where that is the chosen route.
        return encoder_block(self, lambda x: self._forward(x, training), inputs, training)

    def _forward(self, inputs, training, return_attention_scores=False):
        # inputs = [B, N, D]; the identity, which `block_input` may give a cheaper gradient
        # in training (keras_vit.routes).
        inputs = block_input(inputs, training=training)
        x = layer_norm(self.norm_0, inputs, training)
        x = self.attention(x, training=training, return_attention_scores=return_attention_scores)
        x, probs = x if return_attention_scores else (x, None)  # probs = [B, h, N, N]
        y = inputs + self.dropout(x, training=training)  # y = [B, N, D]
        x = layer_norm(self.norm_2, y, training)
        outputs = y + self.mlp(x, training=training)  # outputs = [B, N, D]
        return (outputs, probs) if return_attention_scores else outputs


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
