"""Contender: keras-hub's ViT (`ViTBackbone` + `ViTImageClassifier`), random weights.

The backbone gets the variant's sizes (keras_vit's architecture: class token, pre-LN blocks,
LayerNorm epsilon 1e-6, dropout 0), no preprocessor, and a 1000-class head on the class token,
as keras-hub's `vit_base_patch16_224_imagenet` preset has.
"""

import sys

from benchmarks.contenders import common, keras_common

PRECISIONS = keras_common.PRECISIONS
device_peak_bytes = keras_common.device_peak_bytes


def setup(args):
    return keras_common.setup(args, "keras_hub")


def build_model(args, config):
    import keras_hub

    backbone = keras_hub.models.ViTBackbone(
        image_shape=(args.image_size, args.image_size, 3), patch_size=config["patch_size"],
        num_layers=config["num_layers"], num_heads=config["num_heads"],
        hidden_dim=config["hidden_size"], mlp_dim=config["mlp_dim"],
        dropout_rate=0.0, attention_dropout=0.0, layer_norm_epsilon=1e-6,
    )
    return keras_hub.models.ViTImageClassifier(
        backbone=backbone, num_classes=common.NUM_CLASSES, preprocessor=None, pooling="token"
    )


def build_inference(args, config):
    return keras_common.inference_step(build_model(args, config), args)


def build_training(args, config):
    """AdamW on cross-entropy from logits, no metrics (keras-hub's default adds accuracy)."""
    import keras

    model = build_model(args, config)
    optimizer = keras.optimizers.AdamW(common.LEARNING_RATE, weight_decay=common.WEIGHT_DECAY)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    keras_common.compile_model(model, args, optimizer=optimizer, loss=loss, metrics=None)
    return keras_common.training_step(model, args)


if __name__ == "__main__":
    sys.exit(common.main(sys.modules[__name__]))
