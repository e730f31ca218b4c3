"""The key map between a model's variables and the official checkpoint layout.

Every keras_vit layer and weight carries the name the official checkpoint uses, so a
variable's Keras path (`encoderblock_3/MlpBlock_3/Dense_0/kernel`) becomes its checkpoint key
(`Transformer/encoderblock_3/MlpBlock_3/Dense_0/kernel`) by a few renaming rules, applied in
order. Nothing else is written by hand: a new layer gets its key from its name.
"""

import re

import keras
import numpy as np

# (pattern, replacement) on the Keras variable path, in order.
RENAMING_RULES = (
    # The hybrid's ResNet stem has no prefix in the file, and numbers its units block{s}/unit{u}.
    (r"^resnet/", ""),
    (r"(^|/)block(\d+)_unit(\d+)/", r"\1block\2/unit\3/"),
    # Flax names the normalisation parameters scale and bias (Keras: gamma and beta).
    (r"/gamma$", "/scale"),
    (r"/beta$", "/bias"),
    # The class token is a bare array at the top of the file.
    (r"^cls/cls$", "cls"),
    # The encoder's layers live under Transformer/.
    (r"^(posembed_input|encoderblock_\d+|encoder_norm)/", r"Transformer/\1/"),
)
_COMPILED = tuple((re.compile(pattern), repl) for pattern, repl in RENAMING_RULES)
# An int8-quantized layer (`model.quantize("int8")`) holds `kernel` as int8 and, beside it,
# `kernel_scale`: Keras' AbsMax scale over the kernel's input axes, one value per output.
SCALE_SUFFIX = "_scale"
QUANTIZED_DTYPE = "int8"


def checkpoint_key(path):
    """The checkpoint key of a Keras variable path, by `RENAMING_RULES`."""
    for pattern, repl in _COMPILED:
        path = pattern.sub(repl, path)
    return path


def checkpoint_variables(model):
    """Maps each checkpoint key to the model's variable, in the model's order.

    Args:
        model: a model built by keras_vit (or any model whose layers carry the official names).

    Returns:
        dict[str, keras.Variable].
    """
    out = {}
    for variable in model.weights:
        key = checkpoint_key(variable.path)
        if key in out:
            raise ValueError(f"Two variables of model {model.name!r} map to the checkpoint key "
                             f"{key!r}. Expected unique layer names.")
        out[key] = variable
    return out


def is_quantized(keys):
    """Whether checkpoint keys (or a model's) hold int8 kernels' scales."""
    return any(key.endswith("/kernel" + SCALE_SUFFIX) for key in keys)


def _output_axes(scale, kernel):
    """An int8 kernel's scale without the leading axes of size 1 that an einsum layer gives it
    (its output's batch and sequence axes): the kernel's trailing, output axes."""
    while scale.ndim and scale.shape[0] == 1 and (
            scale.ndim > kernel.ndim or scale.shape != kernel.shape[kernel.ndim - scale.ndim:]):
        scale = scale.reshape(scale.shape[1:])
    return scale


def dequantized(params):
    """The arrays of an int8-quantized model as float32 weights: each int8 `<layer>/kernel`
    divided by its `<layer>/kernel_scale` (one value per output unit: over the kernel's
    trailing, output axes), as Keras' int8 layers compute with it. Other arrays are returned
    as they are.

    Raises:
        ValueError: naming the layer, for a scale that does not fit its kernel that way.
    """
    out = dict(params)
    for scale_key in [k for k in params if k.endswith("/kernel" + SCALE_SUFFIX)]:
        key = scale_key.removesuffix(SCALE_SUFFIX)
        kernel = np.asarray(out.get(key))
        scale = _output_axes(np.asarray(out.pop(scale_key)), kernel)
        if kernel.dtype != QUANTIZED_DTYPE or kernel.shape[kernel.ndim - scale.ndim:] \
                != scale.shape:
            raise ValueError(f"{key} ({kernel.dtype} {kernel.shape}) cannot be dequantized with "
                             f"the scale {scale.shape}: expected an int8 kernel whose trailing "
                             "axes are the scale's (Keras' int8 quantization).")
        out[key] = (kernel.astype(np.float32) / scale).astype(np.float32)
    return out


def model_params(model):
    """The model's weights as a dict of NumPy arrays in the official checkpoint layout; an
    int8-quantized model's as their dequantized float32 values (`dequantized`)."""
    return dequantized({k: keras.ops.convert_to_numpy(v)
                        for k, v in checkpoint_variables(model).items()})


def check_finite_weights(model_or_params, action, limit=5):
    """Raises ValueError, naming `action` (what would have been done, e.g. "Writing m.npz")
    and the first `limit` weights holding NaN or infinity, if any weight of the model (or
    dict of arrays) is not finite: no file keras_vit writes, and no answer it gives, comes
    from such weights. Integer (quantized) weights are finite by construction."""
    if isinstance(model_or_params, dict):
        items = model_or_params.items()
    else:
        items = ((variable.path, variable) for variable in model_or_params.weights)
    bad = []
    for name, value in items:
        array = np.asarray(keras.ops.convert_to_numpy(value))
        if np.issubdtype(array.dtype, np.inexact) and not np.isfinite(array).all():
            bad.append(f"{name} ({array.size - np.count_nonzero(np.isfinite(array))} values)")
    if bad:
        more = f" and {len(bad) - limit} more" if len(bad) > limit else ""
        raise ValueError(f"{action}: the model's weights hold NaN or infinity in "
                         f"{', '.join(bad[:limit])}{more}. Nothing was done. Expected finite "
                         "weights (a model whose training diverged, or a damaged checkpoint, "
                         "has none to give).")


def check_finite_outputs(model, outputs, action):
    """Raises ValueError, naming `action` and the cause, if the model's outputs hold NaN or
    infinity: its non-finite weights where it has any (`check_finite_weights`), else the
    overflow of its activations. No answer is given from such outputs."""
    outputs = np.asarray(outputs)
    if np.isfinite(outputs).all():
        return
    check_finite_weights(model, action)
    rows = int(np.count_nonzero(~np.isfinite(outputs.reshape(len(outputs), -1)).all(axis=1)))
    raise ValueError(f"{action}: the model gave NaN or infinity for {rows} of {len(outputs)} "
                     "images although its weights are finite (its activations overflowed). "
                     "Nothing was reported. Expected weights of a trained model and images "
                     "normalised by its data config.")
