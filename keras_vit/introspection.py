"""A keras_vit model's model with the attention probabilities (`attention_model`), and the
model built again in another layout or precision (`rebuilt`, `per_block`), for models of this
version and files of earlier ones (their arguments: `keras_vit.model_parts.vit_config`).
"""

from keras_vit.layer_config import sublayers
from keras_vit.model import ENCODER, ViT
from keras_vit.model_parts import base_policy, encoder_blocks, encoder_layer, vit_config


def attention_model(model):
    """`model.attention_model()` (see `keras_vit.ViT`): a model sharing `model`'s weights that
    returns `(outputs, [attention probabilities of every block])`. A model loaded from a file
    of keras_vit 0.3 or earlier is rebuilt as a `keras_vit.ViT` first (a copy of its weights).
    """
    return (model if isinstance(model, ViT) else rebuilt(model)).attention_model()


def per_block(model):
    """The per-block model of a model whose blocks live in an `Encoder` layer (`scan=True` or
    `remat=True`), with a copy of its weights.

    Its outputs equal the model's. A per-block model is returned as it is.

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
            `remat`).

    Returns:
        A `keras_vit.ViT`.
    """
    config = dict(vit_config(model), **overrides)
    twin = ViT(**config, dtype=dtype_policy or base_policy(model))
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


