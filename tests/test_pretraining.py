"""Masked patch prediction (`keras_vit.pretraining`): the corruption's statistics, the targets
against NumPy, learning, the shared encoder, `training.fit` with a crash and a resume, and the
`keras-vit pretrain` command followed by `keras-vit train` from its encoder."""

import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_vit
import keras_vit_cli as cli
from keras_vit import builders, data, pretraining, training, weights

TINY = dict(image_size=8, patch_size=4, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=16,
            num_classes=3)


def uint8_images(count, size=8, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (count, size, size, 3), dtype=np.uint8)


# ------------------------------------------------------------------------------------------
# The corruption.


def classify_positions(patches, corrupted, mask_embedding):
    """Per position: 'mask' (the [mask] embedding), 'random' (another patch of the same image),
    'kept' (itself); exactly one holds everywhere (patches are distinct random vectors)."""
    num = patches.shape[1]
    kept = np.all(corrupted == patches, -1)  # [B, N]
    masked = np.all(corrupted == mask_embedding, -1)
    equal = np.all(corrupted[:, :, None] == patches[:, None], -1)  # [B, N, N]: out i == in j
    equal[:, np.arange(num), np.arange(num)] = False
    randomised = equal.any(-1)
    assert np.all(kept.astype(int) + masked + randomised == 1)
    return masked, randomised, kept


def test_corruption_statistics_over_many_draws():
    batch, num, width, draws = 256, 16, 8, 8
    patches = np.random.default_rng(0).normal(size=(batch, num, width)).astype("float32")
    layer = pretraining.PatchCorruption(seed=1)
    layer.build((None, num, width))
    mask_embedding = keras.ops.convert_to_numpy(layer.mask_embedding)
    totals = dict(mask=0, random=0, kept=0)
    per_position = np.zeros(num)
    previous = None
    for _ in range(draws):
        out, selected = (keras.ops.convert_to_numpy(t) for t in layer(patches, training=True))
        selected = selected > 0
        assert np.all(selected.sum(1) == 8)  # exactly 50% of every image's patches
        masked, randomised, kept = classify_positions(patches, out, mask_embedding)
        assert np.all(kept[~selected])  # only the selected positions change
        totals["mask"] += masked[selected].sum()
        totals["random"] += randomised[selected].sum()
        totals["kept"] += kept[selected].sum()
        per_position += selected.sum(0)
        assert previous is None or not np.array_equal(selected, previous)  # fresh draws
        previous = selected
    count = batch * 8 * draws  # 16,384 selected positions
    assert totals["mask"] / count == pytest.approx(0.8, abs=0.015)
    assert totals["random"] / count == pytest.approx(0.1, abs=0.01)
    assert totals["kept"] / count == pytest.approx(0.1, abs=0.01)
    np.testing.assert_allclose(per_position / (batch * draws), 0.5, atol=0.05)  # uniform

    out, weights_ = layer(patches, training=False)  # inference: nothing corrupted, all count
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(out), patches)
    assert np.all(keras.ops.convert_to_numpy(weights_) == 1)
    # Another rate: round(0.3 * 16) = 5 per image.
    _, selected = pretraining.PatchCorruption(mask_rate=0.3, seed=0)(patches, training=True)
    assert np.all(keras.ops.convert_to_numpy(selected).sum(1) == 5)


@pytest.mark.parametrize("classifier", ["token", "gap"])
def test_only_patch_positions_are_selected_never_the_class_token(classifier):
    vit = keras_vit.ViT(**dict(TINY, image_size=16, classifier=classifier))  # 16 patches
    model = pretraining.masked_patch_model(vit, seed=0)
    images = keras_vit.preprocess_inputs(uint8_images(64, 16))
    sequence, selected = model.embed(images, training=True)
    clean, _ = model.embed(images, training=False)
    sequence, selected, clean = (keras.ops.convert_to_numpy(t)
                                 for t in (sequence, selected, clean))
    prefix = 1 if classifier == "token" else 0
    assert sequence.shape == (64, prefix + 16, 16) and selected.shape == (64, 16)
    assert np.all(selected.sum(1) == 8)
    if prefix:
        np.testing.assert_array_equal(sequence[:, 0], clean[:, 0])  # the class token
    patches, clean_patches = sequence[:, prefix:], clean[:, prefix:]
    unselected = selected == 0
    np.testing.assert_array_equal(patches[unselected], clean_patches[unselected])
    assert not np.allclose(patches[~unselected], clean_patches[~unselected])


# ------------------------------------------------------------------------------------------
# The targets, against NumPy in float64.


def numpy_color(mean):
    levels = np.minimum(np.floor((mean + 1) / 2 * 8), 7).astype(int)  # [..., 3] in 0..7
    return levels[..., 0] * 64 + levels[..., 1] * 8 + levels[..., 2]


def numpy_targets(images, patch, objective):
    images = images.astype(np.float64)
    out = []
    for image in images:
        rows = []
        for r in range(image.shape[0] // patch):
            for c in range(image.shape[1] // patch):
                cell = image[r * patch:(r + 1) * patch, c * patch:(c + 1) * patch]  # [p, p, 3]
                if objective == "mean_color":
                    rows.append(numpy_color(cell.mean((0, 1))))
                elif objective == "pixels":
                    rows.append(cell.reshape(-1))
                else:
                    sub = patch // 4
                    rows.append([numpy_color(cell[i * sub:(i + 1) * sub, j * sub:(j + 1) * sub]
                                             .mean((0, 1))) for i in range(4) for j in range(4)])
        out.append(rows)
    return np.array(out)


@pytest.mark.parametrize("objective", pretraining.OBJECTIVES)
def test_targets_match_numpy(objective):
    rng = np.random.default_rng(1)
    colors = rng.uniform(-1, 1, (3, 2, 3, 3)).repeat(8, axis=1).repeat(8, axis=2)  # per patch
    noise = rng.uniform(-0.3, 0.3, (3, 16, 24, 3))
    images = np.clip(colors + noise, -1, 1).astype("float32")  # [3, 16, 24, 3]: 6 patches each
    images[0, :8, :8] = 1.0  # white: level 8 of 8 is clipped to 7 (class 511)
    images[1, :8, :8] = -1.0  # black: class 0
    got = keras.ops.convert_to_numpy(pretraining.patch_targets(images, 8, objective))
    expected = numpy_targets(images, 8, objective)
    assert got.shape == {"mean_color": (3, 6), "downsized_color": (3, 6, 16),
                         "pixels": (3, 6, 192)}[objective]
    if objective == "pixels":
        np.testing.assert_allclose(got, expected, atol=1e-7)
    else:
        np.testing.assert_array_equal(got, expected)
        assert np.all(got[0, 0] == 511) and np.all(got[1, 0] == 0)
        assert len(np.unique(got)) > {"mean_color": 12, "downsized_color": 40}[objective]


def test_model_targets_hybrid_patches_and_mixed_precision():
    # A hybrid's patches are the image regions of its feature-map cells: 2 cells x stride 4.
    hybrid = keras_vit.ViT(**dict(TINY, image_size=32, patch_size=2, resnet={"num_layers": ()}))
    model = pretraining.masked_patch_model(hybrid, objective="downsized_color", seed=0)
    images = np.random.default_rng(2).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    out = model(images)
    assert model.pixel_patch == (8, 8)
    assert tuple(out["predictions"].shape) == (2, 16, 16, 512)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(out["targets"]),
                                  numpy_targets(images, 8, "downsized_color"))
    # Under mixed precision the logits are float32 and the targets come from the exact pixels.
    keras.config.set_dtype_policy("mixed_bfloat16")
    model = pretraining.masked_patch_model(keras_vit.ViT(**dict(TINY, image_size=32)))
    out = model(images, training=True)
    assert out["predictions"].dtype == "float32"
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(out["targets"]),
                                  numpy_targets(images, 4, "mean_color"))
    keras.config.set_dtype_policy("mixed_float16")  # float16 gets dynamic loss scaling
    model = pretraining.masked_patch_model(keras_vit.ViT(**TINY))
    training.compile_masked_patches(model, total_steps=10, warmup_steps=0)
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)


# ------------------------------------------------------------------------------------------
# Learning, and the shared encoder.


def test_loss_decreases_and_pretraining_trains_the_vits_own_weights():
    keras.utils.set_random_seed(0)
    vit = keras_vit.ViT(**TINY)
    before = weights.model_params(vit)
    model = pretraining.masked_patch_model(vit, seed=0)
    training.compile_masked_patches(model, learning_rate=3e-3, total_steps=40, warmup_steps=0)
    images = keras_vit.preprocess_inputs(uint8_images(32))
    history = model.fit(images, epochs=20, batch_size=16, verbose=0)  # no labels at all
    losses = history.history["loss"]
    assert losses[-1] < 0.75 * losses[0], losses  # from about ln(512) = 6.2
    assert set(history.history) == {"loss", "masked_accuracy"}

    after = weights.model_params(vit)
    changed = {k for k in after if not np.array_equal(before[k], after[k])}
    assert {"embedding/kernel", "cls", "Transformer/posembed_input/pos_embedding",
            "Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel",
            "Transformer/encoder_norm/scale"} <= changed
    assert not changed & {"head/kernel", "head/bias"}  # the classifier head is not used
    assert model.blocks[0] is vit.get_layer("encoderblock_0")
    encoder = model.encoder_params()
    assert set(encoder) == set(after) - {"head/kernel", "head/bias"}
    for key, value in encoder.items():
        np.testing.assert_array_equal(value, after[key], err_msg=key)


def test_config_round_trip_and_errors():
    model = pretraining.masked_patch_model(keras_vit.ViT(**TINY), objective="pixels",
                                           mask_rate=0.25, seed=3)
    clone = pretraining.MaskedPatchModel.from_config(model.get_config())
    clone.set_weights(model.get_weights())
    images = np.random.default_rng(3).uniform(-1, 1, (2, 8, 8, 3)).astype("float32")
    np.testing.assert_allclose(keras.ops.convert_to_numpy(clone(images)["predictions"]),
                               keras.ops.convert_to_numpy(model(images)["predictions"]),
                               atol=1e-6)
    assert clone.get_config() == model.get_config()
    assert model.get_config()["vit"]["include_top"] is False


def test_keras_file_round_trip(tmp_path):
    """A masked-patch model saved as .keras reloads with its weights, configuration and
    objective: same predictions and targets, and the same loss on the same corruption."""
    model = pretraining.masked_patch_model(keras_vit.ViT(**TINY), objective="downsized_color",
                                           seed=5)
    images = np.random.default_rng(4).uniform(-1, 1, (2, 8, 8, 3)).astype("float32")
    model(images)
    # Train the [mask] embedding and the head away from their initial values first.
    for variable in model.weights:
        variable.assign(variable + 0.01 * np.random.default_rng(1).normal(
            size=variable.shape).astype("float32"))
    model.save(tmp_path / "mpp.keras")
    loaded = keras.saving.load_model(tmp_path / "mpp.keras")
    assert isinstance(loaded, pretraining.MaskedPatchModel)
    assert loaded.get_config() == model.get_config()
    for a, b in zip(loaded.weights, model.weights):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b),
                                      err_msg=b.path)
    ours, theirs = model(images, training=False), loaded(images, training=False)
    for key in ("predictions", "targets", "weights"):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(theirs[key]),
                                   keras.ops.convert_to_numpy(ours[key]), atol=1e-6, err_msg=key)
    assert float(loaded.compute_loss(y_pred=theirs)) == pytest.approx(
        float(model.compute_loss(y_pred=ours)), rel=1e-6)

    vit = keras_vit.ViT(**dict(TINY, image_size=12, patch_size=6))
    with pytest.raises(ValueError, match="patches are 6x6 pixels"):
        pretraining.masked_patch_model(vit, objective="downsized_color")
    with pytest.raises(ValueError, match="Received: objective='colour'"):
        pretraining.masked_patch_model(vit, objective="colour")
    with pytest.raises(ValueError, match="exceed 1"):
        pretraining.masked_patch_model(vit, mask_fraction=0.9, random_fraction=0.2)
    with pytest.raises(ValueError, match="at least 2 patches"):
        pretraining.masked_patch_model(keras_vit.ViT(**dict(TINY, image_size=4)))
    with pytest.raises(ValueError, match="'pretrain_mpp' recipe trains a masked patch"):
        training.compile_recipe(vit, "pretrain_mpp", 10)


# ------------------------------------------------------------------------------------------
# training.fit: unlabelled data, a crash and a resume, the encoder checkpoint.


class SimulatedCrash(Exception):
    pass


class Crash(keras.callbacks.Callback):
    def __init__(self, epoch):
        super().__init__()
        self.epoch = epoch

    def on_epoch_end(self, epoch, logs=None):  # runs after fit's backup of this epoch
        if epoch + 1 == self.epoch:
            raise SimulatedCrash(f"after epoch {self.epoch}")


def pretrain_run(folder, crash_at=None):
    keras.utils.set_random_seed(0)
    vit = keras_vit.ViT(**dict(TINY, dropout_rate=0.1))  # dropout: random state to restore
    model = pretraining.masked_patch_model(vit, seed=0)
    train = data.from_arrays(uint8_images(24), None, image_size=8, batch_size=8, training=True)
    return training.fit(model, train, output_dir=folder, epochs=4, recipe="pretrain_mpp",
                        learning_rate=3e-3, jit_compile=False, verbose=0,
                        callbacks=[Crash(crash_at)] if crash_at else [])


def test_fit_crashed_and_resumed_equals_an_uninterrupted_run(tmp_path):
    reference = pretrain_run(tmp_path / "ref")
    with pytest.raises(SimulatedCrash):
        pretrain_run(tmp_path / "run", crash_at=2)
    assert training.resume_epoch(training.backup_dir(tmp_path / "run")) == 2
    resumed = pretrain_run(tmp_path / "run")
    assert resumed["resumed_at_epoch"] == 2 and resumed["updates"] == 12
    for name in ("encoder.npz", "final.npz"):
        expected = weights.read_npz(tmp_path / "ref" / name)
        got = weights.read_npz(tmp_path / "run" / name)
        assert set(got) == set(expected)
        for key in expected:
            np.testing.assert_allclose(got[key], expected[key], atol=1e-5, err_msg=key)
    final = weights.read_npz(reference["final_weights"])
    assert {"masked_patches/mask_embedding", "mpp_head/kernel"} <= set(final)
    encoder = weights.read_npz(reference["encoder_weights"])
    assert not {k for k in encoder if k.startswith(("head", "mpp_head", "masked_patches"))}
    # config.json describes the encoder: it loads as a classifier with a new zero head.
    config = json.loads((tmp_path / "ref" / "config.json").read_text())
    assert config["model"]["include_top"] is False and config["class_names"] is None
    classifier, info = builders.build_from_checkpoint(reference["encoder_weights"],
                                                      include_top=True, num_classes=5)
    assert info["report"]["fresh"] == ["head"]
    assert not np.any(keras.ops.convert_to_numpy(classifier.get_layer("head").kernel))
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(classifier.get_layer("embedding").kernel),
        encoder["embedding/kernel"])


# ------------------------------------------------------------------------------------------
# The command line.


def write_folder(root, count=16):
    rng = np.random.default_rng(5)
    for i in range(count):
        path = root / f"class{i % 2}" / f"{i}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        image = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
        path.write_bytes(tf.io.encode_png(image).numpy())


def test_pretrain_command_writes_an_encoder_that_train_fine_tunes(tmp_path, capsys):
    write_folder(tmp_path / "images")
    tiny = json.dumps({k: v for k, v in TINY.items() if k not in ("image_size", "num_classes")})
    common = ["--folder", str(tmp_path / "images"), "--batch-size", "8", "--no-xla",
              "--verbose", "2"]
    code = cli.main(["pretrain", "--objective", "masked-patches", "--target", "pixels",
                     "--model-config", tiny, "--image-size", "8", "--steps", "4",
                     "--output", str(tmp_path / "mpp"), "--json", *common])
    assert code == 0, capsys.readouterr().err
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["updates"] == 4 and summary["encoder_weights"].endswith("encoder.npz")
    encoder = weights.read_npz(tmp_path / "mpp" / "encoder.npz")
    assert "head/kernel" not in encoder and encoder["embedding/kernel"].shape == (4, 4, 3, 16)
    assert weights.read_npz(tmp_path / "mpp" / "final.npz")["mpp_head/kernel"].shape == (16, 48)

    code = cli.main(["train", "--weights", str(tmp_path / "mpp" / "encoder.npz"), "--steps",
                     "2", "--validation-split", "none", "--output", str(tmp_path / "ft"),
                     *common])
    assert code == 0, capsys.readouterr().err
    tuned = weights.read_npz(tmp_path / "ft" / "final.npz")
    assert tuned["head/kernel"].shape == (16, 2)  # a new head for the folder's 2 classes
    assert set(tuned) == set(encoder) | {"head/kernel", "head/bias"}


def test_pretrain_reads_a_flat_folder_of_unlabelled_images(tmp_path, capsys):
    """Unlabelled images need no class subfolders: every image under --folder is read."""
    folder = tmp_path / "flat"
    folder.mkdir()
    images = uint8_images(10)
    for i, image in enumerate(images[:8]):
        (folder / f"{i}.png").write_bytes(tf.io.encode_png(image).numpy())
    (folder / "nested").mkdir()
    for i, image in enumerate(images[8:]):
        (folder / "nested" / f"{i}.png").write_bytes(tf.io.encode_png(image).numpy())
    (folder / "notes.txt").write_text("not an image")
    paths, labels, names = data.list_image_folder(folder, labels=None)
    assert [os.path.relpath(p, folder) for p in paths] == \
        [f"{i}.png" for i in range(8)] + ["nested/0.png", "nested/1.png"]
    assert labels == [0] * 10 and names == []
    pipe = data.from_folder(folder, labels=None, image_size=8, batch_size=10, training=False)
    got, got_labels = next(iter(pipe.dataset))
    order = [int(os.path.basename(p)[:-4]) + (8 if "nested" in p else 0) for p in paths]
    np.testing.assert_allclose(got.numpy(), images[order] / 127.5 - 1, atol=1e-6)
    assert pipe.num_classes == 1 and not got_labels.numpy().any()
    # Labelled reading still wants class subfolders: here it sees one class, "nested".
    assert data.list_image_folder(folder)[2] == ["nested"]
    with pytest.raises(ValueError, match="`labels` must be 'inferred' or None"):
        data.list_image_folder(folder, labels="folders")

    tiny = json.dumps({k: v for k, v in TINY.items() if k not in ("image_size", "num_classes")})
    code = cli.main(["pretrain", "--model-config", tiny, "--image-size", "8", "--steps", "2",
                     "--folder", str(folder), "--batch-size", "4", "--no-xla", "--verbose",
                     "0", "--output", str(tmp_path / "mpp")])
    assert code == 0, capsys.readouterr().err
    run = json.loads((tmp_path / "mpp" / "run.json").read_text())
    assert run["finished"] and run["settings"]["examples"] == 10


@pytest.mark.parametrize("objective", ["mean_color", "pixels"])
def test_a_vit_of_another_normalisation_predicts_the_targets_of_its_pixels(tmp_path, objective):
    """The targets are defined on the paper's [-1, 1]: images normalised with a checkpoint's
    mean and std give the targets of the same pixels, and the run records that
    normalisation for the encoder it writes."""
    imagenet = dict(input_size=[3, 8, 8], interpolation="bilinear", crop_pct=1.0,
                    crop_mode="squash", mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    vit = keras_vit.ViT(**dict(TINY, include_top=False, data_config=imagenet))
    model = pretraining.masked_patch_model(vit, objective, seed=0)
    assert model.data_config["mean"] == imagenet["mean"]
    path = tmp_path / f"{objective}.keras"  # the data config is part of its configuration
    model.save(path)
    model = keras.saving.load_model(path)
    assert model.data_config["mean"] == imagenet["mean"]
    pixels = np.random.default_rng(0).integers(0, 256, (4, 8, 8, 3), np.uint8)
    got = model(keras_vit.preprocess_inputs(pixels, model))["targets"]
    want = pretraining.patch_targets(keras_vit.preprocess_inputs(pixels), (4, 4), objective)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(got), keras.ops.convert_to_numpy(want),
                               atol=1e-5)
    if objective == "pixels":
        return
    train = data.from_arrays(pixels, None, image_size=8, batch_size=2, training=True,
                             data_config=model)
    training.fit(model, train, output_dir=tmp_path / "run", steps=1, recipe="pretrain_mpp",
                 verbose=0)
    written = json.loads((tmp_path / "run" / "config.json").read_text())
    assert written["preprocessing"]["mean"] == imagenet["mean"]
    encoder = keras_vit.from_pretrained(tmp_path / "run" / "encoder.npz")
    assert encoder.data_config["mean"] == imagenet["mean"]


def test_a_pretraining_checkpoint_loaded_as_a_classifier_points_to_its_encoder(tmp_path):
    model = pretraining.masked_patch_model(keras_vit.ViT(**TINY), seed=0)
    np.savez(tmp_path / "final.npz", **weights.model_params(model))  # as fit writes final.npz
    with pytest.raises(weights.CheckpointError, match="masked-patch pre-training model: its "
                                                      "encoder, without them, is the "
                                                      "encoder.npz"):
        keras_vit.load_pretrained(keras_vit.ViT(**TINY), tmp_path / "final.npz")
