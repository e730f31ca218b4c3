"""The fused Adam(W) update of `keras_vit.training.AdamW`: Keras' update built from fewer graph
operations.

Keras' AdamW recomputes the bias-corrected step size, the learning rate (a schedule is
evaluated again for every variable) and the weight-decay factor per variable, and routes each
variable through `tf.distribute`'s update machinery: about 45 TensorFlow operations per
variable, which Python must create at every trace and XLA must compile. On TensorFlow outside
any distribution strategy `FusedAdamUpdate` computes those scalars once per step and updates
each float32/float64 variable with one fused `ResourceApplyAdam` kernel, after the decoupled
decay `w -= lr wd w`. Elsewhere (under a strategy, other backends, `amsgrad`, a Keras release
without the private members `keras_vit.framework` reads for it) it is Keras' own update.
"""

import keras
from keras import ops

from keras_vit import framework


class FusedAdamUpdate(framework.UpdateStepOverride):
    """A mixin for `keras.optimizers.Adam`/`AdamW` subclasses: the same update built from
    fewer graph operations (`keras_vit.training.AdamW` is the one user-facing class)."""

    def fuses_update(self):
        """Whether this optimizer can take the fused update now."""
        if keras.backend.backend() != "tensorflow" or self.amsgrad:
            return False
        import tensorflow as tf  # the fused kernel is TensorFlow's, on that backend only

        # Variables created under a strategy (even when applied outside it) are distributed:
        # Keras' path updates every copy, the fused kernel would update one.
        return not tf.distribute.has_strategy() and \
            framework.optimizer_strategy(self) is tf.distribute.get_strategy()

    def fused_update_step(self, grads, trainable_variables, learning_rate):
        """Keras' Adam(W) step with the scalars computed once per dtype and `ResourceApplyAdam`
        per float32/float64 variable; the decoupled weight decay first.

        The formula is Keras': `m += (g - m)(1 - b1)`, `v += (g^2 - v)(1 - b2)`,
        `w -= alpha m / (sqrt(v) + eps)` with `alpha = lr sqrt(1 - b2^t) / (1 - b1^t)`. The
        kernel computes `1 - b2` in float32 (0.00099998713 against Keras' 0.001), so steps
        differ from Keras' in the sixth significant digit.
        """
        import tensorflow as tf  # the fused kernel is TensorFlow's, on that backend only

        scalars = {}
        for grad, variable in zip(grads, trainable_variables):
            dtype = variable.dtype
            if dtype not in scalars:
                scalars[dtype] = _step_scalars(self, learning_rate, dtype)
            alpha, decay, beta_1, beta_2, epsilon, zero = scalars[dtype]
            if self.weight_decay and framework.uses_weight_decay(self, _tf_variable(variable)):
                self.assign_sub(variable, variable * decay)  # decoupled: w -= lr wd w
            distributed = isinstance(_tf_variable(variable), tf.distribute.DistributedValues)
            if isinstance(grad, tf.IndexedSlices) or dtype not in ("float32", "float64") \
                    or distributed:
                # Keras' own update: sparse rows; in 16-bit dtypes 1 - b2 would round off;
                # a distributed variable has one copy per replica.
                self.update_step(grad, variable, learning_rate)
                continue
            momentum, velocity = framework.adam_slots(self, variable)
            # With beta powers 0 the kernel's own bias correction is 1: its step is `alpha`.
            tf.raw_ops.ResourceApplyAdam(
                var=_tf_variable(variable).handle,
                m=_tf_variable(momentum).handle,
                v=_tf_variable(velocity).handle,
                beta1_power=zero,
                beta2_power=zero,
                lr=alpha,
                beta1=beta_1,
                beta2=beta_2,
                epsilon=epsilon,
                grad=ops.cast(grad, dtype),
            )


def _step_scalars(optimizer, learning_rate, dtype):
    """`(alpha, decay, beta_1, beta_2, epsilon, zero)` in `dtype` for this step: the
    bias-corrected step size and the weight-decay factor `lr wd`."""
    lr = ops.cast(learning_rate, dtype)
    step = ops.cast(optimizer.iterations + 1, dtype)
    beta_1, beta_2 = ops.cast(optimizer.beta_1, dtype), ops.cast(optimizer.beta_2, dtype)
    alpha = lr * ops.sqrt(1 - ops.power(beta_2, step)) / (1 - ops.power(beta_1, step))
    decay = lr * ops.cast(optimizer.weight_decay or 0.0, dtype)
    return alpha, decay, beta_1, beta_2, ops.cast(optimizer.epsilon, dtype), ops.zeros((), dtype)


def _tf_variable(variable):
    """The TensorFlow variable behind a Keras variable (or the TensorFlow variable itself)."""
    return getattr(variable, "value", variable)
