"""The classification loss of the recipes (`keras_vit.training.compile_model`)."""

import keras
from keras import ops

from keras_vit.checks import check_number


@keras.saving.register_keras_serializable(package="keras_vit")
class SparseCategoricalCrossentropy(keras.losses.Loss):
    """Cross-entropy from logits and integer labels, with optional label smoothing.

    Keras' own sparse cross-entropy has no label smoothing; this one smooths the one-hot
    target to `(1 - s) * onehot + s / num_classes`, as `CategoricalCrossentropy` does.

    Args:
        label_smoothing: float in [0, 1). Defaults to 0.
    """

    def __init__(self, label_smoothing=0.0, name="sparse_categorical_crossentropy", **kwargs):
        super().__init__(name=name, **kwargs)
        self.label_smoothing = check_number("label_smoothing", label_smoothing, 0.0, 1.0)

    def call(self, y_true, y_pred):
        # y_true = [B] integer labels, y_pred = [B, K] logits
        y_true = ops.reshape(ops.cast(y_true, "int32"), (-1,))
        if not self.label_smoothing:
            return keras.losses.sparse_categorical_crossentropy(y_true, y_pred, from_logits=True)
        onehot = ops.one_hot(y_true, ops.shape(y_pred)[-1], dtype=y_pred.dtype)  # [B, K]
        return keras.losses.categorical_crossentropy(
            onehot, y_pred, from_logits=True, label_smoothing=self.label_smoothing
        )

    def get_config(self):
        return dict(super().get_config(), label_smoothing=self.label_smoothing)
