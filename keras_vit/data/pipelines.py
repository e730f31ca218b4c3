"""The one `tf.data` pipeline every source goes through: training and evaluation input,
the official augmentation, batching (per replica under a strategy), resumable epoch orders;
and the sources that are not files of their own, NumPy arrays (`from_arrays`) and `tf.data`
datasets (`from_tf_dataset`). See the package docstring (`keras_vit.data`) for what the pipelines yield.
"""

import dataclasses
import functools
import math
import warnings

import numpy as np
import tensorflow as tf

from keras_vit import images as image_ops
from keras_vit.checks import (check_bool, check_int, check_labels, check_positive_int,
                              check_replica_batch, in_range, to_pair)
from keras_vit.labels import check_class_names
from keras_vit.preprocessing import as_data_config, check_pixel_range, check_value_range

# Inception crop of the official training pipeline (vit_jax input_pipeline.py):
# `tf.image.sample_distorted_bounding_box(area_range=(0.05, 1.0), min_object_covered=0)`,
# with TensorFlow's default aspect-ratio range.
INCEPTION_AREA_RANGE = (0.05, 1.0)
INCEPTION_ASPECT_RATIO_RANGE = (3 / 4, 4 / 3)
# Splits of at most this many examples are held in memory (still encoded) so that every
# epoch's order is a stateless permutation: resumed runs see the same batches.
RANDOM_ACCESS_LIMIT = 200_000
# Shuffle buffer for larger, streamed splits (vit_jax uses 50k for ImageNet-21k).
STREAM_SHUFFLE_BUFFER = 50_000
AUTOTUNE = tf.data.AUTOTUNE


def _as_written(fn):
    """`fn` for `tf.data` to trace as it is written, without AutoGraph's rewriting of its
    source (the rewrite runs for each function on its first trace in a process). keras_vit's
    input functions branch on Python values only, never on a tensor."""
    return tf.autograph.experimental.do_not_convert(fn)


# The data config fields a pipeline's images depend on: every pipeline normalises; an
# evaluation pipeline also resizes and crops as the config says.
_NORMALISATION = ("mean", "std")
_RESIZE_AND_CROP = ("interpolation", "crop_pct", "crop_mode", "antialias")


def _fields(config, fields):
    """"mean [0.5, 0.5, 0.5], crop_pct 0.9": the values of `fields` in a data config."""
    return ", ".join(f"{field} {list(config[field]) if field in _NORMALISATION else config[field]}"
                     for field in fields)


@dataclasses.dataclass
class InputData:
    """A batched input pipeline and what `model.fit` needs to know about it.

    Attributes:
        dataset: `tf.data.Dataset` (or a distributed dataset) of `(images, labels)` batches.
        num_examples: int. Examples in the split.
        num_classes: int. Labels are in `[0, num_classes)`.
        batch_size: int. Global batch size.
        training: bool. Training pipelines repeat forever with augmentation.
        class_names: tuple of str. Label names, where known.
        start_epoch: int. The first epoch of a training pipeline.
        skipped: tuple of (path, reason). Image files left out as undecodable.
        data_config: `keras_vit.DataConfig`. The preprocessing whose normalisation (mean and
            std) the images have; an evaluation pipeline also resizes and crops as it says.
        data_config_given: bool. Whether the pipeline was built with a `data_config` (False:
            the paper's by default, which `for_model` may replace with a model's).
    """

    dataset: object
    num_examples: int
    num_classes: int
    batch_size: int
    training: bool
    class_names: tuple = ()
    start_epoch: int = 0
    rebuild: object = dataclasses.field(default=None, repr=False)  # epoch -> InputData
    skipped: tuple = ()  # (path, reason) of the files `from_folder(skip_corrupt=True)` left out
    data_config: object = None  # the keras_vit.DataConfig the images are normalised with
    data_config_given: bool = False

    def from_epoch(self, epoch):
        """The same pipeline starting at `epoch`: the batches an uninterrupted run sees from
        there (to resume a run). Evaluation pipelines do not depend on the epoch."""
        if not self.training or epoch == self.start_epoch or self.rebuild is None:
            return self
        return dataclasses.replace(self.rebuild(epoch), skipped=self.skipped)

    def for_model(self, model, role="data"):
        """This pipeline with `model`'s preprocessing (its data config): the normalisation
        (mean and std) of every pipeline, and the resize and crop of an evaluation pipeline
        (a training pipeline's augmentation crops and resizes its own way).

        A pipeline built without a `data_config` is built again with the model's (its
        preprocessing, from the same epoch); one built with another normalisation is refused
        (another resize or crop, given, is the caller's choice).

        Returns:
            (pipeline, adopted): `adopted` is True where the pipeline was built again.

        Raises:
            ValueError: one line naming `role`, both preprocessings and what to pass.
        """
        expected = getattr(model, "data_config", None)
        stated = self.data_config
        if expected is None or stated is None:
            return self, False
        differs = [field for field in self._applied_fields()
                   if stated.get(field) != expected.get(field)]
        normalisation = any(field in _NORMALISATION for field in differs)
        if not differs or (self.data_config_given and not normalisation):
            return self, False
        if self.data_config_given or self.rebuild is None:
            if normalisation:
                raise ValueError(
                    f"The {role} pipeline normalises with mean {list(stated['mean'])} and std "
                    f"{list(stated['std'])}, but model {model.name!r} expects mean "
                    f"{list(expected['mean'])} and std {list(expected['std'])} (its "
                    "data_config). Expected a pipeline built with data_config=model.")
            raise ValueError(
                f"The {role} pipeline resizes and crops with {_fields(stated, differs)}, but "
                f"model {model.name!r} expects {_fields(expected, differs)} (its data_config)."
                " Expected a pipeline built with data_config=model.")
        rebuilt = self.rebuild(self.start_epoch, expected)
        return dataclasses.replace(rebuilt, skipped=self.skipped, data_config_given=False), True

    def _applied_fields(self):
        """The data config's fields this pipeline's images depend on."""
        return _NORMALISATION if self.training else _NORMALISATION + _RESIZE_AND_CROP

    def normalised_for(self, model, role="data"):
        """`for_model`'s pipeline, with a warning of one line where it was built again."""
        pipeline, adopted = self.for_model(model, role)
        if adopted:
            warnings.warn(f"The {role} pipeline was built without a data config: it now "
                          f"preprocesses as model {model.name!r}'s data config says ("
                          f"{_fields(pipeline.data_config, pipeline._applied_fields())}), as "
                          "its weights expect (pass data_config=model to build it so).",
                          stacklevel=3)
        return pipeline

    @property
    def steps_per_epoch(self):
        """Whole batches per epoch for training; all batches (the last partial) for eval."""
        if self.training:
            return self.num_examples // self.batch_size
        return math.ceil(self.num_examples / self.batch_size)


# --------------------------------------------------------------------------------------------
# Preprocessing.


def preprocess_train(image, image_size, seed, area_range=INCEPTION_AREA_RANGE, flip=True,
                     crop=True, data_config=None):
    """Official training preprocessing, stateless: inception crop, resize, flip, normalise.

    Args:
        image: uint8 (or float in [0, 255]) tensor `[H, W, 3]` (or `[H, W, 1]`).
        image_size: (height, width).
        seed: int tensor of shape [2]. The same seed gives the same crop and flip.
        area_range: (min, max) fraction of the image the crop covers. Defaults to the
            official (0.05, 1.0).
        flip: bool. Random horizontal flip. Defaults to True.
        crop: bool. The inception crop; False resizes the whole image (for labels that depend
            on where things are, e.g. VTAB's structured tasks). Defaults to True.
        data_config: None or a data config: its mean and std normalise the result (as timm
            fine-tunes with the checkpoint's own). Defaults to None: the paper's [-1, 1].

    Returns:
        float32 `[height, width, 3]`: `(x / 255 - mean) / std`.
    """
    image = image_ops.to_rgb(image)
    return _augmented(lambda window: image_ops.cut_window(image, window), image_size, seed,
                      area_range, flip, crop, data_config)


def _augmented(load, image_size, seed, area_range, flip, crop, data_config):
    """`preprocess_train` of the RGB image `load(window)` gives: the box that `window` (None:
    the whole image) gives for the image's shape, cut out or decoded alone."""
    crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    image = load((lambda shape: _inception_box(shape, crop_seed, area_range)) if crop else None)
    image = image_ops.resize(image, image_size)  # image = [height, width, 3]
    if flip:
        image = tf.image.stateless_random_flip_left_right(image, flip_seed)
    # None: the paper's, `x / 127.5 - 1` bit for bit.
    return image_ops.normalize(image, as_data_config(data_config, image_size))


def _inception_box(shape, seed, area_range):
    """`(begin, size)` of the inception crop's random box in an image of `shape`."""
    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        shape,
        bounding_boxes=tf.zeros([0, 0, 4], tf.float32),
        seed=seed,
        min_object_covered=0.0,
        aspect_ratio_range=INCEPTION_ASPECT_RATIO_RANGE,
        area_range=area_range,
        use_image_if_no_bounding_boxes=True,
    )
    return begin, size


# --------------------------------------------------------------------------------------------
# The one pipeline every source goes through.


@dataclasses.dataclass
class _Source:
    """Examples to feed: random access (`fetch(index)`) or a stream (`stream`)."""

    num_examples: int
    num_classes: int
    fetch: object = None  # index -> (raw image, label)
    stream: object = None  # unbatched tf.data.Dataset of (raw image, label)
    # (raw image, window=None) -> uint8 RGB [H, W, 3], or the box `window` (`decode_image`'s)
    # gives for it; None if already decoded.
    decode: object = None
    class_names: tuple = ()

    def load(self, raw, window=None):
        """The RGB image of `raw`, or the box `window` (`decode_image`'s) gives for it."""
        if self.decode is None:
            return image_ops.cut_window(image_ops.to_rgb(raw), window)
        return self.decode(raw, window=window)


def _check_batch_size(batch_size, num_replicas, num_examples, training):
    check_replica_batch(batch_size, num_replicas)
    if training and num_examples < batch_size:
        raise ValueError(
            f"The training split has {num_examples} examples, fewer than one batch of "
            f"{batch_size}. Expected at least batch_size examples.")


def _epoch_indices(epoch, num_examples, steps, batch_size, seed):
    """(epoch, index) pairs of one training epoch: a stateless permutation, whole batches."""
    order = tf.random.experimental.stateless_shuffle(
        tf.range(num_examples, dtype=tf.int64), seed=tf.stack([tf.constant(seed, tf.int64), epoch])
    )[: steps * batch_size]
    return tf.data.Dataset.from_tensor_slices((tf.fill([steps * batch_size], epoch), order))


def _train_dataset(source, image_size, global_batch, batch_size, seed, start_epoch, augment,
                   shard, config):
    """The repeated, augmented training stream of one input pipeline, in `batch_size` batches.

    Each epoch takes the first `steps * global_batch` examples of its permutation; input
    pipeline `shard = (count, index)` keeps every count-th of them, so that the pipelines'
    per-replica batches of one step together hold the same examples as one global batch.
    """
    num_shards, shard_index = shard
    steps = source.num_examples // global_batch

    def prepare(epoch, index, raw, label):
        example_seed = tf.stack([epoch * source.num_examples + index, tf.constant(seed, tf.int64)])
        if augment:  # `preprocess_train`, the crop's box decoded alone where it can be
            image = _augmented(lambda window: source.load(raw, window), image_size,
                               example_seed, **augment, data_config=config)
        else:
            image = image_ops.eval_transform(source.load(raw), config)
        return image, _int32(label)

    if source.fetch is not None:
        epochs = tf.data.Dataset.range(start_epoch, np.iinfo(np.int64).max)
        pairs = epochs.flat_map(
            _as_written(lambda e: _epoch_indices(e, source.num_examples, steps, global_batch,
                                                seed))
        )
        pairs = pairs.shard(num_shards, shard_index)
        examples = pairs.map(
            _as_written(lambda e, i: prepare(e, i, *source.fetch(i))), num_parallel_calls=AUTOTUNE
        )
    else:
        stream = source.stream.shard(num_shards, shard_index)
        stream = stream.shuffle(
            min(STREAM_SHUFFLE_BUFFER, source.num_examples), seed=seed * 1_000_003 + start_epoch
        ).repeat()
        examples = stream.enumerate().map(
            _as_written(lambda i, example: prepare(tf.constant(start_epoch, tf.int64), i,
                                                  *example)),
            num_parallel_calls=AUTOTUNE,
        )
    return examples.batch(batch_size, drop_remainder=True)


def _eval_dataset(source, batch_size, config):
    """The evaluation stream, preprocessed as the data config `config` says."""
    if source.fetch is not None:
        examples = tf.data.Dataset.range(source.num_examples).map(_as_written(source.fetch))
    else:
        examples = source.stream
    examples = examples.map(
        _as_written(lambda raw, label: (image_ops.eval_transform(source.load(raw), config),
                                       _int32(label))),
        num_parallel_calls=AUTOTUNE,
    )
    return examples.batch(batch_size)


def _int32(labels):
    """Labels as int32: a label tensor, or each tensor of a dict of them (label sets)."""
    return tf.nest.map_structure(lambda t: tf.cast(t, tf.int32), labels)


def _finish(dataset):
    options = tf.data.Options()
    options.deterministic = True
    # Keras shards a dataset across workers by batches; our pipelines have no file reader.
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return dataset.prefetch(AUTOTUNE).with_options(options)


def _pipeline(source, image_size, batch_size, training, seed, start_epoch, augment, strategy,
              data_config=None):
    image_size = to_pair("image_size", image_size)
    training = check_bool("training", training)
    if not source.num_examples:
        raise ValueError("The data holds no examples. Expected at least one image.")
    # The paper's where none is given (a model gives its own: `as_data_config`).
    config = as_data_config(data_config, image_size)
    num_replicas = strategy.num_replicas_in_sync if strategy is not None else 1
    _check_batch_size(batch_size, num_replicas, source.num_examples, training)
    start_epoch = check_int("start_epoch", start_epoch, 0)
    seed = check_int("seed", seed, 0)
    if seed >= _SEED_LIMIT:  # TensorFlow's seeds are int64
        raise ValueError(f"`seed` must be an integer in [0, 2**63). Received: seed={seed!r:.40}")
    if not training:
        dataset = _finish(_eval_dataset(source, batch_size, config))
    elif num_replicas == 1:
        dataset = _finish(
            _train_dataset(source, image_size, batch_size, batch_size, seed, start_epoch,
                           augment, (1, 0), config)
        )
    else:

        def dataset_fn(context):
            return _finish(
                _train_dataset(
                    source,
                    image_size,
                    batch_size,
                    context.get_per_replica_batch_size(batch_size),
                    seed,
                    start_epoch,
                    augment,
                    (context.num_input_pipelines, context.input_pipeline_id),
                    config,
                )
            )

        dataset = strategy.distribute_datasets_from_function(dataset_fn)
    return InputData(
        dataset=dataset,
        num_examples=source.num_examples,
        num_classes=source.num_classes,
        batch_size=batch_size,
        training=training,
        class_names=tuple(source.class_names),
        start_epoch=start_epoch,
        rebuild=lambda epoch, config=data_config: _pipeline(
            source, image_size, batch_size, training, seed, epoch, augment, strategy, config),
        data_config=config,
        data_config_given=data_config is not None,
    )


# Seeds are TensorFlow's int64.
_SEED_LIMIT = 2**63


def _augment_args(augment):
    """`augment`: True (official), False (eval preprocessing), or a dict of overrides."""
    official = dict(area_range=INCEPTION_AREA_RANGE, flip=True, crop=True)
    if augment is True:
        return official
    if augment is False or augment is None:
        return None
    if isinstance(augment, dict) and set(augment) <= set(official):
        chosen = dict(official, **augment)
        for name in ("flip", "crop"):
            check_bool(f"augment[{name!r}]", chosen[name])
        area = chosen["area_range"]
        ok = isinstance(area, (tuple, list)) and len(area) == 2
        low, high = area if ok else (None, None)
        if not (ok and in_range(low, 0, 1, low_inclusive=False, high_inclusive=True)
                and in_range(high, 0, 1, low_inclusive=False, high_inclusive=True)
                and low <= high):
            raise ValueError(f"`augment['area_range']` must be (low, high) with 0 < low <= high "
                             f"<= 1 (fractions of the image area). Received: {area!r:.100}")
        return dict(chosen, area_range=(float(low), float(high)))
    raise ValueError(
        f"`augment` must be True, False or a dict with keys 'area_range', 'flip' and/or "
        f"'crop'. Received: augment={augment!r}"
    )


# --------------------------------------------------------------------------------------------
# Sources.


def from_arrays(
    images,
    labels=None,
    *,
    num_classes=None,
    image_size,
    batch_size,
    training,
    seed=0,
    start_epoch=0,
    augment=True,
    strategy=None,
    class_names=(),
    value_range=None,
    data_config=None,
):
    """A pipeline over in-memory images.

    Args:
        images: array. `[N, H, W, 3]`, `[N, H, W, 1]` or `[N, H, W]`, RGB or grey values:
            integers in [0, 255], or floats in the range `value_range` says.
        labels: int array `[N]`, or None for unlabelled images (self-supervised pre-training,
            `keras_vit.pretraining`): every label is then 0, of one class.
        num_classes: int or None. Labels must lie in `[0, num_classes)`. Defaults to
            `max(labels) + 1`.
        image_size: int or (height, width). The model resolution.
        batch_size: int. Global batch size.
        training: bool. Augmented, shuffled, repeated batches if True; one pass in order if
            False.
        seed: int in [0, 2**63). Seed of the shuffle and augmentation. Defaults to 0.
        start_epoch: int. First epoch of a training pipeline (to resume a run). Defaults to 0.
        augment: bool or dict. True for the official inception crop and flip, False for
            none, or a dict overriding `area_range`, `flip` or `crop` (False: resize the
            whole image).
            Defaults to True.
        strategy: `tf.distribute.Strategy` or None. See the module docstring.
        class_names: sequence of str. Label names, one per class. Defaults to none.
        value_range: (0, 255) or (0, 1): the range of the image values. Required for float
            images (a float array does not say whether 1.0 is white or nearly black);
            integer images are (0, 255). Values outside the range are refused.
        data_config: None, a model or a data config (a dict; a registry entry's or a
            checkpoint's: `keras_vit.resolve_data_config`): pass the model. An evaluation pipeline
            resizes, crops and normalises as it says at `image_size`; a training pipeline
            augments as the paper does, then normalises with its mean and std (as timm
            fine-tunes a checkpoint with its own). None: the paper's (bilinear resize,
            [-1, 1]). Defaults to None.

    Returns:
        `InputData`.

    Raises:
        ValueError: for images that are not `[N, H, W(, C)]`, float images without
            `value_range` or outside it, a label count that differs from the image count, or
            labels outside `[0, num_classes)`.
    """
    try:
        images = np.asarray(images)
    except ValueError:  # a list of images of different sizes
        raise ValueError("`images` must be one array [N, H, W, 3] of images of one size "
                         "(from_tf_dataset takes images of different sizes).") from None
    labels = np.zeros(images.shape[:1], np.int32) if labels is None else np.asarray(labels)
    if images.ndim == 3:
        images = images[..., None]
    if images.ndim != 4 or images.shape[-1] not in (1, 3) or 0 in images.shape[1:3]:
        raise ValueError(
            f"`images` must have shape [N, H, W, 3], [N, H, W, 1] or [N, H, W] with H, W > 0. "
            f"Received shape {images.shape}"
        )
    if labels.ndim != 1 or len(labels) != len(images):
        raise ValueError(
            f"`labels` must be a vector of one label per image ({len(images)}). "
            f"Received shape {labels.shape}"
        )
    if not len(images):
        raise ValueError(f"`images` holds no images (shape {images.shape}). Expected at least "
                         "one image.")
    if not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"`labels` must be integers. Received dtype {labels.dtype}")
    images = to_0_255(images, value_range)
    class_names = () if class_names is None else class_names
    if num_classes is None and not isinstance(class_names, str) and len(class_names):
        num_classes = len(class_names)  # the names say how many classes there are
    num_classes = int(labels.max()) + 1 if num_classes is None and len(labels) else num_classes
    class_names = _checked_names(class_names, num_classes)
    check_labels(labels, num_classes)
    images_t = tf.constant(images)
    labels_t = tf.constant(labels.astype(np.int32))
    source = _Source(
        num_examples=len(images),
        num_classes=num_classes,
        fetch=lambda i: (tf.gather(images_t, i), tf.gather(labels_t, i)),
        class_names=class_names,
    )
    return _pipeline(source, image_size, batch_size, training, seed, start_epoch,
                     _augment_args(augment) if training else None, strategy, data_config)


def _checked_names(class_names, num_classes):
    """The label names given to a pipeline, a tuple: none, or one name per class (checked)."""
    if class_names is None or (not isinstance(class_names, str) and not len(class_names)):
        return ()
    return tuple(check_class_names(class_names, num_classes, owner="the data"))


def to_0_255(images, value_range):
    """Images with values in [0, 255]: integer images as they are (checked), float images
    scaled from their declared `value_range`, (0, 255) or (0, 1), which float images must give.

    Raises:
        ValueError: for float images without `value_range` or outside it, integer images
            outside [0, 255], or another dtype.
    """
    check_value_range(value_range, allow_none=True)
    floating = np.issubdtype(images.dtype, np.floating)
    if floating and value_range is None:
        raise ValueError(
            f"`images` are {images.dtype}: say their range with value_range=(0, 255) or "
            "value_range=(0, 1). (Integer images are taken as [0, 255].)")
    if not floating and not np.issubdtype(images.dtype, np.integer):
        raise ValueError(f"`images` must be integer or float arrays. Received dtype "
                         f"{images.dtype}")
    low, high = (0, 255) if value_range is None else tuple(value_range)
    if images.size:
        check_pixel_range(images, (low, high), floating, "`images`")
    if floating and high == 1:
        return images.astype(np.float32) * 255.0
    return images


def _decoded_window(decode, value_range, raw, window=None):
    """`decode(raw)` as RGB in [0, 255], or the box `window` gives for it."""
    image = decode(raw)
    _check_pixels_dtype(image.dtype, value_range, "The images `decode` returns")  # as traced
    return image_ops.cut_window(image_ops.to_rgb(_in_0_255(image, value_range)), window)


def _check_examples(dataset, decode, value_range):
    """Refuses what `from_tf_dataset` cannot read as (image, label) examples, by the dataset's
    element spec: no dataset, other elements, batched images, float images without their
    `value_range` (pixels in [0, 1] read as [0, 255] would all be near black), labels that
    are no integer class ids."""
    if not isinstance(dataset, tf.data.Dataset):
        raise ValueError(f"from_tf_dataset takes a tf.data.Dataset of (image, label) examples. "
                         f"Received: {type(dataset).__name__}")
    spec = dataset.element_spec
    if not isinstance(spec, tuple) or len(spec) != 2:
        raise ValueError(f"The dataset's elements must be (image, label) pairs. Received: "
                         f"{spec!r:.200}")
    image, label = spec
    if decode is None and image.dtype == tf.string and image.shape.rank != 0:
        raise ValueError(f"The dataset's images are strings of shape {image.shape}: expected "
                         "one encoded file per example (an unbatched dataset: "
                         "dataset.unbatch()).")
    if decode is None and image.dtype != tf.string:
        _check_pixels_dtype(image.dtype, value_range, "The dataset's images")
        rank = image.shape.rank
        channels = image.shape[-1] if rank else None
        if (rank is not None and rank != 3) or channels not in (None, 1, 3):
            hint = " (a batched dataset: dataset.unbatch())" if rank == 4 else ""
            raise ValueError(f"The dataset's images have shape {image.shape}: expected one "
                             f"image [height, width, 3] (or 1, grey) per example{hint}.")
    if isinstance(label, dict) and "label" not in label:
        raise ValueError(f"The dataset's labels are a dict without 'label' (the class ids; "
                         f"'label_set' beside it for label sets). Received keys {sorted(label)}")
    label = label["label"] if isinstance(label, dict) else label
    ok = isinstance(label, tf.TensorSpec) and label.dtype.is_integer and label.shape in (
        tf.TensorShape([]), tf.TensorShape([1]))
    if not ok:
        hint = " (one-hot labels: tf.argmax(label))" if isinstance(label, tf.TensorSpec) and \
            label.shape.rank == 1 and (label.shape[0] or 0) > 1 else ""
        raise ValueError(f"The dataset's labels must be integer class ids, one per example"
                         f"{hint}. Received: {label!r:.200}")


def _check_pixels_dtype(dtype, value_range, what):
    """Refuses images of `dtype` that hold no pixels, or floats without their `value_range`
    ((0, 255) or (0, 1)); integers are [0, 255]."""
    if not (dtype.is_integer or dtype.is_floating):
        raise ValueError(f"{what} are {dtype.name}: expected integer or float pixels.")
    if dtype.is_floating and value_range is None:
        raise ValueError(f"{what} are {dtype.name}: say their range with value_range=(0, 255) "
                         "(as Keras' image_dataset_from_directory gives them) or "
                         "value_range=(0, 1). (Integer images are taken as [0, 255].)")


def _in_0_255(image, value_range):
    """`image` in [0, 255]: scaled from (0, 1) where that is its `value_range`."""
    if value_range is not None and tuple(value_range) == (0, 1) and image.dtype.is_floating:
        return tf.cast(image, tf.float32) * 255.0
    return image


def _checked_label(num_classes, image, label):
    """(image, label) once its class id lies in [0, num_classes): else reading fails with an
    InvalidArgumentError saying so."""
    value = label["label"] if isinstance(label, dict) else label
    check = tf.debugging.Assert(
        (value >= 0) & (tf.cast(value, tf.int64) < num_classes),
        ["from_tf_dataset: a label", value, f"outside [0, {num_classes}) (num_classes)"])
    with tf.control_dependencies([check]):
        return image, tf.nest.map_structure(tf.identity, label)


def from_tf_dataset(dataset, *, num_classes, image_size, batch_size, training, decode=None,
                    class_names=(), seed=0, start_epoch=0, augment=True, strategy=None,
                    data_config=None, value_range=None):
    """A pipeline over an unbatched `tf.data.Dataset` of `(image, label)` examples.

    The images are encoded files (scalar strings: JPEG, PNG, GIF, BMP, WebP) or `[H, W, C]`
    tensors of pixels: integers in [0, 255], or floats in their `value_range`; labels are
    integer scalars (or `[1]`, or a dict of label tensors, see the module docstring). A
    training split of at most `RANDOM_ACCESS_LIMIT` examples is held in memory (still
    encoded) and gets epoch-deterministic, resumable orders; larger ones (and decoded images
    of varying sizes) stream, as does every evaluation split.

    The arguments it shares with `from_arrays` mean the same as there.

    Args:
        dataset: `tf.data.Dataset` of `(image, label)`.
        num_classes: int. Labels lie in `[0, num_classes)`.
        decode: callable or None. A function from one raw image to an `[H, W, C]` tensor of
            pixels, or None: decode encoded images, pass decoded ones through.
        value_range: (0, 255) or (0, 1): the range of float pixels (the dataset's, or what
            `decode` returns), which float pixels must give. Defaults to None (integers).

    Returns:
        `InputData`.
    """
    num_classes = check_positive_int("num_classes", num_classes)
    check_value_range(value_range, allow_none=True)
    _check_examples(dataset, decode, value_range)
    image_spec, label_spec = dataset.element_spec
    if decode is None and image_spec.dtype == tf.string:
        decode = image_ops.decode_image
    elif decode is not None:  # the caller's decoder, to any channels, then the box
        decode = functools.partial(_decoded_window, decode, value_range)
    elif image_spec.dtype.is_floating and tuple(value_range) == (0, 1):
        dataset = dataset.map(lambda image, label: (_in_0_255(image, value_range), label))
    if not isinstance(label_spec, dict) and label_spec.shape.rank == 1:  # [1]: the class id
        dataset = dataset.map(lambda image, label: (image, label[0]))
    num_examples = int(dataset.cardinality())
    if num_examples == tf.data.INFINITE_CARDINALITY:
        raise ValueError("The dataset repeats forever: from_tf_dataset needs its examples once "
                         "(training pipelines repeat them). Expected the dataset without "
                         ".repeat().")
    if num_examples < 0:  # unknown cardinality: count once
        num_examples = int(dataset.reduce(0, lambda n, _: n + 1))
    if not num_examples:
        raise ValueError("The data holds no examples. Expected at least one image.")
    source = _Source(num_examples=num_examples, num_classes=num_classes, decode=decode,
                     class_names=_checked_names(class_names, num_classes))
    batchable = image_spec.dtype == tf.string or image_spec.shape.is_fully_defined()
    if training and batchable and num_examples <= RANDOM_ACCESS_LIMIT:
        # Hold the encoded images in memory: random access gives resumable epoch orders.
        images_t, labels_t = _in_memory(dataset, num_examples)
        ids = labels_t["label"] if isinstance(labels_t, dict) else labels_t
        check_labels(ids.numpy(), num_classes, "The dataset's labels")
        source.fetch = lambda i: (tf.gather(images_t, i),
                                  tf.nest.map_structure(lambda t: tf.gather(t, i), labels_t))
    else:  # each label checked as it is read
        source.stream = dataset.map(_as_written(functools.partial(_checked_label, num_classes)),
                                    num_parallel_calls=AUTOTUNE)
    return _pipeline(source, image_size, batch_size, training, seed, start_epoch,
                     _augment_args(augment) if training else None, strategy, data_config)


def _in_memory(dataset, num_examples):
    """Every example of `dataset` (N > 0) as one batch of tensors (`[N, ...]` each)."""
    return dataset.batch(num_examples).get_single_element()
