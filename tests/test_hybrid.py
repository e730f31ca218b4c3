"""Hybrid ResNet + ViT models: parity with the NumPy ResNet, the official layout, round-trips."""

import keras
import numpy as np
import pytest
import reference

import keras_vit
from keras_vit import weights

TINY = dict(hidden_size=32, num_layers=2, num_heads=4, mlp_dim=48, num_classes=7)


def hybrid_params(rng, stages, patch, grid, gn_as_4d=False):
    params, channels = reference.resnet_params(rng, stages)
    vit = reference.official_params(
        rng,
        hidden=32,
        mlp=48,
        heads=4,
        layers=2,
        patch=patch,
        grid=grid,
        channels=channels,
        num_classes=7,
    )
    params.update(vit)
    if gn_as_4d:  # some official hybrid files store GroupNorm parameters as (1, 1, 1, C)
        params = {k: v.reshape(1, 1, 1, -1) if "/gn" in "/" + k else v for k, v in params.items()}
    return params


@pytest.mark.parametrize(
    "stages,patch,image,gn_as_4d",
    [((1, 1), 1, (32, 48), False), ((1, 2), 1, (32, 32), True), ((), 2, (32, 32), False)],
    ids=["two-stages-non-square", "gn-stored-4d", "root-only-patch-2"],
)
def test_hybrid_matches_the_numpy_resnet_and_vit(tmp_path, stages, patch, image, gn_as_4d):
    stride = 4 * 2 ** max(len(stages) - 1, 0)
    grid = (image[0] // stride // patch, image[1] // stride // patch)
    rng = np.random.default_rng(0)
    params = hybrid_params(rng, stages, patch, grid, gn_as_4d)
    np.savez(tmp_path / "hybrid.npz", **params)  # the official hybrid layout, written here
    model = keras_vit.ViT(
        image_size=image, patch_size=patch, resnet={"num_layers": stages}, **TINY
    )
    report = keras_vit.load_pretrained(model, str(tmp_path / "hybrid.npz"))
    assert report["skipped"] == [] and report["fresh"] == []
    images = rng.uniform(-1, 1, (2, *image, 3)).astype(np.float32)
    expected, _, _ = reference.forward(params, images)
    assert np.abs(expected).max() > 0.1
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(model(images)), expected, atol=1e-5, rtol=1e-5
    )
    assert model.get_layer("embedding").grid_size == grid


def test_every_official_hybrid_builds_with_its_table_entry():
    expected = {
        "R50+B/16": ((3, 4, 9), 1, 0.1),
        "R50+L/32": ((3, 4, 6, 3), 1, 0.1),
        "R26+B/32": ((2, 2, 2, 2), 1, 0.0),
        "R26+S/32": ((2, 2, 2, 2), 1, 0.0),
        "R+Ti/16": ((), 8, 0.0),
    }
    for name, (stages, patch, dropout) in expected.items():
        variant = keras_vit.VARIANTS[name]
        assert (variant.resnet, variant.patch_size, variant.dropout_rate) == (
            stages,
            patch,
            dropout,
        )
        assert callable(getattr(keras_vit, variant.builder_name))
    model = keras_vit.ViT_R_Ti16()
    assert model.get_layer("embedding").grid_size == (7, 7)  # 224 / (4 * 8)
    assert model.count_params() == keras_vit.VARIANTS["R+Ti/16"].params


def test_checkpoint_keys_follow_the_official_hybrid_names():
    model = keras_vit.ViT(image_size=32, patch_size=1, resnet={"num_layers": (2, 1)}, **TINY)
    keys = set(weights.checkpoint_variables(model))
    assert {
        "conv_root/kernel",
        "gn_root/scale",
        "gn_root/bias",
        "block1/unit1/conv_proj/kernel",
        "block1/unit1/gn_proj/scale",
        "block1/unit2/conv3/kernel",
        "block1/unit2/gn3/bias",
        "block2/unit1/conv_proj/kernel",
    } <= keys
    assert "block1/unit2/conv_proj/kernel" not in keys  # projection on a stage's first unit only
    assert model.get_layer("embedding").kernel.shape == (1, 1, 512, 32)


def test_weight_standardisation_epsilon_is_an_argument():
    layer = keras_vit.StdConv2D(4, 3, epsilon=0.5)
    layer.build((None, 8, 8, 2))
    w = np.random.default_rng(1).standard_normal((3, 3, 2, 4)).astype(np.float32)
    layer.kernel.assign(w)
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(layer.standardized_kernel()),
        reference.standardize(w.astype(np.float64), eps=0.5),
        atol=1e-6,
    )
    model = keras_vit.ViT(
        image_size=32, patch_size=1, resnet={"num_layers": (1,), "std_conv_epsilon": 1e-3}, **TINY
    )
    assert model.get_layer("resnet").conv_root.epsilon == 1e-3


@pytest.mark.parametrize(
    "layer",
    [
        keras_vit.StdConv2D(filters=8, kernel_size=3, strides=2, epsilon=1e-4),
        keras_vit.BottleneckUnit(features=16, strides=2, std_conv_epsilon=1e-4),
        keras_vit.ResNet(num_layers=(2, 1), width_factor=2, std_conv_epsilon=1e-4),
    ],
    ids=lambda layer: type(layer).__name__,
)
def test_resnet_layer_configs_round_trip(layer):
    config = layer.get_config()
    assert type(layer).from_config(config).get_config() == config
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert restored.get_config() == config


def test_hybrid_keras_file_round_trip(tmp_path):
    rng = np.random.default_rng(2)
    model = keras_vit.ViT(image_size=32, patch_size=1, resnet={"num_layers": (1, 1)}, **TINY)
    weights.load_params(model, hybrid_params(rng, (1, 1), 1, (4, 4)))
    model.save(tmp_path / "hybrid.keras")
    restored = keras.saving.load_model(tmp_path / "hybrid.keras")
    images = rng.uniform(-1, 1, (2, 32, 32, 3)).astype(np.float32)
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(model(images)), keras.ops.convert_to_numpy(restored(images))
    )
    assert isinstance(restored.get_layer("resnet"), keras_vit.ResNet)


def test_hybrid_bad_inputs():
    with pytest.raises(
        ValueError,
        match=r"image_size height 200 is not divisible by 16 \(the "
        r"ResNet's stride 16 times patch_size 1\)",
    ):
        keras_vit.ViT_R50_B16(image_size=200)
    with pytest.raises(ValueError, match=r"`resnet` must be None or a dict"):
        keras_vit.ViT(resnet=(3, 4, 9))
    with pytest.raises(ValueError, match=r"Unknown `resnet` keys \[.layers.\]"):
        keras_vit.ViT(resnet={"layers": (3, 4, 9)})
    with pytest.raises(
        ValueError,
        match=r"`num_layers` must be a positive integer. Received: "
        r"num_layers=0",
    ):
        keras_vit.ResNet(num_layers=(3, 0))
    with pytest.raises(ValueError, match="is a ViT-R50\\+B/16 checkpoint; ViT_R26_B32 builds"):
        keras_vit.ViT_R26_B32(pretrained="imagenet21k/R50+ViT-B_16")


def test_a_plain_checkpoint_does_not_fit_a_hybrid(tmp_path):
    rng = np.random.default_rng(3)
    plain = reference.official_params(
        rng, hidden=32, mlp=48, heads=4, layers=2, patch=1, grid=(4, 4), num_classes=7
    )
    model = keras_vit.ViT(image_size=32, patch_size=1, resnet={"num_layers": (1, 1)}, **TINY)
    with pytest.raises(keras_vit.CheckpointError, match=r"missing keys \(\d+\): conv_root/kernel"):
        weights.load_params(model, plain)


def test_registry_has_the_hybrid_files():
    names = {c["name"] for c in keras_vit.list_checkpoints()}
    for name in (
        "imagenet21k/R50+ViT-B_16",
        "imagenet21k/R26+ViT-B_32",
        "imagenet21k/R50+ViT-L_32",
        "imagenet21k+imagenet2012/R50+ViT-B_16",
    ):
        assert name in names
    for variant in ("R26+S/32", "R50+L/32", "R+Ti/16"):
        augreg = [c for c in keras_vit.list_checkpoints(variant) if c["name"].startswith("augreg/")]
        assert len(augreg) == 2, variant
