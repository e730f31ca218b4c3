"""Classification accuracy (`evaluate`: top-1, top-5, loss, per-class accuracy, the confusion
matrix, ReaL accuracy on multi-label data) and its report files."""

import contextlib
import csv
import io
import os

import keras
import numpy as np

from keras_vit.checks import check_labels, check_positive_int, is_real_dtype
from keras_vit.fileio import atomic_write, check_destination, folder_lock, naming_write_errors
from keras_vit.model_parts import fresh_head
from keras_vit.plots import plot_confusion_matrix
from keras_vit.weights.keymap import check_finite_outputs
from keras_vit.evaluation.features import batches

# The most classes whose confusion matrix is drawn as a figure.
MAX_CONFUSION_CLASSES = 100


# Top-k accuracy is reported for more than TOP_K classes only: with TOP_K classes or fewer,
# every label is among the top k and the metric is 100% whatever the model predicts.
TOP_K = 5


def evaluate(model, data, batch_size=64, class_names=None, out_dir=None, progress=True,
             value_range=None, allow_fresh_head=False, overwrite=False):
    """Top-1, top-5 and loss of a classifier, with per-class accuracy and the confusion matrix;
    ReaL accuracy too where the data has label sets.

    Args:
        model: a keras_vit classifier (with head).
        data: InputData, tf.data.Dataset or (images, labels). A `keras_vit.data` pipeline
            (`InputData`), a dataset of (images, labels) batches or an (images, labels)
            arrays pair; `labels` may be a dict with `label` and `label_set` (see the module
            docstring).
        batch_size: int. For arrays. Defaults to 64.
        class_names: list of str or None. For the CSV and the figure. (To check that the
            data's classes are the model's, see `check_class_names`.)
        out_dir: str or None. If set, writes `per_class_accuracy.csv` (with label sets, also
            `real_examples`, `real_correct` and `real_accuracy` of each original class) and, for
            at most 100 classes, `confusion_matrix.png` there.
        progress: bool. Show a progress bar (`keras.utils.Progbar`, in images). Defaults to
            True.
        value_range: (0, 255) or (0, 1): the range of float images in an arrays pair (as
            `keras_vit.data.from_arrays`). Defaults to None (integer images).
        allow_fresh_head: bool. Evaluate a head that is all zeros (a fresh head: no trained
            weights were loaded into it, so it scores chance), which is otherwise refused.
            Defaults to False.
        overwrite: bool. Replace report files already in `out_dir` (refused otherwise, before
            anything is evaluated). Defaults to False.

    Returns:
        dict: `top1`, `top5` (None for a model of 5 classes or fewer, where it is always
        1), `loss`, `num_examples`, `per_class_accuracy` [K] (NaN for
        classes absent from the data), `confusion_matrix` [K, K] (rows: true, columns:
        predicted), and `files` written; with label sets, `real` as `real_accuracy` returns
        it (top-1, top-5, loss and the confusion matrix stay against `label`, on every image).
    """
    if "head" not in [layer.name for layer in model.layers]:
        raise ValueError(f"Model {model.name!r} has no classification head (include_top=False).")
    if not allow_fresh_head:
        _check_trained_head(model)
    if not out_dir:
        return _evaluate(model, data, batch_size, progress, value_range)
    with _report_folder(out_dir):  # one writer: two evaluations never mix their reports
        check_report_files(out_dir, overwrite)
        result = _evaluate(model, data, batch_size, progress, value_range)
        result["files"] = _write_reports(result, class_names, out_dir)
        return result


@contextlib.contextmanager
def _report_folder(out_dir):
    """The folder of `evaluate`'s reports, created if absent and locked while the block runs
    (`keras_vit.fileio.folder_lock`); a folder it created is removed again if the block leaves
    it empty (an evaluation that failed)."""
    folder = os.path.expanduser(os.fspath(out_dir))
    created = not os.path.isdir(folder)
    if created:
        check_destination(folder, overwrite=False, kind="folder")
        with naming_write_errors(folder):
            os.makedirs(folder)
    try:
        with folder_lock(folder, "evaluation", remove=True):
            yield
    finally:
        if created:
            with contextlib.suppress(OSError):
                os.rmdir(folder)  # only if empty


def _evaluate(model, data, batch_size, progress, value_range):
    """`evaluate`'s numbers (its `files` empty)."""
    num_classes = int(model.output.shape[-1])
    top5, loss_sum = 0, 0.0
    all_labels, predicted, in_set, has_set = [], [], [], []
    for images, labels, label_sets in batches(data, batch_size, progress, value_range, model):
        labels = check_labels(labels, num_classes)
        logits = np.asarray(model.predict_on_batch(images), np.float64)
        check_finite_outputs(model, logits, "evaluate")
        logits -= logits.max(axis=1, keepdims=True)
        log_probs = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
        loss_sum += float(-log_probs[np.arange(len(labels)), labels].sum())
        order = np.argsort(-logits, axis=1, kind="stable")
        top5 += int((order[:, :TOP_K] == labels[:, None]).any(axis=1).sum())
        all_labels.append(labels)
        predicted.append(order[:, 0])
        if label_sets is not None:
            hits, scored = _label_set_hits(order[:, 0], label_sets, num_classes)
            in_set.append(hits)
            has_set.append(scored)
    if not all_labels:
        raise ValueError("The data holds no images.")
    labels, predicted = np.concatenate(all_labels), np.concatenate(predicted)
    n = len(labels)
    confusion = np.zeros((num_classes, num_classes), np.int64)
    np.add.at(confusion, (labels, predicted), 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        per_class = np.diag(confusion) / confusion.sum(axis=1)
    result = dict(top1=float(np.mean(predicted == labels)),
                  top5=top5 / n if num_classes > TOP_K else None, loss=loss_sum / n,
                  num_examples=n, per_class_accuracy=per_class, confusion_matrix=confusion,
                  files=[])
    if has_set:
        result["real"] = _real_summary(labels, predicted, np.concatenate(in_set),
                                       np.concatenate(has_set), num_classes)
    return result


def check_class_names(model_names, data_names):
    """Raises ValueError if the model's class names and the data's are both known and differ:
    the data's label i would be scored as the model's class i. Names that differ only in
    order or number are refused too (no mapping by name), naming both lists. For names of
    one vocabulary (an image folder's subfolders against the checkpoint trained on such a
    folder); tensorflow-datasets' names (ImageNet's WordNet ids) are not a checkpoint's.

    Args:
        model_names: sequence of str or None. The classes of the model's outputs, in order
            (e.g. a checkpoint's).
        data_names: sequence of str or None. The data's (e.g. an image folder's subfolders).
    """
    if not model_names or not data_names:
        return
    model_names, data_names = [str(n) for n in model_names], [str(n) for n in data_names]
    if model_names == data_names:
        return
    first = next((i for i, (a, b) in enumerate(zip(model_names, data_names)) if a != b),
                 min(len(model_names), len(data_names)))
    differ = (f"class {first} is {data_names[first]!r} in the data but {model_names[first]!r} "
              "in the model" if first < min(len(model_names), len(data_names)) else
              f"the data has {len(data_names)} classes, the model {len(model_names)}")
    raise ValueError(f"The data's classes are not the model's ({differ}): data "
                     f"{_listed(data_names)}; model {_listed(model_names)}. Expected data whose "
                     "class names are the model's, in the same order.")


def _listed(names, limit=10):
    shown = ", ".join(names[:limit])
    return f"[{shown}{', ...' if len(names) > limit else ''}] ({len(names)})"


def _check_trained_head(model):
    """Refuses a head that is all zeros: keras_vit's initial head, which scores chance."""
    if fresh_head(model):
        raise ValueError(
            f"Model {model.name!r} has a fresh head (all zeros: no trained weights were loaded "
            "into it), which scores chance. Expected a classifier with trained weights "
            "(keras_vit.load_pretrained, --weights); pass allow_fresh_head=True "
            "(--allow-fresh-head) to evaluate it anyway.")


def multi_hot(label_sets, num_classes):
    """Label sets as a multi-hot array: row i is True at the classes of `label_sets[i]`.

    Args:
        label_sets: a sequence of N sequences of class ids (each possibly empty).
        num_classes: int.

    Returns:
        bool array [N, num_classes].

    Examples:

    >>> multi_hot([[2], [0, 2], []], 3).astype(int).tolist()
    [[0, 0, 1], [1, 0, 1], [0, 0, 0]]
    """
    num_classes = check_positive_int("num_classes", num_classes)
    rows = np.zeros((len(label_sets), num_classes), bool)
    for i, ids in enumerate(label_sets):
        rows[i, check_labels(ids, num_classes, f"Class ids of label set {i}")] = True
    return rows


def _label_set_hits(predictions, label_sets, num_classes):
    """Per image: whether its prediction is in its label set, and whether the set is
    non-empty (scored). `label_sets`: multi-hot [N, num_classes]."""
    label_sets = np.asarray(label_sets)
    if label_sets.shape != (len(predictions), num_classes):
        raise ValueError(f"Label sets must be multi-hot [{len(predictions)}, {num_classes}] "
                         f"(images, classes). Received shape {label_sets.shape}.")
    if label_sets.dtype != bool:
        rule = ("Label sets must be multi-hot: bool, or 0 and 1 only (see `multi_hot` for lists "
                f"of class ids). Received dtype {label_sets.dtype}")
        if not is_real_dtype(label_sets.dtype):
            raise ValueError(f"{rule}.")
        other = label_sets[(label_sets != 0) & (label_sets != 1)]
        if other.size:
            raise ValueError(f"{rule} with values such as {float(other.flat[0])!r:.20}.")
        label_sets = label_sets.astype(bool)
    return label_sets[np.arange(len(predictions)), predictions], label_sets.any(axis=1)


def _real_summary(labels, predicted, hits, scored, num_classes):
    """`real_accuracy`'s dict from per-image hits and scored flags."""
    n = int(scored.sum())

    def mean(correct):
        return float(correct[scored].mean()) if n else float("nan")

    return dict(accuracy=mean(hits), original_accuracy=mean(predicted == labels),
                num_examples=n, num_left_out=len(scored) - n,
                per_class_examples=np.bincount(labels[scored], minlength=num_classes),
                per_class_correct=np.bincount(labels[scored & hits], minlength=num_classes))


def real_accuracy(predictions, label_sets, labels):
    """ReaL accuracy: the fraction of images whose prediction is in their set of correct
    labels, over the images whose set is not empty (the others are left out), beside the
    plain accuracy against `labels` on the same images.

    Args:
        predictions: int array [N]. The predicted class of each image.
        label_sets: multi-hot [N, K] (bool or 0/1): the correct classes of each image (see
            `multi_hot` for lists of class ids).
        labels: int array [N]. The original single label of each image.

    Returns:
        dict: `accuracy` (ReaL), `original_accuracy` (against `labels`, on the same images;
        both NaN if every set is empty), `num_examples` (images scored), `num_left_out`
        (images with an empty set), `per_class_examples` and `per_class_correct` [K] (the
        scored images of each original class, and how many of them are ReaL-correct).

    Examples:

    >>> result = real_accuracy([2, 1, 0], multi_hot([[2], [0, 2], []], 3), labels=[2, 0, 1])
    >>> result["accuracy"], result["original_accuracy"], result["num_left_out"]
    (0.5, 0.5, 1)
    """
    label_sets = np.asarray(label_sets)
    if label_sets.ndim != 2:
        raise ValueError(f"Label sets must be multi-hot [N, num_classes] (see `multi_hot`). "
                         f"Received shape {label_sets.shape}.")
    num_classes = label_sets.shape[1]
    predictions = check_labels(predictions, num_classes, "Predictions")
    labels = check_labels(labels, num_classes)
    for name, values in (("predictions", predictions), ("labels", labels)):
        if values.ndim != 1:
            hint = f" ({name}.reshape(-1))" if values.ndim == 2 and values.shape[1] == 1 else ""
            raise ValueError(f"`{name}` must hold one class id per image, shape [N]. Received "
                             f"shape {values.shape}{hint}.")
    if len(labels) != len(predictions):
        raise ValueError(f"{len(predictions)} predictions but {len(labels)} labels.")
    hits, scored = _label_set_hits(predictions, label_sets, num_classes)
    return _real_summary(labels, predictions, hits, scored, num_classes)


REPORT_FILES = ("per_class_accuracy.csv", "confusion_matrix.png")


def check_report_files(out_dir, overwrite=False):
    """Raises `keras_vit.fileio.DestinationExists` if a report `evaluate` writes is already in
    `out_dir` (unless `overwrite`), `WriteError` for a link there."""
    for name in REPORT_FILES:
        check_destination(os.path.join(os.path.expanduser(os.fspath(out_dir)), name), overwrite)


def _write_reports(result, class_names, out_dir):
    confusion = result["confusion_matrix"]
    k = len(confusion)
    names = list(class_names) if class_names is not None else [str(i) for i in range(k)]
    if len(names) != k:
        raise ValueError(f"{len(names)} class names given for {k} classes.")
    os.makedirs(out_dir, exist_ok=True)
    csv_path = os.path.join(out_dir, "per_class_accuracy.csv")
    real = result.get("real")
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")  # quotes names with commas, quotes, newlines
    writer.writerow(["class_index", "class_name", "examples", "correct", "accuracy"]
                    + (["real_examples", "real_correct", "real_accuracy"] if real else []))
    for i, name in enumerate(names):
        row = [i, name, *_count_cells(confusion[i].sum(), confusion[i, i])]
        if real:  # the scored images of original class i, and how many are ReaL-correct
            row += _count_cells(real["per_class_examples"][i], real["per_class_correct"][i])
        writer.writerow(row)
    atomic_write(csv_path, lambda f: f.write(text.getvalue().encode("utf-8")))
    files = [csv_path]
    if k <= MAX_CONFUSION_CLASSES:
        files.append(plot_confusion_matrix(confusion, names,
                                           os.path.join(out_dir, "confusion_matrix.png")))
    return files


def _count_cells(examples, correct):
    """CSV cells `examples, correct, accuracy` (accuracy empty without examples)."""
    examples, correct = int(examples), int(correct)
    return [examples, correct, "" if examples == 0 else f"{correct / examples:.6f}"]
