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

Ownership: keras_vit deletes or replaces only what it can show it wrote. Its temporaries carry
names no user picks (`.keras_vit-tmp-HOST-PID-...`, with this host's digest and the writing
process's id), and `remove_temporaries` removes only those whose process has ended. A file
that exists is replaced only when the caller says so (`check_destination`), and no write goes
through a symbolic link or replaces one (`refuse_link`).
"""

import contextlib
import datetime
import errno
import hashlib
import json
import os
import re
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
# The folders whose lock this process holds: their real paths -> (device, inode) when locked.
# Its own writes there are its, into that very folder only.
_HELD = {}


class WriteError(OSError):
    """A file or folder could not be written; the message names the path and the reason."""


class FolderInUse(ValueError):
    """Another process is writing the folder; the message names it (pid, host, start, command)."""


class DestinationExists(ValueError):
    """An output path holds a file or folder that would be replaced; the message says how to
    replace it (`overwrite=True`, `--overwrite`) or where else to write."""


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


def scratch_folder():
    """What a failed write in the system's temporary folder is named as: that folder and the
    variable that chose it (a full TMPDIR is not the destination's fault)."""
    return f"{tempfile.gettempdir()} (the temporary folder, TMPDIR)"


@contextlib.contextmanager
def scratch_dir():
    """A temporary folder in the system's temporary folder for the block, removed after it; a
    failure to make it names TMPDIR (`scratch_folder`)."""
    with naming_write_errors(scratch_folder()):
        folder = tempfile.mkdtemp()
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


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
    already at `path` stays as it was. What a killed writer of `path` left is removed first
    (`remove_temporaries`); a link at `path` is refused.

    The temporary name keeps `path`'s suffix, for writers that choose the format by it
    (`model.save("x.keras")`).
    """
    path = os.fspath(path)
    refuse_link(path)
    check_held_folder(path)
    directory = os.path.dirname(os.path.abspath(path))
    tmp = None
    made = _missing_folders(directory)
    with naming_write_errors(path), _removed_if_failed(made):
        try:
            os.makedirs(directory, exist_ok=True)
            remove_temporaries(directory, os.path.basename(path))  # of a killed writer
            fd, tmp = tempfile.mkstemp(dir=directory, prefix=_temporary_prefix("tmp"),
                                       suffix=_temporary_suffix(os.path.basename(path)))
            os.close(fd)
            yield tmp
            _fsync(tmp)
            chmod_as_umask(tmp, 0o666)
            check_held_folder(path)  # still the folder the job locked
            try:
                os.replace(tmp, path)  # the temporary lies in the folder it was made in
            except FileNotFoundError:
                check_held_folder(path)  # moved as the rename came: say so
                raise
        finally:
            if tmp is not None and os.path.lexists(tmp):
                os.remove(tmp)


def _missing_folders(directory):
    """The folders `os.makedirs(directory)` would create, the deepest first."""
    missing = []
    while directory and not os.path.exists(directory):
        missing.append(directory)
        parent = os.path.dirname(directory)
        if parent == directory:
            break
        directory = parent
    return missing


@contextlib.contextmanager
def _removed_if_failed(folders):
    """On an error in the block, removes those of `folders` (the deepest first) that it
    created and left empty: a failed write leaves no folder behind."""
    try:
        yield
    except BaseException:
        for folder in folders:
            with contextlib.suppress(OSError):
                os.rmdir(folder)  # only if empty
        raise


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
    absent, the old folder or the new one. On an error the staging folder is removed.

    The old folder is first moved aside into an "old" temporary that names `path`: a process
    killed between the two renames leaves the previous version there, and the next write in
    that folder (`remove_temporaries`) puts it back where `path` is still absent."""
    path = os.fspath(path).rstrip(os.sep)
    refuse_link(path)
    check_held_folder(path)
    parent = os.path.dirname(os.path.abspath(path))
    staging = None
    made = _missing_folders(parent)
    with naming_write_errors(path), _removed_if_failed(made):
        try:
            os.makedirs(parent, exist_ok=True)
            remove_temporaries(parent, os.path.basename(path))  # of a killed writer
            staging = tempfile.mkdtemp(dir=parent, prefix=_temporary_prefix("tmp"),
                                       suffix=_temporary_suffix(os.path.basename(path)))
            chmod_as_umask(staging, 0o777)  # mkdtemp makes it 0700
            yield staging
            check_held_folder(path)  # still the folder the job locked
            old = None
            try:
                os.stat(staging)
            except FileNotFoundError:
                check_held_folder(path)  # moved as the block ended: say so
                raise
            if os.path.exists(path):
                old = tempfile.mkdtemp(dir=parent, prefix=_temporary_prefix("old"),
                                       suffix=_temporary_suffix(os.path.basename(path)))
                with open(os.path.join(old, OLD_DESTINATION), "w", encoding="utf-8") as f:
                    f.write(os.path.basename(path))  # where the previous version goes back
                os.replace(path, os.path.join(old, "previous"))
            os.replace(staging, path)
            if old:
                shutil.rmtree(old)
        finally:
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True)


# The temporaries of `atomic_file` and `staging_dir`: `.keras_vit-tmp-HOST-PID-...` (and
# `-old-` for a folder being replaced), HOST a digest of this machine's name, PID the writer's.
TEMPORARY_NAME = re.compile(
    r"\.keras_vit-(?P<kind>tmp|old)-(?P<host>[0-9a-f]{8})-(?P<pid>[0-9]+)-")


# The length of the random part of `tempfile.mkdtemp`'s names.
_RANDOM_CHARACTERS = 8


# The longest file name (bytes) most file systems take, and the name of the file in an "old"
# folder that records its destination.
NAME_MAX = 255
OLD_DESTINATION = "destination"


def _temporary_suffix(name):
    """The end of a temporary's name for the destination `name`: "-" and the name, or, where
    the whole would pass `NAME_MAX`, "-" and a digest of the name with its suffix (the format
    some writers choose by it: `.keras`, `.weights.h5`)."""
    # ".keras_vit-old-", the host's 8 digits, "-", a pid of up to 10 digits, "-", the random
    # part: the same for every process, so that a later one finds the temporaries of a name.
    longest_prefix = len(".keras_vit-old-") + 8 + 1 + 10 + 1 + _RANDOM_CHARACTERS
    if longest_prefix + 1 + len(name.encode("utf-8")) <= NAME_MAX:
        return "-" + name
    extension = ".weights.h5" if name.endswith(".weights.h5") else os.path.splitext(name)[1]
    if len(extension.encode("utf-8")) > 32:
        extension = ""
    return f"-{hashlib.sha256(name.encode('utf-8')).hexdigest()[:16]}{extension}"


def _host_digest():
    return hashlib.sha256(socket.gethostname().encode("utf-8")).hexdigest()[:8]


def _temporary_prefix(kind):
    return f".keras_vit-{kind}-{_host_digest()}-{os.getpid()}-"


def _process_alive(pid):
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, OSError):
        return True  # another user's process, or a pid this OS cannot ask about: keep
    return True


def is_temporary(entry):
    """Whether the name `entry` is one of keras_vit's temporaries."""
    return TEMPORARY_NAME.match(entry) is not None


def is_own_temporary(entry):
    """Whether the name `entry` is a temporary file or folder this process is writing: an
    `atomic_file` or `staging_dir` "tmp" name with this machine's digest and this process's
    id. The "old" folder a replacement moves aside (the user's previous version) is not one.
    What an interrupted command may remove, and nothing else.

    Args:
        entry: str. A file or folder name in a folder (not a path).

    Returns:
        bool.
    """
    match = TEMPORARY_NAME.match(entry)
    return match is not None and match["kind"] == "tmp" and match["host"] == _host_digest() \
        and int(match["pid"]) == os.getpid()


def remove_temporaries(folder, name=None):
    """Removes what interrupted writes of keras_vit left in `folder`: the temporary files and
    folders of `atomic_file` and `staging_dir` (of the destination `name` only, if given) that
    a process on this machine which has ended wrote. A previous version `staging_dir` had
    moved aside is put back where its destination is still absent (the process was killed
    between its two renames), and removed only where the new version took its place. Nothing
    else is touched: not a user's `.tmp-x`, not a link, not the temporaries of a process that
    still runs or of another machine, not an old folder that does not name its destination."""
    if not os.path.isdir(folder):
        return
    host = _host_digest()
    for entry in os.listdir(folder):
        match = TEMPORARY_NAME.match(entry)
        if match is None or match["host"] != host or _process_alive(int(match["pid"])):
            continue
        if name is not None and match["kind"] == "tmp" \
                and not entry.endswith(_temporary_suffix(name)):
            continue
        path = os.path.join(folder, entry)
        if os.path.islink(path):
            continue
        if match["kind"] == "old":
            _settle_old_version(folder, path, entry[match.end():])
            continue
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.remove(path)


def _settle_old_version(folder, old, rest):
    """An "old" folder a killed `staging_dir` left (`rest`: its random part, "-" and the
    destination's name): its previous version goes back to the destination if that is absent,
    and the folder is removed once empty or superseded."""
    destination = None
    with contextlib.suppress(OSError, UnicodeDecodeError):
        with open(os.path.join(old, OLD_DESTINATION), encoding="utf-8") as f:
            destination = f.read(NAME_MAX * 4 + 1)
    if destination is None:  # killed before it was written, or an older name-only folder
        random_part, dash, named = rest[:_RANDOM_CHARACTERS], rest[_RANDOM_CHARACTERS:][:1], \
            rest[_RANDOM_CHARACTERS + 1:]
        destination = named if dash == "-" and random_part and \
            _temporary_suffix(named) == "-" + named else None
    if not destination or os.sep in destination or destination in (".", ".."):
        if not os.path.lexists(os.path.join(old, "previous")):
            with contextlib.suppress(OSError):
                shutil.rmtree(old)  # nothing was moved into it yet
        return  # naming no destination (an earlier version's): kept
    target = os.path.join(folder, destination)
    previous = os.path.join(old, "previous")
    with contextlib.suppress(OSError):  # a failed rename keeps the old folder as it is
        if os.path.lexists(previous) and not os.path.lexists(target):
            os.replace(previous, target)  # the kill came between the two renames
        shutil.rmtree(old)  # empty now, or the new version took the destination


def refuse_link(path, what=None):
    """Raises `WriteError` if `path` is a symbolic link: keras_vit neither writes through a link
    nor replaces one."""
    if os.path.islink(path):
        error = WriteError(
            f"{what or os.fspath(path)} is a symbolic link (to {os.readlink(path)}): keras_vit "
            "does not write through links or replace them. Nothing was changed; expected a "
            "regular file or folder there, or none.")
        error.errno = errno.ELOOP
        raise error


def check_destination(path, overwrite, kind="file", flag="--overwrite"):
    """Checks that writing `path` replaces nothing without `overwrite`: raises
    `DestinationExists` if something is at `path` (a folder where a file is to go, or the
    reverse, is refused even with `overwrite`), `WriteError` for a link, and `FolderInUse` if a
    running keras_vit job holds a folder above it. Returns `path`.

    A previous version a killed replacement of `path` left aside is put back first
    (`remove_temporaries`), so that it counts as being there."""
    path = os.fspath(path).rstrip(os.sep) or os.fspath(path)
    refuse_link(path)
    parent = os.path.dirname(os.path.abspath(path))
    check_not_in_use(parent)
    remove_temporaries(parent, os.path.basename(path))
    if not os.path.exists(path):
        return path
    if kind == "file" and os.path.isdir(path):
        raise DestinationExists(f"{path} is a folder. Expected the path of a file to write.")
    if kind == "folder" and not os.path.isdir(path):
        raise DestinationExists(f"{path} is a file. Expected the path of a folder to write.")
    if not overwrite:
        raise DestinationExists(
            f"{path} already exists. Nothing was written; pass overwrite=True ({flag}) to "
            f"replace it, or choose another path.")
    return path


def check_held_folder(path):
    """Raises `WriteError` if `path` lies in a folder this process holds (`folder_lock`) that
    is no longer the folder it locked (moved away, or replaced by another folder of that name
    while the job ran): a job writes only into the folder it locked, never through a path that
    now names someone else's."""
    folder = os.path.realpath(os.path.dirname(os.path.abspath(os.fspath(path))))
    while True:
        identity = _HELD.get(folder)
        if identity is not None:
            try:
                status = os.stat(folder)
                now = (status.st_dev, status.st_ino)
            except OSError:
                now = None
            if now != identity:
                raise WriteError(
                    f"{folder} is no longer the folder this job locked (it was moved or "
                    f"replaced while the job ran): nothing was written to {path}. Expected the "
                    "folder to stay in place until the job ends.")
            return
        parent = os.path.dirname(folder)
        if parent == folder:
            return
        folder = parent


def held_folder_moved(path):
    """Whether `path` lies in a folder this process holds that is no longer the folder it
    locked (see `check_held_folder`): what a job removes, it removes only from its own."""
    try:
        check_held_folder(path)
    except WriteError:
        return True
    return False


def check_not_in_use(folder):
    """Raises `FolderInUse` if a running keras_vit job (a training run, a VTAB suite) holds
    `folder` or a folder above it: its files are that job's to write."""
    folder = os.path.abspath(os.fspath(folder))
    while True:
        lock_path = os.path.join(folder, LOCK_FILE)
        if os.path.realpath(folder) in _HELD:
            return  # this process's own job
        if os.path.isfile(lock_path) and not os.path.islink(lock_path):
            with contextlib.suppress(OSError):
                fd = os.open(lock_path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
                try:
                    if not _try_lock(fd, lock_path, shared=True):
                        raise FolderInUse(
                            f"{folder} is in use by {_describe_holder(fd)}. Nothing was "
                            "written; wait for it to finish, or write elsewhere.")
                finally:
                    os.close(fd)
        parent = os.path.dirname(folder)
        if parent == folder:
            return
        folder = parent


def check_writable_dir(path, what="Output folder"):
    """Creates `path` if needed and checks that files can be written there.

    Raises:
        ValueError: naming the folder, if it cannot be created or written.
    """
    path = os.path.expanduser(os.fspath(path))
    try:
        os.makedirs(path, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path, prefix=_temporary_prefix("tmp"),
                                     suffix="-write-test")
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


def _try_lock(fd, lock_path, shared=False):
    """Takes the exclusive (or `shared`) lock of an open lock file: True, or False if another
    process holds it. Where the platform or the file system has no locks, warns and returns
    True."""
    try:
        import fcntl  # POSIX only: elsewhere a folder is not locked (see folder_lock)
    except ImportError:
        return True
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as e:  # ENOLCK, EOPNOTSUPP: a file system without locks
        if not shared:
            warnings.warn(f"{lock_path}: this file system cannot lock files ({e.strerror}); a "
                          "second run on the same folder will not be refused.", stacklevel=3)
        return True
    if shared:
        fcntl.flock(fd, fcntl.LOCK_UN)
    return True


@contextlib.contextmanager
def folder_lock(path, what="run", remove=False):
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
    system refuses locks). The lock file is never followed through a symbolic link.

    Args:
        path: str or path. An existing folder.
        what: str. What this process does there, for the message another one meets ("run",
            "VTAB run"). Defaults to "run".
        remove: bool or callable. Remove the lock file on release if this call created it
            (a callable is asked then, so that a job decides at its end whether it left
            anything). Defaults to False.

    Raises:
        FolderInUse: naming the holder, if another process holds the lock.
        WriteError: if the lock file cannot be created, or is a symbolic link.
    """
    path = os.fspath(path)
    lock_path = os.path.join(path, LOCK_FILE)
    while True:
        refuse_link(lock_path)
        created = not os.path.lexists(lock_path)
        with naming_write_errors(lock_path):
            try:
                fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0),
                             0o666)
            except OSError as e:
                if e.errno == errno.ELOOP:
                    refuse_link(lock_path)
                raise
        if not _try_lock(fd, lock_path):
            try:
                raise FolderInUse(
                    f"{path} is in use by {_describe_holder(fd)}. Wait for it to finish (or "
                    "stop it), or choose another folder.")
            finally:
                os.close(fd)
        if _same_file(fd, lock_path):
            break
        os.close(fd)  # a holder removed the file as we opened it: take the one there now
    held = os.path.realpath(path)
    try:
        with naming_write_errors(lock_path):
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
            os.write(fd, json.dumps(_holder(what)).encode("utf-8"))
        status = os.stat(path)
        _HELD[held] = (status.st_dev, status.st_ino)
        try:
            yield
        finally:
            _HELD.pop(held, None)
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)  # an unheld lock records no holder
            if created and (remove() if callable(remove) else remove) \
                    and _same_file(fd, lock_path):  # never another folder's file
                with contextlib.suppress(OSError):
                    os.remove(lock_path)  # still held: a waiting process retries on the new one
    finally:
        os.close(fd)  # releases the lock


def _same_file(fd, path):
    """Whether the open file `fd` is still the file at `path`."""
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path, follow_symlinks=False))
    except OSError:
        return False


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
