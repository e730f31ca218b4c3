"""The command line's consistency: input files and folders are checked before TensorFlow starts
(each command's `check(args)`), every flag has help, the offline message names the flag, top-5
accuracy only where it means something, and keras_vit's namespace holds its public API only."""

import argparse
import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
TINY = dict(image_size=16, patch_size=8, hidden_size=8, num_layers=1, num_heads=2, mlp_dim=8)
TINY_JSON = json.dumps(TINY)
# Runs keras_vit_cli.main on the arguments in a fresh interpreter and fails (exit 3) if
# TensorFlow was imported on the way.
NO_TENSORFLOW = ("import sys, keras_vit_cli; code = keras_vit_cli.main(sys.argv[1:]); "
                 "sys.exit(3 if 'tensorflow' in sys.modules else code)")


def _env():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    env.pop("KERAS_BACKEND", None)
    return env


def _run(args, cwd, module=False):
    command = ["-m", "keras_vit_cli"] if module else ["-c", NO_TENSORFLOW]
    return subprocess.run([sys.executable, *command, *map(str, args)], cwd=cwd, env=_env(),
                          capture_output=True, text=True, timeout=120)


def _image(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    # A valid PNG header is enough: the checks never read an image.
    path.write_bytes(b"\x89PNG\r\n\x1a\n")
    return path


def test_predict_of_a_missing_image_exits_2_in_one_line_without_tensorflow(tmp_path):
    done = _run(["predict", "nothere.jpg"], tmp_path, module=True)
    assert done.returncode == 2, done.stderr
    assert done.stderr == "keras-vit predict: error: Image file nothere.jpg does not exist.\n"
    done = _run(["predict", "nothere.jpg"], tmp_path)
    assert done.returncode == 2, "TensorFlow was imported" if done.returncode == 3 else done
    assert done.stderr == "keras-vit predict: error: Image file nothere.jpg does not exist.\n"


# (command line, the message it gives), run in a folder holding img.png and an image folder
# `classes` (its classes c0 and c1 each hold img.png).
MISSING = {
    "predict --weights": (["predict", "img.png", "--weights", "nothere.npz"],
                          "No checkpoint file at nothere.npz."),
    "predict --weights ~": (["predict", "img.png", "--weights", "~/nothere/w.npz"],
                            f"No checkpoint file at {os.path.expanduser('~/nothere/w.npz')}."),
    "predict --weights safetensors": (["predict", "img.png", "--weights", "w.safetensors"],
                                      "No checkpoint file at w.safetensors."),
    "predict --model": (["predict", "img.png", "--model", "nothere.keras"],
                        "--model nothere.keras: no such file."),
    "predict --class-names": (["predict", "img.png", "--model-config", TINY_JSON,
                               "--class-names", "names.txt"],
                              "Class-names file names.txt does not exist."),
    "predict --class-names folder": (["predict", "img.png", "--model-config", TINY_JSON,
                                      "--class-names", "."],
                                     "--class-names . is a folder. Expected a UTF-8 text file "
                                     "with one class name a line."),
    "predict folder image": (["predict", "."], "is a folder. Expected image files"),
    "inspect": (["inspect", "img.png", "nothere.png", "--out", "figures"],
                "Image file nothere.png does not exist."),
    "inspect --weights": (["inspect", "img.png", "--out", "figures", "--weights", "./w"],
                          "No checkpoint file at ./w."),
    "train --folder": (["train", "--folder", "photos", "--output", "run",
                        "--model-config", TINY_JSON],
                       "Image folder 'photos' does not exist or is not a directory."),
    "train --weights": (["train", "--folder", "classes", "--output", "run", "--weights", "w.npz"],
                        "No checkpoint file at w.npz."),
    "evaluate --folder": (["evaluate", "--folder", "photos", "--model-config", TINY_JSON],
                          "Image folder 'photos' does not exist or is not a directory."),
    "evaluate --class-names": (["evaluate", "--folder", "classes", "--model-config", TINY_JSON,
                                "--class-names", "names.txt"],
                               "Class-names file names.txt does not exist."),
    "fewshot --folder": (["fewshot", "--folder", "photos", "--model-config", TINY_JSON],
                         "Image folder 'photos' does not exist or is not a directory."),
    "pretrain --folder": (["pretrain", "--folder", "photos", "--output", "run",
                           "--model-config", TINY_JSON],
                          "Image folder 'photos' does not exist or is not a directory."),
    "convert SOURCE npz": (["convert", "nothere.npz", "out.npz"],
                           "No checkpoint file at nothere.npz."),
    "convert SOURCE keras": (["convert", "nothere.keras", "out.npz"],
                             "--model nothere.keras: no such file."),
    "export --weights": (["export", "served", "--weights", "nothere.npz"],
                         "No checkpoint file at nothere.npz."),
    "export --class-names": (["export", "served", "--model-config", TINY_JSON,
                              "--class-names", "names.txt"],
                             "Class-names file names.txt does not exist."),
    "vtab --model": (["vtab", "--output", "suite", "--model", "vit.keras"],
                     "--model vit.keras: no such file."),
    # Flags that contradict each other come first, as they did when TensorFlow started first.
    "predict --weights default with a .keras --model": (
        ["predict", "nothere.png", "--model", "m.keras", "--weights", "default"],
        "--weights default needs a variant --model; a .keras file holds its own weights."),
    "convert SOURCE keras with --model": (
        ["convert", "nothere.keras", "out.npz", "--model", "B/16"],
        "SOURCE nothere.keras is a saved model; --model and --model-config do not apply to it."),
    # Input files that are not regular files (reading a FIFO waits forever).
    "predict --class-names FIFO": (["predict", "img.png", "--model-config", TINY_JSON,
                                    "--class-names", "fifo"],
                                   "--class-names fifo is not a regular file (a FIFO, socket or "
                                   "device)"),
    "predict FIFO image": (["predict", "img.png", "fifo", "--model-config", TINY_JSON],
                           "Image file fifo is not a regular file"),
    # Links to no file: named as links, with the reason (a loop of links exists, in a way).
    "predict looping link": (["predict", "loop_a", "--model-config", TINY_JSON],
                             "Image file loop_a is a symbolic link to nothing readable (Too many "
                             "levels of symbolic links)."),
    "predict dangling link": (["predict", "dangling.png", "--model-config", TINY_JSON],
                              "Image file dangling.png is a symbolic link to nothing readable "
                              "(No such file or directory)."),
    # Output destinations, by keras_vit.fileio's rules.
    "export OUTPUT file": (["export", "afile", "--model-config", TINY_JSON],
                           "OUTPUT afile is a file; expected a folder (or a new name) for the "
                           "SavedModel's version folders."),
    "export tflite OUTPUT folder": (["export", "classes", "--format", "tflite",
                                     "--model-config", TINY_JSON],
                                    "OUTPUT classes is a folder; expected a file path for the "
                                    "TFLite file."),
    "export tflite OUTPUT exists": (["export", "old.tflite", "--format", "tflite",
                                     "--model-config", TINY_JSON],
                                    "old.tflite already exists. Nothing was written; pass "
                                    "overwrite=True (--overwrite) to replace it"),
    "export OUTPUT below a file": (["export", "afile/sub", "--model-config", TINY_JSON],
                                   "OUTPUT afile/sub lies below "),  # names the file
    "convert OUT below a file": (["convert", "digits", "afile/x/m.npz"],
                                 "OUT afile/x/m.npz lies below "),
    "convert OUT exists": (["convert", "digits", "old.npz"], "old.npz already exists."),
    "convert OUT folder": (["convert", "digits", "folder.npz"],
                           "OUT folder.npz is a folder; expected a file path for the .npz file."),
    "inspect --out file": (["inspect", "img.png", "--out", "afile", "--model-config", TINY_JSON],
                           "--out afile is a file; expected a folder (or a new name) for the "
                           "figures."),
    "evaluate --out file": (["evaluate", "--folder", "classes", "--out", "afile",
                             "--model-config", TINY_JSON],
                            "--out afile is a file; expected a folder"),
    "train --output file": (["train", "--folder", "classes", "--output", "afile",
                             "--model-config", TINY_JSON],
                            "--output afile is a file; expected a folder (or a new name) for "
                            "the run."),
    "pretrain --output file": (["pretrain", "--folder", "classes", "--output", "afile",
                                "--model-config", TINY_JSON],
                               "--output afile is a file"),
    "vtab --output file": (["vtab", "--output", "afile", "--model-config", TINY_JSON],
                           "--output afile is a file; expected a folder (or a new name) for "
                           "the suite."),
    "fewshot --cache file": (["fewshot", "--folder", "classes", "--cache", "afile",
                              "--model-config", TINY_JSON],
                             "--cache afile is a file"),
    "inspect --out empty": (["inspect", "img.png", "--out", "", "--model-config", TINY_JSON],
                            "--out is empty; expected a folder for the figures."),
    "evaluate --out empty": (["evaluate", "--folder", "classes", "--out", "",
                              "--model-config", TINY_JSON],
                             "--out is empty; expected a folder for the reports."),
    "export tflite OUTPUT empty": (["export", "", "--format", "tflite", "--model-config",
                                    TINY_JSON],
                                   "OUTPUT is empty; expected a file path for the TFLite file."),
    # Flag values that need no TensorFlow to check.
    "fewshot --split of no folder split": (["fewshot", "--folder", "classes", "--split", "BAD",
                                            "--model-config", TINY_JSON],
                                           "--split 'BAD' is not a split of the image folder "
                                           "classes. Expected validation (its held-out 10%; "
                                           "also test) or train."),
    "vtab --sweep-lr without --sweep": (["vtab", "--output", "suite", "--model-config",
                                          TINY_JSON, "--sweep-lr", "0.5,0.7"],
                                         "--sweep-lr applies to a sweep: add --sweep, or "
                                         "leave it out."),
    "vtab --sweep-lr twice": (["vtab", "--output", "suite", "--model-config", TINY_JSON,
                               "--sweep", "--sweep-lr", "0.01,0.01"],
                              "--sweep-lr names a value twice (0.01,0.01). Expected each once."),
    "predict unknown variant": (["predict", "img.png", "--model", "B/17"],
                                "Unknown ViT variant 'B/17'. Expected one of Ti/16"),
    "predict --model-config unknown key": (["predict", "img.png", "--model-config",
                                            '{"hiden_size": 8}'],
                                           "--model-config: unknown keys ['hiden_size']. "
                                           "Expected keras_vit.ViT arguments: "),
    "train --precision": (["train", "--folder", "classes", "--output", "run",
                           "--model-config", TINY_JSON, "--precision", "float8"],
                          "--precision 'float8' is not one of float32, bfloat16, float16."),
    "train --strategy": (["train", "--folder", "classes", "--output", "run",
                          "--model-config", TINY_JSON, "--strategy", "gpu"],
                         "--strategy 'gpu' is not one of auto, tpu, mirrored, multiworker, "
                         "cpu."),
    "train --validation-split with --folder": (
        ["train", "--folder", "classes", "--output", "run", "--model-config", TINY_JSON,
         "--validation-split", "test"],
        "--validation-split 'test' with --folder: expected 'validation'"),
    "vtab --precision": (["vtab", "--output", "suite", "--model-config", TINY_JSON,
                          "--precision", "half"], "--precision 'half' is not one of"),
    "vtab --target-batch-size": (["vtab", "--output", "suite", "--model-config", TINY_JSON,
                                  "--batch-size", "64", "--target-batch-size", "100"],
                                 "--target-batch-size 100 is not a multiple of --batch-size 64."),
    "evaluate --split of a folder": (["evaluate", "--folder", "classes", "--split", "val",
                                      "--model-config", TINY_JSON],
                                     "Split 'val' is not a split of the image folder classes."),
    "evaluate --strategy": (["evaluate", "--folder", "classes", "--strategy", "x",
                             "--model-config", TINY_JSON], "--strategy 'x' is not one of"),
    "fewshot --shots": (["fewshot", "--folder", "classes", "--shots", "1,0",
                         "--model-config", TINY_JSON],
                        "--shots must be positive integers separated by commas."),
    "fewshot --split overlaps": (["fewshot", "--folder", "classes", "--split", "train",
                                  "--model-config", TINY_JSON],
                                 "--split train overlaps --train-split train"),
}


@pytest.mark.parametrize("case", list(MISSING))
def test_missing_inputs_are_refused_before_tensorflow_starts(tmp_path, case):
    argv, message = MISSING[case]
    _image(tmp_path / "img.png")
    _image(tmp_path / "classes" / "c0" / "img.png")
    _image(tmp_path / "classes" / "c1" / "img.png")
    for name in ("afile", "old.tflite", "old.npz"):
        (tmp_path / name).write_bytes(b"kept")
    (tmp_path / "folder.npz").mkdir()
    os.mkfifo(tmp_path / "fifo")
    os.symlink("loop_b", tmp_path / "loop_a")
    os.symlink("loop_a", tmp_path / "loop_b")
    os.symlink("nothere.png", tmp_path / "dangling.png")
    before = sorted(os.listdir(tmp_path))
    done = _run(argv, tmp_path)
    assert done.returncode != 3, f"{case}: TensorFlow was imported before the check"
    assert done.returncode == 2, done.stderr
    command = argv[0]
    assert done.stderr.startswith(f"keras-vit {command}: error: "), done.stderr
    assert message in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert sorted(os.listdir(tmp_path)) == before  # no output folder left behind
    assert all((tmp_path / name).read_bytes() == b"kept"
               for name in ("afile", "old.tflite", "old.npz"))


def test_registry_names_and_urls_are_left_to_the_library():
    from keras_vit_cli import preflight
    from keras_vit_cli.catalog import registry_entries

    for source in ("default", "digits", "https://example.com/w.npz", "file:///x/w.npz",
                   "hf://timm/vit_tiny", "imagenet21k/ViT-B_16", "not-a-name"):
        preflight.check_model_paths(argparse.Namespace(model=None, weights=source))
    for entry in registry_entries():
        preflight.check_model_paths(argparse.Namespace(model="B/16", weights=entry["name"]))


def test_existing_inputs_pass_the_checks(tmp_path):
    from keras_vit_cli import preflight

    (tmp_path / "w.npz").write_bytes(b"")
    (tmp_path / "m.keras").write_bytes(b"")
    (tmp_path / "names.txt").write_text("a\n")
    args = argparse.Namespace(model=str(tmp_path / "m.keras"), weights=str(tmp_path / "w.npz"),
                              class_names=str(tmp_path / "names.txt"), folder=str(tmp_path))
    preflight.check_model_paths(args)
    preflight.check_class_names_file(args)
    preflight.check_data_folder(args)


def test_unreadable_inputs_are_refused_before_anything_is_read(tmp_path, monkeypatch):
    from keras_vit_cli import preflight

    for name in ("img.png", "w.npz", "m.keras", "names.txt"):
        (tmp_path / name).write_bytes(b"x")
    # This suite may run as root, who reads any file: the process is told it may not.
    monkeypatch.setattr(preflight.os, "access", lambda path, mode: False)
    with pytest.raises(PermissionError, match=r"Image file .*img.png cannot be read"):
        preflight.check_images_exist([str(tmp_path / "img.png")])
    for check, args, phrase in [
            (preflight.check_model_paths, dict(model=None, weights=str(tmp_path / "w.npz")),
             "checkpoint file .*w.npz"),
            (preflight.check_model_paths, dict(model=str(tmp_path / "m.keras"), weights=None),
             "--model .*m.keras"),
            (preflight.check_class_names_file, dict(class_names=str(tmp_path / "names.txt")),
             "Class-names file .*names.txt")]:
        with pytest.raises(PermissionError, match=phrase + " cannot be read"):
            check(argparse.Namespace(**args))
    with pytest.raises(PermissionError, match="Image folder .* cannot be read"):
        preflight.check_data_folder(argparse.Namespace(folder=str(tmp_path)))


def test_the_lists_read_without_tensorflow_are_the_library_s():
    """The command line reads these from the library's source (`catalog.library_names`,
    `library_arguments`) to check flags before TensorFlow starts: they are the live values."""
    import inspect

    from keras_vit import execution
    from keras_vit.model import ViT
    from keras_vit.parallel import tf_distribute
    from keras_vit_cli.catalog import library_arguments, library_names

    assert library_names("execution.py", "PRECISIONS") == tuple(execution.PRECISIONS)
    assert library_names("parallel/tf_distribute.py", "STRATEGIES") == tf_distribute.STRATEGIES
    parameters = inspect.signature(ViT).parameters.values()
    assert library_arguments("model.py", "ViT") == tuple(
        p.name for p in parameters if p.kind is not p.VAR_KEYWORD)
    with pytest.raises(LookupError):
        library_names("execution.py", "NOT_THERE")


def test_every_option_of_every_command_has_help():
    import keras_vit_cli

    missing = []
    for name in keras_vit_cli.COMMANDS:
        parser = keras_vit_cli.build_parser([name])
        commands = next(action for action in parser._actions
                        if isinstance(action, argparse._SubParsersAction))
        for parser_ in (parser, commands.choices[name]):
            for action in parser_._actions:
                if not (action.help or "").strip() or action.help == argparse.SUPPRESS:
                    missing.append(f"{name}: {'/'.join(action.option_strings) or action.dest}")
    assert not missing, f"options without help: {missing}"


def test_the_offline_message_names_the_flag_and_the_argument(tmp_path):
    from keras_vit.weights import DownloadError, download

    missing = (tmp_path / "gone.npz").as_uri()
    with pytest.raises(DownloadError) as raised:
        download.download(missing, str(tmp_path / "cache" / "gone.npz"), progress=False)
    message = str(raised.value)
    assert "--weights PATH" in message and "pretrained=PATH" in message, message
    assert "\n" not in message


def test_keras_vit_namespace_holds_the_public_api_only():
    import keras_vit

    extra = [name for name in dir(keras_vit) if not name.startswith("_")
             and name not in keras_vit.__all__
             and importlib.util.find_spec(f"keras_vit.{name}") is None]
    assert not extra, f"not in keras_vit.__all__ and not a submodule: {extra}"
    assert "importlib" not in dir(keras_vit) and "warnings" not in dir(keras_vit)


def _classifier(num_classes):
    import keras_vit

    model = keras_vit.ViT(**TINY, num_classes=num_classes)
    head = model.get_layer("head")
    kernel, bias = head.get_weights()
    rng = np.random.default_rng(0)
    head.set_weights([rng.normal(size=kernel.shape).astype("float32"), bias])
    return model


@pytest.mark.parametrize("num_classes, has_top5", [(4, False), (5, False), (6, True)])
def test_top5_is_reported_for_more_than_5_classes_only(num_classes, has_top5):
    import keras_vit

    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (8, 16, 16, 3)).astype(np.uint8)
    labels = np.arange(8) % num_classes
    report = keras_vit.evaluate(_classifier(num_classes), (images, labels), progress=False)
    assert (report["top5"] is not None) == has_top5
    if has_top5:
        assert 0 <= report["top5"] <= 1


def test_evaluate_command_leaves_top5_out_for_4_classes(tmp_path, capsys):
    import keras_vit_cli
    from keras_vit import weights
    from PIL import Image

    rng = np.random.default_rng(2)
    for c in range(4):
        for i in range(2):
            path = tmp_path / "images" / f"c{c}" / f"{i}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(path)
    weights.save_npz(_classifier(4), tmp_path / "tiny.npz")
    common = ["evaluate", "--folder", str(tmp_path / "images"), "--model-config", TINY_JSON,
              "--weights", str(tmp_path / "tiny.npz"), "--batch-size", "4", "--verbose", "0"]
    assert keras_vit_cli.main(common) == 0
    table = capsys.readouterr().out
    assert "top-1 accuracy" in table and "top-5" not in table, table
    assert keras_vit_cli.main([*common, "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert "top5" in result and result["top5"] is None, result


def test_digits_demo_says_truthfully_how_its_checkpoint_relates_to_the_shipped_one():
    sys.path.insert(0, str(ROOT / "examples"))
    import train_digits
    from keras_vit import data

    shipped = train_digits.sha256(train_digits.SHIPPED)
    line = train_digits.compare_with_shipped(shipped, [], None, None)
    assert line == f"identical to the shipped {train_digits.SHIPPED_NAME}"
    line = train_digits.compare_with_shipped("0" * 64, ["--epochs"], None, None)
    assert "the default settings train (changed here: --epochs)" in line
    images, labels = train_digits.digits_rgb()
    _, x_test, _, y_test = train_digits.split(images, labels)
    test = data.from_arrays(x_test, y_test, num_classes=10, image_size=16, batch_size=360,
                            training=False)
    line = train_digits.compare_with_shipped("0" * 64, [], test, y_test)
    # The same settings on another machine: other weights, and the shipped model's score on
    # the same held-out digits (97.5%, as the README and the evaluation guide say).
    assert "the same settings trained on another machine" in line
    assert "the shipped model scores 0.9750 on the same held-out digits" in line, line
