"""The training state of a compiled model: the optimizer's, loss's and metrics' variables,
created before the first training step."""

import keras

from keras_vit import framework
from keras_vit.parallel import tf_distribute


def build_training_state(model, labels=None):
    """Creates the optimizer's, loss's and metrics' variables of a compiled `model` now.

    Without a distribution strategy Keras creates them inside the first traced training step,
    and TensorFlow traces a `tf.function` that created variables a second time (BENCHMARKS.md
    has the cost). `compile_model` calls this; call it after your own `model.compile` to get
    the same. Under a strategy it builds in the strategy's scope, as Keras would. A model whose
    layers are not all built (a Sequential without an `Input`, say) is left for Keras to
    build at the first step.

    Args:
        model: a compiled `keras.Model`.
        labels: `keras.KerasTensor` or None. Describes a batch of labels (anything with
            `shape` and `dtype` will do), for building the loss and metrics. Defaults to
            integer class ids of shape `[B]` (what `compile_model`'s loss takes); pass
            `keras.KerasTensor((None, K), "float32")` for one-hot labels.

    Returns:
        The model.
    """
    if getattr(model, "optimizer", None) is None:
        raise ValueError(f"Model {model.name!r} is not compiled: call `model.compile` first.")
    if not model.built or not all(layer.built for layer in model.layers):
        return model  # its variables do not all exist yet: Keras builds at the first step
    with tf_distribute.strategy_scope(model):
        inputs = getattr(model, "inputs", None)
        if inputs and len(inputs) == 1:
            if labels is None:
                labels = keras.KerasTensor((inputs[0].shape[0],), "int32")
            framework.symbolic_build(model, (inputs[0], labels, None))
        elif not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)
    return model
