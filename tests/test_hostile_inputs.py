"""Hostile images, data folders and model arguments (issue "Reliability IV"): each is refused
with one line naming the file, folder or argument, or handled as documented, and no input file
is changed. The image readers are also fuzzed: real files mutated by hypothesis decode to an
RGB image or fail with one ValueError naming the file."""

import hashlib
import io
import json
import os
import pathlib
import struct

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

import keras_vit
import keras_vit_cli as cli
from keras_vit import data, images

TINY = dict(image_size=16, patch_size=8, hidden_size=8, num_layers=1, num_heads=2, mlp_dim=8,
            num_classes=3)


def encoded(fmt, size=(12, 10), seed=0, **save):
    """The bytes of a random RGB image of `size` (height, width) written by Pillow."""
    pixels = np.random.default_rng(seed).integers(0, 256, (*size, 3), np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, fmt, **save)
    return buffer.getvalue()


def write(path, content):
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return path


def class_folder(root, classes=("cat", "dog"), per_class=2):
    for name in classes:
        for i in range(per_class):
            write(root / name / f"{i}.png", encoded("PNG", seed=i))
    return root


def digest(root):
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(pathlib.Path(root).rglob("*")) if p.is_file()}


def os2_bmp(height, width):
    """An OS/2 BMP (12-byte BITMAPCOREHEADER, 16-bit sides), 24 bits a pixel, all grey."""
    row = bytes([128] * (3 * width))
    row += b"\0" * (-len(row) % 4)
    offset = 14 + 12
    header = struct.pack("<IHHHH", 12, width, height, 1, 24)
    return (b"BM" + struct.pack("<IHHI", offset + len(row) * height, 0, 0, offset) + header
            + row * height)


# --------------------------------------------------------------------------------------------
# Item 5: an empty batch.


def test_an_empty_batch_gives_no_rows_of_logits():
    model = keras_vit.ViT(**TINY)
    assert tuple(model(np.zeros((0, 16, 16, 3), np.float32)).shape) == (0, 3)
    x = np.random.default_rng(0).uniform(-1, 1, (2, 16, 16, 3)).astype(np.float32)
    assert model(x).shape == (2, 3)


def test_an_empty_batch_of_a_model_of_any_size():
    model = keras_vit.ViT(**TINY, dynamic_image_size=True)
    assert tuple(model(np.zeros((0, 24, 16, 3), np.float32)).shape) == (0, 3)


def test_the_exported_signatures_take_an_empty_batch(tmp_path):
    from keras_vit import export

    model = keras_vit.ViT(**TINY)
    path = export.export_saved_model(model, tmp_path / "vit", warmup=False)
    loaded = tf.saved_model.load(path)
    out = loaded.signatures["predict_images"](images=tf.zeros((0, 16, 16, 3), tf.float32))
    assert tuple(out["probabilities"].shape) == (0, 3)
    out = loaded.signatures["serving_default"](image_bytes=tf.constant([], tf.string))
    assert tuple(out["probabilities"].shape) == (0, 3)
    one = loaded.signatures["serving_default"](image_bytes=tf.constant([encoded("PNG")]))
    assert tuple(one["probabilities"].shape) == (1, 3)


# --------------------------------------------------------------------------------------------
# Item 17: OS/2 BMP and animated WebP.


def test_an_os2_bmp_is_refused_by_name_before_its_size_is_read(tmp_path):
    content = os2_bmp(4, 6)
    with pytest.raises(ValueError, match="OS/2 BMP"):  # whatever the size its header gives
        images.check_encoded(content, max_pixels=1)
    path = write(tmp_path / "os2.bmp", content)
    with pytest.raises(ValueError, match=r"os2\.bmp is an OS/2 BMP image") as info:
        keras_vit.load_image(path, 4)
    assert "\n" not in str(info.value) and path.read_bytes() == content
    # A Windows BMP still reads.
    assert keras_vit.load_image(write(tmp_path / "win.bmp", encoded("BMP")), 4).shape == (4, 4, 3)


def bitfields_bmp(pixels, masks):
    """A 32-bit BMP (BITMAPV4HEADER, BI_BITFIELDS) of RGB `pixels` stored as `masks` say:
    (red, green, blue) masks of a little-endian 32-bit pixel, alpha in the top byte."""
    height, width, _ = pixels.shape
    order = [int(np.log2(mask)) // 8 for mask in masks]  # the byte of each channel
    stored = np.zeros((height, width, 4), np.uint8)
    stored[..., order], stored[..., 3] = pixels, 255
    rows = b"".join(stored[i].tobytes() for i in range(height - 1, -1, -1))  # bottom-up
    header = struct.pack("<IiiHHIIiiII", 108, width, height, 1, 32, 3, len(rows), 2835, 2835,
                         0, 0) + struct.pack("<IIII", *masks, 0xFF000000) + b"BGRs" + b"\0" * 48
    start = 14 + len(header)
    return b"BM" + struct.pack("<IHHI", start + len(rows), 0, 0, start) + header + rows


def offset_frame_gif(pixels, screen, offset):
    """A GIF whose one frame (`pixels`) lies at `offset` (x, y) of a larger `screen` (w, h)."""
    buffer = io.BytesIO()
    Image.fromarray(pixels).quantize(64).save(buffer, "GIF")
    data = bytearray(buffer.getvalue())
    height, width, _ = pixels.shape
    struct.pack_into("<HH", data, 6, *screen)  # the logical screen
    descriptor = data.index(b"\x2c\0\0\0\0" + struct.pack("<HH", width, height))
    struct.pack_into("<HH", data, descriptor + 1, *offset)
    return bytes(data)


def encoded_as(image, fmt):
    """The file Pillow writes of `image` (an array, or a Pillow image: a palette's) in `fmt`."""
    buffer = io.BytesIO()
    (image if isinstance(image, Image.Image) else Image.fromarray(image)).save(buffer, fmt)
    return buffer.getvalue()


PHOTO = np.random.default_rng(5).integers(0, 256, (13, 17, 3), np.uint8)
BGR = (0x00FF0000, 0x0000FF00, 0x000000FF)


@pytest.mark.parametrize("name, content, refusal", [
    ("rgb.bmp", lambda: encoded_as(PHOTO, "BMP"), None),
    ("grey.bmp", lambda: encoded_as(PHOTO[..., 0], "BMP"), None),
    ("bgr_masks.bmp", lambda: bitfields_bmp(PHOTO, BGR), None),
    ("palette.bmp", lambda: encoded_as(Image.fromarray(PHOTO).quantize(16), "BMP"),
     "a colour palette"),
    ("bits1.bmp", lambda: encoded_as(PHOTO[..., 0] > 128, "BMP"), "1, 4 or 16 bits a pixel"),
    ("rgb_masks.bmp", lambda: bitfields_bmp(PHOTO, BGR[::-1]), "channel masks other than"),
    ("offset.gif", lambda: offset_frame_gif(PHOTO, (40, 30), (10, 5)),
     "first frame does not cover its screen"),
    ("small_screen.gif", lambda: offset_frame_gif(PHOTO, (9, 7), (0, 0)), None),  # the frame's
])
def test_images_tensorflow_reads_wrongly_are_refused_and_the_rest_read_as_pillow(
        tmp_path, name, content, refusal):
    """Pillow's `convert("RGB")` is timm's loader: keras_vit reads a file's pixels as it does,
    or refuses the file by name, never reads other pixels (a palette index as a grey level,
    red and blue swapped, a frame smaller than its GIF)."""
    path = write(tmp_path / name, content())
    want = np.asarray(Image.open(path).convert("RGB"))
    if refusal is None:
        got = np.asarray(keras_vit.load_image(path, size=want.shape[:2]))  # no resampling
        np.testing.assert_array_equal(got, want)
        return
    with pytest.raises(ValueError, match=f"{name} is a .*{refusal}") as info:
        keras_vit.load_image(path, 8)
    assert "\n" not in str(info.value)


def animated_webp():
    frames = [Image.fromarray(np.full((8, 8, 3), c, np.uint8)) for c in (0, 255)]
    buffer = io.BytesIO()
    frames[0].save(buffer, "WEBP", save_all=True, append_images=frames[1:], duration=100, loop=0)
    return buffer.getvalue()


def test_an_animated_webp_is_refused_naming_the_file(tmp_path):
    path = write(tmp_path / "anim.webp", animated_webp())
    with pytest.raises(ValueError, match=r"anim\.webp is an animated WebP image; animated "
                                         r"images are not supported"):
        keras_vit.load_image(path, 4)
    still = write(tmp_path / "still.webp", encoded("WEBP", lossless=True))
    assert keras_vit.load_image(still, 4).shape == (4, 4, 3)


@pytest.mark.parametrize("fmt, mode, save", [
    ("WEBP", "RGBA", dict(lossless=True)), ("WEBP", "RGBA", dict(quality=80)),
    ("PNG", "RGBA", {}), ("PNG", "LA", {})])
def test_an_image_with_alpha_reads_as_pillow_converts_it_to_rgb(tmp_path, fmt, mode, save):
    pixels = np.random.default_rng(3).integers(0, 256, (9, 11, 4), np.uint8)
    pixels[..., 3] = np.where(pixels[..., 3] > 128, 255, 0)  # opaque and transparent pixels
    image = Image.fromarray(pixels, "RGBA").convert(mode)
    path = tmp_path / f"alpha.{fmt.lower()}"
    image.save(path, fmt, **save)
    want = np.asarray(Image.open(path).convert("RGB"), np.float32)
    got = np.asarray(keras_vit.load_image(path, size=(9, 11)))  # the same size: no resampling
    lossy = save.get("quality") is not None  # two libwebp builds may round differently
    np.testing.assert_allclose(got, want, atol=2 if lossy else 0)


def test_the_folder_pipeline_names_the_images_it_cannot_read_right(tmp_path):
    root = class_folder(tmp_path / "images")
    write(root / "cat" / "anim.webp", animated_webp())
    write(root / "dog" / "os2.bmp", os2_bmp(4, 4))
    write(root / "dog" / "palette.bmp", encoded_as(Image.fromarray(PHOTO).quantize(16), "BMP"))
    write(root / "dog" / "offset.gif", offset_frame_gif(PHOTO, (40, 30), (10, 5)))
    bad = dict(data.find_corrupt_images(data.list_image_folder(root)[0]))
    assert sorted(pathlib.Path(p).name for p in bad) == ["anim.webp", "offset.gif", "os2.bmp",
                                                         "palette.bmp"]
    assert all(any(word in r for word in ("animated", "OS/2", "colour palette", "first frame"))
               for r in bad.values())


# --------------------------------------------------------------------------------------------
# Item 24: a truncated JPEG prints nothing from libjpeg.


def test_a_truncated_jpeg_is_refused_without_libjpeg_lines_on_stderr(tmp_path, capfd):
    content = encoded("JPEG", size=(32, 32))
    path = write(tmp_path / "cut.jpg", content[: len(content) // 2])
    capfd.readouterr()
    with pytest.raises(ValueError, match=r"cut\.jpg is not a readable JPEG image \(truncated"):
        keras_vit.load_image(path, 4)
    assert data.find_corrupt_images([str(path)])[0][0] == str(path)
    err = capfd.readouterr().err
    assert "JPEG" not in err and "Corrupt" not in err, err


def test_a_jpeg_with_bytes_after_its_end_marker_and_a_progressive_one_still_read(tmp_path):
    content = encoded("JPEG", size=(32, 32))
    assert keras_vit.load_image(write(tmp_path / "tail.jpg", content + b"trailing"), 4).shape \
        == (4, 4, 3)
    progressive = encoded("JPEG", size=(32, 32), progressive=True)
    assert keras_vit.load_image(write(tmp_path / "p.jpg", progressive), 4).shape == (4, 4, 3)
    cut = write(tmp_path / "p_cut.jpg", progressive[: len(progressive) * 3 // 4])
    with pytest.raises(ValueError, match=r"p_cut\.jpg is not a readable JPEG image \(truncated"):
        keras_vit.load_image(cut, 4)


def test_a_jpeg_is_complete_where_its_last_end_marker_follows_its_last_scan_start():
    # Every cut of a progressive JPEG (several scans) and the whole file with bytes after its
    # end, against the definition read off the bytes in Python.
    progressive = encoded("JPEG", size=(32, 32), progressive=True)
    files = [progressive[:n] for n in range(0, len(progressive) + 1, 5)]
    files += [progressive, progressive + b"\xff\xd9", progressive + b"\xff\xda\x00"]
    files += [progressive[:len(progressive) - 2], progressive + b"\x00\xff"]
    check = tf.function(images.jpeg_is_complete)
    for content in files:
        expected = content.rfind(b"\xff\xd9") > content.rfind(b"\xff\xda")
        assert bool(check(tf.constant(content))) == expected, len(content)
    assert sum(content.rfind(b"\xff\xd9") > content.rfind(b"\xff\xda")
               for content in files) >= 3


# --------------------------------------------------------------------------------------------
# Items 4, 22, 23: what a class folder may hold.


def test_a_fifo_in_a_class_folder_is_refused_or_skipped_by_name_without_being_read(tmp_path,
                                                                                  capsys):
    root = class_folder(tmp_path / "images")
    os.mkfifo(root / "cat" / "pipe.png")
    with pytest.raises(ValueError, match=r"pipe\.png is a FIFO \(named pipe\), not a regular "
                                         r"file.*skip_corrupt"):
        data.from_folder(root, image_size=8, batch_size=2, training=True)
    skipped = data.from_folder(root, image_size=8, batch_size=2, training=True,
                               skip_corrupt=True)
    assert [pathlib.Path(p).name for p, _ in skipped.skipped] == ["pipe.png"]
    assert skipped.num_examples == 4
    assert "pipe.png (is a FIFO" in capsys.readouterr().err
    next(iter(skipped.dataset))


def test_predicting_a_fifo_says_it_is_not_a_regular_file(tmp_path, capsys):
    fifo = tmp_path / "pipe.png"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match=r"pipe\.png is a FIFO \(named pipe\), not a regular"):
        keras_vit.load_image(fifo, 4)
    assert cli.main(["predict", str(fifo)]) == 2
    err = capsys.readouterr().err
    assert "not a regular file" in err and "does not exist" not in err, err


def test_hidden_folders_are_not_classes_and_hidden_files_are_not_images(tmp_path):
    root = class_folder(tmp_path / "images")
    write(root / ".ipynb_checkpoints" / "0-checkpoint.png", encoded("PNG"))
    write(root / "cat" / ".hidden.png", encoded("PNG"))
    write(root / "cat" / ".cache" / "x.png", encoded("PNG"))
    paths, labels, class_names = data.list_image_folder(root)
    assert class_names == ["cat", "dog"]
    assert [pathlib.Path(p).name for p in paths] == ["0.png", "1.png", "0.png", "1.png"]
    unlabelled, _, _ = data.list_image_folder(root, labels=None)
    assert len(unlabelled) == 4


@pytest.mark.parametrize("name", ["new\nline", "tab\there", " ", "bell\x07"])
def test_a_class_folder_name_with_a_control_character_is_refused_by_name(tmp_path, name):
    root = class_folder(tmp_path / "images")
    write(root / name / "0.png", encoded("PNG"))
    with pytest.raises(ValueError, match="cannot be a class name") as info:
        data.list_image_folder(root)
    assert repr(name)[1:-1] in str(info.value)


# --------------------------------------------------------------------------------------------
# Item 7: an architecture that cannot fit in memory.


@pytest.mark.parametrize("args, named", [
    (dict(hidden_size=10**9, num_heads=1), "hidden_size=1000000000"),
    (dict(image_size=16 * 10**6), "image_size=16000000"),
    (dict(image_size=16 * 10**6, position_embedding="sincos_2d"), "image_size=16000000"),
    (dict(num_layers=10**7), "num_layers=10000000"),
])
def test_an_architecture_too_large_for_memory_is_refused_up_front(args, named):
    with pytest.raises(ValueError, match=r"needs about [\d,.]+ GB for its [\d,]+ weights and one "
                                         r"image's activations \(float32\); this machine has "
                                         r"[\d,.]+ GB of memory\. Expected a smaller") as info:
        keras_vit.ViT(**args)
    assert named in str(info.value) and "\n" not in str(info.value)


def test_the_memory_check_compares_with_this_machines_memory(monkeypatch):
    from keras_vit import checks, flops

    small = flops.vit_params(16, 8, 8, 1, 8, num_classes=3)
    monkeypatch.setattr(checks, "physical_memory", lambda: 4 * small)
    with pytest.raises(ValueError, match=f"for its {small:,} weights"):
        keras_vit.ViT(**TINY)
    monkeypatch.setattr(checks, "physical_memory", lambda: None)  # the OS does not say
    keras_vit.ViT(**TINY)


def test_the_parameter_count_is_the_models():
    from keras_vit import configs, flops

    for variant in configs.VARIANTS.values():
        config = variant.config()
        if "resnet" not in config:
            assert flops.vit_params(224, config["patch_size"], config["hidden_size"],
                                    config["num_layers"], config["mlp_dim"]) == variant.params
    model = keras_vit.ViT(**dict(TINY, image_size=(16, 24)), representation_size=5)
    assert flops.vit_params((16, 24), 8, 8, 1, 8, num_classes=3, representation_size=5) == \
        model.count_params()


# --------------------------------------------------------------------------------------------
# Item 12: training data with more classes than the model has outputs.


def arrays(classes, count=10, training=True):
    x = np.random.default_rng(0).integers(0, 256, (count, 16, 16, 3), np.uint8)
    return data.from_arrays(x, np.arange(count) % classes, image_size=16, batch_size=5,
                            training=training)


@pytest.mark.parametrize("which", ["training", "validation"])
def test_fit_refuses_data_with_more_classes_than_the_model_up_front(tmp_path, which):
    from keras_vit import training

    model = keras_vit.ViT(**TINY)
    train, validation = (arrays(5), arrays(3, training=False)) if which == "training" else (
        arrays(3), arrays(5, training=False))
    with pytest.raises(ValueError, match=f"The {which} data holds 5 classes, more than the "
                                         "model's 3 outputs. Expected a model with "
                                         "num_classes=5"):
        training.fit(model, train, validation, output_dir=tmp_path / "run", epochs=1,
                     verbose=0, jit_compile=False)
    assert not (tmp_path / "run").exists()


# --------------------------------------------------------------------------------------------
# Item 15: evaluating a folder split that does not exist, or classes that are not the model's.


def checkpoint_with_names(tmp_path, class_names):
    """A tiny model's checkpoint with a trained-looking head and a keras_vit config.json
    naming its classes, as `keras_vit.training.fit` writes them."""
    import json

    from keras_vit import weights

    model = keras_vit.ViT(**TINY)
    head = model.get_layer("head")
    head.bias.assign(np.arange(3, dtype=np.float32))
    folder = tmp_path / "run"
    folder.mkdir()
    weights.save_npz(model, folder / "final.npz")
    (folder / "config.json").write_text(json.dumps(dict(
        format="keras_vit", model={k: v for k, v in TINY.items()}, class_names=class_names)))
    return folder / "final.npz"


def evaluate_cli(capsys, *argv):
    code = cli.main(["evaluate", *map(str, argv), "--batch-size", "2", "--verbose", "0"])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


def test_evaluate_refuses_a_folder_split_that_does_not_exist(tmp_path, capsys):
    root = class_folder(tmp_path / "images", ("bird", "cat", "dog"))
    code, err = evaluate_cli(capsys, "--folder", root, "--weights",
                             checkpoint_with_names(tmp_path, ["bird", "cat", "dog"]),
                             "--split", "nosuch")
    assert code == 2 and "Split 'nosuch' is not a split of the image folder" in err, err
    assert "Expected one of train, validation, all or test" in err
    code, err = evaluate_cli(capsys, "--folder", root, "--weights", tmp_path / "run" / "final.npz")
    assert code == 0, err  # the default, test: every image


def test_evaluate_refuses_folder_classes_that_are_not_the_checkpoints(tmp_path, capsys):
    root = class_folder(tmp_path / "images", ("cat", "dog", "zebra"))
    before = digest(tmp_path)
    code, err = evaluate_cli(capsys, "--folder", root, "--weights",
                             checkpoint_with_names(tmp_path, ["bird", "cat", "dog"]))
    assert code == 2, err
    assert "class 0 is 'cat' in the data but 'bird' in the model" in err
    assert "data [cat, dog, zebra] (3); model [bird, cat, dog] (3)" in err
    assert all(digest(tmp_path).get(k) == v for k, v in before.items())


def test_check_class_names():
    from keras_vit import evaluation

    evaluation.check_class_names(["a", "b"], ["a", "b"])
    evaluation.check_class_names(None, ["a", "b"])
    evaluation.check_class_names(["a", "b"], ())
    with pytest.raises(ValueError, match="class 0 is 'b' in the data but 'a' in the model"):
        evaluation.check_class_names(["a", "b"], ["b", "a"])
    with pytest.raises(ValueError, match="the data has 3 classes, the model 2"):
        evaluation.check_class_names(["a", "b"], ["a", "b", "c"])


# --------------------------------------------------------------------------------------------
# Property: mutated real image files decode to an RGB image or fail with one line naming them.

BASES = {
    "png": encoded("PNG"),
    "jpg": encoded("JPEG", quality=90),
    "jpg-progressive": encoded("JPEG", progressive=True),
    "bmp": encoded("BMP"),
    "bmp-os2": os2_bmp(6, 5),
    "bmp-palette": encoded_as(Image.fromarray(PHOTO).quantize(16), "BMP"),
    "bmp-masks": bitfields_bmp(PHOTO, BGR),
    "gif": encoded("GIF"),
    "gif-offset": offset_frame_gif(PHOTO, (40, 30), (10, 5)),
    "webp": encoded("WEBP", quality=80),
    "webp-lossless": encoded("WEBP", lossless=True),
    "webp-animated": animated_webp(),
}


@st.composite
def mutated_images(draw):
    name = draw(st.sampled_from(sorted(BASES)))
    content = bytearray(BASES[name])
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["truncate", "flip", "splice"]))
        at = draw(st.integers(0, max(len(content) - 1, 0)))
        if kind == "truncate":
            del content[at:]
        elif kind == "flip" and content:
            content[at] ^= draw(st.integers(1, 255))
        else:
            other = BASES[draw(st.sampled_from(sorted(BASES)))]
            start = draw(st.integers(0, len(other) - 1))
            content[at:at] = other[start:start + draw(st.integers(1, 64))]
    return name, bytes(content)


# The folder pipeline's decoding (`data.from_folder` maps `images.decode_image` in a graph),
# traced once: whole (evaluation), and the middle of the image alone (a training crop's box).
graph_decode = tf.function(images.decode_image,
                           input_signature=[tf.TensorSpec([], tf.string)])


def middle(shape):
    return tf.stack([shape[0] // 4, shape[1] // 4, 0]), tf.stack([shape[0] // 2,
                                                                  shape[1] // 2, -1])


graph_decode_middle = tf.function(lambda data: images.decode_image(data, window=middle),
                                  input_signature=[tf.TensorSpec([], tf.string)])


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(case=mutated_images())
def test_mutated_images_decode_or_fail_with_one_line_naming_the_file(tmp_path, case):
    name, content = case
    path = write(tmp_path / f"image.{name.split('-')[0]}", content)
    try:
        image = keras_vit.load_image(path, (5, 7))
    except ValueError as e:
        assert str(path) in str(e) and "\n" not in str(e) and "[Op:" not in str(e), str(e)
        image = None
    else:
        assert image.shape == (5, 7, 3) and image.dtype == np.float32
        assert np.all((image >= 0) & (image <= 255))
    try:
        decoded = graph_decode(tf.io.read_file(str(path)))
    except tf.errors.InvalidArgumentError as e:
        assert images.first_line(e.message), e.message
        decoded = None
    else:
        assert decoded.dtype == tf.uint8 and decoded.shape[-1] == 3
    assert (image is None) == (decoded is None)  # both readers agree
    try:  # a box alone: what decodes whole decodes there too (damage elsewhere goes unseen)
        box = graph_decode_middle(tf.io.read_file(str(path)))
    except tf.errors.InvalidArgumentError as e:
        assert images.first_line(e.message), e.message
        assert decoded is None
    else:
        assert box.dtype == tf.uint8 and box.shape[-1] == 3
        if decoded is not None:
            h, w = decoded.shape[0], decoded.shape[1]
            assert box.shape[:2] == (h // 2, w // 2)
    assert path.read_bytes() == content


def test_a_class_folder_name_that_is_not_utf8_is_named(tmp_path):
    from PIL import Image

    for name in (b"\xff\xfe", b"ok"):
        folder = os.path.join(os.fsencode(tmp_path), name)
        os.makedirs(folder)
        Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(
            os.fsdecode(os.path.join(folder, b"a.png")))
    with pytest.raises(ValueError, match=r"its name is not valid UTF-8 \(bytes b'\\xff\\xfe'\)"):
        keras_vit.data.from_folder(tmp_path, image_size=8, batch_size=2, training=False)


@pytest.mark.parametrize("split", [None, "0.2", True, -0.1, 1.0])
def test_a_validation_split_of_another_type_or_range_is_named(tmp_path, split):
    with pytest.raises(ValueError, match=r"`validation_split` must be a number in \[0, 1\)"):
        keras_vit.data.from_folder(tmp_path, image_size=8, batch_size=2, training=False,
                                   validation_split=split, subset="training")


def test_an_image_linked_to_a_file_that_cannot_be_read_is_named(tmp_path):
    """/proc/self/mem is a regular file to stat, and reading it fails: the error names it."""
    link = tmp_path / "x.png"
    link.symlink_to("/proc/self/mem")
    with pytest.raises(ValueError, match=rf"Image file {link} cannot be read \("):
        keras_vit.load_image(link, size=8)


def test_libjpegs_warnings_become_one_warning_naming_the_file(tmp_path, capfd):
    """A JPEG with stray bytes decodes; libjpeg's own line on file descriptor 2 becomes one
    Python warning naming the file (one command-line line), never raw output."""
    from PIL import Image

    rng = np.random.default_rng(0)
    good = tmp_path / "good.jpg"
    Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(good, quality=90)
    data = good.read_bytes()
    start = data.index(b"\xff\xda")  # the scan's marker: stray bytes just before it
    (tmp_path / "bad.jpg").write_bytes(data[:start] + bytes(50) + data[start:])
    capfd.readouterr()
    with pytest.warns(UserWarning, match=r"bad\.jpg: Corrupt JPEG data: .* \(decoded anyway\)"):
        keras_vit.load_image(tmp_path / "bad.jpg", size=8)
    assert "Corrupt JPEG" not in capfd.readouterr().err
    assert cli.main(["predict", str(tmp_path / "bad.jpg"), "--model-config",
                     json.dumps(dict(image_size=16, patch_size=8, hidden_size=8, num_layers=1,
                                     num_heads=2, mlp_dim=8, num_classes=3))]) == 0
    err = [line for line in capfd.readouterr().err.splitlines() if "Corrupt" in line]
    assert len(err) == 1 and err[0].startswith("keras-vit predict: warning: "), err


def test_numpy_scalars_none_and_empty_policies_are_taken_as_python_ones():
    """The checks added for bad values must not refuse good ones: NumPy rates, no class names,
    a policy map whose default is bfloat16."""
    import keras

    model = keras_vit.ViT(**dict(TINY, dropout_rate=np.float32(0.1)))
    assert keras_vit.vit_config(model)["dropout_rate"] == pytest.approx(0.1)
    json.dumps(keras_vit.vit_config(model))  # the saved config holds Python numbers
    mapped = keras_vit.ViT(**TINY, dtype=keras.dtype_policies.DTypePolicyMap("mixed_bfloat16"))
    assert mapped.get_layer("embedding").compute_dtype == "bfloat16"
    pixels = np.zeros((4, 16, 16, 3), np.uint8)
    assert data.from_arrays(pixels, np.arange(4) % 2, class_names=None, image_size=16,
                            batch_size=2, training=False).class_names == ()
    with pytest.raises(ValueError, match=r"`seed` must be an integer in \[0, 2\*\*63\)"):
        data.from_arrays(pixels, np.arange(4) % 2, seed=10**400, image_size=16, batch_size=2,
                         training=True)
