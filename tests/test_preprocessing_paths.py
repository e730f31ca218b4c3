"""One preprocessing per checkpoint, on every path from pixels: a checkpoint normalised with
ImageNet's mean and std (bicubic, crop 0.875, as DeiT's), loaded from each kind of source,
gives the same answer through each consumer (`classify_images`, `load_image` +
`preprocess_inputs`, `keras-vit predict`, the SavedModel's `serving_default`, TFLite, ONNX).

The reference is independent of keras_vit's image code: timm's evaluation transform written
with PIL (`test_data_config.pil_eval_transform`), then `(x / 255 - mean) / std` in NumPy. The
model's head is scaled so that its outputs are peaked: the paper's preprocessing moves the
log-probabilities by far more than the tolerance (checked), so a path that lost the data config
cannot pass.
"""

import json
import pathlib
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_vit
import keras_vit_cli as cli
from keras_vit import data_config as dc
from keras_vit import weights
from keras_vit.weights import config_json, writers

from test_checkpoint_registry import offline_hub  # noqa: F401 - a fixture
from test_data_config import TINY, pil_eval_transform, smooth_image, write_png

ROOT = pathlib.Path(__file__).resolve().parent.parent

DEIT = dict(input_size=[3, 16, 16], interpolation="bicubic", crop_pct=0.875, crop_mode="center",
            mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
# The log-probabilities of a path may differ from the reference's by this much (PIL resizes in
# 8 bits); the paper's preprocessing differs by more than WRONG (checked on the reference).
TOLERANCE = 0.1
WRONG = 1.0
PHOTO_SIZES = ((30, 41), (45, 28), (16, 16))


def peaked_model():
    """A tiny classifier of 5 classes with random weights and a head scaled by 8."""
    keras.utils.set_random_seed(3)
    model = keras_vit.ViT(**dict(TINY, num_classes=5))
    rng = np.random.default_rng(3)
    model.set_weights([rng.normal(0, 0.5, w.shape).astype(w.dtype)
                       for w in model.get_weights()])
    head = model.get_layer("head")
    head.kernel.assign(head.kernel * 8.0)
    return model


def log_softmax(logits):
    logits = np.asarray(logits, np.float64)
    return logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(
        -1, keepdims=True)) - logits.max(-1, keepdims=True)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The checkpoint in every source kind, its photos, and the reference log-probabilities."""
    root = tmp_path_factory.mktemp("paths")
    model = peaked_model()
    (root / "npz").mkdir()
    weights.save_npz(model, root / "npz" / "model.npz")
    (root / "npz" / "config.json").write_text(json.dumps(config_json.keras_vit_document(
        keras_vit.vit_config(model), None, DEIT)))
    loaded = keras_vit.from_pretrained(root / "npz" / "model.npz")
    writers.save_safetensors(loaded, root / "st" / "model.safetensors")
    loaded.save(root / "model.keras")
    photos = [write_png(root / f"{i}.png", smooth_image(h, w, seed=i))
              for i, (h, w) in enumerate(PHOTO_SIZES)]
    pixels = [np.asarray(tf.io.decode_png(tf.io.read_file(str(p)))) for p in photos]

    def reference(config):
        inputs = np.stack([(pil_eval_transform(p, config) / 255 - config["mean"])
                           / config["std"] for p in pixels]).astype(np.float32)
        return log_softmax(keras.ops.convert_to_numpy(model(inputs)))

    want = reference(DEIT)
    paper = reference(dc.paper_data_config(16))
    assert np.abs(want - paper).max() > WRONG  # peaked enough to expose a wrong config
    sources = {"npz": root / "npz" / "model.npz", "safetensors": root / "st" / "model.safetensors",
               "keras": root / "model.keras"}
    return dict(root=root, model=loaded, photos=photos, pixels=pixels, want=want,
                sources=sources)


def assert_answer(got, want):
    """Same top-5 order and log-probabilities within TOLERANCE."""
    got = np.asarray(got, np.float64)
    assert np.abs(got - want).max() < TOLERANCE, np.abs(got - want).max()
    np.testing.assert_array_equal(np.argsort(-got, -1), np.argsort(-want, -1))


def load(source):
    if str(source).endswith(".keras"):
        return keras.saving.load_model(source)
    return keras_vit.from_pretrained(source)


@pytest.mark.parametrize("kind", ["npz", "safetensors", "keras"])
def test_every_source_gives_the_model_the_checkpoints_data_config(world, kind):
    source = world["sources"][kind]
    model = load(source)
    assert model.data_config == dc.check_data_config(DEIT)
    if kind != "keras":
        assert keras_vit.resolve_data_config(source) == dc.check_data_config(DEIT)
    # classify_images: from paths, and from arrays of any size.
    for given in (world["photos"], world["pixels"]):
        top = keras_vit.classify_images(model, given, top=5)
        got = np.full_like(world["want"], -np.inf)
        for i, classes in enumerate(top):
            for class_id, _, probability in classes:
                got[i, int(class_id)] = np.log(probability)
        assert_answer(got, world["want"])
    # The documented two-step recipe.
    batch = np.stack([keras_vit.load_image(p, data_config=model) for p in world["photos"]])
    logits = model(keras_vit.preprocess_inputs(batch, model))
    assert_answer(log_softmax(keras.ops.convert_to_numpy(logits)), world["want"])


def test_the_command_line_predicts_as_the_checkpoint_says(world, capsys):
    for path, want in zip(world["photos"], world["want"]):
        assert cli.main(["predict", str(path), "--weights", str(world["sources"]["npz"]),
                         "--top-k", "5"]) == 0
        shown = [float(line.split("%")[0]) / 100 for line in
                 capsys.readouterr().out.splitlines() if "%" in line]
        shown, expected = np.array(shown), np.exp(np.sort(want)[::-1])
        seen = shown >= 0.01  # printed with two decimals in percent
        np.testing.assert_allclose(np.log(shown[seen]), np.log(expected[seen]), atol=TOLERANCE)
        np.testing.assert_allclose(shown, expected, atol=1e-3)


def test_the_saved_model_serves_as_the_checkpoint_says(world):
    from keras_vit import export

    path = export.export_saved_model(world["model"], world["root"] / "export", warmup=False,
                                     jit_compile=False)
    assert export.read_metadata(path)["data_config"] == dc.check_data_config(DEIT)
    serve = tf.saved_model.load(path).signatures["serving_default"]
    encoded = [p.read_bytes() for p in world["photos"]]
    got = serve(image_bytes=tf.constant(encoded))["probabilities"].numpy()
    assert_answer(np.log(got), world["want"])


def test_tflite_normalises_as_the_checkpoint_says(world):
    from keras_vit import tflite

    path = tflite.export_tflite(world["model"], world["root"] / "m.tflite")
    batch = np.stack([keras_vit.load_image(p, data_config=world["model"])
                      for p in world["photos"]])
    assert_answer(np.log(tflite.run_tflite(path, batch)), world["want"])


def test_onnx_normalises_in_its_graph_and_states_its_data_config(world):
    pytest.importorskip("tf2onnx")
    from keras_vit import onnx_export

    model = world["model"]
    batch = np.stack([keras_vit.load_image(p, data_config=model) for p in world["photos"]])
    path = keras_vit.export_onnx(model, world["root"] / "m.onnx")
    stated = onnx_export.file_metadata(path)
    assert stated["data_config"] == dc.check_data_config(DEIT)
    assert "[0, 255]" in stated["input"]
    assert_answer(log_softmax(onnx_export.run_onnx(path, batch)), world["want"])
    # On request, the graph alone: the caller normalises with the metadata's mean and std.
    raw = keras_vit.export_onnx(model, world["root"] / "raw.onnx", preprocessing=False)
    config = onnx_export.file_metadata(raw)["data_config"]
    normalised = (batch / 255 - np.array(config["mean"])) / np.array(config["std"])
    assert_answer(log_softmax(onnx_export.run_onnx(raw, normalised.astype(np.float32))),
                  world["want"])


def test_a_first_prediction_of_a_few_images_is_not_traced_and_gives_the_same_answer(world):
    # Keras' own call (no prediction function made) where it is cheaper: the model's first
    # prediction of at most EAGER_IMAGES; predict_on_batch otherwise, with the same answer.
    few, many = (keras_vit.from_pretrained(world["sources"]["npz"]) for _ in range(2))
    photos = world["photos"]
    assert len(photos) <= keras_vit.images.EAGER_IMAGES < 2 * len(photos)
    called = keras_vit.classify_images(few, photos, top=5)
    assert few.predict_function is None
    traced = keras_vit.classify_images(many, photos * 2, top=5)[:len(photos)]
    assert many.predict_function is not None
    for got, want in zip(called, traced):
        assert [c for c, _, _ in got] == [c for c, _, _ in want]
        np.testing.assert_allclose([p for _, _, p in got], [p for _, _, p in want], atol=1e-5)


def test_classify_images_refuses_what_it_cannot_read_in_one_line(world, tmp_path):
    model = world["model"]
    (tmp_path / "bad.png").write_bytes(b"not an image")
    for given, message in ((tmp_path / "missing.png", "missing.png"),
                           (tmp_path / "bad.png", "bad.png"),
                           ([], "got no images"), (7, "Received: int"),
                           (np.zeros((16, 16, 4), np.uint8), r"Received shape \(16, 16, 4\)"),
                           (np.zeros((16, 16, 3), bool), "of bool"),
                           ([np.zeros((0, 0, 3), np.uint8)], "an empty image"),
                           # Out of [0, 255] before the resize, which clips to it.
                           (np.full((20, 20, 3), 200 * 257.0, np.float32), "51400 to 51400"),
                           (np.full((20, 20, 3), -128.0, np.float32), "from -128"),
                           (np.full((20, 20, 3), 0.5, np.float32), "multiply them by 255")):
        with pytest.raises((ValueError, FileNotFoundError), match=message) as raised:
            keras_vit.classify_images(model, given)
        assert "\n" not in str(raised.value)
    for names in ("abc", ["a", "b"], [0, 1, 2]):  # a string is no list of 3 names
        with pytest.raises(ValueError, match="class_names"):
            keras_vit.classify_images(model, np.zeros((16, 16, 3), np.uint8), class_names=names)
    with pytest.raises(ValueError, match="`max_pixels` must be a positive integer"):
        keras_vit.classify_images(model, tmp_path / "bad.png", max_pixels="3")
    for size in (0, False, (), "", 0.0):  # none is a size, though each is falsy
        with pytest.raises(ValueError, match="`size` must be a positive int"):
            keras_vit.load_image(tmp_path / "bad.png", size=size)


# ------------------------------------------------------------------------------------------
# Against timm itself: files timm writes, timm's own transform and model on a photo.

TIMM_FROM_PIXELS = """
import json, pathlib, re, sys
import numpy as np
sys.path.insert(0, {root!r})
from benchmarks.contenders.timm_vit import import_timm
timm, _ = import_timm()
import torch
from PIL import Image
from timm.models import save_for_hf
from torchvision import transforms
torch.manual_seed(0)
photo = Image.open({photo!r}).convert("RGB")
out = {{}}
for name in json.loads({names!r}):
    side = 2 * int(re.search(r"patch(\\d+)", name)[1])
    model = timm.create_model(name, pretrained=False, depth=1, img_size=side,
                              num_classes=5).eval()
    with torch.no_grad():
        for p in model.parameters():  # non-trivial values everywhere
            p.add_(torch.randn_like(p) * 0.1)
        model.get_classifier().weight.mul_({head_scale})  # peaked outputs
    model.pretrained_cfg = dict(model.pretrained_cfg, input_size=(3, side, side))
    config = timm.data.resolve_model_data_config(model)
    transform = timm.data.create_transform(**config, is_training=False)
    paper = transforms.Compose([transforms.Resize((side, side)), transforms.ToTensor(),
                                transforms.Normalize([0.5] * 3, [0.5] * 3)])
    with torch.no_grad():
        answers = [torch.log_softmax(model(t(photo)[None]), -1)[0].tolist()
                   for t in (transform, paper)]
    save_for_hf(model, pathlib.Path({folder!r}) / name, safe_serialization=True)
    out[name] = dict(config={{k: list(v) if isinstance(v, tuple) else v
                             for k, v in config.items()}}, timm=answers[0], paper=answers[1])
# timm's older config.json layout (the pretrained_cfg's fields at the top), which it still reads.
import shutil
folder, name = pathlib.Path({folder!r}), {legacy!r}
document = json.loads((folder / name / "config.json").read_text())
flat = dict(document["pretrained_cfg"], architecture=document["architecture"],
            num_classes=document["num_classes"])
(folder / "legacy").mkdir()
(folder / "legacy" / "config.json").write_text(json.dumps(flat))
shutil.copy(folder / name / "model.safetensors", folder / "legacy")
side = 2 * int(re.search(r"patch(\\d+)", name)[1])
model = timm.create_model("local-dir:" + str(folder / "legacy"), pretrained=True, depth=1,
                          img_size=side, num_classes=5).eval()
config = timm.data.resolve_model_data_config(model)
with torch.no_grad():
    answer = torch.log_softmax(model(timm.data.create_transform(**config)(photo)[None]), -1)
out["legacy"] = dict(config={{k: list(v) if isinstance(v, tuple) else v
                             for k, v in config.items()}}, timm=answer[0].tolist())
cfgs = {{name: timm.models.get_pretrained_cfg(name).to_dict()
        for name in json.loads({every!r})}}
print(json.dumps(dict(answers=out, pretrained_cfgs=cfgs)))
"""


def distinct_timm_preprocessings():
    """One timm registry name for each distinct preprocessing (resolution aside) timm's
    checkpoints in the registry use."""
    chosen = {}
    for entry in keras_vit.list_checkpoints("timm"):
        config = dict(entry["preprocessing"], input_size=None)
        chosen.setdefault(json.dumps(config, sort_keys=True), entry["name"])
    return list(chosen.values())


def test_every_timm_preprocessing_gives_timms_own_answer_from_pixels(tmp_path, timm_python,
                                                                    offline_hub, monkeypatch):
    """For each distinct preprocessing of timm's checkpoints in the registry, a model timm
    built and wrote (peaked head), a photo through timm's `create_transform` and model, and
    the same photo through keras_vit by the checkpoint's registry name (from a Hugging Face
    cache laid out as the Hub's) and by the file timm wrote: the same data config, the same
    top-5 and log-probabilities within TOLERANCE; TFLite and ONNX of an ImageNet-normalised
    one too; and a file whose config.json is in timm's older layout (no `pretrained_cfg`).
    And every timm registry entry's data config is timm's `pretrained_cfg`'s."""
    import subprocess

    from test_checkpoint_registry import hub_cache, use_stand_in

    names = distinct_timm_preprocessings()
    every = [entry["name"] for entry in keras_vit.list_checkpoints("timm")]
    assert len(names) >= 7  # ImageNet's, CLIP's, 0.5 and 0/1 means; crops 0.875, 0.9, 1, squash
    photo = write_png(tmp_path / "photo.png", smooth_image(52, 77, seed=5))
    imagenet = next(n for n in names if keras_vit.resolve_data_config(n)["mean"][0] == 0.485)
    code = TIMM_FROM_PIXELS.format(root=str(ROOT), photo=str(photo), names=json.dumps(names),
                                   folder=str(tmp_path / "timm"), head_scale=5.0,
                                   every=json.dumps(every), legacy=imagenet)
    done = subprocess.run([timm_python, "-c", code], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    printed = json.loads(done.stdout.strip().splitlines()[-1])
    answers = printed["answers"]
    # Every timm checkpoint the registry knows: its data config is timm's pretrained_cfg's.
    assert len(printed["pretrained_cfgs"]) == len(every) > 60
    for name, cfg in printed["pretrained_cfgs"].items():
        assert keras_vit.resolve_data_config(name) == dc.timm_data_config(cfg), name
    hub_cache(offline_hub, {f"timm/{name}": tmp_path / "timm" / name for name in names})
    for name in names:  # depth 1, two patches a side, 5 classes
        side = 2 * int(re.search(r"patch(\d+)", name)[1])
        use_stand_in(monkeypatch, name, num_layers=1, resolution=side, num_classes=5)
    answers["legacy"]["paper"] = answers[imagenet]["paper"]  # the same weights
    for name in names + ["legacy"]:
        want, wrong = np.array(answers[name]["timm"]), np.array(answers[name]["paper"])
        assert np.abs(want - wrong).max() > WRONG, name  # the paper's would be caught
        # The file timm wrote, and its folder (as timm's local-dir: and transformers read it).
        sources = [tmp_path / "timm" / name / "model.safetensors", tmp_path / "timm" / name]
        for source in sources + ([name] if name != "legacy" else []):
            model = keras_vit.from_pretrained(source)
            stated = answers[name]["config"]
            assert {k: model.data_config[k] for k in dc.FIELDS} == \
                {k: stated[k] for k in dc.FIELDS}, (name, source)
            top = keras_vit.classify_images(model, photo, top=5)[0]
            assert [int(i) for i, _, _ in top] == list(np.argsort(-want)), (name, source)
            assert_log_close(np.log([p for _, _, p in top]), np.sort(want)[::-1],
                             f"{name} from {source}")
    # TFLite and ONNX of an ImageNet-normalised checkpoint (DINO's), from pixels.
    from keras_vit import onnx_export, tflite

    name = next(n for n in names if answers[n]["config"]["mean"][0] == 0.485)
    model = keras_vit.from_pretrained(name)
    pixels = keras_vit.load_image(photo, data_config=model)[None]
    want = np.array(answers[name]["timm"])
    path = tflite.export_tflite(model, tmp_path / "m.tflite")
    assert_log_close(np.log(tflite.run_tflite(path, pixels)[0]), want, "TFLite")
    path = keras_vit.export_onnx(model, tmp_path / "m.onnx")
    assert_log_close(log_softmax(onnx_export.run_onnx(path, pixels))[0], want, "ONNX")


def assert_log_close(got, want, what):
    """Log-probabilities within TOLERANCE for the classes of probability 1e-3 or more (timm's
    PIL resizes in 8 bits: relative differences of about 1% in the far tail); the rest
    below 1e-3 on both sides."""
    seen = np.maximum(got, want) >= np.log(1e-3)
    np.testing.assert_allclose(got[seen], want[seen], atol=TOLERANCE, err_msg=what)
    assert np.all(np.exp(got[~seen]) < 1e-3) and np.all(np.exp(want[~seen]) < 1e-3), what


def test_the_new_flags_are_refused_where_they_do_not_apply(tmp_path, capsys):
    assert cli.main(["export", str(tmp_path / "m.tflite"), "--format", "tflite", "--weights",
                     "digits", "--no-preprocessing"]) == 2
    err = capsys.readouterr().err
    assert "--no-preprocessing does not apply to --format tflite." in err
    assert "Traceback" not in err
    assert cli.main(["convert", "digits", str(tmp_path / "x.npz"),
                     "--approximate-preprocessing"]) == 2
    err = capsys.readouterr().err
    assert "--approximate-preprocessing applies to --format keras-hub only." in err
    assert "Traceback" not in err
    assert list(tmp_path.iterdir()) == []
