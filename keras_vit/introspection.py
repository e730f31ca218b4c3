"""What a keras_vit model is made of, read off the model: its `keras_vit.ViT` arguments, its
encoder blocks in either layout, its patch grid and image size, the model with its attention
probabilities, and the model built again with other execution-independent options.
"""

from keras_vit.encoder import Encoder
from keras_vit.layer_config import sublayers
from keras_vit.model import ENCODER, ViT


def vit_config(model):
    """The `keras_vit.ViT` arguments that rebuild `model`.

    Args:
        model: a `keras_vit.ViT` (built by it or a named builder, or loaded from its `.keras`
            file), or a model loaded from a `.keras` file of keras_vit 0.3 or earlier.

    Returns:
        dict of `keras_vit.ViT` keyword arguments (JSON-serialisable).
    """
    if isinstance(model, ViT):
        return model.vit_arguments()
    from keras_vit import compat  # files of earlier versions only

    return compat.legacy_vit_config(model)


def base_policy(model):
    """The dtype policy `model`'s layers were made with (before any quantization)."""
    if isinstance(model, ViT):
        return model.base_policy
    return model.get_layer("embedding").dtype_policy


def attention_model(model):
    """`model.attention_model()` (see `keras_vit.ViT`): a model sharing `model`'s weights that
    returns `(outputs, [attention probabilities of every block])`. A model loaded from a file
    of keras_vit 0.3 or earlier is rebuilt as a `keras_vit.ViT` first (a copy of its weights).
    """
    return (model if isinstance(model, ViT) else rebuilt(model)).attention_model()


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
