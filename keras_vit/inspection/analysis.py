"""The arrays of the inspection: the model's geometry, its attention from one forward pass,
attention rollout and maps, mean attention distance, position-embedding similarity and the
patch-embedding filters' principal components (see `keras_vit.inspection`)."""

import collections

import keras
import numpy as np

from keras_vit.checks import check_bool, check_index, check_positive_int
from keras_vit.introspection import attention_model
from keras_vit.model_parts import vit_config
from keras_vit.model_parts import encoder_blocks
from keras_vit.positions import NoPositionEmbs, model_image_size, patch_grid
from keras_vit.preprocessing import check_preprocessed

NUM_COMPONENTS = 28  # Figure 7 left: "first 28 principal components"

Geometry = collections.namedtuple(
    "Geometry", "image_size grid patch_pixels num_prefix num_layers num_heads"
)
Geometry.__doc__ = """What the inspection needs to know about a model.

Attributes:
    image_size: (height, width) of the input in pixels.
    grid: (rows, cols) of patches.
    patch_pixels: (height, width) of one patch in input pixels (image size / grid).
    num_prefix: 1 if the sequence starts with a class token, else 0.
    num_layers: number of encoder blocks.
    num_heads: attention heads per block.
"""


# --------------------------------------------------------------------------------------------
# The model's geometry and its attention, from one forward pass.


def _blocks(model):
    blocks = encoder_blocks(model)
    if not blocks:
        raise ValueError(
            f"Model {model.name!r} has no encoder blocks named 'encoderblock_0', ...; expected "
            "a model built by keras_vit."
        )
    return blocks


def _embedding(model):
    names = {layer.name for layer in model.layers}
    if "embedding" not in names or not hasattr(model.get_layer("embedding"), "grid_size"):
        raise ValueError(
            f"Model {model.name!r} has no patch embedding layer 'embedding' with a `grid_size`; "
            "expected a model built by keras_vit."
        )
    return model.get_layer("embedding")


def geometry(model):
    """Returns the `Geometry` of a keras_vit model (input size, patch grid, class token, ...)."""
    blocks = _blocks(model)
    _embedding(model)  # a keras_vit model
    height, width = model_image_size(model)
    rows, cols = patch_grid(model)  # a model of any input size: at the size it was built for
    num_prefix = int("cls" in {layer.name for layer in model.layers})
    return Geometry(
        image_size=(height, width),
        grid=(rows, cols),
        patch_pixels=(height / rows, width / cols),
        num_prefix=num_prefix,
        num_layers=len(blocks),
        num_heads=blocks[0].num_heads,
    )


def attention_probe(model):
    """A `keras.Model` from the model's input to every block's attention probabilities.

    It shares the model's weights (`keras_vit.attention_model`), so one call runs one forward
    pass of the model and returns `[layers] x [B, heads, N, N]` (N counts the class token, if
    any).
    """
    _blocks(model)  # a keras_vit model
    full = attention_model(model)
    return keras.Model(full.input, full.outputs[1:], name=f"{model.name}_probe")


def _check_images(model, images):
    """`images` as float32 `[B, H, W, C]`, once they are real numbers preprocessed for
    `model` (`keras_vit.preprocessing.check_preprocessed`) at its input size."""
    raw = np.asarray(images)
    expected = (*model_image_size(model), model.input.shape[-1])
    if raw.ndim == 3:
        raw = raw[None]
    if raw.ndim != 4 or raw.shape[1:] != expected or not len(raw):
        raise ValueError(
            f"images must have shape [batch, {', '.join(map(str, expected))}] (the model's input "
            "size, preprocessed by keras_vit.preprocess_inputs(images, model)). Received shape "
            f"{raw.shape}."
        )
    check_preprocessed(raw, model, "The images")
    return raw.astype(np.float32)


def _batches(model, images, batch_size):
    """Yields each batch's attention `[layers, b, heads, N, N]`: one forward pass per batch."""
    batch_size = check_positive_int("batch_size", batch_size)
    images = _check_images(model, images)
    probe = attention_probe(model)
    for start in range(0, len(images), batch_size):
        outputs = probe.predict_on_batch(images[start:start + batch_size])
        if not isinstance(outputs, (list, tuple)):  # a one-block model has one output
            outputs = [outputs]
        yield np.stack([np.asarray(probs, np.float32) for probs in outputs])


def attention_weights(model, images, batch_size=32):
    """Every block's attention probabilities on `images`.

    Args:
        model: a keras_vit model.
        images: array `[B, H, W, 3]` (or one image `[H, W, 3]`) at the model's input size,
            preprocessed for it (`keras_vit.preprocess_inputs(images, model)`).
        batch_size: int. Images per forward pass. Defaults to 32.

    Returns:
        float32 array `[layers, B, heads, N, N]`: row q of `[l, b, h]` is the attention of
        query token q over all tokens (the class token first, if any; then the patches in
        row-major order).
    """
    return np.concatenate(list(_batches(model, images, batch_size)), axis=1)


# --------------------------------------------------------------------------------------------
# Attention maps: rollout and single layers.


def check_layer_head(geo, layer, head):
    """Returns (layer, head) as non-negative indices (head None stays None)."""
    layer = check_index("layer", layer, geo.num_layers, "encoder blocks")
    if head is not None:
        head = check_index("head", head, geo.num_heads, "attention heads")
    return layer, head


def _query(model, geo, query):
    """Resolves `query` to "class" or "mean"; None means the token the classifier reads (a
    "gap" model with a class token reads the mean of the patch tokens)."""
    if query is None:
        return "class" if vit_config(model)["classifier"] == "token" else "mean"
    if query not in ("class", "mean"):
        raise ValueError(f"query must be 'class', 'mean' or None. Received: {query!r}")
    if query == "class" and not geo.num_prefix:
        raise ValueError(
            "query='class' needs a class token, but this model has none (classifier='gap'). "
            "Use query='mean' (the mean token the 'gap' classifier reads) or None."
        )
    return query


def _from_query(matrices, geo, query):
    """Rows of `[..., N, N]` for the query token, over the patches: `[..., rows, cols]`. The
    mean token's row is the mean of the patch tokens' rows, as "gap" pools the patch tokens."""
    if query == "class":
        rows = matrices[..., 0, :]
    else:
        rows = matrices[..., geo.num_prefix:, :].mean(axis=-2)
    return rows[..., geo.num_prefix:].reshape(*rows.shape[:-1], *geo.grid)


def rollout(weights):
    """Attention rollout (Abnar & Zuidema, 2020) of attention weights `[layers, ..., N, N]`.

    Each layer's attention is averaged over heads, the identity is added for the residual
    connection and the rows are renormalised (`0.5 * A + 0.5 * I`); the layers are then
    multiplied from the first to the last.

    Args:
        weights: array `[layers, B, heads, N, N]` (`attention_weights`).

    Returns:
        float64 array `[B, N, N]`: row q says how much of the output token q comes from each
        input token.
    """
    weights = np.asarray(weights, np.float64)
    length = weights.shape[-1]
    identity = np.eye(length)
    result = np.broadcast_to(identity, weights.shape[1:2] + (length, length))
    for layer in weights:
        mixed = layer.mean(axis=1) + identity  # [B, N, N]
        mixed /= mixed.sum(axis=-1, keepdims=True)
        result = mixed @ result
    return result


def _layer_map(weights, geo, layer, head, query):
    probs = weights[layer]  # [B, heads, N, N]
    probs = probs.mean(axis=1) if head is None else probs[:, head]  # [B, N, N]
    return _from_query(probs, geo, query)


def patch_distances(geo):
    """Pixel distance between the centres of every two patches: `[P, P]`, row-major patches."""
    rows, cols = np.meshgrid(np.arange(geo.grid[0]), np.arange(geo.grid[1]), indexing="ij")
    centres = np.stack([rows.ravel() * geo.patch_pixels[0], cols.ravel() * geo.patch_pixels[1]], 1)
    return np.linalg.norm(centres[:, None] - centres[None], axis=-1)


def _distances(weights, geo, distances):
    """Per image, layer and head: the mean over patch queries of the attention-weighted
    distance to the patches, the class token left out: `[B, layers, heads]`."""
    patches = weights[..., geo.num_prefix:, geo.num_prefix:].astype(np.float64)
    mass = patches.sum(axis=-1, keepdims=True)
    patches /= np.maximum(mass, np.finfo(np.float64).tiny)  # [layers, B, heads, P, P]
    per_query = (patches * distances).sum(axis=-1)  # [layers, B, heads, P]
    return per_query.mean(axis=-1).transpose(1, 0, 2)


def _analyse(model, images, layer=-1, head=None, query=None, batch_size=32):
    """Everything the attention figures need, from one forward pass per batch of images.

    Returns:
        (geometry, dict): `rollout` and `attention` maps `[B, rows, cols]` (see
        `attention_rollout` and `attention_map`), `distance` `[B, layers, heads]`.
    """
    geo = geometry(model)
    query = _query(model, geo, query)
    layer, head = check_layer_head(geo, layer, head)  # before the forward pass
    distances = patch_distances(geo)
    parts = collections.defaultdict(list)
    for weights in _batches(model, images, batch_size):  # [layers, b, heads, N, N]
        parts["rollout"].append(_from_query(rollout(weights), geo, query))
        parts["attention"].append(_layer_map(weights, geo, layer, head, query))
        parts["distance"].append(_distances(weights, geo, distances))
    return geo, {name: np.concatenate(arrays) for name, arrays in parts.items()}


def attention_rollout(model, images, query=None, batch_size=32):
    """Attention rollout from the class token (or the mean token) to the patches.

    Args:
        model: a keras_vit model.
        images: array `[B, H, W, 3]` at the model's input size, preprocessed for it
            (`keras_vit.preprocess_inputs(images, model)`).
        query: "class" (the class token), "mean" (the mean of the patch tokens, what a "gap"
            model classifies) or None (the token the model's classifier reads). Defaults to
            None.
        batch_size: int. Images per forward pass. Defaults to 32.

    Returns:
        float64 array `[B, rows, cols]` over the patch grid. For the class token the weights
        sum to 1 minus what the class token keeps from its own input.

    Raises:
        ValueError: for query="class" on a model without a class token, or images of the
            wrong shape.
    """
    return _analyse(model, images, query=query, batch_size=batch_size)[1]["rollout"]


def attention_map(model, images, layer=-1, head=None, query=None, batch_size=32):
    """One layer's attention from the class token (or the mean token) to the patches.

    Args:
        model: a keras_vit model.
        images: array `[B, H, W, 3]` at the model's input size, preprocessed for it
            (`keras_vit.preprocess_inputs(images, model)`).
        layer: int. Encoder block, from 0 (negative counts from the end). Defaults to -1.
        head: int or None. Attention head, from 0; None averages the heads. Defaults to None.
        query: "class", "mean" or None, as in `attention_rollout`. Defaults to None.
        batch_size: int. Images per forward pass. Defaults to 32.

    Returns:
        float32 array `[B, rows, cols]`: the attention probabilities on the patches.

    Raises:
        ValueError: for a layer or head out of range, or query="class" without a class token.
    """
    return _analyse(model, images, layer, head, query, batch_size)[1]["attention"]


def mean_attention_distance(model, images, batch_size=32):
    """The paper's mean attention distance for every layer and head, averaged over images.

    For each patch query, the attention-weighted mean pixel distance between its centre and
    the centres of the attended patches. The class token has no place in the image: it is
    left out as a query, and the weights a query puts on it are left out too (the patch
    weights are renormalised to sum to 1). The distances are averaged over the queries and
    then over the images. Uniform attention therefore gives the mean distance between two
    patches of the grid.

    Args:
        model: a keras_vit model.
        images: array `[B, H, W, 3]` at the model's input size, preprocessed for it
            (`keras_vit.preprocess_inputs(images, model)`).
        batch_size: int. Images per forward pass. Defaults to 32.

    Returns:
        float64 array `[layers, heads]`, in input pixels.
    """
    return _analyse(model, images, batch_size=batch_size)[1]["distance"].mean(axis=0)


def upsample(maps, size):
    """Bilinear upsampling of patch-grid maps `[B, rows, cols]` to `size` (height, width)."""
    maps = np.asarray(maps, np.float32)[..., None]
    resized = keras.ops.image.resize(maps, tuple(size), interpolation="bilinear")
    return keras.ops.convert_to_numpy(resized)[..., 0]


# --------------------------------------------------------------------------------------------
# Position embeddings (Figure 7 centre) and patch-embedding filters (Figure 7 left).


def _weight(variable):
    return np.asarray(keras.ops.convert_to_numpy(variable), np.float64)


def has_position_embeddings(model):
    """Whether the model adds an embedding per position to the tokens (not for
    `position_embedding` "none" or "relative")."""
    return not isinstance(model.get_layer("posembed_input"), NoPositionEmbs)


def position_embedding_similarity(model):
    """Cosine similarity between the position embeddings of every two patches.

    The embedding each patch gets, whatever the model's `position_embedding`: the learned
    vectors, the concatenated row and column vectors ("learned_2d"), or the computed
    sine-cosine ones ("sincos_2d"); at `image_size` for a model of any input size.

    Returns:
        float64 array `[rows, cols, rows, cols]`: `[r, c]` is the tile of patch (r, c), its
        similarity with every patch laid out by row and column. The class-token position,
        if any, is left out.

    Raises:
        ValueError: for a model built with `position_embedding="none"` or `"relative"`: it
            has no embedding per position.
    """
    if vit_config(model)["position_embedding"] == "relative":
        raise ValueError(
            "The model's position information is relative (position_embedding='relative'): "
            "its attention learns an embedding per offset between patches, not one per "
            "position, so there is no position embedding to compare. Expected a model built "
            "with position_embedding 'learned', 'learned_2d' or 'sincos_2d'.")
    geo = geometry(model)
    embedding = model.get_layer("posembed_input").embedding(*geo.grid)  # [1, prefix + P, D]
    posemb = _weight(embedding)[0, geo.num_prefix:]
    norms = np.linalg.norm(posemb, axis=-1, keepdims=True)
    unit = posemb / np.maximum(norms, np.finfo(np.float64).tiny)
    similarity = unit @ unit.T  # [P, P]
    return similarity.reshape(*geo.grid, *geo.grid)


def patch_embedding_components(model, num_components=NUM_COMPONENTS, gray=False):
    """The top principal components of the patch-embedding filters, as RGB patches.

    Each of the D filters (the kernel's last axis) is one sample of ph*pw*3 values; the
    samples are centred and decomposed with an SVD, as `sklearn.decomposition.PCA` does. The
    sign of each component is fixed so that its largest-magnitude value is positive.

    Args:
        model: a keras_vit model with an RGB patch embedding.
        num_components: int. Defaults to 28, as in Figure 7.
        gray: bool. For models trained on grey images (R = G = B): a grey pixel meets the
            sum of a filter's three colour planes, so the filters are summed over the colour
            axis first (their colour differences never saw a gradient and stay at their
            random initial values). Defaults to False.

    Returns:
        (components, explained_variance_ratio): float64 arrays `[k, ph, pw, 3]` (`[k, ph, pw,
        1]` if `gray`; unit norm each) and `[k]`.
    """
    kernel = _weight(_embedding(model).kernel)  # [ph, pw, C, D]
    if kernel.ndim != 4 or kernel.shape[2] != 3:
        raise ValueError(
            "Patch-embedding filters are drawn as RGB patches, which needs a kernel "
            f"[patch_h, patch_w, 3, D]. Received a kernel of shape {kernel.shape}."
        )
    if check_bool("gray", gray):
        kernel = kernel.sum(axis=2, keepdims=True)  # [ph, pw, 1, D]
    filters = kernel.reshape(-1, kernel.shape[-1]).T  # [D, ph*pw*C]
    limit = min(filters.shape)
    if isinstance(num_components, bool) or not isinstance(num_components, int) or not (
        0 < num_components <= limit
    ):
        raise ValueError(
            f"num_components must be an integer from 1 to {limit} (the filters are "
            f"{filters.shape[0]} samples of {filters.shape[1]} values). "
            f"Received: {num_components!r}"
        )
    centred = filters - filters.mean(axis=0)
    _, singular, vt = np.linalg.svd(centred, full_matrices=False)
    vt = vt[:num_components]
    signs = np.sign(vt[np.arange(num_components), np.abs(vt).argmax(axis=1)])
    components = (vt * signs[:, None]).reshape(num_components, *kernel.shape[:3])
    variance = singular**2
    return components, variance[:num_components] / variance.sum()


