"""Where a keras_vit model's parts are: its encoder blocks in either layout (top-level
`encoderblock_{i}` layers, or the blocks of one `Encoder` layer `Transformer`), the patch grid
its position embedding is learned for and how it is resized, and the image size it is built
for. Read off the layers
by their checkpoint names, for models of every version."""

from keras_vit.encoder import Encoder
from keras_vit.model import ENCODER


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
