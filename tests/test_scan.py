"""The scanned encoder (`keras_vit.ViT(scan=True)`): the per-block model's weights, names and
outputs in one `Encoder` layer named `Transformer`, so that loading, saving, conversion, export, inspection and
masked-patch pre-training work on it unchanged. On TensorFlow it applies its blocks one after
the other; the scan itself runs on JAX (`tests/test_jax.py`)."""

import json
import warnings

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit import inspection, pretraining, routes, weights
from keras_vit import Encoder
from keras_vit.weights.keymap import checkpoint_variables

CONFIG = dict(image_size=16, patch_size=8, hidden_size=16, num_layers=3, num_heads=2, mlp_dim=24,
              num_classes=5)


def randomise(model, seed=0):
    rng = np.random.default_rng(seed)
    for variable in model.weights:  # the zero head too, so that the logits differ
        variable.assign(rng.normal(scale=0.3, size=variable.shape).astype("float32"))
    return model


def images(count=3, seed=1):
    return np.random.default_rng(seed).uniform(-1, 1, (count, 16, 16, 3)).astype("float32")


@pytest.fixture(scope="module")
def pair():
    plain = randomise(keras_vit.ViT(**CONFIG))
    scanned = keras_vit.ViT(scan=True, **CONFIG)
    variables = checkpoint_variables(scanned)
    for key, variable in checkpoint_variables(plain).items():  # by name, not by position
        variables[key].assign(variable.value)
    return plain, scanned


def test_the_scanned_model_has_the_per_block_weights_under_the_checkpoint_names(pair):
    plain, scanned = pair
    assert "Transformer" in [layer.name for layer in scanned.layers]
    assert not any(layer.name.startswith("encoderblock_") for layer in scanned.layers)
    # The variables' paths are the checkpoint keys; the keys are the per-block model's.
    assert "Transformer/encoderblock_2/MlpBlock_3/Dense_1/kernel" in [
        v.path for v in scanned.weights]
    assert sorted(checkpoint_variables(scanned)) == sorted(checkpoint_variables(plain))
    assert scanned.count_params() == plain.count_params()
    np.testing.assert_allclose(scanned.predict(images(), verbose=0),
                               plain.predict(images(), verbose=0), atol=1e-5)
    config = keras_vit.vit_config(scanned)
    assert config["scan"] is True and config["num_layers"] == 3
    assert "scan" not in keras_vit.vit_config(plain)  # the 0.4 layout's flag, where it is set
    config.pop("scan")
    assert dict(config, name=None) == dict(keras_vit.vit_config(plain), name=None)


def test_the_scan_route_takes_the_inputs_the_graph_takes(pair):
    # On TensorFlow the route runs the blocks in turn, through the same path as on JAX.
    plain, _ = pair
    x = images()
    pixels = np.random.default_rng(3).integers(0, 256, (2, 16, 16, 3)).astype("uint8")
    want = [np.asarray(plain(x)), np.asarray(plain(pixels))]
    with routes.use_routes(scan="blocks"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # that it cannot scan here, said once
        got = [plain({"image": x}), plain([x]), plain(pixels)]
    for value, expected in zip(got, want[:1] * 2 + want[1:]):
        np.testing.assert_allclose(np.asarray(value), expected, atol=1e-6)


def test_per_block_gives_the_per_block_model_with_the_same_outputs(pair):
    plain, scanned = pair
    twin = keras_vit.per_block(scanned)
    assert [f"encoderblock_{i}" in [layer.name for layer in twin.layers] for i in range(3)] \
        == [True] * 3
    assert "scan" not in keras_vit.vit_config(twin)
    np.testing.assert_allclose(twin.predict(images(), verbose=0),
                               scanned.predict(images(), verbose=0), atol=1e-6)
    assert keras_vit.per_block(plain) is plain


def test_scanned_model_saves_loads_and_converts_like_the_per_block_model(pair, tmp_path):
    plain, scanned = pair
    scanned.save(tmp_path / "scanned.keras")
    again = keras.saving.load_model(tmp_path / "scanned.keras")
    assert isinstance(again.get_layer("Transformer"), Encoder) and \
        again.get_layer("Transformer").scan
    np.testing.assert_allclose(again.predict(images(), verbose=0),
                               plain.predict(images(), verbose=0), atol=1e-5)
    # Official-layout .npz both ways: the scanned model writes the per-block model's file.
    weights.save_npz(scanned, tmp_path / "scanned.npz")
    written, expected = weights.read_npz(tmp_path / "scanned.npz"), weights.model_params(plain)
    assert sorted(written) == sorted(expected)
    for key, value in expected.items():
        np.testing.assert_array_equal(written[key], value, err_msg=key)
    weights.save_npz(plain, tmp_path / "plain.npz")
    loaded = keras_vit.from_pretrained(tmp_path / "plain.npz", scan=True)
    assert keras_vit.vit_config(loaded)["scan"] is True
    np.testing.assert_allclose(loaded.predict(images(), verbose=0),
                               plain.predict(images(), verbose=0), atol=1e-5)


def test_inspection_reads_a_scanned_model_through_its_per_block_twin(pair):
    plain, scanned = pair
    assert inspection.geometry(scanned) == inspection.geometry(plain)
    np.testing.assert_allclose(inspection.attention_weights(scanned, images()),
                               inspection.attention_weights(plain, images()), atol=1e-5)
    np.testing.assert_allclose(keras_vit.mean_attention_distance(scanned, images()),
                               keras_vit.mean_attention_distance(plain, images()), atol=1e-4)


def test_masked_patch_model_runs_the_scanned_encoder(pair):
    plain, scanned = pair
    models = [pretraining.masked_patch_model(vit, seed=3) for vit in (plain, scanned)]
    models[1].get_layer("mpp_head").set_weights(models[0].get_layer("mpp_head").get_weights())
    outputs = [model(images(), training=False) for model in models]
    np.testing.assert_allclose(outputs[1]["predictions"], outputs[0]["predictions"], atol=1e-5)
    assert models[1].encoder_config["scan"] is True


def test_scanned_encoder_config_round_trips_and_checks_its_arguments():
    layer = Encoder(4, 2, 32, dropout_rate=0.1, scan=True, remat=True, name="Transformer")
    config = layer.get_config()
    assert {k: config[k] for k in ("num_layers", "num_heads", "mlp_dim", "dropout_rate",
                                   "scan", "remat")} == dict(
        num_layers=4, num_heads=2, mlp_dim=32, dropout_rate=0.1, scan=True, remat=True)
    assert "kernels" not in config  # execution routes are no architecture
    # A config of 0.3, which saved the routes, loads without them.
    again = Encoder.from_config(dict(config, kernels={"attention": "products"}))
    again.build((None, 5, 16))
    assert [block.name for block in again.blocks] == [f"encoderblock_{i}" for i in range(4)]
    assert again.scan and again.remat
    assert all(block.dropout_rate == 0.1 and not hasattr(block, "kernels")
               for block in again.blocks)
    with pytest.raises(ValueError, match="num_layers=0"):
        Encoder(0, 2, 32)
    with pytest.raises(ValueError, match="dropout_rate"):
        Encoder(2, 2, 32, dropout_rate=1.5)
    with pytest.raises(ValueError, match="remat"):
        Encoder(2, 2, 32, remat="yes")
    with pytest.raises(ValueError, match="scan"):
        keras_vit.ViT(scan="yes", **CONFIG)


def test_scan_and_remat_flags_reach_the_run_config(tmp_path, image_folder):
    from keras_vit_cli import main

    folder = image_folder
    config = json.dumps({k: v for k, v in CONFIG.items() if k != "num_classes"})
    status = main(["train", "--scan", "--remat", "--folder", str(folder), "--model-config", config,
                   "--batch-size", "4", "--epochs", "1", "--validation-split", "none",
                   "--verbose", "0", "--output", str(tmp_path / "run")])
    assert status == 0
    # --scan and --remat are routes, chosen for the run and saved nowhere.
    written = json.loads((tmp_path / "run" / "config.json").read_text())
    assert "scan" not in written["model"] and "remat" not in written["model"]
    assert {k: routes.chosen_routes()[k] for k in ("scan", "remat")} == dict(scan="blocks",
                                                                             remat="blocks")
    # The run's sidecar rebuilds the per-block model; its weights load into either layout.
    plain = keras_vit.from_pretrained(tmp_path / "run" / "final.npz")
    scanned = keras_vit.from_pretrained(tmp_path / "run" / "final.npz", scan=True)
    assert [keras_vit.vit_config(m).get("scan") for m in (scanned, plain)] == [True, None]
    np.testing.assert_allclose(scanned.predict(images(), verbose=0),
                               plain.predict(images(), verbose=0), atol=1e-5)
    assert np.abs(plain.get_layer("head").get_weights()[0]).max() > 0  # trained


def test_a_run_resumes_only_in_the_layout_it_was_started_in(tmp_path):
    import argparse

    from keras_vit import data, training
    from keras_vit_cli.common import run_architecture

    class Crash(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            raise KeyboardInterrupt("simulated crash")

    rng = np.random.default_rng(0)
    train = data.from_arrays(rng.integers(0, 256, (8, 16, 16, 3), dtype=np.uint8),
                             np.arange(8) % 5, image_size=16, batch_size=4, training=True, seed=1)
    with pytest.raises(KeyboardInterrupt):
        training.fit(keras_vit.ViT(**CONFIG), train, output_dir=tmp_path, epochs=2, verbose=0,
                     callbacks=[Crash()])
    files = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    # The backup holds the per-block layers: refused in one line, before anything changes.
    with pytest.raises(ValueError, match=r"other settings \(scan False -> True\)"):
        training.fit(keras_vit.ViT(scan=True, **CONFIG), train, output_dir=tmp_path, epochs=2,
                     verbose=0)
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == files
    summary = training.fit(keras_vit.ViT(**CONFIG), train, output_dir=tmp_path, epochs=2,
                           verbose=0)
    assert summary["resumed_at_epoch"] == 1
    # A run started with scan=True or remat=True in its model (0.4's --scan and --remat)
    # resumes from the command line in that layout; any other run's flags are the routes alone.
    flags = dict(scan=True, remat=True, overwrite=False)
    assert run_architecture(argparse.Namespace(output=str(tmp_path), **flags)) is None
    for layout in ("scan", "remat"):
        with pytest.raises(KeyboardInterrupt):
            training.fit(keras_vit.ViT(**{layout: True}, **CONFIG), train, epochs=2, verbose=0,
                         output_dir=tmp_path / layout, callbacks=[Crash()])
        assert run_architecture(argparse.Namespace(output=str(tmp_path / layout), **flags)) \
            == {layout: True}
        assert run_architecture(argparse.Namespace(
            output=str(tmp_path / layout), **dict(flags, overwrite=True))) is None


def test_per_block_keeps_the_models_precision_policy():
    keras.config.set_dtype_policy("mixed_bfloat16")
    scanned = keras_vit.ViT(scan=True, **CONFIG)
    keras.config.set_dtype_policy("float32")
    twin = keras_vit.per_block(scanned)
    assert twin.get_layer("encoderblock_0").dtype_policy.name == "mixed_bfloat16"
    assert keras.config.dtype_policy().name == "float32"
