"""The core model: parameter counts, parity with the NumPy reference, round-trips, errors."""

import inspect
import json
import os
import subprocess
import sys
import warnings

import keras
import numpy as np
import pytest
import reference

import keras_vit
from keras_vit.model_parts import encoder_blocks
from keras_vit import weights

TINY = dict(hidden_size=32, num_layers=2, num_heads=4, mlp_dim=48)


def tiny_model(**kwargs):
    args = dict(image_size=32, patch_size=8, num_classes=10, **TINY)
    args.update(kwargs)
    return keras_vit.ViT(**args)


def reference_params(rng, model_kwargs):
    """Random official-layout params for the config `model_kwargs` describes."""
    h, w = keras_vit.layers.to_pair("image_size", model_kwargs["image_size"])
    ph, pw = keras_vit.layers.to_pair("patch_size", model_kwargs["patch_size"])
    return reference.official_params(
        rng,
        hidden=model_kwargs["hidden_size"],
        mlp=model_kwargs["mlp_dim"],
        heads=model_kwargs["num_heads"],
        layers=model_kwargs["num_layers"],
        patch=(ph, pw),
        grid=(h // ph, w // pw),
        num_classes=model_kwargs.get("num_classes")
        if model_kwargs.get("include_top", True)
        else None,
        classifier=model_kwargs.get("classifier", "token"),
        representation=model_kwargs.get("representation_size"),
    )


# ------------------------------------------------------------------------------------------
# Parameter counts of the official table.

OFFICIAL_COUNTS = {  # vit_jax models_test.py, 224 px, 1000 classes
    "Ti/16": 5_717_416,
    "S/16": 22_050_664,
    "B/16": 86_567_656,
    "B/32": 88_224_232,
    "L/16": 304_326_632,
    "L/32": 306_535_400,
    "H/14": 632_045_800,
    "R50+B/16": 98_659_112,
    "R50+L/32": 328_994_856,
}

# The paper's variants (vit_jax configs/models.py): width D, MLP width, blocks, patch size
# (cells of the ResNet's feature map for hybrids) and the ResNet's units per stage.
PAPER_VARIANTS = {
    "Ti/16": (192, 768, 12, 16, None),
    "S/16": (384, 1536, 12, 16, None),
    "S/32": (384, 1536, 12, 32, None),
    "B/8": (768, 3072, 12, 8, None),
    "B/16": (768, 3072, 12, 16, None),
    "B/32": (768, 3072, 12, 32, None),
    "L/16": (1024, 4096, 24, 16, None),
    "L/32": (1024, 4096, 24, 32, None),
    "H/14": (1280, 5120, 32, 14, None),
    "R50+B/16": (768, 3072, 12, 1, (3, 4, 9)),
    "R50+L/32": (1024, 4096, 24, 1, (3, 4, 6, 3)),
    "R26+B/32": (768, 3072, 12, 1, (2, 2, 2, 2)),
    "R26+S/32": (384, 1536, 12, 1, (2, 2, 2, 2)),
    "R+Ti/16": (192, 768, 12, 8, ()),
}


def resnet_count(stages, width=64):
    """Parameters, output channels and stride of the hybrids' ResNet (BiT's ResNetV2): a
    7x7/2 root convolution without bias, GroupNorm, a 3x3/2 max-pool; bottleneck units of 1x1,
    3x3 and 1x1 convolutions without bias, each with a GroupNorm (scale and bias), and in each
    stage's first unit a 1x1 projection with its GroupNorm. Stages after the first halve the
    map."""
    count, channels = 7 * 7 * 3 * width + 2 * width, width
    for stage, units in enumerate(stages):
        mid = width * 2 ** stage
        out = 4 * mid
        for unit in range(units):
            count += channels * mid + 9 * mid * mid + mid * out + 2 * (mid + mid + out)
            if unit == 0:
                count += channels * out + 2 * out
            channels = out
    return count, channels, 4 * 2 ** max(len(stages) - 1, 0)


def vit_count(hidden, mlp, blocks, patch, resnet=None, image_size=224, num_classes=1000,
              representation=None):
    """The parameter count of the ViT architecture, from the paper's equations 1-4."""
    d = hidden
    count, channels, stride = resnet_count(resnet) if resnet is not None else (0, 3, 1)
    tokens = (image_size // (stride * patch)) ** 2
    count += patch * patch * channels * d + d  # patch embedding E and its bias
    count += d + (tokens + 1) * d  # class token, position embeddings
    attention = 4 * d * d + 4 * d  # query, key, value and output projections with biases
    mlp_block = d * mlp + mlp + mlp * d + d
    count += blocks * (attention + mlp_block + 2 * 2 * d)  # and two LayerNorms per block
    count += 2 * d  # the final LayerNorm
    if representation:
        count += d * representation + representation  # pre_logits
        d = representation
    return count + d * num_classes + num_classes  # the head


def test_the_argument_list_configuration_files_are_read_with_is_the_models():
    parameters = inspect.signature(keras_vit.ViT).parameters.values()
    assert keras_vit.configs.VIT_ARGUMENTS == tuple(
        p.name for p in parameters if p.kind is not p.VAR_KEYWORD)
    document = dict(format="keras_vit", model=keras_vit.ViT(
        image_size=32, patch_size=8, num_classes=3, **TINY).vit_arguments())
    assert weights.config_json.check_keras_vit(document, "x")["model"] == document["model"]


def test_the_paper_variants_are_the_variants():
    assert sorted(PAPER_VARIANTS) == sorted(keras_vit.VARIANTS)


@pytest.mark.parametrize("name", PAPER_VARIANTS)
def test_parameter_count_of_a_variant(name):
    count = vit_count(*PAPER_VARIANTS[name])
    assert count == OFFICIAL_COUNTS.get(name, count)
    variant = keras_vit.get_variant(name)
    assert variant.params == count
    # Built with the initialisation of its variables deferred: their shapes alone, no values.
    with keras.StatelessScope(initialize_variables=False):
        model = getattr(keras_vit, variant.builder_name)()
    assert model.count_params() == count


def test_parameter_count_of_a_representation_layer_and_other_sizes():
    model = keras_vit.ViT(image_size=48, patch_size=2, num_classes=7, representation_size=24,
                          resnet={"num_layers": (1, 1)}, **TINY)  # tokens: (48 / 8 / 2)^2
    assert model.count_params() == vit_count(32, 48, 2, 2, (1, 1), 48, 7, 24)


def test_variant_lookup_spellings():
    for spelling in ("B/16", "ViT-B/16", "ViT_B16", "vit_b16", "b16"):
        assert keras_vit.get_variant(spelling).name == "B/16"
    assert keras_vit.get_variant("ti/16").name == "Ti/16"


# ------------------------------------------------------------------------------------------
# Parity with the independent NumPy forward.

PARITY_CASES = {
    "token": dict(),
    "gap": dict(classifier="gap"),
    "token+representation": dict(representation_size=24),
    "gap+representation": dict(classifier="gap", representation_size=24),
    "exact_gelu": dict(gelu_approximate=False),
}


@pytest.mark.parametrize("case", PARITY_CASES)
def test_logits_match_numpy_reference_on_non_square_images(case):
    kwargs = dict(image_size=(32, 48), patch_size=8, num_classes=7, **TINY)
    kwargs.update(PARITY_CASES[case])
    model = keras_vit.ViT(**kwargs)
    rng = np.random.default_rng(0)
    params = reference_params(rng, kwargs)
    weights.load_params(model, params)
    images = rng.uniform(-1, 1, (3, 32, 48, 3)).astype(np.float32)
    expected, _, _ = reference.forward(
        params, images, kwargs.get("classifier", "token"), kwargs.get("gelu_approximate", True)
    )
    logits = keras.ops.convert_to_numpy(model(images))
    assert logits.dtype == np.float32
    assert np.abs(expected).max() > 0.1  # the check is not vacuous
    np.testing.assert_allclose(logits, expected, atol=1e-5, rtol=1e-5)
    # The training path (no dropout here) takes other kernels (keras_vit.kernels).
    trained = keras.ops.convert_to_numpy(model(images, training=True))
    np.testing.assert_allclose(trained, expected, atol=1e-5, rtol=1e-5)


def test_gelu_choice_changes_the_output():
    """The approximate and exact GELU are different functions, and the flag picks one."""
    kwargs = dict(image_size=32, patch_size=8, num_classes=7, **TINY)
    rng = np.random.default_rng(1)
    params = reference_params(rng, kwargs)
    images = rng.uniform(-1, 1, (2, 32, 32, 3)).astype(np.float32)
    outs = []
    for approximate in (True, False):
        model = keras_vit.ViT(gelu_approximate=approximate, **kwargs)
        weights.load_params(model, params)
        outs.append(keras.ops.convert_to_numpy(model(images)))
    assert np.abs(outs[0] - outs[1]).max() > 1e-5


def test_features_tokens_and_attention_are_reachable():
    kwargs = dict(image_size=(32, 48), patch_size=8, num_classes=7, **TINY)
    model = keras_vit.ViT(**kwargs)
    rng = np.random.default_rng(2)
    params = reference_params(rng, kwargs)
    weights.load_params(model, params)
    images = rng.uniform(-1, 1, (2, 32, 48, 3)).astype(np.float32)
    _, tokens, attentions = reference.forward(params, images)
    probe = keras.Model(model.input, model.get_layer("encoder_norm").output)
    _, probabilities = model.attention_model()(images)
    got = [keras.ops.convert_to_numpy(t) for t in [probe(images), *probabilities]]
    np.testing.assert_allclose(got[0], tokens, atol=1e-5)
    for probs, expected in zip(got[1:], attentions):
        assert probs.shape == (2, 4, 25, 25)
        np.testing.assert_allclose(probs, expected, atol=1e-5)
        np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-5)


def test_include_top_false_returns_the_representation():
    kwargs = dict(image_size=32, patch_size=8, representation_size=24, **TINY)
    model = keras_vit.ViT(include_top=False, **kwargs)
    assert model.output.shape == (None, 24)
    rng = np.random.default_rng(3)
    params = reference_params(rng, dict(kwargs, include_top=False))
    weights.load_params(model, params)
    images = rng.uniform(-1, 1, (2, 32, 32, 3)).astype(np.float32)
    expected, _, _ = reference.forward(params, images, include_top=False)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(model(images)), expected, atol=1e-5)
    assert "head" not in [layer.name for layer in model.layers]


def test_head_is_zero_initialised_and_other_weights_are_not():
    model = tiny_model()
    head = model.get_layer("head")
    assert not np.any(keras.ops.convert_to_numpy(head.kernel))
    assert not np.any(keras.ops.convert_to_numpy(head.bias))
    posemb = keras.ops.convert_to_numpy(model.get_layer("posembed_input").pos_embedding)
    assert 0.01 < posemb.std() < 0.03  # normal(stddev=0.02)
    assert not np.any(keras.ops.convert_to_numpy(model.get_layer("cls").cls))


def test_preprocess_inputs_scales_to_minus_one_one():
    x = np.array([[[[0, 127.5, 255]]]], np.float32)
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(keras_vit.preprocess_inputs(x)), [[[[-1, 0, 1]]]]
    )
    out = keras_vit.preprocess_inputs(np.full((1, 2, 2, 3), 255, np.uint8))
    assert keras.backend.standardize_dtype(out.dtype) == "float32"
    np.testing.assert_allclose(keras.ops.convert_to_numpy(out), 1.0)


# ------------------------------------------------------------------------------------------
# Training signal.


def test_every_weight_gets_a_gradient_in_one_step():
    import tensorflow as tf

    model = tiny_model(representation_size=16)
    rng = np.random.default_rng(4)
    x = rng.uniform(-1, 1, (4, 32, 32, 3)).astype(np.float32)
    y = np.array([0, 1, 2, 3])
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def grads():
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        return dict(
            zip(
                [v.path for v in model.trainable_variables],
                tape.gradient(loss, model.trainable_variables),
            )
        )

    # With the zero head, only the head gets gradient at first (backbone gradients flow
    # through the head's kernel); after one step every weight does.
    first = grads()
    assert np.abs(first["head/bias"].numpy()).max() > 0
    optimizer = keras.optimizers.SGD(0.1)
    optimizer.apply(list(first.values()), model.trainable_variables)
    for path, g in grads().items():
        assert g is not None and np.abs(g.numpy()).max() > 0, path


# ------------------------------------------------------------------------------------------
# Serialisation.

LAYERS = [
    keras_vit.PatchEmbedding(patch_size=(4, 8), hidden_size=16, name="pe"),
    keras_vit.ClassToken(name="ct"),
    keras_vit.AddPositionEmbs(name="ape"),
    keras_vit.MultiHeadDotProductAttention(num_heads=4, attention_dropout_rate=0.1),
    keras_vit.MlpBlock(mlp_dim=24, dropout_rate=0.2, gelu_approximate=False),
    keras_vit.TransformerBlock(
        num_heads=2,
        mlp_dim=24,
        dropout_rate=0.1,
        attention_dropout_rate=0.2,
        layer_norm_epsilon=1e-5,
        gelu_approximate=False,
    ),
    keras_vit.TokenPooling(classifier="gap"),
]


@pytest.mark.parametrize("layer", LAYERS, ids=lambda layer: type(layer).__name__)
def test_layer_config_round_trips(layer):
    config = layer.get_config()
    clone = type(layer).from_config(config)
    assert clone.get_config() == config
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert type(restored) is type(layer)
    assert restored.get_config() == config
    # get_config holds exactly the constructor arguments (plus the base Layer's).
    base = set(keras.layers.Layer().get_config())
    own_init = type(layer).__dict__.get("__init__")
    args = set(inspect.signature(own_init).parameters) - {"self", "kwargs"} if own_init else set()
    assert set(config) - base == args


@pytest.mark.parametrize("kwargs", [dict(), dict(classifier="gap", representation_size=8)])
def test_keras_file_round_trip(tmp_path, kwargs):
    model = tiny_model(image_size=(16, 24), **kwargs)
    rng = np.random.default_rng(5)
    weights.load_params(
        model,
        reference_params(
            rng, dict(image_size=(16, 24), patch_size=8, num_classes=10, **TINY, **kwargs)
        ),
    )
    path = tmp_path / "model.keras"
    model.save(path)
    restored = keras.saving.load_model(path)
    images = rng.uniform(-1, 1, (2, 16, 24, 3)).astype(np.float32)
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(model(images)), keras.ops.convert_to_numpy(restored(images))
    )
    assert [type(layer) for layer in restored.layers] == [type(layer) for layer in model.layers]
    assert isinstance(restored.get_layer("encoderblock_1"), keras_vit.TransformerBlock)


# ------------------------------------------------------------------------------------------
# Mixed precision.


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_mixed_precision_builds_runs_and_returns_float32_logits(policy):
    keras.config.set_dtype_policy(policy)
    kwargs = dict(image_size=32, patch_size=8, num_classes=7, **TINY)
    model = keras_vit.ViT(**kwargs)
    rng = np.random.default_rng(6)
    params = reference_params(rng, kwargs)
    weights.load_params(model, params)
    assert model.get_layer("encoderblock_0").compute_dtype == policy.split("_")[1]
    images = rng.uniform(-1, 1, (2, 32, 32, 3)).astype(np.float32)
    logits = model(images)
    assert keras.backend.standardize_dtype(logits.dtype) == "float32"
    expected, _, _ = reference.forward(params, images)
    tolerance = 0.1 if policy == "mixed_bfloat16" else 0.02
    np.testing.assert_allclose(keras.ops.convert_to_numpy(logits), expected, atol=tolerance)


# ------------------------------------------------------------------------------------------
# Other backends.

JAX_SCRIPT = r"""
import json, sys
import numpy as np
import keras
assert keras.backend.backend() == "jax"
import keras_vit
from keras_vit import weights
params = dict(np.load(sys.argv[1]))
model = keras_vit.ViT(**json.loads(sys.argv[2]))
weights.load_params(model, params)
images = np.load(sys.argv[3])
np.save(sys.argv[4], keras.ops.convert_to_numpy(model(images)))
"""


def test_jax_backend_matches_tensorflow(tmp_path):
    kwargs = dict(image_size=(32, 48), patch_size=8, num_classes=7, classifier="token", **TINY)
    rng = np.random.default_rng(7)
    params = reference_params(rng, kwargs)
    np.savez(tmp_path / "params.npz", **params)
    images = rng.uniform(-1, 1, (2, 32, 48, 3)).astype(np.float32)
    np.save(tmp_path / "images.npy", images)
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu")
    subprocess.run(
        [
            sys.executable,
            "-c",
            JAX_SCRIPT,
            str(tmp_path / "params.npz"),
            json.dumps(kwargs),
            str(tmp_path / "images.npy"),
            str(tmp_path / "out.npy"),
        ],
        check=True,
        env=env,
        timeout=300,
    )
    model = keras_vit.ViT(**kwargs)
    weights.load_params(model, params)
    tf_logits = keras.ops.convert_to_numpy(model(images))
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), tf_logits, atol=1e-5)


# ------------------------------------------------------------------------------------------
# Bad input.

BAD_INPUTS = {
    "image not divisible": (
        dict(image_size=225),
        "image_size height 225 is not divisible by patch_size 16",
    ),
    "width not divisible": (
        dict(image_size=(224, 200)),
        "width 200 is not divisible by patch_size 16",
    ),
    "heads": (
        dict(hidden_size=100, num_heads=12),
        "hidden_size 100 is not divisible by num_heads 12",
    ),
    "classifier": (dict(classifier="cls"),
                   "`classifier` must be one of 'token', 'gap'. Received: classifier='cls'"),
    "zero layers": (
        dict(num_layers=0),
        "`num_layers` must be a positive integer. Received: num_layers=0",
    ),
    "negative hidden": (dict(hidden_size=-8), "hidden_size=-8"),
    "zero classes": (dict(num_classes=0), "num_classes=0"),
    "float patch": (dict(patch_size=16.0), "patch_size=16.0"),
    "representation": (dict(representation_size=-1), "representation_size=-1"),
    "image size triple": (dict(image_size=(1, 2, 3)), "(height, width) pair"),
    "resize of a fixed embedding": (
        dict(position_embedding="sincos_2d", position_resize="bicubic"),
        "position_resize='bicubic' resizes a learned position embedding of one vector per "
        "patch. Expected position_embedding=\"learned\" with it"),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_arguments_raise_clear_errors(case):
    kwargs, message = BAD_INPUTS[case]
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        keras_vit.ViT(**kwargs)


def test_unknown_variant_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"Unknown ViT variant 'B/15'. Expected one of Ti/16"):
        keras_vit.create_model("B/15")


def test_wrong_number_of_channels():
    model = tiny_model()
    with pytest.raises(
        ValueError, match=r"expected shape=\(None, 32, 32, 3\), found shape=\(1, 32, 32, 4\)"
    ):
        model(np.zeros((1, 32, 32, 4), np.float32))
    with pytest.raises(
        ValueError, match=r"RGB images \[..., height, width, 3\]. Received shape \(2, 8, 8, 1\)"
    ):
        keras_vit.preprocess_inputs(np.zeros((2, 8, 8, 1)))


def test_layer_level_errors():
    with pytest.raises(ValueError, match="Image width 30 is not divisible by the patch width 8"):
        keras_vit.PatchEmbedding(8, 16)(np.zeros((1, 32, 30, 3), np.float32))
    with pytest.raises(ValueError, match="hidden_size 30 is not divisible by num_heads 4"):
        keras_vit.TransformerBlock(4, 8)(np.zeros((1, 5, 30), np.float32))
    with pytest.raises(
        ValueError, match=r"dropout_rate` must be a number in \[0, 1\). Received: dropout_rate=1.5"
    ):
        keras_vit.TransformerBlock(4, 8, dropout_rate=1.5)


def test_int8_quantized_model_uses_its_quantized_kernels_and_stays_close():
    kwargs = dict(image_size=32, patch_size=8, num_classes=7, **TINY)
    model = keras_vit.ViT(**kwargs)
    rng = np.random.default_rng(8)
    weights.load_params(model, reference_params(rng, kwargs))
    images = rng.uniform(-1, 1, (4, 32, 32, 3)).astype(np.float32)
    before = keras.ops.convert_to_numpy(model(images))
    model.quantize("int8")
    attention = model.get_layer("encoderblock_0").attention
    assert attention.query.quantization_mode == "int8"
    after = keras.ops.convert_to_numpy(model(images))
    spread = np.abs(before).max()
    assert 0 < np.abs(after - before).max() < 0.05 * spread  # quantized, and still close


@pytest.mark.parametrize("layout", ["blocks", "scan"])
def test_int8_quantized_model_round_trips_through_keras_files(tmp_path, layout):
    """Keras builds a reloaded layer's sublayers from its config: the quantized ones come back
    quantized (a `DTypePolicyMap` in the block's config), and their int8 weights load exactly,
    also when saved a second time. `per_block` of a quantized scanned model is quantized too.
    (The hybrids' ResNet has no layer Keras quantizes; their blocks are these.)"""
    kwargs = dict(image_size=8, patch_size=4, hidden_size=16, num_layers=2, num_heads=2,
                  mlp_dim=16, num_classes=3)
    if layout == "scan":
        kwargs["scan"] = True
    keras.utils.set_random_seed(0)
    model = keras_vit.ViT(**kwargs)
    size = kwargs["image_size"]
    images = np.random.default_rng(0).uniform(-1, 1, (2, size, size, 3)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Keras: "Layer ... does not have a `quantize` method"
        model.quantize("int8")
    want = keras.ops.convert_to_numpy(model(images))
    for generation in range(2):
        path = tmp_path / f"vit{generation}.keras"
        model.save(path)
        model = keras.saving.load_model(path)
        blocks = encoder_blocks(model)
        assert blocks[-1].mlp.dense_1.quantization_mode == "int8"
        assert blocks[0].attention.out.kernel.dtype == "int8"
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(model(images)), want)
    twin = keras_vit.per_block(model)
    assert encoder_blocks(twin)[1].attention.query.quantization_mode == "int8"
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(twin(images)), want)
