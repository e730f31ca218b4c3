"""Inspection (paper Figure 7, attention maps): numbers against hand-set weights and the NumPy
reference, the `keras-vit inspect` command's PNGs, and bad input."""

import json
import re

import keras
import numpy as np
import pytest
import reference
from PIL import Image
from scipy.spatial.distance import cdist
from sklearn.decomposition import PCA
from sklearn.metrics.pairwise import cosine_similarity

import keras_vit
import keras_vit_cli as cli
from keras_vit import inspection, weights
from keras_vit import images as image_files

TINY = dict(hidden_size=32, num_layers=2, num_heads=4, mlp_dim=48)
ATTENTION = "Transformer/encoderblock_{}/MultiHeadDotProductAttention_1/"


def build(image_size=(32, 48), patch_size=8, classifier="token", seed=0, **overrides):
    """A tiny model with random official-layout weights; returns (model, params)."""
    kwargs = dict(image_size=image_size, patch_size=patch_size, classifier=classifier,
                  num_classes=5, **dict(TINY, **overrides))
    model = keras_vit.ViT(**kwargs)
    h, w = keras_vit.layers.to_pair("image_size", image_size)
    ph, pw = keras_vit.layers.to_pair("patch_size", patch_size)
    params = reference.official_params(
        np.random.default_rng(seed), hidden=kwargs["hidden_size"], mlp=kwargs["mlp_dim"],
        heads=kwargs["num_heads"], layers=kwargs["num_layers"], patch=(ph, pw),
        grid=(h // ph, w // pw), num_classes=5, classifier=classifier, scale=0.5)
    weights.load_params(model, params)
    return model, params


def random_images(count, image_size, seed=1):
    return np.random.default_rng(seed).uniform(-1, 1, (count, *image_size, 3)).astype(np.float32)


def centres(grid, patch_pixels):
    """Patch centres in pixels, row-major, written independently of keras_vit."""
    return np.array([[r * patch_pixels[0], c * patch_pixels[1]]
                     for r in range(grid[0]) for c in range(grid[1])], np.float64)


def expected_distance(attentions, prefix, distances):
    """The paper's mean attention distance from reference attentions, with loops."""
    out = np.zeros((len(attentions), attentions[0].shape[1]))
    for layer, probs in enumerate(attentions):
        for head in range(probs.shape[1]):
            per_image = []
            for image in probs[:, head]:
                weights = image[prefix:, prefix:]
                weights = weights / weights.sum(axis=1, keepdims=True)
                per_image.append(np.mean([w @ d for w, d in zip(weights, distances, strict=True)]))
            out[layer, head] = np.mean(per_image)
    return out


# ------------------------------------------------------------------------------------------
# The attention the inspection reads is the model's own.


def test_probe_returns_every_blocks_attention_in_one_model():
    model, params = build()
    images = random_images(2, (32, 48))
    probe = inspection.attention_probe(model)
    for i in range(2):
        # the model's own blocks, called for their probabilities too
        assert probe.get_layer(f"encoderblock_{i}").block is model.get_layer(f"encoderblock_{i}")
    weights = inspection.attention_weights(model, images)
    _, _, attentions = reference.forward(params, images)
    assert weights.shape == (2, 2, 4, 25, 25)
    np.testing.assert_allclose(weights, np.stack(attentions), atol=1e-5)
    assert inspection.geometry(model) == inspection.Geometry(
        image_size=(32, 48), grid=(4, 6), patch_pixels=(8.0, 8.0), num_prefix=1,
        num_layers=2, num_heads=4)


@pytest.mark.parametrize("classifier", ["token", "gap"])
def test_rollout_and_layer_maps_match_the_reference_attention(classifier):
    model, params = build(classifier=classifier, seed=3)
    images = random_images(3, (32, 48), seed=4)
    _, _, attentions = reference.forward(params, images, classifier)
    prefix = 1 if classifier == "token" else 0

    def from_query(matrix):  # [N, N] -> [rows, cols]; the class token, or the mean token
        row = matrix[0] if prefix else matrix.mean(axis=0)
        return row[prefix:].reshape(4, 6)

    expected_rollout, expected_layer = [], []
    for b in range(3):
        flow = np.eye(25 - (1 - prefix))
        for probs in attentions:
            mixed = probs[b].mean(axis=0) + np.eye(len(flow))
            flow = (mixed / mixed.sum(axis=1, keepdims=True)) @ flow
        expected_rollout.append(from_query(flow))
        expected_layer.append(from_query(attentions[0][b, 3]))
    rollout = inspection.attention_rollout(model, images)
    assert rollout.shape == (3, 4, 6)
    np.testing.assert_allclose(rollout, expected_rollout, atol=1e-5)
    # The maps are not flat: the comparison above is not vacuous.
    assert np.ptp(np.asarray(expected_rollout)) > 1e-3
    layer = inspection.attention_map(model, images, layer=-2, head=3)
    np.testing.assert_allclose(layer, expected_layer, atol=1e-5)
    mean_heads = inspection.attention_map(model, images, layer=1, head=None)
    np.testing.assert_allclose(
        mean_heads, [from_query(attentions[1][b].mean(axis=0)) for b in range(3)], atol=1e-5)


# ------------------------------------------------------------------------------------------
# Hand-set weights with known answers.


def uniform_attention_model(classifier="token"):
    """Zero query and key projections: every attention row is exactly uniform."""
    model, params = build(image_size=(32, 48), patch_size=(8, 6), classifier=classifier, seed=5)
    for i in range(2):
        for proj in ("query", "key"):
            for name in ("kernel", "bias"):
                params[ATTENTION.format(i) + f"{proj}/{name}"] *= 0
    weights.load_params(model, params)
    return model


def test_uniform_attention_gives_the_mean_pairwise_patch_distance():
    model = uniform_attention_model()
    images = random_images(3, (32, 48))
    weights = inspection.attention_weights(model, images)
    np.testing.assert_allclose(weights, 1 / 33, rtol=1e-6)  # 4 x 8 patches + class token
    # Patches are 8 pixels high and 6 wide: centres differ by 8 per row, 6 per column.
    pairwise = cdist(centres((4, 8), (8, 6)), centres((4, 8), (8, 6)))
    distance = inspection.mean_attention_distance(model, images, batch_size=2)
    assert distance.shape == (2, 4)
    np.testing.assert_allclose(distance, pairwise.mean(), rtol=1e-6)
    # Uniform attention everywhere: the rollout is (0.5 U + 0.5 I)^layers, the class row.
    mixed = 0.5 * np.full((33, 33), 1 / 33) + 0.5 * np.eye(33)
    expected = np.linalg.matrix_power(mixed, 2)[0, 1:].reshape(4, 8)
    np.testing.assert_allclose(inspection.attention_rollout(model, images), [expected] * 3,
                               rtol=1e-6)


def test_mean_attention_distance_matches_the_reference_attention():
    model, params = build(image_size=(32, 48), patch_size=(8, 6), seed=6)
    images = random_images(3, (32, 48), seed=7)
    _, _, attentions = reference.forward(params, images)
    pairwise = cdist(centres((4, 8), (8, 6)), centres((4, 8), (8, 6)))
    expected = expected_distance(attentions, 1, pairwise)
    got = inspection.mean_attention_distance(model, images, batch_size=2)
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    assert np.ptp(expected) > 0.1  # heads differ: not the uniform case again


def identity_attention_model(classifier):
    """Tokens are one-hot position embeddings, unchanged by every block (zero attention output
    and MLP output); query = key = 4 * LayerNorm(token) in one head, so each token attends to
    itself alone (logit gap of about 93)."""
    model = keras_vit.ViT(image_size=32, patch_size=8, hidden_size=32, num_layers=3,
                          num_heads=1, mlp_dim=16, num_classes=5, classifier=classifier)
    params = weights.model_params(model)
    for key, value in params.items():
        if key.startswith("embedding/") or "/out/" in key or "Dense_1" in key:
            params[key] = np.zeros_like(value)
    length = params[weights.layouts.POSEMB_KEY].shape[1]
    params[weights.layouts.POSEMB_KEY] = np.eye(length, 32, dtype=np.float32)[None]
    for i in range(3):
        for proj in ("query", "key"):
            params[ATTENTION.format(i) + f"{proj}/kernel"] = 4 * np.eye(32, dtype=np.float32)[
                :, None]
            params[ATTENTION.format(i) + f"{proj}/bias"] = np.zeros((1, 32), np.float32)
    weights.load_params(model, params)
    return model, length


def test_identity_attention_rolls_out_uniformly_over_patches():
    model, length = identity_attention_model("gap")
    images = random_images(2, (32, 32))
    weights = inspection.attention_weights(model, images)
    np.testing.assert_allclose(weights, np.broadcast_to(np.eye(length), weights.shape), atol=1e-6)
    # Gap models read the mean token: with no mixing it draws 1/16 from every patch.
    np.testing.assert_allclose(inspection.attention_rollout(model, images), 1 / 16, atol=1e-6)
    # With a class token and no mixing, the class token only ever sees itself.
    model, _ = identity_attention_model("token")
    np.testing.assert_allclose(inspection.attention_rollout(model, images), 0, atol=1e-6)


def test_one_hot_position_embeddings_give_an_identity_similarity_grid():
    model, params = build(seed=8)
    posemb = np.zeros((1, 25, 32), np.float32)
    posemb[0, 0] = np.random.default_rng(9).normal(size=32)  # class token: left out
    posemb[0, 1:, :24] = 3 * np.eye(24)
    model.get_layer("posembed_input").pos_embedding.assign(posemb)
    similarity = inspection.position_embedding_similarity(model)
    assert similarity.shape == (4, 6, 4, 6)
    np.testing.assert_allclose(similarity.reshape(24, 24), np.eye(24), atol=1e-12)
    # Random embeddings against scikit-learn's cosine similarity.
    model, params = build(classifier="gap", seed=10)
    expected = cosine_similarity(params[weights.layouts.POSEMB_KEY][0])
    np.testing.assert_allclose(
        inspection.position_embedding_similarity(model), expected.reshape(4, 6, 4, 6), atol=1e-6)


def test_patch_embedding_components_match_scikit_learn_pca():
    model, params = build(patch_size=(8, 6), seed=11)
    filters = params["embedding/kernel"].reshape(-1, 32).T.astype(np.float64)  # [D, 144]
    pca = PCA(n_components=5).fit(filters)
    components, ratio = inspection.patch_embedding_components(model, num_components=5)
    assert components.shape == (5, 8, 6, 3)
    np.testing.assert_allclose(ratio, pca.explained_variance_ratio_, rtol=1e-6)
    flat = components.reshape(5, -1)
    # Same directions (PCA signs are a convention); ours has its largest entry positive.
    np.testing.assert_allclose(np.abs(np.sum(flat * pca.components_, axis=1)), 1, atol=1e-6)
    assert np.all(flat[np.arange(5), np.abs(flat).argmax(axis=1)] > 0)
    # Grey inputs see each filter summed over its colour planes.
    grey = params["embedding/kernel"].astype(np.float64).sum(axis=2).reshape(-1, 32).T
    pca = PCA(n_components=4).fit(grey)
    components, ratio = inspection.patch_embedding_components(model, 4, gray=True)
    assert components.shape == (4, 8, 6, 1)
    np.testing.assert_allclose(ratio, pca.explained_variance_ratio_, rtol=1e-6)
    np.testing.assert_allclose(
        np.abs(np.sum(components.reshape(4, -1) * pca.components_, axis=1)), 1, atol=1e-6)


# ------------------------------------------------------------------------------------------
# The command and its PNGs.


def write_images(directory, sizes):
    paths = []
    rng = np.random.default_rng(12)
    for i, (height, width) in enumerate(sizes):
        path = directory / f"image{i}.{'png' if i % 2 else 'jpg'}"
        Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(path)
        paths.append(str(path))
    return paths


def test_command_writes_four_pngs_of_the_expected_sizes(tmp_path, capsys):
    model, _ = build(image_size=(32, 64), seed=13)
    npz = tmp_path / "tiny.npz"
    weights.save_npz(model, npz)
    images = write_images(tmp_path, [(40, 30), (64, 128), (20, 20)])
    out = tmp_path / "figures"
    code = cli.main(["inspect", "--pretrained", str(npz), "--image-size", "32x64",
                     "--layer", "0", "--head", "1", "--out", str(out), *images])
    assert code == 0
    printed = capsys.readouterr().out
    # Attention: 3 rows of 250 * 32/64 + 40 pixels. Similarity: 4 rows of tiles 4 cells high
    # and 8 columns of tiles 8 cells wide, 1-cell gaps: 19 x 71 square cells, the longer side
    # 600 pixels, plus 160 x 100 of margins. Filters: 28 (the kernel has 8*8*3 = 192 values,
    # 32 filters) in 4 rows of 7.
    expected = {
        "attention.png": (750, 3 * (125 + 40)),
        "attention_distance.png": (600, 450),
        "position_embedding_similarity.png": (600 + 160, round(19 * 600 / 71) + 100),
        "patch_embedding_filters.png": (7 * 100, 4 * 100 + 50),
    }
    for name, size in expected.items():
        path = out / name
        assert str(path) in printed
        assert path.stat().st_size > 5000
        with Image.open(path) as png:
            assert png.format == "PNG" and png.size == size, name
            assert np.asarray(png.convert("L")).std() > 5  # something is drawn


def run_inspect(monkeypatch, *argv):
    """Runs `keras-vit inspect ARGV` up to the figures: returns the exit code and the model
    and the preprocessed images the command would draw them from (None if it stopped)."""
    seen = {}

    def record(model, batch, out_dir, **kwargs):
        seen.update(model=model, images=batch)
        return {}

    with monkeypatch.context() as patch:
        patch.setattr(inspection, "inspect_model", record)
        code = cli.main(["inspect", *argv])
    return code, seen.get("model"), seen.get("images")


def assert_same_params(model, params, skip=("head/",)):
    loaded = weights.model_params(model)
    assert sorted(loaded) == sorted(k for k in params if not k.startswith(skip))
    for key, value in loaded.items():
        np.testing.assert_array_equal(value, params[key], err_msg=key)


def test_built_model_has_the_checkpoint_weights_and_architecture(tmp_path, monkeypatch):
    image = write_images(tmp_path, [(20, 20)])
    out = ["--out", str(tmp_path / "out"), *image]
    model, params = build(image_size=(32, 64), classifier="gap", seed=14)
    npz = tmp_path / "gap.npz"
    weights.save_npz(model, npz)
    # A non-square checkpoint: its shapes give everything but the image size.
    code, built, _ = run_inspect(monkeypatch, "--pretrained", str(npz), "--image-size", "32x64",
                                 *out)
    assert code == 0
    assert_same_params(built, params)
    geo = inspection.geometry(built)
    assert (geo.grid, geo.num_prefix, geo.num_layers, geo.num_heads) == ((4, 8), 0, 2, 4)
    # A square checkpoint needs no --image-size.
    square, square_params = build(image_size=32, seed=15)
    weights.save_npz(square, tmp_path / "square.npz")
    config = weights.config_from_params(weights.read_npz(tmp_path / "square.npz"))
    assert config == dict(image_size=32, patch_size=(8, 8), classifier="token", num_classes=5,
                          include_top=True, representation_size=None, **TINY)
    code, built, _ = run_inspect(monkeypatch, "--weights", str(tmp_path / "square.npz"), *out)
    assert code == 0
    assert_same_params(built, square_params)
    geo = inspection.geometry(built)
    assert (geo.image_size, geo.grid, geo.num_prefix) == ((32, 32), (4, 4), 1)
    # A .keras file is used as it is.
    square.save(tmp_path / "square.keras")
    code, restored, _ = run_inspect(monkeypatch, "--model", str(tmp_path / "square.keras"), *out)
    assert code == 0
    assert_same_params(restored, square_params, skip=())


def test_variant_name_or_registry_name_with_pretrained_weights(tmp_path, monkeypatch, capsys):
    ti16 = keras_vit.ViT_Ti16(image_size=32, include_top=False)
    npz = tmp_path / "ti16.npz"
    weights.save_npz(ti16, npz)
    expected = weights.model_params(ti16)
    # A registry entry gives the variant and resolution; this one lives only in this test.
    monkeypatch.setenv("KERAS_VIT_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(weights.registry, "_REGISTERED", dict(weights.registry._REGISTERED))
    weights.register_checkpoint("test/ti16-32px", npz.as_uri(), "Ti/16", resolution=32)
    out = ["--out", str(tmp_path / "out"), *write_images(tmp_path, [(20, 20)])]
    for flags in (["--model", "Ti/16", "--weights", str(npz), "--image-size", "32"],
                  ["--pretrained", "test/ti16-32px"]):
        code, built, _ = run_inspect(monkeypatch, *flags, *out)
        assert code == 0, flags
        assert inspection.geometry(built).grid == (2, 2)
        assert_same_params(built, expected)
    capsys.readouterr()
    assert cli.main(["inspect", "--pretrained", "test/ti16-23px", *out]) == 2
    assert "Unknown checkpoint 'test/ti16-23px'. Did you mean 'test/ti16-32px'" in (
        capsys.readouterr().err)
    assert not (tmp_path / "out").exists()


def test_hybrid_models_measure_distance_in_input_pixels(tmp_path, monkeypatch):
    """The ResNet root (stride 4) turns 32 px into an 8x8 map; patches of 2 cells are 8 px."""
    model = keras_vit.ViT(image_size=32, patch_size=2, num_classes=5, resnet={"num_layers": ()},
                          **TINY)
    for i in range(2):
        attention = model.get_layer(f"encoderblock_{i}").attention
        for proj in (attention.query, attention.key):
            proj.kernel.assign(np.zeros(proj.kernel.shape, np.float32))
            proj.bias.assign(np.zeros(proj.bias.shape, np.float32))
    geo = inspection.geometry(model)
    assert geo.grid == (4, 4) and geo.patch_pixels == (8.0, 8.0)
    images = random_images(2, (32, 32))
    pairwise = cdist(centres((4, 4), (8, 8)), centres((4, 4), (8, 8)))
    np.testing.assert_allclose(inspection.mean_attention_distance(model, images),
                               pairwise.mean(), rtol=1e-6)
    # Three figures: a hybrid's patch embedding sees ResNet features, not RGB pixels. Both
    # attention figures come from one forward pass per batch (here 2 batches of 1 image).
    calls = []
    predict = keras.Model.predict_on_batch
    monkeypatch.setattr(keras.Model, "predict_on_batch",
                        lambda self, x: calls.append(len(x)) or predict(self, x))
    results = inspection.inspect_model(model, images, tmp_path, batch_size=1)
    assert calls == [1, 1]
    assert sorted(results) == ["attention", "attention_distance", "position_embedding_similarity"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        inspection.FIGURE_FILES[name] for name in results)
    with pytest.raises(ValueError, match=r"needs a kernel \[patch_h, patch_w, 3, D\]. Received "
                                         r"a kernel of shape \(2, 2, 64, 32\)"):
        inspection.patch_embedding_components(model)
    # The architecture of a hybrid checkpoint is read off its arrays too (ResNet stages
    # included), so the command needs no --model for it.
    weights.save_npz(model, tmp_path / "hybrid.npz")
    config = weights.config_from_params(weights.read_npz(tmp_path / "hybrid.npz"))
    assert (config["resnet"], config["image_size"], config["patch_size"]) == (
        {"num_layers": ()}, 32, (2, 2))
    rebuilt = keras_vit.from_pretrained(str(tmp_path / "hybrid.npz"), progress=False)
    assert inspection.geometry(rebuilt) == geo
    assert_same_params(rebuilt, weights.model_params(model), skip=())


def test_images_are_resized_and_scaled(tmp_path, monkeypatch):
    pixels = np.zeros((4, 6, 3), np.uint8)
    pixels[..., 0] = 255  # pure red: every resize keeps it
    Image.fromarray(pixels).save(tmp_path / "red.png")
    Image.fromarray(pixels[..., 0]).save(tmp_path / "gray.png")  # grayscale becomes RGB
    paths = [str(tmp_path / "red.png"), str(tmp_path / "gray.png")]
    red, gray = (image_files.load_image(path, (8, 12)) for path in paths)
    assert red.shape == gray.shape == (8, 12, 3) and red.dtype == np.float32
    np.testing.assert_allclose(red, np.broadcast_to([255, 0, 0], (8, 12, 3)))
    np.testing.assert_allclose(gray, 255)
    # The command reads the images at the model's resolution, scaled to [-1, 1].
    config = dict(image_size=[8, 12], patch_size=4, **TINY)
    code, _, batch = run_inspect(monkeypatch, "--model-config", json.dumps(config), "--out",
                                 str(tmp_path / "out"), *paths)
    assert code == 0
    assert batch.shape == (2, 8, 12, 3) and batch.dtype == np.float32
    np.testing.assert_allclose(batch[0], np.broadcast_to([1, -1, -1], (8, 12, 3)))
    np.testing.assert_allclose(batch[1], 1)


# ------------------------------------------------------------------------------------------
# Bad input.


def test_layer_or_head_out_of_range():
    model, _ = build()
    images = random_images(1, (32, 48))
    with pytest.raises(ValueError, match="layer 2 is out of range: the model has 2 encoder "
                                         "blocks. Expected an integer from 0 to 1"):
        inspection.attention_map(model, images, layer=2)
    with pytest.raises(ValueError, match="layer -3 is out of range"):
        inspection.plot_attention(model, images, "unused.png", layer=-3)
    with pytest.raises(ValueError, match="head 4 is out of range: the model has 4 attention "
                                         "heads. Expected an integer from 0 to 3"):
        inspection.attention_map(model, images, layer=0, head=4)


def test_class_token_attention_on_a_model_without_one():
    model, _ = build(classifier="gap")
    images = random_images(1, (32, 48))
    message = r"query='class' needs a class token, but this model has none \(classifier='gap'\)"
    with pytest.raises(ValueError, match=message):
        inspection.attention_rollout(model, images, query="class")
    with pytest.raises(ValueError, match=message):
        inspection.attention_map(model, images, query="class")
    with pytest.raises(ValueError, match="query must be 'class', 'mean' or None. Received: 'cls'"):
        inspection.attention_map(model, images, query="cls")


def test_a_gap_model_with_a_class_token_is_read_from_its_patch_tokens():
    # timm's global_pool="avg" models keep a class token that their classifier never reads.
    model = keras_vit.ViT(image_size=(32, 48), patch_size=8, classifier="gap", class_token=True,
                          num_classes=5, **TINY)
    images = random_images(2, (32, 48))
    probs = inspection.attention_weights(model, images)[1].mean(axis=1)  # [B, N, N], mean of heads
    patch_queries = probs[:, 1:, 1:].mean(axis=1).reshape(2, 4, 6)  # the patch tokens' mean row
    np.testing.assert_allclose(inspection.attention_map(model, images, layer=1), patch_queries,
                               atol=1e-6)
    np.testing.assert_allclose(inspection.attention_map(model, images, layer=1, query="mean"),
                               patch_queries, atol=1e-6)
    class_row = inspection.attention_map(model, images, layer=1, query="class")
    np.testing.assert_allclose(class_row, probs[:, 0, 1:].reshape(2, 4, 6), atol=1e-6)
    assert np.abs(class_row - patch_queries).max() > 1e-4  # the two readings differ


@pytest.mark.parametrize("images, message", [
    (np.full((1, 32, 48, 3), 128, np.uint8), "The images are uint8, not scaled"),
    (np.full((1, 32, 48, 3), 128.0, np.float32), "The images hold values from 128 to 128"),
    (np.full((1, 32, 48, 3), np.nan, np.float32), "The images hold values from nan to nan"),
    (np.ones((1, 32, 48, 3), bool), "The images are bool, not scaled"),
    (np.ones((1, 32, 48, 3), complex), "The images are complex128, not real pixels"),
], ids=["uint8", "0_255_floats", "nan", "bool", "complex"])
def test_images_not_preprocessed_for_the_model_are_refused(tmp_path, images, message):
    model, _ = build()
    with pytest.raises(ValueError, match=re.escape(message)):
        inspection.attention_rollout(model, images)
    with pytest.raises(ValueError, match=re.escape(message)):
        inspection.inspect_model(model, images, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_model_without_position_embeddings_gets_the_other_figures(tmp_path, capsys):
    config = dict(image_size=32, patch_size=8, position_embedding="relative", **TINY)
    model = keras_vit.ViT(num_classes=5, **config)
    assert not inspection.has_position_embeddings(model)
    figures = inspection.inspect_model(model, random_images(1, (32, 32)), tmp_path / "py")
    assert sorted(figures) == ["attention", "attention_distance", "patch_embedding_filters"]
    assert sorted(p.name for p in (tmp_path / "py").iterdir()) == [
        "attention.png", "attention_distance.png", "patch_embedding_filters.png"]
    image = tmp_path / "image.png"
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(image)
    argv = ["inspect", "--model-config", json.dumps(config), str(image), "--out",
            str(tmp_path / "cli")]
    assert cli.main(argv) == 0
    assert "position_embedding_similarity  none: the model adds no embedding per position" in (
        capsys.readouterr().out)
    assert cli.main(argv) == 2  # the same command again: the figures it wrote are there
    assert "attention.png already exists" in capsys.readouterr().err


def test_images_that_cannot_be_used(tmp_path, capsys):
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"this is not a PNG file")
    undecodable = f"{bad} is not an image in a supported format"
    with pytest.raises(ValueError, match=re.escape(undecodable)):
        image_files.load_image(bad, (32, 32))
    with pytest.raises(FileNotFoundError, match="missing.png does not exist"):
        image_files.load_image(tmp_path / "missing.png", (32, 32))
    model, _ = build()
    with pytest.raises(ValueError, match=r"images must have shape \[batch, 32, 48, 3\].*"
                                         r"Received shape \(2, 32, 32, 3\)"):
        inspection.attention_rollout(model, random_images(2, (32, 32)))
    # Through the command: exit code 2 and the reason, no figures.
    npz = tmp_path / "m.npz"
    weights.save_npz(model, npz)
    args = ["inspect", "--pretrained", str(npz), "--image-size", "32x48", "--out",
            str(tmp_path / "out")]
    assert cli.main([*args, str(bad)]) == 2
    assert undecodable in capsys.readouterr().err
    # Every file is looked for before any is decoded.
    assert cli.main([*args, str(bad), str(tmp_path / "missing.png")]) == 2
    assert "missing.png does not exist" in capsys.readouterr().err
    assert cli.main([*args, "--layer", "7", str(bad)]) == 2  # checked before the images
    assert "layer 7 is out of range: the model has 2 encoder blocks" in capsys.readouterr().err
    # A non-square checkpoint without --image-size cannot be rebuilt.
    assert cli.main(["inspect", "--pretrained", str(npz), "--out", "o", str(bad)]) == 2
    assert "covers 24 patches, not a square grid" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_bad_component_count_and_image_size(capsys):
    model, _ = build()
    with pytest.raises(ValueError, match="num_components must be an integer from 1 to 32 "
                                         r"\(the filters are 32 samples of 192 values\). "
                                         "Received: 33"):
        inspection.patch_embedding_components(model, num_components=33)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["inspect", "--image-size", "32by48", "--out", "o", "x"])
    assert exit_info.value.code == 2
    assert "expected N or HEIGHTxWIDTH (e.g. 224 or 384x512). Received: '32by48'" in (
        capsys.readouterr().err)
