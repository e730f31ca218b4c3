"""Fine-tune a pre-trained ViT on your own images: one subfolder per class.

    python examples/finetune_folder.py --folder ~/photos --pretrained imagenet21k/ViT-B_16

`--folder` holds `<class name>/<image>.jpg` (PNG, BMP, GIF too; any nesting below the class
folder). A fixed, seeded 10% of the images is held out for validation. The paper's
fine-tuning recipe (SGD momentum 0.9, clipping at 1, warmup then cosine decay, zero head),
scaled to a short run: 500 updates of batch 32 at 224 px by default. Interrupt and run the
same command again to resume.
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", required=True)
    parser.add_argument("--pretrained", default=None,
                        help="registry name, .npz path or URL (default: train from scratch)")
    parser.add_argument("--variant", default="B/16")
    parser.add_argument("--model-config", type=json.loads, default=None,
                        help="JSON keras_vit.ViT arguments instead of --variant")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=500, help="optimizer updates (about)")
    parser.add_argument("--lr", type=float, default=0.003)
    parser.add_argument("--output", default="runs/folder")
    args = parser.parse_args(argv)

    import keras_vit
    from keras_vit import checkpoint, data, training
    from keras_vit.pretrained import load_pretrained

    callbacks = training.training_callbacks(args.output)  # checks the folder first
    common = dict(image_size=args.image_size, batch_size=args.batch_size, validation_split=0.1)
    start_epoch = training.resume_epoch(training.backup_dir(args.output))
    train = data.from_folder(args.folder, training=True, subset="training",
                             start_epoch=start_epoch, **common)
    val = data.from_folder(args.folder, training=False, subset="validation", **common)
    num_classes = train.num_classes
    if args.model_config:
        model = keras_vit.ViT(image_size=args.image_size, num_classes=num_classes,
                              **args.model_config)
    else:
        model = keras_vit.create_model(args.variant, image_size=args.image_size,
                                       num_classes=num_classes)
    if args.pretrained:
        load_pretrained(model, args.pretrained)  # fresh zero head for your classes
    epochs = max(1, -(-args.steps // train.steps_per_epoch))
    updates = epochs * train.steps_per_epoch
    training.compile_finetune(model, learning_rate=args.lr, total_steps=updates,
                              warmup_steps=min(training.FINETUNE_WARMUP_STEPS, updates // 10))
    model.fit(train.dataset, steps_per_epoch=train.steps_per_epoch, epochs=epochs,
              validation_data=val.dataset, callbacks=callbacks, verbose=2)
    loss, accuracy = model.evaluate(val.dataset, verbose=0)
    checkpoint.save_npz(model, os.path.join(args.output, "final.npz"))
    print(json.dumps({"classes": list(train.class_names), "validation_images": val.num_examples,
                      "validation_accuracy": accuracy, "validation_loss": loss}))


if __name__ == "__main__":
    main()
