"""The checkpoint registry (registry.json), the label lists and the small checkpoints keras_vit
ships: data only, importable without Keras (`keras-vit checkpoints` lists the registry without
starting TensorFlow)."""
