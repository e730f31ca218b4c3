"""The checkpoint registry as users choose from it: timm's ViT checkpoints by name (loaded from
the Hugging Face Hub, here a local cache laid out as huggingface_hub lays it out, offline),
every entry's size, top-1 and preprocessing, each variant's default, and `keras-vit
checkpoints [PATTERN]`.

The files timm writes itself are tested where `KERAS_VIT_TIMM_PYTHON` names an interpreter with
timm (`.ci/run` builds one; see tests/test_timm_interop.py), for example
`KERAS_VIT_TIMM_PYTHON=.venv-bench/bin/python .venv/bin/python -m pytest
tests/test_checkpoint_registry.py`; elsewhere the download path is tested on files written here
in the Hub's format."""

import json
import pathlib
import subprocess

import keras
import numpy as np
import pytest
import reference
from test_data_config import pil_eval_transform  # timm's eval transform, written with PIL
from huggingface_hub import constants as hub_constants
from safetensors.numpy import save_file

import keras_vit
import keras_vit_cli as cli
from keras_vit import configs, flops
from keras_vit.weights import registry, torch_layouts

ROOT = pathlib.Path(__file__).resolve().parent.parent
COMMIT = "0123456789abcdef0123456789abcdef01234567"
PREPROCESSING_KEYS = ["input_size", "interpolation", "crop_pct", "crop_mode", "mean", "std"]
# The official ImageNet-1k fine-tune with no published top-1 (and no documented resolution).
NO_TOP1 = {"imagenet21k+imagenet2012/ViT-B_8"}


def registry_file():
    """The registry file, read directly (not through keras_vit)."""
    return json.loads((ROOT / "checkpoints" / "registry.json").read_text())["checkpoints"]


def timm_entries():
    return [e for e in registry_file() if str(e["url"]).startswith("hf://timm/")]


# ------------------------------------------------------------------------------------------
# What every entry says.


def test_every_entry_has_timms_six_preprocessing_fields():
    for entry in registry_file():
        pre = entry["preprocessing"]
        assert list(pre)[:6] == PREPROCESSING_KEYS, entry["name"]
        assert set(list(pre)[6:]) <= {"antialias"}, entry["name"]
        channels, height, width = pre["input_size"]
        assert channels == 3 and height > 0 and width > 0, entry["name"]
        if entry["resolution"] is not None:
            assert [height, width] == ([entry["resolution"]] * 2 if isinstance(
                entry["resolution"], int) else entry["resolution"]), entry["name"]
        assert pre["interpolation"] in ("bilinear", "bicubic", "nearest"), entry["name"]
        assert 0 < pre["crop_pct"] <= 1 and pre["crop_mode"] in ("center", "squash"), entry["name"]
        assert len(pre["mean"]) == len(pre["std"]) == 3 and min(pre["std"]) > 0, entry["name"]
        if not str(entry["url"]).startswith("hf://"):  # the paper's [-1, 1] scaling, no crop
            assert (pre["mean"], pre["std"], pre["crop_pct"], pre["interpolation"],
                    pre["crop_mode"], pre["antialias"]) == (
                [0.5] * 3, [0.5] * 3, 1.0, "bilinear", "squash", False), entry["name"]


def expected_params(entry):
    """A paper-variant file's parameters: the variant's count at 224 px with 1000 classes
    (configs.VARIANTS, tested against the official numbers), moved to the entry's resolution,
    classes and representation layer."""
    spec = configs.get_variant(entry["variant"])
    size = configs.MODEL_SIZES[spec.size]
    sizes = dict(patch_size=spec.patch_size, hidden_size=size["hidden_size"],
                 num_layers=size["num_layers"], mlp_dim=size["mlp_dim"],
                 resnet=spec.config().get("resnet"))
    resolution = entry["resolution"] or 224
    return spec.params - flops.vit_params(224, **sizes) + flops.vit_params(
        resolution, num_classes=entry["num_classes"],
        representation_size=entry["representation_size"], **sizes)


def test_every_entry_has_a_size_that_its_parameters_account_for():
    """Sizes measured (the vit_jax README's) and counted (timm's own models) agree with
    4 bytes a parameter of the variant's count, within the odd bias or class token (and the
    README's rounding to whole MiB)."""
    for entry in registry_file():
        assert entry["size_mib"] > 0, entry["name"]
        if entry["variant"] is None:
            continue
        mib = expected_params(entry) * 4 / 2**20
        assert entry["size_mib"] == pytest.approx(mib, rel=0.01, abs=0.6), entry["name"]


def test_every_official_imagenet_fine_tune_has_a_top1_with_its_source():
    for entry in registry_file():
        assert (entry["imagenet_top1"] is None) == (entry["imagenet_top1_source"] is None)
        if entry["imagenet_top1"] is not None:
            assert 50 < entry["imagenet_top1"] < 100 and entry["num_classes"] == 1000
    official_fine_tunes = {e["name"] for e in registry_file() if e["finetuning"] ==
                           "imagenet2012" and not str(e["url"]).startswith("hf://")}
    without = {e["name"] for e in registry_file() if e["name"] in official_fine_tunes
               and e["imagenet_top1"] is None}
    assert without == NO_TOP1
    top1 = {e["name"]: e["imagenet_top1"] for e in registry_file()}
    assert top1["imagenet21k+imagenet2012/ViT-B_16-224"] == 81.2  # vit_jax README
    assert top1["vit_base_patch16_224.augreg2_in21k_ft_in1k"] == 85.108  # timm's results


def test_timm_entries_are_timms_names_on_the_hub():
    entries = timm_entries()
    families = {tag for e in entries for tag in e["tags"]}
    assert {"augreg", "augreg2", "orig", "dino", "mae", "sam", "miil", "deit", "eva",
            "siglip"} <= families
    for entry in entries:
        assert entry["url"] == "hf://timm/" + entry["name"]
        assert entry["name"].split(".")[0] == entry["architecture"] and "timm" in entry["tags"]
        assert "license" in entry and entry["name_source"] == "timm 1.0.31 pretrained_cfg"
    names = {e["name"] for e in entries}
    assert "vit_base_patch16_224.augreg2_in21k_ft_in1k" in names
    # Left out: registers, layer scale, CLIP's pre-norm, SigLIP's MAP head, distillation.
    assert not {n for n in names if "reg4" in n or "dinov2" in n or "clip" in n
                or "distilled" in n or "deit3" in n or "_siglip_2" in n or "_siglip_3" in n}


def test_each_variant_has_one_default_and_it_is_what_pretrained_true_loads():
    entries = keras_vit.list_checkpoints()
    defaults = {e["variant"]: e["name"] for e in entries if e["default"]}
    assert sum(e["default"] for e in entries) == len(defaults)
    assert set(defaults) == {e["variant"] for e in entries if e["variant"]}
    for variant, name in defaults.items():
        assert keras_vit.default_checkpoint(variant) == name
        assert not registry.hub_source(name)  # the paper's own files stay the defaults


@pytest.mark.parametrize("pattern, expected", [
    ("vit_base_patch16_224.augreg2*", ["vit_base_patch16_224.augreg2_in21k_ft_in1k"]),
    ("VIT_BASE_PATCH16_224.AUGREG2*", ["vit_base_patch16_224.augreg2_in21k_ft_in1k"]),
    ("dino", ["vit_small_patch16_224.dino", "vit_small_patch8_224.dino",
              "vit_base_patch16_224.dino", "vit_base_patch8_224.dino"]),
    ("digits", ["digits"]),
])
def test_list_checkpoints_matches_names_variants_and_tags(pattern, expected):
    assert [e["name"] for e in keras_vit.list_checkpoints(pattern)] == expected


def test_list_checkpoints_takes_a_variant_in_any_spelling():
    b16 = [e["name"] for e in keras_vit.list_checkpoints("B/16")]
    assert b16 == [e["name"] for e in keras_vit.list_checkpoints("ViT_B16")]
    assert "imagenet21k/ViT-B_16" in b16 and "vit_base_patch16_224.mae" in b16
    assert keras_vit.list_checkpoints("no-such-*") == keras_vit.list_checkpoints("") == []
    with pytest.raises(ValueError, match="`pattern` must be a string"):
        keras_vit.list_checkpoints(16)


# ------------------------------------------------------------------------------------------
# Loading a timm name: through the Hub's files, here a local Hugging Face cache, offline.


def hub_cache(root, files, names=("config.json", "model.safetensors")):
    """A Hugging Face cache under `root` holding `files` ({repo: folder with the files
    `names`}), laid out as huggingface_hub lays it out."""
    for repo, folder in files.items():
        cached = root / ("models--" + repo.replace("/", "--"))
        snapshot = cached / "snapshots" / COMMIT
        snapshot.mkdir(parents=True)
        (cached / "refs").mkdir()
        (cached / "refs" / "main").write_text(COMMIT)
        for name in names:
            (snapshot / name).write_bytes((folder / name).read_bytes())
    return root


@pytest.fixture
def offline_hub(monkeypatch, tmp_path):
    """Points huggingface_hub at an empty cache under tmp_path, offline."""
    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    return cache


TI16 = dict(hidden=192, mlp=768, heads=3, layers=1, patch=16, grid=(2, 2))


def stand_in_entry(name, **facts):
    """`name`'s registry entry rewritten to describe the small stand-in a test writes under
    that name (`facts`: the `keras_vit.ViT` sizes, `resolution` and `num_classes` in which it
    differs), so that the stand-in must still match its entry as a real file must."""
    entry = registry.get_checkpoint(name)
    config = configs.get_variant(entry["variant"]).config() if entry.get("variant") else {}
    sizes = {k: v for k, v in facts.items() if k not in ("resolution", "num_classes")}
    return dict(entry, variant=None, config=dict(config, **sizes) or None,
                resolution=facts.get("resolution", entry["resolution"]),
                num_classes=facts.get("num_classes", entry["num_classes"]))


def use_stand_in(monkeypatch, name, **facts):
    monkeypatch.setitem(registry._REGISTERED, name, stand_in_entry(name, **facts))


def write_hub_files(folder, name, params, num_classes):
    """`model.safetensors` in timm's layout and the `config.json` the Hub holds for timm's
    files (no `model_args`: the architecture is timm's `name`), as timm's `push_to_hf_hub`
    writes them."""
    folder.mkdir(parents=True)
    save_file(torch_layouts.to_timm(params), str(folder / "model.safetensors"),
              metadata={"format": "pt"})
    entry = registry.get_checkpoint(name)
    pre = entry["preprocessing"]
    config = dict(architecture=entry["architecture"], num_classes=num_classes,
                  num_features=TI16["hidden"], global_pool="token",
                  pretrained_cfg=dict(tag=name.split(".", 1)[1], custom_load=False,
                                      input_size=[3, 32, 32], fixed_input_size=True,
                                      interpolation=pre["interpolation"],
                                      crop_pct=pre["crop_pct"], crop_mode=pre["crop_mode"],
                                      mean=pre["mean"], std=pre["std"], num_classes=num_classes,
                                      pool_size=None, first_conv="patch_embed.proj",
                                      classifier="head", license=entry["license"]))
    (folder / "config.json").write_text(json.dumps(config))


def test_a_timm_name_loads_from_the_hub_with_the_papers_numerics(offline_hub, tmp_path, monkeypatch):
    name = "vit_tiny_patch16_224.augreg_in21k_ft_in1k"
    params = reference.official_params(np.random.default_rng(0), num_classes=7, **TI16)
    write_hub_files(tmp_path / "files", name, params, 7)
    hub_cache(offline_hub, {f"timm/{name}": tmp_path / "files"})
    use_stand_in(monkeypatch, name, num_layers=1, resolution=32, num_classes=7)
    images = np.random.default_rng(1).uniform(-1, 1, (2, 32, 32, 3)).astype(np.float32)
    want, _, _ = reference.forward(params, images, approximate=False)  # timm: exact GELU
    model = keras_vit.from_pretrained(name)
    np.testing.assert_allclose(model.predict(images, verbose=0), want, atol=1e-4)
    again = keras_vit.from_pretrained(f"hf://timm/{name}")
    np.testing.assert_allclose(again.predict(images, verbose=0), want, atol=1e-4)
    # A named builder takes what the file computes (timm's exact GELU) from the file.
    same = keras_vit.ViT_Ti16(image_size=32, num_classes=7, num_layers=1, pretrained=name)
    assert same.get_config()["gelu_approximate"] is False
    np.testing.assert_allclose(same.predict(images, verbose=0), want, atol=1e-4)
    chosen = keras_vit.ViT_Ti16(image_size=32, num_classes=7, num_layers=1, pretrained=name,
                                gelu_approximate=True)  # unless the caller chooses
    assert chosen.get_config()["gelu_approximate"] is True


def test_the_command_line_takes_a_timm_name_as_weights(offline_hub, tmp_path, capsys, monkeypatch):
    from PIL import Image

    name = "vit_small_patch16_224.augreg_in1k"
    params = reference.official_params(np.random.default_rng(2), num_classes=1000,
                                       **dict(TI16, hidden=384, mlp=96, heads=6))
    write_hub_files(tmp_path / "files", name, params, 1000)
    hub_cache(offline_hub, {f"timm/{name}": tmp_path / "files"})
    use_stand_in(monkeypatch, name, num_layers=1, mlp_dim=96, resolution=32)
    image = np.random.default_rng(3).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    Image.fromarray(image).save(tmp_path / "x.png")
    assert cli.main(["predict", str(tmp_path / "x.png"), "--weights", name, "--top-k", "1"]) == 0
    printed = capsys.readouterr().out.splitlines()
    # The name's own preprocessing (timm's: bicubic, crop 0.9), written with PIL.
    config = dict(keras_vit.weights.get_checkpoint(name)["preprocessing"], input_size=[3, 32, 32])
    assert (config["interpolation"], config["crop_pct"]) == ("bicubic", 0.9)
    pixels = pil_eval_transform(image, config)
    want, _, _ = reference.forward(params, pixels[None] / 127.5 - 1, approximate=False)
    paper, _, _ = reference.forward(params, image[None] / 127.5 - 1, approximate=False)
    assert np.argmax(paper) != np.argmax(want)  # the check tells the preprocessings apart
    assert keras_vit.class_names()[int(np.argmax(want))] in printed[1]


def test_a_timm_name_not_in_the_cache_offline_is_one_clear_error(offline_hub):
    name = "vit_base_patch16_224.dino"
    with pytest.raises(keras_vit.DownloadError, match=f"Could not fetch hf://timm/{name}"):
        keras_vit.from_pretrained(name)


# ------------------------------------------------------------------------------------------
# Files timm writes itself, one architecture family each: the Hub's layout and config.json
# (`save_for_hf`, what `push_to_hf_hub` uploads), every other one without the `model_args`
# that timm 1.0.31 adds and the files on the Hub, written by earlier timm, lack.

# (timm name, timm.create_model arguments that make it small): each family's architecture
# (class token and pooling, final norm or fc_norm, query/key/value biases, head or none).
FAMILIES = [
    ("vit_tiny_patch16_224.augreg_in21k_ft_in1k", dict(img_size=32)),
    ("vit_base_patch16_224.augreg2_in21k_ft_in1k", dict(img_size=32, num_classes=5)),
    ("vit_base_patch32_224.orig_in21k", dict(img_size=64)),
    ("vit_base_patch16_224.sam_in1k", dict(img_size=32, num_classes=5)),
    ("vit_small_patch16_224.dino", dict(img_size=32)),
    ("vit_base_patch16_224.mae", dict(img_size=32)),
    ("vit_base_patch16_224_miil.in21k_ft_in1k", dict(img_size=32, num_classes=5)),
    ("vit_base_patch16_224.bamboo", dict(img_size=32, num_classes=5)),
    ("deit_tiny_patch16_224.fb_in1k", dict(img_size=32)),
    ("eva_large_patch14_196.in22k_ft_in1k", dict(img_size=28, num_classes=5)),
    ("vit_base_patch16_siglip_gap_224.webli", dict(img_size=32)),
]
WRITE_WITH_TIMM = """
import json, pathlib, sys
import numpy as np
sys.path.insert(0, {root!r})
from benchmarks.contenders.timm_vit import import_timm
timm, _ = import_timm()
import torch
from timm.models import save_for_hf
torch.manual_seed(0)
images = torch.from_numpy(np.load({images!r})).permute(0, 3, 1, 2).float()
outputs = {{}}
for name, kwargs in json.loads({families!r}):
    model = timm.create_model(name, pretrained=False, depth=1, **kwargs).eval()
    with torch.no_grad():
        for p in model.parameters():  # non-trivial values everywhere (biases, norms, tokens)
            p.add_(torch.randn_like(p) * 0.1)
        pre = model.pretrained_cfg
        mean = torch.tensor(pre["mean"]).view(1, 3, 1, 1)
        std = torch.tensor(pre["std"]).view(1, 3, 1, 1)
        side = model.patch_embed.img_size[0]
        x = torch.nn.functional.interpolate(images, size=(side, side), mode="bilinear")
        outputs[name] = model((x / 255 - mean) / std).tolist()
    save_for_hf(model, pathlib.Path({folder!r}) / name, safe_serialization=True)
sys.path.insert(0, str(pathlib.Path({root!r}) / "checkpoints"))
import make_registry  # the registry's entries, as it writes them from timm's configurations
family = dict(make_registry.TIMM)
entries = {{name: make_registry.timm_entry(timm, name, family[name]) for name, _ in
            json.loads({families!r})}}
print(json.dumps(dict(outputs=outputs, entries=entries)))
"""


def test_every_family_loads_exactly_from_the_files_timm_writes(offline_hub, tmp_path, monkeypatch,
                                                               timm_python):
    images = np.random.default_rng(4).uniform(0, 255, (2, 64, 64, 3)).astype(np.float32)
    np.save(tmp_path / "images.npy", images)
    code = WRITE_WITH_TIMM.format(root=str(ROOT), images=str(tmp_path / "images.npy"),
                                  families=json.dumps(FAMILIES), folder=str(tmp_path / "timm"))
    done = subprocess.run([timm_python, "-c", code], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    printed = json.loads(done.stdout.strip().splitlines()[-1])
    outputs, by_name = printed["outputs"], {e["name"]: e for e in registry_file()}
    for name, _ in FAMILIES:  # registry.json holds what make_registry.py reads from timm
        assert printed["entries"][name] == by_name[name], name
    for name, _ in FAMILIES[::2]:  # as the Hub's files written by earlier timm: no model_args
        config = tmp_path / "timm" / name / "config.json"
        written = json.loads(config.read_text())
        assert written.pop("model_args")["depth"] == 1
        config.write_text(json.dumps(written))
    hub_cache(offline_hub, {f"timm/{name}": tmp_path / "timm" / name for name, _ in FAMILIES})
    for name, kwargs in FAMILIES:  # depth 1, smaller images, fewer classes
        use_stand_in(monkeypatch, name, num_layers=1, resolution=kwargs["img_size"],
                     **{k: v for k, v in kwargs.items() if k == "num_classes"})
    for name, kwargs in FAMILIES:
        assert registry.hub_source(name) == f"hf://timm/{name}"
        model = keras_vit.from_pretrained(name)
        side = model.input.shape[1]
        pre = registry.get_checkpoint(name)["preprocessing"]
        x = keras.ops.image.resize(images, (side, side), interpolation="bilinear",
                                   antialias=False)
        x = (keras.ops.convert_to_numpy(x) / 255 - np.array(pre["mean"])) / np.array(pre["std"])
        got = model.predict(x.astype(np.float32), verbose=0)
        np.testing.assert_allclose(got, np.array(outputs[name]), atol=1e-4, err_msg=name)


# ------------------------------------------------------------------------------------------
# keras-vit checkpoints [PATTERN].


def test_checkpoints_shows_one_entry_whole_by_name(capsys):
    assert cli.main(["checkpoints", "digits"]) == 0
    lines = capsys.readouterr().out.splitlines()
    fields = dict(line.split(None, 1) for line in lines)
    assert fields["name"] == "digits" and fields["size_mib"] == "0.55"
    assert fields["default"] == "false"
    assert json.loads(fields["preprocessing"])["input_size"] == [3, 16, 16]


def test_checkpoints_table_has_top1_size_and_the_default_mark(capsys):
    assert cli.main(["checkpoints", "B/16"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["variant", "resolution", "classes", "top-1", "download",
                                "data", "name"]
    rows = {line.split()[-1]: line for line in lines[1:-1]}
    default = keras_vit.default_checkpoint("B/16")
    assert rows[default].startswith("*") and sum(r.startswith("*") for r in rows.values()) == 1
    assert rows["vit_base_patch16_224.augreg2_in21k_ft_in1k"].split()[:6] == [
        "B/16", "224", "1000", "85.1", "330", "MiB"]
    assert "* marks each variant's default" in lines[-1]


def test_checkpoints_json_has_every_field_and_the_default(capsys):
    assert cli.main(["checkpoints", "vit_base_patch16_224.*", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    by_name = {e["name"]: e for e in registry_file()}
    assert printed and all(e["name"].startswith("vit_base_patch16_224.") for e in printed)
    for entry in printed:
        assert entry == dict(by_name[entry["name"]], default=False)
        assert list(entry["preprocessing"]) == PREPROCESSING_KEYS


@pytest.mark.parametrize("pattern", ["vit_base_patch16_224.augreg3*", "", "["])
def test_checkpoints_matching_nothing_is_one_line(capsys, pattern):
    assert cli.main(["checkpoints", pattern]) == 2
    err = capsys.readouterr().err
    assert err.startswith("keras-vit checkpoints: error: No checkpoint's name, variant or tag "
                          f"matches {pattern!r}.")
    assert err.count("\n") == 1


def test_checkpoints_names_close_names_and_tags_for_a_typo(capsys):
    assert cli.main(["checkpoints", "dinno"]) == 2
    assert "Did you mean 'dino'?" in capsys.readouterr().err
