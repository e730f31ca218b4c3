"""Looking inside a trained ViT: the paper's Figure 7 and attention maps, as arrays and PNGs.

Paper section 4.5 and Figure 7 (Dosovitskiy et al., 2020), and attention rollout
(Abnar & Zuidema, 2020, "Quantifying Attention Flow in Transformers"):

- `attention_rollout` / `attention_map`: which patches the class token (or, in "gap" models,
  the mean token) draws on, through all layers or in one layer and head;
- `mean_attention_distance` (Figure 7 right): how far, in pixels, each head looks;
- `position_embedding_similarity` (Figure 7 centre): cosine similarity of the position
  embeddings, one tile per patch;
- `patch_embedding_components` (Figure 7 left): principal components of the patch-embedding
  filters, as RGB patches.

Each `plot_*` function writes a PNG (matplotlib, without pyplot, so no global backend is
touched) and returns the arrays it drew. `inspect_model` writes all four; `keras-vit inspect`
does the same from the command line.

Attention probabilities are the encoder blocks' own outputs
(`model.get_layer(f"encoderblock_{i}").output[1]`), collected for every layer in one
forward pass; nothing here re-implements attention.

Example (a random model: train one, or load weights, to see something):

    import numpy as np
    import keras_vit
    from keras_vit import inspection as inspect

    model = keras_vit.ViT(image_size=32, patch_size=8, hidden_size=32, num_layers=2,
                          num_heads=4, mlp_dim=64, num_classes=10)
    images = keras_vit.preprocess_inputs(np.zeros((2, 32, 32, 3)))
    inspect.attention_rollout(model, images).shape        # (2, 4, 4)
    inspect.mean_attention_distance(model, images).shape  # (2, 4): layers x heads
    inspect.inspect_model(model, images, "figures")       # the four PNGs
"""

import collections
import math
import os

import keras
import numpy as np

from keras_vit.checks import check_index, check_positive_int
from keras_vit.fileio import atomic_write, check_destination
from keras_vit.introspection import (
    attention_model,
    encoder_blocks,
    model_image_size,
    patch_grid,
    vit_config,
)

# Figure layout, in pixels (PNGs are written at `DPI` dots per inch).
DPI = 100
ATTENTION_PANEL = 250  # width of one panel (image, rollout, one layer) of the attention figure
ATTENTION_TITLE = 40  # height of the titles above each row of the attention figure
MAX_ATTENTION_IMAGES = 8  # rows of the attention figure; the rest of the images are not drawn
DISTANCE_SIZE = (600, 450)
SIMILARITY_GRID = 600  # the longer side of the grid of tiles
# Around the grid of tiles: axis labels left, colour bar right, tick labels below, title above.
SIMILARITY_MARGINS = dict(left=60, right=100, bottom=55, top=45)
SIMILARITY_COLORBAR = (12, 15)  # gap to the grid, width
FILTER_TILE = 100
FILTER_COLUMNS = 7  # the paper shows 28 components as 4 rows of 7
FILTER_TITLE = 50
FILTER_MIN_WIDTH = 400  # room for the title when there are few components
NUM_COMPONENTS = 28  # Figure 7 left: "first 28 principal components"
FIGURE_FILES = {
    "attention": "attention.png",
    "attention_distance": "attention_distance.png",
    "position_embedding_similarity": "position_embedding_similarity.png",
    "patch_embedding_filters": "patch_embedding_filters.png",
}

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
    images = np.asarray(images, dtype=np.float32)
    expected = (*model_image_size(model), model.input.shape[-1])
    if images.ndim == 3:
        images = images[None]
    if images.ndim != 4 or images.shape[1:] != expected or not len(images):
        raise ValueError(
            f"images must have shape [batch, {', '.join(map(str, expected))}] (the model's input "
            "size, scaled to [-1, 1] by keras_vit.preprocess_inputs). Received shape "
            f"{images.shape}."
        )
    return images


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
            scaled to [-1, 1] (`keras_vit.preprocess_inputs`).
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


def _query(geo, query):
    """Resolves `query` to "class" or "mean"; None means the token the classifier reads."""
    if query is None:
        return "class" if geo.num_prefix else "mean"
    if query not in ("class", "mean"):
        raise ValueError(f"query must be 'class', 'mean' or None. Received: {query!r}")
    if query == "class" and not geo.num_prefix:
        raise ValueError(
            "query='class' needs a class token, but this model has none (classifier='gap'). "
            "Use query='mean' (the mean token the 'gap' classifier reads) or None."
        )
    return query


def _from_query(matrices, geo, query):
    """Rows of `[..., N, N]` for the query token, over the patches: `[..., rows, cols]`."""
    rows = matrices[..., 0, :] if query == "class" else matrices.mean(axis=-2)
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
    query = _query(geo, query)
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
        images: array `[B, H, W, 3]` at the model's input size, scaled to [-1, 1].
        query: "class" (the class token), "mean" (the mean of all tokens, what a "gap" model
            classifies) or None (the token the model's classifier reads). Defaults to None.
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
        images: array `[B, H, W, 3]` at the model's input size, scaled to [-1, 1].
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
        images: array `[B, H, W, 3]` at the model's input size, scaled to [-1, 1].
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
    if gray:
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


# --------------------------------------------------------------------------------------------
# Figures.


def _figure(size, layout="constrained"):
    """A figure of `size` (width, height) pixels at `DPI`, outside pyplot."""
    from matplotlib.figure import Figure  # optional: the `figures` extra

    # Agg truncates width * dpi to an int: half a pixel more keeps the size exact.
    figsize = tuple((pixels + 0.5) / DPI for pixels in size)
    return Figure(figsize=figsize, dpi=DPI, layout=layout)


def _save(fig, path):
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=DPI))
    return os.fspath(path)


def _to_unit(images):
    """[-1, 1] model inputs back to [0, 1] for display."""
    return np.clip((np.asarray(images, np.float32) + 1.0) / 2.0, 0.0, 1.0)


def _normalise(maps):
    """Each map scaled to [0, 1] by its maximum (for display only)."""
    peak = maps.reshape(len(maps), -1).max(axis=1).reshape(-1, 1, 1)
    return maps / np.where(peak > 0, peak, 1.0)


def attention_size(num_images, image_size):
    """(width, height) in pixels of `plot_attention`'s PNG: three panels per image row."""
    height, width = image_size
    rows = min(num_images, MAX_ATTENTION_IMAGES)
    return 3 * ATTENTION_PANEL, rows * (round(ATTENTION_PANEL * height / width) + ATTENTION_TITLE)


def _draw_attention(path, images, maps, geo, layer, head, query):
    source = "class token" if _query(geo, query) == "class" else "mean token"
    layer, head = check_layer_head(geo, layer, head)
    heads = "mean of heads" if head is None else f"head {head}"
    titles = ("input", f"rollout ({source})", f"encoderblock_{layer}, {heads}")
    shown = images[:MAX_ATTENTION_IMAGES]
    size = attention_size(len(images), geo.image_size)
    # Maps upsampled to the panel's pixels, so that small images get smooth maps too.
    panel = (size[1] // len(shown) - ATTENTION_TITLE, ATTENTION_PANEL)
    overlays = [upsample(_normalise(maps[k][:len(shown)]), panel)
                for k in ("rollout", "attention")]
    height, width = geo.image_size
    extent = (-0.5, width - 0.5, height - 0.5, -0.5)  # both layers in image pixel coordinates
    fig = _figure(size)
    axes = fig.subplots(len(shown), 3, squeeze=False)
    for i, image in enumerate(_to_unit(shown)):
        for j, ax in enumerate(axes[i]):
            ax.imshow(image, extent=extent, interpolation="nearest")
            if j:
                ax.imshow(overlays[j - 1][i], cmap="inferno", alpha=0.6, vmin=0, vmax=1,
                          extent=extent)
            ax.set_title(titles[j], fontsize=9)
            ax.set_axis_off()
    _save(fig, path)


def plot_attention(model, images, path, layer=-1, head=None, query=None, batch_size=32):
    """Draws, for each image (at most 8), the image, its attention rollout and one layer's map.

    The maps are upsampled bilinearly to the image and overlaid on it, each scaled to its own
    maximum. PNG size: `attention_size` (750 pixels wide; 250 * H/W + 40 per image row).

    Args:
        model, images, layer, head, query, batch_size: as in `attention_map`.
        path: str. Where to write the PNG.

    Returns:
        dict with `rollout` and `attention`, arrays `[B, rows, cols]` for every image.
    """
    images = _check_images(model, images)
    geo, arrays = _analyse(model, images, layer, head, query, batch_size)
    maps = {k: arrays[k] for k in ("rollout", "attention")}
    _draw_attention(path, images, maps, geo, layer, head, query)
    return maps


def _draw_distance(path, distances, geo, num_images):
    import matplotlib  # optional: the `figures` extra

    fig = _figure(DISTANCE_SIZE)
    ax = fig.subplots()
    depth = np.arange(geo.num_layers)  # encoderblock_{i}, as `--layer` counts
    # tab20's ten dark colours for the first ten heads, then its ten light ones.
    colours = matplotlib.colormaps["tab20"]
    for head in range(geo.num_heads):
        ax.scatter(depth, distances[:, head], s=18, color=colours((2 * head + head // 10) % 20),
                   label=f"head {head}")
    uniform = patch_distances(geo).mean()
    ax.axhline(uniform, color="gray", linestyle="--", linewidth=1, label="uniform attention")
    ax.set_xlabel("Network depth (encoder block)")
    ax.set_ylabel("Mean attention distance (pixels)")
    ax.set_xticks(depth if geo.num_layers <= 16 else depth[::2])
    ax.set_ylim(0, 1.1 * max(uniform, distances.max()))
    ax.set_title(f"Mean attention distance ({num_images} images)")
    if geo.num_heads <= 16:
        ax.legend(fontsize=7, ncol=2, loc="lower right")
    _save(fig, path)


def plot_mean_attention_distance(model, images, path, batch_size=32):
    """Figure 7 right: mean attention distance against network depth, one dot per head.

    A dashed line marks the distance uniform attention would give. PNG size 600 x 450.

    Returns:
        The `[layers, heads]` array of `mean_attention_distance`.
    """
    geo, arrays = _analyse(model, images, batch_size=batch_size)
    distances = arrays["distance"].mean(axis=0)
    _draw_distance(path, distances, geo, len(arrays["distance"]))
    return distances


def _mosaic(tiles, columns, gap=1):
    """Tiles `[T, h, w, ...]` in a grid of `columns`, separated by NaN gaps (drawn blank)."""
    count, h, w = tiles.shape[:3]
    rows = math.ceil(count / columns)
    out = np.full(((h + gap) * rows - gap, (w + gap) * columns - gap, *tiles.shape[3:]), np.nan)
    for i, tile in enumerate(tiles):
        r, c = divmod(i, columns)
        out[r * (h + gap):r * (h + gap) + h, c * (w + gap):c * (w + gap) + w] = tile
    return out


def _similarity_layout(grid):
    """(gap, (height, width)): the mosaic's gap in cells and the pixel size of its area.

    The mosaic has `rows` rows of tiles `rows` cells high and `cols` columns of tiles `cols`
    cells wide, with gaps between tiles; square cells, the longer side `SIMILARITY_GRID`.
    """
    rows, cols = grid
    gap = max(1, round(max(rows, cols) / 8))
    cells = (rows * (rows + gap) - gap, cols * (cols + gap) - gap)
    scale = SIMILARITY_GRID / max(cells)
    return gap, (round(cells[0] * scale), round(cells[1] * scale))


def similarity_size(grid):
    """(width, height) in pixels of `plot_position_embedding_similarity`'s PNG."""
    _, (height, width) = _similarity_layout(grid)
    m = SIMILARITY_MARGINS
    return width + m["left"] + m["right"], height + m["bottom"] + m["top"]


def plot_position_embedding_similarity(model, path):
    """Figure 7 centre: each patch's position-embedding similarity with all others.

    One tile per patch, laid out by row and column; in tile (r, c), the pixel (r', c') is the
    cosine similarity between the embeddings of patches (r, c) and (r', c'). Rows and
    columns are numbered from 1, as in the paper. PNG size: `similarity_size` (square cells,
    the grid's longer side 600 pixels, plus 160 x 100 for the colour bar and labels).

    Returns:
        The `[rows, cols, rows, cols]` array of `position_embedding_similarity`.
    """
    import matplotlib  # optional: the `figures` extra

    similarity = position_embedding_similarity(model)
    rows, cols = similarity.shape[:2]
    gap, (height, width) = _similarity_layout((rows, cols))
    mosaic = _mosaic(similarity.reshape(rows * cols, rows, cols), cols, gap)
    size = similarity_size((rows, cols))
    fig = _figure(size, layout=None)
    # Axes placed in pixels: the cells stay square and the colour bar as tall as the grid.
    m, (bar_gap, bar_width) = SIMILARITY_MARGINS, SIMILARITY_COLORBAR
    ax = fig.add_axes([m["left"] / size[0], m["bottom"] / size[1], width / size[0],
                       height / size[1]])
    bar = fig.add_axes([(m["left"] + width + bar_gap) / size[0], m["bottom"] / size[1],
                        bar_width / size[0], height / size[1]])
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="white")
    image = ax.imshow(mosaic, cmap=cmap, vmin=-1, vmax=1, interpolation="nearest", aspect="auto")
    ax.set_xticks(np.arange(cols) * (cols + gap) + (cols - 1) / 2, np.arange(1, cols + 1))
    ax.set_yticks(np.arange(rows) * (rows + gap) + (rows - 1) / 2, np.arange(1, rows + 1))
    ax.tick_params(length=0, labelsize=8)
    ax.set_xlabel("Input patch column")
    ax.set_ylabel("Input patch row")
    ax.set_title("Position embedding similarity")
    ax.set_frame_on(False)
    fig.colorbar(image, cax=bar, label="Cosine similarity")
    _save(fig, path)
    return similarity


def filters_size(num_components):
    """(width, height) in pixels of `plot_patch_embedding_filters`' PNG."""
    columns = min(FILTER_COLUMNS, num_components)
    rows = math.ceil(num_components / columns)
    return max(columns * FILTER_TILE, FILTER_MIN_WIDTH), rows * FILTER_TILE + FILTER_TITLE


def plot_patch_embedding_filters(model, path, num_components=NUM_COMPONENTS, gray=False):
    """Figure 7 left: the top principal components of the patch-embedding filters, in RGB.

    Each component is scaled to [0, 1] on its own; 7 per row. `num_components` is capped at
    what the kernel has (`min(D, ph*pw*3)`, or `min(D, ph*pw)` if `gray`). PNG size:
    `filters_size` (100 pixels per component, 7 per row, at least 400 wide, plus 50 for the
    title).

    Args:
        model, num_components, gray: as in `patch_embedding_components`.
        path: str. Where to write the PNG.

    Returns:
        (components, explained_variance_ratio), as `patch_embedding_components`.
    """
    ph, pw, channels, width = _embedding(model).kernel.shape
    count = min(num_components, width, ph * pw * (1 if gray else channels))
    components, ratio = patch_embedding_components(model, count, gray=gray)
    low = components.min(axis=(1, 2, 3), keepdims=True)
    span = components.max(axis=(1, 2, 3), keepdims=True) - low
    tiles = (components - low) / np.where(span > 0, span, 1.0)
    tiles = np.broadcast_to(tiles, (*tiles.shape[:3], 3))  # grey components as RGB
    columns = min(FILTER_COLUMNS, count)
    fig = _figure(filters_size(count))
    axes = fig.subplots(math.ceil(count / columns), columns, squeeze=False).ravel()
    for ax, tile in zip(axes[:count], tiles, strict=True):
        ax.imshow(tile, interpolation="nearest")
        ax.set_xticks([])  # no ticks, but the frame stays: white tile pixels stay visible
        ax.set_yticks([])
    for ax in axes[count:]:
        ax.set_axis_off()
    colours = ", summed over RGB (grey inputs)" if gray else ""
    fig.suptitle(f"Patch-embedding filters{colours}\ntop {count} principal components, "
                 f"{ratio.sum():.0%} of the variance", fontsize=9)
    _save(fig, path)
    return components, ratio


def has_rgb_filters(model):
    """Whether the patch embedding sees RGB pixels (False for hybrids: ResNet features)."""
    return _embedding(model).kernel.shape[2] == 3


def check_figure_files(out_dir, overwrite=False):
    """Raises `keras_vit.fileio.DestinationExists` if a figure `inspect_model` writes is
    already in `out_dir` (unless `overwrite`), `WriteError` for a link there."""
    for file in FIGURE_FILES.values():
        check_destination(os.path.join(os.path.expanduser(os.fspath(out_dir)), file), overwrite)


def inspect_model(model, images, out_dir, layer=-1, head=None, query=None, batch_size=32,
                  gray=False, overwrite=False):
    """Writes the four figures (`FIGURE_FILES`) for `model` on `images` into `out_dir`.

    A figure file already in `out_dir` is replaced only with `overwrite=True` (refused before
    anything is computed otherwise: `keras_vit.fileio.DestinationExists`).

    `plot_attention`, `plot_mean_attention_distance` (from the same forward pass),
    `plot_position_embedding_similarity` and `plot_patch_embedding_filters`; the arguments
    are theirs.

    Hybrid models get three: their patch embedding sees ResNet features, not RGB pixels, so
    there are no RGB filters to draw.

    Returns:
        dict: figure name -> (path, the arrays its plot function returned).
    """
    check_figure_files(out_dir, overwrite)
    images = _check_images(model, images)
    geo, arrays = _analyse(model, images, layer, head, query, batch_size)  # one pass for both
    maps = {k: arrays[k] for k in ("rollout", "attention")}
    distances = arrays["distance"].mean(axis=0)
    os.makedirs(out_dir, exist_ok=True)
    paths = {name: os.path.join(out_dir, file) for name, file in FIGURE_FILES.items()}
    _draw_attention(paths["attention"], images, maps, geo, layer, head, query)
    _draw_distance(paths["attention_distance"], distances, geo, len(images))
    results = {
        "attention": maps,
        "attention_distance": distances,
        "position_embedding_similarity": plot_position_embedding_similarity(
            model, paths["position_embedding_similarity"]),
    }
    if has_rgb_filters(model):
        results["patch_embedding_filters"] = plot_patch_embedding_filters(
            model, paths["patch_embedding_filters"], gray=gray)
    return {name: (paths[name], arrays) for name, arrays in results.items()}
