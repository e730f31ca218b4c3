"""A keras_vit model of any version, read off its layers: its encoder blocks in either layout
(top-level `encoderblock_{i}` layers, or the blocks of one `Encoder` layer `Transformer`), and
the `keras_vit.ViT` arguments and dtype policy that rebuild it (`vit_config`, `base_policy`).
Its patch grid and image size are read in `keras_vit.positions`.

It also loads what earlier versions wrote. Before 0.4 a model was a plain functional
`keras.Model` (0.2: the class `ViTModel`), whose `.keras` file holds its layers and not the
`keras_vit.ViT` arguments: `legacy_vit_config` reads them back off the layers. The classes at
the end are the names 0.2 saved; they load such files and are not for new code. Layer configs
of 0.2 and 0.3 with arguments that are gone (`kernels`, `TransformerBlock(remat=)`) load
through each layer's `LEGACY_KEYS`.
"""

import inspect

import keras

from keras_vit.encoder import Encoder
from keras_vit.model import ENCODER, LAYOUT_ARGUMENTS, POSITION_EMBEDDINGS, RELATIVE, ViT
from keras_vit.positions import model_image_size, position_resize
from keras_vit.resnet import ResNet


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


# `keras_vit.ViT`'s arguments with their defaults: what a configuration that leaves one out means.
VIT_DEFAULTS = {name: parameter.default
                for name, parameter in inspect.signature(ViT).parameters.items()}


def vit_config(model):
    """The `keras_vit.ViT` arguments that rebuild `model`'s architecture; the preprocessing
    its weights expect is `model.data_config`
    (`keras_vit.ViT(**vit_config(model), data_config=model.data_config)`).

    Args:
        model: keras.Model. A `keras_vit.ViT` (built by it or a named builder, or loaded
            from its `.keras` file), or a model loaded from a `.keras` file of keras_vit 0.3
            or earlier.

    Returns:
        dict of `keras_vit.ViT` keyword arguments (JSON-serialisable).
    """
    if isinstance(model, ViT):
        return model.vit_arguments()
    return legacy_vit_config(model)


def base_policy(model):
    """The dtype policy `model`'s layers were made with (before any quantization)."""
    if isinstance(model, ViT):
        return model.base_policy
    return model.get_layer("embedding").dtype_policy


def fresh_head(model):
    """Whether the model's classification head is all zeros: keras_vit's initial head, into
    which no trained weights were loaded (it gives every class the same probability). Its
    kernel and bias are compared (an int8 head's scale is never zero)."""
    try:
        head = model.get_layer("head")
    except ValueError:
        return False
    return not any(keras.ops.convert_to_numpy(w).any() for w in (head.kernel, head.bias))


# ---------------------------------------------------------------------------------------------
# What earlier versions wrote.


_register = keras.saving.register_keras_serializable(package="keras_vit")


def legacy_vit_config(model):
    """The `keras_vit.ViT` arguments that rebuild `model`, a functional model loaded from a
    `.keras` file of keras_vit 0.3 or earlier (which did not save them), read off its layers.

    Args:
        model: a `keras.Model` loaded from such a file.

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
        position_embedding=_position_embedding(model.get_layer("posembed_input"), block),
        position_resize=position_resize(model),
        name=model.name,
    )
    config.update({name: True for name in LAYOUT_ARGUMENTS if encoder and getattr(encoder, name)})
    if "resnet" in names:
        stem = model.get_layer("resnet")
        config["resnet"] = dict(num_layers=list(stem.num_layers),
                                  width_factor=stem.width_factor,
                                  std_conv_epsilon=stem.std_conv_epsilon)
    return config


def _position_embedding(layer, block):
    """The `position_embedding` argument that builds `layer` (`posembed_input`) and `block`."""
    if block.relative_positions:
        return RELATIVE
    for variant, cls in POSITION_EMBEDDINGS.items():
        if type(layer) is cls:
            return variant
    raise ValueError(f"Layer {layer.name!r} ({type(layer).__name__}) is none of the position "
                     f"embeddings keras_vit.ViT builds ({', '.join(POSITION_EMBEDDINGS)}).")


@keras.saving.register_keras_serializable(package="keras_vit")
class ViTModel(keras.Model):
    """The model class of keras_vit 0.2, for its `.keras` files: it drops 0.2's
    `fuse_optimizer` from a saved compile config, so a reloaded model compiles as Keras
    documents."""

    def compile_from_config(self, config):
        super().compile_from_config({k: v for k, v in config.items() if k != "fuse_optimizer"})


@_register
class ScannedEncoder(Encoder):
    """0.2's name for `keras_vit.Encoder(scan=True)`, for its `.keras` files."""

    def __init__(self, *args, scan=True, **kwargs):
        super().__init__(*args, scan=scan, **kwargs)


@_register
class ResNetStem(ResNet):
    """0.2's name for `keras_vit.ResNet`, for its `.keras` files."""
