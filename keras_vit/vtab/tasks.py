"""The VTAB-1k tasks (Zhai et al. 2019): their groups, data sets, splits, label functions and
image conversions, as in the benchmark's reference code (google-research/task_adaptation), and
the input pipeline over one split of one task (see `keras_vit.vtab`)."""

import dataclasses

import tensorflow as tf

from keras_vit.data import pipelines
from keras_vit.data import tfds as data_tfds
from keras_vit import images as image_ops
from keras_vit.checks import check_choice
from keras_vit.preprocessing import paper_data_config

NATURAL, SPECIALIZED, STRUCTURED = "natural", "specialized", "structured"
GROUPS = (NATURAL, SPECIALIZED, STRUCTURED)
SPLITS = ("train800", "val200", "train800val200", "test")



# --------------------------------------------------------------------------------------------
# Label functions of the structured tasks (task_adaptation's, in TensorFlow).


def _bin_index(value, thresholds, num_classes):
    """The index of the bin `(thresholds[i], thresholds[i + 1]]` holding `value`: the number of
    thresholds strictly below it, minus one (a value equal to a threshold falls in the lower
    bin). Values outside the outer thresholds, which the real data do not have, go to the end
    bins."""
    below = tf.reduce_sum(tf.cast(tf.constant(thresholds, tf.float32) < value, tf.int64))
    return tf.clip_by_value(below - 1, 0, num_classes - 1)


# CLEVR: the distance to the closest object (the depth coordinate of `pixel_coords`), in 6 bins.
CLEVR_DISTANCE_THRESHOLDS = (0.0, 8.0, 8.5, 9.0, 9.5, 10.0, 100.0)
# CLEVR scenes hold 3 to 10 objects: count classes 0..7.
CLEVR_MIN_OBJECTS = 3
# KITTI: the depth (metres) of the closest vehicle (Car, Van, Truck: object types 0, 1, 2):
# up to 8 m, 8 to 20 m, beyond 20 m, and no vehicle at all (depth NO_VEHICLE_DEPTH).
KITTI_DISTANCE_THRESHOLDS = (-100.0, 8.0, 20.0, 999.0)
KITTI_VEHICLE_TYPES = 3
KITTI_NO_VEHICLE_DEPTH = 1000.0


def clevr_count(example):
    """Number of objects minus 3 (8 classes)."""
    return tf.cast(tf.size(example["objects"]["size"]), tf.int64) - CLEVR_MIN_OBJECTS


def clevr_distance(example):
    """The closest object's distance in 6 bins (`CLEVR_DISTANCE_THRESHOLDS`)."""
    distance = tf.reduce_min(example["objects"]["pixel_coords"][:, 2])
    return _bin_index(distance, CLEVR_DISTANCE_THRESHOLDS, 6)


def kitti_distance(example):
    """The closest vehicle's depth in 4 classes (`KITTI_DISTANCE_THRESHOLDS`)."""
    objects = example["objects"]
    vehicles = objects["type"] < KITTI_VEHICLE_TYPES
    depths = tf.boolean_mask(objects["location"][:, 2], vehicles)
    distance = tf.reduce_min(tf.concat([depths, [KITTI_NO_VEHICLE_DEPTH]], axis=0))
    return _bin_index(distance, KITTI_DISTANCE_THRESHOLDS, 4)


def _coarsened(feature, num_original, num_classes):
    """A class label of `num_original` values coarsened to `num_classes` equal bins
    (`floor(label / (num_original / num_classes))`, as task_adaptation's dSprites)."""
    factor = num_original / num_classes

    def label(example):
        return tf.cast(tf.math.floordiv(tf.cast(example[feature], tf.float32), factor),
                       tf.int64)

    label.__name__ = f"{feature}_in_{num_classes}"
    return label


def _dsprites_image(image):
    """dSprites images are 0/1 masks: white shapes on black (the grey channel is tiled to RGB
    by the pipeline)."""
    return tf.minimum(image, 1) * 255


# --------------------------------------------------------------------------------------------
# The tasks.


@dataclasses.dataclass(frozen=True)
class Task:
    """One VTAB-1k task.

    Attributes:
        name: str. The task's name here ("clevr_count").
        group: str. "natural", "specialized" or "structured".
        tfds_name: str. The tfds data set, with config and version where the benchmark fixes
            them ("kitti:3.1.0").
        num_classes: int.
        train: str. The tfds split of the 800 training examples.
        val: str. The tfds split of the 200 validation examples.
        test: str. The tfds split of the test examples.
        label: str or callable. The tfds feature holding the label, or a function from a tfds
            example (dict) to the label.
        image: callable or None. A function applied to each decoded uint8 image.
        flip: bool. Whether a horizontal flip keeps the label (augmentation).
        manual: str or None. For a data set tfds cannot download: what must be put in
            `manual_dir`.
    """

    name: str
    group: str
    tfds_name: str
    num_classes: int
    train: str
    val: str
    test: str
    label: object = "label"
    image: object = None
    flip: bool = True
    manual: str = None

    def split(self, name):
        """The tfds split string of "train800", "val200", "train800val200" or "test"."""
        check_choice("split", name, SPLITS)
        return {"train800": self.train, "val200": self.val,
                "train800val200": f"{self.train}+{self.val}", "test": self.test}[name]


def _tasks():
    natural = [
        # Data sets without a validation split: val200 is the start of the tail of the
        # training split the benchmark holds out (90%, 80% or 60% of it is kept for training).
        Task("caltech101", NATURAL, "caltech101:3.*.*", 102, "train[:800]", "train[2754:2954]",
             "test"),
        Task("cifar100", NATURAL, "cifar100:3.*.*", 100, "train[:800]", "train[45000:45200]",
             "test"),
        Task("dtd", NATURAL, "dtd:3.*.*", 47, "train[:800]", "validation[:200]", "test"),
        Task("oxford_flowers102", NATURAL, "oxford_flowers102:2.*.*", 102, "train[:800]",
             "validation[:200]", "test"),
        # task_adaptation reads version 3; tfds 4.9 offers only 4.0.0 (same images and splits).
        Task("oxford_iiit_pet", NATURAL, "oxford_iiit_pet:4.*.*", 37, "train[:800]",
             "train[2944:3144]", "test"),
        Task("sun397", NATURAL, "sun397/tfds:4.*.*", 397, "train[:800]", "validation[:200]",
             "test"),
        Task("svhn", NATURAL, "svhn_cropped:3.*.*", 10, "train[:800]", "train[65931:66131]",
             "test"),
    ]
    specialized = [
        Task("patch_camelyon", SPECIALIZED, "patch_camelyon:2.*.*", 2, "train[:800]",
             "validation[:200]", "test"),
        # EuroSAT and RESISC45 have one split: 60% train, 20% validation, 20% test.
        Task("eurosat", SPECIALIZED, "eurosat/rgb:2.*.*", 10, "train[:800]",
             "train[16200:16400]", "train[21600:]"),
        Task("resisc45", SPECIALIZED, "resisc45:3.*.*", 45, "train[:800]",
             "train[18900:19100]", "train[25200:]", manual="NWPU-RESISC45.rar"),
        Task("diabetic_retinopathy", SPECIALIZED,
             "diabetic_retinopathy_detection/btgraham-300:3.*.*", 5, "train[:800]",
             "validation[:200]", "test",
             manual="the Kaggle competition's train/test zip files and trainLabels.csv"),
    ]
    structured = [
        # CLEVR's test split is tfds' validation split (its test split has no labels).
        Task("clevr_count", STRUCTURED, "clevr:3.*.*", 8, "train[:800]", "train[63000:63200]",
             "validation", label=clevr_count, flip=False),
        Task("clevr_distance", STRUCTURED, "clevr:3.*.*", 6, "train[:800]",
             "train[63000:63200]", "validation", label=clevr_distance, flip=False),
        Task("dmlab", STRUCTURED, "dmlab:2.0.1", 6, "train[:800]", "validation[:200]", "test",
             flip=False),
        # dSprites has one split: 80% train, 10% validation, 10% test.
        Task("dsprites_location", STRUCTURED, "dsprites:2.*.*", 16, "train[:800]",
             "train[589824:590024]", "train[663552:]",
             label=_coarsened("label_x_position", 32, 16), image=_dsprites_image, flip=False),
        Task("dsprites_orientation", STRUCTURED, "dsprites:2.*.*", 16, "train[:800]",
             "train[589824:590024]", "train[663552:]",
             label=_coarsened("label_orientation", 40, 16), image=_dsprites_image,
             flip=False),
        # smallNORB: the first half of tfds' test split validates, the second tests.
        Task("smallnorb_azimuth", STRUCTURED, "smallnorb:2.*.*", 18, "train[:800]",
             "test[:200]", "test[50%:]", label="label_azimuth", flip=False),
        Task("smallnorb_elevation", STRUCTURED, "smallnorb:2.*.*", 9, "train[:800]",
             "test[:200]", "test[50%:]", label="label_elevation", flip=False),
        Task("kitti_distance", STRUCTURED, "kitti:3.1.0", 4, "train[:800]", "validation[:200]",
             "test", label=kitti_distance, flip=False),
    ]
    return {task.name: task for task in natural + specialized + structured}


TASKS = _tasks()


def get_tasks(names=None):
    """The tasks named, in the benchmark's order: task names and group names ("natural",
    "specialized", "structured", "all"), as a list or a comma-separated string. None: all.

    Raises:
        ValueError: for an unknown name (listing the known ones) or an empty selection.
    """
    if names is None:
        return list(TASKS.values())
    if isinstance(names, str):
        names = [name.strip() for name in names.split(",") if name.strip()]
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        raise ValueError(f"`tasks` must be task or group names: a list of str or a "
                         f"comma-separated str. Received: tasks={names!r}")
    chosen = set()
    for name in names:
        if name == "all":
            chosen.update(TASKS)
        elif name in GROUPS:
            chosen.update(t.name for t in TASKS.values() if t.group == name)
        elif name in TASKS:
            chosen.add(name)
        else:
            raise ValueError(f"Unknown VTAB task {name!r}. Expected task names ("
                             f"{', '.join(TASKS)}) or groups ({', '.join(GROUPS)}, all).")
    if not chosen:
        raise ValueError("No VTAB task chosen. Expected task or group names.")
    return [task for name, task in TASKS.items() if name in chosen]


# --------------------------------------------------------------------------------------------
# Data.


def task_data(task, split, *, image_size, batch_size, training, data_dir=None, manual_dir=None,
              download=True, seed=0, start_epoch=0, augment=True, strategy=None,
              data_config=None):
    """An input pipeline (`keras_vit.data.InputData`) over one split of a VTAB-1k task.

    Args:
        task: a `Task` or a task name.
        split: "train800", "val200", "train800val200" or "test".
        training: bool. A training pipeline (shuffled, repeated, augmented) or one pass.
        augment: bool. With training: flip horizontally where the task allows it (no crop).
        data_config: None or a model: VTAB's resize of the whole image to `image_size` (no
            crop, as the protocol has it), with the model's mean and std. None: the paper's.
        Other arguments as in `keras_vit.data.from_tfds`.
    """
    import tensorflow_datasets as tfds  # slow to import, and only the data need it


    task = TASKS[task] if isinstance(task, str) and task in TASKS else task
    if not isinstance(task, Task):
        get_tasks([task])  # raises, naming the known tasks
    _, prepare_kwargs = data_tfds.tfds_builder(task.tfds_name, data_dir, download,
                                                manual_dir=manual_dir, manual_files=task.manual)
    dataset = tfds.load(task.tfds_name, split=task.split(split), data_dir=data_dir,
                        download=download, shuffle_files=False,
                        decoders={"image": tfds.decode.SkipDecoding()},
                        download_and_prepare_kwargs=prepare_kwargs)
    label = task.label
    if isinstance(label, str):
        feature = label
        label = lambda example: example[feature]  # noqa: E731
    dataset = dataset.map(
        pipelines._as_written(lambda example: (example["image"],
                                              tf.cast(label(example), tf.int64))),
        num_parallel_calls=tf.data.AUTOTUNE)

    def decode(raw):
        image = image_ops.decode_image(raw)
        return task.image(image) if task.image is not None else image

    flip = bool(augment) and task.flip
    return pipelines.from_tf_dataset(
        dataset, num_classes=task.num_classes, image_size=image_size, batch_size=batch_size,
        training=training, decode=decode, seed=seed, start_epoch=start_epoch,
        augment=dict(crop=False, flip=flip) if augment else False, strategy=strategy,
        data_config=vtab_data_config(data_config, image_size))


def vtab_data_config(model, image_size):
    """VTAB's preprocessing at `image_size`: the paper's resize of the whole image (no crop),
    with the normalisation `model`'s weights expect (None: the paper's)."""
    config = paper_data_config(image_size)
    stated = getattr(model, "data_config", None)
    return config if stated is None else config.replace(mean=stated["mean"], std=stated["std"])


def check_data(tasks, data_dir=None, manual_dir=None, download=True):
    """Checks that every task's data set is prepared or can be (online, or downloaded by hand
    into `manual_dir`), without downloading anything.

    Raises:
        ValueError: naming the first data set that cannot be had, and what to do.
    """
    seen = set()
    for task in get_tasks([t.name if isinstance(t, Task) else t for t in tasks]):
        if task.tfds_name not in seen:
            seen.add(task.tfds_name)
            data_tfds.tfds_builder(task.tfds_name, data_dir, download, manual_dir=manual_dir,
                              manual_files=task.manual)
