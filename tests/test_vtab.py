"""VTAB-1k: the task table, the structured label functions against hand-computed values, every
task's pipeline and the whole suite (sweep, resume, command line) on tfds.testing.mock_data."""

import csv
import io
import json
import os
from contextlib import redirect_stderr

import keras
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

import keras_vit
from keras_vit import vtab
from keras_vit_cli import main as cli_main

TINY = dict(image_size=16, patch_size=8, hidden_size=8, num_layers=1, num_heads=2, mlp_dim=8)
TINY_JSON = json.dumps({k: v for k, v in TINY.items() if k != "image_size"})
MOCK_EXAMPLES = 8
# Run settings small enough for a test: 2 batches of 4 per epoch.
SMALL = dict(steps=4, batch_size=4, jit_compile=False, verbose=0)


def model_fn(num_classes):
    return keras_vit.ViT(num_classes=num_classes, **TINY)


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


# --------------------------------------------------------------------------------------------
# The task table.


def test_the_nineteen_tasks():
    groups = [t.group for t in vtab.TASKS.values()]
    assert len(vtab.TASKS) == 19
    assert (groups.count("natural"), groups.count("specialized"),
            groups.count("structured")) == (7, 4, 8)
    assert [t.name for t in vtab.get_tasks("specialized,dtd")] == [
        "dtd", "patch_camelyon", "eurosat", "resisc45", "diabetic_retinopathy"]
    with pytest.raises(ValueError, match="Unknown VTAB task 'imagenet'. Expected task names"):
        vtab.get_tasks("natural,imagenet")


# The held-out part of a data set without a validation split starts at pct% of its training
# split (task_adaptation), whose sizes in the tfds versions the benchmark reads are these.
HELD_OUT = {"caltech101": (3060, 90), "cifar100": (50000, 90), "oxford_iiit_pet": (3680, 80),
            "svhn": (73257, 90), "eurosat": (27000, 60), "resisc45": (31500, 60),
            "clevr_count": (70000, 90), "dsprites_location": (737280, 80)}


@pytest.mark.parametrize("name", list(vtab.TASKS))
def test_task_splits_and_features(name):
    task = vtab.TASKS[name]
    for split in vtab.SPLITS:  # every split string parses as a tfds split
        tfds.core.ReadInstruction.from_spec(task.split(split))
    assert task.split("train800") == "train[:800]"
    assert task.split("train800val200") == f"train[:800]+{task.val}"
    if name in HELD_OUT:
        size, pct = HELD_OUT[name]
        start = size * pct // 100
        assert task.val == f"train[{start}:{start + 200}]"
    builder = tfds.builder(task.tfds_name)
    # The hand-download note is there exactly for the data sets tfds cannot download.
    assert bool(task.manual) == bool(getattr(builder, "MANUAL_DOWNLOAD_INSTRUCTIONS", None))
    if isinstance(task.label, str):
        assert builder.info.features[task.label].num_classes == task.num_classes


# --------------------------------------------------------------------------------------------
# Label functions, against values worked out by hand from task_adaptation's definitions.


def clevr_example(depths):
    n = len(depths)
    return {"objects": {"size": tf.zeros([n], tf.int64),
                        "pixel_coords": tf.constant([[10.0, 20.0, d] for d in depths],
                                                    tf.float32)}}


def test_clevr_labels():
    assert int(vtab.clevr_count(clevr_example([9.0] * 3))) == 0
    assert int(vtab.clevr_count(clevr_example([9.0] * 10))) == 7
    # Bins (0, 8], (8, 8.5], (8.5, 9], (9, 9.5], (9.5, 10], (10, 100]: the closest object counts.
    cases = {(7.9, 12.0): 0, (8.0, 30.0): 0, (8.2,): 1, (11.0, 8.5): 1, (8.7,): 2, (9.5,): 3,
             (9.9, 10.0): 4, (10.5, 20.0): 5}
    for depths, label in cases.items():
        assert int(vtab.clevr_distance(clevr_example(depths))) == label, depths


def kitti_example(objects):
    """objects: (type, depth) pairs; types 0-2 are Car, Van, Truck."""
    return {"objects": {
        "type": tf.constant([t for t, _ in objects], tf.int64),
        "location": tf.reshape(tf.constant([[1.0, 1.5, d] for _, d in objects], tf.float32),
                               [-1, 3])}}


def test_kitti_labels():
    cases = {(): 3,                       # no object: no vehicle
             ((3, 4.0), (5, 6.0)): 3,     # a pedestrian and a cyclist only
             ((0, 7.9),): 0, ((1, 8.0),): 0, ((2, 8.1),): 1, ((0, 20.0),): 1,
             ((3, 2.0), (0, 15.0), (1, 40.0)): 1, ((0, 25.0), (7, 3.0)): 2}
    for objects, label in cases.items():
        assert int(vtab.kitti_distance(kitti_example(objects))) == label, objects


def test_dsprites_labels():
    location = vtab.TASKS["dsprites_location"].label
    orientation = vtab.TASKS["dsprites_orientation"].label
    x = np.arange(32)
    got = [int(location({"label_x_position": tf.constant(v, tf.int64)})) for v in x]
    np.testing.assert_array_equal(got, x // 2)  # 32 positions in 16 bins of 2
    o = np.arange(40)
    got = [int(orientation({"label_orientation": tf.constant(v, tf.int64)})) for v in o]
    np.testing.assert_array_equal(got, np.floor(o / 2.5).astype(int))  # 40 in 16 bins of 2.5
    assert max(got) == 15 and np.bincount(got).tolist() == [3, 2] * 8


# --------------------------------------------------------------------------------------------
# Every task's pipeline on mock data.


def objects_as_dataset(self, split, decoders=None, read_config=None, shuffle_files=False):
    """Mock examples for CLEVR and KITTI, whose `objects` sequences tfds' own mock generates
    with unequal lengths: consistent objects, with labels known from the example index."""
    del split, decoders, read_config, shuffle_files
    png = tf.io.encode_png(tf.zeros([20, 30, 3], tf.uint8))
    if self.name == "clevr":
        def example(i):  # i + 3 objects, the closest at depth 7.5 + i / 2
            n = i + 3
            depths = 7.5 + tf.cast(tf.range(n), tf.float32) + tf.cast(i, tf.float32) / 2
            return {"image": png, "objects": {
                "size": tf.zeros([n], tf.int64),
                "pixel_coords": tf.stack([tf.zeros([n]), tf.zeros([n]), depths], axis=1)}}
    else:
        def example(i):  # a car at depth 5 * i + 3 (no vehicle for i = 7)
            types = tf.where(i == 7, tf.constant([3], tf.int64), tf.constant([0], tf.int64))
            depth = tf.cast(5 * i + 3, tf.float32)
            return {"image": png, "objects": {"type": types,
                                              "location": [[0.0, 0.0, depth]]}}
    return tf.data.Dataset.range(MOCK_EXAMPLES).map(example)


CLEVR_COUNTS = list(range(MOCK_EXAMPLES))  # i + 3 objects
# Closest object at 7.5, 8.0, 8.5, ..., 11.0: a depth equal to a threshold is in the lower bin.
CLEVR_DISTANCES = [0, 0, 1, 2, 3, 4, 5, 5]
# Closest car at 3, 8, 13, ..., 33 m; none in the last example.
KITTI_DISTANCES = [0, 0, 1, 1, 2, 2, 2, 3]


def test_clevr_and_kitti_pipelines():
    expected = {"clevr_count": CLEVR_COUNTS, "clevr_distance": CLEVR_DISTANCES,
                "kitti_distance": KITTI_DISTANCES}
    with tfds.testing.mock_data(as_dataset_fn=objects_as_dataset):
        for name, labels in expected.items():
            pipe = vtab.task_data(name, "test", image_size=8, batch_size=MOCK_EXAMPLES,
                                  training=False)
            images, got = next(iter(pipe.dataset))
            assert images.shape == (MOCK_EXAMPLES, 8, 8, 3)
            np.testing.assert_array_equal(got.numpy(), labels, err_msg=name)


def labelled_as_dataset(self, split, decoders=None, read_config=None, shuffle_files=False):
    """Mock examples with an image and every class-label feature (`i % classes`), for data sets
    whose other features tfds' mock generates invalid (oxford_iiit_pet's random boxes)."""
    del split, decoders, read_config, shuffle_files
    features = self.info.features
    png = tf.io.encode_png(tf.zeros([20, 30, 3], tf.uint8))
    labels = {k: f.num_classes for k, f in features.items()
              if isinstance(f, tfds.features.ClassLabel)}
    return tf.data.Dataset.range(MOCK_EXAMPLES).map(
        lambda i: dict({k: i % n for k, n in labels.items()}, image=png))


# tfds' own mock examples, except where it cannot make valid ones.
MOCKS = {"oxford_iiit_pet": dict(as_dataset_fn=labelled_as_dataset)}


@pytest.mark.parametrize("name", [n for n in vtab.TASKS if not n.startswith(("clevr", "kitti"))])
def test_task_pipeline_on_mock_data(name):
    task = vtab.TASKS[name]
    with tfds.testing.mock_data(**MOCKS.get(name, dict(num_examples=MOCK_EXAMPLES))):
        train = vtab.task_data(name, "train800val200", image_size=8, batch_size=4,
                               training=True, manual_dir="/mocked")
        test = vtab.task_data(name, "test", image_size=8, batch_size=4, training=False,
                              manual_dir="/mocked")
    assert (train.num_classes, train.num_examples, train.steps_per_epoch) == (
        task.num_classes, MOCK_EXAMPLES, 2)
    images, labels = next(iter(train.dataset))
    assert images.shape == (4, 8, 8, 3) and images.dtype == tf.float32
    assert -1 <= float(tf.reduce_min(images)) and float(tf.reduce_max(images)) <= 1
    batches = list(test.dataset)
    labels = np.concatenate([y.numpy() for _, y in batches])
    assert len(labels) == MOCK_EXAMPLES and labels.min() >= 0
    assert labels.max() < task.num_classes


def test_dsprites_images_are_white_on_black():
    """dSprites' 0/1 masks become 0/255 (task_adaptation multiplies by 255)."""
    mask = np.zeros([64, 64, 1], np.uint8)
    mask[10:20, 30:40] = 1
    image = vtab.TASKS["dsprites_location"].image(tf.constant(mask)).numpy()
    np.testing.assert_array_equal(image, mask * 255)


def test_training_preprocessing_keeps_the_whole_image():
    """No crop (structured labels depend on positions); flips only where the task allows."""
    image = np.zeros([4, 8, 3], np.uint8)
    image[:, :4] = 255  # left half white
    with tfds.testing.mock_data(num_examples=MOCK_EXAMPLES):
        for name in ("dmlab", "dtd"):
            pipe = vtab.task_data(name, "train800", image_size=(4, 8), batch_size=4,
                                  training=True)
            assert pipe.num_examples == MOCK_EXAMPLES
    from keras_vit import data

    outs = [data.preprocess_train(image, (4, 8), tf.constant([s, 0]), crop=False,
                                  flip=True).numpy() for s in range(20)]
    plain = image / 127.5 - 1
    assert all(np.allclose(o, plain) or np.allclose(o, plain[:, ::-1]) for o in outs)
    assert any(np.allclose(o, plain[:, ::-1]) for o in outs)
    outs = [data.preprocess_train(image, (4, 8), tf.constant([s, 0]), crop=False,
                                  flip=False).numpy() for s in range(5)]
    assert all(np.allclose(o, plain) for o in outs)


# --------------------------------------------------------------------------------------------
# The suite.


def test_suite_results_table_and_files(tmp_path):
    out = tmp_path / "vtab"
    with tfds.testing.mock_data(num_examples=MOCK_EXAMPLES):
        summary = vtab.run(model_fn, out, tasks="dtd,eurosat,smallnorb_azimuth",
                           keep_weights=True, description="tiny", **SMALL)
        # The recorded accuracy is the fine-tuned weights' accuracy on the test split.
        for row in read_csv(out / "results.csv"):
            task = vtab.TASKS[row["task"]]
            model = keras_vit.from_pretrained(str(out / "runs" / task.name / "final.npz"))
            test = vtab.task_data(task, "test", image_size=16, batch_size=4, training=False)
            images, labels = zip(*[(x.numpy(), y.numpy()) for x, y in test.dataset])
            predicted = np.argmax(model.predict(np.concatenate(images), verbose=0), axis=-1)
            np.testing.assert_allclose(float(row["accuracy"]),
                                       np.mean(predicted == np.concatenate(labels)), atol=1e-6)
            assert int(row["test_examples"]) == MOCK_EXAMPLES
            assert (float(row["learning_rate"]), int(row["steps"])) == (0.01, 4)
            assert int(row["train_examples"]) == MOCK_EXAMPLES
    rows = {r["task"]: float(r["accuracy"]) for r in read_csv(out / "results.csv")}
    assert list(rows) == ["dtd", "eurosat", "smallnorb_azimuth"]
    groups = summary["groups"]
    assert groups["natural"] == dict(mean=rows["dtd"], tasks=1, of=7)
    assert groups["specialized"] == dict(mean=rows["eurosat"], tasks=1, of=4)
    assert groups["structured"] == dict(mean=rows["smallnorb_azimuth"], tasks=1, of=8)
    assert summary["mean"]["mean"] == pytest.approx(np.mean(list(rows.values())))
    assert not summary["complete"]
    assert json.loads((out / "summary.json").read_text())["tasks"] == rows
    table = (out / "summary.md").read_text()
    assert "| natural | specialized | structured | mean |" in table and "(1 of 7)" in table


def test_suite_resumes_task_by_task_and_refuses_other_settings(tmp_path):
    out = tmp_path / "vtab"
    calls = []

    def counting_model_fn(num_classes):
        calls.append(num_classes)
        return model_fn(num_classes)

    with tfds.testing.mock_data(num_examples=MOCK_EXAMPLES):
        vtab.run(counting_model_fn, out, tasks="dtd", **SMALL)
        first = read_csv(out / "results.csv")
        assert not (out / "runs").exists()  # weights not kept by default
        vtab.run(counting_model_fn, out, tasks="dtd,eurosat", **SMALL)
        rows = read_csv(out / "results.csv")
        assert calls == [47, 10]  # dtd was not trained again
        assert rows[0] == first[0] and [r["task"] for r in rows] == ["dtd", "eurosat"]
        before = {p: p.read_bytes() for p in out.iterdir() if p.is_file()}
        with pytest.raises(ValueError, match=r"other settings \(steps 4 -> 5\)"):
            vtab.run(model_fn, out, tasks="dtd", **dict(SMALL, steps=5))
        assert {p: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
        vtab.run(model_fn, out, tasks="dtd", overwrite=True, **dict(SMALL, steps=5))
        assert [r["steps"] for r in read_csv(out / "results.csv")] == ["5"]


class Interrupt(keras.callbacks.Callback):
    """Stops training, as a crash would, once `after` epochs have finished."""

    def __init__(self, after):
        super().__init__()
        self.after = after

    def on_epoch_end(self, epoch, logs=None):
        if epoch + 1 == self.after:
            raise KeyboardInterrupt


def test_an_interrupted_task_resumes_where_it_stopped(tmp_path):
    settings = dict(SMALL, steps=6, tasks="dtd", keep_weights=True)  # 3 epochs of 2 steps
    with tfds.testing.mock_data(num_examples=MOCK_EXAMPLES):
        vtab.run(model_fn, tmp_path / "whole", **settings)
        with pytest.raises(KeyboardInterrupt):
            vtab.run(model_fn, tmp_path / "cut", callbacks=[Interrupt(2)], **settings)
        assert not (tmp_path / "cut" / "results.csv").exists()
        vtab.run(model_fn, tmp_path / "cut", **settings)
    run = json.loads((tmp_path / "cut" / "runs" / "dtd" / "run.json").read_text())
    assert run["finished"]
    whole = np.load(tmp_path / "whole" / "runs" / "dtd" / "final.npz")
    cut = np.load(tmp_path / "cut" / "runs" / "dtd" / "final.npz")
    for key in whole:
        np.testing.assert_allclose(cut[key], whole[key], atol=1e-6, err_msg=key)
    assert read_csv(tmp_path / "cut" / "results.csv")[0]["accuracy"] == \
        read_csv(tmp_path / "whole" / "results.csv")[0]["accuracy"]


def test_sweep_picks_the_best_validation_setting(tmp_path, capsys):
    out = tmp_path / "vtab"
    grid = [(0.01, 2), (0.001, 4)]
    with tfds.testing.mock_data(num_examples=MOCK_EXAMPLES):
        summary = vtab.run(model_fn, out, tasks="dtd,dmlab", sweep=grid,
                           **{k: v for k, v in SMALL.items() if k not in ("steps", "verbose")},
                           verbose=1)
    # A line and a bar of its updates per run: 4 sweep runs, then 2 tasks.
    printed = capsys.readouterr().out
    started = [line.split(":")[0] for line in printed.splitlines() if "->" in line]
    assert started == [f"vtab sweep [{i}/4] {t}" for i, t in enumerate(
        ["dtd", "dmlab"] * 2, 1)] + ["vtab [1/2] dtd", "vtab [2/2] dmlab"]
    assert printed.count("\x1b[1m2/2\x1b[0m") + printed.count("\x1b[1m4/4\x1b[0m") == 6
    rows = read_csv(out / "sweep.csv")
    assert sorted((r["task"], float(r["learning_rate"]), int(r["steps"])) for r in rows) == \
        sorted((t, lr, n) for t in ("dtd", "dmlab") for lr, n in grid)
    means = {s: np.mean([float(r["val_accuracy"]) for r in rows
                         if (float(r["learning_rate"]), int(r["steps"])) == s]) for s in grid}
    best = grid[0] if means[grid[0]] >= means[grid[1]] else grid[1]
    record = json.loads((out / "vtab.json").read_text())
    assert record["chosen"] == summary["chosen"] == {
        t: dict(learning_rate=best[0], steps=best[1]) for t in ("dtd", "dmlab")}
    assert [(float(r["learning_rate"]), int(r["steps"])) for r in
            read_csv(out / "results.csv")] == [best, best]
    assert not (out / "runs").exists()  # no weights kept, no empty folders of the sweep
    # Per-task selection takes each task's own best.
    chosen = vtab._choose(
        [dict(task="a", learning_rate=0.01, steps=2, val_accuracy=0.5),
         dict(task="a", learning_rate=0.001, steps=4, val_accuracy=0.7),
         dict(task="b", learning_rate=0.01, steps=2, val_accuracy=0.9),
         dict(task="b", learning_rate=0.001, steps=4, val_accuracy=0.1)],
        [vtab.Task("a", "natural", "x", 2, "", "", ""), vtab.Task("b", "natural", "x", 2, "",
                                                                  "", "")], grid, "task")
    assert chosen == {"a": (0.001, 4), "b": (0.01, 2)}


def test_command_line_defaults_are_the_protocol():
    """The command line keeps its own copy of the protocol (its --help loads no TensorFlow)."""
    from keras_vit_cli import build_parser
    from keras_vit_cli import vtab as cli_vtab

    assert (cli_vtab.STEPS, cli_vtab.LEARNING_RATE, cli_vtab.BATCH_SIZE, cli_vtab.IMAGE_SIZE,
            cli_vtab.SWEEP_LEARNING_RATES, cli_vtab.SWEEP_STEPS) == (
        vtab.STEPS, vtab.LEARNING_RATE, vtab.BATCH_SIZE, vtab.IMAGE_SIZE,
        vtab.SWEEP_LEARNING_RATES, vtab.SWEEP_STEPS)
    parser = build_parser(["vtab"])
    action = next(a for a in parser._subparsers._group_actions[0].choices["vtab"]._actions
                  if a.dest == "tasks")
    assert ", ".join(vtab.TASKS) in " ".join(action.help.split())
    assert action.help.count(",") >= len(vtab.TASKS)


def test_command_line(tmp_path, capsys):
    out = tmp_path / "vtab"
    args = ["vtab", "--model-config", TINY_JSON, "--image-size", "16", "--tasks", "dtd",
            "--steps", "2", "--batch-size", "4", "--no-xla", "--output", str(out)]
    with tfds.testing.mock_data(num_examples=MOCK_EXAMPLES):
        assert cli_main(args) == 0
    printed = capsys.readouterr().out
    assert "vtab [1/1] dtd: test accuracy" in printed and "| natural |" in printed
    assert "\x1b[1m2/2\x1b[0m" in printed  # the task's bar: 2 of 2 updates
    (row,) = read_csv(out / "results.csv")
    assert row["task"] == "dtd"
    accuracy = f"{100 * float(row['accuracy']):.1f}"
    assert f"| dtd | natural | {accuracy} | {MOCK_EXAMPLES} | {MOCK_EXAMPLES} |" in printed
    assert "  setting  learning rate 0.01, 2 steps\n" in printed
    # Run again: the task is done; --json prints the summary vtab.run returns.
    with tfds.testing.mock_data(num_examples=MOCK_EXAMPLES):
        assert cli_main([*args, "--json"]) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed[0] == "vtab [1/1] dtd: already done"
    summary = json.loads(printed[-1])
    assert summary["tasks"] == {"dtd": float(row["accuracy"])}
    assert summary["examples"] == {"dtd": {"train": MOCK_EXAMPLES, "test": MOCK_EXAMPLES}}
    assert summary["output_dir"] == str(out)
    settings = json.loads((out / "vtab.json").read_text())["settings"]
    assert settings["image_size"] == [16, 16] and settings["steps"] == 2

    bad = tmp_path / "bad"
    stderr = io.StringIO()
    with redirect_stderr(stderr):
        status = cli_main(["vtab", "--model-config", TINY_JSON, "--tasks", "dtd,mnist",
                           "--output", str(bad)])
    assert status == 2 and not bad.exists()
    with redirect_stderr(io.StringIO()):  # a data set that cannot be had: nothing written
        status = cli_main(["vtab", "--model-config", TINY_JSON, "--tasks",
                           "diabetic_retinopathy", "--data-dir", str(tmp_path / "d"),
                           "--output", str(bad)])
    assert status == 2 and not bad.exists()
    assert stderr.getvalue().strip() == (
        "keras-vit vtab: error: Unknown VTAB task 'mnist'. Expected task names (" +
        ", ".join(vtab.TASKS) + ") or groups (natural, specialized, structured, all).")


def test_corrupt_records_are_named_and_left_as_they_are(tmp_path):
    with tfds.testing.mock_data(num_examples=MOCK_EXAMPLES):
        vtab.run(model_fn, tmp_path, tasks="dtd", **SMALL)
        for name, garbage in (("results.csv", "not,a\nresults file\n"),
                              ("vtab.json", "{not json")):
            path = tmp_path / name
            good = path.read_bytes()
            path.write_text(garbage)
            with pytest.raises(ValueError, match=f"{name} is unreadable .* pass overwrite=True"):
                vtab.run(model_fn, tmp_path, tasks="dtd,eurosat", **SMALL)
            assert path.read_text() == garbage
            path.write_bytes(good)


def test_missing_data_is_named_before_anything_is_written(tmp_path):
    """Not mocked: a data set downloaded by hand, missing, stops the suite before it starts."""
    out = tmp_path / "vtab"
    with pytest.raises(ValueError, match=r"diabetic_retinopathy_detection/btgraham-300:3.\*.\* "
                                         r"must be downloaded by hand: pass manual_dir=<folder "
                                         "with the Kaggle"):
        vtab.run(model_fn, out, tasks="diabetic_retinopathy", data_dir=str(tmp_path / "d"),
                 **SMALL)
    assert not out.exists()


def test_tasks_added_to_a_swept_suite_cannot_change_its_choice(tmp_path, monkeypatch):
    """With select="suite" one setting trains every task: tasks added to a suite whose results
    were trained with another setting are refused, not trained with the new choice beside
    them."""
    accuracy = {("dtd", 0.001): 0.9, ("dtd", 0.01): 0.1,
                ("eurosat", 0.001): 0.0, ("eurosat", 0.01): 1.0}
    monkeypatch.setattr(vtab, "_finetune", lambda model_fn, task, train, evaluation, run_dir,
                        learning_rate, steps, **common: (accuracy[task.name, learning_rate], 8, 8))
    grid = [(0.001, 2), (0.01, 2)]
    out = tmp_path / "vtab"
    with tfds.testing.mock_data(num_examples=MOCK_EXAMPLES):
        first = vtab.run(model_fn, out, tasks="dtd", sweep=grid, batch_size=4, verbose=0)
        assert first["chosen"] == {"dtd": dict(learning_rate=0.001, steps=2)}
        with pytest.raises(ValueError, match=r"the sweep chooses learning rate 0.01, 2 steps "
                                             r"for dtd, which .* trained with learning rate "
                                             r"0.001, 2 steps"):
            vtab.run(model_fn, out, tasks="dtd,eurosat", sweep=grid, batch_size=4, verbose=0)
    assert [row["task"] for row in read_csv(out / "results.csv")] == ["dtd"]
    assert json.loads((out / "vtab.json").read_text())["chosen"] == first["chosen"]
