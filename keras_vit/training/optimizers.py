"""`keras_vit.training.AdamW`: Keras' AdamW, the same update built from fewer operations."""

import keras

from keras_vit.training.adam import FusedAdamUpdate


@keras.saving.register_keras_serializable(package="keras_vit")
class AdamW(FusedAdamUpdate, keras.optimizers.AdamW):
    """`keras.optimizers.AdamW` with a fused update: the pre-training recipe's optimizer.

    On TensorFlow outside any distribution strategy, the bias-corrected step size, the
    learning rate and the weight-decay factor are computed once per step instead of once per
    variable, and each float32/float64 variable is updated by one `ResourceApplyAdam` kernel
    after the decoupled decay `w -= lr wd w` (`keras_vit.training.adam`): far fewer
    operations to trace and compile. The formula is Keras'; the kernel computes `1 - beta_2`
    in float32, so steps differ from Keras' in the sixth significant digit. Elsewhere (under
    a strategy, other backends, `amsgrad`) it is Keras' own AdamW. Arguments and `get_config`
    are those of `keras.optimizers.AdamW`.

    ```python
    optimizer = keras_vit.training.AdamW(learning_rate=1e-3, weight_decay=0.1)
    ```
    """
