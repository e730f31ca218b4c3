"""The download cache: `$KERAS_VIT_HOME` (default `~/.keras/keras_vit`).

Files are downloaded to a temporary name and renamed into place once complete and verified,
under a lock, so that two processes fetching one file download it once and never see half of
it. A cached file that fails its SHA-256 (when one is registered) or its zip CRC is fetched
again, never loaded. Cache file names are derived so that they never leave the cache folder.
"""

import contextlib
import hashlib
import os
import re
import sys
import urllib.error
import urllib.parse
import urllib.request

import keras

from keras_vit.fileio import WriteError, atomic_file
from keras_vit.weights.errors import CheckpointError, DownloadError

_CHUNK = 1 << 20
_UNSAFE = re.compile(r"[^A-Za-z0-9._+\-]")


def cache_dir():
    """Where downloads are cached: `$KERAS_VIT_HOME`, default `~/.keras/keras_vit`."""
    return os.path.expanduser(os.environ.get("KERAS_VIT_HOME")
                              or os.path.join("~", ".keras", "keras_vit"))


def _safe_segment(segment):
    segment = _UNSAFE.sub("_", segment).lstrip(".")
    return segment or "_"


def _inside_cache(*segments):
    root = os.path.realpath(cache_dir())
    path = os.path.join(root, *(_safe_segment(s) for s in segments))
    if os.path.commonpath([root, os.path.realpath(path)]) != root:
        raise DownloadError(f"Cache path {path} would leave the cache folder {root}.")
    return path


def cache_path(name):
    """The cached file of registry entry `name`: `<cache_dir>/<name>.npz`, with every path
    segment reduced to letters, digits and `._+-` (no `..`), so it stays inside the cache."""
    return _inside_cache(*str(name).split("/")) + ".npz"


def url_cache_path(url):
    """The cached file of a URL: `<cache_dir>/urls/<hash>-<file name>`."""
    tail = os.path.basename(urllib.parse.unquote(urllib.parse.urlparse(url).path)) or "file.npz"
    digest = hashlib.sha256(url.encode()).hexdigest()[:12]
    return _inside_cache("urls", f"{digest}-{tail}")


def sha256sum(path):
    """The SHA-256 hex digest of a file."""
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
            import fcntl  # POSIX only: elsewhere the atomic rename keeps the cache consistent
        except ImportError:
            yield
            return
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def redrawn_in_place(stream):
    """Whether a bar drawn on `stream` (where Keras' `Progbar` draws) redraws in place."""
    try:
        return stream.isatty() or "ipykernel" in sys.modules
    except (AttributeError, OSError, ValueError):  # a closed or replaced stream
        return False


def download(url, path, sha256=None, progress=True):
    """Downloads `url` to `path` through a temporary file renamed into place.

    Raises:
        DownloadError: if the URL cannot be fetched (naming the URL and the path where a file
            downloaded by hand should go), stops early, or its SHA-256 is not `sha256`.
    """
    digest = hashlib.sha256()
    try:
        with atomic_file(path) as tmp, open(tmp, "wb") as out, \
                urllib.request.urlopen(url, timeout=60) as response:
            total = int(response.headers.get("Content-Length") or 0) or None
            if progress:
                print(f"Downloading {url}", file=sys.stderr, flush=True)
            # Keras' bar is redrawn in place: drawn where that shows (a terminal, a notebook),
            # not into a log file or a pipe, where the line above is the download's record.
            bar = keras.utils.Progbar(total, unit_name="B") if (
                progress and total and redrawn_in_place(sys.stdout)) else None
            done = 0
            for chunk in iter(lambda: response.read(_CHUNK), b""):
                out.write(chunk)
                digest.update(chunk)
                done += len(chunk)
                if bar:
                    bar.update(done)
            out.flush()
            if total is not None and done != total:
                raise DownloadError(f"Download of {url} stopped after {done} of {total} bytes.")
            if sha256 and digest.hexdigest() != sha256:
                raise DownloadError(f"The file downloaded from {url} has SHA-256 "
                                    f"{digest.hexdigest()}, expected {sha256}. It was not kept.")
    except (DownloadError, WriteError):  # a full disk is not the download's fault
        raise
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise DownloadError(
            f"Could not download {url}: {getattr(e, 'reason', e)}. If this machine is offline, "
            f"download that file elsewhere and put it at {path}, or pass its local path "
            "instead (`--weights PATH` on the command line, `pretrained=PATH` in Python).") from e
    return path


def _stale(url, path):
    """Whether the cached copy of a `file://` URL is older than the file (a local file, unlike
    a published URL, may be rewritten: a training run's checkpoint registered by name)."""
    if not url.startswith("file://") or not os.path.exists(path):
        return False
    source = urllib.request.url2pathname(urllib.parse.urlparse(url).path)
    return os.path.exists(source) and os.path.getmtime(source) > os.path.getmtime(path)


def fetch_cached(url, path, sha256, read, progress=True):
    """`read(path)` of the cached file at `path`, downloading it (again) when it is absent,
    older than its `file://` source, or fails its SHA-256 or `read` (a CheckpointError)."""
    with _file_lock(path):
        if _stale(url, path):
            os.remove(path)
        for attempt in range(2):
            if not os.path.exists(path):
                download(url, path, sha256=sha256, progress=progress)
            try:
                if sha256 and sha256sum(path) != sha256:
                    raise CheckpointError(f"{path} does not have SHA-256 {sha256}")
                return read(path)
            except CheckpointError as e:
                if attempt:
                    raise
                print(f"Cached {path} is damaged ({e}); fetching it again.", file=sys.stderr)
                os.remove(path)
