"""Fine-tune ViT-B/16 on CIFAR-10 at 384 px as in the paper (appendix B.1.1).

    python examples/finetune_cifar10.py --weights imagenet21k/ViT-B_16 --output runs/cifar10

The paper's fine-tuning recipe (`keras_vit.training.fit`, recipe "finetune"): SGD momentum 0.9,
no weight decay, gradient clipping at global norm 1, 500 warm-up updates then cosine decay over
10k updates of batch 512 (here `--batch-size` images per step, accumulated to 512), a fresh
zero head, the official preprocessing at 384 px. The paper reports 99.0% (B/16, ImageNet-21k)
to 99.42% (L/16); this needs accelerators and the tensorflow-datasets CIFAR-10 download.
Interrupt it and run the same command again to resume from the last finished epoch.
"""

import argparse

import keras_vit
from keras_vit import data, training


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--weights", required=True,
                        help="ImageNet-21k checkpoint: registry name, .npz path or URL")
    parser.add_argument("--output", default="runs/cifar10")
    parser.add_argument("--variant", default="B/16")
    parser.add_argument("--image-size", type=int, default=384)
    parser.add_argument("--batch-size", type=int, default=64, help="global batch per step")
    parser.add_argument("--lr", type=float, default=0.003)
    parser.add_argument("--steps", type=int, default=10_000, help="optimizer updates")
    parser.add_argument("--precision", default="bfloat16", help="float32, bfloat16 or float16")
    parser.add_argument("--data-dir", default=None)
    args = parser.parse_args(argv)

    training.set_precision(args.precision)
    strategy = keras_vit.get_strategy("auto")
    common = dict(image_size=args.image_size, batch_size=args.batch_size, data_dir=args.data_dir)
    train = data.from_tfds("cifar10", "train", strategy=strategy, **common)
    validation = data.from_tfds("cifar10", "validation", **common)
    with strategy.scope():  # new zero head for the 10 classes, position embedding resized
        model = keras_vit.create_model(args.variant, image_size=args.image_size,
                                       num_classes=train.num_classes, pretrained=args.weights)
    summary = training.fit(model, train, validation, output_dir=args.output, steps=args.steps,
                           learning_rate=args.lr, target_batch_size=training.FINETUNE_BATCH_SIZE)
    print("run:", summary)
    test = data.from_tfds("cifar10", "test", **common)
    print("test:", model.evaluate(test.dataset, verbose=0, return_dict=True))


if __name__ == "__main__":
    main()
