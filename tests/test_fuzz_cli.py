"""Property-based fuzzing of real command lines: each command's own flags with values drawn
from hostile sets (negative, zero, NaN, infinities, huge integers, empty strings, paths that do
not exist, folders, files, unicode, line breaks), run in-process by `keras_vit_cli.main`.

Every outcome is exit 0, or exit 2 with one `keras-vit CMD: error: ...` line (argparse's usage
lines before it for a usage error, a checkpoint's indented list of mismatches after it); never
a traceback or an internal error, and the input files are unchanged."""

import hashlib
import json
import os
import pathlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

import keras_vit_cli as cli

TINY = dict(image_size=16, patch_size=8, hidden_size=8, num_layers=1, num_heads=2, mlp_dim=8)
TINY_JSON = json.dumps(TINY)

# Placeholders a drawn argument list names paths with; `Workspace.resolve` replaces them.
MISSING, FOLDER, IMAGE, NPZ, NEW = "<missing>", "<folder>", "<image>", "<npz>", "<new>"
NUMBERS = ["-1", "0", "1", "2", "nan", "inf", "-inf", "1e309", "-0", "0.5", "1e-300",
           str(2**63), str(2**64), "99999999999999999999", "3.5"]
TEXT = ["", " ", "é☃名", "a\nb", "--", "\x7f", "x" * 300, "%s%n", "../..", "~"]
PATHS = [MISSING, FOLDER, IMAGE, NPZ, NEW]
HOSTILE = NUMBERS + TEXT + PATHS

MODEL_FLAGS = {
    "--model": ["Q/99", "x.keras", MISSING, FOLDER, IMAGE, NPZ] + TEXT,
    "--model-config": [TINY_JSON, "{}", "[]", "nan", '{"patch_size": 0}',
                       '{"image_size": 16, "patch_size": 8, "hidden_size": 8, "num_layers": 1, '
                       '"num_heads": 3, "mlp_dim": 8}', '{"nope": 1}', "{" * 50] + TEXT,
    "--weights": ["digits", NPZ, MISSING, FOLDER, IMAGE, "ftp://x/y.npz", "hf://", "nope/nope",
                  "file:///nowhere.npz"] + TEXT,
    "--image-size": ["16", "32", "8x16", "0", "-1", "16x", "x", "1e9", "65536", "99999999999"]
    + TEXT,
}
DATA_FLAGS = {
    "--batch-size": NUMBERS,
    "--seed": NUMBERS,
    "--strategy": ["auto", "cpu", "tpu", "nope"] + TEXT,
    "--data-dir": PATHS + TEXT,
    "--skip-corrupt": None,
}


def flags(*tables, **more):
    merged = {}
    for table in tables + (more,):
        merged.update(table)
    return merged


COMMANDS = {
    "models": flags({"--variant": ["B/16", "Q/99"] + TEXT}),
    "checkpoints": flags({"--json": None}),
    "predict": flags(MODEL_FLAGS, {"--top-k": NUMBERS, "--max-pixels": NUMBERS,
                                   "--class-names": PATHS + TEXT}),
    "convert": flags(MODEL_FLAGS),
    "export": flags(MODEL_FLAGS, {
        "--num-classes": NUMBERS, "--format": ["saved_model", "tflite", "onnx"] + TEXT,
        "--version": NUMBERS, "--top-k": NUMBERS, "--image-dtype": ["uint8", "float16"],
        "--no-warmup": None, "--max-pixels": NUMBERS, "--class-names": PATHS + TEXT,
        "--max-patches": NUMBERS, "--parity-images": NUMBERS}),
    "evaluate": flags(MODEL_FLAGS, DATA_FLAGS, {
        "--split": ["train", "validation", "all", "test"] + TEXT, "--out": PATHS + TEXT,
        "--allow-fresh-head": None, "--class-names": PATHS + TEXT}),
    "train": flags(MODEL_FLAGS, DATA_FLAGS, {
        "--lr": NUMBERS, "--warmup-steps": NUMBERS, "--weight-decay": NUMBERS,
        "--label-smoothing": NUMBERS, "--target-batch-size": NUMBERS,
        "--recipe": ["finetune", "pretrain", "nope"], "--validation-split": ["none",
                                                                            "validation", "x"],
        "--precision": ["float32", "bfloat16", "float8", ""], "--overwrite": None}),
}
# Positional arguments and the flags every example of a command has.
BASE = {
    "models": [], "checkpoints": ["B/16"], "predict": [IMAGE, "--weights", "digits"],
    "convert": ["digits", NEW + ".npz"],
    "export": [NEW, "--weights", "digits", "--no-warmup"],
    "evaluate": ["--folder", FOLDER, "--weights", "digits", "--verbose", "0",
                 "--batch-size", "4"],
    "train": ["--folder", FOLDER, "--model-config", TINY_JSON, "--steps", "1", "--output", NEW,
              "--verbose", "0", "--batch-size", "4", "--validation-split", "none"],
}


class Workspace:
    """The input files every example may name, and fresh output names."""

    def __init__(self, root):
        self.root = pathlib.Path(root)
        rng = np.random.default_rng(0)
        self.folder = self.root / "images"
        for c in range(2):
            (self.folder / f"c{c}").mkdir(parents=True)
            for i in range(2):
                Image.fromarray(rng.integers(0, 256, (16, 16, 3), np.uint8)).save(
                    self.folder / f"c{c}" / f"{i}.png")
        self.image = self.folder / "c0" / "0.png"
        import keras_vit
        from keras_vit import weights

        self.npz = self.root / "tiny.npz"
        weights.save_npz(keras_vit.ViT(**TINY, num_classes=2), self.npz)
        self.count = 0

    def inputs(self):
        return {str(p): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(self.root.rglob("*")) if p.is_file() and "out-" not in str(p)}

    def resolve(self, value):
        self.count += 1
        for mark, path in ((MISSING, self.root / "missing" / "nothing.npz"),
                           (FOLDER, self.folder), (IMAGE, self.image), (NPZ, self.npz),
                           (NEW, self.root / f"out-{self.count}")):
            if value.startswith(mark):
                return str(path) + value[len(mark):]
        return value


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    return Workspace(tmp_path_factory.mktemp("fuzz"))


def arguments(command, max_flags=3):
    """Argument lists for `command`: its base arguments and up to `max_flags` of its flags,
    each with a value from its set or the hostile set."""
    table = COMMANDS[command]

    def value(flag):
        choices = table[flag]
        if choices is None:
            return st.just([flag])
        return st.sampled_from(choices + HOSTILE).map(lambda v: [flag, v])

    chosen = st.lists(st.sampled_from(sorted(table)), max_size=max_flags, unique=True)
    return chosen.flatmap(lambda names: st.tuples(*[value(name) for name in names])).map(
        lambda pairs: [command] + BASE[command] + [part for pair in pairs for part in pair])


def check_outcome(workspace, capsys, argv):
    argv = [workspace.resolve(arg) for arg in argv]
    before = workspace.inputs()
    try:
        status = cli.main(argv)
    except SystemExit as exit_:  # argparse's usage error
        status = exit_.code
    out, err = capsys.readouterr()
    command = argv[0]
    assert "Traceback" not in err and "internal error" not in err, (argv, err)
    assert status in (0, 2), (argv, status, err)
    if status == 2:
        lines = [line for line in err.strip().splitlines() if line.strip()]
        errors = [line for line in lines if line.startswith(f"keras-vit {command}: error: ")]
        assert len(errors) == 1, (argv, err)
        # Before the error line: argparse's usage; after it: the indented details of a
        # checkpoint that does not fit (one CheckpointError lists every mismatch).
        at = lines.index(errors[0])
        assert not lines[:at] or lines[0].startswith("usage: "), (argv, err)
        assert all(line.startswith(" ") for line in lines[at + 1:]), (argv, err)
    assert workspace.inputs() == before, argv


# KERAS_VIT_FUZZ_SCALE=N: N times the examples (a longer search, by hand).
SCALE = int(os.environ.get("KERAS_VIT_FUZZ_SCALE", "1"))
FUZZ = dict(deadline=None, derandomize=True,
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@settings(max_examples=40 * SCALE, **FUZZ)
@given(argv=st.one_of(arguments("models"), arguments("checkpoints")))
def test_fuzz_listing_commands(workspace, capsys, argv):
    check_outcome(workspace, capsys, argv)


@settings(max_examples=12 * SCALE, **FUZZ)
@given(argv=arguments("predict"))
def test_fuzz_predict(workspace, capsys, argv):
    check_outcome(workspace, capsys, argv)


@settings(max_examples=10 * SCALE, **FUZZ)
@given(argv=arguments("convert", max_flags=2))
def test_fuzz_convert(workspace, capsys, argv):
    check_outcome(workspace, capsys, argv)


@settings(max_examples=8 * SCALE, **FUZZ)
@given(argv=arguments("evaluate", max_flags=2))
def test_fuzz_evaluate(workspace, capsys, argv):
    check_outcome(workspace, capsys, argv)


@settings(max_examples=4 * SCALE, **FUZZ)
@given(argv=arguments("export", max_flags=2))
def test_fuzz_export(workspace, capsys, argv):
    check_outcome(workspace, capsys, argv)


@settings(max_examples=4 * SCALE, **FUZZ)
@given(argv=arguments("train", max_flags=2))
def test_fuzz_train(workspace, capsys, argv):
    check_outcome(workspace, capsys, argv)
