"""Faults injected into real runs: two runs on one folder, a full disk (a file-size limit) during
each kind of write, kill -9 between two writes, and state files changed behind a run's back.

The runs are processes of the command line; `tests/fault_child.py` pauses or kills one just
before a given file is renamed into place (Python's audit hooks see every rename). Each fault
must end in one clear line (or, for a kill, a resume that works), leave no temporary files,
and keep the previous state loadable."""

import importlib.util
import json
import os
import pathlib
import resource
import select
import signal
import socket
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from PIL import Image

import keras_vit
import keras_vit_cli as cli
from keras_vit import evaluation, fileio, training, weights
from test_errors import file_size_limit as file_size_limit_here  # this process's, for a block

TESTS = pathlib.Path(__file__).resolve().parent
CHILD = TESTS / "fault_child.py"
TINY_JSON = json.dumps(dict(patch_size=8, hidden_size=8, num_layers=1, num_heads=2, mlp_dim=8))
# Larger than the small records (run.json, config.json, TensorBoard's first events) and smaller
# than a backup of the tiny model: the file-size limit of `ulimit -f` that stops the backup.
BACKUP_LIMIT = 24_000
CHILD_TIMEOUT = 300
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")


def write_images(folder, classes=3, per_class=4, seed=0):
    rng = np.random.default_rng(seed)
    for c in range(classes):
        for i in range(per_class):
            path = folder / f"class{c}" / f"{i}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(path)
    return folder


def train_args(folder, output, *extra):
    """A 3-epoch run of 2 updates each, validated on a held-out image (so best.npz is kept)."""
    return ["train", "--folder", str(folder), "--model-config", TINY_JSON, "--image-size", "16",
            "--batch-size", "4", "--epochs", "3", "--no-xla", "--verbose", "0", "--output",
            str(output), *extra]


def file_size_limit(limit):
    """A `preexec_fn` that sets the child's file-size limit (`ulimit -f`); Python ignores
    SIGXFSZ, so a write past it fails with EFBIG."""
    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    return apply


def run_cli(argv, limit=None, fault=None):
    """The command line in a child process: `fault` is ("kill", NAME, COUNT) for
    tests/fault_child.py, `limit` a file-size limit in bytes."""
    command = [sys.executable, "-m", "keras_vit_cli"] if fault is None else \
        [sys.executable, str(CHILD), *map(str, fault), "--"]
    return subprocess.run(command + argv, capture_output=True, text=True, env=ENV,
                          timeout=CHILD_TIMEOUT,
                          preexec_fn=file_size_limit(limit) if limit else None)


def leftovers(root):
    """Temporary files or folders of keras_vit's atomic writes under `root`."""
    return sorted(str(p.relative_to(root)) for p in pathlib.Path(root).rglob("*")
                  if fileio.is_temporary(p.name))


def snapshot(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(pathlib.Path(root).rglob("*"))
            if p.is_file()}


def wait_for(path, process):
    deadline = time.monotonic() + CHILD_TIMEOUT
    while not path.exists():
        if process.poll() is not None:
            pytest.fail(f"the child ended first: {process.communicate()[1][-3000:]}")
        if time.monotonic() > deadline:
            process.kill()
            pytest.fail("the child did not reach its pause")
        time.sleep(0.1)


def one_line(stderr):
    """The command line's one line of error (TensorFlow's C++ start-up lines aside)."""
    lines = [line for line in stderr.splitlines() if line.startswith("keras-vit")]
    assert "Traceback" not in stderr and len(lines) == 1, stderr[-3000:]
    return lines[0]


# ---------------------------------------------------------------------------------------------
# Two runs on one folder.


def test_a_second_run_on_a_folder_meets_the_first_and_changes_nothing(tmp_path, capsys):
    folder, out, marker = write_images(tmp_path / "images"), tmp_path / "run", tmp_path / "paused"
    first = subprocess.Popen(
        [sys.executable, str(CHILD), "pause", "best.npz", "1", str(marker), "--",
         *train_args(folder, out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=ENV)
    try:
        wait_for(marker, first)  # the first run holds the folder, one epoch in
        before = snapshot(out)
        second = train_args(folder, out, "--lr", "0.05", "--seed", "7")
        pretrain = ["pretrain", "--folder", str(folder), "--model-config", TINY_JSON,
                    "--image-size", "16", "--batch-size", "4", "--epochs", "1", "--no-xla",
                    "--verbose", "0", "--output", str(out)]
        for argv in (second, second + ["--overwrite"], pretrain):
            assert cli.main(argv) == 2
            message = one_line(capsys.readouterr().err)
            assert f"{out} is in use by another run: process {first.pid} on " \
                   f"{socket.gethostname()}, started " in message, message
            assert "fault_child.py pause best.npz" in message and " train " in message
            assert snapshot(out) == before
    finally:
        marker.unlink(missing_ok=True)
        _, stderr = first.communicate(timeout=CHILD_TIMEOUT)
    assert first.returncode == 0, stderr[-3000:]
    run = json.loads((out / "run.json").read_text())
    assert run["finished"] and run["settings"]["learning_rate"] == 0.003  # the first run's
    assert cli.main(second) == 2  # now the finished run, not the lock, answers
    assert "finished (3 epochs)" in capsys.readouterr().err


def test_a_folder_lock_is_released_when_its_holder_dies(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import time
        from keras_vit_cli.catalog import library_module  # fileio without Keras
        with library_module("fileio").folder_lock({str(out)!r}):
            print("held", flush=True)
            time.sleep(600)
        """)], stdout=subprocess.PIPE, text=True, env=ENV)
    try:
        ready, _, _ = select.select([holder.stdout], [], [], CHILD_TIMEOUT)
        assert ready, "the holder did not take the lock"
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(keras_vit.fileio.FolderInUse, match=f"process {holder.pid} on"):
            with keras_vit.fileio.folder_lock(out):
                pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with keras_vit.fileio.folder_lock(out):  # the kernel dropped the dead holder's lock
        held = json.loads((out / keras_vit.fileio.LOCK_FILE).read_text())
        assert held["pid"] == os.getpid()
    assert (out / keras_vit.fileio.LOCK_FILE).read_text() == ""  # an unheld lock names nobody


# ---------------------------------------------------------------------------------------------
# kill -9 between two writes, and a full disk, each followed by the same command again.


def test_a_run_killed_between_writes_or_stopped_by_a_full_disk_resumes(tmp_path):
    """One run through four faults, each met by running the same command again."""
    folder, out = write_images(tmp_path / "images"), tmp_path / "run"
    argv = train_args(folder, out)

    def killed_at(name, count):
        killed = run_cli(argv, fault=("kill", name, count))
        assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
        training.best_record(out / "best.npz")  # what it left is consistent

    # 1. Epoch 1's best.json is written, the best.npz it names not yet in place.
    killed_at("best.npz", 1)
    assert training.resume_epoch(training.backup_dir(out)) == 1
    # 2. Epoch 2's backup does not fit under the file-size limit: one line, the last backup
    # stands (its lock did not outlive the killed run).
    full = run_cli(argv, limit=BACKUP_LIMIT)
    assert full.returncode == 2, full.stderr[-3000:]
    message = one_line(full.stderr)
    assert message.startswith(f"keras-vit train: error: Cannot write {out}/backup/epoch-000002: "
                              "File too large."), message
    assert "ulimit -f" in message and leftovers(out) == []
    assert training.resume_epoch(training.backup_dir(out)) == 1
    # 3. Epoch 3's backup is staged, the pointer to it not moved.
    killed_at("latest.json", 2)
    assert training.resume_epoch(training.backup_dir(out)) == 2
    # 4. final.npz is written, the run not yet marked finished.
    killed_at("run.json", 2)
    assert (out / "final.npz").exists()
    assert not json.loads((out / "run.json").read_text())["finished"]
    resumed = run_cli(argv)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads((out / "run.json").read_text())["finished"]
    keras_vit.from_pretrained(out / "final.npz")
    record = training.best_record(out / "best.npz")  # best.npz is the file best.json names
    assert record is not None and record["epoch"] in (0, 1, 2)
    keras_vit.from_pretrained(out / "best.npz")
    assert not (out / "backup").exists() and leftovers(out) == []


# ---------------------------------------------------------------------------------------------
# A full disk.


def test_a_full_disk_in_a_new_run_leaves_nothing(tmp_path):
    folder, out = write_images(tmp_path / "images"), tmp_path / "run"
    full = run_cli(train_args(folder, out), limit=BACKUP_LIMIT)
    assert full.returncode == 2, full.stderr[-3000:]
    assert "Cannot write" in one_line(full.stderr)
    assert not out.exists()  # nothing to resume: no run.json, config.json, or empty folder


WRITES = textwrap.dedent("""
    import importlib.util, json, os, resource, sys, urllib.parse
    import numpy as np
    import keras, keras_vit, keras_vit_cli
    from keras_vit import evaluation, export, fileio, tflite, training, weights
    from keras_vit.weights import download, hub, writers

    out, limit = sys.argv[1], int(sys.argv[2])
    model = keras_vit.ViT(image_size=32, patch_size=8, hidden_size=64, num_layers=2,
                          num_heads=2, mlp_dim=128, num_classes=3)
    images = np.zeros((300, 32, 32, 3), np.uint8)
    source = weights.save_npz(model, os.path.join(out, "source.npz"))
    backup = training.BackupAndRestore(os.path.join(out, "backup"))
    backup.set_model(model)
    model.stop_training = False  # as model.fit sets it

    def convert(path):  # the command line's writer, its error raised (--debug)
        keras_vit_cli.main(["--debug", "convert", source, path, "--overwrite"])

    WRITES = {
        "model.npz": lambda p: weights.save_npz(model, p, overwrite=True),
        "model.safetensors": lambda p: writers.save_safetensors(model, p, overwrite=True),
        "model.keras": convert,
        "model.weights.h5": convert,
        "export": lambda p: export.export_saved_model(model, p, warmup=False),
        "model.tflite": lambda p: tflite.export_tflite(model, p, overwrite=True),
        "cache": lambda p: evaluation.extract_features(model, (images, np.zeros(300, int)),
                                                       cache=p, progress=False),
        "download.npz": lambda p: download.fetch_cached(
            "file://" + urllib.parse.quote(source), p, None, weights.read_npz, False),
        "backup": lambda p: backup.on_epoch_end(0, {"loss": 1.0}),
    }
    if importlib.util.find_spec("keras_hub") is not None:  # h5py would end the process
        exact = keras_vit.ViT(image_size=32, patch_size=8, hidden_size=64, num_layers=2,
                              num_heads=2, mlp_dim=128, num_classes=3, gelu_approximate=False)
        WRITES["preset"] = lambda p: keras_vit.save_keras_hub_preset(exact, p)
    for name in WRITES:  # the previous version each write must leave as it is
        if name.startswith("model."):
            with open(os.path.join(out, name), "wb") as f:
                f.write(b"previous")
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    for name, write in WRITES.items():
        try:
            write(os.path.join(out, name))
            print(json.dumps([name, None, None]), flush=True)
        except Exception as e:
            print(json.dumps([name, type(e).__name__, str(e)]), flush=True)
""")


def test_a_full_disk_during_each_kind_of_write_is_one_error_naming_the_file(tmp_path):
    result = subprocess.run([sys.executable, "-c", WRITES, str(tmp_path), "65536"],
                            capture_output=True, text=True, env=ENV, timeout=CHILD_TIMEOUT)
    assert result.returncode == 0, result.stderr[-3000:]
    reports = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("[")]
    with_preset = ["preset"] if importlib.util.find_spec("keras_hub") is not None else []
    assert [name for name, _, _ in reports] == [
        "model.npz", "model.safetensors", "model.keras", "model.weights.h5", "export",
        "model.tflite", "cache", "download.npz", "backup", *with_preset]
    for name, error, message in reports:
        assert error == "WriteError", (name, error, message)
        # The limit holds for every file of the process: TFLite's converter writes a SavedModel
        # into TMPDIR first, and that write is the one that fails, named as such.
        where = "(the temporary folder, TMPDIR)" if name == "model.tflite" else f"{tmp_path}/"
        assert message.startswith("Cannot write ") and where in message, (name, message)
        assert "File too large" in message
        assert "\n" not in message
    assert leftovers(tmp_path) == []
    for name in ("model.npz", "model.safetensors", "model.keras", "model.weights.h5",
                 "model.tflite"):
        assert (tmp_path / name).read_bytes() == b"previous", name
    assert not (tmp_path / "backup" / "latest.json").exists()


def test_best_npz_and_its_record_stay_a_pair_when_a_write_fails(tmp_path):
    model = keras_vit.ViT(image_size=16, patch_size=8, hidden_size=32, num_layers=2,
                          num_heads=2, mlp_dim=64, num_classes=3)
    best = tmp_path / "best.npz"
    callback = training.BestCheckpoint(best, monitor="loss")
    callback.set_model(model)
    callback.on_train_begin()
    callback.on_epoch_end(0, {"loss": 1.0})
    first = best.read_bytes()
    model.get_layer("head").bias.assign(np.ones(3, np.float32))
    with file_size_limit_here(len(first) // 2), \
            pytest.raises(keras_vit.fileio.WriteError, match=f"Cannot write {best}: File too"):
        callback.on_epoch_end(1, {"loss": 0.5})  # best.json is written first: it names both
    assert best.read_bytes() == first and leftovers(tmp_path) == []
    assert json.loads((tmp_path / "best.json").read_text())["epoch"] == 2  # from 1
    assert training.best_record(best)["epoch"] == 1  # the file that is there
    resumed = training.BestCheckpoint(best, monitor="loss")
    resumed.set_model(model)
    resumed.on_train_begin()
    assert (resumed.best, resumed.best_epoch) == (1.0, 1)
    best.write_bytes(np.random.default_rng(0).bytes(len(first)))  # replaced behind its back
    with pytest.raises(training.StateFileError, match="is not the file .* records"):
        resumed.on_train_begin()


# ---------------------------------------------------------------------------------------------
# Caches.


def test_the_feature_cache_follows_the_data_and_recomputes_a_damaged_entry(tmp_path):
    model = keras_vit.ViT(image_size=16, patch_size=8, hidden_size=8, num_layers=1, num_heads=2,
                          mlp_dim=8, num_classes=3)
    rng = np.random.default_rng(0)
    first, other = (rng.integers(0, 256, (6, 16, 16, 3), dtype=np.uint8) for _ in range(2))
    labels = np.arange(6) % 3
    cache = tmp_path / "cache"

    def features(images, **kwargs):
        return evaluation.extract_features(model, (images, labels), cache=cache,
                                           progress=False, **kwargs)[0]

    fresh = evaluation.extract_features(model, (other, labels), progress=False)[0]
    features(first)
    np.testing.assert_array_equal(features(other), fresh)  # the same key, other images
    assert len(list(cache.iterdir())) == 2
    for entry in cache.iterdir():
        entry.write_bytes(b"\x93NUMPY garbage")
    with pytest.warns(UserWarning, match="is damaged"):
        np.testing.assert_array_equal(features(other), fresh)
    np.testing.assert_array_equal(features(other), fresh)  # replaced by a good entry
    with pytest.raises(ValueError, match="say their range"):
        features(other.astype(np.float32))
    np.testing.assert_allclose(features(other / 255.0, value_range=(0, 1)), fresh, atol=1e-5)


def test_fewshot_recomputes_features_when_the_folder_changes(tmp_path, capsys):
    folder = write_images(tmp_path / "images", per_class=10)
    model = keras_vit.ViT(image_size=16, patch_size=8, hidden_size=8, num_layers=1, num_heads=2,
                          mlp_dim=8, include_top=False)
    weights.save_npz(model, tmp_path / "w.npz")
    argv = ["fewshot", "--folder", str(folder), "--weights", str(tmp_path / "w.npz"),
            "--split", "validation", "--shots", "1", "--l2", "1", "--batch-size", "4",
            "--verbose", "0", "--cache", str(tmp_path / "cache")]
    assert cli.main(argv) == 0
    assert len(list((tmp_path / "cache").iterdir())) == 2  # train and test features
    write_images(folder, per_class=10, seed=1)  # every image replaced
    assert cli.main(argv) == 0
    assert len(list((tmp_path / "cache").iterdir())) == 4
    capsys.readouterr()


def test_a_run_whose_folder_is_moved_away_writes_nothing_through_the_new_one(tmp_path):
    """The run folder moved away during `train` and a folder of the user's made in its place:
    the run writes nothing there (not its config.json, not best.json), and ends with one line
    naming the folder."""
    folder, out, marker = write_images(tmp_path / "images"), tmp_path / "run", tmp_path / "paused"
    run = subprocess.Popen(
        [sys.executable, str(CHILD), "pause", "best.npz", "1", str(marker), "--",
         *train_args(folder, out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=ENV)
    try:
        wait_for(marker, run)  # one epoch in, about to put best.npz in place
        out.rename(tmp_path / "elsewhere")
        out.mkdir()
        (out / "config.json").write_text("the user's")
        (out / "best.json").write_text("the user's too")
        before = snapshot(out)
    finally:
        marker.unlink(missing_ok=True)
        _, stderr = run.communicate(timeout=CHILD_TIMEOUT)
    assert run.returncode == 2, stderr[-3000:]
    assert "is no longer the folder this job locked" in one_line(stderr) \
        or "Cannot write" in one_line(stderr)
    assert snapshot(out) == before
    assert [p.name for p in out.iterdir() if p.name not in before] == []
