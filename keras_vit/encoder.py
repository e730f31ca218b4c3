"""The encoder as one layer, for its structure options: scanning the blocks, recomputing them.

A `keras_vit.ViT` holds its encoder blocks as top-level layers `encoderblock_{i}` of the
functional model, each returning its attention probabilities into the graph. With `scan=True`
or `remat=True` they live instead in one `Encoder` layer named `Transformer` (the name of the
official code's encoder module), so that its variables' paths are still the checkpoint keys
`Transformer/encoderblock_{i}/...` and loading, saving and conversion are unchanged.
"""

import keras

from keras_vit.checks import check_bool, check_positive_int
from keras_vit.layer_config import ConfigArgs
from keras_vit.layers import GELU_APPROXIMATE, LAYER_NORM_EPSILON, TransformerBlock, block_args
from keras_vit.routes import encoder, use_routes

_register = keras.saving.register_keras_serializable(package="keras_vit")


@_register
class Encoder(ConfigArgs, keras.layers.Layer):
    """`num_layers` `TransformerBlock`s `encoderblock_{i}` applied in turn.

    The arguments it shares with `TransformerBlock` (`dropout_rate`, `attention_dropout_rate`,
    `layer_norm_epsilon`, `gelu_approximate`, `qkv_bias`, `relative_positions`,
    `num_prefix_tokens`) go to every block.

    Args:
        num_layers: int. Number of blocks.
        num_heads: int. The blocks' attention heads.
        mlp_dim: int. The blocks' MLP width.
        scan: bool. Run one traced block over the blocks' stacked weights (big_vision's
            scanned layout: one block to trace and compile instead of `num_layers`), where the
            backend can (JAX; on TensorFlow the blocks run in turn). Dropout masks then come
            from block 0's seed generators, advanced from block to block. Defaults to False.
        remat: bool. In training, keep only each block's input for the backward pass and
            recompute the rest there (`keras.remat`), with the forward pass's dropout masks:
            the route `remat="blocks"` (`keras_vit.routes`), chosen for these blocks whatever
            the process chose. Defaults to False.
        **kwargs: standard `keras.layers.Layer` arguments.

    Input: `[B, N, D]`. Output: `[B, N, D]` (no attention probabilities: the per-block model,
    `keras_vit.per_block(model)`, has them).
    """

    BLOCK_ARGS = TransformerBlock.CONFIG_ARGS
    CONFIG_ARGS = ("num_layers", *BLOCK_ARGS, "scan", "remat")

    def __init__(self, num_layers, num_heads, mlp_dim, dropout_rate=0.0,
                 attention_dropout_rate=0.0, layer_norm_epsilon=LAYER_NORM_EPSILON,
                 gelu_approximate=GELU_APPROXIMATE, qkv_bias=True, relative_positions=None,
                 num_prefix_tokens=0, scan=False, remat=False, **kwargs):
        super().__init__(**kwargs)
        self.num_layers = check_positive_int("num_layers", num_layers)
        self.scan = check_bool("scan", scan)
        self.remat = check_bool("remat", remat)
        checked = block_args(num_heads, mlp_dim, dropout_rate, attention_dropout_rate,
                             layer_norm_epsilon, gelu_approximate, qkv_bias, relative_positions,
                             num_prefix_tokens)  # the blocks' rule, without building one
        for name in self.BLOCK_ARGS:
            setattr(self, name, checked[name])

    def build(self, input_shape):
        block_args = {name: getattr(self, name) for name in self.BLOCK_ARGS}
        self.blocks = [TransformerBlock(**block_args, name=f"encoderblock_{i}",
                                        dtype=self.dtype_policy)
                       for i in range(self.num_layers)]
        for block in self.blocks:
            block.build(input_shape)

    def call(self, inputs, training=None):
        # inputs = [B, N, D]; `scan=True` and `remat=True` choose their routes for the blocks.
        with use_routes(**{name: "blocks" for name in ("scan", "remat") if getattr(self, name)}):
            return encoder(self.blocks, inputs, training)  # [B, N, D]

    def compute_output_shape(self, input_shape):
        return input_shape
