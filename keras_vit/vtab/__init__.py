"""VTAB-1k (Zhai et al. 2019, "A Large-scale Study of Representation Learning with the Visual
Task Adaptation Benchmark"): the paper's Table 2 column and Figure 2.

19 tasks in three groups, each fine-tuned from the same pre-trained model on 1,000 labelled
examples and scored on its full test split:

- natural: caltech101, cifar100, dtd, oxford_flowers102, oxford_iiit_pet, sun397, svhn;
- specialized: patch_camelyon, eurosat, resisc45, diabetic_retinopathy;
- structured: clevr_count, clevr_distance, dmlab, dsprites_location, dsprites_orientation,
  smallnorb_azimuth, smallnorb_elevation, kitti_distance.

The splits, label functions and image conversions are those of the benchmark's reference code
(google-research/task_adaptation): `train800` is the first 800 examples of the tfds training
split, `val200` 200 held-out examples (from the validation split where the data set has one,
else from the part of the training split the benchmark holds out), `train800val200` both, and
`test` the benchmark's test split. Nothing is shuffled before slicing, so every user gets the
same 1,000 examples.

The protocol is the ViT paper's (appendix B.1.1): SGD with momentum 0.9, batch 512, gradient
clipping at global norm 1, a linear warm-up then cosine decay (the "finetune" recipe of
`keras_vit.training`), learning rate 0.01 and 2,500 steps for every task, at 384x384. The paper
chose that one setting by a small sweep (two learning rates, two schedules) scored on the
200-example validation sets, then trained on all 1,000 examples; `run(sweep=...)` does the same.
Training images are resized whole to the resolution (no crop: the structured labels depend on
positions), with a random horizontal flip on the natural and specialized tasks only; test
images are resized.

```python
import keras_vit
from keras_vit import vtab

def model_fn(num_classes):
    return keras_vit.ViT_B16(num_classes=num_classes, image_size=384, pretrained=True)

table = vtab.run(model_fn, "runs/vtab", tasks=["natural"], batch_size=64)
print(vtab.summary_markdown(table))
```

`run` writes, under `output_dir`: `results.csv` (one row per finished task), `sweep.csv` (one row
per task and swept setting), `summary.json` and `summary.md` (each task, the group means and the
mean over tasks), `vtab.json` (the settings, and the setting the sweep chose), and `runs/` (the
fine-tuning runs while they are unfinished; kept with `keep_weights=True`). Calling it again with
the same settings skips the finished tasks and resumes an interrupted one from its last backup,
so a suite that crashed loses at most a tenth of one task; calling it with more tasks adds them.
"""

import csv
import io
import json
import math
import os
import shutil
import time

import keras

from keras_vit.training import loop as training
from keras_vit.fileio import (
    atomic_write_text,
    check_writable_dir,
    folder_lock,
    refuse_link,
    remove_temporaries,
)
from keras_vit.positions import model_image_size
from keras_vit.training.callbacks import read_json_state
from keras_vit.checks import (check_choice, check_int, check_learning_rate, check_seed,
                              to_pair)
from keras_vit.vtab.tasks import (  # noqa: F401  (the public names of the tasks, here too)
    NATURAL,
    SPECIALIZED,
    STRUCTURED,
    GROUPS,
    SPLITS,
    CLEVR_DISTANCE_THRESHOLDS,
    CLEVR_MIN_OBJECTS,
    KITTI_DISTANCE_THRESHOLDS,
    KITTI_VEHICLE_TYPES,
    KITTI_NO_VEHICLE_DEPTH,
    clevr_count,
    clevr_distance,
    kitti_distance,
    Task,
    TASKS,
    get_tasks,
    task_data,
    check_data,
)
from keras_vit.weights import load_pretrained

# The ViT paper's VTAB-1k protocol (appendix B.1.1, Table 4).
LEARNING_RATE = 0.01
STEPS = 2500
BATCH_SIZE = 512
IMAGE_SIZE = 384
# The paper's sweep: two learning rates and two schedules (run lengths), scored on val200.
SWEEP_LEARNING_RATES = (0.001, 0.01)
SWEEP_STEPS = (500, 2500)
SELECTIONS = ("suite", "task")
# Backups per fine-tuning run: an interruption loses at most 1/BACKUPS_PER_RUN of a task.
BACKUPS_PER_RUN = 10

RESULTS_FILE = "results.csv"
SWEEP_FILE = "sweep.csv"
SETTINGS_FILE = "vtab.json"
SUMMARY_JSON = "summary.json"
SUMMARY_MD = "summary.md"
RUNS_DIR = "runs"
# The columns of results.csv and sweep.csv, and how each cell is read back.
RESULT_FIELDS = {"task": str, "group": str, "accuracy": float, "test_examples": int,
                 "learning_rate": float, "steps": int, "train_examples": int, "seconds": float}
SWEEP_FIELDS = {"task": str, "learning_rate": float, "steps": int, "val_accuracy": float,
                "val_examples": int, "seconds": float}


# --------------------------------------------------------------------------------------------
# Records.


_CELL_WORDS = {str: "text", float: "a non-negative number", int: "a non-negative integer"}


def _cell(text, kind, task_name):
    """A CSV cell read as `kind`, or None where it is not a valid value of its column."""
    if kind is str:
        return text if not task_name or text in TASKS else None
    try:
        value = kind(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) and value >= 0 else None


def _read_rows(path, fields):
    """The rows of results.csv or sweep.csv, each cell checked and read as its column's type.

    Raises:
        ValueError: naming the file, the line and the column of the first bad cell.
    """
    if not os.path.exists(path):
        return []
    remedy = ("Expected the CSV file keras_vit wrote; pass overwrite=True (--overwrite) to "
              "start the suite over.")
    try:
        with open(path, encoding="utf-8", newline="") as f:
            reader = csv.DictReader(f)
            rows = list(reader)
        if tuple(reader.fieldnames or ()) != tuple(fields):
            raise csv.Error(f"columns {reader.fieldnames}, expected {list(fields)}")
    except (OSError, csv.Error, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is unreadable ({e}). {remedy}") from None
    typed = []
    for line, row in enumerate(rows, 2):
        cells = {name: _cell(row[name], kind, name == "task") for name, kind in fields.items()}
        bad = [name for name, value in cells.items() if value is None]
        if bad:
            what = "a VTAB task name" if bad[0] == "task" else _CELL_WORDS[fields[bad[0]]]
            raise ValueError(f"{path}, line {line}: {bad[0]} {row[bad[0]]!r} is not {what}. "
                             f"{remedy}")
        typed.append(cells)
    return typed


def _write_rows(path, fields, rows):
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(path, buffer.getvalue())


def summarize(results):
    """The VTAB table from result rows (dicts with `task`, `group`, `accuracy`): each task's
    accuracy, each group's mean over its tasks, and the mean over all tasks (the VTAB score),
    with how many of the benchmark's tasks each mean covers.

    Returns:
        dict: `tasks` {name: accuracy}, `groups` {group: {"mean", "tasks", "of"}}, `mean`
        {"mean", "tasks", "of"}, `complete` (all 19 tasks done), `examples` {name: {"train",
        "test"}} (the images each task was fine-tuned on and scored on).
    """
    accuracies = {row["task"]: float(row["accuracy"]) for row in results}
    sizes = {row["task"]: dict(train=int(row["train_examples"]), test=int(row["test_examples"]))
             for row in results}
    groups = {}
    for group in GROUPS:
        names = [name for name, task in TASKS.items() if task.group == group]
        done = [accuracies[name] for name in names if name in accuracies]
        groups[group] = dict(mean=sum(done) / len(done) if done else None, tasks=len(done),
                             of=len(names))
    ordered = {name: accuracies[name] for name in TASKS if name in accuracies}
    mean = dict(mean=sum(ordered.values()) / len(ordered) if ordered else None,
                tasks=len(ordered), of=len(TASKS))
    return dict(tasks=ordered, groups=groups, mean=mean, complete=len(ordered) == len(TASKS),
                examples={name: sizes[name] for name in ordered})


def _percent(value):
    return "-" if value is None else f"{100 * value:.1f}"


def summary_markdown(summary):
    """The summary as Markdown: the group table, then one row per task."""
    def covered(entry):
        return "" if entry["tasks"] == entry["of"] else f" ({entry['tasks']} of {entry['of']})"

    lines = ["| natural | specialized | structured | mean |", "|---|---|---|---|",
             "| " + " | ".join(_percent(summary["groups"][g]["mean"]) + covered(summary["groups"][g])
                             for g in GROUPS)
             + f" | {_percent(summary['mean']['mean'])}{covered(summary['mean'])} |",
             "", "| task | group | accuracy (%) | train images | test images |",
             "|---|---|---|---|---|"]
    lines += [f"| {name} | {TASKS[name].group} | {_percent(accuracy)} | "
              f"{summary['examples'][name]['train']:,} | {summary['examples'][name]['test']:,} |"
              for name, accuracy in summary["tasks"].items()]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# The suite.


def _check_settings(output_dir, settings, overwrite):
    """Refuses a folder holding a suite run with other settings; clears it with `overwrite`."""
    path = os.path.join(output_dir, SETTINGS_FILE)
    names = (RESULTS_FILE, SWEEP_FILE, SETTINGS_FILE, SUMMARY_JSON, SUMMARY_MD, RUNS_DIR)
    for name in names:
        refuse_link(os.path.join(output_dir, name))
    if overwrite:
        for name in names[:-1]:
            if os.path.exists(os.path.join(output_dir, name)):
                os.remove(os.path.join(output_dir, name))
        shutil.rmtree(os.path.join(output_dir, RUNS_DIR), ignore_errors=True)
        return {}
    if not os.path.exists(path):
        found = [name for name in names if os.path.lexists(os.path.join(output_dir, name))]
        if found:
            raise ValueError(f"{output_dir} holds {', '.join(found)} but not {SETTINGS_FILE}: "
                             "they are not a keras_vit VTAB run's (which settings made them "
                             "cannot be told), and the suite would write over them. Nothing was "
                             "changed; pass overwrite=True (--overwrite) to start over, or "
                             "choose another folder.")
        return {}
    record = read_json_state(
        path, {"settings": dict}, "pass overwrite=True (--overwrite) to start the suite over")
    previous = record["settings"]
    changed = {k: (previous.get(k), v) for k, v in settings.items() if previous.get(k) != v}
    if changed:
        details = ", ".join(f"{k} {old!r} -> {new!r}" for k, (old, new) in changed.items())
        raise ValueError(f"The VTAB run in {output_dir} was made with other settings "
                         f"({details}). Use the same settings to resume or extend it, another "
                         "folder, or overwrite=True (--overwrite) to start over.")
    return record


def _jsonable(value):
    return json.loads(json.dumps(value, default=str))


class _UpdateProgress(keras.callbacks.Callback):
    """A bar of one fine-tuning run's optimizer updates (`keras.utils.Progbar`) with the loss,
    moved at each epoch's end: a task's run is thousands of one-batch epochs, too many for
    Keras' bar per epoch."""

    def __init__(self, updates, steps_per_epoch, accumulation):
        super().__init__()
        self.updates, self.steps_per_epoch, self.accumulation = \
            updates, steps_per_epoch, accumulation
        self.bar = keras.utils.Progbar(updates, unit_name="update", stateful_metrics=["loss"])

    def on_epoch_end(self, epoch, logs=None):
        done = min(self.updates, (epoch + 1) * self.steps_per_epoch // self.accumulation)
        self.bar.update(done, values=[("loss", float((logs or {}).get("loss", float("nan"))))])


def _finetune(model_fn, task, train_split, eval_split, run_dir, *, learning_rate, steps,
              batch_size, target_batch_size, image_size, data_kwargs, jit_compile, verbose,
              callbacks, strategy):
    """Fine-tunes a fresh model on `train_split` of `task` (resuming from `run_dir`) and
    returns (accuracy on `eval_split`, examples evaluated, examples trained on)."""
    keras.backend.clear_session()
    keras.utils.set_random_seed(data_kwargs["seed"])
    if strategy is not None:
        with strategy.scope():
            model = model_fn(task.num_classes)
    else:
        model = model_fn(task.num_classes)
    outputs = model.outputs[0].shape[-1]
    if outputs != task.num_classes:
        raise ValueError(f"model_fn({task.num_classes}) returned a model with {outputs} "
                         f"outputs. Expected {task.num_classes} (the classes of {task.name}).")
    size = image_size or model_image_size(model)
    train = task_data(task, train_split, image_size=size, batch_size=batch_size, training=True,
                      strategy=strategy, data_config=model, **data_kwargs)
    evaluation = task_data(task, eval_split, image_size=size, batch_size=batch_size,
                           training=False, data_config=model,
                           **{k: v for k, v in data_kwargs.items()
                              if k not in ("seed", "augment")})
    accumulation = (target_batch_size or batch_size) // batch_size
    epochs, updates = training.plan(train.steps_per_epoch, steps=steps,
                                    accumulation=accumulation)
    if verbose == 1:  # verbose 2 shows Keras' own progress instead
        callbacks = [*callbacks, _UpdateProgress(updates, train.steps_per_epoch, accumulation)]
    try:
        training.fit(model, train, output_dir=run_dir, steps=steps, recipe="finetune",
                     learning_rate=learning_rate, target_batch_size=target_batch_size,
                     jit_compile=jit_compile, verbose=max(0, verbose - 1), callbacks=callbacks,
                     backup_every=max(1, epochs // BACKUPS_PER_RUN))
    except training.RunFinished:  # finished, but its result was not recorded: evaluate it
        load_pretrained(model, os.path.join(run_dir, "final.npz"), progress=False)
    results = model.evaluate(evaluation.dataset, verbose=0, return_dict=True)
    return float(results["accuracy"]), evaluation.num_examples, train.num_examples


def _setting_key(learning_rate, steps):
    return f"lr{learning_rate:g}_steps{steps}"


def _grid(sweep):
    """The (learning rate, steps) pairs of `sweep`: True (the paper's grid) or pairs, each
    checked, none twice."""
    if sweep is True:
        return [(lr, s) for lr in SWEEP_LEARNING_RATES for s in SWEEP_STEPS]
    expected = "Expected (learning_rate, steps) pairs, or True."
    if isinstance(sweep, (str, bytes, dict)) or not hasattr(sweep, "__iter__"):
        raise ValueError(f"`sweep` must hold settings. {expected} Received: sweep={sweep!r:.80}")
    sweep = list(sweep)  # a generator too (itertools.product)
    if not sweep:
        raise ValueError(f"`sweep` is empty. {expected}")
    grid = []
    for item in sweep:
        if not isinstance(item, (list, tuple)) or len(item) != 2:
            raise ValueError(f"`sweep` holds {item!r:.60}. {expected}")
        pair = (check_learning_rate("sweep learning rate", item[0]),
                check_int("sweep steps", item[1], 1))
        if pair in grid:
            raise ValueError(f"`sweep` holds the setting {pair} twice. Expected each once.")
        grid.append(pair)
    return grid


def run(model_fn, output_dir, *, tasks=None, learning_rate=LEARNING_RATE, steps=STEPS,
        batch_size=BATCH_SIZE, target_batch_size=None, image_size=None, sweep=None,
        select="suite", data_dir=None, manual_dir=None, download=True, seed=0, augment=True,
        keep_weights=False, overwrite=False, jit_compile=None, strategy=None, callbacks=(),
        description=None, verbose=1):
    """Runs VTAB-1k (or some of its tasks) and writes the per-task results and the table.

    Args:
        model_fn: a function `num_classes -> keras.Model`: the pre-trained model with a fresh
            head of `num_classes`, e.g. `lambda n: keras_vit.ViT_B16(num_classes=n,
            image_size=384, pretrained=True)`. Called once per fine-tuning run (under
            `strategy.scope()` when a strategy is given).
        output_dir: str. The suite's folder (see the module docstring).
        tasks: task and group names, a list or a comma-separated string. Defaults to all 19.
        learning_rate: float. Defaults to the paper's 0.01.
        steps: int. Optimizer updates per task. Defaults to the paper's 2,500.
        batch_size: int. Examples per batch (global). Defaults to the paper's 512.
        target_batch_size: int or None. Reach this batch size per update by gradient
            accumulation (e.g. batch_size=64, target_batch_size=512 on a small accelerator).
        image_size: int, (height, width) or None. The resolution fed to the model. Defaults
            to the model's (build it at the paper's 384).
        sweep: None, True (the paper's grid: learning rates 0.001 and 0.01, 500 and 2,500
            steps) or a list of `(learning_rate, steps)`: train each task on train800 with each
            setting, score on val200, then train on train800val200 with the best setting
            (`learning_rate` and `steps` are then not used).
        select: "suite" (one setting for every task, the best mean validation accuracy, as the
            paper) or "task" (each task's best). Defaults to "suite".
        data_dir, manual_dir, download: as `keras_vit.data.from_tfds` (diabetic_retinopathy
            and resisc45 need their files downloaded by hand into `manual_dir`).
        seed: int. Data order and augmentation seed. Defaults to 0.
        augment: bool. Random horizontal flips where they keep the label. Defaults to True.
        keep_weights: bool. Keep each task's fine-tuned weights under `runs/` (350 MB per task
            for B/16). Defaults to False.
        overwrite: bool. Start over in a folder that holds a suite run. Defaults to False.
        jit_compile: bool or None. XLA; None picks what works (see `keras_vit.training.fit`).
        strategy: a `tf.distribute.Strategy` or None.
        callbacks: more Keras callbacks for every fine-tuning run.
        description: JSON-serialisable or None. A description of the model (e.g. its variant
            and weights), recorded in `vtab.json`: a run is resumed only with the same
            description.
        verbose: 0 (silent), 1 (a line and a bar of its updates per run) or 2 (a line per run
            and Keras' progress per epoch). Defaults to 1.

    Returns:
        dict: the summary (see `summarize`; `summary_markdown` writes it as a table), with
        `output_dir` and, after a sweep, `chosen`.

    Raises:
        ValueError: for unknown tasks, bad settings, a folder holding a run with other
            settings, or a data set that is not prepared and cannot be downloaded.
    """
    chosen_tasks = get_tasks(tasks)
    check_choice("select", select, SELECTIONS)
    steps = check_int("steps", steps, 1)
    batch_size = check_int("batch_size", batch_size, 1)
    if target_batch_size is not None:
        target_batch_size = check_int("target_batch_size", target_batch_size, batch_size)
        if target_batch_size % batch_size:
            raise ValueError(f"target_batch_size {target_batch_size} is not a multiple of "
                             f"batch_size {batch_size}.")
    # Every setting is checked before the folder holds a record of them (a refusal after that
    # would leave a record the corrected call is refused by).
    learning_rate = check_learning_rate("learning_rate", learning_rate)
    seed = check_seed("seed", seed)
    if image_size is not None:
        to_pair("image_size", image_size)  # checked; recorded as given
    grid = None if sweep is None or sweep is False else _grid(sweep)
    check_data(chosen_tasks, data_dir, manual_dir, download)  # before hours of training
    output_dir = check_writable_dir(output_dir)
    # One suite run per folder; the lock file goes too if the call leaves no suite record.
    with folder_lock(output_dir, "VTAB run",
                     remove=lambda: not os.path.exists(os.path.join(output_dir, SETTINGS_FILE))):
        return _run_suite(model_fn, output_dir, chosen_tasks, grid, dict(
            model=description, image_size=image_size, batch_size=batch_size,
            target_batch_size=target_batch_size, seed=seed, augment=bool(augment),
            learning_rate=None if grid else learning_rate, steps=None if grid else steps,
            sweep=grid, select=select if grid else None), overwrite=overwrite,
            keep_weights=keep_weights, verbose=verbose, common=dict(
                batch_size=batch_size, target_batch_size=target_batch_size,
                image_size=image_size, jit_compile=jit_compile, verbose=verbose,
                callbacks=list(callbacks), strategy=strategy, data_kwargs=dict(
                    data_dir=data_dir, manual_dir=manual_dir, download=download, seed=seed,
                    augment=augment)))


def _run_suite(model_fn, output_dir, chosen_tasks, grid, settings, *, overwrite, keep_weights,
               verbose, common):
    """`run` in its locked folder: the records checked, the sweep, then each task."""
    remove_temporaries(output_dir)  # of a suite killed mid-write: nobody else writes here
    settings = _jsonable(settings)
    record = _check_settings(output_dir, settings, overwrite)
    sweep_path = os.path.join(output_dir, SWEEP_FILE)
    results_path = os.path.join(output_dir, RESULTS_FILE)
    sweep_rows = _read_rows(sweep_path, SWEEP_FIELDS)  # both checked before any training
    results = _read_rows(results_path, RESULT_FIELDS)
    record["settings"] = settings
    atomic_write_text(os.path.join(output_dir, SETTINGS_FILE), json.dumps(record, indent=1))
    runs = os.path.join(output_dir, RUNS_DIR)

    def say(text):
        if verbose:
            print(text, flush=True)

    def finish_run(run_dir):
        """The run's weights removed unless kept, with the folders above it left empty, up to
        `runs` itself."""
        if keep_weights:
            return
        shutil.rmtree(run_dir, ignore_errors=True)
        folder = os.path.dirname(run_dir)
        while folder.startswith(runs) and os.path.isdir(folder) and not os.listdir(folder):
            os.rmdir(folder)
            folder = os.path.dirname(folder)

    # 1. The sweep: every setting on every task, train800 -> val200.
    chosen = {}
    if grid:
        done = {(r["task"], r["learning_rate"], r["steps"]) for r in sweep_rows}
        runs_of_sweep = [(lr, n, task) for lr, n in grid for task in chosen_tasks]
        for index, (lr, n, task) in enumerate(runs_of_sweep, 1):
            counter = f"vtab sweep [{index}/{len(runs_of_sweep)}] {task.name}"
            if (task.name, lr, n) in done:
                say(f"{counter}: learning rate {lr:g}, {n} steps: already done")
                continue
            say(f"{counter}: learning rate {lr:g}, {n} steps, train800 -> val200")
            start = time.perf_counter()
            run_dir = os.path.join(runs, "sweep", _setting_key(lr, n), task.name)
            accuracy, examples, _ = _finetune(model_fn, task, "train800", "val200", run_dir,
                                              learning_rate=lr, steps=n, **common)
            sweep_rows.append(dict(task=task.name, learning_rate=lr, steps=n,
                                   val_accuracy=accuracy, val_examples=examples,
                                   seconds=round(time.perf_counter() - start, 1)))
            _write_rows(sweep_path, SWEEP_FIELDS, sweep_rows)
            finish_run(run_dir)
            say(f"{counter}: val200 accuracy {100 * accuracy:.2f}% on {examples} images")
        chosen = _choose(sweep_rows, chosen_tasks, grid, settings["select"])
        _check_choice_kept(chosen, results, output_dir)
        record["chosen"] = {name: dict(learning_rate=lr, steps=n)
                            for name, (lr, n) in chosen.items()}
        atomic_write_text(os.path.join(output_dir, SETTINGS_FILE), json.dumps(record, indent=1))

    # 2. Each task: train800val200 -> test, with the protocol's (or the chosen) setting.
    for index, task in enumerate(chosen_tasks, 1):
        lr, n = chosen.get(task.name, (settings["learning_rate"], settings["steps"]))
        if any(row["task"] == task.name for row in results):
            say(f"vtab [{index}/{len(chosen_tasks)}] {task.name}: already done")
            continue
        say(f"vtab [{index}/{len(chosen_tasks)}] {task.name}: learning rate {lr:g}, {n} steps, "
            "train800val200 -> test")
        start = time.perf_counter()
        run_dir = os.path.join(runs, task.name)
        accuracy, examples, trained = _finetune(model_fn, task, "train800val200", "test",
                                                run_dir, learning_rate=lr, steps=n, **common)
        results.append(dict(task=task.name, group=task.group, accuracy=accuracy,
                            test_examples=examples, learning_rate=lr, steps=n,
                            train_examples=trained,
                            seconds=round(time.perf_counter() - start, 1)))
        _write_rows(results_path, RESULT_FIELDS, results)
        summary = summarize(results)
        atomic_write_text(os.path.join(output_dir, SUMMARY_JSON), json.dumps(summary, indent=1))
        atomic_write_text(os.path.join(output_dir, SUMMARY_MD), summary_markdown(summary))
        finish_run(run_dir)
        say(f"vtab [{index}/{len(chosen_tasks)}] {task.name}: test accuracy "
            f"{100 * accuracy:.2f}% on {examples} images")
    summary = summarize(results)
    summary["output_dir"] = output_dir
    if chosen:
        summary["chosen"] = record["chosen"]
    return summary


def _check_choice_kept(chosen, results, output_dir):
    """Refuses a choice of the sweep that the tasks already trained did not use (tasks added
    to a suite whose setting is chosen for every task can change it): their results would mix
    settings."""
    for row in results:
        setting = chosen.get(row["task"])
        trained = (float(row["learning_rate"]), int(row["steps"]))
        if setting is not None and trained != tuple(setting):
            raise ValueError(
                f"With these tasks the sweep chooses learning rate {setting[0]:g}, "
                f"{setting[1]} steps for {row['task']}, which {output_dir} trained with "
                f"learning rate {trained[0]:g}, {trained[1]} steps: its results would mix "
                "settings. Expected the tasks of its first run (a folder of its own for "
                "others), or overwrite=True (--overwrite) to run the suite again.")


def _choose(rows, tasks, grid, select):
    """The setting(s) the sweep selects: {task name: (learning_rate, steps)}."""
    scores = {(r["task"], float(r["learning_rate"]), int(r["steps"])): float(r["val_accuracy"])
              for r in rows}
    if select == "task":
        # Ties go to the earlier setting of the grid.
        return {t.name: max(grid, key=lambda s: (scores[(t.name, *s)], -grid.index(s)))
                for t in tasks}
    means = {s: sum(scores[(t.name, *s)] for t in tasks) / len(tasks) for s in grid}
    best = max(grid, key=lambda s: (means[s], -grid.index(s)))
    return {t.name: best for t in tasks}
