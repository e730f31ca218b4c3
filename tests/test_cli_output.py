"""What the commands print for a person: the checkpoint and variant tables, and the summaries
that end the long commands (epochs numbered as Keras numbers them, the data named for what was
read, the sizes used) with their `--json` machine form."""

import json
import os
import pathlib
import re
import subprocess
import sys

import keras
import numpy as np
import pytest
from PIL import Image

import keras_vit
import keras_vit_cli as cli
from keras_vit import data, evaluation, training

ROOT = pathlib.Path(__file__).resolve().parent.parent
TINY = dict(patch_size=4, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=16)


def registry():
    """The registry file, read directly."""
    return json.loads((ROOT / "checkpoints" / "registry.json").read_text())["checkpoints"]


# ------------------------------------------------------------------------------------------
# keras-vit checkpoints and keras-vit models.


def test_checkpoints_lists_every_registry_name_with_its_facts(capsys):
    assert cli.main(["checkpoints"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["variant", "resolution", "classes", "top-1", "download", "data",
                                "name"]
    entries = registry()
    assert [line.split()[-1] for line in lines[1:-1]] == [e["name"] for e in entries]
    assert lines[-1].startswith(f"{len(entries)} checkpoint(s). * marks each variant's default")
    # What the mark means for the variants whose default is not a 1000-class fine-tune.
    upstream = sorted(e["variant"] for e in entries if e["variant"] and
                      e["name"] == keras_vit.default_checkpoint(e["variant"])
                      and not e["finetuning"])
    assert upstream and f"its ImageNet-21k weights where it has none ({', '.join(upstream)})" \
        in lines[-1]
    rows = dict(zip((e["name"] for e in entries), lines[1:-1]))
    assert rows["imagenet21k+imagenet2012/ViT-B_16"].split() == [
        "B/16", "384", "1000", "84.2", "331", "MiB", "imagenet21k", "->", "imagenet2012",
        "imagenet21k+imagenet2012/ViT-B_16"]
    assert rows["imagenet21k/ViT-L_32"].split() == [
        "L/32", "224", "21843", "-", "1,255", "MiB", "imagenet21k", "imagenet21k/ViT-L_32"]
    assert rows["digits"].split() == [
        "-", "16", "10", "-", "0.55", "MiB", "(shipped)", "scikit-learn", "digits", "digits"]
    assert rows["imagenet21k/ViT-H_14"].split()[0] == "*"  # H/14's default: no 1k fine-tune


@pytest.mark.parametrize("spelling", ["B/16", "ViT_B16", "vit-b16"])
def test_checkpoints_of_one_variant_and_their_json(capsys, spelling):
    assert cli.main(["checkpoints", spelling, "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    default = keras_vit.default_checkpoint("B/16")
    assert printed == [dict(e, default=e["name"] == default) for e in registry()
                       if e["variant"] == "B/16"]
    assert len([e for e in printed if not e["url"].startswith("hf://")]) == 6


def test_checkpoints_of_an_unknown_variant_is_one_line(capsys):
    assert cli.main(["checkpoints", "B/17"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("keras-vit checkpoints: error: No checkpoint's name, variant or tag "
                          "matches 'B/17'. Expected ")
    assert err.count("\n") == 1


@pytest.mark.parametrize("command", ["checkpoints", "models"])
def test_a_closed_output_pipe_ends_the_command_quietly(command):
    """`keras-vit checkpoints | head -1`: the reader goes away; the command stops as a shell
    command stopped by SIGPIPE does (status 141), without an error line."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # every write to the pipe now fails with EPIPE
    try:
        done = subprocess.run([sys.executable, "-m", "keras_vit_cli", command], stdout=write_end,
                              stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write_end)
    assert (done.returncode, done.stderr) == (141, "")


def test_models_shows_parameters_and_gflops(capsys):
    # A variant named twice, in any spelling, is listed once.
    assert cli.main(["models", "--variant", "B/16", "--variant", "R50+B/16", "--variant",
                     "b/16"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[-2:] == ["params", "GFLOPs"]
    # B/16 at 224 px: 86,567,656 parameters (the official models_test.py); 17.56 GMAC forward
    # (196 patches + the class token through 12 blocks of width 768), 35.1 GFLOPs.
    assert lines[1].split()[0] == "B/16" and lines[1].split()[-2:] == ["86,567,656", "35.1"]
    # R50+B/16: 98,659,112 (models_test.py); the ResNet's convolutions add 8.0 GFLOPs.
    assert lines[2].split()[0] == "R50+B/16" and lines[2].split()[-2:] == ["98,659,112", "43.1"]
    assert "224x224 px" in lines[3] and "keras_vit.flops" in lines[3]


# ------------------------------------------------------------------------------------------
# Training: the summary fit returns, and the table of train and pretrain.


class ValidationLog(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.val_loss = []

    def on_epoch_end(self, epoch, logs=None):
        self.val_loss.append(logs["val_loss"])


def test_fit_summary_numbers_epochs_as_keras_progress_does(tmp_path):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (12, 8, 8, 3), dtype=np.uint8)
    labels = np.arange(12) % 3
    train = data.from_arrays(images[:8], labels[:8], image_size=8, batch_size=4, training=True)
    validation = data.from_arrays(images[8:], labels[8:], image_size=8, batch_size=4,
                                  training=False)
    log = ValidationLog()
    summary = training.fit(keras_vit.ViT(image_size=8, num_classes=3, **TINY), train,
                           validation, output_dir=tmp_path, epochs=4, learning_rate=0.3,
                           warmup_steps=1, monitor="val_loss", callbacks=[log], verbose=0)
    assert len(log.val_loss) == 4
    # Keras shows the first epoch as "Epoch 1/4": the best epoch is counted the same way.
    assert summary["best_epoch"] == 1 + int(np.argmin(log.val_loss))
    assert summary["best_value"] == pytest.approx(min(log.val_loss))
    assert summary["examples"] == {"train": 8, "validation": 4}
    assert summary["resumed_at_epoch"] == 0 and summary["epochs"] == 4


def write_folder(root, count=20):
    rng = np.random.default_rng(3)
    for i in range(count):
        path = root / f"c{i % 2}" / f"{i}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(path)
    return root


def test_train_ends_with_a_table_and_json_keeps_the_keys(tmp_path, capsys):
    folder = write_folder(tmp_path / "images")
    common = ["train", "--folder", str(folder), "--model-config", json.dumps(TINY),
              "--image-size", "8", "--batch-size", "6", "--no-xla", "--lr", "0.3",
              "--warmup-steps", "1"]
    assert cli.main([*common, "--epochs", "3", "--verbose", "2",
                     "--output", str(tmp_path / "table")]) == 0
    out = capsys.readouterr().out
    # Keras' own progress: "Epoch k/3" and that epoch's val_accuracy.
    keras_epochs = {int(k): float(v) for k, v in re.findall(
        r"Epoch (\d+)/3\n.*? val_accuracy: ([\d.]+)", out)}
    assert sorted(keras_epochs) == [1, 2, 3]
    table = out[out.index(f"Finished training in {tmp_path / 'table'}\n"):].splitlines()
    fields = dict(re.match(r"  (\S+(?: \S+)?) +(.*)$", line).groups() for line in table[1:])
    assert fields["trained on"] == f"{folder} less its held-out 10%, 18 images"
    assert fields["epochs"] == "3 (9 updates)"
    assert fields["validation"].startswith(f"the held-out 10% of {folder}, 2 images: ")
    best = re.fullmatch(r"epoch (\d) of 3, val_accuracy ([\d.]+)%: (.*)", fields["best"])
    best_epoch, best_accuracy = int(best[1]), float(best[2]) / 100
    assert keras_epochs[best_epoch] == max(keras_epochs.values()) == pytest.approx(best_accuracy)
    assert best_epoch == min(k for k, v in keras_epochs.items() if v == best_accuracy)
    assert best[3] == str(tmp_path / "table" / "best.npz")
    assert fields["final weights"] == str(tmp_path / "table" / "final.npz")

    # --json: one JSON object on the last line, with the keys it always had.
    assert cli.main([*common, "--epochs", "1", "--verbose", "0", "--json",
                     "--output", str(tmp_path / "json")]) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    summary = json.loads(printed[-1])
    assert {"output_dir", "epochs", "updates", "resumed_at_epoch", "final_weights",
            "best_weights", "monitor", "best_value", "best_epoch", "validation_loss",
            "validation_accuracy", "seconds"} <= set(summary)
    assert (summary["epochs"], summary["best_epoch"]) == (1, 1)
    # best.json numbers the epoch as the summary and Keras' progress do.
    assert json.loads((tmp_path / "json" / "best.json").read_text())["epoch"] == 1
    assert summary["examples"] == {"train": 18, "validation": 2}
    assert summary["splits"] == {"train": "train", "validation": "validation"}
    assert summary["data"] == str(folder)


# ------------------------------------------------------------------------------------------
# Progress bars.


def test_feature_extraction_counts_the_images_of_a_pipeline(tmp_path, capsys):
    folder = write_folder(tmp_path / "images", count=10)
    pipeline = data.from_folder(folder, image_size=8, batch_size=4, training=False)
    model = keras_vit.ViT(image_size=8, include_top=False, **TINY)
    features, labels = evaluation.extract_features(model, pipeline)
    printed = capsys.readouterr().out
    assert features.shape == (10, 16) and len(labels) == 10
    assert "\x1b[1m10/10\x1b[0m" in printed and printed.endswith("\n")
    # A dataset of batches whose size is not known: the count alone, then a new line.
    evaluation.extract_features(model, pipeline.dataset)
    printed = capsys.readouterr().out
    assert re.search(r"\s10/Unknown", printed) and printed.endswith("\n")
    evaluation.extract_features(model, pipeline, progress=False)
    assert capsys.readouterr().out == ""


def test_the_checkpoints_footer_explains_the_mark_only_where_a_row_has_it(capsys):
    assert cli.main(["checkpoints", "dino"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert not any(line.startswith("*") for line in lines[1:-1])
    assert "*" not in lines[-1] and lines[-1].startswith(f"{len(lines) - 2} checkpoint(s). ")


def test_predict_shows_a_name_with_a_line_break_on_one_line(tmp_path, capsys):
    """Each image's block is its name's line, then its classes: a name holding a line break
    (or another character that does not print) is quoted as bash writes it, on one line."""
    names = ["plain.png", "two\nlines.png", "tab\there's.png", os.fsdecode(b"bad\xff.png")]
    for name in names:
        Image.fromarray(np.zeros((16, 16, 3), np.uint8)).save(tmp_path / name)
    assert cli.main(["predict", *(str(tmp_path / n) for n in names), "--weights", "digits",
                     "--top-k", "1", "-q"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0::2] == [str(tmp_path / "plain.png"), f"$'{tmp_path}/two\\nlines.png'",
                           f"$'{tmp_path}/tab\\there\\'s.png'",
                           f"$'{tmp_path}/bad\\377.png'"], lines  # bash's quoting of each
    assert all(line.startswith("  ") for line in lines[1::2]), lines
