"""`ViT.forward_intermediates`: the outputs of chosen blocks as feature maps, under timm's name
and arguments, equal to timm's own `forward_intermediates` on weights timm wrote.

The comparison runs where `KERAS_VIT_TIMM_PYTHON` names an interpreter with timm (the
`timm_python` fixture); the rest checks the API's shapes and arguments on tiny models, on the
backend the suite runs.
"""

import json
import pathlib
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_vit

ROOT = pathlib.Path(__file__).resolve().parent.parent
TINY = dict(image_size=32, patch_size=8, hidden_size=32, num_layers=3, num_heads=4, mlp_dim=64,
            num_classes=5)
# timm builds each model (random weights made non-trivial), writes it with `save_for_hf` and
# prints its `forward_intermediates` for each set of arguments on the same inputs.
TIMM_INTERMEDIATES = """
import json, pathlib, sys
import numpy as np
sys.path.insert(0, {root!r})
from benchmarks.contenders.timm_vit import import_timm
timm, _ = import_timm()
import torch
from timm.models import save_for_hf
torch.manual_seed(0)
out = {{}}
for case in json.loads({cases!r}):
    model = timm.create_model(case["name"], pretrained=False, **case["timm"]).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    save_for_hf(model, pathlib.Path({folder!r}) / case["key"], safe_serialization=True)
    images = torch.from_numpy(np.load({images!r})[:, :case["height"], :case["width"]])
    images = images.permute(0, 3, 1, 2).contiguous()
    answers = []
    for call in case["calls"]:
        nhwc = call.get("output_fmt", "NHWC") == "NHWC"  # keras_vit's default: timm's, moved
        with torch.no_grad():
            got = model.forward_intermediates(images, **dict(call, output_fmt="NCHW")
                                              if nhwc else call)
        final, maps = (None, got) if call.get("intermediates_only") else got
        flat = [list(m) if isinstance(m, tuple) else [m] for m in maps]
        if nhwc:
            flat = [[m[0].permute(0, 2, 3, 1), *m[1:]] for m in flat]
        answers.append(dict(final=None if final is None else final.tolist(),
                            maps=[[t.tolist() for t in m] for m in flat]))
    out[case["key"]] = answers
print(json.dumps(out))
"""
# Each case: a timm model, the keras_vit overrides it is read with, the input size, and the
# `forward_intermediates` arguments to compare (keras_vit's default "NHWC" is timm's "NCHW"
# moved to channels-last).
CASES = [
    dict(key="token", name="vit_base_patch16_224", height=32, width=32, overrides={},
         timm=dict(embed_dim=48, depth=3, num_heads=3, img_size=32, patch_size=8,
                   num_classes=5),
         calls=[dict(), dict(indices=[0, -1], norm=True, output_fmt="NCHW"),
                dict(indices=2, output_fmt="NLC", return_prefix_tokens=True,
                     intermediates_only=True),
                dict(indices=[1], norm=True, stop_early=True, intermediates_only=True),
                dict(indices=[1], stop_early=True)]),  # final: block 1's tokens, normed
    dict(key="gap", name="vit_base_patch16_224", height=32, width=32, overrides={},
         timm=dict(embed_dim=48, depth=2, num_heads=3, img_size=32, patch_size=8,
                   num_classes=5, class_token=False, global_pool="avg", fc_norm=True),
         calls=[dict(norm=True), dict(indices=1, output_fmt="NLC")]),
    dict(key="dynamic", name="vit_base_patch16_224", height=48, width=24,
         overrides=dict(dynamic_image_size=True),
         timm=dict(embed_dim=48, depth=2, num_heads=3, img_size=32, patch_size=8,
                   num_classes=5, dynamic_img_size=True),
         calls=[dict(norm=True, output_fmt="NCHW")]),
]
# timm's answers against keras_vit's, in float32.
TOLERANCE = 1e-4


def test_forward_intermediates_equals_timms_on_weights_timm_wrote(tmp_path, timm_python):
    rng = np.random.default_rng(0)
    images = rng.uniform(-1, 1, (2, 48, 32, 3)).astype(np.float32)
    np.save(tmp_path / "images.npy", images)
    code = TIMM_INTERMEDIATES.format(root=str(ROOT), cases=json.dumps(CASES),
                                     folder=str(tmp_path), images=str(tmp_path / "images.npy"))
    done = subprocess.run([timm_python, "-c", code], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    answers = json.loads(done.stdout.strip().splitlines()[-1])
    compared = 0
    for case in CASES:
        model = keras_vit.from_pretrained(tmp_path / case["key"] / "model.safetensors",
                                          **case["overrides"])
        batch = images[:, :case["height"], :case["width"]]
        for call, want in zip(case["calls"], answers[case["key"]]):
            got = model.forward_intermediates(batch, **call)
            final, maps = (None, got) if call.get("intermediates_only") else got
            assert len(maps) == len(want["maps"]), (case["key"], call)
            for ours, theirs in zip(maps, want["maps"]):
                ours = list(ours) if isinstance(ours, (tuple, list)) else [ours]
                for a, b in zip(ours, theirs, strict=True):
                    np.testing.assert_allclose(keras.ops.convert_to_numpy(a), np.array(b),
                                               atol=TOLERANCE, err_msg=f"{case['key']} {call}")
                    compared += 1
            if final is not None:
                np.testing.assert_allclose(keras.ops.convert_to_numpy(final),
                                           np.array(want["final"]), atol=TOLERANCE)
    assert compared == 16


def tiny(**overrides):
    keras.utils.set_random_seed(0)
    model = keras_vit.ViT(**dict(TINY, **overrides))
    rng = np.random.default_rng(1)
    model.set_weights([rng.normal(0, 0.2, w.shape).astype(w.dtype) for w in model.get_weights()])
    return model


def images(height=32, width=32):
    return np.random.default_rng(2).uniform(-1, 1, (2, height, width, 3)).astype(np.float32)


def test_the_last_block_normed_is_the_models_own_final_tokens():
    """The final tokens are what the classifier pools: the head on them gives the logits."""
    model = tiny()
    final, maps = model.forward_intermediates(images())
    assert [tuple(m.shape) for m in maps] == [(2, 4, 4, 32)] * 3
    pooled = model.get_layer("pool")(final)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(model.get_layer("head")(pooled)),
                               keras.ops.convert_to_numpy(model(images())), atol=1e-5)


@pytest.mark.parametrize("layout", [dict(scan=True), dict(remat=True)])
def test_a_scanned_model_gives_the_per_block_models_features(layout):
    want = tiny().forward_intermediates(images(), indices=[0, 2], intermediates_only=True)
    got = tiny(**layout).forward_intermediates(images(), indices=[0, 2],
                                              intermediates_only=True)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b),
                                   atol=1e-6)


def test_a_hybrid_gives_the_numpy_references_tokens_as_maps_of_its_feature_grid(tmp_path):
    """A hybrid (ResNet stem and two stages, a non-square 32x48 input: a 2x3 grid), loaded
    from an official-layout file: the final tokens and the last block's normed map are the
    float64 NumPy reference's (tests/reference.py), the class token apart."""
    import reference
    from test_hybrid import TINY as HYBRID, hybrid_params

    rng = np.random.default_rng(0)
    params = hybrid_params(rng, (1, 1), 2, (2, 3))
    np.savez(tmp_path / "hybrid.npz", **params)
    model = keras_vit.ViT(image_size=(32, 48), patch_size=2, resnet={"num_layers": (1, 1)},
                          **HYBRID)
    keras_vit.load_pretrained(model, str(tmp_path / "hybrid.npz"))
    x = rng.uniform(-1, 1, (2, 32, 48, 3)).astype(np.float32)
    _, tokens, _ = reference.forward(params, x)  # after encoder_norm: [B, 1 + 6, D]
    final, maps = model.forward_intermediates(x, indices=[-1], norm=True)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(final), tokens, atol=1e-5)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(maps[0]),
                               tokens[:, 1:].reshape(2, 2, 3, -1), atol=1e-5)


def test_a_model_of_any_size_gives_maps_of_each_inputs_grid():
    model = tiny(dynamic_image_size=True)
    for height, width in ((48, 24), (16, 40)):
        maps = model.forward_intermediates(images(height, width), indices=1,
                                           intermediates_only=True)
        assert [tuple(m.shape) for m in maps] == [(2, height // 8, width // 8, 32)]


def test_the_intermediates_model_trains_a_dense_head(tmp_path):
    """A segmentation head on the last block's map learns a per-patch target through `fit`;
    the backbone's weights are the ViT's own (trained with it unless frozen)."""
    model = tiny()
    backbone = model.intermediates_model(indices=1, intermediates_only=True, norm=True)
    backbone.trainable = False
    head = keras.layers.Conv2D(2, 1, name="patch_classes")
    segmenter = keras.Model(backbone.inputs, head(backbone.outputs[0]))
    segmenter.compile(optimizer=keras.optimizers.Adam(0.05),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    x = images()
    target = (np.arange(16).reshape(1, 4, 4) % 2).repeat(2, 0)  # alternate columns
    _, before = segmenter.evaluate(x, target, verbose=0)
    # 150 updates on the whole batch, in one epoch (an epoch's own overhead paid once).
    segmenter.fit(tf.data.Dataset.from_tensors((x, target)).repeat(150), shuffle=False,
                  verbose=0)
    _, after = segmenter.evaluate(x, target, verbose=0)
    assert before < 0.8 and after == 1.0
    assert backbone.get_layer("encoderblock_0") is model.get_layer("encoderblock_0")
    segmenter.save(tmp_path / "segmenter.keras")  # reads back, as every file keras_vit writes
    np.testing.assert_allclose(keras.saving.load_model(tmp_path / "segmenter.keras")(x),
                               segmenter(x), atol=1e-6)


@pytest.mark.parametrize("arguments, named", [
    (dict(indices=0), "indices"), (dict(indices=4), "indices"), (dict(indices=[3]), "3"),
    (dict(indices=[]), "indices"), (dict(indices="last"), "indices"),
    (dict(indices=[True]), "True"), (dict(output_fmt="NWHC"), "output_fmt"),
    (dict(norm="yes"), "norm"), (dict(intermediates_only=1), "intermediates_only"),
])
def test_bad_arguments_are_named_in_one_line(arguments, named):
    with pytest.raises(ValueError) as raised:
        tiny().forward_intermediates(images(), **arguments)
    assert named in str(raised.value) and "\n" not in str(raised.value)


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="SavedModel: TensorFlow")
@pytest.mark.parametrize("features, blocks", [
    (dict(indices=[0, -1], norm=True, return_prefix_tokens=True), [0, 2]),
    (dict(indices=1), [2]),  # one block: the backbone's one output
])
def test_a_saved_model_serves_the_same_features(tmp_path, features, blocks):
    import tensorflow as tf

    model = tiny()
    path = keras_vit.export_saved_model(model, tmp_path / "export", warmup=False,
                                        features=features)
    pixels = np.random.default_rng(3).uniform(0, 255, (2, 32, 32, 3)).astype(np.float32)
    signature = tf.saved_model.load(path).signatures["features"]
    served = signature(images=tf.constant(pixels))
    want = model.forward_intermediates(keras_vit.preprocess_inputs(pixels), **features,
                                       intermediates_only=True)
    prefix = features.get("return_prefix_tokens", False)
    assert sorted(served) == sorted(f"block_{i}{end}" for i in blocks
                                    for end in (["", "_prefix"] if prefix else [""]))
    for index, maps in zip(blocks, want):
        patches, tokens = maps if prefix else (maps, None)
        np.testing.assert_allclose(served[f"block_{index}"].numpy(),
                                   keras.ops.convert_to_numpy(patches), atol=1e-5)
        if prefix:
            np.testing.assert_allclose(served[f"block_{index}_prefix"].numpy(),
                                       keras.ops.convert_to_numpy(tokens), atol=1e-5)
    metadata = json.loads((pathlib.Path(path) / "assets.extra" / "keras_vit.json").read_text())
    assert metadata["features"]["indices"] == blocks and "features" in metadata["signatures"]
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"must be RGB pixels in \[0, 255\]"):
        signature(images=tf.constant(pixels - 128))


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="SavedModel: TensorFlow")
@pytest.mark.parametrize("features, named", [
    ("all", "features"), (dict(stop_early=True), "stop_early"), (dict(indices=[7]), "7")])
def test_bad_features_are_refused_before_writing(tmp_path, features, named):
    with pytest.raises(ValueError) as raised:
        keras_vit.export_saved_model(tiny(), tmp_path / "export", features=features)
    assert named in str(raised.value) and not (tmp_path / "export").exists()


def test_the_segmentation_example_trains_a_head_on_the_shipped_model(capsys):
    sys.path.insert(0, str(ROOT / "examples"))
    import segment_digits

    results = segment_digits.main(["--train-mosaics", "64", "--test-mosaics", "32",
                                   "--epochs", "1"])
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(printed) == {"pre-trained digits ViT", "random weights", "background"}
    assert all(0 <= value <= 1 for value in printed.values()) and printed == dict(
        results, background=printed["background"])
