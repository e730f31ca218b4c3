"""Reading and writing `.npz` checkpoints, never unpickling and never trusting a header.

A checkpoint is read in two steps. `open_npz` reads the zip directory and each member's `.npy`
header only (nothing is inflated beyond the headers) and checks them against each other and
against the file's real size: duplicate members, encrypted members, compression methods other
than numpy's (stored, deflated), object arrays (pickles) and sizes that the member cannot hold
are refused with a `CheckpointError` naming the member. Its `placeholders()` are arrays of the
declared shapes and dtypes that hold no memory, so that keys and shapes can be checked against
a model before `read()` inflates anything. Reading a member to its end checks its zip CRC.
`verified()` instead checks every member's data in one pass that holds a chunk at a time and
gives arrays read on use (`Deferred`), so that a loader holds one array at a time; `deferred()`
gives them without that pass, for a loader that checks each array as it reads it.
"""

import collections
import contextlib
import functools
import io
import math
import os
import struct
import tokenize
import weakref
import zipfile
import zlib

import numpy as np

from keras_vit.fileio import atomic_write, check_destination
from keras_vit.weights.errors import CheckpointError
from keras_vit.weights.keymap import check_finite_weights, model_params

_HEADER_READERS = {
    (1, 0): np.lib.format.read_array_header_1_0,
    (2, 0): np.lib.format.read_array_header_2_0,
}
# numpy.savez writes stored members, numpy.savez_compressed deflated ones.
_COMPRESSIONS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflated"}
# Deflate cannot inflate one byte to more than 1032 (RFC 1951: 258 bytes per 2-bit code).
MAX_DEFLATE_RATIO = 1032
_ENCRYPTED_FLAG = 0x1
# The signatures that start a central directory entry, the end of the directory and its ZIP64
# record (APPNOTE 4.3.12, 4.3.16, 4.3.14): inside an entry's name, extra field or comment, they
# are the entries after it, swallowed by a damaged length.
_DIRECTORY_SIGNATURES = (b"PK\x01\x02", b"PK\x05\x06", b"PK\x06\x06")
# What a damaged archive or member stream raises while it is read.
_READ_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, OSError, struct.error, OverflowError,
                UnicodeDecodeError)
_CHUNK = 1 << 24  # bytes inflated at a time into the array


def placeholder(shape, dtype):
    """A read-only array of `shape` and `dtype` that holds no memory (all strides 0), to check
    shapes and dtypes without reading the data."""
    return np.broadcast_to(np.zeros((), dtype), shape)


def count_nonfinite(values):
    """The count of NaN and infinite values of an array: 0 for integers and booleans; the
    ml_dtypes floats (bfloat16, float8) counted in float32, which holds each of their values."""
    if values.dtype.kind in "iub":
        return 0
    if values.dtype.kind != "f":
        values = values.astype(np.float32)
    return int(values.size - np.count_nonzero(np.isfinite(values)))


def holds_data(value):
    """Whether `value` is an array that holds its values: not a `placeholder` (nor a
    `Deferred`)."""
    return isinstance(value, np.ndarray) and (value.size <= 1 or any(value.strides))


class Deferred:
    """An array made when it is read (`numpy.asarray`), whose `shape` and `dtype` are known
    before: a checkpoint's array read from its file on use, or one rewritten from such arrays.

    Attributes:
        nonfinite: int or None. The count of its NaN and infinite values where it is known
            without reading it (counted as the file was verified), else None.
    """

    def __init__(self, shape, dtype, read, nonfinite=None):
        self.shape, self.dtype, self.nonfinite = tuple(shape), np.dtype(dtype), nonfinite
        self.ndim, self.size = len(self.shape), math.prod(self.shape)
        self._read = read

    def __array__(self, dtype=None, copy=None):
        value = self._read()
        return value if dtype is None else value.astype(dtype)


def derived(value, shape, make):
    """`make(value)`, an array of `shape` and `value`'s dtype: computed now where `value` holds
    its values, else a `Deferred` computed as it is read (nothing is read for a `placeholder`;
    its count of non-finite values is known where `value`'s is zero)."""
    if not isinstance(value, Deferred):
        value = np.asarray(value)
        if holds_data(value):
            return make(value)
    nonfinite = 0 if getattr(value, "nonfinite", None) == 0 else None
    return Deferred(shape, value.dtype, lambda: make(np.asarray(value)), nonfinite)


class NpzCheckpoint:
    """An `.npz` whose zip directory and `.npy` headers were read and checked (`open_npz`).

    Attributes:
        path: str. The file.
        headers: dict of key -> (shape, dtype, fortran_order), in the file's order.
    """

    def __init__(self, path, members, headers):
        self.path = path
        self._members = members  # key -> ZipInfo
        self.headers = headers
        self._kept_archive = None  # the archive `verified()` opened, and reads from after

    def placeholders(self):
        """The declared arrays as `placeholder`s: a dict like `read()`'s, read from nothing."""
        return {key: placeholder(shape, dtype) for key, (shape, dtype, _) in self.headers.items()}

    def read(self):
        """The arrays, each checked again against its header and its zip CRC.

        Raises:
            CheckpointError: naming the file and the member, if it changed or is corrupted.
        """
        with self._archive() as archive:
            return {key: self._read_member(archive, key) for key in self.headers}

    def verified(self):
        """The arrays as `Deferred`s, read on use, after one pass over the whole file that
        checks every member against its header and its zip CRC and counts its non-finite
        values, holding no more than a chunk of it: a loader that takes one array at a time
        then holds one array at a time.

        Raises:
            CheckpointError: naming the file and the member, if it changed or is corrupted.
        """
        largest = max(math.prod(shape) * dtype.itemsize
                      for shape, dtype, _ in self.headers.values())
        buffer = np.empty(min(_CHUNK, max(largest, 1)), np.uint8)  # whole values per chunk
        with self._archive(keep=True) as archive:
            counts = {key: self._count_nonfinite(archive, key, buffer) for key in self.headers}
        return self.deferred(counts)

    def deferred(self, nonfinite=None):
        """The arrays as `Deferred`s, read on use from the file as it is opened now (even where
        the path is replaced meanwhile), each read checking its member against its header and
        its zip CRC, with nothing read before: `verified()` without its pass, for a loader
        that checks each array's values as it reads it.

        Args:
            nonfinite: dict of key -> the count of its non-finite values, or None (unknown).

        Raises:
            CheckpointError: naming the file, if it cannot be opened (from each read: naming
                the member, if it changed or is corrupted).
        """
        with self._archive(keep=True):
            pass
        nonfinite = nonfinite or {}
        return {key: Deferred(shape, dtype, functools.partial(self._read_kept, key),
                              nonfinite.get(key))
                for key, (shape, dtype, _) in self.headers.items()}

    def _read_kept(self, key):
        with self._archive() as archive:
            return self._read_member(archive, key)

    @contextlib.contextmanager
    def _archive(self, keep=False):
        """The open archive, its errors raised as `CheckpointError`s. With `keep`, it stays
        open for later reads (the one `verified()` opened): they read what was verified even
        where the path is replaced meanwhile (a new download, an atomic write)."""
        try:
            if keep and self._kept_archive is None:
                file = open(self.path, "rb")
                try:
                    self._kept_archive = zipfile.ZipFile(file)
                except BaseException:
                    file.close()
                    raise
                weakref.finalize(self, _close, self._kept_archive, file)
            if self._kept_archive is not None:
                yield self._kept_archive
                return
            with zipfile.ZipFile(self.path) as archive:
                yield archive
        except CheckpointError:
            raise
        except (*_READ_ERRORS, ValueError) as e:
            raise CheckpointError(f"{self.path} is corrupted or truncated "
                                  f"({str(e) or type(e).__name__}).") from None

    def _read_member(self, archive, key):
        """The member's array."""
        shape, dtype, fortran_order = self.headers[key]
        flat = np.empty(math.prod(shape), dtype)
        view = flat.view(np.uint8) if flat.nbytes else np.empty(0, np.uint8)
        for _ in self._chunks(archive, key, lambda done, size: view[done:done + size]):
            pass
        return flat.reshape(shape, order="F" if fortran_order else "C")

    def _count_nonfinite(self, archive, key, buffer):
        """The count of the member's NaN and infinite values, read through `buffer` (uint8)
        in turn."""
        dtype = self.headers[key][1]
        return sum(count_nonfinite(chunk.view(dtype)) if dtype.kind == "f" else 0
                   for chunk in self._chunks(archive, key, lambda done, size: buffer[:size]))

    def _chunks(self, archive, key, into):
        """Reads the member's data to its end (which checks its zip CRC), each chunk into
        `into(bytes done, chunk size)` (a uint8 array), yielding it filled."""
        shape, dtype, _ = self.headers[key]
        with archive.open(self._members[key]) as f:
            if _read_header(f, self.path, key) != self.headers[key]:
                raise CheckpointError(f"{self.path}: member {key!r} changed while it was read.")
            size, done = math.prod(shape) * dtype.itemsize, 0
            while done < size:
                target = into(done, min(_CHUNK, size - done))
                count = _read_exactly(f, target)
                if count < target.size:
                    raise CheckpointError(f"{self.path}: member {key!r} ends after "
                                          f"{done + count:,} of its {size:,} bytes: the file is "
                                          "truncated.")
                yield target
                done += count
            if f.read(1):
                raise CheckpointError(f"{self.path}: member {key!r} holds more bytes than its "
                                      f"shape {shape} of {dtype}: the file is corrupted.")


def _close(archive, file):
    archive.close()
    file.close()


def _read_exactly(f, into):
    """Reads `len(into)` bytes of `f` into `into`, fewer only at its end; returns the count."""
    done = 0
    while done < len(into):
        count = f.readinto(into[done:])
        if not count:
            break
        done += count
    return done


def _read_header(f, path, key):
    """(shape, dtype, fortran_order) of the `.npy` stream `f`, checked: no pickles."""
    try:
        version = np.lib.format.read_magic(f)
        if version not in _HEADER_READERS:
            raise ValueError(f"unsupported .npy format version {version}")
        shape, fortran_order, dtype = _HEADER_READERS[version](f)
    # NumPy parses the header as a Python literal, retokenizing it (Python 2 files) where it
    # is not one: a damaged header can also be a TokenError or a RecursionError.
    except (ValueError, EOFError, OverflowError, SyntaxError, RecursionError,
            tokenize.TokenError) as e:
        raise CheckpointError(f"{path}: member {key!r} is not a NumPy array "
                              f"({type(e).__name__}: {e}).") from None
    if dtype.hasobject:
        raise CheckpointError(
            f"{path}: member {key!r} holds pickled Python objects ({dtype}); checkpoints are "
            "read without unpickling, for safety. Expected plain numeric arrays.")
    if any(n < 0 for n in shape):
        raise CheckpointError(f"{path}: member {key!r} declares shape {shape}. Expected "
                              "non-negative sizes.")
    return shape, dtype, fortran_order


def _check_info(info, key, path, file_size):
    """Refuses a zip member numpy.savez cannot have written, from its directory entry alone."""
    if any(signature in field for signature in _DIRECTORY_SIGNATURES
           for field in (info.extra, info.comment, info.filename.encode("latin-1", "replace"))):
        raise CheckpointError(
            f"{path}: the zip directory entry of member {key!r} runs over the entries after it "
            "(one of its lengths is damaged, and zipfile would drop them): the file is "
            "corrupted.")
    if info.flag_bits & _ENCRYPTED_FLAG:
        raise CheckpointError(f"{path}: member {key!r} is encrypted. Expected the plain "
                              "members numpy.savez writes.")
    if info.compress_type not in _COMPRESSIONS:
        raise CheckpointError(
            f"{path}: member {key!r} uses zip compression method {info.compress_type}. "
            "Expected stored or deflated members (numpy.savez, numpy.savez_compressed).")
    if info.header_offset + info.compress_size > file_size:
        raise CheckpointError(
            f"{path}: member {key!r} declares {info.compress_size:,} bytes at offset "
            f"{info.header_offset:,}, past the end of the file ({file_size:,} bytes): the file "
            "is truncated or corrupted.")
    limit = info.compress_size * (MAX_DEFLATE_RATIO if info.compress_type else 1)
    if info.file_size > limit:
        raise CheckpointError(
            f"{path}: member {key!r} declares {info.file_size:,} bytes, more than its "
            f"{info.compress_size:,} {_COMPRESSIONS[info.compress_type]} bytes can hold: the "
            "file is corrupted.")


def _member_header(archive, info, key, path):
    with archive.open(info) as f:
        shape, dtype, fortran_order = _read_header(f, path, key)
        declared = math.prod(shape) * dtype.itemsize
        stored = info.file_size - f.tell()
    if declared != stored:
        raise CheckpointError(
            f"{path}: member {key!r} declares shape {shape} of {dtype} ({declared:,} bytes) "
            f"but holds {stored:,} bytes: the file is truncated or corrupted.")
    return shape, dtype, fortran_order


def open_npz(path):
    """Reads and checks the zip directory and the `.npy` headers of a checkpoint `.npz`,
    inflating nothing else.

    Returns:
        An `NpzCheckpoint`: `placeholders()` to check keys and shapes, `read()` for the arrays.

    Raises:
        FileNotFoundError: if there is no file at `path`.
        CheckpointError: naming the file (and the member), if it is not an npz archive, has two
            members of one name, encrypted members or another compression than numpy's, holds
            pickled objects, or declares sizes it cannot hold.
    """
    path = os.path.expanduser(os.fspath(path))
    if not os.path.isfile(path):
        raise FileNotFoundError(f"No checkpoint file at {path}.")
    if not zipfile.is_zipfile(path):
        raise CheckpointError(
            f"{path} is not an .npz checkpoint (not a zip archive). Expected a file saved with "
            "numpy.savez, such as the official ViT checkpoints.")
    file_size = os.path.getsize(path)
    try:
        with zipfile.ZipFile(path) as archive:
            infos = [info for info in archive.infolist() if not info.is_dir()]
            keys = [info.filename.removesuffix(".npy") for info in infos]
            twice = sorted(k for k, n in collections.Counter(keys).items() if n > 1)
            if twice:
                raise CheckpointError(f"{path} has two members named {twice[0]!r}: which one "
                                      "holds the array is ambiguous. Expected one member per "
                                      "array, as numpy.savez writes.")
            for info, key in zip(infos, keys):
                _check_info(info, key, path, file_size)
            headers = {key: _member_header(archive, info, key, path)
                       for info, key in zip(infos, keys)}
    except CheckpointError:
        raise
    except (*_READ_ERRORS, ValueError, RuntimeError, NotImplementedError) as e:
        raise CheckpointError(f"{path} is corrupted or truncated "
                              f"({str(e) or type(e).__name__}).") from None
    if not headers:
        raise CheckpointError(f"{path} holds no arrays. Expected a ViT checkpoint.")
    return NpzCheckpoint(path, dict(zip(keys, infos)), headers)


def read_npz(path):
    """Reads a checkpoint `.npz` into a dict of arrays (see `open_npz`; its headers are checked
    before any data is inflated).

    Raises:
        FileNotFoundError: if there is no file at `path`.
        CheckpointError: naming the file (and the member), if it is not an npz archive, holds
            pickled objects or non-array members, or is truncated or corrupted.
    """
    return open_npz(path).read()


def npz_bytes(model_or_params):
    """The bytes of the `.npz` of a model (or a dict of arrays) in the official layout."""
    params = model_or_params if isinstance(model_or_params, dict) else model_params(
        model_or_params)
    buffer = io.BytesIO()
    np.savez(buffer, **params)
    return buffer.getvalue()


def write_npz(params, path, overwrite=False):
    """Writes a dict of arrays as an `.npz`, atomically: the arrays of a checkpoint in the
    official layout (`keras_vit.weights.save_npz` writes a model, checking that it reads back).

    A file already at `path` is replaced only with `overwrite=True`.

    Raises:
        keras_vit.fileio.DestinationExists: if `path` exists (without `overwrite`) or is a
            folder; nothing is written.
        keras_vit.fileio.WriteError: naming `path`, if it cannot be written (a full disk).
    """
    check_destination(path, overwrite)
    check_finite_weights(params, f"Writing {path}")
    data = npz_bytes(params)
    atomic_write(path, lambda f: f.write(data))
    return os.fspath(path)
