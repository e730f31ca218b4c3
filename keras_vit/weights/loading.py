"""Loading a checkpoint's arrays into a model: all or nothing.

Every model variable must come from the file and every file array must be used, except `head`
and `pre_logits`, which load only where model and file agree (fine-tuning replaces them). Every
array is checked (shape, a real floating-point dtype, finite values) before any variable is
assigned, and one `CheckpointError` lists every problem; on any error the model is untouched.
A file's arrays may come as `keras_vit.weights.npz.Deferred`s, read (again) from the file
they were verified in as they are assigned (`NpzCheckpoint.verified`, the safetensors reader):
only a read that fails there (a failing disk, a file cut short in place) leaves a model
part-loaded, and its error says so. A new model, which no one holds until its loading returns
(`load_params(..., new_model=True)`), takes unverified arrays instead, each checked as it is
read and assigned: a refusal then comes part-way, and the model is dropped.
"""

import functools

import keras
import ml_dtypes
import numpy as np

from keras_vit.checks import to_pair
from keras_vit.positions import model_image_size, patch_grid, position_resize
from keras_vit.weights.errors import CheckpointError
from keras_vit.weights.keymap import checkpoint_variables, is_quantized
from keras_vit.weights.npz import Deferred, count_nonfinite, placeholder
from keras_vit.weights.layouts import (
    POSEMB_2D_KEYS,
    POSEMB_KEY,
    RELATIVE_SUFFIX,
    canonicalize,
    describe,
    resize_pos_embedding,
    resize_pos_table,
)

# Layers that load only where model and file agree. The head follows pre_logits: a head is only
# meaningful on the features it was trained on.
OPTIONAL_LAYERS = ("pre_logits", "head")
# Some hybrid files store GroupNorm parameters as (1, 1, 1, C).
GROUP_NORM_SUFFIXES = ("/scale", "/bias")
MAX_LISTED = 20  # keys listed per kind of problem in an error message


def _split_optional(variables, params):
    """Removes `head` / `pre_logits` where model and file disagree.

    Returns:
        (variables, params, skipped file keys, fresh model layers).
    """
    skipped, fresh = [], []
    features_differ = False  # whether pre_logits is in one of model and file only
    for layer in OPTIONAL_LAYERS:
        model_keys = sorted(k for k in variables if k.split("/")[0] == layer)
        file_keys = sorted(k for k in params if k.split("/")[0] == layer)
        fits = model_keys == file_keys and all(
            np.shape(params[k]) == tuple(variables[k].shape) for k in model_keys)
        if model_keys and fits and not features_differ:
            continue
        features_differ = bool(model_keys or file_keys)
        skipped += file_keys
        fresh += [layer] if model_keys else []
        variables = {k: v for k, v in variables.items() if k not in model_keys}
        params = {k: v for k, v in params.items() if k not in file_keys}
    return variables, params, skipped, fresh


def _adaptation(key, file_shape, shape, regrid=False):
    """How the official code adapts a file array of `file_shape` to the model's `shape`: one of
    "group_norm", "posemb", "posemb_2d", "relative", or None (as it is). `regrid`: the file's
    patch grid is known to differ from the model's (a position embedding is resized even where
    the two grids have as many positions)."""
    if regrid and key == POSEMB_KEY and file_shape[::2] == shape[::2]:
        return "posemb"
    if file_shape == shape:
        return None
    if key.endswith(GROUP_NORM_SUFFIXES) and file_shape == (1, 1, 1, *shape):
        return "group_norm"
    if len(file_shape) == 3 and len(shape) == 3:
        if key == POSEMB_KEY and file_shape[-1] == shape[-1]:
            return "posemb"
        if key in POSEMB_2D_KEYS and file_shape[::2] == shape[::2]:
            return "posemb_2d"  # a row or column table of learned_2d
        if key.endswith(RELATIVE_SUFFIX) and file_shape[1:] == shape[1:]:
            return "relative"  # the offsets of another grid
    return None


def _adapted_shape(key, file_shape, shape):
    """The shape `_adapt` gives a file array of `file_shape` (the model's where it adapts)."""
    return shape if _adaptation(key, file_shape, shape) else file_shape


def _adapt(key, value, shape, model, has_cls, source_grid=None):
    """The file array in the model's shape where the official code adapts it (`source_grid`:
    the file's patch grid, where known: `_stated_grid`)."""
    kind = _adaptation(key, value.shape, shape, _regrid(model, source_grid))
    if kind == "group_norm":
        return value.reshape(shape)
    if kind == "posemb":
        return resize_pos_embedding(value, patch_grid(model), has_cls, position_resize(model),
                                    source_grid=source_grid)
    if kind == "posemb_2d":
        return resize_pos_table(value, shape[1])
    if kind == "relative":
        return resize_pos_table(value, shape[0], axis=0)
    return value


def as_numpy_float(value):
    """bfloat16 and the other ml_dtypes floats (safetensors files) as float32."""
    if value.dtype.name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        return value.astype(np.float32)
    return value


def _dtype_problem(key, value):
    dtype = as_numpy_float(placeholder((), value.dtype)).dtype
    if not np.issubdtype(dtype, np.floating):
        return f"{key}: dtype {value.dtype}, expected a floating-point array"
    return None


def _array_problem(key, value, dtype):
    """The problem of a file array (an array, or a `Deferred`, whose values are read to count
    them unless they were counted as its file was verified) for a variable of `dtype`, or
    None: a dtype that is not floating point, non-finite values, or values beyond the range of
    a narrower `dtype` (which would become infinite there)."""
    if problem := _dtype_problem(key, value):
        return problem
    file_dtype = as_numpy_float(placeholder((), value.dtype)).dtype
    narrows = ml_dtypes.finfo(file_dtype).max > ml_dtypes.finfo(dtype).max
    bad, values = getattr(value, "nonfinite", None), None
    if bad is None or narrows:
        values = as_numpy_float(np.asarray(value))
        bad = count_nonfinite(values)
    if bad:
        return f"{key}: {bad} non-finite values (NaN or infinity)"
    if narrows and (over := int(np.count_nonzero(np.abs(values) > ml_dtypes.finfo(dtype).max))):
        return f"{key}: {over} values beyond the range of the model's {dtype}"
    return None


def variable_dtype(variable):
    """The NumPy dtype of a Keras variable."""
    return np.dtype(keras.backend.standardize_dtype(variable.dtype))


def _value(key, value, shape, model, has_cls, source_grid=None):
    """The file array `value` as the model's variable of `shape` takes it."""
    return _adapt(key, as_numpy_float(np.asarray(value)), shape, model, has_cls, source_grid)


def _stated_grid(source_grid, posemb, has_cls):
    """`source_grid` where it holds as many positions as the file's position embedding,
    else None: a stated size the arrays do not have leaves them their square grid."""
    shape = np.shape(posemb) if posemb is not None else ()
    if source_grid is None or len(shape) != 3 or \
            source_grid[0] * source_grid[1] != shape[1] - has_cls:
        return None
    return tuple(source_grid)


def file_grid(model, file_size):
    """The patch grid of the checkpoint's own image size `file_size` (its configuration's) for
    `model`'s patches, or None where it is not a whole grid."""
    if file_size is None:
        return None
    file_size, size = to_pair("image_size", file_size), model_image_size(model)
    grid = patch_grid(model)
    scaled = [g * f / s for g, f, s in zip(grid, file_size, size)]
    return tuple(int(n) for n in scaled) if all(n == int(n) and n for n in scaled) else None


def _regrid(model, source_grid):
    """Whether the file's patch grid (where known) differs from the model's."""
    return source_grid is not None and tuple(source_grid) != tuple(patch_grid(model))


def _listed(keys):
    more = f", ... ({len(keys) - MAX_LISTED} more)" if len(keys) > MAX_LISTED else ""
    return ", ".join(keys[:MAX_LISTED]) + more


def match_params(model, params, source=None, check_values=True, checked_as_read=False,
                 source_grid=None):
    """Pairs every model variable with its checked file array.

    Keys and shapes are checked first, from the arrays' shapes alone: with
    `check_values=False` (arrays that are `keras_vit.weights.npz.placeholder`s, read from a
    file's headers) nothing else is, and no data is read. A `keras_vit.weights.npz.Deferred`
    that reaches the model as it is (or only reshaped) is checked by the counts its file's
    verification made (else read once to count them, or with `checked_as_read`, left to be
    checked as it is read) and read again only as it is assigned; every other array is checked
    as the model will take it (resized, converted) and kept.

    `source_grid`: the file's patch grid where its configuration says it (None: a position
    embedding of another length is taken as a square grid, as the official code does).

    Returns:
        (assignments, skipped, fresh): a list of (variable, a function of no arguments giving
        its array, None or a function giving the problem of that array or None: its check as
        it is read), the file keys skipped on purpose, and the names of the model layers left
        at their initial values.

    Raises:
        CheckpointError: listing every missing key, unexpected key, shape mismatch, and array
            of a wrong dtype or with non-finite values.
    """
    params, big_vision = canonicalize(params)
    variables = checkpoint_variables(model)
    if is_quantized(variables):
        raise CheckpointError(
            f"Model {model.name!r} is int8-quantized: a checkpoint's float weights do not load "
            "into its int8 kernels. Expected the float model: load the checkpoint into it, then "
            "call model.quantize('int8').")
    has_cls = "cls" in variables
    if big_vision and has_cls and POSEMB_KEY in params:
        # big_vision adds position embeddings to the patches only; a zero class-token
        # position makes our (cls + pos[0]) equal to its plain cls.
        posemb = params[POSEMB_KEY]
        shape = np.shape(posemb)
        if len(shape) == 3:
            params[POSEMB_KEY] = Deferred(
                (*shape[:1], shape[1] + 1, *shape[2:]), posemb.dtype,
                functools.partial(_padded, posemb), getattr(posemb, "nonfinite", None))
    source_grid = _stated_grid(source_grid, params.get(POSEMB_KEY), has_cls)
    description = describe(params)
    variables, params, skipped, fresh = _split_optional(variables, params)

    missing = [k for k in variables if k not in params]
    unexpected = [k for k in params if k not in variables]
    problems = []
    for key, variable in variables.items():
        if key in params:
            file_shape, shape = tuple(np.shape(params[key])), tuple(variable.shape)
            if _adapted_shape(key, file_shape, shape) != shape:
                problems.append(f"shape mismatch: {key}: file {file_shape}, model {shape}")
    assignments = []
    if not (missing or unexpected or problems):
        for key, variable in variables.items():
            value = params[key]
            if not check_values:
                if problem := _dtype_problem(key, value):
                    problems.append(problem)
                continue
            shape = tuple(variable.shape)
            if isinstance(value, Deferred) and _adaptation(
                    key, value.shape, shape, _regrid(model, source_grid)) in (None, "group_norm"):
                # Read again as it is assigned: its values reach the model as they are.
                # Reshaped at most, so that the array read has the file's values to check.
                dtype, as_read = variable_dtype(variable), None
                if checked_as_read and value.nonfinite is None:
                    problem = _dtype_problem(key, value)
                    as_read = functools.partial(_array_problem, key, dtype=dtype)
                else:
                    problem = _array_problem(key, value, dtype)
                read = functools.partial(_value, key, value, shape, model, has_cls)
            else:  # computed once, here, where a resize can still fail or overflow
                adapted = _value(key, value, shape, model, has_cls, source_grid)
                problem = _array_problem(key, adapted, variable_dtype(variable))
                read, as_read = functools.partial(np.asarray, adapted), None
            if problem:
                problems.append(problem)
            else:
                assignments.append((variable, read, as_read))
    if missing or unexpected or problems:
        raise CheckpointError(_does_not_fit(model, source, description, missing, unexpected,
                                            problems))
    return assignments, skipped, fresh


# The layers a masked-patch pre-training model adds to its ViT (`keras_vit.pretraining`).
PRETRAINING_LAYERS = ("masked_patches", "mpp_head")


def _does_not_fit(model, source, description, missing=(), unexpected=(), problems=()):
    """The message refusing a checkpoint: every missing and unexpected key, and the problems
    of its arrays (shape mismatches, dtypes, values)."""
    model_shapes = {k: np.empty(v.shape, np.uint8)
                    for k, v in checkpoint_variables(model).items()}
    where = f"{source} " if source else ""
    lines = [f"The checkpoint {where}({description}) does not fit model {model.name!r} "
             f"({describe(model_shapes)}):"]
    if missing:
        lines.append(f"  missing keys ({len(missing)}): {_listed(missing)}")
    if unexpected:
        lines.append(f"  unexpected keys ({len(unexpected)}): {_listed(unexpected)}")
        if any(key.split("/")[0] in PRETRAINING_LAYERS for key in unexpected):
            lines.append("  (a masked-patch pre-training model: its encoder, without them, is "
                         "the encoder.npz that training.fit writes beside it)")
    lines += [f"  {p}" for p in problems[:MAX_LISTED]]
    if len(problems) > MAX_LISTED:
        lines.append(f"  ... {len(problems) - MAX_LISTED} more arrays with problems")
    return "\n".join(lines)


def _padded(posemb):
    """big_vision's position embedding with a zero class-token position in front."""
    posemb = np.asarray(posemb)
    return np.concatenate([np.zeros_like(posemb[:, :1]), posemb], axis=1)


def load_params(model, params, source=None, new_model=False, assign=None, source_grid=None):
    """Assigns a checkpoint's arrays to the model's variables, all or nothing.

    With `new_model` (a model nothing else holds yet, which the caller drops where this
    raises), the arrays a file's verification did not check are checked as they are read and
    assigned, each read once; a refusal then comes part-way, after every array was read, and
    lists the problems of all of them (a read that fails, a damaged file, raises at once).

    Position embeddings are resized to the model's grid; a `head` or `pre_logits` the file
    cannot fill is reset to its initial values (zeros for the head). See `match_params`.

    Args:
        model: a `keras_vit` model.
        params: dict of arrays, in any layout `canonicalize` knows.
        source: str or None. The file's name, for error messages.
        new_model: bool. See above. Defaults to False.
        assign: callable or None. `assign(variable, value)` gives a variable its value
            (None: `variable.assign`); for a new model, `keras_vit.framework.FirstValues.assign`.
        source_grid: (rows, cols) or None. The file's patch grid, where its configuration says
            it (see `match_params`).

    Returns:
        A dict with `skipped` (file keys not loaded) and `fresh` (model layers left at their
        initial values).
    """
    assign = assign or (lambda variable, value: variable.assign(value))
    assignments, skipped, fresh = match_params(model, params, source,
                                               checked_as_read=new_model,
                                               source_grid=source_grid)
    refused = []
    for done, (variable, read, as_read) in enumerate(assignments):  # one array at a time
        try:
            value = read()
        except CheckpointError as e:
            if new_model:
                raise
            raise CheckpointError(f"{e} The model is part-loaded ({done} of {len(assignments)} "
                                  "weights assigned): load it again.") from None
        if as_read is not None and (problem := as_read(value)):
            refused.append(problem)
        elif not refused:
            assign(variable, value.astype(variable_dtype(variable), copy=False))
    if refused:
        raise CheckpointError(_does_not_fit(model, source, describe(canonicalize(params)[0]),
                                            problems=refused))
    for name in fresh:
        layer = model.get_layer(name)
        assign(layer.kernel, layer.kernel_initializer(layer.kernel.shape, layer.kernel.dtype))
        assign(layer.bias, layer.bias_initializer(layer.bias.shape, layer.bias.dtype))
    return {"skipped": skipped, "fresh": fresh}
