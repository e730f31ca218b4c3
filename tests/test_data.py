"""tf.data pipelines: official preprocessing, epoch-deterministic order, sources, bad input."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

import keras_vit
from keras_vit import data


def numpy_bilinear(image, size):
    """Half-pixel-centre bilinear resize with edge clamping (TF's `resize`, antialias off)."""
    image = image.astype(np.float64)
    out_h, out_w = size
    in_h, in_w = image.shape[:2]

    def coords(out_n, in_n):
        c = (np.arange(out_n) + 0.5) * in_n / out_n - 0.5
        c = np.clip(c, 0, in_n - 1)
        lo = np.floor(c).astype(int)
        hi = np.minimum(lo + 1, in_n - 1)
        return lo, hi, c - lo

    r0, r1, fr = coords(out_h, in_h)
    c0, c1, fc = coords(out_w, in_w)
    top = image[r0][:, c0] * (1 - fc)[None, :, None] + image[r0][:, c1] * fc[None, :, None]
    bottom = image[r1][:, c0] * (1 - fc)[None, :, None] + image[r1][:, c1] * fc[None, :, None]
    return top * (1 - fr)[:, None, None] + bottom * fr[:, None, None]


def unbatch(dataset, batches):
    images, labels = [], []
    for x, y in dataset.take(batches):
        images.append(x.numpy())
        labels.append(y.numpy())
    return np.concatenate(images), np.concatenate(labels)


@pytest.fixture
def arrays():
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (10, 6, 6, 3), dtype=np.uint8)
    return images, np.arange(10) % 4


# ------------------------------------------------------------------------------------------
# Official preprocessing.


def test_eval_preprocessing_is_bilinear_resize_then_scaling():
    rng = np.random.default_rng(1)
    image = rng.integers(0, 256, (5, 7, 3), dtype=np.uint8)
    out = keras_vit.images.eval_preprocess(tf.constant(image), (10, 14)).numpy()
    expected = numpy_bilinear(image, (10, 14)) / 127.5 - 1
    np.testing.assert_allclose(out, expected, atol=1e-5)
    assert out.dtype == np.float32 and out.min() >= -1 and out.max() <= 1
    # Grey images become RGB with three equal channels.
    grey = keras_vit.images.eval_preprocess(tf.constant(image[..., :1]), (5, 7)).numpy()
    np.testing.assert_allclose(grey, np.repeat(image[..., :1] / 127.5 - 1, 3, -1), atol=1e-6)


def coordinate_image(n):
    """An n x n image whose red channel is the row and green channel the column (x8)."""
    rows, cols = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    return np.stack([rows * 8, cols * 8, np.zeros_like(rows)], -1).astype(np.uint8)


def test_inception_crop_covers_5_to_100_percent_and_keeps_aspect():
    n = 32
    image = tf.constant(coordinate_image(n))
    areas = []
    for i in range(40):
        out = data.preprocess_train(image, (n, n), tf.constant([i, 7]), flip=False).numpy()
        pixels = (out + 1) * 127.5 / 8  # back to row / column indices
        # Resizing a crop maps its corner pixels to the output corners (within one pixel).
        r0, c0 = pixels[0, 0, :2]
        r1, c1 = pixels[-1, -1, :2]
        height, width = r1 - r0 + 1, c1 - c0 + 1
        assert -1 <= r0 and r1 <= n and -1 <= c0 and c1 <= n
        areas.append(height * width / n**2)
        assert 3 / 4 - 0.35 <= width / height <= 4 / 3 + 0.35
    areas = np.array(areas)
    assert areas.min() >= 0.05 - 0.03 and areas.max() <= 1.0 + 0.07
    assert areas.min() < 0.4 and areas.max() > 0.7  # the whole range is used


def test_train_flip_and_determinism():
    image = tf.constant(coordinate_image(8))
    full = dict(area_range=(1.0, 1.0))  # the whole image: only the flip remains
    plain = keras_vit.images.eval_preprocess(image, (8, 8)).numpy()
    outs = [data.preprocess_train(image, (8, 8), tf.constant([s, 0]), **full).numpy()
            for s in range(16)]
    flipped = [np.allclose(o, plain[:, ::-1], atol=1e-6) for o in outs]
    same = [np.allclose(o, plain, atol=1e-6) for o in outs]
    assert all(f != s for f, s in zip(flipped, same)) and 0 < sum(flipped) < 16
    again = data.preprocess_train(image, (8, 8), tf.constant([3, 0])).numpy()
    np.testing.assert_array_equal(again, data.preprocess_train(image, (8, 8), tf.constant([3, 0])))


# ------------------------------------------------------------------------------------------
# Arrays: order, epochs, resumption.


def test_eval_pipeline_is_every_example_in_order(arrays):
    images, labels = arrays
    pipe = data.from_arrays(images, labels, image_size=6, batch_size=4, training=False)
    assert pipe.steps_per_epoch == 3 and pipe.num_classes == 4
    x, y = unbatch(pipe.dataset, 3)
    np.testing.assert_allclose(x, images / 127.5 - 1, atol=1e-6)
    np.testing.assert_array_equal(y, labels)


def identify(batch_images, images):
    """Index of each (unaugmented) output image among the inputs."""
    flat = (images.reshape(len(images), -1) / 127.5 - 1)
    return [int(np.argmin(np.abs(flat - b.reshape(-1)).sum(1))) for b in batch_images]


def test_training_epochs_are_permutations_and_resume_exactly(arrays):
    images, labels = arrays
    kw = dict(image_size=6, batch_size=4, training=True, augment=False, seed=5)
    pipe = data.from_arrays(images, labels, **kw)
    assert pipe.steps_per_epoch == 2  # 10 examples: two whole batches, 2 left out per epoch
    x, y = unbatch(pipe.dataset, 6)  # three epochs
    order = identify(x, images)
    np.testing.assert_array_equal(y, labels[order])
    epochs = [order[i:i + 8] for i in (0, 8, 16)]
    for epoch in epochs:
        assert len(set(epoch)) == 8  # no repeats within an epoch
    assert epochs[0] != epochs[1] and epochs[1] != epochs[2]
    resumed = data.from_arrays(images, labels, start_epoch=1, **kw)
    x1, _ = unbatch(resumed.dataset, 4)
    np.testing.assert_array_equal(x1, x[8:])
    other_seed = data.from_arrays(images, labels, **dict(kw, seed=6))
    assert identify(unbatch(other_seed.dataset, 2)[0], images) != epochs[0]


def test_augmented_stream_is_reproducible(arrays):
    images, labels = arrays
    kw = dict(image_size=4, batch_size=2, training=True, seed=1)
    a = unbatch(data.from_arrays(images, labels, **kw).dataset, 3)[0]
    b = unbatch(data.from_arrays(images, labels, **kw).dataset, 3)[0]
    np.testing.assert_array_equal(a, b)
    assert a.shape == (6, 4, 4, 3) and a.min() >= -1 and a.max() <= 1


def test_array_errors(arrays):
    images, labels = arrays
    kw = dict(image_size=6, batch_size=2, training=True)
    with pytest.raises(ValueError, match=r"Labels out of range: \[4\].*\[0, 4\)"):
        data.from_arrays(images, labels + (labels == 3), num_classes=4, **kw)
    with pytest.raises(ValueError, match=r"Labels out of range: \[-1\]"):
        data.from_arrays(images, labels - 1, num_classes=4, **kw)
    with pytest.raises(ValueError, match="one label per image"):
        data.from_arrays(images, labels[:5], **kw)
    with pytest.raises(ValueError, match=r"Received shape \(10, 6\)"):
        data.from_arrays(images[:, :, 0, 0], labels, **kw)
    with pytest.raises(ValueError, match="batch_size=0"):
        data.from_arrays(images, labels, **dict(kw, batch_size=0))
    with pytest.raises(ValueError, match="fewer than one batch of 16"):
        data.from_arrays(images, labels, **dict(kw, batch_size=16))
    with pytest.raises(ValueError, match="start_epoch=-1"):
        data.from_arrays(images, labels, start_epoch=-1, **kw)
    with pytest.raises(ValueError, match="augment"):
        data.from_arrays(images, labels, augment={"rotate": 1}, **kw)


# ------------------------------------------------------------------------------------------
# Image folders.


def write_png(path, image):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(tf.io.encode_png(image).numpy())


def test_image_folder(tmp_path):
    rng = np.random.default_rng(2)
    cat = rng.integers(0, 256, (2, 6, 6, 3), dtype=np.uint8)
    dog = rng.integers(0, 256, (6, 6, 1), dtype=np.uint8)  # grey PNG
    write_png(tmp_path / "cat" / "a.png", cat[0])
    write_png(tmp_path / "cat" / "nested" / "b.png", cat[1])
    write_png(tmp_path / "dog" / "c.png", dog)
    (tmp_path / "dog" / "notes.txt").write_text("not an image")
    (tmp_path / "empty").mkdir()
    pipe = data.from_folder(tmp_path, image_size=6, batch_size=3, training=False)
    assert pipe.class_names == ("cat", "dog") and pipe.num_examples == 3
    x, y = unbatch(pipe.dataset, 1)
    np.testing.assert_array_equal(y, [0, 0, 1])
    expected = np.concatenate([cat, np.repeat(dog, 3, -1)[None]]) / 127.5 - 1
    np.testing.assert_allclose(x, expected, atol=1e-6)
    train = data.from_folder(tmp_path, image_size=4, batch_size=2, training=True)
    assert next(iter(train.dataset))[0].shape == (2, 4, 4, 3)


def photo(rng, height, width):
    """A smooth uint8 RGB image with colour at several scales, as JPEG's chroma subsampling
    meets it in photographs."""
    coarse = rng.integers(0, 256, (height // 8, width // 8, 3)).astype(np.float32)
    image = tf.image.resize(coarse, (height, width), "bicubic") + rng.normal(0, 6, (height, width, 3))
    return np.clip(image.numpy(), 0, 255).astype(np.uint8)


def test_a_box_of_a_jpeg_decodes_alone_as_pil_decodes_it(tmp_path):
    """`decode_image(window=...)` decodes only the box's blocks of a JPEG: PIL's pixels inside
    the box; its outermost rows and columns differ where the colour changes across the box's
    edge (their chroma is upsampled without the neighbours outside); a PNG is the slice of the
    whole image. The checks before decoding still hold."""
    from PIL import Image

    image = photo(np.random.default_rng(4), 96, 120)
    Image.fromarray(image).save(tmp_path / "a.jpg", quality=90)  # 4:2:0 chroma
    Image.fromarray(image).save(tmp_path / "a.png")
    for name in ("a.jpg", "a.png"):
        whole = np.asarray(Image.open(tmp_path / name).convert("RGB")).astype(int)
        encoded = tf.constant((tmp_path / name).read_bytes())
        for top, left in ((0, 0), (13, 7), (40, 61)):
            def window(shape):  # the box's size from the image's shape [H, W, 3]
                return (tf.constant([top, left, 0]),
                        tf.stack([shape[0] // 2, shape[1] // 2 - 3, -1]))

            got = keras_vit.images.decode_image(encoded, window=window).numpy().astype(int)
            want = whole[top:top + 48, left:left + 57]
            assert got.shape == want.shape == (48, 57, 3)
            np.testing.assert_array_equal(got[1:-1, 1:-1], want[1:-1, 1:-1])
            border = np.abs(got - want).max(-1)
            assert border.max() <= (48 if name == "a.jpg" else 0) and border.mean() < 2
        with pytest.raises(tf.errors.InvalidArgumentError, match="above the limit of 100 "):
            keras_vit.images.decode_image(encoded, max_pixels=100, window=window)


def test_a_jpeg_folder_trains_on_the_boxes_of_its_png_twin(tmp_path):
    """Training from JPEGs decodes each inception crop's box alone; the same images as PNGs
    (PIL's decode of those JPEGs) are cropped after decoding. The boxes are the same: the
    batches differ only where the boxes' outermost pixels went. The same JPEGs as a
    `tf.data` dataset of encoded strings train on the same batches as the folder."""
    from PIL import Image

    rng = np.random.default_rng(5)
    for i in range(8):
        folder = tmp_path / "jpeg" / "ab"[i % 2]
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(photo(rng, 64 + 8 * i, 96)).save(folder / f"{i}.jpg", quality=90)
        twin = tmp_path / "png" / "ab"[i % 2] / f"{i}.png"
        twin.parent.mkdir(parents=True, exist_ok=True)
        Image.open(folder / f"{i}.jpg").convert("RGB").save(twin)
    batches = [unbatch(data.from_folder(tmp_path / kind, image_size=32, batch_size=4,
                                        training=True, seed=1).dataset, 4)[0]
               for kind in ("jpeg", "png")]
    difference = np.abs(batches[0] - batches[1])
    assert 0 < difference.max() < 0.1 and np.mean(difference > 1e-6) < 0.2, difference.max()
    paths = sorted((tmp_path / "jpeg").rglob("*.jpg"))
    encoded = tf.data.Dataset.from_tensor_slices(
        ([p.read_bytes() for p in paths], [int(p.parent.name == "b") for p in paths]))
    from_strings = data.from_tf_dataset(encoded, num_classes=2, image_size=32, batch_size=4,
                                        training=True, seed=1)
    np.testing.assert_array_equal(unbatch(from_strings.dataset, 4)[0], batches[0])


def test_image_folder_validation_split(tmp_path):
    rng = np.random.default_rng(3)
    for i in range(10):
        write_png(tmp_path / f"c{i % 2}" / f"{i}.png", rng.integers(0, 256, (4, 4, 3), np.uint8))
    kw = dict(image_size=4, batch_size=1, training=False, validation_split=0.3)
    val = data.from_folder(tmp_path, subset="validation", **kw)
    train = data.from_folder(tmp_path, subset="training", **kw)
    everything = data.from_folder(tmp_path, image_size=4, batch_size=1, training=False)
    assert (val.num_examples, train.num_examples) == (3, 7)
    assert train.class_names == val.class_names == ("c0", "c1")

    def images(pipe):
        return {x.tobytes() for x in unbatch(pipe.dataset, pipe.steps_per_epoch)[0]}

    assert not images(val) & images(train)
    assert images(val) | images(train) == images(everything)
    with pytest.raises(ValueError, match="subset=None"):
        data.from_folder(tmp_path, **kw)
    with pytest.raises(ValueError, match="validation_split"):
        data.from_folder(tmp_path, **dict(kw, validation_split=1.5), subset="training")


def test_image_folder_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        data.from_folder(tmp_path / "missing", image_size=4, batch_size=2, training=True)
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.txt").write_text("")
    with pytest.raises(ValueError, match=r"has no images.*found subfolders: \['a'\]"):
        data.from_folder(tmp_path, image_size=4, batch_size=2, training=True)


# ------------------------------------------------------------------------------------------
# tensorflow-datasets (mocked: nothing is downloaded).


def test_tfds_pipelines_with_mock_data():
    with tfds.testing.mock_data(num_examples=12):
        train = data.from_tfds("cifar10", "train", image_size=8, batch_size=4, seed=3)
        test = data.from_tfds("cifar10", "test", image_size=32, batch_size=5)
        raw = list(tfds.load("cifar10", split="test", as_supervised=True).as_numpy_iterator())
    assert (train.num_examples, train.num_classes, train.steps_per_epoch) == (12, 10, 3)
    assert train.training and not test.training
    x, y = unbatch(train.dataset, 3)
    assert x.shape == (12, 8, 8, 3) and x.min() >= -1 and x.max() <= 1
    assert y.dtype == np.int32 and y.min() >= 0 and y.max() < 10
    x, y = unbatch(test.dataset, test.steps_per_epoch)
    np.testing.assert_allclose(x, np.stack([im for im, _ in raw]) / 127.5 - 1, atol=1e-6)
    np.testing.assert_array_equal(y, [label for _, label in raw])


def test_tfds_errors():
    with pytest.raises(ValueError, match="Unknown dataset 'mnist'. Expected one of cifar10"):
        data.from_tfds("mnist", "train", image_size=8, batch_size=4)
    with tfds.testing.mock_data(num_examples=4):
        with pytest.raises(ValueError, match="manual_dir=None"):
            data.from_tfds("imagenet2012", "train", image_size=8, batch_size=2)
        pipe = data.from_tfds("imagenet2012", "validation", image_size=8, batch_size=2,
                              manual_dir="/nonexistent/but/mocked", training=False)
    assert pipe.num_classes == 1000


def test_from_tf_dataset_reads_pixels_as_their_range_says():
    """Float pixels say their range (Keras' image_dataset_from_directory gives [0, 255]),
    integers are [0, 255]; the same pixels give the same batches, however they come; a [1]
    label is the class id."""
    pixels = np.random.default_rng(0).integers(0, 256, (6, 10, 10, 3), np.uint8)
    labels = np.arange(6) % 3

    def batch(images, ids=labels, **kwargs):
        pipeline = data.from_tf_dataset(tf.data.Dataset.from_tensor_slices((images, ids)),
                                        num_classes=3, image_size=8, batch_size=6,
                                        training=False, **kwargs)
        x, y = next(iter(pipeline.dataset))
        return x.numpy(), y.numpy()

    want, ids = batch(pixels)
    assert ids.tolist() == labels.tolist()
    for images, value_range in ((pixels.astype(np.float32), (0, 255)),
                                (pixels.astype(np.float32) / 255, (0, 1)),
                                (pixels.astype(np.int32), None)):
        np.testing.assert_allclose(batch(images, value_range=value_range)[0], want, atol=1e-5)
    assert batch(pixels, labels[:, None])[1].tolist() == labels.tolist()
