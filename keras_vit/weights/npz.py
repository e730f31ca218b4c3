"""Reading and writing `.npz` checkpoints, never unpickling and never trusting a header.

Each member's `.npy` header is read first: object arrays (pickles) are refused, and the bytes a
header declares must be the bytes the member holds, so a corrupt or hostile file gets a
`CheckpointError` naming the member instead of a huge allocation or a misleading message.
Reading a member to its end checks its zip CRC.
"""

import io
import os
import zipfile

import numpy as np

from keras_vit.fileio import atomic_write, check_destination
from keras_vit.weights.errors import CheckpointError
from keras_vit.weights.keymap import model_params

_HEADER_READERS = {
    (1, 0): np.lib.format.read_array_header_1_0,
    (2, 0): np.lib.format.read_array_header_2_0,
}


def _read_member(archive, info, path):
    key = info.filename.removesuffix(".npy")
    with archive.open(info) as f:
        try:
            version = np.lib.format.read_magic(f)
            if version not in _HEADER_READERS:
                raise ValueError(f"unsupported .npy format version {version}")
            shape, fortran_order, dtype = _HEADER_READERS[version](f)
        except ValueError as e:
            raise CheckpointError(f"{path}: member {key!r} is not a NumPy array ({e}).") from None
        if dtype.hasobject:
            raise CheckpointError(
                f"{path}: member {key!r} holds pickled Python objects ({dtype}); checkpoints are "
                "read without unpickling, for safety. Expected plain numeric arrays.")
        declared = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        stored = info.file_size - f.tell()
        if declared != stored:
            raise CheckpointError(
                f"{path}: member {key!r} declares shape {shape} of {dtype} ({declared:,} bytes) "
                f"but holds {stored:,} bytes: the file is truncated or corrupted.")
        data = f.read(declared)
        f.read()  # to the end, so that the CRC is checked
    array = np.frombuffer(data, dtype=dtype)
    return key, array.reshape(shape, order="F" if fortran_order else "C").copy()


def read_npz(path):
    """Reads a checkpoint `.npz` into a dict of arrays.

    Raises:
        FileNotFoundError: if there is no file at `path`.
        CheckpointError: naming the file (and the member), if it is not an npz archive, holds
            pickled objects or non-array members, or is truncated or corrupted.
    """
    path = os.path.expanduser(os.fspath(path))
    if not os.path.isfile(path):
        raise FileNotFoundError(f"No checkpoint file at {path}.")
    if not zipfile.is_zipfile(path):
        raise CheckpointError(
            f"{path} is not an .npz checkpoint (not a zip archive). Expected a file saved with "
            "numpy.savez, such as the official ViT checkpoints.")
    try:
        with zipfile.ZipFile(path) as archive:
            params = dict(_read_member(archive, info, path) for info in archive.infolist()
                          if not info.is_dir())
    except (zipfile.BadZipFile, EOFError, OSError) as e:
        raise CheckpointError(f"{path} is corrupted or truncated: {e}") from e
    if not params:
        raise CheckpointError(f"{path} holds no arrays. Expected a ViT checkpoint.")
    return params


def npz_bytes(model_or_params):
    """The bytes of the `.npz` of a model (or a dict of arrays) in the official layout."""
    params = model_or_params if isinstance(model_or_params, dict) else model_params(
        model_or_params)
    buffer = io.BytesIO()
    np.savez(buffer, **params)
    return buffer.getvalue()


def save_npz(model_or_params, path, overwrite=False):
    """Writes a model (or a dict of arrays) as an `.npz` in the official layout, atomically.

    A file already at `path` is replaced only with `overwrite=True`.

    An int8-quantized model (`model.quantize("int8")`) is written as its dequantized float
    weights: the file loads into the float model, which `quantize("int8")` turns back into
    the same quantized model.

    Raises:
        keras_vit.fileio.DestinationExists: if `path` exists (without `overwrite`) or is a
            folder; nothing is written.
        keras_vit.fileio.WriteError: naming `path`, if it cannot be written (a full disk).
    """
    check_destination(path, overwrite)
    data = npz_bytes(model_or_params)
    atomic_write(path, lambda f: f.write(data))
    return os.fspath(path)
