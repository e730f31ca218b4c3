"""Train a ViT from scratch with the paper's pre-training recipe (appendix B.1).

    python examples/train_from_scratch.py --variant S/16 --dataset imagenet2012 \\
        --manual-dir ~/imagenet --image-size 224 --batch-size 256 --epochs 300

`keras_vit.training.fit` with recipe "pretrain": Adam (b1 0.9, b2 0.999) with decoupled weight
decay 0.1, linear warm-up (10k updates, at most 10% of the run) then linear decay to 1e-5, the
variant's dropout, the official training preprocessing. The paper pre-trains at batch 4096 on
ImageNet-21k or JFT; `--target-batch-size 4096` reaches it by gradient accumulation. For a run
that finishes on a laptop, see examples/train_digits.py.
"""

import argparse

import keras_vit
from keras_vit import data, training


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", default="S/16")
    parser.add_argument("--dataset", default="imagenet2012")
    parser.add_argument("--manual-dir", default=None)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--target-batch-size", type=int, default=None)
    parser.add_argument("--epochs", type=int, default=300)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--weight-decay", type=float, default=0.1)
    parser.add_argument("--precision", default="bfloat16")
    parser.add_argument("--output", default="runs/scratch")
    args = parser.parse_args(argv)

    training.set_precision(args.precision)
    strategy = keras_vit.get_strategy("auto")
    common = dict(image_size=args.image_size, batch_size=args.batch_size,
                  data_dir=args.data_dir, manual_dir=args.manual_dir)
    train = data.from_tfds(args.dataset, "train", strategy=strategy, **common)
    validation = data.from_tfds(args.dataset, "validation", **common)
    with strategy.scope():
        model = keras_vit.create_model(args.variant, image_size=args.image_size,
                                       num_classes=train.num_classes)
    summary = training.fit(model, train, validation, output_dir=args.output, epochs=args.epochs,
                           recipe="pretrain", learning_rate=args.lr,
                           weight_decay=args.weight_decay, target_batch_size=args.target_batch_size)
    print("run:", summary)


if __name__ == "__main__":
    main()
