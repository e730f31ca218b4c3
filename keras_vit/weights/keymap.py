"""The key map between a model's variables and the official checkpoint layout.

Every keras_vit layer and weight carries the name the official checkpoint uses, so a
variable's Keras path (`encoderblock_3/MlpBlock_3/Dense_0/kernel`) becomes its checkpoint key
(`Transformer/encoderblock_3/MlpBlock_3/Dense_0/kernel`) by a few renaming rules, applied in
order. Nothing else is written by hand: a new layer gets its key from its name.
"""

import re

import keras

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


def model_params(model):
    """The model's weights as a dict of NumPy arrays in the official checkpoint layout."""
    return {k: keras.ops.convert_to_numpy(v) for k, v in checkpoint_variables(model).items()}
