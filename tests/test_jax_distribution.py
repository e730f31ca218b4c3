"""`keras.distribution` on the JAX backend: `training.fit` under DataParallel on 8 virtual CPU
devices and under ModelParallel (2 replicas x 4 shards of the heads and MLP units, crashed and
resumed) ends with the losses and weights of one device; the layout map; the refusals.

The distributed runs share one subprocess: JAX reads its device count once, before it is
imported, and a process has one Keras backend."""

import json
import os
import re
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit import data, training, weights
from keras_vit.parallel import keras_distribution as sharding

DEVICES = 8
FAKE_DEVICES = [f"cpu:{i}" for i in range(DEVICES)]  # device names; never placed on
TINY = dict(image_size=16, patch_size=4, hidden_size=32, num_layers=2, num_heads=8, mlp_dim=64,
            num_classes=3, dropout_rate=0.1)
RTOL = 1e-5

FIT_DISTRIBUTED = textwrap.dedent("""
    import contextlib, json, os, sys
    import keras, numpy as np
    import keras_vit
    from keras_vit import data, training

    assert keras.backend.backend() == "jax" and len(keras.distribution.list_devices()) == 8
    out, tiny = sys.argv[1], json.loads(sys.argv[2])
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (32, 16, 16, 3), dtype=np.uint8)
    y = np.arange(32) % 3

    class Record(keras.callbacks.Callback):
        def __init__(self, crash_after=None):
            super().__init__()
            self.crash_after, self.losses = crash_after, []

        def on_epoch_end(self, epoch, logs=None):
            self.losses.append(float(logs["loss"]))
            if epoch + 1 == self.crash_after:
                raise KeyboardInterrupt("simulated crash")

    def run(name, distribution, validation=False, crash_after=None, scan=False):
        keras.utils.set_random_seed(0)
        train = data.from_arrays(x, y, image_size=16, batch_size=16, training=True, seed=1)
        val = data.from_arrays(x[:16], y[:16], image_size=16, batch_size=8, training=False)
        record = Record(crash_after)
        with distribution.scope() if distribution else contextlib.nullcontext():
            model = keras_vit.ViT(**tiny, scan=scan)
            try:
                training.fit(model, train, val if validation else None, epochs=2,
                             output_dir=os.path.join(out, name), learning_rate=0.1,
                             warmup_steps=1, verbose=0, callbacks=[record])
            except KeyboardInterrupt:
                return record.losses, None
        return record.losses, model

    def specs(model, block, *names):
        # name in the block -> [partition spec, shape of one device's shard, device count]
        arrays = {v.path: v.value for v in model.variables}
        return {name: [list(arrays[block + name].sharding.spec),
                       list(arrays[block + name].addressable_shards[0].data.shape),
                       len(arrays[block + name].sharding.device_set)] for name in names}

    results = {"one": run("one", None)[0]}
    results["dp"], model = run("dp", keras_vit.get_distribution(), validation=True)
    results["dp_specs"] = specs(model, "encoderblock_0/MlpBlock_3/", "Dense_0/kernel")
    mp = keras_vit.get_distribution(tiny, model_parallel=4)
    results["mp_crashed"] = run("mp", mp, crash_after=1)[0]
    results["mp"], model = run("mp", mp)
    results["mp_specs"] = specs(model, "encoderblock_1/", *(
        "MultiHeadDotProductAttention_1/" + name for name in ("query/kernel", "key/bias",
                                                               "out/kernel")), *(
        "MlpBlock_3/" + name for name in ("Dense_0/kernel", "Dense_1/kernel", "Dense_1/bias")),
        "LayerNorm_0/gamma")
    momentum = [v for v in model.optimizer.variables
                if "query_kernel" in v.path and "encoderblock_1" in v.path]
    results["momentum_spec"] = list(momentum[0].value.sharding.spec)
    # The scanned encoder under ModelParallel: its blocks' weights sharded the same way.
    results["one_scan"] = run("one_scan", None, scan=True)[0]
    results["mp_scan"], model = run("mp_scan", mp, scan=True)
    results["mp_scan_specs"] = specs(model, "Transformer/encoderblock_1/",
                                     "MlpBlock_3/Dense_0/kernel")
    # The several-process test's reference: FIT_PROCESS's run in one process on one device.
    keras.utils.set_random_seed(0)
    keras.distribution.set_distribution(
        keras_vit.get_distribution(devices=keras.distribution.list_devices()[:1]))
    train = data.from_arrays(x, y, image_size=16, batch_size=16, training=True, seed=1)
    val = data.from_arrays(x[:16], y[:16], image_size=16, batch_size=8, training=False)
    summary = training.fit(keras_vit.ViT(**dict(tiny, dropout_rate=0.0)), train, val, epochs=2,
                           output_dir=os.path.join(out, "one_process"), learning_rate=0.1,
                           warmup_steps=1, verbose=0)
    fed = keras.distribution.distribution().distribute_dataset(train.dataset)
    results["one_process"] = dict(summary, fed=next(iter(fed))[1].numpy().tolist())
    print(json.dumps(results))
""")


def run_on_8_devices(code, *args):
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={DEVICES}"
    env = dict(os.environ, KERAS_BACKEND="jax", TF_CPP_MIN_LOG_LEVEL="3", XLA_FLAGS=flags)
    result = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True,
                            text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def assert_same_weights(got_path, want_path):
    got, want = weights.read_npz(got_path), weights.read_npz(want_path)
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        # Relative to each tensor's scale: the attention's key bias gets no gradient (softmax
        # ignores it) and holds only rounding noise.
        scale = max(np.abs(value).max(), 1e-3)
        np.testing.assert_allclose(got[key], value, rtol=0, atol=RTOL * scale, err_msg=key)


@pytest.fixture(scope="module")
def on_8_devices(tmp_path_factory):
    """FIT_DISTRIBUTED's results, and the folder its runs wrote into."""
    folder = tmp_path_factory.mktemp("on_8_devices")
    return run_on_8_devices(FIT_DISTRIBUTED, folder, json.dumps(TINY)), folder


def test_data_and_model_parallel_fit_match_one_device(on_8_devices):
    results, tmp_path = on_8_devices
    one = results["one"]
    assert len(one) == 2 and one[0] != one[1]
    np.testing.assert_allclose(results["dp"], one, rtol=RTOL)
    np.testing.assert_allclose(results["mp_crashed"] + results["mp"], one, rtol=RTOL)
    # DataParallel replicates; ModelParallel splits 8 heads and 64 units in 4 and replicates the
    # rest, the optimizer's state like its weight.
    assert results["dp_specs"] == {"Dense_0/kernel": [[None, None], [32, 64], 8]}
    attention, mlp = "MultiHeadDotProductAttention_1/", "MlpBlock_3/"
    assert results["mp_specs"] == {
        attention + "query/kernel": [[None, "model", None], [32, 2, 4], 8],  # [D, N, H]
        attention + "key/bias": [["model", None], [2, 4], 8],
        attention + "out/kernel": [["model", None, None], [2, 4, 32], 8],  # [N, H, D]
        mlp + "Dense_0/kernel": [[None, "model"], [32, 16], 8],  # [D, M]
        mlp + "Dense_1/kernel": [["model", None], [16, 32], 8],  # [M, D]
        mlp + "Dense_1/bias": [[None], [32], 8],
        "LayerNorm_0/gamma": [[None], [32], 8],
    }
    assert results["momentum_spec"] == [None, "model", None]
    # Official-layout checkpoints, with the weights of one device: DataParallel, and a
    # ModelParallel run crashed after its first epoch and resumed from its backup.
    reference = tmp_path / "one" / "final.npz"
    assert np.abs(weights.read_npz(reference)["head/kernel"]).max() > 1e-3  # trained
    assert_same_weights(tmp_path / "dp" / "final.npz", reference)
    assert_same_weights(tmp_path / "mp" / "final.npz", reference)
    assert (tmp_path / "dp" / "best.npz").exists()  # evaluated under the distribution
    # The scanned encoder (its own dropout masks: compared with itself on one device).
    assert len(results["one_scan"]) == 2
    np.testing.assert_allclose(results["mp_scan"], results["one_scan"], rtol=RTOL)
    assert results["mp_scan_specs"] == {
        "MlpBlock_3/Dense_0/kernel": [[None, "model"], [32, 16], 8]}
    assert_same_weights(tmp_path / "mp_scan" / "final.npz", tmp_path / "one_scan" / "final.npz")
    assert json.loads((tmp_path / "mp" / "run.json").read_text())["finished"] is True


# What each encoder-block weight is split on, by its name in the block; everything else is
# replicated (written out here, independently of keras_vit.sharding's table).
EXPECTED_AXES = {
    "query/kernel": (None, "model", None), "key/kernel": (None, "model", None),
    "value/kernel": (None, "model", None), "query/bias": ("model", None),
    "key/bias": ("model", None), "value/bias": ("model", None),
    "out/kernel": ("model", None, None), "Dense_0/kernel": (None, "model"),
    "Dense_0/bias": ("model",), "Dense_1/kernel": ("model", None),
}


def mesh(shape=(2, 4), axes=("batch", "model")):
    return keras.distribution.DeviceMesh(shape, axes, FAKE_DEVICES)


@pytest.mark.parametrize("config", ["token", "hybrid"])
def test_layout_map_shards_the_blocks_heads_and_mlp_units_only(config):
    arguments = dict(TINY, representation_size=8)
    if config == "hybrid":
        arguments.update(patch_size=1, resnet={"num_layers": ()})
    model = keras_vit.ViT(**arguments)
    layouts = keras_vit.layout_map(model, mesh())
    sharded = 0
    for variable in model.weights:
        name = "/".join(variable.path.split("/")[-2:])
        expected = EXPECTED_AXES.get(name) if "encoderblock_" in variable.path else None
        layout = layouts[variable.path]
        assert (layout and layout.axes) == expected, variable.path
        sharded += expected is not None
    assert sharded == len(EXPECTED_AXES) * TINY["num_layers"]
    # A variant by name, a custom axis name.
    custom = keras_vit.layout_map("L/16", mesh(axes=("data", "heads")), model_axis="heads")
    assert custom["encoderblock_23/MlpBlock_3/Dense_1/kernel"].axes == ("heads", None)


@pytest.fixture
def eight_devices(monkeypatch):
    """This process as a machine of FAKE_DEVICES (get_distribution refuses devices it lacks)."""
    monkeypatch.setattr(keras.distribution, "list_devices",
                        lambda device_type=None: list(FAKE_DEVICES) if device_type in (
                            None, "cpu") else [])


def test_get_distribution_builds_the_meshes(eight_devices):
    data_parallel = keras_vit.get_distribution(devices=FAKE_DEVICES)
    assert isinstance(data_parallel, keras.distribution.DataParallel)
    assert sharding.data_parallel_size(data_parallel) == 8
    model_parallel = keras_vit.get_distribution("B/16", model_parallel=4, devices=FAKE_DEVICES)
    assert isinstance(model_parallel, keras.distribution.ModelParallel)
    assert model_parallel.device_mesh.shape == (2, 4)
    assert model_parallel.device_mesh.axis_names == ("batch", "model")
    assert sharding.data_parallel_size(model_parallel) == 2
    assert sharding.data_parallel_size() == 1  # no distribution set


def test_a_global_batch_without_a_strategy_splits_over_the_distributions_replicas(
        eight_devices, monkeypatch):
    """On JAX, where no tf.distribute strategy runs, `global_batch_size` counts the replicas
    of the current `keras.distribution` (its batch axis), as `fit` splits batches."""
    from keras_vit.parallel import tf_distribute

    monkeypatch.setattr(keras.backend, "backend", lambda: "jax")
    assert tf_distribute.global_batch_size(4, per_replica=True) == 4  # no distribution
    with keras_vit.get_distribution("B/16", model_parallel=4, devices=FAKE_DEVICES).scope():
        assert tf_distribute.global_batch_size(4, per_replica=True) == 8  # 2 replicas
        assert tf_distribute.global_batch_size(6) == 6
        with pytest.raises(ValueError, match="batch_size 3 is not divisible across 2 replicas"):
            tf_distribute.global_batch_size(3)


@pytest.mark.parametrize("call, message", [
    (lambda: keras_vit.get_distribution(TINY, model_parallel=3, devices=FAKE_DEVICES),
     "model_parallel 3 does not divide the 8 devices. Expected one of 1, 2, 4, 8."),
    (lambda: keras_vit.get_distribution(TINY, model_parallel=0, devices=FAKE_DEVICES),
     "`model_parallel` must be a positive integer. Received: model_parallel=0"),
    (lambda: keras_vit.get_distribution(model_parallel=4, devices=FAKE_DEVICES),
     "model_parallel 4 shards the model, so `config` must name it."),
    (lambda: keras_vit.get_distribution("S/16", model_parallel=4, devices=FAKE_DEVICES),
     "num_heads 6 is not divisible by the 'model' axis size 4. Expected a multiple of 4 "
     "(e.g. 4)."),
    (lambda: keras_vit.layout_map(dict(num_heads=8, mlp_dim=90), mesh()),
     "mlp_dim 90 is not divisible by the 'model' axis size 4. Expected a multiple of 4 "
     "(e.g. 88)."),
    (lambda: keras_vit.layout_map(TINY, mesh(), model_axis="heads"),
     "`model_axis` must be one of 'batch', 'model'. Received: model_axis='heads'"),
])
def test_refusals_name_the_value_and_what_was_expected(call, message, eight_devices):
    with pytest.raises(ValueError) as error:
        call()
    assert message in str(error.value)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("batch_size, validation_examples, message", [
    (12, None, "batch_size 12 is not divisible across 8 replicas. Expected a multiple of 8 "
               "(e.g. 8)."),
    (16, 20, "20 evaluation examples in batches of 16 end with a batch of 4, which does not "
             "split across 8 replicas. Expected a multiple of 8 examples (e.g. 16)."),
], ids=["batch", "last-batch"])
def test_fit_refuses_batches_that_do_not_split_before_it_writes(batch_size, validation_examples,
                                                                message, tmp_path,
                                                                eight_devices):
    x = np.zeros((24, 16, 16, 3), np.uint8)
    y = np.arange(24) % 3
    train = data.from_arrays(x, y, image_size=16, batch_size=batch_size, training=True)
    validation = None if validation_examples is None else data.from_arrays(
        x[:validation_examples], y[:validation_examples], image_size=16, batch_size=batch_size,
        training=False)
    model = keras_vit.ViT(**TINY)
    with keras_vit.get_distribution(devices=FAKE_DEVICES).scope():
        with pytest.raises(ValueError, match=re.escape(message)):
            training.fit(model, train, validation, output_dir=tmp_path / "run", epochs=1)
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------------------------------------
# Several processes: `keras.distribution.initialize()` from the environment, as a cluster's
# launcher sets it (KERAS_DISTRIBUTION_JOB_ADDRESSES, _NUM_PROCESSES, _PROCESS_ID).

FIT_PROCESS = textwrap.dedent("""
    import json, os, sys
    import keras, numpy as np
    keras.distribution.initialize()  # jax.distributed, from the environment
    import jax
    import keras_vit
    from keras_vit import data, training

    out, tiny, crash_after = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (32, 16, 16, 3), dtype=np.uint8)
    y = np.arange(32) % 3

    class Crash(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch + 1 == crash_after:
                raise KeyboardInterrupt("simulated crash")

    keras.utils.set_random_seed(0)
    keras.distribution.set_distribution(keras_vit.get_distribution())
    train = data.from_arrays(x, y, image_size=16, batch_size=16, training=True, seed=1)
    val = data.from_arrays(x[:16], y[:16], image_size=16, batch_size=8, training=False)
    model = keras_vit.ViT(**tiny)
    try:
        summary = training.fit(model, train, val, epochs=2, output_dir=out, learning_rate=0.1,
                               warmup_steps=1, verbose=0, callbacks=[Crash()])
    except KeyboardInterrupt:
        summary = dict(crashed=True)
    # What this process feeds: its share of the pipeline's batches (Keras' own sharding).
    fed = keras.distribution.distribution().distribute_dataset(train.dataset)
    images, labels = next(iter(fed))
    print(json.dumps(dict(summary, processes=jax.process_count(), index=jax.process_index(),
                          devices=len(jax.devices()), fed=labels.numpy().tolist())))
""")


def run_processes(count, out, crash_after=0, port=None):
    """FIT_PROCESS in a cluster of `count` processes of one CPU device each; their last
    lines, by process."""
    env = dict(os.environ, KERAS_BACKEND="jax", TF_CPP_MIN_LOG_LEVEL="3")
    env["XLA_FLAGS"] = " ".join(flag for flag in env.get("XLA_FLAGS", "").split()
                                if "device_count" not in flag)  # one device per process
    tiny = json.dumps(dict(TINY, dropout_rate=0.0))
    running = []
    for index in range(count):
        env.update(KERAS_DISTRIBUTION_JOB_ADDRESSES=f"localhost:{port}",
                   KERAS_DISTRIBUTION_NUM_PROCESSES=str(count),
                   KERAS_DISTRIBUTION_PROCESS_ID=str(index))
        running.append(subprocess.Popen(
            [sys.executable, "-c", FIT_PROCESS, str(out), tiny, str(crash_after)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(env)))
    results = []
    for process in running:
        stdout, stderr = process.communicate(timeout=600)
        assert process.returncode == 0, stderr[-3000:]
        results.append(json.loads(stdout.strip().splitlines()[-1]))
    return results


def free_port():
    import socket

    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def test_two_processes_train_to_one_process_weights_and_resume(tmp_path, on_8_devices):
    """Two JAX processes on this machine (a localhost coordinator): each feeds its half of
    every batch; process 0 alone writes the run's files, each its own backup; crashed after
    the first epoch and run again, they end with the weights of one process on one device run
    straight (FIT_PROCESS's run, in FIT_DISTRIBUTED's process)."""
    one, reference = on_8_devices[0]["one_process"], on_8_devices[1] / "one_process"
    crashed = run_processes(2, tmp_path / "two", crash_after=1, port=free_port())
    assert [r["crashed"] for r in crashed] == [True, True]
    assert sorted(os.listdir(tmp_path / "two" / "backup")) == ["process-0", "process-1"]
    done = run_processes(2, tmp_path / "two", port=free_port())
    assert [(r["processes"], r["index"], r["devices"]) for r in done] == [(2, 0, 2), (2, 1, 2)]
    assert [r["resumed_at_epoch"] for r in done] == [1, 1]
    # Each process feeds its contiguous half of every batch: together, one process's batch.
    assert len(one["fed"]) == 16 and done[0]["fed"] + done[1]["fed"] == one["fed"]
    assert_same_weights(tmp_path / "two" / "final.npz", reference / "final.npz")
    assert done[0]["validation_accuracy"] == pytest.approx(one["validation_accuracy"])
    assert json.loads((tmp_path / "two" / "run.json").read_text())["finished"] is True
    assert not (tmp_path / "two" / "backup").exists() or not os.listdir(tmp_path / "two" /
                                                                         "backup")


def test_a_jax_cluster_environment_on_tensorflow_is_one_line(tmp_path, image_folder,
                                                             monkeypatch, capsys):
    import keras_vit_cli as cli

    monkeypatch.setenv("KERAS_DISTRIBUTION_NUM_PROCESSES", "2")
    config = json.dumps({k: v for k, v in TINY.items() if k != "num_classes"})
    assert cli.main(["train", "--folder", str(image_folder), "--model-config", config,
                     "--image-size", "16", "--epochs", "1", "--output",
                     str(tmp_path / "run")]) == 2
    error = capsys.readouterr().err.strip()
    assert "KERAS_DISTRIBUTION_NUM_PROCESSES is set" in error and "\n" not in error
    assert not (tmp_path / "run").exists()
