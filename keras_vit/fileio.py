"""Atomic files and folders: whatever is written appears whole under its final name, or not at all.

Every file the package writes (checkpoints, downloads, backups, exports, reports) goes through
`atomic_file` or `staging_dir`: the content is written under a hidden temporary name beside
its destination and renamed into place once complete, so that a crash, a full disk or an
exception never leaves a half-written file under the final name, and the previous version
stays intact until the new one is complete. Permissions follow the process umask, as a plain
`open` or `mkdir` would give (temporary files are created 0600).
"""

import contextlib
import os
import shutil
import tempfile


def current_umask():
    """The process umask, read without changing it where the OS allows.

    Linux reports it in /proc/self/status; elsewhere it is read by setting and restoring it,
    which another thread creating a file at that instant could observe.
    """
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    umask = os.umask(0o077)  # the restrictive value, should another thread see it
    os.umask(umask)
    return umask


def chmod_as_umask(path, mode):
    """`chmod(path, mode & ~umask)`: the permissions `open`/`mkdir` would have given."""
    os.chmod(path, mode & ~current_umask())


def _fsync(path):
    with open(path, "rb") as f:
        os.fsync(f.fileno())


@contextlib.contextmanager
def atomic_file(path):
    """Yields a temporary path beside `path`; when the block ends without an error, the file
    written there is synced and renamed to `path`. On an error it is removed and any file
    already at `path` stays as it was.

    The temporary name keeps `path`'s suffix, for writers that choose the format by it
    (`model.save("x.keras")`).
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix="-" + os.path.basename(path))
    os.close(fd)
    try:
        yield tmp
        _fsync(tmp)
        chmod_as_umask(tmp, 0o666)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def atomic_write(path, write):
    """Calls `write(file)` on a binary file that becomes `path` only once complete."""
    with atomic_file(path) as tmp, open(tmp, "wb") as f:
        write(f)


def atomic_write_text(path, text):
    """Writes `text` (UTF-8) to `path` atomically."""
    atomic_write(path, lambda f: f.write(text.encode("utf-8")))


@contextlib.contextmanager
def staging_dir(path):
    """Yields a hidden, empty folder beside `path`; when the block ends without an error it
    replaces `path` (a folder or nothing) by renames only, so `path` is at every moment
    absent, the old folder or the new one. On an error the staging folder is removed."""
    path = os.fspath(path).rstrip(os.sep)
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(dir=parent, prefix=f".tmp-{os.path.basename(path)}-")
    try:
        chmod_as_umask(staging, 0o777)  # mkdtemp makes it 0700
        yield staging
        old = None
        if os.path.exists(path):
            old = tempfile.mkdtemp(dir=parent, prefix=".old-")
            os.replace(path, os.path.join(old, "previous"))
        os.replace(staging, path)
        if old:
            shutil.rmtree(old)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def check_writable_dir(path, what="Output folder"):
    """Creates `path` if needed and checks that files can be written there.

    Raises:
        ValueError: naming the folder, if it cannot be created or written.
    """
    path = os.path.expanduser(os.fspath(path))
    try:
        os.makedirs(path, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path, prefix=".write-test-")
        os.close(fd)
        os.remove(probe)
    except OSError as e:
        raise ValueError(f"{what} {path!r} is not writable ({e.strerror or e}). Expected a "
                         "folder this process can create files in.") from e
    return path
