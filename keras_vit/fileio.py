"""Atomic files and folders, failed writes as one-line errors, and one writer per run folder.

Every file the package writes (checkpoints, downloads, backups, exports, reports) goes through
`atomic_file` or `staging_dir`: the content is written under a hidden temporary name beside
its destination and renamed into place once complete, so that a crash, a full disk or an
exception never leaves a half-written file under the final name, and the previous version
stays intact until the new one is complete. Permissions follow the process umask, as a plain
`open` or `mkdir` would give (temporary files are created 0600).

A write that fails for want of room (a full disk, a quota, the file-size limit of `ulimit -f`)
or another I/O error raises `WriteError`, one line naming the path and the reason, whichever
library was writing (h5py and TensorFlow report these in their own exception types); the
temporary file or folder is removed.

`folder_lock` gives a run folder one writer at a time (see its docstring for the file systems
on which it holds).
"""

import contextlib
import datetime
import errno
import json
import os
import shlex
import shutil
import socket
import sys
import tempfile
import warnings

# The errno values of a write that found no room, and how other libraries word them (h5py
# raises RuntimeError("... (File too large)"); TensorFlow its own error types).
NO_ROOM_ERRNOS = tuple(getattr(errno, name) for name in ("ENOSPC", "EFBIG", "EDQUOT")
                       if hasattr(errno, name))
NO_ROOM_MESSAGES = {os.strerror(code): code for code in NO_ROOM_ERRNOS}
# Other errnos of a write that the user can act on (a read-only or failing file system).
WRITE_ERRNOS = NO_ROOM_ERRNOS + (errno.EROFS, errno.EIO, errno.EACCES, errno.EPERM,
                                 errno.ENAMETOOLONG)
LOCK_FILE = ".keras_vit.lock"


class WriteError(OSError):
    """A file or folder could not be written; the message names the path and the reason."""


class FolderInUse(ValueError):
    """Another process is writing the folder; the message names it (pid, host, start, command)."""


def _write_failure(error):
    """The errno of an exception that reports a failed write (any library), or None."""
    if isinstance(error, OSError) and error.errno in WRITE_ERRNOS:
        return error.errno
    text = str(error)
    for message, code in NO_ROOM_MESSAGES.items():
        if message in text:
            return code
    return None


def _hint(code):
    if code in NO_ROOM_ERRNOS:
        limit = (" (or raise the file-size limit: `ulimit -f`, or the file system's)"
                 if code == errno.EFBIG else "")
        return f"free some space{limit} and run again"
    return "expected a folder this process can write to"


def _write_error(path, code):
    error = WriteError(f"Cannot write {os.fspath(path)}: {os.strerror(code)}. Nothing was "
                       f"changed there; {_hint(code)}.")
    error.errno = code  # str(error) stays the message: no strerror or filename set
    return error


@contextlib.contextmanager
def naming_write_errors(path):
    """Turns a failed write inside the block (no room, a read-only or failing file system, in
    whichever library's exception type) into a `WriteError` naming `path`; other exceptions
    pass unchanged."""
    try:
        yield
    except WriteError:
        raise
    except Exception as error:  # noqa: BLE001 - only write failures are mapped
        code = _write_failure(error)
        if code is None:
            raise
        raise _write_error(path, code) from None


def _file_size_limit():
    """This process's file-size limit in bytes (`ulimit -f`), or None."""
    try:
        import resource  # POSIX only: elsewhere a process has no file-size limit
    except ImportError:
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    return None if soft == resource.RLIM_INFINITY else soft


def check_room(path, nbytes):
    """Raises `WriteError` naming `path` if a file of `nbytes` cannot be written there: above
    this process's file-size limit or the free space of its file system. For writers that do
    not survive a write that fails midway (HDF5: h5py crashes the process), before they start.
    """
    directory = os.path.dirname(os.path.abspath(os.fspath(path)))
    while not os.path.isdir(directory):
        directory = os.path.dirname(directory)
    limit = _file_size_limit()
    if limit is not None and nbytes > limit:
        raise _write_error(path, errno.EFBIG)
    if nbytes > shutil.disk_usage(directory).free:
        raise _write_error(path, errno.ENOSPC)


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
    tmp = None
    with naming_write_errors(path):
        try:
            os.makedirs(directory, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=directory, prefix=TEMPORARY_PREFIXES[0],
                                       suffix="-" + os.path.basename(path))
            os.close(fd)
            yield tmp
            _fsync(tmp)
            chmod_as_umask(tmp, 0o666)
            os.replace(tmp, path)
        finally:
            if tmp is not None and os.path.exists(tmp):
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
    staging = None
    with naming_write_errors(path):
        try:
            os.makedirs(parent, exist_ok=True)
            staging = tempfile.mkdtemp(dir=parent,
                                       prefix=f"{TEMPORARY_PREFIXES[0]}{os.path.basename(path)}-")
            chmod_as_umask(staging, 0o777)  # mkdtemp makes it 0700
            yield staging
            old = None
            if os.path.exists(path):
                old = tempfile.mkdtemp(dir=parent, prefix=TEMPORARY_PREFIXES[1])
                os.replace(path, os.path.join(old, "previous"))
            os.replace(staging, path)
            if old:
                shutil.rmtree(old)
        finally:
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True)


TEMPORARY_PREFIXES = (".tmp-", ".old-")  # the names `atomic_file` and `staging_dir` use


def remove_temporaries(folder):
    """Removes what interrupted writes left in `folder` (a process killed before its rename):
    the temporary files and folders of `atomic_file` and `staging_dir`. Call it only where
    no other process writes, e.g. under `folder_lock`."""
    if not os.path.isdir(folder):
        return
    for entry in os.listdir(folder):
        if entry.startswith(TEMPORARY_PREFIXES):
            path = os.path.join(folder, entry)
            if os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.remove(path)


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


def _holder(what):
    """Who holds a lock: what it does, this process's id, host, start time and command line."""
    return dict(what=what, pid=os.getpid(), host=socket.gethostname(),
                started=datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
                command=shlex.join([os.path.basename(sys.argv[0] or "python"), *sys.argv[1:]]))


def _describe_holder(fd):
    """The holder recorded in an open lock file, in words."""
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        holder = json.loads(os.read(fd, 1 << 16).decode("utf-8"))
        return (f"another {holder['what']}: process {holder['pid']} on {holder['host']}, "
                f"started {holder['started']}: {holder['command']}")
    except (OSError, ValueError, KeyError, TypeError):
        return "another process (which has not recorded itself yet)"


def _try_lock(fd, lock_path):
    """Takes the exclusive lock of an open lock file: True, or False if another process holds
    it. Where the platform or the file system has no locks, warns and returns True."""
    try:
        import fcntl  # POSIX only: elsewhere a folder is not locked (see folder_lock)
    except ImportError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as e:  # ENOLCK, EOPNOTSUPP: a file system without locks
        warnings.warn(f"{lock_path}: this file system cannot lock files ({e.strerror}); a "
                      "second run on the same folder will not be refused.", stacklevel=3)
    return True


@contextlib.contextmanager
def folder_lock(path, what="run"):
    """Holds the lock of the folder `path` while the block runs: one writer per folder.

    The lock is `fcntl.flock` on `path/.keras_vit.lock`, which records the holder (what it
    does, process id, host, start time, command) for the message another process meets. The
    operating system releases it when the holder's process ends, however it ends (kill -9
    included), so a crash never leaves a lock behind on the same machine. It holds across
    machines where the file system implements `flock` between clients: NFS (v4, or v3 with its
    lock daemons; Linux maps `flock` to NFS byte-range locks; a crashed client's lock is
    released when the server notices, within its lease time), and not on file systems that
    lock locally or not at all (most FUSE file systems, SMB mounted with `nobrl`): there, and
    where `fcntl` does not exist (Windows), runs are not locked (with a warning where the file
    system refuses locks).

    Args:
        path: str or path. An existing folder.
        what: str. What this process does there, for the message another one meets ("run",
            "VTAB run"). Defaults to "run".

    Raises:
        FolderInUse: naming the holder, if another process holds the lock.
        WriteError: if the lock file cannot be created.
    """
    path = os.fspath(path)
    lock_path = os.path.join(path, LOCK_FILE)
    with naming_write_errors(lock_path):
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        if not _try_lock(fd, lock_path):
            raise FolderInUse(
                f"{path} is in use by {_describe_holder(fd)}. Wait for it to finish (or stop "
                "it), or choose another folder.")
        with naming_write_errors(lock_path):
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
            os.write(fd, json.dumps(_holder(what)).encode("utf-8"))
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)  # an unheld lock records no holder
    finally:
        os.close(fd)  # releases the lock


def remove_if_unused(path):
    """Removes the folder `path` if it holds nothing, or only the lock file of a run that
    nobody holds (a run that failed before writing anything). Returns whether it did."""
    entries = os.listdir(path)
    if entries == [LOCK_FILE]:
        try:
            with folder_lock(path):
                os.remove(os.path.join(path, LOCK_FILE))
        except (FolderInUse, OSError):
            return False
    elif entries:
        return False
    with contextlib.suppress(OSError):
        os.rmdir(path)
        return True
    return False
