"""keras_vit touches only what it wrote: pointed at a folder that holds the user's own files, no
command deletes, replaces or writes through (a symbolic link) what keras_vit did not write, and a
failed command leaves the folder as it found it. A property-based test draws the user's files."""

import json
import os
import pathlib
import socket
import subprocess
import sys

import keras
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

import keras_vit
import keras_vit_cli as cli
from keras_vit import data, fileio, training, weights

TINY = dict(image_size=16, patch_size=8, hidden_size=8, num_layers=1, num_heads=2, mlp_dim=8,
            num_classes=3)
TINY_JSON = json.dumps({k: v for k, v in TINY.items() if k != "num_classes"})
# What a user may keep in a folder: names keras_vit writes too, and names its temporaries had.
USER_FILES = {
    "config.json": b'{"mine": true}',
    "logs/notes.txt": b"my notes",
    ".old-x": b"old",
    ".tmp-y": b"tmp",
    "notes.txt": b"notes",
    "final.npz": b"not keras_vit's",
    "best.json": b"{}",
    "backup/readme": b"my backup",
    "sub/.tmp-z": b"z",
}


def tree(root):
    """Every entry under `root`: files with their bytes, folders and links as such."""
    root = pathlib.Path(root)
    entries = {}
    for path in sorted(root.rglob("*")):
        name = str(path.relative_to(root))
        if path.is_symlink():
            entries[name] = ("link", os.readlink(path))
        elif path.is_dir():
            entries[name] = "folder"
        else:
            entries[name] = path.read_bytes()
    return entries


def write_files(root, files):
    for name, content in files.items():
        path = pathlib.Path(root) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)


def image_folder(root, corrupt=False):
    rng = np.random.default_rng(0)
    for c in range(3):
        for i in range(4):
            path = pathlib.Path(root) / f"class{c}" / f"{i}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(path)
    if corrupt:  # decodes only when the pipeline reaches it: the run has started by then
        (pathlib.Path(root) / "class0" / "9.png").write_bytes(b"\x89PNG\r\n\x1a\n broken")
    return root


def train(folder, output, *extra):
    return cli.main(["train", "--folder", str(folder), "--model-config", TINY_JSON,
                     "--image-size", "16", "--batch-size", "4", "--epochs", "1", "--no-xla",
                     "--verbose", "0", "--output", str(output), *map(str, extra)])


def error_line(capsys):
    err = capsys.readouterr().err
    assert "Traceback" not in err and "internal error" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("keras-vit")]
    assert len(lines) == 1, err
    return lines[0]


def dead_pid():
    process = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                             capture_output=True, text=True, check=True)
    return int(process.stdout)


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("KERAS_VIT_HOME", str(tmp_path / "cache"))


# --------------------------------------------------------------------------------------------
# Training runs.


def test_a_failed_run_in_a_users_folder_leaves_it_as_it_was(tmp_path, capsys):
    """The probe's case: the user's config.json, logs/, .old-* and .tmp-* survive a failed run
    (here refused up front: config.json and logs/ are not a keras_vit run's)."""
    out = tmp_path / "p"
    write_files(out, {k: USER_FILES[k] for k in ("config.json", "logs/notes.txt", ".old-x",
                                                 ".tmp-y")})
    before = tree(out)
    assert train(image_folder(tmp_path / "F", corrupt=True), out) == 2
    line = error_line(capsys)
    assert "config.json" in line and "logs/" in line and "--overwrite" in line, line
    assert tree(out) == before


def test_a_run_that_fails_midway_removes_only_what_it_wrote(tmp_path, capsys):
    """No name of the run is taken, so the command goes ahead and fails on an undecodable
    image; it leaves the user's files, .tmp-* and .old-* included, and nothing of its own (no
    lock file). A run that fails inside `fit` is the fuzz test's case below."""
    out = tmp_path / "p"
    write_files(out, {k: USER_FILES[k] for k in (".old-x", ".tmp-y", "notes.txt", "sub/.tmp-z")})
    before = tree(out)
    assert train(image_folder(tmp_path / "F", corrupt=True), out) == 2
    error_line(capsys)
    assert tree(out) == before


def test_a_failed_run_in_a_new_folder_leaves_no_folder(tmp_path):
    out = tmp_path / "new" / "run"
    model = keras_vit.ViT(**TINY)
    with pytest.raises(ValueError, match="epochs"):
        training.fit(model, arrays(), output_dir=out, epochs=0, verbose=0)
    assert not out.exists()

    class Fail(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            raise RuntimeError("stop")

    with pytest.raises(RuntimeError, match="stop"):
        training.fit(model, arrays(), output_dir=out, epochs=1, verbose=0, jit_compile=False,
                     callbacks=[Fail()])
    assert not out.exists()


def test_a_successful_run_keeps_the_users_other_files(tmp_path, capsys):
    out = tmp_path / "p"
    mine = {k: USER_FILES[k] for k in (".old-x", ".tmp-y", "notes.txt", "sub/.tmp-z")}
    write_files(out, mine)
    assert train(image_folder(tmp_path / "F"), out) == 0
    capsys.readouterr()
    after = tree(out)
    for name, content in mine.items():
        assert after[name] == content
    assert (out / "run.json").exists() and (out / "final.npz").exists()


def test_a_run_replaces_the_users_files_only_with_overwrite(tmp_path, capsys):
    out = tmp_path / "p"
    write_files(out, {"config.json": USER_FILES["config.json"]})
    before = tree(out)
    assert train(image_folder(tmp_path / "F"), out) == 2
    assert "config.json but no run.json" in error_line(capsys)
    assert tree(out) == before
    assert train(image_folder(tmp_path / "F"), out, "--overwrite") == 0
    capsys.readouterr()
    assert json.loads((out / "config.json").read_text())["format"] == "keras_vit"


def test_overwrite_removes_what_the_run_wrote_and_keeps_the_users_files_among_it(tmp_path,
                                                                                capsys):
    """`--overwrite` starts a finished run over: its TensorBoard events go (the new run's
    curves do not continue the old one's), and a file of the user's in its backup/ or logs/
    stays, as at the end of the run, which removes its backup."""
    out = tmp_path / "p"
    assert train(image_folder(tmp_path / "F"), out) == 0
    events = {name for name in tree(out) if "tfevents" in name}
    assert events
    # An earlier run's other worker's backup is the run's too; a file of the user's is not.
    write_files(out, {"backup/mine.txt": b"mine", "logs/notes.txt": b"my notes",
                      "backup/worker-1/latest.json": b'{"epoch": 1, "dir": "epoch-000001"}',
                      "backup/worker-1/epoch-000001/state.npz": b"state"})
    assert train(image_folder(tmp_path / "F"), out, "--overwrite") == 0
    capsys.readouterr()
    after = tree(out)
    assert after["backup/mine.txt"] == b"mine" and after["logs/notes.txt"] == b"my notes"
    assert not events & set(after) and any("tfevents" in name for name in after)
    assert [name for name in after if name.startswith("backup/")] == ["backup/mine.txt"]


def arrays():
    rng = np.random.default_rng(1)
    x = rng.integers(0, 256, (12, 16, 16, 3), dtype=np.uint8)
    return data.from_arrays(x, np.arange(12) % 3, num_classes=3, image_size=16, batch_size=4,
                            training=True)


class FailAtFirstBatch(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        raise RuntimeError("injected failure")


@settings(max_examples=8, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(names=st.sets(st.sampled_from(sorted(USER_FILES)), max_size=5),
       overwrite=st.booleans())
def test_fuzz_a_failed_fit_leaves_the_users_folder_as_it_was(tmp_path_factory, names,
                                                               overwrite):
    """Any mix of the user's files; a run that fails before its first epoch ends leaves the
    folder exactly as it was, unless `overwrite=True` let it replace the names it writes."""
    out = tmp_path_factory.mktemp("fuzz") / "p"
    write_files(out, {name: USER_FILES[name] for name in names})
    out.mkdir(exist_ok=True)
    before = tree(out)
    with pytest.raises((RuntimeError, ValueError)) as info:
        training.fit(keras_vit.ViT(**TINY), arrays(), output_dir=out, epochs=1, verbose=0,
                     jit_compile=False, overwrite=overwrite, callbacks=[FailAtFirstBatch()])
    after = tree(out)
    if isinstance(info.value, ValueError):  # refused: a name of the run is the user's
        assert not overwrite and "--overwrite" in str(info.value)
        assert after == before
        return
    assert "injected failure" in str(info.value)
    replaced = {"config.json", "final.npz", "best.json"}
    for name, value in before.items():  # the user's files, but those overwrite replaced
        if name.split("/")[0] not in {r.split("/")[0] for r in replaced} or not overwrite:
            assert after.get(name) == value, name
    assert set(after) <= set(before)  # nothing of the run is left


# --------------------------------------------------------------------------------------------
# convert and export.


def test_convert_does_not_replace_a_file_without_overwrite(tmp_path, capsys):
    """`convert digits RUN/final.npz` on a finished run replaced its weights."""
    run = tmp_path / "run"
    write_files(run, {"final.npz": b"trained weights"})
    assert cli.main(["convert", "digits", str(run / "final.npz")]) == 2
    assert "already exists" in error_line(capsys)
    assert (run / "final.npz").read_bytes() == b"trained weights"
    assert cli.main(["convert", "digits", str(run / "final.npz"), "--overwrite"]) == 0
    capsys.readouterr()
    assert set(weights.read_npz(run / "final.npz")) == set(
        weights.model_params(keras_vit.from_pretrained("digits")))


@pytest.mark.parametrize("suffix", [".npz", ".safetensors", ".keras", ".weights.h5"])
def test_convert_refuses_every_format_over_an_existing_file(tmp_path, capsys, suffix):
    out = tmp_path / f"model{suffix}"
    out.write_bytes(b"mine")
    assert cli.main(["convert", "digits", str(out)]) == 2
    assert "already exists" in error_line(capsys)
    assert out.read_bytes() == b"mine"


def test_convert_to_safetensors_keeps_another_files_config(tmp_path, capsys):
    assert cli.main(["convert", "digits", str(tmp_path / "a.safetensors")]) == 0
    capsys.readouterr()
    config = (tmp_path / "config.json").read_bytes()
    assert cli.main(["convert", "digits", str(tmp_path / "b.safetensors")]) == 2
    assert "config.json describes a.safetensors there" in error_line(capsys)
    assert (tmp_path / "config.json").read_bytes() == config
    assert not (tmp_path / "b.safetensors").exists()


def test_tflite_export_does_not_replace_a_file_without_overwrite(tmp_path, capsys):
    out = tmp_path / "model.tflite"
    out.write_bytes(b"mine")
    assert cli.main(["export", str(out), "--format", "tflite", "--weights", "digits"]) == 2
    assert "already exists" in error_line(capsys)
    assert out.read_bytes() == b"mine"
    model = keras_vit.from_pretrained("digits")
    with pytest.raises(fileio.DestinationExists, match="overwrite=True"):
        keras_vit.tflite.export_tflite(model, out)
    assert out.read_bytes() == b"mine"


def test_python_writers_do_not_replace_a_file_without_overwrite(tmp_path):
    model = keras_vit.ViT(**TINY)
    out = tmp_path / "m.npz"
    out.write_bytes(b"mine")
    with pytest.raises(fileio.DestinationExists, match="overwrite=True"):
        weights.save_npz(model, out)
    assert out.read_bytes() == b"mine"
    weights.save_npz(model, out, overwrite=True)
    assert set(weights.read_npz(out)) == set(weights.model_params(model))
    out = tmp_path / "m.safetensors"
    out.write_bytes(b"mine")
    with pytest.raises(fileio.DestinationExists, match="overwrite=True"):
        weights.writers.save_safetensors(model, out)
    assert out.read_bytes() == b"mine" and not (tmp_path / "config.json").exists()


# Another process holding a folder's lock as a run does (flock, the holder recorded).
HOLDER = """
import fcntl, json, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o666)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(fd, json.dumps(dict(what="run", pid=os.getpid(), host="h", started="s",
                             command="keras-vit train")).encode())
print("held", flush=True)
sys.stdin.read()
"""


def test_writes_into_a_folder_a_running_job_holds_are_refused(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(run / fileio.LOCK_FILE)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        before = tree(run)
        assert cli.main(["convert", "digits", str(run / "other.npz")]) == 2
        assert "in use by another run" in error_line(capsys)
        assert cli.main(["export", str(run / "export"), "--weights", "digits"]) == 2
        assert "in use by another run" in error_line(capsys)
        assert tree(run) == before
    finally:
        holder.communicate("")
    assert cli.main(["convert", "digits", str(run / "other.npz")]) == 0  # released


# --------------------------------------------------------------------------------------------
# Links.


def test_a_run_refuses_a_link_among_its_files(tmp_path, capsys):
    outside = tmp_path / "outside.json"
    outside.write_bytes(b"keep me")
    out = tmp_path / "p"
    out.mkdir()
    for name in ("config.json", fileio.LOCK_FILE):
        link = out / name
        link.symlink_to(outside)
        before = tree(out)
        for extra in ((), ("--overwrite",)):
            assert train(image_folder(tmp_path / "F"), out, *extra) == 2
            line = error_line(capsys)
            assert f"{name} is a symbolic link" in line, line
            assert tree(out) == before and outside.read_bytes() == b"keep me"
        link.unlink()


def test_writers_refuse_a_link_even_with_overwrite(tmp_path, capsys):
    outside = tmp_path / "outside.npz"
    outside.write_bytes(b"keep me")
    link = tmp_path / "link.npz"
    link.symlink_to(outside)
    assert cli.main(["convert", "digits", str(link), "--overwrite"]) == 2
    assert "is a symbolic link" in error_line(capsys)
    with pytest.raises(fileio.WriteError, match="symbolic link"):
        weights.save_npz(keras_vit.ViT(**TINY), link, overwrite=True)
    with pytest.raises(fileio.WriteError, match="symbolic link"):
        fileio.atomic_write_text(link, "x")
    assert link.is_symlink() and outside.read_bytes() == b"keep me"


# --------------------------------------------------------------------------------------------
# Temporaries.


def test_only_keras_vits_temporaries_of_ended_processes_are_removed(tmp_path):
    host = fileio._host_digest()
    other_host = "0" * 8 if host != "0" * 8 else "1" * 8
    dead = dead_pid()
    names = {
        f".keras_vit-tmp-{host}-{dead}-abc-final.npz": True,      # a killed writer's
        f".keras_vit-old-{host}-{dead}-abc": False,  # a previous version naming no place
        f".keras_vit-tmp-{host}-{os.getpid()}-abc-final.npz": False,  # a live writer's
        f".keras_vit-tmp-{other_host}-{dead}-abc-final.npz": False,   # another machine's
        ".tmp-final.npz": False,                                     # the user's
        ".old-x": False,
        "keras_vit-tmp-x": False,
    }
    for name in names:
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / f".keras_vit-tmp-{host}-{dead}-d-export").mkdir()
    fileio.remove_temporaries(tmp_path)
    for name, removed in names.items():
        assert (tmp_path / name).exists() != removed, name
    assert not (tmp_path / f".keras_vit-tmp-{host}-{dead}-d-export").exists()


def test_a_later_write_removes_what_a_killed_writer_of_the_same_file_left(tmp_path):
    host = fileio._host_digest()
    dead = dead_pid()
    same = tmp_path / f".keras_vit-tmp-{host}-{dead}-q1w2-model.tflite"
    other = tmp_path / f".keras_vit-tmp-{host}-{dead}-q1w2-other.npz"
    same.write_bytes(b"half")
    other.write_bytes(b"half")
    fileio.atomic_write_text(tmp_path / "model.tflite", "x")
    assert not same.exists() and other.exists()
    staging = tmp_path / f".keras_vit-tmp-{host}-{dead}-z9-1"
    staging.mkdir()
    with fileio.staging_dir(tmp_path / "1") as folder:
        pathlib.Path(folder, "saved_model.pb").write_bytes(b"x")
    assert not staging.exists()
    assert [p.name for p in tmp_path.iterdir() if fileio.is_temporary(p.name)] == [other.name]


def test_temporary_names_carry_this_host_and_process(tmp_path):
    seen = []
    with fileio.atomic_file(tmp_path / "a.npz") as tmp:
        seen.append(os.path.basename(tmp))
        pathlib.Path(tmp).write_bytes(b"x")
    assert fileio.is_temporary(seen[0])
    assert f"-{os.getpid()}-" in seen[0] and seen[0].endswith("-a.npz")
    assert fileio._host_digest() in seen[0]
    assert socket.gethostname() not in seen[0]


# --------------------------------------------------------------------------------------------
# Reports and figures in a folder the user names.


def test_evaluate_and_inspect_replace_reports_only_with_overwrite(tmp_path, capsys):
    from keras_vit import evaluation, inspection

    model = keras_vit.from_pretrained("digits")
    images = np.zeros((2, 16, 16, 3), np.uint8)
    for name in (*evaluation.REPORT_FILES, *inspection.FIGURE_FILES.values()):
        (tmp_path / name).write_bytes(b"mine")
    before = tree(tmp_path)
    with pytest.raises(fileio.DestinationExists, match="per_class_accuracy.csv already exists"):
        keras_vit.evaluate(model, (images, np.zeros(2, int)), out_dir=tmp_path, progress=False)
    with pytest.raises(fileio.DestinationExists, match="already exists"):
        keras_vit.inspect_model(model, np.zeros((2, 16, 16, 3), np.float32), tmp_path)
    image = tmp_path / "x.png"
    Image.fromarray(images[0]).save(image)
    assert cli.main(["inspect", str(image), "--weights", "digits", "--out", str(tmp_path)]) == 2
    line = error_line(capsys)
    assert "attention.png already exists" in line and "--overwrite" in line, line
    image.unlink()
    assert tree(tmp_path) == before
    result = keras_vit.evaluate(model, (images, np.zeros(2, int)), out_dir=tmp_path,
                                progress=False, overwrite=True)
    assert (tmp_path / "per_class_accuracy.csv").read_bytes() != b"mine"
    assert str(tmp_path / "per_class_accuracy.csv") in result["files"]


# A replacement by `fileio.staging_dir`, killed (SIGKILL) at one instant: EVENT is the audit
# event ("os.rename" to a name, or "shutil.rmtree") before which the process dies.
# The child loads keras_vit's fileio as the command line does before TensorFlow starts
# (`keras_vit_cli.catalog.library_module`): the same module, without importing Keras.
KILLED_REPLACEMENT = """
import os, signal, sys
from keras_vit_cli.catalog import library_module
fileio = library_module("fileio")
assert "tensorflow" not in sys.modules
event, name, path = sys.argv[1:]
def hook(seen, args):
    if seen == event and (event != "os.rename" or os.path.basename(os.fspath(args[1])) == name):
        os.kill(os.getpid(), signal.SIGKILL)
sys.addaudithook(hook)
with fileio.staging_dir(path) as staging:
    open(os.path.join(staging, "version"), "w").write("2")
"""


@pytest.mark.parametrize("event,name,left", [
    ("os.rename", "previous", "1"),  # before the old version is moved aside
    ("os.rename", "export", "1"),    # between the two renames: only the moved-aside copy
    ("shutil.rmtree", "", "2"),      # after the new version took its place
])
def test_the_previous_version_survives_a_kill_at_every_instant_of_a_replacement(
        tmp_path, event, name, left):
    export = tmp_path / "export"
    export.mkdir()
    (export / "version").write_text("1")
    done = subprocess.run([sys.executable, "-c", KILLED_REPLACEMENT, event, name, str(export)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == -9, done.stderr[-2000:]
    # The next write in the folder (here of another destination) settles what was left: the
    # previous version back in place, or the new one.
    with fileio.staging_dir(tmp_path / "other") as staging:
        (pathlib.Path(staging) / "x").write_text("x")
    assert (export / "version").read_text() == left
    with pytest.raises(fileio.DestinationExists):  # it is there: no silent replacement
        fileio.check_destination(export, overwrite=False, kind="folder")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export", "other"]  # no temporary


def test_an_old_folder_naming_no_destination_is_kept(tmp_path):
    """An old folder left by an earlier version of keras_vit (no destination in its name) is
    the user's previous version: never removed."""
    dead = 2 ** 22 + 12345  # beyond Linux' default pid_max: no such process
    host = fileio.TEMPORARY_NAME.match(
        os.path.basename(tempfile_name(tmp_path)))["host"]
    old = tmp_path / f".keras_vit-old-{host}-{dead}-abcdefgh"
    (old / "previous").mkdir(parents=True)
    fileio.remove_temporaries(tmp_path)
    assert (old / "previous").is_dir()


def tempfile_name(folder):
    with fileio.atomic_file(folder / "probe") as tmp:
        return tmp


@pytest.mark.parametrize("length", [200, 240, 255])
def test_a_valid_file_name_of_any_length_is_written_and_replaced(tmp_path, length):
    """The temporary's name never passes the file system's 255 bytes, whatever the length of
    the destination's (its suffix kept for writers that choose the format by it)."""
    name = "a" * (length - len(".weights.h5")) + ".weights.h5"
    fileio.atomic_write_text(tmp_path / name, "1")
    with fileio.atomic_file(tmp_path / name) as tmp:
        assert tmp.endswith(".weights.h5") and len(os.path.basename(tmp).encode()) <= 255
        pathlib.Path(tmp).write_text("2")
    folder = "f" * length
    for version in "12":
        with fileio.staging_dir(tmp_path / folder) as staging:
            (pathlib.Path(staging) / "v").write_text(version)
    assert (tmp_path / name).read_text() == "2" and (tmp_path / folder / "v").read_text() == "2"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([name, folder])


def test_export_overwrite_replaces_only_an_export_keras_vit_wrote(tmp_path, capsys):
    """`export --overwrite` into a version folder of the user's own files deleted them."""
    base = tmp_path / "exports"
    write_files(base / "1", {"keep.txt": b"mine"})
    argv = ["export", "--weights", "digits", str(base), "--no-warmup", "-q"]
    for extra in ([], ["--overwrite"]):
        assert cli.main(argv + extra) == 2
        assert "did not write" in error_line(capsys)
        assert tree(base) == {"1": "folder", "1/keep.txt": b"mine"}
    # An export keras_vit wrote is replaced with --overwrite, but not once the user's file is
    # beside it.
    assert cli.main(argv + ["--version", "2"]) == 0
    capsys.readouterr()
    assert cli.main(argv + ["--version", "2"]) == 2
    assert "already holds an export" in error_line(capsys)
    assert cli.main(argv + ["--version", "2", "--overwrite"]) == 0
    capsys.readouterr()
    for mine in ("notes.txt", "assets.extra/my_requests"):
        write_files(base / "2", {mine: b"mine"})
        before = tree(base)
        assert cli.main(argv + ["--version", "2", "--overwrite"]) == 2
        assert f"files it did not write ({mine})" in error_line(capsys)
        assert tree(base) == before
        (base / "2" / mine).unlink()
