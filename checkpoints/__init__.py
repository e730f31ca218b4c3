"""The checkpoint registry (registry.json) and the small checkpoints keras_vit ships."""
