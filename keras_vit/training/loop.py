"""`keras_vit.training.fit`: the one way to train, from the command line, the examples and yours.

```python
with strategy.scope():                              # optional: a tf.distribute strategy
    model = keras_vit.ViT_B16(num_classes=10, image_size=384, pretrained=True)
train = keras_vit.data.from_tfds("cifar10", "train", image_size=384, batch_size=64,
                                 strategy=strategy)
val = keras_vit.data.from_tfds("cifar10", "validation", image_size=384, batch_size=64)
summary = keras_vit.training.fit(model, train, val, output_dir="runs/cifar10", steps=10_000,
                                 target_batch_size=512)
```

On JAX, a `keras.distribution` (`keras_vit.get_distribution`: data parallel, or the encoder blocks
sharded over devices) takes the strategy's place: set it before building the model and keep it
set while `fit` runs.

`fit` owns the whole sequence: the epochs/updates arithmetic, gradient accumulation, the
recipe's compile in the model's strategy scope, resuming from `output_dir` (weights, optimizer
and random state of the last finished epoch, and the data pipeline replayed from that epoch),
the callbacks (backup, best checkpoint, TensorBoard, NaN guard), the final checkpoint, and a
summary. Run the same call again after a crash and it continues; call it on a finished run and
it says so instead of overwriting its results.

Files under `output_dir`:

- `final.npz`: the weights after the last epoch (official layout); `best.npz` and `best.json`:
  the best epoch on `monitor`;
- `config.json`: the `keras_vit.ViT` configuration and the class names, so that
  `keras_vit.from_pretrained("output_dir/final.npz")` rebuilds the model with its names;
- `run.json`: the run's settings and whether it finished; `backup/`: the resume state while
  the run is unfinished; `logs/`: TensorBoard; `.keras_vit.lock`: the folder's lock (one run
  at a time: another run on the folder is refused, naming this one);
- for a self-supervised model wrapping a ViT (`keras_vit.pretraining.masked_patch_model`):
  `encoder.npz`, the ViT encoder alone (no pre-training head, official layout), which
  `config.json` describes (`model.encoder_config`); `final.npz` and `best.npz` hold the whole
  pre-training model.
"""

import contextlib
import json
import math
import os
import shutil
import time
import warnings

import keras
import numpy as np

from keras_vit.checks import check_choice, check_int, check_trainable_classes
from keras_vit.data.pipelines import InputData
from keras_vit.fileio import (
    LOCK_FILE,
    atomic_write_text,
    check_writable_dir,
    folder_lock,
    held_folder_moved,
    refuse_link,
    remove_temporaries,
)
from keras_vit.model_parts import vit_config
from keras_vit.parallel import cluster, keras_distribution, tf_distribute
from keras_vit.preprocessing import paper_data_config
from keras_vit.training.callbacks import (
    BACKUP_FOLDER,
    BACKUP_POINTER,
    BACKUP_STATE,
    BEST_FILE,
    BEST_RECORD,
    backup_dir,
    StateFileError,
    best_record,
    check_json_fields,
    finite_params,
    read_json_state,
    resume_epoch,
    training_callbacks,
)
from keras_vit.training.compilation import jit_choice
from keras_vit.training.recipes import (
    PRETRAIN_WEIGHT_DECAY,
    RECIPES,
    accumulation_steps,
    compile_recipe,
    recipe_defaults,
)
from keras_vit.weights.npz import write_npz
from keras_vit.weights.architecture import SIDECAR_CONFIG
from keras_vit.weights.config_json import keras_vit_document, read_json
from keras_vit.weights.errors import CheckpointError

RUN_FILE = "run.json"
CONFIG_FILE = SIDECAR_CONFIG  # the architecture, which keras_vit.from_pretrained reads back
# The values of settings that a run.json may lack: the encoder's layout, and the classes.
LAYOUT_SETTINGS = {"scan": False, "remat": False}
SETTING_DEFAULTS = dict(LAYOUT_SETTINGS, class_names=None)
FINAL_FILE = "final.npz"
ENCODER_FILE = "encoder.npz"
LOGS_DIR = "logs"
TENSORBOARD_EVENTS = "events.out.tfevents."  # the start of the event files' names
# The files `overwrite=True` removes from an output folder before starting over (and, of
# backup/ and logs/, what a run writes there: `_clear_backup`, `_clear_logs`).
RUN_OUTPUTS = (RUN_FILE, CONFIG_FILE, FINAL_FILE, BEST_FILE, BEST_RECORD, ENCODER_FILE)
# What a new run that failed before finishing an epoch leaves nothing of (of what it created).
STARTED_OUTPUTS = (RUN_FILE, CONFIG_FILE, LOGS_DIR)
# Every name a run writes in its folder: in a folder that no run.json marks as a keras_vit
# run, a new run refuses to start where one of them exists (it is not keras_vit's to replace).
RUN_NAMES = RUN_OUTPUTS + (BACKUP_FOLDER, LOGS_DIR)


class TrainingDiverged(RuntimeError):
    """The loss or the weights became NaN or infinite; no final checkpoint was written."""


class RunFinished(ValueError):
    """`output_dir` holds a finished run; the message says how to train further."""


def plan(steps_per_epoch, epochs=None, steps=None, accumulation=1):
    """The run's length: `(epochs, updates)` from whole epochs of `steps_per_epoch` batches.

    Give `epochs`, or `steps` (optimizer updates, rounded up to whole epochs). Each update
    averages `accumulation` batches.
    """
    steps_per_epoch = check_int("steps_per_epoch", steps_per_epoch, 1)
    accumulation = check_int("accumulation", accumulation, 1)
    if (epochs is None) == (steps is None):
        raise ValueError(f"Give exactly one of `epochs` and `steps`. Received: epochs={epochs!r}, "
                         f"steps={steps!r}")
    if epochs is None:
        epochs = math.ceil(check_int("steps", steps, 1) * accumulation / steps_per_epoch)
    epochs = check_int("epochs", epochs, 1)
    updates = epochs * steps_per_epoch // accumulation
    if updates < 1:
        raise ValueError(f"{epochs} epochs of {steps_per_epoch} batches make no update of "
                         f"{accumulation} batches. Expected more epochs or less accumulation.")
    return epochs, updates


# The settings of run.json that are read, and their types (`check_json_fields`).
RUN_SETTINGS = {"epochs": int, "updates": int, "steps_per_epoch": int, "batch_size": int}


def _read_run(path):
    """run.json, validated: `{"settings": {...}, "finished": bool}`, with the settings that
    are read (`RUN_SETTINGS`; `epochs` at least 1) and the run's backup pointer, whose epoch
    must be within the run's epochs."""
    remedy = "pass overwrite=True (--overwrite) to start the run over"
    run = read_json_state(path, {"settings": dict, "finished": bool}, remedy)
    settings = check_json_fields(run["settings"], RUN_SETTINGS, f"{path} (settings)", remedy)
    if settings["epochs"] < 1:
        raise StateFileError(f"{path}: field 'settings.epochs' is {settings['epochs']}, "
                             f"expected at least 1; {remedy}.")
    resume_epoch(backup_dir(os.path.dirname(path)), settings["epochs"])
    return run


def _remove(output_dir, names):
    """Removes the run's files `names` from `output_dir`: never from a folder that took the
    place of the one the run locked."""
    for name in names:
        path = os.path.join(output_dir, name)
        if held_folder_moved(path):
            continue
        if os.path.isdir(path):
            shutil.rmtree(path)
        elif os.path.exists(path):
            os.remove(path)


def _clear_backup(folder):
    """Removes a run's backup in `folder`: its pointer and the state file of each epoch-N
    folder, then each folder they leave empty."""
    if held_folder_moved(folder) or not os.path.isdir(folder):
        return
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(folder, BACKUP_POINTER))
    for entry in os.listdir(folder):
        if entry.startswith("epoch-") and os.path.isdir(os.path.join(folder, entry)):
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(folder, entry, BACKUP_STATE))
            with contextlib.suppress(OSError):
                os.rmdir(os.path.join(folder, entry))
    with contextlib.suppress(OSError):
        os.rmdir(folder)


def _clear_logs(folder):
    """Removes the TensorBoard event files a run wrote under `folder`, then each folder they
    leave empty: a new run's curves do not continue an old one's."""
    if held_folder_moved(folder) or not os.path.isdir(folder):
        return
    for root, _, files in os.walk(folder, topdown=False):
        for name in files:
            if name.startswith(TENSORBOARD_EVENTS):
                os.remove(os.path.join(root, name))
        with contextlib.suppress(OSError):
            os.rmdir(root)


def check_output_dir(output_dir, overwrite=False):
    """Refuses an output folder a run may not write: links among the names a run writes, and,
    in a folder that no run.json marks as a keras_vit run, those names held by files keras_vit
    did not write (unless `overwrite`). `fit` checks this; the command line checks it first.

    Raises:
        ValueError: naming the files, and the way to go on.
        keras_vit.fileio.WriteError: naming a symbolic link among them.
    """
    output_dir = os.path.expanduser(os.fspath(output_dir))
    if os.path.isdir(output_dir):
        _check_ownership(output_dir, overwrite)


def _check_ownership(output_dir, overwrite):
    """Refuses links among the run's names, and, in a folder no run.json marks as a keras_vit
    run, the run's names held by files keras_vit did not write (unless `overwrite`)."""
    for name in RUN_NAMES + (LOCK_FILE,):
        refuse_link(os.path.join(output_dir, name))
    if cluster.is_chief():
        refuse_link(backup_dir(output_dir))
    if overwrite or os.path.exists(os.path.join(output_dir, RUN_FILE)):
        return
    found = [name + ("/" if os.path.isdir(os.path.join(output_dir, name)) else "")
             for name in RUN_NAMES if os.path.lexists(os.path.join(output_dir, name))]
    if found:
        raise ValueError(
            f"{output_dir} holds {', '.join(found)} but no {RUN_FILE}: they are not a keras_vit "
            "run's, and a run would write over them. Nothing was changed; choose a new or empty "
            "folder, or pass overwrite=True (--overwrite) to replace them.")


def recorded_layout(output_dir):
    """The encoder layout (`scan`, `remat`) the run in `output_dir` was started in, whose
    backup holds that layout's layers; {} where no run is recorded there."""
    run_path = os.path.join(output_dir, RUN_FILE)
    if not os.path.exists(run_path):
        return {}
    settings = _recorded_settings(_read_run(run_path))
    return {name: bool(settings[name]) for name in LAYOUT_SETTINGS}


def _recorded_settings(run):
    """The settings a run's `run.json` (read) records, with the defaults of those it predates."""
    return dict(SETTING_DEFAULTS, **run["settings"])


def _check_resume(output_dir, settings, overwrite, model):
    """Refuses a finished run or a changed one (its settings, or the model's architecture or
    data config in its `config.json`); clears the folder with `overwrite`."""
    run_path = os.path.join(output_dir, RUN_FILE)
    if overwrite:
        # Each worker clears its own backup; the chief the shared files. Of the folders, only
        # what a run writes there goes: another file stays, and so its folder.
        _clear_backup(backup_dir(output_dir))
        if cluster.is_chief():
            _remove(output_dir, RUN_OUTPUTS)
            backups = os.path.join(output_dir, BACKUP_FOLDER)
            for entry in os.listdir(backups) if os.path.isdir(backups) else ():
                _clear_backup(os.path.join(backups, entry))  # an earlier run's other processes
            _clear_backup(backups)
            _clear_logs(os.path.join(output_dir, LOGS_DIR))
        return
    if not os.path.exists(run_path):
        return
    previous = _read_run(run_path)
    if previous["finished"]:
        raise RunFinished(
            f"The run in {output_dir} finished ({previous['settings']['epochs']} epochs); its "
            f"weights are in {os.path.join(output_dir, FINAL_FILE)}. To train further, start a "
            f"new run from them (--weights {os.path.join(output_dir, FINAL_FILE)} --output "
            "NEW_FOLDER); to start this one over, pass overwrite=True (--overwrite).")
    recorded = _recorded_settings(previous)
    # A record without class names (older than them) says nothing of the classes.
    changed = {k: (recorded.get(k), v) for k, v in settings.items() if recorded.get(k) != v
               and not (k == "class_names" and recorded.get(k) is None)}
    details = [_names_change(old, new) if k == "class_names" else f"{k} {old!r} -> {new!r}"
               for k, (old, new) in changed.items()] + _changed_model(output_dir, model)
    if details and os.path.exists(backup_dir(output_dir)):
        details = ", ".join(details)
        raise ValueError(
            f"The unfinished run in {output_dir} was started with other settings ({details}). "
            "Resume it with the same settings, or pass overwrite=True (--overwrite) to start "
            "over.")


def _changed_model(output_dir, model):
    """How `model`'s arguments and data config differ from those the run's `config.json`
    records ("model.hidden_size 16 -> 32", ...): the backup holds the recorded model's
    weights, trained with its dropout and preprocessing. What the record leaves out says
    nothing (an argument added since; as for class names), and a record without a data config
    states the paper's, as keras_vit's readers take it. The name aside, and the layout (`scan`,
    `remat`: the run's settings). Empty where they agree, or without a readable record."""
    path = os.path.join(output_dir, CONFIG_FILE)
    try:
        recorded = read_json(path, "the config.json of a run")
    except CheckpointError:  # absent or unreadable: the resume's own checks speak of it
        return []
    if not isinstance(recorded, dict):
        return []
    now = json.loads(json.dumps(keras_vit_document(
        _model_config(model), None, getattr(model, "data_config", None))))
    old, new = recorded.get("model"), now["model"] or {}
    old = old if isinstance(old, dict) else {}
    changes = [f"model.{key} {old[key]!r} -> {new.get(key)!r}" for key in sorted(old)
               if key not in ("name", *LAYOUT_SETTINGS) and old[key] != new.get(key)]
    stated = recorded.get("preprocessing")
    if stated is None and old.get("image_size") is not None:  # the paper's
        stated = json.loads(json.dumps(dict(paper_data_config(old["image_size"]))))
    if isinstance(stated, dict) and isinstance(now["preprocessing"], dict):
        changes += [f"preprocessing.{key} {stated[key]!r} -> {now['preprocessing'].get(key)!r}"
                    for key in sorted(stated) if stated[key] != now["preprocessing"].get(key)]
    return changes


def _names_change(old, new):
    """How a run's class names changed, in a few words (there may be thousands)."""
    if new is None or len(old) != len(new):
        return f"class_names: {len(old)} names -> {'none' if new is None else len(new)}"
    differ = [i for i, (a, b) in enumerate(zip(old, new)) if a != b]
    shown = ", ".join(f"label {i} {old[i]!r:.40} -> {new[i]!r:.40}" for i in differ[:3])
    return f"class_names: {shown}{', ...' if len(differ) > 3 else ''} ({len(differ)} of " \
           f"{len(new)} differ)"


def _model_config(model):
    """The model's `keras_vit.ViT` configuration, or None for a model it did not build."""
    config = getattr(model, "encoder_config", None)  # a ViT inside a pre-training model
    try:
        return config or vit_config(model)
    except ValueError:
        return None  # not a keras_vit.ViT model: the .npz alone describes it


def _compile(model, recipe, settings, weight_decay, jit_compile):
    """Compiles `model` with the recipe of the run's `settings` (`_plan_run`) in its strategy's
    scope (nothing for `recipe=None`: the model's own compile), and returns
    `{"xla": bool, "why": str}`: the runtime it trains on, and why."""
    if recipe is None:
        why = "the model's own compile"
    else:
        jit_compile, why = jit_choice(model, jit_compile)
        with tf_distribute.strategy_scope(model):
            compile_recipe(model, recipe, settings["updates"], settings["learning_rate"],
                           settings["warmup_steps"], weight_decay,
                           settings["accumulation"], settings["label_smoothing"], jit_compile)
    return {"xla": bool(model.jit_compile), "why": why}


def _write_run(output_dir, settings, finished, model, class_names, run_time):
    if not cluster.is_chief():
        return
    atomic_write_text(os.path.join(output_dir, RUN_FILE), json.dumps(
        {"settings": settings, "finished": finished, "runtime": run_time}, indent=1))
    atomic_write_text(os.path.join(output_dir, CONFIG_FILE), json.dumps(keras_vit_document(
        _model_config(model), class_names, getattr(model, "data_config", None)), indent=1))


def _check_model_classes(model, name, data):
    """Raises ValueError if `data` (an `InputData` or None) holds more classes than `model`
    has outputs: its labels would index past the logits."""
    outputs = getattr(model, "outputs", None) or []
    classes = outputs[0].shape[-1] if len(outputs) == 1 else None
    if data is None or classes is None or data.num_classes <= classes:
        return
    names = f" ({', '.join(map(str, data.class_names))})" if data.class_names else ""
    raise ValueError(f"The {name} data holds {data.num_classes} classes{names}, more than the "
                     f"model's {classes} outputs. Expected a model with num_classes="
                     f"{data.num_classes}, or data of at most {classes} classes.")


def _checked_callbacks(callbacks):
    """`callbacks` as a list of Keras callbacks, or a TypeError naming what is not one."""
    try:
        listed = list(callbacks or ())
    except TypeError:
        listed = [callbacks]
    others = [c for c in listed if not isinstance(c, keras.callbacks.Callback)]
    if others:
        raise TypeError(f"`callbacks` must be a list of keras.callbacks.Callback. Received: "
                        f"{others[0]!r:.80}")
    return listed


def _plan_run(model, train, epochs, steps, recipe, learning_rate, warmup_steps, weight_decay,
              target_batch_size, label_smoothing, self_supervised):
    """The run's settings, as run.json records them (NumPy scalars as Python numbers): its
    length (`plan`), the gradient accumulation, the recipe's learning rate and warm-up, the
    classes its labels stand for, and the encoder's layout."""
    accumulation = 1 if target_batch_size is None else accumulation_steps(target_batch_size,
                                                                          train.batch_size)
    epochs, updates = plan(train.steps_per_epoch, epochs, steps, accumulation)
    if recipe is not None:
        learning_rate, warmup_steps = recipe_defaults(recipe, updates, learning_rate,
                                                      warmup_steps)
    layout = _model_config(model) or {}
    names = list(map(str, train.class_names)) if train.class_names else None
    settings = dict(epochs=epochs, updates=updates, steps_per_epoch=train.steps_per_epoch,
                    batch_size=train.batch_size, accumulation=accumulation,
                    examples=train.num_examples, recipe=recipe, learning_rate=learning_rate,
                    warmup_steps=warmup_steps,
                    weight_decay=weight_decay if recipe == "pretrain" else None,
                    label_smoothing=label_smoothing,
                    # Label i's class: a backup's head was trained on these names.
                    class_names=None if self_supervised else names,
                    # The encoder's layout: its backup holds the layers of one layout only.
                    scan=bool(layout.get("scan")), remat=bool(layout.get("remat")))
    return {k: v.item() if isinstance(v, np.generic) else v for k, v in settings.items()}


def fit(model, train, validation=None, *, output_dir, epochs=None, steps=None,
        recipe="finetune", learning_rate=None, warmup_steps=None,
        weight_decay=PRETRAIN_WEIGHT_DECAY, target_batch_size=None, label_smoothing=0.0,
        jit_compile=None, monitor=None, callbacks=(), verbose=1, overwrite=False,
        backup_every=1):
    """Trains `model` with one of the paper's recipes, resumably, and writes its checkpoints.

    Args:
        model: a `keras.Model` (built under `strategy.scope()` to train distributed; on JAX,
            under a `keras.distribution` that stays set, e.g. `keras_vit.get_distribution`).
        train: `keras_vit.data.InputData` of a training pipeline (`training=True`).
        validation: `InputData` of an evaluation pipeline, or None.
        output_dir: str. The run's folder (see the module docstring).
        epochs: int. Whole passes over `train`; or give `steps`.
        steps: int. Optimizer updates, rounded up to whole epochs; or give `epochs`.
        recipe: str or None. "finetune" (SGD momentum 0.9, clipping at 1, warm-up then
            cosine decay), "pretrain" (AdamW, weight decay, warm-up then linear decay),
            "pretrain_mpp" (Adam, warm-up then cosine decay, for
            `keras_vit.pretraining.masked_patch_model`), or None to keep the compile you gave
            the model. Defaults to "finetune".
        learning_rate: float. Peak learning rate. Defaults to the recipe's (0.003, 1e-3,
            2e-4).
        warmup_steps: int. Linear warm-up updates. Defaults to the one rule of
            `keras_vit.training.default_warmup_steps`: the paper's (500 fine-tuning, 10k
            pre-training), at most 10% of the run's updates.
        weight_decay: float. "pretrain" only. Defaults to 0.1.
        target_batch_size: int or None. Reach this batch size per update by gradient
            accumulation (a multiple of `train.batch_size`), e.g. the paper's 512.
        label_smoothing: float in [0, 1). Defaults to 0.
        jit_compile: bool or None. XLA; None takes the measured default for the model's
            device, precision and strategy (`keras_vit.execution.choose`), recorded with the
            reason in `run.json` and the summary.
        monitor: str or None. The log `best.npz` follows. Defaults to "val_accuracy" with
            validation data ("val_loss" for a self-supervised model); without validation data
            and `monitor`, no `best.npz` is kept.
        callbacks: more Keras callbacks.
        verbose: 0, 1 or 2: Keras' progress output. Defaults to 1.
        overwrite: bool. Start over in an `output_dir` that holds a run (removing its
            checkpoints, backup and records). Defaults to False.
        backup_every: int. Epochs between backups: a crash loses at most this many. Defaults
            to 1 (raise it when epochs are short and the model large).

    Returns:
        dict, the run's summary: `output_dir`, `epochs`, `updates`, `resumed_at_epoch` (the
        epochs finished before this call, 0 for a fresh start), `examples` (`train` and
        `validation` sizes), `final_weights`, `encoder_weights` (self-supervised models),
        `best_weights` (with `monitor`, `best_value` and `best_epoch`, numbered from 1 as
        Keras' progress shows "Epoch 1/N"), the validation metrics after the last epoch
        (`validation_loss`, ...), `seconds`.

    Raises:
        RunFinished: if `output_dir` holds a finished run and not `overwrite`.
        TrainingDiverged: if the loss or weights became NaN or infinite (no final
            checkpoint is written; `best.npz` keeps the best finite epoch).
        ValueError: for bad arguments, an unwritable folder, a backup made with other
            settings, or batches that do not split across the distribution's replicas.
        TypeError: for pipelines that are not `keras_vit.data`'s, an `output_dir` that is
            not a path, or `callbacks` that are not Keras callbacks.
        keras_vit.fileio.FolderInUse: if another run holds `output_dir` (its lock names it).
        keras_vit.training.callbacks.StateFileError: naming the file and the field, for a
            run record (run.json, best.json) that is unreadable or malformed, or a best.npz
            that is not the file best.json records.
        keras_vit.fileio.WriteError: naming the file, if a checkpoint, backup or record
            cannot be written (a full disk); the previous state stays loadable. A new run
            that fails before finishing an epoch leaves no records behind.
    """
    start_time = time.perf_counter()
    if not isinstance(train, InputData) or not train.training:
        raise TypeError("`train` must be a training pipeline from keras_vit.data (training=True)"
                        f". Received: {type(train).__name__}")
    if validation is not None and (not isinstance(validation, InputData) or validation.training):
        raise TypeError("`validation` must be an evaluation pipeline from keras_vit.data "
                        f"(training=False) or None. Received: {type(validation).__name__}")
    keras_distribution.check_batches(train.batch_size)  # under a keras.distribution (JAX)
    if validation is not None:
        keras_distribution.check_batches(validation.batch_size, validation.num_examples)
    # A self-supervised model (keras_vit.pretraining) learns from the images alone.
    self_supervised = getattr(model, "self_supervised", False)
    if not self_supervised:
        check_trainable_classes(train.num_classes)
        for name, pipeline in (("training", train), ("validation", validation)):
            _check_model_classes(model, name, pipeline)
        if validation is not None and train.class_names and validation.class_names \
                and tuple(train.class_names) != tuple(validation.class_names):
            raise ValueError(
                "The validation data names its classes otherwise than the training data ("
                f"{_names_change(train.class_names, validation.class_names)}): its labels "
                "would be scored as other classes. Expected the same class names, in the "
                "same order.")
    train, validation = (None if pipeline is None else pipeline.normalised_for(model, role)
                         for role, pipeline in (("train", train), ("validation", validation)))
    if recipe is not None:
        check_choice("recipe", recipe, RECIPES)
    elif getattr(model, "optimizer", None) is None:
        raise ValueError("recipe=None keeps your compile, but the model is not compiled.")
    if not isinstance(output_dir, (str, os.PathLike)):
        raise TypeError(f"`output_dir` must be a folder's path (str or os.PathLike). Received: "
                        f"{output_dir!r:.80}")
    callbacks = _checked_callbacks(callbacks)
    settings = _plan_run(model, train, epochs, steps, recipe, learning_rate, warmup_steps,
                         weight_decay, target_batch_size, label_smoothing, self_supervised)
    # Before anything is written: compiling checks the recipe's arguments.
    run_time = _compile(model, recipe, settings, weight_decay, jit_compile)
    if monitor is None and validation is not None:
        monitor = "val_loss" if self_supervised else "val_accuracy"
    new_folder = not os.path.exists(os.path.expanduser(os.fspath(output_dir)))
    output_dir = check_writable_dir(output_dir)
    # One run per folder: the chief holds its lock (each worker writes only its own backup).
    chief = cluster.is_chief()
    run_path = os.path.join(output_dir, RUN_FILE)
    try:
        # The lock file goes too if the call leaves no run (it failed before its first epoch).
        with folder_lock(output_dir, remove=lambda: not os.path.exists(run_path)) if chief \
                else contextlib.nullcontext():
            _check_ownership(output_dir, overwrite)
            for folder in ([output_dir] if chief else []) + [backup_dir(output_dir)]:
                remove_temporaries(folder)  # of a run killed mid-write: nobody else writes
            _check_resume(output_dir, settings, overwrite, model)
            new_run = not os.path.exists(run_path)
            created = [name for name in STARTED_OUTPUTS + (BACKUP_FOLDER,)
                       if not os.path.lexists(os.path.join(output_dir, name))]
            logs_before = _new_in(output_dir, LOGS_DIR)
            try:
                summary = _run(model, train, validation, output_dir, settings, monitor,
                               callbacks, verbose, backup_every, self_supervised, run_time)
            except BaseException:
                if new_run and chief and not _any_epoch_kept(output_dir):
                    # Nothing to resume: leave nothing.
                    _remove_started(output_dir, created, logs_before)
                raise
    except BaseException:
        if new_folder and os.path.isdir(output_dir) and not os.listdir(output_dir):
            with contextlib.suppress(OSError):
                os.rmdir(output_dir)  # created by this call, and empty again
        raise
    summary["seconds"] = round(time.perf_counter() - start_time, 1)
    return summary


def _new_in(output_dir, folder, before=None):
    """The names in `output_dir/folder` now; with `before`, only those not in it."""
    path = os.path.join(output_dir, folder)
    names = set(os.listdir(path)) if os.path.isdir(path) else set()
    return names if before is None else names - before


def _remove_started(output_dir, created, logs_before):
    """Removes what a new run wrote before it failed with no epoch kept: of the names it
    writes, those that did not exist before it started (`created`), and in a logs/ folder that
    did, the entries TensorBoard added (not in `logs_before`)."""
    _remove(output_dir, [name for name in STARTED_OUTPUTS if name in created])
    if LOGS_DIR not in created:
        _remove(output_dir, [os.path.join(LOGS_DIR, name)
                             for name in _new_in(output_dir, LOGS_DIR, logs_before)])
    if held_folder_moved(os.path.join(output_dir, RUN_FILE)):
        return  # another folder now: nothing of it is the run's
    _clear_backup(backup_dir(output_dir))  # no epoch kept
    if BACKUP_FOLDER in created:
        with contextlib.suppress(OSError):
            os.rmdir(os.path.join(output_dir, BACKUP_FOLDER))  # if no other worker's is left


def _any_epoch_kept(output_dir):
    """Whether something of the run in `output_dir` is kept: a backup (even one that cannot
    be read: its pointer is the user's to look at), or best.npz."""
    return os.path.exists(os.path.join(backup_dir(output_dir), BACKUP_POINTER)) \
        or os.path.exists(os.path.join(output_dir, BEST_FILE))


def _run(model, train, validation, output_dir, settings, monitor, callbacks, verbose,
         backup_every, self_supervised, run_time):
    """`fit` from the resume check on: the training, the final checkpoint, the summary
    (`run_time`: the runtime and why, `_compile`)."""
    epochs, updates = settings["epochs"], settings["updates"]
    start_epoch = resume_epoch(backup_dir(output_dir))  # the state files, checked before
    best_record(os.path.join(output_dir, BEST_FILE))    # anything is written
    class_names = () if self_supervised else train.class_names
    _write_run(output_dir, settings, False, model, class_names, run_time)
    if verbose:
        print(f"Training {model.name} ({model.count_params():,} parameters) on "
              f"{train.num_examples} examples, "
              + ("labels unused" if self_supervised else f"{train.num_classes} classes")
              + f": {epochs} epochs of "
              f"{train.steps_per_epoch} batches of {train.batch_size} x "
              f"{settings['accumulation']} accumulation = {updates} updates; "
              f"{tf_distribute.num_replicas(model)} replica(s), "
              f"{'XLA' if run_time['xla'] else 'TensorFlow graph runtime'} ({run_time['why']})"
              + (f"; resuming after epoch {start_epoch}" if start_epoch else ""), flush=True)
    # In a multi-process JAX run, Keras' distribution gives each process its share of every
    # batch (`distribute_dataset`: contiguous slices, the global batch one process would see).
    history = model.fit(
        train.from_epoch(start_epoch).dataset, steps_per_epoch=train.steps_per_epoch,
        epochs=epochs, initial_epoch=start_epoch,
        validation_data=validation.dataset if validation is not None else None,
        callbacks=training_callbacks(output_dir, monitor, best=monitor is not None,
                                     backup_every=backup_every) + list(callbacks),
        verbose=verbose,
        shuffle=False)  # the pipelines shuffle (epoch-deterministically) themselves

    losses = history.history.get("loss", [])
    params = finite_params(model) if all(np.isfinite(losses)) else None
    if params is None:
        kept = (f"{os.path.join(output_dir, BEST_FILE)} keeps the best finite epoch, if any, "
                "and backup/ the last finite one" if _any_epoch_kept(output_dir) else
                "no epoch was kept (no backup, no best.npz)")
        raise TrainingDiverged(
            f"Training diverged in {output_dir}: the loss or the weights became NaN or infinite "
            f"(losses per epoch: {[round(float(v), 4) for v in losses]}). No final checkpoint "
            f"was written; {kept}. Start again with a lower learning rate (--lr) or more "
            "warm-up, with --overwrite or a new --output.")
    final = os.path.join(output_dir, FINAL_FILE)
    encoder = os.path.join(output_dir, ENCODER_FILE) if hasattr(model, "encoder_params") \
        else None
    if cluster.is_chief():
        write_npz(params, final, overwrite=True)  # the run's own files
        if encoder:
            write_npz(model.encoder_params(), encoder, overwrite=True)
    _write_run(output_dir, settings, True, model, class_names, run_time)
    _clear_backup(backup_dir(output_dir))

    summary = dict(output_dir=output_dir, epochs=epochs, updates=updates,
                   resumed_at_epoch=start_epoch,
                   examples=dict(train=train.num_examples, validation=None
                                 if validation is None else validation.num_examples),
                   final_weights=final, xla=run_time["xla"], runtime=run_time["why"])
    if encoder:
        summary["encoder_weights"] = encoder
    record = best_record(os.path.join(output_dir, BEST_FILE))
    if record is not None:
        summary.update(best_weights=os.path.join(output_dir, BEST_FILE), monitor=monitor,
                       best_value=record["value"], best_epoch=record["epoch"])
    if validation is not None:
        results = model.evaluate(validation.dataset, verbose=0, return_dict=True)
        summary.update({f"validation_{k}": float(v) for k, v in results.items()})
    return summary
