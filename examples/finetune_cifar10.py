"""Fine-tune ViT-B/16 on CIFAR-10 at 384 px as in the paper (appendix B.1.1).

    python examples/finetune_cifar10.py --pretrained imagenet21k/ViT-B_16 --output runs/cifar10

The recipe: SGD momentum 0.9, no weight decay, global gradient-norm clipping at 1, 500 warmup
steps then cosine decay over 10k steps, batch 512 (here reached with gradient accumulation:
`--batch-size` images per step times `512 / batch-size` steps per update), learning rate from
{0.001, 0.003, 0.01, 0.03}, a fresh zero head, the official preprocessing (inception crop and
flip for training, plain resize for evaluation) at 384 px. The paper reports 99.0% (B/16,
ImageNet-21k) to 99.42% (L/16) on CIFAR-10; this needs accelerators (about 10k x 512 images at
384 px) and the tensorflow-datasets CIFAR-10 download.

Interrupt and run the same command again to resume from the last finished epoch.
"""

import argparse
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pretrained", required=True,
                        help="ImageNet-21k checkpoint: registry name, .npz path or URL")
    parser.add_argument("--output", default="runs/cifar10")
    parser.add_argument("--variant", default="B/16")
    parser.add_argument("--image-size", type=int, default=384)
    parser.add_argument("--batch-size", type=int, default=64, help="global batch per step")
    parser.add_argument("--lr", type=float, default=0.003)
    parser.add_argument("--steps", type=int, default=10_000, help="optimizer updates")
    parser.add_argument("--precision", default="bfloat16", help="float32, bfloat16 or float16")
    parser.add_argument("--strategy", default="auto")
    parser.add_argument("--data-dir", default=None)
    args = parser.parse_args(argv)

    import keras_vit
    from keras_vit import checkpoint, data, distribute, training
    from keras_vit.pretrained import load_pretrained

    callbacks = training.training_callbacks(args.output)  # checks the folder first
    strategy = distribute.get_strategy(args.strategy)
    batch_size = distribute.global_batch_size(args.batch_size, strategy)
    accumulation = training.accumulation_steps(training.FINETUNE_BATCH_SIZE, batch_size)
    training.set_precision(args.precision)
    start_epoch = training.resume_epoch(training.backup_dir(args.output))
    train = data.from_tfds("cifar10", "train", image_size=args.image_size, batch_size=batch_size,
                           data_dir=args.data_dir, start_epoch=start_epoch, strategy=strategy)
    val = data.from_tfds("cifar10", "validation", image_size=args.image_size,
                         batch_size=batch_size, data_dir=args.data_dir)
    epochs = math.ceil(args.steps * accumulation / train.steps_per_epoch)
    updates = epochs * train.steps_per_epoch // accumulation  # whole epochs
    with strategy.scope():
        model = keras_vit.create_model(args.variant, image_size=args.image_size,
                                       num_classes=train.num_classes)
        load_pretrained(model, args.pretrained)  # new zero head, resized pos. emb.
        training.compile_finetune(
            model, learning_rate=args.lr, total_steps=updates, accumulation_steps=accumulation,
            warmup_steps=min(training.FINETUNE_WARMUP_STEPS, updates // 10))
    model.fit(train.dataset, steps_per_epoch=train.steps_per_epoch, epochs=epochs,
              validation_data=val.dataset, callbacks=callbacks)
    test = data.from_tfds("cifar10", "test", image_size=args.image_size, batch_size=batch_size,
                          data_dir=args.data_dir)
    print("test loss, accuracy:", model.evaluate(test.dataset, verbose=0))
    checkpoint.save_npz(model, os.path.join(args.output, "final.npz"))


if __name__ == "__main__":
    main()
