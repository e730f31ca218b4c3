"""The command line's progress on stderr: a line per stage and a bar where the count is known on
a terminal (and the stage lines with --progress elsewhere), nothing under --quiet, standard output
the result alone; and an interrupt taken at once, saying what was kept and how to resume."""

import functools
import json
import os
import pathlib
import signal
import subprocess
import sys

import numpy as np
import pytest
import tqdm
from PIL import Image

import keras_vit_cli
from keras_vit_cli import progress

ROOT = pathlib.Path(__file__).resolve().parents[1]
TINY = dict(image_size=16, patch_size=8, hidden_size=8, num_layers=1, num_heads=2, mlp_dim=8)
TINY_JSON = json.dumps(TINY)


def write_images(folder, classes=2, per_class=2):
    """An image folder: `classes` subfolders c0, c1, ... of `per_class` 16x16 PNGs each."""
    rng = np.random.default_rng(0)
    paths = []
    for c in range(classes):
        for i in range(per_class):
            path = folder / f"c{c}" / f"{i}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(path)
            paths.append(str(path))
    return paths


@pytest.fixture
def terminal(monkeypatch):
    """Standard error reads as a terminal, and tqdm's bars draw every count (by default they
    redraw at most every 0.1 s, so a fast run would show none of its counts)."""
    from keras_vit.weights import download

    monkeypatch.setattr(progress, "_is_terminal", lambda stream: True)
    monkeypatch.setattr(download, "redrawn_in_place", lambda stream: stream is sys.stderr)
    monkeypatch.setattr(tqdm, "tqdm", functools.partial(tqdm.tqdm, mininterval=0, miniters=1))


def stage_lines(err, command):
    return [line[len(f"keras-vit {command}: "):] for line in err.splitlines()
            if line.startswith(f"keras-vit {command}: ")
            and not line.startswith(f"keras-vit {command}: warning: ")]


def test_export_names_each_stage_with_progress_and_is_silent_elsewhere(tmp_path, capsys):
    served = tmp_path / "served"
    argv = ["export", str(served), "--model-config", TINY_JSON, "--num-classes", "3",
            "--no-warmup", "--no-xla"]
    assert keras_vit_cli.main([*argv, "--progress"]) == 0
    out, err = capsys.readouterr()
    assert stage_lines(err, "export") == [
        "building the model of --model-config with initial weights",
        "tracing the signatures (graph runtime)",
        "writing the SavedModel"], err
    assert out.startswith(f"SavedModel written to {served / '1'}"), out
    # Standard error is not a terminal here (a test, a pipe, a log): no progress without
    # --progress; the result on stdout is the same.
    assert keras_vit_cli.main([*argv, "--version", "2"]) == 0
    out, err = capsys.readouterr()
    assert err == "" and out.startswith(f"SavedModel written to {served / '2'}"), (out, err)


def test_quiet_prints_nothing_even_on_a_terminal(tmp_path, capsys, terminal):
    images = write_images(tmp_path / "images", classes=1, per_class=3)
    argv = ["predict", *images, "--model-config", TINY_JSON, "--top-k", "1"]
    assert keras_vit_cli.main([*argv, "--quiet"]) == 0
    out, err = capsys.readouterr()
    # No progress at all: only the warning that the initial head makes every class alike.
    assert err.splitlines() == [
        "keras-vit predict: warning: vit's head is all zeros (no trained weights were loaded "
        "into it): every class gets the same probability. Expected --weights with a trained "
        "head."] and out.count("\n") == 6, (out, err)
    assert keras_vit_cli.main(argv) == 0
    quiet_out = out
    out, err = capsys.readouterr()
    assert out == quiet_out  # the result is the same
    assert stage_lines(err, "predict")[:2] == [
        "building the model of --model-config with initial weights",
        "classifying 3 images at 16x16"], err
    assert "3/3" in err, err  # the bar counted the images (tqdm's, on stderr)


def test_predict_counts_many_images_in_batches(tmp_path, capsys, monkeypatch, terminal):
    from keras_vit_cli import predict

    monkeypatch.setattr(predict, "PREDICT_BATCH", 2)
    images = write_images(tmp_path / "images", classes=1, per_class=5)
    argv = ["predict", *images, "--model-config", TINY_JSON, "--top-k", "1"]
    assert keras_vit_cli.main(argv) == 0
    out, err = capsys.readouterr()
    assert [line for line in out.splitlines() if not line.startswith(" ")] == images
    assert "5/5" in err and "2/5" in err, err


def test_convert_and_inspect_name_their_stages(tmp_path, capsys):
    images = write_images(tmp_path / "images", classes=1, per_class=2)
    out_file = tmp_path / "tiny.npz"
    assert keras_vit_cli.main(["convert", "digits", str(out_file), "--progress"]) == 0
    assert stage_lines(capsys.readouterr().err, "convert") == [
        "building the model with the weights digits", f"writing {out_file}"]
    figures = tmp_path / "figures"
    assert keras_vit_cli.main(["inspect", *images, "--weights", str(out_file),
                               "--out", str(figures), "--progress"]) == 0
    assert stage_lines(capsys.readouterr().err, "inspect") == [
        f"building the model with the weights {out_file}", "reading 2 images",
        f"computing the attention maps and drawing the figures into {figures}"]


def test_evaluate_draws_its_bar_on_stderr_and_keeps_stdout_for_the_result(
        tmp_path, capsys, terminal):
    folder = tmp_path / "images"
    write_images(folder, classes=2, per_class=2)
    argv = ["evaluate", "--folder", str(folder), "--model-config", TINY_JSON,
            "--allow-fresh-head", "--batch-size", "2", "--json"]
    assert keras_vit_cli.main(argv) == 0
    out, err = capsys.readouterr()
    assert len(out.splitlines()) == 1 and json.loads(out)["examples"] == 4, out
    assert stage_lines(err, "evaluate") == [
        "building the model of --model-config with initial weights",
        f"evaluating on every image of {folder}"], err
    assert "4/4" in err, err  # Keras' Progbar, moved to stderr
    assert keras_vit_cli.main([*argv, "--quiet"]) == 0
    quiet_out, err = capsys.readouterr()
    assert err == "" and json.loads(quiet_out)["examples"] == 4


def test_quiet_and_progress_exclude_each_other(capsys):
    with pytest.raises(SystemExit) as exit_:
        keras_vit_cli.main(["predict", "x.png", "--quiet", "--progress"])
    assert exit_.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# Ctrl-C in a call that holds the signal.

# Runs keras_vit_cli.main on the arguments with the start of TensorFlow replaced by STALL (a
# call that holds a signal, as the import of TensorFlow or a long TensorFlow op does), after
# printing "ready" on stdout.
HELD = """
import bz2, os, sys, time
import keras_vit_cli

def stall():
    print("ready", flush=True)
    {stall}

keras_vit_cli._start_tensorflow_quietly = stall
sys.exit(keras_vit_cli.main(sys.argv[1:]))
"""
# Calls into C that run for seconds each without looking at signals, with the interpreter
# lock released, as TensorFlow's ops and compiler do; one after another, forever.
IN_C = "[bz2.compress(os.urandom(20_000_000)) for _ in iter(int, 1)]"
# Waiting inside the deferred imports: Python takes the signal and holds it until they end.
DEFERRED = "time.sleep(600)"


def interrupt_when_ready(stall, argv, cwd):
    """Runs the command line with HELD's stall, sends SIGINT once it stalls, and returns
    (exit status, stderr)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    run = subprocess.Popen([sys.executable, "-c", HELD.format(stall=stall), *argv], cwd=cwd,
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert run.stdout.readline() == "ready\n", run.communicate()
        run.send_signal(signal.SIGINT)
        _, err = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
    return run.returncode, err


@pytest.mark.parametrize("stall", [IN_C, DEFERRED], ids=["in C", "deferred imports"])
def test_an_interrupt_held_by_a_long_call_still_ends_the_command_saying_how_to_resume(
        tmp_path, stall):
    folder = tmp_path / "images"
    write_images(folder)
    argv = ["train", "--folder", str(folder), "--model-config", TINY_JSON, "--output",
            str(tmp_path / "run")]
    status, err = interrupt_when_ready(stall, argv, tmp_path)
    assert status == 130, err
    assert err.splitlines() == [
        "keras-vit train: interrupted; no epoch had finished, so nothing was kept: the same "
        f"command starts again: keras-vit {' '.join(argv[:4])} '{TINY_JSON}' "
        f"{' '.join(argv[5:])}"], err
    assert not (tmp_path / "run").exists()  # the output folder was not created


def test_a_write_stopped_in_a_long_call_leaves_nothing_of_it(tmp_path):
    """The export is writing its staging folder when the signal comes and the call holds it:
    the staging folder is removed, and so is the output folder the command created."""
    stall = ("from keras_vit_cli.catalog import library_module\n"
             "    fileio = library_module('fileio')\n"
             "    os.makedirs('served')\n"
             "    with fileio.staging_dir(os.path.join('served', '1')) as staging:\n"
             "        open(os.path.join(staging, 'saved_model.pb'), 'w').close()\n"
             f"        {IN_C}")
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "file").write_text("kept")
    status, err = interrupt_when_ready(
        stall, ["export", "served", "--model-config", TINY_JSON, "--quiet"], tmp_path)
    assert status == 130 and err.splitlines() == ["keras-vit export: interrupted"], err
    assert sorted(os.listdir(tmp_path)) == ["kept"]


def test_a_download_bar_never_reaches_stdout(tmp_path, capsys, monkeypatch, terminal):
    """`predict -q --weights file://...` printed Keras' download bar on stdout, before the
    classes a script reads there."""
    import keras_vit

    monkeypatch.setenv("KERAS_VIT_HOME", str(tmp_path / "home"))
    weights = tmp_path / "digits.npz"
    keras_vit.weights.save_npz(keras_vit.from_pretrained("digits"), weights)
    images = write_images(tmp_path / "images", classes=1, per_class=1)
    url = weights.as_uri()
    assert keras_vit_cli.main(["predict", *images, "--weights", url, "--quiet"]) == 0
    out, err = capsys.readouterr()
    assert err == "" and out.splitlines()[0] == images[0], (out, err)
    (tmp_path / "home").rename(tmp_path / "first")  # downloaded again: the bar shows
    assert keras_vit_cli.main(["predict", *images, "--weights", url]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[0] == images[0] and "\x1b" not in out and "\r" not in out, out
    assert f"Downloading {url}" in err and "\r" in err and " B/step" not in out, err


def test_a_download_into_a_log_is_one_line_with_progress_and_nothing_without(
        tmp_path, capsys, monkeypatch):
    """Standard error a file (a CI log): `--progress` says which URL downloads, in one line and
    no bar redrawn into the file; without it nothing is said. In Python, `progress=True` says
    it too, on stderr, with no bar where standard output is not a terminal."""
    import keras_vit

    weights = tmp_path / "digits.npz"
    keras_vit.weights.save_npz(keras_vit.from_pretrained("digits"), weights)
    images = write_images(tmp_path / "images", classes=1, per_class=1)
    url = weights.as_uri()
    for number, flags in enumerate((["--progress"], [])):
        monkeypatch.setenv("KERAS_VIT_HOME", str(tmp_path / f"home{number}"))
        assert keras_vit_cli.main(["predict", *images, "--weights", url, *flags]) == 0
        out, err = capsys.readouterr()
        assert out.splitlines()[0] == images[0], out
        downloads = [line for line in err.splitlines() if "Downloading" in line]
        assert downloads == ([f"Downloading {url}"] if flags else []), err
        assert "\r" not in err + out and "\b" not in err + out, err
    monkeypatch.setenv("KERAS_VIT_HOME", str(tmp_path / "python"))
    model = keras_vit.from_pretrained(url)
    out, err = capsys.readouterr()
    assert out == "" and err.splitlines() == [f"Downloading {url}"], (out, err)
    assert model.output.shape[-1] == 10
