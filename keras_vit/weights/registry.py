"""The checkpoint registry: every official file by name, the shipped demo, and your own.

`checkpoints/registry.json` (installed as `keras_vit_checkpoints`) lists the official
`imagenet21k/`, `imagenet21k+imagenet2012/` and recommended AugReg files with their URL,
variant, resolution, classes and data sets; `register_checkpoint` adds entries for this
process (a mirror, a `file://` path, your own training run).
"""

import copy
import difflib
import functools
import importlib.resources
import json
import re

from keras_vit import configs
from keras_vit.checks import check_bool

_REGISTERED = {}  # name -> entry, added with `register_checkpoint`
URL_SCHEMES = ("http", "https", "file")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+\-]*(/[A-Za-z0-9][A-Za-z0-9._+\-]*)*")
# Each name segment is a folder or file name in the cache (`<segment>.npz` for the last): at
# most 255 bytes on the common file systems.
MAX_SEGMENT = 255 - len(".npz")


@functools.lru_cache(maxsize=None)
def _builtin_entries():
    text = importlib.resources.files("keras_vit_checkpoints").joinpath("registry.json").read_text()
    return {entry["name"]: entry for entry in json.loads(text)["checkpoints"]}


def _registry():
    return {**_builtin_entries(), **_REGISTERED}


def is_registered(name):
    """Whether `name` is a registry name (built in, or registered in this process)."""
    return isinstance(name, str) and name in _registry()


def list_checkpoints(variant=None):
    """Lists the known checkpoints, optionally only those of one variant.

    Args:
        variant: str or None. E.g. "B/16" (any spelling `keras_vit.get_variant` accepts).

    Returns:
        A list of dicts with name, url, variant, resolution, num_classes, representation_size,
        pretraining, finetuning, labels, size_mib, sha256, imagenet_top1, name_source.

    Examples:
    >>> names = [c["name"] for c in list_checkpoints("Ti/16")]
    >>> names[0]
    'augreg/Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0'
    """
    wanted = configs.get_variant(variant).name if variant else None
    return [copy.deepcopy(entry) for entry in _registry().values()
            if wanted is None or entry["variant"] == wanted]


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
        sha256=normalize_sha256(sha256), imagenet_top1=None,
        name_source="registered at run time",
    )
    unknown = sorted(set(info) - set(entry))
    if unknown:
        raise ValueError(f"Unknown registry fields {unknown}. Expected some of {sorted(entry)}.")
    entry.update(info)
    _REGISTERED[name] = entry
    return copy.deepcopy(entry)


def default_checkpoint(variant, image_size=224, num_classes=1000, include_top=True):
    """The checkpoint `pretrained=True` loads for a variant.

    With `include_top` and 1000 classes: the best ImageNet-1k fine-tune, preferring the
    resolution nearest to `image_size` among the best-scoring family (AugReg where it exists,
    else the original `imagenet21k+imagenet2012` files). Otherwise (a new head, or no head):
    the ImageNet-21k pre-trained weights (AugReg where they exist, else `imagenet21k/`).
    ViT-H/14 has no ImageNet-1k fine-tune, so it always gets the ImageNet-21k weights.
    """
    spec = configs.get_variant(variant)
    entries = list_checkpoints(spec.name)
    side = max(image_size) if isinstance(image_size, (tuple, list)) else image_size

    def family_rank(entry):
        return 0 if entry["name"].startswith("augreg/") else 1

    if include_top and num_classes == 1000:
        fine_tuned = [e for e in entries if e["finetuning"] == "imagenet2012"]
        if fine_tuned:
            best = min(family_rank(e) for e in fine_tuned)
            family = [e for e in fine_tuned if family_rank(e) == best]
            return min(family, key=lambda e: abs((e["resolution"] or side) - side))["name"]
    upstream = [e for e in entries if e["finetuning"] is None and e["pretraining"]]
    if not upstream:
        raise ValueError(f"No pretrained checkpoint is registered for ViT-{spec.name}.")
    return min(upstream, key=family_rank)["name"]
