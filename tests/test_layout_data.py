"""The layout of data, images and evaluation: one module per job, one rule per check.

- the label rule is one function (`keras_vit.checks.check_labels`): the input pipelines and the
  evaluation refuse the same bad labels with the same message;
"""

import numpy as np
import pytest

import keras_vit
from keras_vit import checks, data, evaluation

TINY = dict(hidden_size=8, num_layers=1, num_heads=2, mlp_dim=8)


def _message(action):
    with pytest.raises(ValueError) as info:
        action()
    return str(info.value)


def test_pipelines_and_evaluation_refuse_bad_labels_with_the_one_message():
    images = np.zeros((4, 16, 16, 3), np.uint8)
    labels = np.array([0, 1, 9, -1])
    expected = ("Labels out of range: [-1, 9] (2 of 4 values). Expected integers in [0, 3).")
    assert _message(lambda: checks.check_labels(labels, 3)) == expected
    assert _message(lambda: data.from_arrays(images, labels, num_classes=3, image_size=16,
                                             batch_size=2, training=False)) == expected
    model = keras_vit.ViT(image_size=16, patch_size=8, num_classes=3, **TINY)
    assert _message(lambda: keras_vit.evaluate(model, (images, labels), progress=False,
                                               allow_fresh_head=True)) == expected
    # The ReaL metric's predictions and label sets go through the same rule.
    assert _message(lambda: evaluation.real_accuracy(
        labels, np.ones((4, 3), bool), [0, 1, 2, 0])) == expected.replace("Labels",
                                                                          "Predictions")
    assert _message(lambda: evaluation.multi_hot([[0], [1.5]], 3)) == (
        "Class ids of label set 1 must be integers. Received dtype float64.")


def test_the_label_rule_returns_int64_class_ids():
    ids = checks.check_labels(np.array([2, 0], np.uint8), 3)
    assert ids.dtype == np.int64 and ids.tolist() == [2, 0]
    assert checks.check_labels([], 3).dtype == np.int64  # an empty label set
