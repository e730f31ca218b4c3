"""The outputs of chosen encoder blocks as feature maps, for `keras_vit.ViT.forward_intermediates`
and `ViT.intermediates_model` (timm's `forward_intermediates` arguments): which blocks, and the
layer that turns a block's tokens into a map of its patch grid."""

import keras
import numpy as np

from keras_vit.checks import check_bool, check_choice

# The layouts of the patch features (timm's "NCHW", "NLC"; Keras' channels-last "NHWC").
OUTPUT_FORMATS = ("NHWC", "NCHW", "NLC")


def collect(parts, x, grid, args, options, base_grid):
    """Wires the blocks of `parts` (a ViT's layers by name) on the embedded tokens `x` (and
    the patch grid `grid` of a model of any size, else None) for `ViT.intermediates_model`:
    the outputs of the blocks `options["indices"]` (as `forward_intermediates` says), and the
    final tokens unless `options["intermediates_only"]`. `args`: the ViT's arguments;
    `base_grid`: the grid of its fixed input size."""
    taken = options["indices"]
    last = max(taken) if options["stop_early"] else None
    norm = parts.get("encoder_norm")  # a model with fc_norm has none before the pooling
    split = _TokenGrid(int(args["class_token"]), base_grid, options["output_fmt"],
                       name="token_grid", dtype=parts["embedding"].dtype_policy)
    features = []
    for i in range(args["num_layers"] if last is None else last + 1):
        x = parts[f"encoderblock_{i}"](x)
        if i in taken:
            y = norm(x) if options["norm"] and norm is not None else x
            patches, prefix = split(y, grid) if grid is not None else split(y)
            features.append((patches, prefix) if options["return_prefix_tokens"] else patches)
    if options["intermediates_only"]:
        return features
    return (norm(x) if norm is not None else x), features


@keras.saving.register_keras_serializable(package="keras_vit")
class _TokenGrid(keras.layers.Layer):
    """A block's tokens `[B, P + N, D]` -> `(patch features, prefix tokens [B, P, D])`: the N
    patch tokens as a map `[B, gh, gw, D]` ("NHWC"), `[B, D, gh, gw]` ("NCHW") or as they are
    ("NLC"); the grid is the patch grid `[B, gh, gw, D]` it is given, else `base_grid`."""

    def __init__(self, num_prefix_tokens, base_grid, output_fmt, **kwargs):
        super().__init__(**kwargs)
        self.num_prefix_tokens = num_prefix_tokens
        self.base_grid = tuple(base_grid)
        self.output_fmt = output_fmt

    def call(self, tokens, grid=None):
        prefix = tokens[:, :self.num_prefix_tokens]
        patches = tokens[:, self.num_prefix_tokens:]
        if self.output_fmt == "NLC":
            return patches, prefix
        rows, cols = self.base_grid
        if grid is not None:
            shape = keras.ops.shape(grid)
            rows, cols = shape[1], shape[2]
        patches = keras.ops.reshape(patches, (-1, rows, cols, tokens.shape[-1]))
        if self.output_fmt == "NCHW":
            patches = keras.ops.transpose(patches, (0, 3, 1, 2))
        return patches, prefix

    def compute_output_spec(self, tokens, grid=None):
        batch, length, width = tokens.shape
        prefix = self.num_prefix_tokens
        rows, cols = self.base_grid if grid is None else grid.shape[1:3]
        shape = {"NLC": (batch, None if length is None else length - prefix, width),
                 "NHWC": (batch, rows, cols, width), "NCHW": (batch, width, rows, cols)}
        return (keras.KerasTensor(shape[self.output_fmt], dtype=tokens.dtype),
                keras.KerasTensor((batch, prefix, width), dtype=tokens.dtype))

    def get_config(self):
        return dict(super().get_config(), num_prefix_tokens=self.num_prefix_tokens,
                    base_grid=list(self.base_grid), output_fmt=self.output_fmt)


def options(num_layers, indices=None, norm=False, output_fmt="NHWC", intermediates_only=False,
            return_prefix_tokens=False, stop_early=False):
    """`forward_intermediates`' arguments checked, `indices` as the sorted block numbers (as
    timm's `feature_take_indices`), or a ValueError naming the first bad one."""
    if indices is None:
        indices = num_layers
    if isinstance(indices, (int, np.integer)) and not isinstance(indices, bool):
        if not 0 < indices <= num_layers:
            raise ValueError(f"`indices` {indices} asks for the last {indices} blocks of "
                             f"{num_layers}. Expected 1 to {num_layers}, a list of block "
                             "indices, or None (every block).")
        taken = list(range(num_layers - int(indices), num_layers))
    elif isinstance(indices, (list, tuple)) and indices:
        taken = []
        for i in indices:
            if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or \
                    not -num_layers <= i < num_layers:
                raise ValueError(f"`indices` holds {i!r}, not the index of one of the "
                                 f"{num_layers} blocks. Expected integers from {-num_layers} "
                                 f"to {num_layers - 1}.")
            taken.append(int(i) % num_layers)
        taken = sorted(set(taken))
    else:
        raise ValueError("`indices` must be None, a positive int (the last n blocks) or a "
                         f"non-empty list of block indices. Received: indices={indices!r}")
    return dict(indices=taken, norm=check_bool("norm", norm),
                output_fmt=check_choice("output_fmt", output_fmt, OUTPUT_FORMATS),
                intermediates_only=check_bool("intermediates_only", intermediates_only),
                return_prefix_tokens=check_bool("return_prefix_tokens", return_prefix_tokens),
                stop_early=check_bool("stop_early", stop_early))
