"""Each checkpoint's data config (timm's field names), resolved from any source, carried by the
model built from it, and applied by default: `load_image`, `preprocess_inputs`, `predict`,
`evaluate`, the evaluation pipelines and the exported serving signatures.

The resize and crop are checked against an independent NumPy/PIL implementation of timm's
evaluation transform (`transforms_imagenet_eval`), and, where `KERAS_VIT_TIMM_PYTHON` names an
interpreter with timm (see tests/test_timm_interop.py), against timm's own `create_transform`
and `resolve_data_config`.
"""

import json
import math
import os
import pathlib
import subprocess

import keras
import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

import keras_vit
import keras_vit_cli as cli
from keras_vit import data_config as dc
from keras_vit import evaluation, images, weights
from keras_vit.weights import config_json, writers

ROOT = pathlib.Path(__file__).resolve().parent.parent
TIMM_PYTHON = os.environ.get("KERAS_VIT_TIMM_PYTHON")
TINY = dict(image_size=16, patch_size=8, hidden_size=8, num_layers=1, num_heads=2, mlp_dim=8,
            num_classes=3)
# A DINO-like data config: ImageNet mean and std, bicubic, timm's default crop.
IMAGENET = dict(input_size=[3, 16, 16], interpolation="bicubic", crop_pct=0.875,
                crop_mode="center", mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
# The most levels (of 255) PIL's 8-bit resize differs by from the float32 one.
PIL_LEVELS = 1.5
PIL_FILTERS = {"bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC, "nearest": Image.NEAREST,
               "lanczos": Image.LANCZOS}


def smooth_image(height, width, seed=0):
    """A uint8 RGB image with structure at several scales (noise alone hides misalignment),
    in [32, 223]: away from black and white, where PIL's 8-bit resize clips a filter's
    overshoot between its horizontal and vertical passes (a difference of the number format,
    not of the transform)."""
    rng = np.random.default_rng(seed)
    coarse = rng.integers(48, 208, (max(height // 3, 2), max(width // 3, 2), 3), np.uint8)
    image = np.asarray(Image.fromarray(coarse).resize((width, height), Image.BICUBIC), np.int16)
    return np.clip(image + rng.integers(-16, 17, image.shape), 32, 223).astype(np.uint8)


def write_png(path, pixels):
    Image.fromarray(pixels).save(path)
    return path


def pil_eval_transform(pixels, config):
    """timm's `transforms_imagenet_eval` resize and centre crop, written out with PIL: the
    independent reference. Returns float32 [height, width, 3] in [0, 255]."""
    height, width = config["input_size"][1:]
    scaled = [math.floor(side / config["crop_pct"]) for side in (height, width)]
    h, w = pixels.shape[:2]
    if config["crop_mode"] == "squash":
        new_h, new_w = scaled
    elif config["crop_mode"] == "border":  # timm ResizeKeepRatio(longest=1)
        ratio = max(h / scaled[0], w / scaled[1])
        new_h, new_w = round(h / ratio), round(w / ratio)
    elif scaled[0] == scaled[1]:  # torchvision Resize(int): the shorter side
        new_h, new_w = (int(scaled[0] * h / w), scaled[0]) if w <= h \
            else (scaled[0], int(scaled[0] * w / h))
    else:  # timm ResizeKeepRatio
        ratio = min(h / scaled[0], w / scaled[1])
        new_h, new_w = round(h / ratio), round(w / ratio)
    image = Image.fromarray(pixels)
    if (new_h, new_w) != (h, w):
        image = image.resize((new_w, new_h), PIL_FILTERS[config["interpolation"]])
    image = np.asarray(image, np.float32)
    if config["crop_mode"] == "border":  # timm CenterCropOrPad, with the mean colour
        pad_h, pad_w = max(height - new_h, 0), max(width - new_w, 0)
        padded = np.empty((new_h + pad_h, new_w + pad_w, 3), np.float32)
        padded[:] = [round(255 * m) for m in config["mean"]]
        padded[pad_h // 2:pad_h // 2 + new_h, pad_w // 2:pad_w // 2 + new_w] = image
        image, new_h, new_w = padded, new_h + pad_h, new_w + pad_w
    top, left = int(round((new_h - height) / 2.0)), int(round((new_w - width) / 2.0))
    return image[top:top + height, left:left + width]


def tiny_model(seed=0, **changes):
    """A tiny classifier with random weights everywhere (a zero head would hide the input)."""
    keras.utils.set_random_seed(seed)
    model = keras_vit.ViT(**dict(TINY, **changes))
    rng = np.random.default_rng(seed)
    model.set_weights([rng.normal(0, 0.5, w.shape).astype(w.dtype) for w in model.get_weights()])
    return model


def checkpoint_with_config(folder, preprocessing, model=None):
    """A tiny `.npz` and the keras_vit config.json beside it stating `preprocessing`."""
    model = model or tiny_model()
    folder.mkdir(parents=True, exist_ok=True)
    weights.save_npz(model, folder / "model.npz")
    document = config_json.keras_vit_document(keras_vit.vit_config(model), None,
                                                      preprocessing)
    (folder / "config.json").write_text(json.dumps(document))
    return folder / "model.npz"


# --------------------------------------------------------------------------------------------
# The paper's preprocessing, bit for bit.


def test_paper_data_config_gives_the_paper_input_bit_for_bit(tmp_path):
    pixels = smooth_image(37, 23)
    path = write_png(tmp_path / "a.png", pixels)
    paper = dc.paper_data_config((16, 12))
    old = np.clip(tf.image.resize(tf.constant(pixels, tf.float32), (16, 12),
                                  method="bilinear").numpy(), 0, 255)
    np.testing.assert_array_equal(images.load_image(path, (16, 12)), old)
    np.testing.assert_array_equal(images.load_image(path, data_config=paper), old)
    scaled = old / np.float32(127.5) + np.float32(-1.0)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(
        keras_vit.preprocess_inputs(old, paper)), scaled)
    np.testing.assert_array_equal(images.eval_transform(tf.constant(pixels), paper).numpy(),
                                  images.eval_preprocess(tf.constant(pixels), (16, 12)).numpy())


def test_a_model_gets_its_checkpoints_data_config_else_the_papers_at_its_size():
    model = keras_vit.ViT(**dict(TINY, image_size=(16, 24)))
    assert keras_vit.resolve_data_config(model) == dc.paper_data_config((16, 24))
    assert keras_vit.resolve_data_config() == dc.paper_data_config(224)
    # A registry entry's own `preprocessing`, carried by the model built from it.
    stated = dc.check_data_config(keras_vit.weights.get_checkpoint("digits")["preprocessing"])
    digits = keras_vit.from_pretrained("digits", progress=False)
    assert keras_vit.resolve_data_config("digits") == stated
    assert keras_vit.resolve_data_config(digits) == stated
    assert stated["mean"] == stated["std"] == [0.5, 0.5, 0.5]  # x / 127.5 - 1


# --------------------------------------------------------------------------------------------
# The resize and crop against timm's transform written with PIL.


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic", "nearest", "lanczos"])
@pytest.mark.parametrize("crop_mode, crop_pct", [("center", 0.875), ("center", 1.0),
                                                  ("squash", 0.9), ("squash", 1.0),
                                                  ("border", 1.0), ("border", 0.8)])
@pytest.mark.parametrize("shape, size", [((37, 23), (16, 16)), ((20, 50), (12, 16)),
                                         ((9, 7), (16, 16))])
def test_resize_crop_matches_timms_transform_written_with_pil(interpolation, crop_mode, crop_pct,
                                                              shape, size):
    pixels = smooth_image(*shape)
    config = dc.check_data_config(dict(IMAGENET, input_size=[3, *size], crop_mode=crop_mode,
                                       crop_pct=crop_pct, interpolation=interpolation))
    got = images.resize_crop(tf.constant(pixels, tf.float32), config).numpy()
    want = pil_eval_transform(pixels, config)
    assert got.shape == want.shape == (*size, 3)
    # PIL works in 8 bits (it rounds between its two passes); TensorFlow in float32.
    difference = np.abs(got - want)
    assert difference.max() <= PIL_LEVELS and difference.mean() <= 0.4, (difference.max(),
                                                                          difference.mean())


@pytest.mark.parametrize("shape, size, crop_mode, crop_pct", [
    ((48, 64), (32, 32), "center", 0.875),  # 36x48: a scale of 4/3, samples on pixel borders
    ((64, 48), (48, 36), "squash", 1.0),
    ((375, 500), (224, 224), "center", 0.875),
])
def test_nearest_picks_the_pixels_pil_picks(shape, size, crop_mode, crop_pct):
    # Where a sample falls on a pixel border, rounding decides: PIL's steps, not TF's formula.
    pixels = np.random.default_rng(0).integers(0, 256, (*shape, 3), np.uint8)  # no smoothing
    config = dc.check_data_config(dict(IMAGENET, input_size=[3, *size], crop_mode=crop_mode,
                                       crop_pct=crop_pct, interpolation="nearest"))
    got = images.resize_crop(tf.constant(pixels, tf.float32), config).numpy()
    np.testing.assert_array_equal(got, pil_eval_transform(pixels, config))


def test_nearest_rows_are_pils_for_many_sizes():
    rng = np.random.default_rng(1)
    for _ in range(60):
        old, new = (int(n) for n in rng.integers(1, 700, 2))
        row = np.arange(old, dtype=np.int32)[None].repeat(2, 0)  # each pixel its index
        want = np.asarray(Image.fromarray(row).resize((new, 2), Image.NEAREST))[0]
        got = images._pil_nearest(tf.constant(row[..., None], tf.float32), 2, new)
        np.testing.assert_array_equal(got.numpy()[0, :, 0], want, err_msg=f"{old} -> {new}")


def test_load_image_and_preprocess_inputs_apply_a_data_config(tmp_path):
    pixels = smooth_image(30, 41)
    path = write_png(tmp_path / "a.png", pixels)
    config = dc.check_data_config(IMAGENET)
    loaded = images.load_image(path, data_config=config)
    np.testing.assert_allclose(loaded, pil_eval_transform(pixels, config), atol=PIL_LEVELS)
    want = (loaded / 255 - np.float32(IMAGENET["mean"])) / np.float32(IMAGENET["std"])
    np.testing.assert_allclose(keras.ops.convert_to_numpy(
        keras_vit.preprocess_inputs(loaded, config)), want, atol=1e-5)
    # The model's own, and another size on request.
    assert images.load_image(path, 8, data_config=config).shape == (8, 8, 3)


# --------------------------------------------------------------------------------------------
# Sources.


def test_images_and_pipelines_take_a_model_or_a_data_config_and_refuse_a_name(tmp_path):
    npz = checkpoint_with_config(tmp_path / "mine", IMAGENET)
    path = write_png(tmp_path / "a.png", smooth_image(37, 23))
    stated = keras_vit.resolve_data_config(npz)
    model = keras_vit.from_pretrained(npz)
    from_config = images.load_image(path, data_config=stated)
    np.testing.assert_array_equal(images.load_image(path, data_config=model), from_config)
    arrays = np.stack([smooth_image(37, 23)] * 2).astype(np.uint8)
    for source in (npz, str(npz), "digits"):
        with pytest.raises(ValueError, match=r"resolve_data_config\(") as error:
            images.load_image(path, data_config=source)
        assert len(str(error.value).splitlines()) == 1
        with pytest.raises(ValueError, match=r"resolve_data_config\("):
            keras_vit.data.from_arrays(arrays, np.array([0, 1]), num_classes=3, image_size=16,
                                       batch_size=2, training=False, data_config=source)


def test_resolve_data_config_reads_every_source(tmp_path):
    npz = checkpoint_with_config(tmp_path / "mine", IMAGENET)
    want = dc.check_data_config(IMAGENET)
    assert keras_vit.resolve_data_config(npz) == want
    assert keras_vit.resolve_data_config(tmp_path / "mine") == want
    assert keras_vit.resolve_data_config(tmp_path / "mine" / "config.json") == want
    assert keras_vit.resolve_data_config(npz, image_size=32)["input_size"] == [3, 32, 32]
    # timm's config.json: `pretrained_cfg`, timm's defaults for what it leaves out.
    timm_folder = tmp_path / "timm"
    timm_folder.mkdir()
    (timm_folder / "config.json").write_text(json.dumps(
        {"architecture": "vit_small_patch16_224", "pretrained_cfg": {
            "input_size": [3, 224, 224], "interpolation": "bicubic", "crop_pct": 0.9}}))
    assert keras_vit.resolve_data_config(timm_folder) == dict(
        input_size=[3, 224, 224], interpolation="bicubic", crop_pct=0.9, crop_mode="center",
        mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225], antialias=True)
    # A registry entry's `preprocessing`.
    entry = {"name": "mine/dino", "preprocessing": IMAGENET}
    assert dc.checkpoint_data_config("mine/dino", entry) == want
    # A file that states none: the paper's, at the resolution of its position embedding.
    bare = tmp_path / "bare.npz"
    weights.save_npz(keras_vit.ViT(**dict(TINY, image_size=24)), bare)
    assert keras_vit.resolve_data_config(bare) == dc.paper_data_config(24)


@pytest.mark.parametrize("source, error, message", [
    (b"digits", ValueError, r"resolve_data_config takes a model, a data config \(dict\), a "
                            r"registry name, .* Received: b'digits'"),
    (42, ValueError, "Received: 42"),
    ("empty", FileNotFoundError, "empty holds no config.json. Expected a folder with the "
                                 "config.json of a model"),
    ("gone.json", FileNotFoundError, "gone.json: no such file"),
    ("imagenet21k/ViT-B_61", ValueError, "Unknown checkpoint 'imagenet21k/ViT-B_61'. Did you "
                                         "mean 'imagenet21k/ViT-B_16'"),
])
def test_resolve_data_config_refuses_what_it_cannot_read_in_one_line(tmp_path, monkeypatch,
                                                                      source, error, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(error, match=message) as raised:
        keras_vit.resolve_data_config(source)
    assert len(str(raised.value).splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty"]


def test_from_pretrained_keeps_the_checkpoints_data_config_at_the_models_size(tmp_path):
    npz = checkpoint_with_config(tmp_path / "mine", IMAGENET)
    model = keras_vit.from_pretrained(npz)
    assert model.data_config == dc.check_data_config(IMAGENET)
    bigger = keras_vit.from_pretrained(npz, image_size=32)
    assert keras_vit.resolve_data_config(bigger) == dc.check_data_config(
        dict(IMAGENET, input_size=[3, 32, 32]))


def test_safetensors_carry_the_data_config_to_keras_vit_and_to_timms_config(tmp_path):
    model = keras_vit.from_pretrained(checkpoint_with_config(tmp_path / "npz", IMAGENET))
    writers.save_safetensors(model, tmp_path / "st" / "model.safetensors")
    timm_config = json.loads((tmp_path / "st" / "config.json").read_text())
    assert {k: timm_config["pretrained_cfg"][k] for k in dc.FIELDS} == \
        {k: v for k, v in dc.check_data_config(IMAGENET).items() if k in dc.FIELDS}
    again = keras_vit.from_pretrained(tmp_path / "st" / "model.safetensors")
    assert again.data_config == dc.check_data_config(IMAGENET)
    # A model that states none is written with the paper's, a plain resize ("squash").
    writers.save_safetensors(tiny_model(), tmp_path / "paper" / "model.safetensors")
    paper = json.loads((tmp_path / "paper" / "config.json").read_text())["pretrained_cfg"]
    assert (paper["crop_mode"], paper["crop_pct"], paper["mean"]) == ("squash", 1.0,
                                                                     [0.5, 0.5, 0.5])


# --------------------------------------------------------------------------------------------
# Bad configs: one clear line.


@pytest.mark.parametrize("change, phrase", [
    (dict(interpolation="hamming"), "`interpolation` 'hamming' is not supported. Expected one "
                                    "of bilinear, bicubic, nearest, lanczos, area"),
    (dict(crop_pct=0), "`crop_pct` must be a number in (0, 1]. Received: crop_pct=0"),
    (dict(crop_pct=1.2), "`crop_pct` must be a number in (0, 1]"),
    (dict(crop_pct=True), "`crop_pct` must be a number"),
    (dict(crop_pct=float("nan")), "`crop_pct` must be a number"),
    (dict(crop_mode="edge"), "`crop_mode` 'edge' is not supported"),
    (dict(input_size=[16, 16]), "`input_size` must be [3, height, width]"),
    (dict(input_size=[1, 16, 16]), "`input_size` must be [3, height, width]"),
    (dict(mean=[0.5, 0.5]), "`mean` must be 3 numbers (R, G, B)"),
    (dict(std=[0.5, 0.0, 0.5]), "`std` must be 3 numbers (R, G, B) in [0.001, 1000]"),
    (dict(antialias="yes"), "`antialias` must be true or false"),
    (dict(size=224), "has unknown fields ['size']"),
])
def test_bad_data_configs_are_refused_in_one_line(change, phrase):
    with pytest.raises(ValueError) as raised:
        dc.check_data_config(dict(IMAGENET, **change), "preprocessing")
    message = str(raised.value)
    assert phrase in message and "\n" not in message, message
    assert message.startswith("preprocessing")


def test_a_config_missing_a_field_names_it():
    config = {k: v for k, v in IMAGENET.items() if k != "std"}
    with pytest.raises(ValueError, match=r"lacks \['std'\]"):
        dc.check_data_config(config)


def test_a_bad_config_json_names_the_file_and_the_field(tmp_path, capsys):
    npz = checkpoint_with_config(tmp_path / "mine", IMAGENET)
    document = json.loads((tmp_path / "mine" / "config.json").read_text())
    document["preprocessing"]["crop_pct"] = 2
    (tmp_path / "mine" / "config.json").write_text(json.dumps(document))
    with pytest.raises(keras_vit.CheckpointError, match=r"config.json.*`crop_pct` must be"):
        keras_vit.from_pretrained(npz)
    image = write_png(tmp_path / "a.png", smooth_image(20, 20))
    assert cli.main(["predict", str(image), "--weights", str(npz)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "crop_pct" in err and "config.json" in err, err
    assert "Traceback" not in err


# --------------------------------------------------------------------------------------------
# Applied by default.


def expected_probabilities(model, paths, config):
    batch = np.stack([images.load_image(p, data_config=config) for p in paths])
    logits = keras.ops.convert_to_numpy(model(keras_vit.preprocess_inputs(batch, config)))
    return keras.ops.convert_to_numpy(keras.ops.softmax(logits))


def test_predict_applies_the_checkpoints_own_data_config(tmp_path, capsys):
    npz = checkpoint_with_config(tmp_path / "mine", IMAGENET)
    path = write_png(tmp_path / "a.png", smooth_image(30, 41))
    assert cli.main(["predict", str(path), "--weights", str(npz), "--top-k", "3"]) == 0
    shown = [float(line.split("%")[0]) / 100 for line in capsys.readouterr().out.splitlines()
             if "%" in line]
    model = keras_vit.from_pretrained(npz)
    own = np.sort(expected_probabilities(model, [path], IMAGENET)[0])[::-1]
    paper = np.sort(expected_probabilities(model, [path], dc.paper_data_config(16))[0])[::-1]
    np.testing.assert_allclose(shown, own, atol=6e-5)
    assert np.abs(own - paper).max() > 1e-3  # the check can tell them apart


def test_evaluate_and_the_evaluation_pipelines_apply_the_models_data_config(tmp_path):
    model = keras_vit.from_pretrained(checkpoint_with_config(tmp_path / "mine", IMAGENET))
    config = dc.check_data_config(IMAGENET)
    rng = np.random.default_rng(1)
    arrays = rng.integers(0, 256, (6, 16, 16, 3), np.uint8)
    labels = np.array([0, 1, 2, 0, 1, 2])
    report = evaluation.evaluate(model, (arrays, labels), progress=False)
    logits = keras.ops.convert_to_numpy(model(keras_vit.preprocess_inputs(arrays, config)))
    log_probs = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    np.testing.assert_allclose(report["loss"], -log_probs[np.arange(6), labels].mean(),
                               rtol=1e-5)
    # A pipeline of larger images: resized, cropped and normalised as the model's config says.
    big = np.stack([smooth_image(30, 41, seed) for seed in range(2)])
    data = keras_vit.data.from_arrays(big, np.array([0, 1]), num_classes=3, image_size=16,
                                      batch_size=2, training=False, data_config=model)
    batch = next(iter(data.dataset))[0].numpy()
    want = np.stack([(pil_eval_transform(p, config) / 255 - config["mean"]) / config["std"]
                     for p in big])
    assert np.abs(batch - want).max() <= PIL_LEVELS / 255 / min(config["std"])
    assert data.data_config == config


def test_training_pipelines_normalise_with_the_models_mean_and_std():
    """The same augmentation, then `(x / 255 - mean) / std` with the model's: equal, image for
    image, to the paper's [-1, 1] batch mapped back to pixels and normalised (as timm
    fine-tunes a checkpoint with its own mean and std)."""
    model = tiny_model()
    model.data_config = IMAGENET
    big = np.stack([smooth_image(30, 41, seed) for seed in range(2)])
    batches = [next(iter(keras_vit.data.from_arrays(
        big, np.array([0, 1]), num_classes=3, image_size=16, batch_size=2, training=True,
        **given).dataset))[0].numpy() for given in ({}, dict(data_config=model))]
    paper, own = batches
    pixels = (paper + 1) * 127.5
    want = (pixels / 255 - np.array(IMAGENET["mean"])) / np.array(IMAGENET["std"])
    np.testing.assert_allclose(own, want, atol=1e-4)
    assert np.abs(own - paper).max() > 0.1


def test_fit_trains_with_the_models_normalisation_and_refuses_another(tmp_path):
    """A pipeline built without a data config is built again with the model's (a warning of
    one line says so); one built with another is refused in one line, before anything is
    written; the run records the data config, and `evaluate` of the fine-tuned file on the
    validation images gives the loss training's validation gave."""
    model = keras_vit.from_pretrained(checkpoint_with_config(tmp_path / "mine", IMAGENET))
    rng = np.random.default_rng(0)
    arrays, labels = rng.integers(0, 256, (4, 16, 16, 3), np.uint8), np.array([0, 1, 2, 0])

    def pipeline(training, **given):
        return keras_vit.data.from_arrays(arrays, labels, num_classes=3, image_size=16,
                                          batch_size=4, training=training, **given)

    other = dict(IMAGENET, mean=[0.5] * 3, std=[0.5] * 3)
    with pytest.raises(ValueError, match=r"The train pipeline normalises with mean \[0.5, "
                                         r".*expects mean \[0.485.*data_config=model") as e:
        keras_vit.training.fit(model, pipeline(True, data_config=other),
                               output_dir=tmp_path / "refused", steps=1, verbose=0,
                               jit_compile=False)
    assert "\n" not in str(e.value) and not (tmp_path / "refused").exists()
    with pytest.raises(ValueError, match="The validation pipeline normalises"):
        keras_vit.training.fit(model, pipeline(True), pipeline(False, data_config=other),
                               output_dir=tmp_path / "refused", steps=1, verbose=0,
                               jit_compile=False)
    assert not (tmp_path / "refused").exists()
    adopted, was = pipeline(True).for_model(model)
    assert was and adopted.data_config == model.data_config
    batch = next(iter(adopted.dataset))[0].numpy()
    own = next(iter(pipeline(True, data_config=model).dataset))[0].numpy()
    np.testing.assert_array_equal(batch, own)  # the same batches as built with the model's
    with pytest.warns(UserWarning, match=r"The train pipeline was built without a data "
                                         r"config: it now preprocesses as model .* data "
                                         r"config says \(mean \[0.485") as warned:
        summary = keras_vit.training.fit(
            model, pipeline(True), pipeline(False, data_config=model),
            output_dir=tmp_path / "run", steps=1, verbose=0, jit_compile=False,
            monitor="val_loss")
    assert len([w for w in warned if "pipeline was built" in str(w.message)]) == 1
    written = json.loads((tmp_path / "run" / "config.json").read_text())["preprocessing"]
    assert written == dc.check_data_config(IMAGENET)
    tuned = keras_vit.from_pretrained(tmp_path / "run" / "final.npz")
    assert tuned.data_config == written
    report = evaluation.evaluate(tuned, pipeline(False, data_config=tuned), progress=False)
    np.testing.assert_allclose(report["loss"], summary["best_value"], rtol=1e-4)


def test_the_serving_signatures_apply_the_models_data_config(tmp_path):
    from keras_vit import export

    model = keras_vit.from_pretrained(checkpoint_with_config(tmp_path / "mine", IMAGENET))
    path = export.export_saved_model(model, tmp_path / "export", warmup=False,
                                     jit_compile=False)
    assert export.read_metadata(path)["data_config"] == dc.check_data_config(IMAGENET)
    loaded = tf.saved_model.load(path)
    image = write_png(tmp_path / "a.png", smooth_image(30, 41))
    served = loaded.signatures["serving_default"](
        image_bytes=tf.constant([image.read_bytes()]))["probabilities"].numpy()
    np.testing.assert_allclose(served, expected_probabilities(model, [image], IMAGENET),
                               atol=1e-5)
    arrays = np.random.default_rng(0).uniform(0, 255, (1, 16, 16, 3)).astype(np.float32)
    served = loaded.signatures["predict_images"](images=tf.constant(arrays))["probabilities"]
    logits = model(keras_vit.preprocess_inputs(arrays, IMAGENET))
    np.testing.assert_allclose(served.numpy(), keras.ops.convert_to_numpy(
        keras.ops.softmax(logits)), atol=1e-5)


# --------------------------------------------------------------------------------------------
# timm's own transform and data config.

TIMM_TRANSFORM = """
import json, sys
import numpy as np
sys.path.insert(0, {root!r})
from benchmarks.contenders.timm_vit import import_timm
timm, _ = import_timm()
from PIL import Image
from timm.data import create_transform, resolve_data_config
out = []
for case in json.load(open({cases!r})):
    config = resolve_data_config(pretrained_cfg=case["pretrained_cfg"])
    transform = create_transform(**config)
    image = transform(Image.open(case["image"]).convert("RGB"))
    out.append(dict(config={{k: list(v) if isinstance(v, tuple) else v
                            for k, v in config.items()}},
                    image=image.permute(1, 2, 0).numpy().tolist()))
print(json.dumps(out))
"""


@pytest.mark.skipif(not TIMM_PYTHON, reason="KERAS_VIT_TIMM_PYTHON names no interpreter with timm")
def test_timms_create_transform_gives_the_same_input(tmp_path):
    cases = []
    for i, (config, shape) in enumerate([
            (IMAGENET, (37, 23)),
            (dict(IMAGENET, input_size=[3, 12, 16], interpolation="bilinear"), (20, 50)),
            (dict(IMAGENET, crop_mode="squash", crop_pct=1.0, mean=[0.5] * 3, std=[0.5] * 3),
             (40, 30)),
            (dict(IMAGENET, crop_pct=0.95, interpolation="bicubic"), (9, 7)),
            (dict(IMAGENET, crop_mode="border", crop_pct=1.0), (20, 50)),
            (dict(IMAGENET, crop_mode="border", crop_pct=0.9, input_size=[3, 12, 16]),
             (40, 30))]):
        path = write_png(tmp_path / f"{i}.png", smooth_image(*shape, seed=i))
        cases.append(dict(pretrained_cfg=config, image=str(path)))
    # And the pretrained_cfg of the config.json keras_vit writes for timm.
    model = keras_vit.from_pretrained(checkpoint_with_config(tmp_path / "mine", IMAGENET))
    writers.save_safetensors(model, tmp_path / "st" / "model.safetensors")
    written = json.loads((tmp_path / "st" / "config.json").read_text())["pretrained_cfg"]
    cases.append(dict(pretrained_cfg=written, image=cases[0]["image"]))
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    code = TIMM_TRANSFORM.format(root=str(ROOT), cases=str(tmp_path / "cases.json"))
    done = subprocess.run([TIMM_PYTHON, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    for case, result in zip(cases, results):
        config = dc.timm_data_config(case["pretrained_cfg"])
        assert {k: result["config"][k] for k in dc.FIELDS} == \
            {k: config[k] for k in dc.FIELDS}
        pixels = np.asarray(Image.open(case["image"]).convert("RGB"))
        got = images.eval_transform(tf.constant(pixels), config).numpy()
        want = np.array(result["image"], np.float32)
        assert got.shape == want.shape
        # timm's PIL resize works in 8 bits: a few levels of 255 at most, over std.
        assert np.abs(got - want).max() <= PIL_LEVELS / 255 / min(config["std"]), case


def test_a_hub_checkpoint_keeps_the_data_config_of_timms_config_json(tmp_path, monkeypatch,
                                                                      capsys):
    """`hf://` through the Hugging Face cache, offline: timm's `pretrained_cfg` (bicubic, crop
    0.9) is the model's data config, and `resolve_data_config` reads it from the cache. A timm
    registry name read from the same cache carries its entry's (and timm's) data config, on
    every path: `from_pretrained`, `resolve_data_config` and the command line's `predict`, all
    in-process (huggingface_hub pointed at the cache and offline, as HF_HOME and
    HF_HUB_OFFLINE=1 set it when it is imported)."""
    import shutil

    from huggingface_hub import constants as hub_constants

    from keras_vit.weights import registry

    fixture = ROOT / "tests" / "fixtures" / "hub" / "timm_vit"
    commit = "0123456789abcdef0123456789abcdef01234567"
    dino = "vit_base_patch16_224.dino"
    stated = json.loads((fixture / "config.json").read_text())["pretrained_cfg"]
    for repo, pretrained_cfg in (("vit-test", stated),
                                 (dino, weights.get_checkpoint(dino)["preprocessing"])):
        folder = tmp_path / "hf" / "hub" / f"models--timm--{repo}"
        (folder / "snapshots" / commit).mkdir(parents=True)
        (folder / "refs").mkdir()
        (folder / "refs" / "main").write_text(commit)
        shutil.copy(fixture / "model.safetensors", folder / "snapshots" / commit)
        document = json.loads((fixture / "config.json").read_text())
        document["pretrained_cfg"].update(pretrained_cfg)  # as timm writes it for `repo`
        (folder / "snapshots" / commit / "config.json").write_text(json.dumps(document))
    photo = write_png(tmp_path / "photo.png", smooth_image(45, 60))
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    # DINO's entry, rewritten to describe the small stand-in under its name (width 32, depth 2,
    # 32 px, 5 classes): the file must match its entry, as a real one must.
    monkeypatch.setitem(registry._REGISTERED, dino, dict(
        registry.get_checkpoint(dino), variant=None, resolution=32, num_classes=5,
        config=dict(hidden_size=32, num_layers=2, num_heads=2, mlp_dim=64, patch_size=8)))
    configs = []
    for name in ("hf://timm/vit-test", dino):
        model = keras_vit.from_pretrained(name, progress=False)
        configs += [model.data_config, keras_vit.resolve_data_config(name)]
    carried, resolved, dino_carried, dino_resolved = configs
    assert cli.main(["predict", str(photo), "--weights", dino, "--top-k", "5"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert carried == resolved == dc.timm_data_config(stated)
    assert (carried["interpolation"], carried["crop_pct"]) == ("bicubic", 0.9)
    entry = dc.check_data_config(weights.get_checkpoint(dino)["preprocessing"])
    assert dino_resolved == entry
    assert dino_carried == dict(entry, input_size=[3, 32, 32])  # at the model's size
    assert (entry["mean"], entry["crop_pct"]) == ([0.485, 0.456, 0.406], 0.9)
    # `predict` by name: the probabilities of the photo as DINO's config preprocesses it.
    shown = [float(line.split("%")[0]) / 100 for line in lines if "%" in line]
    model = keras_vit.from_pretrained(tmp_path / "hf" / "hub" / f"models--timm--{dino}"
                                      / "snapshots" / commit / "model.safetensors")
    assert model.data_config == dino_carried  # timm's config.json beside the file says so
    want = expected_probabilities(model, [photo], dino_carried)[0]
    wrong = expected_probabilities(model, [photo], dc.paper_data_config(32))[0]
    assert np.abs(want - wrong).max() > 1e-3  # the check can tell them apart
    np.testing.assert_allclose(shown, np.sort(want)[::-1], atol=6e-5)


def test_evaluate_command_reads_a_folder_as_the_checkpoint_says(tmp_path, capsys):
    """`keras-vit evaluate --folder` with the model's data config: its loss is the one of the
    images preprocessed as the config says, not as the paper's."""
    npz = checkpoint_with_config(tmp_path / "mine", IMAGENET)
    paths = []
    for i in range(3):
        (tmp_path / "images" / f"c{i}").mkdir(parents=True)
        paths.append(write_png(tmp_path / "images" / f"c{i}" / "0.png", smooth_image(30, 41, i)))
    assert cli.main(["evaluate", "--folder", str(tmp_path / "images"), "--weights", str(npz),
                     "--batch-size", "3", "--verbose", "0", "--json"]) == 0
    loss = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["loss"]
    model = keras_vit.from_pretrained(npz)
    probabilities = {name: expected_probabilities(model, paths, config)
                     for name, config in (("own", IMAGENET), ("paper", dc.paper_data_config(16)))}
    losses = {name: -np.log(p[np.arange(3), np.arange(3)]).mean()
              for name, p in probabilities.items()}
    assert abs(losses["own"] - losses["paper"]) > 1e-3  # the check can tell them apart
    np.testing.assert_allclose(loss, losses["own"], rtol=1e-4)


def test_inspect_shows_the_images_as_they_were_before_normalisation():
    from keras_vit.inspection import figures

    pixels = np.random.default_rng(0).uniform(0, 255, (2, 16, 16, 3)).astype(np.float32)
    for config in (IMAGENET, None):
        inputs = keras.ops.convert_to_numpy(keras_vit.preprocess_inputs(pixels, config))
        np.testing.assert_allclose(figures._to_unit(inputs, config), pixels / 255, atol=1e-5)


def test_a_keras_hub_preset_keeps_its_image_converters_data_config(tmp_path):
    pytest.importorskip("keras_hub")
    from keras_vit.weights import keras_hub, writers

    stated = dict(IMAGENET, crop_pct=1.0, interpolation="bicubic",  # keras-hub's own crop
                  crop_mode="crop_to_aspect_ratio")
    writers.save_keras_hub_preset(tiny_model(gelu_approximate=False), tmp_path / "preset",
                                    stated)
    want = dc.check_data_config(keras_hub.preset_preprocessing(tmp_path / "preset"))
    assert (want["interpolation"], want["crop_mode"]) == ("bicubic", "crop_to_aspect_ratio")
    np.testing.assert_allclose(want["std"], IMAGENET["std"], rtol=1e-6)
    assert keras_vit.from_pretrained(tmp_path / "preset").data_config == want
    assert keras_vit.resolve_data_config(tmp_path / "preset") == want


def test_vtab_keeps_its_whole_image_resize_with_the_models_normalisation():
    """VTAB's protocol resizes the whole image (its structured tasks' labels depend on where
    things are); the checkpoint's mean and std still apply."""
    from keras_vit.vtab.tasks import vtab_data_config

    model = tiny_model()
    model.data_config = IMAGENET
    assert vtab_data_config(model, 16) == dict(
        input_size=[3, 16, 16], interpolation="bilinear", crop_pct=1.0, crop_mode="squash",
        mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225], antialias=False)
    assert vtab_data_config(None, 16) == dc.paper_data_config(16)
