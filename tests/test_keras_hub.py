"""keras-hub's ViT presets both ways (`keras_vit.weights.keras_hub`): presets keras-hub writes
itself (tiny random `ViTBackbone` / `ViTImageClassifier` with their preprocessors) read by
`keras_vit.from_pretrained`, and presets keras_vit writes loaded by
`keras_hub.models.ImageClassifier.from_preset` with their preprocessor: in each direction the
logits keras-hub's `predict` gives on images in [0, 255] are compared with keras_vit's on the
same images, preprocessed as the data config says. The refusals (what one side cannot hold)
and the destination rules need no keras-hub."""

import json
import re
import os
import sys

import numpy as np
import pytest

import keras_vit
import keras_vit_cli as cli
from keras_vit import builders, fileio, weights
from keras_vit.weights import config_json
from keras_vit.weights import CheckpointError

TINY = dict(image_size=16, patch_size=8, hidden_size=8, num_layers=1, num_heads=2, mlp_dim=8,
            num_classes=3, gelu_approximate=False)
SIZE = TINY["image_size"]
IMAGENET_MEAN, IMAGENET_STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
ATOL = 1e-4


@pytest.fixture(scope="module")
def hub():
    return pytest.importorskip("keras_hub")


def randomize(model, seed=0):
    """Random values in every variable (LayerNorm scales and biases included), so that a
    misplaced array changes the logits."""
    rng = np.random.default_rng(seed)
    for variable in model.weights:
        variable.assign(rng.normal(0.0, 0.5, variable.shape).astype("float32"))
    return model


def images(seed=1):
    return np.random.default_rng(seed).integers(0, 256, (4, SIZE, SIZE, 3)).astype("float32")


def apply(preprocessing, pixels):
    """The data config applied to pixels in [0, 255], as its fields say."""
    return (pixels / 255.0 - np.asarray(preprocessing["mean"])) / np.asarray(preprocessing["std"])


def converter(hub, mean=IMAGENET_MEAN, std=IMAGENET_STD):
    return hub.layers.ViTImageConverter(
        image_size=(SIZE, SIZE), scale=[1 / (255 * s) for s in std],
        offset=[-m / s for m, s in zip(mean, std)])


def keras_hub_classifier(hub, pooling="token", class_token=True, intermediate_dim=None):
    backbone = hub.models.ViTBackbone(
        image_shape=(SIZE, SIZE, 3), patch_size=8, num_layers=2, num_heads=2, hidden_dim=8,
        mlp_dim=12, use_class_token=class_token, layer_norm_epsilon=1e-5)
    preprocessor = hub.models.ViTImageClassifierPreprocessor(image_converter=converter(hub))
    return randomize(hub.models.ViTImageClassifier(
        backbone=backbone, num_classes=3, preprocessor=preprocessor, pooling=pooling,
        intermediate_dim=intermediate_dim))


@pytest.mark.parametrize("pooling,class_token,intermediate_dim",
                         [("token", True, None), ("gap", False, 5)])
def test_from_pretrained_reads_a_classifier_preset_keras_hub_wrote(hub, tmp_path, pooling,
                                                                   class_token,
                                                                   intermediate_dim):
    classifier = keras_hub_classifier(hub, pooling, class_token, intermediate_dim)
    classifier.save_to_preset(tmp_path / "preset")
    model, info = builders.build_from_checkpoint(str(tmp_path / "preset"))
    preprocessing = info["entry"]["preprocessing"]
    assert preprocessing == dict(input_size=[3, SIZE, SIZE], interpolation="bilinear",
                                 crop_pct=1.0, crop_mode="crop_to_aspect_ratio",
                                 mean=IMAGENET_MEAN, std=IMAGENET_STD, antialias=False)
    config = keras_vit.vit_config(model)
    assert (config["classifier"], config["representation_size"], config["layer_norm_epsilon"],
            config["gelu_approximate"]) == (pooling, intermediate_dim, 1e-5, False)
    pixels = images()
    np.testing.assert_allclose(model(apply(preprocessing, pixels)),
                               classifier.predict(pixels, verbose=0), atol=ATOL)


@pytest.mark.parametrize("file, edit, phrase", [
    ("config.json", lambda c: c.update(layer_norm_epsilon=0.5),
     "disagree on the backbone's layer_norm_epsilon: 1e-05 in task.json, 0.5 in config.json"),
    ("preprocessor.json", lambda c: c["image_converter"]["config"].update(offset=0.0),
     "disagree on the preprocessor's image_converter.config.offset: "),
    ("image_converter.json", lambda c: c.update(offset=0.0),  # without a preprocessor.json
     "disagree on the preprocessor's image_converter's offset: "),
], ids=["backbone", "preprocessor", "image_converter"])
def test_a_preset_whose_copies_disagree_is_refused_naming_the_field(hub, tmp_path, file, edit,
                                                                    phrase):
    """keras-hub's classifier is built from the copies task.json embeds; the backbone and the
    preprocessor alone from config.json and preprocessor.json. A preset whose copies differ
    has no one answer."""
    classifier = keras_hub_classifier(hub)
    folder = tmp_path / "preset"
    classifier.save_to_preset(folder)
    if file == "image_converter.json":
        (folder / "preprocessor.json").unlink()
    document = json.loads((folder / file).read_text())
    edit(document["config"])
    (folder / file).write_text(json.dumps(document))
    task = hub.models.ImageClassifier.from_preset(str(folder))  # it reads task.json's copy
    assert task.backbone.layer_norm_epsilon == 1e-5
    np.testing.assert_allclose(task.preprocessor.image_converter.offset,
                               classifier.preprocessor.image_converter.offset)
    with pytest.raises(CheckpointError) as raised:
        keras_vit.from_pretrained(folder)
    assert phrase in str(raised.value) and "\n" not in str(raised.value)
    if file != "config.json":  # the data config alone, too
        with pytest.raises(CheckpointError, match=re.escape(phrase)):
            keras_vit.resolve_data_config(str(folder))


@pytest.mark.parametrize("flags", [dict(), dict(crop_to_aspect_ratio=False),
                                   dict(crop_to_aspect_ratio=False, pad_to_aspect_ratio=True),
                                   dict(interpolation="bicubic", antialias=True)])
def test_a_presets_preprocessing_is_keras_hubs_own_from_pixels_of_any_size(hub, tmp_path,
                                                                          flags):
    """keras-hub's converter, read from its preset, gives keras-hub's own input tensor (to
    1e-4) for photos of other sizes and shapes, and the same classes from pixels."""
    classifier = keras_hub_classifier(hub)
    classifier.preprocessor.image_converter = hub.layers.ViTImageConverter(
        image_size=(SIZE, SIZE), scale=[1 / (255 * s) for s in IMAGENET_STD],
        offset=[-m / s for m, s in zip(IMAGENET_MEAN, IMAGENET_STD)], **flags)
    classifier.save_to_preset(tmp_path / "preset")
    model = keras_vit.from_pretrained(tmp_path / "preset")
    for shape in ((45, 28, 3), (20, 61, 3), (SIZE, SIZE, 3)):
        pixels = np.random.default_rng(sum(shape)).integers(0, 256, shape).astype("float32")
        want = np.asarray(classifier.preprocessor.image_converter(pixels[None]))[0]
        got = np.asarray(keras_vit.images.eval_transform(pixels, model.data_config))
        np.testing.assert_allclose(got, want, atol=1e-4)
        logits = classifier.predict(pixels[None], verbose=0)[0]
        top = keras_vit.classify_images(model, pixels, top=3)[0]
        assert [int(i) for i, _, _ in top] == list(np.argsort(-logits))
        probabilities = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
        np.testing.assert_allclose([p for _, _, p in top], np.sort(probabilities)[::-1],
                                   atol=1e-4)


def test_a_timm_crop_is_written_only_on_request_with_the_closest_converter(hub, tmp_path,
                                                                         capsys):
    model = randomize(keras_vit.ViT(**TINY))
    model.data_config = dict(input_size=[3, SIZE, SIZE], interpolation="bicubic",
                             crop_pct=0.9, crop_mode="center", mean=IMAGENET_MEAN,
                             std=IMAGENET_STD)
    with pytest.raises(ValueError, match=r"crop_mode='center', crop_pct=0.9 \(timm's\).*"
                                         r"approximate=True") as refused:
        keras_vit.save_keras_hub_preset(model, tmp_path / "refused")
    assert "\n" not in str(refused.value) and not (tmp_path / "refused").exists()
    with pytest.warns(UserWarning, match="the preset crops as 'crop_to_aspect_ratio' at "
                                         "crop_pct 1.0"):
        path = keras_vit.save_keras_hub_preset(model, tmp_path / "preset", approximate=True)
    loaded = hub.models.ImageClassifier.from_preset(path)
    converter = loaded.preprocessor.image_converter
    assert (converter.crop_to_aspect_ratio, converter.interpolation, converter.antialias) == \
        (True, "bicubic", True)
    pixels = images()
    expected = np.asarray(model(keras_vit.preprocess_inputs(pixels, model)))  # ImageNet's
    np.testing.assert_allclose(loaded.predict(pixels, verbose=0), expected, atol=ATOL)
    weights.save_npz(model, tmp_path / "m.npz")
    (tmp_path / "config.json").write_text(json.dumps(config_json.keras_vit_document(
        keras_vit.vit_config(model), None, model.data_config)))
    assert cli.main(["convert", str(tmp_path / "m.npz"), str(tmp_path / "cli"), "--format",
                     "keras-hub"]) == 2
    assert "approximate-preprocessing" in capsys.readouterr().err
    assert cli.main(["convert", str(tmp_path / "m.npz"), str(tmp_path / "cli"), "--format",
                     "keras-hub", "--approximate-preprocessing"]) == 0
    assert "note: keras-hub's converter cannot do crop_mode 'center' at crop_pct 0.9" in \
        capsys.readouterr().out


def test_from_pretrained_reads_a_backbone_preset_as_features(hub, tmp_path):
    backbone = keras_hub_classifier(hub).backbone
    backbone.save_to_preset(tmp_path / "preset")
    converter(hub).save_to_preset(tmp_path / "preset")  # image_converter.json beside it
    model, info = builders.build_from_checkpoint(tmp_path / "preset")
    assert keras_vit.vit_config(model)["include_top"] is False
    pixels = images()
    expected = backbone.predict(converter(hub)(pixels), verbose=0)[:, 0]  # the class token
    np.testing.assert_allclose(model(apply(info["entry"]["preprocessing"], pixels)), expected,
                               atol=ATOL)


@pytest.mark.parametrize("arguments", [dict(qkv_bias=False, representation_size=5,
                                            layer_norm_epsilon=1e-5),
                                       dict(classifier="gap")],
                         ids=["token-no-qkv-bias-pre-logits", "gap"])
def test_a_preset_keras_vit_writes_loads_in_keras_hub_with_its_preprocessor(hub, tmp_path,
                                                                          arguments):
    model = randomize(keras_vit.ViT(**dict(TINY, **arguments)))
    path = keras_vit.save_keras_hub_preset(model, tmp_path / "preset")
    loaded = hub.models.ImageClassifier.from_preset(path)
    assert isinstance(loaded, hub.models.ViTImageClassifier) and loaded.preprocessor is not None
    pixels = images()
    expected = np.asarray(model(keras_vit.preprocess_inputs(pixels)))  # x / 127.5 - 1
    np.testing.assert_allclose(loaded.predict(pixels, verbose=0), expected, atol=ATOL)
    read_back, info = builders.build_from_checkpoint(path)  # and back, preprocessing included
    np.testing.assert_allclose(read_back(apply(info["entry"]["preprocessing"], pixels)),
                               expected, atol=ATOL)


def test_a_preset_keras_vit_writes_takes_the_data_config_the_model_carries(hub, tmp_path):
    model = randomize(keras_vit.ViT(**TINY))
    model.data_config = dict(input_size=[3, TINY["image_size"], TINY["image_size"]],
                             interpolation="bilinear", crop_pct=1.0, crop_mode="squash",
                             mean=IMAGENET_MEAN, std=IMAGENET_STD)
    path = keras_vit.save_keras_hub_preset(model, tmp_path / "preset")
    loaded = hub.models.ImageClassifier.from_preset(path)
    pixels = images()
    expected = np.asarray(model(keras_vit.preprocess_inputs(pixels, model)))  # ImageNet's
    np.testing.assert_allclose(loaded.predict(pixels, verbose=0), expected, atol=ATOL)


def test_convert_writes_a_preset_from_a_preset_keeping_its_preprocessing(hub, tmp_path,
                                                                        capsys):
    classifier = keras_hub_classifier(hub)
    classifier.save_to_preset(tmp_path / "source")
    # SOURCE names the folder by an absolute path (checked as a local path before loading).
    assert cli.main(["convert", str(tmp_path / "source"), str(tmp_path / "copy"),
                     "--format", "keras-hub"]) == 0
    assert "a keras-hub preset of" in capsys.readouterr().out
    pixels = images()
    copy = hub.models.ImageClassifier.from_preset(str(tmp_path / "copy"))
    np.testing.assert_allclose(copy.predict(pixels, verbose=0),
                               classifier.predict(pixels, verbose=0), atol=ATOL)


def test_destination_rules(hub, tmp_path):
    model = randomize(keras_vit.ViT(**TINY))
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="keras_vit did not write; it is never replaced"):
        keras_vit.save_keras_hub_preset(model, foreign, overwrite=True)
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]
    (tmp_path / "empty").mkdir()
    ours = keras_vit.save_keras_hub_preset(model, tmp_path / "empty")
    before = {p.name: p.read_bytes() for p in (tmp_path / "empty").iterdir()}
    with pytest.raises(fileio.DestinationExists, match="already holds a preset"):
        keras_vit.save_keras_hub_preset(model, ours)
    assert {p.name: p.read_bytes() for p in (tmp_path / "empty").iterdir()} == before
    other = randomize(keras_vit.ViT(**TINY), seed=5)
    keras_vit.save_keras_hub_preset(other, ours, overwrite=True)
    np.testing.assert_allclose(keras_vit.from_pretrained(ours)(np.zeros((1, SIZE, SIZE, 3))),
                               other(np.zeros((1, SIZE, SIZE, 3))), atol=ATOL)
    assert not [p for p in tmp_path.iterdir() if fileio.is_temporary(p.name)]


def test_a_file_at_the_destination_is_never_replaced(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "keras_hub", None)  # refused before keras-hub is needed
    (tmp_path / "preset").write_text("mine")
    with pytest.raises(fileio.DestinationExists, match="is a file"):
        keras_vit.save_keras_hub_preset(keras_vit.ViT(**TINY), tmp_path / "preset",
                                        overwrite=True)
    assert cli.main(["convert", "digits", str(tmp_path / "preset"), "--format", "keras-hub",
                     "--overwrite"]) == 2
    assert "OUT " + str(tmp_path / "preset") + " is a file" in capsys.readouterr().err
    assert (tmp_path / "preset").read_text() == "mine"


# (keras_vit.ViT arguments, a phrase of the refusal): nothing is written, keras-hub unneeded.
REFUSED = {
    "tanh GELU": (dict(gelu_approximate=True), "tanh-approximate GELU"),
    "hybrid": (dict(image_size=32, patch_size=2, resnet={"num_layers": ()}), "hybrid"),
    "2-D position embedding": (dict(position_embedding="learned_2d"), "'learned_2d'"),
    "fc_norm": (dict(classifier="gap", fc_norm=True), "fc_norm=True"),
    "gap beside a class token": (dict(classifier="gap", class_token=True),
                                 "averages the class token in"),
    "pre_logits without head": (dict(include_top=False, representation_size=4),
                                "pre_logits"),
}


@pytest.mark.parametrize("name", REFUSED)
def test_refuses_what_keras_hubs_vit_cannot_hold(tmp_path, monkeypatch, name):
    monkeypatch.setitem(sys.modules, "keras_hub", None)  # refused before keras-hub is needed
    arguments, phrase = REFUSED[name]
    model = keras_vit.ViT(**dict(TINY, **arguments))
    with pytest.raises(CheckpointError, match="keras-hub's ViT cannot hold") as raised:
        keras_vit.save_keras_hub_preset(model, tmp_path / "preset")
    assert phrase in str(raised.value) and "\n" not in str(raised.value)
    assert not os.path.exists(tmp_path / "preset")


def test_the_command_line_names_the_refusal(tmp_path, capsys):
    assert cli.main(["convert", "digits", str(tmp_path / "preset"), "--format",
                     "keras-hub"]) == 2
    err = capsys.readouterr().err
    assert "error: keras-hub's ViT cannot hold this model: it uses the tanh-approximate GELU" \
        in err and "Traceback" not in err
    assert not os.path.exists(tmp_path / "preset")


def test_without_keras_hub_one_line_names_pip_install(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "keras_hub", None)
    model = keras_vit.ViT(**TINY)
    with pytest.raises(ImportError, match="pip install keras-hub"):
        keras_vit.save_keras_hub_preset(model, tmp_path / "preset")
    write_preset_json(tmp_path / "read", "ViTBackbone", BACKBONE_CONFIG)
    (tmp_path / "read" / "model.weights.h5").write_bytes(b"read by keras-hub, not here")
    with pytest.raises(ImportError, match="pip install keras-hub"):
        keras_vit.from_pretrained(tmp_path / "read")
    assert cli.main(["convert", "digits", str(tmp_path / "preset"), "--format",
                     "keras-hub"]) == 2
    err = capsys.readouterr().err
    assert "pip install keras-hub" in err and "Traceback" not in err
    assert not os.path.exists(tmp_path / "preset")


BACKBONE_CONFIG = dict(image_shape=[SIZE, SIZE, 3], patch_size=[8, 8], num_layers=1, num_heads=2,
                       hidden_dim=8, mlp_dim=8, use_class_token=True)


def write_preset_json(folder, class_name, config, task=None):
    """A preset's JSON files as keras-hub writes them (no weights: read before them)."""
    os.makedirs(folder, exist_ok=True)

    def serialised(name, value):
        return dict(module="keras_hub", class_name=name, config=value,
                    registered_name=f"keras_hub>{name}")

    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(serialised(class_name, config), f)
    with open(os.path.join(folder, "metadata.json"), "w") as f:
        json.dump(dict(keras_hub_version="0.32.0"), f)
    if task is not None:
        with open(os.path.join(folder, "task.json"), "w") as f:
            json.dump(serialised("ViTImageClassifier", task), f)
    return folder


# (config.json class and config, task.json config or None, a phrase of the refusal).
UNREADABLE = {
    "not a ViT": ("ResNetBackbone", BACKBONE_CONFIG, None,
                  "describes a keras-hub 'ResNetBackbone'"),
    "no MLP biases": ("ViTBackbone", dict(BACKBONE_CONFIG, use_mlp_bias=False), None,
                      "use_mlp_bias=false; keras_vit's ViT always has these biases"),
    "gap with class token": ("ViTBackbone", BACKBONE_CONFIG, dict(num_classes=3, pooling="gap"),
                             "'gap' averages the class token"),
    "token without class token": ("ViTBackbone", dict(BACKBONE_CONFIG, use_class_token=False),
                                  dict(num_classes=3, pooling="token"),
                                  "pooling 'token' with use_class_token=false"),
    "channels": ("ViTBackbone", dict(BACKBONE_CONFIG, image_shape=[SIZE, SIZE, 1]), None,
                 "`image_shape` must be [height, width, 3]"),
}


@pytest.mark.parametrize("name", UNREADABLE)
def test_refuses_presets_keras_vits_vit_cannot_express(tmp_path, monkeypatch, name):
    monkeypatch.setitem(sys.modules, "keras_hub", None)  # refused from the JSON files alone
    class_name, config, task, phrase = UNREADABLE[name]
    folder = write_preset_json(tmp_path / "preset", class_name, config, task)
    with pytest.raises(CheckpointError) as raised:
        keras_vit.from_pretrained(folder)
    assert phrase in str(raised.value) and "\n" not in str(raised.value)


def test_a_folder_that_is_no_preset_is_named_as_such(tmp_path, capsys):
    (tmp_path / "folder").mkdir()
    with pytest.raises(CheckpointError, match="without config.json and metadata.json: not a "
                                              "keras-hub preset"):
        keras_vit.from_pretrained(tmp_path / "folder")
    assert cli.main(["convert", str(tmp_path / "folder"), str(tmp_path / "w.npz")]) == 2
    assert "not a keras-hub preset" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# Presets by keras-hub's name and handle, through keras-hub's own resolver and cache.

KERAS_HUB_PRESET_FILES = ("config.json", "metadata.json", "model.weights.h5", "task.json",
                          "task.weights.h5", "preprocessor.json", "image_converter.json")


def kaggle_cache(root, handle, folder, names=KERAS_HUB_PRESET_FILES):
    """A kagglehub cache under `root` holding the preset `folder` as the files of Kaggle
    Models' `handle` (OWNER/MODEL/FRAMEWORK/VARIATION/VERSION), laid out as kagglehub lays out
    the files it downloads one by one: each file, and its completion marker."""
    owner, model, framework, variation, version = handle.split("/")
    base = root / "models" / owner / model / framework / variation
    for name in names:
        (base / version).mkdir(parents=True, exist_ok=True)
        (base / version / name).write_bytes((folder / name).read_bytes())
        marker = base / ".complete" / version / f"{name}.complete"
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
    return root


def test_a_keras_hub_preset_by_name_and_handle_gives_keras_hubs_answer(hub, tmp_path,
                                                                     monkeypatch):
    """keras-hub's name of a ViT preset, its kaggle:// handle and an hf:// repository of a
    preset, each from a cache laid out as keras-hub's resolver lays it out (offline): the
    classifier keras-hub itself loads by that name, its logits from the same pixels, and the
    preset's preprocessing as the model's data config."""
    from test_checkpoint_registry import hub_cache, offline_hub  # noqa: F401

    name = "vit_base_patch16_224_imagenet"
    handle = hub.models.ViTImageClassifier.presets[name]["kaggle_handle"]
    classifier = keras_hub_classifier(hub)
    classifier.save_to_preset(tmp_path / "preset")
    monkeypatch.setenv("KAGGLEHUB_CACHE", str(kaggle_cache(
        tmp_path / "kaggle", handle.removeprefix("kaggle://"), tmp_path / "preset")))
    from huggingface_hub import constants as hub_constants

    hf = tmp_path / "hf-cache"
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(hf))
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    hub_cache(hf, {"keras-io/vit-tiny-test": tmp_path / "preset"}, KERAS_HUB_PRESET_FILES)
    theirs = hub.models.ImageClassifier.from_preset(name)  # keras-hub's own, by name
    pixels = images()
    want = theirs.predict(pixels, verbose=0)
    for source in (name, handle, "hf://keras-io/vit-tiny-test"):
        model = keras_vit.from_pretrained(source)
        assert model.data_config["mean"] == IMAGENET_MEAN, source
        np.testing.assert_allclose(model(keras_vit.preprocess_inputs(pixels, model)), want,
                                   atol=ATOL, err_msg=source)
        top = keras_vit.classify_images(model, pixels[:1], top=1)[0][0]
        assert int(top[0]) == int(np.argmax(want[0])), source
    from PIL import Image

    Image.fromarray(pixels[0].astype(np.uint8)).save(tmp_path / "image.png")
    assert cli.main(["predict", str(tmp_path / "image.png"), "--weights", name, "--top", "1",
                     "--quiet"]) == 0


def test_a_preset_handle_not_in_the_cache_offline_is_one_line_naming_the_file(hub, tmp_path,
                                                                            monkeypatch):
    monkeypatch.setenv("KAGGLEHUB_CACHE", str(tmp_path / "empty"))
    from huggingface_hub import constants as hub_constants

    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path / "hf-empty"))
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    classifier = keras_hub_classifier(hub)
    classifier.save_to_preset(tmp_path / "preset")
    # A cache with every file but the head's weights: never a classifier with a random head.
    kaggle_cache(tmp_path / "empty", "keras/vit/keras/vit_tiny_test/1", tmp_path / "preset",
                 [n for n in KERAS_HUB_PRESET_FILES if n != "task.weights.h5"])
    with pytest.raises(weights.DownloadError) as raised:
        keras_vit.from_pretrained("kaggle://keras/vit/keras/vit_tiny_test/1")
    message = str(raised.value)
    assert "task.weights.h5" in message and "\n" not in message and "cache" in message


def test_a_handle_keras_hub_cannot_parse_is_one_line_naming_it(hub):
    with pytest.raises(ValueError) as raised:
        keras_vit.from_pretrained("kaggle://keras/vit")
    message = str(raised.value)
    assert message.startswith("kaggle://keras/vit is not a preset handle keras-hub takes")
    assert "kaggle://{org}/{model}/keras/{variant}" in message and "\n" not in message
