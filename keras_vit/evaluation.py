"""Evaluation as the paper reports it (section 4.1, "Metrics"): fine-tuning accuracy and
few-shot linear accuracy, plus a linear probe and batched feature extraction.

- `evaluate(model, data)`: top-1, top-5, loss, per-class accuracy and the confusion matrix;
  on data whose images have sets of correct labels (ImageNet-ReaL), ReaL accuracy as well.
- `real_accuracy(predictions, label_sets, labels)`: the ReaL metric (Beyer et al. 2020, "Are we
  done with ImageNet?", the ImageNet-ReaL column of the paper's Table 2): a prediction is correct
  if it is in its image's set of labels; images whose set is empty are left out.
- `extract_features(model, data)`: the frozen representation (`pre_logits` if the model has
  one, else the pooled token), batched, optionally cached to `.npy`.
- `fewshot_accuracy(...)` / `fewshot_table(...)`: k images per class, a closed-form
  regularised least-squares fit onto {-1, 1}^K targets (big_vision `fewshot_lsr`), accuracy on
  the test features.
- `linear_probe(...)`: logistic regression on frozen features with `model.fit`.

`data` is a `keras_vit.data` pipeline (`InputData`), a `tf.data.Dataset` of `(images, labels)`
batches with images already scaled to [-1, 1] (what `keras_vit.data` pipelines give), or a
pair of arrays `(images, labels)` with RGB images at the model's resolution: integers in
[0, 255], or floats in the range `value_range` says ((0, 255) or (0, 1), as
`keras_vit.data.from_arrays` takes them), normalised with the model's data config (its
checkpoint's mean and std, `keras_vit.resolve_data_config`; the paper's [-1, 1] by default).
`labels` are class ids `[N]`, or for multi-label evaluation a dict: `label` (class ids
`[N]`) and `label_set` (multi-hot `[N, num_classes]`, see `multi_hot`), as `keras_vit.data`
gives for ImageNet-ReaL.
"""

import contextlib
import csv
import hashlib
import io
import json
import os
import warnings
import zipfile

import keras
import numpy as np

from keras_vit.checks import check_labels, check_positive_number
from keras_vit.data.pipelines import InputData, to_0_255
from keras_vit.data_config import resolve_data_config
from keras_vit.fileio import atomic_write, check_destination, folder_lock, naming_write_errors
from keras_vit.plots import plot_confusion_matrix
from keras_vit.preprocessing import preprocess_inputs
from keras_vit.weights.keymap import check_finite_outputs

# big_vision fewshot_lsr: the appended bias feature is large so that it is almost unregularised.
BIAS_FEATURE = 100.0
# Shots and L2 regularisation values reported by default (the paper reports 1, 5, 10, 25).
DEFAULT_SHOTS = (1, 5, 10, 25)
DEFAULT_L2_REGS = tuple(2.0**i for i in range(-6, 11, 2))
MAX_CONFUSION_CLASSES = 100


# --------------------------------------------------------------------------------------------
# Data and features.


def _is_arrays(data):
    return isinstance(data, tuple) and len(data) == 2


def _batches(data, batch_size, progress, value_range=None, data_config=None):
    """Yields (model inputs, labels, label sets or None) NumPy batches from a pipeline, a
    dataset or an arrays pair (whose float images need their `value_range`, and are normalised
    with `data_config`'s mean and std: the model's, `keras_vit.resolve_data_config`); with
    `progress`, a `keras.utils.Progbar` counts the images used (of how many, where that is
    known)."""
    bar = keras.utils.Progbar(_num_examples(data), unit_name="image") if progress else None
    done = 0
    for batch in _numpy_batches(data, batch_size, value_range, data_config):
        yield batch
        done += len(batch[1])
        if bar and (bar.target is None or done < bar.target):  # the last one: finalize's
            bar.update(done, finalize=False)
    if bar and done:
        bar.update(done, finalize=True)


def _numpy_batches(data, batch_size, value_range=None, data_config=None):
    """The batches `_batches` yields, without the progress bar."""
    if isinstance(data, InputData):
        data = data.dataset
    if _is_arrays(data):
        images, labels = data
        if labels is None:
            raise ValueError("The data has no labels: expected (images, labels).")
        images = to_0_255(np.asarray(images), value_range)
        labels, label_sets = _split_labels(labels)
        if len(images) != len(labels):
            raise ValueError(f"{len(images)} images but {len(labels)} labels.")
        for start in range(0, len(images), batch_size):
            chunk = slice(start, start + batch_size)
            yield (np.asarray(preprocess_inputs(images[chunk], data_config)), labels[chunk],
                   None if label_sets is None else label_sets[chunk])
        return
    if value_range is not None:
        raise ValueError("`value_range` describes arrays of images; a dataset's batches are "
                         f"already scaled to [-1, 1]. Received: value_range={value_range!r}")
    for element in data:
        if not isinstance(element, (tuple, list)) or len(element) != 2:
            raise ValueError(
                "The dataset has no labels: expected elements (images, labels), received "
                f"{type(element).__name__} of {len(element) if hasattr(element, '__len__') else 1}."
            )
        images, labels = element
        yield (np.asarray(images), *_split_labels(labels))


def _split_labels(labels):
    """(class ids, multi-hot label sets or None) from class ids or a dict of both."""
    if not isinstance(labels, dict):
        return np.asarray(labels), None
    if set(labels) != {"label", "label_set"}:
        raise ValueError(f"Labels given as a dict must have the keys 'label' and 'label_set'. "
                         f"Received keys {sorted(labels)}.")
    return np.asarray(labels["label"]), np.asarray(labels["label_set"])


def representation_model(model):
    """The model up to its representation: `pre_logits` if present, else the pooled token.

    Raises:
        ValueError: if the model has neither (not a keras_vit classifier or backbone).
    """
    names = [layer.name for layer in model.layers]
    for name in ("pre_logits", "pool"):
        if name in names:
            return keras.Model(model.input, model.get_layer(name).output, name="representation")
    raise ValueError(
        f"Model {model.name!r} has no representation layer ('pre_logits' or 'pool'); expected "
        "a keras_vit model."
    )


def feature_cache_key(model, extra=None):
    """A hex digest of the model's part of a feature cache entry: its configuration and every
    weight's bytes, and `extra` (a JSON-serialisable description of the data)."""
    digest = hashlib.sha256()
    digest.update(json.dumps(model.get_config(), sort_keys=True, default=str).encode())
    digest.update(json.dumps(extra, sort_keys=True, default=str).encode())
    for variable in model.weights:
        digest.update(variable.path.encode())
        digest.update(np.ascontiguousarray(keras.ops.convert_to_numpy(variable)).tobytes())
    return digest.hexdigest()[:20]


def data_digest(data, batch_size=64, value_range=None):
    """A hex digest of the data's content: every image and label an arrays pair holds (with
    its `value_range`), or every batch a pipeline or dataset yields (one pass over it:
    decoding and resizing, no model)."""
    digest = hashlib.sha256()

    def add(*arrays):
        for array in arrays:
            if array is not None:
                array = np.ascontiguousarray(array)
                digest.update(f"{array.dtype.str}{array.shape}".encode())
                digest.update(array.tobytes())

    if _is_arrays(data) and data[1] is not None:
        add(np.asarray(data[0]), *_split_labels(data[1]))
        digest.update(repr(None if value_range is None else tuple(value_range)).encode())
    else:
        for batch in _numpy_batches(data, batch_size, value_range):
            add(*batch)
    return digest.hexdigest()[:20]


def _read_cache(path):
    """(features, labels) of a cache entry, or None if absent; a damaged entry is reported
    (a warning naming it) and computed again."""
    if not os.path.exists(path):
        return None
    try:
        with np.load(path, allow_pickle=False) as entry:
            features, labels = entry["features"], entry["labels"]
        if features.ndim != 2 or features.dtype != np.float32 or labels.shape != \
                features.shape[:1] or labels.dtype != np.int64:
            raise ValueError(f"features {features.dtype}{features.shape}, labels "
                             f"{labels.dtype}{labels.shape}")
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
        warnings.warn(f"The feature cache entry {path} is damaged ({e}); computing the "
                      "features again and replacing it.", stacklevel=3)
        return None
    return features, labels


def extract_features(model, data, batch_size=64, cache=None, cache_key=None, progress=True,
                     strategy=None, value_range=None):
    """Computes the frozen representation of every image.

    Args:
        model: a keras_vit model (with or without head).
        data: InputData, tf.data.Dataset or (images, labels). A `keras_vit.data` pipeline
            (`InputData`), a dataset of (images, labels) batches or an (images, labels)
            arrays pair.
        batch_size: int. Batch size for arrays. Defaults to 64.
        cache: str or None. A folder: features and labels are stored there in a file named
            by everything that produced them: the model's configuration and weights
            (`feature_cache_key`), the data's content (`data_digest`: for a dataset, one pass
            over its batches, without the model) and `cache_key`. A damaged file is computed
            again.
        cache_key: JSON-serialisable or None. A description of `data` (e.g. data set and
            split), part of the cache name. Defaults to None.
        progress: bool. Show a progress bar (`keras.utils.Progbar`, in images; without a
            total for a dataset of unknown size). Defaults to True.
        strategy: a `tf.distribute.Strategy` or None: the feature model is built and run under
            its scope (the data should then be batched globally). Defaults to None.
        value_range: (0, 255) or (0, 1): the range of float images in an arrays pair (as
            `keras_vit.data.from_arrays`). Defaults to None (integer images).

    Returns:
        (features [N, D] float32, labels [N] int64).
    """
    path = None
    if cache:
        stated = resolve_data_config(model)  # the features of arrays depend on it
        key = cache_key if stated.is_paper else {"data": cache_key, "data_config": stated}
        name = f"{feature_cache_key(model, key)}-" \
               f"{data_digest(data, batch_size, value_range)}.npz"
        path = os.path.join(os.path.expanduser(os.fspath(cache)), name)
        cached = _read_cache(path)
        if cached is not None:
            return cached
    scope = strategy.scope() if strategy is not None else contextlib.nullcontext()
    with scope:
        features_model = representation_model(model)
    features, labels = [], []
    for images, batch_labels, _ in _batches(data, batch_size, progress, value_range,
                                            getattr(model, "data_config", None)):
        features.append(np.asarray(features_model.predict_on_batch(images), np.float32))
        labels.append(batch_labels.astype(np.int64))
    if not features:
        raise ValueError("The data holds no images.")
    features, labels = np.concatenate(features), np.concatenate(labels)
    if path:
        atomic_write(path, lambda f: np.savez(f, features=features, labels=labels))
    return features, labels


def _num_examples(data):
    """The number of images for a progress bar: known for arrays and `keras_vit.data`
    pipelines; for another dataset of batches, unknown without reading it (None)."""
    if isinstance(data, InputData):
        return data.num_examples
    return len(data[0]) if isinstance(data, tuple) else None


# --------------------------------------------------------------------------------------------
# Few-shot linear evaluation.


def _whiten(train, test):
    mean = train.mean(axis=0, keepdims=True)
    std = train.std(axis=0, keepdims=True) + 1e-5

    def prepare(x):
        x = (x - mean) / std
        return np.concatenate([x, np.full((len(x), 1), BIAS_FEATURE)], axis=1)

    return prepare(train), prepare(test)


def lsr_weights(features, labels, num_classes, l2_reg):
    """Ridge regression of {-1, 1} one-hot targets on the features (closed form).

    Solves `min_w |X w - Y|^2 + l2_reg |w|^2` through whichever of `X^T X` (D x D) or `X X^T`
    (N x N) is smaller, as big_vision's fewshot_lsr does.

    Args:
        features: [N, D] (already whitened, with the bias feature).
        labels: [N] ints in [0, num_classes).
        num_classes: int.
        l2_reg: float > 0.

    Returns:
        w: [D, num_classes].
    """
    l2_reg = check_positive_number("l2_reg", l2_reg)
    x = np.asarray(features, np.float64)
    y = 2.0 * np.eye(num_classes)[np.asarray(labels)] - 1.0
    n, d = x.shape
    if n >= d:
        return np.linalg.solve(x.T @ x + l2_reg * np.eye(d), x.T @ y)
    return x.T @ np.linalg.solve(x @ x.T + l2_reg * np.eye(n), y)


def sample_shots(labels, shots, seed=0):
    """Indices of `shots` examples of every class, drawn without replacement.

    Raises:
        ValueError: if a class has fewer than `shots` examples.
    """
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    classes, counts = np.unique(labels, return_counts=True)
    if counts.min() < shots:
        smallest = classes[np.argmin(counts)]
        raise ValueError(
            f"{shots}-shot needs {shots} examples of every class, but class {smallest} has only "
            f"{counts.min()}. Expected shots <= {counts.min()}."
        )
    picks = [rng.choice(np.flatnonzero(labels == c), shots, replace=False) for c in classes]
    return np.concatenate(picks)


def fewshot_accuracy(train_features, train_labels, test_features, test_labels, shots, l2_reg,
                     num_classes=None, seed=0):
    """Accuracy of the closed-form linear classifier fit on `shots` examples per class."""
    num_classes = num_classes or int(max(train_labels.max(), test_labels.max())) + 1
    index = sample_shots(train_labels, shots, seed)
    train, test = _whiten(np.asarray(train_features[index], np.float64),
                          np.asarray(test_features, np.float64))
    w = lsr_weights(train, train_labels[index], num_classes, l2_reg)
    return float(np.mean(np.argmax(test @ w, axis=1) == np.asarray(test_labels)))


def fewshot_table(train_features, train_labels, test_features, test_labels,
                  shots=DEFAULT_SHOTS, l2_regs=DEFAULT_L2_REGS, seed=0):
    """Few-shot accuracy for every (shots, l2_reg), and the best l2_reg for each shots.

    Returns:
        dict with `accuracy` {shots: {l2_reg: accuracy}}, `best` {shots: (l2_reg, accuracy)},
        and the sizes used: `num_classes`, `train_examples` (the images the shots are drawn
        from) and `test_examples` (the images every accuracy is measured on).
    """
    l2_regs = [check_positive_number("l2_regs", reg) for reg in l2_regs]
    num_classes = int(max(np.max(train_labels), np.max(test_labels))) + 1
    accuracy = {
        k: {reg: fewshot_accuracy(train_features, train_labels, test_features, test_labels, k,
                                  reg, num_classes, seed) for reg in l2_regs}
        for k in shots
    }
    best = {k: max(row.items(), key=lambda item: item[1]) for k, row in accuracy.items()}
    return {"accuracy": accuracy, "best": best, "num_classes": num_classes,
            "train_examples": len(train_labels), "test_examples": len(test_labels)}


def format_fewshot_table(table):
    """The few-shot table as Markdown: one row per l2_reg, one column per shots, and the best."""
    shots = list(table["accuracy"])
    regs = list(next(iter(table["accuracy"].values())))
    lines = ["| l2 reg | " + " | ".join(f"{k}-shot" for k in shots) + " |",
             "|---" * (len(shots) + 1) + "|"]
    for reg in regs:
        cells = [f"{table['accuracy'][k][reg]:.2%}" for k in shots]
        lines.append(f"| {reg:g} | " + " | ".join(cells) + " |")
    best = [f"**{table['best'][k][1]:.2%}** (l2 {table['best'][k][0]:g})" for k in shots]
    lines.append("| best | " + " | ".join(best) + " |")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Linear probe.


def linear_probe(train_features, train_labels, test_features, test_labels, epochs=100,
                 learning_rate=0.01, weight_decay=1e-4, batch_size=256, seed=0):
    """Logistic regression on frozen (whitened) features, trained with `model.fit`.

    Returns:
        dict with `accuracy` and `loss` on the test features, and the fitted `model`.
    """
    num_classes = int(max(np.max(train_labels), np.max(test_labels))) + 1
    mean = train_features.mean(axis=0, keepdims=True)
    std = train_features.std(axis=0, keepdims=True) + 1e-5
    keras.utils.set_random_seed(seed)
    probe = keras.Sequential([
        keras.Input((train_features.shape[1],)),
        keras.layers.Dense(num_classes, kernel_initializer="zeros", name="probe"),
    ])
    probe.compile(
        optimizer=keras.optimizers.AdamW(learning_rate, weight_decay=weight_decay),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    probe.fit((train_features - mean) / std, train_labels, epochs=epochs, batch_size=batch_size,
              verbose=0, shuffle=True)
    loss, accuracy = probe.evaluate((test_features - mean) / std, test_labels, verbose=0)
    return {"accuracy": float(accuracy), "loss": float(loss), "model": probe}


# --------------------------------------------------------------------------------------------
# Classification accuracy.

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
    for images, labels, label_sets in _batches(data, batch_size, progress, value_range,
                                               getattr(model, "data_config", None)):
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
    head = model.get_layer("head")
    if not any(np.any(keras.ops.convert_to_numpy(w)) for w in (head.kernel, head.bias)):
        raise ValueError(
            f"Model {model.name!r} has a fresh head (all zeros: no trained weights were loaded "
            "into it), which scores chance. Expected a classifier with trained weights "
            "(keras_vit.load_pretrained, --weights); pass allow_fresh_head=True "
            "(--allow-fresh-head) to evaluate it anyway.")


# --------------------------------------------------------------------------------------------
# Multi-label (ReaL) accuracy.


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
