"""`ViT(position_embedding=...)`: the variants of paper appendix D.4 (Table 8) and big_vision's
fixed 2-D sine-cosine embedding, against NumPy computations of each (the relative attention
pair by pair, in `reference.relative_bias`), through files, resizing, models of any input
size, inspection and export."""

import json

import keras
import numpy as np
import pytest
import reference
import tensorflow as tf

import keras_vit
from keras_vit import inspection, weights
from keras_vit.positions import AddPositionEmbs, AddSinCosPositionEmbs2D

VARIANTS = ("learned", "learned_2d", "sincos_2d", "none", "relative")
HIDDEN, HEADS, MLP, PATCH, CLASSES = 16, 2, 24, 8, 3
TINY = dict(patch_size=PATCH, hidden_size=HIDDEN, num_layers=1, num_heads=HEADS, mlp_dim=MLP,
            num_classes=CLASSES)
PREFIX = "Transformer/posembed_input/"
RELATIVE = "Transformer/encoderblock_0/MultiHeadDotProductAttention_1/rel_embedding"


def sincos_2d(rows, cols, width, temperature=10_000.0):
    """big_vision `posemb_sincos_2d`, in float64 NumPy: `[rows * cols, width]`."""
    y, x = np.mgrid[:rows, :cols]
    omega = 1.0 / temperature ** (np.arange(width // 4) / (width // 4 - 1))
    y = y.reshape(-1)[:, None] * omega[None]
    x = x.reshape(-1)[:, None] * omega[None]
    return np.concatenate([np.sin(x), np.cos(x), np.sin(y), np.cos(y)], axis=1)


def concat_2d(row, col):
    """Patch (r, c) gets concat(row[r], col[c]), row-major: `[rows * cols, D]`."""
    return np.array([np.concatenate([r, c]) for r in row for c in col])


def interp(table, length):
    """Linear interpolation of `[n, C]` to `length` positions, end points aligned (np.interp)."""
    new = np.linspace(0, len(table) - 1, length)
    return np.stack([np.interp(new, np.arange(len(table)), ch) for ch in table.T], axis=1)


def variant_params(variant, grid, classifier="token", seed=0, layers=1):
    """Random official-layout weights for `variant`, and the effective 1-D embedding
    `[1, prefix + rows * cols, D]` that `reference.forward` adds, computed in NumPy."""
    rng = np.random.default_rng(seed)
    params = reference.official_params(rng, hidden=HIDDEN, mlp=MLP, heads=HEADS, layers=layers,
                                       patch=PATCH, grid=grid, num_classes=CLASSES,
                                       classifier=classifier)
    learned = params.pop(PREFIX + "pos_embedding")
    token = classifier == "token"
    if variant == "learned":
        params[PREFIX + "pos_embedding"] = effective = learned
    elif variant == "learned_2d":
        row, col, cls = (rng.normal(size=shape).astype("float32") for shape in (
            (1, grid[0], HIDDEN // 2), (1, grid[1], HIDDEN // 2), (1, 1, HIDDEN)))
        params.update({PREFIX + "pos_embedding_row": row, PREFIX + "pos_embedding_col": col})
        effective = concat_2d(row[0], col[0])
        if token:
            params[PREFIX + "pos_embedding_cls"] = cls
            effective = np.concatenate([cls[0], effective])
    else:
        effective = sincos_2d(*grid, HIDDEN) if variant == "sincos_2d" else \
            np.zeros((grid[0] * grid[1], HIDDEN))
        if token:
            effective = np.concatenate([np.zeros((1, HIDDEN)), effective])
        for i in range(layers if variant == "relative" else 0):  # each block's offsets table
            key = RELATIVE.replace("encoderblock_0", f"encoderblock_{i}")
            params[key] = rng.normal(
                size=(2 * grid[0] * grid[1] - 1, HEADS, HIDDEN // HEADS)).astype("float32")
            if token:
                params[key + "_cls"] = rng.normal(size=(1, HEADS, HIDDEN // HEADS)) \
                    .astype("float32")
    return params, np.asarray(effective, np.float64).reshape(1, -1, HIDDEN)


def loaded_model(variant, image_size=(16, 24), classifier="token", layers=1, **kwargs):
    """A model with `variant_params` loaded, and the params with the effective embedding."""
    grid = (image_size[0] // PATCH, image_size[1] // PATCH)
    params, effective = variant_params(variant, grid, classifier, layers=layers)
    model = keras_vit.ViT(image_size=image_size, classifier=classifier,
                          position_embedding=variant, **dict(TINY, num_layers=layers), **kwargs)
    weights.load_params(model, params)
    return model, dict(params, **{PREFIX + "pos_embedding": effective})


def images(size, batch=2, seed=1):
    return np.random.default_rng(seed).uniform(-1, 1, (batch, *size, 3)).astype("float32")


# ------------------------------------------------------------------------------------------
# The embeddings against NumPy.


def test_sincos_is_big_visions_formula():
    layer = AddSinCosPositionEmbs2D(grid_size=(3, 5), num_prefix_tokens=1)
    got = keras.ops.convert_to_numpy(layer(np.zeros((1, 16, 16), np.float32)))
    assert not layer.weights
    np.testing.assert_array_equal(got[0, 0], 0.0)  # the class token: no position
    np.testing.assert_allclose(got[0, 1:], sincos_2d(3, 5, 16), atol=1e-5)
    # By hand: patch (row 2, col 1) is [sin(1 w), cos(1 w), sin(2 w), cos(2 w)], w = 1e4^(-k/3).
    omega = 10_000.0 ** -(np.arange(4) / 3)
    want = np.concatenate([np.sin(omega), np.cos(omega), np.sin(2 * omega), np.cos(2 * omega)])
    np.testing.assert_allclose(got[0, 1 + 2 * 5 + 1], want, atol=1e-6)


def test_learned_2d_is_the_concatenation_of_row_and_column_tables():
    model, _ = loaded_model("learned_2d", image_size=(16, 32))
    shapes = {k: v.shape for k, v in weights.model_params(model).items() if k.startswith(PREFIX)}
    assert shapes == {PREFIX + "pos_embedding_row": (1, 2, 8),
                      PREFIX + "pos_embedding_col": (1, 4, 8),
                      PREFIX + "pos_embedding_cls": (1, 1, 16)}
    layer = model.get_layer("posembed_input")
    row, col, cls = (keras.ops.convert_to_numpy(v)[0] for v in (
        layer.pos_embedding_row, layer.pos_embedding_col, layer.pos_embedding_cls))
    got = keras.ops.convert_to_numpy(layer(np.zeros((1, 9, 16), np.float32)))[0]
    np.testing.assert_array_equal(got[0], cls[0])
    for r in range(2):
        for c in range(4):
            np.testing.assert_array_equal(got[1 + 4 * r + c], np.concatenate([row[r], col[c]]))


@pytest.mark.parametrize("classifier", ["token", "gap"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_model_equals_the_numpy_forward_with_the_effective_embedding(variant, classifier):
    model, params = loaded_model(variant, classifier=classifier)
    x = images((16, 24))
    want, _, _ = reference.forward(params, x, classifier=classifier)
    np.testing.assert_allclose(model(x), want, atol=2e-5)


@pytest.mark.parametrize("route", ["products", "fused"])
def test_relative_positions_through_either_attention_route(route):
    """The relative bias reaches the logits and the probabilities through both routes of
    keras_vit.routes, in both modes."""
    model, params = loaded_model("relative")
    x = images((16, 24))
    want, _, attentions = reference.forward(params, x)
    with keras_vit.routes.use_routes(attention=route):
        np.testing.assert_allclose(model(x), want, atol=2e-5)
        _, probabilities = model.attention_model()(x)
        np.testing.assert_allclose(probabilities[0], attentions[0], atol=1e-5)
        np.testing.assert_allclose(model(x, training=True), want, atol=2e-5)


@pytest.mark.parametrize("classifier", ["gap", "token"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_only_none_is_blind_to_where_the_patches_are(variant, classifier):
    # A relative model's class token attends to every patch with the same relative embedding,
    # so it sees where the patches are only through the patches of the block before it.
    layers = 2 if variant == "relative" and classifier == "token" else 1
    model, _ = loaded_model(variant, image_size=(32, 32), classifier=classifier, layers=layers)
    x = images((32, 32))
    patches = x.reshape(2, 4, 8, 4, 8, 3).transpose(0, 1, 3, 2, 4, 5).reshape(2, 16, 8, 8, 3)
    order = np.random.default_rng(3).permutation(16)
    shuffled = patches[:, order].reshape(2, 4, 4, 8, 8, 3).transpose(0, 1, 3, 2, 4, 5)
    difference = np.abs(model(x) - model(shuffled.reshape(x.shape))).max()
    if variant == "none":
        assert difference < 1e-5
    else:
        assert difference > 1e-3


@pytest.mark.parametrize("variant,width,message", [
    ("sincos_2d", 18, "multiple of 4"), ("sincos_2d", 4, "at least 8"),
    ("learned_2d", 15, "multiple of 2"), ("rotary", 16, "position_embedding"),
])
def test_widths_and_names_are_checked(variant, width, message):
    with pytest.raises(ValueError, match=message):
        keras_vit.ViT(image_size=16, patch_size=8, hidden_size=width, num_heads=1, mlp_dim=8,
                      num_layers=1, position_embedding=variant)


def test_a_learned_table_needs_a_length_or_a_grid():
    """The layer on its own, in a functional graph of unknown length: one line saying what
    it needs; with a grid to resize from, it builds."""
    tokens = keras.Input((None, 8))
    with pytest.raises(ValueError, match=r"AddPositionEmbs needs a known sequence length, or a "
                                         r"`grid_size` to resize from.*Received shape "
                                         r"\(None, None, 8\)") as raised:
        keras_vit.AddPositionEmbs()(tokens)
    assert "\n" not in str(raised.value)
    assert keras_vit.AddPositionEmbs(grid_size=2, num_prefix_tokens=1)(tokens).shape == \
        (None, None, 8)


def test_learned_stays_what_it_was():
    model = keras_vit.ViT(image_size=16, **TINY)
    layer = model.get_layer("posembed_input")
    assert type(layer) is AddPositionEmbs and layer.grid_size is None
    assert keras_vit.vit_config(model)["position_embedding"] == "learned"
    assert [k for k in weights.model_params(model) if k.startswith(PREFIX)] == \
        [PREFIX + "pos_embedding"]


# ------------------------------------------------------------------------------------------
# Configs, .keras files and checkpoints.


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("variant", VARIANTS)
def test_config_keras_file_and_npz_round_trip(tmp_path, variant, dynamic):
    model, _ = loaded_model(variant, dynamic_image_size=dynamic)
    layer = model.get_layer("posembed_input")
    assert type(layer).from_config(layer.get_config()).get_config() == layer.get_config()
    x = images((16, 24))
    want = model(x)
    config = keras_vit.vit_config(model)
    assert config["position_embedding"] == variant and config["image_size"] == [16, 24]
    rebuilt = keras_vit.ViT(**config)
    rebuilt.set_weights(model.get_weights())
    np.testing.assert_allclose(rebuilt(x), want, atol=1e-6)
    model.save(tmp_path / "m.keras")
    np.testing.assert_allclose(keras.saving.load_model(tmp_path / "m.keras")(x), want, atol=1e-6)
    # A checkpoint with the config.json keras_vit.training.fit writes beside it.
    weights.save_npz(model, tmp_path / "c.npz")
    (tmp_path / "config.json").write_text(json.dumps(
        {"format": "keras_vit", "model": config, "class_names": None}))
    again = keras_vit.from_pretrained(tmp_path / "c.npz")
    assert keras_vit.vit_config(again)["position_embedding"] == variant
    np.testing.assert_allclose(again(x), want, atol=1e-6)


@pytest.mark.parametrize("variant,want", [
    ("learned", dict(image_size=16)),
    ("learned_2d", dict(image_size=(16, 24), position_embedding="learned_2d")),
    ("sincos_2d", dict(image_size=224, position_embedding="sincos_2d")),
    ("none", dict(image_size=224, position_embedding="sincos_2d")),  # no arrays either
    ("relative", dict(image_size=16, position_embedding="relative")),  # 7 offsets: 2 x 2
])
def test_the_variant_is_read_off_the_keys(variant, want):
    image_size = (16, 16) if variant in ("learned", "relative") else (16, 24)
    model, _ = loaded_model(variant, image_size=image_size)
    config = weights.config_from_params(weights.model_params(model))
    assert {k: config.get(k) for k in want} == want
    if variant == "learned":  # as before: the key only for the other variants
        assert "position_embedding" not in config
    given = weights.config_from_params(weights.model_params(model), image_size=(16, 24))
    assert given["image_size"] == (16, 24)


def test_from_pretrained_without_config_json(tmp_path):
    model, _ = loaded_model("none")
    weights.save_npz(model, tmp_path / "c.npz")
    x = images((16, 24))
    again = keras_vit.from_pretrained(tmp_path / "c.npz", image_size=(16, 24),
                                      position_embedding="none")
    np.testing.assert_allclose(again(x), model(x), atol=1e-6)
    model_2d, _ = loaded_model("learned_2d")
    weights.save_npz(model_2d, tmp_path / "d.npz")
    np.testing.assert_allclose(keras_vit.from_pretrained(tmp_path / "d.npz")(x), model_2d(x),
                               atol=1e-6)


def test_learned_2d_tables_are_resized_at_load_time():
    small, _ = loaded_model("learned_2d", image_size=(24, 16))  # 3 x 2 patches
    params = weights.model_params(small)
    large = keras_vit.ViT(image_size=(40, 56), position_embedding="learned_2d", **TINY)
    weights.load_params(large, params)  # 5 x 7 patches
    got = weights.model_params(large)
    np.testing.assert_allclose(got[PREFIX + "pos_embedding_row"][0],
                               interp(params[PREFIX + "pos_embedding_row"][0], 5), atol=1e-6)
    np.testing.assert_allclose(got[PREFIX + "pos_embedding_col"][0],
                               interp(params[PREFIX + "pos_embedding_col"][0], 7), atol=1e-6)
    np.testing.assert_array_equal(got[PREFIX + "pos_embedding_cls"],
                                  params[PREFIX + "pos_embedding_cls"])


def test_relative_tables_are_resized_at_load_time():
    small, _ = loaded_model("relative", image_size=(24, 16))  # 6 patches: 11 offsets
    params = weights.model_params(small)
    large = keras_vit.ViT(image_size=(40, 56), position_embedding="relative", **TINY)
    weights.load_params(large, params)  # 35 patches: 69 offsets
    got = weights.model_params(large)
    table = params[RELATIVE].reshape(11, -1)
    np.testing.assert_allclose(got[RELATIVE].reshape(69, -1), interp(table, 69), atol=1e-6)
    np.testing.assert_array_equal(got[RELATIVE + "_cls"], params[RELATIVE + "_cls"])


def test_relative_bias_by_hand():
    """One head, two patches and a class token: each pair's logit gains q . r / sqrt(k), r
    the table's entry for the offset (patch 1 to patch 0: +1), the class token's entry for
    every pair with it."""
    from keras_vit.positions import relative_attention_bias

    q = np.array([[[[1.0, 0.0]], [[0.0, 2.0]], [[3.0, 1.0]]]], np.float32)  # [1, 3, 1, 2]
    table = np.array([[[1.0, 1.0]], [[2.0, 0.0]], [[0.0, 4.0]]], np.float32)  # -1, 0, +1
    cls = np.array([[[5.0, 7.0]]], np.float32)
    got = keras.ops.convert_to_numpy(relative_attention_bias(q, table, cls, 1))[0, 0]
    s = np.sqrt(2.0)
    want = np.array([[5, 5, 5],  # the class token: q0 . cls
                     [14, 0 * 2 + 2 * 0, 0 * 1 + 2 * 1],  # patch 0: offsets 0, -1
                     [22, 3 * 0 + 1 * 4, 3 * 2 + 1 * 0]]) / s  # patch 1: offsets +1, 0
    np.testing.assert_allclose(got, want, atol=1e-6)


@pytest.mark.parametrize("variant", ["sincos_2d", "none"])
def test_fixed_embeddings_load_at_any_size(variant):
    small, _ = loaded_model(variant, image_size=(16, 24))
    large = keras_vit.ViT(image_size=(40, 32), position_embedding=variant, **TINY)
    report = weights.load_params(large, weights.model_params(small))
    assert report == {"skipped": [], "fresh": []}
    for a, b in zip(small.weights, large.weights, strict=True):
        np.testing.assert_array_equal(a, b)


# ------------------------------------------------------------------------------------------
# Any input size, inspection, export.


@pytest.mark.parametrize("variant", VARIANTS)
def test_any_size_equals_a_fixed_model_loaded_at_that_size(variant):
    dyn, _ = loaded_model(variant, image_size=(24, 24), dynamic_image_size=True)
    params = weights.model_params(dyn)
    for size in [(24, 24), (40, 16), (8, 32)]:
        fixed = keras_vit.ViT(image_size=size, position_embedding=variant, **TINY)
        weights.load_params(fixed, params)
        x = images(size)
        np.testing.assert_allclose(dyn(x), fixed(x), atol=1e-5)


def cosine(embedding):
    unit = embedding / np.linalg.norm(embedding, axis=-1, keepdims=True)
    return unit @ unit.T


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("variant", ["learned", "learned_2d", "sincos_2d"])
def test_position_embedding_similarity(variant, dynamic):
    model, params = loaded_model(variant, image_size=(16, 24), dynamic_image_size=dynamic)
    got = inspection.position_embedding_similarity(model)
    want = cosine(params[PREFIX + "pos_embedding"][0, 1:]).reshape(2, 3, 2, 3)
    np.testing.assert_allclose(got, want, atol=1e-5)


@pytest.mark.parametrize("variant", ["none", "relative"])
def test_no_position_embedding_has_no_similarity(variant):
    model, _ = loaded_model(variant)
    with pytest.raises(ValueError, match=f"position_embedding={variant!r}"):
        inspection.position_embedding_similarity(model)


@pytest.mark.parametrize("variant", ["learned_2d", "sincos_2d", "none", "relative"])
def test_export(tmp_path, variant):
    model, _ = loaded_model(variant, image_size=(16, 16))
    path = keras_vit.export_saved_model(model, tmp_path / "export", warmup=False)
    loaded = tf.saved_model.load(str(path))
    pixels = np.random.default_rng(4).uniform(0, 255, (2, 16, 16, 3)).astype("float32")
    got = loaded.signatures["predict_images"](images=tf.constant(pixels))["probabilities"]
    want = tf.nn.softmax(model(pixels / 127.5 - 1.0))
    np.testing.assert_allclose(got, want, atol=1e-5)
