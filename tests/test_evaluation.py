"""Evaluation: the few-shot solver, known-answer data, evaluate() against the reference."""

import csv

import keras
import numpy as np
import pytest
import reference

import keras_vit
from keras_vit import evaluation, weights

TINY = dict(hidden_size=32, num_layers=2, num_heads=4, mlp_dim=48)


@pytest.mark.parametrize("n,d", [(60, 8), (12, 40)], ids=["N>=D", "D>N"])
def test_closed_form_solver_matches_lstsq(n, d):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, d))
    labels = rng.integers(0, 5, n)
    for l2 in (1e-3, 1.0, 300.0):
        w = evaluation.lsr_weights(x, labels, 5, l2)
        y = 2.0 * np.eye(5)[labels] - 1.0
        # Ridge regression is least squares on the system augmented with sqrt(l2) * I.
        a = np.concatenate([x, np.sqrt(l2) * np.eye(d)])
        b = np.concatenate([y, np.zeros((d, 5))])
        expected = np.linalg.lstsq(a, b, rcond=None)[0]
        np.testing.assert_allclose(w, expected, atol=1e-8)


CENTRES = np.random.default_rng(42).standard_normal((10, 32)) * 5  # one centre per class


def features_data(rng, kind, num_classes=10, per_class=60, dim=32):
    labels = np.repeat(np.arange(num_classes), per_class)
    if kind == "separable":
        features = CENTRES[labels] + rng.standard_normal((len(labels), dim)) * 0.1
    else:
        features = rng.standard_normal((len(labels), dim))
    return features.astype(np.float32), labels


def test_fewshot_on_separable_features_is_perfect_and_on_noise_is_chance():
    rng = np.random.default_rng(1)
    train = features_data(rng, "separable")
    test = features_data(rng, "separable", per_class=200)
    table = evaluation.fewshot_table(*train, *test, shots=(1, 5), l2_regs=(1.0, 64.0))
    assert all(acc == 1.0 for row in table["accuracy"].values() for acc in row.values())
    train = features_data(rng, "noise")
    test = features_data(rng, "noise", per_class=200)  # 2000 test images, chance 0.1
    table = evaluation.fewshot_table(*train, *test, shots=(5, 25), l2_regs=(1.0, 64.0))
    for row in table["accuracy"].values():
        for acc in row.values():
            assert abs(acc - 0.1) < 0.04  # about 6 standard deviations of a 2000-draw mean
    text = evaluation.format_fewshot_table(table)
    assert text.splitlines()[0] == "| l2 reg | 5-shot | 25-shot |" and "best" in text


def test_shots_are_k_per_class_and_k_too_large_is_refused():
    labels = np.array([0] * 5 + [1] * 3 + [2] * 9)
    index = evaluation.sample_shots(labels, 3, seed=4)
    assert sorted(np.bincount(labels[index])) == [3, 3, 3]
    assert len(set(index)) == 9
    with pytest.raises(ValueError, match=r"4-shot needs 4 examples of every class, but class 1 "
                                         r"has only 3. Expected shots <= 3"):
        evaluation.sample_shots(labels, 4)


def test_shots_are_big_visions_draw_for_the_same_seed():
    """big_vision's fewshot_lsr: `default_rng(seed)`, each class's indices permuted in class
    order, the first k of each; so a seed's shots are nested across k."""
    labels = np.random.default_rng(7).integers(0, 4, 60)
    for seed in (0, 1, 2):
        rng = np.random.default_rng(seed)
        permuted = [rng.permutation(np.where(labels == c)[0]) for c in range(4)]
        for shots in (1, 5, 10):
            want = np.concatenate([indices[:shots] for indices in permuted])
            np.testing.assert_array_equal(evaluation.sample_shots(labels, shots, seed), want)


def test_linear_probe_separates_separable_features():
    rng = np.random.default_rng(2)
    train = features_data(rng, "separable", per_class=20)
    test = features_data(rng, "separable", per_class=20)
    result = evaluation.linear_probe(*train, *test, epochs=30)
    assert result["accuracy"] == 1.0


def tiny_classifier(rng, num_classes=7, representation=None):
    params = reference.official_params(rng, hidden=32, mlp=48, heads=4, layers=2, patch=8,
                                       grid=(4, 4), num_classes=num_classes,
                                       representation=representation, scale=0.5)
    model = keras_vit.ViT(image_size=32, patch_size=8, num_classes=num_classes,
                          representation_size=representation, **TINY)
    weights.load_params(model, params)
    return model, params


def test_evaluate_matches_numbers_computed_from_the_reference(tmp_path):
    rng = np.random.default_rng(3)
    model, params = tiny_classifier(rng)
    images = rng.integers(0, 256, (50, 32, 32, 3)).astype(np.uint8)
    logits, _, _ = reference.forward(params, images.astype(np.float64) / 127.5 - 1)
    labels = np.argmax(logits, axis=1)
    labels[::3] = (labels[::3] + 1) % 7  # a third wrong on purpose
    result = keras_vit.evaluate(model, (images, labels), batch_size=16, out_dir=str(tmp_path),
                                class_names=[f"c{i}" for i in range(7)], progress=False)
    order = np.argsort(-logits, axis=1)
    log_probs = logits - np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1, keepdims=True)) \
        - logits.max(1, keepdims=True)
    assert result["num_examples"] == 50
    assert result["top1"] == pytest.approx(np.mean(order[:, 0] == labels))
    assert result["top5"] == pytest.approx(np.mean((order[:, :5] == labels[:, None]).any(1)))
    assert result["loss"] == pytest.approx(-np.mean(log_probs[np.arange(50), labels]), rel=1e-4)
    expected_confusion = np.zeros((7, 7), int)
    np.add.at(expected_confusion, (labels, order[:, 0]), 1)
    np.testing.assert_array_equal(result["confusion_matrix"], expected_confusion)
    with open(tmp_path / "per_class_accuracy.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["class_name"] for r in rows] == [f"c{i}" for i in range(7)]
    for i, row in enumerate(rows):
        examples = int((labels == i).sum())
        assert int(row["examples"]) == examples
        if examples:
            assert float(row["accuracy"]) == pytest.approx(
                expected_confusion[i, i] / examples, abs=1e-6)
    png = (tmp_path / "confusion_matrix.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000


def test_evaluate_accepts_a_tf_dataset_of_preprocessed_batches():
    import tensorflow as tf

    rng = np.random.default_rng(4)
    model, params = tiny_classifier(rng)
    images = rng.uniform(-1, 1, (20, 32, 32, 3)).astype(np.float32)
    logits, _, _ = reference.forward(params, images)
    labels = np.argmax(logits, axis=1)
    dataset = tf.data.Dataset.from_tensor_slices((images, labels)).batch(8)
    result = keras_vit.evaluate(model, dataset, progress=False)
    assert result["top1"] == 1.0 and result["num_examples"] == 20


def test_features_of_an_fc_norm_model_are_what_its_head_reads():
    # timm's global_pool="avg" with fc_norm (MAE fine-tunes, EVA): the head reads the pooled
    # tokens after fc_norm, as timm's forward_head(pre_logits=True) gives them.
    model = keras_vit.ViT(image_size=32, patch_size=8, num_classes=5, classifier="gap",
                          class_token=False, fc_norm=True, **TINY)
    rng = np.random.default_rng(0)
    model.set_weights([rng.normal(0, 0.5, w.shape).astype(w.dtype) for w in model.get_weights()])
    images = rng.integers(0, 256, (4, 32, 32, 3)).astype(np.uint8)
    features, _ = keras_vit.extract_features(model, (images, np.arange(4)), progress=False)
    head_input = keras.Model(model.input, model.get_layer("head").input)
    expected = head_input(np.asarray(keras_vit.preprocess_inputs(images)))
    np.testing.assert_allclose(features, expected, atol=1e-5)
    pooled = keras.Model(model.input, model.get_layer("pool").output)
    assert np.abs(pooled(np.asarray(keras_vit.preprocess_inputs(images))) - expected).max() > 0.1


def test_features_are_the_representation_and_are_cached(tmp_path, monkeypatch):
    rng = np.random.default_rng(5)
    model, params = tiny_classifier(rng, representation=16)
    images = rng.integers(0, 256, (10, 32, 32, 3)).astype(np.uint8)
    labels = np.arange(10) % 3
    cache = tmp_path / "features"  # a folder: one entry per model, weights and data
    key = dict(dataset="colours", split="train")
    features, got_labels = keras_vit.extract_features(model, (images, labels), batch_size=4,
                                                      cache=str(cache), cache_key=key,
                                                      progress=False)
    expected, _, _ = reference.forward(params, images.astype(np.float64) / 127.5 - 1,
                                       include_top=False)
    np.testing.assert_allclose(features, expected, atol=1e-5)
    np.testing.assert_array_equal(got_labels, labels)
    name = f"{evaluation.feature_cache_key(model, key)}-" \
           f"{evaluation.data_digest((images, labels))}.npz"
    assert [p.name for p in cache.iterdir()] == [name]
    with np.load(cache / name) as entry:
        np.testing.assert_array_equal(entry["features"], features)
        np.testing.assert_array_equal(entry["labels"], labels)
    # The same model (rebuilt, same weights) on the same data reads the cache: no forward pass.
    rebuilt, _ = tiny_classifier(np.random.default_rng(5), representation=16)
    assert name.startswith(evaluation.feature_cache_key(rebuilt, key) + "-")
    with monkeypatch.context() as patch:
        patch.setattr(evaluation, "representation_model",
                      lambda model: pytest.fail("the cached features were computed again"))
        again, again_labels = keras_vit.extract_features(rebuilt, (images, labels),
                                                         cache=cache, cache_key=key,
                                                         progress=False)
    np.testing.assert_array_equal(again, features)
    np.testing.assert_array_equal(again_labels, labels)
    # Other weights (same configuration), another model, or other data: entries of their own,
    # never the stale features above.
    changed = dict(params, **{"pre_logits/bias": params["pre_logits/bias"] + 0.5})
    weights.load_params(rebuilt, changed)
    expected_changed, _, _ = reference.forward(changed, images.astype(np.float64) / 127.5 - 1,
                                               include_top=False)
    assert np.abs(expected_changed - expected).max() > 0.05
    got, _ = keras_vit.extract_features(rebuilt, (images, labels), cache=cache, cache_key=key,
                                        progress=False)
    np.testing.assert_allclose(got, expected_changed, atol=1e-5)
    other = keras_vit.ViT(image_size=32, patch_size=8, num_classes=7, **dict(TINY, hidden_size=8,
                                                                           num_heads=2))
    got, _ = keras_vit.extract_features(other, (images, labels), cache=cache, cache_key=key,
                                        progress=False)
    assert got.shape == (10, 8)
    test_images = images[::-1]
    got, got_labels = keras_vit.extract_features(
        model, (test_images, labels[::-1]), cache=cache,
        cache_key=dict(dataset="colours", split="test"), progress=False)
    np.testing.assert_allclose(got, expected[::-1], atol=1e-5)
    np.testing.assert_array_equal(got_labels, labels[::-1])
    assert len(list(cache.iterdir())) == 4  # four entries


def test_bad_inputs_are_refused():
    import tensorflow as tf

    rng = np.random.default_rng(6)
    model, _ = tiny_classifier(rng)
    images = np.zeros((4, 32, 32, 3), np.uint8)
    no_labels = tf.data.Dataset.from_tensor_slices(images.astype(np.float32)).batch(2)
    with pytest.raises(ValueError, match="The dataset has no labels"):
        keras_vit.evaluate(model, no_labels, progress=False)
    with pytest.raises(ValueError, match="The data has no labels"):
        keras_vit.extract_features(model, (images, None), progress=False)
    plain = keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Flatten(),
                              keras.layers.Dense(3)])
    with pytest.raises(ValueError, match="has no representation layer"):
        keras_vit.extract_features(plain, (images, np.zeros(4)), progress=False)
    with pytest.raises(ValueError, match=r"Labels out of range: \[9\] \(1 of 4 values\). "
                                         r"Expected integers in \[0, 7\)"):
        keras_vit.evaluate(model, (images, np.array([0, 1, 2, 9])), progress=False)
    headless = keras_vit.ViT(image_size=32, patch_size=8, include_top=False, **TINY)
    with pytest.raises(ValueError, match="has no classification head"):
        keras_vit.evaluate(headless, (images, np.zeros(4)), progress=False)


# ------------------------------------------------------------------------------------------
# The shipped demo and the commands.


def test_shipped_demo_reproduces_its_recorded_heldout_accuracy(tmp_path, capsys):
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
    import evaluate_digits

    from keras_vit import weights

    assert evaluate_digits.main(["--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    recorded = weights.get_checkpoint("digits")["heldout_accuracy"]
    assert f"held-out: 360 images, top-1 {recorded:.2%}" in printed  # 352/360 = 97.78%
    assert "| best on the test split |" in printed and "| 1024 (big_vision's) |" in printed
    assert (tmp_path / "confusion_matrix.png").exists()


def write_folder(root, rng, per_class=6):
    import tensorflow as tf

    colours = {"red": (220, 30, 30), "green": (30, 200, 40), "blue": (20, 40, 230)}
    for name, colour in colours.items():
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            image = np.clip(np.array(colour) + rng.normal(0, 20, (32, 32, 3)), 0, 255)
            (root / name / f"{i}.png").write_bytes(
                tf.io.encode_png(image.astype(np.uint8)).numpy())
    return sorted(colours)


def test_evaluate_and_fewshot_commands(tmp_path, capsys, monkeypatch):
    import json

    import keras_vit_cli as cli

    rng = np.random.default_rng(7)
    write_folder(tmp_path / "images", rng)
    model, _ = tiny_classifier(rng, num_classes=3)
    weights.save_npz(model, tmp_path / "tiny.npz")
    config = json.dumps(dict(patch_size=8, **TINY))
    common = ["--folder", str(tmp_path / "images"), "--model-config", config,
              "--image-size", "32", "--weights", str(tmp_path / "tiny.npz"), "--batch-size", "4"]
    assert cli.main(["evaluate", *common, "--out", str(tmp_path / "report"), "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["examples"] == 18 and 0 <= result["accuracy"] <= 1
    assert result["top5"] is None  # 3 classes: every label is in the top 5
    # Every image of the folder was used, and the result says so.
    assert (result["data"], result["split"], result["classes"]) == (
        str(tmp_path / "images"), "all", 3)
    assert cli.main(["evaluate", *common, "--verbose", "0"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0] == f"Evaluated on every image of {tmp_path / 'images'}: 18 images, 3 classes"
    assert table[1].split() == ["top-1", "accuracy", f"{result['accuracy']:.2%}"]
    rows = (tmp_path / "report" / "per_class_accuracy.csv").read_text().splitlines()
    assert rows[1].startswith('0,blue,6,')  # folder classes in sorted order
    assert (tmp_path / "report" / "confusion_matrix.png").exists()

    assert cli.main(["fewshot", *common, "--shots", "1,3", "--l2", "1,100",
                     "--verbose", "0"]) == 0  # folder: train (90%) and validation (10%)
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-5] == "| l2 reg | 1-shot | 3-shot |"
    assert lines[-1].startswith("| best on the test split |")
    # The sizes used: 2 of the 18 images held out (10%, rounded), 16 to draw the shots from.
    assert lines[:3] == [
        "Few-shot linear accuracy of frozen features, 3 classes",
        f"  shots from  {tmp_path / 'images'} less its held-out 10%: 16 images (k = 1, 3 per "
        "class, seed 0)",
        f"  tested on   the held-out 10% of {tmp_path / 'images'}: 2 images"]
    monkeypatch.setattr("keras_vit_cli.progress._is_terminal", lambda stream: True)
    assert cli.main(["fewshot", *common, "--shots", "1,3", "--l2", "1,100", "--json"]) == 0
    printed, err = capsys.readouterr()
    assert "\x1b[1m16/16\x1b[0m" in err and "\x1b[1m2/2\x1b[0m" in err  # the bars, on stderr
    monkeypatch.undo()
    result = json.loads(printed.strip().splitlines()[-1])
    assert (result["train_split"], result["train_examples"], result["test_split"],
            result["test_examples"], result["classes"]) == ("train", 16, "validation", 2, 3)
    best = {row["shots"]: row for row in result["best"]}
    cells = {(row["shots"], row["l2"]): row["accuracy"] for row in result["accuracy"]}
    assert set(cells) == {(1, 1.0), (1, 100.0), (3, 1.0), (3, 100.0)}
    assert best[3]["accuracy"] == max(cells[3, 1.0], cells[3, 100.0])
    assert lines[-1] == "| best on the test split | " + " | ".join(
        f"{best[k]['accuracy']:.2%} (l2 {best[k]['l2']:g})" for k in (1, 3)) + " |"

    # --cache is a folder: the train and test features of this model, weights and data are
    # written there, and a second run reads them instead of running the model.
    cached = ["fewshot", *common, "--shots", "1,3", "--l2", "1,100", "--verbose", "0",
              "--cache", str(tmp_path / "features")]
    assert cli.main(cached) == 0
    assert capsys.readouterr().out.strip().splitlines()[-5:] == lines[-5:]
    assert len(list((tmp_path / "features").glob("*.npz"))) == 2  # train, test
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(evaluation, "representation_model",
                      lambda model: pytest.fail("the cached features were computed again"))
        assert cli.main(cached) == 0
    assert capsys.readouterr().out.strip().splitlines()[-5:] == lines[-5:]

    # Weights whose head does not fit the data's classes are refused, not silently replaced.
    seven, _ = tiny_classifier(rng, num_classes=7)
    weights.save_npz(seven, tmp_path / "seven.npz")
    mismatched = [a if a != str(tmp_path / "tiny.npz") else str(tmp_path / "seven.npz")
                  for a in common]
    assert cli.main(["evaluate", *mismatched]) == 2
    err = capsys.readouterr().err
    assert err.startswith("keras-vit evaluate: error: ")
    assert "has a head of 7 classes, but the data has 3 classes" in err

    assert cli.main(["fewshot", *common, "--shots", "7", "--verbose", "0"]) == 2
    assert "7-shot needs 7 examples of every class" in capsys.readouterr().err
    assert cli.main(["fewshot", *common, "--split", "all", "--verbose", "0"]) == 2
    assert "overlaps --train-split train" in capsys.readouterr().err
    assert cli.main(["fewshot", *common, "--shots", "0"]) == 2
    assert "--shots must be positive integers" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------
# ReaL accuracy: label sets, some empty (paper Table 2, ImageNet-ReaL).


def plain_real(predictions, label_sets, labels):
    """ReaL and original accuracy on the images with a non-empty set, counted in plain Python."""
    scored = [i for i, labels_i in enumerate(label_sets) if labels_i]
    real = sum(predictions[i] in label_sets[i] for i in scored)
    original = sum(predictions[i] == labels[i] for i in scored)
    return real / len(scored), original / len(scored), len(scored), len(label_sets) - len(scored)


def test_real_accuracy_matches_a_plain_python_count():
    predictions = [3, 1, 0, 2, 2, 4, 1, 0]
    label_sets = [[3], [0, 1, 4], [], [1, 3], [2, 2], [], [0, 4], [0, 1, 2, 3]]
    labels = [3, 0, 0, 2, 2, 4, 4, 1]
    sets = evaluation.multi_hot(label_sets, 5)
    assert sets.dtype == bool and sets.sum() == 13  # the repeated 2 counts once
    assert sets[2].sum() == 0 and sets[7, :4].all() and not sets[7, 4]
    result = evaluation.real_accuracy(predictions, sets, labels)
    accuracy, original, scored, left_out = plain_real(predictions, label_sets, labels)
    assert (accuracy, original, scored, left_out) == (4 / 6, 3 / 6, 6, 2)  # by hand, too
    assert result["accuracy"] == pytest.approx(accuracy)
    assert result["original_accuracy"] == pytest.approx(original)
    assert (result["num_examples"], result["num_left_out"]) == (scored, left_out)
    # Per original class: the scored images of that class and how many are ReaL-correct.
    np.testing.assert_array_equal(result["per_class_examples"], [1, 1, 2, 1, 1])
    np.testing.assert_array_equal(result["per_class_correct"], [1, 1, 1, 1, 0])
    # 0/1 integer sets (what keras_vit.data yields) score the same as booleans.
    again = evaluation.real_accuracy(predictions, sets.astype(np.int32), labels)
    assert again["accuracy"] == result["accuracy"]

    everything_empty = evaluation.real_accuracy([0, 1], evaluation.multi_hot([[], []], 3), [0, 1])
    assert np.isnan(everything_empty["accuracy"]) and everything_empty["num_left_out"] == 2

    with pytest.raises(ValueError, match=r"Class ids of label set 1 out of range: \[7\] "
                                         r"\(1 of 2 values\). Expected integers in \[0, 5\)"):
        evaluation.multi_hot([[1], [2, 7]], 5)
    with pytest.raises(ValueError, match=r"Predictions out of range: \[5\].*\[0, 5\)"):
        evaluation.real_accuracy([5, 0], sets[:2], labels[:2])
    with pytest.raises(ValueError, match=r"Label sets must be multi-hot \[3, 5\]"):
        evaluation.real_accuracy([0, 1, 2], sets[:2], [0, 1, 2])
    with pytest.raises(ValueError, match=r"Label sets must be multi-hot \[N, num_classes\]"):
        evaluation.real_accuracy([0, 1], [1, 3], [0, 1])


@pytest.mark.parametrize("sets", [
    [[np.nan, 0, 0], [0, np.nan, 0]],  # NaN as "unknown"
    [[-1, 0, 0], [0, -1, 0]],  # -1 as "unknown"
    [[0.2, 0, 0], [0, 0.1, 0]],  # scores, not a set
    [["0", "0", "0"], ["0", "0", "0"]],
], ids=["nan", "minus_one", "scores", "strings"])
def test_real_accuracy_refuses_label_sets_that_are_not_multi_hot(sets):
    # Each of these marks no class correct; read as truth values, every one was correct.
    with pytest.raises(ValueError, match=r"^Label sets must be multi-hot: bool, or 0 and 1 "):
        evaluation.real_accuracy([0, 1], sets, [2, 2])
    # 0 and 1 in any numeric dtype are a set: here class 2, which neither prediction is.
    assert evaluation.real_accuracy([0, 1], [[0, 0, 1.0], [0, 0, 1.0]], [2, 2])["accuracy"] == 0
    with pytest.raises(ValueError, match=r"shape \[N\]. Received shape \(2, 1\) "
                                         r"\(labels.reshape\(-1\)\)"):
        evaluation.real_accuracy([0, 1], [[1, 0, 0], [0, 1, 0]], [[2], [2]])
    with pytest.raises(ValueError, match="`num_classes` must be a positive integer"):
        evaluation.multi_hot([[0]], -1)


def test_evaluate_reports_real_accuracy_beside_the_original_top1(tmp_path):
    rng = np.random.default_rng(8)
    model, params = tiny_classifier(rng)
    images = rng.integers(0, 256, (40, 32, 32, 3)).astype(np.uint8)
    logits, _, _ = reference.forward(params, images.astype(np.float64) / 127.5 - 1)
    predictions = np.argmax(logits, axis=1).tolist()
    labels = [(p + 1) % 7 if i % 4 == 0 else p for i, p in enumerate(predictions)]
    # Sets with and without the prediction, several labels, and empty ones (left out).
    label_sets = [[] if i % 5 == 0 else [p] if i % 3 else [(p + 2) % 7, (p + 3) % 7]
                  for i, p in enumerate(predictions)]
    data = (images, {"label": np.array(labels), "label_set": evaluation.multi_hot(label_sets, 7)})
    result = keras_vit.evaluate(model, data, batch_size=16, out_dir=str(tmp_path), progress=False)
    accuracy, original, scored, left_out = plain_real(predictions, label_sets, labels)
    assert (scored, left_out) == (32, 8) and 0 < accuracy < 1 and 0 < original < 1
    real = result["real"]
    assert real["accuracy"] == pytest.approx(accuracy)
    assert real["original_accuracy"] == pytest.approx(original)
    assert (real["num_examples"], real["num_left_out"]) == (scored, left_out)
    # top-1 is against the original labels, on every image.
    assert result["top1"] == pytest.approx(np.mean(np.array(predictions) == labels))
    assert result["num_examples"] == 40
    with open(tmp_path / "per_class_accuracy.csv") as f:
        rows = list(csv.DictReader(f))
    for i, row in enumerate(rows):
        mine = [k for k in range(40) if labels[k] == i and label_sets[k]]
        assert int(row["real_examples"]) == len(mine)
        assert int(row["real_correct"]) == sum(predictions[k] in label_sets[k] for k in mine)
    # Plain labels: no ReaL entry, and no ReaL columns.
    plain = keras_vit.evaluate(model, (images, np.array(labels)), out_dir=str(tmp_path / "plain"),
                               progress=False)
    assert "real" not in plain
    header = (tmp_path / "plain" / "per_class_accuracy.csv").read_text().splitlines()[0]
    assert header == "class_index,class_name,examples,correct,accuracy"
    with pytest.raises(ValueError, match="must have the keys 'label' and 'label_set'"):
        keras_vit.evaluate(model, (images, {"label": np.array(labels)}), progress=False)


def test_evaluate_command_on_imagenet2012_real(tmp_path, capsys):
    """The command on mock ImageNet-ReaL (tfds mock data: random images, random label sets)."""
    import json

    import tensorflow_datasets as tfds

    import keras_vit_cli as cli
    from keras_vit import data

    rng = np.random.default_rng(9)
    model, _ = tiny_classifier(rng, num_classes=1000)
    weights.save_npz(model, tmp_path / "tiny.npz")
    command = ["evaluate", "--dataset", "imagenet2012_real", "--manual-dir", str(tmp_path),
               "--model-config", json.dumps(dict(patch_size=8, **TINY)), "--image-size", "32",
               "--weights", str(tmp_path / "tiny.npz"), "--batch-size", "4", "--json"]
    with tfds.testing.mock_data(num_examples=10):
        assert cli.main(command) == 0
        pipeline = data.from_tfds("imagenet2012_real", "test", image_size=32, batch_size=4,
                                  manual_dir=str(tmp_path))
        raw = list(tfds.load("imagenet2012_real", split="validation",
                             decoders={"image": tfds.decode.SkipDecoding()}).as_numpy_iterator())
        with pytest.raises(ValueError, match="imagenet2012_real is an evaluation set"):
            data.from_tfds("imagenet2012_real", "test", image_size=32, batch_size=4,
                           manual_dir=str(tmp_path), training=True)
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["examples"] == 10
    assert set(printed["real"]) == {"accuracy", "original_accuracy", "examples", "left_out"}
    # The pipeline's labels are tfds' own, and the command's numbers are those of its images.
    batches = list(pipeline.dataset.as_numpy_iterator())
    labels = np.concatenate([b[1]["label"] for b in batches])
    label_sets = np.concatenate([b[1]["label_set"] for b in batches])
    np.testing.assert_array_equal(labels, [ex["original_label"] for ex in raw])
    np.testing.assert_array_equal(
        label_sets, evaluation.multi_hot([ex["real_label"] for ex in raw], 1000))
    predictions = np.concatenate([np.argmax(model.predict_on_batch(b[0]), axis=1)
                                  for b in batches])
    expected = evaluation.real_accuracy(predictions, label_sets, labels)
    assert printed["real"]["accuracy"] == pytest.approx(expected["accuracy"])
    assert printed["real"]["original_accuracy"] == pytest.approx(expected["original_accuracy"])
    assert printed["real"]["left_out"] == expected["num_left_out"]
    assert printed["accuracy"] == pytest.approx(np.mean(predictions == labels))


def three_class_job():
    """A 3-class model with a trained-looking head (not all zeros) and 3 images to score."""
    model = keras_vit.ViT(image_size=16, patch_size=8, hidden_size=8, num_layers=1,
                          num_heads=2, mlp_dim=8, num_classes=3)
    model.get_layer("head").kernel.assign(np.ones((8, 3), np.float32))
    images = np.random.default_rng(0).integers(0, 256, (3, 16, 16, 3), dtype=np.uint8)
    return model, keras_vit.data.from_arrays(images, np.arange(3), num_classes=3,
                                             image_size=16, batch_size=3, training=False)


def test_report_rows_are_csv_whatever_the_class_names(tmp_path):
    """Class names with commas, quotes and line breaks read back through the csv module as
    written."""
    import csv

    names = ['a,b', 'say "hi"', "two\nlines"]
    model, data = three_class_job()
    keras_vit.evaluate(model, data, class_names=names, out_dir=tmp_path / "r", progress=False)
    with open(tmp_path / "r" / "per_class_accuracy.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert [row[1] for row in rows[1:]] == names
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == [
        "confusion_matrix.png", "per_class_accuracy.csv"]  # the lock is gone


def test_two_evaluations_never_write_into_one_report_folder_at_once(tmp_path):
    """The report folder has one writer (its lock): an evaluation meeting another one there is
    refused before it computes anything, and leaves the other's reports alone."""
    from keras_vit import fileio

    model, data = three_class_job()
    out = tmp_path / "r"
    out.mkdir()
    with fileio.folder_lock(out, "evaluation"):  # as another process's evaluation holds it
        with pytest.raises(fileio.FolderInUse, match="in use by"):
            keras_vit.evaluate(model, data, out_dir=out, progress=False, overwrite=True)
        assert [p.name for p in out.iterdir()] == [fileio.LOCK_FILE]
    keras_vit.evaluate(model, data, out_dir=out, progress=False)
    with pytest.raises(fileio.DestinationExists):
        keras_vit.evaluate(model, data, out_dir=out, progress=False)


SMALL = dict(image_size=16, patch_size=8, hidden_size=8, num_layers=1, num_heads=2, mlp_dim=8,
             num_classes=3)


def small_model(data_config=None):
    model = keras_vit.ViT(**SMALL, data_config=data_config)
    model.get_layer("head").bias.assign(np.array([0.1, 0.0, -0.1], np.float32))
    return model


def test_evaluate_takes_what_keras_vit_pipelines_give_and_checks_their_preprocessing():
    """A pipeline is checked by its data config, not its values (a Lanczos resize overshoots
    the normalised range); one built without a data config is built again with the model's,
    one built with another is refused; a dataset of bfloat16 images, and batch_size=None for
    a dataset (Keras' convention), are taken."""
    import tensorflow as tf

    lanczos = dict(input_size=[3, 16, 16], interpolation="lanczos5", crop_pct=1.0,
                   crop_mode="crop_to_aspect_ratio", mean=[0.5] * 3, std=[0.5] * 3)
    model = small_model(lanczos)
    board = (np.indices((7, 7)).sum(0) % 2 * 255).astype(np.uint8)[..., None].repeat(3, -1)
    data = keras_vit.data.from_arrays(board[None].repeat(2, 0), np.array([0, 1]),
                                      image_size=16, batch_size=2, training=False,
                                      data_config=model)
    images = next(iter(data.dataset))[0].numpy()
    assert images.min() < -1.2 or images.max() > 1.2  # beyond [-1, 1]: the overshoot
    assert keras_vit.evaluate(model, data, progress=False)["num_examples"] == 2
    imagenet = dict(input_size=[3, 16, 16], interpolation="bicubic", crop_pct=0.875,
                    crop_mode="center", mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    pixels = np.random.default_rng(0).integers(0, 256, (4, 20, 20, 3), np.uint8)
    paper = keras_vit.data.from_arrays(pixels, np.arange(4) % 3, image_size=16, batch_size=2,
                                       training=False)
    timm_like = small_model(imagenet)
    with pytest.warns(UserWarning, match="evaluation pipeline was built without a data config"):
        got = keras_vit.evaluate(timm_like, paper, progress=False)
    own = keras_vit.data.from_arrays(pixels, np.arange(4) % 3, image_size=16, batch_size=2,
                                     training=False, data_config=timm_like)
    assert got["loss"] == keras_vit.evaluate(timm_like, own, progress=False)["loss"]
    other = keras_vit.data.from_arrays(pixels, np.arange(4) % 3, image_size=16, batch_size=2,
                                       training=False, data_config=small_model())
    with pytest.raises(ValueError, match="evaluation pipeline normalises with mean"):
        keras_vit.evaluate(timm_like, other, progress=False)
    # The paper's mean and std with timm's resize and crop (its ViTs' augreg files): the
    # evaluation pipeline is built again too, and a training pipeline (its own crops) is not.
    augreg = small_model(dict(imagenet, crop_pct=0.9, mean=[0.5] * 3, std=[0.5] * 3))
    with pytest.warns(UserWarning, match=r"crop_pct 0\.9, crop_mode center"):
        got = keras_vit.evaluate(augreg, paper, progress=False)
    own = keras_vit.data.from_arrays(pixels, np.arange(4) % 3, image_size=16, batch_size=2,
                                     training=False, data_config=augreg)
    assert got["loss"] == keras_vit.evaluate(augreg, own, progress=False)["loss"]
    train = keras_vit.data.from_arrays(pixels, np.arange(4) % 3, image_size=16, batch_size=2,
                                       training=True)
    assert train.for_model(augreg) == (train, False)
    half = tf.data.Dataset.from_tensor_slices((tf.zeros((4, 16, 16, 3), tf.bfloat16),
                                               np.arange(4) % 3)).batch(2)
    assert keras_vit.evaluate(small_model(), half, batch_size=None,
                              progress=False)["num_examples"] == 4


def test_float_images_are_checked_as_a_whole_not_by_batch():
    """A batch of dark images among others in [0, 255] is not taken for images scaled to
    [0, 1]: the range is the whole array's."""
    images = np.zeros((3, 16, 16, 3), np.float32)
    images[0], images[2] = 200.0, 0.5
    report = keras_vit.evaluate(small_model(), (images, np.arange(3)), batch_size=2,
                                value_range=(0, 255), progress=False)
    assert report["num_examples"] == 3
