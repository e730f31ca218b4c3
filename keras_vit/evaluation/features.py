"""The data `keras_vit.evaluation` takes (pipelines, datasets, arrays) as batches for a model, and
the frozen representation of a model on it (`extract_features`, optionally cached)."""

import contextlib
import hashlib
import json
import os
import warnings
import zipfile

import keras
import numpy as np

from keras_vit.checks import check_positive_int
from keras_vit.data.pipelines import InputData, to_0_255
from keras_vit.data_config import resolve_data_config
from keras_vit.fileio import atomic_write
from keras_vit.preprocessing import check_preprocessed, scale_pixels


def _is_arrays(data):
    return isinstance(data, tuple) and len(data) == 2


def batches(data, batch_size, progress, value_range=None, model=None):
    """Yields (model inputs, labels, label sets or None) NumPy batches for `model` from a
    pipeline, a dataset or an arrays pair (whose float images need their `value_range`, and
    are normalised with the model's data config, `keras_vit.resolve_data_config`), each
    checked (`_checked`); with `progress`, a `keras.utils.Progbar` counts the images used (of
    how many, where that is known)."""
    if isinstance(data, InputData) and model is not None:
        data = data.normalised_for(model, "evaluation")  # its data config, not its values
    bar = keras.utils.Progbar(_num_examples(data), unit_name="image") if progress else None
    done = 0
    for batch in _numpybatches(data, batch_size, value_range, model):
        yield batch
        done += len(batch[1])
        if bar and (bar.target is None or done < bar.target):  # the last one: finalize's
            bar.update(done, finalize=False)
    if bar and done:
        bar.update(done, finalize=True)


def _numpybatches(data, batch_size, value_range=None, model=None):
    """The batches `batches` yields, without the progress bar (without `model`, their images'
    size and values unchecked)."""
    pipeline = isinstance(data, InputData)
    if pipeline:
        data = data.dataset
    if _is_arrays(data):
        images, labels = data
        batch_size = check_positive_int("batch_size", batch_size)  # of arrays only
        if labels is None:
            raise ValueError("The data has no labels: expected (images, labels).")
        images = to_0_255(np.asarray(images), value_range)  # checked, whole: scaled by chunk
        labels, label_sets = _checked(images, *_split_labels(labels), model, "")
        data_config = getattr(model, "data_config", None)
        for start in range(0, len(images), batch_size):
            chunk = slice(start, start + batch_size)
            yield (np.asarray(scale_pixels(images[chunk], data_config)), labels[chunk],
                   None if label_sets is None else label_sets[chunk])
        return
    if value_range is not None:
        raise ValueError("`value_range` describes arrays of images; a dataset's batches are "
                         "already preprocessed for the model. Received: "
                         f"value_range={value_range!r}")
    for element in data:
        if not isinstance(element, (tuple, list)) or len(element) != 2:
            raise ValueError(
                "The dataset has no labels: expected elements (images, labels), received "
                f"{type(element).__name__} of {len(element) if hasattr(element, '__len__') else 1}."
            )
        images = np.asarray(element[0])
        labels, label_sets = _checked(images, *_split_labels(element[1]), model, "dataset's ")
        if model is not None and not pipeline:  # a keras_vit pipeline's, by its data config
            check_preprocessed(images, model, "The dataset's images")
        yield images, labels, label_sets


def _checked(images, labels, label_sets, model, whose):
    """(labels, label sets) of a batch of `images` (or of all the images of an arrays pair),
    once the images are [batch, height, width, 3] at the size of `model` (where given and
    fixed), and there is one class id (and label set) per image; else a ValueError naming what
    differs (`whose`: "dataset's " for a dataset's batch)."""
    if images.ndim != 4 or images.shape[-1] != 3:
        hint = " (a dataset of single images: dataset.batch(n))" if whose and images.ndim == 3 \
            else ""
        raise ValueError(f"The {whose}images have shape {images.shape}: expected a batch of "
                         f"RGB images [batch, height, width, 3]{hint}.")
    count = len(images)
    if labels.ndim != 1 or len(labels) != count:
        hint = " (keras.datasets gives [N, 1] labels: labels.reshape(-1))" if \
            labels.shape == (count, 1) else ""
        raise ValueError(f"The {whose}labels have shape {labels.shape} for {count} images: "
                         f"expected one class id per image, shape ({count},){hint}.")
    if label_sets is not None and (label_sets.ndim != 2 or len(label_sets) != count):
        raise ValueError(f"The {whose}label sets have shape {label_sets.shape} for {count} "
                         f"images: expected one multi-hot row per image, [{count}, classes].")
    size = tuple(model.inputs[0].shape[1:3]) if model is not None else None
    if size is not None and None not in size and tuple(images.shape[1:3]) != tuple(size):
        raise ValueError(f"The {whose}images are {images.shape[1]}x{images.shape[2]} pixels; "
                         f"the model takes {size[0]}x{size[1]}. Expected images of its size "
                         "(keras_vit.data pipelines resize to image_size=).")
    return labels, label_sets


def _split_labels(labels):
    """(class ids, multi-hot label sets or None) from class ids or a dict of both."""
    if not isinstance(labels, dict):
        return np.asarray(labels), None
    if set(labels) != {"label", "label_set"}:
        raise ValueError(f"Labels given as a dict must have the keys 'label' and 'label_set'. "
                         f"Received keys {sorted(labels)}.")
    return np.asarray(labels["label"]), np.asarray(labels["label_set"])


def representation_model(model):
    """The model up to its representation, what its head reads: `pre_logits` if present, else
    the pooled token (normalised by `fc_norm` in a model that has it, as timm's
    `forward_head(pre_logits=True)`).

    Raises:
        ValueError: if the model has neither (not a keras_vit classifier or backbone).
    """
    layer = model.get_layer(_representation_layer(model))
    return keras.Model(model.input, layer.output, name="representation")


def _representation_layer(model):
    names = [layer.name for layer in model.layers]
    for name in ("pre_logits", "fc_norm", "pool"):
        if name in names:
            return name
    raise ValueError(
        f"Model {model.name!r} has no representation layer ('pre_logits' or 'pool'); expected "
        "a keras_vit model."
    )


def feature_cache_key(model, extra=None):
    """A hex digest of the model's part of a feature cache entry: its configuration and every
    weight's bytes, the layer its features are read from, and `extra` (a JSON-serialisable
    description of the data)."""
    digest = hashlib.sha256()
    digest.update(json.dumps(model.get_config(), sort_keys=True, default=str).encode())
    digest.update(_representation_layer(model).encode())
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
        for batch in _numpybatches(data, batch_size, value_range):
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
    for images, batch_labels, _ in batches(data, batch_size, progress, value_range, model):
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
