"""The figures of the inspection, written as PNG files with matplotlib (the `figures` extra),
without pyplot, so that no global backend is touched. Each `plot_*` function returns the arrays
it drew; `inspect_model` writes each that applies to the model."""

import math
import os

import numpy as np

from keras_vit.data_config import resolve_data_config
from keras_vit.fileio import atomic_write, check_destination
from keras_vit.inspection.analysis import (
    NUM_COMPONENTS,
    _analyse,
    _check_images,
    _embedding,
    _query,
    check_layer_head,
    has_position_embeddings,
    patch_distances,
    patch_embedding_components,
    position_embedding_similarity,
    upsample,
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
FIGURE_FILES = {
    "attention": "attention.png",
    "attention_distance": "attention_distance.png",
    "position_embedding_similarity": "position_embedding_similarity.png",
    "patch_embedding_filters": "patch_embedding_filters.png",
}


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


def _to_unit(images, data_config=None):
    """Model inputs back to [0, 1] for display: `x * std + mean` with the data config's
    (`keras_vit.data_config`; None: the paper's [-1, 1])."""
    images = np.asarray(images, np.float32)
    if data_config is None:
        return np.clip((images + 1.0) / 2.0, 0.0, 1.0)
    config = resolve_data_config(data_config)
    return np.clip(images * np.float32(config["std"]) + np.float32(config["mean"]), 0.0, 1.0)


def _normalise(maps):
    """Each map scaled to [0, 1] by its maximum (for display only)."""
    peak = maps.reshape(len(maps), -1).max(axis=1).reshape(-1, 1, 1)
    return maps / np.where(peak > 0, peak, 1.0)


def attention_size(num_images, image_size):
    """(width, height) in pixels of `plot_attention`'s PNG: three panels per image row."""
    height, width = image_size
    rows = min(num_images, MAX_ATTENTION_IMAGES)
    return 3 * ATTENTION_PANEL, rows * (round(ATTENTION_PANEL * height / width) + ATTENTION_TITLE)


def _draw_attention(path, model, images, maps, geo, layer, head, query, data_config):
    source = "class token" if _query(model, geo, query) == "class" else "mean token"
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
    for i, image in enumerate(_to_unit(shown, model if data_config is None else data_config)):
        for j, ax in enumerate(axes[i]):
            ax.imshow(image, extent=extent, interpolation="nearest")
            if j:
                ax.imshow(overlays[j - 1][i], cmap="inferno", alpha=0.6, vmin=0, vmax=1,
                          extent=extent)
            ax.set_title(titles[j], fontsize=9)
            ax.set_axis_off()
    _save(fig, path)


def plot_attention(model, images, path, layer=-1, head=None, query=None, batch_size=32,
                   data_config=None):
    """Draws, for each image (at most 8), the image, its attention rollout and one layer's map.

    The maps are upsampled bilinearly to the image and overlaid on it, each scaled to its own
    maximum. PNG size: `attention_size` (750 pixels wide; 250 * H/W + 40 per image row).

    Args:
        model, images, layer, head, query, batch_size: as in `attention_map`.
        path: str. Where to write the PNG.
        data_config: what normalised `images` (anything `keras_vit.resolve_data_config`
            takes), to show them as they were; None: the model's (the data config it
            carries, else the paper's [-1, 1]). Defaults to None.

    Returns:
        dict with `rollout` and `attention`, arrays `[B, rows, cols]` for every image.
    """
    images = _check_images(model, images)
    geo, arrays = _analyse(model, images, layer, head, query, batch_size)
    maps = {k: arrays[k] for k in ("rollout", "attention")}
    _draw_attention(path, model, images, maps, geo, layer, head, query, data_config)
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
                  gray=False, overwrite=False, data_config=None):
    """Writes the figures (`FIGURE_FILES`) that apply to `model` on `images` into `out_dir`.

    A figure file already in `out_dir` is replaced only with `overwrite=True` (refused before
    anything is computed otherwise: `keras_vit.fileio.DestinationExists`).

    `plot_attention`, `plot_mean_attention_distance` (from the same forward pass),
    `plot_position_embedding_similarity` and `plot_patch_embedding_filters`; the arguments
    are theirs (`data_config`: what normalised `images`, for showing them; None: the model's).

    Hybrid models get no filters figure: their patch embedding sees ResNet features, not RGB
    pixels. Models with `position_embedding` "none" or "relative" get no similarity figure:
    they add no embedding per position.

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
    _draw_attention(paths["attention"], model, images, maps, geo, layer, head, query,
                    data_config)
    _draw_distance(paths["attention_distance"], distances, geo, len(images))
    results = {"attention": maps, "attention_distance": distances}
    if has_position_embeddings(model):
        results["position_embedding_similarity"] = plot_position_embedding_similarity(
            model, paths["position_embedding_similarity"])
    if has_rgb_filters(model):
        results["patch_embedding_filters"] = plot_patch_embedding_filters(
            model, paths["patch_embedding_filters"], gray=gray)
    return {name: (paths[name], arrays) for name, arrays in results.items()}
