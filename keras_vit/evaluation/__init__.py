"""Evaluation as the paper reports it (section 4.1, "Metrics"): fine-tuning accuracy and
few-shot linear accuracy, plus a linear probe and batched feature extraction.

- `evaluate(model, data)`: top-1, top-5, loss, per-class accuracy and the confusion matrix;
  on data whose images have sets of correct labels (ImageNet-ReaL), ReaL accuracy as well.
- `real_accuracy(predictions, label_sets, labels)`: the ReaL metric (Beyer et al. 2020, "Are we
  done with ImageNet?", the ImageNet-ReaL column of the paper's Table 2): a prediction is correct
  if it is in its image's set of labels; images whose set is empty are left out.
- `extract_features(model, data)`: the frozen representation (`pre_logits` if the model has
  one, else the pooled token, after `fc_norm` where it has one), batched, optionally cached
  to `.npy`.
- `fewshot_accuracy(...)` / `fewshot_table(...)`: k images per class, a closed-form
  regularised least-squares fit onto {-1, 1}^K targets (big_vision `fewshot_lsr`), accuracy on
  the test features.
- `linear_probe(...)`: logistic regression on frozen features with `model.fit`.

`data` is a `keras_vit.data` pipeline (`InputData`), a `tf.data.Dataset` of `(images, labels)`
batches with float images already preprocessed for the model (what `keras_vit.data` pipelines
give, or `keras_vit.preprocess_inputs(images, model)`; raw pixels are refused), or a
pair of arrays `(images, labels)` with RGB images at the model's resolution: integers in
[0, 255], or floats in the range `value_range` says ((0, 255) or (0, 1), as
`keras_vit.data.from_arrays` takes them), normalised with the model's data config (its
checkpoint's mean and std, `keras_vit.resolve_data_config`; the paper's [-1, 1] by default).
`labels` are class ids `[N]`, or for multi-label evaluation a dict: `label` (class ids
`[N]`) and `label_set` (multi-hot `[N, num_classes]`, see `multi_hot`), as `keras_vit.data`
gives for ImageNet-ReaL.
"""

from keras_vit.evaluation.features import (  # noqa: F401 - the public names, here
    data_digest,
    extract_features,
    feature_cache_key,
    representation_model,
)
from keras_vit.evaluation.fewshot import (  # noqa: F401 - the public names, here
    BIAS_FEATURE,
    DEFAULT_L2_REGS,
    DEFAULT_SHOTS,
    fewshot_accuracy,
    fewshot_table,
    format_fewshot_table,
    linear_probe,
    lsr_weights,
    sample_shots,
)
from keras_vit.evaluation.accuracy import (  # noqa: F401 - the public names, here
    MAX_CONFUSION_CLASSES,
    REPORT_FILES,
    TOP_K,
    check_class_names,
    check_report_files,
    evaluate,
    multi_hot,
    real_accuracy,
)
