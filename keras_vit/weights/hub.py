"""Weights from the Hugging Face Hub and local safetensors files.

- `hf://ORG/NAME[@REVISION]`: a model repository, fetched with `huggingface_hub` (its cache,
  resumable downloads, tokens, `HF_HUB_OFFLINE=1`): its `config.json` and `model.safetensors`;
- a local `.safetensors` file (read with the `safetensors` package's NumPy API: no torch), with
  the `config.json` beside it when there is one.

The key layout (timm, transformers, or the official one) is detected from the key names and
rewritten to the official layout (`keras_vit.weights.torch_layouts`); the architecture comes
from the keras_vit configuration in the file's metadata (the files `save_safetensors` writes),
else from `config.json` (checked against the arrays: `keras_vit.weights.config_json`), else
from the array shapes.

`keras_vit.weights.writers.save_safetensors` writes such files.
"""

import contextlib
import functools
import os
import re
import sys
import time
import weakref

import huggingface_hub
from huggingface_hub import constants as hub_constants
import ml_dtypes
import numpy as np
from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError, LocalEntryNotFoundError
from huggingface_hub.utils import (are_progress_bars_disabled, disable_progress_bars,
                                   enable_progress_bars)
from safetensors import SafetensorError, safe_open

from keras_vit.weights import config_json
from keras_vit.weights.download import redrawn_in_place
from keras_vit.weights.errors import CheckpointError, DownloadError
from keras_vit.weights.layouts import config_from_params
from keras_vit.weights.npz import Deferred, count_nonfinite, placeholder
from keras_vit.weights.torch_layouts import detect_layout, layout_width, to_official

HF_SCHEME = "hf://"
WEIGHTS_FILE, CONFIG_FILE = config_json.WEIGHTS_FILE, config_json.CONFIG_FILE
# The metadata entry of the .safetensors files keras_vit writes: the keras_vit configuration
# document (`config_json.check_keras_vit`) as JSON text.
METADATA_KEY = "keras_vit"
_REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*/[A-Za-z0-9][A-Za-z0-9_.\-]*")
# A branch, tag or commit: what git allows in a ref name, without a parent folder (`..`).
_REVISION = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-/]{0,254}")


def is_hub(source):
    return isinstance(source, str) and source.startswith(HF_SCHEME)


def parse_hub(source):
    """`hf://ORG/NAME[@REVISION]` as (repo id, revision or None)."""
    spec = source[len(HF_SCHEME):]
    repo, at, revision = spec.partition("@")
    if not _REPO.fullmatch(repo) or (at and not _REVISION.fullmatch(revision)) \
            or ".." in revision.split("/"):
        raise ValueError(f"{source!r:.200} is not a Hugging Face model. Expected hf://ORG/NAME "
                         "or hf://ORG/NAME@REVISION (a branch, tag or commit), e.g. "
                         "hf://timm/vit_base_patch16_224.augreg2_in21k_ft_in1k.")
    return repo, revision or None


# safetensors' dtype names, as NumPy dtypes.
SAFETENSORS_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16,
                      "BF16": ml_dtypes.bfloat16, "F8_E4M3": ml_dtypes.float8_e4m3fn,
                      "F8_E5M2": ml_dtypes.float8_e5m2, "I64": np.int64, "I32": np.int32,
                      "I16": np.int16, "I8": np.int8, "U64": np.uint64, "U32": np.uint32,
                      "U16": np.uint16, "U8": np.uint8, "BOOL": np.bool_}


def _existing(path):
    path = os.path.expanduser(os.fspath(path))
    if not os.path.isfile(path):
        if os.path.exists(path):  # a folder, a device (a cache blob linked to /dev/zero), a FIFO
            raise CheckpointError(f"{path} is not a regular file (it is "
                                  f"{'a folder' if os.path.isdir(path) else 'a device or pipe'})."
                                  " Expected a .safetensors checkpoint file.")
        raise FileNotFoundError(f"No checkpoint file at {path}.")
    return path


def _unreadable(path, error):
    return CheckpointError(f"{path} is not a readable .safetensors file ({error}).")


def read_safetensors_headers(path):
    """The arrays a `.safetensors` file's header declares, as `keras_vit.weights.npz`
    placeholders (their shapes and dtypes, holding no memory), and its metadata: nothing else
    is read. `safe_open` checks the header's offsets against the dtypes, shapes and the file's
    real size.

    Raises:
        FileNotFoundError: if there is no file at `path`.
        CheckpointError: naming the file (and the tensor), if its header is malformed or
            declares a dtype keras_vit does not read.
    """
    opened = _Opened(_existing(path))
    arrays = {}
    for key, (shape, dtype) in opened.declared.items():
        if isinstance(dtype, str):  # a name `_dtype` does not know
            raise CheckpointError(f"{opened.path}: tensor {key!r} has dtype {dtype}. Expected "
                                  f"one of {', '.join(SAFETENSORS_DTYPES)}.")
        arrays[key] = placeholder(shape, dtype)
    return arrays, opened.metadata


def read_safetensors(path, expected, verify=True):
    """The arrays of a `.safetensors` file as `keras_vit.weights.npz.Deferred`s, read on use
    from the file as it is opened now, checked against `expected` (its placeholders from
    `read_safetensors_headers`): a loader that takes one array at a time then holds one array
    at a time, and reads what was checked even where the path is replaced meanwhile.

    With `verify`, after one pass that reads each array in turn and counts its non-finite
    values; else nothing is read before, for a loader that checks each array as it reads it.

    Raises:
        CheckpointError: naming the file, if it cannot be read or changed since `expected`.
    """
    opened = _Opened(_existing(path))
    if opened.declared != {key: (value.shape, value.dtype) for key, value in expected.items()}:
        raise CheckpointError(f"{opened.path} changed while it was read.")
    return {key: Deferred(shape, dtype, functools.partial(opened.read, key),
                          count_nonfinite(opened.read(key)) if verify else None)
            for key, (shape, dtype) in opened.declared.items()}


class _Opened:
    """A `.safetensors` file open for reading tensors (with `pread(2)`: no memory map, so no
    bus error where it is cut short), which refuses to read one once the file has been written
    in place (`_written_since`); a file renamed over its path is read as it was.

    Attributes:
        declared: dict of key -> (shape, NumPy dtype, or safetensors' name of one NumPy does
            not have) from its header.
        metadata: dict. Its header's metadata.
    """

    def __init__(self, path):
        self.path = path
        fd = os.open(path, os.O_RDONLY)  # the file safe_open reads, to see it change
        weakref.finalize(self, os.close, fd)
        try:
            self._tensors = safe_open(path, framework="np", backend="pread")
            self.declared = {key: (tuple(self._tensors.get_slice(key).get_shape()),
                                   _dtype(self._tensors.get_slice(key).get_dtype()))
                             for key in self._tensors.keys()}
            self.metadata = self._tensors.metadata() or {}
            if not os.path.samestat(os.fstat(fd), os.stat(path)):
                raise CheckpointError(f"{path} changed while it was read.")
        except CheckpointError:
            raise
        except (SafetensorError, ValueError, OSError, RecursionError) as e:
            raise _unreadable(path, e) from None
        self._fd = fd
        self._opened_as = os.fstat(fd)

    def _written_since(self):
        """Whether the file was written in place since it was opened: its size or modification
        time moved, or its status change time while it still has a name (a rename over the
        path, which leaves the open file as it was, changes that of the old file too)."""
        now, then = os.fstat(self._fd), self._opened_as
        return (now.st_size, now.st_mtime_ns) != (then.st_size, then.st_mtime_ns) or (
            now.st_nlink > 0 and now.st_ctime_ns != then.st_ctime_ns)

    def read(self, key):
        """The tensor `key`, as the file was when opened."""
        try:
            value = self._tensors.get_tensor(key)
            if self._written_since():
                raise CheckpointError(f"{self.path} changed in place after it was opened.")
            return value
        except CheckpointError:
            raise
        except (TypeError, AttributeError) as e:  # a dtype safetensors' NumPy API lacks
            raise CheckpointError(
                f"{self.path} holds arrays NumPy cannot represent ({e}); keras_vit reads "
                "float16, bfloat16, float32 and float64 safetensors. Expected a float32 file "
                "(e.g. save it again in float32).") from None
        except (SafetensorError, ValueError, OSError) as e:
            raise _unreadable(self.path, e) from None


def _dtype(name):
    return np.dtype(SAFETENSORS_DTYPES[name]) if name in SAFETENSORS_DTYPES else name


def read_own_config(path, metadata=None):
    """The keras_vit configuration document in a `.safetensors` file's metadata (the files
    `save_safetensors` writes; `metadata`: the file's, where already read), checked; None for
    other files."""
    if metadata is None:
        metadata = read_safetensors_headers(path)[1]
    text = metadata.get(METADATA_KEY)
    if text is None:
        return None
    where = f"the keras_vit metadata of {path}"
    document = config_json.parse_json(text, where)
    if not isinstance(document, dict):
        raise CheckpointError(f"{where} holds {type(document).__name__}, expected a JSON object.")
    return config_json.check_keras_vit(document, where)


@contextlib.contextmanager
def bars(progress):
    """huggingface_hub's download bars in the block, drawn as keras_vit's own are: with
    `progress`, where standard error (where they draw) redraws them in place (a terminal, a
    notebook); off otherwise, as they were after the block. A user's
    `HF_HUB_DISABLE_PROGRESS_BARS`, or bars already turned off, are left as they are. The
    switch is huggingface_hub's, for the whole process: another thread's download in the block
    draws no bar either, and the settings of groups of bars (`disable_progress_bars(name)`)
    are reset by it."""
    if (progress and redrawn_in_place(sys.stderr)
            or hub_constants.HF_HUB_DISABLE_PROGRESS_BARS is not None
            or are_progress_bars_disabled()):
        yield
        return
    disable_progress_bars()
    try:
        yield
    finally:
        enable_progress_bars()


# How long the Hub's endpoint may take to answer before a fetch reads huggingface_hub's cache
# alone (offline, huggingface_hub retries each file with back-offs), and how long that answer
# holds for the next fetch (one load asks for a repository's config.json, then its files).
REACH_TIMEOUT = 3.0
REACH_REUSE = 30.0
_reached = {}  # endpoint -> (time.monotonic() of the probe, whether it answered)


def _unreachable():
    """The Hub's endpoint where it does not answer a HEAD request through huggingface_hub's
    own HTTP client (its proxies and client factory) within `REACH_TIMEOUT`, else None; a fetch
    then reads huggingface_hub's cache alone. Not probed under `HF_HUB_OFFLINE`, where the
    cache alone is read already."""
    endpoint = hub_constants.ENDPOINT
    if hub_constants.HF_HUB_OFFLINE:
        return None
    probed, answered = _reached.get(endpoint, (None, None))
    if probed is None or time.monotonic() - probed > REACH_REUSE:
        try:
            huggingface_hub.get_session().head(endpoint, timeout=REACH_TIMEOUT)
            answered = True
        except Exception:  # noqa: BLE001 - any failure to answer (the client's types vary)
            answered = False
        _reached[endpoint] = (time.monotonic(), answered)
    return None if answered else endpoint


def hub_files(source):
    """Local paths of `config.json` (or None) and `model.safetensors` of `hf://ORG/NAME`,
    through `huggingface_hub` (downloaded once into its cache; `HF_HUB_OFFLINE=1` reads the
    cache only).

    Raises:
        DownloadError: naming the repository and what to do, when it cannot be fetched.
    """
    repo, revision = parse_hub(source)
    unreachable = _unreachable()

    def fetch(name):
        return huggingface_hub.hf_hub_download(repo, name, revision=revision,
                                               local_files_only=unreachable is not None)

    try:
        weights = fetch(WEIGHTS_FILE)
    except EntryNotFoundError as e:
        if isinstance(e, LocalEntryNotFoundError):  # not in the cache, offline
            raise DownloadError(_offline_advice(source, repo, e, unreachable)) from None
        raise CheckpointError(f"{source} has no {WEIGHTS_FILE}. keras_vit reads safetensors "
                              "weights (no torch): expected a repository that has them.") from None
    except (HfHubHTTPError, OSError, ValueError) as e:
        raise DownloadError(_offline_advice(source, repo, e)) from None
    try:
        config = fetch(CONFIG_FILE)
    except (EntryNotFoundError, LocalEntryNotFoundError, HfHubHTTPError, OSError):
        config = None
    return config, weights


def hub_config(source):
    """The local path of `config.json` of `hf://ORG/NAME` (from `huggingface_hub`'s cache, or
    fetched into it), or None where it cannot be had: what kind of repository it is."""
    repo, revision = parse_hub(source)
    try:
        return huggingface_hub.hf_hub_download(repo, CONFIG_FILE, revision=revision,
                                               local_files_only=_unreachable() is not None)
    except (EntryNotFoundError, HfHubHTTPError, OSError, ValueError):
        return None


def _offline_advice(source, repo, error, unreachable=None):
    first = str(error).splitlines()[0] if str(error) else ""
    why = (f"{unreachable} does not answer, and huggingface_hub's cache does not hold it"
           if unreachable else f"{type(error).__name__}: {first}")
    return (f"Could not fetch {source} ({why}). Offline, download it "
            f"where there is internet (`hf download {repo} {CONFIG_FILE} {WEIGHTS_FILE}`), copy "
            "the Hugging Face cache here and set HF_HUB_OFFLINE=1, or pass the local "
            ".safetensors path.")


def _check_describes(config, own, config_path, weights_path):
    """`config_json.check_describes` of the `config.json` keras_vit wrote for a file (one that
    names it: `weights_file`) against the config.json the file's metadata gives. Metadata that
    does not state the whole model gives none (the model is checked as it is built)."""
    try:
        expected = config_json.timm_config(own["model"], own["class_names"],
                                           own.get("preprocessing"))
    except (KeyError, TypeError, ValueError):
        return
    config_json.check_describes(config, expected, config_path, weights_path)


def described_file(config, folder):
    """The weights file of `folder` that a `config.json` keras_vit wrote there (the document
    `config`) describes (`weights_file`), or None: where keras_vit did not write it, or it
    names no plain file name of a file there."""
    if not isinstance(config, dict) or config.get("written_by") != config_json.WRITTEN_BY:
        return None
    name = config.get("weights_file")
    if not isinstance(name, str) or "\0" in name or os.path.basename(name) in ("", ".", "..") \
            or os.path.basename(name) != name:
        return None
    return name if os.path.isfile(os.path.join(folder, name)) else None


def beside(weights_path):
    """The path of the `config.json` beside a weights file, or None where there is none or
    keras_vit wrote it for another file that is in the folder (`weights_file`). A config.json
    that cannot be read is left to the reader, which names what is wrong with it."""
    folder = os.path.dirname(os.fspath(weights_path))
    path = os.path.join(folder, CONFIG_FILE)
    if not os.path.isfile(path):
        return None
    try:
        config = config_json.read_json(path, "a model's config.json")
    except CheckpointError:
        return path
    described = described_file(config, folder)
    return None if described not in (None, os.path.basename(weights_path)) else path


def read_config(path):
    """A `config.json` as a dict, or None without one.

    Raises:
        CheckpointError: naming the file, if it is not a JSON object.
    """
    if path is None or not os.path.isfile(path):
        return None
    config = config_json.read_json(path, "a model's config.json")
    if not isinstance(config, dict):
        raise CheckpointError(f"{path} holds {type(config).__name__}, expected a JSON object "
                              "(a model's config.json).")
    return config


def _config_kind(config):
    """Whose `config.json` this is: "timm", "transformers", or None (another tool's)."""
    if "architecture" in config or "model_args" in config:
        return "timm"
    if "model_type" in config or "num_hidden_layers" in config:
        return "transformers"
    return None


def _declared(config, layout, where):
    """(`config_json.Declared` arguments, the options the arrays do not show, class names) of
    the `config.json` of a file in `layout`."""
    declared, names = config_json.Declared(where), None
    kind = _config_kind(config) if config else None
    if kind is not None and layout in ("timm", "transformers") and kind != layout:
        raise CheckpointError(f"{where} is {kind}'s configuration, but the arrays beside it are "
                              f"in {layout}'s layout. Expected the config.json of that file.")
    if layout == "timm":
        if kind:
            declared, names = config_json.declared_timm(config, where)
        return declared, None, names
    if layout == "transformers":
        if kind:
            declared, options, names = config_json.declared_transformers(config, where)
            return declared, options, names
        return declared, dict(gelu_approximate=False, layer_norm_epsilon=config_json.
                              TRANSFORMERS_LAYER_NORM_EPSILON), None
    return declared, {}, None


def _heads(num_heads, own, config, declared, layout):
    """(number of heads, where it comes from) for a file's arrays: the caller's, the file's
    keras_vit metadata, its config.json, or (None, None)."""
    if num_heads is not None:
        return num_heads, "num_heads"
    if own and own["model"] and own["model"].get("num_heads") is not None:
        return own["model"]["num_heads"], "the keras_vit metadata's model.num_heads"
    heads = config_json.timm_heads(config or {}, declared) if layout == "timm" \
        else declared.get("num_heads")
    field = declared.fields.get("num_heads", "architecture")
    return heads, f"{declared.where}: {field}"


def load_safetensors(weights_path, config_path=None, num_heads=None, check=None, verify=True):
    """(official-layout arrays, `keras_vit.ViT` arguments, class names) of a `.safetensors`
    file in timm's, transformers' or the official layout: its architecture from the keras_vit
    configuration in its metadata (files keras_vit wrote), else its `config.json`, checked
    against the arrays; what neither says comes from the arrays. `num_heads` overrides the
    files' (and is needed where no file says and the width is not a paper variant's).

    All of it is worked out from the file's header first: `check(placeholders, arguments,
    class_names)`, where given, is called with the official-layout placeholders
    (`keras_vit.weights.npz.placeholder`) before any tensor is read, and raises to refuse it.
    The arrays are then verified (unless not `verify`) and read on use (`read_safetensors`),
    each rewritten to the official layout as it is read.

    Raises:
        CheckpointError: naming the file and the field, for a config that is malformed or
            contradicts the arrays, or an architecture keras_vit cannot express.
    """
    headers, metadata = read_safetensors_headers(weights_path)
    config = config_json.timm_layout(read_config(config_path))
    own = read_own_config(weights_path, metadata)
    official, architecture, names = _interpret(headers, config, own, weights_path, config_path,
                                               num_heads)
    if own is not None and own["model"] and config is not None and "weights_file" in config:
        _check_describes(config, own, config_path, weights_path)
    if check is not None:
        check(official, architecture, names)
    params = read_safetensors(weights_path, headers, verify)
    return _interpret(params, config, own, weights_path, config_path, num_heads)


def _interpret(params, config, own, weights_path, config_path, num_heads):
    """`load_safetensors` of the file's arrays (or their placeholders)."""
    layout = detect_layout(params)
    declared, options, names = _declared(config, layout, config_path)
    heads, heads_source = _heads(num_heads, own, config, declared, layout)
    try:
        width = layout_width(params, layout)
        if heads is not None:
            heads = config_json.check_heads_divide(heads, width, heads_source, weights_path)
        official = to_official(params, layout, heads)
    except CheckpointError as e:
        raise e if weights_path in str(e) else CheckpointError(f"{weights_path}: {e}") from None
    config_json.check_agreement(declared, official, weights_path)
    architecture = dict(config_from_params(official, declared.get("image_size")))
    if layout == "timm":
        options = config_json.timm_options(declared, official)
    architecture.update(options)
    if own is not None and own["model"]:
        mine = config_json.declared_keras_vit(own["model"], f"the keras_vit metadata of "
                                                             f"{weights_path}")
        config_json.check_agreement(mine, official, weights_path)
        config_json.check_same(declared, mine)
        architecture, names = dict(own["model"]), own["class_names"] or names
    if heads is not None:
        architecture["num_heads"] = int(heads)
    names_from = f"the keras_vit metadata of {weights_path}" if own and own["class_names"] \
        else config_path
    return official, architecture, config_json.check_class_names(names, architecture,
                                                                 names_from)
