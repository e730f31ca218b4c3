"""The checkpoint registry: every official file by name, timm's ViTs, the shipped demo, and
your own.

`checkpoints/registry.json` (installed as `keras_vit_checkpoints`, written by
`checkpoints/make_registry.py`) lists the official `imagenet21k/`, `imagenet21k+imagenet2012/`
and recommended AugReg files, and the ViT checkpoints timm publishes on the Hugging Face Hub
that keras_vit loads exactly (under their timm names, e.g.
"vit_base_patch16_224.augreg2_in21k_ft_in1k", from `hf://timm/<name>`), each with its URL,
variant, resolution, classes, data sets, size, licence, ImageNet top-1 (and its source) and
preprocessing (timm's data-config fields); `register_checkpoint` adds entries for this process
(a mirror, a `file://` path, your own training run).
"""

import copy
import difflib
import functools
import importlib.resources
import json
import re

from keras_vit import configs
from keras_vit.checks import check_bool
from keras_vit.weights import entries as queries

_REGISTERED = {}  # name -> entry, added with `register_checkpoint`
URL_SCHEMES = ("http", "https", "file")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+\-]*(/[A-Za-z0-9][A-Za-z0-9._+\-]*)*")
# Each name segment is a folder or file name in the cache (`<segment>.npz` for the last): at
# most 255 bytes on the common file systems.
MAX_SEGMENT = 255 - len(".npz")


def is_url(source):
    """Whether `source` is an http(s):// or file:// URL."""
    return isinstance(source, str) and source.split("://", 1)[0] in URL_SCHEMES \
        and "://" in source


@functools.lru_cache(maxsize=None)
def _builtin_entries():
    text = importlib.resources.files("keras_vit_checkpoints").joinpath("registry.json").read_text()
    return {entry["name"]: entry for entry in json.loads(text)["checkpoints"]}


def _registry():
    return {**_builtin_entries(), **_REGISTERED}


def is_registered(name):
    """Whether `name` is a registry name (built in, or registered in this process)."""
    return isinstance(name, str) and name in _registry()


def list_checkpoints(pattern=None):
    """Lists the known checkpoints, optionally those a pattern matches.

    Args:
        pattern: str or None. A shell-style pattern (`*`, `?`, `[...]`, any case) matched
            against each name, variant and tag (e.g. "vit_base_patch16*", "B/16", "dino",
            "*in21k*"); a variant in any spelling `keras_vit.get_variant` accepts ("ViT_B16")
            matches that variant's checkpoints. None lists them all.

    Returns:
        A list of dicts with name, url, variant, resolution, num_classes, representation_size,
        pretraining, finetuning, labels, size_mib, sha256, imagenet_top1 (and its source),
        license, preprocessing, tags, name_source, and `default`: whether it is its variant's
        `pretrained=True` (and `--weights default`) checkpoint at 224 px with 1000 classes.

    Examples:
    >>> names = [c["name"] for c in list_checkpoints("Ti/16")]
    >>> names[0]
    'augreg/Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0'
    >>> len(list_checkpoints("vit_base_patch16_224.augreg2*"))
    1
    """
    entries = queries.with_defaults([copy.deepcopy(e) for e in _registry().values()])
    if pattern is None:
        return entries
    if not isinstance(pattern, str):
        raise ValueError(f"`pattern` must be a string such as 'vit_base*' or 'B/16'. Received: "
                         f"{pattern!r}")
    return queries.matching(entries, pattern, _variant_name(pattern))


def _variant_name(text):
    """The variant `text` spells ("ViT_B16" -> "B/16"), or None."""
    try:
        return configs.get_variant(text).name
    except ValueError:
        return None


def get_checkpoint(name):
    """The registry entry called `name`; a ValueError naming close matches if there is none."""
    entries = _registry()
    if name not in entries:
        close = difflib.get_close_matches(str(name), list(entries), n=3, cutoff=0.5)
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        raise ValueError(
            f"Unknown checkpoint {name!r}.{hint} Expected a registry name (see "
            "keras_vit.list_checkpoints()), a local .npz path or an http(s):// or file:// URL.")
    return copy.deepcopy(entries[name])


def normalize_sha256(sha256, what="sha256"):
    """A SHA-256 hex digest in lower case, or None; ValueError for anything else."""
    if sha256 is None:
        return None
    digest = sha256.strip().lower() if isinstance(sha256, str) else None
    if digest is None or not _SHA256.fullmatch(digest):
        raise ValueError(f"`{what}` must be a SHA-256 hex digest (64 hexadecimal digits). "
                         f"Received: {sha256!r}")
    return digest


def register_checkpoint(name, url, variant=None, sha256=None, overwrite=False, **info):
    """Adds a checkpoint to the registry for this process (e.g. a mirror or your own file).

    A name of the built-in registry (the official files, the shipped `digits`) is replaced
    only with `overwrite=True`; a name registered at run time is replaced by the new entry.

    Args:
        name: str. Registry name: letters, digits and `._+-`, segments joined by `/` (no `..`).
        url: str. `http(s)://` or `file://` URL of the `.npz`.
        variant: str or None. The ViT variant, e.g. "B/16"; None for another architecture,
            which is then read off the file (or from `config=`).
        sha256: str or None. Expected SHA-256 of the file; checked on download and on every
            cache hit.
        overwrite: bool. Replace a built-in entry of the same name. Defaults to False.
        **info: other registry fields (resolution, num_classes, representation_size,
            class_names, config, ...).

    Returns:
        A copy of the entry.
    """
    if not isinstance(name, str) or not _NAME.fullmatch(name) or ".." in name.split("/"):
        raise ValueError(f"Checkpoint name {name!r} is not valid. Expected letters, digits and "
                         "'._+-', in segments joined by '/' (e.g. 'mine/vit-b16-cifar').")
    if name in _builtin_entries() and not check_bool("overwrite", overwrite):
        raise ValueError(f"Checkpoint name {name!r} is a built-in registry entry. Expected "
                         "another name, or overwrite=True to replace it in this process.")
    longest = max(name.split("/"), key=len)
    if len(longest) > MAX_SEGMENT:
        raise ValueError(f"Checkpoint name {name[:40]!r}... has a segment of {len(longest)} "
                         f"characters, too long for a file name in the cache. Expected segments "
                         f"of at most {MAX_SEGMENT} characters.")
    scheme = url.split("://", 1)[0] if isinstance(url, str) and "://" in url else None
    if scheme not in URL_SCHEMES:
        raise ValueError(f"Checkpoint URL {url!r} is not understood. Expected an http://, "
                         "https:// or file:// URL.")
    entry = dict(
        name=name, url=url, file=None,
        variant=configs.get_variant(variant).name if variant is not None else None,
        config=None, resolution=None, num_classes=None, representation_size=None,
        pretraining=None, finetuning=None, labels=None, class_names=None, size_mib=None,
        sha256=normalize_sha256(sha256), imagenet_top1=None, imagenet_top1_source=None,
        license=None, preprocessing=None, tags=[], name_source="registered at run time",
    )
    unknown = sorted(set(info) - set(entry))
    if unknown:
        raise ValueError(f"Unknown registry fields {unknown}. Expected some of {sorted(entry)}.")
    entry.update(info)
    _REGISTERED[name] = entry
    return copy.deepcopy(entry)


def hub_source(name):
    """The `hf://` source of a registry name whose weights are on the Hugging Face Hub (timm's
    files: "vit_small_patch16_224.dino" -> "hf://timm/vit_small_patch16_224.dino"), else
    None."""
    entry = _registry().get(name) if isinstance(name, str) else None
    url = entry and entry.get("url")
    return url if isinstance(url, str) and url.startswith(queries.HUB_PREFIX) else None


def default_checkpoint(variant, image_size=224, num_classes=1000, include_top=True):
    """The checkpoint `pretrained=True` loads for a variant.

    With `include_top` and 1000 classes: the best ImageNet-1k fine-tune, preferring the
    resolution nearest to `image_size` among the best-scoring family (AugReg where it exists,
    else the original `imagenet21k+imagenet2012` files). Otherwise (a new head, or no head):
    the ImageNet-21k pre-trained weights (AugReg where they exist, else `imagenet21k/`).
    ViT-H/14 has no ImageNet-1k fine-tune, so it always gets the ImageNet-21k weights. The
    paper's own files only: timm's are loaded by name (see `list_checkpoints`).
    """
    spec = configs.get_variant(variant)
    side = max(image_size) if isinstance(image_size, (tuple, list)) else image_size
    name = queries.default_name(list(_registry().values()), spec.name, side, num_classes,
                                include_top)
    if name is None:
        raise ValueError(f"No pretrained checkpoint is registered for ViT-{spec.name}.")
    return name
