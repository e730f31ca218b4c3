"""Fine-tune a pre-trained ViT on your own images: one subfolder per class.

    python examples/finetune_folder.py --folder ~/photos --weights imagenet21k/ViT-B_16

`--folder` holds `<class name>/<image>.jpg` (PNG, BMP, GIF, WebP too; any nesting below the
class folder). A fixed, seeded 10% of the images is held out for validation. The paper's
fine-tuning recipe (SGD momentum 0.9, clipping at 1, warm-up then cosine decay, zero head),
scaled to a short run: 500 updates of batch 32 at 224 px by default. Interrupt it and run the
same command again to resume; `keras-vit predict IMAGE --weights runs/folder/final.npz` then
uses the model with your class names.
"""

import argparse
import json

import keras_vit
from keras_vit import data, training


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", required=True)
    parser.add_argument("--weights", default=None,
                        help="registry name, .npz path or URL (default: train from scratch)")
    parser.add_argument("--variant", default="B/16")
    parser.add_argument("--model-config", type=json.loads, default=None,
                        help="keras_vit.ViT arguments (JSON) instead of --variant")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=500, help="optimizer updates (about)")
    parser.add_argument("--lr", type=float, default=0.003)
    parser.add_argument("--output", default="runs/folder")
    args = parser.parse_args(argv)

    common = dict(image_size=args.image_size, batch_size=args.batch_size, validation_split=0.1)
    train = data.from_folder(args.folder, training=True, subset="training", **common)
    validation = data.from_folder(args.folder, training=False, subset="validation", **common)
    if args.model_config:
        model = keras_vit.ViT(**args.model_config, image_size=args.image_size,
                              num_classes=train.num_classes)
        if args.weights:
            keras_vit.load_pretrained(model, args.weights)
    else:
        model = keras_vit.create_model(args.variant, image_size=args.image_size,
                                       num_classes=train.num_classes, pretrained=args.weights)
    summary = training.fit(model, train, validation, output_dir=args.output, steps=args.steps,
                           learning_rate=args.lr, verbose=2)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
