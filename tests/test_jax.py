"""The JAX backend as a first-class path: `training.fit` with a recipe, a crash and a resume,
checkpoints that TensorFlow loads, and `keras-vit train --backend jax`. The scripts run in one
JAX process on CPUs (a process has one Keras backend), the command line in its own."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import keras_vit
from keras_vit import weights
from one_process import run_scripts

TINY = dict(image_size=16, patch_size=8, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=16,
            num_classes=3, dropout_rate=0.1)

FIT_ON_JAX = textwrap.dedent("""
    import json, os, sys
    import keras, numpy as np
    import keras_vit
    from keras_vit import data, training

    assert keras.backend.backend() == "jax"
    out, tiny = sys.argv[1], json.loads(sys.argv[2])
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (24, 16, 16, 3), dtype=np.uint8)
    y = np.arange(24) % 3

    class Crash(keras.callbacks.Callback):
        def __init__(self, after):
            super().__init__()
            self.after = after

        def on_epoch_end(self, epoch, logs=None):
            if epoch + 1 == self.after:
                raise KeyboardInterrupt("simulated crash")

    def run(folder, crash_after=None):
        keras.utils.set_random_seed(0)
        train = data.from_arrays(x, y, image_size=16, batch_size=6, training=True, seed=1)
        model = keras_vit.ViT(**tiny)
        try:
            training.fit(model, train, output_dir=folder, epochs=4, recipe="pretrain",
                         learning_rate=0.01, warmup_steps=2, verbose=0,
                         callbacks=[Crash(crash_after)] if crash_after else [])
        except KeyboardInterrupt:
            return None
        return model

    run(os.path.join(out, "ref"))
    assert run(os.path.join(out, "run"), crash_after=2) is None
    assert not os.path.exists(os.path.join(out, "run", "final.npz"))
    model = run(os.path.join(out, "run"))
    images = np.random.default_rng(5).uniform(-1, 1, (4, 16, 16, 3)).astype("float32")
    np.save(os.path.join(out, "images.npy"), images)
    np.save(os.path.join(out, "jax_logits.npy"), np.asarray(model.predict(images, verbose=0)))
    print(json.dumps(json.load(open(os.path.join(out, "run", "run.json")))))
""")


@pytest.fixture(scope="module")
def on_jax(tmp_path_factory):
    """The JAX scripts of this file, run in one JAX process (on CPUs), and the folder each
    wrote into (`on_jax.folder / name`)."""
    folder = tmp_path_factory.mktemp("on_jax")
    vtab_config = json.dumps({k: v for k, v in TINY.items()
                              if k not in ("num_classes", "image_size", "dropout_rate")})
    results = run_scripts({
        "fit": (FIT_ON_JAX, [folder / "fit", json.dumps(TINY)]),
        "vtab": (VTAB_ON_JAX, [folder / "vtab", vtab_config]),
        "scan": (SCAN_ON_JAX, []), "lora": (LORA_ON_JAX, []), "barrier": (BARRIER_ON_JAX, []),
        "remat": (REMAT_DROPOUT_ON_JAX, []), "from_pretrained": (FROM_PRETRAINED_ON_JAX, []),
    }, env=dict(os.environ, KERAS_BACKEND="jax", TF_CPP_MIN_LOG_LEVEL="3",
                JAX_PLATFORMS="cpu"))  # CPUs, where the gradient barrier applies
    results.folder = folder
    return results


def test_fit_on_jax_resumes_to_the_same_weights_and_tensorflow_loads_them(on_jax):
    out, tmp_path = on_jax.stdout("fit"), on_jax.folder / "fit"
    assert json.loads(out.strip().splitlines()[-1])["finished"] is True
    resumed = weights.read_npz(tmp_path / "run" / "final.npz")
    uninterrupted = weights.read_npz(tmp_path / "ref" / "final.npz")
    for key, value in uninterrupted.items():  # dropout's random state is restored too
        np.testing.assert_allclose(resumed[key], value, atol=1e-6, err_msg=key)
    assert np.abs(uninterrupted["head/kernel"]).max() > 1e-3  # trained
    # The checkpoint written on JAX gives TensorFlow the logits JAX computed.
    model = keras_vit.from_pretrained(tmp_path / "run" / "final.npz")
    images = np.load(tmp_path / "images.npy")
    np.testing.assert_allclose(model.predict(images, verbose=0),
                               np.load(tmp_path / "jax_logits.npy"), atol=1e-4)


def test_train_command_on_jax(tmp_path, image_folder):
    folder = image_folder
    config = json.dumps({k: v for k, v in TINY.items() if k != "num_classes"})
    code = ("import sys\nfrom keras_vit_cli import main\n"
            "sys.exit(main(sys.argv[1:]))")
    # Two CPU devices, and the environment of a one-process cluster (the multi-process
    # path: tests/test_jax_distribution.py): data parallel over both, after joining it.
    from test_jax_distribution import free_port

    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", KERAS_DISTRIBUTION_NUM_PROCESSES="1",
               KERAS_DISTRIBUTION_PROCESS_ID="0",
               KERAS_DISTRIBUTION_JOB_ADDRESSES=f"localhost:{free_port()}",
               XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} "
                         "--xla_force_host_platform_device_count=2")
    result = subprocess.run(
        [sys.executable, "-c", code, "train", "--backend", "jax", "--scan", "--folder",
         str(folder),
         "--model-config", config, "--image-size", "16", "--batch-size", "4", "--epochs", "2",
         "--validation-split", "none", "--verbose", "2", "--json", "--output",
         str(tmp_path / "run"),
         "--compile-cache", str(tmp_path / "xla_cache")],
        capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert '"epochs": 2' in result.stdout and "2 replica(s)" in result.stdout
    assert weights.read_npz(tmp_path / "run" / "final.npz")["head/kernel"].shape == (16, 2)
    written = json.loads((tmp_path / "run" / "config.json").read_text())
    assert "scan" not in written["model"]  # --scan is the route, saved nowhere
    # JAX's persistent cache holds the compiled steps for the next run.
    assert any(path.is_file() for path in (tmp_path / "xla_cache").rglob("*"))


def test_the_compilation_cache_needs_jax(tmp_path):
    from keras_vit import training

    with pytest.raises(ValueError, match="needs the JAX backend"):
        training.enable_compilation_cache(tmp_path / "cache")


# A JAX process where TensorFlow cannot be imported (as on a GPU machine with JAX only): a
# recipe (`compile_model` with AdamW) compiles a model that Keras' own `fit` trains from
# arrays; `fit`, which takes tf.data pipelines, says what it lacks.
TRAIN_WITHOUT_TENSORFLOW = textwrap.dedent("""
    import json, sys

    class NoTensorFlow:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "tensorflow":
                raise ModuleNotFoundError("No module named 'tensorflow'", name=name)

    sys.meta_path.insert(0, NoTensorFlow())
    import keras, numpy as np
    import keras_vit
    from keras_vit import training

    tiny = json.loads(sys.argv[1])
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (8, 16, 16, 3)).astype("float32")
    y = np.arange(8) % 3
    model = keras_vit.ViT(**tiny)
    training.compile_pretrain(model, 3e-3, total_steps=8, warmup_steps=1)  # AdamW's recipe
    assert isinstance(model.optimizer, training.AdamW)
    losses = model.fit(x, y, batch_size=4, epochs=4, shuffle=False, verbose=0).history["loss"]
    try:
        training.fit
        fit = "importable"
    except AttributeError as e:  # missing, for hasattr and help, with the reason
        fit = str(e)
    assert not hasattr(training, "plan") and "fit" in dir(training)
    # Every name that needs TensorFlow is missing, with its reason, so help() reads the rest.
    assert not hasattr(keras_vit, "export_saved_model") and "data" in dir(keras_vit)
    import pydoc
    assert "ViT_B16" in pydoc.render_doc(keras_vit) and "AdamW" in pydoc.render_doc(training)
    loaded = sorted(m for m in sys.modules if m.split(".")[0] == "tensorflow")
    print(json.dumps([losses, fit, loaded]))
""")


def test_the_recipes_train_on_jax_without_tensorflow():
    env = dict(os.environ, KERAS_BACKEND="jax", TF_CPP_MIN_LOG_LEVEL="3", JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, "-c", TRAIN_WITHOUT_TENSORFLOW, json.dumps(
        dict(TINY, dropout_rate=0.0))], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    losses, fit, loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0], losses
    assert fit == ("keras_vit.training.fit cannot be loaded here: importing "
                   "keras_vit.training.loop failed (No module named 'tensorflow')")
    assert loaded == []


@pytest.mark.parametrize("backend", ["jax"])
def test_backend_flag_is_refused_once_keras_runs_on_another(backend):
    from keras_vit_cli import arguments

    with pytest.raises(ValueError, match="Keras is already running on tensorflow"):
        arguments.select_backend(backend)


VTAB_ON_JAX = textwrap.dedent("""
    import json, sys
    import keras, tensorflow_datasets as tfds
    from keras_vit_cli import main

    out, config = sys.argv[1], sys.argv[2]
    with tfds.testing.mock_data(num_examples=8):
        status = main(["vtab", "--backend", "jax", "--model-config", config, "--image-size",
                       "16", "--tasks", "dtd,dmlab", "--steps", "4", "--batch-size", "4",
                       "--keep-weights", "--verbose", "0", "--output", out])
    assert keras.backend.backend() == "jax"
    print(json.dumps(status))
""")


def test_vtab_on_jax(on_jax):
    """`keras-vit vtab --backend jax` runs the suite; its recorded accuracy is what the saved
    weights score in TensorFlow."""
    import csv

    import tensorflow_datasets as tfds

    from keras_vit import vtab

    tmp_path = on_jax.folder
    assert on_jax.stdout("vtab").strip().splitlines()[-1] == "0"
    with open(tmp_path / "vtab" / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["task"] for r in rows] == ["dtd", "dmlab"]
    for row in rows:
        model = keras_vit.from_pretrained(str(tmp_path / "vtab" / "runs" / row["task"] /
                                              "final.npz"))
        with tfds.testing.mock_data(num_examples=8):
            test = vtab.task_data(row["task"], "test", image_size=16, batch_size=8,
                                  training=False)
        images, labels = next(iter(test.dataset))
        predicted = np.argmax(model.predict(images.numpy(), verbose=0), axis=-1)
        assert float(row["accuracy"]) == pytest.approx(np.mean(predicted == labels.numpy()))


SCAN_ON_JAX = textwrap.dedent("""
    import keras, numpy as np
    import keras_vit

    assert keras.backend.backend() == "jax"
    config = dict(image_size=16, patch_size=8, hidden_size=16, num_layers=3, num_heads=2,
                  mlp_dim=16, num_classes=3)
    x = np.random.default_rng(0).uniform(-1, 1, (4, 16, 16, 3)).astype("float32")
    y = np.arange(4) % 3

    def twins(**overrides):
        plain = keras_vit.ViT(**config, **overrides)
        scanned = keras_vit.ViT(scan=True, **config, **overrides)
        scanned.set_weights(plain.get_weights())
        return plain, scanned

    def difference(a, b):
        return max(np.abs(u - v).max() for u, v in zip(a.get_weights(), b.get_weights()))

    def fit(model):
        model.compile(optimizer=keras.optimizers.AdamW(0.01), jit_compile=True,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(x, y, epochs=3, batch_size=2, shuffle=False, verbose=0)

    # Training through the scan gives the per-block model's weights, with remat too (remat
    # changes no value: REMAT_DROPOUT_ON_JAX).
    plain, scanned = twins()
    initial = plain.get_weights()
    scanned_remat = keras_vit.ViT(scan=True, remat=True, **config)
    scanned_remat.set_weights(initial)
    for model in (plain, scanned, scanned_remat):
        fit(model)
    assert np.abs(plain.get_layer("head").get_weights()[0]).max() > 1e-3  # trained
    assert difference(plain, scanned) < 2e-4, difference(plain, scanned)
    assert difference(plain, scanned_remat) < 2e-4, difference(plain, scanned_remat)
    trained = plain

    # Dropout: block 0's seed generators, advanced from block to block. Reference: each block
    # applied in turn with the state the previous one left.
    plain, scanned = twins(dropout_rate=0.3, attention_dropout_rate=0.2)
    encoder = scanned.get_layer("Transformer")

    def seeds(block):
        kept = {id(v) for v in block.weights}
        return [v for v in block.variables if id(v) not in kept]

    tokens = np.random.default_rng(1).normal(size=(4, 5, 16)).astype("float32")
    start = [np.asarray(v.value) for v in seeds(encoder.blocks[0])]
    got = np.asarray(encoder(tokens, training=True))
    end = [np.asarray(v.value) for v in seeds(encoder.blocks[0])]
    state, expected = start, tokens
    for block in encoder.blocks:
        for variable, value in zip(seeds(block), state):
            variable.assign(value)
        expected = block(expected, training=True)
        state = [np.asarray(v.value) for v in seeds(block)]
    np.testing.assert_allclose(got, np.asarray(expected), atol=1e-5)
    assert not np.allclose(got, np.asarray(encoder(tokens)))  # dropout was on
    for after, value in zip(end, state):  # block 0's state moved on as the blocks' did
        assert (after == value).all()

    # A frozen block stays as it is; the others train.
    plain, scanned = twins()
    frozen, free = scanned.get_layer("Transformer").blocks[1:3]
    frozen.trainable = False
    before = [[w.copy() for w in block.get_weights()] for block in (frozen, free)]
    scanned.compile(optimizer=keras.optimizers.AdamW(0.01),
                    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    scanned.fit(x, y, epochs=2, batch_size=2, verbose=0)
    changes = [max(np.abs(a - b).max() for a, b in zip(old, block.get_weights()))
               for old, block in zip(before, (frozen, free))]
    assert changes[0] == 0 and changes[1] > 1e-4, changes

    # The route scan="blocks" scans a per-block model's blocks (one scan in its traced
    # function, none without it) and trains it to the same weights.
    import jax
    from keras_vit import routes

    def traced(model):
        return str(jax.make_jaxpr(lambda t, n: model.stateless_call(t, n, x)[0])(
            [v.value for v in model.trainable_variables],
            [v.value for v in model.non_trainable_variables]))

    # The reference: the per-block model trained above by the default route (scan="none").
    twin = keras_vit.ViT(**config)
    twin.set_weights(initial)
    assert "scan[" not in traced(twin)
    with routes.use_routes(scan="blocks"):
        assert traced(twin).count("scan[") == 1
        fit(twin)
    assert difference(trained, twin) < 2e-4, difference(trained, twin)
    assert "scan" not in keras_vit.vit_config(twin)  # saved nowhere
    # The masked-patch pre-training model runs its encoder by the route too.
    from keras_vit import pretraining

    encoder_only = keras_vit.ViT(**dict(config, include_top=False, num_classes=None))
    masked = pretraining.masked_patch_model(encoder_only)
    masked(x)

    def pretraining_step():
        return str(jax.make_jaxpr(lambda t, n: masked.stateless_call(t, n, x, training=True)[0])(
            [v.value for v in masked.trainable_variables],
            [v.value for v in masked.non_trainable_variables]))

    assert "scan[" not in pretraining_step()
    with routes.use_routes(scan="blocks"):
        assert pretraining_step().count("scan[") == 1
    print("ok")
""")


def test_scanned_encoder_trains_like_the_per_block_model_on_jax(on_jax):
    assert on_jax.stdout("scan").strip().splitlines()[-1] == "ok"


FROM_PRETRAINED_ON_JAX = textwrap.dedent("""
    import sys, tempfile
    import jax, keras, numpy as np
    import keras_vit
    from keras_vit import weights

    tiny = dict(image_size=16, patch_size=8, hidden_size=8, num_layers=1, num_heads=2,
                mlp_dim=8, num_classes=3)
    path = tempfile.mkdtemp() + "/tiny.npz"
    source = keras_vit.ViT(**tiny)
    weights.save_npz(source, path)
    model = keras_vit.from_pretrained(path, progress=False)
    # Its variables hold JAX arrays, as built ones do: not the file's NumPy arrays (which
    # each call would copy to the device again, and a NumPy write could change).
    print(sorted({type(v.value).__name__ for v in model.variables
                  if not isinstance(v.value, jax.Array)}))
    same = all(np.array_equal(a, b) for a, b in zip(model.get_weights(), source.get_weights()))
    print("same" if same else "differ")
""")


LORA_ON_JAX = textwrap.dedent("""
    import warnings

    import keras, numpy as np
    import keras_vit

    config = dict(image_size=16, patch_size=8, hidden_size=16, num_layers=3, num_heads=2,
                  mlp_dim=16, num_classes=3)
    plain = keras_vit.ViT(**config)
    scanned = keras_vit.ViT(scan=True, **config)
    scanned.set_weights(plain.get_weights())
    # LoRA on one block only: the blocks' weights no longer stack, the blocks run in turn.
    plain.get_layer("encoderblock_1").mlp.dense_0.enable_lora(2)
    scanned.get_layer("Transformer").blocks[1].mlp.dense_0.enable_lora(2)
    scanned.set_weights(plain.get_weights())
    x = np.random.default_rng(0).uniform(-1, 1, (2, 16, 16, 3)).astype("float32")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert np.abs(scanned.predict(x, verbose=0) - plain.predict(x, verbose=0)).max() < 1e-5
    assert any("weights differ in shape" in str(w.message) for w in caught)  # said, not silent
    print("ok")
""")


def test_from_pretrained_on_jax_gives_variables_jax_arrays(on_jax):
    assert on_jax.stdout("from_pretrained").strip().splitlines() == ["[]", "same"]


def test_scanned_encoder_with_blocks_that_differ_runs_them_in_turn_on_jax(on_jax):
    assert on_jax.stdout("lora").strip().splitlines()[-1] == "ok"


BARRIER_ON_JAX = textwrap.dedent("""
    import jax, jax.numpy as jnp, keras, numpy as np
    import keras_vit
    from keras_vit import implementations, routes

    # The barrier is the identity forward and backward, for finite values.
    g = jnp.asarray(np.random.default_rng(0).normal(size=(2, 3, 4)).astype("float32"))
    out, vjp = jax.vjp(implementations.gradient_barrier, g)
    assert (np.asarray(out) == np.asarray(g)).all() and (np.asarray(vjp(g)[0]) == g).all()

    config = dict(image_size=16, patch_size=8, hidden_size=16, num_layers=4, num_heads=2,
                  mlp_dim=16, num_classes=3)
    # The default on CPUs ("auto"), against the plain block input, with the same weights.
    model = keras_vit.ViT(**config)
    x = jnp.asarray(np.random.default_rng(1).uniform(-1, 1, (4, 16, 16, 3)).astype("float32"))
    y = jnp.arange(4) % 3
    trainable = [v.value for v in model.trainable_variables]
    others = [v.value for v in model.non_trainable_variables]

    def gradients(barrier):
        def loss(trainable):
            with routes.use_routes(block_input="auto" if barrier else "plain"):
                logits, _ = model.stateless_call(trainable, others, x, training=True)
            return jnp.mean(jax.nn.logsumexp(logits, -1) - logits[jnp.arange(4), y])

        step = jax.jit(jax.grad(loss))
        lowered = step.lower(trainable)
        # Divisions in the program as traced, and in XLA's optimised program: XLA must keep
        # each barrier's division (and not copy it into its consumers) for the barrier to work.
        counts = (lowered.as_text().count("stablehlo.divide"),
                  lowered.compile().as_text().count(" divide("))
        return [np.asarray(a) for a in step(trainable)], np.array(counts)

    with_barrier, divisions = gradients(True)
    without, divisions_without = gradients(False)
    # One division per block in the backward pass, and the same gradients to the last bit.
    assert (divisions - divisions_without == config["num_layers"]).all(), (divisions,
                                                                           divisions_without)
    for a, b in zip(with_barrier, without):
        assert (a == b).all(), np.abs(a - b).max()
    assert max(np.abs(a).max() for a in with_barrier) > 0

    # Inference does not go through it: forward-mode derivatives work there.
    infer = lambda x: model.stateless_call(trainable, others, x, training=False)[0]
    _, tangent = jax.jvp(infer, (x,), (jnp.ones_like(x),))
    assert np.isfinite(np.asarray(tangent)).all()
    print("ok")
""")


def test_gradient_barrier_changes_no_gradient_on_jax(on_jax):
    assert on_jax.stdout("barrier").strip().splitlines()[-1] == "ok"


REMAT_DROPOUT_ON_JAX = textwrap.dedent("""
    import re
    import jax, jax.numpy as jnp, keras, numpy as np
    import keras_vit
    from keras_vit import Encoder, routes

    def seeds(layer):
        return [v for v in layer.variables if "seed_generator_state" in v.path]

    # Two blocks: the same outputs, gradients and advanced seeds as without remat.
    plain = Encoder(2, 4, 64, dropout_rate=0.2, attention_dropout_rate=0.3)
    remat = Encoder(2, 4, 64, dropout_rate=0.2, attention_dropout_rate=0.3, remat=True)
    for block in (plain, remat):
        block.build((2, 5, 32))
    remat.set_weights(plain.get_weights())
    for a, b in zip(seeds(plain), seeds(remat)):
        b.assign(a.value)  # the same dropout masks
    x = jnp.asarray(np.random.default_rng(0).normal(size=(2, 5, 32)).astype("float32"))

    def run(block):
        trainable = [v.value for v in block.trainable_variables]
        others = [v.value for v in block.non_trainable_variables]

        def loss(trainable, x):
            y, others_after = block.stateless_call(trainable, others, x, training=True)
            return jnp.sum(y * y), (y, others_after)

        step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))
        (value, (y, others_after)), grads = step(trainable, x)
        return [np.asarray(a) for a in [y, *grads[0], grads[1], *others_after]]

    want, got = run(plain), run(remat)
    assert not np.allclose(want[0], np.asarray(plain(x)))  # dropout was on
    for a, b in zip(want, got):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)

    # The gradient's program recomputes the blocks (jax.checkpoint, a remat primitive) under
    # the saved layout and under the route on the plain blocks, and not otherwise.
    def recomputes(block):
        trainable = [v.value for v in block.trainable_variables]
        others = [v.value for v in block.non_trainable_variables]

        def loss(trainable, x):
            return jnp.sum(block.stateless_call(trainable, others, x, training=True)[0] ** 2)

        program = str(jax.make_jaxpr(jax.grad(loss))(trainable, x))
        return re.search(r"\\b(checkpoint|remat\\d*)\\[", program) is not None

    assert not recomputes(plain) and recomputes(remat)
    with routes.use_routes(remat="blocks"):
        assert recomputes(plain)

    # A model: fit with remat and dropout gives the plain model's losses.
    config = dict(image_size=16, patch_size=4, hidden_size=32, num_layers=2, num_heads=4,
                  mlp_dim=64, num_classes=5, dropout_rate=0.1, attention_dropout_rate=0.1)
    images = np.random.default_rng(1).uniform(-1, 1, (4, 16, 16, 3)).astype("float32")
    losses = []
    for flag in (False, True):
        keras.utils.set_random_seed(0)
        model = keras_vit.ViT(remat=flag, **config)
        model.compile(optimizer=keras.optimizers.Adam(1e-3), jit_compile=True,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        losses.append([float(model.train_on_batch(images, np.arange(4))) for _ in range(3)])
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5)
    print("ok")
""")


def test_remat_with_dropout_matches_the_plain_block_on_jax(on_jax):
    assert on_jax.stdout("remat").strip().splitlines()[-1] == "ok"
