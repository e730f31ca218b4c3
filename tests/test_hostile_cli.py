"""A hostile user's command lines: closed and full standard streams, signals during a command,
out-of-range numbers, paths of the wrong kind. Each ends in exit 0 with the work done, or in one
`keras-vit CMD: error: ...` line (or a signal's status) with nothing left behind."""

import io
import json
import os
import signal
import subprocess
import sys
import time
import types

import numpy as np
import pytest
from PIL import Image

import keras_vit_cli as cli

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_JSON = json.dumps(dict(image_size=16, patch_size=8, hidden_size=8, num_layers=1,
                            num_heads=2, mlp_dim=8))


def keras_vit(*argv, cwd, **kwargs):
    """`python -m keras_vit_cli ARGV` in a process of its own, started in `cwd`."""
    env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.Popen([sys.executable, "-m", "keras_vit_cli", *map(str, argv)], cwd=cwd,
                            env=env, text=True, **kwargs)


def finished(process, timeout=240):
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out or "", err or ""


def error_lines(err):
    """stderr without TensorFlow's own start-up lines."""
    return [line for line in err.splitlines()
            if line.startswith("keras-vit") or "Traceback" in line or "rror" in line]


@pytest.fixture
def image_folder(tmp_path):
    rng = np.random.default_rng(0)
    for c in range(2):
        (tmp_path / "images" / f"c{c}").mkdir(parents=True)
        for i in range(4):
            Image.fromarray(rng.integers(0, 256, (16, 16, 3), np.uint8)).save(
                tmp_path / "images" / f"c{c}" / f"{i}.png")
    return tmp_path / "images"


# --------------------------------------------------------------------------------------------
# Standard streams.


def test_train_with_stdout_closed_trains_and_writes_its_files(tmp_path, image_folder):
    run = keras_vit("train", "--model-config", TINY_JSON, "--folder", image_folder,
                    "--steps", 1, "--batch-size", 4, "--validation-split", "none",
                    "--output", tmp_path / "run", cwd=tmp_path, stderr=subprocess.PIPE,
                    preexec_fn=lambda: os.close(1))
    status, _, err = finished(run)
    assert status == 0, err[-3000:]
    assert "Traceback" not in err and "internal error" not in err
    assert (tmp_path / "run" / "final.npz").is_file()


def test_predict_with_stderr_closed_prints_its_classes(tmp_path, image_folder):
    run = keras_vit("predict", "--weights", "digits", image_folder / "c0" / "0.png",
                    cwd=tmp_path, stdout=subprocess.PIPE, preexec_fn=lambda: os.close(2))
    status, out, _ = finished(run)
    assert status == 0
    assert out.startswith(str(image_folder / "c0" / "0.png")) and "%" in out


def test_full_stdout_is_one_error_line(tmp_path):
    with open("/dev/full", "w") as full:
        run = keras_vit("checkpoints", cwd=tmp_path, stdout=full, stderr=subprocess.PIPE)
        status, _, err = finished(run)
    assert status == 2
    assert err.splitlines() == ["keras-vit checkpoints: error: cannot write to standard "
                                "output: No space left on device"]


# --------------------------------------------------------------------------------------------
# Signals.


def _signal_export(tmp_path, name, sig, when):
    """Starts `keras-vit export` of the shipped digits model into tmp_path/name, to be sent
    `sig` once the command line handles signals (when="started": it is still importing
    TensorFlow) or while the export, written in full to its temporary folder, waits before
    renaming it into place (when="writing": tests/fault_child.py pauses it there, so the signal
    cannot arrive after the export has finished)."""
    argv = ["export", "--weights", "digits", "--no-warmup", tmp_path / name]
    if when == "writing":
        pause = ["pause", "1", "1", tmp_path / f"{name}.paused", "--"]
        argv = [os.path.join(REPO, "tests", "fault_child.py"), *pause, *argv]
        run = subprocess.Popen([sys.executable, *map(str, argv)], cwd=tmp_path, text=True,
                               env=dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2"),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    else:
        run = keras_vit(*argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return run, sig, when


def _handles_sigterm(pid):
    """Whether process `pid` has a handler for SIGTERM (Linux: /proc/PID/status SigCgt)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            fields = dict(line.split(":", 1) for line in status if ":" in line)
    except OSError:
        return False
    return bool(int(fields.get("SigCgt", "0"), 16) >> (signal.SIGTERM - 1) & 1)


def _deliver(runs, tmp_path):
    start = time.monotonic()
    pending = list(runs)
    while pending and time.monotonic() - start < 240:
        for item in list(pending):
            run, sig, when = item
            paused = f"{run.args[-1]}.paused"
            due = os.path.exists(paused) if when == "writing" else _handles_sigterm(run.pid)
            if due or run.poll() is not None:
                run.send_signal(sig)
                pending.remove(item)
        time.sleep(0.02)


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads /proc")
def test_signals_end_export_with_their_status_and_nothing_written(tmp_path):
    runs = [_signal_export(tmp_path, "early", signal.SIGINT, "started"),
            _signal_export(tmp_path, "terminated", signal.SIGTERM, "writing")]
    _deliver(runs, tmp_path)
    for run, sig, when in runs:
        status, _, err = finished(run)
        words = "interrupted" if sig == signal.SIGINT else "terminated"
        assert status == 128 + sig, (when, status, err[-3000:])
        assert error_lines(err) == [f"keras-vit export: {words}"], (when, err[-3000:])
        assert not os.path.exists(run.args[-1]), (when, os.listdir(run.args[-1]))


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads /proc")
def test_an_interrupted_training_run_says_what_it_kept_and_the_command_that_resumes_it(
        tmp_path, image_folder):
    """Ctrl-C once the first epoch's backup is written: one line naming the backup and the
    exact command (its resuming is tests/test_training.py's)."""
    argv = ["train", "--model-config", TINY_JSON, "--folder", str(image_folder), "--epochs",
            "5000", "--batch-size", "4", "--validation-split", "none", "--output",
            str(tmp_path / "run")]
    # Its epochs' lines go nowhere: a pipe nobody reads would hold the run up once full.
    run = keras_vit(*argv, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    pointer = tmp_path / "run" / "backup" / "latest.json"
    start = time.monotonic()
    while not pointer.exists() and run.poll() is None and time.monotonic() - start < 240:
        time.sleep(0.05)
    assert run.poll() is None and pointer.exists(), f"no backup while it ran ({run.poll()})"
    run.send_signal(signal.SIGINT)
    status, _, err = finished(run)
    assert status == 130, (status, err[-3000:], signal.getsignal(signal.SIGINT),
                           signal.pthread_sigmask(signal.SIG_BLOCK, []))  # what it inherits
    lines = error_lines(err)
    assert len(lines) == 1, err[-3000:]  # the one line, and nothing else that looks an error
    line = lines[0]
    epoch = json.loads(pointer.read_text())["epoch"]
    assert line == (f"keras-vit train: interrupted; the backup of epoch {epoch} is kept in "
                    f"{tmp_path / 'run' / 'backup'}, and the same command resumes from it: "
                    f"keras-vit {' '.join(argv[:2])} '{TINY_JSON}' {' '.join(argv[3:])}")


def test_an_interrupted_run_that_finished_no_epoch_says_nothing_was_kept(tmp_path):
    import argparse

    from keras_vit.training import callbacks  # what a started run has loaded

    assert callbacks.resume_epoch(callbacks.backup_dir(tmp_path / "run")) == 0
    args = argparse.Namespace(command="pretrain", output=str(tmp_path / "run"),
                              argv=["pretrain", "--output", str(tmp_path / "run")])
    assert cli._resume_text(args) == (
        "; no epoch had finished, so nothing was kept: the same command starts again: "
        f"keras-vit pretrain --output {tmp_path / 'run'}")
    assert cli._resume_text(argparse.Namespace(command="export", output="x")) == ""


def test_an_interrupt_swallowed_by_a_garbage_collection_callback_is_raised_again():
    import gc

    from keras_vit_cli.interrupts import Interrupts

    def interrupt_once(phase, info):
        if phase == "start" and not sent:
            sent.append(phase)
            signal.raise_signal(signal.SIGTERM)  # raised inside the callback: swallowed

    sent = []
    with Interrupts().installed() as interrupts:
        gc.callbacks.append(interrupt_once)
        try:
            with pytest.raises(KeyboardInterrupt):
                gc.collect()
                len([])  # the next call
        finally:
            gc.callbacks.remove(interrupt_once)
    assert sent and interrupts.status() == 143
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_an_interrupt_c_code_reported_as_a_system_error_is_raised_again(capsys):
    """C code calling Python when the signal came reports a SystemError caused by the
    KeyboardInterrupt to sys.unraisablehook: it is not printed, and the interrupt is raised."""
    from keras_vit_cli.interrupts import Interrupts

    with Interrupts().installed() as interrupts:
        with pytest.raises(KeyboardInterrupt):
            try:
                signal.raise_signal(signal.SIGINT)
                len([])
            except KeyboardInterrupt as interrupt:
                error = SystemError("<built-in function __import__> returned a result with "
                                    "an exception set")
                error.__cause__ = interrupt
                interrupts._raised = False  # as when a callback swallowed it
                sys.unraisablehook(types.SimpleNamespace(
                    exc_type=SystemError, exc_value=error, exc_traceback=None, err_msg=None,
                    object=None))
            len([])  # the next call
    assert interrupts.status() == 130
    assert "SystemError" not in capsys.readouterr().err


def test_a_signal_a_library_turned_into_another_error_still_ends_with_its_status(capsys):
    """A library that catches the KeyboardInterrupt half-way fails on its own broken state
    (TensorFlow's SavedModel writer raises AttributeError): the command reports the signal."""
    import argparse

    from keras_vit_cli.interrupts import Interrupts

    def run(args):
        try:
            signal.raise_signal(signal.SIGTERM)
            len([])
        except KeyboardInterrupt:
            raise AttributeError("'NoneType' object has no attribute '_type_spec'") from None

    args = argparse.Namespace(command="export", debug=False, run=run, check=None)
    with Interrupts().installed() as interrupts:
        status = cli._run(args, interrupts)
    assert status == 143
    assert capsys.readouterr().err.splitlines() == ["keras-vit export: terminated"]


# --------------------------------------------------------------------------------------------
# Numbers out of range: refused by the flag's parser, naming the flag and the range.


def usage_error(capsys, argv):
    """argparse's error for `argv`: its last line, after the exit with status 2."""
    with pytest.raises(SystemExit) as exit_:
        cli.main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize("argv, phrase", [
    (["train", "--weight-decay", "nan"], "argument --weight-decay: expected a finite number in "
                                         "[0, inf). Received: 'nan'"),
    (["train", "--weight-decay", "-1"], "argument --weight-decay: expected a finite number"),
    (["train", "--label-smoothing", "1"], "argument --label-smoothing: expected a finite number "
                                          "in [0, 1)"),
    (["train", "--lr", "inf"], "argument --lr: expected a finite number in (0, inf)"),
    (["pretrain", "--lr", "0"], "argument --lr: expected a finite number in (0, inf)"),
    (["pretrain", "--mask-rate", "nan"], "argument --mask-rate: expected a finite number in "
                                         "(0, 1)"),
    (["fewshot", "--l2", "-1"], "argument --l2: expected a finite number in (0, inf). "
                                "Received: '-1'"),
    (["fewshot", "--l2", "1e-3,nan"], "argument --l2: expected a finite number in (0, inf). "
                                      "Received: 'nan'"),
    (["vtab", "--sweep-lr", "0.01,inf"], "argument --sweep-lr: expected a finite number"),
    (["vtab", "--lr", "-0.01"], "argument --lr: expected a finite number in (0, inf)"),
    (["train", "--seed", "-1"], "argument --seed: expected a non-negative integer. "
                                "Received: '-1'"),
    (["vtab", "--seed", str(2**32)], "argument --seed: expected a non-negative integer up to "
                                     "4294967295"),
    (["train", "--warmup-steps", "-5"], "argument --warmup-steps: expected a non-negative "
                                        "integer"),
    (["export", "out", "--version", str(2**63)], "argument --version: expected a non-negative "
                                                 "integer up to 9223372036854775807"),
    (["export", "out", "--version", "-1"], "argument --version: expected a non-negative integer"),
    (["train", "--batch-size", str(10**30)], "argument --batch-size: expected a positive integer "
                                             "up to"),
])
def test_out_of_range_numbers_are_refused_naming_the_flag(capsys, argv, phrase):
    assert phrase in usage_error(capsys, argv)


def test_recipes_and_fewshot_refuse_out_of_range_numbers():
    import keras_vit
    from keras_vit import evaluation, training

    model = keras_vit.ViT(image_size=16, patch_size=8, hidden_size=8, num_layers=1, num_heads=2,
                          mlp_dim=8, num_classes=3)
    for recipe in ("finetune", "pretrain"):
        with pytest.raises(ValueError,
                           match=r"`weight_decay` must be a number in \[0, 3.40282e\+38\]"):
            training.compile_recipe(model, recipe, 10, weight_decay=float("nan"))
        with pytest.raises(ValueError, match=r"`label_smoothing` must be a number in \[0, 1\)"):
            training.compile_recipe(model, recipe, 10, label_smoothing=-1.0)
    with pytest.raises(ValueError, match="`weight_decay` must be a number"):
        training.pretrain_optimizer(weight_decay=-1.0)
    rng = np.random.default_rng(0)
    features, labels = rng.normal(size=(12, 4)), np.arange(12) % 3
    for bad in (-1.0, 0.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=r"`l2_regs` must be a number in \(0, inf\)"):
            evaluation.fewshot_table(features, labels, features, labels, shots=(2,),
                                     l2_regs=(1.0, bad))


# --------------------------------------------------------------------------------------------
# Paths of the wrong kind, sources and arguments that name nothing keras_vit reads.


def one_error(capsys, argv):
    """The one `keras-vit CMD: error: ...` line of a command that exits with status 2."""
    status = cli.main([str(a) for a in argv])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert status == 2 and len(lines) == 1 and "Traceback" not in err, (status, err)
    assert lines[0].startswith(f"keras-vit {argv[0]}: error: ")
    return lines[0]


def test_output_paths_of_the_wrong_kind_are_named(tmp_path, capsys, image_folder):
    folder = tmp_path / "x.tflite"
    (folder / "inside").mkdir(parents=True)
    (tmp_path / "dir.npz").mkdir()
    file = tmp_path / "file"
    file.write_text("mine")
    cases = [
        (["export", folder, "--weights", "digits", "--format", "tflite"],
         f"OUTPUT {folder} is a folder; expected a file path for the TFLite file."),
        (["convert", "digits", tmp_path / "dir.npz"],
         f"OUT {tmp_path / 'dir.npz'} is a folder; expected a file path for the .npz file."),
        (["train", "--model-config", TINY_JSON, "--folder", image_folder, "--output", file],
         f"--output {file} is a file; expected a folder (or a new name) for the run."),
        (["evaluate", "--weights", "digits", "--folder", image_folder, "--out", file],
         f"--out {file} is a file; expected a folder (or a new name) for the reports."),
    ]
    for argv, message in cases:
        assert one_error(capsys, argv).endswith(message)
    assert os.listdir(folder) == ["inside"] and not os.listdir(tmp_path / "dir.npz")
    assert file.read_text() == "mine"


def test_convert_reads_a_keras_model(tmp_path, capsys):
    from keras_vit import weights

    assert cli.main(["convert", "digits", str(tmp_path / "m.keras")]) == 0
    assert cli.main(["convert", str(tmp_path / "m.keras"), str(tmp_path / "o.npz")]) == 0
    shipped, _ = weights.fetch_params("digits")
    converted = weights.read_npz(tmp_path / "o.npz")
    assert sorted(converted) == sorted(shipped)
    for key, value in shipped.items():
        np.testing.assert_array_equal(converted[key], value, err_msg=key)
    capsys.readouterr()
    assert "--model and --model-config do not apply" in one_error(
        capsys, ["convert", tmp_path / "m.keras", tmp_path / "p.npz", "--model", "B/16"])


def test_unsupported_url_schemes_are_named(capsys, image_folder):
    import keras_vit

    message = ("Checkpoint source ftp://host/x.npz: unsupported URL scheme 'ftp'; expected a "
               "local path, file://, http(s)://, hf:// or kaggle://.")
    assert one_error(capsys, ["predict", "--weights", "ftp://host/x.npz",
                              image_folder / "c0" / "0.png"]).endswith(message)
    with pytest.raises(ValueError, match="unsupported URL scheme 's3'"):
        keras_vit.from_pretrained("s3://bucket/x.npz")


def test_library_arguments_that_name_nothing_are_refused():
    import keras_vit
    from keras_vit import data, export

    with pytest.raises(ValueError, match="pretrained=True is not understood. Expected a "
                                         "registry name"):
        keras_vit.from_pretrained(True)
    with pytest.raises(ValueError, match=r"`images` holds no images \(shape \(0, 16, 16, 3\)\)"):
        data.from_arrays(np.zeros((0, 16, 16, 3), np.uint8), np.zeros((0,), int),
                         image_size=16, batch_size=2, training=False)
    with pytest.raises(ValueError, match="'digits' is a built-in registry entry. Expected "
                                         "another name, or overwrite=True"):
        keras_vit.register_checkpoint("digits", "file:///nowhere/x.npz")
    assert keras_vit.weights.get_checkpoint("digits")["file"]  # still the shipped file
    with pytest.raises(ValueError, match=r"class_names\[0\] is '', an empty name"):
        keras_vit.labels.check_class_names([""] * 10, 10)


# --------------------------------------------------------------------------------------------
# What the fuzzer (tests/test_fuzz_cli.py) found.


def test_a_class_names_folder_is_one_line(capsys, image_folder):
    image = image_folder / "c0" / "0.png"
    assert one_error(capsys, ["predict", "--weights", "digits", "--class-names", image_folder,
                              image]).endswith(
        f"--class-names {image_folder} is a folder. Expected a UTF-8 text file with one class "
        "name a line.")


def test_out_of_memory_is_the_users_to_fix():
    import tensorflow as tf

    from keras_vit_cli.errors import describe

    oom = tf.errors.ResourceExhaustedError(None, None, "{{function_node Fill}} OOM when "
                                           "allocating tensor with shape[8,1099511627776] and "
                                           "type float on /job:localhost")
    assert describe(oom) == ("out of memory allocating tensor with shape[8,1099511627776]. "
                             "Expected a smaller model, image size, number of classes or batch "
                             "size.", 2)
    assert describe(MemoryError())[0].startswith("out of memory. Expected a smaller model")


def test_a_keras_file_that_is_no_image_classifier_or_nested_too_deeply_is_named(tmp_path,
                                                                                  capsys):
    import zipfile

    import keras

    vectors = keras.Sequential([keras.Input((7,)), keras.layers.Dense(2)])
    vectors.save(tmp_path / "vectors.keras")
    Image.fromarray(np.zeros((16, 16, 3), np.uint8)).save(tmp_path / "x.png")
    line = one_error(capsys, ["predict", tmp_path / "x.png", "--model", tmp_path / "vectors.keras"])
    assert f"--model {tmp_path / 'vectors.keras'} takes [(None, 7)]" in line
    assert "Expected an image classifier" in line
    with zipfile.ZipFile(tmp_path / "vectors.keras") as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    members["config.json"] = b"[" * 50_000
    with zipfile.ZipFile(tmp_path / "deep.keras", "w") as archive:
        for name, content in members.items():
            archive.writestr(name, content)
    line = one_error(capsys, ["predict", tmp_path / "x.png", "--model", tmp_path / "deep.keras"])
    assert f"{tmp_path / 'deep.keras'} is not a readable .keras model" in line


def hang_up_during_a_command(sighup_action):
    """An export command that receives SIGHUP, run with SIGHUP's action set to
    `sighup_action` as the caller would leave it (the default, or ignored under nohup); its
    exit status, and SIGHUP's action after it (the previous one restored afterwards)."""
    import argparse

    from keras_vit_cli.interrupts import Interrupts

    def run(args):
        signal.raise_signal(signal.SIGHUP)
        len([])
        return 0

    args = argparse.Namespace(command="export", debug=False, run=run, check=None)
    previous = signal.signal(signal.SIGHUP, sighup_action)
    try:
        with Interrupts().installed() as interrupts:
            status = cli._run(args, interrupts)
        return status, signal.getsignal(signal.SIGHUP)
    finally:
        signal.signal(signal.SIGHUP, previous)


def test_a_hang_up_ends_a_command_as_a_termination_does(capsys):
    """SIGHUP (a closed terminal or session) ends a command with one line and status 129,
    through the same handler as SIGTERM (what it was writing removed by its own code)."""
    assert hang_up_during_a_command(signal.SIG_DFL) == (129, signal.SIG_DFL)
    assert capsys.readouterr().err.splitlines() == ["keras-vit export: hung up"]


def test_a_command_under_nohup_goes_on_after_a_hang_up(capsys):
    """A hang-up that the caller ignores (nohup) stays ignored: the command goes on."""
    assert hang_up_during_a_command(signal.SIG_IGN) == (0, signal.SIG_IGN)
    assert capsys.readouterr().err == ""


def test_an_error_quoting_a_huge_argument_is_one_bounded_line(capsys):
    from keras_vit_cli.errors import MAX_LINE

    assert cli.main(["checkpoints", "a" * 100_000]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and len(err) < MAX_LINE + 100
    assert err.startswith("keras-vit checkpoints: error: No checkpoint's name")
    assert err.rstrip().endswith("lists them all.")  # what was expected survives


def test_an_address_space_limit_while_tensorflow_loads_is_one_line_about_memory(tmp_path):
    import resource
    import subprocess

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (600 * 2**20, resource.RLIM_INFINITY))

    Image.fromarray(np.zeros((16, 16, 3), np.uint8)).save(tmp_path / "x.png")
    (tmp_path / "m.keras").write_bytes(b"not read: TensorFlow does not start")
    command = "import sys, keras_vit_cli; sys.exit(keras_vit_cli.main(sys.argv[1:]))"  # keras-vit
    done = subprocess.run([sys.executable, "-c", command, "predict", str(tmp_path / "x.png"),
                           "--model", str(tmp_path / "m.keras")], capture_output=True,
                          text=True, timeout=300, preexec_fn=limit,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    lines = [line for line in done.stderr.splitlines() if line.startswith("keras-vit")]
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-2000:]
    assert "not enough memory to load a library" in lines[0] and "ulimit -v" in lines[0]
    assert "internal error" not in done.stderr


@pytest.mark.parametrize("argv", [["--help"], ["predict", "--help"]])
def test_help_to_a_full_stdout_is_one_error_line(tmp_path, argv):
    with open("/dev/full", "w") as full:
        run = keras_vit(*argv, cwd=tmp_path, stdout=full, stderr=subprocess.PIPE)
        status, _, err = finished(run)
    assert status == 2
    assert err.splitlines() == ["keras-vit: error: cannot write to standard output: No space "
                                "left on device"]


def test_output_in_an_encoding_without_the_class_names_characters_is_escaped(
        tmp_path, monkeypatch, capsys):
    """PYTHONIOENCODING=ascii: a class name with é is printed escaped, not a codec error. Run
    in-process on a standard output that is what Python opens with that setting (ASCII,
    strict): the stream is the subject, not the interpreter that made it."""
    Image.fromarray(np.zeros((16, 16, 3), np.uint8)).save(tmp_path / "x.png")
    (tmp_path / "names.txt").write_text("café\nb\nc\n", encoding="utf-8")
    config = json.dumps(dict(image_size=16, patch_size=8, hidden_size=8, num_layers=1,
                             num_heads=2, mlp_dim=8, num_classes=3))
    monkeypatch.chdir(tmp_path)
    stdout = io.TextIOWrapper(io.BytesIO(), encoding="ascii", errors="strict")
    monkeypatch.setattr(sys, "stdout", stdout)
    status = cli.main(["predict", "x.png", "--model-config", config, "--class-names",
                       "names.txt", "--top-k", "3"])
    assert status == 0, capsys.readouterr().err[-2000:]
    stdout.flush()
    assert b"caf\\xe9" in stdout.buffer.getvalue()


def test_convert_to_weights_h5_names_the_preprocessing_it_leaves_behind(tmp_path, capsys):
    """A .weights.h5 file holds weights only: the model that loads them must be built with
    their data config, which the command names (a .keras file holds it)."""
    import keras_vit

    imagenet = dict(input_size=[3, 16, 16], interpolation="bicubic", crop_pct=0.875,
                    crop_mode="center", mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    source = keras_vit.ViT(image_size=16, patch_size=8, hidden_size=8, num_layers=1,
                           num_heads=2, mlp_dim=8, num_classes=3, data_config=imagenet)
    source.save(tmp_path / "m.keras")
    assert cli.main(["convert", str(tmp_path / "m.keras"), str(tmp_path / "m.weights.h5")]) == 0
    out = capsys.readouterr().out
    assert "note: " in out and "holds the weights only" in out
    assert '"crop_pct": 0.875, "crop_mode": "center", "mean": [0.485, 0.456, 0.406]' in out
    rebuilt = keras_vit.ViT(**keras_vit.vit_config(source), data_config=source.data_config)
    rebuilt.load_weights(tmp_path / "m.weights.h5")
    assert rebuilt.data_config == source.data_config
    assert cli.main(["convert", "digits", str(tmp_path / "d.weights.h5")]) == 0
    assert "note: " not in capsys.readouterr().out  # the paper's preprocessing
