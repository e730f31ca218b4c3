"""Reading a whole Keras model file (`.keras`, as `model.save` writes it), checked.

`keras.saving.load_model` reports a damaged file as whatever its parts raise (a `BadZipFile`
for one flipped byte, "File not found" for a truncated file, h5py's errors for a damaged
weights member). `load_model` checks the archive first (a zip whose every member matches its
CRC-32, with the members Keras writes) and reports any failure as one `CheckpointError`
naming the file.
"""

import os
import zipfile
import zlib

import keras

import keras_vit  # noqa: F401  (registers keras_vit's layers for deserialisation)
from keras_vit.weights.errors import CheckpointError

# The members `keras.Model.save` writes into a `.keras` archive.
MEMBERS = ("config.json", "metadata.json", "model.weights.h5")
# What Keras' reader and its parts raise for a file that is not a model it can rebuild.
_LOAD_ERRORS = (ValueError, TypeError, LookupError, AttributeError, OSError, RuntimeError,
                RecursionError, EOFError, zipfile.BadZipFile, zlib.error)


def check_archive(path):
    """Raises unless `path` is a zip archive holding the members Keras writes, each matching
    its CRC-32.

    Raises:
        FileNotFoundError: for a path that is not a file.
        CheckpointError: naming the file and what is wrong with it.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise ValueError(f"load_model takes the path of a .keras file (a str or path). "
                         f"Received: {type(path).__name__}")
    local = os.path.expanduser(os.fspath(path))
    if not os.path.isfile(local):
        raise FileNotFoundError(f"{path}: no such file. Expected a .keras model file.")
    try:
        with zipfile.ZipFile(local) as archive:
            names = set(archive.namelist())
            missing = [name for name in MEMBERS if name not in names]
            if missing:
                raise CheckpointError(
                    f"{path}: a zip archive without {', '.join(missing)}: not a .keras model. "
                    "Expected a file keras.Model.save wrote.")
            damaged = archive.testzip()
    except CheckpointError:
        raise
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError,
            NotImplementedError) as e:
        raise CheckpointError(f"{path} is not a readable .keras model: not a whole zip archive "
                              f"({_first_line(e)}). Expected a file keras.Model.save wrote, "
                              "whole.") from None
    if damaged is not None:
        raise CheckpointError(f"{path} is damaged: its member {damaged} does not match its "
                              "checksum. Expected a file keras.Model.save wrote, whole.")


def load_model(path, **kwargs):
    """`keras.saving.load_model(path, **kwargs)` with keras_vit's layers registered, for a
    `.keras` file checked first (`check_archive`): a damaged, truncated or foreign file is
    one `CheckpointError` naming it, never an error from Keras' parts. `safe_mode` stays
    Keras' default (True: no code in the file runs).

    Raises:
        FileNotFoundError: for a path that is not a file.
        CheckpointError: naming the file, for one Keras cannot rebuild a model from.
    """
    check_archive(path)
    try:
        return keras.saving.load_model(os.path.expanduser(os.fspath(path)), **kwargs)
    except RecursionError:
        raise CheckpointError(f"{path} is not a readable .keras model: its config.json is "
                              "nested too deeply.") from None
    except _LOAD_ERRORS as e:
        raise CheckpointError(f"{path} is not a readable .keras model "
                              f"({_first_line(e)}).") from None


def _first_line(error):
    text = str(error).strip()
    line = text.splitlines()[0] if text else type(error).__name__
    return line if len(line) <= 300 else line[:297] + "..."
