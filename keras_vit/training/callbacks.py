"""Callbacks of a fault-tolerant run: crash-safe backups, the best checkpoint, logs.

`keras_vit.training.fit` uses them; `training_callbacks(dir)` gives the same set for your own
`model.fit` (pass `initial_epoch=resume_epoch(backup_dir(dir))` to resume).
"""

import importlib.util
import json
import os
import shutil

import keras
import numpy as np

from keras_vit.parallel import tf_distribute
from keras_vit.fileio import atomic_write_text, check_writable_dir, staging_dir
from keras_vit.kernels import random_states
from keras_vit.checks import check_positive_int
from keras_vit.weights import model_params, save_npz

BACKUP_POINTER = "latest.json"
BACKUP_WEIGHTS = "model.weights.h5"
BACKUP_RANDOM_STATE = "random_state.npz"


class BackupError(ValueError):
    """A backup folder that cannot be resumed from; the message says what to do."""


def backup_dir(output_dir):
    """The backup folder of this process under a run's `output_dir`: `backup/`, or
    `backup/<task type>-<index>` when TF_CONFIG names several workers."""
    path = os.path.join(os.fspath(output_dir), "backup")
    if tf_distribute.tf_config_workers() > 1:
        path = os.path.join(path, "{}-{}".format(*tf_distribute.worker_index()))
    return path


def _read_pointer(backup_dir):
    """The backup state `{"epoch": int, "dir": str}`, or None without a backup."""
    pointer = os.path.join(os.fspath(backup_dir), BACKUP_POINTER)
    if not os.path.exists(pointer):
        return None
    try:
        with open(pointer, encoding="utf-8") as f:
            state = json.load(f)
        epoch, folder = state["epoch"], state["dir"]
        if not isinstance(epoch, int) or epoch < 0 or not isinstance(folder, str) \
                or os.sep in folder or folder in ("", ".", ".."):
            raise ValueError(f"epoch {epoch!r}, dir {folder!r}")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise BackupError(f"The backup pointer {pointer} is unreadable ({e}). Expected "
                          f'{{"epoch": N, "dir": "epoch-..."}}. Start the run over with '
                          "overwrite=True (--overwrite).") from None
    return state


def resume_epoch(backup_dir):
    """The epoch a run backed up in `backup_dir` resumes at (epochs completed): 0 without a
    backup. Build the training pipeline from that epoch so that a resumed run sees the
    batches the uninterrupted run would have seen (`InputData.from_epoch`)."""
    state = _read_pointer(backup_dir)
    return 0 if state is None else state["epoch"]


class BackupAndRestore(keras.callbacks.Callback):
    """Backs up the model, its optimizer state and its random-number state at every epoch end,
    crash-safe, and restores them when training begins.

    Each backup is written to a fresh folder, then `latest.json` is replaced atomically to
    point at it: a process killed at any instant leaves the previous complete backup in use,
    never a half-written file or the weights of one epoch with the counter of another. The
    previous backup folder is removed once the pointer has moved.

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
        state = _read_pointer(self.backup_dir)
        if state is None:
            return
        if self.model.optimizer is not None and not self.model.optimizer.built:
            self.model.optimizer.build(self.model.trainable_variables)
        folder = os.path.join(self.backup_dir, state["dir"])
        try:
            self.model.load_weights(os.path.join(folder, BACKUP_WEIGHTS))
            with np.load(os.path.join(folder, BACKUP_RANDOM_STATE), allow_pickle=False) as saved:
                arrays = [saved[f"arr_{i}"] for i in range(len(saved.files))]
        except (OSError, ValueError, KeyError) as e:
            raise BackupError(f"The backup {folder} cannot be restored ({e}). Start the run "
                              "over with overwrite=True (--overwrite).") from None
        variables = random_states(self.model)
        if len(arrays) != len(variables):
            raise BackupError(f"The backup {folder} holds {len(arrays)} random states, the model "
                              f"has {len(variables)}: it was made by another model. Start the "
                              "run over with overwrite=True (--overwrite).")
        for variable, value in zip(variables, arrays):
            variable.assign(value)

    def on_epoch_end(self, epoch, logs=None):
        completed = epoch + 1
        loss = (logs or {}).get("loss", 0.0)
        if completed % self.every or self.model.stop_training or not np.isfinite(loss):
            return  # a stopped (e.g. diverged) epoch keeps the last good backup
        name = f"epoch-{completed:06d}"
        with staging_dir(os.path.join(self.backup_dir, name)) as staging:
            self.model.save_weights(os.path.join(staging, BACKUP_WEIGHTS))
            np.savez(os.path.join(staging, BACKUP_RANDOM_STATE),
                     *[keras.ops.convert_to_numpy(v) for v in random_states(self.model)])
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


class BestCheckpoint(keras.callbacks.Callback):
    """Writes the model as an official-layout `.npz` whenever `monitor` improves.

    Beside the file, `<name>.json` records the monitored value and the epoch; a resumed run
    starts from that value, so its first epoch replaces the file only if it is better. Weights
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

    def on_train_begin(self, logs=None):
        if os.path.exists(self.record) and os.path.exists(self.path):
            with open(self.record, encoding="utf-8") as f:
                record = json.load(f)
            if record.get("monitor") == self.monitor:
                self.best, self.best_epoch = record["value"], record["epoch"]

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
        self.best, self.best_epoch = value, epoch
        if tf_distribute.is_chief():
            save_npz(params, self.path)
            atomic_write_text(self.record, json.dumps(
                {"monitor": self.monitor, "value": value, "epoch": epoch}))


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
    `logs/<task type>-<i>`.

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
        callbacks.append(BestCheckpoint(os.path.join(output_dir, "best.npz"), monitor))
    if tensorboard or (tensorboard is None and installed):
        logs = os.path.join(output_dir, "logs")
        if not tf_distribute.is_chief():
            logs = os.path.join(logs, "{}-{}".format(*tf_distribute.worker_index()))
        callbacks.append(keras.callbacks.TensorBoard(logs))
    return callbacks
