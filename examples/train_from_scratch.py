"""Train a ViT from scratch with the paper's pre-training recipe (appendix B.1).

    python examples/train_from_scratch.py --variant S/16 --dataset imagenet2012 \\
        --manual-dir ~/imagenet --image-size 224 --batch-size 256 --epochs 300

Adam (b1 0.9, b2 0.999) with decoupled weight decay 0.1, linear warmup (10k steps, or 5% of
the run if shorter) then linear decay to 1e-5, dropout of the variant's configuration, the
official training preprocessing. The paper pre-trains at batch 4096 on ImageNet-21k or JFT;
`--target-batch-size 4096` reaches it by gradient accumulation. For a run that finishes on a
laptop, see examples/train_digits.py.
"""

import argparse
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


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
    parser.add_argument("--dropout", type=float, default=None,
                        help="override the variant's dropout (0.1 for L/16 and H/14)")
    parser.add_argument("--precision", default="bfloat16")
    parser.add_argument("--strategy", default="auto")
    parser.add_argument("--output", default="runs/scratch")
    args = parser.parse_args(argv)

    import keras_vit
    from keras_vit import checkpoint, data, distribute, training

    callbacks = training.training_callbacks(args.output)
    strategy = distribute.get_strategy(args.strategy)
    batch_size = distribute.global_batch_size(args.batch_size, strategy)
    accumulation = training.accumulation_steps(args.target_batch_size or batch_size, batch_size)
    training.set_precision(args.precision)
    start_epoch = training.resume_epoch(training.backup_dir(args.output))
    common = dict(image_size=args.image_size, batch_size=batch_size, data_dir=args.data_dir,
                  manual_dir=args.manual_dir)
    train = data.from_tfds(args.dataset, "train", start_epoch=start_epoch, strategy=strategy,
                           **common)
    val = data.from_tfds(args.dataset, "validation", **common)
    updates = args.epochs * train.steps_per_epoch // accumulation
    overrides = {} if args.dropout is None else {"dropout_rate": args.dropout}
    with strategy.scope():
        model = keras_vit.create_model(args.variant, image_size=args.image_size,
                                       num_classes=train.num_classes, **overrides)
        training.compile_pretrain(
            model, learning_rate=args.lr, total_steps=updates,
            warmup_steps=min(training.PRETRAIN_WARMUP_STEPS, math.ceil(0.05 * updates)),
            weight_decay=args.weight_decay, accumulation_steps=accumulation)
    model.fit(train.dataset, steps_per_epoch=train.steps_per_epoch, epochs=args.epochs,
              validation_data=val.dataset, callbacks=callbacks)
    checkpoint.save_npz(model, os.path.join(args.output, "final.npz"))


if __name__ == "__main__":
    main()
