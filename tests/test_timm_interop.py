"""timm reads the `.safetensors` files keras_vit writes: `timm.create_model("local-dir:DIR",
pretrained=True)` on the folder `keras_vit.weights.writers.save_safetensors` wrote gives keras_vit's
logits.

timm and torch are not dependencies of the package or of its tests: this runs where
`KERAS_VIT_TIMM_PYTHON` names an interpreter that has them (`.ci/run` builds `.venv-timm` and
sets it; the benchmarks' environment from `bash benchmarks/setup_peers.sh` has them too), for
example `KERAS_VIT_TIMM_PYTHON=.venv-bench/bin/python .venv/bin/python -m pytest
tests/test_timm_interop.py`. Elsewhere it is skipped (the `timm_python` fixture)."""

import json
import pathlib
import subprocess

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.weights import writers

ROOT = pathlib.Path(__file__).resolve().parent.parent
# Reads the folder with timm, as a folder and as a file under the config.json's names (the two
# ways the writer's documentation gives), and prints both models' logits of the images as JSON.
READ_WITH_TIMM = """
import json, pathlib, sys
import numpy as np
sys.path.insert(0, {root!r})
from benchmarks.contenders.timm_vit import import_timm
timm, _ = import_timm()
import torch
folder = pathlib.Path({folder!r})
config = json.loads((folder / "config.json").read_text())
models = [timm.create_model("local-dir:" + str(folder), pretrained=True),
          timm.create_model(config["architecture"], pretrained=True, **config["model_args"],
                            pretrained_cfg_overlay=dict(config["pretrained_cfg"],
                                                        file=str(folder / "model.safetensors")))]
images = torch.from_numpy(np.load({images!r}) / 127.5 - 1.0).permute(0, 3, 1, 2).float()
with torch.no_grad():
    print(json.dumps([model.eval()(images).numpy().tolist() for model in models]))
"""


@pytest.mark.parametrize("config", [
    dict(hidden_size=64, num_heads=4, mlp_dim=128),   # a width no paper variant has
    dict(hidden_size=48, num_heads=3, mlp_dim=192, classifier="gap"),
])
def test_timm_reads_the_safetensors_keras_vit_writes(tmp_path, config, timm_python):
    keras.utils.set_random_seed(0)
    model = keras_vit.ViT(image_size=32, patch_size=8, num_layers=2, num_classes=3, **config)
    rng = np.random.default_rng(0)
    model.set_weights([rng.normal(0, 0.2, w.shape).astype(w.dtype) for w in model.get_weights()])
    writers.save_safetensors(model, tmp_path / "model.safetensors", ["a", "b", "c"])
    images = rng.uniform(0, 255, (2, 32, 32, 3)).astype(np.float32)
    np.save(tmp_path / "images.npy", images)
    code = READ_WITH_TIMM.format(root=str(ROOT), folder=str(tmp_path),
                                 images=str(tmp_path / "images.npy"))
    done = subprocess.run([timm_python, "-c", code], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    folder, named = np.array(json.loads(done.stdout.strip().splitlines()[-1]))
    want = keras.ops.convert_to_numpy(model(keras_vit.preprocess_inputs(images)))
    np.testing.assert_allclose(folder, want, atol=1e-5)
    np.testing.assert_allclose(named, want, atol=1e-5)


# timm builds a model, writes it, and gives its logits at other sizes: built at another
# `img_size` from the file (its load-time resize of the position embedding) and, as a model of
# any size (`dynamic_img_size`), on inputs of other sizes (its resize in the forward pass).
TIMM_AT_OTHER_SIZES = """
import json, pathlib, sys
import numpy as np
sys.path.insert(0, {root!r})
from benchmarks.contenders.timm_vit import import_timm
timm, _ = import_timm()
import torch
from timm.models import save_for_hf
torch.manual_seed(0)
args = dict(embed_dim=48, depth=2, num_heads=3, patch_size=8, num_classes=5)
model = timm.create_model("vit_base_patch16_224", img_size=32, **args).eval()
with torch.no_grad():
    for p in model.parameters():
        p.add_(torch.randn_like(p) * 0.1)
    model.head.weight.mul_(5.0)
save_for_hf(model, pathlib.Path({folder!r}), safe_serialization=True)
images = np.load({images!r})
out = dict(loaded={{}}, dynamic={{}})
with torch.no_grad():
    for side in (24, 48, 72):
        resized = timm.create_model("local-dir:" + {folder!r}, img_size=side,
                                    pretrained=True).eval()
        x = torch.from_numpy(images[:, :side, :side]).permute(0, 3, 1, 2).contiguous()
        out["loaded"][side] = resized(x).tolist()
    dynamic = timm.create_model("local-dir:" + {folder!r}, dynamic_img_size=True,
                                pretrained=True).eval()
    for height, width in ((48, 24), (16, 72)):
        x = torch.from_numpy(images[:, :height, :width]).permute(0, 3, 1, 2).contiguous()
        out["dynamic"][f"{{height}}x{{width}}"] = dynamic(x).tolist()
print(json.dumps(out))
"""


def test_a_timm_checkpoint_at_other_sizes_gives_timms_logits(tmp_path, timm_python):
    """timm resizes a checkpoint's position embedding bicubically (antialiased), at load time
    and in a model of any size; keras_vit does the same for timm's checkpoints (the official
    code's linear resize would differ by more than the tolerance, checked)."""
    images = np.random.default_rng(0).uniform(-1, 1, (2, 72, 72, 3)).astype(np.float32)
    np.save(tmp_path / "images.npy", images)
    code = TIMM_AT_OTHER_SIZES.format(root=str(ROOT), folder=str(tmp_path / "timm"),
                                      images=str(tmp_path / "images.npy"))
    done = subprocess.run([timm_python, "-c", code], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    answers = json.loads(done.stdout.strip().splitlines()[-1])
    file = tmp_path / "timm" / "model.safetensors"
    for side, want in answers["loaded"].items():
        side = int(side)
        for resize in ("bicubic", "linear"):
            model = keras_vit.from_pretrained(file, image_size=side, position_resize=resize)
            got = keras.ops.convert_to_numpy(model(images[:, :side, :side]))
            gap = np.abs(got - np.array(want)).max()
            assert gap < 1e-4 if resize == "bicubic" else gap > 1e-2, (side, resize, gap)
    model = keras_vit.from_pretrained(file, dynamic_image_size=True)
    assert keras_vit.vit_config(model)["position_resize"] == "bicubic"
    for size, want in answers["dynamic"].items():
        height, width = map(int, size.split("x"))
        got = keras.ops.convert_to_numpy(model(images[:, :height, :width]))
        np.testing.assert_allclose(got, np.array(want), atol=1e-4, err_msg=size)
