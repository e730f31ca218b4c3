"""Training on several devices, one module per backend's mechanism:

- `keras_vit.parallel.tf_distribute`: TensorFlow's `tf.distribute` strategies by name
  (`keras_vit.get_strategy`), global batch sizes, the chief of a cluster;
- `keras_vit.parallel.keras_distribution`: `keras.distribution` on JAX, data parallel or the
  encoder blocks sharded over devices (`keras_vit.get_distribution`, `keras_vit.layout_map`).

Each is imported on its own, so that the JAX side does not import TensorFlow.
"""
