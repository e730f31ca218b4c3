"""Image folders: scanning `directory/<class name>/**/<image>` (or unlabelled images), finding
the files that cannot be decoded, and the pipeline over a folder (`from_folder`)."""

import functools
import os
import sys
import unicodedata

import numpy as np
import tensorflow as tf

from keras_vit import images as image_ops
from keras_vit.checks import check_bool, check_int, check_number, check_positive_int
from keras_vit.data.pipelines import AUTOTUNE, _augment_args, _pipeline, _Source, _as_written

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp")


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

    dataset = tf.data.Dataset.range(len(paths)).map(_as_written(check),
                                                   num_parallel_calls=AUTOTUNE)
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
    if not isinstance(directory, (str, bytes, os.PathLike)):
        raise ValueError(f"`directory` must be a folder's path. Received: {directory!r:.80}")
    directory = os.fsdecode(directory)
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
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # bytes the file system's encoding could not decode
        raise ValueError(f"Class folder {folder!r}: its name is not valid UTF-8 (bytes "
                         f"{os.fsencode(name)!r:.80}), so it cannot be a class name. Expected a "
                         "folder name in UTF-8; rename it.") from None


def from_folder(directory, *, image_size, batch_size, training, seed=0, start_epoch=0,
                augment=True, strategy=None, validation_split=0.0, subset=None, split_seed=0,
                skip_corrupt=False, max_pixels=image_ops.DEFAULT_MAX_PIXELS,
                labels="inferred", data_config=None):
    """A pipeline over an image folder: `directory/<class name>/**/<image>`, or with
    `labels=None` any unlabelled images under `directory` (self-supervised pre-training).

    Classes are the subfolders that hold images, in sorted order (label i is the i-th name).
    JPEG, PNG, GIF, BMP and WebP files are read (`keras_vit.images.decode_image`); grey images
    become RGB. A file that cannot be decoded stops the pipeline; `find_corrupt_images` names
    such files, and `skip_corrupt=True` leaves them out (one decoding pass over the folder
    first; their number and names are printed and kept in `InputData.skipped`). In training a
    JPEG is decoded only under its random crop's box: a file that is complete but damaged
    elsewhere stops the pipeline only when a box reaches the damage (evaluation decodes
    whole files); `skip_corrupt=True` finds it before training.

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
    validation_split = check_number("validation_split", validation_split, 0, 1)
    if validation_split and subset not in ("training", "validation"):
        raise ValueError(f"`subset` must be 'training' or 'validation' with validation_split > "
                         f"0. Received: subset={subset!r:.80}")
    if not validation_split and subset is not None:  # else every image, the held-out ones too
        raise ValueError(f"`subset` {subset!r:.80} needs a `validation_split` > 0 to split the "
                         "folder. Expected subset=None, or a validation_split.")
    split_seed = check_int("split_seed", split_seed, 0)  # None: another split each call
    skip_corrupt = check_bool("skip_corrupt", skip_corrupt)
    max_pixels = check_positive_int("max_pixels", max_pixels, allow_none=True)
    paths, labels, class_names = list_image_folder(directory, labels)
    if validation_split:
        order = np.random.default_rng(split_seed).permutation(len(paths))
        count = max(1, round(validation_split * len(paths)))
        if subset == "training" and count >= len(paths):
            raise ValueError(f"validation_split={validation_split} holds out all {len(paths)} "
                             f"images of {directory!r}: the training subset would be empty. "
                             "Expected a smaller validation_split, or more images.")
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
        decode=functools.partial(image_ops.decode_image, max_pixels=max_pixels),
        class_names=class_names,
    )
    data = _pipeline(source, image_size, batch_size, training, seed, start_epoch,
                     _augment_args(augment) if training else None, strategy, data_config)
    data.skipped = skipped
    return data
