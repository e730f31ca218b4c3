"""Strategies: names and errors, MirroredStrategy on 2 logical CPUs and MultiWorkerMirroredStrategy
with 2 localhost workers (each in subprocesses with timeouts), batch-size scaling."""

import json
import os
import pathlib
import socket
import subprocess
import sys
import types

import numpy as np
import pytest
import tensorflow as tf
import test_distribute_run as run

from keras_vit import execution, training
from keras_vit.parallel import tf_distribute as distribute

ROOT = pathlib.Path(__file__).resolve().parent.parent
TIMEOUT_S = 240


def start(*args):
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_CONFIG", None)
    return subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "test_distribute_run.py"), *map(str, args)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def finish(process):
    try:
        output = process.communicate(timeout=TIMEOUT_S)[0]
    except subprocess.TimeoutExpired:
        process.kill()
        output = process.communicate()[0]
        pytest.fail(f"subprocess timed out after {TIMEOUT_S} s:\n{output[-3000:]}")
    assert process.returncode == 0, output[-5000:]
    return output


def free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def assert_weights_close(got, want, atol):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.array(a), np.array(b), atol=atol)


def test_mirrored_on_two_cpus_matches_one_device(tmp_path):
    out = tmp_path / "mirrored.json"
    finish(start("mirrored", out))
    result = json.loads(out.read_text())
    assert result["replicas"] == 2
    np.testing.assert_allclose(result["mirrored_loss"], result["single_loss"], rtol=1e-5)
    assert_weights_close(result["mirrored_weights"], result["single_weights"], atol=2e-6)
    initial = run.initial_weights()
    assert max(np.abs(np.array(a) - b).max() for a, b in zip(result["single_weights"], initial)) > 1e-2
    # XLA: on one device, the runtime table's choice for this CPU; off by default under
    # MirroredStrategy, where Keras 3.15's XLA step fails on variables of the other replicas'
    # devices.
    assert result["single_jit"] is execution.choose("float32")[0]
    assert result["mirrored_jit"] is False
    assert result["default_jit"] is False
    assert "Trying to access resource" in result["xla_error"], result["xla_error"][-2000:]
    assert "batch_size 5 is not divisible across 2 replicas" in result["batch_error"]
    # `use_routes(remat="blocks")` around fit: each replica's thread recomputes its block.
    np.testing.assert_allclose(result["remat_loss"], result["mirrored_loss"], rtol=1e-5)
    assert len(result["remat_threads"]) == 2 and "MainThread" not in result["remat_threads"]
    assert result["auto_threads"] == []


def test_multiworker_fit_on_two_localhost_workers(tmp_path):
    ports = ",".join(map(str, free_ports(2)))
    workers = [start("worker", tmp_path / f"worker{i}.json", i, ports) for i in range(2)]
    try:
        for w in workers:
            finish(w)
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
    results = [json.loads((tmp_path / f"worker{i}.json").read_text()) for i in range(2)]
    assert [r["replicas"] for r in results] == [2, 2]
    assert [r["chief"] for r in results] == [True, False]
    assert results[0]["jit"] is False  # XLA has no CPU collectives: off by default
    # Both workers end with identical weights and logs ...
    assert results[0]["losses"] == results[1]["losses"]
    assert_weights_close(results[1]["weights"], results[0]["weights"], atol=0)
    assert results[0]["eval_accuracy"] == results[1]["eval_accuracy"]
    # ... equal to one process training on the same global batches.
    tf.keras.utils.set_random_seed(0)
    losses, model = run.train()
    np.testing.assert_allclose(results[0]["losses"], losses, rtol=1e-5)
    assert_weights_close(results[0]["weights"], model.get_weights(), atol=2e-6)
    images, labels = run.arrays()
    eval_loss, eval_accuracy = model.evaluate(images[:16] / 127.5 - 1, labels[:16], verbose=0)
    assert results[0]["eval_loss"] == pytest.approx(eval_loss, rel=1e-5)
    assert results[0]["eval_accuracy"] == pytest.approx(eval_accuracy)


# ------------------------------------------------------------------------------------------
# Names, errors, batch sizes (no subprocess needed).


def test_strategy_names_and_errors(monkeypatch):
    with pytest.raises(ValueError, match="`strategy` must be one of 'auto', 'tpu'.*Received: strategy='gpus'"):
        distribute.get_strategy("gpus")
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(ValueError, match="'multiworker' needs TF_CONFIG"):
        distribute.get_strategy("multiworker")
    monkeypatch.delenv("TPU_NAME", raising=False)
    with pytest.raises(ValueError, match="No TPU found"):
        distribute.get_strategy("tpu")
    monkeypatch.setenv("TF_CONFIG", "{not json")
    with pytest.raises(ValueError, match="TF_CONFIG is not valid JSON"):
        distribute.get_strategy("auto")
    monkeypatch.delenv("TF_CONFIG")
    assert distribute.get_strategy("auto") is tf.distribute.get_strategy()
    cpu = distribute.get_strategy("cpu")
    assert isinstance(cpu, tf.distribute.OneDeviceStrategy) and cpu.num_replicas_in_sync == 1
    assert training.default_jit_compile(cpu) is execution.choose("float32", cpu)[0]


def test_global_batch_size_scaling():
    eight = types.SimpleNamespace(num_replicas_in_sync=8)
    assert distribute.global_batch_size(64, eight) == 64
    assert distribute.global_batch_size(16, eight, per_replica=True) == 128
    with pytest.raises(ValueError, match="batch_size 60 is not divisible across 8 replicas.*56"):
        distribute.global_batch_size(60, eight)
    with pytest.raises(ValueError, match="batch_size=0"):
        distribute.global_batch_size(0)
    assert distribute.global_batch_size(3) == 3  # one replica


def test_worker_roles_from_tf_config(monkeypatch):
    cluster = {"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 1}}
    monkeypatch.setenv("TF_CONFIG", json.dumps(cluster))
    assert distribute.worker_index() == ("worker", 1) and not distribute.is_chief()
    assert training.backup_dir("run").endswith(os.path.join("run", "backup", "worker-1"))
    cluster = {"cluster": {"chief": ["c:0"], "worker": ["a:1"]}, "task": {"type": "worker", "index": 0}}
    monkeypatch.setenv("TF_CONFIG", json.dumps(cluster))
    assert not distribute.is_chief()
    monkeypatch.delenv("TF_CONFIG")
    assert distribute.is_chief() and training.backup_dir("run") == os.path.join("run", "backup")


def test_mirrored_with_one_device_says_how_to_split_the_cpu():
    assert len(tf.config.list_logical_devices("CPU")) == 1  # this test process's
    with pytest.warns(UserWarning, match=r"'mirrored' has one replica: .*split_cpu\(N\) .*"
                                         r"--cpu-replicas N"):
        strategy = distribute.get_strategy("mirrored")
    assert strategy.num_replicas_in_sync == 1
    assert distribute.split_cpu(1) == 1  # the count already in place: allowed
    with pytest.raises(ValueError, match=r"split_cpu\(3\): TensorFlow has already started with "
                                         r"1 CPU device"):
        distribute.split_cpu(3)
    with pytest.raises(ValueError, match="`cpu_replicas` must be a positive integer"):
        distribute.split_cpu(0)


def test_cpu_replicas_on_the_command_line_train_on_several_replicas(tmp_path, image_folder):
    """`keras-vit train --strategy mirrored --cpu-replicas 2` on a machine without GPUs: two
    replicas, and a validation batch split unevenly between them (one image held out of 12:
    a batch of 1 and 0, past Keras' symbolic build that summed the replicas' first batch)."""
    config = json.dumps(dict(patch_size=8, hidden_size=8, num_layers=1, num_heads=2, mlp_dim=8))
    command = [sys.executable, "-m", "keras_vit_cli", "train", "--folder", str(image_folder),
               "--model-config", config, "--image-size", "16", "--batch-size", "4",
               "--epochs", "1", "--no-xla", "--verbose", "1", "--output", str(tmp_path / "run"),
               "--strategy", "mirrored", "--cpu-replicas", "2"]
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "2 replica(s)" in done.stdout
    assert (tmp_path / "run" / "final.npz").exists()
    import keras_vit_cli as cli

    other = command[3:command.index("--output")] + ["--output", str(tmp_path / "other"),
                                                    "--strategy", "cpu", "--cpu-replicas", "2"]
    assert cli.main(other) == 2  # refused before anything starts
    assert not (tmp_path / "other").exists()
