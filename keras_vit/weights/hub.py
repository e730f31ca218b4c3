"""Weights from the Hugging Face Hub and local safetensors files.

- `hf://ORG/NAME[@REVISION]`: a model repository, fetched with `huggingface_hub` (its cache,
  resumable downloads, tokens, `HF_HUB_OFFLINE=1`): its `config.json` and `model.safetensors`;
- a local `.safetensors` file (read with the `safetensors` package's NumPy API: no torch), with
  the `config.json` beside it when there is one.

The key layout (timm, transformers, or the official one) is detected from the key names and
rewritten to the official layout (`keras_vit.weights.torch_layouts`); the architecture comes
from `config.json` (`architecture_from_config`), else from the array shapes.
"""

import json
import os
import re

import huggingface_hub
from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError, LocalEntryNotFoundError
from safetensors import SafetensorError
from safetensors.numpy import load_file

from keras_vit import configs
from keras_vit.weights.errors import CheckpointError, DownloadError
from keras_vit.weights.layouts import config_from_params
from keras_vit.weights.torch_layouts import detect_layout, to_official

HF_SCHEME = "hf://"
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
_REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*/[A-Za-z0-9][A-Za-z0-9_.\-]*")
# timm's ViT defaults (`partial(nn.LayerNorm, eps=1e-6)`, exact GELU).
TIMM_LAYER_NORM_EPSILON = 1e-6
# transformers' `hidden_act` values and the GELU form each names.
TRANSFORMERS_GELU = {"gelu": False, "gelu_new": True, "gelu_pytorch_tanh": True,
                     "gelu_fast": True}


def is_hub(source):
    return isinstance(source, str) and source.startswith(HF_SCHEME)


def parse_hub(source):
    """`hf://ORG/NAME[@REVISION]` as (repo id, revision or None)."""
    spec = source[len(HF_SCHEME):]
    repo, _, revision = spec.partition("@")
    if not _REPO.fullmatch(repo):
        raise ValueError(f"{source!r} is not a Hugging Face model. Expected hf://ORG/NAME or "
                         "hf://ORG/NAME@REVISION, e.g. hf://timm/vit_base_patch16_224.augreg2_in21k_ft_in1k.")
    return repo, revision or None


def read_safetensors(path):
    """The arrays of a `.safetensors` file, as NumPy."""
    path = os.path.expanduser(os.fspath(path))
    if not os.path.isfile(path):
        raise FileNotFoundError(f"No checkpoint file at {path}.")
    try:
        return load_file(path)
    except TypeError as e:  # NumPy has no bfloat16: safetensors' NumPy API refuses it
        raise CheckpointError(f"{path} holds arrays NumPy cannot represent ({e}); keras_vit "
                              "reads float16/float32/float64 safetensors. Expected a float32 "
                              "file (e.g. save it again in float32).") from None
    except (SafetensorError, ValueError, OSError) as e:
        raise CheckpointError(f"{path} is not a readable .safetensors file ({e}).") from None


def hub_files(source):
    """Local paths of `config.json` (or None) and `model.safetensors` of `hf://ORG/NAME`,
    through `huggingface_hub` (downloaded once into its cache; `HF_HUB_OFFLINE=1` reads the
    cache only).

    Raises:
        DownloadError: naming the repository and what to do, when it cannot be fetched.
    """
    repo, revision = parse_hub(source)

    def fetch(name):
        return huggingface_hub.hf_hub_download(repo, name, revision=revision)

    try:
        weights = fetch(WEIGHTS_FILE)
    except EntryNotFoundError as e:
        if isinstance(e, LocalEntryNotFoundError):  # not in the cache, offline
            raise DownloadError(_offline_advice(source, repo, e)) from None
        raise CheckpointError(f"{source} has no {WEIGHTS_FILE}. keras_vit reads safetensors "
                              "weights (no torch): expected a repository that has them.") from None
    except (HfHubHTTPError, OSError, ValueError) as e:
        raise DownloadError(_offline_advice(source, repo, e)) from None
    try:
        config = fetch(CONFIG_FILE)
    except (EntryNotFoundError, LocalEntryNotFoundError, HfHubHTTPError, OSError):
        config = None
    return config, weights


def _offline_advice(source, repo, error):
    first = str(error).splitlines()[0] if str(error) else ""
    return (f"Could not fetch {source} ({type(error).__name__}: {first}). Offline, download it "
            f"where there is internet (`hf download {repo} {CONFIG_FILE} {WEIGHTS_FILE}`), copy "
            "the Hugging Face cache here and set HF_HUB_OFFLINE=1, or pass the local "
            ".safetensors path.")


def read_config(path):
    """A `config.json` as a dict, or None."""
    if path is None or not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path} is not readable JSON ({e}).") from None
    return config if isinstance(config, dict) else None


def _timm_size(architecture):
    """The paper's model size ("Ti" ... "H") of a timm name such as "vit_small_patch8_224"."""
    sizes = {"tiny": "Ti", "small": "S", "base": "B", "large": "L", "huge": "H"}
    match = re.match(r"vit_(tiny|small|base|large|huge)_patch\d+", architecture or "")
    return sizes[match[1]] if match else None


def architecture_from_config(config, params, layout):
    """`keras_vit.ViT` arguments from a Hugging Face `config.json` (timm's or transformers')
    and the official-layout arrays; what the config does not say comes from the arrays.

    Raises:
        CheckpointError: for an architecture keras_vit cannot express, naming the feature.
    """
    shapes = config_from_params(params, _image_size(config))
    arch = dict(shapes)
    if layout == "timm":
        arch.update(gelu_approximate=False, layer_norm_epsilon=TIMM_LAYER_NORM_EPSILON)
        args = dict((config or {}).get("model_args") or {})
        if args.get("global_pool", (config or {}).get("global_pool", "token")) == "avg":
            # The average of the patch tokens, beside a class token where the file has one.
            arch.update(classifier="gap", class_token="cls" in params)
    elif layout == "transformers" and config:
        act = config.get("hidden_act", "gelu")
        if act not in TRANSFORMERS_GELU:
            raise CheckpointError(f"The checkpoint's activation {act!r} is not a GELU keras_vit "
                                  f"expresses (expected one of {sorted(TRANSFORMERS_GELU)}).")
        arch.update(gelu_approximate=TRANSFORMERS_GELU[act],
                    layer_norm_epsilon=float(config.get("layer_norm_eps", 1e-12)))
    return arch


def _image_size(config):
    if not config:
        return None
    size = config.get("image_size") or ((config.get("pretrained_cfg") or {}).get("input_size")
                                        or [None])[-2:]
    if isinstance(size, int):
        return size
    if isinstance(size, (list, tuple)) and len(size) == 2 and all(isinstance(v, int) for v in size):
        return tuple(size)
    return None


def class_names_from_config(config):
    """Class names from a transformers `id2label` or timm `label_names`, else None."""
    if not config:
        return None
    if isinstance(config.get("id2label"), dict):
        labels = config["id2label"]
        try:
            return [labels[str(i)] for i in range(len(labels))]
        except KeyError:
            return None
    names = config.get("label_names")
    return list(names) if isinstance(names, list) else None


def _config_heads(config, layout):
    """The number of heads a Hugging Face config gives, or None."""
    if not config:
        return None
    if layout == "transformers":
        return config.get("num_attention_heads")
    heads = (config.get("model_args") or {}).get("num_heads")
    size = _timm_size(config.get("architecture"))
    if heads is None and size:
        heads = configs.MODEL_SIZES[size]["num_heads"]
    return heads


def load_torch_layout(params, config, num_heads=None):
    """(official-layout arrays, ViT arguments, class names) of a timm or transformers file.
    `num_heads` overrides what the config says (and is needed where there is none and the
    width is not a paper variant's)."""
    layout = detect_layout(params)
    heads = num_heads if num_heads is not None else _config_heads(config, layout)
    official = to_official(params, layout, heads)
    architecture = architecture_from_config(config, official, layout)
    if heads is not None:
        architecture["num_heads"] = int(heads)
    return official, architecture, class_names_from_config(config)
