"""Official `.npz` checkpoints: the key map between a model and the file, reading, writing.

The canonical layout is the one of google-research/vision_transformer (`vit_jax`):

    embedding/{kernel,bias}, cls, Transformer/posembed_input/pos_embedding,
    Transformer/encoderblock_{i}/{LayerNorm_0,MultiHeadDotProductAttention_1,LayerNorm_2,
    MlpBlock_3}/..., Transformer/encoder_norm/{scale,bias}, pre_logits/..., head/...

Other layouts found in the wild are rewritten to it by `canonicalize` (see its docstring).
"""

import io
import os
import re
import tempfile
import zipfile

import keras
import numpy as np

from keras_vit.layers import (
    AddPositionEmbs,
    ClassToken,
    PatchEmbedding,
    TransformerBlock,
)

POSEMB_KEY = "Transformer/posembed_input/pos_embedding"
GROUP_NORM_KEY = re.compile(r"(^|/)gn_?\w*/(scale|bias)$")
# Layers that load only where model and file agree (fine-tuning replaces them). The head
# follows pre_logits: a head is only meaningful on the features it was trained on.
OPTIONAL_LAYERS = ("pre_logits", "head")


class CheckpointError(ValueError):
    """A checkpoint that does not fit the model, or a file that is not a checkpoint."""


def _norm_vars(layer):
    return {"scale": layer.gamma, "bias": layer.beta}


def _dense_vars(layer):
    return {"kernel": layer.kernel, "bias": layer.bias}


def _block_vars(block):
    out = {}
    for sub, layer in (("LayerNorm_0", block.norm_0), ("LayerNorm_2", block.norm_2)):
        out.update({f"{sub}/{k}": v for k, v in _norm_vars(layer).items()})
    attention = block.attention
    for proj in ("query", "key", "value", "out"):
        dense = getattr(attention, proj)
        for k, v in _dense_vars(dense).items():
            out[f"MultiHeadDotProductAttention_1/{proj}/{k}"] = v
    for sub, dense in (("Dense_0", block.mlp.dense_0), ("Dense_1", block.mlp.dense_1)):
        out.update({f"MlpBlock_3/{sub}/{k}": v for k, v in _dense_vars(dense).items()})
    return out


def checkpoint_variables(model):
    """Maps each canonical checkpoint key to the model's variable, in file order.

    Args:
        model: a model built by `keras_vit` (or any functional model using its layers with
            the official names).

    Returns:
        dict[str, keras.Variable].
    """
    out = {}
    for layer in model.layers:
        if not layer.weights:
            continue
        if isinstance(layer, PatchEmbedding):
            out.update({"embedding/kernel": layer.kernel, "embedding/bias": layer.bias})
        elif isinstance(layer, ClassToken):
            out["cls"] = layer.cls
        elif isinstance(layer, AddPositionEmbs):
            out[POSEMB_KEY] = layer.pos_embedding
        elif isinstance(layer, TransformerBlock):
            prefix = f"Transformer/{layer.name}/"
            out.update({prefix + k: v for k, v in _block_vars(layer).items()})
        elif isinstance(layer, keras.layers.LayerNormalization) and layer.name == "encoder_norm":
            out.update({f"Transformer/encoder_norm/{k}": v for k, v in _norm_vars(layer).items()})
        elif isinstance(layer, keras.layers.Dense) and layer.name in ("pre_logits", "head"):
            out.update({f"{layer.name}/{k}": v for k, v in _dense_vars(layer).items()})
        elif hasattr(layer, "checkpoint_variables"):
            out.update(layer.checkpoint_variables())
        else:
            raise CheckpointError(
                f"Layer {layer.name!r} ({type(layer).__name__}) has weights but no place in the "
                "official checkpoint layout."
            )
    return out


def model_params(model):
    """The model's weights as a dict of NumPy arrays in the canonical checkpoint layout."""
    return {k: keras.ops.convert_to_numpy(v) for k, v in checkpoint_variables(model).items()}


# --------------------------------------------------------------------------------------------
# Reading and writing files.


def read_npz(path):
    """Reads a checkpoint `.npz` into a dict of arrays, never unpickling anything.

    Raises:
        CheckpointError: if the file is not an npz archive, holds pickled objects, or is
            corrupted (a member fails its CRC check).
    """
    path = os.fspath(path)
    if not zipfile.is_zipfile(path):
        raise CheckpointError(
            f"{path} is not an .npz checkpoint (not a zip archive). Expected a file saved with "
            "numpy.savez, such as the official ViT checkpoints."
        )
    try:
        with np.load(path, allow_pickle=False) as npz:
            return {key: npz[key] for key in npz.files}
    except ValueError as e:  # numpy refuses object arrays without allow_pickle.
        raise CheckpointError(
            f"{path} holds pickled Python objects ({e}); checkpoints are loaded with "
            "allow_pickle=False for safety. Expected plain numeric arrays."
        ) from e
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        raise CheckpointError(f"{path} is corrupted or truncated: {e}") from e


def current_umask():
    """The process umask, read without changing it where the OS allows.

    Linux reports it in /proc/self/status; elsewhere it is read by setting and restoring it,
    which another thread creating a file at that instant could observe.
    """
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    umask = os.umask(0o077)  # the restrictive value, should another thread see it
    os.umask(umask)
    return umask


def chmod_as_umask(path, mode):
    """`chmod(path, mode & ~umask)`: the permissions `open`/`mkdir` would have given."""
    os.chmod(path, mode & ~current_umask())


def atomic_write(path, write):
    """Calls `write(file)` on a temporary file beside `path`, then renames it into place.

    A failure leaves any existing file at `path` untouched and no partial file behind.
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=os.path.basename(path))
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        chmod_as_umask(tmp, 0o666)  # as a plain open() would (mkstemp makes it 0600)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def save_npz(model_or_params, path):
    """Writes a model (or a params dict) as an `.npz` in the official layout, atomically."""
    params = model_or_params
    if not isinstance(params, dict):
        params = model_params(params)
    buffer = io.BytesIO()
    np.savez(buffer, **params)
    atomic_write(path, lambda f: f.write(buffer.getvalue()))


# --------------------------------------------------------------------------------------------
# Layouts.

_BIG_VISION_BLOCK = {
    "MultiHeadDotProductAttention_0": "MultiHeadDotProductAttention_1",
    "LayerNorm_1": "LayerNorm_2",
    "MlpBlock_0": "MlpBlock_3",
}


def canonicalize(params):
    """Rewrites known checkpoint layouts to the canonical `vit_jax` one.

    Handled: the `opt/target/` prefix (Flax optimizer state files); big_vision files (`params/`
    prefix, top-level `pos_embedding` of the patches only, blocks numbered
    `MultiHeadDotProductAttention_0` / `LayerNorm_1` / `MlpBlock_0`); scanned files
    (`Transformer/encoderblock/...` with a leading layer axis).

    Returns:
        (params, big_vision): the canonical dict, and whether the file was in the big_vision
        layout (whose position embedding does not cover the class token).
    """
    out = {}
    big_vision = False
    for key, value in params.items():
        for prefix in ("opt/target/", "params/"):
            if key.startswith(prefix):
                key = key[len(prefix) :]
                big_vision = big_vision or prefix == "params/"
        if key == "pos_embedding":
            key, big_vision = POSEMB_KEY, True
        parts = key.split("/")
        if len(parts) > 2 and parts[0] == "Transformer" and parts[1].startswith("encoderblock"):
            if parts[2] in _BIG_VISION_BLOCK:
                parts[2] = _BIG_VISION_BLOCK[parts[2]]
                big_vision = True
            if parts[1] == "encoderblock":  # scanned: one array with a leading layer axis
                for i, layer_value in enumerate(value):
                    out["/".join(["Transformer", f"encoderblock_{i}", *parts[2:]])] = layer_value
                continue
        out["/".join(parts)] = value
    return out, big_vision


def resize_pos_embedding(posemb, grid, has_class_token):
    """Resizes a position embedding to a new patch grid as the official code does.

    The patch part is treated as a square 2D grid and resized with linear interpolation
    (`scipy.ndimage.zoom(order=1)` semantics: the corner positions map onto each other); the
    class-token position is kept as is.

    Args:
        posemb: array (1, N[+1], D).
        grid: (rows, cols) of the target patch grid.
        has_class_token: bool. Whether position 0 belongs to the class token.

    Returns:
        Array (1, rows*cols[+1], D).
    """
    token, patches = (posemb[:, :1], posemb[0, 1:]) if has_class_token else (None, posemb[0])
    old = int(round(np.sqrt(len(patches))))
    if old * old != len(patches):
        raise CheckpointError(
            f"Cannot resize a position embedding of {len(patches)} patch positions: "
            "expected a square grid."
        )
    patches = patches.reshape(old, old, -1).astype(np.float64)
    for axis, new in enumerate(grid):
        patches = _linear_resize(patches, new, axis)
    patches = patches.reshape(1, grid[0] * grid[1], -1).astype(posemb.dtype)
    return patches if token is None else np.concatenate([token, patches], axis=1)


def _linear_resize(x, new, axis):
    old = x.shape[axis]
    if new == old:
        return x
    # Output index o samples input coordinate o * (old - 1) / (new - 1) (scipy's zoom).
    coords = np.arange(new) * ((old - 1) / (new - 1) if new > 1 else 0.0)
    low = np.clip(np.floor(coords).astype(int), 0, old - 1)
    high = np.minimum(low + 1, old - 1)
    frac = (coords - low).reshape([-1 if a == axis else 1 for a in range(x.ndim)])
    return np.take(x, low, axis=axis) * (1 - frac) + np.take(x, high, axis=axis) * frac


# --------------------------------------------------------------------------------------------
# Loading.


def _has_class_token(model):
    return any(isinstance(layer, ClassToken) for layer in model.layers)


def _patch_grid(model):
    embedding = next(layer for layer in model.layers if isinstance(layer, PatchEmbedding))
    return embedding.grid_size


def _describe(params):
    """A short description of the architecture a params dict belongs to, for error messages."""
    kernel = params.get("embedding/kernel")
    blocks = {k.split("/")[1] for k in params if re.match(r"Transformer/encoderblock_\d+/", k)}
    if kernel is None or np.ndim(kernel) != 4:
        return f"{len(blocks)} encoder blocks"
    return (
        f"patch {kernel.shape[0]}x{kernel.shape[1]}, width {kernel.shape[-1]}, {len(blocks)} blocks"
    )


def match_params(model, params):
    """Pairs every model variable with its file array, adapting what the official code adapts.

    `head` and `pre_logits` are optional on both sides: they load only when the file has the
    same layer with the same shapes; otherwise the file's arrays are skipped and the model's
    layer stays fresh (zero head for fine-tuning). Everything else must match one to one;
    the position embedding is resized to the model's grid.

    Returns:
        (assignments, skipped, fresh): a list of (variable, array), the file keys skipped on
        purpose, and the names of the model layers left at their initial values.

    Raises:
        CheckpointError: listing every missing key, unexpected key and shape mismatch.
    """
    params, big_vision = canonicalize(params)
    variables = checkpoint_variables(model)
    has_cls = _has_class_token(model)
    if big_vision and has_cls and POSEMB_KEY in params:
        # big_vision adds position embeddings to the patches only; a zero class-token
        # position makes our (cls + pos[0]) equal to its plain cls.
        posemb = params[POSEMB_KEY]
        params[POSEMB_KEY] = np.concatenate([np.zeros_like(posemb[:, :1]), posemb], axis=1)
    description = _describe(params)

    skipped, fresh = [], []
    features_differ = False  # whether pre_logits is in one of model and file only
    for layer in OPTIONAL_LAYERS:
        model_keys = sorted(k for k in variables if k.split("/")[0] == layer)
        file_keys = sorted(k for k in params if k.split("/")[0] == layer)
        fits = model_keys == file_keys and all(
            np.shape(params[k]) == tuple(variables[k].shape) for k in model_keys
        )
        if model_keys and fits and not features_differ:
            continue
        features_differ = bool(model_keys or file_keys)
        skipped += file_keys
        fresh += [layer] if model_keys else []
        variables = {k: v for k, v in variables.items() if k not in model_keys}
        params = {k: v for k, v in params.items() if k not in file_keys}

    assignments, mismatched = [], []
    missing = [k for k in variables if k not in params]
    unexpected = [k for k in params if k not in variables]
    for key, variable in variables.items():
        if key not in params:
            continue
        value = np.asarray(params[key])
        shape = tuple(variable.shape)
        if GROUP_NORM_KEY.search(key) and value.shape == (1, 1, 1, *shape):
            value = value.reshape(shape)  # some hybrid files store GroupNorm as (1, 1, 1, C)
        if key == POSEMB_KEY and value.ndim == 3 and value.shape != shape:
            if value.shape[-1] == shape[-1]:
                value = resize_pos_embedding(value, _patch_grid(model), has_cls)
        if value.shape != shape:
            mismatched.append((key, value.shape, shape))
            continue
        assignments.append((variable, value))
    if missing or unexpected or mismatched:
        model_shapes = {
            k: np.empty(v.shape, np.uint8) for k, v in checkpoint_variables(model).items()
        }
        lines = [
            f"The checkpoint ({description}) does not fit model {model.name!r} "
            f"({_describe(model_shapes)}):"
        ]
        if missing:
            lines.append(f"  missing keys ({len(missing)}): {', '.join(missing)}")
        if unexpected:
            lines.append(f"  unexpected keys ({len(unexpected)}): {', '.join(unexpected)}")
        for key, file_shape, model_shape in mismatched:
            lines.append(f"  shape mismatch: {key}: file {file_shape}, model {model_shape}")
        raise CheckpointError("\n".join(lines))
    return assignments, skipped, fresh


def load_params(model, params):
    """Assigns a checkpoint's arrays to the model's variables, all or nothing.

    Every model variable must come from the file and every file array must be used, except
    `head` and `pre_logits`, which load only where model and file agree (see
    `match_params`); a model layer they do not fill is reset to its initial values (zeros for
    the head). Position embeddings are resized to the model's grid. On any error the model is
    left untouched.

    Args:
        model: a `keras_vit` model.
        params: dict of arrays, in any layout `canonicalize` knows.

    Returns:
        A dict with `skipped` (file keys not loaded) and `fresh` (model layers left at their
        initial values).
    """
    assignments, skipped, fresh = match_params(model, params)
    for variable, value in assignments:
        variable.assign(value.astype(keras.backend.standardize_dtype(variable.dtype), copy=False))
    for name in fresh:
        layer = model.get_layer(name)
        layer.kernel.assign(layer.kernel_initializer(layer.kernel.shape, layer.kernel.dtype))
        layer.bias.assign(layer.bias_initializer(layer.bias.shape, layer.bias.dtype))
    return {"skipped": skipped, "fresh": fresh}


def config_from_params(params, image_size=None):
    """Reads the `keras_vit.ViT` arguments off a checkpoint's array shapes.

    Everything is in the shapes: patch size and width (embedding kernel), depth (number of
    blocks), heads (query kernel), MLP width, class token, representation size, number of
    classes and resolution (position embedding, assumed a square grid unless `image_size`
    is given).
    """
    params, big_vision = canonicalize(params)
    try:
        kernel = params["embedding/kernel"]
        query = params["Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/kernel"]
        mlp = params["Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel"]
        posemb = params[POSEMB_KEY]
    except KeyError as e:
        raise CheckpointError(f"Not a ViT checkpoint: no {e.args[0]!r} array.") from None
    has_cls = "cls" in params
    patches = posemb.shape[1] - (has_cls and not big_vision)
    grid = int(round(np.sqrt(patches)))
    if image_size is None and grid * grid != patches:
        raise CheckpointError(
            f"The position embedding covers {patches} patches, not a square grid; pass the "
            "image size explicitly."
        )
    layers = {k.split("/")[1] for k in params if re.match(r"Transformer/encoderblock_\d+/", k)}
    head = params.get("head/kernel")
    representation = params.get("pre_logits/kernel")
    return dict(
        image_size=image_size or grid * kernel.shape[0],
        patch_size=(kernel.shape[0], kernel.shape[1]),
        hidden_size=kernel.shape[-1],
        num_layers=len(layers),
        num_heads=query.shape[1],
        mlp_dim=mlp.shape[1],
        num_classes=None if head is None else head.shape[-1],
        include_top=head is not None,
        classifier="token" if has_cls else "gap",
        representation_size=None if representation is None else representation.shape[-1],
    )
