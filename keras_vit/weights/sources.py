"""Where weights come from: registry names, local files and URLs.

`pretrained=` (on every builder), `load_pretrained(model, source)` and the command line's
`--weights` take:

- `True`: the documented default for the variant (see `default_checkpoint`);
- a registry name, e.g. "imagenet21k/ViT-B_16" or timm's
  "vit_base_patch16_224.augreg2_in21k_ft_in1k" (see `list_checkpoints()`);
- a local `.npz` path (`~` is expanded);
- an `http(s)://` or `file://` URL (downloaded once into the cache);
- `hf://ORG/NAME[@REVISION]` on the Hugging Face Hub, or a local `.safetensors` file (or the
  folder holding it as `model.safetensors`), in timm's or transformers' layout
  (`keras_vit.weights.hub`);
- a keras-hub ViT preset folder (`keras_vit.weights.keras_hub`).

Each source may state the preprocessing its weights expect, its data config
(`checkpoint_data_config`): a registry entry's `preprocessing`, a keras-hub preset's image
converter, a `.safetensors` file's metadata, or the `config.json` beside a file.
"""

import functools
import importlib.resources
import os
import re

import huggingface_hub
import numpy as np

from keras_vit import configs
from keras_vit.checks import to_pair
from keras_vit.positions import model_image_size
from keras_vit.preprocessing import (DEFAULT_IMAGE_SIZE, check_data_config,
                                     paper_data_config, timm_data_config, with_image_size)
from keras_vit.weights import download, hub, keras_hub, keras_hub_handles, registry
from keras_vit.weights.architecture import stated_image_size
from keras_vit.weights.config_json import KERAS_VIT_FORMAT, WRITTEN_BY, read_json, timm_layout
from keras_vit.weights.errors import CheckpointError
from keras_vit.weights.loading import file_grid, load_params, match_params
from keras_vit.weights.npz import open_npz


def checkpoint_file(source):
    """The weights file a folder stands for: the `model.safetensors` of a folder holding one
    (as timm's `save_for_hf` and transformers' `save_pretrained` write it, and as `hf://`
    reads a repository) that is not a keras-hub preset; else `source` itself (a registry name
    first)."""
    if registry.is_registered(source) or not keras_hub.is_folder(source):
        return source
    folder = os.path.expanduser(os.fspath(source))
    weights = os.path.join(folder, hub.WEIGHTS_FILE)
    if os.path.isfile(os.path.join(folder, keras_hub.METADATA_FILE)) \
            or not os.path.isfile(weights):
        return source
    return weights


def check_source(source):
    """Raises ValueError for a source that is not a name, path or URL, or a URL of a scheme
    keras_vit does not read (ftp://, s3://)."""
    if not isinstance(source, (str, os.PathLike)) or isinstance(source, bytes):
        raise ValueError(f"pretrained={source!r} is not understood. Expected a registry name, a "
                         f"local .npz or .safetensors path, or a {SCHEMES_TEXT} URL.")
    scheme = re.match(r"([A-Za-z][A-Za-z0-9+.-]*)://", os.fspath(source))
    if scheme and scheme[1].lower() not in (*registry.URL_SCHEMES, hub.HF_SCHEME.split(":")[0],
                                            keras_hub_handles.KAGGLE_SCHEME.split(":")[0]):
        raise ValueError(f"Checkpoint source {os.fspath(source)}: unsupported URL scheme "
                         f"{scheme[1]!r}; expected a local path, {SCHEMES_TEXT}.")


SCHEMES_TEXT = "file://, http(s)://, hf:// or kaggle://"


def _read_shipped(entry, read):
    """`read(path)` of a checkpoint shipped inside the package, checking its registered
    SHA-256."""
    resource = importlib.resources.files("keras_vit_checkpoints").joinpath(entry["file"])
    with importlib.resources.as_file(resource) as path:
        if entry["sha256"] and download.sha256sum(path) != entry["sha256"]:
            raise CheckpointError(
                f"The shipped checkpoint {path} does not have its registered SHA-256 "
                f"{entry['sha256']}: the installation is damaged or the file was replaced.")
        return read(path)


def fetch_params(source, progress=True, num_heads=None, check=None, verify=True):
    """Reads a checkpoint from a registry name, local path or URL.

    `check(placeholders, entry)`, where given, is called before any array is read: the
    placeholders (`keras_vit.weights.npz.placeholder`) have the shapes and dtypes the file's
    headers declare, in the layout the returned arrays will have; it raises to refuse the file
    (e.g. `keras_vit.weights.loading.match_params` with `check_values=False`).

    With `check`, the arrays of an `.npz` or `.safetensors` file are verified before they are
    returned (one pass over the file: every `.npz` member's CRC, every array's non-finite
    values), so that a loader can refuse the file before it changes a model. `verify=False`
    leaves that to the loader, which then checks each array as it reads it (for a model that
    nothing else holds yet, which a refusal part-way cannot leave half-changed): the file is
    read once. A download cached without a registered digest is verified all the same, where
    its damage is found in time to fetch it again.

    Returns:
        (params, entry): the arrays by key (with `check`, those of an `.npz` or `.safetensors`
        file verified, as `keras_vit.weights.npz.Deferred`s read on use), and the registry
        entry (None for
        `.npz` paths and URLs; for safetensors, an entry with the `config` and `class_names`
        the file's `config.json` gives; for a keras-hub preset folder, one with its `config`
        and `preprocessing`, see `keras_vit.weights.keras_hub.read_preset`).

    Raises:
        ValueError: for a source that is none of these (naming close registry names).
        FileNotFoundError: for a path with no file.
        CheckpointError, DownloadError: for a bad file or a failed download.
    """
    check_source(source)
    with hub.bars(progress):  # huggingface_hub's, as `progress` asks of the library's own
        return _fetch(checkpoint_file(source), progress, num_heads, check, verify)


def _fetch(source, progress, num_heads, check, verify):
    """`fetch_params` of a checked `source`."""
    preset = _keras_hub_preset(source)
    if preset is not None:
        params, entry = keras_hub.read_preset(preset)
        entry["name"] = os.fspath(source)
        if check is not None:
            check(params, entry)
        return params, entry
    on_hub = source if hub.is_hub(source) else registry.hub_source(source)
    if on_hub:  # hf://ORG/NAME, or a registry name of a file there (timm's)
        config_path, weights_path = hub.hub_files(on_hub)
        registered = registry.get_checkpoint(source) if registry.is_registered(source) else None
        return _torch_layout(weights_path, config_path, source, num_heads, check, verify,
                             registered)
    if isinstance(source, (str, os.PathLike)) and os.fspath(source).endswith(".safetensors"):
        path = os.path.expanduser(os.fspath(source))
        config = hub.beside(path)  # None where keras_vit wrote it for another file
        return _torch_layout(path, config, source, num_heads, check, verify)
    if isinstance(source, (str, os.PathLike)) and os.fspath(source).endswith(".keras"):
        raise CheckpointError(
            f"{source} is a whole Keras model (.keras), not a checkpoint of weights: load it with "
            "keras_vit.load_model(path) (--model on the command line). Expected an .npz or "
            ".safetensors file, a keras-hub preset folder, a registry name or a URL here.")
    opened, entry, refetched_if_damaged = _npz_reader(source, progress)
    if check is None:
        return opened(lambda path: open_npz(path).read()), entry
    # One fetch and one digest: the headers checked, then the data verified. A refusal is
    # returned, not raised, through `download.fetch_cached`, which fetches a cached file again
    # where reading it raises a CheckpointError (a damaged file).
    params = opened(functools.partial(_verified_if_it_fits, check, entry,
                                      verify or refetched_if_damaged))
    if isinstance(params, CheckpointError):
        raise params
    return params, entry


def _verified_if_it_fits(check, entry, verify, path):
    """The arrays of the `.npz` at `path` (verified: `NpzCheckpoint.verified`, else
    `NpzCheckpoint.deferred`) once `check(placeholders, entry)` has passed on its headers,
    before any data is read; else the CheckpointError it raised."""
    checkpoint = open_npz(path)
    try:
        check(checkpoint.placeholders(), entry)
    except CheckpointError as e:
        return e
    return checkpoint.verified() if verify else checkpoint.deferred()


def _keras_hub_preset(source):
    """The local folder of the keras-hub preset `source` is, names or is a handle of, or None:
    a folder (not a registry name); keras-hub's name of a ViT preset or a `kaggle://` handle;
    a `hf://` repository whose `config.json` is a keras-hub `ViTBackbone`'s (all fetched by
    keras-hub's own resolver into its cache)."""
    if registry.is_registered(source):
        return None
    if keras_hub.is_folder(source):
        return source
    if keras_hub_handles.is_preset_name(source):
        return keras_hub_handles.fetch_preset(source)
    if hub.is_hub(source) and keras_hub_handles.is_hub_preset(hub.hub_config(source)):
        return keras_hub_handles.fetch_preset(source)
    return None


def _npz_reader(source, progress):
    """(`opened(read)`, registry entry or None, whether a damaged file is fetched again only
    where `read` finds the damage): `opened(read)` is `read(path)` of the `.npz` of a registry
    name, URL or local path (a cached file is fetched again where it fails its registered
    digest or `read`)."""
    if registry.is_registered(source):
        entry = registry.get_checkpoint(source)
        if entry.get("file"):
            return lambda read: _read_shipped(entry, read), entry, False
        path = download.cache_path(entry["name"])
        return lambda read: download.fetch_cached(entry["url"], path, entry["sha256"], read,
                                                  progress), entry, not entry.get("sha256")
    if registry.is_url(source):
        return lambda read: download.fetch_cached(source, download.url_cache_path(source), None,
                                                  read, progress), None, True
    if isinstance(source, (str, os.PathLike)):
        text = os.fspath(source)
        path = os.path.expanduser(text)
        if os.path.exists(path) or text.endswith(".npz") or text.startswith((".", "~", os.sep)):
            return lambda read: read(path), None, False
        registry.get_checkpoint(path)  # raises, naming close registry names
    raise ValueError(
        f"pretrained={source!r} is not understood. Expected True, a registry name, a local "
        ".npz path or an http(s):// or file:// URL.")


def _torch_layout(weights_path, config_path, source, num_heads, check, verify,
                  registered=None):
    """A safetensors file in the official layout, and an entry describing its architecture
    (`num_heads`: for files whose config does not say, or that have none). The file of a
    registry name (`registered`: its entry) must be the architecture that entry names."""
    def entry_of(config, class_names):
        return dict(name=str(source), url=None, variant=None, config=config,
                    class_names=class_names, num_classes=config.get("num_classes"),
                    representation_size=config.get("representation_size"), sha256=None)

    def check_headers(placeholders, config, class_names):
        if registered is not None:
            check_registered(config, registered, weights_path)
        if check is not None:
            check(placeholders, entry_of(config, class_names))

    params, config, class_names = hub.load_safetensors(weights_path, config_path, num_heads,
                                                       check_headers, verify)
    if check is None:  # arrays, as an .npz's without a check
        params = {key: np.asarray(value) for key, value in params.items()}
    return params, entry_of(config, class_names)


# What a registry entry fixes of the file it names, beyond its digest.
REGISTERED_FACTS = ("hidden_size", "num_layers", "num_heads", "mlp_dim", "patch_size",
                    "image_size", "num_classes")


def _registered_facts(entry):
    """The architecture a registry entry names: its variant's (or `config`'s) sizes, its
    resolution and its number of classes (0: no head)."""
    if entry.get("variant"):
        facts = configs.get_variant(entry["variant"]).config()
    else:
        facts = dict(entry.get("config") or {})
    if entry.get("resolution"):
        facts["image_size"] = entry["resolution"]
    facts["num_classes"] = entry.get("num_classes") or 0
    for pair in ("patch_size", "image_size"):
        if pair in facts:
            facts[pair] = list(to_pair(pair, facts[pair]))
    return {name: facts[name] for name in REGISTERED_FACTS if name in facts}


def check_registered(config, entry, path):
    """Raises unless the architecture a file's config describes (`config`: `keras_vit.ViT`
    arguments) is the one its registry entry names: a cache or mirror holding another model
    under the name would otherwise load it under that name.

    Raises:
        CheckpointError: naming the file, the registry name and the first difference.
    """
    found = dict(config)
    if not found.get("include_top", True):
        found["num_classes"] = 0
    for pair in ("patch_size", "image_size"):
        if found.get(pair) is not None:
            found[pair] = list(to_pair(pair, found[pair]))
    for name, expected in _registered_facts(entry).items():
        if found.get(name) is not None and found[name] != expected:
            raise CheckpointError(
                f"{path} is not the checkpoint {entry['name']!r} names: it has {name} "
                f"{found[name]}, the registry's entry {expected}. Expected the file of that "
                "name (a cache or mirror holding another model under it?).")


def load_pretrained(model, source, progress=True):
    """Loads a checkpoint into a built `keras_vit` model, all or nothing.

    The position embedding is resized to the model's patch grid, from the file's own grid
    where its image size is recorded (its registry entry, `config.json` or metadata), else
    from a square one; the head loads only if the model's head has the file's number of
    classes (otherwise it stays a fresh zero head, for fine-tuning); `pre_logits` loads only
    into a representation layer of the same size.
    The model then carries the checkpoint's data config as `model.data_config`, as a model
    from `keras_vit.from_pretrained` does (see `keras_vit.resolve_data_config`): its registry
    entry's `preprocessing`, else what the file's metadata or the `config.json` beside it
    states, else None (the paper's preprocessing).

    Args:
        model: a model from `keras_vit.ViT` or a named builder.
        source: str or path. A registry name, a local `.npz` or `.safetensors` path, an
            `http(s)://` / `file://` URL, `hf://ORG/NAME`, a folder holding `model.safetensors`
            or a keras-hub preset folder.
        progress: bool. While a URL downloads, say which on stderr, and draw a bar where
            standard output is a terminal or a notebook. Defaults to True. `huggingface_hub`'s
            bars of an `hf://` download show where standard error is one, and not with False
            (its `HF_HUB_DISABLE_PROGRESS_BARS` wins where set).

    Returns:
        A dict: `skipped` (file keys not loaded), `fresh` (model layers left at their initial
        values), `entry` (the registry entry, or None).

    Raises:
        keras_vit.CheckpointError: when the file does not fit the model (listing missing
            keys, unexpected keys, shape mismatches and bad arrays) or is not a valid
            checkpoint; the model is then unchanged.
    """
    if source is True:
        raise ValueError(
            "load_pretrained needs a registry name, path or URL; `True` only works on the "
            "named builders, which know their variant.")
    source = checkpoint_file(source)
    grids = {}

    def fits(placeholders, entry):
        grids["file"] = file_grid(model, stated_image_size(entry, source))
        match_params(model, placeholders, str(source), check_values=False,
                     source_grid=grids["file"])

    params, entry = fetch_params(source, progress=progress, check=fits)
    stated = checkpoint_model_data_config(model, source, entry)  # before any change
    report = load_params(model, params, source=str(source), source_grid=grids.get("file"))
    model.data_config = stated  # None: the paper's
    report["entry"] = entry
    return report


# --------------------------------------------------------------------------------------------
# The data config a checkpoint states (`keras_vit.data_config` resolves any source with these).


def checkpoint_data_config(source, entry=None, image_size=None):
    """The data config a checkpoint states: its entry's `preprocessing` (`entry`: the registry
    or keras-hub preset entry `keras_vit.weights.fetch_params` returned, where there is one),
    else what its file's metadata or `config.json` says; None where nothing says (the paper's
    applies). `image_size` gives the `input_size` of a stated config without one.

    Raises:
        keras_vit.CheckpointError: naming the file or entry and the field, for a malformed one.
    """
    if registry.is_registered(source):  # the registry's entry, not the one its file gave
        entry = registry.get_checkpoint(source)
    if entry and entry.get("preprocessing") is not None:
        stated = dict(entry["preprocessing"])
        if stated.get("input_size") is None and image_size is not None:
            stated["input_size"] = with_image_size(stated, image_size)["input_size"]
        try:
            return check_data_config(stated, f"checkpoint {entry.get('name')!r}'s preprocessing")
        except ValueError as e:
            raise CheckpointError(str(e)) from None
    if registry.is_registered(source):  # only a file on the Hub has more to say
        on_hub = registry.hub_source(source)
        return file_data_config(on_hub) if on_hub else None
    return file_data_config(source)


def checkpoint_model_data_config(model, source, entry=None):
    """The data config the checkpoint `source` states (see `checkpoint_data_config`), at
    `model`'s input size; None where it states none (the paper's applies)."""
    size = model_image_size(model)
    config = checkpoint_data_config(source, entry, size)
    return None if config is None else with_image_size(config, size)


def json_data_config(path, required=False):
    """The data config in a `config.json`: keras_vit's `preprocessing` (the paper's, at its
    model's resolution, for one without; in timm's files keras_vit writes, beside timm's
    `pretrained_cfg`) or timm's `pretrained_cfg` (in either of timm's layouts:
    `keras_vit.weights.config_json.timm_layout`); None for another tool's (refused if
    `required`)."""
    document = timm_layout(read_json(path, "a model's config.json"))
    try:
        if isinstance(document, dict) and document.get("format") == KERAS_VIT_FORMAT:
            stated = document.get("preprocessing")
            if stated is None:
                model = document.get("model") if isinstance(document.get("model"), dict) \
                    else {}
                return paper_data_config(model.get("image_size") or DEFAULT_IMAGE_SIZE)
            return check_data_config(stated, f"{path}: `preprocessing`")
        if isinstance(document, dict) and document.get("written_by") == WRITTEN_BY \
                and document.get("preprocessing") is not None:  # timm's, written by keras_vit
            return check_data_config(document["preprocessing"], f"{path}: `preprocessing`")
        if isinstance(document, dict) and "pretrained_cfg" in document:
            return timm_data_config(document["pretrained_cfg"], f"{path}: `pretrained_cfg`")
    except ValueError as e:
        raise CheckpointError(str(e) if str(e).startswith(str(path)) else f"{path}: {e}") \
            from None
    if required:
        raise CheckpointError(f"{path} states no preprocessing. Expected keras_vit's config.json "
                              "(`preprocessing`) or timm's (`pretrained_cfg`).")
    return None


def file_data_config(source):
    """The data config a checkpoint file states (a `.safetensors` file's keras_vit metadata,
    else the `config.json` beside the file or in the `hf://` repository), or None."""
    text = os.fspath(source)
    if text.startswith(hub.HF_SCHEME):
        weights, beside = (_cached_hub_file(text, name)
                           for name in (hub.WEIGHTS_FILE, hub.CONFIG_FILE))
    elif "://" in text:
        return None
    else:
        weights = os.path.expanduser(text)
        beside = hub.beside(weights)  # None where keras_vit wrote it for another file
    if weights and weights.endswith(".safetensors") and os.path.isfile(weights):
        own = hub.read_own_config(weights)
        if own and own.get("preprocessing") is not None:
            return own["preprocessing"]
    return json_data_config(beside) if beside and os.path.isfile(beside) else None


def _cached_hub_file(source, name):
    """The file `name` of `hf://ORG/NAME[@REVISION]` in the Hugging Face cache (where
    `from_pretrained` put it), or None."""
    repo, revision = hub.parse_hub(source)
    path = huggingface_hub.try_to_load_from_cache(repo, name, revision=revision)
    return path if isinstance(path, str) else None
