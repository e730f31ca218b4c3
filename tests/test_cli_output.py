"""What the commands print for a person: the checkpoint and variant tables, and the summaries
that end the long commands (epochs numbered as Keras numbers them, the data named for what was
read, the sizes used) with their `--json` machine form."""

import json
import pathlib

import pytest

import keras_vit_cli as cli

ROOT = pathlib.Path(__file__).resolve().parent.parent


def registry():
    """The registry file, read directly."""
    return json.loads((ROOT / "checkpoints" / "registry.json").read_text())["checkpoints"]


# ------------------------------------------------------------------------------------------
# keras-vit checkpoints and keras-vit models.


def test_checkpoints_lists_every_registry_name_with_its_facts(capsys):
    assert cli.main(["checkpoints"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["variant", "resolution", "classes", "download", "data", "name"]
    entries = registry()
    assert [line.split()[-1] for line in lines[1:-1]] == [e["name"] for e in entries]
    assert lines[-1].startswith(f"{len(entries)} checkpoint(s). Load one by name")
    rows = dict(zip((e["name"] for e in entries), lines[1:-1]))
    assert rows["imagenet21k+imagenet2012/ViT-B_16"].split() == [
        "B/16", "384", "1000", "331", "MiB", "imagenet21k", "->", "imagenet2012",
        "imagenet21k+imagenet2012/ViT-B_16"]
    assert rows["imagenet21k/ViT-L_32"].split() == [
        "L/32", "224", "21843", "-", "imagenet21k", "imagenet21k/ViT-L_32"]
    assert rows["digits"].split() == [
        "custom", "16", "10", "0.55", "MiB", "(shipped)", "scikit-learn", "digits", "digits"]


@pytest.mark.parametrize("spelling", ["B/16", "ViT_B16", "vit-b16"])
def test_checkpoints_of_one_variant_and_their_json(capsys, spelling):
    assert cli.main(["checkpoints", spelling, "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == [e for e in registry() if e["variant"] == "B/16"]
    assert len(printed) == 6


def test_checkpoints_of_an_unknown_variant_is_one_line(capsys):
    assert cli.main(["checkpoints", "B/17"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("keras-vit checkpoints: error: Unknown ViT variant 'B/17'. Expected ")
    assert err.count("\n") == 1


def test_models_shows_parameters_and_gflops(capsys):
    assert cli.main(["models", "--variant", "B/16", "--variant", "R50+B/16"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[-2:] == ["params", "GFLOPs"]
    # B/16 at 224 px: 86,567,656 parameters (the official models_test.py); 17.56 GMAC forward
    # (196 patches + the class token through 12 blocks of width 768), 35.1 GFLOPs.
    assert lines[1].split()[0] == "B/16" and lines[1].split()[-2:] == ["86,567,656", "35.1"]
    # R50+B/16: 98,659,112 (models_test.py); the ResNet's convolutions add 8.0 GFLOPs.
    assert lines[2].split()[0] == "R50+B/16" and lines[2].split()[-2:] == ["98,659,112", "43.1"]
    assert "224x224 px" in lines[3] and "keras_vit.flops" in lines[3]
