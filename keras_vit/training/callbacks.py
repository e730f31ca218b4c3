"""Callbacks of a fault-tolerant run: crash-safe backups, the best checkpoint, logs.

`keras_vit.training.fit` uses them; `training_callbacks(dir)` gives the same set for your own
`model.fit` (pass `initial_epoch=resume_epoch(backup_dir(dir))` to resume).
"""

import hashlib
import importlib.util
import json
import math
import os
import shutil

import keras
import numpy as np

from keras_vit.parallel import cluster
from keras_vit.fileio import atomic_write, atomic_write_text, check_writable_dir, staging_dir
from keras_vit.implementations import random_states
from keras_vit.checks import check_positive_int
from keras_vit.weights import model_params
from keras_vit.weights.config_json import read_json
from keras_vit.weights.loading import as_numpy_float
from keras_vit.weights.npz import npz_bytes, open_npz

BACKUP_FOLDER = "backup"
BACKUP_POINTER = "latest.json"
# The training state of a backup, one .npz written by NumPy (no HDF5: a full disk is then an
# OSError, which h5py cannot always survive).
BACKUP_STATE = "state.npz"
BEST_FILE = "best.npz"
BEST_RECORD = "best.json"
# best.json: the monitored value, the epoch (numbered from 1, as Keras' progress shows "Epoch
# 1/N" and the run's summary counts), and the SHA-256 of best.npz; "previous" keeps the record
# of the file it replaces until that file is replaced too.
BEST_FIELDS = {"monitor": str, "value": float, "epoch": int, "sha256": str}
_SHA256_DIGITS = 64
# The most epochs a backup pointer may record: far beyond any real run (a larger number is a
# damaged or hostile file).
MAX_EPOCH = 2**31 - 1
MAX_LOSS = 1e6
_JSON_TYPES = {dict: "an object", bool: "true or false", int: "a non-negative integer",
               float: "a finite number", str: "a string"}


class StateFileError(ValueError):
    """A state file of a run (run.json, best.json, best.npz, latest.json) that is unreadable,
    malformed, or not the file the run recorded; the message names the file and the field."""


class BackupError(StateFileError):
    """A backup folder that cannot be resumed from; the message says what to do."""


def _has_type(value, kind):
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) \
            and math.isfinite(value)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0
    return isinstance(value, kind)


def check_json_fields(state, fields, path, remedy):
    """Raises `StateFileError` naming `path` and the first field of `fields` ({name: type})
    that `state` (a JSON object) lacks or holds with another type."""
    if not isinstance(state, dict):
        raise StateFileError(f"{path} holds {type(state).__name__}, expected a JSON object; "
                             f"{remedy}.")
    for name, kind in fields.items():
        if name not in state or not _has_type(state[name], kind):
            found = f"is {state[name]!r}" if name in state else "is missing"
            raise StateFileError(f"{path}: field {name!r} {found}, expected {_JSON_TYPES[kind]}; "
                                 f"{remedy}.")
    return state


def read_json_state(path, fields, remedy):
    """The JSON object in `path`, its `fields` ({name: type}) checked; `remedy` ends messages.

    Raises:
        StateFileError: naming the file (and the field), if it is unreadable or malformed.
    """
    state = read_json(path, f"the JSON file keras_vit wrote; {remedy}", StateFileError)
    return check_json_fields(state, fields, path, remedy)


def backup_dir(output_dir):
    """The backup folder of this process under a run's `output_dir`: `backup/`, or
    `backup/<task type>-<index>` when TF_CONFIG names several workers, `backup/process-<i>` in
    a multi-process JAX run (`keras_vit.parallel.cluster.process_name`)."""
    path = os.path.join(os.fspath(output_dir), BACKUP_FOLDER)
    name = cluster.process_name()
    return os.path.join(path, name) if name else path


def _read_pointer(backup_dir, epochs=None):
    """The backup state `{"epoch": int, "dir": str}`, or None without a backup; `epochs`: the
    run's length, which the epoch must not pass."""
    pointer = os.path.join(os.fspath(backup_dir), BACKUP_POINTER)
    if not os.path.exists(pointer):
        return None
    remedy = "Start the run over with overwrite=True (--overwrite)"
    state = read_json(pointer, f'{{"epoch": N, "dir": "epoch-..."}}, the backup pointer '
                               f"keras_vit writes; {remedy}", BackupError)
    epoch, folder = (state.get(k) for k in ("epoch", "dir")) if isinstance(state, dict) \
        else (None, None)
    if not _has_type(epoch, int) or epoch > MAX_EPOCH or folder != _backup_name(epoch):
        raise BackupError(f"The backup pointer {pointer} is unreadable (epoch {epoch!r:.40}, dir "
                          f'{folder!r:.60}). Expected {{"epoch": N, "dir": "epoch-N"}} with N '
                          f"epochs completed (0 to {MAX_EPOCH}), as keras_vit writes it. "
                          f"{remedy}.")
    if epochs is not None and epoch > epochs:
        raise BackupError(f"The backup pointer {pointer} records epoch {epoch} of a run of "
                          f"{epochs} epochs. Expected an epoch from 0 to {epochs}. {remedy}.")
    return state


def _backup_name(epoch):
    return f"epoch-{epoch:06d}"


def resume_epoch(backup_dir, epochs=None):
    """The epoch a run backed up in `backup_dir` resumes at (epochs completed): 0 without a
    backup. Build the training pipeline from that epoch so that a resumed run sees the
    batches the uninterrupted run would have seen (`InputData.from_epoch`).

    Args:
        backup_dir: str. The run's backup folder (`backup_dir(output_dir)`).
        epochs: int or None. The run's length: a backup past it is refused.

    Raises:
        BackupError: naming `latest.json`, if it is unreadable or malformed, or records an
            epoch past `epochs`.
    """
    state = _read_pointer(backup_dir, epochs)
    return 0 if state is None else state["epoch"]


def training_state(model):
    """The variables a backup holds, by group: the model's weights, its optimizer's variables
    (moments, step counter, loss scale), and its dropout layers' seed states (not weights)."""
    optimizer = getattr(model, "optimizer", None)
    return {"weights": list(model.weights),
            "optimizer": list(optimizer.variables) if optimizer is not None else [],
            "random": random_states(model)}


def _restore(model, path):
    """Assigns the training state saved at `path` to `model`, all or nothing.

    Raises:
        BackupError: naming the file, if it is unreadable or holds another model's state.
    """
    remedy = "Start the run over with overwrite=True (--overwrite)."
    try:
        checkpoint = open_npz(path)
        declared = checkpoint.placeholders()
        for group, variables in training_state(model).items():
            values = [declared.get(f"{group}/{i}") for i in range(len(variables))]
            count = sum(key.startswith(group + "/") for key in declared)
            shapes = [tuple(v.shape) for v in variables]
            if count != len(variables) or any(
                    value is None or value.shape != shape for value, shape in zip(values, shapes)):
                raise BackupError(
                    f"The backup {path} holds {count} {group} arrays that do not fit the "
                    f"{len(variables)} of this model (and its optimizer): it was made by "
                    f"another model or training setup. {remedy}")
        saved = checkpoint.read()
    except BackupError:
        raise
    except (OSError, ValueError) as e:
        raise BackupError(f"The backup {path} cannot be restored ({e}). {remedy}") from None
    for group, variables in training_state(model).items():
        for i, variable in enumerate(variables):
            variable.assign(saved[f"{group}/{i}"])


class BackupAndRestore(keras.callbacks.Callback):
    """Backs up the model, its optimizer state and its random-number state at every epoch end,
    crash-safe, and restores them when training begins.

    Each backup is written to a fresh folder, then `latest.json` is replaced atomically to
    point at it: a process killed at any instant leaves the previous complete backup in use,
    never a half-written file or the weights of one epoch with the counter of another. The
    previous backup folder is removed once the pointer has moved. A backup that cannot be
    written (a full disk) raises `keras_vit.fileio.WriteError` and leaves the previous one.

    Keras resumes at epoch boundaries: pass `initial_epoch=resume_epoch(backup_dir)` to
    `model.fit` (`keras_vit.training.fit` does), and the run continues at the first epoch
    without a backup, from the weights saved at the end of the previous one.

    Args:
        backup_dir: str. A folder used for nothing else.
        every: int. Back up every `every` epochs (and never lose more than that many on a
            crash). Defaults to 1.
    """

    def __init__(self, backup_dir, every=1):
        super().__init__()
        self.backup_dir = os.fspath(backup_dir)
        self.every = check_positive_int("every", every)

    def on_train_begin(self, logs=None):
        state = _read_pointer(self.backup_dir, (self.params or {}).get("epochs"))
        if state is None:
            return
        if self.model.optimizer is not None and not self.model.optimizer.built:
            self.model.optimizer.build(self.model.trainable_variables)
        _restore(self.model, os.path.join(self.backup_dir, state["dir"], BACKUP_STATE))

    def on_epoch_end(self, epoch, logs=None):
        completed = epoch + 1
        loss = (logs or {}).get("loss", 0.0)
        if completed % self.every or self.model.stop_training or not np.isfinite(loss):
            return  # a stopped (e.g. diverged) epoch keeps the last good backup
        data = npz_bytes({f"{group}/{i}": as_numpy_float(keras.ops.convert_to_numpy(v))
                          for group, variables in training_state(self.model).items()
                          for i, v in enumerate(variables)})
        name = _backup_name(completed)
        with staging_dir(os.path.join(self.backup_dir, name)) as staging, \
                open(os.path.join(staging, BACKUP_STATE), "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        atomic_write_text(os.path.join(self.backup_dir, BACKUP_POINTER),
                          json.dumps({"epoch": completed, "dir": name}))
        for entry in os.listdir(self.backup_dir):
            if entry.startswith("epoch-") and entry != name:
                shutil.rmtree(os.path.join(self.backup_dir, entry), ignore_errors=True)


def finite_params(model):
    """The model's checkpoint arrays, or None if any weight is NaN or infinite."""
    params = model_params(model)
    if all(np.isfinite(v).all() for v in params.values()):
        return params
    return None


def _sha256(data):
    return hashlib.sha256(data).hexdigest()


def _file_sha256(path):
    with open(path, "rb") as f:
        return _sha256(f.read())


def best_record(path):
    """The record of the best checkpoint `path` (`best.npz`) as the file is now: `monitor`,
    `value`, `epoch` and `sha256`; None without the file or its record (`best.json`).

    The record is written before the file it describes and keeps the record of the file it
    replaces, so a run killed between the two writes resumes with the file it left.

    Raises:
        StateFileError: naming the file, if the record is unreadable or malformed, or the file
            is neither the one recorded nor the one it replaced (it was changed afterwards).
    """
    path = os.fspath(path)
    record_path = os.path.splitext(path)[0] + ".json"
    if not (os.path.exists(path) and os.path.exists(record_path)):
        return None
    remedy = f"delete {path} and {record_path} to let the run choose its best again"
    record = read_json_state(record_path, BEST_FIELDS, remedy)
    previous = record.get("previous")
    candidates = [record] + ([previous] if previous is not None else [])
    for candidate in candidates:
        check_json_fields(candidate, BEST_FIELDS, record_path, remedy)
        _check_best_ranges(candidate, record_path, remedy)
        if len(candidate["sha256"]) != _SHA256_DIGITS:
            raise StateFileError(f"{record_path}: field 'sha256' is {candidate['sha256']!r}, "
                                 f"expected {_SHA256_DIGITS} hexadecimal digits; {remedy}.")
    digest = _file_sha256(path)
    for candidate in candidates:
        if candidate["sha256"] == digest:
            return {name: candidate[name] for name in BEST_FIELDS}
    raise StateFileError(
        f"{path} is not the file {record_path} records (SHA-256 {digest}, recorded "
        f"{record['sha256']}): it was changed after the run wrote it. Put the run's own file "
        f"back, or {remedy}.")


def monitor_range(monitor):
    """The values a monitored metric can take: [0, 1] for an accuracy, [0, 1e6] for a loss
    (cross-entropies of any real model stay far below), else any finite number."""
    if "acc" in monitor:
        return 0.0, 1.0
    if "loss" in monitor:
        return 0.0, MAX_LOSS
    return -math.inf, math.inf


def _check_best_ranges(record, path, remedy):
    """A best.json record's epoch (an epoch's number, from 1) and value (in its monitor's
    range): a value no epoch can beat would keep the first best for ever."""
    if not 1 <= record["epoch"] <= MAX_EPOCH:
        raise StateFileError(f"{path}: field 'epoch' is {record['epoch']}, expected an "
                             f"epoch's number from 1 to {MAX_EPOCH}; {remedy}.")
    low, high = monitor_range(record["monitor"])
    if not low <= record["value"] <= high:
        raise StateFileError(f"{path}: field 'value' is {record['value']:.6g}, outside the "
                             f"range of {record['monitor']!r:.60} ([{low:g}, {high:g}]); "
                             f"{remedy}.")


class BestCheckpoint(keras.callbacks.Callback):
    """Writes the model as an official-layout `.npz` whenever `monitor` improves.

    Beside the file, `<name>.json` records the monitored value, the epoch and the file's
    SHA-256; a resumed run starts from that value, so its first epoch replaces the file only
    if it is better, and refuses a file that is not the one recorded (`best_record`). Weights
    with a NaN or infinity are never written. The file loads with `keras_vit.load_pretrained`.
    Written atomically, by the chief worker only.

    Args:
        path: str. The `.npz` file to write.
        monitor: str. A log name, e.g. "val_accuracy" or "val_loss". Defaults to
            "val_accuracy".
        mode: "max", "min" or "auto" (max for names containing "acc", min otherwise).
    """

    def __init__(self, path, monitor="val_accuracy", mode="auto"):
        super().__init__()
        if mode not in ("auto", "max", "min"):
            raise ValueError(f"Unknown mode {mode!r}. Expected 'auto', 'max' or 'min'.")
        self.path = os.fspath(path)
        self.record = os.path.splitext(self.path)[0] + ".json"
        self.monitor = monitor
        self.sign = 1.0 if mode == "max" or (mode == "auto" and "acc" in monitor) else -1.0
        self.best = None
        self.best_epoch = None
        self._kept = None  # the record of the file on disk

    def on_train_begin(self, logs=None):
        self._kept = best_record(self.path)
        if self._kept is not None and self._kept["monitor"] == self.monitor:
            self.best, self.best_epoch = self._kept["value"], self._kept["epoch"]

    def on_epoch_end(self, epoch, logs=None):
        value = (logs or {}).get(self.monitor)
        if value is None:
            raise ValueError(
                f"BestCheckpoint monitors {self.monitor!r}, which is not among the logs "
                f"{sorted(logs or {})}. Expected validation data for 'val_*' names.")
        value = float(value)
        better = self.best is None or self.sign * value > self.sign * self.best
        if not np.isfinite(value) or not better:
            return
        params = finite_params(self.model)
        if params is None:
            return
        self.best, self.best_epoch = value, epoch + 1  # Keras' index from 0: the epoch's number
        data = npz_bytes(params)
        entry = {"monitor": self.monitor, "value": value, "epoch": self.best_epoch,
                 "sha256": _sha256(data)}
        if cluster.is_chief():
            atomic_write_text(self.record, json.dumps(dict(entry, previous=self._kept)))
            atomic_write(self.path, lambda f: f.write(data))
        self._kept = entry


def training_callbacks(output_dir, monitor="val_accuracy", backup=True, best=True,
                       tensorboard=None, terminate_on_nan=True, backup_every=1):
    """The callbacks of a fault-tolerant run, writing under `output_dir`.

    - `backup/`: `BackupAndRestore` every `backup_every` epochs (resume after a crash);
    - `best.npz`: `BestCheckpoint` on `monitor` (needs validation data for `val_*`);
    - `logs/`: TensorBoard event files (`tensorboard --logdir output_dir/logs`); with
      `tensorboard=None` (the default) only if the `tensorboard` package is installed;
    - `TerminateOnNaN`: stops at the first NaN loss.

    Under multi-worker training (TF_CONFIG) each worker backs up to `backup/<task type>-<i>`
    (e.g. `backup/worker-1`) and the workers other than the chief log to
    `logs/<task type>-<i>`; in a multi-process JAX run, `backup/process-<i>` and
    `logs/process-<i>`.

    Raises:
        ValueError: if `output_dir` is not writable, or `tensorboard=True` without the
            `tensorboard` package (before any training starts).
    """
    output_dir = check_writable_dir(output_dir)
    installed = importlib.util.find_spec("tensorboard") is not None
    if tensorboard and not installed:
        raise ValueError("tensorboard=True needs the tensorboard package: pip install tensorboard")
    callbacks = []
    if terminate_on_nan:
        callbacks.append(keras.callbacks.TerminateOnNaN())
    if backup:
        callbacks.append(BackupAndRestore(backup_dir(output_dir), backup_every))
    if best:
        callbacks.append(BestCheckpoint(os.path.join(output_dir, BEST_FILE), monitor))
    if tensorboard or (tensorboard is None and installed):
        logs = os.path.join(output_dir, "logs")
        if not cluster.is_chief():
            logs = os.path.join(logs, cluster.process_name())
        callbacks.append(keras.callbacks.TensorBoard(logs))
    return callbacks
