"""Figures of evaluation results, written as PNG files with matplotlib (the `figures` extra).

- `plot_confusion_matrix`: the confusion matrix `keras_vit.evaluate` computes, rows
  normalised to recall (`evaluate(out_dir=...)` writes it as `confusion_matrix.png`).

matplotlib is used without pyplot (a `Figure` of its own), so no global backend is chosen.
"""

import io

import numpy as np

from keras_vit.fileio import atomic_write


def plot_confusion_matrix(confusion, class_names, path):
    """Writes the confusion matrix (rows normalised to recall) as a PNG; returns the path."""
    from matplotlib.figure import Figure  # optional: the `figures` extra

    k = len(confusion)
    with np.errstate(invalid="ignore", divide="ignore"):
        recall = np.nan_to_num(confusion / confusion.sum(axis=1, keepdims=True))
    size = min(3 + 0.35 * k, 24)
    figure = Figure(figsize=(size, size), dpi=100)
    ax = figure.add_subplot()
    image = ax.imshow(recall, cmap="Blues", vmin=0, vmax=1)
    figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="fraction of the true class")
    ticks = np.arange(k)
    show_names = k <= 40
    ax.set_xticks(ticks, class_names if show_names else None, rotation=90, fontsize=8)
    ax.set_yticks(ticks, class_names if show_names else None, fontsize=8)
    ax.set_xlabel("predicted class")
    ax.set_ylabel("true class")
    if k <= 20:
        for i in range(k):
            for j in range(k):
                if confusion[i, j]:
                    ax.text(j, i, int(confusion[i, j]), ha="center", va="center", fontsize=7,
                            color="white" if recall[i, j] > 0.5 else "black")
    ax.set_title(f"Confusion matrix ({int(confusion.sum())} images, "
                 f"top-1 {np.trace(confusion) / max(confusion.sum(), 1):.2%})")
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    atomic_write(path, lambda f: f.write(buffer.getvalue()))
    return path
