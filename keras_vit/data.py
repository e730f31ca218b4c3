"""Input pipelines with `tf.data`: tensorflow-datasets by name, image folders, NumPy arrays.

Every pipeline yields `(images, labels)` batches: images float32 `[B, H, W, 3]` in [-1, 1],
labels int32 `[B]`. The preprocessing is the official one (vit_jax `input_pipeline.py`):

- train: inception crop (a random box covering 5% to 100% of the image, aspect ratio 3/4 to
  4/3), resize to the model resolution, random horizontal flip, `x / 127.5 - 1`;
- eval: plain resize to the model resolution (no centre crop), `x / 127.5 - 1`.

Training pipelines are *epoch-deterministic*: the order of epoch `e` and every random crop and
flip in it are stateless functions of `(seed, e, example index)`. A run resumed at epoch `e`
(see `keras_vit.training.resume_epoch`) therefore sees exactly the batches the uninterrupted
run would have seen. This holds for NumPy arrays, image folders and every tensorflow-datasets
split of at most `RANDOM_ACCESS_LIMIT` examples (held in memory still encoded); larger splits
(ImageNet) stream through a seeded shuffle buffer, deterministic from the start of a run but
reshuffled differently after a resume.

Data sets whose images have a *set* of correct labels (ImageNet-ReaL, see
`DatasetSpec.label_set`) are for evaluation only. Their labels are a dict: `label` int32 `[B]`
(the original single label) and `label_set` int32 `[B, num_classes]` (multi-hot: 1 at each
correct class, all zeros for an image whose set is empty).

Training pipelines repeat forever, one epoch after the other, with whole batches only (the
examples that do not fill the last batch of an epoch are left out of that epoch); pass
`steps_per_epoch=data.steps_per_epoch` to `model.fit`. Evaluation pipelines run once over
every example.

Batch sizes are global. Under a `tf.distribute` strategy with more than one replica, pass
`strategy=`: the training pipeline is then built per input pipeline with
`strategy.distribute_datasets_from_function`, each worker reading only its share of the
examples and batching per replica (`batch_size / num_replicas_in_sync`); every step still
covers the same global batch as on one device.
"""

import dataclasses
import math
import os
import socket
import sys
import unicodedata

import numpy as np
import tensorflow as tf

from keras_vit import images as image_ops
from keras_vit.checks import check_int, check_labels, check_replica_batch, to_pair

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
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp")
AUTOTUNE = tf.data.AUTOTUNE


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
    """A tensorflow-datasets dataset the paper fine-tunes on.

    Attributes:
        name: str. The tfds name.
        num_classes: int.
        splits: dict. Our split names ("train", "validation", "test") to tfds split strings;
            "validation" is the held-out slice of the training set the paper selects
            hyper-parameters on (2% for CIFAR, as vit_jax's `train[:98%]`).
        manual: bool. Whether tfds needs the files downloaded by hand (`manual_dir`).
        label: str. The tfds feature holding each image's class label. Defaults to "label".
        label_set: str or None. A tfds `Sequence(ClassLabel)` feature holding each image's set
            of correct labels (multi-label evaluation, as ImageNet-ReaL's `real_label`), or None.
            Such a data set is for evaluation only. Defaults to None.
    """

    name: str
    num_classes: int
    splits: dict
    manual: bool = False
    label: str = "label"
    label_set: str = None


DATASETS = {
    spec.name: spec
    for spec in (
        DatasetSpec("cifar10", 10, dict(train="train[:98%]", validation="train[98%:]", test="test")),
        DatasetSpec("cifar100", 100, dict(train="train[:98%]", validation="train[98%:]", test="test")),
        DatasetSpec("oxford_iiit_pet", 37, dict(train="train[:90%]", validation="train[90%:]", test="test")),
        DatasetSpec("oxford_flowers102", 102, dict(train="train", validation="validation", test="test")),
        DatasetSpec(
            "imagenet2012",
            1000,
            dict(train="train[:99%]", validation="train[99%:]", test="validation"),
            manual=True,
        ),
        # ImageNet validation images with the "Reassessed Labels" (Beyer et al. 2020), the
        # ImageNet-ReaL column of the paper's Table 2. Needs ILSVRC2012_img_val.tar by hand.
        DatasetSpec(
            "imagenet2012_real",
            1000,
            dict(test="validation"),
            manual=True,
            label="original_label",
            label_set="real_label",
        ),
    )
}


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

    def from_epoch(self, epoch):
        """The same pipeline starting at `epoch`: the batches an uninterrupted run sees from
        there (to resume a run). Evaluation pipelines do not depend on the epoch."""
        if not self.training or epoch == self.start_epoch or self.rebuild is None:
            return self
        return dataclasses.replace(self.rebuild(epoch), skipped=self.skipped)

    @property
    def steps_per_epoch(self):
        """Whole batches per epoch for training; all batches (the last partial) for eval."""
        if self.training:
            return self.num_examples // self.batch_size
        return math.ceil(self.num_examples / self.batch_size)


# --------------------------------------------------------------------------------------------
# Preprocessing.


def preprocess_train(image, image_size, seed, area_range=INCEPTION_AREA_RANGE, flip=True,
                     crop=True):
    """Official training preprocessing, stateless: inception crop, resize, flip, scale.

    Args:
        image: uint8 (or float in [0, 255]) tensor `[H, W, 3]` (or `[H, W, 1]`).
        image_size: (height, width).
        seed: int tensor of shape [2]. The same seed gives the same crop and flip.
        area_range: (min, max) fraction of the image the crop covers. Defaults to the
            official (0.05, 1.0).
        flip: bool. Random horizontal flip. Defaults to True.
        crop: bool. The inception crop; False resizes the whole image (for labels that depend
            on where things are, e.g. VTAB's structured tasks). Defaults to True.

    Returns:
        float32 `[height, width, 3]` in [-1, 1].
    """
    image = image_ops.to_rgb(image)
    crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    if crop:
        begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
            tf.shape(image),
            bounding_boxes=tf.zeros([0, 0, 4], tf.float32),
            seed=crop_seed,
            min_object_covered=0.0,
            aspect_ratio_range=INCEPTION_ASPECT_RATIO_RANGE,
            area_range=area_range,
            use_image_if_no_bounding_boxes=True,
        )
        image = tf.slice(image, begin, size)  # image = [h, w, 3], a random box
    image = image_ops.resize(image, image_size)  # image = [height, width, 3]
    if flip:
        image = tf.image.stateless_random_flip_left_right(image, flip_seed)
    return image_ops.scale(image)


# --------------------------------------------------------------------------------------------
# The one pipeline every source goes through.


@dataclasses.dataclass
class _Source:
    """Examples to feed: random access (`fetch(index)`) or a stream (`stream`)."""

    num_examples: int
    num_classes: int
    fetch: object = None  # index -> (raw image, label)
    stream: object = None  # unbatched tf.data.Dataset of (raw image, label)
    decode: object = None  # raw image -> uint8 [H, W, C]; None if already decoded
    class_names: tuple = ()

    def load(self, raw):
        return raw if self.decode is None else self.decode(raw)


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
                   shard):
    """The repeated, augmented training stream of one input pipeline, in `batch_size` batches.

    Each epoch takes the first `steps * global_batch` examples of its permutation; input
    pipeline `shard = (count, index)` keeps every count-th of them, so that the pipelines'
    per-replica batches of one step together hold the same examples as one global batch.
    """
    num_shards, shard_index = shard
    steps = source.num_examples // global_batch

    def prepare(epoch, index, raw, label):
        image = source.load(raw)
        example_seed = tf.stack([epoch * source.num_examples + index, tf.constant(seed, tf.int64)])
        if augment:
            image = preprocess_train(image, image_size, example_seed, **augment)
        else:
            image = image_ops.eval_preprocess(image, image_size)
        return image, _int32(label)

    if source.fetch is not None:
        epochs = tf.data.Dataset.range(start_epoch, np.iinfo(np.int64).max)
        pairs = epochs.flat_map(
            lambda e: _epoch_indices(e, source.num_examples, steps, global_batch, seed)
        )
        pairs = pairs.shard(num_shards, shard_index)
        examples = pairs.map(
            lambda e, i: prepare(e, i, *source.fetch(i)), num_parallel_calls=AUTOTUNE
        )
    else:
        stream = source.stream.shard(num_shards, shard_index)
        stream = stream.shuffle(
            min(STREAM_SHUFFLE_BUFFER, source.num_examples), seed=seed * 1_000_003 + start_epoch
        ).repeat()
        examples = stream.enumerate().map(
            lambda i, example: prepare(tf.constant(start_epoch, tf.int64), i, *example),
            num_parallel_calls=AUTOTUNE,
        )
    return examples.batch(batch_size, drop_remainder=True)


def _eval_dataset(source, image_size, batch_size):
    if source.fetch is not None:
        examples = tf.data.Dataset.range(source.num_examples).map(source.fetch)
    else:
        examples = source.stream
    examples = examples.map(
        lambda raw, label: (image_ops.eval_preprocess(source.load(raw), image_size), _int32(label)),
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


def _pipeline(source, image_size, batch_size, training, seed, start_epoch, augment, strategy):
    image_size = to_pair("image_size", image_size)
    num_replicas = strategy.num_replicas_in_sync if strategy is not None else 1
    _check_batch_size(batch_size, num_replicas, source.num_examples, training)
    start_epoch = check_int("start_epoch", start_epoch, 0)
    seed = check_int("seed", seed)
    if not training:
        dataset = _finish(_eval_dataset(source, image_size, batch_size))
    elif num_replicas == 1:
        dataset = _finish(
            _train_dataset(source, image_size, batch_size, batch_size, seed, start_epoch,
                           augment, (1, 0))
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
        rebuild=lambda epoch: _pipeline(source, image_size, batch_size, training, seed, epoch,
                                        augment, strategy),
    )


def _augment_args(augment):
    """`augment`: True (official), False (eval preprocessing), or a dict of overrides."""
    official = dict(area_range=INCEPTION_AREA_RANGE, flip=True, crop=True)
    if augment is True:
        return official
    if augment is False or augment is None:
        return None
    if isinstance(augment, dict) and set(augment) <= set(official):
        return dict(official, **augment)
    raise ValueError(
        f"`augment` must be True, False or a dict with keys 'area_range', 'flip' and/or "
        f"'crop'. Received: augment={augment!r}"
    )


def _decode(encoded):
    return image_ops.decode_image(encoded)


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
):
    """A pipeline over in-memory images.

    Args:
        images: array `[N, H, W, 3]`, `[N, H, W, 1]` or `[N, H, W]`, RGB or grey values:
            integers in [0, 255], or floats in the range `value_range` says.
        labels: int array `[N]`, or None for unlabelled images (self-supervised pre-training,
            `keras_vit.pretraining`): every label is then 0, of one class.
        num_classes: int or None. Labels must lie in `[0, num_classes)`. Defaults to
            `max(labels) + 1`.
        image_size: int or (height, width). The model resolution.
        batch_size: int. Global batch size.
        training: bool. Augmented, shuffled, repeated batches if True; one pass in order if
            False.
        seed: int. Seed of the shuffle and augmentation. Defaults to 0.
        start_epoch: int. First epoch of a training pipeline (to resume a run). Defaults to 0.
        augment: True for the official inception crop and flip, False for none, or a dict
            overriding `area_range`, `flip` or `crop` (False: resize the whole image).
            Defaults to True.
        strategy: `tf.distribute.Strategy` or None. See the module docstring.
        class_names: sequence of str. Label names. Defaults to none.
        value_range: (0, 255) or (0, 1): the range of the image values. Required for float
            images (a float array does not say whether 1.0 is white or nearly black);
            integer images are (0, 255). Values outside the range are refused.

    Returns:
        `InputData`.

    Raises:
        ValueError: for images that are not `[N, H, W(, C)]`, float images without
            `value_range` or outside it, a label count that differs from the image count, or
            labels outside `[0, num_classes)`.
    """
    images = np.asarray(images)
    labels = np.zeros(images.shape[:1], np.int32) if labels is None else np.asarray(labels)
    if images.ndim == 3:
        images = images[..., None]
    if images.ndim != 4 or images.shape[-1] not in (1, 3):
        raise ValueError(
            f"`images` must have shape [N, H, W, 3], [N, H, W, 1] or [N, H, W]. "
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
    num_classes = int(labels.max()) + 1 if num_classes is None and len(labels) else num_classes
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
                     _augment_args(augment) if training else None, strategy)


VALUE_RANGES = ((0, 255), (0, 1))


def to_0_255(images, value_range):
    """Images with values in [0, 255]: integer images as they are (checked), float images
    scaled from their declared `value_range`, (0, 255) or (0, 1), which float images must give.

    Raises:
        ValueError: for float images without `value_range` or outside it, integer images
            outside [0, 255], or another dtype.
    """
    if value_range is not None and tuple(value_range) not in VALUE_RANGES:
        raise ValueError(f"`value_range` must be (0, 255) or (0, 1). Received: {value_range!r}")
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
        least, most = images.min(), images.max()
        if not (np.isfinite(least) and np.isfinite(most)) or least < low or most > high:
            raise ValueError(f"`images` hold values from {least} to {most}, outside "
                             f"value_range ({low}, {high}).")
    if floating and high == 1:
        return images.astype(np.float32) * 255.0
    return images


def find_corrupt_images(paths, max_pixels=image_ops.DEFAULT_MAX_PIXELS):
    """The image files that cannot be decoded, with the reason: those that are not regular
    files (never read), then one decoding pass over the others (in parallel), then each
    failing file once more for its message.

    Returns:
        list of (path, reason).
    """
    irregular = {path: image_ops.not_regular_file(path) for path in paths}
    paths = [path for path in paths if not irregular[path]]
    if not paths:
        return [(path, reason) for path, reason in irregular.items() if reason]
    paths_t = tf.constant(paths)

    def check(index):
        image = image_ops.decode_image(tf.io.read_file(tf.gather(paths_t, index)), max_pixels)
        with tf.control_dependencies([tf.shape(image)]):
            return tf.identity(index)

    dataset = tf.data.Dataset.range(len(paths)).map(check, num_parallel_calls=AUTOTUNE)
    good = set(dataset.ignore_errors().as_numpy_iterator())
    bad = []
    for index in sorted(set(range(len(paths))) - good):
        try:
            image_ops.load_image(paths[index], (1, 1), max_pixels)
            reason = "cannot be read"
        except (ValueError, OSError) as e:
            reason = str(e).replace(f"Cannot read {paths[index]}: ", "")
        bad.append((paths[index], reason))
    bad += [(path, reason) for path, reason in irregular.items() if reason]
    return sorted(bad)


def list_image_folder(directory, labels="inferred"):
    """The images of a folder with one subfolder per class, like Keras' `image_dataset_from_directory`.

    Args:
        directory: str. The folder.
        labels: "inferred" (one subfolder per class) or None (unlabelled images, for
            self-supervised pre-training: every image anywhere under the folder, label 0).
            Defaults to "inferred".

    Returns:
        (paths, labels, class_names): the file paths, their class indices, and the sorted
        subfolder names (none for unlabelled images).

    Raises:
        FileNotFoundError: if `directory` does not exist.
        ValueError: if it holds no class subfolder with images (no image at all, unlabelled).
    """
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"Image folder {directory!r} does not exist or is not a directory.")
    if labels is None:
        paths = _images_under(directory)
        if not paths:
            raise ValueError(f"Image folder {directory!r} has no images. Expected "
                             f"{', '.join(IMAGE_EXTENSIONS)} files in it or its subfolders.")
        return paths, [0] * len(paths), []
    if labels != "inferred":
        raise ValueError(f"`labels` must be 'inferred' or None. Received: labels={labels!r}")
    classes = sorted(d for d in os.listdir(directory)
                     if not _hidden(d) and os.path.isdir(os.path.join(directory, d)))
    paths, labels, class_names = [], [], []
    for name in classes:
        files = _images_under(os.path.join(directory, name), by_folder_path=True)
        if files:
            check_class_name(name, os.path.join(directory, name))
            paths += files
            labels += [len(class_names)] * len(files)
            class_names.append(name)
    if not paths:
        raise ValueError(
            f"Image folder {directory!r} has no images. Expected one subfolder per class "
            f"holding {', '.join(IMAGE_EXTENSIONS)} files (found subfolders: {classes or 'none'})."
        )
    return paths, labels, class_names


def _hidden(name):
    """Hidden files and folders (`.ipynb_checkpoints`, `.DS_Store`) are neither classes nor
    images, as in Keras' `image_dataset_from_directory` and torchvision's `ImageFolder`."""
    return name.startswith(".")


def _images_under(folder, by_folder_path=False):
    """The image files under `folder` and its subfolders, hidden ones left out: each folder's
    files sorted by name, the folders in walking order (sorted names, depth first) or, with
    `by_folder_path`, sorted by their paths."""
    found = []
    for root, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not _hidden(d))
        found.append((root, [os.path.join(root, f) for f in sorted(names)
                             if not _hidden(f) and f.lower().endswith(IMAGE_EXTENSIONS)]))
    if by_folder_path:
        found.sort()
    return [path for _, files in found for path in files]


def check_class_name(name, folder):
    """Raises ValueError naming `folder` if its name `name` cannot be a class name: one that
    holds a control character (a newline, a tab) cannot be written one a line, as the exports'
    label files and `--class-names` files are."""
    if not name.strip() or any(unicodedata.category(c) == "Cc" for c in name):
        raise ValueError(f"Class folder {folder!r}: its name {name!r} cannot be a class name. "
                         "Expected a name of printable characters (no newline, tab or other "
                         "control character).")


def from_folder(directory, *, image_size, batch_size, training, seed=0, start_epoch=0,
                augment=True, strategy=None, validation_split=0.0, subset=None, split_seed=0,
                skip_corrupt=False, max_pixels=image_ops.DEFAULT_MAX_PIXELS,
                labels="inferred"):
    """A pipeline over an image folder: `directory/<class name>/**/<image>`, or with
    `labels=None` any unlabelled images under `directory` (self-supervised pre-training).

    Classes are the subfolders that hold images, in sorted order (label i is the i-th name).
    JPEG, PNG, GIF, BMP and WebP files are read (`keras_vit.images.decode_image`); grey images
    become RGB. A file that cannot be decoded stops the pipeline; `find_corrupt_images` names
    such files, and `skip_corrupt=True` leaves them out (one decoding pass over the folder
    first; their number and names are printed and kept in `InputData.skipped`).

    The arguments it shares with `from_arrays` mean the same as there.

    Args:
        validation_split: float in [0, 1). Hold out this fraction of the images (a seeded
            random choice, the same for both subsets). Defaults to 0.
        subset: "training" or "validation": which part to read when `validation_split` > 0.
        split_seed: int. Seed of the held-out choice. Defaults to 0.
        skip_corrupt: bool. Leave out files that cannot be decoded. Defaults to False.
        max_pixels: int or None. Images whose header declares more pixels cannot be decoded.
        labels: "inferred" (from the subfolders) or None (unlabelled: every image under
            `directory`, all of class 0, as `from_arrays(images, None)`). Defaults to
            "inferred".

    Raises:
        FileNotFoundError: if `directory` does not exist.
        ValueError: if it holds no images, or for a bad `validation_split` / `subset`.
    """
    unlabelled = labels is None
    paths, labels, class_names = list_image_folder(directory, labels)
    if not 0 <= validation_split < 1:
        raise ValueError(f"`validation_split` must be in [0, 1). Received: {validation_split!r}")
    if validation_split:
        if subset not in ("training", "validation"):
            raise ValueError(
                f"`subset` must be 'training' or 'validation' with validation_split > 0. "
                f"Received: subset={subset!r}"
            )
        order = np.random.default_rng(split_seed).permutation(len(paths))
        count = max(1, round(validation_split * len(paths)))
        keep = np.sort(order[:count] if subset == "validation" else order[count:])
        paths, labels = [paths[i] for i in keep], [labels[i] for i in keep]
    skipped = ()
    if not skip_corrupt:
        for path in paths:
            reason = image_ops.not_regular_file(path)
            if reason:
                raise ValueError(f"{path} {reason}. Expected image files; remove it, or pass "
                                 "skip_corrupt=True (--skip-corrupt) to leave it out.")
    else:
        skipped = tuple(find_corrupt_images(paths, max_pixels))
        bad = {path for path, _ in skipped}
        labels = [label for path, label in zip(paths, labels) if path not in bad]
        paths = [path for path in paths if path not in bad]
        if skipped:
            listed = "; ".join(f"{path} ({reason})" for path, reason in skipped[:10])
            print(f"from_folder: skipped {len(skipped)} of {len(paths) + len(skipped)} files "
                  f"that cannot be decoded: {listed}", file=sys.stderr)
        if not paths:
            raise ValueError(f"Image folder {directory!r}: none of its images can be decoded.")
    paths_t = tf.constant(paths)
    labels_t = tf.constant(labels, tf.int32)
    source = _Source(
        num_examples=len(paths),
        num_classes=1 if unlabelled else len(class_names),
        fetch=lambda i: (tf.io.read_file(tf.gather(paths_t, i)), tf.gather(labels_t, i)),
        decode=lambda encoded: image_ops.decode_image(encoded, max_pixels),
        class_names=class_names,
    )
    data = _pipeline(source, image_size, batch_size, training, seed, start_epoch,
                     _augment_args(augment) if training else None, strategy)
    data.skipped = skipped
    return data


def get_dataset_spec(name):
    """The `DatasetSpec` of a known tensorflow-datasets name.

    Raises:
        ValueError: for an unknown name, listing the known ones.
    """
    if name not in DATASETS:
        raise ValueError(
            f"Unknown dataset {name!r}. Expected one of {', '.join(DATASETS)}, or an image "
            "folder (see `from_folder`)."
        )
    return DATASETS[name]


def from_tfds(name, split, *, image_size, batch_size, training=None, data_dir=None,
              manual_dir=None, download=True, seed=0, start_epoch=0, augment=True, strategy=None):
    """A pipeline over a tensorflow-datasets dataset the paper uses.

    The arguments it shares with `from_arrays` mean the same as there.

    Args:
        name: str. One of `DATASETS`: cifar10, cifar100, oxford_iiit_pet, oxford_flowers102,
            imagenet2012, imagenet2012_real (evaluation only: its labels are a dict with the
            `label_set` of each image, see the module docstring).
        split: str. "train", "validation" or "test" (mapped through `DatasetSpec.splits`), or
            any tfds split string such as "train[:10%]".
        training: bool or None. Defaults to `split == "train"`.
        data_dir: str or None. Where tfds keeps prepared datasets.
        manual_dir: str or None. Where the hand-downloaded files are (imagenet2012 needs the
            ILSVRC2012 tars there, imagenet2012_real ILSVRC2012_img_val.tar).
        download: bool. Let tfds download and prepare the dataset if it is missing.

    Raises:
        ValueError: for an unknown dataset name, imagenet2012 without `manual_dir` when it
            still has to be prepared, or a data set with label sets and `training=True`.
    """
    import tensorflow_datasets as tfds  # slow to import, and only tfds data sets need it

    spec = get_dataset_spec(name)
    tfds_split = spec.splits.get(split, split)
    training = split == "train" if training is None else training
    if training and spec.label_set:
        raise ValueError(
            f"{name} is an evaluation set (each image has a set of correct labels, "
            f"{spec.label_set!r}); it cannot be a training pipeline. Expected training=False.")
    builder, prepare_kwargs = tfds_builder(
        name, data_dir, download, manual_dir=manual_dir,
        manual_files="the ILSVRC2012 tar files" if spec.manual else None)
    dataset = tfds.load(
        name,
        split=tfds_split,
        data_dir=data_dir,
        download=download,
        as_supervised=spec.label_set is None,
        shuffle_files=False,
        decoders={"image": tfds.decode.SkipDecoding()},
        download_and_prepare_kwargs=prepare_kwargs,
    )
    label_feature = builder.info.features[spec.label]
    if spec.label_set:
        dataset = dataset.map(lambda example: (example["image"], dict(
            label=example[spec.label],
            label_set=_multi_hot(example[spec.label_set], label_feature.num_classes))))
    return from_tf_dataset(dataset, num_classes=label_feature.num_classes,
                           image_size=image_size, batch_size=batch_size, training=training,
                           class_names=label_feature.names, seed=seed,
                           start_epoch=start_epoch, augment=augment, strategy=strategy)


def from_tf_dataset(dataset, *, num_classes, image_size, batch_size, training, decode=None,
                    class_names=(), seed=0, start_epoch=0, augment=True, strategy=None):
    """A pipeline over an unbatched `tf.data.Dataset` of `(image, label)` examples.

    The images are encoded files (scalar strings: JPEG, PNG, GIF, BMP, WebP) or uint8
    `[H, W, C]` tensors; labels are int scalars (or a dict of label tensors, see the module
    docstring). A training split of at most `RANDOM_ACCESS_LIMIT` examples is held in memory
    (still encoded) and gets epoch-deterministic, resumable orders; larger ones (and decoded
    images of varying sizes) stream, as does every evaluation split.

    The arguments it shares with `from_arrays` mean the same as there.

    Args:
        dataset: `tf.data.Dataset` of `(image, label)`.
        num_classes: int. Labels lie in `[0, num_classes)`.
        decode: a function from one raw image to a uint8 `[H, W, C]` tensor, or None: decode
            encoded images, pass decoded ones through.

    Returns:
        `InputData`.
    """
    image_spec = dataset.element_spec[0]
    if decode is None and image_spec.dtype == tf.string:
        decode = _decode
    num_examples = int(dataset.cardinality())
    if num_examples < 0:  # unknown cardinality: count once
        num_examples = int(dataset.reduce(0, lambda n, _: n + 1))
    source = _Source(num_examples=num_examples, num_classes=num_classes, decode=decode,
                     class_names=tuple(class_names))
    batchable = image_spec.dtype == tf.string or image_spec.shape.is_fully_defined()
    if training and batchable and num_examples <= RANDOM_ACCESS_LIMIT:
        # Hold the encoded images in memory: random access gives resumable epoch orders.
        images_t, labels_t = _in_memory(dataset, num_examples)
        source.fetch = lambda i: (tf.gather(images_t, i),
                                  tf.nest.map_structure(lambda t: tf.gather(t, i), labels_t))
    else:
        source.stream = dataset
    return _pipeline(source, image_size, batch_size, training, seed, start_epoch,
                     _augment_args(augment) if training else None, strategy)


def tfds_builder(name, data_dir, download, manual_dir=None, manual_files=None):
    """The tfds builder of `name`, checked before tfds would retry downloads for minutes.

    Args:
        name: str. A tfds name, with config and version if any ("kitti:3.1.0").
        data_dir, download, manual_dir: as `from_tfds`.
        manual_files: str or None. For a data set downloaded by hand, what the user must put
            in `manual_dir` (named in the error).

    Returns:
        (builder, the `download_and_prepare_kwargs` for `tfds.load`, or None).

    Raises:
        ValueError: if the data set is not prepared and cannot be: offline, or a hand-made
            download without `manual_dir`.
    """
    import tensorflow_datasets as tfds  # slow to import, and only tfds data sets need it

    builder = tfds.builder(name, data_dir=data_dir)
    if not download or _is_prepared(builder):
        return builder, None
    if manual_files is None:
        if _downloads_for_real(builder) and not _online():
            raise ValueError(
                f"{name} is not prepared in {builder.data_dir}, and this machine cannot reach "
                f"the internet to download it. Prepare it where there is internet access "
                f"(`tfds build {_build_name(builder)} --data_dir DIR`) and pass that folder as "
                "data_dir "
                "(--data-dir).")
        return builder, None
    if manual_dir is None:
        raise ValueError(
            f"{name} must be downloaded by hand: pass manual_dir=<folder with {manual_files}> "
            "(received manual_dir=None), or a data_dir where it is already prepared.")
    folder = os.path.expanduser(os.fspath(manual_dir))
    if _downloads_for_real(builder) and (not os.path.isdir(folder) or not os.listdir(folder)):
        state = "is empty" if os.path.isdir(folder) else "does not exist or is not a folder"
        raise ValueError(f"manual_dir {os.fspath(manual_dir)!r} (--manual-dir) {state}. Expected "
                         f"the folder holding {name}'s hand-downloaded files: {manual_files}.")
    return builder, dict(download_config=tfds.download.DownloadConfig(manual_dir=folder))


def _build_name(builder):
    """The `tfds build` argument of a builder: name, config and exact version."""
    config = f"/{builder.builder_config.name}" if builder.builder_config else ""
    return f"{builder.name}{config}:{builder.version}"


def _multi_hot(class_ids, num_classes):
    """A set of class ids `[L]` (possibly empty, repeats allowed) as a bool `[num_classes]`."""
    return tf.reduce_sum(tf.one_hot(class_ids, num_classes, dtype=tf.int32), axis=0) > 0


def _in_memory(dataset, num_examples):
    """Every example of `dataset` as one batch of tensors (`[N, ...]` each, N may be 0)."""
    if not num_examples:
        return tf.nest.map_structure(lambda spec: tf.zeros([0, *spec.shape], spec.dtype),
                                     dataset.element_spec)
    return dataset.batch(num_examples).get_single_element()


# tensorflow-datasets downloads through Google's servers (GCS) and the data sets' own hosts.
CONNECTIVITY_PROBE = ("storage.googleapis.com", 443)
CONNECTIVITY_TIMEOUT = 3.0


def _online():
    """Whether the internet answers within a few seconds (offline, tfds would retry for
    minutes before failing)."""
    try:
        socket.create_connection(CONNECTIVITY_PROBE, timeout=CONNECTIVITY_TIMEOUT).close()
    except OSError:
        return False
    return True


def _downloads_for_real(builder):
    """False under `tfds.testing.mock_data`, whose `download_and_prepare` does nothing."""
    return type(builder).download_and_prepare.__module__.startswith("tensorflow_datasets.core")


def _is_prepared(builder):
    try:
        return bool(builder.info.splits)
    except Exception:  # noqa: BLE001 - tfds raises various errors for missing metadata
        return False
