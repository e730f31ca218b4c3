"""The Vision Transformer's building blocks as Keras 3 layers.

Every layer is written with `keras.ops` only, so it runs on every Keras backend.
Sublayers and weights carry the names of the official checkpoint format
(google-research/vision_transformer, `vit_jax/models_vit.py`), so that loading a
checkpoint is a plain key map (see `keras_vit.weights.keymap`).
"""

import math

import keras
from keras import ops

from keras_vit.validation import (
    check_bool,
    check_choice,
    check_heads,
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

_register = keras.saving.register_keras_serializable(package="keras_vit")
CLASSIFIERS = ("token", "gap")


class ConfigArgs:
    """`get_config()` = Keras' base config plus the constructor arguments named in
    `CONFIG_ARGS`, each kept on the layer under its own name: `from_config(get_config())`
    rebuilds the same layer."""

    CONFIG_ARGS = ()

    def get_config(self):
        config = {name: getattr(self, name) for name in self.CONFIG_ARGS}
        return dict(super().get_config(), **config)


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
        **kwargs: standard `keras.layers.Layer` arguments.

    Input: `[B, H, W, C]` with H and W divisible by the patch size.
    Output: `[B, (H / ph) * (W / pw), D]`.

    Example:
    >>> layer = PatchEmbedding(patch_size=16, hidden_size=64)
    >>> layer(keras.ops.zeros((2, 32, 48, 3))).shape
    (2, 6, 64)
    """

    CONFIG_ARGS = ("patch_size", "hidden_size")

    def __init__(self, patch_size, hidden_size, **kwargs):
        super().__init__(**kwargs)
        self.patch_size = to_pair("patch_size", patch_size)
        self.hidden_size = check_positive_int("hidden_size", hidden_size)

    def _grid(self, input_shape):
        check_rank("PatchEmbedding", input_shape, ("batch", "height", "width", "channels"))
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
        kernel = ops.cast(self.kernel, images.dtype)
        x = ops.conv(images, kernel, strides=self.patch_size, padding="valid")
        x = x + ops.cast(self.bias, x.dtype)  # x = [B, gh, gw, D]
        batch = ops.shape(x)[0]
        return ops.reshape(x, (batch, -1, self.hidden_size))  # x = [B, gh * gw, D]

    def compute_output_shape(self, input_shape):
        gh, gw = self._grid(input_shape)
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
class AddPositionEmbs(keras.layers.Layer):
    """Adds a learned position embedding (checkpoint key `pos_embedding`, shape (1, N, D)).

    N is the sequence length the layer is built with (patches plus the class token, if any).
    Initialised normal(stddev=0.02), as in the official code.

    Input and output: `[B, N, D]`.
    """

    def build(self, input_shape):
        if input_shape[1] is None:
            raise ValueError(
                "AddPositionEmbs needs a known sequence length; build the model with a fixed "
                f"image size. Received shape {tuple(input_shape)}"
            )
        self.pos_embedding = self.add_weight(
            shape=(1, input_shape[1], input_shape[2]),
            initializer=keras.initializers.RandomNormal(stddev=POSITION_EMBEDDING_STDDEV),
            name="pos_embedding",
        )

    def call(self, inputs):
        # inputs = [B, N, D], pos_embedding = [1, N, D]
        return inputs + ops.cast(self.pos_embedding, inputs.dtype)

    def compute_output_shape(self, input_shape):
        return input_shape


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

    Sublayers `query`, `key`, `value` (kernel (D, heads, head_dim), bias (heads, head_dim))
    and `out` (kernel (heads, head_dim, D), bias (D,)).

    Args:
        num_heads: int. Number of attention heads; must divide the input width D.
        attention_dropout_rate: float. Dropout on the attention probabilities. Defaults to 0.
        **kwargs: standard `keras.layers.Layer` arguments.

    Input: `[B, N, D]`. Output: `[B, N, D]`, or with `return_attention_scores=True` a tuple
    `([B, N, D], [B, heads, N, N])` whose second item holds the attention probabilities
    (before dropout).
    """

    CONFIG_ARGS = ("num_heads", "attention_dropout_rate")

    def __init__(self, num_heads, attention_dropout_rate=0.0, **kwargs):
        super().__init__(**kwargs)
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.attention_dropout_rate = check_rate("attention_dropout_rate", attention_dropout_rate)

    def build(self, input_shape):
        width = check_heads(input_shape[-1], self.num_heads)
        self.head_dim = width // self.num_heads
        init = _dense_general_glorot(width, width)
        common = dict(kernel_initializer=init, bias_initializer="zeros", dtype=self.dtype_policy)
        for name in ("query", "key", "value"):
            layer = keras.layers.EinsumDense(
                "bnd,dhk->bnhk",
                output_shape=(None, self.num_heads, self.head_dim),
                bias_axes="hk",
                name=name,
                **common,
            )
            layer.build(input_shape)
            setattr(self, name, layer)
        self.out = keras.layers.EinsumDense(
            "bnhk,hkd->bnd", output_shape=(None, width), bias_axes="d", name="out", **common
        )
        self.out.build((*input_shape[:-1], self.num_heads, self.head_dim))
        self.dropout = keras.layers.Dropout(self.attention_dropout_rate, dtype=self.dtype_policy)

    def probabilities(self, query, key):
        """Attention probabilities `[B, h, N, N]` of query and key `[B, N, h, k]`: the softmax,
        in float32 at least so that mixed precision does not overflow, of the scaled logits."""
        query = query * ops.cast(1.0 / math.sqrt(self.head_dim), query.dtype)
        logits = ops.einsum("bqhk,bshk->bhqs", query, key)  # logits = [B, h, N, N]
        return ops.cast(ops.softmax(ops.cast(logits, "float32"), axis=-1), query.dtype)

    def call(self, inputs, training=None, return_attention_scores=False):
        # inputs = [B, N, D]; query, key, value = [B, N, h, k]
        query, key, value = (layer(inputs) for layer in (self.query, self.key, self.value))
        if training:
            # The products one by one: dropout applies to the probabilities, and on a GPU this
            # trains faster than the fused kernel's backward (BENCHMARKS.md).
            probs = self.probabilities(query, key)
            dropped = self.dropout(probs, training=training)
            context = ops.einsum("bhqs,bshk->bqhk", dropped, value)  # context = [B, N, h, k]
        else:
            # Inference: softmax(q k^T / sqrt(k)) v in one op, fused where the backend has a
            # kernel (cuDNN flash attention on a GPU under JAX). The probabilities are computed
            # apart, for callers that ask for them; compiled graphs drop them when unread.
            context = ops.dot_product_attention(query, key, value,
                                                scale=1.0 / math.sqrt(self.head_dim))
            probs = self.probabilities(query, key) if return_attention_scores else None
        outputs = self.out(context)  # outputs = [B, N, D]
        return (outputs, probs) if return_attention_scores else outputs


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
            dtype=self.dtype_policy,
        )
        self.dense_0 = keras.layers.Dense(self.mlp_dim, name="Dense_0", **common)
        self.dense_0.build(input_shape)
        self.dense_1 = keras.layers.Dense(width, name="Dense_1", **common)
        self.dense_1.build((*input_shape[:-1], self.mlp_dim))
        self.dropout = keras.layers.Dropout(self.dropout_rate, dtype=self.dtype_policy)

    def call(self, inputs, training=None):
        # inputs = [B, N, D]
        x = self.dense_0(inputs)  # x = [B, N, mlp_dim]
        x = keras.activations.gelu(x, approximate=self.gelu_approximate)
        x = self.dropout(x, training=training)
        x = self.dense_1(x)  # x = [B, N, D]
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
        **kwargs: standard `keras.layers.Layer` arguments.

    Input: `[B, N, D]`. Output: `[B, N, D]`, or with `return_attention_scores=True` the tuple
    `([B, N, D], [B, heads, N, N])`: the attention probabilities come from the same forward pass.

    Example:
    >>> block = TransformerBlock(num_heads=2, mlp_dim=32)
    >>> y, probs = block(keras.ops.zeros((1, 5, 8)), return_attention_scores=True)
    >>> tuple(y.shape), tuple(probs.shape)
    ((1, 5, 8), (1, 2, 5, 5))
    """

    CONFIG_ARGS = (
        "num_heads", "mlp_dim", "dropout_rate",
        "attention_dropout_rate", "layer_norm_epsilon", "gelu_approximate",
    )

    def __init__(
        self,
        num_heads,
        mlp_dim,
        dropout_rate=0.0,
        attention_dropout_rate=0.0,
        layer_norm_epsilon=LAYER_NORM_EPSILON,
        gelu_approximate=GELU_APPROXIMATE,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.mlp_dim = check_positive_int("mlp_dim", mlp_dim)
        self.dropout_rate = check_rate("dropout_rate", dropout_rate)
        self.attention_dropout_rate = check_rate("attention_dropout_rate", attention_dropout_rate)
        self.layer_norm_epsilon = check_positive_number("layer_norm_epsilon", layer_norm_epsilon)
        self.gelu_approximate = check_bool("gelu_approximate", gelu_approximate)

    def build(self, input_shape):
        check_rank("TransformerBlock", input_shape, ("batch", "length", "width"))
        check_heads(input_shape[-1], self.num_heads)
        norm = dict(epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy)
        self.norm_0 = keras.layers.LayerNormalization(name="LayerNorm_0", **norm)
        self.attention = MultiHeadDotProductAttention(
            self.num_heads,
            attention_dropout_rate=self.attention_dropout_rate,
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
        # inputs = [B, N, D]
        x = self.norm_0(inputs)
        x, probs = self.attention(x, training=training, return_attention_scores=True)
        x = self.dropout(x, training=training)
        x = x + inputs  # x = [B, N, D]
        y = self.mlp(self.norm_2(x), training=training)  # y = [B, N, D]
        outputs = x + y
        if return_attention_scores:
            return outputs, probs  # probs = [B, heads, N, N]
        return outputs



@_register
class TokenPooling(ConfigArgs, keras.layers.Layer):
    """Pools the encoder output to one vector per image.

    Args:
        classifier: str. "token": take the class token (position 0); "gap": mean over all
            tokens (the "gap" models have no class token).
        **kwargs: standard `keras.layers.Layer` arguments.

    Input: `[B, N, D]`. Output: `[B, D]`.
    """

    CONFIG_ARGS = ("classifier",)

    def __init__(self, classifier="token", **kwargs):
        super().__init__(**kwargs)
        check_choice("classifier", classifier, CLASSIFIERS)
        self.classifier = classifier

    def call(self, inputs):
        # inputs = [B, N, D]
        if self.classifier == "token":
            return inputs[:, 0]  # [B, D]
        return ops.mean(inputs, axis=1)  # [B, D]

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[2])


