"""Input pipelines with `tf.data`: tensorflow-datasets by name, image folders, NumPy arrays.

Every pipeline yields `(images, labels)` batches: images float32 `[B, H, W, 3]`, labels int32
`[B]`. The preprocessing is the official one (vit_jax `input_pipeline.py`):

- train: inception crop (a random box covering 5% to 100% of the image, aspect ratio 3/4 to
  4/3), resize to the model resolution, random horizontal flip, `x / 127.5 - 1`; a JPEG's
  box is decoded alone, as big_vision's `decode_jpeg_and_inception_crop` does
  (`keras_vit.images.decode_image(window=...)`);
- eval: plain resize to the model resolution (no centre crop), `x / 127.5 - 1`.

With `data_config=model` (see `keras_vit.resolve_data_config`) a pipeline normalises with that
checkpoint's own mean and std, `(x / 255 - mean) / std`, after the same augmentation (as timm
fine-tunes), and an evaluation pipeline also resizes and crops as the checkpoint says. The
pipeline records what it applied (`InputData.data_config`); `keras_vit.training.fit` builds
one made without a data config again with its model's (`InputData.for_model`) and refuses one
built with another.

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

The package, one module per job:

- `keras_vit.data.pipelines`: the pipeline itself (`InputData`, `preprocess_train`), and its
  in-memory sources `from_arrays` and `from_tf_dataset`;
- `keras_vit.data.folders`: image folders (`from_folder`, `list_image_folder`,
  `find_corrupt_images`);
- `keras_vit.data.tfds`: the tensorflow-datasets registry (`DATASETS`, `DatasetSpec`),
  `from_tfds` and the check that a data set is prepared or can be (`tfds_builder`).

Every public name of those modules is importable from `keras_vit.data` itself.
"""

from keras_vit.data.folders import (
    IMAGE_EXTENSIONS,
    check_class_name,
    find_corrupt_images,
    from_folder,
    list_image_folder,
)
from keras_vit.data.pipelines import (
    AUTOTUNE,
    INCEPTION_AREA_RANGE,
    INCEPTION_ASPECT_RATIO_RANGE,
    RANDOM_ACCESS_LIMIT,
    STREAM_SHUFFLE_BUFFER,
    InputData,
    from_arrays,
    from_tf_dataset,
    preprocess_train,
    to_0_255,
)
from keras_vit.data.tfds import (
    CONNECTIVITY_PROBE,
    CONNECTIVITY_TIMEOUT,
    DATASETS,
    DatasetSpec,
    from_tfds,
    get_dataset_spec,
    tfds_builder,
)
from keras_vit.preprocessing import VALUE_RANGES  # of the float pixels pipelines take

__all__ = [
    "AUTOTUNE",
    "CONNECTIVITY_PROBE",
    "CONNECTIVITY_TIMEOUT",
    "DATASETS",
    "DatasetSpec",
    "IMAGE_EXTENSIONS",
    "INCEPTION_AREA_RANGE",
    "INCEPTION_ASPECT_RATIO_RANGE",
    "InputData",
    "RANDOM_ACCESS_LIMIT",
    "STREAM_SHUFFLE_BUFFER",
    "VALUE_RANGES",
    "check_class_name",
    "find_corrupt_images",
    "from_arrays",
    "from_folder",
    "from_tf_dataset",
    "from_tfds",
    "get_dataset_spec",
    "list_image_folder",
    "preprocess_train",
    "tfds_builder",
    "to_0_255",
]
