"""Pretrained weights: the checkpoint registry, the download cache, and loading by name.

`pretrained=` (on every builder) and `load_pretrained(model, source)` take:

- `True`: the documented default for the variant (see `default_checkpoint`);
- a registry name, e.g. "imagenet21k/ViT-B_16" (see `list_checkpoints()`);
- a local `.npz` path;
- an `http(s)://` or `file://` URL.

Files are cached under `$KERAS_VIT_HOME` (default `~/.keras/keras_vit`), written atomically
(a partial download never has the final name) under a lock, so that two processes fetching
the same file download it once and never see half of it.
"""

import contextlib
import copy
import difflib
import hashlib
import importlib.resources
import json
import os
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request

from keras_vit import checkpoint, configs

_REGISTERED = {}  # name -> entry, added with `register_checkpoint`
_CHUNK = 1 << 20


class DownloadError(OSError):
    """A checkpoint could not be fetched; the message says where to put it by hand."""


# --------------------------------------------------------------------------------------------
# The registry.


def _builtin_registry():
    text = importlib.resources.files("keras_vit.checkpoints").joinpath("registry.json").read_text()
    return {entry["name"]: entry for entry in json.loads(text)["checkpoints"]}


def _registry():
    entries = _builtin_registry()
    entries.update(_REGISTERED)
    return entries


def list_checkpoints(variant=None):
    """Lists the known checkpoints, optionally only those of one variant.

    Args:
        variant: str or None. E.g. "B/16" (any spelling `keras_vit.get_variant` accepts).

    Returns:
        A list of dicts with name, url, variant, resolution, num_classes, representation_size,
        pretraining, finetuning, labels, size_mib, sha256, imagenet_top1, name_source.

    Example:
    >>> [c["name"] for c in list_checkpoints("Ti/16")][:1]
    ['augreg/Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0']
    """
    wanted = configs.get_variant(variant).name if variant else None
    return [
        copy.deepcopy(entry)
        for entry in _registry().values()
        if wanted is None or entry["variant"] == wanted
    ]


def get_checkpoint(name):
    """The registry entry called `name`; a ValueError naming close matches if there is none."""
    entries = _registry()
    if name not in entries:
        close = difflib.get_close_matches(name, list(entries), n=3, cutoff=0.5)
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        raise ValueError(
            f"Unknown checkpoint {name!r}.{hint} Expected a registry name (see "
            "keras_vit.list_checkpoints()), a local .npz path or an http(s):// or file:// URL."
        )
    return copy.deepcopy(entries[name])


def register_checkpoint(name, url, variant, sha256=None, **info):
    """Adds a checkpoint to the registry for this process (e.g. a mirror or your own file).

    Args:
        name: str. Registry name.
        url: str. `http(s)://` or `file://` URL of the `.npz`.
        variant: str. The ViT variant, e.g. "B/16".
        sha256: str or None. Expected SHA-256 of the file; checked on download and on every
            cache hit.
        **info: other registry fields (resolution, num_classes, representation_size, labels...).
    """
    entry = dict(
        name=name,
        url=url,
        variant=configs.get_variant(variant).name,
        resolution=None,
        num_classes=None,
        representation_size=None,
        pretraining=None,
        finetuning=None,
        labels=None,
        size_mib=None,
        sha256=sha256,
        imagenet_top1=None,
        name_source="registered at run time",
    )
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


# --------------------------------------------------------------------------------------------
# The cache and downloads.


def cache_dir():
    """Where downloads are cached: `$KERAS_VIT_HOME`, default `~/.keras/keras_vit`."""
    return os.environ.get("KERAS_VIT_HOME") or os.path.join(
        os.path.expanduser("~"), ".keras", "keras_vit"
    )


def _cache_path_for_url(url):
    tail = os.path.basename(urllib.parse.unquote(urllib.parse.urlparse(url).path)) or "file.npz"
    digest = hashlib.sha256(url.encode()).hexdigest()[:12]
    return os.path.join(cache_dir(), "urls", f"{digest}-{tail}")


def cache_path(entry):
    """The cached file of a registry entry: `<cache_dir>/<name>.npz`."""
    return os.path.join(cache_dir(), *entry["name"].split("/")) + ".npz"


def sha256sum(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


@contextlib.contextmanager
def _file_lock(path):
    """An exclusive lock beside `path`, so that concurrent fetches of one file download once."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".lock", "a+b") as lock:
        try:
            import fcntl
        except ImportError:  # Windows: the atomic rename still keeps the cache consistent.
            yield
            return
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def download(url, path, sha256=None, progress=True):
    """Downloads `url` to `path` through a temporary file renamed into place.

    Raises:
        DownloadError: if the URL cannot be fetched (naming the URL and the path where a file
            downloaded by hand should go) or the file's SHA-256 is not `sha256`.
    """
    import keras

    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".download-", suffix=".part")
    digest = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=60) as response:
            total = int(response.headers.get("Content-Length") or 0) or None
            bar = keras.utils.Progbar(total, unit_name="B") if progress and total else None
            done = 0
            if progress:
                print(f"Downloading {url}", file=sys.stderr)
            for chunk in iter(lambda: response.read(_CHUNK), b""):
                out.write(chunk)
                digest.update(chunk)
                done += len(chunk)
                if bar:
                    bar.update(done)
            out.flush()
            os.fsync(out.fileno())
        if total is not None and done != total:
            raise DownloadError(f"Download of {url} stopped after {done} of {total} bytes.")
        if sha256 and digest.hexdigest() != sha256:
            raise DownloadError(
                f"The file downloaded from {url} has SHA-256 {digest.hexdigest()}, expected "
                f"{sha256}. It was not kept."
            )
        os.replace(tmp, path)
    except (urllib.error.URLError, OSError) as e:
        if isinstance(e, DownloadError):
            raise
        raise DownloadError(
            f"Could not download {url}: {getattr(e, 'reason', e)}. If this machine is offline, "
            f"download that file elsewhere and put it at {path} (or pass its local path as "
            "`pretrained=`)."
        ) from e
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path


def _fetch_valid(url, path, sha256, progress):
    """Returns the parameters of a cached file, downloading it (again) when absent or bad."""
    with _file_lock(path):
        for attempt in range(2):
            if not os.path.exists(path):
                download(url, path, sha256=sha256, progress=progress)
            try:
                if sha256 and sha256sum(path) != sha256:
                    raise checkpoint.CheckpointError(f"{path} does not have SHA-256 {sha256}")
                return checkpoint.read_npz(path)
            except checkpoint.CheckpointError as e:
                if attempt:
                    raise
                print(f"Cached {path} is damaged ({e}); fetching it again.", file=sys.stderr)
                os.remove(path)


def _read_shipped(entry):
    """Reads a checkpoint shipped inside the package, checking its registered SHA-256."""
    resource = importlib.resources.files("keras_vit.checkpoints").joinpath(entry["file"])
    with importlib.resources.as_file(resource) as path:
        if entry["sha256"] and sha256sum(path) != entry["sha256"]:
            raise checkpoint.CheckpointError(
                f"The shipped checkpoint {path} does not have its registered SHA-256 "
                f"{entry['sha256']}: the installation is damaged or the file was replaced."
            )
        return checkpoint.read_npz(path)


def _is_url(source):
    return isinstance(source, str) and source.split("://", 1)[0] in ("http", "https", "file")


def fetch_params(source, progress=True):
    """Reads a checkpoint from a registry name, local path or URL.

    Returns:
        (params, entry): the arrays by key, and the registry entry (None for paths and URLs).
    """
    if isinstance(source, os.PathLike) or (isinstance(source, str) and not _is_url(source)):
        path = os.fspath(source)
        if os.path.exists(path):
            return checkpoint.read_npz(path), None
        if path not in _registry() and (path.endswith(".npz") or path.startswith((".", "/", "~"))):
            raise FileNotFoundError(f"No checkpoint file at {path}.")
        entry = get_checkpoint(path)
        if entry.get("file"):
            return _read_shipped(entry), entry
        return _fetch_valid(entry["url"], cache_path(entry), entry["sha256"], progress), entry
    if _is_url(source):
        return _fetch_valid(source, _cache_path_for_url(source), None, progress), None
    raise ValueError(
        f"pretrained={source!r} is not understood. Expected True, a registry name, a local "
        ".npz path or an http(s):// or file:// URL."
    )


# --------------------------------------------------------------------------------------------
# Loading into models.


def load_pretrained(model, source, progress=True):
    """Loads a checkpoint into a built `keras_vit` model, all or nothing.

    The position embedding is resized to the model's patch grid; the head loads only if the
    model's head has the file's number of classes (otherwise it stays a fresh zero head, for
    fine-tuning); `pre_logits` loads only into a representation layer of the same size.

    Args:
        model: a model from `keras_vit.ViT` or a named builder.
        source: a registry name, a local `.npz` path or an `http(s)://` / `file://` URL.
        progress: bool. Show a progress bar while downloading. Defaults to True.

    Returns:
        A dict: `skipped` (file keys not loaded), `fresh` (model layers left at their initial
        values), `entry` (the registry entry, or None).

    Raises:
        keras_vit.checkpoint.CheckpointError: when the file does not fit the model (listing
            missing keys, unexpected keys and shape mismatches) or is not a valid checkpoint.
    """
    if source is True:
        raise ValueError(
            "load_pretrained needs a registry name, path or URL; `True` only works on the "
            "named builders, which know their variant."
        )
    params, entry = fetch_params(source, progress=progress)
    report = checkpoint.load_params(model, params)
    report["entry"] = entry
    return report


def from_pretrained(source, progress=True, **overrides):
    """Builds the model a checkpoint describes and loads it: no architecture to spell out.

    Args:
        source: a registry name (e.g. "digits", "imagenet21k/ViT-B_16"), a local `.npz` path
            or a URL. For registry entries of a paper variant, the variant at the entry's
            resolution and classes; otherwise the architecture read off the file's shapes.
        progress: bool. Show a download progress bar. Defaults to True.
        **overrides: arguments of `keras_vit.ViT` to change (e.g. `image_size`, `num_classes`,
            `include_top`); position embeddings and head follow the usual loading rules.

    Example:
    >>> model = from_pretrained("digits")  # the shipped demo, 10 classes at 16x16
    """
    import keras_vit.model

    params, entry = fetch_params(source, progress=progress)
    if entry and entry.get("variant"):
        kwargs = dict(image_size=entry["resolution"] or 224, num_classes=entry["num_classes"])
        kwargs.update(overrides)
        return keras_vit.model.create_model(entry["variant"], pretrained=entry["name"], **kwargs)
    config = dict(entry["config"]) if entry and entry.get("config") else (
        checkpoint.config_from_params(params))
    config.update(overrides)
    model = keras_vit.model.ViT(name=config.pop("name", None) or _model_name(source), **config)
    checkpoint.load_params(model, params)
    return model


def _model_name(source):
    stem = os.path.basename(os.fspath(source)).removesuffix(".npz")
    return "vit_" + "".join(c if c.isalnum() else "_" for c in stem).strip("_").lower()


def build_pretrained(spec, source, kwargs):
    """Builds variant `spec` with the keyword arguments `kwargs` and loads `source` into it."""
    import keras_vit.model

    if source is True:
        source = default_checkpoint(
            spec, kwargs["image_size"], kwargs["num_classes"], kwargs["include_top"]
        )
    if isinstance(source, str) and source in _registry():
        entry = get_checkpoint(source)
        if entry["variant"] != spec.name:
            raise ValueError(
                f"Checkpoint {source!r} is a ViT-{entry['variant']} checkpoint; "
                f"{spec.builder_name} builds ViT-{spec.name}."
            )
        # Reproduce the released network when its classifier is kept whole.
        same_head = kwargs["include_top"] and kwargs["num_classes"] == entry["num_classes"]
        if same_head and entry.get("representation_size") and "representation_size" not in kwargs:
            kwargs["representation_size"] = entry["representation_size"]
    model = keras_vit.model.ViT(**kwargs)
    load_pretrained(model, source)
    return model
