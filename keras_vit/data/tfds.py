"""The tensorflow-datasets data sets the paper uses: their registry (`DATASETS`), the pipeline
over one (`from_tfds`), and the builder check that refuses, before tfds would retry downloads
for minutes, a data set that is not prepared and cannot be (offline: the network probe;
a hand-made download without its files)."""

import dataclasses
import os
import socket

import tensorflow as tf

from keras_vit.data.pipelines import _as_written, from_tf_dataset


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
              manual_dir=None, download=True, seed=0, start_epoch=0, augment=True, strategy=None,
              data_config=None):
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
    if not isinstance(split, str) or not split.strip():
        raise ValueError(f"`split` must be a split's name, e.g. 'train', 'test' or "
                         f"'train[:10%]'. Received: split={split!r:.80}")
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
        dataset = dataset.map(_as_written(lambda example: (example["image"], dict(
            label=example[spec.label],
            label_set=_multi_hot(example[spec.label_set], label_feature.num_classes)))))
    return from_tf_dataset(dataset, num_classes=label_feature.num_classes,
                           image_size=image_size, batch_size=batch_size, training=training,
                           class_names=label_feature.names, seed=seed,
                           start_epoch=start_epoch, augment=augment, strategy=strategy,
                           data_config=data_config)


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
